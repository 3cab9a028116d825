"""Triton selective scan, run on CPU tensors by Triton's interpreter: outputs, last state and
every gradient equal a float64 sequential reference (odd shapes, several chunks including a
partial one, masked channel and state blocks), float32 state accumulation for half-precision
inputs, O(L/chunk) saved states, and the backend choice ('auto' order, clear errors, logging)."""
import argparse
import importlib
import logging
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
from conftest import load_script  # noqa: E402
from test_selective_scan import make_inputs, sequential_reference  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
        env = dict(os.environ, TRITON_INTERPRET='1')
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


def _all_grads(out, last, args):
    w_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    w_last = torch.randn(last.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    loss = (out.double() * w_out).sum() + (last.double() * w_last).sum()
    return torch.autograd.grad(loss, list(args.values()))


def _check_against_reference(args, softplus, out, last, rtol=1e-4, atol=1e-4):
    ref_out, ref_last = sequential_reference(**args, delta_softplus=softplus)
    torch.testing.assert_close(out, ref_out.to(out.dtype), rtol=rtol, atol=atol)
    torch.testing.assert_close(last, ref_last.float(), rtol=rtol, atol=atol)
    for name, g, r in zip(args, _all_grads(out, last, args), _all_grads(ref_out, ref_last, args)):
        assert g.dtype == args[name].dtype, name
        torch.testing.assert_close(g, r.to(g.dtype), rtol=rtol, atol=atol, msg=f'gradient of {name}')


@pytest.mark.parametrize('bc, options, dim, groups', [
    ('shared', '', 5, 1),
    ('shared', 'D+z+bias+softplus', 5, 1),
    ('grouped', 'D+bias+softplus', 10, 2),  # 5 channels per group: a full and a partial block
    ('grouped', 'z', 10, 2),
    ('grouped', 'D+z+bias+softplus', 6, 3),
    ('const', 'D+z+bias+softplus', 5, 1),
    ('const', 'bias', 5, 1),
])
def test_matches_float64_reference_over_several_chunks(interpreted, bc, options, dim, groups):
    """L=37 with chunks of 8 (four full chunks and a partial one), n=3 (masked to 4), 4-channel
    blocks that do not divide the channels."""
    args, softplus = make_inputs(bc, 37, options, batch=2, dim=dim, dstate=3, groups=groups)
    out, last = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=8, block_d=4)
    assert out.dtype == torch.float32 and last.shape == (2, dim, 3)
    _check_against_reference(args, softplus, out, last)


@pytest.mark.parametrize('bc, options, dstate', [
    ('grouped', 'D+z+bias+softplus', 4),  # both B and C vary: one butterfly for dB and dC
    ('grouped', 'D+bias+softplus', 8),    # two loop passes of four states
    ('shared', 'bias+softplus', 2),
    ('shared', 'D', 6),                   # passes of two states (6 is not a multiple of 4)
    ('const', 'D+z', 4),
    ('grouped', 'D+z', 5),                # an odd count: the last pass has no state for half the lanes
])
def test_state_counts_of_the_gradient_walk(interpreted, bc, options, dstate):
    """The gradient walk gives each lane the states of its parity, four states per loop pass when
    d_state is a multiple of 4 (MambaIR's 16), else two, and masks the missing state of an odd
    count: output, last state and every gradient against the float64 reference, over chunks and
    a partial last sub-tile, with channel blocks whose second half is partly past the group."""
    args, softplus = make_inputs(bc, 23, options, batch=2, dim=6, dstate=dstate, groups=2)
    out, last = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=8, block_d=4)
    _check_against_reference(args, softplus, out, last)


@triton.jit
def _lane_sums_probe(x_ptr, out_ptr, ROWS: tl.constexpr, V: tl.constexpr, PARTS: tl.constexpr):
    rows = tl.arange(0, ROWS)
    columns = ()
    for v in tl.static_range(V):  # one (ROWS,) vector per value, as the gradient kernel has them
        columns = columns + (tl.load(x_ptr + rows * V + v),)
    tl.store(out_ptr + tl.arange(0, PARTS * V), triton_kernels._lane_sums(triton_kernels._stack(columns), PARTS))


