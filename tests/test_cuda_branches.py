r"""Every CUDA-only branch of the Python code, run on the CPU: the same lines, selected by a float16
``MixedPrecision``, a faked GPU condition (one small function per module: ``_on_gpu``, ``on_cuda``,
``_copy_event``) or an in-process flag instead of a GPU. "CUDA-only" = code that only a run with
CUDA tensors, ``train: amp: fp16`` / ``test: precision: fp16`` (refused on the CPU up front) or
``--device cuda`` reaches. Found with ``grep -rnE "is_cuda|device.type == 'cuda'|torch\.cuda\.|
GradScaler|pin_memory|non_blocking|synchronize|max_memory_allocated|float16|fp16|autocast"`` over
basicsr_ldt/, archs/, scripts/ and the entry points.

BRANCH (file: what) -> TEST (in this module unless a file is named)

Training and profiling precision (fp16 = torch's GradScaler, which runs on the CPU):
  ldt/precision.py MixedPrecision.scaler/backward/step: one GradScaler per optimizer key
      -> test_fp16_ft_model_skips_overflow_and_nan_and_resumes_its_scaler ('net_g'),
         test_fp16_ldt_model_has_one_scaler_per_optimizer_and_resumes_them ('warmup', 'profile',
         'primary', 'auxiliary'; an overflow in one branch leaves the other's scale and step alone),
         test_fp16_ldt_s_steps_and_resumes ('ldt_s');
         tests/test_precision.py::test_fp16_scalers_are_per_branch_and_resume_exactly
  ldt/precision.py MixedPrecision.backward_unscaled: fp16 profiling (FIXED: the profiling scaler was
  never initialised, the first overflow raised "Attempted update but _scale is None"; and it took
  one host sync per parameter, now one per sample)
      -> test_fp16_profiling_survives_an_overflow_and_backs_off,
         test_fp16_profiling_gradients_are_the_true_gradients,
         test_fp16_profiling_syncs_once_per_sample_not_per_parameter,
         test_fp16_ldt_model_has_one_scaler_per_optimizer_and_resumes_them (through LDTSRModel);
         tests/test_precision.py::test_fp16_loss_scaling_does_not_reach_the_profiling_statistics
  ldt/precision.py resolve_dtype: fp16 accepted on 'cuda', bf16-support check on 'cuda'
      -> test_resolve_dtype_on_cuda_checks_bf16_support
  models/guarded_step.py fp16: setup_precision's log line, optimize_parameters (GradScaler skip on
  overflow, step skipped on a NaN loss, bad-step count), scaler state in the training
  state and on resume -> test_fp16_ft_model_skips_overflow_and_nan_and_resumes_its_scaler
  models/ldt_model.py fp16: the scalers inside the 'ldt' training state, resumed
      -> test_fp16_ldt_model_has_one_scaler_per_optimizer_and_resumes_them, test_fp16_ldt_s_steps_and_resumes

Adam (models/optimizers.py):
  _on_cuda -> fused Adam for every optimizer whose parameters are all on CUDA (train.optim_g.fused not set),
  the log line, and GradScaler handing the fused kernel its scale under fp16
      -> tests/test_optimizers.py (the resolution with CUDA faked, each model's optimizers,
         test_fused_adam_under_fp16_loss_scaling_skips_overflows_and_trains_as_the_loop_adam)

LDT-S host buffer (ldt/ldt_s.py):
  _on_cuda -> _host_copy(pin=True) only for a network on CUDA
      -> test_ldt_s_pins_only_when_cuda_is_there
  exchange/swap on the device (the path taken when a CUDA event exists; on the CPU a stand-in
  event): buffer slices copied non_blocking, EMA (fused lerp) on the device, copied back non_blocking,
  event recorded after the copies, waited for by the device before the next exchange/swap and by
  the host before state_dict/composite_state_dict/load_state_dict
      -> test_ldt_s_device_exchange_matches_a_float64_ema (float64 EMA written in the test),
         test_ldt_s_copy_path_is_bitwise_the_in_place_host_ema;
         tests/test_ldt_s.py (CPU results unchanged, exact resume)

Selective scan (archs/scan/dispatch.py):
  select_kernel for CUDA tensors ('auto' order, forced backends missing)
      -> tests/test_scan_triton.py::test_auto_order_for_cuda_tensors,
         ::test_forced_backends_that_are_unavailable_name_the_option,
         tests/test_selective_scan.py::test_available_kernel_is_used_on_cuda_tensors_only
  selective_scan's call of mamba-ssm's kernel (argument order)
      -> test_mamba_ssm_kernel_gets_mamba_s_argument_order
  checked_kernel/_triton_trial: first Triton call per device tried on copies (forward, backward when
  needed); 'auto' falls back to torch with one warning, never retried; forced 'triton' stops with
  ScanKernelFailed naming the option; CUDA OOM propagates
      -> test_auto_falls_back_to_torch_once_when_triton_fails_at_its_first_call (ptxas, no C compiler,
         compiler failed, shared memory), test_a_backward_kernel_that_fails_is_caught_at_the_first_call_too,
         test_forced_triton_stops_with_one_line_naming_the_option, test_out_of_memory_is_not_a_kernel_failure,
         test_the_decision_is_a_function_of_backend_device_and_trial
  archs/scan/triton_launches.py ``torch.cuda.device(u.device) if u.is_cuda``: n/a here (the kernel launch;
  the kernels run under TRITON_INTERPRET and are compiled for sm_90 in tests/test_scan_triton.py)

Benchmarks and gpu_check.sh:
  scripts/bench_ldt.py on_cuda(): synchronize around timed regions, allocator peak counters, in-process
  memory workers (FIXED: --device cuda crashed with "'int' object is not subscriptable"), one rep,
  3 warm-up steps, device name
      -> test_bench_ldt_cuda_path_runs_its_workers_in_process,
         test_bench_ldt_profile_worker_takes_its_sample_count_in_and_out_of_process
  scripts/bench_scan.py on_cuda(): synchronize in time_fwd_bwd, peak memory and device name in
  compare_backends; a forced backend failing at its first call reported as not run
      -> test_bench_scan_cuda_comparison_with_a_triton_that_fails_to_compile
  scripts/gpu_check.sh Python: the versions report, check_test's mean-PSNR check
      -> test_gpu_check_version_report, test_gpu_check_reads_the_mean_psnr_of_test_py_table;
         no CUDA -> tests/test_gpu_check.py::test_gpu_check_without_cuda_is_one_line_and_non_zero;
         its option files -> tests/test_gpu_check.py::test_gpu_check_option_files_train_and_test_on_cpu

Freezing (ldt/freezing.py):
  _on_gpu -> a conv with frozen weight and trainable bias takes the fused convolution on CUDA
  (cuDNN skips the weight gradient there; the split conv + bias add is for the CPU's oneDNN)
      -> test_bias_only_convs_split_on_the_cpu_and_stay_fused_on_cuda

Inference, resume, processes:
  inference/tiling.py tiled_forward and inference/api.py upscale (through run_inference) under fp16 autocast
      -> test_fp16_inference_runs_under_fp16_autocast_and_returns_fp32
  inference/api.py load_network device 'cuda' (default when available; asked for without CUDA),
  pipelines/upscale.py --device
      -> test_asking_for_cuda_without_it_is_one_clear_error
  models/resumable.py CUDA RNG state saved in and restored from training states
      -> test_cuda_rng_state_is_saved_and_restored
  common/process_group.py start_process_group on GPUs: set_device per local rank, NCCL with a GPU per rank, Gloo
  (and one line) when ranks share a GPU -> test_process_group_on_gpus_picks_the_device_and_backend
  pipelines/evaluate.py ``'cuda' if num_gpu and torch.cuda.is_available()``: the expression runs in every
  test.py test; its CUDA value needs a GPU (n/a)
  pipelines/train.py ``prefetch_mode: cuda``: BasicSR's CUDAPrefetcher (CUDA streams), n/a; the option check
  runs on the CPU
"""
import copy
import io
import logging
import math
import os
import re
import subprocess
import sys
import types
from collections import OrderedDict

