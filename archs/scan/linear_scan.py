"""Two-level scans of the diagonal linear recurrence ``h[l] = a[l] * h[l-1] + x[l]``.

A step-by-step Python loop over a sequence of length L costs L tiny kernel launches (and as
many autograd nodes), which is what makes a naive selective scan slow on CPU. Here the sequence
is cut into ``nc`` chunks of length ``T`` and stored chunk-major, ``(T, *batch, nc, n)``; one
loop of T steps runs every chunk at once from a zero state, keeping only each chunk's end state
and total decay, one loop of nc steps carries the true state across chunk borders, and a second
loop of T steps recomputes every chunk from its true entry state. That is about ``3 * sqrt(L)``
launches instead of L. Only products of the coefficients appear (never
``exp`` of a positive cumulative sum), so the result is as stable as the sequential loop.

All tensors here are float32 and laid out ``(T, b, d, nc, n)``; callers build that layout.
"""
import math
from typing import Optional, Tuple

import torch


def chunk_length(length: int) -> int:
    """Chunk length that balances the two Python loops (T steps + L/T chunk carries)."""
    if length < 1:
        raise ValueError(f'sequence length must be >= 1, got {length}')
    return max(1, math.isqrt(length - 1) + 1)


def scan_forward(a: torch.Tensor, x: torch.Tensor, decay: Optional[torch.Tensor] = None,
                 carry: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Solve the recurrence from a zero state; overwrite ``x`` with the states ``h``.

    Returns ``(h, last, carry)`` where ``last`` is the state after the final position, shape
    ``(b, d, n)``, and ``carry`` the true state entering each chunk, ``(b, d, nc, n)``; a
    ``carry`` saved from an earlier call on the same ``a``, ``x`` skips pass 1 and the carry loop. Pass 1 only keeps each chunk's local end state and total decay (slab-sized,
    cache-resident); the carry loop turns them into true chunk entry states; pass 2 runs the
    recurrence again from those states, in place. No full-size temporary is allocated.
    ``decay`` (optional, ``(b, d, nc, n)``) is each chunk's total decay ``a[0] * ... * a[T-1]``
    when the caller can form it cheaply (``exp(A * sum(delta))``); otherwise it is multiplied up.
    """
    steps, nc = a.shape[0], a.shape[-2]
    given = carry is not None  # entry states known: skip pass 1 and the carry loop
    if not given:
        carry = torch.zeros_like(x[0])  # (b, d, nc, n): true state entering each chunk
    if nc > 1 and not given:
        own_decay = decay is None
        end, tmp = x[0].clone(), torch.empty_like(x[0])
        if own_decay:
            decay = a[0].clone()
        a_s, x_s = a.unbind(0), x.unbind(0)  # one call instead of 2T Python-level selects
        for j in range(1, steps):
            torch.addcmul(x_s[j], a_s[j], end, out=tmp)
            end, tmp = tmp, end
            if own_decay:
                decay.mul_(a[j])
        for c in range(1, nc):
            torch.addcmul(end[..., c - 1, :], decay[..., c - 1, :], carry[..., c - 1, :],
                          out=carry[..., c, :])
    h, a_s, h_s = x, a.unbind(0), x.unbind(0)
    h_s[0].addcmul_(a_s[0], carry)
    for j in range(1, steps):
        h_s[j].addcmul_(a_s[j], h_s[j - 1])
    return h, h[-1, ..., -1, :].clone(), carry


def scan_reverse(a: torch.Tensor, dh: torch.Tensor, decay: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Adjoint of :func:`scan_forward`: ``g[l] = dh[l] + a[l+1] * g[l+1]``, in place on ``dh``.

    ``g`` is the total gradient of the loss with respect to each state ``h[l]``; the gradient
    with respect to ``x[l]`` equals ``g[l]`` and with respect to ``a[l]`` is ``g[l] * h[l-1]``.
    Same two-pass structure as :func:`scan_forward`, running from the end. ``decay`` (optional)
    is ``a[1] * ... * a[T-1]`` per chunk, as in :func:`scan_forward`.
    """
    steps, nc = a.shape[0], a.shape[-2]
    carry = torch.zeros_like(dh[0])  # (b, d, nc, n): a[next chunk start] * g[next chunk start]
    if nc > 1:
        own_decay = decay is None
        start, tmp = dh[-1].clone(), torch.empty_like(dh[0])
        if own_decay:
            decay = torch.ones_like(a[0])
        a_s, dh_s = a.unbind(0), dh.unbind(0)
        for j in range(steps - 2, -1, -1):
            torch.addcmul(dh_s[j], a_s[j + 1], start, out=tmp)
            start, tmp = tmp, start
            if own_decay:
                decay.mul_(a[j + 1])  # ends as a[1] * ... * a[T-1]
        for c in range(nc - 1, 0, -1):
            entry = torch.addcmul(start[..., c, :], decay[..., c, :], carry[..., c, :])
            torch.mul(a[0, ..., c, :], entry, out=carry[..., c - 1, :])
    g, a_s, g_s = dh, a.unbind(0), dh.unbind(0)
    g_s[-1].add_(carry)
    for j in range(steps - 2, -1, -1):
        g_s[j].addcmul_(a_s[j + 1], g_s[j + 1])
    return g


def times_previous_state(g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``g[l] * h[l-1]`` for every position ``l`` in chunk layout (``h[-1]`` is the zero state)."""
    out = torch.empty_like(g)
    torch.mul(g[1:], h[:-1], out=out[1:])
    torch.mul(g[0, ..., 1:, :], h[-1, ..., :-1, :], out=out[0, ..., 1:, :])
    out[0, ..., 0, :] = 0.0
    return out


def decayed_previous_state_(h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Overwrite the states ``h`` with ``a[l] * h[l-1]`` (chunk layout; the state before the
    first position is zero). Times the adjoint ``g`` this is the gradient w.r.t. ``delta * A``."""
    prev_last = h[-1, ..., :-1, :].clone()  # state at the end of each chunk but the last
    h_s, a_s = h.unbind(0), a.unbind(0)
    for j in range(h.shape[0] - 1, 0, -1):  # downwards, so h[j-1] is still a state when read
        torch.mul(h_s[j - 1], a_s[j], out=h_s[j])
    torch.mul(prev_last, a[0, ..., 1:, :], out=h[0, ..., 1:, :])
    h[0, ..., 0, :] = 0.0
    return h