@pytest.mark.parametrize('rows, values, parts', [(32, 16, 1), (32, 8, 1), (32, 1, 1), (4, 8, 1), (4, 4, 1),
                                                 (2, 16, 1), (32, 8, 2), (32, 16, 2), (4, 8, 2), (2, 4, 2)])
def test_lane_sums_butterfly_equals_a_float64_sum_over_each_run_of_rows(interpreted, rows, values, parts):
    """The butterfly that sums dB and dC over a program's channels: each of ``values`` columns
    summed over the ``rows`` lanes, or separately over each half of them (``parts`` 2: the
    gradient walk's two state parities), also when there are more values than lanes."""
    x = torch.randn(rows, values, generator=torch.Generator().manual_seed(rows * values))
    out = torch.empty(parts * values)
    _lane_sums_probe[(1,)](x, out, ROWS=rows, V=values, PARTS=parts)
    expected = x.double().view(parts, rows // parts, values).sum(1).reshape(-1)
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('length, chunk, n_chunks', [
    (1, 4, 1),    # a sequence of one position: one sub-tile, three positions of it masked
    (16, 16, 1),  # exactly one chunk of whole sub-tiles
    (9, 8, 2),    # one chunk and one position: the second chunk is a single position
    (13, 4, 4),   # chunks of one sub-tile, the last one partial
    (9, 1, 3),    # chunk 1 rounded up to a whole sub-tile of 4
    (30, 12, 3),  # chunks of three sub-tiles, the last chunk partial (6 of 12)
])
def test_chunk_boundaries(interpreted, length, chunk, n_chunks):
    """Carries between chunks and sub-tiles at every kind of boundary: output, last state and
    every gradient against the float64 reference, with the chunk count the launch used."""
    args, softplus = make_inputs('grouped', length, 'D+z+bias+softplus', dim=4, groups=2)
    out, last = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=chunk)
    saved = [t for t in out.grad_fn.saved_tensors if t is not None and t.dim() == 4 and t.shape[-1] == 3]
    assert [tuple(t.shape) for t in saved] == [(2, 4, n_chunks, 3)]
    _check_against_reference(args, softplus, out, last)


@pytest.mark.parametrize('bc, options, dim, groups', [
    ('grouped', 'D+z+bias+softplus', 10, 2),
    ('shared', 'D', 5, 1),
    ('const', 'D+bias+softplus', 5, 1),
])
def test_forward_loop_and_its_masked_tail(interpreted, bc, options, dim, groups):
    """The forward's loop walks FORWARD_UNROLL sub-tiles per pass and leaves the rest of a chunk
    to masked sub-tiles after it: at chunk 20 (16 positions of loop and one sub-tile of tail)
    and L = 37 (the second chunk: 16 of loop and one position of tail), output, last state and
    every gradient against the float64 reference."""
    assert triton_launches.FORWARD_SUB * triton_launches.FORWARD_UNROLL == 16
    args, softplus = make_inputs(bc, 37, options, batch=2, dim=dim, dstate=3, groups=groups)
    out, last = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=20, block_d=4)
    _check_against_reference(args, softplus, out, last)


@triton.jit
def _softplus_probe(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, triton_kernels._softplus(tl.load(x_ptr + i, mask=i < n)), mask=i < n)


def test_softplus_is_torchs_to_a_few_float32_ulp(interpreted):
    """The kernels' softplus (no log: exp2, rsqrt and a polynomial) against float64
    log(1 + e^x) (x itself above 20, as torch): relative error under 1e-6 where MambaIR's
    delta + bias lie (about -8 to 2; the float32 rounding of the exp2 argument dominates, as in
    any exp2-based exp) and under 4e-6 from -40 to 40; x itself above 20; e^x where it is tiny.
    The interpreter rounds exp2 and rsqrt correctly, a GPU's approximate ones add about 2 ulp."""
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
def _bc_positions_probe(out_ptr, bi, dim, chans, g0, padded, t0, NQ: tl.constexpr):
    bi = (tl.program_id(0) + bi).to(tl.int64)  # int64, as _program_coordinates makes it
    tl.store(out_ptr, triton_kernels._bc_positions(bi, dim, chans, g0, padded, t0, NQ, True))