import pytest
import torch
from torch import nn

import archs  # noqa: F401  (registers MambaIR)
import archs.scan.dispatch as scan_module
from archs.scan.dispatch import ScanKernelFailed, checked_kernel, selective_scan
from basicsr_ldt.ldt import CrossFrozenPair, MixedPrecision
from basicsr_ldt.ldt import ldt_s as ldt_s_module
from conftest import REPO, load_script
from test_cli import train_options
from test_ldt_algorithm import _run
from test_ldt_model import ldt_options
from test_ldt_s import START, _ldt_s
from test_selective_scan import make_inputs

try:
    from triton.runtime.errors import OutOfResources, PTXASError
except ImportError:  # triton is for Linux x86-64: its own error types are then not needed
    OutOfResources = PTXASError = None
needs_triton = pytest.mark.skipif(PTXASError is None, reason='triton is not installed')

_HOST_READS = ('item', 'tolist', '__bool__', '__float__', '__int__', 'cpu', 'numpy')


class HostSyncs:
    """Counts the tensor-to-host reads (each one a host sync on a GPU) made inside ``with``."""

    def __init__(self, monkeypatch):
        self.count = 0
        self._monkeypatch = monkeypatch

    def __enter__(self):
        for name in _HOST_READS:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                self.count += 1
                return _original(tensor, *args, **kwargs)
            self._monkeypatch.setattr(torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc):
        self._monkeypatch.undo()


def _deep_net(layers=12, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Linear(6, 6) for _ in range(layers)])


