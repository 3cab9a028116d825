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
from typing import Tuple

import torch


def chunk_length(length: int) -> int:
    """Chunk length that balances the two Python loops (T steps + L/T chunk carries)."""
    if length < 1:
        raise ValueError(f'sequence length must be >= 1, got {length}')
    return max(1, math.isqrt(length - 1) + 1)


def scan_forward(a: torch.Tensor, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Solve the recurrence from a zero state; overwrite ``x`` with the states ``h``.

    Returns ``(h, last)`` where ``last`` is the state after the final position, shape
    ``(b, d, n)``. Pass 1 only keeps each chunk's local end state and total decay (slab-sized,
    cache-resident); the carry loop turns them into true chunk entry states; pass 2 runs the
    recurrence again from those states, in place. No full-size temporary is allocated.
    """
    steps, nc = a.shape[0], a.shape[-2]
    carry = torch.zeros_like(x[0])  # (b, d, nc, n): true state entering each chunk
    if nc > 1:
        end, decay, tmp = x[0].clone(), a[0].clone(), torch.empty_like(x[0])
        for j in range(1, steps):
            torch.addcmul(x[j], a[j], end, out=tmp)
            end, tmp = tmp, end
            decay.mul_(a[j])
        for c in range(1, nc):
            torch.addcmul(end[..., c - 1, :], decay[..., c - 1, :], carry[..., c - 1, :],
                          out=carry[..., c, :])
    h = x
    h[0].addcmul_(a[0], carry)
    for j in range(1, steps):
        h[j].addcmul_(a[j], h[j - 1])
    return h, h[-1, ..., -1, :].clone()


def scan_reverse(a: torch.Tensor, dh: torch.Tensor) -> torch.Tensor:
    """Adjoint of :func:`scan_forward`: ``g[l] = dh[l] + a[l+1] * g[l+1]``, in place on ``dh``.

    ``g`` is the total gradient of the loss with respect to each state ``h[l]``; the gradient
    with respect to ``x[l]`` equals ``g[l]`` and with respect to ``a[l]`` is ``g[l] * h[l-1]``.
    Same two-pass structure as :func:`scan_forward`, running from the end.
    """
    steps, nc = a.shape[0], a.shape[-2]
    carry = torch.zeros_like(dh[0])  # (b, d, nc, n): a[next chunk start] * g[next chunk start]
    if nc > 1:
        start, decay, tmp = dh[-1].clone(), torch.ones_like(a[0]), torch.empty_like(dh[0])
        for j in range(steps - 2, -1, -1):
            torch.addcmul(dh[j], a[j + 1], start, out=tmp)
            start, tmp = tmp, start
            decay.mul_(a[j + 1])  # ends as a[1] * ... * a[T-1]
        for c in range(nc - 1, 0, -1):
            entry = torch.addcmul(start[..., c, :], decay[..., c, :], carry[..., c, :])
            torch.mul(a[0, ..., c, :], entry, out=carry[..., c - 1, :])
    g = dh
    g[-1].add_(carry)
    for j in range(steps - 2, -1, -1):
        g[j].addcmul_(a[j + 1], g[j + 1])
    return g


def times_previous_state(g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``g[l] * h[l-1]`` for every position ``l`` in chunk layout (``h[-1]`` is the zero state)."""
    out = torch.empty_like(g)
    torch.mul(g[1:], h[:-1], out=out[1:])
    torch.mul(g[0, ..., 1:, :], h[-1, ..., :-1, :], out=out[0, ..., 1:, :])
    out[0, ..., 0, :] = 0.0
    return out
