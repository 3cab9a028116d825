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
from archs.scan import triton_launches
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


# SS2D's four directions in one launch each way (:func:`four_way_scan_triton`), as custom operators:
# torch.compile then keeps the kernels inside its graph as opaque calls (an autograd.Function would
# break the graph), with shapes from the fake implementations below.
_FOUR_WAY = 'basicsr_ldt::four_way_scan'


@torch.library.custom_op(f'{_FOUR_WAY}_forward', mutates_args=())
def _four_way_forward(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                      C: torch.Tensor, D: torch.Tensor, delta_bias: torch.Tensor, height: int,
                      softplus: bool, save_states: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    launch = forward_launch(x, delta, A, B, C, D, None, delta_bias, softplus, save_states, height=height)
    outputs = launch.run()
    states = outputs['states']
    return outputs['out'], (states if states is not None else x.new_empty(0, dtype=torch.float32))


@_four_way_forward.register_fake
def _(x, delta, A, B, C, D, delta_bias, height, softplus, save_states):
    batch, dim, length = delta.shape
    chunks = -(-length // triton_launches.CHUNK)
    states = (x.new_empty(batch, dim, chunks, A.shape[1], dtype=torch.float32) if save_states
              else x.new_empty(0, dtype=torch.float32))
    return x.new_empty(x.shape, dtype=torch.float32), states


@torch.library.custom_op(f'{_FOUR_WAY}_backward', mutates_args=())
def _four_way_backward(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                       C: torch.Tensor, D: torch.Tensor, delta_bias: torch.Tensor, states: torch.Tensor,
                       dout: torch.Tensor, height: int, softplus: bool, chunk: int
                       ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                  torch.Tensor, torch.Tensor]:
    grads = backward_launch(x, delta, A, B, C, D, None, delta_bias, states, dout, None, softplus, chunk,
                            height=height).run()
    return (grads['du'].to(x.dtype), grads['ddelta'], grads['dA'].sum(0).to(A.dtype),
            _input_grad(grads['dB'], B), _input_grad(grads['dC'], C), grads['dD'].sum(0).to(D.dtype),
            grads['dbias'].sum(0).to(delta_bias.dtype))


@_four_way_backward.register_fake
def _(x, delta, A, B, C, D, delta_bias, states, dout, height, softplus, chunk):
    # (contiguous, as the kernels' gradients are, whatever the strides of the views B and C)
    return tuple(t.new_empty(t.shape) for t in (x, delta, A, B, C, D, delta_bias))


def _four_way_setup(ctx, inputs, output) -> None:
    x, delta, A, B, C, D, delta_bias, height, softplus, _ = inputs
    # the chunk the states were saved at (the launch settings may change before the backward)
    ctx.height, ctx.softplus, ctx.chunk = height, softplus, triton_launches.CHUNK
    ctx.save_for_backward(x, delta, A, B, C, D, delta_bias, output[1])


def _four_way_grad(ctx, dout, _dstates):
    x, delta, A, B, C, D, delta_bias, states = ctx.saved_tensors
    if dout is None:
        dout = x.new_zeros(x.shape, dtype=torch.float32)
    grads = _four_way_backward(x, delta, A, B, C, D, delta_bias, states, dout.contiguous(), ctx.height,
                               ctx.softplus, ctx.chunk)
    return (*grads, None, None, None)


_four_way_forward.register_autograd(_four_way_grad, setup_context=_four_way_setup)


def four_way_scan_triton(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                         C: torch.Tensor, D: torch.Tensor, delta_bias: torch.Tensor, height: int,
                         delta_softplus: bool = True) -> torch.Tensor:
    """SS2D's four scans of one image, summed: the float32 (b, d, L) sum, in row-major order, of the
    selective scans of x (b, d, L; L = height x width, row-major) read in row-major order, in
    column-major order and both reversed. Direction k's delta is channels ``k d .. (k + 1) d - 1``
    of ``delta`` (b, 4 d, L), its B and C group k of B, C (b, 4, n, L), its A, D and delta_bias
    rows ``k d ..`` of A (4 d, n), D and delta_bias (4 d); every sequence is given in row-major
    order and the kernels read each direction's order by index, so no direction copy of x, y or
    their gradients is made. Inputs are read in their dtypes (bf16 too), computed in float32;
    gradients come back in each input's dtype (x's four directions added up in float32 first).
    The four directions' outputs (and x's gradients) are added with float32 atomics, so their
    last bits can vary from run to run, as mamba-ssm's dB and dC do."""
    save = torch.is_grad_enabled() and any(
        t.requires_grad for t in (x, delta, A, B, C, D, delta_bias))
    return _four_way_forward(x, delta, A, B, C, D, delta_bias, int(height), bool(delta_softplus), save)[0]