def _sample(net, factor=1.0, seed=1):
    """A loss of ``net`` on a fixed batch; ``factor`` large enough overflows the scaled gradients."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    return lambda precision: _autocast_loss(net, x, y, precision) * factor


def _autocast_loss(net, x, y, precision):
    with precision.autocast():
        return (net(x) - y).abs().mean()


# -- fp16 profiling ------------------------------------------------------------------------------
def test_fp16_profiling_survives_an_overflow_and_backs_off():
    net, precision = _deep_net(), MixedPrecision(torch.float16, 'cpu')
    # first sample of the run overflows (loss x 65536 beyond float32): left out, scale halved
    assert precision.backward_unscaled(_sample(net, 1e35)(precision), net.parameters(), 'profile') is False
    assert precision.scaler('profile').get_scale() == 65536.0 / 2
    net.zero_grad(set_to_none=True)
    assert precision.backward_unscaled(_sample(net)(precision), net.parameters(), 'profile') is True
    assert all(torch.isfinite(p.grad).all() for p in net.parameters())
    state = precision.state_dict()['profile']
    assert state['scale'] == 65536.0 / 2 and state['_growth_tracker'] == 1


def test_fp16_profiling_gradients_are_the_true_gradients():
    """Unscaled fp16-autocast gradients = float64 gradients of the same loss, to fp16 accuracy."""
    net = _deep_net(layers=3)
    precision = MixedPrecision(torch.float16, 'cpu')
    assert precision.backward_unscaled(_sample(net)(precision), net.parameters(), 'profile')
    got = [p.grad.clone() for p in net.parameters()]
    reference = _deep_net(layers=3).double()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 6, generator=g).double(), torch.randn(4, 6, generator=g).double()
    (reference(x) - y).abs().mean().backward()
    for ours, ref in zip(got, [p.grad for p in reference.parameters()]):
        assert ours.dtype == torch.float32
        assert torch.allclose(ours.double(), ref, rtol=2e-2, atol=2e-3)


def test_fp16_profiling_syncs_once_per_sample_not_per_parameter(monkeypatch):
    net = _deep_net(layers=12)                       # 24 parameter tensors
    precision = MixedPrecision(torch.float16, 'cpu')
    for factor in (1.0, 1e35, 1.0):                  # clean, overflowing, clean
        loss = _sample(net, factor)(precision)
        with HostSyncs(monkeypatch) as syncs:
            precision.backward_unscaled(loss, net.parameters(), 'profile')
        net.zero_grad(set_to_none=True)
        assert syncs.count == 1


# -- selective-scan backend: first-call check of Triton, fallback of 'auto' -----------------------



FAILURES = {
    'no C compiler': (RuntimeError('Failed to find C compiler. Please specify via CC environment variable '
                                   'or set triton.knobs.build.impl.'),
                      'RuntimeError: Failed to find C compiler. Please specify via CC environment variable '
                      'or set triton.knobs.build.impl.'),
    'compiler failed': (subprocess.CalledProcessError(1, ['gcc', 'main.c']),
                        "CalledProcessError: Command '['gcc', 'main.c']' returned non-zero exit status 1."),
}
if PTXASError is not None:
    FAILURES['ptxas'] = (PTXASError('ptxas fatal   : Unresolved extern function\nmore lines'),
                         'PTXASError: PTXAS error: ptxas fatal   : Unresolved extern function')
    FAILURES['shared memory'] = (OutOfResources(232448, 101376, 'shared memory'),
                                 'OutOfResources: out of resource: shared memory, Required: 232448, Hardware '
                                 'limit: 101376. Reducing block sizes or `num_stages` may help.')


class _FailsInBackward(torch.autograd.Function):
    """A Triton scan whose forward launches and whose backward kernel fails to compile."""

    @staticmethod
    def forward(ctx, u):
        return u.clone(), u.new_zeros(u.shape[0], u.shape[1], 1)

    @staticmethod
    def backward(ctx, dout, dlast):
        raise PTXASError('ptxas fatal   : backward kernel')


@pytest.fixture
def fake_gpu(monkeypatch):
    """selective_scan as on a GPU machine without mamba-ssm, with CPU tensors: the GPU condition
    faked, the first-call records and the log-once set fresh; ``triton(fn)`` installs a Triton
    module whose entry point is ``fn`` and returns the list of its calls."""
    monkeypatch.setattr(scan_module, '_on_gpu', lambda device: True)
    monkeypatch.setattr(scan_module, '_cuda_fn', None)
    monkeypatch.setattr(scan_module, '_cuda_error', 'ImportError: No module named mamba_ssm')
    monkeypatch.setattr(scan_module, '_triton_checked', set())
    monkeypatch.setattr(scan_module, '_triton_failed', {})
    monkeypatch.setattr(scan_module, '_logged', set())
    monkeypatch.delenv(scan_module.BACKEND_ENV, raising=False)

    def triton(fn):
        calls = []

        def entry(*args, out_dtype=None):   # (the out_dtype MambaIR passes goes to the kernels, not here)
            calls.append(args)
            return fn(*args)
        monkeypatch.setattr(scan_module, '_triton_module', types.SimpleNamespace(selective_scan_triton=entry))
        monkeypatch.setattr(scan_module, '_triton_error', None)
        return calls
    return triton


def _raise(err):
    def fn(*args):
        raise err
    return fn


@pytest.fixture
def warnings_logged():
    """The warnings logged to logger 'basicsr' (BasicSR's get_root_logger turns its propagation
    off, so pytest's caplog does not see them once a model was built in this process)."""
    records = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger('basicsr')
    logger.addHandler(handler)
    yield lambda: [r.getMessage() for r in records]
    logger.removeHandler(handler)


@pytest.mark.parametrize('failure', list(FAILURES))
def test_auto_falls_back_to_torch_once_when_triton_fails_at_its_first_call(fake_gpu, warnings_logged, failure):
    err, cause = FAILURES[failure]
    calls = fake_gpu(_raise(err))
    args, softplus = make_inputs('shared', 5, 'D z bias')
    expected = selective_scan(**args, delta_softplus=softplus, backend='torch')
    outs = [selective_scan(**args, delta_softplus=softplus, backend='auto') for _ in range(3)]
    assert len(calls) == 1                               # tried once, at the first call
    assert all(torch.equal(out, expected) for out in outs)
    assert warnings_logged() == [
        f'selective scan: network_g.scan_backend=auto: the Triton kernel failed to compile or launch on cpu at '
        f'its first call ({cause}); using the torch scan on cpu from now on']
    assert all(a.grad is None for a in args.values())   # the trial left no gradient behind


@needs_triton
def test_a_backward_kernel_that_fails_is_caught_at_the_first_call_too(fake_gpu, warnings_logged):
    calls = fake_gpu(lambda u, *rest: _FailsInBackward.apply(u))
    args, _ = make_inputs('const', 4, '')
    with torch.no_grad():
        selective_scan(**args)                           # inference: the forward works
    assert len(calls) == 2 and not warnings_logged()     # the trial, then the call itself
    out = selective_scan(**args)                         # the first call needing a backward
    assert len(calls) == 3 and 'backward kernel' in warnings_logged()[0]
    out.sum().backward()                                 # it ran the torch scan: backward works
    assert args['u'].grad is not None


@needs_triton
def test_forced_triton_stops_with_one_line_naming_the_option(fake_gpu, monkeypatch):
    fake_gpu(_raise(FAILURES['ptxas'][0]))
    args, _ = make_inputs('const', 4, '')
    with pytest.raises(ScanKernelFailed) as caught:
        selective_scan(**args, backend='triton')
    assert str(caught.value) == (
        'network_g.scan_backend=triton: the Triton selective scan failed to compile or launch on cpu at its first '
        f"call ({FAILURES['ptxas'][1]}). Use auto (which then runs torch) or torch.")
    monkeypatch.setenv(scan_module.BACKEND_ENV, 'triton')
    with pytest.raises(ScanKernelFailed, match=r'^\$BASICSR_LDT_SCAN=triton: the Triton selective scan failed'):
        selective_scan(**args)


def test_an_interpreted_failure_names_the_numpy_fix_where_triton_and_numpy_conflict(fake_gpu, monkeypatch):
    """On the CPU interpreter (kernel tests), Triton < 3.7 with numpy >= 2.4 fails at every call:
    the one line then says how to fix the environment; a GPU's failure never gets that hint."""
    calls = fake_gpu(_raise(RuntimeError('only 0-dimensional arrays can be converted to Python scalars')))
    monkeypatch.setattr(scan_module, 'interpreter_numpy_conflict', lambda: 'THE FIX')
    args, _ = make_inputs('const', 4, '')
    with pytest.raises(ScanKernelFailed) as caught:            # a (faked) GPU: no hint
        selective_scan(**args, backend='triton')
    assert 'THE FIX' not in str(caught.value)
    monkeypatch.setattr(scan_module, '_on_gpu', lambda device: False)
    monkeypatch.setattr(scan_module, '_triton_module', types.SimpleNamespace(
        selective_scan_triton=scan_module._triton_module.selective_scan_triton, interpreting=lambda: True))
    with pytest.raises(ScanKernelFailed) as caught:
        selective_scan(**args, backend='triton')
    assert ('(RuntimeError: only 0-dimensional arrays can be converted to Python scalars; THE FIX). Use auto'
            in str(caught.value)) and len(calls) == 2


@pytest.mark.parametrize('triton_version, numpy_version, conflict', [
    ('3.6.0', '2.5.2', True),     # seen here: the GPU image's Triton (torch 2.11's pin) with numpy 2.5.2
    ('3.6.0', '2.4.0', True),     # the numpy of triton-lang/triton issue 9171
    ('3.5.1', '2.4.6', True),
    ('3.6.0', '2.3.5', False),    # seen here: the kernel tests pass
    ('3.7.0', '2.5.2', False),    # 3.7.0's interpreter squeezes the array first (read in its wheel)
    ('3.10.0', '2.4.0', False),   # versions compared as numbers
    ('3.8.0', '1.26.4', False),
])
def test_triton_interpreter_and_numpy_conflict_by_version(triton_version, numpy_version, conflict):
    line = scan_module.interpreter_numpy_conflict(triton_version, numpy_version)
    assert (line is not None) == conflict
    if conflict:
        assert line == (f"Triton {triton_version}'s CPU interpreter fails with numpy {numpy_version} (triton-lang/"
                        "triton issue 9171, fixed in Triton 3.7): pip install 'numpy<2.4' (scripts/install.sh does)")


def test_triton_interpreter_and_numpy_conflict_reads_the_installed_versions(monkeypatch):
    installed = {'triton': '3.6.0', 'numpy': '2.5.2'}

    def version(name):
        if name not in installed:
            raise scan_module.metadata.PackageNotFoundError(name)
        return installed[name]
    monkeypatch.setattr(scan_module.metadata, 'version', version)
    assert scan_module.interpreter_numpy_conflict().startswith("Triton 3.6.0's CPU interpreter fails with numpy 2.5.2")
    del installed['triton']                      # no triton (not Linux x86-64): no interpreter to fail
    assert scan_module.interpreter_numpy_conflict() is None


def test_mamba_ssm_kernel_gets_mamba_s_argument_order(fake_gpu, monkeypatch):
    calls = []
    monkeypatch.setattr(scan_module, '_cuda_fn', lambda *args: calls.append(args) or 'from mamba-ssm')
    args, _ = make_inputs('grouped', 4, 'D z bias')
    assert selective_scan(**args, delta_softplus=True, return_last_state=True) == 'from mamba-ssm'
    order = ('u', 'delta', 'A', 'B', 'C', 'D', 'z', 'delta_bias')
    assert len(calls) == 1 and all(a is args[k] for a, k in zip(calls[0], order)) and calls[0][8:] == (True, True)


def test_out_of_memory_is_not_a_kernel_failure(fake_gpu):
    calls = fake_gpu(_raise(torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')))
    args, _ = make_inputs('const', 4, '')
    for _ in range(2):
        with pytest.raises(torch.cuda.OutOfMemoryError):
            selective_scan(**args)
    assert len(calls) == 2 and not scan_module._triton_failed


@needs_triton
def test_the_decision_is_a_function_of_backend_device_and_trial(fake_gpu):
    fake_gpu(_raise(AssertionError('not called')))
    trials = []
    cuda = torch.device('cuda')
    assert checked_kernel('auto', cuda, False, trials.append) == 'triton'
    assert checked_kernel('auto', cuda, False, trials.append) == 'triton'   # checked: no trial
    assert checked_kernel('auto', cuda, True, trials.append) == 'triton'    # first backward: a trial
    assert checked_kernel('auto', cuda, True, trials.append) == 'triton'
    assert trials == [False, True]
    assert checked_kernel('torch', cuda, True, _raise(AssertionError('not called'))) == 'torch'
    assert checked_kernel('auto', torch.device('cuda', 1), False, _raise(PTXASError('x'))) == 'torch'
    assert checked_kernel('auto', torch.device('cuda', 1), True, _raise(AssertionError('not retried'))) == 'torch'
    assert checked_kernel('auto', cuda, True, _raise(AssertionError('not called'))) == 'triton'  # per device
    bf16 = ('bf16 inputs', 'float32 output')                                  # another compiled variant
    assert checked_kernel('auto', cuda, True, trials.append, bf16) == 'triton'   # its own trial
    assert checked_kernel('auto', cuda, False, trials.append, bf16) == 'triton'  # its backward covers it
    assert trials == [False, True, True]
    assert checked_kernel('auto', cuda, False, _raise(PTXASError('x')), ('fp16',)) == 'torch'   # and its failure
    assert checked_kernel('auto', cuda, False, _raise(AssertionError('not retried'))) == 'torch'


@needs_triton
def test_each_compiled_variant_of_a_call_gets_its_first_call_check(fake_gpu):
    """MambaIR trains under bf16 autocast (bf16 activations, a float32 output) and may validate in
    float32: two compiled kernels, each checked at its first call; a repeat of either is not."""
    calls = fake_gpu(lambda *args: (args[0].float(), args[0].new_zeros(1)))
    args, _ = make_inputs('grouped', 4, 'D+bias+softplus')
    with torch.no_grad():
        for _ in range(2):
            selective_scan(**args, delta_softplus=True, out_dtype=torch.float32)
        half = {k: v.to(torch.bfloat16) if k in ('u', 'delta', 'B', 'C') else v for k, v in args.items()}
        for _ in range(2):
            selective_scan(**half, delta_softplus=True, out_dtype=torch.float32)
    # each variant: one trial, then its two calls
    assert [c[0].dtype for c in calls] == [torch.float32] * 3 + [torch.bfloat16] * 3


def test_the_first_call_check_runs_the_kernel_the_call_runs(fake_gpu, monkeypatch):
    """The trial compiles and launches what the call will: the same input dtypes, softplus and
    output dtype, with a backward only when the call will need one (an inference call with grad
    mode on, as in a validation without no_grad, compiles no backward kernel). A call that
    differs only in softplus or in its output dtype is another compiled kernel, checked apart.
    Mutation testing (issue #38): kills the mutants whose trial ran another kernel than the call
    (without softplus, in another output dtype, on other inputs; a backward trial for an inference call
    with grad mode on; a softplus-only change not checked again)."""
    seen = []

    def entry(*args, out_dtype=None):
        seen.append((tuple(None if a is None else a.dtype for a in args[:8]), args[8], out_dtype,
                     torch.is_grad_enabled()))
        return args[0].to(out_dtype or args[0].dtype) * 1, args[0].new_zeros(1)
    fake_gpu(lambda *args: None)
    monkeypatch.setattr(scan_module, '_triton_module', types.SimpleNamespace(selective_scan_triton=entry))
    args, _ = make_inputs('grouped', 4, 'D+bias+softplus')
    args = {k: v.detach() for k, v in args.items()}
    for softplus, out_dtype in ((True, None), (False, None), (False, torch.float32)):
        seen.clear()
        selective_scan(**args, delta_softplus=softplus, out_dtype=out_dtype)   # grad mode on, nothing needs grad
        trial, call = seen
        assert trial[:3] == call[:3] == (trial[0], softplus, out_dtype) and trial[3] is False
        seen.clear()
        selective_scan(**args, delta_softplus=softplus, out_dtype=out_dtype)
        assert len(seen) == 1                                                 # checked: the call alone
    seen.clear()
    selective_scan(**dict(args, u=args['u'].requires_grad_()), delta_softplus=False, out_dtype=torch.float32)
    assert [s[3] for s in seen] == [True, True]    # a training call: its trial runs the backward too


# -- LDT-S host buffer: pinned on CUDA, EMA and swap on the device, event before host access ---------


class _Event:
    """Stands in for torch.cuda.Event on the CPU: logs what the buffer code asks of it."""

    def __init__(self, log):
        self.log = log

    def record(self):
        self.log.append('record')

    def wait(self):
        self.log.append('wait')

    def synchronize(self):
        self.log.append('synchronize')


@pytest.fixture
def cuda_copy_lines(monkeypatch):
    """LDT-S's CUDA copy path on CPU tensors: an event that logs, slices of a few tensors each."""
    log = []
    monkeypatch.setattr(ldt_s_module, '_copy_event', lambda cuda: _Event(log))
    monkeypatch.setattr(ldt_s_module, 'STAGING_BYTES', 200)
    return log


def test_ldt_s_device_exchange_matches_a_float64_ema(cuda_copy_lines):
    algo = _ldt_s(ema_every=10 ** 6, interval_iters=10 ** 6)   # exchange and swap called here
    _run(algo, 1, START)
    alt, w = algo.alternation, algo.partition.dpu_coefficients
    names = {g: list(getattr(algo.partition, g)) for g in ('stable', 'unstable')}
    assert len(list(alt._slices('stable'))) > 1                  # several slices per exchange
    params = dict(algo.primary.named_parameters())
    ema = {n: t.double().clone() for n, t in zip(names['stable'], alt.buffer['stable'])}
    gen = torch.Generator().manual_seed(3)
    for _ in range(4):                                          # eq. 8/11 in float64, written here
        with torch.no_grad():
            for n in names['stable']:
                params[n].add_(torch.randn(params[n].shape, generator=gen))
        for n in names['stable']:
            ema[n] = w[n] * ema[n] + (1 - w[n]) * params[n].double()
        cuda_copy_lines.clear()
        alt.exchange()
        assert cuda_copy_lines == (['record'] if _ == 0 else ['wait', 'record'])
        for n, b in zip(names['stable'], alt.buffer['stable']):
            assert b.dtype == torch.float32 and torch.allclose(b.double(), ema[n], rtol=1e-6, atol=1e-6)
    trained = {n: params[n].detach().clone() for n in names['stable']}
    parked = {n: t.clone() for n, t in zip(names['unstable'], alt.buffer['unstable'])}
    frozen = {n: params[n].detach().clone() for n in names['unstable']}
    alt.swap()
    assert alt.active == 'unstable'
    for n, b in zip(names['stable'], alt.buffer['stable']):     # stable: EMA on the device, trained parked
        assert torch.allclose(params[n].double(), ema[n], rtol=1e-6, atol=1e-6) and torch.equal(b, trained[n])
    for n, b in zip(names['unstable'], alt.buffer['unstable']):  # unstable: trained back, its EMA parked
        assert torch.equal(params[n], parked[n]) and torch.equal(b, frozen[n])
    cuda_copy_lines.clear()
    alt.composite_state_dict()                                  # the host reads: it waits first, once
    alt.state_dict()
    assert cuda_copy_lines == ['synchronize']


def test_ldt_s_copy_path_is_bitwise_the_in_place_host_ema(cuda_copy_lines, monkeypatch):
    """The CUDA path (buffer slices staged on the device, copied back) with many slices or one,
    and the CPU path (EMA in place in the buffer): the same training run, bit for bit."""
    def run():
        algo = _ldt_s(ema_every=1, interval_iters=2)
        _run(algo, 1, START + 6)
        return algo.state_dict()['alternation'], algo.composite_state_dict()
    runs = [run()]
    assert 'record' in cuda_copy_lines
    monkeypatch.setattr(ldt_s_module, 'STAGING_BYTES', 2 ** 40)
    runs.append(run())
    monkeypatch.setattr(ldt_s_module, '_copy_event', lambda cuda: None)
    cuda_copy_lines.clear()
    runs.append(run())
    assert cuda_copy_lines == []
    for other in runs[1:]:
        for group in ('stable', 'unstable'):
            assert all(torch.equal(a, b) for a, b in zip(runs[0][0]['buffer'][group], other[0]['buffer'][group]))
        assert all(torch.equal(runs[0][1][n], other[1][n]) for n in runs[0][1])


def test_ldt_s_pins_only_when_cuda_is_there(monkeypatch):
    pins = []
    real = ldt_s_module._host_copy
    monkeypatch.setattr(ldt_s_module, '_host_copy', lambda t, pin: pins.append(pin) or real(t, pin))
    algo = _ldt_s()
    _run(algo, 1, START - 1)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)   # a driver, but the network is on the CPU
    algo.enter(START)                                               # builds the buffer
    monkeypatch.undo()
    _run(algo, START, START + 1)
    assert pins and not any(pins) and algo.alternation._copies is None
    assert not any(b.is_pinned() for b in algo.alternation.buffer['stable'])


# -- benchmark scripts: CUDA timing and memory counters, in-process workers -----------------------


class _Tiny(nn.Module):
    """A two-conv SR network with a BasicSR-style head name, so the benchmarks run in seconds."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.conv_first = nn.Conv2d(3, 8, 3, padding=1)
        self.conv_last = nn.Conv2d(8, 3 * scale * scale, 3, padding=1)

    def forward(self, x):
        return nn.functional.pixel_shuffle(self.conv_last(torch.relu(self.conv_first(x))), self.scale)


@pytest.fixture
def fake_cuda_counters(monkeypatch):
    """torch.cuda's clock and memory counters as the CUDA branches call them, on a CPU machine:
    each call is logged; the peak grows by 1 MiB per reading, the reserved peak by 10 MiB."""
    calls = []
    peaks, reserved = iter(range(1, 10 ** 6)), iter(range(1, 10 ** 6))

    def log(name, value=None):
        def fn(*args, **kwargs):
            calls.append(name)
            return value() if callable(value) else value
        monkeypatch.setattr(torch.cuda, name, fn)
    log('synchronize')
    log('reset_peak_memory_stats')
    log('memory_allocated', 4096)
    log('max_memory_allocated', lambda: 4096 + next(peaks) * 2 ** 20)
    log('empty_cache')
    log('memory_reserved', 8192)
    log('max_memory_reserved', lambda: 8192 + next(reserved) * 10 * 2 ** 20)
    log('get_device_name', 'Fake GPU')
    return calls


def test_bench_ldt_cuda_path_runs_its_workers_in_process(fake_cuda_counters, monkeypatch, capsys):
    """gpu_check.sh step 5 (bench_ldt.py --device cuda): the memory workers run in the benchmark's
    own process (was: TypeError 'int' object is not subscriptable), timed regions are bracketed by
    synchronize and memory is read from the allocator counters; here with CPU tensors."""
    bench = load_script('bench_ldt')
    monkeypatch.setattr(bench, 'on_cuda', lambda device: True)
    monkeypatch.setattr(bench, 'build_network', lambda arch, scale: _Tiny(scale))
    monkeypatch.setattr(bench.subprocess, 'run', _raise(AssertionError('no subprocess on CUDA')))
    bench.main(['--device', 'cpu', '--patch', '6', '--batch', '1', '--scale', '2', '--iters', '2', '--warm', '1',
                '--samples', '2', '3', '--profile-passes', '2', '--mem-iters', '1', '--ldt-s-interval', '2'])
    out = capsys.readouterr().out
    assert 'device=cpu amp=none LR patch 6 batch 1 x2' in out and 'Fake GPU' in out
    assert re.search(r'peak memory \(torch\.cuda\.max_memory_allocated; median \[min-max\] of 1 runs\): '
                     r'FT 1\.0 MiB \| dual 2\.0 MiB', out), out
    assert 'memory ratio dual/FT = 2.000' in out
    assert 'profiling peak memory (LR patch 12, batch 1): N=2: 3.0 MiB, N=3: 4.0 MiB' in out
    assert 'memory ratio LDT-S/FT = 1.200' in out                # FT 5 MiB, LDT-S 6 MiB
    assert re.search(r'step ratio LDT-S/FT = \d+\.\d+', out)
    # every memory run: reset, base, work, synchronize, peak
    assert fake_cuda_counters.count('max_memory_allocated') == 6
    assert fake_cuda_counters.count('reset_peak_memory_stats') == 6
    assert fake_cuda_counters.count('empty_cache') == 6           # reserved counts from each run's own start
    assert 'FT 10.0 MiB | dual 20.0 MiB, ratio to FT 2.000' in out
    assert fake_cuda_counters.count('synchronize') > 20


def test_bench_ldt_profile_worker_takes_its_sample_count_in_and_out_of_process(monkeypatch):
    bench = load_script('bench_ldt')
    monkeypatch.setattr(bench, 'build_network', lambda arch, scale: _Tiny(scale))
    args = bench.parse_args(['--device', 'cpu', '--in-process', '--scale', '2', '--profile-patch', '4'])
    assert args.in_process and bench.peak_of(args, 'profile', profile_samples=3)[0] >= 0
    commands = []
    monkeypatch.setattr(bench.subprocess, 'run', lambda cmd, **kw: commands.append(cmd) or
                        types.SimpleNamespace(stdout='{"peak_bytes": 7}\n'))
    args = bench.parse_args(['--device', 'cpu', '--mem-reps', '2'])
    assert not args.in_process and bench.peak_of(args, 'profile', profile_samples=3) == [7, 7]
    assert commands[0][-2:] == ['--profile-samples', '3']
    assert bench.parse_args(commands[0][2:]).profile_samples == 3   # what the child process parses


def test_bench_ldt_times_and_measures_the_dual_step_as_the_defaults_run_it_and_its_other_schedules(
        fake_cuda_counters, monkeypatch, capsys):
    """gpu_check.sh's bench steps: the 'dual' figures are the dual step as LDT's defaults run it
    (ldt.overlap_branches 'auto', overlap_memory 1.0), and --overlap-branches on CUDA adds the branches one
    after the other, overlapped without a bound and within each --overlap-memory factor, timed in the same
    iterations, each with its own memory run and its ratios on the summary line."""
    bench = load_script('bench_ldt')
    monkeypatch.setattr(bench, 'on_cuda', lambda device: True)
    monkeypatch.setattr(bench, 'build_network', lambda arch, scale: _Tiny(scale))
    workers = []
    real_worker = bench.worker
    monkeypatch.setattr(bench, 'worker', lambda args: workers.append((args.worker, args.overlap, args.bound))
                        or real_worker(args))
    stepped, step_both = [], CrossFrozenPair.step_both
    monkeypatch.setattr(CrossFrozenPair, 'step_both', lambda pair, *a: stepped.append(
        (pair.overlap_branches, pair.overlap_memory)) or step_both(pair, *a))
    bench.main(['--device', 'cpu', '--patch', '6', '--batch', '1', '--scale', '2', '--iters', '2', '--warm', '1',
                '--profile-passes', '2', '--mem-iters', '1', '--ldt-s-interval', '2', '--no-profile-memory',
                '--overlap-branches', '--overlap-memory', '1.05', '2'])
    out = capsys.readouterr().out
    # (the stand-in GPU's tensors are on the CPU, where 'auto' runs the branches one after the other)
    assert "dual step: as LDT's defaults run it here (ldt.overlap_branches 'auto', overlap_memory 1): " \
           'branches one after the other' in out.splitlines()
    for label in ('branches one after the other', 'overlapped branches', 'overlapped branches within x1.05 memory',
                  'overlapped branches within x2 memory'):       # wall and process time
        assert len(re.findall(rf'^  {label}: dual [\d.]+ ms, step ratio dual/FT = \d+\.\d+', out, re.M)) == 2, label
    assert 'memory ratio dual/FT = 2.000' in out                  # FT 1 MiB, the default 2, then 3, 4, 5, 6
    assert 'branches one after the other: dual 3.0 MiB, memory ratio dual/FT = 3.000' in out
    assert 'overlapped branches: dual 4.0 MiB, memory ratio dual/FT = 4.000' in out
    assert 'overlapped branches within x1.05 memory: dual 5.0 MiB, memory ratio dual/FT = 5.000' in out
    assert 'overlapped branches within x2 memory: dual 6.0 MiB, memory ratio dual/FT = 6.000' in out
    assert [w for w in workers if w[0] == 'dual'] == [('dual', 'auto', 1.0), ('dual', False, None), ('dual', True, None),
                                                      ('dual', True, 1.05), ('dual', True, 2.0)]
    # each timed iteration (1 warm-up + 2) steps the default, sequential, overlapped and bounded dual steps in turn
    assert stepped[:15] == [('auto', 1.0), (False, None), (True, None), (True, 1.05), (True, 2.0)] * 3
    # what the allocator took from the GPU, beside each figure above (10, 20, ... 60 MiB here)
    assert ('  reserved (torch.cuda.max_memory_reserved after empty_cache; what the process holds on the GPU): FT 10.0 '
            'MiB | dual 20.0 MiB, ratio to FT 2.000 | branches one after the other 30.0 MiB, ratio to FT 3.000 | '
            'overlapped branches 40.0 MiB, ratio to FT 4.000 | overlapped branches within x1.05 memory 50.0 MiB, '
            'ratio to FT 5.000 | overlapped branches within x2 memory 60.0 MiB, ratio to FT 6.000') in out.splitlines()
    assert re.search(r'\| LDT/FT memory 2\.000 .*\| LDT sequential/FT time \d+\.\d+ \| LDT sequential/FT memory 3\.000 '
                     r'\| LDT overlapped/FT time \d+\.\d+ \| LDT overlapped/FT memory 4\.000 '
                     r'\| LDT bounded x1.05/FT time \d+\.\d+ \| LDT bounded x1.05/FT memory 5\.000 '
                     r'\| LDT bounded x2/FT time \d+\.\d+ \| LDT bounded x2/FT memory 6\.000$', out.splitlines()[-1])
    commands = []
    monkeypatch.setattr(bench.subprocess, 'run', lambda cmd, **kw: commands.append(cmd) or
                        types.SimpleNamespace(stdout='{"peak_bytes": 7}\n'))
    monkeypatch.setattr(bench, 'on_cuda', lambda device: False)
    args = bench.parse_args(['--device', 'cpu', '--overlap-branches'])
    for overlap, bound in (('auto', 1.0), (True, 1.05), (True, None), (False, None)):   # what the child parses
        bench.run_worker(args, 'dual', partition='p.json', overlap=overlap, bound=bound)
        child = bench.parse_args(commands[-1][2:])
        assert child.overlap == overlap and type(child.overlap) is type(overlap) and child.bound == bound
    assert bench.parse_args([]).overlap == 'auto'             # a child given nothing runs LDT's default
    with pytest.raises(SystemExit):
        bench.parse_args(['--device', 'cpu', '--overlap-branches', '--overlap-memory', '1', '0.9'])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        'error: --overlap-memory: each ldt.overlap_memory is a multiple of the sequential peak, >= 1; got 0.9')


def test_bench_ldt_overlap_on_a_cpu_measures_no_memory_bound(monkeypatch, capsys):
    bench = load_script('bench_ldt')
    monkeypatch.setattr(bench, 'build_network', lambda arch, scale: _Tiny(scale))
    bench.main(['--device', 'cpu', '--in-process', '--patch', '6', '--batch', '1', '--scale', '2', '--iters', '1',
                '--warm', '1', '--profile-passes', '2', '--ldt-s-interval', '2', '--overlap-branches'])
    out = capsys.readouterr().out
    assert 'overlapped branches within a memory bound: CUDA only' in out and 'LDT bounded' not in out
    assert 'LDT sequential' not in out          # the default already runs the branches one after the other here
    assert re.search(r'\| LDT overlapped/FT time \d+\.\d+ \| LDT overlapped/FT memory n/a$', out.splitlines()[-1])


def test_bench_ldt_ratios_are_per_iteration_medians_with_the_exchanges_amortised(monkeypatch, capsys):
    """The figures the goals are read from, on a stand-in clock: a forward takes 10 ms of wall and 2 ms
    of process time, the dual step's EMA exchange 4 ms (one every --ema-every 2 steps), LDT-S's swap
    50 ms (one every --ldt-s-interval 50) and its exchange 6 ms, the exchanges timed on the wall clock
    and added to both clocks. So the dual step is 22 ms against FT's 10 (2.2; process time 6 against
    2, 3.0), overlapped or not, and LDT-S 14 ms (1.4; 3.0); the summary takes wall time. The warm-up
    step (a first forward of 1 s) is not counted. Peak memory is the median of the fresh runs (FT 1, 2,
    9 MiB; dual 3, 4, 20; LDT-S 2, 2, 30)."""
    bench = load_script('bench_ldt')
    clock = {'wall': 0.0, 'cpu': 0.0}

    def spend(wall, cpu=0.0):
        clock['wall'] += wall
        clock['cpu'] += cpu

    class Clocked(_Tiny):
        forwards = 0

        def forward(self, x):
            spend(0.010 + (1.0 if self.forwards == 0 else 0.0), 0.002)   # a network's first forward: 1 s
            self.forwards += 1
            return super().forward(x)
    monkeypatch.setattr(bench, 'time', types.SimpleNamespace(perf_counter=lambda: clock['wall'],
                                                             process_time=lambda: clock['cpu']))
    monkeypatch.setattr(bench, 'build_network', lambda arch, scale: Clocked(scale))
    for cls, name, cost in ((CrossFrozenPair, 'exchange', (0.004,)),
                            (ldt_s_module.AlternatingFreezing, 'swap', (0.050,)),
                            (ldt_s_module.AlternatingFreezing, 'exchange', (0.006,))):
        original = getattr(cls, name)
        monkeypatch.setattr(cls, name, lambda self, original=original, cost=cost: (spend(*cost), original(self))[1])
    peaks = {'ft': [1, 2, 9], 'dual': [3, 4, 20], 'ldt_s': [2, 2, 30]}
    runs = {kind: 0 for kind in peaks}

    def run_worker(args, kind, **extra):
        runs[kind] += 1
        return {'peak_bytes': peaks[kind][(runs[kind] - 1) % 3] * 2 ** 20}
    monkeypatch.setattr(bench, 'run_worker', run_worker)
    bench.main(['--device', 'cpu', '--patch', '6', '--batch', '1', '--scale', '2', '--iters', '3', '--warm', '1',
                '--profile-passes', '2', '--ema-every', '2', '--ldt-s-interval', '50', '--no-profile-memory',
                '--overlap-branches'])
    out = capsys.readouterr().out
    assert 'FT 10.0 ms | dual 22.0 ms (both branches + EMA 2.000)' in out
    assert 'step ratio dual/FT = 2.200 (median of per-iteration ratios [2.2, 2.2, 2.2]' in out
    assert 'FT 2.0 ms | dual 6.0 ms' in out and 'step ratio dual/FT = 3.000' in out   # process time
    assert out.count('overlapped branches: dual 22.0 ms, step ratio dual/FT = 2.200') == 1
    assert 'step ratio LDT-S/FT = 1.400 (per-iteration ratios [1.4, 1.4, 1.4]' in out
    assert 'step ratio LDT-S/FT = 3.000' in out
    assert 'memory ratio dual/FT = 2.000' in out and 'memory ratio LDT-S/FT = 1.000' in out
    assert out.splitlines()[-1].endswith(
        'FT 10.0 ms | LDT/FT time 2.200 | LDT/FT memory 2.000 | LDT-S/FT time 1.400 | LDT-S/FT memory 1.000'
        ' | LDT overlapped/FT time 2.200 | LDT overlapped/FT memory 2.000')


def test_bench_scan_cuda_comparison_with_a_triton_that_fails_to_compile(fake_gpu, fake_cuda_counters, monkeypatch,
                                                                        capsys):
    """gpu_check.sh step 2 (bench_scan.py --device cuda) on a GPU image where Triton cannot build its
    launcher: torch is timed with the CUDA clock and memory counters, triton is reported as not run
    with the cause, mamba-ssm as missing."""
    fake_gpu(_raise(FAILURES['no C compiler'][0]))
    bench = load_script('bench_scan')
    monkeypatch.setattr(bench, 'on_cuda', lambda device: True)
    args = types.SimpleNamespace(batch=1, d_inner=2, d_state=2, side=2, repeats=2, warmup=1, skip_loop=True)
    bench.compare_backends(args, torch.device('cpu'))
    out = capsys.readouterr().out
    assert out.startswith('device: Fake GPU; torch ')
    assert re.search(r'^torch +fwd\+bwd: median [\d.]+ ms, best [\d.]+ ms, peak memory 1 MB above the inputs$', out,
                     re.M), out
    assert re.search(r'^triton +not run: network_g\.scan_backend=triton: the Triton selective scan failed to compile '
                     r'or launch on cpu at its first call \(RuntimeError: Failed to find C compiler', out, re.M), out
    assert re.search(r'^mamba-ssm +not run: .*mamba-ssm', out, re.M), out
    assert fake_cuda_counters.count('synchronize') == 1 + 2 * 3   # before the counters, around each timed run


# -- train: amp: fp16 through the real models (FT, LDT dual, LDT-S), with skip logic and resume ---------

SCALER_FIELDS = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, _growth_tracker=0)


@pytest.fixture
def fp16_models(monkeypatch, tmp_path):
    """build(opt) -> a BasicSR model with ``train: amp: fp16`` on the CPU: the up-front check that
    refuses fp16 off CUDA is told the run is on CUDA; everything after it is the CUDA code."""
    from basicsr.models import build_model
    from basicsr_ldt.models import guarded_step
    real = guarded_step.resolve_dtype
    monkeypatch.setattr(guarded_step, 'resolve_dtype',
                        lambda key, value, choices, device_type: real(key, value, choices, 'cuda'))

    def build(opt):
        opt = copy.deepcopy(opt)
        opt['train']['amp'] = 'fp16'
        opt.update(is_train=True, dist=False, rank=0, world_size=1)
        opt['path']['training_states'] = str(tmp_path)
        model = build_model(opt)
        assert model.precision.dtype is torch.float16 and model.precision.device_type == 'cpu'
        return model
    return build


def _batch(i, nan=False):
    g = torch.Generator().manual_seed(100 + i)
    gt = torch.rand(2, 3, 32, 32, generator=g)
    if nan:
        gt[0, 0, 0, 0] = math.nan
    return {'lq': torch.rand(2, 3, 8, 8, generator=g), 'gt': gt}


def _step(model, i, **batch):
    model.feed_data(_batch(i, **batch))
    model.optimize_parameters(i)


def _weights(network):
    return {k: v.clone() for k, v in network.state_dict().items()}


def _same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _resumed(build, opt, model, iteration):
    """A fresh model resumed from the training state ``model`` writes at ``iteration`` (read back as
    a file is), weights as BasicSR's resume loads them."""
    model.save_training_state(0, iteration)
    state = torch.load(os.path.join(model.opt['path']['training_states'], f'{iteration}.state'), weights_only=True)
    again = build(opt)
    again.net_g.load_state_dict(model.net_g.state_dict())
    again.resume_training(state)
    return again


def test_fp16_ft_model_skips_overflow_and_nan_and_resumes_its_scaler(fp16_models, demo_data):
    opt = train_options(demo_data, 'fp16_ft')
    model = fp16_models(opt)
    _step(model, 1)
    assert model.precision.state_dict() == {'net_g': {'scale': 65536.0, **SCALER_FIELDS, '_growth_tracker': 1}}
    # scaled gradients overflow: GradScaler skips the optimizer step and backs off; not a bad step
    model.precision.scaler('net_g').update(2.0 ** 100)
    before = _weights(model.net_g)
    _step(model, 2)
    assert _same_weights(_weights(model.net_g), before) and model.bad_steps == 0
    assert model.precision.state_dict()['net_g']['scale'] == 2.0 ** 99
    model.precision.scaler('net_g').update(1024.0)
    _step(model, 3)
    assert not _same_weights(_weights(model.net_g), before)
    # a NaN loss: step skipped (its gradients dropped), counted, scaler untouched
    scaler_state = model.precision.state_dict()
    before = _weights(model.net_g)
    _step(model, 4, nan=True)
    assert model.bad_steps == 1 and _same_weights(_weights(model.net_g), before)
    assert model.precision.state_dict() == scaler_state
    again = _resumed(fp16_models, opt, model, 4)
    assert again.bad_steps == 1 and again.precision.state_dict() == scaler_state
    for i in (5, 6):
        _step(model, i)
        _step(again, i)
    assert _same_weights(_weights(again.net_g), _weights(model.net_g))
    assert again.precision.state_dict() == model.precision.state_dict() and again.bad_steps == model.bad_steps == 0


def test_fp16_ldt_model_has_one_scaler_per_optimizer_and_resumes_them(fp16_models, demo_data):
    # warm-up 1-2, profiling 3-5 (the first sample overflows), dual training from 6
    opt = ldt_options(demo_data, 'fp16_ldt', total_iter=10, profile_iters=3)
    model = fp16_models(opt)
    for i in (1, 2):
        _step(model, i)
    # the profiling scaler, never used before: an overflow at its first sample (was: "Attempted
    # update but _scale is None") leaves the sample out; a backoff of 2^-30 makes the next usable
    model.precision.scaler('profile').load_state_dict({'scale': 2.0 ** 40, **SCALER_FIELDS, 'backoff_factor': 2.0 ** -30})
    for i in (3, 4, 5):
        _step(model, i)
    assert model.ldt.statistics.samples == 2 and model.bad_steps == 0
    assert model.precision.state_dict()['profile']['scale'] == 2.0 ** 10
    _step(model, 6)
    assert set(model.precision.state_dict()) == {'warmup', 'profile', 'primary', 'auxiliary'}
    # an overflow in the primary branch skips its step and lowers its scale only
    model.precision.scaler('primary').update(2.0 ** 100)
    primary, auxiliary = _weights(model.ldt.primary), _weights(model.ldt.auxiliary)
    aux_scale = model.precision.state_dict()['auxiliary']['scale']
    _step(model, 7)
    stable = model.ldt.partition.stable
    assert all(torch.equal(model.ldt.primary.state_dict()[n], primary[n]) for n in stable)
    assert any(not torch.equal(model.ldt.auxiliary.state_dict()[n], auxiliary[n]) for n in model.ldt.partition.unstable)
    assert model.precision.state_dict()['primary']['scale'] == 2.0 ** 99
    assert model.precision.state_dict()['auxiliary']['scale'] == aux_scale
    model.precision.scaler('primary').update(4096.0)
    _step(model, 8)
    again = _resumed(fp16_models, opt, model, 8)
    assert again.precision.state_dict() == model.precision.state_dict()
    for i in (9, 10):
        _step(model, i)
        _step(again, i)
    assert _same_weights(again.ldt.composite_state_dict(), model.ldt.composite_state_dict())
    assert again.precision.state_dict() == model.precision.state_dict()


def test_fp16_ldt_s_steps_and_resumes(fp16_models, demo_data):
    opt = ldt_options(demo_data, 'fp16_ldt_s', total_iter=10, method='ldt_s', interval_iters=2, ema_every=1)
    model = fp16_models(opt)
    for i in range(1, 7):
        _step(model, i)
    assert model.ldt.alternation is not None and 'ldt_s' in model.precision.state_dict()
    model.precision.scaler('ldt_s').update(2.0 ** 100)
    active = model.ldt.alternation.active
    before = _weights(model.ldt.primary)
    _step(model, 7)                                   # overflow: no optimizer step (EMA still runs)
    params = dict(model.ldt.primary.named_parameters())
    assert model.precision.state_dict()['ldt_s']['scale'] == 2.0 ** 99
    assert all(torch.equal(params[n], before[n]) for n in getattr(model.ldt.partition, active))
    model.precision.scaler('ldt_s').update(2048.0)
    again = _resumed(fp16_models, opt, model, 7)
    for i in (8, 9, 10):
        _step(model, i)
        _step(again, i)
    assert _same_weights(again.ldt.composite_state_dict(), model.ldt.composite_state_dict())
    assert again.precision.state_dict() == model.precision.state_dict()


# -- other CUDA-only lines: bf16 support check, fp16 inference, CUDA RNG state, process group ------
def test_resolve_dtype_on_cuda_checks_bf16_support(monkeypatch):
    from basicsr_ldt.ldt import INFERENCE_DTYPES, resolve_dtype
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: False)
    with pytest.raises(ValueError) as err:
        resolve_dtype('test.precision', 'bf16', INFERENCE_DTYPES, 'cuda')
    assert str(err.value) == 'test.precision: this GPU has no bfloat16 support; use fp16 or fp32'
    assert resolve_dtype('test.precision', 'fp16', INFERENCE_DTYPES, 'cuda') is torch.float16
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: True)
    assert resolve_dtype('test.precision', 'bf16', INFERENCE_DTYPES, 'cuda') is torch.bfloat16


