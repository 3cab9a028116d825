"""Triton selective scan, run on CPU tensors by Triton's interpreter: outputs, last state and
every gradient equal a float64 sequential reference (every feature MambaIR uses, grouped, shared
and constant B/C, sequences of 1, T - 1, T, T + 1 and several chunks, masked channel and state
blocks), float32 state accumulation for half-precision inputs, O(L/T) saved states, and the
backend choice ('auto' order, clear errors, logging)."""
import argparse
import importlib
import os
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip('triton', reason='triton is not installed (it ships with the Linux torch wheel)')

import basicsr_ldt  # noqa: E402,F401
import archs  # noqa: E402,F401
import archs.scan.dispatch as scan_module  # noqa: E402
from archs.scan.dispatch import (BACKEND_ENV, ScanBackendUnavailable, resolve_backend,  # noqa: E402
                                select_kernel, selective_scan)
import archs.scan.triton_kernels as triton_kernels  # noqa: E402  (interpreted: see `interpreted`)
import archs.scan.triton_launches as triton_launches  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from basicsr_ldt.common.errors import InputError  # noqa: E402
from conftest import basicsr_log, load_script  # noqa: E402
from test_selective_scan import make_inputs, sequential_reference  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_FRESH_RUN = 'BASICSR_LDT_TEST_INTERPRETED_RUN'   # set in the fresh process the fixture below starts


@pytest.fixture(scope='module')
def interpreted():
    """archs.scan.triton_function with kernels for Triton's CPU interpreter.

    Triton decorates its own library functions (tl.sum, ...) for the interpreter only when
    TRITON_INTERPRET=1 is set before triton is first imported; tests/conftest.py sets it on
    machines without a GPU. Where it was not set in time (a GPU machine, another runner), the
    whole module runs once in a fresh process with the flag, whose result decides (the
    in-process tests are then skipped, saying so)."""
    import archs.scan.triton_function as module
    if not module.interpreting():  # flag set after these modules were imported
        for name in ('archs.scan.triton_kernels', 'archs.scan.triton_launches'):
            importlib.reload(sys.modules[name])
        module = importlib.reload(module)
    if not module.interpreting():
        if os.environ.get(_FRESH_RUN):   # the flag was set before the import, yet no interpreter: no second run
            pytest.fail('TRITON_INTERPRET=1 was set before triton was imported, and the kernels still '
                        'do not run under its CPU interpreter')
        env = dict(os.environ, TRITON_INTERPRET='1', **{_FRESH_RUN: '1'})
        run = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-x', '-p', 'no:cacheprovider',
                              os.path.abspath(__file__)], cwd=REPO, env=env, capture_output=True,
                             text=True)
        if run.returncode != 0:
            pytest.fail('interpreter tests failed in a fresh process:\n'
                        f'{run.stdout[-4000:]}{run.stderr[-2000:]}')
        pytest.skip('triton was imported without TRITON_INTERPRET=1 in this process: these tests '
                    'ran and passed in a fresh process with it')
    saved = scan_module._triton_module, scan_module._triton_error
    scan_module._triton_module, scan_module._triton_error = module, None
    yield module
    scan_module._triton_module, scan_module._triton_error = saved


def test_interpreter_flag_is_honoured(interpreted):
    assert interpreted.interpreting()
    assert select_kernel('triton', torch.device('cpu')) == 'triton'


def _all_grads(out, last, args, use_last=True):
    w_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    w_last = torch.randn(last.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    loss = (out.double() * w_out).sum() + use_last * (last.double() * w_last).sum()
    return torch.autograd.grad(loss, list(args.values()))


def _check_against_reference(args, softplus, out, last, rtol=1e-4, atol=1e-4, use_last=True):
    """Output, last state and the gradient of every input against ``sequential_reference`` (the
    test's own float64 step-by-step loop, mamba's ``selective_scan_ref`` semantics), for a loss
    that uses the output and (``use_last``) the last state."""
    ref_out, ref_last = sequential_reference(**args, delta_softplus=softplus)
    torch.testing.assert_close(out, ref_out.to(out.dtype), rtol=rtol, atol=atol)
    torch.testing.assert_close(last, ref_last.float(), rtol=rtol, atol=atol)
    grads = _all_grads(out, last, args, use_last)
    refs = _all_grads(ref_out, ref_last, args, use_last)
    for name, g, r in zip(args, grads, refs):
        assert g.dtype == args[name].dtype, name
        torch.testing.assert_close(g, r.to(g.dtype), rtol=rtol, atol=atol, msg=f'gradient of {name}')


T = 8  # the chunk length (the kernels' T) of most tests here: small, so that lengths span chunks


@pytest.mark.parametrize('bc, groups, dim', [('grouped', 4, 8),   # MambaIR: 4 directions, B/C per direction
                                             ('shared', 1, 5),    # (b, n, L): one group
                                             ('const', 1, 5)])    # (d, n)
@pytest.mark.parametrize('options', ['', 'D', 'z', 'bias+softplus', 'D+z+bias+softplus'])
def test_every_feature_matches_the_float64_reference_over_several_chunks(interpreted, bc, groups, dim, options):
    """L = 3 T + 5 (three full chunks and a partial one), 3 states (masked to 4), blocks of 4
    channels (one partly past its group when a group has 5): output, last state and every
    gradient (u, delta, A, B, C, D, z, delta_bias, with the last state in the loss)."""
    args, softplus = make_inputs(bc, 3 * T + 5, options, batch=2, dim=dim, dstate=3, groups=groups)
    out, last = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=T, block_d=4)
    assert out.dtype == torch.float32 and last.shape == (2, dim, 3)
    _check_against_reference(args, softplus, out, last)


@pytest.mark.parametrize('length', [1, T - 1, T, T + 1, 2 * T, 5 * T - 3])
@pytest.mark.parametrize('use_last', [True, False])
def test_chunk_boundaries_with_mambairs_call(interpreted, length, use_last):
    """MambaIR's call (grouped B/C in 4 groups, D, delta_bias, softplus; z too) at every kind of
    chunk boundary, with and without the last state in the loss (without it, MambaIR's case, the
    backward starts from no last-state gradient)."""
    args, softplus = make_inputs('grouped', length, 'D+z+bias+softplus', batch=2, dim=8, dstate=3, groups=4)
    out, last = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=T, block_d=2)
    _check_against_reference(args, softplus, out, last, use_last=use_last)


