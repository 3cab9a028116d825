"""The Triton selective scan as an autograd function: the forward's launch, the chunk states it
saves, and the backward's launch with its per-batch sums added up
(:mod:`archs.scan.triton_launches` describes each launch, :mod:`archs.scan.triton_kernels` holds
the kernels).
"""
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from archs.scan.triton_kernels import _scan_forward_kernel
from archs.scan.triton_launches import backward_launch, forward_launch


class SelectiveScanTriton(torch.autograd.Function):
    """Autograd function over the kernels; arguments as :func:`selective_scan_triton`."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, softplus: bool, chunk: Optional[int],
                block_d: Optional[int], backward: bool,
                out_dtype: Optional[torch.dtype] = None):  # type: ignore[override]
        if u.shape[-1] == 0:
            raise ValueError('the selective scan needs a sequence length of at least 1')
        # An output that no loss uses gets None in backward, not zeros: without the last
        # state's gradient (MambaIR never uses the last state) the backward skips that load.
        ctx.set_materialize_grads(False)
        launch = forward_launch(u, delta, A, B, C, D, z, delta_bias, softplus, backward, chunk, block_d,
                                out_dtype)
        outputs = launch.run()
        if backward:
            ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, outputs['states'])
            # the chunk the states were saved at, not the setting at the backward's call (the
            # launch settings may change between the two: triton_launches.launch_settings)
            ctx.softplus, ctx.chunk, ctx.block_d = bool(softplus), launch.layout.chunk, block_d
            ctx.out_dtype = outputs['out'].dtype
        return outputs['out'], outputs['last']

    @staticmethod
    def backward(ctx, dout, dlast):  # type: ignore[override]
        u, delta, A, B, C, D, z, delta_bias, states = ctx.saved_tensors
        if dout is None:  # only the last state is used
            dout = torch.zeros_like(u, dtype=ctx.out_dtype)
        grads = backward_launch(u, delta, A, B, C, D, z, delta_bias, states, dout, dlast,
                                ctx.softplus, ctx.chunk, ctx.block_d).run()
        dB = _input_grad(grads['dB'], B)
        dC = _input_grad(grads['dC'], C)
        dD = None if D is None else grads['dD'].sum(0).to(D.dtype)
        dbias = None if delta_bias is None else grads['dbias'].sum(0).to(delta_bias.dtype)
        return (grads['du'], grads['ddelta'], grads['dA'].sum(0).to(A.dtype), dB, dC, dD,
                grads['dz'], dbias, None, None, None, None, None)


def _input_grad(grad: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """A B or C's gradient in its own shape and dtype: a varying one's float32 (b, G, n, L)
    sums as they are, a constant one's (b, d, n) per-batch sums added up."""
    if m.dim() == 2:
        grad = grad.sum(0)
    return grad.view(m.shape).to(m.dtype)


def selective_scan_triton(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                          C: torch.Tensor, D: Optional[torch.Tensor] = None,
                          z: Optional[torch.Tensor] = None, delta_bias: Optional[torch.Tensor] = None,
                          delta_softplus: bool = False, chunk: Optional[int] = None,
                          block_d: Optional[int] = None, out_dtype: Optional[torch.dtype] = None
                          ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(output in ``out_dtype``, default u's; last state in float32); shapes as
    :func:`archs.scan.dispatch.selective_scan` (which checks them). The kernels read every input in
    its own dtype and compute in float32, so half-precision inputs with ``out_dtype=torch.float32``
    give exactly what float32 copies of them would, without the copies; each input's gradient
    comes back in its dtype. ``chunk``: positions per iteration of the kernels' loop (a power of
    two, a constexpr); ``block_d``: channels per program (None: the defaults of
    :mod:`archs.scan.triton_launches`, read at each call)."""
    # (inside the function's forward grad mode is always off: decide here whether a backward
    # can follow, so that inference writes no chunk states)
    backward = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (u, delta, A, B, C, D, z, delta_bias))
    return SelectiveScanTriton.apply(u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus),
                                     chunk, block_d, backward, out_dtype)


def interpreting() -> bool:
    """Whether these kernels run on Triton's CPU interpreter: TRITON_INTERPRET=1 was set before
    triton was imported (its own library functions, such as ``tl.sum``, are decorated then) and
    still when this module was."""
    return not any(isinstance(f, triton.runtime.JITFunction) for f in (_scan_forward_kernel, tl.sum))
