"""EMA speeds that scale with the run (``ldt.ema_reference_iters``, ``train.ema_reference_iters``).

A user who fine-tunes for fewer exchanges than the coefficients were written for relies on every EMA
averaging over the same share of the run: ``W' = 1 - (1 - W) * E_ref / E_run`` for every layer's W
(the paper's eq. 8/10/11 rescaled). The references below are written here in float64 from that
formula and the paper's eq. 10 (``W_i = W_base + R_base * rank_i / N``, rank in ascending order of the
statistic within the group), and E_run is counted by running the real method and counting its
exchanges, never taken from the project's helpers.
"""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.ldt import LDT, LDTConfig, preset
from basicsr_ldt.ldt.ldt_s import AlternatingFreezing
from basicsr_ldt.ldt.pair import CrossFrozenPair
from basicsr_ldt.models.ema_decay import scaled_ema_decay
from basicsr_ldt.models.ldt_model import ldt_config_from_options

PAPER = {'stable': (0.99, 0.01), 'unstable': (0.999, 0.001)}   # eq. 10 (W_base, R_base), paper section 2.3


def network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 2))


def run(config: LDTConfig, total_iters: int, monkeypatch) -> LDT:
    """Train ``total_iters`` iterations of a tiny regression; count every exchange per group."""
    counts = {'stable': 0, 'unstable': 0}
    pair_exchange, alternating_exchange = CrossFrozenPair.exchange, AlternatingFreezing.exchange

    def count_pair(self, *args, **kwargs):
        counts['stable'] += 1
        counts['unstable'] += 1
        return pair_exchange(self, *args, **kwargs)

    def count_alternating(self, *args, **kwargs):
        counts[self.active] += 1
        return alternating_exchange(self, *args, **kwargs)

    monkeypatch.setattr(CrossFrozenPair, 'exchange', count_pair)
    monkeypatch.setattr(AlternatingFreezing, 'exchange', count_alternating)
    ldt = LDT(network(), config, lambda params, role: torch.optim.SGD(params, lr=1e-2), total_iters=total_iters)
    generator = torch.Generator().manual_seed(1)
    for iteration in range(1, total_iters + 1):
        x = torch.randn(8, 4, generator=generator)
        y = torch.randn(8, 2, generator=generator)
        ldt.update(lambda net, x=x, y=y: ((net(x) - y) ** 2).mean(), iteration)
    ldt.counted_exchanges = counts
    return ldt


def reference_coefficients(ldt: LDT, e_ref: float, e_run: dict) -> dict:
    """Float64, from the paper: eq. 10 per group from the recorded statistics, then W' per layer."""
    out = {}
    for group, (w_base, r_base) in PAPER.items():
        layers = [r for r in ldt.partition.layers if r.group == group]
        ascending = sorted(range(len(layers)), key=lambda i: (layers[i].statistic, i))
        for rank, i in enumerate(ascending):
            w = w_base + r_base * rank / len(layers)
            out[layers[i].name] = max(0.0, 1.0 - (1.0 - w) * e_ref / e_run[group])
    return out


@pytest.mark.parametrize('mode, ema_every, total, expected_exchanges', [
    ('dual', 1, 60, {'stable': 50, 'unstable': 50}),      # 50 dual steps after 10 profiling iterations
    ('dual', 3, 60, {'stable': 16, 'unstable': 16}),      # every 3rd of 50
    # LDT-S, intervals of 7 from the stable group: 7 full intervals (s u s u s u s) and 1 of 1 (u);
    # per full interval 7 // 3 = 2 plus its end = 3 exchanges, the partial one 1 // 3 = 0.
    ('alternating', 3, 60, {'stable': 12, 'unstable': 9}),
])
def test_scaled_coefficients_are_the_paper_ones_rescaled_to_the_run(monkeypatch, mode, ema_every, total,
                                                                    expected_exchanges):
    config = LDTConfig(mode=mode, profile_iters=10, ema_every=ema_every, interval_iters=7,
                       ema_reference_iters=200000, ema_reference_every=10)
    ldt = run(config, total, monkeypatch)
    assert ldt.counted_exchanges == expected_exchanges              # E_run as the method really exchanges
    expected = reference_coefficients(ldt, 200000 / 10, ldt.counted_exchanges)
    got = ldt.partition.dpu_coefficients
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=0, abs=1e-12), name
    # The composite averages the groups with these very coefficients (the pair / LDT-S reads them).
    coefficients = (ldt.pair.partition if ldt.pair is not None else ldt.alternation.partition).dpu_coefficients
    assert coefficients == got