def test_sixteen_states_at_the_default_chunk(interpreted):
    """MambaIR's d_state 16 at the launch defaults (CHUNK, channel blocks), over 3 chunks and a partial
    one, channel groups of 6 (a block of 4 partly past its group)."""
    length = 3 * triton_launches.CHUNK + 7
    args, softplus = make_inputs('grouped', length, 'D+bias+softplus', batch=1, dim=12, dstate=16, groups=2)
    out, last = interpreted.selective_scan_triton(**args, delta_softplus=softplus)
    _check_against_reference(args, softplus, out, last)


def test_the_backward_walks_the_chunks_its_forward_saved_states_at(interpreted):
    """Launch settings are read at each call, and triton_launches.launch_settings changes them for a
    block (archs/README.md suggests CHUNK=16 where memory matters): a forward inside the block and
    its backward after it must still agree on the chunk length the states were saved at."""
    args, softplus = make_inputs('grouped', 3 * 4 + 3, 'D+bias+softplus', batch=1, dim=8, dstate=4, groups=2)
    with triton_launches.launch_settings(CHUNK=4):
        out, last = interpreted.selective_scan_triton(**args, delta_softplus=softplus)
    assert triton_launches.CHUNK != 4
    _check_against_reference(args, softplus, out, last)      # the backward runs here, outside the block


@pytest.mark.parametrize('block_d', [1, 2, 8])
def test_channel_blocks(interpreted, block_d):
    """One channel a program, two, and a block wider than a group (rounded down to the group)."""
    args, softplus = make_inputs('grouped', 2 * T + 3, 'D+z+bias+softplus', batch=1, dim=6, dstate=2, groups=2)
    out, last = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=T, block_d=block_d)
    _check_against_reference(args, softplus, out, last)


@triton.jit
def _softplus_probe(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, triton_kernels._softplus(tl.load(x_ptr + i, mask=i < n)), mask=i < n)


def test_softplus_is_torchs_to_a_few_float32_ulp(interpreted):
    """The kernels' softplus (no log: exp2, rsqrt and a polynomial) against float64
    log(1 + e^x) (x itself above 20, as torch): relative error under 1e-6 where MambaIR's
    delta + bias lie (about -8 to 2) and under 4e-6 from -40 to 40; x itself above 20."""
    x = torch.cat([torch.linspace(-40, 40, 160001), torch.linspace(-8, 2, 100001),
                   torch.tensor([0.0, 20.0, 20.5, 19.99, -1e-6, 1e-6, -87.0, -100.0])])
    y = torch.empty_like(x)
    _softplus_probe[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    xd = x.double()
    ref = torch.where(xd > 20, xd, torch.log1p(torch.exp(xd)))
    rel = ((y.double() - ref).abs() / ref.clamp_min(1e-300))
    near = (x >= -8) & (x <= 2)
    assert rel[near].max() < 1e-6, (rel[near].max(), x[near][rel[near].argmax()])
    assert rel[x > -40].max() < 4e-6, rel.max()
    assert torch.equal(y[x > 20], x[x > 20])
    assert (y >= 0).all() and y[x == -100.0].item() < 1e-40


@triton.jit
def _rows_probe(out_ptr, dim, length, group_size, blocks_per_group, BLOCK_D: tl.constexpr):
    """The kernels' own program coordinates and row offsets for program (batch 1, last block)."""
    bi, d, mask_d, gb, gc = triton_kernels._program(dim, group_size, blocks_per_group, group_size,
                                                    group_size, BLOCK_D)
    last = (tl.program_id(0) == 1) & (tl.program_id(1) == tl.num_programs(1) - 1)
    tl.store(out_ptr + tl.arange(0, BLOCK_D), triton_kernels._rows(bi, dim, d, length), mask=last)


def test_row_offsets_past_2_31_are_exact(interpreted):
    """A 1024 x 1024 image at MambaIR's 1440 channels (4 groups of 360, blocks of 4), batch 2: the
    last program's rows start past 2**31 elements. Reference: Python integers."""
    dim, group, bd, length = 1440, 360, 4, 1024 * 1024
    blocks_per_group = group // bd
    out = torch.zeros(bd, dtype=torch.int64)
    _rows_probe[(2, 4 * blocks_per_group)](out, dim, length, group, blocks_per_group, BLOCK_D=bd)
    expected = [(1 * dim + 3 * group + (blocks_per_group - 1) * bd + i) * length for i in range(bd)]
    assert expected[0] > 2 ** 31
    assert out.tolist() == expected


def test_b_and_c_with_different_groupings_through_the_public_function(interpreted):
    """B with 2 groups, C with 3 (of 6 channels): programs follow the finer grouping and the
    gradients are summed back to each tensor's own groups.
    With the bf16 MambaIR test below it kills the 22 mutants (issue #38) where ``selective_scan`` handed
    the Triton call a wrong argument."""
    args, softplus = make_inputs('grouped', 23, 'D+z+bias+softplus', dim=6, groups=2)
    args['C'] = torch.randn(2, 3, 3, 23, generator=torch.Generator().manual_seed(9)).requires_grad_()
    out, last = selective_scan(**args, delta_softplus=softplus, return_last_state=True, backend='triton')
    _check_against_reference(args, softplus, out, last)


def test_b_and_c_read_in_place_from_one_projection_as_mambair_passes_them(interpreted):
    """MambaIR's B and C are slices of one (b, K, dt_rank + 2 n, L) projection: read through
    their strides (no copy), at an offset into the projection, with the gradient in their shape."""
    args, softplus = make_inputs('grouped', 2 * T + 1, 'D+bias+softplus', batch=2, dim=8, dstate=3, groups=4)
    projection = torch.randn(2, 4, 2 + 2 * 3, 2 * T + 1, generator=torch.Generator().manual_seed(3),
                             requires_grad=True)
    B, C = projection[:, :, 2:5], projection[:, :, 5:]
    assert not B.is_contiguous()
    plain = dict(args, B=B.detach().clone().requires_grad_(), C=C.detach().clone().requires_grad_())
    out, _ = interpreted.selective_scan_triton(**dict(args, B=B, C=C), delta_softplus=softplus, chunk=T)
    ref, last = interpreted.selective_scan_triton(**plain, delta_softplus=softplus, chunk=T)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    _check_against_reference(plain, softplus, ref, last)
    ref, _ = interpreted.selective_scan_triton(**plain, delta_softplus=softplus, chunk=T)
    (grad,) = torch.autograd.grad(out.sum(), [projection])
    ref_grads = torch.autograd.grad(ref.sum(), [plain['B'], plain['C']])
    torch.testing.assert_close(grad[:, :, 2:5], ref_grads[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad[:, :, 5:], ref_grads[1], rtol=1e-6, atol=1e-6)


def test_strong_decay_stays_finite_and_exact(interpreted):
    """delta*A down to about -150 per step: only decays <= 1 are formed."""
    args, _ = make_inputs('grouped', 30, 'D', dim=4, groups=2, delta_scale=50.0)
    out, last = interpreted.selective_scan_triton(**args, chunk=T)
    assert torch.isfinite(out).all() and torch.isfinite(last).all()
    _check_against_reference(args, False, out, last)


def test_adjoints_through_decay_products_that_underflow(interpreted):
    """State 0 decays by about e^-20 per position, so products of its decays underflow to 0
    within a chunk, while states 1 and 2 decay slowly and carry adjoints across every chunk
    boundary; the loss uses the last state too. Every gradient against the float64 reference."""
    args, softplus = make_inputs('grouped', 75, 'D+z+bias+softplus', dim=4, dstate=3, groups=2)
    with torch.no_grad():
        args['A'][:, 0] = -40.0
        args['A'][:, 1:] = -0.02 * torch.arange(1, 3)
    out, last = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=32)
    _check_against_reference(args, softplus, out, last)  # (a NaN anywhere fails it)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_half_precision_inputs_accumulate_the_state_in_float32(interpreted, dtype):
    """The state grows to about 9.9 in steps of 0.02. A bfloat16 state (8-bit mantissa) would
    stall at 8, where its spacing is 0.0625 and a step of 0.02 rounds away; in float32 the
    output only carries its final rounding to the input dtype."""
    length, dim = 500, 3
    u = torch.ones(1, dim, length, dtype=dtype)
    delta = torch.full((1, dim, length), 0.02, dtype=dtype)
    A = torch.full((dim, 2), -1e-3)
    B = torch.ones(1, 2, length, dtype=dtype)
    C = torch.ones(1, 2, length, dtype=dtype)
    out, last = interpreted.selective_scan_triton(u, delta, A, B, C, chunk=128)
    ref_out, ref_last = sequential_reference(u, delta, A, B, C)
    assert out.dtype == dtype and last.dtype == torch.float32
    assert ref_last.min() > 9.5  # well past the point where a bfloat16 state stalls
    torch.testing.assert_close(last, ref_last.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), ref_out, rtol=8e-3, atol=1e-2)