def test_fp16_inference_runs_under_fp16_autocast_and_returns_fp32(monkeypatch):
    """test.py's and upscale()'s fp16 path (refused on the CPU up front; the check is bypassed)."""
    from basicsr_ldt.inference import api, settings
    from basicsr_ldt.inference.tiling import tiled_forward
    torch.manual_seed(0)
    net = _Tiny(2).eval()
    lq = torch.rand(1, 3, 13, 11)
    seen = []
    net.conv_last.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    full = tiled_forward(net, lq, 2, tile_size=8, tile_overlap=4)
    half = tiled_forward(net, lq, 2, tile_size=8, tile_overlap=4, dtype=torch.float16)
    assert seen[-1] == torch.float16 and half.dtype == torch.float32
    assert torch.allclose(half, full, atol=5e-3) and not torch.equal(half, full)
    monkeypatch.setattr(settings, 'resolve_dtype', lambda key, value, choices, device_type: choices[value])
    out = api.upscale(net, lq, precision='fp16')
    assert seen[-1] == torch.float16 and out.dtype == torch.float32
    assert torch.allclose(out, full.clamp(0, 1), atol=5e-3)


def test_asking_for_cuda_without_it_is_one_clear_error(tmp_path, monkeypatch):
    """``device='cuda'`` where torch sees no GPU is one ``InputError`` line; by default the CPU.
    Mutation testing (inference run of 2026-11-26): kills 7 of the 10 mutants of ``resolve_device``
    that the inference tests left alive."""
    from basicsr_ldt.common.errors import InputError
    from basicsr_ldt.inference.api import load_network
    network = {'type': 'SAFMN', 'dim': 8, 'n_blocks': 1, 'ffn_scale': 2.0, 'upscaling_factor': 2}
    from basicsr.archs import build_network
    torch.save({'params': build_network(dict(network)).state_dict()}, tmp_path / 'net.pth')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    with pytest.raises(InputError, match="^device 'cuda' was asked for, but torch sees no CUDA device$"):
        load_network(str(tmp_path / 'net.pth'), opt={'network_g': network}, device='cuda')
    assert next(load_network(str(tmp_path / 'net.pth'), opt={'network_g': network}).parameters()).device.type == 'cpu'