def test_the_issues_demo_numbers_both_ends_of_each_range(monkeypatch):
    """20,000 reference exchanges, 450 in the run: stable 0.556 + 0.444 rank/N, unstable
    0.956 + 0.044 rank/N (W_base and W_base + R_base both rescaled)."""
    config = LDTConfig(profile_iters=50, ema_every=1, ema_reference_iters=200000)
    ldt = run(config, 500, monkeypatch)
    k = 20000 / 450
    for group, (w_base, r_base) in PAPER.items():
        layers = sorted((r for r in ldt.partition.layers if r.group == group), key=lambda r: r.statistic)
        n = len(layers)
        assert layers[0].coefficient == pytest.approx(1 - k * (1 - w_base), abs=1e-12)
        assert layers[-1].coefficient == pytest.approx(1 - k * (1 - w_base - r_base * (n - 1) / n), abs=1e-12)
    stable_low = min(r.coefficient for r in ldt.partition.layers if r.group == 'stable')
    assert stable_low == pytest.approx(0.5556, abs=1e-4)


def all_equal(ldt: LDT, value: float) -> bool:
    values = list(ldt.partition.dpu_coefficients.values())
    return values == pytest.approx([value] * len(values), rel=0, abs=1e-12)


def test_fixed_coefficient_deft_beta_and_clamp(monkeypatch):
    # dpu: false -> w_fixed rescaled; DeFT's beta 0.9999 was written for 40K iterations, one exchange each.
    no_dpu = run(LDTConfig(dpu=False, w_fixed=0.99, profile_iters=0, criterion='random', ema_every=1,
                           ema_reference_iters=4000, ema_reference_every=1), 100, monkeypatch)
    assert all_equal(no_dpu, 1 - 0.01 * 4000 / 100)
    deft = run(preset('deft', head_warmup_iters=10, head_patterns=['6'], ema_reference_iters=40000), 460, monkeypatch)
    assert deft.counted_exchanges == {'stable': 450, 'unstable': 450}
    assert all_equal(deft, 1 - 0.0001 * 40000 / 450)
    # A reference horizon longer than the run: W' < 0 would overshoot; 0 copies the trained weights.
    clamped = run(LDTConfig(dpu=False, w_fixed=0.9, profile_iters=0, criterion='random', ema_every=1,
                            ema_reference_iters=1000, ema_reference_every=1), 50, monkeypatch)
    assert set(clamped.partition.dpu_coefficients.values()) == {0.0}


def test_without_the_option_the_coefficients_are_the_papers(monkeypatch):
    ldt = run(LDTConfig(profile_iters=10, ema_every=1), 60, monkeypatch)
    expected = reference_coefficients(ldt, 1, {'stable': 1, 'unstable': 1})
    assert ldt.partition.dpu_coefficients == pytest.approx(expected, abs=1e-12)


def test_warning_when_every_ema_of_a_group_outlasts_the_run(monkeypatch):
    """The trap: the paper's W over a 450-exchange run (unstable W >= 0.999: 1000 exchanges or more)."""
    paper = run(LDTConfig(profile_iters=50, ema_every=1), 500, monkeypatch)
    lines = paper.horizon_warnings()
    # The stable group's fastest EMA (W 0.99: 100 exchanges) fits in 450; the unstable one's does not.
    assert len(lines) == 1 and lines[0].endswith(
        'Set ldt.ema_reference_iters to the run length the coefficients were written for (200000 for the paper\'s '
        'coefficients, with ema_reference_every 10) to rescale them to this run')
    assert lines[0].startswith("the unstable layers'") and '1000 exchanges' in lines[0] and 'the 450 left' in lines[0]
    deft = LDT(network(), LDTConfig(partition='name', head_patterns=['6'], dpu=False, w_fixed=0.9999, profile_iters=0,
                                    ema_every=1), lambda p, r: torch.optim.SGD(p, lr=0), total_iters=100)
    deft.enter(1)                    # DeFT's split by name: its beta was written for 40,000 exchanges
    assert deft.horizon_warnings() and all(line.endswith("(40000 for DeFT's beta, with ema_reference_every 1) to "
                                                         'rescale them to this run') for line in deft.horizon_warnings())
    unknown_length = LDT(network(), LDTConfig(criterion='random', profile_iters=0), lambda p, r: torch.optim.SGD(p, lr=0))
    unknown_length.enter(1)
    assert unknown_length.horizon_warnings() == []          # no total_iters: nothing to compare with
    scaled = run(LDTConfig(profile_iters=50, ema_every=1, ema_reference_iters=200000), 500, monkeypatch)
    assert scaled.horizon_warnings() == []
    # The paper's own length: 20,000 exchanges; its slowest DPU layers outlast it by design, no warning.
    long_run = LDT(network(), LDTConfig(criterion='random', profile_iters=0), lambda p, r: torch.optim.SGD(p, lr=0),
                   total_iters=200000)
    long_run.enter(1)
    assert long_run.horizon_warnings() == []
    long_run = LDT(network(), LDTConfig(criterion='random', profile_iters=0), lambda p, r: torch.optim.SGD(p, lr=0),
                   total_iters=9990)   # 999 exchanges: the unstable group's fastest EMA needs 1000
    long_run.enter(1)
    assert [line.split("'")[0] for line in long_run.horizon_warnings()] == ['the unstable layers']