def test_half_precision_gradients_keep_each_input_dtype(interpreted):
    args, softplus = make_inputs('grouped', 21, 'D+z+bias+softplus', dim=4, groups=2)
    half = {k: v.detach().to(torch.bfloat16 if k in ('u', 'delta', 'B', 'C', 'z') else torch.float32)
            .requires_grad_() for k, v in args.items()}
    out, last = interpreted.selective_scan_triton(**half, delta_softplus=softplus, chunk=T)
    assert out.dtype == torch.bfloat16
    _check_against_reference(half, softplus, out, last, rtol=3e-2, atol=3e-2)


def _bf16_ulp(t: torch.Tensor) -> torch.Tensor:
    """The spacing of bfloat16 numbers at each value of ``t`` (8 significant bits)."""
    exponent = torch.floor(torch.log2(t.double().abs().clamp(min=2.0 ** -126)))
    return torch.pow(2.0, exponent - 7)


@pytest.mark.parametrize('options', ['D+bias+softplus', 'D+z+bias+softplus'])
def test_bf16_inputs_with_a_float32_output_equal_float32_copies_of_them(interpreted, options):
    """MambaIR's call under bf16 autocast: u, delta, B, C (and z) in bf16, ``out_dtype`` float32.
    The kernels read bf16 as it is, so the output, the last state and the float32 parameters'
    gradients are bit-equal to the call on float32 copies (upstream's ``.float()``), and B's and
    C's gradients too (both cast by torch). du, ddelta and dz are rounded to bf16 by the kernel's
    store instead of by the copy's backward: round-to-nearest-even on a GPU (torch's rounding),
    truncation in Triton's CPU interpreter, so here they agree within one bf16 step."""
    args, softplus = make_inputs('grouped', 2 * T + 3, options, dim=4, groups=2)
    half = ('u', 'delta', 'B', 'C', 'z')
    leaves = {k: v.detach().to(torch.bfloat16 if k in half else torch.float32).requires_grad_()
              for k, v in args.items()}
    w = torch.randn(2, 4, 2 * T + 3, generator=torch.Generator().manual_seed(3))

    def run(direct: bool):
        inputs = leaves if direct else {k: v.float() for k, v in leaves.items()}   # upstream's copies
        out, last = interpreted.selective_scan_triton(**inputs, delta_softplus=softplus, chunk=T,
                                                      out_dtype=torch.float32 if direct else None)
        return out, last, torch.autograd.grad((out * w).sum(), list(leaves.values()))

    (out, last, grads), (ref_out, ref_last, ref_grads) = run(True), run(False)
    assert out.dtype == torch.float32 and torch.equal(out, ref_out) and torch.equal(last, ref_last)
    for (name, leaf), g, r in zip(leaves.items(), grads, ref_grads):
        assert g.dtype == leaf.dtype, name
        if name in ('u', 'delta', 'z'):
            assert ((g.double() - r.double()).abs() <= _bf16_ulp(r)).all(), f'gradient of {name}'
        else:
            assert torch.equal(g, r), f'gradient of {name}'


