"""Selective scan (Mamba S6) with a choice of kernel.

MambaIR needs mamba's ``selective_scan_fn``, whose CUDA extension (package ``mamba-ssm``) only
builds on GPU machines. :func:`selective_scan` has the same signature and semantics as mamba's
``selective_scan_ref`` and picks a kernel at call time:

* ``'cuda'`` (alias ``'mamba_ssm'``): mamba-ssm's fused kernel (CUDA tensors, mamba-ssm installed);
* ``'triton'``: :mod:`archs.scan.triton_function`, single-pass Triton kernels (CUDA
  tensors; CPU tensors too when ``TRITON_INTERPRET=1``, which the tests use);
* ``'torch'``: :class:`archs.scan.torch_scan.SelectiveScanTorch`, pure PyTorch, any device;
* ``'auto'`` (default): for CUDA tensors ``'cuda'`` when mamba-ssm imports, else ``'triton'``
  when triton imports, else ``'torch'``; for any other device ``'torch'``.

Triton compiles its kernels and builds their C launcher at the first call, which can fail on a
GPU machine where the import worked (no C compiler in the image, a ptxas that rejects the
code). So the first call on each device that runs the Triton kernel checks it: one forward (and
backward, when gradients are wanted) on detached copies of the call's own inputs. When that
fails, ``'auto'`` logs one warning naming the cause and runs the torch scan on that device from
then on (Triton is not tried again); a forced ``'triton'`` stops with one line naming the option
(:class:`ScanKernelFailed`). See :func:`checked_kernel`.

The choice comes from the ``backend`` argument (MambaIR's ``scan_backend`` option), else from
the environment variable :data:`BACKEND_ENV` (``BASICSR_LDT_SCAN``), else ``'auto'``. mamba-ssm
and triton are imported only when a call needs them, never on import, so that neither is
required and tests can set ``TRITON_INTERPRET`` before triton is first imported.
"""
import logging
import os
import re
import subprocess
from importlib import metadata
from typing import Callable, Dict, Optional, Sequence, Set, Tuple, Union

import torch

from archs.scan.torch_scan import SelectiveScanTorch
from basicsr_ldt.common.errors import InputError

BACKEND_ENV = 'BASICSR_LDT_SCAN'
BACKENDS = ('auto', 'torch', 'triton', 'cuda')
ALIASES = {'mamba_ssm': 'cuda', 'mamba-ssm': 'cuda'}
OPTION_KEY = 'network_g.scan_backend'
# What 'auto' tries, in order, for CUDA tensors (any other device runs 'torch').
AUTO_ORDER = ('cuda (mamba-ssm)', 'triton', 'torch')


class ScanBackendUnavailable(InputError, ImportError):
    """A forced backend whose package does not import (an ImportError and an InputError)."""


class ScanKernelFailed(InputError, RuntimeError):
    """A forced Triton backend whose kernel failed to compile or launch at its first call."""


_cuda_fn: Optional[Callable] = None
_cuda_error: Optional[str] = None
_triton_module = None
_triton_error: Optional[str] = None
_logged: Set[Tuple[str, str, str]] = set()
# First-call check of the Triton kernel, per device (str) and compiled variant (the call's dtypes,
# which inputs are given, B's and C's forms, softplus, the output dtype): what was checked
# ('forward', 'backward') and, for devices where it failed, the cause ('auto' runs torch there).
_triton_checked: Set[Tuple[str, str, Tuple]] = set()
_triton_failed: Dict[str, str] = {}


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


def _load_triton():
    """Import :mod:`archs.scan.triton_function` (and so triton) once; remember why it failed."""
    global _triton_module, _triton_error
    if _triton_module is None and _triton_error is None:
        try:
            import archs.scan.triton_function as module
            _triton_module = module
        except (ImportError, OSError, RuntimeError) as err:  # no triton, or a broken install
            _triton_error = f'{type(err).__name__}: {err}'
    return _triton_module


def _source(backend: Optional[str]) -> str:
    return OPTION_KEY if backend is not None else f'${BACKEND_ENV}'


def resolve_backend(backend: Optional[str] = None) -> str:
    """The configured backend name: the argument, else $BASICSR_LDT_SCAN, else 'auto'."""
    name = backend if backend is not None else os.environ.get(BACKEND_ENV, 'auto')
    name = name.strip().lower()
    name = ALIASES.get(name, name)
    if name not in BACKENDS:
        raise InputError(f'{_source(backend)}={name!r}: expected one of {", ".join(BACKENDS)} '
                         f'(or mamba_ssm, an alias of cuda)')
    return name


def _on_gpu(device: torch.device) -> bool:
    """Whether ``device`` gets the GPU kernels (one place, so tests can fake a GPU)."""
    return device.type == 'cuda'