def test_with_a_partition_file_the_warning_points_at_its_coefficients(monkeypatch, tmp_path):
    """A partition file's coefficients are used as written (ema_reference_iters is refused with one):
    the warning said to set ema_reference_iters all the same."""
    paper = run(LDTConfig(profile_iters=50, ema_every=1), 500, monkeypatch)
    paper.partition.save(str(tmp_path / 'partition.json'))
    from_file = LDT(network(), LDTConfig(profile_iters=0, ema_every=1, partition_file=str(tmp_path / 'partition.json')),
                    lambda p, r: torch.optim.SGD(p, lr=0), total_iters=450)
    from_file.enter(1)
    (line,) = from_file.horizon_warnings()
    assert line.startswith("the unstable layers'") and 'ema_reference_iters' not in line
    assert line.endswith(f"Lower the coefficients in {tmp_path / 'partition.json'} (its 'coefficient' column), or "
                         'train longer')


def ldt_options(total_iter=500, **ldt):
    return {'train': {'total_iter': total_iter}, 'ldt': ldt}


@pytest.mark.parametrize('ldt, message', [
    ({'ema_reference_iters': '200k'}, r'ldt\.ema_reference_iters: expected an integer >= 1, or null'),
    ({'ema_reference_iters': 0}, r'ldt\.ema_reference_iters: expected an integer >= 1'),
    ({'ema_reference_every': 0, 'ema_reference_iters': 100}, r'ldt\.ema_reference_every: expected an integer >= 1'),
    ({'ema_reference_iters': 5}, r'ldt\.ema_reference_iters: expected at least ema_reference_every \(10\)'),
    ({'method': 'ft', 'ema_reference_iters': 200000}, r"ldt\.ema_reference_iters: .*mode 'single'"),
    ({'partition_file': 'p.json', 'profile_iters': 0, 'ema_reference_iters': 200000},
     r'ldt\.ema_reference_iters: a partition_file carries its own coefficients'),
    # 500 - 300 profiling = 200 training iterations, an exchange every 400: none.
    ({'ema_every': 400, 'ema_reference_iters': 200000}, r'ldt\.ema_reference_iters: a run of 500 iterations leaves '
                                                         r'200 training iterations, in which the stable and unstable EMAs get no exchange'),
    ({'ema_reference_iter': 200000}, r"did you mean 'ema_reference_iters'"),
])
def test_bad_option_values_are_refused_up_front(ldt, message):
    with pytest.raises(InputError, match=message):
        ldt_config_from_options(ldt_options(**ldt))


def test_basicsr_ema_decay_scales_the_same_way():
    """FT+EMA: BasicSR's EMA moves every iteration, so E_ref and E_run are iteration counts."""
    assert scaled_ema_decay({'ema_decay': 0.999, 'total_iter': 450}) is None
    got = scaled_ema_decay({'ema_decay': 0.999, 'ema_reference_iters': 200000, 'total_iter': 4500})
    assert got == pytest.approx(1 - 0.001 * 200000 / 4500, abs=1e-12)
    assert math.isclose(1 / (1 - got), 1000 * 4500 / 200000)         # the same share: 0.5% of the run
    for train, message in (({'ema_decay': 0.999, 'ema_reference_iters': 2e5, 'total_iter': 10},
                            r'train\.ema_reference_iters: expected an integer >= 1'),
                           ({'ema_reference_iters': 100, 'total_iter': 10}, r'which is not set'),
                           ({'ema_decay': 0.8, 'ema_reference_iters': 100, 'total_iter': 10}, r'<= 0')):
        with pytest.raises(InputError, match=message):
            scaled_ema_decay(train)


