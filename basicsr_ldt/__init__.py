"""basicsr-ldt: Layer-Decomposition Training for image super-resolution on BasicSR.

Importing this package registers the project's architectures, datasets and models into
BasicSR's registries (as BasicSR does for its own folders), so ``type:`` names in option files
resolve. ``basicsr_ldt.ldt`` is the method itself and does not depend on BasicSR.
``load_network`` and ``upscale`` are the Python API (docs/inference-and-api.md).
"""
from basicsr_ldt.common import compat  # noqa: F401  (must precede the first basicsr import)
from basicsr_ldt import data, models  # noqa: F401,E402  (registration)
import archs  # noqa: F401,E402  (MambaIR, HAT, SAFMN into ARCH_REGISTRY)
from basicsr_ldt.inference.api import load_network, upscale  # noqa: E402  (the Python API)

__all__ = ['load_network', 'upscale']
