"""All LDT hyperparameters in one place, validated when built.

Option files are edited by hand, so a typo must fail loudly and say what was meant instead of
silently falling back to a default: unknown keys raise with the closest valid key (difflib).
Baselines (FT, LP-FT, DeFT, LDT ablations) are presets of this one dataclass, not separate code.
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Tuple

CRITERIA = ('var', 'mean', 'var_over_mean', 'random', 'sample_var', 'fisher')
MODES = ('dual', 'single', 'alternating')
GROUPS = ('stable', 'unstable')
PARTITIONS = ('criterion', 'name')
BUFFER_SOURCES = ('primary', 'auxiliary')
PROFILE_ORDERS = ('shuffled', 'file_order')   # file_order: the official script's unshuffled loader
DEFT_GROUPINGS = ('head', 'non_layers')       # non_layers: official DeFT split, `layers.*` vs the rest

# Upsampler / prediction-head module names of the SR networks this project ships (MambaIR, HAT,
# SAFMN) and of BasicSR's MSRResNet/EDSR/RCAN. A pattern matches a parameter name exactly, by
# fnmatch glob, or as a module prefix (``conv_last`` matches ``conv_last.weight``).
SR_HEAD_PATTERNS: Tuple[str, ...] = (
    'conv_before_upsample', 'upsample', 'upconv*', 'conv_hr', 'conv_last', 'to_img')


def reject_unknown_keys(options: Mapping[str, Any], valid: Sequence[str], owner: str) -> None:
    """Raise on the first key not in ``valid``, suggesting the closest valid one (difflib)."""
    for key in options:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f'; valid keys: {", ".join(valid)}'
            raise ValueError(f"unknown {owner} option '{key}'{hint}")


@dataclass(frozen=True)
class LDTConfig:
    """Hyperparameters of LDT and of the baselines expressed with the same machinery.

    Iterations are counted from 1 (BasicSR's ``current_iter``): iterations
    ``1..head_warmup_iters`` warm the head up, the next ``profile_iters`` profile gradients, the rest
    train (``dual`` = cross-frozen primary/auxiliary pair, ``single`` = plain fine-tuning,
    ``alternating`` = LDT-S: one network, the groups train in turn for ``interval_iters`` each).
    """

    mode: str = 'dual'
    head_warmup_iters: int = 0
    head_patterns: Tuple[str, ...] = SR_HEAD_PATTERNS
    profile_iters: int = 300           # official code: N = 300 batches
    criterion: str = 'var'
    partition: str = 'criterion'       # 'name': head unstable, backbone stable (DeFT)
    partition_file: Optional[str] = None
    ratio_u: Optional[float] = 0.4     # paper Table 9 best (0.4 reproduces Tables 1/4)
    ratio_s: Optional[float] = None    # stable share instead (official Par_ratio = 0.5); excludes ratio_u
    force_stable: Tuple[str, ...] = ()
    force_unstable: Tuple[str, ...] = ()
    dpu: bool = True
    w_base_stable: float = 0.99
    r_base_stable: float = 0.01
    w_base_unstable: float = 0.999
    r_base_unstable: float = 0.001
    w_fixed: float = 0.99
    ema_every: int = 10
    seed: int = 0
    buffers_from: str = 'primary'
    profile_order: str = 'shuffled'
    profile_counts_in_total_iter: bool = True
    deft_grouping: str = 'head'
    interval_iters: int = 100          # LDT-S: iterations per group before the frozen group swaps
    first_group: str = 'stable'        # LDT-S: group trained in the first interval (LDT's primary)

    def __post_init__(self) -> None:
        for key in ('head_patterns', 'force_stable', 'force_unstable'):
            value = getattr(self, key)
            if isinstance(value, str):
                value = (value,)
            object.__setattr__(self, key, tuple(value))
        _validate(self)

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> 'LDTConfig':
        """Build from an option mapping (a YAML section); unknown keys raise with a suggestion."""
        reject_unknown_keys(options, [f.name for f in dataclasses.fields(cls)], 'LDT')
        options = dict(options)
        if options.get('ratio_s') is not None:  # "given" = present and not null
            if options.get('ratio_u') is not None:
                raise ValueError("give either 'ratio_u' (unstable share) or 'ratio_s' (stable share), not both")
            options['ratio_u'] = None
        return cls(**options)

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}

    @property
    def counted_profile_iters(self) -> int:
        """Iterations of ``total_iter`` the profiling phase occupies (0 when it runs before training)."""
        return self.profile_iters if self.profile_counts_in_total_iter else 0

    def needs_profiling(self) -> bool:
        """Whether the partition or the DPU coefficients depend on gradient statistics."""
        if self.mode == 'single' or self.partition_file is not None:
            return False
        # DPU ranks by the partition criterion's statistic; 'random' draws it from the seed.
        if self.criterion == 'random':
            return False
        return self.partition == 'criterion' or self.dpu


def _validate(cfg: LDTConfig) -> None:
    def choice(key: str, allowed: Tuple[str, ...]) -> None:
        if getattr(cfg, key) not in allowed:
            raise ValueError(f"LDT option '{key}' must be one of {allowed}, got {getattr(cfg, key)!r}")

    choice('mode', MODES)
    choice('criterion', CRITERIA)
    choice('partition', PARTITIONS)
    choice('buffers_from', BUFFER_SOURCES)
    choice('first_group', GROUPS)
    for key in ('head_warmup_iters', 'profile_iters', 'seed'):
        value = getattr(cfg, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"LDT option '{key}' must be an integer >= 0, got {value!r}")
    for key in ('ema_every', 'interval_iters'):
        value = getattr(cfg, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"LDT option '{key}' must be an integer >= 1, got {value!r}")
    if (cfg.ratio_u is None) == (cfg.ratio_s is None):
        raise ValueError("exactly one of the LDT options 'ratio_u' and 'ratio_s' must be given (ratio_u=None "
                         f"when constructing with ratio_s), got ratio_u={cfg.ratio_u!r}, ratio_s={cfg.ratio_s!r}")
    for key in ('ratio_u', 'ratio_s'):
        value = getattr(cfg, key)
        if value is not None and not (isinstance(value, (int, float)) and 0.0 < float(value) < 1.0):
            raise ValueError(f"LDT option '{key}' must lie strictly between 0 and 1, got {value!r}")
    choice('profile_order', PROFILE_ORDERS)
    choice('deft_grouping', DEFT_GROUPINGS)
    if not isinstance(cfg.profile_counts_in_total_iter, bool):
        raise ValueError("LDT option 'profile_counts_in_total_iter' must be true or false, "
                         f'got {cfg.profile_counts_in_total_iter!r}')
    if cfg.profile_order == 'file_order' and cfg.profile_counts_in_total_iter:
        raise ValueError("profile_order 'file_order' profiles one pass of the data before training (it may hold "
                         "fewer than profile_iters batches): set 'profile_counts_in_total_iter: false'")
    if cfg.deft_grouping != 'head' and cfg.partition != 'name':
        raise ValueError(f"'deft_grouping: {cfg.deft_grouping}' applies to partition 'name' only")
    if not 0.0 <= cfg.w_fixed < 1.0:
        raise ValueError(f"LDT option 'w_fixed' must lie in [0, 1), got {cfg.w_fixed!r}")
    for group in ('stable', 'unstable'):
        base, spread = getattr(cfg, f'w_base_{group}'), getattr(cfg, f'r_base_{group}')
        if not (0.0 <= base < 1.0 and spread >= 0.0 and base + spread <= 1.0):
            raise ValueError(f"LDT options 'w_base_{group}'={base} and 'r_base_{group}'={spread} must "
                             'satisfy 0 <= w_base < 1, r_base >= 0, w_base + r_base <= 1')
    if cfg.mode in ('dual', 'alternating') and cfg.partition_file is None:
        if cfg.needs_profiling() and cfg.profile_iters < 2:
            raise ValueError(f"criterion '{cfg.criterion}' (or dpu) needs gradient statistics: set "
                             f"'profile_iters' >= 2 (got {cfg.profile_iters}), or dpu: false with "
                             "criterion 'random' / partition 'name', or a 'partition_file'")
    if cfg.partition_file is not None and cfg.profile_iters:
        raise ValueError("'partition_file' replaces profiling: set 'profile_iters' to 0")
    if cfg.mode == 'single' and cfg.profile_iters:
        raise ValueError("mode 'single' (FT / LP-FT) does not profile: set 'profile_iters' to 0")
    if cfg.head_warmup_iters and not cfg.head_patterns:
        raise ValueError("'head_warmup_iters' > 0 needs 'head_patterns' naming the head's parameters")
    if cfg.partition == 'name' and cfg.deft_grouping == 'head' and not cfg.head_patterns:
        raise ValueError("partition 'name' needs 'head_patterns' naming the head's parameters")


_PRESETS = {
    'ft': dict(mode='single', head_warmup_iters=0, profile_iters=0),
    'lp_ft': dict(mode='single', head_warmup_iters=1000, profile_iters=0),
    # DeFT (Pahk et al. 2025): head = unstable (GC of primary), backbone = stable; beta = 0.9999
    # every step; the final model is both EMA'd components, i.e. our composite.
    'deft': dict(mode='dual', head_warmup_iters=1000, partition='name', dpu=False, w_fixed=0.9999,
                 ema_every=1, profile_iters=0),
    'ldt': dict(),
    'ldt_no_dpu': dict(dpu=False),
    'ldt_mean': dict(criterion='mean'),
    'ldt_var_over_mean': dict(criterion='var_over_mean'),
    'ldt_random': dict(criterion='random'),
    # LDT-S (single network, groups frozen alternately over intervals, CPU weight buffer)
    'ldt_s': dict(mode='alternating'),
    'ldt_sample_var': dict(criterion='sample_var'),
    'ldt_fisher': dict(criterion='fisher'),
}
PRESETS = tuple(_PRESETS)


def preset(name: str, **overrides: Any) -> LDTConfig:
    """The configuration of a named method (``ft``, ``lp_ft``, ``deft``, ``ldt``, ablations)."""
    if name not in _PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ''
        raise ValueError(f"unknown LDT preset '{name}' (known: {', '.join(PRESETS)}){hint}")
    return LDTConfig.from_dict({**_PRESETS[name], **overrides})
