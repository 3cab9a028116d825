"""Pure-PyTorch selective scan with a hand-written backward.

Autograd through the recurrence would keep the decay and the state tensors, ``b*d*L*n`` floats
each, alive for every SS2D layer until backward (about 1.7 GB per layer for MambaIR classic at a
48x48 patch, batch 4). Like mamba's CUDA kernel, this function saves only its inputs and
recomputes the states in backward. Work is split into blocks of channels so that the
``(T, b, d_block, nc, n)`` temporaries stay near :data:`BLOCK_ELEMENTS` floats, which bounds
memory and keeps the data cache-friendly.

Shapes (mamba's convention): u, delta, z ``(b, d, L)``; A ``(d, n)``; B, C either ``(d, n)``
(constant) or ``(b, G, n, L)`` with G dividing d (a 3-D ``(b, n, L)`` is G=1, normalised by the
caller); D, delta_bias ``(d,)``.
"""
import math
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F

from archs.linear_scan import chunk_length, scan_forward, scan_reverse, times_previous_state

# Target size (in float32 elements) of one (T, b, d_block, nc, n) temporary.
BLOCK_ELEMENTS = 1 << 22


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
    """(b, d, L) -> (T, b, d, nc), zero-padded at the end (zero delta = identity step)."""
    t = F.pad(t, (0, lay.padded - lay.length))
    return t.view(*t.shape[:2], lay.chunks, lay.steps).permute(3, 0, 1, 2).contiguous()


def _from_chunks(t: torch.Tensor, lay: _Layout) -> torch.Tensor:
    """(T, b, d, nc) -> (b, d, L)."""
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


def _block_states(dc: torch.Tensor, uc: torch.Tensor, A: torch.Tensor, Bb: torch.Tensor,
                  d0: int, d1: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decays ``a``, inputs ``delta*u`` and states ``h`` of one channel block (chunk layout)."""
    blk = dc[:, :, d0:d1]
    a = torch.exp(blk.unsqueeze(-1) * A[d0:d1].view(1, 1, -1, 1, A.shape[1]))
    du = blk * uc[:, :, d0:d1]
    h, last = scan_forward(a, du.unsqueeze(-1) * Bb)
    return a, du, h, last


class SelectiveScanTorch(torch.autograd.Function):
    """Autograd function: forward as mamba's ``selective_scan_ref``, backward recomputed."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, softplus: bool):  # type: ignore[override]
        dtype_in = u.dtype
        u32, delta32 = u.float(), delta.float()
        A32, B32, C32 = A.float(), B.float(), C.float()
        bias32 = None if delta_bias is None else delta_bias.float()
        lay = _make_layout(u32, A32, B32, C32)
        dc = _to_chunks(_delta(delta32, bias32, softplus), lay)
        uc = _to_chunks(u32, lay)
        Bc, Cc = _bc_to_chunks(B32, lay), _bc_to_chunks(C32, lay)
        y = u32.new_empty(lay.batch, lay.dim, lay.length)
        last = u32.new_empty(lay.batch, lay.dim, lay.dstate)
        for d0, d1 in lay.blocks():
            _, _, h, last[:, d0:d1] = _block_states(dc, uc, A32, _bc_block(Bc, d0, d1, lay), d0, d1)
            y[:, d0:d1] = _from_chunks((h * _bc_block(Cc, d0, d1, lay)).sum(-1), lay)
        out = y if D is None else y + u32 * D.float()[:, None]
        if z is not None:
            out = out * F.silu(z.float())
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias)
        ctx.softplus = softplus
        return out.to(dtype_in), last

    @staticmethod
    def backward(ctx, dout, dlast):  # type: ignore[override]
        u, delta, A, B, C, D, z, delta_bias = ctx.saved_tensors
        u32, delta32, A32 = u.float(), delta.float(), A.float()
        B32, C32 = B.float(), C.float()
        bias32 = None if delta_bias is None else delta_bias.float()
        lay = _make_layout(u32, A32, B32, C32)
        raw = delta32 if bias32 is None else delta32 + bias32[:, None]
        delta_pos = F.softplus(raw) if ctx.softplus else raw
        dc, uc = _to_chunks(delta_pos, lay), _to_chunks(u32, lay)
        Bc, Cc = _bc_to_chunks(B32, lay), _bc_to_chunks(C32, lay)
        dout = dout.float()
        dy = dout if z is None else dout * F.silu(z.float())
        dyc = _to_chunks(dy, lay)
        dA = torch.zeros_like(A32)
        dBc, dCc = torch.zeros_like(Bc), torch.zeros_like(Cc)
        ddc, duc = torch.zeros_like(dc), torch.zeros_like(uc)
        y = u32.new_empty(lay.batch, lay.dim, lay.length) if z is not None else None
        for d0, d1 in lay.blocks():
            Bb, Cb = _bc_block(Bc, d0, d1, lay), _bc_block(Cc, d0, d1, lay)
            a, du, h, _ = _block_states(dc, uc, A32, Bb, d0, d1)
            if y is not None:
                y[:, d0:d1] = _from_chunks((h * Cb).sum(-1), lay)
            dyb = dyc[:, :, d0:d1].unsqueeze(-1)
            _accumulate_bc(dCc, d0, d1, dyb * h, lay)
            g = dyb * Cb
            if dlast is not None:
                g[-1, :, :, -1] += dlast[:, d0:d1].float()
            g = scan_reverse(a, g)
            da = times_previous_state(g, h).mul_(a)  # gradient w.r.t. delta * A
            del h
            blk = dc[:, :, d0:d1]
            # Batched matmuls over views of da: no permuted copy of the big tensor.
            ddc[:, :, d0:d1] += (da @ A32[d0:d1].unsqueeze(-1)).squeeze(-1)
            dA[d0:d1] += (blk.unsqueeze(-2) @ da).sum(dim=(0, 1)).squeeze(-2)
            del da
            _accumulate_bc(dBc, d0, d1, g * du.unsqueeze(-1), lay)
            ddu = (g * Bb).sum(-1)  # gradient w.r.t. delta * u
            ddc[:, :, d0:d1] += ddu * uc[:, :, d0:d1]
            duc[:, :, d0:d1] += ddu * blk
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


def _accumulate_bc(acc: torch.Tensor, d0: int, d1: int, prod: torch.Tensor, lay: _Layout) -> None:
    """Add a block's (T, b, db, nc, n) product into the gradient of B or C."""
    if acc.dim() == 2:
        acc[d0:d1] += prod.sum(dim=(0, 1, 3))
    else:
        g = d0 // (lay.dim // acc.shape[2])
        acc[:, :, g] += prod.sum(dim=2)


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
        du = du + dout * D.float()[:, None]
    if ctx.softplus:
        ddelta = ddelta * torch.sigmoid(raw)
    dbias = ddelta.sum(dim=(0, 2))
    return [dD, dz, du, ddelta, dbias]
