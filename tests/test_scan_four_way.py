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
from archs.scan import triton_launches  # noqa: E402
from test_scan_triton import interpreted  # noqa: E402,F401  (the interpreter fixture)
from test_selective_scan import sequential_reference  # noqa: E402


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
    the direction-copy path in float64 with a step-by-step reference scan, over chunk boundaries
    (T = 8 < L for most)."""
    block = _ss2d()
    reference = copy.deepcopy(block).double()
    reference.scan_backend = 'torch'
    x = torch.randn(2, block.d_inner, height, width)
    weight = torch.randn(2, block.d_inner, height * width, dtype=torch.float64)
    y, grads = _core_and_grads(block, x, weight)
    # today's path (the four direction copies, their outputs mapped back and summed), its scan the
    # float64 step-by-step reference written in tests/test_selective_scan.py (not a kernel of ours)
    monkeypatch.setattr(mambair_arch, 'selective_scan',
                        lambda u, delta, A, B, C, D, delta_bias=None, delta_softplus=False, **kwargs:
                        sequential_reference(u, delta, A, B, C, D, delta_bias=delta_bias,
                                             delta_softplus=delta_softplus)[0])
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


def _aten_ops(fn) -> dict:
    """The operators ``fn`` dispatches (their overload packets' names), each with the shapes of
    the tensors it returned."""
    from torch.utils._python_dispatch import TorchDispatchMode
    seen = {}

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            outs = out if isinstance(out, (tuple, list)) else (out,)
            seen.setdefault(func.overloadpacket.__name__, set()).update(
                tuple(t.shape) for t in outs if isinstance(t, torch.Tensor))
            return out

    with Record():
        fn()
    return seen


def test_no_direction_copy_of_x_y_or_their_gradients_is_made(interpreted):
    """The in-kernel path builds none of the (b, 4, d, L) direction copies of x or of its gradient
    (flip, stack, a cat of four d-channel maps) in the forward or the backward; its only cat is the
    backward of the (dt, B, C) split, of dt_rank + 2 n = 7 channels per direction, not d = 8. The
    copy path, for contrast, makes them."""
    block = _ss2d()
    b, d, length = 2, block.d_inner, 15
    x = torch.randn(b, d, 3, 5, requires_grad=True)

    def step():
        block.forward_core(x).sum().backward()
    ops = _aten_ops(step)
    assert {'four_way_scan_forward', 'four_way_scan_backward'} <= set(ops)
    assert not set(ops) & {'flip', 'stack'}, sorted(ops)
    assert (b, 4, d, length) not in ops.get('cat', set()), ops['cat']
    block.scan_backend = 'torch'
    copies = _aten_ops(step)
    assert {'flip', 'stack'} <= set(copies) and (b, 4, d, length) in copies['cat']


def test_bf16_activations_are_read_as_they_are_and_sum_in_float32(interpreted):
    """Under bf16 the kernels read x and the projections in bf16 and return the float32 sum: the
    same as float32 copies of those bf16 tensors through the copy path (float32 rounding), and x's
    gradient comes back in bf16."""
    block = _ss2d()
    x = torch.randn(1, block.d_inner, 5, 3).bfloat16().requires_grad_(True)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = block.forward_core(x)
    assert y.dtype == torch.float32
    y.sum().backward()
    assert x.grad.dtype == torch.bfloat16
    flat = x.detach().reshape(1, block.d_inner, 15)
    with torch.autocast('cpu', dtype=torch.bfloat16):   # the projections exactly as the kernels got them
        x_dbl = torch.einsum('bdl,kcd->bkcl', flat, block.x_proj_weight)
        dts, Bs, Cs = torch.split(x_dbl, [block.dt_rank, block.d_state, block.d_state], dim=2)
        dts = torch.einsum('bkrl,kdr->bkdl', dts, block.dt_projs_weight)
    A, D, bias = block._scan_inputs()
    got = interpreted.four_way_scan_triton(flat, dts.reshape(1, -1, 15), A, Bs, Cs, D, bias, 5)
    ref = interpreted.four_way_scan_triton(flat.float(), dts.float().reshape(1, -1, 15), A, Bs.float(),
                                           Cs.float(), D, bias, 5)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(y.detach(), got, rtol=1e-6, atol=1e-6)


def test_a_failing_first_call_under_auto_falls_back_to_the_direction_copies(interpreted, monkeypatch):
    """'auto' with a Triton kernel that fails to compile: one warning, and SS2D runs the copy path
    with the torch scan from then on (the same output as the torch backend)."""
    import archs.scan.dispatch as dispatch
    monkeypatch.setattr(dispatch, '_triton_checked', set())
    monkeypatch.setattr(dispatch, '_triton_failed', {})
    monkeypatch.setattr(dispatch, '_on_gpu', lambda device: True)   # 'auto' picks Triton for "GPU" tensors
    monkeypatch.setattr(dispatch, '_load_cuda_kernel', lambda: None)

    def broken(*args, **kwargs):
        raise RuntimeError('ptxas fatal: fake failure')
    monkeypatch.setattr(interpreted, 'four_way_scan_triton', broken)
    block = _ss2d()
    block.scan_backend = 'auto'
    x = torch.randn(1, block.d_inner, 3, 4)
    y = block.forward_core(x)
    assert 'cpu' in dispatch._triton_failed and 'fake failure' in dispatch._triton_failed['cpu']
    block.scan_backend = 'torch'
    torch.testing.assert_close(y, block.forward_core(x))


def test_four_way_launches_refuse_shapes_they_cannot_read():
    """A height that does not divide L, a delta that is not 4 x x's channels, B or C not in 4
    groups, a z: one line each, before any launch."""
    x = torch.zeros(1, 2, 6)
    bc = torch.zeros(1, 4, 3, 6)
    A, D = torch.zeros(8, 3), torch.zeros(8)
    cases = [(dict(height=4), 'height dividing'), (dict(delta=torch.zeros(1, 4, 6)), 'delta of shape'),
             (dict(B=torch.zeros(1, 2, 3, 6)), 'B of shape'), (dict(z=torch.zeros(1, 2, 6)), 'no z')]
    for change, message in cases:
        kw = dict(u=x, delta=torch.zeros(1, 8, 6), A=A, B=bc, C=bc, D=D, z=None, delta_bias=D, softplus=True,
                  height=2)
        kw.update(change)
        with pytest.raises(ValueError, match=message):
            triton_launches.forward_launch(**kw)


def test_the_four_way_scan_stays_inside_a_compiled_graph(interpreted):
    """torch.compile (fullgraph: a graph break is an error) traces SS2D's scan as one custom
    operator, its first call compiled too, with the output and gradients of the eager call."""
    torch._dynamo.reset()
    block = _ss2d(seed=1)
    x = torch.randn(1, block.d_inner, 3, 4, requires_grad=True)
    compiled = torch.compile(block.forward_core, backend='aot_eager', fullgraph=True, dynamic=False)
    y = compiled(x)
    (grad,) = torch.autograd.grad(y.square().sum(), x)
    eager = block.forward_core(x)
    (eager_grad,) = torch.autograd.grad(eager.square().sum(), x)
    torch.testing.assert_close(y, eager)
    torch.testing.assert_close(grad, eager_grad)
    torch._dynamo.reset()


def test_the_scan_benchmark_checks_the_four_way_scan_against_float64(interpreted, capsys):
    """scripts/bench_scan.py's GPU check of the four-way scan, run here on the interpreter at small
    sizes: within FLOAT32_BOUND, no FAIL; with the kernel's output made wrong by 1e-3 of its scale,
    one FAIL line per size for the output."""
    from conftest import load_script
    bench = load_script('bench_scan')
    bench.CHECK = bench.ReferenceCheck()
    bench.compare_four_way(torch.device('cpu'), d_model=4, d_state=3, sizes=((3, 5), (1, 4)))
    out = capsys.readouterr().out
    assert 'four-way Triton scan vs float64 direction copies, 3x5: output' in out and 'FAIL' not in out
    assert bench.CHECK.checked == 14 and bench.CHECK.failures == []
    real = interpreted.four_way_scan_triton
    try:
        interpreted.four_way_scan_triton = lambda *a: real(*a) * (1 + 1e-3)
        bench.compare_four_way(torch.device('cpu'), d_model=4, d_state=3, sizes=((3, 5), (1, 4)))
    finally:
        interpreted.four_way_scan_triton = real
    fails = [line for line in capsys.readouterr().out.splitlines() if line.startswith('FAIL')]
    assert len(fails) >= 2 and all('output' in line or 'grad' in line for line in fails)
    assert any(line.startswith('FAIL: four-way scan 3x5 output') for line in fails)


def test_without_gradients_the_direction_copies_run_split_along_the_sequence(interpreted, monkeypatch):
    """Validation and test.py (no gradients) take the direction copies, whose Triton forward reads
    contiguous sequences (a 250x250 tile on an H200: 5.29 ms against 10.14 with the directions in
    the kernels); the same sum as the training path's."""
    block = _ss2d()
    x = torch.randn(1, block.d_inner, 5, 6)
    with torch.no_grad():
        trained_path = block._scan_in_kernels(x)
        monkeypatch.setattr(SS2D, '_scan_in_kernels', lambda self, x: pytest.fail('four-way path without gradients'))
        with triton_launches.launch_settings(CHUNK=2):   # 15 chunks: the split forward's segments
            monkeypatch.setattr(triton_launches, 'SPLIT_MIN_CHUNKS', 4)
            y = block.forward_core(x)
    torch.testing.assert_close(y, trained_path, rtol=1e-5, atol=1e-5)
