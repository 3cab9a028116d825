"""Pure-PyTorch selective scan with a hand-written backward.

Autograd through the recurrence would keep the decay and the state tensors, ``b*d*L*n`` floats
each, alive for every SS2D layer until backward (about 1.7 GB per layer for MambaIR classic at a
48x48 patch, batch 4). Like mamba's CUDA kernel, this function saves only its inputs and
recomputes the states in backward. Work is split into blocks of channels so that the
``(T, b, d_block, nc, n)`` temporaries stay near :data:`BLOCK_ELEMENTS` floats, which bounds
memory and keeps the data cache-friendly.

Two kernels share the autograd function. Variable (grouped) B and C, MambaIR's case, run
:class:`_TimeMajor`: the positions in intervals of :data:`CHECKPOINT_STEPS`, the whole state
cache-resident, and the state entering each interval saved for backward. Constant B or C run the
chunked scan below.

Shapes (mamba's convention): u, delta, z ``(b, d, L)``; A ``(d, n)``; B, C either ``(d, n)``
(constant) or ``(b, G, n, L)`` with G dividing d (a 3-D ``(b, n, L)`` is G=1, normalised by the
caller); D, delta_bias ``(d,)``.
"""
import math
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F

from archs.scan.linear_scan import chunk_length, decayed_previous_state_, scan_forward, scan_reverse

# Target size (in float32 elements) of one (T, b, d_block, nc, n) temporary.
BLOCK_ELEMENTS = 1 << 21
# Variable (grouped) B and C use the time-major step loop (:class:`_TimeMajor`); constant B or C
# the chunked scan. Tests switch this off to exercise the chunked scan on grouped B/C too.
TIME_MAJOR = True
# Time-major path: positions per interval (between two saved states).
CHECKPOINT_STEPS = 16
# Time-major path: side of the square tiles in which (b, d, L) <-> (L, b, d) are transposed.
TRANSPOSE_TILE = 512


