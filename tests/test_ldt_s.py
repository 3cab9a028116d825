"""LDT-S (single network, groups frozen alternately): swaps, EMA buffer, composite, exact resume."""
import io

import pytest
import torch

from basicsr_ldt.ldt import LDT, LDTConfig, preset
from test_ldt_algorithm import _factory, _loss, _net, _run

# warm-up 2, profiling 3, then LDT-S: intervals of 3 iterations, EMA every 2
CFG = dict(head_warmup_iters=2, head_patterns=('5',), profile_iters=3, ratio_u=0.5, ema_every=2,
           interval_iters=3)
START = 6   # first training iteration


def _ldt_s(seed=0, **overrides):
    return LDT(_net(seed), preset('ldt_s', **{**CFG, **overrides}), _factory)


def test_groups_train_in_turn_and_swap_every_interval():
    algo = _ldt_s()
    _run(algo, 1, START - 1)
    alt_log = []
    for i in range(START, START + 9):
        before = {n: p.clone() for n, p in algo.primary.named_parameters()}
        log = algo.update(_loss(i), i)
        alt_log.append(next(iter(log)))
        changed = {n for n, p in algo.primary.named_parameters() if not torch.equal(p, before[n])}
        group = set(algo.partition.stable if log.get('l_stable') is not None else algo.partition.unstable)
        if (i - START + 1) % 3:            # within an interval only the active group moves
            assert changed and changed <= group
    assert alt_log == ['l_stable'] * 3 + ['l_unstable'] * 3 + ['l_stable'] * 3
    assert algo.pair is None and set(algo.optimizers) == {'ldt_s'}


def test_swap_parks_trained_weights_and_puts_ema_on_the_device():
    algo = _ldt_s(ema_every=1)
    _run(algo, 1, START + 1)                     # two stable steps, EMA after each
    alt = algo.alternation
    params = dict(algo.primary.named_parameters())
    trained = {n: params[n].clone() for n in algo.partition.stable}
    ema = {n: t.clone() for n, t in zip(algo.partition.stable, alt.buffer['stable'])}
    frozen_on_device = {n: params[n].clone() for n in algo.partition.unstable}
    assert all(not torch.equal(ema[n], trained[n]) for n in trained)
    _run(algo, START + 2, START + 2)             # third step: EMA, then the swap
    w = algo.partition.dpu_coefficients
    trained_now = dict(zip(algo.partition.stable, alt.buffer['stable']))   # parked
    for n in algo.partition.stable:
        # device now holds the stable EMA, which absorbed the last trained weights (eq. 8/11)
        expected = w[n] * ema[n] + (1 - w[n]) * trained_now[n]
        assert torch.allclose(params[n], expected, atol=1e-6)
        assert not params[n].requires_grad
    for n, t in zip(algo.partition.unstable, alt.buffer['unstable']):
        assert torch.equal(t, frozen_on_device[n])   # unstable EMA moved to the buffer unchanged
        assert params[n].requires_grad


def test_composite_is_the_ema_of_both_groups():
    algo = _ldt_s(ema_every=1)
    _run(algo, 1, START + 4)                     # one full stable interval, 2 unstable steps
    comp = algo.composite_state_dict()
    alt = algo.alternation
    params = dict(algo.primary.named_parameters())
    assert alt.active == 'unstable'
    for n in algo.partition.stable:              # frozen on the device = EMA of stable
        assert torch.equal(comp[n], params[n])
    for n, t in zip(algo.partition.unstable, alt.buffer['unstable']):
        assert torch.equal(comp[n], t) and not torch.equal(comp[n], params[n])
    net = algo.composite()
    assert all(torch.equal(p, comp[n]) for n, p in net.named_parameters())


@pytest.mark.parametrize('k', [3, 6, 7, 8, 9, 11])   # profiling, first step, mid-interval, at a swap, ...
def test_resume_continues_bitwise(k):
    total = 16
    full = _ldt_s()
    _run(full, 1, total)
    first = _ldt_s()
    _run(first, 1, k)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = _ldt_s(seed=123)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    _run(resumed, k + 1, total)
    want, got = full.state_dict(), resumed.state_dict()
    assert all(torch.equal(want['primary'][n], got['primary'][n]) for n in want['primary'])
    for group in ('stable', 'unstable'):
        assert all(torch.equal(a, b) for a, b in zip(want['alternation']['buffer'][group],
                                                     got['alternation']['buffer'][group]))
    assert want['alternation']['active'] == got['alternation']['active']
    want_c, got_c = full.composite_state_dict(), resumed.composite_state_dict()
    assert all(torch.equal(want_c[n], got_c[n]) for n in want_c)


def test_first_group_and_bad_interval():
    algo = _ldt_s(first_group='unstable')
    assert next(iter(_run(algo, 1, START)[-1])) == 'l_unstable'
    for bad in (0, -3, 1.5):
        with pytest.raises(ValueError, match="ldt.interval_iters: expected an integer >= 1"):
            preset('ldt_s', interval_iters=bad)
    with pytest.raises(ValueError, match="ldt.first_group: expected one of"):
        LDTConfig(mode='alternating', first_group='both')