def test_an_ss2d_block_under_bf16_autocast_keeps_no_float32_copy_of_its_scan_inputs(interpreted):
    """What autograd keeps of one SS2D forward on the Triton scan under bf16 autocast: x (the
    scan's u, (b, d_inner, L): the four directions read it in place) and dts (delta, (b, 4 d_inner, L))
    in bf16, and no float32 tensor of either size; upstream's float32 copies of the four direction
    copies were kept for the scan's backward (eight times x's bytes). dt_rank 2 (d_model 17), so
    the dt projection is a bf16 matrix product as in classic MambaIR (dt_rank 12; at dt_rank 1 it
    is a broadcast product, which autocast leaves in float32)."""
    torch.manual_seed(0)
    block = archs.mambair_arch.SS2D(d_model=17, d_state=2, scan_backend='triton')
    x = torch.randn(1, 3, 2, 17)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        block(x)                                   # the first-call check, not recorded
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            block(x)
    scan_sized = [t.dtype for t in kept if tuple(t.shape) == (1, 4 * 34, 6)]
    assert scan_sized == [torch.bfloat16], scan_sized   # delta (dts)
    x_sized = {t.dtype for t in kept if tuple(t.shape) == (1, 34, 6)}
    assert x_sized == {torch.bfloat16}, x_sized          # u = x, read in place by the four directions


def test_the_dispatch_gives_other_kernels_float32_copies_for_a_float32_output():
    """``out_dtype`` through :func:`selective_scan` on the torch kernel: bf16 inputs give exactly
    the float32 copies' output and gradients; without it, mamba's semantics (u's dtype); a dtype
    that is not floating point is refused."""
    args, softplus = make_inputs('grouped', 13, 'D+bias+softplus', dim=4, groups=2)
    half = {k: v.detach().to(torch.bfloat16 if k in ('u', 'delta', 'B', 'C') else torch.float32)
            .requires_grad_() for k, v in args.items()}
    out = selective_scan(**half, delta_softplus=softplus, backend='torch', out_dtype=torch.float32)
    copies = {k: v.float() for k, v in half.items()}
    ref = selective_scan(**copies, delta_softplus=softplus, backend='torch')
    assert out.dtype == torch.float32 and torch.equal(out, ref)
    for g, r in zip(torch.autograd.grad(out.sum(), list(half.values())),
                    torch.autograd.grad(ref.sum(), list(half.values()))):
        assert torch.equal(g, r)
    assert selective_scan(**half, delta_softplus=softplus, backend='torch').dtype == torch.bfloat16
    low, last = selective_scan(**copies, delta_softplus=softplus, backend='torch', out_dtype=torch.bfloat16,
                               return_last_state=True)     # any floating dtype: float32 rounded once
    assert low.dtype == torch.bfloat16 and torch.equal(low, ref.to(torch.bfloat16)) and last.dtype == torch.float32
    assert torch.equal(selective_scan(**copies, delta_softplus=softplus, backend='torch', out_dtype=torch.bfloat16), low)
    with pytest.raises(ValueError, match='out_dtype must be a floating-point dtype'):
        selective_scan(**half, backend='torch', out_dtype=torch.int32)


def test_mambair_under_bf16_autocast_hands_the_triton_scan_its_bf16_activations(interpreted, monkeypatch):
    """No float32 copies of x, dts, Bs, Cs (four casts forward and two backward per block, and
    the copies the scan would keep for its backward): the four-way Triton scan receives them in
    bf16 and returns a float32 output, and the network's output equals the torch kernel's on
    float32 copies.
    With the groupings test above it kills the 22 mutants (issue #38) where ``selective_scan`` handed
    the Triton call a wrong argument."""
    seen = []
    real = interpreted.four_way_scan_triton
    monkeypatch.setattr(interpreted, 'four_way_scan_triton',
                        lambda *a: seen.append([None if t is None else t.dtype for t in a[:5]]) or real(*a))

    def build(backend):
        torch.manual_seed(0)
        return archs.MambaIR(upscale=2, img_size=8, embed_dim=30, depths=[1], d_state=3, mlp_ratio=1,
                             upsampler='pixelshuffle', scan_backend=backend)

    x = torch.rand(1, 3, 5, 3, generator=torch.Generator().manual_seed(1))
    outs = []
    for backend in ('triton', 'torch'):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            outs.append(build(backend)(x))
    bf16, f32 = torch.bfloat16, torch.float32
    assert seen and all(s == [bf16, bf16, f32, bf16, bf16] for s in seen)   # x, delta, A, B, C (each call)
    # (the four directions summed in another order than the copy path's: float32 rounding, seen in bf16)
    torch.testing.assert_close(outs[0], outs[1])


def test_backward_keeps_one_state_per_chunk_and_inference_none(interpreted, monkeypatch):
    """What forward saves: the inputs and the (b, d, ceil(L/T), n) chunk-entry states; nothing
    of the states' full b*d*n*L size. Under no_grad the forward writes no chunk state (its
    launch gets flag 0) and the output is equal."""
    launches = []
    real = interpreted.forward_launch
    monkeypatch.setattr(interpreted, 'forward_launch', lambda *a, **k: launches.append(real(*a, **k)) or launches[-1])
    args, softplus = make_inputs('grouped', 37, 'D+bias+softplus', dim=4, groups=2)
    out, _ = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=T)
    sizes = [tuple(t.shape) for t in out.grad_fn.saved_tensors if t is not None]
    assert (2, 4, 5, 3) in sizes
    assert max(torch.Size(s).numel() for s in sizes) < 2 * 4 * 3 * 37
    with torch.no_grad():
        again, _ = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=T)
    assert again.grad_fn is None
    torch.testing.assert_close(again, out.detach(), rtol=0, atol=0)
    assert [plan.outputs['states'] is None for plan in launches] == [False, True]
    assert [dict(zip(plan.launch.kernel.arg_names, plan.launch.args))['flag'] for plan in launches] == [1, 0]