def select_kernel(backend: Optional[str], device: torch.device) -> str:
    """Which kernel runs for tensors on ``device``: 'torch', 'triton' or 'cuda' (before any
    call; :func:`checked_kernel` adds the first-call check of Triton)."""
    name = resolve_backend(backend)
    on_gpu = _on_gpu(device)
    if name == 'torch':
        return 'torch'
    if name == 'auto':
        if on_gpu and _load_cuda_kernel() is not None:
            return 'cuda'
        if on_gpu and _load_triton() is not None:
            return 'triton'
        return 'torch'
    key = f'{_source(backend)}={name}'
    if name == 'triton':
        if _load_triton() is None:
            raise ScanBackendUnavailable(
                f'{key}: the Triton selective scan needs the package triton (it ships with the '
                f'Linux torch wheel), which failed to import: {_triton_error}. Use torch or auto.')
        if not on_gpu and not _triton_module.interpreting():
            raise InputError(f'{key}: the Triton selective scan needs CUDA tensors (or '
                             f'TRITON_INTERPRET=1 set before triton is imported, which runs it '
                             f'slowly on CPU), got tensors on {device}. Use torch or auto.')
        return 'triton'
    if _load_cuda_kernel() is None:
        raise ScanBackendUnavailable(
            f'{key}: selective scan backend "cuda" needs the optional package mamba-ssm '
            f'(pip install mamba-ssm; GPU only), which failed to import: {_cuda_error}. '
            f'Use triton, torch or auto.')
    if not on_gpu:
        raise InputError(f'{key}: selective scan backend "cuda" needs CUDA tensors, got tensors '
                         f'on {device}. Use torch or auto.')
    return 'cuda'


def _triton_failures() -> Tuple[type, ...]:
    """What a failed Triton compile or launch raises: triton's own errors (CompilationError,
    PTXASError, OutOfResources), RuntimeError (no C compiler, a CUDA launch error), the failed
    compiler subprocess, an unloadable launcher module."""
    try:
        from triton.errors import TritonError
    except ImportError:   # an older triton: its errors derive from these anyway
        return (RuntimeError, OSError, ImportError, subprocess.SubprocessError)
    return (TritonError, RuntimeError, OSError, ImportError, subprocess.SubprocessError)


# Triton's CPU interpreter before 3.7 turns a scalar kernel argument into a loop bound with int()
# of a one-element array, which numpy 2.4 made an error (triton-lang/triton issue 9171, fixed for
# 3.7.0 by pull request 9172). Seen here with Triton 3.6.0, the pin of torch 2.11, and numpy 2.5.2:
# every interpreted call of the kernels stops with "only 0-dimensional arrays can be converted".
INTERPRETER_FIXED_IN = (3, 7)
NUMPY_STRICT_FROM = (2, 4)


def _major_minor(version: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r'\d+', version)[:2])


def interpreter_numpy_conflict(triton_version: Optional[str] = None,
                               numpy_version: Optional[str] = None) -> Optional[str]:
    """One line saying how to fix it when this Triton's CPU interpreter (``TRITON_INTERPRET=1``,
    the kernel tests) cannot run with this numpy; None when it can or either is not installed.
    Versions default to the installed ones."""
    try:
        triton_version = triton_version or metadata.version('triton')
        numpy_version = numpy_version or metadata.version('numpy')
    except metadata.PackageNotFoundError:
        return None
    if _major_minor(triton_version) < INTERPRETER_FIXED_IN and _major_minor(numpy_version) >= NUMPY_STRICT_FROM:
        return (f"Triton {triton_version}'s CPU interpreter fails with numpy {numpy_version} (triton-lang/triton "
                f"issue 9171, fixed in Triton 3.7): pip install 'numpy<2.4' (scripts/install.sh does)")
    return None


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = lines[0] if lines else ''
    text = text if len(text) <= 300 else text[:297] + '...'
    return f'{type(err).__name__}: {text}' if text else type(err).__name__


