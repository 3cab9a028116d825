"""Selective scan as chunk-parallel Triton kernels, for GPUs without mamba-ssm.

This module imports triton at import time, so :mod:`archs.selective_scan` imports it only when
the 'triton' backend is used. ``TRITON_INTERPRET=1`` runs the same kernels on CPU tensors (the
tests do); it must be set before triton itself is first imported, since Triton decorates its own
library functions (``tl.sum``, ...) then (:func:`interpreting`).

Work split. Every kernel that walks positions runs one program per (chunk of ``chunk``
positions, block of :data:`BLOCK_D` channels sharing one slice of B and C, batch element), so a
launch has ``batch * channel blocks * chunks`` programs (6912 one-warp programs at MambaIR's x4
training shapes) instead of one per channel block. Each lane owns one channel. A program walks
its chunk in sub-tiles of :data:`SUB` consecutive positions: u, delta, z and the output gradient
are loaded as ``(BLOCK_D, SUB)`` tiles (each lane reads ``SUB`` consecutive positions of its row),
and what depends only on the position and channel (delta + bias, softplus, delta * u, the gate)
is computed once per sub-tile and reused for all ``n`` states. All arithmetic is float32
whatever the input dtype.

Every kernel keeps every per-lane value a (BLOCK_D,) vector, one register per lane, so no
value changes layout: the ``n`` states are a tuple of such vectors carried through the loop,
A log2 e another tuple loaded before it, and a loaded (BLOCK_D, :data:`FORWARD_SUB`) tile is split
into its column vectors by a reshape and splits (:func:`_columns`; the output tile is joined back
the same way), which move no data. A varying B and C are read from a position-major float32
copy (b, G, chunks * chunk, n rounded up to 4) made before the launches: the ``n`` values of one
position are ``n / 4`` 16-byte loads that every lane makes at fixed offsets from one address,
split into scalars the same way (:func:`_states_at`); a constant (d, n) B or C is loaded once
as a tuple. In the forward, each pass of the loop walks :data:`FORWARD_UNROLL` sub-tiles with
row pointers carried from pass to pass; the chunk's positions left over (fewer than a pass) go
through masked copies of the sub-tile code after the loop (:func:`_forward_sub_tile`). The
backward's loop over the states (see below) reads B and C by state rows instead. Lanes past the
channel block's group read their group's last channel (so loads need no channel mask) and store
nothing. Per state update the loops need FMUL delta * A log2 e, MUFU.EX2, FMUL (delta u) B,
FFMA for the recurrence, and in the output pass one more FFMA for C . h; the rest (loads, the
softplus, D u, addresses) is per position or per pass and shared by the ``n`` states.

Forward, three launches:
1. ``_forward_chunk_kernel`` (``OUTPUT=False``): each chunk scanned from a zero state; writes the
   chunk's end state, the sum of its deltas, and delta after bias and softplus (:func:`_softplus`)
   into a float32 (b, d, L) temporary that the third launch reads instead of computing it again
   (freed after the forward; the backward recomputes it).
2. ``_carry_kernel``: one program per (channel block, batch) walks the chunks in order:
   ``H[c + 1] = exp2(A log2 e * sum(delta over c)) * H[c] + end[c]``, giving the state entering
   every chunk (saved for backward: ``b*d*n*L/chunk`` floats, O(L/chunk)) and the last state.
3. ``_forward_chunk_kernel`` (``OUTPUT=True``): each chunk scanned again from its true entering
   state; ``y = C . h + D u``, times ``silu(z)``.

Backward, three launches that walk each chunk twice, with the adjoint ``r[t] = dL/dh[t-1]``
through ``h[t]``, ``r[t] = a[t] (C[t] dy[t] + r[t+1])``, ``a[t] = exp(delta[t] A)``:
1. ``_backward_states_kernel``: each chunk walked forward from its saved entering state. It
   writes the state entering each sub-tile into a per-program scratch buffer (each row's even
   states, then its odd ones) and, with the same decays (each exp2 computed once), sums the
   chunk's adjoint from a zero one at its end in the forward direction: ``r[t0] = sum_t P[t]
   C[t] dy[t]`` with ``P[t] = a[t0] ... a[t]`` a running product (no division by a decay; a
   product that underflows to 0 drops what is negligible). States, products and adjoints of
   all states are tuples of (BLOCK_D,) vectors in registers; its loop takes
   :data:`STATES_STEP` positions a pass so that they fit the register cap.
2. ``_carry_kernel`` (reversed): the adjoint entering every chunk from its right, starting from
   the last state's gradient (compiled without it when that gradient is not needed).
3. ``_backward_chunk_kernel``: the sub-tiles walked backwards in a loop over the states. Each
   lane takes two channels, its own and its partner's (the lane ``BLOCK_D / 2`` away), and the
   states of its parity, four states a pass when d_state is a multiple of 4 (two passes of
   the parities). Per (channel, state) it recomputes the sub-tile's decays and states from the
   scratch, then walks the adjoint backwards with every gradient; ``p = r[t] h[t-1]`` (the
   adjoint's own product) gives dA and ddelta. What it carries between sub-tiles (adjoint, dA,
   with A log2 e) waits in the program's slot, 16 bytes per (channel, state), so few registers
   are live. The gradients of a varying B and C at a position are sums over the channels: a
   lane adds its two, and :func:`_lane_sums` adds them over the 16 lanes of each parity in one
   butterfly per pass; each channel's sums over the states (du, ddelta) meet in one shuffle per
   sub-tile. A varying B and C are read from float32 state-major copies padded to whole chunks
   (:func:`_states_major`), so that these loads need neither masks nor widening.

Only decays ``exp(delta A) <= 1`` (for delta >= 0) and their products over a chunk,
``exp2(A log2 e * sum(delta))``, are formed: never the exponential of a positive cumulative sum,
so strong decay cannot overflow.

Reductions without atomics: the gradients of B and C at a position are sums over channels
(each program writes its channel block's sum, per position), those of A, D, delta_bias and of
constant B/C sums over positions (each program writes one tile). PyTorch adds the partial sums,
so gradients are deterministic. Offsets that can pass 2**31 - 1 (batch x dim x L, partial sums,
scratch, the position-major B/C copy) are formed in 64 bits: every one starts from the int64
batch index.
"""
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
import triton
import triton.language as tl

from basicsr_ldt.common.errors import InputError

# Options every launch passes to Triton's compiler. FP fusion (``a * b + c`` as one FFMA) is
# Triton's default today, but Triton 3.9 warns at the first launch that the default will change;
# the recurrence, C . h and every gradient sum are multiply-adds, and the loops' instruction
# counts (the static goals, archs/README.md) assume them fused.
COMPILE_OPTIONS = {'enable_fp_fusion': True}

# Positions per chunk (at least; longer sequences get longer chunks, see MAX_CHUNKS).
CHUNK = 64
# At most this many chunks: the carry kernel walks them one after another.
MAX_CHUNKS = 128
# Channels per program (rounded to a power of two, at most the channels of one B/C group).
BLOCK_D = 32
# Consecutive positions per lane and sub-tile: one 16-byte float32 load per row (backward).
SUB = 4
# The same for the forward kernels (a chunk is a whole number of both; a (BLOCK_D, FORWARD_SUB)
# float32 tile is one 16-byte load per lane, wider tiles would be spread over lanes).
FORWARD_SUB = 4
# Positions per pass of the backward's states loop (a divisor of SUB): with all states' state,
# decay product and adjoint carried, two positions' B and C fit the register cap, four do not.
STATES_STEP = 2
# Sub-tiles per pass of the forward's loop: the per-pass pointer and loop work shared by more
# positions (4: 16 positions, 8192 state updates per pass at BLOCK_D 32 and 16 states).
FORWARD_UNROLL = 4
INT32_MAX = 2 ** 31 - 1