@pytest.mark.parametrize('used', ['output', 'last state', 'both'])
def test_last_state_gradient_is_read_only_when_a_loss_uses_it(interpreted, monkeypatch, used):
    """Only the outputs a loss uses get a gradient: with the output alone (MambaIR's case) the
    backward launch gets no last-state gradient (flag 0), with the last state alone the output
    gradient is zero; every gradient equals the float64 reference of the same loss."""
    launches = []
    real = interpreted.backward_launch
    monkeypatch.setattr(interpreted, 'backward_launch',
                        lambda *a, **k: launches.append(real(*a, **k)) or launches[-1])
    args, softplus = make_inputs('grouped', 19, 'D+bias+softplus', dim=4, groups=2)
    out, last = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=T)
    ref_out, ref_last = sequential_reference(**args, delta_softplus=softplus)

    def loss(o, s):
        w_out = torch.randn(o.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
        w_last = torch.randn(s.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
        return ((o.double() * w_out).sum() if used != 'last state' else 0) + \
            ((s.double() * w_last).sum() if used != 'output' else 0)
    grads = torch.autograd.grad(loss(out, last), list(args.values()))
    refs = torch.autograd.grad(loss(ref_out, ref_last), list(args.values()), allow_unused=True)
    assert [plan.launch.args[-4] for plan in launches] == [int(used != 'output')]  # ``flag``
    for (name, a), g, r in zip(args.items(), grads, refs):  # (the last state does not use C)
        r = torch.zeros_like(a) if r is None else r.float()
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4, msg=f'gradient of {name}')


def test_shapes_past_the_grid_limit_are_refused_by_name_before_any_work(interpreted):
    """More than 65535 channel blocks (CUDA's grid limit on the launch's second axis) is refused
    with the shape named, before anything is allocated (meta tensors: shapes only)."""
    def meta(*shape):
        return torch.empty(*shape, device='meta')
    dim = 4 * 65536 + 4
    with pytest.raises(InputError, match=r'shape \(1, 262148, 3\).*channel blocks'):
        triton_launches.forward_launch(meta(1, dim, 3), meta(1, dim, 3), meta(dim, 4), meta(1, 1, 4, 3),
                                       meta(1, 1, 4, 3), None, None, None, True, block_d=4)
    plan = triton_launches.forward_launch(meta(1, dim - 8, 3), meta(1, dim - 8, 3), meta(dim - 8, 4),
                                          meta(1, 1, 4, 3), meta(1, 1, 4, 3), None, None, None, True, block_d=4)
    assert plan.launch.grid == (1, 65535, 1)


def test_mambair_with_the_triton_backend_matches_the_torch_backend(interpreted):
    def build(backend):
        torch.manual_seed(0)
        return archs.MambaIR(upscale=2, img_size=8, embed_dim=30, depths=[1], d_state=3, mlp_ratio=1,
                             upsampler='pixelshuffle', scan_backend=backend)

    x = torch.rand(1, 3, 5, 3, generator=torch.Generator().manual_seed(1))
    nets = [build('triton'), build('torch')]
    outs = [net(x) for net in nets]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-5)
    grads = []
    for net, out in zip(nets, outs):
        out.square().sum().backward()
        grads.append(net.layers[0].residual_group.blocks[0].self_attention.A_logs.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-3, atol=1e-5)


@pytest.fixture
def without_packages(monkeypatch):
    """mamba-ssm and the Triton kernel fail to import; cached kernels are forgotten."""
    def block(*names):
        for name in names:
            monkeypatch.setitem(sys.modules, name, None)
        for attr in ('_cuda_fn', '_cuda_error', '_triton_module', '_triton_error'):
            monkeypatch.setattr(scan_module, attr, None)
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    return block


def test_auto_order_for_cuda_tensors(without_packages, monkeypatch):
    without_packages('mamba_ssm')
    assert select_kernel('auto', torch.device('cuda')) == 'triton'  # triton imports here
    assert select_kernel('auto', torch.device('cpu')) == 'torch'  # the interpreter is for tests only
    monkeypatch.setattr(scan_module, '_cuda_fn', lambda *a: None)
    assert select_kernel('auto', torch.device('cuda')) == 'cuda'  # mamba-ssm first when present
    assert resolve_backend('mamba_ssm') == resolve_backend('CUDA') == 'cuda'


def test_forced_backends_that_are_unavailable_name_the_option(without_packages, monkeypatch):
    without_packages('mamba_ssm', 'archs.scan.triton_function')
    args, _ = make_inputs('shared', 5, '')
    for backend, package in (('triton', 'triton'), ('cuda', 'mamba-ssm'), ('mamba_ssm', 'mamba-ssm')):
        with pytest.raises(ScanBackendUnavailable, match=f'network_g.scan_backend.*{package}'):
            selective_scan(**args, backend=backend)
    monkeypatch.setenv(BACKEND_ENV, 'triton')
    with pytest.raises(ImportError, match=f'\\${BACKEND_ENV}=triton'):
        selective_scan(**args)
    assert select_kernel('auto', torch.device('cuda')) == 'torch'  # neither package: torch


def test_forced_triton_on_cpu_without_the_interpreter_asks_for_cuda_tensors(interpreted, monkeypatch):
    monkeypatch.setattr(interpreted, 'interpreting', lambda: False)
    with pytest.raises(InputError, match='network_g.scan_backend=triton.*CUDA tensors.*TRITON_INTERPRET'):
        select_kernel('triton', torch.device('cpu'))


def test_backend_is_logged_once_at_build_and_once_at_first_use_per_process(interpreted, monkeypatch):
    monkeypatch.setattr(scan_module, '_logged', set())
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    with basicsr_log() as records:
        nets = [archs.MambaIR(upscale=2, img_size=8, embed_dim=30, depths=[2], d_state=2, mlp_ratio=1,
                              upsampler='pixelshuffle') for _ in range(2)]  # e.g. net_g and its EMA
        built = list(records)
        assert built == ['selective scan: scan_backend=auto (for CUDA tensors the first that '
                         'imports of cuda (mamba-ssm) > triton > torch; otherwise torch)']
        with torch.no_grad():
            nets[0](torch.rand(1, 3, 4, 4))
            nets[0](torch.rand(1, 3, 4, 4))
        assert records[len(built):] == ["selective scan: backend 'auto' runs the 'torch' kernel on cpu tensors"]


