"""The selective scan (Mamba's S6) that MambaIR runs, one file per part:

* ``dispatch.py``: :func:`selective_scan`, the one entry point; checks shapes and picks a kernel
  at call time (mamba-ssm's CUDA kernel, the Triton kernels, or the torch scan);
* ``torch_scan.py``: the pure-PyTorch scan with its hand-written backward (any device), built on
  the chunked linear-recurrence scans of ``linear_scan.py``;
* ``triton_kernels.py``: the Triton kernels, one forward and one backward, each a single pass
  over the sequence (``@triton.jit`` code only);
* ``triton_launches.py``: how those kernels are launched (grid, arguments, constexprs, compiler
  options, launch defaults: chunk length, channels and warps per program), the one description that the autograd
  function, ``scripts/scan_static_report.py`` and ``scripts/bench_scan.py --sweep`` use;
* ``triton_function.py``: the autograd function over the launches.

Importing this package imports neither triton nor mamba-ssm; :mod:`archs.scan.dispatch` imports
them at the first call that needs them.
"""
from archs.scan.dispatch import selective_scan  # noqa: F401
