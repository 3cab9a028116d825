"""The LDT algorithm object: phases, exact resume in every phase, baselines as configurations."""
import io

import pytest
import torch
from torch import nn

from basicsr_ldt.ldt import LDT, LDTConfig, preset

TOTAL = 9


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 3, padding=1))


def _loss(iteration):
    g = torch.Generator().manual_seed(iteration)
    x, y = torch.randn(2, 2, 6, 6, generator=g), torch.randn(2, 2, 6, 6, generator=g)
    return lambda m: (m(x) - y).abs().mean()


def _factory(params, role):
    return torch.optim.Adam(params, lr=1e-2)


CFG = dict(head_warmup_iters=2, head_patterns=('5',), profile_iters=3, ratio_u=0.5, ema_every=2)


def _run(algo, start, stop):
    return [algo.update(_loss(i), i) for i in range(start, stop + 1)]


def test_phases_and_logged_losses():
    algo = LDT(_net(), LDTConfig(**CFG), _factory)
    assert [algo.phase(i) for i in range(1, 8)] == ['warmup'] * 2 + ['profile'] * 3 + ['train'] * 2
    logs = _run(algo, 1, 7)
    assert set(logs[0]) == {'l_warmup'} and logs[2] == {} and set(logs[6]) == {'l_primary', 'l_auxiliary'}
    assert algo.partition is not None and len(algo.partition.unstable) == 4   # of 8 tensors
    with pytest.raises(ValueError, match='does not follow'):
        algo.update(_loss(7), 7)


def test_enter_builds_the_phase_without_training():
    net = _net()
    algo = LDT(net, LDTConfig(**CFG), _factory)
    _run(algo, 1, 5)
    before = {n: p.clone() for n, p in net.named_parameters()}
    assert algo.enter(6) == 'train' and algo.enter(6) == 'train'
    assert set(algo.optimizers) == {'primary', 'auxiliary'} and algo.partition is not None
    assert all(torch.equal(p, before[n]) for n, p in net.named_parameters())
    assert set(_run(algo, 6, 6)[0]) == {'l_primary', 'l_auxiliary'}