def test_benchmark_compares_backends_against_the_float64_reference(interpreted, without_packages, capsys):
    """bench_scan.py's backend comparison (run with --device cuda on a GPU), here on CPU tensors
    through the interpreter at tiny shapes: torch and triton agree with the float64 reference in
    the output and every gradient, a missing mamba-ssm is reported as not run, every backend
    gets a time; and the MambaIR comparison runs triton against torch."""
    without_packages('mamba_ssm')
    scan_module._triton_module = interpreted
    bench = load_script('bench_scan')
    args = argparse.Namespace(batch=1, d_inner=3, d_state=3, side=3, repeats=1, warmup=1, skip_loop=False,
                              sweep_tile=4)
    medians = bench.compare_backends(args, torch.device('cpu'))
    out = capsys.readouterr().out
    assert set(medians) == {'torch', 'triton'}
    assert re.search(r'^torch +fwd\+bwd: median', out, re.M)
    assert re.search(r'^mamba-ssm +not run: .*mamba-ssm', out, re.M)
    errors = re.findall(r'^ +max \|diff\| / max \|float64 reference\|: output (\S+), grads (.*)$', out, re.M)
    assert len(errors) == 2, out   # torch, triton
    for output, grads in errors:
        values = [float(output)] + [float(v.split()[1]) for v in grads.split(', ')]
        assert len(values) == 8 and max(values) < 1e-5, out
    assert 'speed-up of triton over torch' in out and 'sequential loop fwd+bwd' in out
    bench.compare_mambair(torch.device('cpu'), ('torch', 'triton', 'cuda'), embed_dim=30, d_state=3, size=(5, 3),
                          blocks=1)
    out = capsys.readouterr().out
    assert re.search(r'^MambaIR mamba-ssm +not run: .*mamba-ssm', out, re.M), out
    diff = re.search(r'^MambaIR scan_backend triton vs torch: output (\S+), largest over (\d+) parameter '
                     r'gradients (\S+)', out, re.M)
    assert diff and int(diff.group(2)) > 10 and float(diff.group(1)) < 1e-4 and float(diff.group(3)) < 1e-3, out
    names = triton_launches.LAUNCH_SETTINGS
    before = {name: getattr(triton_launches, name) for name in names}
    bench.sweep_triton(args, torch.device('cpu'), ['8,2,1,1,4,1,1', '4,1,1,2,2,1,3'])
    out = capsys.readouterr().out
    for config in ('8,2,1,1,4,1,1', '4,1,1,2,2,1,3'):
        line = re.search(rf'^sweep {config}: fwd\+bwd median [\d.]+ ms \(forward [\d.]+ ms, backward -?[\d.]+ ms\), '
                         rf'max rel diff (\S+) \(first call', out, re.M)
        assert line and float(line.group(1)) < 1e-5, out   # correct, not marked WRONG
    assert re.search(r'^fastest correct at chunk 4: .*: 4,1,1,2,2,1,3$', out, re.M), out
    assert re.search(r'^fastest correct at chunk 8: .*: 8,2,1,1,4,1,1$', out, re.M), out
    assert 'sweep tile at u/delta (1, 12, 16), d_state 3, forward alone' in out   # then the tile, batch 1
    for config in ('8,2,1,1,4,1,1', '4,1,1,2,2,1,3'):
        line = re.search(rf'^sweep tile {config}: forward median [\d.]+ ms, max rel diff (\S+) \(first call', out, re.M)
        assert line and float(line.group(1)) < 1e-5, out
    assert re.search(r'^fastest correct forward at the tile: [\d.]+ ms: (8,2,1,1,4,1,1|4,1,1,2,2,1,3)$', out, re.M), out
    assert {name: getattr(triton_launches, name) for name in names} == before   # defaults restored


def test_benchmark_checks_mambairs_bf16_call_against_float32_copies(interpreted, monkeypatch, capsys):
    """bench_scan's bf16 line: the Triton call on bf16 activations with a float32 output against the
    same call on float32 copies, and that call against itself (under the interpreter all of them
    bit-equal in the output and the gradients of A, B, C, D, delta_bias; u's and delta's bf16
    gradients counted where their rounding differs: the interpreter truncates), then the timed
    calls (mamba-ssm's on float32 copies, when it is there)."""
    bench = load_script('bench_scan')
    monkeypatch.setattr(bench, 'available_backends', lambda device: [('triton', ''), ('cuda', 'no mamba-ssm')])
    direct_dtypes, perturb = [], {'on': False}
    real = bench.selective_scan

    def scan(*a, **k):
        if k.get('out_dtype') is not None:
            direct_dtypes.append([a[i].dtype for i in (0, 1, 3, 4)])
        out = real(*a, **k)
        return out * (1 + 1e-3) if perturb['on'] and k.get('out_dtype') is not None else out
    monkeypatch.setattr(bench, 'selective_scan', scan)
    args = argparse.Namespace(batch=1, d_inner=2, d_state=3, side=4, repeats=1, warmup=0)
    assert bench.compare_bf16_call(args, torch.device('cpu')) is None
    out = capsys.readouterr().out
    line = re.search(r'^MambaIR bf16 call \(bf16 u, delta, B, C; float32 output\), Triton against float32 copies: '
                     r'output and the other gradients bit-equal \(the copies\' call against itself: bit-equal\); '
                     r'u and delta gradients: (\d+) of 256 elements differ, by at most (\d+) bf16 step\(s\)$', out, re.M)
    assert line, out
    assert direct_dtypes and all(d == [torch.bfloat16] * 4 for d in direct_dtypes)   # u, delta, B, C
    # the count, recomputed here: the bf16 gradients of u and delta from the kernel's store against
    # torch's cast of the float32 copies' gradients
    inputs = [t.detach().to(torch.bfloat16 if i in (0, 1, 3, 4) else torch.float32).requires_grad_()
              for i, t in enumerate(bench.make_inputs(1, 2, 3, 4))]
    grads = []
    for direct in (True, False):
        u, dl, A, B, C, D, db = inputs if direct else [t.float() for t in inputs]
        y = real(u, dl, A, B, C, D, None, db, True, backend='triton', out_dtype=torch.float32 if direct else None)
        weight = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
        grads.append(torch.autograd.grad((y * weight).sum(), inputs[:2]))
    differing = sum(int((a != b).sum()) for a, b in zip(*grads))
    assert int(line.group(1)) == differing > 0
    assert line.group(2) == '1'                    # truncation against rounding: one step at most
    assert re.search(r'^triton +bf16 call fwd\+bwd \(reads bf16, casts included\): median [\d.]+ ms', out, re.M), out
    assert 'mamba-ssm bf16 call' not in out
    perturb['on'] = True                           # a call that does not equal the copies' is said to differ
    bench.compare_bf16_call(args, torch.device('cpu'))
    out = capsys.readouterr().out
    apart = re.search(r'output and the other gradients within (\S+) \(the copies\' call against itself: bit-equal\)', out)
    assert apart and 0 < float(apart.group(1)) < 1e-2, out   # B's and C's gradients are bf16