def test_the_default_device_is_the_gpu_when_torch_sees_one(monkeypatch):
    """``resolve_device``: the GPU by default when torch sees one, a device asked for as asked. Mutation
    testing (inference run of 2026-11-26): kills the mutants that defaulted to the CPU beside a GPU."""
    from basicsr_ldt.inference.api import resolve_device
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    assert resolve_device() == torch.device('cuda') and resolve_device('cuda:1') == torch.device('cuda:1')
    assert resolve_device('cpu') == torch.device('cpu')   # asked for, the CPU even beside a GPU
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    assert resolve_device() == torch.device('cpu')


def test_cuda_rng_state_is_saved_and_restored(monkeypatch):
    from basicsr_ldt.models import resumable
    states = [torch.arange(16, dtype=torch.uint8), torch.arange(16, 32, dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'is_initialized', lambda: True)
    monkeypatch.setattr(torch.cuda, 'get_rng_state_all', lambda: [s.clone() for s in states])
    monkeypatch.setattr(torch.cuda, 'set_rng_state_all', restored.append)
    buffer = io.BytesIO()
    torch.save(resumable.rng_state(), buffer)
    buffer.seek(0)
    resumable.set_rng_state(torch.load(buffer, weights_only=True))   # as a .state file is read
    assert len(restored) == 1 and all(torch.equal(a, b) for a, b in zip(restored[0], states))


@pytest.mark.parametrize('gpus, ranks, backend', [(2, 2, 'nccl'), (1, 2, 'gloo')])
def test_process_group_on_gpus_picks_the_device_and_backend(monkeypatch, capsys, gpus, ranks, backend):
    from basicsr_ldt.common import process_group as distributed
    started, devices = [], []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: gpus)
    monkeypatch.setattr(torch.cuda, 'set_device', devices.append)
    monkeypatch.setattr(distributed.dist, 'init_process_group', lambda backend: started.append(backend))
    monkeypatch.setenv('LOCAL_WORLD_SIZE', str(ranks))
    for rank in range(ranks):
        monkeypatch.setenv('LOCAL_RANK', str(rank))
        distributed.start_process_group()
    assert started == [backend] * ranks and devices == [r % gpus for r in range(ranks)]
    shared = [f'{ranks} ranks share {gpus} GPU(s): NCCL needs one GPU per rank, using the Gloo backend']
    assert capsys.readouterr().err.splitlines() == (shared if backend == 'gloo' else [])


