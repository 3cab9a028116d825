"""The selective scan's Triton kernels (``@triton.jit`` code only): one forward kernel and one
backward kernel, each a single pass over the sequence with the state kept on chip, in the
structure of mamba-ssm's CUDA kernel (``csrc/selective_scan/selective_scan_{fwd,bwd}_kernel.cuh``).

How they are launched lives in :mod:`archs.scan.triton_launches`, the autograd function over them
in :mod:`archs.scan.triton_function`. This module imports triton at import time, so
:mod:`archs.scan.dispatch` imports it only when the 'triton' backend is used.
``TRITON_INTERPRET=1`` runs the same kernels on CPU tensors (the tests do); it must be set
before triton itself is first imported (:func:`archs.scan.triton_function.interpreting`).

Work split. One program per (batch element, block of ``BLOCK_D`` channels that share one slice
of B and C). It owns those channels over the whole sequence and walks it in a runtime loop
over chunks of ``T`` positions (``T`` a constexpr; the number of chunks is a runtime value, so
the compiled code does not depend on the sequence length). Per chunk, u and delta are loaded as
(T, BLOCK_D) tiles and B and C as (T, BLOCK_N) tiles of the channels' group (``T`` consecutive
positions of each row); delta + bias and the softplus are computed once per (position,
channel), then the decays ``a = exp2(delta A log2 e)`` and inputs ``b = delta u B`` as
(T, BLOCK_N, BLOCK_D) tiles. Positions come first and channels last so that Triton's default
layout gives the lanes states and channels and keeps a chunk's positions inside each thread:
the scans along the positions then need no lane shuffles (compiled for sm_90 and read in the
SASS; with the positions last the lanes took positions and the forward needed 3.6x the
shuffles). The recurrence ``h[t] = a[t] h[t-1] + b[t]`` is a
``tl.associative_scan`` along the positions with the combine ``(a1, b1), (a2, b2) ->
(a1 a2, a2 b1 + b2)``, the state carried from the previous chunk folded into position 0
(``b[0] += a[0] h``). Positions past the sequence get delta 0: decay 1, input 0, so the state
passes through them unchanged. All arithmetic is float32 whatever the input dtype.

Latency. A chunk's loads do not depend on the state carried into it, so the chunk loop is a
``tl.range`` with ``num_stages=STAGES``: at ``STAGES`` > 1 Triton's software pipeliner issues the
loads of the next ``STAGES - 1`` chunks as asynchronous copies into shared memory (``cp.async``)
while the current chunk computes, so a program does not wait a full memory latency per chunk;
this costs registers and shared memory (compiled for sm_90 at the training shape: forward 96 -> 118
registers at 3 stages, backward 168 -> 226). ``STAGES`` = 1 compiles the plain loop (the same SASS
as ``range``). Which is faster depends on how many programs an SM holds: a GPU timing decides
(:mod:`archs.scan.triton_launches`). Only decays
``exp(delta A) <= 1`` (for delta >= 0) and their products are formed: never the exponential of
a positive cumulative sum, so strong decay cannot overflow.

Forward (:func:`_scan_forward_kernel`): per chunk, ``y = sum_n C h + D u``, times
``silu(z)``; writes the output, the state entering each chunk (float32 (b, d, chunks, n), only
when a backward will need it: ``b d n L / T`` floats) and the last state.

Backward (:func:`_scan_backward_kernel`): walks the chunks last to first. Per chunk it reloads
the saved entering state, recomputes the decays, inputs and states with the same scan (and the
output, for z's gradient), then the adjoint ``g[t] = dL/dh[t] = C[t] dy[t] + a[t+1] g[t+1]`` by a
reverse ``tl.associative_scan``. ``a[t+1]`` is the next position's decay, which this program
has not got in the same register as ``g[t]``; instead of a shift (or a second exp2 of the next
position's delta) the reverse scan carries three values per position (see
:func:`_adjoint_combine`), so each decay is computed once. The adjoint entering a chunk from the
later one, ``a[t0] g[t0]``, is folded into the chunk's last position. Gradients:
``dL/d(delta A)[t] = g[t] a[t] h[t-1] = g[t] (h[t] - b[t])`` (no shift), du, ddelta (through the
softplus) and dz per position; dA, dD, d(delta_bias) and a constant B or C's gradient summed in
registers over the program's positions and written once per program (per batch element; torch
sums over the batch, deterministic); a varying B or C's gradient at a position is a sum over
the channels of its group: summed over the program's ``BLOCK_D`` channels, then added across the
group's channel blocks with float32 atomic adds into a zeroed (b, G, n, L) float32 buffer
(``ceil(channels per group / BLOCK_D)`` atomic adds per element; like mamba-ssm, which adds one
per channel, the order of those adds, and so the last bits of dB and dC, can vary from run to
run).

SS2D's four directions (``FOUR_WAY``, :func:`archs.scan.triton_function.four_way_scan_triton`).
MambaIR scans one (height, width) image x in four orders: rows, columns, and both reversed. One
launch runs all four: the channels are the four directions' (``4 x_dim``; B and C in one group per
direction, so a program's direction is its group), u is x itself, and every sequence (x, each
direction's delta, B and C, the output and the gradients) lies in row-major order: position t of
the program's direction is read at :func:`_positions` (for a column-major scan, row ``t % height``
of column ``t // height``). The four directions of a channel are four programs, so each adds its
output (and in the backward its du) into a zeroed float32 (b, x_dim, L) sum with float32 atomics;
no (b, 4, d, L) copy of x, of the output or of their gradients exists. A column-major program
reads its positions a row apart (scattered loads where a row-major one reads consecutive ones).

Offsets: the batch index is int64, so every offset into a (b, ...) tensor is formed in 64 bits;
channel and position indices are 32-bit. Every integer argument that depends on the input's
shape (batch, channels, L, chunks, strides) is in ``do_not_specialize``: Triton would otherwise
compile a variant per "equals 1" and "divisible by 16" class of each.
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)

# The integer arguments that depend on the input's shape: never specialised on (see above).
SHAPE_ARGS = ('dim', 'length', 'n_chunks', 'group_size', 'blocks_per_group', 'b_chans', 'c_chans',
              'b_stride_b', 'b_stride_g', 'b_stride_n', 'c_stride_b', 'c_stride_g', 'c_stride_n',
              'flag', 'x_dim', 'height')
FORWARD_SHAPE_ARGS = SHAPE_ARGS + ('seg_chunks',)


@triton.jit
def _softplus(x):
    """log(1 + e^x) = max(x, 0) + log1p(t), t = e^-|x| in (0, 1], within a few float32 ulp of
    torch's softplus (identity above 20 too: there log1p(t) < 2.1e-9 is under half an ulp of x).
    log1p(t) = 2 asinh(y / 2) with y = t / sqrt(1 + t) in (0, 1/sqrt 2], and 2 asinh(y / 2) is
    y P(y^2) with P a degree-3 fit (relative error 4.7e-8): one exp2 and one rsqrt, no log and
    no division."""
    t = tl.exp2(tl.abs(x) * -1.4426950408889634)
    y = t * tl.math.rsqrt(1.0 + t)
    w = y * y
    p = -0.0005927310012463798 * w + 0.004656155073510326
    p = p * w - 0.04166360591778831
    p = p * w + 0.9999999529524569
    return y * p + tl.maximum(x, 0.0)


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp2(x * -1.4426950408889634))


@triton.jit
def _state_combine(a1, b1, a2, b2):
    """Two steps of ``h -> a h + b``, the first (earlier) one first."""
    return a1 * a2, a2 * b1 + b2


@triton.jit
def _adjoint_combine(u_later, v_later, lead_later, u_here, v_here, lead_here):
    """Two spans of the adjoint recurrence ``g[t] = x[t] + a[t+1] g[t+1]``, joined.

    A span [t, e] is the map from ``a[e+1] g[e+1]`` (what enters it from the right) to ``g[t]``:
    ``g[t] = U * (a[e+1] g[e+1]) + V``, with ``lead = a[t]``, the decay its left neighbour
    needs. One position is ``(1, x[t], a[t])``. The reverse scan calls this with the span
    already scanned (later positions) first; joining [t, m] before [m+1, e]:
    ``U = U_here lead_later U_later``, ``V = V_here + U_here lead_later V_later``, ``lead =
    lead_here``. A composition of maps, so associative; no decay is divided by."""
    w = u_here * lead_later
    return w * u_later, w * v_later + v_here, lead_here


@triton.jit
def _chunk_inputs(u_ptr, delta_ptr, u_offsets, offsets, mask, bias, HAS_BIAS: tl.constexpr,
                  SOFTPLUS: tl.constexpr):
    """u, delta after bias and softplus (0 where ``mask`` is off: decay 1, input 0), and delta
    before the softplus, as float32 (T, BLOCK_D) tiles of one chunk (u at ``u_offsets``, delta at
    ``offsets``: the same in a plain scan, x's and the direction's in the four-way one)."""
    u = tl.load(u_ptr + u_offsets, mask=mask, other=0.0).to(tl.float32)
    raw = tl.load(delta_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        raw = raw + bias[None, :]
    dt = raw
    if SOFTPLUS:
        dt = _softplus(raw)
    return u, tl.where(mask, dt, 0.0), raw


@triton.jit
def _bc_tile(ptr, base, stride_n, n, t, mask_n, mask_t, d, dstate, mask_d, VARIES: tl.constexpr):
    """A varying B or C's (T, BLOCK_N) tile of the chunk (float32), or a constant one's
    (BLOCK_N, BLOCK_D) tile of the program's channels."""
    if VARIES:
        tile = tl.load(ptr + base + n[None, :] * stride_n + t[:, None],
                       mask=mask_t[:, None] & mask_n[None, :], other=0.0)
    else:
        tile = tl.load(ptr + d[None, :] * dstate + n[:, None],
                       mask=mask_n[:, None] & mask_d[None, :], other=0.0)
    return tile.to(tl.float32)


