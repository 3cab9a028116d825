"""CorGrad, the multi-source gradient-surgery baseline, as plain PyTorch (no BasicSR import).

``models/corgrad_model.py`` adapts it to BasicSR, as ``models/ldt_model.py`` does for ``ldt/``.
"""
from basicsr_ldt.corgrad.algorithm import CorGrad, CorGradConfig

__all__ = ['CorGrad', 'CorGradConfig']