def _sr_model(tmp_path, model_type, **train):
    """A model built in-process as Train_pip.py builds it (no dataset is read)."""
    from basicsr.models import build_model
    from test_cli import train_options
    opt = train_options(tmp_path / 'no_data', 'ema', total_iter=500, model_type=model_type)
    opt['train'].update(train)
    opt['path'].update(models=str(tmp_path / 'models'), training_states=str(tmp_path / 'states'))
    opt.update(is_train=True, dist=False, rank=0, world_size=1)
    return build_model(opt)


def test_ft_with_ema_trains_with_the_rescaled_decay(tmp_path):
    """FTSRModel uses decay' (what BasicSR's model_ema is called with), not the decay as written; a
    decay whose rescaled value is <= 0 and LDTSRModel with the train key are refused before training."""
    model = _sr_model(tmp_path, 'FTSRModel', ema_decay=0.99, ema_reference_iters=20000)
    assert model.ema_decay == pytest.approx(1 - 0.01 * 20000 / 500, abs=1e-12)       # 0.6
    assert _sr_model(tmp_path, 'FTSRModel', ema_decay=0.99).ema_decay == 0.99
    with pytest.raises(InputError, match=r'train\.ema_reference_iters: .*<= 0'):
        _sr_model(tmp_path, 'FTSRModel', ema_decay=0.99, ema_reference_iters=200000)   # 1 - 4 < 0
    with pytest.raises(InputError, match=r'train\.ema_reference_iters: .*ldt\.ema_reference_iters'):
        _sr_model(tmp_path, 'LDTSRModel', ema_reference_iters=200000)


# ---------------------------------------------------------------- LDT-S, either group first (issue 58)

def exchanges_by_hand(train_iters: int, interval_iters: int, ema_every: int, first_group: str) -> dict:
    """E_run of LDT-S counted iteration by iteration from the rule its docstring states: the groups
    train in turn, ``first_group`` in the first interval; within an interval the EMA of the group that
    trains moves every ``ema_every``-th iteration counted from the interval's start, and at the last
    iteration of a full interval. Written here, not taken from ``ema_horizon``."""
    other = {'stable': 'unstable', 'unstable': 'stable'}
    counts = {'stable': 0, 'unstable': 0}
    for t in range(1, train_iters + 1):
        interval, within = divmod(t - 1, interval_iters)
        group = first_group if interval % 2 == 0 else other[first_group]
        within += 1
        if within % ema_every == 0 or within == interval_iters:
            counts[group] += 1
    return counts


def ldt_s_config(first_group: str, interval_iters: int = 7, ema_every: int = 3, **extra) -> LDTConfig:
    return preset('ldt_s', profile_iters=0, criterion='random', first_group=first_group,
                  interval_iters=interval_iters, ema_every=ema_every, ema_reference_iters=200000, **extra)


def test_ldt_s_unstable_first_rescales_each_group_for_its_own_exchanges(monkeypatch):
    """A user who starts LDT-S with the unstable group (``first_group: unstable``) and rescales the
    paper's coefficients (``ema_reference_iters``) relies on each group's W' being rescaled for the
    exchanges that group really gets in that order. 50 iterations in intervals of 7 from the unstable
    group: u s u s u s u (7 full intervals, 3 exchanges each) then 1 iteration of s (none), so the
    unstable EMA moves 12 times and the stable one 9 -- the reverse of the stable-first run.
    Kills the slip that counts the exchanges as if the stable group trained first (both groups'
    coefficients then use the other group's count)."""
    expected_counts = exchanges_by_hand(50, 7, 3, 'unstable')
    assert expected_counts == {'stable': 9, 'unstable': 12}
    assert exchanges_by_hand(50, 7, 3, 'stable') == {'stable': 12, 'unstable': 9}   # the order matters here
    ldt = run(ldt_s_config('unstable'), 50, monkeypatch)
    assert ldt.counted_exchanges == expected_counts                      # the method really exchanges so
    expected = reference_coefficients(ldt, 200000 / 10, expected_counts)
    got = ldt.partition.dpu_coefficients
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=0, abs=1e-12), name
    assert ldt.alternation.partition.dpu_coefficients == got              # what LDT-S averages with