@triton.jit
def _per_update(tile, VARIES: tl.constexpr):
    """A B or C tile from :func:`_bc_tile` broadcast to (T, BLOCK_N, BLOCK_D)."""
    if VARIES:
        out = tile[:, :, None]
    else:
        out = tile[None, :, :]
    return out


@triton.jit
def _chunk_states(u, dt, A2, B, h, first, VAR_B: tl.constexpr):
    """(decays, inputs, states) of one chunk, (T, BLOCK_N, BLOCK_D), from the state ``h``
    (BLOCK_N, BLOCK_D) entering it (``first``: position 0 of the chunk)."""
    a = tl.exp2(dt[:, None, :] * A2[None, :, :])
    b = (dt * u)[:, None, :] * _per_update(B, VAR_B)
    folded = tl.where(first[:, None, None], b + a * h[None, :, :], b)
    _, states = tl.associative_scan((a, folded), 0, _state_combine)
    return a, b, states


@triton.jit
def _at(x, where):
    """The (BLOCK_N, BLOCK_D) slice of a (T, BLOCK_N, BLOCK_D) tile at the one position where
    ``where`` (a (T,) mask) is on."""
    return tl.sum(tl.where(where[:, None, None], x, 0.0), axis=0)


@triton.jit
def _program(dim, group_size, blocks_per_group, b_chans, c_chans, BLOCK_D: tl.constexpr):
    """(batch index (int64), channel indices, their mask, B's group, C's group) of this program:
    axis 0 is the batch element, axis 1 the channel block (a group's blocks are consecutive)."""
    bi = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    g0 = (blk // blocks_per_group) * group_size
    d_in = (blk % blocks_per_group) * BLOCK_D + tl.arange(0, BLOCK_D)
    return bi, g0 + d_in, d_in < group_size, g0 // b_chans, g0 // c_chans


@triton.jit
def _rows(bi, dim, d, length):
    """Offsets of position 0 of channels ``d`` of batch ``bi`` (int64) in a contiguous (b, dim, L)
    tensor: 64-bit, since b * dim * L passes 2**31 for large images."""
    return (bi * dim + d) * length


@triton.jit
def _positions(t, direction, length, height, FOUR_WAY: tl.constexpr):
    """Where position ``t`` of the program's scan lies in its row-major sequence. A plain scan reads
    its sequence in order; SS2D's four directions (:func:`archs.scan.triton_function.four_way_scan_triton`)
    read one (height, width) image in row-major order (direction 0), column-major (1) and both
    reversed (2, 3): position t of a column-major scan is row ``t % height`` of column ``t // height``."""
    if FOUR_WAY:
        along = tl.where(direction >= 2, length - 1 - t, t)
        by_columns = (along % height) * (length // height) + along // height
        pos = tl.where(direction % 2 == 1, by_columns, along)
    else:
        pos = t
    return pos


@triton.jit
def _x_rows(bi, d, rows, x_dim, direction, length, FOUR_WAY: tl.constexpr):
    """Offsets of position 0 of u (and of the output and their gradients) for channels ``d``: the
    scan's own rows, or in the four-way scan the rows of x (b, x_dim, L), which all four
    directions' channel ``direction * x_dim + c`` read as channel ``c``."""
    if FOUR_WAY:
        out = (bi * x_dim + (d - direction * x_dim)) * length
    else:
        out = rows
    return out


@triton.jit
def _output(states, C, u, z, Dv, VAR_C: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr):
    """(y = sum_n C h + D u, y times silu(z) when there is z) of one chunk, (T, BLOCK_D)."""
    y = tl.sum(states * _per_update(C, VAR_C), axis=1)
    if HAS_D:
        y = y + Dv[None, :] * u
    gated = y
    if HAS_Z:
        gated = y * z * _sigmoid(z)
    return y, gated


@triton.jit(do_not_specialize=FORWARD_SHAPE_ARGS)
def _scan_forward_kernel(u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr,
                         out_ptr, chunk_states_ptr, last_ptr, seg_states_ptr, seg_dsum_ptr,
                         dim, length, n_chunks, group_size, blocks_per_group, b_chans, c_chans,
                         b_stride_b, b_stride_g, b_stride_n, c_stride_b, c_stride_g, c_stride_n,
                         flag, x_dim, height, dstate, seg_chunks,
                         VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_D: tl.constexpr,
                         HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, T: tl.constexpr,
                         STAGES: tl.constexpr, FOUR_WAY: tl.constexpr, SPLIT: tl.constexpr):
    """Output (u's dtype), last state and, when ``flag`` is 1, the state entering every chunk.
    u, delta, z and the output are contiguous (b, dim, L); B and C (b, G, n, L) with the given
    strides (positions contiguous), or (dim, n) contiguous. ``FOUR_WAY``: SS2D's four directions
    in one launch (B and C in 4 groups, the direction of a program is its group): u is x
    (b, x_dim, L) with ``dim = 4 x_dim``, every sequence is read at :func:`_positions`, and each
    direction's output is added into the zeroed float32 (b, x_dim, L) output in row-major order.

    ``SPLIT`` (a forward without a backward, grid axis 2 = the S segments of ``seg_chunks``
    chunks): one program per segment instead of one per sequence, for grids too small to fill the
    GPU (a validation tile of batch 1). Since ``h_end = exp(A sum(delta)) h_start + h_end|0`` over a
    segment, pass 1 (``SPLIT`` 1) writes each segment's end state from zero and its delta sum
    (float32 (b, dim, S, n) and (b, dim, S)); pass 2 (``SPLIT`` 2) starts segment s from the
    states of segments 0..s-1 composed that way and writes the outputs; its last segment the
    last state. 0: one program walks the whole sequence."""
    bi, d, mask_d, gb, gc = _program(dim, group_size, blocks_per_group, b_chans, c_chans, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    mask_n = n < dstate
    mask_dn = mask_n[:, None] & mask_d[None, :]  # (BLOCK_N, BLOCK_D) tiles: states, then channels
    dn = d[None, :] * dstate + n[:, None]
    A2 = tl.load(A_ptr + dn, mask=mask_dn, other=0.0) * LOG2E
    bias = tl.load(bias_ptr + d, mask=mask_d, other=0.0) if HAS_BIAS else None
    Dv = tl.load(D_ptr + d, mask=mask_d, other=0.0) if HAS_D else None
    rows = _rows(bi, dim, d, length)
    x_rows = _x_rows(bi, d, rows, x_dim, gb, length, FOUR_WAY)
    b_base = bi * b_stride_b + gb * b_stride_g
    c_base = bi * c_stride_b + gc * c_stride_g
    state_rows = (bi * dim + d) * n_chunks * dstate
    steps = tl.arange(0, T)
    seg = tl.program_id(2)
    segments = tl.num_programs(2)
    seg_rows = (bi * dim + d) * segments   # (b, dim, S) offsets of segment 0
    h = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dsum = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if SPLIT == 2:   # the state entering this segment, composed from the earlier segments'
        for j in tl.range(0, seg):
            h_j = tl.load(seg_states_ptr + (seg_rows[None, :] + j) * dstate + n[:, None], mask=mask_dn, other=0.0)
            dsum_j = tl.load(seg_dsum_ptr + seg_rows + j, mask=mask_d, other=0.0)
            h = tl.exp2(dsum_j[None, :] * A2) * h + h_j
    first_chunk = seg * seg_chunks
    for c in tl.range(first_chunk, tl.minimum(first_chunk + seg_chunks, n_chunks), num_stages=STAGES):
        t = c * T + steps
        mask_t = t < length
        mask = mask_t[:, None] & mask_d[None, :]
        pos = _positions(t, gb, length, height, FOUR_WAY)
        offsets = rows[None, :] + pos[:, None]
        x_offsets = x_rows[None, :] + pos[:, None]
        if flag != 0:  # the state entering chunk c, for the backward
            tl.store(chunk_states_ptr + state_rows[None, :] + c * dstate + n[:, None], h, mask=mask_dn)
        u, dt, _ = _chunk_inputs(u_ptr, delta_ptr, x_offsets, offsets, mask, bias, HAS_BIAS, SOFTPLUS)
        B = _bc_tile(B_ptr, b_base, b_stride_n, n, pos, mask_n, mask_t, d, dstate, mask_d, VAR_B)
        _, _, states = _chunk_states(u, dt, A2, B, h, steps == 0, VAR_B)
        if SPLIT == 1:
            dsum += tl.sum(dt, axis=0)
        else:
            C = _bc_tile(C_ptr, c_base, c_stride_n, n, pos, mask_n, mask_t, d, dstate, mask_d, VAR_C)
            z = None
            if HAS_Z:
                z = tl.load(z_ptr + x_offsets, mask=mask, other=0.0).to(tl.float32)
            _, out = _output(states, C, u, z, Dv, VAR_C, HAS_D, HAS_Z)
            if FOUR_WAY:   # the four directions of a channel come from four programs
                tl.atomic_add(out_ptr + x_offsets, out, mask=mask, sem='relaxed')
            else:
                tl.store(out_ptr + x_offsets, out, mask=mask)
        h = _at(states, steps == T - 1)
    if SPLIT == 1:
        tl.store(seg_states_ptr + (seg_rows[None, :] + seg) * dstate + n[:, None], h, mask=mask_dn)
        tl.store(seg_dsum_ptr + seg_rows + seg, dsum, mask=mask_d)
    else:
        tl.store(last_ptr + (bi * dim + d[None, :]) * dstate + n[:, None], h, mask=mask_dn & (seg == segments - 1))


@triton.jit(do_not_specialize=SHAPE_ARGS)
def _scan_backward_kernel(u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr,
                          chunk_states_ptr, dout_ptr, dlast_ptr,
                          du_ptr, ddelta_ptr, dz_ptr, dB_ptr, dC_ptr, dA_ptr, dD_ptr, dbias_ptr,
                          dim, length, n_chunks, group_size, blocks_per_group, b_chans, c_chans,
                          b_stride_b, b_stride_g, b_stride_n, c_stride_b, c_stride_g, c_stride_n,
                          flag, x_dim, height, dstate,
                          VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_D: tl.constexpr,
                          HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
                          BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, T: tl.constexpr,
                          STAGES: tl.constexpr, FOUR_WAY: tl.constexpr):
    """Every gradient, from the forward's inputs, its chunk states, the output's gradient and,
    when ``flag`` is 1, the last state's. du, ddelta, dz: contiguous (b, dim, L) in the inputs'
    dtypes. A varying B's (C's) gradient is added into the zeroed float32 (b, G, n, L) ``dB_ptr``
    (``dC_ptr``); a constant one's, and dA, are written to float32 (b, dim, n) per-batch sums,
    dD and d(delta_bias) to float32 (b, dim) ones. ``FOUR_WAY`` (as in the forward): dout is the
    gradient of the row-major sum (b, x_dim, L), and each direction's du is added into the zeroed
    float32 (b, x_dim, L) ``du_ptr``."""
    bi, d, mask_d, gb, gc = _program(dim, group_size, blocks_per_group, b_chans, c_chans, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    mask_n = n < dstate
    mask_dn = mask_n[:, None] & mask_d[None, :]  # (BLOCK_N, BLOCK_D) tiles: states, then channels
    dn = d[None, :] * dstate + n[:, None]
    A = tl.load(A_ptr + dn, mask=mask_dn, other=0.0)
    A2 = A * LOG2E
    bias = tl.load(bias_ptr + d, mask=mask_d, other=0.0) if HAS_BIAS else None
    Dv = tl.load(D_ptr + d, mask=mask_d, other=0.0) if HAS_D else None
    rows = _rows(bi, dim, d, length)
    x_rows = _x_rows(bi, d, rows, x_dim, gb, length, FOUR_WAY)
    b_base = bi * b_stride_b + gb * b_stride_g
    c_base = bi * c_stride_b + gc * c_stride_g
    state_rows = (bi * dim + d) * n_chunks * dstate
    per_batch = (bi * dim + d[None, :]) * dstate + n[:, None]  # (b, dim, n) sums
    steps = tl.arange(0, T)
    first = steps == 0
    last = steps == T - 1
    # what enters a chunk from its right: a[t0] g[t0] of the next chunk, or the last state's
    # gradient (the positions past the sequence pass it through: decay 1, no input)
    carried = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    if flag != 0:
        carried = tl.load(dlast_ptr + per_batch, mask=mask_dn, other=0.0)
    dA = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dB_const = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dC_const = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dD = tl.zeros((BLOCK_D,), dtype=tl.float32)
    dbias = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for i in tl.range(0, n_chunks, num_stages=STAGES):
        c = n_chunks - 1 - i
        t = c * T + steps
        mask_t = t < length
        mask = mask_t[:, None] & mask_d[None, :]
        pos = _positions(t, gb, length, height, FOUR_WAY)
        offsets = rows[None, :] + pos[:, None]
        x_offsets = x_rows[None, :] + pos[:, None]
        h0 = tl.load(chunk_states_ptr + state_rows[None, :] + c * dstate + n[:, None], mask=mask_dn,
                     other=0.0)
        u, dt, raw = _chunk_inputs(u_ptr, delta_ptr, x_offsets, offsets, mask, bias, HAS_BIAS, SOFTPLUS)
        B = _bc_tile(B_ptr, b_base, b_stride_n, n, pos, mask_n, mask_t, d, dstate, mask_d, VAR_B)
        C = _bc_tile(C_ptr, c_base, c_stride_n, n, pos, mask_n, mask_t, d, dstate, mask_d, VAR_C)
        a, b, states = _chunk_states(u, dt, A2, B, h0, first, VAR_B)
        dy = tl.load(dout_ptr + x_offsets, mask=mask, other=0.0).to(tl.float32)
        if HAS_Z:
            z = tl.load(z_ptr + x_offsets, mask=mask, other=0.0).to(tl.float32)
            y, _ = _output(states, C, u, z, Dv, VAR_C, HAS_D, False)
            sig = _sigmoid(z)
            tl.store(dz_ptr + x_offsets, dy * y * sig * (1.0 + z * (1.0 - sig)), mask=mask)
            dy = dy * z * sig
        Cx = _per_update(C, VAR_C)
        x = dy[:, None, :] * Cx
        x = tl.where(last[:, None, None], x + carried[None, :, :], x)
        # the reverse scan as a forward scan of the flipped chunk: Triton lowers ``reverse=True``
        # with lane shuffles even along an axis a thread holds whole (the flips here move no data)
        _, g, _ = tl.associative_scan((tl.full(a.shape, 1.0, tl.float32), tl.flip(x, 0), tl.flip(a, 0)), 0,
                                      _adjoint_combine)
        g = tl.flip(g, 0)
        carried = _at(a * g, first)
        # dL/d(delta A) at each position: g a h[t-1] = g (h - b)
        dlog = g * (states - b)
        gB = g * _per_update(B, VAR_B)
        sum_gB = tl.sum(gB, axis=1)   # sum_n g B: du's, and u times it ddelta's (one product fewer per update)
        ddt = tl.sum(dlog * A[None, :, :], axis=1) + sum_gB * u
        du = sum_gB * dt
        dA += tl.sum(dlog * dt[:, None, :], axis=0)
        if HAS_D:
            du += Dv[None, :] * dy
            dD += tl.sum(dy * u, axis=0)
        if SOFTPLUS:
            ddt = ddt * _sigmoid(raw)
        ddt = tl.where(mask, ddt, 0.0)
        if FOUR_WAY:   # x's gradient: the four directions' du of a channel come from four programs
            tl.atomic_add(du_ptr + x_offsets, du, mask=mask, sem='relaxed')
        else:
            tl.store(du_ptr + x_offsets, du, mask=mask)
        tl.store(ddelta_ptr + offsets, ddt, mask=mask)
        if HAS_BIAS:
            dbias += tl.sum(ddt, axis=0)
        gbu = g * (dt * u)[:, None, :]
        if VAR_B:
            tl.atomic_add(dB_ptr + ((bi * (dim // b_chans) + gb) * dstate + n[None, :]) * length + pos[:, None],
                          tl.sum(gbu, axis=2), mask=mask_t[:, None] & mask_n[None, :], sem='relaxed')
        else:
            dB_const += tl.sum(gbu, axis=0)
        hdy = states * dy[:, None, :]
        if VAR_C:
            tl.atomic_add(dC_ptr + ((bi * (dim // c_chans) + gc) * dstate + n[None, :]) * length + pos[:, None],
                          tl.sum(hdy, axis=2), mask=mask_t[:, None] & mask_n[None, :], sem='relaxed')
        else:
            dC_const += tl.sum(hdy, axis=0)
    tl.store(dA_ptr + per_batch, dA, mask=mask_dn)
    if not VAR_B:
        tl.store(dB_ptr + per_batch, dB_const, mask=mask_dn)
    if not VAR_C:
        tl.store(dC_ptr + per_batch, dC_const, mask=mask_dn)
    if HAS_D:
        tl.store(dD_ptr + bi * dim + d, dD, mask=mask_d)
    if HAS_BIAS:
        tl.store(dbias_ptr + bi * dim + d, dbias, mask=mask_d)
