"""EMA algebra (eq. 8/11), composite (eq. 12), freezing of the cross-frozen pair, and its dual step
with the branches one after the other or overlapped (ldt.overlap_branches)."""
import contextlib
import threading
import time

import pytest
import torch
from torch import nn

from conftest import on_two_gloo_ranks
from test_ldt_algorithm import _loss

from basicsr_ldt.ldt import (LDT, CrossFrozenPair, LDTConfig, MixedPrecision, build_partition, composite_state,
                             ema_exchange_, route_bias_only_convs, set_trainable)
from basicsr_ldt.ldt.overlap import MemoryGate, OverlappedBranches
from basicsr_ldt.ldt.pair import optimizer_step


def test_ema_exchange_known_numbers():
    frozen = [torch.tensor([4.0, 8.0]), torch.tensor([1.0])]
    trained = [torch.tensor([0.0, 0.0]), torch.tensor([3.0])]
    ema_exchange_(frozen, trained, [0.75, 0.5])
    assert frozen[0].tolist() == [3.0, 6.0]        # 0.75*4 + 0.25*0, 0.75*8
    assert frozen[1].tolist() == [2.0]             # 0.5*1 + 0.5*3
    assert trained[1].tolist() == [3.0]


def test_composite_takes_each_tensor_from_the_right_branch():
    p = {'s': torch.tensor(1.0), 'u': torch.tensor(2.0), 'buf': torch.tensor(3.0)}
    a = {'s': torch.tensor(10.0), 'u': torch.tensor(20.0), 'buf': torch.tensor(30.0)}
    groups = {'s': 'stable', 'u': 'unstable'}
    out = composite_state(p, a, groups)
    assert {k: v.item() for k, v in out.items()} == {'s': 10.0, 'u': 2.0, 'buf': 3.0}
    assert composite_state(p, a, groups, buffers_from='auxiliary')['buf'].item() == 30.0


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Conv2d(4, 2, 3, padding=1))


def test_frozen_tensors_change_only_through_the_ema():
    net = _net()
    names = [n for n, _ in net.named_parameters()]
    part = build_partition(names, [float(i) for i in range(len(names))], partition='criterion',
                           ratio_u=0.5, dpu=False, w_fixed=0.5)
    pair = CrossFrozenPair(net, part, lambda ps, role: torch.optim.Adam(ps, lr=0.1))
    p, a = dict(pair.primary.named_parameters()), dict(pair.auxiliary.named_parameters())
    assert all(not p[n].requires_grad and a[n].requires_grad for n in part.unstable)
    assert all(p[n].requires_grad and not a[n].requires_grad for n in part.stable)
    for opt, branch in ((pair.optimizers['primary'], p), (pair.optimizers['auxiliary'], a)):
        assert {id(t) for g in opt.param_groups for t in g['params']} == {
            id(t) for t in branch.values() if t.requires_grad}
    frozen_before = {('P', n): p[n].clone() for n in part.unstable}
    frozen_before.update({('A', n): a[n].clone() for n in part.stable})
    x, y = torch.randn(2, 2, 5, 5), torch.randn(2, 2, 5, 5)
    loss = lambda m: (m(x) - y).pow(2).mean()   # noqa: E731
    for _ in range(3):
        pair.step('primary', loss)
        pair.step('auxiliary', loss)
    for (branch, n), before in frozen_before.items():
        assert torch.equal((p if branch == 'P' else a)[n], before)
    assert all(t.grad is None for t in list(p.values()) + list(a.values()))
    expected = {n: 0.5 * a[n] + 0.5 * p[n] for n in part.stable}
    expected.update({n: 0.5 * p[n] + 0.5 * a[n] for n in part.unstable})
    pair.exchange()
    for n in part.stable:
        assert torch.allclose(a[n], expected[n], atol=1e-7)
    for n in part.unstable:
        assert torch.allclose(p[n], expected[n], atol=1e-7)
    comp = pair.composite_state_dict()
    for n in part.stable:
        assert comp[n] is pair.auxiliary.state_dict()[n] or torch.equal(comp[n], a[n])
    for n in part.unstable:
        assert torch.equal(comp[n], p[n])
    assert torch.equal(comp['1.running_mean'], pair.primary.state_dict()['1.running_mean'])