def test_warmup_trains_only_the_head():
    net = _net()
    before = {n: p.clone() for n, p in net.named_parameters()}
    algo = LDT(net, LDTConfig(**CFG), _factory)
    _run(algo, 1, 2)
    changed = {n for n, p in net.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {'5.weight', '5.bias'}


@pytest.mark.parametrize('k, criterion', [(1, 'var'), (3, 'var'), (5, 'var'), (7, 'var'),
                                          (3, 'sample_var')])   # warm-up, mid-/end of profiling, dual
def test_resume_continues_bitwise(k, criterion):
    cfg = LDTConfig(**CFG, criterion=criterion)
    full = LDT(_net(), cfg, _factory)
    _run(full, 1, TOTAL)
    first = LDT(_net(), cfg, _factory)
    _run(first, 1, k)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = LDT(_net(seed=123), cfg, _factory)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    _run(resumed, k + 1, TOTAL)
    for key in ('primary', 'auxiliary'):
        want, got = full.state_dict()[key], resumed.state_dict()[key]
        assert all(torch.equal(want[n], got[n]) for n in want), key
    assert resumed.partition == full.partition
    assert resumed.dual_steps == full.dual_steps
    want, got = full.composite_state_dict(), resumed.composite_state_dict()
    assert all(torch.equal(want[n], got[n]) for n in want)


def test_resume_rejects_other_options():
    algo = LDT(_net(), LDTConfig(**CFG), _factory)
    _run(algo, 1, 1)
    other = LDT(_net(), LDTConfig(**{**CFG, 'ema_every': 3}), _factory)
    with pytest.raises(ValueError, match=r"different options: \['ema_every'\]"):
        other.load_state_dict(algo.state_dict())


def test_resume_may_change_how_the_dual_step_runs():
    """ldt.overlap_branches and overlap_memory change how the two branches are scheduled, not what they
    compute: a run saved with the branches one after the other resumes overlapped (and back), and ends
    with the weights of the run that never stopped.
    Hand-applied mutants (2026-11-27): kills the one that refused a resume after switching the overlap
    on."""
    full = LDT(_net(), LDTConfig(**CFG), _factory)
    _run(full, 1, TOTAL)
    first = LDT(_net(), LDTConfig(**CFG), _factory)
    _run(first, 1, 6)
    resumed = LDT(_net(seed=123), LDTConfig(**CFG, overlap_branches=True, overlap_memory=1.0), _factory)
    resumed.load_state_dict(first.state_dict())
    _run(resumed, 7, TOTAL - 1)
    again = LDT(_net(seed=123), LDTConfig(**CFG), _factory)
    again.load_state_dict(resumed.state_dict())
    _run(again, TOTAL, TOTAL)
    want, got = full.composite_state_dict(), again.composite_state_dict()
    assert all(torch.equal(want[n], got[n]) for n in want)


def test_training_cannot_start_without_profiling():
    algo = LDT(_net(), LDTConfig(**CFG), _factory)
    with pytest.raises(ValueError, match='without the profiling phase'):
        algo.update(_loss(6), 6)


def test_composite_network_holds_eq12_weights():
    algo = LDT(_net(), LDTConfig(**CFG), _factory)
    _run(algo, 1, 8)
    comp = algo.composite()
    assert comp is not algo.primary and '_conv_forward' not in comp[0].__dict__
    p, a = dict(algo.primary.named_parameters()), dict(algo.auxiliary.named_parameters())
    for n, t in comp.named_parameters():
        src = a if n in algo.partition.stable else p
        assert torch.equal(t, src[n]) and t.requires_grad


def test_branch_copies_are_plain_networks_without_the_routed_conv_forward():
    """A conv whose weight is unstable and bias stable runs bias-apart in the primary, which trains the
    stable tensors (its frozen weight's gradient skipped); the copies ``network()`` hands out (validated, saved, used by inference) all
    train and must run the class's own conv forward, not a method bound to the training branch's
    pattern. Mutation testing: kills ``clear_routing``'s mutants that left the override in place."""
    config = LDTConfig(**{**CFG, 'force_stable': ('3.bias',), 'force_unstable': ('3.weight',)})
    algo = LDT(_net(), config, _factory)
    _run(algo, 1, 8)
    assert '_conv_forward' in algo.primary[3].__dict__   # the pattern this test is about
    for which in ('primary', 'auxiliary', 'composite'):
        copy = algo.network(which)
        assert not [m for m in copy.modules() if '_conv_forward' in m.__dict__], which
    assert '_conv_forward' in algo.primary[3].__dict__   # the training branch keeps its own


@pytest.mark.parametrize('name, overrides', [
    ('ft', {}),
    ('lp_ft', {'head_warmup_iters': 2, 'head_patterns': ('5',)}),
    ('deft', {'head_warmup_iters': 2, 'head_patterns': ('5',)}),
    ('ldt', {'profile_iters': 2, 'ema_every': 2}),
    ('ldt_no_dpu', {'profile_iters': 2, 'ema_every': 2}),
    ('ldt_mean', {'profile_iters': 2, 'ema_every': 2}),
    ('ldt_var_over_mean', {'profile_iters': 2, 'ema_every': 2}),
    ('ldt_random', {'profile_iters': 0, 'ema_every': 2}),
    ('ldt_sample_var', {'profile_iters': 2, 'ema_every': 2}),
    ('ldt_fisher', {'profile_iters': 2, 'ema_every': 2}),
])
def test_each_baseline_configuration_trains(name, overrides):
    cfg = preset(name, **overrides)
    net = _net()
    before = {n: p.clone() for n, p in net.named_parameters()}
    algo = LDT(net, cfg, _factory)
    logs = _run(algo, 1, cfg.head_warmup_iters + cfg.profile_iters + 3)
    assert logs[-1] and all(v == v for v in logs[-1].values())
    comp = algo.composite_state_dict()
    assert any(not torch.equal(comp[n], before[n]) for n in before)
    if name == 'deft':
        assert algo.partition.unstable == ['5.weight', '5.bias']
        assert set(algo.partition.dpu_coefficients.values()) == {0.9999}
    if cfg.mode == 'single':
        assert algo.pair is None and set(algo.optimizers) == {'finetune'}


def test_partition_file_is_used_and_checked(tmp_path):
    algo = LDT(_net(), LDTConfig(**CFG), _factory)
    _run(algo, 1, 6)
    path = str(tmp_path / 'p.json')
    algo.partition.save(path)
    cfg = LDTConfig(partition_file=path, profile_iters=0)
    again = LDT(_net(), cfg, _factory)
    again.update(_loss(1), 1)
    assert again.partition == algo.partition
    wrong = LDT(nn.Sequential(nn.Linear(2, 2)), cfg, _factory)
    with pytest.raises(ValueError, match='does not match the model'):
        wrong.update(_loss(1), 1)


def test_the_smallest_network_ldt_accepts_has_two_tensors():
    """A network with exactly two parameter tensors (one Linear: weight, bias) is split one/one."""
    torch.manual_seed(0)
    net = nn.Linear(3, 3)
    algo = LDT(net, LDTConfig(head_warmup_iters=0, profile_iters=2, ratio_u=0.5, ema_every=1), _factory)
    data = torch.randn(4, 3)
    for i in range(1, 5):
        algo.update(lambda m: (m(data) - data).abs().mean(), i)
    assert sorted([*algo.partition.stable, *algo.partition.unstable]) == ['bias', 'weight']
    assert len(algo.partition.stable) == len(algo.partition.unstable) == 1


class _Blocks(nn.Module):
    """Named like MambaIR/HAT/SAFMN: a shallow conv, ``layers.*`` blocks, a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv_first = nn.Conv2d(2, 4, 3, padding=1)
        self.layers = nn.ModuleList([nn.Conv2d(4, 4, 3, padding=1) for _ in range(2)])
        self.conv_last = nn.Conv2d(4, 2, 3, padding=1)

    def forward(self, x):
        x = self.conv_first(x)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.conv_last(x)


def _trained_partition(network, **options):
    algo = LDT(network, LDTConfig(**options), _factory)
    start = options.get('head_warmup_iters', 0) + options.get('profile_iters', 0) + 1
    _run(algo, 1, start)
    return algo.partition


def test_every_partition_option_reaches_the_trained_partition():
    """What a user sets in the ``ldt:`` block decides the partition the pair trains with (and that
    partition.json shows): the share (ratio_u or ratio_s), forced layers, the DPU bases of each group
    (eq. 9-10), the fixed coefficient without DPU, the criterion, and DeFT's official grouping.
    Mutation testing (issue #33): kills the mutants of ``LDT._make_partition`` that dropped any one of
    these on its way to ``build_partition`` (the ``ldt:`` option silently ignored)."""
    base = dict(head_warmup_iters=0, profile_iters=3, ema_every=2)
    assert len(_trained_partition(_net(), ratio_u=0.25, **base).unstable) == 2          # of 8 tensors
    assert len(_trained_partition(_net(), ratio_u=None, ratio_s=0.25, **base).unstable) == 6
    by_statistic = _trained_partition(_net(), ratio_u=0.5, **base)
    flip_stable, flip_unstable = by_statistic.unstable[0], by_statistic.stable[0]
    forced = _trained_partition(_net(), ratio_u=0.5, force_stable=(flip_stable,), force_unstable=(flip_unstable,),
                                **base)
    assert flip_stable in forced.stable and flip_unstable in forced.unstable
    bases = _trained_partition(_net(), ratio_u=0.5, w_base_stable=0.9, r_base_stable=0.05, w_base_unstable=0.95,
                               r_base_unstable=0.02, criterion='mean', **base)
    w = bases.dpu_coefficients
    assert sorted(w[n] for n in bases.stable) == pytest.approx([0.9 + 0.05 * k / 4 for k in range(4)])
    assert sorted(w[n] for n in bases.unstable) == pytest.approx([0.95 + 0.02 * k / 4 for k in range(4)])
    assert bases.criterion == 'mean'
    fixed = _trained_partition(_net(), ratio_u=0.5, dpu=False, w_fixed=0.9, **base)
    assert set(fixed.dpu_coefficients.values()) == {0.9}
    deft = _trained_partition(_Blocks(), partition='name', deft_grouping='non_layers', dpu=False,
                              head_warmup_iters=0, profile_iters=0, ema_every=1)
    assert deft.stable == ['layers.0.weight', 'layers.0.bias', 'layers.1.weight', 'layers.1.bias']
    assert deft.unstable == ['conv_first.weight', 'conv_first.bias', 'conv_last.weight', 'conv_last.bias']


def test_each_branch_is_a_standalone_copy_of_its_own_weights():
    """``network('primary' | 'auxiliary' | 'composite')`` (what ``val: network:`` validates and what is
    saved): each holds that branch's weights, is a copy that training does not move and that does not
    move training, and a branch before dual training is the one network; other names are refused.
    Mutation testing (issue #33): kills the mutants of ``LDT.network`` that returned a shallow copy
    sharing the primary's tensors, or the composite for 'primary' / 'auxiliary'."""
    algo = LDT(_net(), LDTConfig(**CFG), _factory)
    early = algo.network('auxiliary')
    assert all(torch.equal(early.state_dict()[k], v) for k, v in algo.primary.state_dict().items())
    _run(algo, 1, 8)
    branches = {which: algo.network(which) for which in ('primary', 'auxiliary', 'composite')}
    expected = {'primary': algo.primary.state_dict(), 'auxiliary': algo.auxiliary.state_dict(),
                'composite': algo.composite_state_dict()}
    for which, network in branches.items():
        assert all(torch.equal(network.state_dict()[k], v) for k, v in expected[which].items()), which
    assert not all(torch.equal(branches['primary'].state_dict()[k], v)
                   for k, v in expected['auxiliary'].items())  # the branches differ after training
    kept = {k: v.clone() for k, v in branches['primary'].state_dict().items()}
    with torch.no_grad():
        for p in branches['composite'].parameters():
            p.add_(1.0)
    _run(algo, 9, 9)
    assert all(torch.equal(branches['primary'].state_dict()[k], v) for k, v in kept.items())
    assert not any(torch.equal(p, q) for p, q in zip(branches['composite'].parameters(), algo.primary.parameters()))
    with pytest.raises(ValueError, match=r"^LDT\.network: expected 'composite', 'primary' or 'auxiliary', got 'ema'$"):
        algo.network('ema')


@pytest.mark.parametrize('name, trained', [('ft_stable', 'stable'), ('ft_unstable', 'unstable')])
def test_partial_control_trains_one_group_and_keeps_the_other_at_the_start(name, trained):
    """ft_stable / ft_unstable: the partition LDT would use, then one network of which only the named
    group moves; the composite is that network (no second branch, no exchange)."""
    cfg = preset(name, profile_iters=3, ratio_u=0.5)
    net = _net()
    before = {n: p.clone() for n, p in net.named_parameters()}
    algo = LDT(net, cfg, _factory)
    logs = _run(algo, 1, 6)
    assert set(logs[-1]) == {'l_finetune'} and algo.pair is None and set(algo.optimizers) == {'finetune'}
    moved = {n for n, p in net.named_parameters() if not torch.equal(p, before[n])}
    assert moved == set(getattr(algo.partition, trained)) and len(moved) == 4
    comp = algo.composite_state_dict()
    assert all(torch.equal(comp[n], p) for n, p in net.state_dict().items())
    reference = LDT(_net(), LDTConfig(profile_iters=3, ratio_u=0.5), _factory)  # LDT's own split of the same data
    _run(reference, 1, 4)
    assert reference.partition.groups == algo.partition.groups


def test_partial_control_resumes_bitwise():
    cfg = preset('ft_stable', profile_iters=3, ratio_u=0.5)
    full = LDT(_net(), cfg, _factory)
    _run(full, 1, TOTAL)
    first = LDT(_net(), cfg, _factory)
    _run(first, 1, 5)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = LDT(_net(seed=123), cfg, _factory)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    _run(resumed, 6, TOTAL)
    want, got = full.composite_state_dict(), resumed.composite_state_dict()
    assert all(torch.equal(want[n], got[n]) for n in want)
    assert set(resumed.optimizers) == {'finetune'}


def test_the_freezing_control_split_by_name_trains_the_backbone_alone():
    """ft_stable with DeFT's split by name: no profiling, no statistic, and only the non-head layers move."""
    net = _net()
    before = {n: p.clone() for n, p in net.named_parameters()}
    algo = LDT(net, preset('ft_stable', partition='name', profile_iters=0, head_patterns=('5',)), _factory)
    _run(algo, 1, 2)
    moved = {n for n, p in net.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {'0.weight', '0.bias', '1.weight', '1.bias', '3.weight', '3.bias'}


def test_a_freezing_controls_partition_file_gives_ldt_its_own_coefficients(tmp_path):
    """Audit 6: the control's ldt_partition.json carried w_fixed for every layer, so an LDT run reusing it as its
    partition_file ran without DPU; it carries the DPU coefficients LDT computes from the same statistics."""
    control, ldt = (LDT(_net(), cfg, _factory) for cfg in (preset('ft_stable', profile_iters=3, ratio_u=0.5),
                                                           LDTConfig(profile_iters=3, ratio_u=0.5)))
    for algo in (control, ldt):
        _run(algo, 1, 4)
    assert control.partition == ldt.partition and len(set(ldt.partition.dpu_coefficients.values())) == 8
