"""Mixed precision and non-finite losses: a NaN batch changes nothing in any LDT phase, fp16 loss
scaling never leaks into the profiling statistics, bf16 trains and tests end to end on the CPU,
and bad precision options stop in one line."""
import copy
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import run_entry
from test_cli import dataset, write
from test_ldt_algorithm import _net
from test_ldt_model import NETWORK, ldt_options

from basicsr_ldt.inference.tiling import tiled_forward
from basicsr_ldt.ldt import AMP_DTYPES, LDT, LDTConfig, MixedPrecision, optimizer_step, resolve_dtype
from basicsr_ldt.models.guarded_step import GuardedStepMixin

CFG = dict(head_warmup_iters=2, head_patterns=('5',), profile_iters=3, ratio_u=0.5, ema_every=1)


def _data(iteration):
    g = torch.Generator().manual_seed(iteration)
    return torch.randn(2, 2, 6, 6, generator=g), torch.randn(2, 2, 6, 6, generator=g)


def _loss(iteration, nan_for=None):
    """L1 loss of batch ``iteration``; NaN for the networks in ``nan_for`` (a corrupted batch)."""
    x, y = _data(iteration)
    return lambda m: (m(x) - y).abs().mean() * (math.nan if nan_for is not None and m in nan_for else 1.0)


def _factory(params, role):
    return torch.optim.Adam(params, lr=1e-2)


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _state(algo):
    state = copy.deepcopy(algo.state_dict())
    state.pop('last_iteration')
    return state


@pytest.mark.parametrize('iteration, phase, overlap', [(2, 'warmup', False), (4, 'profile', False),
                                                     (7, 'primary', False), (7, 'primary', True)])
def test_a_nan_batch_changes_nothing_in_any_phase(iteration, phase, overlap):
    algo = LDT(_net(), LDTConfig(**CFG, overlap_branches=overlap), _factory)
    for i in range(1, iteration):
        algo.update(_loss(i), i)
    algo.enter(iteration)
    before = _state(algo)
    losses = algo.update(_loss(iteration, nan_for=[algo.primary]), iteration)
    assert algo.last_skipped == phase and all(math.isnan(v) for v in losses.values())
    # weights and batch-norm statistics of both branches, optimizer state (Adam's step count),
    # profiling statistics, partition, dual-step count (so the EMA/DPU cadence) are unchanged
    assert _same(_state(algo), before)
    networks = [algo.primary] + ([algo.auxiliary] if algo.auxiliary is not None else [])
    assert all(p.grad is None for net in networks for p in net.parameters())   # no gradient kept alive
    algo.update(_loss(iteration + 1), iteration + 1)
    assert algo.last_skipped is None


@pytest.mark.parametrize('overlap', [False, True])
def test_a_nan_in_the_auxiliary_branch_skips_its_step_and_the_exchange(overlap):
    algo = LDT(_net(), LDTConfig(**CFG, overlap_branches=overlap), _factory)
    for i in range(1, 7):
        algo.update(_loss(i), i)
    auxiliary = {k: v.clone() for k, v in algo.auxiliary.state_dict().items()}
    primary = {k: v.clone() for k, v in algo.primary.state_dict().items()}
    dual_steps = algo.dual_steps
    losses = algo.update(_loss(7, nan_for=[algo.auxiliary]), 7)
    assert algo.last_skipped == 'auxiliary' and math.isfinite(losses['l_primary'])
    assert math.isnan(losses['l_auxiliary']) and algo.dual_steps == dual_steps
    assert _same(algo.auxiliary.state_dict(), auxiliary)   # no step, and no exchange into it
    frozen = algo.partition.unstable                       # P's frozen layers: no exchange either
    assert all(torch.equal(algo.primary.state_dict()[n], primary[n]) for n in frozen)


def _profile(precision):
    algo = LDT(_net(), LDTConfig(**{**CFG, 'head_warmup_iters': 0}), _factory, precision)
    for i in range(1, 4):
        algo.update(_loss(i), i)
    return algo.statistics


def test_fp16_loss_scaling_does_not_reach_the_profiling_statistics():
    fp32 = _profile(MixedPrecision())
    fp16 = _profile(MixedPrecision(torch.float16, 'cpu'))  # CPU fp16 only to exercise the scaler here
    assert fp16.samples == fp32.samples == 3
    # Unscaled, the fp16 statistics match fp32's to fp16 accuracy; left scaled (x65536) they would
    # be 65536 (mean) and 2^32 (variance) times larger.
    assert torch.allclose(fp16.abs_sum, fp32.abs_sum, rtol=2e-2, atol=1e-4)
    assert torch.allclose(torch.tensor(fp16.criterion('var')), torch.tensor(fp32.criterion('var')), rtol=5e-2, atol=1e-8)


