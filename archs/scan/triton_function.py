"""The Triton selective scan as an autograd function: the forward's launches, the states they
save, and the backward's launches with the partial sums reduced to the inputs' gradients
(:mod:`archs.scan.triton_launches` describes each launch, :mod:`archs.scan.triton_kernels` holds
the kernels).
"""
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from archs.scan.triton_kernels import _forward_chunk_kernel
from archs.scan.triton_launches import BLOCK_D, CHUNK, backward_launch, forward_launch, grouped_view


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
        dB = (lay.per_position(grads['dB_part'], grouped_view(B).shape[1])
              if grads['dB_part'] is not None else lay.per_channel(dtile[:, 0], n))
        dC = (lay.per_position(grads['dC_part'], grouped_view(C).shape[1])
              if grads['dC_part'] is not None else lay.per_channel(dtile[:, 1], n))
        dD = None if D is None else lay.per_channel(dvec[:, 0], 1).view(-1).to(D.dtype)
        dbias = None if delta_bias is None else lay.per_channel(dvec[:, 1], 1).view(-1).to(delta_bias.dtype)
        return (grads['du'], grads['ddelta'], dA.to(A.dtype), dB.view(B.shape).to(B.dtype),
                dC.view(C.shape).to(C.dtype), dD, grads['dz'], dbias, None, None, None)


def selective_scan_triton(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                          C: torch.Tensor, D: Optional[torch.Tensor] = None,
                          z: Optional[torch.Tensor] = None, delta_bias: Optional[torch.Tensor] = None,
                          delta_softplus: bool = False, chunk: int = CHUNK, block_d: int = BLOCK_D
                          ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(output in u's dtype, last state in float32); shapes as :func:`archs.scan.dispatch.selective_scan`
    (which checks them). ``chunk``: positions per program (rounded up to whole sub-tiles of
    :data:`~archs.scan.triton_launches.SUB`, and raised so that there are at most
    :data:`~archs.scan.triton_launches.MAX_CHUNKS` chunks); ``block_d``:
    channels per program."""
    return SelectiveScanTriton.apply(u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus),
                                     int(chunk), int(block_d))


def interpreting() -> bool:
    """Whether these kernels run on Triton's CPU interpreter: TRITON_INTERPRET=1 was set before
    triton was imported (its own library functions, such as ``tl.sum``, are decorated then) and
    still when this module was."""
    return not any(isinstance(f, triton.runtime.JITFunction) for f in (_forward_chunk_kernel, tl.sum))