def test_position_major_b_and_c_offsets_past_2_31_are_exact(interpreted):
    """The forward's B/C copy is (b, G, padded L, NQ): the last group's chunk start of a
    2**28-position sequence (a 16384 x 16384 image) at batch 2 lies past 2**31 elements."""
    padded, nq, chans, dim, chunk = 2 ** 28, 16, 360, 1440, 2 ** 21
    bi, g0, t0 = 1, 3 * chans, padded - chunk
    out = torch.zeros(1, dtype=torch.int64)
    _bc_positions_probe[(1,)](out, bi, dim, chans, g0, padded, t0, NQ=nq)
    expected = ((bi * (dim // chans) + g0 // chans) * padded + t0) * nq
    assert expected > 2 ** 31 and out.item() == expected


def test_long_sequences_get_longer_chunks_not_more_than_max_chunks(interpreted, monkeypatch):
    """The carry kernel walks the chunks one after another, so their number is capped: with a
    cap of 3, L = 37 at chunk 4 runs 3 chunks of 16 positions (the last one partial)."""
    monkeypatch.setattr(triton_launches, 'MAX_CHUNKS', 3)
    args, softplus = make_inputs('shared', 37, 'D+bias+softplus', dim=3)
    out, last = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=4)
    assert [tuple(t.shape) for t in out.grad_fn.saved_tensors if t is not None and t.dim() == 4] == \
        [(2, 3, 3, 3)]
    _check_against_reference(args, softplus, out, last)


def test_b_and_c_with_different_groupings_through_the_public_function(interpreted):
    """B with 2 groups, C with 3 (of 6 channels): programs follow the finer grouping and the
    gradients are summed back to each tensor's own groups. Default chunk (longer than L)."""
    args, softplus = make_inputs('grouped', 23, 'D+z+bias+softplus', dim=6, groups=2)
    args['C'] = torch.randn(2, 3, 3, 23, generator=torch.Generator().manual_seed(9)).requires_grad_()
    out, last = selective_scan(**args, delta_softplus=softplus, return_last_state=True, backend='triton')
    _check_against_reference(args, softplus, out, last)


def test_strong_decay_stays_finite_and_exact(interpreted):
    """delta*A down to about -150 per step: only decays <= 1 are formed."""
    args, _ = make_inputs('grouped', 30, 'D', dim=4, groups=2, delta_scale=50.0)
    out, last = interpreted.selective_scan_triton(**args, chunk=8)
    assert torch.isfinite(out).all() and torch.isfinite(last).all()
    _check_against_reference(args, False, out, last)


def test_chunk_adjoints_summed_forward_through_decay_products_that_underflow(interpreted):
    """The backward sums each chunk's adjoint from zero in the forward direction, weighting C dy
    at each position by the product of the decays from the chunk's start to it. Here chunks are
    32 positions long and state 0 decays by about e^-20 per position, so that product
    underflows to 0 a few positions into every chunk, while states 1 and 2 decay slowly and
    carry adjoints across every boundary; the loss uses the last state too, so the reversed
    carries start from its gradient. Every gradient against the float64 reference."""
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
    out, last = interpreted.selective_scan_triton(**half, delta_softplus=softplus, chunk=8)
    assert out.dtype == torch.bfloat16
    _check_against_reference(half, softplus, out, last, rtol=3e-2, atol=3e-2)


def test_backward_keeps_one_state_per_chunk(interpreted):
    """What forward saves: the inputs and (b, d, ceil(L/chunk), n) chunk-entry states; nothing
    of the states' full b*d*n*L size. Under no_grad nothing is saved and the output is equal."""
    args, softplus = make_inputs('grouped', 37, 'D+bias+softplus', dim=4, groups=2)
    out, _ = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=8)
    sizes = [tuple(t.shape) for t in out.grad_fn.saved_tensors if t is not None]
    assert (2, 4, 5, 3) in sizes
    assert max(torch.Size(s).numel() for s in sizes) < 2 * 4 * 3 * 37
    with torch.no_grad():
        again, _ = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=8)
    assert again.grad_fn is None
    torch.testing.assert_close(again, out.detach(), rtol=0, atol=0)


