"""SS2D's four scan directions inside the Triton kernels (``scan_backend: triton``), run on CPU
tensors by Triton's interpreter: the sum of the four directions and every gradient equal today's
SS2D path (the four direction copies, the torch scan) run in float64, for odd, unequal and
one-pixel-wide images; no direction copy of x is made; bf16 activations are read as they are."""
import copy

import pytest
import torch

pytest.importorskip('triton', reason='triton is not installed (it ships with the Linux torch wheel)')

import archs  # noqa: E402,F401
import archs.mambair_arch as mambair_arch  # noqa: E402
from archs.mambair_arch import SS2D  # noqa: E402
from archs.scan.dispatch import selective_scan  # noqa: E402
from archs.scan import triton_launches  # noqa: E402
from test_scan_triton import interpreted  # noqa: E402,F401  (the interpreter fixture)


def _ss2d(d_model: int = 4, d_state: int = 3, seed: int = 0) -> SS2D:
    """A small SS2D with every scan parameter moved off its init, so that each direction differs."""
    torch.manual_seed(seed)
    block = SS2D(d_model=d_model, d_state=d_state, scan_backend='triton')
    with torch.no_grad():
        for p in (block.A_logs, block.Ds, block.dt_projs_bias):
            p.add_(0.3 * torch.randn_like(p))
    return block


def _core_and_grads(block: SS2D, x: torch.Tensor, weight: torch.Tensor):
    x = x.detach().requires_grad_(True)
    y = block.forward_core(x)
    params = [p for _, p in block.named_parameters() if p.requires_grad]
    names = ['x'] + [n for n, p in block.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad((y.double() * weight).sum(), [x] + params, allow_unused=True)
    return y, dict(zip(names, grads))


@pytest.mark.parametrize('height, width', [(3, 5), (5, 3), (4, 4), (1, 7), (6, 1), (1, 1), (7, 9)])
def test_four_directions_in_the_kernels_equal_the_direction_copies_in_float64(interpreted, height, width,
                                                                             monkeypatch):
    """Output and every gradient (x, the projections, A, D, dt bias) of the in-kernel path against
    the direction-copy path in float64 (torch scan), over chunk boundaries (T = 8 < L for most)."""
    block = _ss2d()
    reference = copy.deepcopy(block).double()
    reference.scan_backend = 'torch'
    x = torch.randn(2, block.d_inner, height, width)
    weight = torch.randn(2, block.d_inner, height * width, dtype=torch.float64)
    y, grads = _core_and_grads(block, x, weight)
    # today's path asks for a float32 output (float32 copies of the inputs): here, float64 throughout
    monkeypatch.setattr(mambair_arch, 'selective_scan',
                        lambda *args, out_dtype=None, **kwargs: selective_scan(*args, **kwargs))
    ref_y, ref_grads = _core_and_grads(reference, x.double(), weight)
    assert ref_y.dtype == torch.float64
    assert y.dtype == torch.float32 and y.shape == (2, block.d_inner, height * width)
    torch.testing.assert_close(y.double(), ref_y, rtol=1e-5, atol=1e-5)
    used = {name for name, ref in ref_grads.items() if ref is not None}
    assert used == {'x', 'x_proj_weight', 'dt_projs_weight', 'dt_projs_bias', 'A_logs', 'Ds'}
    for name in used:
        got, ref = grads[name], ref_grads[name]
        assert got is not None and got.dtype == torch.float32, name
        torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-5, msg=f'gradient of {name}')