def test_launch_overhead_times_the_host_side_of_mambairs_bf16_call_without_a_gpu(monkeypatch, capsys):
    """--launch-overhead: the launch descriptions of MambaIR's bf16 call (bf16 in, float32 out),
    timed on the host; no kernel runs, so no GPU and no interpreter is needed."""
    bench = load_script('bench_scan')
    described = []
    real = triton_launches.forward_launch
    monkeypatch.setattr(triton_launches, 'forward_launch', lambda *a, **k: described.append(k) or real(*a, **k))
    monkeypatch.setattr(sys, 'argv', ['bench_scan.py', '--launch-overhead', '--side', '2', '--d-inner', '4'])
    bench.main()
    out = capsys.readouterr().out
    line = re.search(r'^Triton launch descriptions on the host \(MambaIR bf16 call, u \(4, 16, 4\); torch .*\): '
                     r'forward ([\d.]+) us, backward ([\d.]+) us per call', out, re.M)
    assert line and float(line.group(1)) > 0 and float(line.group(2)) > 0, out
    assert described and all(k.get('out_dtype') is torch.float32 for k in described)


def test_benchmark_times_torch_once_at_a_tile_and_checks_mambair_before_the_tile(monkeypatch, capsys):
    """On a GPU, the torch scan at the 250x250 tile took seconds a call: timed at full repeats it ran the
    GPU check's scan step past its limit before the network check (the first run of the cuda
    backend inside MambaIR) was reached. Now, on stand-ins: past REFERENCE_GRAD_LENGTH torch is timed
    once without warm-up (said), the other backends at --repeats; and --device cuda runs the training
    shape, then the MambaIR check, then the tile."""
    bench = load_script('bench_scan')
    torch_scan = bench.backend_fn('torch')
    monkeypatch.setattr(bench, 'backend_fn', lambda name: torch_scan)
    monkeypatch.setattr(bench, 'available_backends', lambda device: [('triton', ''), ('cuda', '')])
    calls = []
    timed = bench.time_fwd_bwd
    monkeypatch.setattr(bench, 'time_fwd_bwd', lambda fn, inputs, repeats, warmup=0, backward=True:
                        calls.append((repeats, warmup)) or timed(fn, inputs, repeats, warmup, backward))
    monkeypatch.setattr(bench, 'REFERENCE_GRAD_LENGTH', 8)   # side 3: L 9 counts as a tile
    args = argparse.Namespace(batch=1, d_inner=3, d_state=3, side=3, repeats=3, warmup=2, skip_loop=True)
    bench.compare_backends(args, torch.device('cpu'))
    out = capsys.readouterr().out
    assert calls == [(1, 0), (3, 2), (3, 2)], calls   # torch, triton, mamba-ssm
    assert re.search(r'^torch +fwd\+bwd: median [\d.]+ ms, best [\d.]+ ms \(one timed run\)$', out, re.M), out
    assert re.search(r'^triton +fwd\+bwd: median [\d.]+ ms, best [\d.]+ ms$', out, re.M), out
    calls.clear()
    monkeypatch.setattr(bench, 'REFERENCE_GRAD_LENGTH', 9)   # at the training shape: every backend at --repeats
    bench.compare_backends(args, torch.device('cpu'))
    assert calls == [(3, 2)] * 3 and '(one timed run)' not in capsys.readouterr().out
    order = []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(bench, 'versions', lambda device: 'versions')
    monkeypatch.setattr(bench, 'compare_backends', lambda a, device: order.append((a.batch, a.side)))
    monkeypatch.setattr(bench, 'compare_mambair', lambda device: order.append('mambair'))
    monkeypatch.setattr(bench, 'compare_four_way', lambda device: order.append('four-way'))
    monkeypatch.setattr(bench, 'compare_bf16_call', lambda a, device: order.append(('bf16', a.batch, a.side)))
    monkeypatch.setattr(sys, 'argv', ['bench_scan.py', '--device', 'cuda'])
    bench.main()
    assert order == [(4, 48), 'mambair', 'four-way', ('bf16', 4, 48), (1, 250)]
    order.clear()                                 # a shape of one's own: that shape alone, no tile
    monkeypatch.setattr(sys, 'argv', ['bench_scan.py', '--device', 'cuda', '--side', '24', '--batch', '2'])
    bench.main()
    assert order == [(2, 24), 'mambair', 'four-way', ('bf16', 2, 24)]