def test_ldt_s_state_is_not_resumed_into_ldt():
    algo = _ldt_s()
    _run(algo, 1, START)
    other = LDT(_net(), LDTConfig(**{k: v for k, v in CFG.items() if k != 'interval_iters'}), _factory)
    with pytest.raises(ValueError, match="different options: .*'interval_iters'.*'mode'"):
        other.load_state_dict(algo.state_dict())


@pytest.mark.parametrize('interval_iters, ema_every', [(5, 10), (10, 20), (3, 2), (1, 1), (100, 10), (4, 3),
                                                       (2, 8)])
def test_every_interval_moves_the_ema_of_the_group_that_trained(interval_iters, ema_every):
    # counted over the whole run, ema_every an even multiple of interval_iters put every exchange
    # in the unstable intervals: the stable EMA never moved and the stable layers came back unchanged
    algo = _ldt_s(interval_iters=interval_iters, ema_every=ema_every)
    _run(algo, 1, START - 1)
    algo.enter(START)
    start = {n: p.clone() for n, p in algo.primary.named_parameters()}
    moved = {'stable': 0, 'unstable': 0}
    iteration = START
    for _ in range(2):                                   # a stable interval, then an unstable one
        group = algo.alternation.active
        before = {n: t.clone() for n, t in algo.composite_state_dict().items()}
        _run(algo, iteration, iteration + interval_iters - 1)
        iteration += interval_iters
        after = algo.composite_state_dict()
        assert algo.alternation.active != group      # swapped at the interval's end
        trained = set(getattr(algo.partition, group))
        for name in algo.partition.stable + algo.partition.unstable:
            changed = not torch.equal(after[name], before[name])
            assert changed == (name in trained), (group, name)   # exactly the trained group's EMA moved
        moved[group] += 1
    final = dict(algo.primary.named_parameters())        # device: EMA of the frozen group, trained active group
    for group in ('stable', 'unstable'):
        names = getattr(algo.partition, group)
        assert all(not torch.equal(final[n], start[n]) for n in names), group
        assert all(not torch.equal(algo.composite_state_dict()[n], start[n]) for n in names), group
    assert moved == {'stable': 1, 'unstable': 1}


@pytest.mark.parametrize('interval_iters, ema_every, exchanges', [
    (4, 3, [3, 4, 7, 8, 11, 12]),      # counted over the run it would be 3, 4, 6, 8, 9, 12
    (5, 2, [2, 4, 5, 7, 9, 10, 12]),   # counted over the run it would be 2, 4, 5, 6, 8, 10, 12
])
def test_ema_every_is_counted_within_each_interval(interval_iters, ema_every, exchanges):
    """The composite (what net_g saves) changes exactly at the exchanges: every ``ema_every``
    iterations counted from the start of each interval, and at each interval's last iteration."""
    algo = _ldt_s(interval_iters=interval_iters, ema_every=ema_every)
    _run(algo, 1, START - 1)
    algo.enter(START)
    changed_at = []
    for step in range(1, 13):                          # LDT-S iterations 1..12 = START..START+11
        before = {n: t.clone() for n, t in algo.composite_state_dict().items()}
        _run(algo, START + step - 1, START + step - 1)
        after = algo.composite_state_dict()
        if any(not torch.equal(after[n], before[n]) for n in algo.partition.stable + algo.partition.unstable):
            changed_at.append(step)
    assert changed_at == exchanges


def test_a_skipped_non_finite_step_does_not_move_the_exchanges():
    """A NaN batch at LDT-S iteration 2 is skipped and not counted: the exchanges of interval 4,
    ema_every 3 come one iteration later (4, 5, 8, 9) and the first swap after 5 iterations."""
    algo = _ldt_s(interval_iters=4, ema_every=3)
    _run(algo, 1, START - 1)
    algo.enter(START)
    changed_at, active = [], []
    for step in range(1, 10):
        iteration = START + step - 1
        loss = _loss(iteration)
        batch = (lambda m: loss(m) * float('nan')) if step == 2 else loss
        before = {n: t.clone() for n, t in algo.composite_state_dict().items()}
        algo.update(batch, iteration)
        after = algo.composite_state_dict()
        if any(not torch.equal(after[n], before[n]) for n in algo.partition.stable + algo.partition.unstable):
            changed_at.append(step)                    # (BatchNorm statistics move at every step)
        active.append(algo.alternation.active)
    assert changed_at == [4, 5, 8, 9]
    assert active == ['stable'] * 4 + ['unstable'] * 4 + ['stable']


def test_train_amp_bf16_reaches_the_ldt_s_steps():
    """``train.amp: bf16`` (here on the CPU) runs the LDT-S forward passes under bf16 autocast too,
    not only warm-up and profiling."""
    from basicsr_ldt.ldt.precision import MixedPrecision
    net = _net()
    algo = LDT(net, preset('ldt_s', **CFG), _factory, MixedPrecision(torch.bfloat16, 'cpu'))
    dtypes = []
    net[0].register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    _run(algo, 1, START + 3)
    assert algo.alternation is not None and dtypes == [torch.bfloat16] * (START + 3)