def checked_kernel(backend: Optional[str], device: torch.device, backward: bool,
                   run_triton: Callable[[bool], None], variant: Tuple = ()) -> str:
    """:func:`select_kernel`, plus the first-call check when it picks 'triton'.

    ``run_triton(backward)`` runs the Triton kernel once (forward, and backward when
    ``backward``); it is called the first time per device and ``variant`` (what makes Triton
    compile another kernel: a bf16 training call and a float32 validation compile apart), and
    once more for the first such call that needs a backward. A failure to compile or launch makes 'auto' log one warning and
    return 'torch' for this and every later call on ``device``; a forced 'triton' raises
    :class:`ScanKernelFailed` naming the option. CUDA out-of-memory is not a kernel failure
    and propagates as it is.
    """
    kernel = select_kernel(backend, device)
    if kernel != 'triton':
        return kernel
    where = str(device)
    if where in _triton_failed:           # only 'auto' gets here: a forced backend raised
        return 'torch'
    stage = 'backward' if backward else 'forward'
    if (where, stage, variant) in _triton_checked or (where, 'backward', variant) in _triton_checked:
        return 'triton'
    try:
        run_triton(backward)
    except _triton_failures() as err:
        if isinstance(err, torch.cuda.OutOfMemoryError):
            raise
        cause = _one_line(err)
        conflict = None if _on_gpu(device) else interpreter_numpy_conflict()   # it ran interpreted
        if conflict:
            cause = f'{cause}; {conflict}'
        name = resolve_backend(backend)
        if name != 'auto':
            raise ScanKernelFailed(
                f'{_source(backend)}={name}: the Triton selective scan failed to compile or launch '
                f'on {where} at its first call ({cause}). Use auto (which then runs torch) or torch.'
            ) from err
        _triton_failed[where] = cause
        logging.getLogger('basicsr').warning(
            f'selective scan: {_source(backend)}=auto: the Triton kernel failed to compile or launch on '
            f'{where} at its first call ({cause}); using the torch scan on {where} from now on')
        return 'torch'
    _triton_checked.add((where, stage, variant))
    return 'triton'


def _triton_trial(args: Sequence[Optional[torch.Tensor]], softplus: bool, return_last_state: bool,
                  out_dtype: Optional[torch.dtype], backward: bool) -> None:
    """One Triton scan of detached copies of a call's inputs (and its backward): compiles and
    launches exactly what the call will, leaving no gradient on the caller's tensors."""
    with torch.set_grad_enabled(backward):
        copies = [None if t is None else t.detach().requires_grad_(backward and t.requires_grad)
                  for t in args]
        out, last = _triton_module.selective_scan_triton(*copies, softplus, out_dtype=out_dtype)
        if backward:
            leaves = [t for t in copies if t is not None and t.requires_grad]
            outputs = (out, last) if return_last_state else (out,)
            torch.autograd.grad(outputs, leaves, [torch.ones_like(o) for o in outputs], allow_unused=True)


def log_configuration_once(backend: Optional[str]) -> None:
    """Log the configured backend, and for 'auto' how it chooses, once per process and setting:
    called when a network is built, before the device of its tensors is known."""
    name = resolve_backend(backend)
    how = (f' (for CUDA tensors the first that imports of {" > ".join(AUTO_ORDER)}; otherwise torch)'
           if name == 'auto' else '')
    _log_once(('configured', name, ''), f'selective scan: scan_backend={name}{how}')


def _log_once(key: Tuple[str, str, str], message: str) -> None:
    if key not in _logged:
        _logged.add(key)
        logging.getLogger('basicsr').info(message)


def _log_kernel_once(backend: Optional[str], kernel: str, device: torch.device) -> None:
    """Log the kernel a configuration actually runs, the first time per process and device type."""
    name = resolve_backend(backend)
    _log_once((name, kernel, device.type),
              f'selective scan: backend {name!r} runs the {kernel!r} kernel on {device.type} tensors')


def _check_shapes(u, delta, A, B, C, D, z, delta_bias) -> None:
    # (on every call of every backend: plain comparisons of sizes, nothing built per call)
    if u.dim() != 3 or delta.shape != u.shape:
        raise ValueError(f'u and delta must both be (batch, dim, length); got u {tuple(u.shape)}, '
                         f'delta {tuple(delta.shape)}')
    batch, dim, length = u.shape
    if A.dim() != 2 or A.shape[0] != dim or A.is_complex():
        raise ValueError(f'A must be a real (dim={dim}, dstate) tensor; got {tuple(A.shape)} {A.dtype}')
    dstate = A.shape[1]
    for name, m in (('B', B), ('C', C)):
        shape = m.shape
        if len(shape) == 4:
            ok = (shape[0] == batch and shape[2] == dstate and shape[3] == length and shape[1] > 0
                  and dim % shape[1] == 0)
        elif len(shape) == 3:
            ok = shape == (batch, dstate, length)
        else:
            ok = shape == (dim, dstate)
        if not ok or m.is_complex():
            raise ValueError(f'{name} must be real ({dim}, {dstate}), ({batch}, {dstate}, {length}) or '
                             f'({batch}, G, {dstate}, {length}) with G dividing {dim}; got {tuple(shape)}')
    for name, v in (('D', D), ('delta_bias', delta_bias)):
        if v is not None and v.shape != (dim,):
            raise ValueError(f'{name} must have shape ({dim},); got {tuple(v.shape)}')
    if z is not None and z.shape != u.shape:
        raise ValueError(f'z must have the shape of u {tuple(u.shape)}; got {tuple(z.shape)}')