def test_bias_only_conv_matches_fused_conv_and_skips_weight_grad():
    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 6, 6)
    reference = conv(x)
    set_trainable(conv, {'bias'})
    assert '_conv_forward' in conv.__dict__
    out = conv(x)
    assert torch.allclose(out, reference, atol=1e-6)
    out.sum().backward()
    assert conv.weight.grad is None
    assert torch.allclose(conv.bias.grad, torch.full((4,), 2 * 6 * 6.0))
    set_trainable(conv, {'weight', 'bias'})
    assert route_bias_only_convs(conv) == 0 and '_conv_forward' not in conv.__dict__


def test_the_auxiliary_follows_the_primarys_mode_walking_its_modules_only_on_a_change(monkeypatch):
    """The SR model switches only the primary between train and eval (validation); the auxiliary
    takes the primary's mode at its next step. nn.Module.train walks every module (2.4 ms a step for
    classic MambaIR's 846, 4.9 ms for HAT's 1098 on the CPU), so it runs only when the modes differ."""
    net = _net()
    names = [n for n, _ in net.named_parameters()]
    part = build_partition(names, [float(i) for i in range(len(names))], partition='criterion',
                           ratio_u=0.5, dpu=False, w_fixed=0.5)
    pair = CrossFrozenPair(net, part, lambda ps, role: torch.optim.SGD(ps, lr=0.1))
    calls = []
    train = pair.auxiliary.train
    monkeypatch.setattr(pair.auxiliary, 'train', lambda mode=True: calls.append(mode) or train(mode))
    x, y = torch.randn(2, 2, 5, 5), torch.randn(2, 2, 5, 5)
    loss = lambda m: (m(x) - y).pow(2).mean()   # noqa: E731
    pair.step('auxiliary', loss)
    pair.step('auxiliary', loss)
    assert calls == [] and pair.auxiliary.training
    pair.primary.eval()
    pair.step('auxiliary', loss)
    assert calls == [False] and not pair.auxiliary.training and not pair.auxiliary[1].training
    before = pair.auxiliary[1].running_mean.clone()
    pair.step('auxiliary', loss)                    # eval: batch norm's running statistics stay
    assert calls == [False] and torch.equal(pair.auxiliary[1].running_mean, before)
    pair.primary.train()
    pair.step('auxiliary', loss)
    assert calls == [False, True] and pair.auxiliary[1].training
    assert not torch.equal(pair.auxiliary[1].running_mean, before)


# -- overlapped branches (ldt.overlap_branches) ------------------------------------------------
OVERLAP_CFG = dict(head_warmup_iters=1, head_patterns=('6',), profile_iters=2, ratio_u=0.5, ema_every=2)


