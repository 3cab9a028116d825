"""Network architectures of basicsr-ldt, registered in BasicSR's ARCH_REGISTRY on import.

``MambaIR`` (with its selective-scan kernels), ``HAT`` and ``SAFMN`` are re-implementations
whose checkpoints and outputs match the upstream repositories; see ``archs/README.md``. The
scan itself is ``archs.scan.selective_scan``.
"""
from basicsr_ldt.common import compat  # noqa: F401  (torchvision alias; must precede basicsr)

from archs.hat_arch import HAT  # noqa: E402
from archs.mambair_arch import MambaIR  # noqa: E402
from archs.safmn_arch import SAFMN  # noqa: E402

__all__ = ['HAT', 'MambaIR', 'SAFMN']