def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: Optional[torch.Tensor] = None, z: Optional[torch.Tensor] = None,
                   delta_bias: Optional[torch.Tensor] = None, delta_softplus: bool = False,
                   return_last_state: bool = False, backend: Optional[str] = None,
                   out_dtype: Optional[torch.dtype] = None
                   ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """``y = C h + D u`` (times ``silu(z)``) with ``h[l] = exp(delta[l] A) h[l-1] + delta[l] B[l] u[l]``.

    Argument meaning, shapes and return value are those of mamba's ``selective_scan_ref``
    (real A only); ``backend`` is 'auto' | 'torch' | 'triton' | 'cuda' (see the module
    docstring). ``out_dtype`` (not in mamba): the output is what float32 copies of every input
    give, in this dtype (None: mamba's semantics, u's dtype). MambaIR passes its bfloat16
    activations with ``torch.float32``: the Triton kernels read them as they are, the torch and
    mamba-ssm kernels get the float32 copies (mamba-ssm's output has its input's dtype).
    """
    _check_shapes(u, delta, A, B, C, D, z, delta_bias)
    if out_dtype is not None and not out_dtype.is_floating_point:
        raise ValueError(f'out_dtype must be a floating-point dtype or None; got {out_dtype}')
    args = (u, delta, A, B, C, D, z, delta_bias)
    backward = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in args)
    variant = (tuple(None if t is None else (t.dtype, t.dim()) for t in args), bool(delta_softplus), out_dtype)
    kernel = checked_kernel(backend, u.device, backward,
                            lambda bwd: _triton_trial(args, bool(delta_softplus), return_last_state,
                                                      out_dtype, bwd), variant)
    _log_kernel_once(backend, kernel, u.device)
    if kernel == 'triton':
        out, last = _triton_module.selective_scan_triton(u, delta, A, B, C, D, z, delta_bias,
                                                         bool(delta_softplus), out_dtype=out_dtype)
        return (out, last) if return_last_state else out
    if out_dtype is not None:
        u, delta, A, B, C, D, z, delta_bias = (None if t is None else t.float() for t in args)
    if kernel == 'cuda':
        result = _cuda_fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
    else:
        if B.dim() == 3:
            B = B.unsqueeze(1)
        if C.dim() == 3:
            C = C.unsqueeze(1)
        result = SelectiveScanTorch.apply(u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus))
        result = result if return_last_state else result[0]
    if out_dtype is None:
        return result
    if return_last_state:
        return result[0].to(out_dtype), result[1]
    return result.to(out_dtype)


def four_way_runs_in_triton(backend: Optional[str], device: torch.device) -> bool:
    """Whether SS2D on ``device`` should hand its four directions to the Triton kernels in one
    call (:func:`four_way_scan`): the configured backend runs Triton there, and Triton has not
    already failed there. Cheap: no kernel is compiled or run."""
    return select_kernel(backend, device) == 'triton' and str(device) not in _triton_failed


def four_way_scan(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                  D: torch.Tensor, delta_bias: torch.Tensor, height: int, delta_softplus: bool = True,
                  backend: Optional[str] = None) -> Optional[torch.Tensor]:
    """SS2D's four scans summed in row-major order, by the Triton kernels
    (:func:`archs.scan.triton_function.four_way_scan_triton` has the shapes), or None when the
    kernel for ``x``'s device is not Triton: then the caller builds the four direction copies and
    calls :func:`selective_scan`. The first call per device and variant runs the kernels once on
    detached copies, as :func:`checked_kernel` describes (a failure under 'auto' returns None
    from then on)."""
    if not four_way_runs_in_triton(backend, x.device):
        return None
    if torch.compiler.is_compiling():
        # Traced by torch.compile (archs/compile.py): the kernels are one custom operator in the
        # graph, and a trial run (a backward of its own) cannot be traced, so a compiled block
        # skips the first-call check: a kernel that fails to compile then stops with its own error.
        return _triton_module.four_way_scan_triton(x, delta, A, B, C, D, delta_bias, height, delta_softplus)
    args = (x, delta, A, B, C, D, delta_bias)
    backward = torch.is_grad_enabled() and any(t.requires_grad for t in args)
    variant = ('four_way', tuple(t.dtype for t in args), bool(delta_softplus))

    def trial(bwd: bool) -> None:
        with torch.set_grad_enabled(bwd):
            copies = [t.detach().requires_grad_(bwd and t.requires_grad) for t in args]
            out = _triton_module.four_way_scan_triton(*copies, height, delta_softplus)
            if bwd:
                leaves = [t for t in copies if t.requires_grad]
                torch.autograd.grad(out, leaves, torch.ones_like(out), allow_unused=True)

    kernel = checked_kernel(backend, x.device, backward, trial, variant)
    _log_kernel_once(backend, kernel, x.device)
    if kernel != 'triton':
        return None
    return _triton_module.four_way_scan_triton(x, delta, A, B, C, D, delta_bias, height, delta_softplus)