@triton.jit
def _softplus(x):
    """log(1 + e^x) = max(x, 0) + log1p(t), t = e^-|x| in (0, 1], within a few float32 ulp of
    torch's softplus (identity above 20 too: there log1p(t) < 2.1e-9 is under half an ulp of x).
    log1p(t) = 2 asinh(y / 2) with y = t / sqrt(1 + t) in (0, 1/sqrt 2], and 2 asinh(y / 2) is
    y P(y^2) with P a degree-3 fit (relative error 4.7e-8): one exp2 and one rsqrt, no log and
    no division (a division adds range fix-ups), and accurate for small t, where rounding 1 + t
    barely moves its rsqrt. Every constant is alone in its instruction but P's leading one."""
    t = tl.exp2(tl.abs(x) * -1.4426950408889634)
    y = t * tl.math.rsqrt(1.0 + t)
    w = y * y
    p = -0.0005927310012463798 * w + 0.004656155073510326
    p = p * w - 0.04166360591778831
    p = p * w + 0.9999999529524569
    return y * p + tl.maximum(x, 0.0)


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _even_odd(x):
    """(the even, the odd) entries along the last axis of ``x``, a (rows, w) tile or a (w,)
    vector. In registers only: the reshape splits no lane's run of consecutive entries."""
    w: tl.constexpr = x.shape[len(x.shape) - 1]
    if w == 2:
        even, odd = tl.split(x)
    elif len(x.shape) == 1:
        even, odd = tl.split(tl.reshape(x, (w // 2, 2)))
    else:
        even, odd = tl.split(tl.reshape(x, (x.shape[0], w // 2, 2)))
    return even, odd


@triton.jit
def _columns(tile):
    """The columns of a (rows, W) tile as a tuple of W (rows,) vectors, in order (W a power of
    two); of a (W,) vector, its W scalars. Each lane holds its rows whole (or the whole vector),
    so this only names registers: no data moves between lanes."""
    parts = (tile,)
    for level in tl.static_range(8):
        if len(parts) < tile.shape[len(tile.shape) - 1]:
            evens = ()
            odds = ()
            for p in tl.static_range(len(parts)):
                even, odd = _even_odd(parts[p])
                evens = evens + (even,)
                odds = odds + (odd,)
            parts = evens + odds  # evens first keeps the columns in order at the last level
    return parts


@triton.jit
def _stack(columns):
    """The inverse of :func:`_columns` for (rows,) vectors: a (rows, W) tile."""
    parts = ()
    for j in tl.static_range(len(columns)):
        parts = parts + (tl.reshape(columns[j], (columns[j].shape[0], 1)),)
    for level in tl.static_range(8):
        if len(parts) > 1:
            merged = ()
            for p in tl.static_range(len(parts) // 2):
                x = tl.join(parts[p], parts[p + len(parts) // 2])  # interleaved: (rows, w, 2)
                merged = merged + (tl.reshape(x, (x.shape[0], 2 * x.shape[1])),)
            parts = merged
    return parts[0]


@triton.jit
def _lane_sums(tile, parts: tl.constexpr):
    """The sums over axis 0 (the lanes) of a (lanes, V) tile whose rows each lie in one lane,
    taken separately over each of ``parts`` equal runs of consecutive lanes: a (parts * V,)
    vector, value v of run r at r * V + v (V, the lanes and ``parts`` powers of two).

    A butterfly instead of V separate warp reductions (5 shuffles and 5 adds per value): at each
    lane bit below the runs', from the highest, a lane keeps one half of the values it still
    holds, receives its partner's copy of that half (``tl.flip`` across the bit: one shuffle per
    value) and adds it, so the values it holds halve at every bit; once it holds one, plain
    reductions finish. For V = 8 over 32 lanes that is 10 shuffles instead of 40 (static
    figures in archs/README.md)."""
    x = tl.reshape(tile, (parts, tile.shape[0] // parts, tile.shape[1]))  # (halves taken, lanes, values)
    for level in tl.static_range(8):
        if x.shape[2] > 1 and x.shape[1] > 1:
            # (halves taken, lane bit, other lanes, values) with the value half last
            y = tl.permute(tl.reshape(x, (x.shape[0], 2, x.shape[1] // 2, 2, x.shape[2] // 2)),
                           (0, 1, 2, 4, 3))
            first, second = tl.split(y)
            bit = tl.arange(0, 2)[None, :, None, None]
            keep = tl.where(bit == 0, first, second)
            send = tl.where(bit == 0, second, first)
            x = tl.reshape(keep + tl.flip(send, 1), (x.shape[0] * 2, x.shape[1] // 2, x.shape[2] // 2))
    return tl.reshape(tl.sum(x, axis=1), (parts * tile.shape[1],))  # (run, half bits..., rest) in order


@triton.jit
def _partner(x):
    """``x`` (a (lanes,) vector or (lanes, w) tile) as the lane half a warp away holds it: the
    other channel of a lane in the gradient walk. One shuffle per register."""
    if len(x.shape) == 1:
        y = tl.reshape(tl.flip(tl.reshape(x, (2, x.shape[0] // 2)), 0), (x.shape[0],))
    else:
        y = tl.reshape(tl.flip(tl.reshape(x, (2, x.shape[0] // 2, x.shape[1])), 0), x.shape)
    return y


@triton.jit
def _program_coordinates(bi, blk, dim, group_size, BLOCK_D: tl.constexpr):
    """(batch index (int64), first channel of the group, channel indices, their mask) of the
    programs of channel block ``blk`` (blocks of one group are consecutive) and batch ``bi``."""
    blocks = (group_size + BLOCK_D - 1) // BLOCK_D
    g0 = (blk // blocks) * group_size
    d_in = (blk % blocks) * BLOCK_D + tl.arange(0, BLOCK_D)
    return bi.to(tl.int64), g0, g0 + d_in, d_in < group_size


@triton.jit
def _sequence_rows(bi, dim, d, length):
    """Offsets of position 0 of channels ``d`` of batch ``bi`` in a (b, dim, L) tensor."""
    return (bi * dim + d) * length


@triton.jit
def _chunk_state_rows(bi, dim, d, n_chunks, c, dstate):
    """Offsets of state 0 of channels ``d``, chunk ``c`` in a (b, dim, n_chunks, dstate) tensor
    (the states or adjoints entering the chunks)."""
    return _channel_chunk_rows(bi * dim + d, n_chunks, c, dstate)


@triton.jit
def _channel_chunk_rows(channel, n_chunks, c, dstate):
    """The same from the channels' indices over (b, dim), ``bi * dim + d``."""
    return (channel * n_chunks + c) * dstate


@triton.jit
def _chunk_state_offsets(bi, dim, d, n_chunks, c, dstate, n):
    """Offsets of the (channels d, states n) tile of chunk ``c`` in such a tensor."""
    return _chunk_state_rows(bi, dim, d, n_chunks, c, dstate)[:, None] + n[None, :]


@triton.jit
def _chunk_sum_offsets(bi, dim, d, n_chunks, c):
    """Offsets of channels ``d``, chunk ``c`` in the (b, dim, n_chunks) sums of delta."""
    return (bi * dim + d) * n_chunks + c


@triton.jit
def _last_state_offsets(bi, dim, dstate, tile):
    """Offsets of a (channels, states) ``tile`` of batch ``bi`` in a (b, dim, dstate) tensor."""
    return bi * dim * dstate + tile


@triton.jit
def _program_slot(bi, blk, blocks, n_chunks, c, slot_size):
    """Start of program (chunk ``c``, block ``blk``, batch ``bi``)'s ``slot_size`` elements in a
    per-program buffer laid out (b, blocks, n_chunks, slot_size)."""
    return ((bi.to(tl.int64) * blocks + blk) * n_chunks + c) * slot_size


@triton.jit
def _scratch_rows(scratch_ptr, bi, blk, blocks, n_chunks, c, chunk, SUB: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Each lane's row of the first sub-tile's state tile in program (chunk ``c``, block ``blk``,
    batch ``bi``)'s slot of the backward's scratch: one (BLOCK_D, BLOCK_N) tile per sub-tile,
    the next sub-tile's ``BLOCK_D * BLOCK_N`` further on."""
    return scratch_ptr + _program_slot(bi, blk, blocks, n_chunks, c, (chunk // SUB) * BLOCK_D * BLOCK_N) + \
        tl.arange(0, BLOCK_D) * BLOCK_N


@triton.jit
def _partial_rows(bi, blk, blocks, dstate, length):
    """Offset of (block ``blk``, state 0, position 0) of batch ``bi`` in the
    (b, blocks, dstate, L) dB/dC partial sums."""
    return (bi.to(tl.int64) * blocks + blk) * dstate * length


@triton.jit
def _bc_row(bi, dim, chans, g0, dstate, length, VARIES: tl.constexpr):
    """Offset of (batch, group, state 0, position 0) of a varying (b, G, n, L) B or C."""
    if VARIES:
        return (bi * (dim // chans) + g0 // chans) * dstate * length
    return bi * 0


@triton.jit
def _bc_positions(bi, dim, chans, g0, padded, t0, NQ: tl.constexpr, VARIES: tl.constexpr):
    """Offset of (batch, group, position ``t0``) of a varying B or C in the forward's
    position-major float32 copy (b, G, padded length, NQ); 0 for a constant one."""
    if VARIES:
        return ((bi * (dim // chans) + g0 // chans) * padded + t0) * NQ
    return bi * 0


@triton.jit
def _tile(ptr, offsets, mask):
    return _widen(tl.load(ptr + offsets, mask=mask, other=0.0))


@triton.jit
def _sub_tile(s, kk, t1, mask_d, row):
    """Positions, their mask (inside the chunk), the (channel, position) mask and offsets into
    the (b, d, L) tensors of the sub-tile starting at position ``s``."""
    t = s + kk
    mask_t = t < t1
    return t, mask_t, mask_d[:, None] & mask_t[None, :], row[:, None] + t[None, :]


@triton.jit
def _delta_tile(delta_ptr, offsets, mask, bias, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """(delta after bias and softplus, delta before softplus); 0 outside the sequence, so that a
    masked position leaves the state unchanged (decay 1, input 0)."""
    raw = _tile(delta_ptr, offsets, mask)
    if HAS_BIAS:
        raw = raw + bias[:, None]
    dt = raw
    if SOFTPLUS:
        dt = _softplus(raw)
    return tl.where(mask, dt, 0.0), raw


@triton.jit
def _states_at(ptr, d, dstate: tl.constexpr, NQ: tl.constexpr, VEC: tl.constexpr,
               VARIES: tl.constexpr):
    """The ``dstate`` values of B (or C) at one position, a tuple of scalars (every lane loads the
    same ``NQ`` floats of the position-major copy at ``ptr``, ``VEC`` at a time) when it varies,
    or of channels ``d`` of the constant (d, n) one: (BLOCK_D,) vectors."""
    vals = ()
    if VARIES:
        for q in tl.static_range(NQ // VEC):
            vals = vals + _columns(tl.load(ptr + q * VEC + tl.arange(0, VEC)))
    else:
        for k in tl.static_range(dstate):
            vals = vals + (tl.load(ptr + d * dstate + k),)
    return vals


@triton.jit
def _widen(x):
    """``x`` as float32; bfloat16 by shifting its bits into place (exact, one instruction per
    element, where Triton's conversion takes two for every other element)."""
    if x.dtype == tl.bfloat16:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def _forward_sub_tile(h, dsum, A2, Bc, Cc, Dv, bias, pu, pd, pw, pz, bp, cp, j0, s, t1, mask_d,
                      dstate: tl.constexpr, NQ: tl.constexpr, VEC: tl.constexpr,
                      VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_D: tl.constexpr,
                      HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
                      OUTPUT: tl.constexpr, MASKED: tl.constexpr, SUB: tl.constexpr):
    """The ``SUB`` positions from ``s + j0`` (``j0`` static): the states ``h`` (a tuple of
    (BLOCK_D,) vectors) carried through them. ``pu``, ``pd``, ``pw``, ``pz``: each lane's row
    pointers at position ``s`` into u, delta (OUTPUT: dt), dt (OUTPUT: out) and z; ``bp``,
    ``cp``: position ``s`` of a varying B and C. Loads need no channel mask (every lane's row is
    a real channel's, see :func:`_forward_chunk_kernel`); MASKED: positions from ``t1`` on are
    masked (the chunk's last, partial sub-tile). OUTPUT=False: delta after bias and softplus is
    stored into dt and summed into ``dsum``; OUTPUT=True: dt is loaded and the output stored."""
    kk = j0 + tl.arange(0, SUB)
    if MASKED:
        m_t = (s + kk < t1)[None, :]
    else:
        m_t = (kk >= 0)[None, :]  # always true: folds away
    m2 = mask_d[:, None] & m_t
    u = _widen(tl.load(pu[:, None] + kk[None, :], mask=m_t, other=0.0))
    dt = _widen(tl.load(pd[:, None] + kk[None, :], mask=m_t, other=0.0))
    if not OUTPUT:
        if HAS_BIAS:
            dt = dt + bias[:, None]
        if SOFTPLUS:
            dt = _softplus(dt)
        if MASKED:  # a masked position leaves the state unchanged: decay 1, input 0
            dt = tl.where(m_t, dt, 0.0)
        tl.store(pw[:, None] + kk[None, :], dt, mask=m2)
        dsum += tl.sum(dt, axis=1)
    dts = _columns(dt)
    dtus = _columns(dt * u)
    us = _columns(u)
    ys = ()
    for j in tl.static_range(SUB):
        Bj = Bc
        if VAR_B:
            Bj = _states_at(bp + (j0 + j) * NQ, 0, dstate, NQ, VEC, True)
        if OUTPUT:
            Cj = Cc
            if VAR_C:
                Cj = _states_at(cp + (j0 + j) * NQ, 0, dstate, NQ, VEC, True)
            y = tl.zeros_like(dts[j])
            if HAS_D:
                y = Dv * us[j]
        nh = ()
        for k in tl.static_range(dstate):
            hk = tl.exp2(dts[j] * A2[k]) * h[k] + dtus[j] * Bj[k]
            nh = nh + (hk,)
            if OUTPUT:
                y += Cj[k] * hk
        h = nh
        if OUTPUT:
            ys = ys + (y,)
    if OUTPUT:
        y = _stack(ys)
        if HAS_Z:
            zt = _widen(tl.load(pz[:, None] + kk[None, :], mask=m_t, other=0.0))
            y = y * zt * _sigmoid(zt)
        tl.store(pw[:, None] + kk[None, :], y, mask=m2)
    return h, dsum


@triton.jit
def _forward_chunk_kernel(u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr,
                          dt_ptr, out_ptr, states_ptr, dsum_ptr,
                          dim, length, group_size, b_chans, c_chans, n_chunks, chunk,
                          dstate: tl.constexpr, VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_D: tl.constexpr,
                          HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
                          OUTPUT: tl.constexpr, BLOCK_D: tl.constexpr, NQ: tl.constexpr,
                          VEC: tl.constexpr, SUB: tl.constexpr, UNROLL: tl.constexpr):
    """OUTPUT=False: the chunk from a zero state; its end state into ``states``, the sum of its
    deltas into ``dsum`` and delta (after bias and softplus) into ``dt``. OUTPUT=True: the chunk
    from the state in ``states``, delta from ``dt``; the output. Each pass of the loop walks
    ``UNROLL`` sub-tiles of ``SUB`` positions, with row pointers carried from pass to pass."""
    c, blk = tl.program_id(0), tl.program_id(1)
    bi, g0, d, mask_d = _program_coordinates(tl.program_id(2), blk, dim, group_size, BLOCK_D)
    # A lane past the group's channels reads its last channel's rows (so loads need no channel
    # mask) and stores nothing.
    d = tl.minimum(d, g0 + group_size - 1)
    row = _sequence_rows(bi, dim, d, length)  # (b, d, 0) of the (b, d, L) tensors
    state_row = _chunk_state_rows(bi, dim, d, n_chunks, c, dstate)
    padded = n_chunks * chunk
    t0 = c * chunk
    t1 = tl.minimum(t0 + chunk, length)
    bp = B_ptr + _bc_positions(bi, dim, b_chans, g0, padded, t0, NQ, VAR_B)
    cp = C_ptr + _bc_positions(bi, dim, c_chans, g0, padded, t0, NQ, VAR_C)
    pu = u_ptr + row + t0
    pz = z_ptr + row + t0
    if OUTPUT:
        pd = dt_ptr + row + t0
        pw = out_ptr + row + t0
    else:
        pd = delta_ptr + row + t0
        pw = dt_ptr + row + t0
    bias = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d)
    Dv = bias
    if HAS_D:
        Dv = tl.load(D_ptr + d)
    # per state: A log2 e, the state, and a constant B and C: tuples of (BLOCK_D,) vectors
    A2 = ()
    h = ()
    for k in tl.static_range(dstate):
        A2 = A2 + (tl.load(A_ptr + d * dstate + k) * 1.4426950408889634,)
        if OUTPUT:
            h = h + (tl.load(states_ptr + state_row + k),)
        else:
            h = h + (tl.zeros((BLOCK_D,), dtype=tl.float32),)
    Bc = A2
    if not VAR_B:
        Bc = _states_at(B_ptr, d, dstate, NQ, VEC, False)
    Cc = A2
    if not VAR_C:
        Cc = _states_at(C_ptr, d, dstate, NQ, VEC, False)
    dsum = tl.zeros((BLOCK_D,), dtype=tl.float32)
    step = SUB * UNROLL
    whole = t0 + (t1 - t0) // step * step  # the passes before it cover whole sub-tiles
    for s in range(t0, whole, step):
        for i in tl.static_range(UNROLL):
            h, dsum = _forward_sub_tile(h, dsum, A2, Bc, Cc, Dv, bias, pu, pd, pw, pz, bp, cp, i * SUB,
                                        s, t1, mask_d, dstate, NQ, VEC, VAR_B, VAR_C, HAS_D, HAS_Z,
                                        HAS_BIAS, SOFTPLUS, OUTPUT, False, SUB)
        pu += step
        pd += step
        pw += step
        pz += step
        bp += step * NQ
        cp += step * NQ
    for i in tl.static_range(UNROLL):  # the rest, each sub-tile masked from t1 on
        if whole + i * SUB < t1:
            h, dsum = _forward_sub_tile(h, dsum, A2, Bc, Cc, Dv, bias, pu, pd, pw, pz, bp, cp, i * SUB,
                                        whole, t1, mask_d, dstate, NQ, VEC, VAR_B, VAR_C, HAS_D, HAS_Z,
                                        HAS_BIAS, SOFTPLUS, OUTPUT, True, SUB)
    if not OUTPUT:
        for k in tl.static_range(dstate):
            tl.store(states_ptr + state_row + k, h[k], mask=mask_d)
        tl.store(dsum_ptr + _chunk_sum_offsets(bi, dim, d, n_chunks, c), dsum, mask=mask_d)


@triton.jit
def _carry_kernel(A_ptr, states_ptr, dsum_ptr, start_ptr, last_ptr, dim, dstate, n_chunks,
                  REVERSE: tl.constexpr, HAS_START: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """Replaces each chunk's own contribution in ``states`` by the carry entering the chunk
    (from the left, or from the right when REVERSE): ``carry <- exp2(A log2 e * dsum) * carry +
    own``, starting from ``start`` (HAS_START) or zero; the final carry into ``last``."""
    d = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    bi = tl.program_id(1).to(tl.int64)
    nn = tl.arange(0, BLOCK_N)
    mask_d = d < dim
    mask = mask_d[:, None] & (nn < dstate)[None, :]
    A2 = tl.load(A_ptr + d[:, None] * dstate + nn[None, :], mask=mask, other=0.0) * 1.4426950408889634
    tile = _last_state_offsets(bi, dim, dstate, d[:, None] * dstate + nn[None, :])
    if HAS_START:
        carry = tl.load(start_ptr + tile, mask=mask, other=0.0).to(tl.float32)
    else:
        carry = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    for i in range(0, n_chunks):
        c = n_chunks - 1 - i if REVERSE else i
        offs = _chunk_state_offsets(bi, dim, d, n_chunks, c, dstate, nn)
        own = tl.load(states_ptr + offs, mask=mask, other=0.0)
        total = tl.load(dsum_ptr + _chunk_sum_offsets(bi, dim, d, n_chunks, c), mask=mask_d, other=0.0)
        tl.store(states_ptr + offs, carry, mask=mask)
        carry = tl.exp2(A2 * total[:, None]) * carry + own
    tl.store(last_ptr + tile, carry, mask=mask)


@triton.jit
def _state_vectors(ptr, offsets, dstate: tl.constexpr):
    """A tuple of ``dstate`` (BLOCK_D,) vectors: state k of each channel at ``ptr + offsets + k``."""
    v = ()
    for k in tl.static_range(dstate):
        v = v + (_widen(tl.load(ptr + offsets + k)),)
    return v


@triton.jit
def _store_state_vectors(ptr, offsets, mask, v):
    for k in tl.static_range(len(v)):
        tl.store(ptr + offsets + k, v[k], mask=mask)


@triton.jit
def _output_gradient(dout_ptr, z_ptr, offs, m2, HAS_Z: tl.constexpr):
    """(dy, dy through the gate, z, sigmoid(z)) of a sub-tile: ``out = (y + D u) * silu(z)``, so
    the states see ``dy * z * sigmoid(z)``; without z, dy itself (and dy in place of z, sigmoid)."""
    dy = _tile(dout_ptr, offs, m2)
    if HAS_Z:
        zt = _tile(z_ptr, offs, m2)
        zs = _sigmoid(zt)
        return dy, dy * zt * zs, zt, zs
    return dy, dy, dy, dy


@triton.jit
def _backward_states_kernel(u_ptr, delta_ptr, A_ptr, z_ptr, bias_ptr, dout_ptr, states_ptr, adj_ptr,
                            scratch_ptr, Bp_ptr, Cp_ptr,
                            dim, length, group_size, b_chans, c_chans, n_chunks, chunk,
                            dstate: tl.constexpr, VAR_B: tl.constexpr, VAR_C: tl.constexpr,
                            HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
                            BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SUB: tl.constexpr,
                            NQ: tl.constexpr, VEC: tl.constexpr, STEP: tl.constexpr):
    """One forward walk of the chunk from its entering state (``states``) that does both things
    the gradient walk needs before it: the state entering each sub-tile into this program's
    scratch slot (one (BLOCK_D, BLOCK_N) tile per sub-tile, each lane its own rows), and the
    adjoint entering the chunk from a zero one at its end, into ``adj``.

    That adjoint, ``r[t0] = sum_t P[t] C[t] dy[t]`` with ``P[t] = a[t0] ... a[t]`` the decays'
    running product, is summed in the same direction as the states, so each decay ``a[t]`` is
    computed once for both (``P *= a``, then one FMUL and one FFMA); ``P`` only shrinks, and
    once it underflows to 0 the rest of the chunk adds nothing it could have. The states, the
    products and the adjoints of all states are tuples of (BLOCK_D,) vectors in registers; a
    varying B and C are read from their position-major copies (``Bp``, ``Cp``), a constant one
    is the (d, n) tensor itself there."""
    c, blk, blocks = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    bi, g0, d, mask_d = _program_coordinates(tl.program_id(2), blk, dim, group_size, BLOCK_D)
    d = tl.minimum(d, g0 + group_size - 1)  # read the group's last channel, store nothing
    steps = tl.arange(0, STEP)
    row = _sequence_rows(bi, dim, d, length)
    state = _chunk_state_rows(bi, dim, d, n_chunks, c, dstate)  # (channels, state 0) of chunk c
    bias = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d)
    A2 = ()  # A log2 e per state: a decay is exp2(delta * A2)
    for n in tl.static_range(dstate):
        A2 = A2 + (tl.load(A_ptr + d * dstate + n) * 1.4426950408889634,)
    if not VAR_B:  # a constant B, C: their columns, once
        Bc = _states_at(Bp_ptr, d, dstate, NQ, VEC, False)
    if not VAR_C:
        Cc = _states_at(Cp_ptr, d, dstate, NQ, VEC, False)
    padded = n_chunks * chunk
    t0 = c * chunk
    t1 = tl.minimum(t0 + chunk, length)
    bp = Bp_ptr + _bc_positions(bi, dim, b_chans, g0, padded, t0, NQ, VAR_B)  # the chunk's start
    cp = Cp_ptr + _bc_positions(bi, dim, c_chans, g0, padded, t0, NQ, VAR_C)
    scratch = _scratch_rows(scratch_ptr, bi, blk, blocks, n_chunks, c, chunk, SUB, BLOCK_D, BLOCK_N)
    h = _state_vectors(states_ptr, state, dstate)
    P = (tl.full((BLOCK_D,), 1.0, tl.float32),) * dstate
    r = (tl.zeros((BLOCK_D,), dtype=tl.float32),) * dstate
    for s in range(t0, t1, SUB):  # (every lane stores into its own slot, masked or not)
        for k in tl.static_range(dstate):  # parities apart: the gradient walk's lanes read theirs
            tl.store(scratch + (k % 2) * (BLOCK_N // 2) + k // 2, h[k])
        for p in range(s, s + SUB, STEP):  # STEP positions a pass: fewer B, C values live at once
            t, mask_t, m2, offs = _sub_tile(p, steps, t1, mask_d, row)
            dt, _ = _delta_tile(delta_ptr, offs, m2, bias, HAS_BIAS, SOFTPLUS)
            _, dy_gated, _, _ = _output_gradient(dout_ptr, z_ptr, offs, m2, HAS_Z)
            dts = _columns(dt)
            dtus = _columns(dt * _tile(u_ptr, offs, m2))
            dys = _columns(dy_gated)
            for j in tl.static_range(STEP):
                if VAR_B:
                    Bc = _states_at(bp + j * NQ, d, dstate, NQ, VEC, True)
                if VAR_C:
                    Cc = _states_at(cp + j * NQ, d, dstate, NQ, VEC, True)
                h_next = ()
                P_next = ()
                r_next = ()
                for n in tl.static_range(dstate):
                    a = tl.exp2(dts[j] * A2[n])
                    h_next = h_next + (a * h[n] + dtus[j] * Bc[n],)
                    P_next = P_next + (P[n] * a,)
                for n in tl.static_range(dstate):  # (after all of B's uses: fewer registers)
                    r_next = r_next + (P_next[n] * (dys[j] * Cc[n]) + r[n],)
                h = h_next
                P = P_next
                r = r_next
            bp += STEP * NQ
            cp += STEP * NQ
        scratch += BLOCK_D * BLOCK_N
    # The adjoint leaving the chunk on the left, at ``state``: its offset derived again from
    # values live in the loop, the channel from the row and the chunk from its end t1, so that
    # nothing else is kept across the loop (under the register cap ptxas spilled the offset, the
    # chunk index, or the sign word of a signed division).
    channel = (row.to(tl.uint64) // length.to(tl.uint32).to(tl.uint64)).to(tl.int64)
    chunk_again = (t1 - 1) // chunk  # t0 <= t1 - 1 < t0 + chunk
    _store_state_vectors(adj_ptr + _channel_chunk_rows(channel, n_chunks, chunk_again, dstate), 0, mask_d, r)


@triton.jit
def _backward_chunk_kernel(u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr,
                           dout_ptr, adj_ptr, scratch_ptr,
                           du_ptr, ddelta_ptr, dz_ptr, dB_ptr, dC_ptr, dtile_ptr, dvec_ptr,
                           dim, length, group_size, b_chans, c_chans, n_chunks, chunk,
                           dstate: tl.constexpr, VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_D: tl.constexpr,
                           HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
                           BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SUB: tl.constexpr,
                           CONST: tl.constexpr):
    """The gradient walk, from the state entering each sub-tile (``scratch``, written by
    :func:`_backward_states_kernel`) and the adjoint entering the chunk from the right
    (``adj``): du, ddelta, dz per position; dB, dC per position summed over the program's
    channels (varying B/C, read from float32 copies padded to whole chunks, :func:`_states_major`;
    into ``dB``/``dC``) or per (channel, state) summed over the chunk (constant, ``dtile``
    tiles 0, 1); dA in ``dtile``'s carried values; dD, d(delta_bias) in ``dvec``.

    The SUB positions of a sub-tile are the columns of (BLOCK_D, SUB) tiles (:func:`_columns`),
    lane = channel. The walk over the states gives each lane two channels, its own and its
    partner's (the lane BLOCK_D / 2 away, :func:`_partner`), and the states of its parity: the
    dB, dC sums over the channels are then over half the lanes (:func:`_lane_sums`), and each
    channel's sums over the states (du, ddelta) meet in one shuffle at the end of a sub-tile.
    What the walk carries from sub-tile to sub-tile waits in memory, so few registers are live."""
    c, blk, blocks = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    bi, g0, d, mask_d = _program_coordinates(tl.program_id(2), blk, dim, group_size, BLOCK_D)
    # A lane past the group's channels reads its last channel's rows, so that loads need no
    # channel mask; it stores nothing, and its dB/dC contributions are zero (dtus, dys below).
    d = tl.minimum(d, g0 + group_size - 1)
    kk = tl.arange(0, SUB)
    row = _sequence_rows(bi, dim, d, length)
    state = _chunk_state_rows(bi, dim, d, n_chunks, c, dstate)  # (channels, state 0) of chunk c
    padded = n_chunks * chunk
    # a varying B, C: rows of their float32 copies padded to whole chunks with zeros
    b_row = _bc_row(bi, dim, b_chans, g0, dstate, padded, VAR_B)
    c_row = _bc_row(bi, dim, c_chans, g0, dstate, padded, VAR_C)
    bias = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d)
    if HAS_D:
        Dv = tl.load(D_ptr + d)
    zero = tl.zeros((BLOCK_D,), dtype=tl.float32)
    t0 = c * chunk
    t1 = tl.minimum(t0 + chunk, length)
    last_sub = t0 + ((t1 - t0 - 1) // SUB) * SUB  # first position of the chunk's last sub-tile
    scratch = _scratch_rows(scratch_ptr, bi, blk, blocks, n_chunks, c, chunk, SUB, BLOCK_D, BLOCK_N)
    part = _partial_rows(bi, blk, blocks, dstate, length)  # this block's dB/dC partial sums
    # This program's ``dtile`` slot holds, when B or C is constant, their gradients: ``CONST`` = 2
    # (BLOCK_D, BLOCK_N) tiles summed over the chunk (zeroed by the caller); then what the walk carries
    # per (channel, state) from sub-tile to sub-tile, four floats side by side: the adjoint (it
    # starts as the adjoint entering from the right), dA, A log2 e and a pad. So the loop over
    # the states need not be unrolled, and one 16-byte load per (channel, state) and pass
    # fetches all three.
    tile_size: tl.constexpr = BLOCK_D * BLOCK_N
    dtile = dtile_ptr + _program_slot(bi, blk, blocks, n_chunks, c, (CONST + 4) * tile_size)
    carried = dtile + CONST * tile_size
    lane = tl.arange(0, BLOCK_D)
    four = tl.arange(0, 4)
    for k in tl.static_range(dstate):
        A2k = tl.load(A_ptr + d * dstate + k) * 1.4426950408889634  # a decay is exp2(delta * A2)
        tl.store(carried + (lane * BLOCK_N + k)[:, None] * 4 + four[None, :],
                 _stack((tl.load(adj_ptr + state + k), zero, A2k, zero)))
    tl.debug_barrier()  # (a lane reads its partner's rows below)
    parity = lane // (BLOCK_D // 2)
    partner = (lane + BLOCK_D // 2) % BLOCK_D
    d_partner = _partner(d)
    side_row = (lane * BLOCK_N, partner * BLOCK_N)  # rows of the program's (BLOCK_D, BLOCK_N) tiles
    side_shift = (0, (partner - lane) * BLOCK_N)  # from a lane's row to its partner's
    # per side, the pointer to state ``parity`` of its row in the slot (a pass adds its first
    # state k0)
    t_at = (carried + (side_row[0] + parity) * 4, carried + (side_row[1] + parity) * 4)
    if not VAR_B:
        b_at = (B_ptr + d * dstate + parity, B_ptr + d_partner * dstate + parity)
    else:
        b_at = B_ptr + b_row + parity * padded
    if not VAR_C:
        c_at = (C_ptr + d * dstate + parity, C_ptr + d_partner * dstate + parity)
    else:
        c_at = C_ptr + c_row + parity * padded
    dD_acc = zero
    dbias_acc = zero
    for i in range(0, (t1 - t0 + SUB - 1) // SUB):
        s = last_sub - i * SUB
        t, mask_t, m2, offs = _sub_tile(s, kk, t1, mask_d, row)
        dt, _ = _delta_tile(delta_ptr, offs, m2, bias, HAS_BIAS, SOFTPLUS)
        dy, dy_gated, zt, zs = _output_gradient(dout_ptr, z_ptr, offs, m2, HAS_Z)
        dts = _columns(dt)
        # a lane past the group's channels adds nothing to dC (nor, by dtus, to dB)
        dy_gated = tl.where(mask_d[:, None], dy_gated, 0.0)
        dys = _columns(dy_gated)
        u = _tile(u_ptr, offs, m2)
        dtu = tl.where(mask_d[:, None], dt * u, 0.0)
        # this lane's own channel, then its partner's (the lane BLOCK_D / 2 away)
        dts = (dts, _columns(_partner(dt)))
        dtus = (_columns(dtu), _columns(_partner(dtu)))
        dys = (dys, _columns(_partner(dy_gated)))
        h_sub = scratch + ((s - t0) // SUB) * BLOCK_D * BLOCK_N  # the sub-tile's scratch, each lane's row
        ddt = ((zero,) * SUB, (zero,) * SUB)  # d loss / d delta (after softplus), over log 2
        ddx = ((zero,) * SUB, (zero,) * SUB)  # d loss / d (delta u)
        ys = ((zero,) * SUB, (zero,) * SUB)   # y, for dz
        # STEP states a loop pass (two passes of the lanes' parities), so that the pointers'
        # steps and the dB/dC butterfly are shared by more updates
        STEP: tl.constexpr = 4 if dstate % 4 == 0 else 2
        # the states entering the sub-tile, each row's even states then its odd ones
        h_at = h_sub + parity * (BLOCK_N // 2)
        for i2 in range(0, (dstate + STEP - 1) // STEP):  # not unrolled: its carries are in memory
            k0 = i2 * STEP
            values = ()  # g delta u and dy h per (pass, position), for the dB, dC sums
            h_in = ()  # per side, the states of this loop pass's (STEP // 2) passes
            for side in tl.static_range(2):
                if STEP == 4:
                    h_in = h_in + (_columns(tl.load((h_at + side_shift[side] + i2 * 2)[:, None] +
                                                    tl.arange(0, 2)[None, :])),)
                elif dstate % 2 == 0:
                    h_in = h_in + ((tl.load(h_at + side_shift[side] + i2),),)
                else:
                    h_in = h_in + ((tl.load(h_at + side_shift[side] + i2, mask=k0 + parity < dstate,
                                            other=0.0),),)
            for q in tl.static_range(STEP // 2):
                kq = k0 + 2 * q  # this lane's state is kq + parity, for both its channels; an
                if dstate % 2 == 0:  # odd dstate's last pass has none for parity 1
                    valid = tl.full((BLOCK_D,), 1, tl.int1)
                else:
                    valid = kq + parity < dstate
                if VAR_B:  # one row of B (C) for both channels: the state's, at the SUB positions
                    Bk = _columns(tl.load(b_at[:, None] + kq * padded + t[None, :], mask=valid[:, None],
                                          other=0.0))
                if VAR_C:  # (zero past the sequence, and for a missing state)
                    Ck = _columns(tl.load(c_at[:, None] + kq * padded + t[None, :], mask=valid[:, None],
                                          other=0.0))
                gdtu = (zero,) * SUB
                dyh = (zero,) * SUB
                new_ddt = ()
                new_ddx = ()
                new_ys = ()
                for side in tl.static_range(2):
                    if not VAR_B:  # a constant B (C): this channel's value, at every position
                        Bk = (_widen(tl.load(b_at[side] + kq, mask=valid, other=0.0)),) * SUB
                    if not VAR_C:
                        Ck = (_widen(tl.load(c_at[side] + kq, mask=valid, other=0.0)),) * SUB
                    at = t_at[side][:, None] + (kq * 4 + four)[None, :]
                    rk, dA_old, A2k, pad = _columns(tl.load(at, mask=valid[:, None], other=0.0))
                    # the sub-tile's decays, inputs and states, forward from the state entering it
                    a = ()
                    hs = ()
                    hk = h_in[side][q]
                    h_prev = (hk,)
                    for j in tl.static_range(SUB):
                        a = a + (tl.exp2(dts[side][j] * A2k),)
                        hk = a[j] * hk + dtus[side][j] * Bk[j]
                        hs = hs + (hk,)
                        h_prev = h_prev + (hk,)
                    # then the adjoint backwards, and every gradient of this (channel, state)
                    dAk = zero
                    dB_const = zero
                    dC_const = zero
                    s_ddt = ()
                    s_ddx = ()
                    s_ys = ()
                    s_gdtu = ()
                    s_dyh = ()
                    for j in tl.static_range(SUB - 1, -1, -1):
                        g = dys[side][j] * Ck[j] + rk  # d loss / d h[t]
                        rk = a[j] * g                  # r[t] = a[t] g[t]
                        p = rk * h_prev[j]             # g[t] exp(delta A) h[t-1]
                        dAk += p * dts[side][j]
                        s_ddt = (ddt[side][j] + p * A2k,) + s_ddt
                        s_ddx = (ddx[side][j] + g * Bk[j],) + s_ddx
                        s_gdtu = (gdtu[j] + g * dtus[side][j],) + s_gdtu
                        s_dyh = (dyh[j] + dys[side][j] * hs[j],) + s_dyh
                        if not VAR_B:
                            dB_const += g * dtus[side][j]
                        if not VAR_C:
                            dC_const += dys[side][j] * hs[j]
                        if HAS_Z:
                            s_ys = (ys[side][j] + hs[j] * Ck[j],) + s_ys
                    new_ddt = new_ddt + (s_ddt,)
                    new_ddx = new_ddx + (s_ddx,)
                    if HAS_Z:
                        new_ys = new_ys + (s_ys,)
                    gdtu = s_gdtu
                    dyh = s_dyh
                    two = tl.arange(0, 2)
                    tl.store(t_at[side][:, None] + (kq * 4 + two)[None, :], _stack((rk, dA_old + dAk)),
                             mask=valid[:, None])
                    # dB, dC of a constant B, C: per (channel, state), summed over positions
                    if not VAR_B or not VAR_C:
                        at = dtile + side_row[side] + parity + kq
                    if not VAR_B:
                        tl.store(at, tl.load(at) + dB_const, mask=valid)
                    if not VAR_C:
                        tl.store(at + tile_size, tl.load(at + tile_size) + dC_const, mask=valid)
                ddt = new_ddt
                ddx = new_ddx
                if HAS_Z:
                    ys = new_ys
                if VAR_B:
                    values = values + gdtu
                if VAR_C:
                    values = values + dyh
            # dB, dC of a varying B, C: per (state, position), summed over the channels, which the
            # BLOCK_D / 2 lanes of each parity hold two each; one butterfly per loop pass.
            # Value v of the sums is (parity v // V, pass q, kind (dB before dC), position)
            # with V the values a lane holds, as `values` lists them.
            if VAR_B or VAR_C:
                v = tl.arange(0, 2 * len(values))
                per_pass: tl.constexpr = len(values) // (STEP // 2)
                pos = s + v % SUB
                kv = k0 + 2 * (v % len(values) // per_pass) + v // len(values)
                at = part + kv * length + pos
                if VAR_B and VAR_C:
                    where = tl.where(v % per_pass < SUB, dB_ptr + at, dC_ptr + at)
                elif VAR_B:
                    where = dB_ptr + at
                else:
                    where = dC_ptr + at
                tl.store(where, _lane_sums(_stack(values), 2), mask=(pos < t1) & (kv < dstate))
        # each channel's sums over all states: its own lane's parity plus its partner's
        ddx_tile = _stack(ddx[0]) + _partner(_stack(ddx[1]))
        du = ddx_tile * dt
        # u and delta before softplus loaded again rather than kept in registers over the walk
        u = _tile(u_ptr, offs, m2)
        if HAS_D:
            du += dy_gated * Dv[:, None]
            dD_acc += tl.sum(dy_gated * u, axis=1)
        if HAS_Z:
            y = _stack(ys[0]) + _partner(_stack(ys[1]))
            if HAS_D:
                y += Dv[:, None] * u
            tl.store(dz_ptr + offs, dy * y * zs * (1.0 + zt * (1.0 - zs)), mask=m2)
        ddt_tile = (_stack(ddt[0]) + _partner(_stack(ddt[1]))) * 0.6931471805599453 + ddx_tile * u
        if SOFTPLUS:
            _, raw = _delta_tile(delta_ptr, offs, m2, bias, HAS_BIAS, False)
            ddt_tile = ddt_tile * _sigmoid(raw)
        ddt_tile = tl.where(m2, ddt_tile, 0.0)
        dbias_acc += tl.sum(ddt_tile, axis=1)
        tl.store(du_ptr + offs, du, mask=m2)
        tl.store(ddelta_ptr + offs, ddt_tile, mask=m2)
    # this program's (dD, d delta_bias) vectors
    dvec = dvec_ptr + _program_slot(bi, blk, blocks, n_chunks, c, 2 * BLOCK_D) + lane
    tl.store(dvec, dD_acc)
    tl.store(dvec + BLOCK_D, dbias_acc)


class _Layout:
    """Shapes, chunking and launch grid shared by the kernels."""

    def __init__(self, u: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                 chunk: int, block_d: int):
        self.batch, self.dim, self.length = u.shape
        self.dstate = A.shape[1]
        groups = 1
        for m in (B, C):  # the finest grouping: every program's channels share one B and C slice
            if m.dim() == 4:
                groups = groups * m.shape[1] // math.gcd(groups, m.shape[1])
        self.group_size = self.dim // groups
        self.b_chans = self.dim // B.shape[1] if B.dim() == 4 else 1
        self.c_chans = self.dim // C.shape[1] if C.dim() == 4 else 1
        # whole sub-tiles per chunk, and no more than MAX_CHUNKS chunks
        chunk = max(int(chunk), -(-self.length // MAX_CHUNKS), 1)
        step = SUB * FORWARD_SUB // math.gcd(SUB, FORWARD_SUB)
        self.chunk = -(-chunk // step) * step
        self.n_chunks = -(-self.length // self.chunk)
        # (at least 2: the gradient walk pairs each lane with the lane BLOCK_D / 2 away)
        self.block_d = max(2, min(triton.next_power_of_2(max(1, int(block_d))),
                                  triton.next_power_of_2(self.group_size)))
        self.block_n = triton.next_power_of_2(self.dstate)
        # a position's states in the position-major B/C copies: ``vec`` at a time, ``nq`` in all
        self.vec = min(4, self.block_n)
        self.nq = -(-self.dstate // self.vec) * self.vec
        self.blocks = -(-self.group_size // self.block_d)
        self.fine = groups
        self.grid = (self.n_chunks, groups * self.blocks, self.batch)
        self.carry_grid = (triton.cdiv(self.dim, BLOCK_D), self.batch)
        self.programs = math.prod(self.grid)
        self._check_limits(tuple(u.shape))

    def _check_limits(self, shape: Tuple[int, ...]) -> None:
        """Refuse, before any work, what the kernels' 32-bit indices (positions within one
        sequence, offsets within one program's slot, the A tile) or CUDA's grid (at most 65535
        programs along its second and third axes) cannot address."""
        for what, value, limit in (('positions L + chunk', self.length + self.chunk, INT32_MAX),
                                   ('chunk x state tile', self.chunk * self.block_d * self.block_n, INT32_MAX),
                                   ('dim x d_state', self.dim * self.dstate, INT32_MAX),
                                   ('channel blocks', self.grid[1], 65535),
                                   ('batch', self.batch, 65535)):
            if value > limit:
                raise InputError(
                    f'the Triton selective scan cannot take u of shape {shape} (batch, dim, L): '
                    f'its {what} = {value} passes {limit}, the most its indices or launch grid '
                    f'address. Split the input, or use scan_backend: torch.')

    def args(self) -> Tuple[int, ...]:
        return (self.dim, self.length, self.group_size, self.b_chans, self.c_chans,
                self.n_chunks, self.chunk)

    def per_channel(self, t: torch.Tensor, width: int) -> torch.Tensor:
        """Per-program partial sums (programs, ...) -> (dim, width), summed over batch and chunks."""
        t = t.reshape(self.batch, self.fine, self.blocks, self.n_chunks, self.block_d, -1).sum((0, 3))
        t = t.reshape(self.fine, self.blocks * self.block_d, -1)[:, :self.group_size]
        return t.reshape(self.dim, -1)[:, :width]

    def per_position(self, part: torch.Tensor, groups: int) -> torch.Tensor:
        """dB/dC partial sums (b, channel blocks, n, L) -> (b, groups, n, L)."""
        part = part.view(self.batch, groups, self.fine // groups * self.blocks, self.dstate, self.length)
        return part.sum(2)


@dataclass
class KernelLaunch:
    """One kernel launch, complete: ``kernel[grid](*args, num_warps=num_warps, **constexprs)``.

    ``args`` are the kernel's non-constexpr parameters in order (tensors and Python ints; on a GPU
    Triton specialises on them: pointer alignment, ints divisible by 16, ints past 2**31 - 1 as
    int64), ``constexprs`` its constexpr parameters by name. ``updates_per_pass``: for each
    innermost loop of the compiled kernel, in code order, the state updates (channel, state,
    position) one warp makes per pass (empty for the carry kernel, whose loop walks chunks), so
    that static figures can be put per update. ``options``: other launch options
    (:data:`COMPILE_OPTIONS` always, added to those given; ``maxnreg``: the registers per
    thread ptxas may use, so that enough programs stay resident per SM; Triton's interpreter
    ignores them).
    ``serial_passes``: the passes of its loop that one program makes one after another (the
    carry kernel's chunks), for the time estimate's serial chain.
    ``traffic``: the tensors it reads or writes, each once (one listed twice is moved twice;
    None: absent), for the estimate's memory time."""
    name: str
    kernel: Any
    grid: Tuple[int, ...]
    args: Tuple[Any, ...]
    constexprs: Dict[str, Any]
    num_warps: int
    updates_per_pass: Tuple[int, ...] = ()
    options: Dict[str, Any] = field(default_factory=dict)
    serial_passes: int = 0
    traffic: Tuple[Optional[torch.Tensor], ...] = ()

    def __post_init__(self) -> None:
        self.options = {**COMPILE_OPTIONS, **self.options}

    def run(self) -> None:
        device = self.args[0].device
        with torch.cuda.device(device) if device.type == 'cuda' else _nothing():
            self.kernel[self.grid](*self.args, num_warps=self.num_warps, **self.options,
                                   **self.constexprs)


@dataclass
class ScanLaunches:
    """The launches of one direction, run in order, the tensors they write (``outputs``) and
    the shapes the caller needs afterwards (``layout``)."""
    launches: List[KernelLaunch]
    outputs: Dict[str, Optional[torch.Tensor]]
    layout: _Layout

    def run(self) -> Dict[str, Optional[torch.Tensor]]:
        for launch in self.launches:
            launch.run()
        return self.outputs


def _prepare(u, delta, A, B, C, D, z, delta_bias, softplus, chunk, block_d):
    """Contiguous inputs in the kernels' argument order, the flags they are compiled for, and
    the layout. A shape past the kernels' limits raises :class:`InputError` naming it, before
    any input is copied."""
    lay = _Layout(u, A, _grouped_view(B), _grouped_view(C), chunk, block_d)  # checks limits first
    u, delta = u.contiguous(), delta.contiguous()
    z = None if z is None else z.contiguous()
    Bn, Cn = _grouped_view(B).contiguous(), _grouped_view(C).contiguous()
    A32, D32, bias32 = A.float().contiguous(), _float(D), _float(delta_bias)
    inputs = (u, delta, A32, Bn, Cn, _or(D32, A32), _or(z, u), _or(bias32, A32))
    flags = dict(VAR_B=Bn.dim() == 4, VAR_C=Cn.dim() == 4, HAS_D=D is not None, HAS_Z=z is not None,
                 HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(softplus), dstate=lay.dstate,
                 BLOCK_D=lay.block_d, BLOCK_N=lay.block_n, SUB=SUB)
    return inputs, flags, lay


def _chunk_launch(name, kernel, lay, args, flags, loops, traffic, max_registers, **mode) -> KernelLaunch:
    """``loops``: per innermost loop, whether one pass covers all states of a sub-tile ('tile')
    or the gradient walk's states of one pass for each of the lanes' two channels ('states'):
    two passes of the lanes' two parities when d_state is a multiple of 4, else one."""
    step = 4 if lay.dstate % 4 == 0 else 2
    per = dict(tile=lay.block_d * lay.dstate * SUB, states=lay.block_d * SUB * step,
               step=lay.block_d * lay.dstate * mode.get('STEP', 1))
    return KernelLaunch(name, kernel, lay.grid, args, dict(flags, **mode), num_warps=1,
                        updates_per_pass=tuple(per[loop] for loop in loops),
                        options=dict(maxnreg=max_registers), traffic=tuple(traffic))


def _carry_launch(name, lay, A32, own, dsum, start, last, reverse: bool) -> KernelLaunch:
    return KernelLaunch(name, _carry_kernel, lay.carry_grid,
                        (A32, own, dsum, _or(start, A32), last, lay.dim, lay.dstate, lay.n_chunks),
                        dict(REVERSE=reverse, HAS_START=start is not None, BLOCK_D=BLOCK_D,
                             BLOCK_N=lay.block_n), num_warps=1, serial_passes=lay.n_chunks,
                        traffic=(own, own, dsum, start, last))


def forward_launch(u, delta, A, B, C, D, z, delta_bias, softplus: bool, chunk: int = CHUNK,
                   block_d: int = BLOCK_D) -> ScanLaunches:
    """The forward's launches for these inputs (shapes and dtypes as :func:`selective_scan_triton`).
    Outputs: ``out`` (u's dtype), ``last`` (float32 last state), ``saved`` (the float32 states
    entering the chunks, kept for backward) and ``dsum`` (each chunk's sum of delta).

    This is the one description of the launches: :class:`SelectiveScanTriton` runs them, and
    ``scripts/scan_static_report.py`` compiles them for GPUs it does not have, by calling this
    with tensors on the ``meta`` device (shapes and dtypes only, nothing allocated). So it must
    do nothing but prepare inputs (here also the position-major B/C copies), allocate outputs
    and temporaries (the float32 delta after softplus) on the inputs' device and describe the
    launches; it must never read tensor values."""
    inputs, flags, lay = _prepare(u, delta, A, B, C, D, z, delta_bias, softplus, chunk, block_d)
    u = inputs[0]
    fwd_inputs = list(inputs)
    for i in (3, 4):  # varying B and C: position-major float32 copies
        if inputs[i].dim() == 4:
            fwd_inputs[i] = _positions_major(inputs[i], lay.n_chunks * lay.chunk, lay.nq)
    fwd_flags = {k: v for k, v in flags.items() if k != 'BLOCK_N'}
    fwd_flags.update(NQ=lay.nq, VEC=lay.vec, SUB=FORWARD_SUB, UNROLL=FORWARD_UNROLL)
    out = torch.empty_like(u)
    last = u.new_empty(lay.batch, lay.dim, lay.dstate, dtype=torch.float32)
    saved = u.new_empty(lay.batch, lay.dim, lay.n_chunks, lay.dstate, dtype=torch.float32)
    dsum = u.new_empty(lay.batch, lay.dim, lay.n_chunks, dtype=torch.float32)
    dt = u.new_empty(lay.batch, lay.dim, lay.length, dtype=torch.float32)  # freed after the forward
    args = (*fwd_inputs, dt, out, saved, dsum, *lay.args())
    per_pass = lay.block_d * lay.dstate * FORWARD_SUB * FORWARD_UNROLL
    return ScanLaunches([
        KernelLaunch('forward: chunks from zero', _forward_chunk_kernel, lay.grid, args,
                     dict(fwd_flags, OUTPUT=False), num_warps=1, updates_per_pass=(per_pass,),
                     traffic=(u, inputs[1], fwd_inputs[3], dt, saved, dsum)),
        _carry_launch('forward: carries', lay, inputs[2], saved, dsum, None, last, reverse=False),
        KernelLaunch('forward: output', _forward_chunk_kernel, lay.grid, args,
                     dict(fwd_flags, OUTPUT=True), num_warps=1, updates_per_pass=(per_pass,),
                     traffic=(u, dt, fwd_inputs[3], fwd_inputs[4], _or_none(z, inputs[6]), saved, out)),
    ], dict(out=out, last=last, saved=saved, dsum=dsum), lay)


def _positions_major(m: torch.Tensor, padded: int, nq: int) -> torch.Tensor:
    """A varying (b, G, n, L) B or C as the forward reads it: float32 (b, G, padded, nq), the
    ``n`` states of a position contiguous (zero beyond n and beyond L), so that a position's
    states are ``nq / 4`` 16-byte loads at fixed offsets from one address."""
    b, g, n, length = m.shape
    out = m.new_zeros(b, g, padded, nq, dtype=torch.float32)
    out[:, :, :length, :n] = m.transpose(2, 3)
    return out


def _states_major(m: torch.Tensor, padded: int) -> torch.Tensor:
    """A varying (b, G, n, L) B or C as the gradient walk reads it: float32 (b, G, n, padded),
    zero beyond L, so that the walk's loads of a state's positions need no mask nor widening."""
    out = m.new_zeros(*m.shape[:3], padded, dtype=torch.float32)
    out[..., :m.shape[3]] = m
    return out


def backward_launch(u, delta, A, B, C, D, z, delta_bias, saved: torch.Tensor, dsum: torch.Tensor,
                    dout: torch.Tensor, dlast: Optional[torch.Tensor], softplus: bool,
                    chunk: int = CHUNK, block_d: int = BLOCK_D) -> ScanLaunches:
    """The backward's launches (same contract as :func:`forward_launch`): the forward's inputs,
    its ``saved`` states and ``dsum``, the output gradient ``dout`` and the last state's gradient
    ``dlast`` (None: not needed, the carry kernel is compiled without it). Outputs: ``du``,
    ``ddelta``, ``dz`` (or None), and the partial sums ``dB_part``/``dC_part`` (variable B/C,
    else None), ``dtile`` (dA, constant dB, dC) and ``dvec`` (dD, d delta_bias) that ``layout``
    reduces."""
    inputs, flags, lay = _prepare(u, delta, A, B, C, D, z, delta_bias, softplus, chunk, block_d)
    u, delta = inputs[0], inputs[1]
    dout = dout.contiguous()
    dlast = None if dlast is None else dlast.float().contiguous()
    du, ddelta = torch.empty_like(u), torch.empty_like(delta)
    dz = None if z is None else torch.empty_like(inputs[6])
    f32 = dict(dtype=torch.float32)
    tile_size = lay.block_d * lay.block_n
    adj = torch.empty_like(saved)
    dinit = u.new_empty(lay.batch, lay.dim, lay.dstate, **f32)  # gradient of the zero initial state
    scratch = u.new_empty(lay.programs * (lay.chunk // SUB) * tile_size, **f32)
    const = 0 if flags['VAR_B'] and flags['VAR_C'] else 2  # dtile's constant-gradient tiles, if any
    dtile = u.new_empty(lay.programs, const + 4, lay.block_d, lay.block_n, **f32)
    dtile[:, :const].zero_()
    dvec = u.new_empty(lay.programs, 2, lay.block_d, **f32)
    dB_part = u.new_empty(lay.batch, lay.grid[1], lay.dstate, lay.length, **f32) if flags['VAR_B'] else None
    dC_part = u.new_empty(lay.batch, lay.grid[1], lay.dstate, lay.length, **f32) if flags['VAR_C'] else None
    positions = [_positions_major(m, lay.n_chunks * lay.chunk, lay.nq) if m.dim() == 4 else m
                 for m in inputs[3:5]]  # as the forward reads them
    rows = [_states_major(m, lay.n_chunks * lay.chunk) if m.dim() == 4 else m for m in inputs[3:5]]
    args = (*inputs[:3], *rows, *inputs[5:], dout, adj, scratch, du, ddelta, _or(dz, du), _or(dB_part, scratch),
            _or(dC_part, scratch), dtile, dvec, *lay.args())
    states_args = (u, delta, inputs[2], inputs[6], inputs[7], dout, saved, adj, scratch, *positions,
                   *lay.args())
    states_flags = {k: v for k, v in flags.items() if k != 'HAS_D'}
    return ScanLaunches([
        _chunk_launch('backward: states, adjoints from zero', _backward_states_kernel, lay, states_args,
                      states_flags, ['step'],
                      (u, delta, dout, positions[0], positions[1], _or_none(z, inputs[6]), saved, scratch, adj),
                      max_registers=128 if z is None else 144, NQ=lay.nq, VEC=lay.vec,
                      STEP=STATES_STEP),  # 16 per SM (14 with z)
        _carry_launch('backward: carries', lay, inputs[2], adj, dsum, dlast, dinit, reverse=True),
        _chunk_launch('backward: gradients', _backward_chunk_kernel, lay, args, flags, ['states'],
                      (u, delta, dout, *rows, _or_none(z, inputs[6]), adj, scratch,
                       du, ddelta, dz, dB_part, dC_part, dtile, dvec),
                      max_registers=128 if z is None else 168, CONST=const),  # 16 per SM; 12 with z (its gate needs more)
    ], dict(du=du, ddelta=ddelta, dz=dz, dB_part=dB_part, dC_part=dC_part, dtile=dtile, dvec=dvec), lay)


def _grouped_view(m: torch.Tensor) -> torch.Tensor:
    """(b, n, L) -> (b, 1, n, L) (a view); (d, n) and (b, G, n, L) unchanged."""
    return m.unsqueeze(1) if m.dim() == 3 else m


def _float(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.float().contiguous()


class SelectiveScanTriton(torch.autograd.Function):
    """Autograd function over the kernels; arguments as :func:`selective_scan_triton`."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, softplus: bool, chunk: int,
                block_d: int):  # type: ignore[override]
        if u.shape[-1] == 0:
            raise ValueError('the selective scan needs a sequence length of at least 1')
        # An output that no loss uses gets None in backward, not zeros: without the last
        # state's gradient (MambaIR never uses the last state) the reverse carry kernel is
        # compiled without that work (HAS_START=False).
        ctx.set_materialize_grads(False)
        outputs = forward_launch(u, delta, A, B, C, D, z, delta_bias, softplus, chunk, block_d).run()
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, outputs['saved'], outputs['dsum'])
            ctx.softplus, ctx.chunk, ctx.block_d = bool(softplus), chunk, block_d
        return outputs['out'], outputs['last']

    @staticmethod
    def backward(ctx, dout, dlast):  # type: ignore[override]
        u, delta, A, B, C, D, z, delta_bias, saved, dsum = ctx.saved_tensors
        if dout is None:  # only the last state is used
            dout = torch.zeros_like(u)
        plan = backward_launch(u, delta, A, B, C, D, z, delta_bias, saved, dsum, dout, dlast,
                               ctx.softplus, ctx.chunk, ctx.block_d)
        grads, lay = plan.run(), plan.layout
        dtile, dvec, n = grads['dtile'], grads['dvec'], lay.dstate
        carried = dtile[:, dtile.shape[1] - 4:].reshape(dtile.shape[0], lay.block_d, lay.block_n, 4)
        dA = lay.per_channel(carried[..., 1], n)
        dB = (lay.per_position(grads['dB_part'], _grouped_view(B).shape[1])
              if grads['dB_part'] is not None else lay.per_channel(dtile[:, 0], n))
        dC = (lay.per_position(grads['dC_part'], _grouped_view(C).shape[1])
              if grads['dC_part'] is not None else lay.per_channel(dtile[:, 1], n))
        dD = None if D is None else lay.per_channel(dvec[:, 0], 1).view(-1).to(D.dtype)
        dbias = None if delta_bias is None else lay.per_channel(dvec[:, 1], 1).view(-1).to(delta_bias.dtype)
        return (grads['du'], grads['ddelta'], dA.to(A.dtype), dB.view(B.shape).to(B.dtype),
                dC.view(C.shape).to(C.dtype), dD, grads['dz'], dbias, None, None, None)


class _nothing:
    """A do-nothing context manager (CPU tensors under TRITON_INTERPRET=1)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _or_none(flag: Optional[torch.Tensor], t: torch.Tensor) -> Optional[torch.Tensor]:
    """``t`` where the optional input ``flag`` is given, else None (a launch's traffic)."""
    return None if flag is None else t


def _or(t: Optional[torch.Tensor], fallback: torch.Tensor) -> torch.Tensor:
    """A real tensor for a pointer argument the kernel never touches (its flag is off); never an
    empty one, whose null data pointer Triton's launcher rejects on a GPU."""
    return fallback if t is None else t


def selective_scan_triton(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                          C: torch.Tensor, D: Optional[torch.Tensor] = None,
                          z: Optional[torch.Tensor] = None, delta_bias: Optional[torch.Tensor] = None,
                          delta_softplus: bool = False, chunk: int = CHUNK, block_d: int = BLOCK_D
                          ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(output in u's dtype, last state in float32); shapes as :func:`archs.selective_scan.selective_scan`
    (which checks them). ``chunk``: positions per program (rounded up to whole sub-tiles of
    :data:`SUB`, and raised so that there are at most :data:`MAX_CHUNKS` chunks); ``block_d``:
    channels per program."""
    return SelectiveScanTriton.apply(u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus),
                                     int(chunk), int(block_d))


def interpreting() -> bool:
    """Whether these kernels run on Triton's CPU interpreter: TRITON_INTERPRET=1 was set before
    triton was imported (its own library functions, such as ``tl.sum``, are decorated then) and
    still when this module was."""
    return not any(isinstance(f, triton.runtime.JITFunction) for f in (_forward_chunk_kernel, tl.sum))
