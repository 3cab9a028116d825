"""Selective scan as two Triton kernels (forward, backward), for GPUs without mamba-ssm.

On a GPU the pure-PyTorch scan is launch-bound: it issues several small kernels per position or
per interval, for every SS2D layer. Here one kernel launch runs the whole forward and one the
whole backward. This module imports triton at import time, so :mod:`archs.selective_scan`
imports it only when the 'triton' backend is used. ``TRITON_INTERPRET=1`` runs the same kernels
on CPU tensors (the tests do); it must be set before triton itself is first imported, since
Triton decorates its own library functions (``tl.sum``, ...) then (:func:`interpreting`).

Work split: one program per (batch, group of channels sharing one slice of B and C, block of
:data:`BLOCK_D` channels of that group). The program keeps its ``(BLOCK_D, n)`` state tile in
float32 registers, whatever the input dtype, and walks the positions one by one, so B and C at a
position are one length-n vector shared by all its channels. Non-power-of-two ``d`` and ``n`` are
masked; any length works.

What is saved for backward, and why. The states ``h[t]`` are ``b*d*n*L`` floats (about 850 MB per
SS2D layer at MambaIR's x4 training shapes), too much to keep for every layer. Like mamba-ssm,
forward saves only its inputs and the state *entering* every chunk of :data:`CHUNK` positions
(``b*d*n*L/CHUNK`` floats, O(L/chunk)). Backward walks the chunks from the last to the first.
For each chunk it recomputes the chunk's states from the saved entry state, writing them to a
small per-program scratch buffer (``CHUNK`` state tiles), then runs the adjoint recurrence
``g[t] = C[t] dy[t] + exp(delta[t+1] A) g[t+1]`` backwards through the chunk, reading ``h[t]``
and ``h[t-1]`` back from the scratch buffer. Only the decays ``exp(delta A) <= 1`` are ever
formed, so strong decay cannot overflow.

Reductions: the gradients of B and C at a position are sums over channels, and those of A, D
and delta_bias sums over batch and positions. Each program writes its own partial sums (B and C:
per position, ``1/BLOCK_D`` of the state's size; A, D, delta_bias: one tile per program) and
PyTorch sums them afterwards. No atomics, so gradients are deterministic.

Launches are described in one place: :func:`forward_launch` and :func:`backward_launch` return a
:class:`KernelLaunch` (kernel, grid, arguments, constexprs, num_warps, the outputs it writes).
The autograd function runs them; ``scripts/scan_static_report.py`` calls the same functions with
``meta`` tensors and compiles what a launch would compile for sm_80/sm_90 without a GPU. A new
kernel keeps this contract, so the report and its test follow it unchanged.
"""
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import torch
import triton
import triton.language as tl

from basicsr_ldt.errors import InputError

# Positions per chunk: forward saves one state per chunk; backward recomputes a chunk at a time.
CHUNK = 64
# Channels per program (rounded to a power of two, at most the channels of one B/C group).
BLOCK_D = 16
INT32_MAX = 2 ** 31 - 1


@triton.jit
def _softplus(x):
    """log(1 + e^x) as torch computes it (identity above 20), with log1p done accurately."""
    e = tl.exp(tl.minimum(x, 20.0))
    w = 1.0 + e
    # log1p(e) = log(w) * e / (w - 1) corrects the rounding of 1 + e (exact when w == 1).
    log1p = tl.where(w == 1.0, e, tl.log(w) * (e / (w - 1.0)))
    return tl.where(x > 20.0, x, log1p)


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


