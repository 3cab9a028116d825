"""Every CUDA-only branch of the Python code, run on the CPU: the same lines, selected by a
float16 ``MixedPrecision``, a fake "CUDA" condition or an in-process flag instead of a GPU.

BRANCHES (CUDA-only code -> the CPU test that runs its lines; "n/a" = nothing testable)

Training and profiling precision (``train: amp: fp16`` is refused on the CPU up front, so the
tests build ``MixedPrecision(torch.float16, 'cpu')``: torch's GradScaler and fp16 autocast run
on the CPU):
  ldt/precision.py MixedPrecision.scaler/backward/step (fp16 GradScaler per optimizer key)
      -> test_fp16_ft_model_skips_overflow_and_nan_and_resumes_its_scaler (FT, GuardedStepMixin),
         test_fp16_ldt_model_has_one_scaler_per_optimizer_and_resumes_them (LDT dual: warmup,
         profile, primary, auxiliary), test_fp16_ldt_s_steps_and_resumes (LDT-S: ldt_s);
         tests/test_precision.py::test_fp16_scalers_are_per_branch_and_resume_exactly
  ldt/precision.py MixedPrecision.backward_unscaled (fp16 profiling)
      -> test_fp16_profiling_survives_an_overflow_and_backs_off (was: "Attempted update but
         _scale is None"), test_fp16_profiling_gradients_are_the_true_gradients,
         test_fp16_profiling_syncs_once_per_sample_not_per_parameter
  ldt/precision.py resolve_dtype: fp16 accepted only for 'cuda', bf16 support check on 'cuda'
      -> test_resolve_dtype_on_cuda_checks_bf16_support (torch.cuda.is_bf16_supported faked)
  models/guarded_step.py setup_precision / optimize_parameters / extra_training_state /
  load_extra_training_state with fp16 (skip on non-finite loss, scaler state in the training
  state) -> test_fp16_ft_model_skips_overflow_and_nan_and_resumes_its_scaler

LDT-S host buffer (ldt/ldt_s.py):
  pinned host buffer and non_blocking copies when the parameters are on CUDA; EMA on the device,
  copy back, event before the host buffer is read again
      -> test_ldt_s_device_exchange_matches_a_float64_ema (the device path with pin and the
         CUDA event disabled, i.e. the same lines on CPU parameters with a separate buffer),
         test_ldt_s_pins_only_when_cuda_is_there
"""
import math

import pytest
import torch
from torch import nn

from basicsr_ldt.ldt import MixedPrecision

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