@dataclass
class _Layout:
    """Chunking of the sequence and the grouping of channels shared by B and C."""
    batch: int
    dim: int
    length: int
    dstate: int
    steps: int  # T, positions per chunk
    chunks: int  # nc
    group_size: int  # channels that share one B/C slice (dim when both are constant)

    @property
    def padded(self) -> int:
        return self.steps * self.chunks

    def blocks(self) -> Iterator[Tuple[int, int]]:
        """Channel ranges that never straddle a B/C group and fit the element budget."""
        per_channel = self.batch * self.padded * self.dstate
        width = max(1, min(self.group_size, BLOCK_ELEMENTS // max(per_channel, 1)))
        for start in range(0, self.dim, self.group_size):
            end = start + self.group_size
            for d0 in range(start, end, width):
                yield d0, min(d0 + width, end)


def _make_layout(u: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> _Layout:
    batch, dim, length = u.shape
    steps = chunk_length(length)
    group = dim
    for m in (B, C):
        if m.dim() == 4:
            group = math.gcd(group, dim // m.shape[1])
    return _Layout(batch, dim, length, A.shape[1], steps, -(-length // steps), group)


def _to_chunks(t: torch.Tensor, lay: _Layout) -> torch.Tensor:
    """(b, d, L) -> (T, b, d, nc), zero-padded at the end (zero delta = identity step).

    A permuted view of a (b, d, nc*T) tensor, not a transposed copy: the block kernels read it
    broadcast over the state dimension, so its strides cost little, while a transposing copy
    of every (b, d, L) tensor would cost a sizeable share of the whole scan.
    """
    if lay.padded != lay.length:
        t = F.pad(t, (0, lay.padded - lay.length))
    return t.reshape(*t.shape[:2], lay.chunks, lay.steps).permute(3, 0, 1, 2)


def _chunk_buffer(lay: _Layout, ref: torch.Tensor) -> torch.Tensor:
    """An uninitialised (T, b, d, nc) view laid out like :func:`_to_chunks` output."""
    t = ref.new_empty(lay.batch, lay.dim, lay.chunks, lay.steps)
    return t.permute(3, 0, 1, 2)


def _from_chunks(t: torch.Tensor, lay: _Layout) -> torch.Tensor:
    """(T, b, d, nc) -> (b, d, L); a view for tensors made by :func:`_chunk_buffer`."""
    return t.permute(1, 2, 3, 0).reshape(t.shape[1], t.shape[2], lay.padded)[..., :lay.length]


def _bc_to_chunks(m: torch.Tensor, lay: _Layout) -> torch.Tensor:
    """Variable B/C (b, G, n, L) -> (T, b, G, nc, n); constant (d, n) is returned as is."""
    if m.dim() == 2:
        return m
    m = F.pad(m, (0, lay.padded - lay.length))
    b, groups, n, _ = m.shape
    return m.view(b, groups, n, lay.chunks, lay.steps).permute(4, 0, 1, 3, 2).contiguous()


def _bc_from_chunks(m: torch.Tensor, lay: _Layout) -> torch.Tensor:
    """(T, b, G, nc, n) -> (b, G, n, L)."""
    T, b, groups, nc, n = m.shape
    return m.permute(1, 2, 4, 3, 0).reshape(b, groups, n, lay.padded)[..., :lay.length]


def _bc_block(m: torch.Tensor, d0: int, d1: int, lay: _Layout) -> torch.Tensor:
    """The slice of B/C that channels [d0, d1) see, broadcastable to (T, b, db, nc, n)."""
    if m.dim() == 2:
        return m[d0:d1].view(1, 1, d1 - d0, 1, m.shape[1])
    g = d0 // (lay.dim // m.shape[2])
    return m[:, :, g:g + 1]


def _delta(delta: torch.Tensor, delta_bias: Optional[torch.Tensor], softplus: bool) -> torch.Tensor:
    if delta_bias is not None:
        delta = delta + delta_bias[:, None]
    return F.softplus(delta) if softplus else delta


class _Workspace:
    """Block-sized buffers, allocated once per call and reused by every channel block.

    Fresh large allocations are page-faulted in by the OS on first touch, which costs more than
    the arithmetic done on them; reusing the same memory also keeps it warm in the caches.
    """

    def __init__(self, lay: _Layout, ref: torch.Tensor, count: int):
        width = max(d1 - d0 for d0, d1 in lay.blocks())
        self.lay = lay
        self.size = lay.steps * lay.batch * width * lay.chunks * lay.dstate
        self.flat = [ref.new_empty(self.size) for _ in range(count)]

    def get(self, index: int, width: int) -> torch.Tensor:
        lay = self.lay
        shape = (lay.steps, lay.batch, width, lay.chunks, lay.dstate)
        return self.flat[index][:math.prod(shape)].view(shape)


def _block_states(dc: torch.Tensor, uc: torch.Tensor, dsum: torch.Tensor, A: torch.Tensor,
                  Bb: torch.Tensor, d0: int, d1: int, work: _Workspace,
                  carry: Optional[torch.Tensor] = None
                  ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decays ``a``, inputs ``delta*u`` and states ``h`` of one channel block (chunk layout).

    ``a`` and ``h`` live in workspace buffers 0 and 1. Each chunk's total decay is
    ``exp(A * sum(delta))`` (a product of decays <= 1, never exp of a positive sum).
    """
    blk = dc[:, :, d0:d1]
    Ab = A[d0:d1]
    a = torch.mul(blk.unsqueeze(-1), Ab.view(1, 1, -1, 1, Ab.shape[1]), out=work.get(0, d1 - d0))
    a.exp_()
    du = blk * uc[:, :, d0:d1]
    x = torch.mul(du.unsqueeze(-1), Bb, out=work.get(1, d1 - d0))
    if carry is None:
        decay = torch.exp(dsum[:, d0:d1].unsqueeze(-1) * Ab.unsqueeze(1))
        h, last, carry = scan_forward(a, x, decay)
    else:
        h, last, carry = scan_forward(a, x, carry=carry)
    return a, du, h, last, carry


def _accumulate_bc(acc: torch.Tensor, d0: int, d1: int, weight: torch.Tensor, t: torch.Tensor,
                   lay: _Layout) -> None:
    """Add ``sum over the block's channels of weight * t`` into the gradient of B or C.

    ``weight`` is (T, b, db, nc), ``t`` (T, b, db, nc, n). Grouped B/C: one fused multiply-add
    per channel into the group's (T, b, nc, n) slice, so no block-sized product is formed.
    """
    if acc.dim() == 2:
        acc[d0:d1] += torch.einsum('tbdc,tbdcn->dn', weight, t)
        return
    g = d0 // (lay.dim // acc.shape[2])
    target = acc[:, :, g]
    for k in range(d1 - d0):
        target.addcmul_(weight[:, :, k].unsqueeze(-1), t[:, :, k])


class SelectiveScanTorch(torch.autograd.Function):
    """Autograd function: forward as mamba's ``selective_scan_ref``, backward recomputed."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, softplus: bool):  # type: ignore[override]
        ctx.time_major = TIME_MAJOR and B.dim() == 4 and C.dim() == 4
        if ctx.time_major:
            return _TimeMajor.forward(ctx, u, delta, A, B, C, D, z, delta_bias, softplus)
        dtype_in = u.dtype
        u32, delta32 = u.float(), delta.float()
        A32, B32, C32 = A.float(), B.float(), C.float()
        bias32 = None if delta_bias is None else delta_bias.float()
        lay = _make_layout(u32, A32, B32, C32)
        dc = _to_chunks(_delta(delta32, bias32, softplus), lay)
        dsum = dc.sum(0)
        uc = _to_chunks(u32, lay)
        Bc, Cc = _bc_to_chunks(B32, lay), _bc_to_chunks(C32, lay)
        yc = _chunk_buffer(lay, u32)
        last = u32.new_empty(lay.batch, lay.dim, lay.dstate)
        entry = u32.new_empty(lay.batch, lay.dim, lay.chunks, lay.dstate)
        work = _Workspace(lay, u32, 2)
        for d0, d1 in lay.blocks():
            _, _, h, last[:, d0:d1], entry[:, d0:d1] = _block_states(
                dc, uc, dsum, A32, _bc_block(Bc, d0, d1, lay), d0, d1, work)
            torch.sum(h.mul_(_bc_block(Cc, d0, d1, lay)), -1, out=yc[:, :, d0:d1])
        del work
        y = _from_chunks(yc, lay)
        out = y if D is None else torch.addcmul(y, u32, D.float()[:, None])
        if z is not None:
            out = out * F.silu(z.float())
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias)
        ctx.softplus = softplus
        # The state entering every chunk (1/T of the states' size): backward rebuilds the states
        # from it in one pass instead of rerunning the two-level scan.
        ctx.entry = entry
        return out.to(dtype_in), last

    @staticmethod
    def backward(ctx, dout, dlast):  # type: ignore[override]
        if ctx.time_major:
            return _TimeMajor.backward(ctx, dout, dlast)
        u, delta, A, B, C, D, z, delta_bias = ctx.saved_tensors
        u32, delta32, A32 = u.float(), delta.float(), A.float()
        B32, C32 = B.float(), C.float()
        bias32 = None if delta_bias is None else delta_bias.float()
        lay = _make_layout(u32, A32, B32, C32)
        raw = delta32 if bias32 is None else delta32 + bias32[:, None]
        delta_pos = F.softplus(raw) if ctx.softplus else raw
        dc, uc = _to_chunks(delta_pos, lay), _to_chunks(u32, lay)
        dsum = dc.sum(0)
        dsum_rev = dsum - dc[0]  # decay a[1] * ... * a[T-1] of the reverse scan
        Bc, Cc = _bc_to_chunks(B32, lay), _bc_to_chunks(C32, lay)
        dout = dout.float()
        dy = dout if z is None else dout * F.silu(z.float())
        dyc = _to_chunks(dy, lay)
        dA = torch.zeros_like(A32)
        dBc, dCc = torch.zeros_like(Bc), torch.zeros_like(Cc)
        ddc, duc = _chunk_buffer(lay, u32), _chunk_buffer(lay, u32)
        yc = _chunk_buffer(lay, u32) if z is not None else None
        work = _Workspace(lay, u32, 3)
        for d0, d1 in lay.blocks():
            Bb, Cb = _bc_block(Bc, d0, d1, lay), _bc_block(Cc, d0, d1, lay)
            Ab = A32[d0:d1]
            a, du, h, _, _ = _block_states(dc, uc, dsum, A32, Bb, d0, d1, work, ctx.entry[:, d0:d1])
            if yc is not None:
                yc[:, :, d0:d1] = torch.mul(h, Cb, out=work.get(2, d1 - d0)).sum(-1)
            dyb = dyc[:, :, d0:d1]
            _accumulate_bc(dCc, d0, d1, dyb, h, lay)
            g = torch.mul(dyb.unsqueeze(-1), Cb, out=work.get(2, d1 - d0))
            if dlast is not None:
                g[-1, :, :, -1] += dlast[:, d0:d1].float()
            decay = torch.exp(dsum_rev[:, d0:d1].unsqueeze(-1) * Ab.unsqueeze(1))
            g = scan_reverse(a, g, decay)
            da = decayed_previous_state_(h, a).mul_(g)  # gradient w.r.t. delta * A, in h's buffer
            blk = dc[:, :, d0:d1]
            dA[d0:d1] += (blk.unsqueeze(-2) @ da).sum(dim=(0, 1)).squeeze(-2)
            ddelta_b = da.mul_(Ab.view(1, 1, -1, 1, Ab.shape[1])).sum(-1)
            _accumulate_bc(dBc, d0, d1, du, g, lay)
            ddu = g.mul_(Bb).sum(-1)  # gradient w.r.t. delta * u
            ddc[:, :, d0:d1] = ddelta_b.addcmul_(ddu, uc[:, :, d0:d1])
            torch.mul(ddu, blk, out=duc[:, :, d0:d1])
        del work
        y = None if yc is None else _from_chunks(yc, lay)
        ddelta = _from_chunks(ddc, lay)
        du_total = _from_chunks(duc, lay)
        grads = _outer_grads(ctx, dout, du_total, ddelta, raw, y, u32, z, D)
        dD, dz, du_total, ddelta, dbias = grads
        dB = dBc if B32.dim() == 2 else _bc_from_chunks(dBc, lay)
        dC = dCc if C32.dim() == 2 else _bc_from_chunks(dCc, lay)
        return (du_total.to(u.dtype), ddelta.to(delta.dtype), dA.to(A.dtype), dB.to(B.dtype),
                dC.to(C.dtype), None if D is None else dD.to(D.dtype),
                None if z is None else dz.to(z.dtype),
                None if delta_bias is None else dbias.to(delta_bias.dtype), None)


def _outer_grads(ctx, dout: torch.Tensor, du: torch.Tensor, ddelta: torch.Tensor,
                 raw: torch.Tensor, y: Optional[torch.Tensor], u: torch.Tensor,
                 z: Optional[torch.Tensor], D: Optional[torch.Tensor]) -> List[Optional[torch.Tensor]]:
    """Gradients of the parts outside the recurrence: D skip, z gate, softplus, delta bias."""
    dD = dz = None
    if z is not None:
        z32 = z.float()
        out = y if D is None else y + u * D.float()[:, None]
        sig = torch.sigmoid(z32)
        dz = dout * out * sig * (1 + z32 * (1 - sig))
        dout = dout * z32 * sig
    if D is not None:
        dD = (dout * u).sum(dim=(0, 2))
        du = du.addcmul_(dout, D.float()[:, None])  # du and ddelta are this call's own buffers
    if ctx.softplus:
        ddelta = ddelta.mul_(torch.sigmoid(raw))
    dbias = ddelta.sum(dim=(0, 2))
    return [dD, dz, du, ddelta, dbias]


class _TimeMajor:
    """Selective scan for variable B, C ``(b, G, n, L)``: time-major, one interval at a time.

    The chunked scan above streams every ``(T, b, d_block, nc, n)`` block through memory about
    twenty times, which makes it memory-bound. Here the state of *all* channels, ``(b, G, n, d/G)``
    (``b*d*n`` floats, 368 KB at MambaIR's classic shapes), is small enough to stay in cache, and
    the positions are walked in intervals of :data:`CHECKPOINT_STEPS` (:class:`_Interval`). Work
    that does not depend on the previous state is done once per interval, as a few large
    operations that split well across threads: the decays ``exp(delta*A)``, the inputs
    ``delta*u*B``, ``y = C h`` and the gradient of C as batched matrix-vector products (laying the
    state out with the channel innermost turns every reduction over the state or channel
    dimension into one). Only the recurrence and its adjoint run position by position. Nothing of
    size ``b*d*n*L`` is ever stored. As in the sequential recurrence, only the decays
    ``exp(delta*A) <= 1`` are formed, so strong decay cannot overflow. ``(b, d, L)`` tensors are
    moved to and from the time-major ``(L, b, d)`` layout by :func:`_transpose_into`.

    Forward saves the state entering every interval, and delta (after bias and softplus) and u
    time-major. Backward walks the intervals from the end: it recomputes the interval's decays
    and states from its saved state (``2 * CHECKPOINT_STEPS`` state-sized buffers), then runs
    the adjoint recurrence ``g[l] = C[l] dy[l] + a[l+1] g[l+1]`` back through the interval with
    ``g`` and the per-position gradients cache-resident. Large ``(L, b, d)`` buffers are reused
    where possible: fresh ones are slow to page in.
    """

    @staticmethod
    def _groups(dim: int, B: torch.Tensor, C: torch.Tensor, A: torch.Tensor) -> Tuple[int, int, int]:
        """(G, d/G, n) with G the finer of the groupings of B and C."""
        groups = B.shape[1] * C.shape[1] // math.gcd(B.shape[1], C.shape[1])
        return groups, dim // groups, A.shape[1]

    @staticmethod
    def _bc(m: torch.Tensor, groups: int) -> torch.Tensor:
        """(b, G', n, L) -> float32 (L, b, G, n, 1), each of the G' groups repeated G/G' times."""
        m = m.float().repeat_interleave(groups // m.shape[1], dim=1)
        return m.permute(3, 0, 1, 2).contiguous().unsqueeze(-1)

    @staticmethod
    def _a_log2e(A: torch.Tensor, groups: int) -> torch.Tensor:
        """A * log2(e) as (G, n, dg): the decay is formed as exp2(delta * A * log2(e)), because
        ATen's float32 exp2 is about 2.7x faster than its exp on CPU. Rounding the product costs
        at most about |delta*A| * 6e-8 relative error in a decay (below 2e-7 for |delta*A| < 3)."""
        dim, n = A.shape
        a2 = A.float() * math.log2(math.e)
        return a2.view(groups, dim // groups, n).transpose(1, 2).contiguous()

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, softplus):
        dtype_in = u.dtype
        batch, dim, length = u.shape
        groups, dg, n = _TimeMajor._groups(dim, B, C, A)
        steps = CHECKPOINT_STEPS
        dl = _to_time_major(delta)  # (L, b, d) float32
        if delta_bias is not None:
            dl.add_(delta_bias.float())
        raw, dl = dl, (F.softplus(dl) if softplus else dl)
        ul = _to_time_major(u)
        shape = (length, batch, groups, 1, dg)
        # delta*u, in the pre-softplus buffer when that is free (fresh large buffers are slow to
        # page in); y overwrites it one interval at a time.
        du = torch.mul(dl, ul, out=raw if softplus else None).view(shape)
        del raw
        At2 = _TimeMajor._a_log2e(A, groups)
        Bt, Ct = _TimeMajor._bc(B, groups), _TimeMajor._bc(C, groups)
        intervals = -(-length // steps)
        keep = any(ctx.needs_input_grad)  # under no_grad only the running state is kept
        # The state entering each interval, from which backward recomputes the interval.
        saved = dl.new_empty(intervals if keep else 1, batch, groups, n, dg)
        entry = saved[0].zero_()
        work = _Interval(entry, steps)
        for c in range(intervals):
            s0, s1 = c * steps, min(length, (c + 1) * steps)
            hs = work.states(dl.view(shape)[s0:s1], du[s0:s1], At2, Bt[s0:s1], entry)
            y = du[s0:s1].view(-1, 1, dg)  # y overwrites delta*u, which the states no longer need
            torch.bmm(Ct[s0:s1].view(-1, 1, n), hs.view(-1, n, dg), out=y)
            if c + 1 < intervals:
                entry = saved[c + 1 if keep else 0].copy_(hs[-1])
        last = hs[-1].transpose(2, 3).reshape(batch, dim, n)
        out = _from_time_major(du, batch, dim)
        del du
        if D is not None:
            out.addcmul_(u.float(), D.float()[:, None])
        if z is not None:
            out.mul_(F.silu(z.float()))
        # Backward needs delta only after bias and softplus, and u time-major: keep those
        # (the raw delta is not kept; sigmoid(raw) = 1 - exp(-softplus(raw))).
        ctx.save_for_backward(u, A, B, C, D, z, dl, ul)
        ctx.delta_dtype = delta.dtype
        ctx.has_bias = delta_bias is not None
        ctx.bias_dtype = None if delta_bias is None else delta_bias.dtype
        ctx.softplus = softplus
        ctx.entry = saved
        return out.to(dtype_in), last

    @staticmethod
    def backward(ctx, dout, dlast):
        u, A, B, C, D, z, dl, ul = ctx.saved_tensors
        batch, dim, length = u.shape
        groups, dg, n = _TimeMajor._groups(dim, B, C, A)
        bg, steps, saved = batch * groups, CHECKPOINT_STEPS, ctx.entry
        shape = (length, batch, groups, 1, dg)
        du = torch.mul(dl, ul).view(shape)  # the gradient w.r.t. delta overwrites it
        At = A.float().view(groups, dg, n).transpose(1, 2).contiguous()
        At2 = _TimeMajor._a_log2e(A, groups)
        Bt, Ct = _TimeMajor._bc(B, groups), _TimeMajor._bc(C, groups)
        dout = dout.float()
        dy = dout if z is None else dout * F.silu(z.float())
        dyt = _to_time_major(dy).view(shape)  # the gradient w.r.t. delta*u overwrites it
        if dlast is not None:
            g = dlast.float().view(batch, groups, dg, n).transpose(2, 3).contiguous()
        else:
            g = saved.new_zeros(saved.shape[1:])
        gb = g.view(bg, n, dg)
        dA = torch.zeros_like(g)  # sum over batch and time of delta * (gradient w.r.t. delta*A)
        p = torch.empty_like(g)
        work = _Interval(g, steps)
        dB = Bt.new_empty(length, batch, groups, n)
        dC = torch.empty_like(dB)
        y = None if z is None else dl.new_empty(shape)
        dl_s, du_s, dy_s = dl.view(shape).unbind(0), du.unbind(0), dyt.unbind(0)
        B_s, C_s, h_s, a_s = Bt.unbind(0), Ct.unbind(0), work.h_s, work.a_s
        gbt = gb.transpose(1, 2)
        for c in range(saved.shape[0] - 1, -1, -1):
            s0, s1 = c * steps, min(length, (c + 1) * steps)
            hs = work.states(dl.view(shape)[s0:s1], du[s0:s1], At2, Bt[s0:s1], saved[c])
            hf = hs.view(-1, n, dg)
            if y is not None:  # the gate's gradient needs y
                torch.bmm(Ct[s0:s1].view(-1, 1, n), hf, out=y[s0:s1].view(-1, 1, dg))
            # dy as transposed (1, dg) rows: MKL's batched product is about 10x slower when given
            # the same numbers as contiguous (dg, 1) columns.
            torch.bmm(hf, dyt[s0:s1].view(-1, 1, dg).transpose(1, 2), out=dC[s0:s1].view(-1, n, 1))
            for j in range(s1 - s0 - 1, -1, -1):
                t = s0 + j
                dy_t, du_t = dy_s[t], du_s[t]
                g.addcmul_(dy_t, C_s[t])  # now the gradient w.r.t. h[t]
                torch.bmm(du_t.view(bg, 1, dg), gbt, out=dB[t].view(bg, 1, n))
                torch.bmm(B_s[t].view(bg, 1, n), gb, out=dy_t.view(bg, 1, dg))  # d(delta*u)
                g.mul_(a_s[j])  # a[t] * g: gradient w.r.t. h[t-1] from this step
                torch.mul(g, h_s[j - 1] if j else saved[c], out=p)  # gradient w.r.t. delta*A
                dA.addcmul_(p, dl_s[t])
                torch.sum(p.mul_(At), 2, keepdim=True, out=du_t)  # d(delta) through the decay
        del work, p, h_s, a_s
        ddu, ddl = dyt.view(length, batch, dim), du.view(length, batch, dim)
        ddl.addcmul_(ddu, ul)  # gradient w.r.t. delta (after softplus)
        ddu.mul_(dl)  # gradient w.r.t. u through delta*u
        du_total = _from_time_major(ddu, batch, dim)
        spare = ddu  # free now; reused below instead of fresh (slow to page in) buffers
        if ctx.softplus:  # times softplus' = sigmoid(raw) = -expm1(-softplus(raw))
            ddl.mul_(torch.neg(dl, out=spare).expm1_()).neg_()
        dbias = ddl.view(length * batch, dim).sum(0) if ctx.has_bias else None
        ddelta = _from_time_major(ddl, batch, dim)
        spare = spare.view(batch, dim, length)
        del du, dyt, ddl, ddu
        dD = dz = None
        if z is not None:
            z32 = z.float()
            out = _from_time_major(y, batch, dim)
            if D is not None:
                out.addcmul_(u.float(), D.float()[:, None])
            sig = torch.sigmoid(z32)
            dz = dout * out * sig * (1 + z32 * (1 - sig))
            dout = dout * z32 * sig
        if D is not None:
            dD = torch.mul(dout, u.float(), out=spare).sum(dim=(0, 2))
            du_total.addcmul_(dout, D.float()[:, None])
        dA = dA.sum(0).transpose(1, 2).reshape(dim, n)

        def bc_grad(m, dm):  # (L, b, G, n) -> (b, G', n, L), summed over the finer grouping
            dm = dm.permute(1, 2, 3, 0)
            return dm.reshape(batch, m.shape[1], groups // m.shape[1], n, length).sum(2)

        return (du_total.to(u.dtype), ddelta.to(ctx.delta_dtype), dA.to(A.dtype),
                bc_grad(B, dB).to(B.dtype), bc_grad(C, dC).to(C.dtype),
                None if D is None else dD.to(D.dtype), None if z is None else dz.to(z.dtype),
                None if dbias is None else dbias.to(ctx.bias_dtype), None)


class _Interval:
    """Decays and states of up to ``steps`` consecutive positions, in buffers reused by every
    interval, with each position's view made once (indexing inside the step loop would cost
    as much as the step itself)."""

    def __init__(self, state: torch.Tensor, steps: int):
        self.decays = state.new_empty(steps, *state.shape)
        self.hs = torch.empty_like(self.decays)
        self.a_s, self.h_s = self.decays.unbind(0), self.hs.unbind(0)

    def states(self, dl: torch.Tensor, du: torch.Tensor, At2: torch.Tensor, Bt: torch.Tensor,
               entry: torch.Tensor) -> torch.Tensor:
        """States h[t] = a[t] h[t-1] + delta[t] u[t] B[t] of k positions from the state entering
        them, as a view of this object's (k, b, G, n, d/G) buffer; the decays a[t] = exp(delta A)
        stay in ``self.decays``. dl, du: (k, b, G, 1, d/G); Bt: (k, b, G, n, 1).

        The decays and inputs of all k positions are each one operation over the interval (one
        large operation splits across threads far better than k small ones); only the
        recurrence runs position by position, one fused operation each.
        """
        k = dl.shape[0]
        torch.mul(dl, At2, out=self.decays[:k]).exp2_()
        torch.mul(du, Bt, out=self.hs[:k])
        prev = entry
        for a, h in zip(self.a_s[:k], self.h_s[:k]):
            prev = h.addcmul_(a, prev)
        return self.hs[:k]


def _to_time_major(t: torch.Tensor) -> torch.Tensor:
    """(b, d, L) -> new contiguous float32 (L, b, d)."""
    batch, dim, length = t.shape
    out = torch.empty(length, batch, dim, dtype=torch.float32, device=t.device)
    _transpose_into(out.view(length, batch * dim), t.reshape(batch * dim, length))
    return out


def _from_time_major(t: torch.Tensor, batch: int, dim: int) -> torch.Tensor:
    """(L, b, d) (any view of it) -> new contiguous float32 (b, d, L)."""
    length = t.shape[0]
    out = t.new_empty(batch, dim, length)
    _transpose_into(out.view(batch * dim, length), t.reshape(length, batch * dim))
    return out


def _transpose_into(out: torch.Tensor, t: torch.Tensor) -> None:
    """``out[:] = t.t()`` for 2-D tensors, copied in square tiles of :data:`TRANSPOSE_TILE`.

    ATen copies a whole transposed matrix on one thread, walking one side across thousands of
    pages at a time. Tiles touch few pages on both sides and are large enough for ATen to split
    each one across threads: at the benchmark's 5760 x 2304 into a fresh buffer, 38 ms -> 22 ms
    with 2 threads (the same 38 ms with 1).
    """
    rows, cols = out.shape
    tile = TRANSPOSE_TILE
    for i in range(0, rows, tile):
        for j in range(0, cols, tile):
            out[i:i + tile, j:j + tile].copy_(t[j:j + tile, i:i + tile].t())