def test_the_sweep_marks_a_wrong_configuration_and_times_each_beside_mamba_ssm(monkeypatch, capsys):
    """The sweep's own logic, on stand-ins (the torch scan for both kernels, fast): a configuration
    whose output is off by 1% is marked WRONG and never reported as the fastest, and with mamba-ssm
    importable every configuration gets its ratio to mamba-ssm's time from the same run."""
    bench = load_script('bench_scan')
    torch_scan = bench.backend_fn('torch')

    def stand_in(name):
        if name != 'triton':
            return torch_scan                        # mamba-ssm's place
        return lambda *inputs: torch_scan(*inputs) * (1.01 if triton_launches.CHUNK == 4 else 1.0)
    monkeypatch.setattr(bench, 'backend_fn', stand_in)
    monkeypatch.setattr(bench, 'available_backends', lambda device: [('triton', ''), ('cuda', '')])
    timed = bench.time_fwd_bwd   # the wrong configuration is also the fastest: it must still not be chosen

    def fast_when_wrong(fn, inputs, repeats, warmup=0, backward=True):
        times = timed(fn, inputs, repeats, warmup, backward)
        return [t / 100 if triton_launches.CHUNK == 4 else t for t in times]
    monkeypatch.setattr(bench, 'time_fwd_bwd', fast_when_wrong)
    args = argparse.Namespace(batch=2, d_inner=3, d_state=3, side=3, repeats=1, warmup=0, sweep_tile=4)
    bench.sweep_triton(args, torch.device('cpu'), ['8,2,1,1,4,1,1', '4,1,1,2,2,1,3'])
    out = capsys.readouterr().out
    # at the validation tile too (batch 1 whatever the training batch): the forward alone beside mamba-ssm's,
    # the wrong configuration never fastest
    assert 'sweep tile at u/delta (1, 12, 16), d_state 3, forward alone' in out
    assert re.search(r'^sweep tile mamba-ssm: forward median [\d.]+ ms, max rel diff \S+$', out, re.M), out
    assert re.search(r'^sweep tile 4,1,1,2,2,1,3: forward median .* WRONG, triton/mamba-ssm [\d.]+ \(first', out, re.M), out
    assert re.search(r'^fastest correct forward at the tile: [\d.]+ ms: 8,2,1,1,4,1,1$', out, re.M), out
    assert re.search(r'^sweep mamba-ssm: fwd\+bwd median [\d.]+ ms \(forward [\d.]+ ms\), max rel diff \S+$', out, re.M), out
    assert re.search(r'^sweep 4,1,1,2,2,1,3: .*, max rel diff \S+ WRONG, triton/mamba-ssm [\d.]+ \(first call', out, re.M), out
    assert re.search(r'^sweep 8,2,1,1,4,1,1: .*, max rel diff [\d.e+-]+, triton/mamba-ssm [\d.]+ \(first call', out, re.M), out
    assert 'fastest correct at chunk 4' not in out
    assert re.search(r'^fastest correct at chunk 8: .*: 8,2,1,1,4,1,1$', out, re.M), out
    bench.sweep_triton(argparse.Namespace(**dict(vars(args), sweep_tile=0)), torch.device('cpu'), ['8,2,1,1,4,1,1'])
    assert 'sweep tile' not in capsys.readouterr().out   # --sweep-tile 0: the training shape only


@pytest.mark.parametrize('config, message', [
    ('16,4,2,4,2', r"expected 7 integers CHUNK,FORWARD_BLOCK_D,FORWARD_WARPS,FORWARD_STAGES,BACKWARD_BLOCK_D"),
    ('16,4,2,x,4,2,1', 'expected 7 integers'),
    ('16,4,2,0,4,2,1', r'FORWARD_STAGES: expected an integer >= 1, got 0'),
])
def test_a_bad_sweep_configuration_is_refused_before_any_gpu_work(config, message):
    """The sweep's configurations are read before the GPU session spends time on the first one."""
    bench = load_script('bench_scan')
    assert bench.parse_sweep(['16,4,2,1,4,2,3']) == [dict(zip(triton_launches.LAUNCH_SETTINGS, (16, 4, 2, 1, 4, 2, 3)))]
    with pytest.raises(ValueError, match=message):
        bench.parse_sweep(['16,4,2,1,4,2,1', config])


# -- a forward without a backward, split along the sequence (the kernel's SPLIT) ------------------
def _split_forward(args, softplus, segments, chunk=T, height=None):
    launch = triton_launches.forward_launch(*(args.get(k) for k in ('u', 'delta', 'A', 'B', 'C', 'D', 'z',
                                                                    'delta_bias')),
                                            softplus, False, chunk, 4, torch.float32, height, segments)
    outputs = launch.run()
    return outputs['out'], outputs['last'], launch


@pytest.mark.parametrize('length, segments, ran', [(5 * T - 3, 2, 2), (5 * T - 3, 3, 3), (5 * T - 3, 5, 5),
                                                   (11 * T + 1, 4, 4), (11 * T + 1, 5, 4), (3, 4, 1)])
def test_a_forward_split_along_the_sequence_equals_the_float64_reference(interpreted, length, segments, ran):
    """Segments of whole chunks (the last one short, or past the sequence's chunks: fewer run),
    each started from the earlier segments' end states composed through their delta sums:
    output and last state of MambaIR's call against the float64 step-by-step reference."""
    args, softplus = make_inputs('grouped', length, 'D+z+bias+softplus', batch=2, dim=8, dstate=3, groups=4)
    with torch.no_grad():
        out, last, launch = _split_forward(args, softplus, segments)
        ref_out, ref_last = sequential_reference(**args, delta_softplus=softplus)
    assert launch.launch.grid[2] == ran and len(launch.before) == (ran > 1)
    torch.testing.assert_close(out, ref_out.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, ref_last.float(), rtol=1e-5, atol=1e-5)


def test_the_four_way_forward_split_along_the_sequence_equals_the_float64_reference(interpreted):
    """SS2D's four directions (reversed and column-major ones read by index) split into three
    segments: the sum of four float64 step-by-step scans, each over its direction's order of the
    row-major inputs (written here: rows, columns, both reversed), mapped back to row-major."""
    height, width, dim, dstate = 5, 7, 3, 3
    gen = torch.Generator().manual_seed(3)
    length = height * width
    x = torch.randn(2, dim, length, generator=gen)
    delta = torch.randn(2, 4 * dim, length, generator=gen).abs() * 0.5
    A = -torch.rand(4 * dim, dstate, generator=gen) * 3
    B, C = (torch.randn(2, 4, dstate, length, generator=gen) for _ in range(2))
    D, bias = torch.randn(4 * dim, generator=gen), torch.randn(4 * dim, generator=gen) * 0.5
    args = dict(u=x, delta=delta, A=A, B=B, C=C, D=D, delta_bias=bias)
    with torch.no_grad():
        split, _, launch = _split_forward(args, True, 3, height=height)
    assert launch.launch.grid[2] == 3
    by_rows = torch.arange(length)
    by_columns = by_rows.view(height, width).t().reshape(-1)   # position t of a column scan
    orders = [by_rows, by_columns, by_rows.flip(0), by_columns.flip(0)]
    reference = torch.zeros(2, dim, length, dtype=torch.float64)
    for k, order in enumerate(orders):
        channels = slice(k * dim, (k + 1) * dim)
        out, _ = sequential_reference(x[..., order], delta[:, channels][..., order], A[channels],
                                      B[:, k][..., order], C[:, k][..., order], D[channels],
                                      delta_bias=bias[channels], delta_softplus=True)
        reference[..., order] += out
    torch.testing.assert_close(split.double(), reference, rtol=1e-5, atol=1e-5)