def test_ldt_s_unstable_first_log_line_states_each_groups_coefficients_and_exchanges(tmp_path):
    """The log line a user reads at the start of training ("LDT EMA coefficients rescaled from ...")
    states, per group, the W range and the exchanges it was rescaled for; with ``first_group:
    unstable`` both must be the unstable-first ones (12 unstable, 9 stable exchanges for 50 iterations
    in intervals of 7, an exchange every 3), counted in the test. Kills the slip that counts the
    exchanges as if the stable group trained first (the line then states 12 stable / 9 unstable and
    the ranges rescaled for them)."""
    from conftest import basicsr_log
    from basicsr.models import build_model
    from test_cli import train_options
    opt = train_options(tmp_path / 'no_data', 'ldt_s_log', total_iter=50, model_type='LDTSRModel')
    opt['ldt'] = {'method': 'ldt_s', 'profile_iters': 0, 'criterion': 'random', 'first_group': 'unstable',
                  'interval_iters': 7, 'ema_every': 3, 'ema_reference_iters': 200000}
    opt['path'].update(models=str(tmp_path / 'models'), training_states=str(tmp_path / 'states'))
    opt.update(is_train=True, dist=False, rank=0, world_size=1)
    model = build_model(opt)
    with basicsr_log() as lines:
        model.update_learning_rate(1)          # the training loop's first call: LDT-S starts here
    line = next(m for m in lines if m.startswith('LDT EMA coefficients rescaled'))
    counts = exchanges_by_hand(50, 7, 3, 'unstable')
    k = {g: 20000 / counts[g] for g in counts}
    for group, (w_base, r_base) in PAPER.items():
        n = len(model.ldt.partition.coefficients(group))
        low, high = 1 - k[group] * (1 - w_base), 1 - k[group] * (1 - w_base - r_base * (n - 1) / n)
        stated = f'{group} W {max(0.0, low):.6g} .. {max(0.0, high):.6g} over {counts[group]} exchanges'
        assert stated in line, (stated, line)


@settings(max_examples=60, deadline=None)
@given(train_iters=st.integers(1, 120), interval_iters=st.integers(1, 12), ema_every=st.integers(1, 12),
       first_group=st.sampled_from(['stable', 'unstable']))
def test_rescaled_coefficients_follow_the_exchanges_of_any_run(train_iters, interval_iters, ema_every, first_group):
    """Property over run lengths, interval lengths, exchange intervals and ``first_group``: every
    layer's W' = 1 - (1 - W) E_ref / E_run with E_run its group's exchanges counted by hand in the
    order the groups really train; a run in which a group gets no exchange is refused naming
    ``ldt.ema_reference_iters``. Kills any slip in the per-group count (the first group ignored, an
    interval's closing exchange dropped or doubled, a partial interval counted as full)."""
    config = ldt_s_config(first_group, interval_iters, ema_every)
    counts = exchanges_by_hand(train_iters, interval_iters, ema_every, first_group)
    if min(counts.values()) == 0:
        with pytest.raises(ValueError, match=r'ldt\.ema_reference_iters: a run of'):
            LDT(network(), config, lambda p, r: torch.optim.SGD(p, lr=0), total_iters=train_iters)
        return
    ldt = LDT(network(), config, lambda p, r: torch.optim.SGD(p, lr=0), total_iters=train_iters)
    ldt.enter(1)
    expected = reference_coefficients(ldt, 200000 / 10, counts)
    got = ldt.partition.dpu_coefficients
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=0, abs=1e-12), name


def test_a_resumed_state_knows_the_run_length_its_coefficients_were_rescaled_for(monkeypatch):
    """A run extended on resume keeps the coefficients rescaled for its first length (they are rescaled
    once, when the partition is made): the state records that length, so the model can say so."""
    config = LDTConfig(mode='dual', profile_iters=10, ema_every=1, ema_reference_iters=200000,
                       ema_reference_every=10)
    done = run(config, 30, monkeypatch)
    state = done.state_dict()
    assert state['total_iters'] == 30
    longer = LDT(network(), config, lambda params, role: torch.optim.SGD(params, lr=1e-2), total_iters=60)
    longer.load_state_dict(state)
    assert (longer.partition_total_iters, longer.total_iters) == (30, 60)
    assert longer.partition.dpu_coefficients == done.partition.dpu_coefficients
    before = LDT(network(), config, lambda params, role: torch.optim.SGD(params, lr=1e-2), total_iters=60)
    before.load_state_dict({k: v for k, v in state.items() if k != 'total_iters'})   # a state from before the record
    assert before.partition_total_iters == 60