# -- scripts/gpu_check.sh: its Python pieces --------------------------------------------------------


def _gpu_check_python(marker):
    """The Python heredoc of scripts/gpu_check.sh that follows the line containing ``marker``."""
    text = (REPO / 'scripts' / 'gpu_check.sh').read_text()
    match = re.search(re.escape(marker) + r"[^\n]*<<'EOF'\n(.*?)\nEOF\n", text, re.S)
    assert match, marker
    return match.group(1)


def test_gpu_check_version_report(monkeypatch, capsys):
    code = _gpu_check_python('run_step versions')
    monkeypatch.setattr(torch.cuda, 'get_device_properties',
                        lambda i: types.SimpleNamespace(total_memory=80 * 2 ** 30, major=9, minor=0))
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda i: 'NVIDIA H100 80GB HBM3')
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: True)
    monkeypatch.setattr(torch.backends.cudnn, 'version', lambda: 91000)
    monkeypatch.setenv('PATH', '/nonexistent')                  # no nvidia-smi
    exec(compile(code, 'gpu_check.sh:versions', 'exec'), {'__name__': '__main__'})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f'GPU NVIDIA H100 80GB HBM3 (80 GiB, sm_90) x1, driver unknown (no nvidia-smi), '
                        f'CUDA {torch.version.cuda}, cuDNN 91000')
    assert re.fullmatch(rf'torch {re.escape(torch.__version__)}, triton \S+, mamba-ssm (present|absent), bf16 True',
                        lines[1])


