"""All LDT hyperparameters in one place, validated when built.

Option files are edited by hand, so a typo must fail loudly and say what was meant instead of
silently falling back to a default: unknown keys raise with the closest valid key (difflib).
Baselines (FT, LP-FT, DeFT, LDT ablations) are presets of this one dataclass, not separate code.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

from basicsr_ldt.ldt.ema_horizon import reference_exchanges, run_exchanges
from basicsr_ldt.ldt.typed import (auto_or_boolean, boolean, check_options, choice, integer, number, optional, string,
                                   strings)

CRITERIA = ('var', 'mean', 'var_over_mean', 'random', 'sample_var', 'fisher')
MODES = ('dual', 'single', 'alternating', 'partial')
GROUPS = ('stable', 'unstable')
#: Modes without an EMA exchange: FT / LP-FT (no groups) and the partial control (one group trains).
ONE_GROUP_OR_NONE = ('single', 'partial')
_MODE_METHODS = {'single': 'FT / LP-FT', 'partial': 'ft_stable / ft_unstable'}
#: What mode 'partial' does not read: it has groups but no EMA, so no coefficient and no exchange.
_EMA_KEYS = ('dpu', 'w_fixed', 'ema_every', 'ema_reference_every', 'buffers_from',
             *(f'{k}_{g}' for k in ('w_base', 'r_base') for g in GROUPS))
PARTITIONS = ('criterion', 'name')
BUFFER_SOURCES = ('primary', 'auxiliary')
PROFILE_ORDERS = ('shuffled', 'file_order')   # file_order: the official script's unshuffled loader
DEFT_GROUPINGS = ('head', 'non_layers')       # non_layers: official DeFT split, `layers.*` vs the rest
OVERLAP_AUTO = 'auto'                         # overlap_branches where the branches are on CUDA
DEFAULT_OVERLAP_MEMORY = 1.0

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
    ``alternating`` = LDT-S: one network, the groups train in turn for ``interval_iters`` each;
    ``partial`` = one network of which only ``trained_group`` trains, the other group frozen at the
    start: a control, not in the paper, for what freezing alone gives).
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
    # Run length the EMA coefficients above were written for (None: use them as given); with it,
    # every W is rescaled so that each EMA averages over the same share of this run (ema_horizon).
    ema_reference_iters: Optional[int] = None
    ema_reference_every: int = 10      # the reference run's exchange interval (official LDT: 10)
    seed: int = 0
    buffers_from: str = 'primary'
    profile_order: str = 'shuffled'
    profile_counts_in_total_iter: bool = True
    deft_grouping: str = 'head'
    interval_iters: int = 100          # LDT-S: iterations per group before the frozen group swaps
    first_group: str = 'stable'        # LDT-S: group trained in the first interval (LDT's primary)
    trained_group: str = 'stable'      # mode 'partial': the one group that trains (the other keeps the start)
    # Dual mode: the auxiliary's forward runs during the primary's backward (same results; on a GPU
    # faster). 'auto': where the branches are on a CUDA device. An execution choice: a resumed run may
    # change it, as it may overlap_memory.
    overlap_branches: Union[bool, str] = OVERLAP_AUTO
    # When the branches overlap on CUDA: the auxiliary's forward waits while the GPU holds more than this
    # multiple of what it held when the primary's backward began (1.0: the sequential step's peak;
    # None: no bound, more activation memory at the peak).
    overlap_memory: Optional[float] = DEFAULT_OVERLAP_MEMORY

    def __post_init__(self) -> None:
        given = {k: v for k, v in dataclasses.asdict(self).items() if not (k in ('ratio_u', 'ratio_s') and v is None)}
        check_options('ldt', given, SPECS)
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
                raise ValueError('ldt.ratio_s: expected either ratio_u (unstable share) or ratio_s (stable share), '
                                 'not both')
            options['ratio_u'] = None
        return cls(**options)

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}

    @property
    def counted_profile_iters(self) -> int:
        """Iterations of ``total_iter`` the profiling phase occupies (0 when it runs before training)."""
        return self.profile_iters if self.profile_counts_in_total_iter else 0

    def train_iters(self, total_iters: int) -> int:
        """Iterations of ``total_iters`` left for the training phase (after warm-up and counted profiling)."""
        return total_iters - self.head_warmup_iters - self.counted_profile_iters

    def run_exchanges(self, total_iters: int) -> Dict[str, int]:
        """E_run: EMA exchanges each group receives in a run of ``total_iters`` iterations."""
        return run_exchanges(self.mode, self.train_iters(total_iters), self.ema_every, self.interval_iters,
                             self.first_group)

    def reference_exchanges(self) -> Optional[int]:
        """E_ref: exchanges of the run the coefficients were written for; None when not scaling."""
        if self.ema_reference_iters is None:
            return None
        return reference_exchanges(self.ema_reference_iters, self.ema_reference_every)

    def check_run_length(self, total_iters: int) -> None:
        """Refuse a run in which a group's EMA never moves: with no exchange that group of the composite
        (eq. 12) stays at the start, so the saved network would be partly or wholly untrained."""
        if self.mode in ONE_GROUP_OR_NONE:
            return
        exchanges = self.run_exchanges(total_iters)
        empty = [g for g, n in exchanges.items() if n < 1]
        if not empty:
            return
        spacing = f'ema_every {self.ema_every}' + (f', interval_iters {self.interval_iters}'
                                                   if self.mode == 'alternating' else '')
        left = (f'a run of {total_iters} iterations leaves {self.train_iters(total_iters)} training iterations, in '
                f'which the {" and ".join(empty)} EMA{"s get" if len(empty) > 1 else " gets"} no exchange ({spacing})')
        if self.ema_reference_iters is not None:
            raise ValueError(f'ldt.ema_reference_iters: {left}: nothing to rescale for; train longer or exchange '
                             'more often')
        key = 'interval_iters' if self.mode == 'alternating' and self.interval_iters > self.ema_every else 'ema_every'
        raise ValueError(f'ldt.{key}: {left}, so the saved network would keep the start\'s {" and ".join(empty)} '
                         'layers; train longer or exchange more often')

    def needs_profiling(self) -> bool:
        """Whether the partition or the DPU coefficients depend on gradient statistics."""
        if self.mode == 'single' or self.partition_file is not None:
            return False
        # DPU ranks by the partition criterion's statistic; 'random' draws it from the seed.
        return self.criterion != 'random' and not self.ranks_nothing()

    def reads_seed(self) -> bool:
        """Whether ``seed`` decides anything: only the 'random' criterion draws from it, and only where
        the criterion ranks (no partition file; the partition by criterion, or DPU's coefficients)."""
        return (self.mode != 'single' and self.criterion == 'random' and self.partition_file is None
                and not self.ranks_nothing())

    def ranks_nothing(self) -> bool:
        """A split by name whose layers no criterion ranks: without DPU, or in mode 'partial', which exchanges
        nothing and so has no coefficients to rank for (a partition file ranks nothing either, said apart)."""
        return (self.partition == 'name' and self.partition_file is None
                and not (self.dpu and self.mode != 'partial'))


#: Type and range of every key, one line each; cross-key rules are in :func:`_validate`.
SPECS = {
    'mode': choice(*MODES),
    'head_warmup_iters': integer(0),
    'head_patterns': strings(),
    'profile_iters': integer(0),
    'criterion': choice(*CRITERIA),
    'partition': choice(*PARTITIONS),
    'partition_file': optional(string()),
    'ratio_u': number(0, 1, '()'),     # one of the two shares is None (not given): see _validate
    'ratio_s': number(0, 1, '()'),
    'force_stable': strings(),
    'force_unstable': strings(),
    'dpu': boolean(),
    'w_base_stable': number(0, 1, '[)'),
    'r_base_stable': number(0, 1, '[]'),
    'w_base_unstable': number(0, 1, '[)'),
    'r_base_unstable': number(0, 1, '[]'),
    'w_fixed': number(0, 1, '[)'),
    'ema_every': integer(1),
    'ema_reference_iters': optional(integer(1)),
    'ema_reference_every': integer(1),
    'seed': integer(0),
    'buffers_from': choice(*BUFFER_SOURCES),
    'profile_order': choice(*PROFILE_ORDERS),
    'profile_counts_in_total_iter': boolean(),
    'deft_grouping': choice(*DEFT_GROUPINGS),
    'interval_iters': integer(1),
    'first_group': choice(*GROUPS),
    'trained_group': choice(*GROUPS),
    'overlap_branches': auto_or_boolean(),
    'overlap_memory': optional(number(1, math.inf, '[)')),
}
#: Keys that change how a run executes, not what it computes: a saved state resumes under other values.
EXECUTION_OPTIONS = frozenset({'overlap_branches', 'overlap_memory'})


def _validate(cfg: LDTConfig) -> None:
    """Rules that involve several keys (types and ranges were checked against SPECS)."""
    if (cfg.ratio_u is None) == (cfg.ratio_s is None):
        raise ValueError("ldt.ratio_s: expected exactly one of ratio_u (unstable share) and ratio_s (stable "
                         f"share), got ratio_u={cfg.ratio_u!r}, ratio_s={cfg.ratio_s!r}")
    if cfg.profile_order == 'file_order' and cfg.profile_counts_in_total_iter:
        raise ValueError("ldt.profile_counts_in_total_iter: expected false with profile_order 'file_order' (one "
                         "pass of the data before training, possibly fewer than profile_iters batches), got true")
    if cfg.overlap_branches is False and cfg.overlap_memory not in (None, DEFAULT_OVERLAP_MEMORY):
        raise ValueError(f'ldt.overlap_memory: bounds the memory of overlapped branches, and overlap_branches '
                         f'is false; expected the default {DEFAULT_OVERLAP_MEMORY} (or null) there, got '
                         f'{cfg.overlap_memory}')
    if cfg.mode != 'dual' and (cfg.overlap_branches is True or cfg.overlap_memory not in (None, DEFAULT_OVERLAP_MEMORY)):
        key, does, expected, value = (
            ('overlap_branches', 'overlaps', f"'{OVERLAP_AUTO}' or false", 'true') if cfg.overlap_branches is True
            else ('overlap_memory', 'bounds the memory of', f'the default {DEFAULT_OVERLAP_MEMORY} or null',
                  cfg.overlap_memory))
        raise ValueError(f"ldt.{key}: {does} the two branches of mode 'dual', and mode '{cfg.mode}' trains one "
                         f'network, where it would do nothing; expected {expected} there, got {value}')
    if cfg.deft_grouping != 'head' and cfg.partition != 'name':
        raise ValueError(f"ldt.deft_grouping: '{cfg.deft_grouping}' applies to partition 'name' only, "
                         f"got partition '{cfg.partition}'")
    for group in ('stable', 'unstable'):
        base, spread = getattr(cfg, f'w_base_{group}'), getattr(cfg, f'r_base_{group}')
        if base + spread > 1.0:
            raise ValueError(f'ldt.r_base_{group}: expected w_base_{group} + r_base_{group} <= 1 (eq. 10 keeps '
                             f'W <= 1), got {base} + {spread}')
    if cfg.mode != 'single' and cfg.partition_file is None:
        if cfg.needs_profiling() and cfg.profile_iters < 2:
            raise ValueError(f"ldt.profile_iters: criterion '{cfg.criterion}' (or dpu) needs gradient statistics: "
                             f"expected >= 2 (got {cfg.profile_iters}), or dpu: false with "
                             "criterion 'random' / partition 'name', or a 'partition_file'")
    if cfg.ranks_nothing() and cfg.profile_iters:
        raise ValueError(f"ldt.profile_iters: partition 'name' without dpu ranks nothing, so {cfg.profile_iters} "
                         'profiling iterations would train nothing; expected 0')
    if cfg.partition_file is not None and cfg.profile_iters:
        raise ValueError("ldt.profile_iters: expected 0 with a partition_file (it replaces profiling), "
                         f'got {cfg.profile_iters}')
    if cfg.mode == 'single' and cfg.profile_iters:
        raise ValueError("ldt.profile_iters: expected 0 with mode 'single' (FT / LP-FT do not profile), "
                         f'got {cfg.profile_iters}')
    if cfg.ema_reference_iters is not None:
        if cfg.mode in ONE_GROUP_OR_NONE:
            raise ValueError("ldt.ema_reference_iters: rescales the EMA coefficients of the cross-frozen pair or "
                             f"LDT-S; mode '{cfg.mode}' ({_MODE_METHODS[cfg.mode]}) has no EMA (got {cfg.ema_reference_iters}); for "
                             "BasicSR's weight EMA use train.ema_reference_iters")
        if cfg.partition_file is not None:
            raise ValueError('ldt.ema_reference_iters: a partition_file carries its own coefficients, used as '
                             f'written; remove one of the two (got {cfg.ema_reference_iters})')
        if cfg.ema_reference_iters < cfg.ema_reference_every:
            raise ValueError(f'ldt.ema_reference_iters: expected at least ema_reference_every '
                             f'({cfg.ema_reference_every}) iterations, i.e. one exchange, got {cfg.ema_reference_iters}')
    if cfg.head_warmup_iters and not cfg.head_patterns:
        raise ValueError("ldt.head_patterns: expected patterns naming the head's parameters when "
                         f'head_warmup_iters > 0, got {list(cfg.head_patterns)}')
    if cfg.partition == 'name' and cfg.deft_grouping == 'head' and not cfg.head_patterns:
        raise ValueError("ldt.head_patterns: expected patterns naming the head's parameters with "
                         f"partition 'name', got {list(cfg.head_patterns)}")


_GROUP_KEYS = ('criterion', 'partition', 'partition_file', 'ratio_u', 'ratio_s', 'force_stable', 'force_unstable',
               'dpu', 'w_base_stable', 'r_base_stable', 'w_base_unstable', 'r_base_unstable', 'w_fixed', 'ema_every',
               'ema_reference_every', 'buffers_from', 'profile_order', 'deft_grouping', 'interval_iters', 'first_group',
               'seed', 'trained_group')


def unread_options(cfg: LDTConfig) -> Dict[str, str]:
    """The keys ``cfg`` never reads, each with the setting that makes it so: a value given for one
    (or swept over it) would train the same run under another label."""
    unread = {}
    if not cfg.head_warmup_iters and (cfg.partition, cfg.deft_grouping) != ('name', 'head'):
        unread['head_patterns'] = "head_warmup_iters 0 and no split by the head's name (DeFT): no head is chosen"
    if not cfg.profile_iters:
        unread.update({key: 'profile_iters 0: nothing is profiled' for key in ('profile_order',
                                                                                'profile_counts_in_total_iter')})
    if cfg.mode == 'single':
        return {**unread, **{key: "mode 'single' (FT, LP-FT) trains one network without groups" for key in _GROUP_KEYS}}
    if cfg.partition_file is not None:     # the file holds each layer's group and coefficient
        unread.update({key: 'a partition_file gives the groups and their coefficients' for key in (
            'criterion', 'force_stable', 'force_unstable', 'partition', 'deft_grouping', 'ratio_u', 'ratio_s', 'dpu',
            'w_fixed', *(f'{k}_{g}' for k in ('w_base', 'r_base') for g in GROUPS))})
    else:
        if cfg.ranks_nothing():
            unread['criterion'] = "partition 'name' without dpu ranks nothing"
        if cfg.partition == 'name':
            unread.update({key: "partition 'name' splits by name (DeFT)" for key in ('ratio_u', 'ratio_s')})
        if cfg.dpu:
            unread['w_fixed'] = 'dpu: true ranks W per layer (eq. 10)'
        else:
            unread.update({f'{k}_{g}': 'dpu: false gives every layer w_fixed' for k in ('w_base', 'r_base')
                           for g in GROUPS})
    if cfg.ema_reference_iters is None:
        unread['ema_reference_every'] = 'no ema_reference_iters: the coefficients are used as written'
    if not cfg.reads_seed():
        if cfg.partition_file is not None:
            unread['seed'] = 'a partition_file gives the groups'
        elif cfg.ranks_nothing():
            unread['seed'] = "partition 'name' without dpu ranks nothing"
        else:
            unread['seed'] = f"criterion '{cfg.criterion}' ranks by gradients; only 'random' draws from the seed"
    if cfg.mode == 'partial':
        unread.update({key: "mode 'partial' trains one group and freezes the other at the start: no EMA exchange"
                       for key in (*_EMA_KEYS, 'interval_iters', 'first_group')})
        return unread
    unread['trained_group'] = f"mode '{cfg.mode}' trains both groups (only mode 'partial' trains one)"
    if cfg.mode == 'dual':
        unread.update({key: "mode 'dual' (LDT-S's alternation only)" for key in ('interval_iters', 'first_group')})
    else:
        unread['buffers_from'] = "mode 'alternating' (LDT-S) trains one network"
    return unread


_PRESETS = {
    'ft': dict(mode='single', head_warmup_iters=0, profile_iters=0),
    'lp_ft': dict(mode='single', head_warmup_iters=1000, profile_iters=0),
    # DeFT (Pahk et al. 2025): head = unstable (GC of primary), backbone = stable; beta = 0.9999
    # every step; the final model is both EMA'd components, i.e. our composite.
    # beta was written for an exchange every iteration (DeFT paper, section 4.1: 40K iterations of
    # decoupled fine-tuning): ema_reference_iters 40000 rescales it to another run length.
    'deft': dict(mode='dual', head_warmup_iters=1000, partition='name', dpu=False, w_fixed=0.9999,
                 ema_every=1, profile_iters=0, ema_reference_every=1),
    'ldt': dict(),
    'ldt_no_dpu': dict(dpu=False),
    'ldt_mean': dict(criterion='mean'),
    'ldt_var_over_mean': dict(criterion='var_over_mean'),
    'ldt_random': dict(criterion='random'),
    # LDT-S (single network, groups frozen alternately over intervals, CPU weight buffer)
    'ldt_s': dict(mode='alternating'),
    'ldt_sample_var': dict(criterion='sample_var'),
    'ldt_fisher': dict(criterion='fisher'),
    # Controls, not in the paper: LDT's warm-up, profiling and partition, then ONE network of which one
    # group trains while the other keeps the start's weights (no second network, no EMA): what freezing
    # the (un)stable layers gives by itself.
    'ft_stable': dict(mode='partial', trained_group='stable'),
    'ft_unstable': dict(mode='partial', trained_group='unstable'),
}
PRESETS = tuple(_PRESETS)
_METHOD_HINTS = {'mode': "'dual': ldt and its ablations, deft; 'single': ft, lp_ft; 'alternating': ldt_s; 'partial': "
                         'ft_stable, ft_unstable',
                 'trained_group': 'ft_stable trains the stable group, ft_unstable the unstable one'}


def preset(name: str, **overrides: Any) -> LDTConfig:
    """The configuration of a named method (``ft``, ``lp_ft``, ``deft``, ``ldt``, ablations)."""
    if name not in _PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ''
        raise ValueError(f"unknown LDT preset '{name}' (known: {', '.join(PRESETS)}){hint}")
    for key in ('mode', 'trained_group'):    # what the method is: another value would train another method
        given, own = overrides.get(key), getattr(LDTConfig.from_dict(_PRESETS[name]), key)
        if given is not None and given != own and (key == 'mode' or _PRESETS[name].get('mode') == 'partial'):
            raise ValueError(f"ldt.{key}: method '{name}' is {key} {own!r}; {given!r} would train another method under "
                             f"its name; choose the method instead ({_METHOD_HINTS[key]})")
    config = LDTConfig.from_dict({**_PRESETS[name], **overrides})
    if name == 'lp_ft' and config.head_warmup_iters == 0:   # its log says fine-tuning from iteration 1, nothing else
        raise ValueError("ldt.head_warmup_iters: 0 leaves method 'lp_ft' without its linear-probing phase, so it "
                         "would train plain FT under the LP-FT label; use method: ft, or give warm-up iterations")
    start = LDTConfig.from_dict(_PRESETS[name])
    for key, why in unread_options(config).items():
        value = overrides.get(key, getattr(start, key))
        if _plain(value) != _plain(getattr(start, key)):
            raise ValueError(f"ldt.{key}: method '{name}' does not read it ({why}), so {value!r} would change "
                             f'nothing; remove it')
    return config


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value
