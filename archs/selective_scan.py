"""Selective scan (Mamba S6) with a choice of kernel.

MambaIR needs mamba's ``selective_scan_fn``, whose CUDA extension (package ``mamba-ssm``) only
builds on GPU machines. :func:`selective_scan` has the same signature and semantics as mamba's
``selective_scan_ref`` and picks a kernel at call time:

* ``'cuda'``: mamba-ssm's fused kernel (CUDA tensors, mamba-ssm installed);
* ``'torch'``: :class:`archs.scan_torch.SelectiveScanTorch`, pure PyTorch, any device;
* ``'auto'`` (default): ``'cuda'`` when mamba-ssm imports and the input is on a GPU, else
  ``'torch'``.

The choice comes from the ``backend`` argument (MambaIR's ``scan_backend`` option), else from
the environment variable :data:`BACKEND_ENV` (``BASICSR_LDT_SCAN``), else ``'auto'``.
"""
import os
from typing import Callable, Optional, Tuple, Union

import torch

from archs.scan_torch import SelectiveScanTorch

BACKEND_ENV = 'BASICSR_LDT_SCAN'
BACKENDS = ('auto', 'torch', 'cuda')

_cuda_fn: Optional[Callable] = None
_cuda_error: Optional[str] = None


def _load_cuda_kernel() -> Optional[Callable]:
    """Import mamba-ssm's fused kernel once; remember why it failed so errors can say so."""
    global _cuda_fn, _cuda_error
    if _cuda_fn is None and _cuda_error is None:
        try:
            from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
            _cuda_fn = selective_scan_fn
        except (ImportError, OSError) as err:  # missing package or an unloadable .so
            _cuda_error = f'{type(err).__name__}: {err}'
    return _cuda_fn


def resolve_backend(backend: Optional[str] = None) -> str:
    """The configured backend name: the argument, else $BASICSR_LDT_SCAN, else 'auto'."""
    name = backend if backend is not None else os.environ.get(BACKEND_ENV, 'auto')
    name = name.strip().lower()
    if name not in BACKENDS:
        source = 'scan_backend' if backend is not None else f'${BACKEND_ENV}'
        raise ValueError(f'{source}={name!r}: expected one of {", ".join(BACKENDS)}')
    return name


def select_kernel(backend: Optional[str], device: torch.device) -> str:
    """Which kernel runs for tensors on ``device``: 'torch' or 'cuda'."""
    name = resolve_backend(backend)
    if name == 'torch':
        return 'torch'
    if name == 'auto':
        return 'cuda' if device.type == 'cuda' and _load_cuda_kernel() is not None else 'torch'
    if _load_cuda_kernel() is None:
        raise ImportError('selective scan backend "cuda" needs the optional package mamba-ssm '
                          f'(pip install mamba-ssm; GPU only), which failed to import: {_cuda_error}. '
                          f'Use backend "torch" or "auto" (scan_backend / ${BACKEND_ENV}).')
    if device.type != 'cuda':
        raise ValueError(f'selective scan backend "cuda" needs CUDA tensors, got tensors on {device}')
    return 'cuda'


def _check_shapes(u, delta, A, B, C, D, z, delta_bias) -> None:
    if u.dim() != 3 or delta.shape != u.shape:
        raise ValueError(f'u and delta must both be (batch, dim, length); got u {tuple(u.shape)}, '
                         f'delta {tuple(delta.shape)}')
    batch, dim, length = u.shape
    if A.is_complex() or A.dim() != 2 or A.shape[0] != dim:
        raise ValueError(f'A must be a real (dim={dim}, dstate) tensor; got {tuple(A.shape)} {A.dtype}')
    dstate = A.shape[1]
    for name, m in (('B', B), ('C', C)):
        ok = {2: lambda: tuple(m.shape) == (dim, dstate),
              3: lambda: tuple(m.shape) == (batch, dstate, length),
              4: lambda: (m.shape[0], m.shape[2], m.shape[3]) == (batch, dstate, length)
              and m.shape[1] > 0 and dim % m.shape[1] == 0}.get(m.dim(), lambda: False)()
        if not ok or m.is_complex():
            raise ValueError(f'{name} must be real ({dim}, {dstate}), ({batch}, {dstate}, {length}) or '
                             f'({batch}, G, {dstate}, {length}) with G dividing {dim}; got {tuple(m.shape)}')
    for name, v in (('D', D), ('delta_bias', delta_bias)):
        if v is not None and tuple(v.shape) != (dim,):
            raise ValueError(f'{name} must have shape ({dim},); got {tuple(v.shape)}')
    if z is not None and z.shape != u.shape:
        raise ValueError(f'z must have the shape of u {tuple(u.shape)}; got {tuple(z.shape)}')


def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: Optional[torch.Tensor] = None, z: Optional[torch.Tensor] = None,
                   delta_bias: Optional[torch.Tensor] = None, delta_softplus: bool = False,
                   return_last_state: bool = False, backend: Optional[str] = None
                   ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """``y = C h + D u`` (times ``silu(z)``) with ``h[l] = exp(delta[l] A) h[l-1] + delta[l] B[l] u[l]``.

    Argument meaning, shapes and return value are those of mamba's ``selective_scan_ref``
    (real A only); ``backend`` is 'auto' | 'torch' | 'cuda' (see the module docstring).
    """
    _check_shapes(u, delta, A, B, C, D, z, delta_bias)
    if select_kernel(backend, u.device) == 'cuda':
        return _cuda_fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
    if B.dim() == 3:
        B = B.unsqueeze(1)
    if C.dim() == 3:
        C = C.unsqueeze(1)
    out, last = SelectiveScanTorch.apply(u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus))
    return (out, last) if return_last_state else out
