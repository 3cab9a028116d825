"""Make ``basicsr==1.4.2`` importable on current torchvision.

BasicSR 1.4.2 imports ``torchvision.transforms.functional_tensor``, a private module that
torchvision removed in 0.17. Importing any ``basicsr`` submodule imports all of BasicSR, so the
alias has to exist before the first ``import basicsr``; every entry point of this project imports
this module first (``import basicsr_ldt`` does it for you).
"""
import sys
import types


def install_torchvision_alias() -> None:
    """Register ``torchvision.transforms.functional_tensor`` if torchvision no longer has it."""
    name = 'torchvision.transforms.functional_tensor'
    if name in sys.modules:
        return
    try:
        import torchvision.transforms.functional_tensor  # noqa: F401  (old torchvision)
        return
    except ImportError:
        pass
    from torchvision.transforms import functional

    alias = types.ModuleType(name)
    alias.rgb_to_grayscale = functional.rgb_to_grayscale
    sys.modules[name] = alias


install_torchvision_alias()