def _dropout_net():
    """Batch norm (running statistics) and dropout (random draws in every forward)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.3),
                         nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 3, padding=1))


def _trained(overlap, iterations=9):
    algo = LDT(_dropout_net(), LDTConfig(**OVERLAP_CFG, overlap_branches=overlap),
               lambda ps, role: torch.optim.Adam(ps, lr=1e-2))
    torch.manual_seed(1)
    logs = [algo.update(_loss(i), i) for i in range(1, iterations + 1)]
    return algo, logs


def test_overlapped_branches_compute_exactly_what_the_sequential_step_computes():
    sequential, seq_logs = _trained(False)
    overlapped, ovl_logs = _trained(True)
    assert ovl_logs == seq_logs and set(ovl_logs[-1]) == {'l_primary', 'l_auxiliary'}
    assert overlapped.dual_steps == sequential.dual_steps == 6        # and 3 exchanges
    for key in ('primary', 'auxiliary', 'optimizers'):
        want, got = sequential.state_dict()[key], overlapped.state_dict()[key]
        assert repr(want) == repr(got), key                            # weights, BN statistics, Adam


def test_the_primary_backward_runs_while_the_auxiliary_runs_forward():
    algo, _ = _trained(True, iterations=3)                     # enters dual training at iteration 4
    algo.enter(4)
    auxiliary_forward = threading.Event()
    seen = []
    algo.auxiliary.register_forward_pre_hook(lambda module, args: auxiliary_forward.set())

    def during_primary_backward(grad):
        seen.append((threading.current_thread().name, auxiliary_forward.wait(timeout=20)))
        return grad
    trained = [p for p in algo.primary.parameters() if p.requires_grad]
    trained[0].register_hook(during_primary_backward)
    algo.update(_loss(4), 4)
    assert seen == [('ldt-primary-backward', True)]


def test_an_error_in_the_primary_backward_reaches_the_caller():
    algo, _ = _trained(True, iterations=3)
    algo.enter(4)

    def fail(grad):
        raise RuntimeError('CUDA out of memory (simulated)')
    next(p for p in algo.primary.parameters() if p.requires_grad).register_hook(fail)
    with pytest.raises(RuntimeError, match='simulated'):
        algo.update(_loss(4), 4)
    assert not any(t.name == 'ldt-primary-backward' for t in threading.enumerate())


def test_a_run_resumes_with_the_other_overlap_setting():
    algo, _ = _trained(False, iterations=5)
    again = LDT(_dropout_net(), LDTConfig(**OVERLAP_CFG, overlap_branches=True),
                lambda ps, role: torch.optim.Adam(ps, lr=1e-2))
    again.load_state_dict(algo.state_dict())
    assert again.pair.overlap_branches and again.dual_steps == algo.dual_steps
    with pytest.raises(ValueError, match='ldt.overlap_branches'):
        LDTConfig(overlap_branches='yes')


class _FakeStream:
    """Stands in for a CUDA stream on the CPU: records who waited for whom."""

    def __init__(self, name, log):
        self.name, self.log, self.device = name, log, f'fake:{name}'

    def wait_stream(self, other):
        self.log.append(('wait', self.name, other.name))


def test_the_cuda_streams_order_each_branch_after_the_batch_and_the_updates_after_both(monkeypatch):
    """The stream protocol a GPU run relies on, with recording stand-ins for CUDA streams: each branch's
    stream waits for the caller's before its forward; P's forward and backward (on the helper thread)
    run on P's stream, A's on A's; the caller's stream waits for both before any update."""
    log, current = [], threading.local()

    @contextlib.contextmanager
    def on(stream):
        before = getattr(current, 'name', 'main')
        current.name = stream.name
        try:
            yield
        finally:
            current.name = before
    monkeypatch.setattr(torch.cuda, 'stream', on)
    monkeypatch.setattr(torch.cuda, 'device', lambda device: log.append(
        ('device', device, threading.current_thread().name)) or contextlib.nullcontext())
    algo, _ = _trained(True, iterations=3)
    algo.enter(4)
    main = _FakeStream('main', log)
    streams = {b: _FakeStream(b, log) for b in ('primary', 'auxiliary')}
    monkeypatch.setattr(OverlappedBranches, 'branch_streams', lambda self, device: (main, streams))
    for branch in ('primary', 'auxiliary'):
        network = getattr(algo.pair, branch)
        network.register_forward_pre_hook(
            lambda m, a, b=branch: log.append(('forward', b, getattr(current, 'name', 'main'))))
        next(p for p in network.parameters() if p.requires_grad).register_hook(
            lambda g, b=branch: log.append(('backward', b, getattr(current, 'name', 'main'))))
        optimizer = algo.pair.optimizers[branch]
        step = optimizer.step
        monkeypatch.setattr(optimizer, 'step', lambda *a, b=branch, s=step, **k: (
            log.append(('update', b, getattr(current, 'name', 'main'))), s(*a, **k))[1])
    algo.update(_loss(4), 4)
    assert log[:3] == [('wait', 'primary', 'main'), ('device', 'fake:primary', 'MainThread'),
                       ('forward', 'primary', 'primary')]
    assert ('device', 'fake:primary', 'ldt-primary-backward') in log      # the helper thread on P's GPU
    # on this thread A's stream waits, then A's forward runs on it (the helper thread's entries fall anywhere)
    caller = [entry for entry in log if entry not in (('device', 'fake:primary', 'ldt-primary-backward'),
                                                      ('backward', 'primary', 'primary'))]
    assert caller.index(('wait', 'auxiliary', 'main')) + 2 == caller.index(('forward', 'auxiliary', 'auxiliary'))
    assert ('backward', 'primary', 'primary') in log and ('backward', 'auxiliary', 'auxiliary') in log
    assert log[-4:] == [('wait', 'main', 'primary'), ('wait', 'main', 'auxiliary'),
                        ('update', 'primary', 'main'), ('update', 'auxiliary', 'main')]


def test_each_branch_stream_is_made_once_on_the_branches_gpu(monkeypatch):
    """One stream per branch on the GPU the branches live on (a torchrun rank's own GPU), made at
    the first overlapped step and kept; the caller's stream is that GPU's current one; none off CUDA.
    Mutation testing of pair.py (2026-11-27): kills the mutants that made the streams at every step, on
    another GPU, or asked another GPU for the caller's stream or the helper thread's device."""
    made, asked = [], []
    monkeypatch.setattr(torch.cuda, 'Stream', lambda device: made.append(device) or object())
    monkeypatch.setattr(torch.cuda, 'current_stream', lambda device: asked.append(device) or 'current')
    overlap = OverlappedBranches(_dropout_net())
    gpu = torch.device('cuda', 1)
    main, streams = overlap.branch_streams(gpu)
    assert main == 'current' and set(streams) == {'primary', 'auxiliary'} and made == [gpu, gpu]
    assert overlap.branch_streams(gpu)[1] is streams and made == [gpu, gpu] and asked == [gpu, gpu]
    assert overlap.branch_streams(torch.device('cpu')) == (None, None)


def _pair(overlap=None, factory=None, **options):
    net = _dropout_net()
    names = [n for n, _ in net.named_parameters()]
    part = build_partition(names, [float(i) for i in range(len(names))], partition='criterion', ratio_u=0.5,
                           dpu=False, w_fixed=0.5)
    factory = factory or (lambda ps, role: torch.optim.SGD(ps, lr=0.1))
    if overlap is None:
        return CrossFrozenPair(net, part, factory, **options)
    return CrossFrozenPair(net, part, factory, overlap_branches=overlap, **options)


def test_by_default_a_branch_finishes_before_the_other_starts():
    """Sequential unless asked: P's backward runs on the caller's thread, before A's forward, so only
    one branch's activations are alive at a time (the memory goal).
    Mutation testing of pair.py (2026-11-27): kills the mutant that overlapped the branches by default."""
    pair, events = _pair(), []
    pair.auxiliary.register_forward_pre_hook(lambda m, a: events.append('auxiliary forward'))
    next(p for p in pair.primary.parameters() if p.requires_grad).register_hook(
        lambda g: events.append(f'primary backward on {threading.current_thread().name}'))
    losses, skipped = pair.step_both(_loss(1))
    assert events == ['primary backward on MainThread', 'auxiliary forward'] and skipped is None
    assert set(losses) == {'l_primary', 'l_auxiliary'}


def test_by_default_ldt_overlaps_the_branches_on_cuda_within_the_sequential_peak_and_not_elsewhere(monkeypatch):
    """ldt.overlap_branches 'auto' with overlap_memory 1.0, the defaults: measured faster on the GPU within
    the memory goal (docs/results.md), so overlapped there; one branch after the other on a CPU."""
    config = LDTConfig()
    assert (config.overlap_branches, config.overlap_memory) == ('auto', 1.0)
    pair, events = _pair(config.overlap_branches, overlap_memory=config.overlap_memory), []
    next(p for p in pair.primary.parameters() if p.requires_grad).register_hook(
        lambda g: events.append(threading.current_thread().name))
    pair.step_both(_loss(1))
    assert events == ['MainThread'] and not pair.overlaps()
    assert pair.schedule() == 'branches one after the other'          # what the training log says
    pair.overlap_branches = True                                       # asked for: overlapped on the CPU too
    assert pair.schedule() == 'branches overlapped (a helper thread; no memory bound off CUDA)'
    pair.overlap_branches = 'auto'
    for device in ('mps', 'xpu', 'cuda'):      # measured on CUDA only: 'auto' overlaps there and nowhere else
        monkeypatch.setattr(pair.auxiliary, 'parameters', lambda d=device: iter([type('P', (), {'device': torch.device(d)})]))
        assert pair.overlaps() is (device == 'cuda'), device
    assert pair.schedule() == ('branches overlapped on two CUDA streams, the auxiliary forward held while the GPU '
                               'holds over x1 its memory at the primary backward start')
    pair.overlap_memory = None
    assert pair.schedule() == 'branches overlapped on two CUDA streams, no memory bound'
    for setting in (False, True):     # an explicit setting holds on any device
        pair.overlap_branches = setting
        assert pair.overlaps() is setting


@pytest.mark.parametrize('overlap', [False, True])
def test_each_branch_gets_its_own_optimizer_role_and_runs_without_a_precision(overlap):
    """Each branch's optimizer is built for its role ('primary', 'auxiliary'), and a pair steps in full
    precision when given none. Mutation testing of pair.py (2026-11-27): kills the mutants of the
    role names and of a step without a precision."""
    roles = []
    pair = _pair(overlap, factory=lambda ps, role: roles.append(role) or torch.optim.SGD(ps, lr=0.1))
    assert roles == ['primary', 'auxiliary']    # a caller attaches its schedulers by role
    losses, skipped = pair.step_both(_loss(1))   # full precision when none is given
    assert skipped is None and all(v == v for v in losses.values())


@pytest.mark.parametrize('overlap', [False, True])
def test_the_auxiliary_runs_in_the_primarys_mode_when_overlapped_too(overlap):
    """The auxiliary takes the primary's train/eval mode, overlapped or not. Mutation testing of pair.py
    (2026-11-27): kills the mutant that left the mode out of the overlapped path."""
    pair, modes = _pair(overlap), []
    pair.auxiliary.register_forward_pre_hook(lambda m, a: modes.append(m.training))
    pair.primary.eval()
    pair.step_both(_loss(1))
    assert modes == [False]


def test_the_composite_takes_its_buffers_from_the_branch_named():
    """``buffers_from``: the composite's buffers (batch-norm statistics) come from the branch named.
    Mutation testing of pair.py (2026-11-27): kills the mutant that took them from the other branch."""
    pair = _pair(buffers_from='auxiliary')
    for i in (1, 2):        # the branches' first layer differs after one step: their batch norms then part
        pair.step_both(_loss(i))
    running = pair.composite_state_dict()['1.running_mean']
    assert torch.equal(running, pair.auxiliary[1].running_mean)
    assert not torch.equal(running, pair.primary[1].running_mean)


@pytest.mark.parametrize('overlap, amp', [(False, None), (True, None), (True, torch.float16)])
def test_the_dual_step_equals_two_branch_steps_one_after_the_other(overlap, amp):
    """The losses are read once both backward passes are queued (and, overlapped, P's backward runs on
    a helper thread), yet the weights, batch-norm statistics and optimizer states are bit for bit those
    of P's whole step followed by A's whole step: the forwards draw dropout in the same order. In fp16
    each branch's loss scaler (P's used on the helper thread) ends as after the two steps."""
    both, one_by_one = _pair(overlap, factory=lambda ps, role: torch.optim.Adam(ps, lr=1e-2)), \
        _pair(False, factory=lambda ps, role: torch.optim.Adam(ps, lr=1e-2))
    for pair in (both, one_by_one):
        pair.precision = MixedPrecision(amp, 'cpu') if amp else None
    def branch_by_branch(pair, loss):
        return {f'l_{branch}': pair.step(branch, loss, pair.precision) for branch in ('primary', 'auxiliary')}
    for pair, step in ((both, lambda pair, loss: pair.step_both(loss, pair.precision)[0]),
                       (one_by_one, branch_by_branch)):
        torch.manual_seed(3)
        pair.logged = [step(pair, _loss(i)) for i in range(1, 4)]
    assert both.logged == one_by_one.logged
    for branch in ('primary', 'auxiliary'):
        assert repr(getattr(both, branch).state_dict()) == repr(getattr(one_by_one, branch).state_dict())
        assert repr(both.optimizers[branch].state_dict()) == repr(one_by_one.optimizers[branch].state_dict())
    if amp:
        assert repr(both.precision.state_dict()) == repr(one_by_one.precision.state_dict())
        assert set(both.precision.state_dict()) == {'primary', 'auxiliary'}


def _gated_pair(monkeypatch, allocated):
    """An overlapped pair bounded by ldt.overlap_memory 1.0, whose 'GPU memory' is ``allocated()``."""
    monkeypatch.setattr(OverlappedBranches, 'allocated_reader', lambda self: allocated)
    monkeypatch.setattr(MemoryGate, 'READ_EVERY_S', 0.0)      # every module checked
    pair = _pair(True, factory=lambda ps, role: torch.optim.Adam(ps, lr=1e-2), overlap_memory=1.0)
    return pair


def test_a_memory_bound_holds_the_auxiliarys_forward_until_the_primary_has_freed_enough(monkeypatch):
    """ldt.overlap_memory on CUDA, simulated: the primary's backward frees 25 units per trained tensor,
    each module of the auxiliary's forward allocates 10. Every module starts only while the memory is
    within the bound (what it was when the primary's backward began), or once that backward is over;
    the weights are still those of the sequential step."""
    live = {'units': 100}
    pair = _gated_pair(monkeypatch, lambda: live['units'])
    starts = []

    def freed(grad):
        time.sleep(0.02)              # a backward slower than the forward it overlaps, as on a GPU
        live['units'] -= 25
        return grad
    for p in pair.primary.parameters():
        if p.requires_grad:
            p.register_hook(freed)
    leaves = [m for m in pair.auxiliary.modules() if not any(True for _ in m.children())]
    torch.manual_seed(3)
    pair.step_both(_loss(1))            # builds the gate; its hooks run before these
    limits = []
    leaves[0].register_forward_pre_hook(lambda m, a: limits.append(pair._overlap.gate.limit))
    for module in leaves:
        module.register_forward_pre_hook(
            lambda m, a: starts.append((live['units'], pair._overlap.gate.released.is_set())))
        module.register_forward_hook(lambda m, a, out: live.update(units=live['units'] + 10))
    live['units'] = 100
    pair.step_both(_loss(2))
    assert len(starts) == len(leaves) and pair._overlap.gate.waits > 0
    assert all(units <= 100 or released for units, released in starts), starts
    assert limits == [100] and pair._overlap.gate.limit is None   # 1.0 x the memory at P's backward; disarmed
    reference = _pair(False, factory=lambda ps, role: torch.optim.Adam(ps, lr=1e-2))
    torch.manual_seed(3)
    for i in (1, 2):
        reference.step_both(_loss(i))
    for branch in ('primary', 'auxiliary'):
        assert repr(getattr(pair, branch).state_dict()) == repr(getattr(reference, branch).state_dict())
    live['units'] = 10 ** 6
    pair.step('auxiliary', _loss(3))           # a later forward is never held
    pair.overlap_memory = None
    pair.step_both(_loss(3))                   # nor an overlapped one without a bound
    assert limits[-1] is None
    pair.overlap_memory, live['units'] = 1.5, 100
    pair.step_both(_loss(4))                   # the bound is the factor times the memory at P's backward
    assert limits[-1] == 150


def test_without_a_memory_bound_the_auxiliary_has_no_gate(monkeypatch):
    """ldt.overlap_memory unset: the auxiliary's modules carry no hook, so the unbounded overlap pays
    nothing per module, even where the GPU's allocator could be read."""
    monkeypatch.setattr(OverlappedBranches, 'allocated_reader', lambda self: _Allocator())
    pair = _pair(True)
    pair.step_both(_loss(1))
    assert pair._overlap.gate is None
    assert not any(m._forward_pre_hooks for m in pair.auxiliary.modules())


def test_a_failing_primary_backward_releases_the_memory_bound(monkeypatch):
    """A primary backward that fails (an out-of-memory error) releases the gate, with a memory figure
    that is never within the bound. Mutation testing of overlap.py (2026-11-27): kills the mutant
    that dropped the release on a failing backward."""
    reads = iter(range(10 ** 12))
    pair = _gated_pair(monkeypatch, lambda: next(reads))       # grows at every read: never within the bound

    def fail(grad):
        raise RuntimeError('CUDA out of memory (simulated)')
    next(p for p in pair.primary.parameters() if p.requires_grad).register_hook(fail)
    with pytest.raises(RuntimeError, match='simulated'):
        pair.step_both(_loss(1))
    assert pair._overlap.gate.limit is None


def test_no_memory_bound_off_cuda():
    pair = _pair(True, overlap_memory=1.0)
    pair.step_both(_loss(1))
    assert pair._overlap.allocated_reader() is None and pair._overlap.gate is None


class _Allocator:
    """A settable 'GPU memory' figure for MemoryGate."""
    units = 0

    def __call__(self):
        return self.units


def test_the_memory_gate_waits_exactly_while_over_its_limit_and_not_released(monkeypatch):
    """``MemoryGate`` on its own with a settable memory figure: held exactly while over its limit and
    not released, and every hold counted. Mutation testing of overlap.py (2026-11-27): kills the
    gate's condition, wait and counter mutants (the loop's ``and`` as ``or`` and the release dropped
    make this test hang rather than fail)."""
    monkeypatch.setattr(MemoryGate, 'READ_EVERY_S', 0.0)
    net, allocated = _dropout_net(), _Allocator()
    gate = MemoryGate(net, allocated)
    assert all(m._forward_pre_hooks for m in net.modules())   # every module, containers (compiled blocks) too
    hold = next(iter(net[0]._forward_pre_hooks.values()))
    allocated.units = 10 ** 6
    hold(net[0], ())                                  # not armed: never held
    gate.arm(100)
    allocated.units = 100
    hold(net[0], ())                                  # at the limit: goes
    assert gate.waits == 0
    allocated.units = 101
    threading.Timer(0.05, lambda: setattr(allocated, 'units', 100)).start()
    safety = threading.Timer(3.0, gate.release)       # a wrong gate would wait for this
    safety.start()
    began = time.monotonic()
    hold(net[0], ())                                  # over: held until the memory is back at the limit
    took = time.monotonic() - began
    safety.cancel()
    assert 0.04 < took < 0.5 and gate.waits == 1
    allocated.units = 101
    threading.Timer(0.02, lambda: setattr(allocated, 'units', 100)).start()
    hold(net[0], ())                                  # each hold over the limit is counted
    assert gate.waits == 2
    gate.release()
    allocated.units = 10 ** 6
    hold(net[0], ())                                  # released: goes whatever the memory
    assert gate.waits == 2


def test_the_memory_gate_leaves_a_compiled_block_one_graph(monkeypatch):
    """Traced inside a compiled block the gate's hooks do nothing (no graph break at each module);
    the block's own hook, outside its graph, still holds it while over the limit."""
    monkeypatch.setattr(MemoryGate, 'READ_EVERY_S', 0.0)
    net, allocated = _dropout_net(), _Allocator()
    gate = MemoryGate(net, allocated)
    gate.arm(100)
    allocated.units = 100
    explained = torch._dynamo.explain(net.forward)(torch.randn(1, 2, 5, 5))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    allocated.units = 101
    threading.Timer(0.05, lambda: setattr(allocated, 'units', 100)).start()
    compiled = torch.compile(net.forward, backend='eager')
    net(torch.randn(1, 2, 5, 5))                      # held at its own hook, then its modules'
    assert gate.waits >= 1
    waits = gate.waits
    allocated.units = 100
    compiled(torch.randn(1, 2, 5, 5))
    assert gate.waits == waits


def test_the_bound_reads_the_allocator_of_the_branches_gpu(monkeypatch):
    """The memory bound reads the allocator of the GPU the branches are on, and nothing on the CPU.
    Mutation testing of overlap.py (2026-11-27): kills the allocator reader's device mutants."""
    asked = []
    monkeypatch.setattr(torch.cuda, 'memory_stats_as_nested_dict',
                        lambda device: asked.append(device) or {'allocated_bytes': {'all': {'current': 123}}})
    overlap = OverlappedBranches(_dropout_net())
    assert overlap.allocated_reader() is None         # on the CPU: nothing to read
    overlap.device = torch.device('cuda', 1)
    assert overlap.allocated_reader()() == 123 and asked == [torch.device('cuda', 1)]


def test_a_branch_step_scales_its_loss_with_its_own_scaler():
    """A single branch step under fp16 uses the scaler of its own key. Mutation testing of pair.py
    (2026-11-27): kills the mutants of ``CrossFrozenPair.step``'s precision and key."""
    pair, precision = _pair(), MixedPrecision(torch.float16, 'cpu')
    pair.step('primary', _loss(1), precision)
    assert set(precision.state_dict()) == {'primary'}


def test_after_a_reading_within_its_limit_the_gate_reads_again_only_after_a_while(monkeypatch):
    """Reading a GPU's allocator before each of hundreds of modules would cost more than it saves."""
    net, reads = _dropout_net(), []
    gate = MemoryGate(net, lambda: reads.append(1) or 50)
    hold = next(iter(net[0]._forward_pre_hooks.values()))
    gate.arm(100)
    for _ in range(5):
        hold(net[0], ())
    assert len(reads) == 1
    time.sleep(MemoryGate.READ_EVERY_S * 2)
    hold(net[0], ())
    assert len(reads) == 2
    gate.arm(100)                                     # a new step reads at once
    hold(net[0], ())
    assert len(reads) == 3


def test_the_figure_read_is_the_one_torch_calls_memory_allocated():
    """torch.cuda.memory_allocated is memory_stats(...)['allocated_bytes.all.current'], and memory_stats
    flattens memory_stats_as_nested_dict: the gate reads that figure without the flattening."""
    import inspect
    assert '"allocated_bytes.all.current"' in inspect.getsource(torch.cuda.memory.memory_allocated)
    assert 'memory_stats_as_nested_dict(device=device)' in inspect.getsource(torch.cuda.memory.memory_stats)


# -- gradients over several ranks (torchrun) ---------------------------------------------------------
def _rank_batch(rank):
    g = torch.Generator().manual_seed(10 + rank)
    return torch.randn(4, 3, generator=g), torch.randn(4, 2, generator=g)


def _rank_step(batches, **step_options):
    """One SGD step of the same small network on the mean squared error of ``batches`` (one each)."""
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    optimizer_step(net, torch.optim.SGD(net.parameters(), lr=0.5),
                   lambda m: sum((m(x) - y).pow(2).mean() for x, y in batches) / len(batches), **step_options)
    return net.state_dict()


def _two_rank_step_worker(rank, out):
    batch = [_rank_batch(rank)]
    torch.save({'averaged': _rank_step(batch), 'own': _rank_step(batch, synchronise=False)}, f'{out}{rank}.pt')


def test_over_two_ranks_a_branch_steps_on_the_mean_gradient(tmp_path):
    """Under torchrun each branch averages its gradients over the ranks itself (a branch cannot be a
    DDP module): both ranks take the step of the two batches' mean gradient, the step of one process
    on both batches, not their sum. ``synchronise=False`` (fine-tuning, whose DDP wrapper has already
    averaged) leaves each rank's gradient as it is.
    Hand-applied mutants (2026-11-27): kills the ones that summed a branch's gradients over the ranks or
    averaged them again after a DDP wrapper, and ``optimizer_step``'s ``synchronise`` default, which
    mutmut cannot reach."""
    on_two_gloo_ranks(_two_rank_step_worker, str(tmp_path / 'rank'))
    ranks = [torch.load(tmp_path / f'rank{r}.pt', weights_only=True) for r in (0, 1)]
    both = _rank_step([_rank_batch(0), _rank_batch(1)])
    for rank, got in enumerate(ranks):
        own = _rank_step([_rank_batch(rank)])
        for name in both:
            torch.testing.assert_close(got['averaged'][name], both[name])
            torch.testing.assert_close(got['own'][name], own[name])
    assert not torch.allclose(ranks[0]['own']['weight'], ranks[1]['own']['weight'])