@pytest.mark.parametrize('used', ['output', 'last state', 'both'])
def test_backward_does_final_state_work_only_when_its_gradient_is_needed(interpreted, monkeypatch, used):
    """Only the outputs a loss uses get a gradient: with the output alone (MambaIR's case) the
    backward kernel runs without the last state's gradient (HAS_DLAST off, its branch compiled
    out), with the last state alone the output gradient is zero; every gradient equals the
    float64 reference of the same loss."""
    launches = []
    real = interpreted.backward_launch
    monkeypatch.setattr(interpreted, 'backward_launch',
                        lambda *a, **k: launches.append(real(*a, **k)) or launches[-1])
    args, softplus = make_inputs('grouped', 19, 'D+bias+softplus', dim=4, groups=2)
    out, last = interpreted.selective_scan_triton(**args, delta_softplus=softplus, chunk=8)
    ref_out, ref_last = sequential_reference(**args, delta_softplus=softplus)
    assert out.grad_fn is not None and last.shape == (2, 4, 3)

    def loss(o, s):
        w_out = torch.randn(o.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
        w_last = torch.randn(s.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
        return ((o.double() * w_out).sum() if used != 'last state' else 0) + \
            ((s.double() * w_last).sum() if used != 'output' else 0)
    grads = torch.autograd.grad(loss(out, last), list(args.values()))
    refs = torch.autograd.grad(loss(ref_out, ref_last), list(args.values()), allow_unused=True)
    carries = [launch for plan in launches for launch in plan.launches if launch.kernel is triton_kernels._carry_kernel]
    assert [launch.constexprs['HAS_START'] for launch in carries] == [used != 'output']
    for (name, a), g, r in zip(args.items(), grads, refs):  # (the last state does not use C)
        r = torch.zeros_like(a) if r is None else r.float()
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4, msg=f'gradient of {name}')


@triton.jit
def _offsets_probe(rows_ptr, part_ptr, state_ptr, sums_ptr, last_ptr, slot_ptr, bi, blk, blocks, dim,
                   length, dstate, group_size, n_chunks, c, slot_size, BLOCK_D: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """The kernels' own offset helpers for the program (chunk c, block blk, batch bi) (any: no
    grid of that size is launched), written to int64 outputs."""
    bi, g0, d, mask_d = triton_kernels._program_coordinates(bi, blk, dim, group_size, BLOCK_D)
    k, n = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_N)
    tile = d[:, None] * dstate + n[None, :]
    square = k[:, None] * BLOCK_N + n[None, :]
    tl.store(rows_ptr + k, triton_kernels._sequence_rows(bi, dim, d, length))
    tl.store(part_ptr, triton_kernels._partial_rows(bi, blk, blocks, dstate, length))
    tl.store(state_ptr + square, triton_kernels._chunk_state_offsets(bi, dim, d, n_chunks, c, dstate, n))
    tl.store(sums_ptr + k, triton_kernels._chunk_sum_offsets(bi, dim, d, n_chunks, c))
    tl.store(last_ptr + square, triton_kernels._last_state_offsets(bi, dim, dstate, tile))
    tl.store(slot_ptr, triton_kernels._program_slot(bi, blk, blocks, n_chunks, c, slot_size))


@pytest.mark.parametrize('batch, length', [(2, 1024 * 1024), (2000, 48 * 48)])
def test_offsets_past_2_31_are_exact(interpreted, batch, length):
    """The last program's offsets at MambaIR's 1440 channels (4 groups of 360, 16 states), where
    b*dim*L passes 2**31: a 1024x1024 image at batch 2, and training patches at batch 2000 (the
    backward's per-program scratch slots pass it there). Reference: Python integers of the same
    layout (channel c of group g in block k is g*360 + k*32 + c; tensors row-major)."""
    dim, group, dstate, bd, bn = 1440, 360, 16, 32, 16
    chunk = max(64, -(-length // triton_launches.MAX_CHUNKS))
    blocks_per_group = -(-group // bd)
    blocks = dim // group * blocks_per_group
    n_chunks = -(-length // chunk)
    bi, blk, c = batch - 1, blocks - 1, n_chunks - 1
    slot_size = chunk // triton_launches.SUB * bd * bn  # the backward's scratch slot
    grp, within = blk // blocks_per_group, blk % blocks_per_group
    chans = [grp * group + within * bd + i for i in range(bd)]
    expected = {
        'rows': [(bi * dim + ch) * length for ch in chans],
        'part': [(bi * blocks + blk) * dstate * length],
        'state': [[((bi * dim + ch) * n_chunks + c) * dstate + j for j in range(bn)] for ch in chans],
        'sums': [(bi * dim + ch) * n_chunks + c for ch in chans],
        'last': [[bi * dim * dstate + ch * dstate + j for j in range(bn)] for ch in chans],
        'slot': [((bi * blocks + blk) * n_chunks + c) * slot_size]}
    got = {k: torch.zeros(torch.tensor(v).shape, dtype=torch.int64) for k, v in expected.items()}
    _offsets_probe[(1,)](got['rows'], got['part'], got['state'], got['sums'], got['last'], got['slot'],
                         bi, blk, blocks, dim, length, dstate, group, n_chunks, c, slot_size,
                         BLOCK_D=bd, BLOCK_N=bn)
    assert max(max(torch.tensor(v).view(-1).tolist()) for v in expected.values()) > 2 ** 31
    for name, value in expected.items():
        assert got[name].tolist() == value, name


def test_shapes_past_the_kernels_32_bit_limits_are_refused_by_name_before_any_work(interpreted):
    """A sequence of 2**31 positions (an image of 46341 x 46341 pixels) cannot be indexed by the
    kernels' 32-bit positions: refused with the shape named, before anything is allocated
    (meta tensors: shapes only)."""
    def meta(*shape):
        return torch.empty(*shape, device='meta')
    L = 2 ** 31
    with pytest.raises(InputError, match=r'shape \(1, 8, 2147483648\).*positions L \+ chunk'):
        triton_launches.forward_launch(meta(1, 8, L), meta(1, 8, L), meta(8, 4), meta(1, 2, 4, L),
                                       meta(1, 2, 4, L), None, None, None, True)
    L = 2 ** 31 - 2 ** 24 - 64  # a long sequence it takes: 128 chunks of 16646144 positions
    plan = triton_launches.forward_launch(meta(1, 8, L), meta(1, 8, L), meta(8, 4), meta(1, 2, 4, L),
                                          meta(1, 2, 4, L), None, None, None, True)
    assert [launch.grid for launch in plan.launches] == [(128, 2, 1), (1, 1), (128, 2, 1)]


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
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger('basicsr')
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    monkeypatch.setattr(scan_module, '_logged', set())
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    try:
        nets = [archs.MambaIR(upscale=2, img_size=8, embed_dim=30, depths=[2], d_state=2, mlp_ratio=1,
                              upsampler='pixelshuffle') for _ in range(2)]  # e.g. net_g and its EMA
        net = nets[0]
        built = [r.getMessage() for r in records]
        assert built == ['selective scan: scan_backend=auto (for CUDA tensors the first that '
                         'imports of cuda (mamba-ssm) > triton > torch; otherwise torch)']
        with torch.no_grad():
            net(torch.rand(1, 3, 4, 4))
            net(torch.rand(1, 3, 4, 4))
        used = [r.getMessage() for r in records[len(built):]]
        assert used == ["selective scan: backend 'auto' runs the 'torch' kernel on cpu tensors"]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def test_benchmark_compares_backends_against_the_torch_path(interpreted, without_packages, capsys):
    """bench_scan.py's backend comparison (run with --device cuda on a GPU), here on CPU tensors
    through the interpreter at tiny shapes: triton agrees with torch, a missing mamba-ssm is
    reported as not run, and every backend gets a time."""
    without_packages('mamba_ssm')
    scan_module._triton_module = interpreted
    bench = load_script('bench_scan')
    args = argparse.Namespace(batch=1, d_inner=3, d_state=3, side=3, repeats=1, warmup=1, skip_loop=False)
    bench.compare_backends(args, torch.device('cpu'))
    out = capsys.readouterr().out
    assert re.search(r'^torch +fwd\+bwd: median', out, re.M)
    assert re.search(r'^mamba-ssm +not run: .*mamba-ssm', out, re.M)
    errors = re.search(r'^triton +fwd\+bwd: .*output (\S+), grads (.*)$', out, re.M)
    assert errors, out
    values = [float(errors.group(1))] + [float(v.split()[1]) for v in errors.group(2).split(', ')]
    assert len(values) == 8 and max(values) < 1e-4, out
    assert 'speed-up of triton over torch' in out and 'sequential loop fwd+bwd' in out