@pytest.mark.parametrize('overlap', [False, True])
def test_fp16_scalers_are_per_branch_and_resume_exactly(overlap):
    precision = MixedPrecision(torch.float16, 'cpu')
    algo = LDT(_net(), LDTConfig(**CFG, overlap_branches=overlap), _factory, precision)
    for i in range(1, 9):
        algo.update(_loss(i), i)
    state = copy.deepcopy(algo.state_dict())   # as read from disk: no tensor shared with algo
    assert set(state['precision']) == {'warmup', 'profile', 'primary', 'auxiliary'}
    state['precision']['primary']['scale'] = 1024.0   # as after overflows: the loaded scale must be used
    again = LDT(_net(1), LDTConfig(**CFG), _factory, MixedPrecision(torch.float16, 'cpu'))
    again.load_state_dict(state)
    assert again.precision.state_dict() == state['precision']
    precision.scaler('primary').update(1024.0)
    for i in (9, 10):
        assert algo.update(_loss(i), i) == again.update(_loss(i), i)


def test_bf16_autocast_steps_keep_fp32_weights_and_gradients_out_of_the_optimizer():
    net = _net()
    seen = []
    net[0].weight.register_hook(lambda g: seen.append(g.dtype))
    loss = optimizer_step(net, _factory(list(net.parameters()), 'finetune'), _loss(1),
                          MixedPrecision(torch.bfloat16, 'cpu'))
    assert math.isfinite(loss) and seen == [torch.float32]
    assert all(p.dtype == torch.float32 for p in net.parameters())