# Offsets. A product of sizes can pass 2**31 - 1: b*dim*L already at batch 1 for a 1024 x 1024
# image at MambaIR's 1440 channels (1.5e9 elements) and at batch 2, the dB/dC partial sums
# (programs*n*L) likewise. So the batch index and the program index are int64 and every offset
# built from them is; offsets inside one sequence, one channel's row or one program's slot stay
# 32-bit, within the limits _Layout checks. Each offset is one helper, evaluated by the tests.
@triton.jit
def _program_coordinates(pid, dim, group_size, BLOCK_D: tl.constexpr):
    """(batch index (int64), first channel of the group, channel indices, their mask) of
    program ``pid``."""
    blocks = (group_size + BLOCK_D - 1) // BLOCK_D
    groups = dim // group_size
    bi = (pid // (groups * blocks)).to(tl.int64)
    grp = (pid // blocks) % groups
    d_in = (pid % blocks) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = d_in < group_size
    return bi, grp * group_size, grp * group_size + d_in, mask_d


@triton.jit
def _sequence_rows(bi, dim, d, length):
    """Offsets of position 0 of channels ``d`` of batch ``bi`` in a (b, dim, L) tensor."""
    return (bi * dim + d) * length


@triton.jit
def _chunk_state_offsets(bi, dim, d, n_chunks, c, dstate, n):
    """Offsets of the (channels d, states n) tile entering chunk ``c`` in the saved
    (b, dim, n_chunks, dstate) states."""
    return ((bi * dim + d[:, None]) * n_chunks + c) * dstate + n[None, :]


@triton.jit
def _last_state_offsets(bi, dim, dstate, tile):
    """Offsets of a (channels, states) ``tile`` of batch ``bi`` in a (b, dim, dstate) tensor."""
    return bi * dim * dstate + tile


@triton.jit
def _program_slot(pid, slots, slot_size):
    """Start of program ``pid``'s ``slots`` x ``slot_size`` elements in a per-program buffer."""
    return pid.to(tl.int64) * slots * slot_size


@triton.jit
def _partial_rows(pid, dstate, n, length):
    """Offsets of program ``pid``'s rows ``n`` in the (programs, dstate, L) dB/dC partial sums."""
    return (pid.to(tl.int64) * dstate + n) * length


@triton.jit
def _projection_source(ptr, tile, mask, bi, dim, chans, g0, dstate, n, length, VARIES: tl.constexpr):
    """Where this program reads B (or C): when it varies along the sequence ((b, G, n, L)), the
    offsets of its group's (n,) rows (all of the program's channels share group g0 // chans);
    when constant ((d, n)), its tile, loaded once. Returns (rows, tile); the unused one is 0."""
    if VARIES:
        rows = ((bi * (dim // chans) + g0 // chans) * dstate + n) * length
        const = 0.0
    else:
        rows = 0
        const = tl.load(ptr + tile, mask=mask, other=0.0).to(tl.float32)
    return rows, const


@triton.jit
def _projection_at(ptr, rows, t, mask_n, const, VARIES: tl.constexpr):
    """B (or C) at position ``t``: a (1, n) float32 row read at ``rows + t``, or the constant tile."""
    if VARIES:
        value = tl.load(ptr + rows + t, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    else:
        value = const
    return value


@triton.jit
def _delta(raw, bias, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    if HAS_BIAS:
        raw = raw + bias
    if SOFTPLUS:
        return _softplus(raw)
    return raw


@triton.jit
def _scan_forward_kernel(u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr,
                         out_ptr, last_ptr, saved_ptr,
                         dim, length, dstate, group_size, b_chans, c_chans, n_chunks, chunk,
                         VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_D: tl.constexpr,
                         HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
                         SAVE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    bi, g0, d, mask_d = _program_coordinates(tl.program_id(0), dim, group_size, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    mask_n = n < dstate
    mask = mask_d[:, None] & mask_n[None, :]
    tile = d[:, None] * dstate + n[None, :]
    A = tl.load(A_ptr + tile, mask=mask, other=0.0)
    row = _sequence_rows(bi, dim, d, length)  # (b, d, 0) offsets of the (b, d, L) tensors
    b_row, B_tile = _projection_source(B_ptr, tile, mask, bi, dim, b_chans, g0, dstate, n, length, VAR_B)
    c_row, C_tile = _projection_source(C_ptr, tile, mask, bi, dim, c_chans, g0, dstate, n, length, VAR_C)
    if HAS_D:
        Dv = tl.load(D_ptr + d, mask=mask_d, other=0.0)
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d, mask=mask_d, other=0.0)
    h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    for c in range(0, n_chunks):
        if SAVE:  # the state entering chunk c, from which backward recomputes the chunk
            tl.store(saved_ptr + _chunk_state_offsets(bi, dim, d, n_chunks, c, dstate, n), h,
                     mask=mask)
        t0 = c * chunk
        for t in range(t0, tl.minimum(t0 + chunk, length)):
            ut = tl.load(u_ptr + row + t, mask=mask_d, other=0.0).to(tl.float32)
            dt = _delta(tl.load(delta_ptr + row + t, mask=mask_d, other=0.0).to(tl.float32),
                        bias, HAS_BIAS, SOFTPLUS)
            Bt = _projection_at(B_ptr, b_row, t, mask_n, B_tile, VAR_B)
            Ct = _projection_at(C_ptr, c_row, t, mask_n, C_tile, VAR_C)
            h = tl.exp(dt[:, None] * A) * h + (dt * ut)[:, None] * Bt
            y = tl.sum(h * Ct, axis=1)
            if HAS_D:
                y += Dv * ut
            if HAS_Z:
                zt = tl.load(z_ptr + row + t, mask=mask_d, other=0.0).to(tl.float32)
                y = y * zt * _sigmoid(zt)
            tl.store(out_ptr + row + t, y, mask=mask_d)
    tl.store(last_ptr + _last_state_offsets(bi, dim, dstate, tile), h, mask=mask)


@triton.jit
def _scan_backward_kernel(u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr,
                          dout_ptr, dlast_ptr, saved_ptr, scratch_ptr,
                          du_ptr, ddelta_ptr, dz_ptr, dB_ptr, dC_ptr, dtile_ptr, dvec_ptr,
                          dim, length, dstate, group_size, b_chans, c_chans, n_chunks, chunk,
                          VAR_B: tl.constexpr, VAR_C: tl.constexpr, HAS_D: tl.constexpr,
                          HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
                          HAS_DLAST: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Outputs: du, ddelta, dz per position; dB, dC per position summed over this program's
    channels (variable B/C) or per (channel, state) summed over positions (constant B/C, into
    the dtile slots 1 and 2); the dA tile in dtile slot 0; dD and d(delta_bias) in dvec."""
    pid = tl.program_id(0)
    bi, g0, d, mask_d = _program_coordinates(pid, dim, group_size, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    mask_n = n < dstate
    mask = mask_d[:, None] & mask_n[None, :]
    tile = d[:, None] * dstate + n[None, :]
    local = tl.arange(0, BLOCK_D)[:, None] * BLOCK_N + n[None, :]  # offsets inside one tile
    tile_size = BLOCK_D * BLOCK_N
    scratch = scratch_ptr + _program_slot(pid, chunk, tile_size) + local
    A = tl.load(A_ptr + tile, mask=mask, other=0.0)
    row = _sequence_rows(bi, dim, d, length)
    part_row = _partial_rows(pid, dstate, n, length)  # this program's dB/dC partial sums
    b_row, B_tile = _projection_source(B_ptr, tile, mask, bi, dim, b_chans, g0, dstate, n, length, VAR_B)
    c_row, C_tile = _projection_source(C_ptr, tile, mask, bi, dim, c_chans, g0, dstate, n, length, VAR_C)
    if not VAR_B:  # constant B and C: their gradients are summed over positions in registers
        dB_acc = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    if not VAR_C:
        dC_acc = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    if HAS_D:
        Dv = tl.load(D_ptr + d, mask=mask_d, other=0.0)
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d, mask=mask_d, other=0.0)
    if HAS_DLAST:  # adjoint of the state, starting from the gradient of the last state
        g = tl.load(dlast_ptr + _last_state_offsets(bi, dim, dstate, tile), mask=mask,
                    other=0.0).to(tl.float32)
    else:
        g = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    dA_acc = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    dD_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    dbias_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for ci in range(0, n_chunks):
        c = n_chunks - 1 - ci
        t0 = c * chunk
        t1 = tl.minimum(t0 + chunk, length)
        h0 = tl.load(saved_ptr + _chunk_state_offsets(bi, dim, d, n_chunks, c, dstate, n),
                     mask=mask, other=0.0)
        h = h0
        for t in range(t0, t1):  # recompute the chunk's states into the scratch buffer
            ut = tl.load(u_ptr + row + t, mask=mask_d, other=0.0).to(tl.float32)
            dt = _delta(tl.load(delta_ptr + row + t, mask=mask_d, other=0.0).to(tl.float32),
                        bias, HAS_BIAS, SOFTPLUS)
            Bt = _projection_at(B_ptr, b_row, t, mask_n, B_tile, VAR_B)
            h = tl.exp(dt[:, None] * A) * h + (dt * ut)[:, None] * Bt
            tl.store(scratch + (t - t0) * tile_size, h)
        tl.debug_barrier()  # the states written above are read below by other threads
        for k in range(0, t1 - t0):
            j = t1 - t0 - 1 - k
            t = t0 + j
            ut = tl.load(u_ptr + row + t, mask=mask_d, other=0.0).to(tl.float32)
            raw = tl.load(delta_ptr + row + t, mask=mask_d, other=0.0).to(tl.float32)
            if HAS_BIAS:
                raw = raw + bias
            if SOFTPLUS:
                dt = _softplus(raw)
            else:
                dt = raw
            Bt = _projection_at(B_ptr, b_row, t, mask_n, B_tile, VAR_B)
            Ct = _projection_at(C_ptr, c_row, t, mask_n, C_tile, VAR_C)
            h_t = tl.load(scratch + j * tile_size)
            first = (tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.int32) + j) == 0
            h_prev = tl.load(scratch + (j - 1) * tile_size, mask=~first, other=0.0)
            h_prev = tl.where(first, h0, h_prev)
            dy = tl.load(dout_ptr + row + t, mask=mask_d, other=0.0).to(tl.float32)
            if HAS_Z:  # out = (y + D u) * silu(z)
                zt = tl.load(z_ptr + row + t, mask=mask_d, other=0.0).to(tl.float32)
                sz = _sigmoid(zt)
                y = tl.sum(h_t * Ct, axis=1)
                if HAS_D:
                    y += Dv * ut
                tl.store(dz_ptr + row + t, dy * y * sz * (1.0 + zt * (1.0 - sz)), mask=mask_d)
                dy = dy * zt * sz
            du_t = tl.zeros((BLOCK_D,), dtype=tl.float32)
            if HAS_D:
                dD_acc += dy * ut
                du_t = dy * Dv
            if VAR_C:
                tl.store(dC_ptr + part_row + t, tl.sum(dy[:, None] * h_t, axis=0), mask=mask_n)
            else:
                dC_acc += dy[:, None] * h_t
            g = g + dy[:, None] * Ct  # gradient w.r.t. h[t]
            dx = dt * ut
            if VAR_B:
                tl.store(dB_ptr + part_row + t, tl.sum(g * dx[:, None], axis=0), mask=mask_n)
            else:
                dB_acc += g * dx[:, None]
            a = tl.exp(dt[:, None] * A)
            gda = g * a * h_prev  # gradient w.r.t. delta[t] * A
            dA_acc += gda * dt[:, None]
            ddx = tl.sum(g * Bt, axis=1)  # gradient w.r.t. delta[t] * u[t]
            ddt = tl.sum(gda * A, axis=1) + ddx * ut
            du_t += ddx * dt
            if SOFTPLUS:
                ddt = ddt * _sigmoid(raw)
            dbias_acc += ddt
            tl.store(du_ptr + row + t, du_t, mask=mask_d)
            tl.store(ddelta_ptr + row + t, ddt, mask=mask_d)
            g = g * a  # gradient w.r.t. h[t-1]
        tl.debug_barrier()  # the next chunk overwrites the scratch states read above
    dtile = dtile_ptr + _program_slot(pid, 3, tile_size) + local
    tl.store(dtile, dA_acc)
    if not VAR_B:
        tl.store(dtile + tile_size, dB_acc)
    if not VAR_C:
        tl.store(dtile + 2 * tile_size, dC_acc)
    dvec = dvec_ptr + _program_slot(pid, 2, BLOCK_D) + tl.arange(0, BLOCK_D)
    tl.store(dvec, dD_acc)
    tl.store(dvec + BLOCK_D, dbias_acc)


class _Layout:
    """Shapes and launch grid shared by the two kernels."""

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
        self.chunk = max(1, int(chunk))
        self.n_chunks = -(-self.length // self.chunk)
        self.block_d = min(triton.next_power_of_2(max(1, int(block_d))),
                           triton.next_power_of_2(self.group_size))
        self.block_n = triton.next_power_of_2(self.dstate)
        self.blocks = -(-self.group_size // self.block_d)
        self.programs = self.batch * groups * self.blocks
        self._check_32_bit_limits(tuple(u.shape))

    def _check_32_bit_limits(self, shape: Tuple[int, ...]) -> None:
        """Refuse, before any work, what the kernels' remaining 32-bit indices cannot address:
        positions within one sequence, offsets within one program's scratch slot and the A tile,
        and the launch grid (at most 2**31 - 1 programs on CUDA)."""
        for what, value in (('positions L + chunk', self.length + self.chunk),
                            ('chunk x state tile', self.chunk * self.block_d * self.block_n),
                            ('dim x d_state', self.dim * self.dstate),
                            ('programs', self.programs)):
            if value > INT32_MAX:
                raise InputError(
                    f'the Triton selective scan cannot take u of shape {shape} (batch, dim, L): '
                    f'its {what} = {value} passes 2**31 - 1, which its 32-bit indices address. '
                    f'Split the image into tiles, or use scan_backend: torch.')

    def args(self) -> Tuple[int, ...]:
        return (self.dim, self.length, self.dstate, self.group_size, self.b_chans, self.c_chans,
                self.n_chunks, self.chunk)

    def per_channel(self, t: torch.Tensor, width: int) -> torch.Tensor:
        """Per-program partial sums (programs, width) -> (dim, ...), summed over the batch."""
        t = t.reshape(self.batch, self.dim // self.group_size, self.blocks * self.block_d, -1).sum(0)
        return t[:, :self.group_size].reshape(self.dim, -1)[:, :width]

    def per_position(self, part: torch.Tensor, groups: int) -> torch.Tensor:
        """dB/dC partial sums (programs, n, L) -> (b, groups, n, L)."""
        fine = self.dim // self.group_size
        part = part.view(self.batch, groups, fine // groups * self.blocks, self.dstate, self.length)
        return part.sum(2)


@dataclass
class KernelLaunch:
    """One kernel launch, complete: ``kernel[grid](*args, num_warps=num_warps, **constexprs)``.

    ``args`` are the kernel's non-constexpr parameters in order (tensors and Python ints; on a GPU
    Triton specialises on them: pointer alignment, ints divisible by 16, ints past 2**31 - 1 as
    int64), ``constexprs`` its constexpr parameters by name. ``outputs`` holds the tensors the
    launch writes (allocated with it), ``layout`` the shapes the caller needs afterwards."""
    name: str
    kernel: Any
    grid: Tuple[int, ...]
    args: Tuple[Any, ...]
    constexprs: Dict[str, Any]
    num_warps: int
    outputs: Dict[str, torch.Tensor] = field(default_factory=dict)
    layout: Any = None

    def run(self) -> Dict[str, torch.Tensor]:
        device = self.args[0].device
        with torch.cuda.device(device) if device.type == 'cuda' else _nothing():
            self.kernel[self.grid](*self.args, num_warps=self.num_warps, **self.constexprs)
        return self.outputs


def forward_launch(u, delta, A, B, C, D, z, delta_bias, softplus: bool, chunk: int = CHUNK,
                   block_d: int = BLOCK_D, save: bool = True) -> KernelLaunch:
    """The forward kernel's launch for these inputs (shapes and dtypes as
    :func:`selective_scan_triton`; ``save``: keep the chunk-entry states for backward).
    Outputs: ``out`` (u's dtype), ``last`` (float32 last state), ``saved`` (chunk-entry states).

    This is the one description of the launch: :class:`SelectiveScanTriton` runs it, and
    ``scripts/scan_static_report.py`` compiles it for GPUs it does not have, by calling it with
    tensors on the ``meta`` device (shapes and dtypes only, nothing allocated). So it must do
    nothing but prepare inputs, allocate outputs with ``new_empty``/``empty_like`` on the inputs'
    device and describe the launch; it must never read tensor values. A shape past the kernels'
    32-bit limits raises :class:`InputError` naming it, before any work."""
    lay = _Layout(u, A, _grouped_view(B), _grouped_view(C), chunk, block_d)  # checks limits first
    u, delta = u.contiguous(), delta.contiguous()
    z = None if z is None else z.contiguous()
    Bn, Cn = _grouped_view(B).contiguous(), _grouped_view(C).contiguous()
    A32, D32, bias32 = A.float().contiguous(), _float(D), _float(delta_bias)
    out = torch.empty_like(u)
    last = u.new_empty(lay.batch, lay.dim, lay.dstate, dtype=torch.float32)
    saved = u.new_empty(lay.batch, lay.dim, lay.n_chunks if save else 1, lay.dstate,
                        dtype=torch.float32)
    return KernelLaunch(
        'forward', _scan_forward_kernel, (lay.programs,),
        (u, delta, A32, Bn, Cn, _or(D32, A32), _or(z, u), _or(bias32, A32), out, last, saved,
         *lay.args()),
        dict(VAR_B=Bn.dim() == 4, VAR_C=Cn.dim() == 4, HAS_D=D is not None, HAS_Z=z is not None,
             HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(softplus), SAVE=bool(save),
             BLOCK_D=lay.block_d, BLOCK_N=lay.block_n),
        num_warps=1, outputs=dict(out=out, last=last, saved=saved), layout=lay)


def backward_launch(u, delta, A, B, C, D, z, delta_bias, saved: torch.Tensor, dout: torch.Tensor,
                    dlast: Optional[torch.Tensor], softplus: bool, chunk: int = CHUNK,
                    block_d: int = BLOCK_D) -> KernelLaunch:
    """The backward kernel's launch (same contract as :func:`forward_launch`): the forward's
    inputs, its ``saved`` states, the output gradient ``dout`` and the last state's gradient
    ``dlast`` (None: not needed, the kernel is compiled without that work). Outputs: ``du``,
    ``ddelta``, ``dz`` (or None), and the per-program partial sums ``dB_part``/``dC_part``
    (variable B/C, else None), ``dtile`` (dA, constant dB, dC) and ``dvec`` (dD, d delta_bias)
    that ``layout`` reduces."""
    lay = _Layout(u, A, _grouped_view(B), _grouped_view(C), chunk, block_d)  # checks limits first
    u, delta = u.contiguous(), delta.contiguous()
    z = None if z is None else z.contiguous()
    Bn, Cn = _grouped_view(B).contiguous(), _grouped_view(C).contiguous()
    A32, D32, bias32 = A.float().contiguous(), _float(D), _float(delta_bias)
    dout = dout.contiguous()
    dlast = None if dlast is None else dlast.float().contiguous()
    du, ddelta = torch.empty_like(u), torch.empty_like(delta)
    dz = None if z is None else torch.empty_like(z)
    f32 = dict(device=u.device, dtype=torch.float32)
    tile_size = lay.block_d * lay.block_n
    scratch = torch.empty(lay.programs * lay.chunk * tile_size, **f32)
    dtile = torch.zeros(lay.programs, 3, lay.block_d, lay.block_n, **f32)
    dvec = torch.zeros(lay.programs, 2, lay.block_d, **f32)
    var_b, var_c = Bn.dim() == 4, Cn.dim() == 4
    dB_part = torch.empty(lay.programs, lay.dstate, lay.length, **f32) if var_b else None
    dC_part = torch.empty(lay.programs, lay.dstate, lay.length, **f32) if var_c else None
    return KernelLaunch(
        'backward', _scan_backward_kernel, (lay.programs,),
        (u, delta, A32, Bn, Cn, _or(D32, A32), _or(z, u), _or(bias32, A32), dout, _or(dlast, A32),
         saved, scratch, du, ddelta, _or(dz, du), _or(dB_part, scratch), _or(dC_part, scratch),
         dtile, dvec, *lay.args()),
        dict(VAR_B=var_b, VAR_C=var_c, HAS_D=D is not None, HAS_Z=z is not None,
             HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(softplus), HAS_DLAST=dlast is not None,
             BLOCK_D=lay.block_d, BLOCK_N=lay.block_n),
        num_warps=1, outputs=dict(du=du, ddelta=ddelta, dz=dz, dB_part=dB_part, dC_part=dC_part,
                                  dtile=dtile, dvec=dvec),
        layout=lay)


def _grouped_view(m: torch.Tensor) -> torch.Tensor:
    """(b, n, L) -> (b, 1, n, L) (a view); (d, n) and (b, G, n, L) unchanged."""
    return m.unsqueeze(1) if m.dim() == 3 else m


def _float(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.float().contiguous()


class SelectiveScanTriton(torch.autograd.Function):
    """Autograd function over the two kernels; arguments as :func:`selective_scan_triton`."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, softplus: bool, chunk: int,
                block_d: int):  # type: ignore[override]
        if u.shape[-1] == 0:
            raise ValueError('the selective scan needs a sequence length of at least 1')
        save = any(ctx.needs_input_grad)
        # An output that no loss uses gets None in backward, not zeros: without the last
        # state's gradient (MambaIR never uses the last state) the kernel is compiled without
        # that work (HAS_DLAST=False).
        ctx.set_materialize_grads(False)
        outputs = forward_launch(u, delta, A, B, C, D, z, delta_bias, softplus, chunk, block_d,
                                 save).run()
        if save:
            ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, outputs['saved'])
            ctx.softplus, ctx.chunk, ctx.block_d = bool(softplus), chunk, block_d
        return outputs['out'], outputs['last']

    @staticmethod
    def backward(ctx, dout, dlast):  # type: ignore[override]
        u, delta, A, B, C, D, z, delta_bias, saved = ctx.saved_tensors
        if dout is None:  # only the last state is used
            dout = torch.zeros_like(u)
        launch = backward_launch(u, delta, A, B, C, D, z, delta_bias, saved, dout, dlast,
                                 ctx.softplus, ctx.chunk, ctx.block_d)
        grads, lay = launch.run(), launch.layout
        dtile, dvec = grads['dtile'], grads['dvec']
        n = lay.dstate
        dA = lay.per_channel(dtile[:, 0], n)
        dB = (lay.per_position(grads['dB_part'], _grouped_view(B).shape[1])
              if grads['dB_part'] is not None else lay.per_channel(dtile[:, 1], n))
        dC = (lay.per_position(grads['dC_part'], _grouped_view(C).shape[1])
              if grads['dC_part'] is not None else lay.per_channel(dtile[:, 2], n))
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
    (which checks them). ``chunk``: positions between saved states; ``block_d``: channels per
    program."""
    return SelectiveScanTriton.apply(u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus),
                                     int(chunk), int(block_d))


def interpreting() -> bool:
    """Whether these kernels run on Triton's CPU interpreter: TRITON_INTERPRET=1 was set before
    triton was imported (its own library functions, such as ``tl.sum``, are decorated then) and
    still when this module was."""
    return not any(isinstance(f, triton.runtime.JITFunction) for f in (_scan_forward_kernel, tl.sum))