@pytest.mark.parametrize('psnr, ok', [(27.31, True), (math.nan, False), (4.0, False)])
def test_gpu_check_reads_the_mean_psnr_of_test_py_table(tmp_path, psnr, ok):
    from collections import OrderedDict
    from basicsr_ldt.pipelines.evaluate import write_results
    rows = OrderedDict([('Sony', {'psnr': psnr, 'ssim': 0.8, 'images': 2}),
                        ('Mean', {'psnr': psnr, 'ssim': 0.8, 'images': 2})])
    write_results(str(tmp_path), OrderedDict([('LDT-bf16', rows), ('Other', rows)]), {},
                  {'channel': 'Y', 'crop_border': 4, 'inference': 'whole images, bf16'})
    code = _gpu_check_python('"$PY" - "$table"')
    run = subprocess.run([sys.executable, '-', str(tmp_path / 'metrics.md')], input=code, capture_output=True,
                         text=True, timeout=60)
    assert (run.returncode == 0) == ok
    if not ok:
        assert run.stderr.strip() == f'mean PSNR {psnr} is not a plausible SR output'


def test_bias_only_convs_split_on_the_cpu_and_stay_fused_on_cuda(monkeypatch):
    """A conv whose weight is frozen and whose bias trains: on the CPU its bias is added apart (oneDNN's
    fused backward would compute the weight gradient anyway); with CUDA inputs the fused convolution
    runs (cuDNN computes only the gradients asked for; the split only added operators). Both give the
    same output and bias gradient and no weight gradient."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from basicsr_ldt.ldt import freezing

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls.append((func.__name__, args))
            return func(*args, **(kwargs or {}))
    results = {}
    for gpu in (False, True):
        monkeypatch.setattr(freezing, '_on_gpu', lambda tensor: gpu)
        torch.manual_seed(0)
        conv = nn.Conv2d(3, 4, 3, padding=1)
        freezing.set_trainable(conv, {'bias'})
        x = torch.randn(2, 3, 6, 6)
        with Ops() as ops:
            out = conv(x)
        convs = [args for name, args in ops.calls if name.startswith('convolution')]
        adds = [name for name, _ in ops.calls if name.startswith('add')]
        assert len(convs) == 1 and (convs[0][2] is None) != gpu and bool(adds) != gpu, ops.calls
        out.square().sum().backward()
        assert conv.weight.grad is None
        results[gpu] = (out.detach(), conv.bias.grad)
    assert torch.allclose(results[True][0], results[False][0], atol=1e-6)
    assert torch.allclose(results[True][1], results[False][1], rtol=1e-5)