class Ops(TorchDispatchMode):
    """The names of the aten operators run inside it, in order."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_a_training_step_reads_the_loss_once_after_its_backward():
    """A GPU step is bound by its launches: every host read of a device value stops the CPU until the
    GPU has caught up. The step reads its loss once, with the backward already queued (the finite
    check and the report share it), and a NaN loss still changes no weight. Counted on the CPU: the
    reads are aten._local_scalar_dense (SGD: Adam reads its own step counters)."""
    for nan in (False, True):
        net = _net()
        before = copy.deepcopy(net.state_dict())
        with Ops() as ops:
            loss = optimizer_step(net, torch.optim.SGD(net.parameters(), lr=0.1), _loss(1, {net} if nan else None),
                                  MixedPrecision(torch.bfloat16, 'cpu'))
        reads = [i for i, name in enumerate(ops.names) if name.startswith('_local_scalar_dense')]
        backward = [i for i, name in enumerate(ops.names) if name.startswith('convolution_backward')]
        assert len(reads) == 1 and backward and max(backward) < reads[0], ops.names
        assert math.isfinite(loss) != nan
        assert _same(net.state_dict(), before) == nan      # a NaN loss: gradients dropped, no step


def test_the_dual_step_reads_its_losses_once_both_backward_passes_are_queued():
    """Each host read stops the CPU until the GPU has caught up: the dual step reads the two losses
    after the auxiliary's backward is queued, so the host queues the auxiliary's forward while a GPU
    still runs the primary's backward; the updates follow, the primary's first."""
    algo = LDT(_net(), LDTConfig(**CFG), lambda ps, role: torch.optim.SGD(ps, lr=0.1))
    for i in range(1, 6):
        algo.update(_loss(i), i)
    algo.enter(6)
    with Ops() as ops:
        algo.update(_loss(6), 6)
    reads = [i for i, name in enumerate(ops.names) if name.startswith('_local_scalar_dense')]
    backward = [i for i, name in enumerate(ops.names) if name.startswith('convolution_backward')]
    forward = [i for i, name in enumerate(ops.names) if name.startswith('convolution.')]
    assert len(forward) == 2 * 3 and max(forward) < min(reads)    # both branches' forwards first
    assert len(reads) == 2 and max(backward) < min(reads), ops.names


@pytest.mark.parametrize('value, device, message', [
    ('fp16', 'cpu', 'train.amp: fp16 needs a CUDA device and this run is on the CPU; use bf16 or none'),
    ('half', 'cpu', "train.amp: expected one of 'none', 'bf16', 'fp16', got 'half'"),
])
def test_amp_values_are_checked_up_front(value, device, message):
    with pytest.raises(ValueError) as err:
        resolve_dtype('train.amp', value, AMP_DTYPES, device)
    assert str(err.value) == message
    assert resolve_dtype('train.amp', 'bf16', AMP_DTYPES, 'cpu') is torch.bfloat16


def test_tiled_bf16_inference_returns_fp32_close_to_fp32_inference():
    net = _net().eval()
    lq = torch.rand(1, 2, 13, 11)
    full = tiled_forward(net, lq, 1, tile_size=8, tile_overlap=4)
    half = tiled_forward(net, lq, 1, tile_size=8, tile_overlap=4, dtype=torch.bfloat16)
    assert half.dtype == torch.float32 and not torch.equal(half, full)
    assert torch.allclose(half, full, atol=5e-2)


class _Steps(GuardedStepMixin):
    def __init__(self, limit):
        self.max_bad_steps, self.bad_steps, self.log_dict = limit, 0, {'l_pix': torch.tensor(math.nan)}


def test_bad_step_counter_counts_consecutive_steps_only():
    steps = _Steps(2)
    steps.record_step(1, 'fine-tuning')
    steps.record_step(2, None)
    steps.record_step(3, 'fine-tuning')
    with pytest.raises(FloatingPointError, match=r'iteration 4 in fine-tuning \(l_pix=nan\): 2 consecutive bad steps'):
        steps.record_step(4, 'fine-tuning')


def test_bf16_ldt_run_through_every_phase_then_bf16_test(project, demo_data):
    opt = ldt_options(demo_data, 'bf16')
    opt['train']['amp'] = 'bf16'
    opt['val']['val_freq'] = 8
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'bf16.yml', opt))
    exp = project / 'experiments' / 'bf16'
    log = next(exp.glob('train_bf16_*.log')).read_text()
    for text in ('Mixed precision: autocast bf16; weights', 'head warm-up on D_S1', 'gradient profiling on D_S2',
                 'dual training (cross-frozen primary/auxiliary) from iteration 5', 'Validation'):
        assert text in log
    assert 'non-finite' not in log and (exp / 'ldt_partition.json').is_file()
    composite = torch.load(exp / 'models' / 'net_g_latest.pth', weights_only=True)['params']
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in composite.values())
    test_opt = {'name': 'eval_bf16', 'scale': 4, 'num_gpu': 0, 'network_g': NETWORK, 'path': {},
                'datasets': {'test_1': dataset(demo_data, 'Test', ['Sony'])}, 'test': {'precision': 'bf16'},
                'checkpoints': [{'label': 'LDT', 'path': str(exp / 'models' / 'net_g_latest.pth')}]}
    run_entry(project, 'test.py', '-opt', write(project / 'test.yml', test_opt))
    import json
    summary = json.loads((project / 'results' / 'eval_bf16' / 'metrics.json').read_text())['summary']['LDT']
    assert math.isfinite(summary['Mean']['psnr']) and summary['Mean']['psnr'] > 10
    test_opt['test']['precision'] = 'fp16'
    result = run_entry(project, 'test.py', '-opt', write(project / 'test.yml', test_opt), check=False)
    assert result.returncode == 2 and 'Traceback' not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == ('error: test.precision: fp16 needs a CUDA device and this run '
                                                      'is on the CPU; use bf16 or fp32')


def test_weights_holding_nan_are_never_saved(tmp_path):
    from basicsr_ldt.models.resumable import ResumableMixin

    class Base:                                     # BasicSR's BaseModel takes the options
        def __init__(self, opt):
            self.opt = opt

    class Model(ResumableMixin, Base):
        net_g = _net()

        @staticmethod
        def get_bare_model(network):
            return network

    model = Model({'path': {'models': str(tmp_path)}})
    model.check_savable(5)                          # finite weights: nothing to object to
    with torch.no_grad():
        model.net_g[3].weight[0, 0, 0, 0] = math.inf
    with pytest.raises(FloatingPointError, match='1 weight tensors hold NaN/inf at iteration 6: not saving them'):
        model.check_savable(6)


def test_running_statistics_look_up_a_networks_batch_norms_once_and_follow_its_mode():
    """A skipped step puts batch norm's running statistics back. The norm layers are found once per
    network (a walk over every module cost about a millisecond a step); whether they are in training
    mode is read at every step."""
    from basicsr_ldt.ldt.precision import RunningStatistics
    net = _net()
    assert len(RunningStatistics(net).buffers) == 3            # running mean, variance, batches tracked
    net.eval()
    assert RunningStatistics(net).buffers == []                # eval: the forward changes no statistics
    net.train()
    snapshot = RunningStatistics(net)
    net(torch.randn(2, 2, 6, 6))
    assert not torch.equal(net[1].running_mean, snapshot.saved[0])
    snapshot.restore()
    assert torch.equal(net[1].running_mean, snapshot.saved[0]) and net[1].num_batches_tracked.item() == 0
