"""The selective scan's chunk-parallel Triton kernels (``@triton.jit`` code and the constants
they are built around), for GPUs without mamba-ssm.

How they are launched lives in :mod:`archs.scan.triton_launches`, the autograd function over them
in :mod:`archs.scan.triton_function`. This module imports triton at import time, so
:mod:`archs.scan.dispatch` imports it only when the 'triton' backend is used.
``TRITON_INTERPRET=1`` runs the same kernels on CPU tensors (the tests do); it must be set
before triton itself is first imported, since Triton decorates its own library functions
(``tl.sum``, ...) then (:func:`archs.scan.triton_function.interpreting`).

Work split. Every kernel that walks positions runs one program per (chunk of ``chunk``
positions, block of :data:`~archs.scan.triton_launches.BLOCK_D` channels sharing one slice of B and C, batch element), so a
launch has ``batch * channel blocks * chunks`` programs (6912 one-warp programs at MambaIR's x4
training shapes) instead of one per channel block. Each lane owns one channel. A program walks
its chunk in sub-tiles of :data:`~archs.scan.triton_launches.SUB` consecutive positions: u, delta, z and the output gradient
are loaded as ``(BLOCK_D, SUB)`` tiles (each lane reads ``SUB`` consecutive positions of its row),
and what depends only on the position and channel (delta + bias, softplus, delta * u, the gate)
is computed once per sub-tile and reused for all ``n`` states. All arithmetic is float32
whatever the input dtype.

Every kernel keeps every per-lane value a (BLOCK_D,) vector, one register per lane, so no
value changes layout: the ``n`` states are a tuple of such vectors carried through the loop,
A log2 e another tuple loaded before it, and a loaded (BLOCK_D, :data:`~archs.scan.triton_launches.FORWARD_SUB`) tile is split
into its column vectors by a reshape and splits (:func:`_columns`; the output tile is joined back
the same way), which move no data. A varying B and C are read from a position-major float32
copy (b, G, chunks * chunk, n rounded up to 4) made before the launches: the ``n`` values of one
position are ``n / 4`` 16-byte loads that every lane makes at fixed offsets from one address,
split into scalars the same way (:func:`_states_at`); a constant (d, n) B or C is loaded once
as a tuple. In the forward, each pass of the loop walks :data:`~archs.scan.triton_launches.FORWARD_UNROLL` sub-tiles with
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
   :data:`~archs.scan.triton_launches.STATES_STEP` positions a pass so that they fit the register cap.
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
import triton
import triton.language as tl


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
