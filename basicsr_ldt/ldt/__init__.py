"""Layer-Decomposition Training (LDT, ICLR 2026), task-agnostic and in plain PyTorch.

No BasicSR import here: the SR model adapter is one user, a classification loop can be another.
See README.md in this folder for the equation -> function map and the phase diagram.
"""
from basicsr_ldt.ldt.algorithm import LDT, PHASES
from basicsr_ldt.ldt.config import CRITERIA, PRESETS, SR_HEAD_PATTERNS, LDTConfig, preset
from basicsr_ldt.ldt.equations import (STABLE, UNSTABLE, composite_state, dpu_coefficients,
                                       ema_exchange_, top_n_unstable, unstable_count)
from basicsr_ldt.ldt.freezing import clear_routing, route_bias_only_convs, set_trainable
from basicsr_ldt.ldt.pair import (BatchLoss, CrossFrozenPair, OptimizerFactory, average_gradients,
                                  optimizer_step, trainable_parameters)
from basicsr_ldt.ldt.precision import (AMP_DTYPES, INFERENCE_DTYPES, MixedPrecision, autocast,
                                       finite_on_all_ranks, resolve_dtype)
from basicsr_ldt.ldt.partition import (FORCE_OPTIONS, LayerRecord, Partition, build_partition, forced_layers,
                                       head_layers, matches, select)
from basicsr_ldt.ldt.statistics import GradientStatistics, all_reduce_statistics, random_statistic

__all__ = [
    'LDT', 'PHASES', 'CRITERIA', 'PRESETS', 'SR_HEAD_PATTERNS', 'LDTConfig', 'preset', 'STABLE',
    'UNSTABLE', 'composite_state', 'dpu_coefficients', 'ema_exchange_', 'top_n_unstable',
    'unstable_count', 'clear_routing', 'route_bias_only_convs', 'set_trainable', 'BatchLoss',
    'CrossFrozenPair', 'OptimizerFactory', 'average_gradients', 'optimizer_step',
    'trainable_parameters', 'FORCE_OPTIONS', 'forced_layers', 'head_layers', 'LayerRecord', 'Partition', 'build_partition', 'matches', 'select',
    'GradientStatistics', 'all_reduce_statistics', 'random_statistic', 'AMP_DTYPES', 'INFERENCE_DTYPES',
    'MixedPrecision', 'autocast', 'finite_on_all_ranks', 'resolve_dtype',
]
