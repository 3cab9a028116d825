"""Stable/unstable layer partitions: built from statistics or names, saved as JSON.

A layer is one named parameter tensor. The JSON file (layer, statistic, group, coefficient, forced)
is what users inspect and plot, and can be edited and fed back (``partition_file``); loading
checks it against the model's parameter names so a partition from another network fails at
once instead of silently freezing the wrong tensors.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from collections import Counter
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from basicsr_ldt.ldt.equations import STABLE, UNSTABLE, dpu_coefficients, top_n_unstable

FORMAT_VERSION = 1


def matches(name: str, pattern: str) -> bool:
    """Exact name, fnmatch glob, or module prefix (``conv_last`` covers ``conv_last.weight``)."""
    return fnmatchcase(name, pattern) or fnmatchcase(name, pattern + '.*')


def select(names: Sequence[str], patterns: Iterable[str]) -> List[str]:
    """Names matching any pattern, in layer order."""
    patterns = tuple(patterns)
    return [n for n in names if any(matches(n, p) for p in patterns)]


def head_layers(names: Sequence[str], head_patterns: Sequence[str], network: str = 'the network') -> List[str]:
    """The head the patterns select together, or the one-line error that stops the run.

    One rule for the SR model's up-front check, the head warm-up and the partition by name.
    """
    head = select(names, head_patterns)
    if not head:
        raise ValueError(f"ldt.head_patterns {list(head_patterns)} match no parameter of {network} "
                         f"(its last parameters: {', '.join(list(names)[-4:])})")
    return head


def deft_blocks(names: Sequence[str]) -> List[str]:
    """The deep feature blocks (``layers.*``) that DeFT's official ``non_layers`` split puts in one group,
    or the one-line error that stops the run (SAFMN, for one, has no ``layers``)."""
    blocks = select(names, ['layers.*'])
    if not blocks:
        raise ValueError(f"ldt.deft_grouping 'non_layers' needs 'layers.*' parameters, and the network has none "
                         f"(first names: {', '.join(list(names)[:4])}); use deft_grouping: head")
    return blocks


#: The options whose patterns force layers into a group, in the order they are checked.
FORCE_OPTIONS = ('force_stable', 'force_unstable')

#: What each pattern of each force option selects: ``{option: [(pattern, names), ...]}``.
ForcedLayers = Dict[str, List[Tuple[str, List[str]]]]


def forced_layers(names: Sequence[str], force_stable: Sequence[str] = (), force_unstable: Sequence[str] = (),
                  network: str = 'the network') -> ForcedLayers:
    """What each force pattern selects, or the one-line error that stops the run.

    The single rule for force patterns: the SR model checks and logs it before training, and
    ``build_partition`` applies it after profiling, so the two cannot disagree. Every pattern must
    select a layer (a typo would otherwise be silent), and no layer may be forced into both groups.
    """
    names = list(names)
    forced: ForcedLayers = {}
    for option, patterns in zip(FORCE_OPTIONS, (force_stable, force_unstable)):
        forced[option] = [(p, select(names, [p])) for p in patterns]
        for pattern, hit in forced[option]:
            if not hit:
                raise ValueError(f"ldt.{option}: pattern '{pattern}' matches no parameter of {network} "
                                 f"(its first parameters: {', '.join(names[:4])})")
    stable_by = {n: p for p, hit in forced['force_stable'] for n in hit}
    for pattern, hit in forced['force_unstable']:
        both = [n for n in hit if n in stable_by]
        if both:
            raise ValueError(f"layers forced both stable and unstable: ldt.force_stable '{stable_by[both[0]]}' and "
                             f"ldt.force_unstable '{pattern}' both select {both[:5]}")
    return forced


@dataclass(frozen=True)
class LayerRecord:
    """One layer of the partition.

    ``forced`` says that a ``force_stable``/``force_unstable`` pattern, not the layer's statistic,
    put it into its group: the statistic ranking of such a layer does not explain its group, so
    the report marks it. Files written before the field existed read as not forced.
    """

    name: str
    statistic: Optional[float]
    group: str
    coefficient: float
    forced: bool = False


@dataclass(frozen=True)
class Partition:
    """Per-layer group and EMA coefficient (W of eq. 8/10), in the model's layer order."""

    layers: Tuple[LayerRecord, ...]
    criterion: str = 'var'

    @property
    def names(self) -> List[str]:
        return [r.name for r in self.layers]

    @property
    def stable(self) -> List[str]:
        return [r.name for r in self.layers if r.group == STABLE]

    @property
    def unstable(self) -> List[str]:
        return [r.name for r in self.layers if r.group == UNSTABLE]

    def coefficients(self, group: str) -> List[float]:
        """The EMA coefficients W of ``group``'s layers, in layer order."""
        return [r.coefficient for r in self.layers if r.group == group]

    @property
    def groups(self) -> Dict[str, str]:
        return {r.name: r.group for r in self.layers}

    @property
    def dpu_coefficients(self) -> Dict[str, float]:
        return {r.name: r.coefficient for r in self.layers}

    @property
    def forced(self) -> List[str]:
        """The layers a force pattern put into their group, in layer order."""
        return [r.name for r in self.layers if r.forced]

    def to_dict(self) -> dict:
        return {'version': FORMAT_VERSION, 'criterion': self.criterion,
                'layers': [{'name': r.name, 'statistic': r.statistic, 'group': r.group,
                            'coefficient': r.coefficient, 'forced': r.forced} for r in self.layers]}

    @classmethod
    def from_dict(cls, data: dict, where: str = 'partition') -> 'Partition':
        try:
            layers = tuple(LayerRecord(str(d['name']), None if d.get('statistic') is None
                                       else float(d['statistic']), str(d['group']),
                                       float(d['coefficient']), d.get('forced', False)) for d in data['layers'])
            criterion = str(data.get('criterion', 'var'))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f'{where}: malformed partition ({err!r}); expected {{"layers": '
                             '[{"name", "statistic", "group", "coefficient", "forced" (optional)}, ...]}') from err
        for r in layers:
            if not isinstance(r.forced, bool):
                raise ValueError(f"{where}: layer '{r.name}' has forced {r.forced!r}, expected true or false")
            if r.group not in (STABLE, UNSTABLE):
                raise ValueError(f"{where}: layer '{r.name}' has group '{r.group}', expected "
                                 f"'{STABLE}' or '{UNSTABLE}'")
            if not 0.0 <= r.coefficient <= 1.0:
                raise ValueError(f"{where}: layer '{r.name}' has coefficient {r.coefficient}, "
                                 'expected a value in [0, 1]')
        return cls(layers, criterion)

    def validate(self, model_names: Sequence[str], where: str = 'partition') -> None:
        """Raise if this partition does not describe exactly ``model_names``."""
        ours, theirs = self.names, list(model_names)
        duplicated = sorted(n for n, k in Counter(ours).items() if k > 1)
        missing = [n for n in theirs if n not in set(ours)]
        unknown = [n for n in ours if n not in set(theirs)]
        if duplicated or missing or unknown:
            parts = []
            if missing:
                parts.append(f'{len(missing)} model parameters missing (e.g. {missing[:3]})')
            if unknown:
                parts.append(f'{len(unknown)} names not in the model (e.g. {unknown[:3]})')
            if duplicated:
                parts.append(f'duplicated names {duplicated[:3]}')
            raise ValueError(f'{where} does not match the model: ' + '; '.join(parts))
        if not self.stable or not self.unstable:
            raise ValueError(f'{where}: both groups need at least one layer '
                             f'({len(self.stable)} stable, {len(self.unstable)} unstable)')

    def save(self, path: str) -> None:
        """Write JSON atomically (temp file in the same folder + os.replace)."""
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix='.partition-', suffix='.tmp', dir=folder)
        try:
            with os.fdopen(fd, 'w') as f:
                json.dump(self.to_dict(), f, indent=1, allow_nan=False)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise

    @classmethod
    def load(cls, path: str, model_names: Optional[Sequence[str]] = None) -> 'Partition':
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f'cannot read partition file {path}: {err}') from err
        partition = cls.from_dict(data, where=f'partition file {path}')
        if model_names is not None:
            partition.validate(model_names, where=f'partition file {path}')
        return partition


def build_partition(names: Sequence[str], statistics: Optional[Sequence[float]], *,
                    partition: str, ratio_u: Optional[float] = None, ratio_s: Optional[float] = None,
                    head_patterns: Sequence[str] = (), deft_grouping: str = 'head',
                    force_stable: Sequence[str] = (), force_unstable: Sequence[str] = (),
                    dpu: bool = True, w_base_stable: float = 0.99, r_base_stable: float = 0.01,
                    w_base_unstable: float = 0.999, r_base_unstable: float = 0.001,
                    w_fixed: float = 0.99, criterion: str = 'var', network: str = 'the network') -> Partition:
    """Groups (by statistic, eq. 1-2, or by head name) then overrides, then coefficients.

    Force patterns are applied after the ratio, so the unstable share can differ from
    ``ratio_u``; they are selected and checked by :func:`forced_layers` (``network`` names the
    model in its errors), and every layer they select is recorded as ``forced``.
    """
    names = list(names)
    if statistics is not None and len(statistics) != len(names):
        raise ValueError('build_partition: one statistic per layer expected')
    if partition == 'criterion':
        if statistics is None:
            raise ValueError("partition 'criterion' needs per-layer statistics")
        unstable = top_n_unstable(statistics, ratio_u, ratio_s=ratio_s)
    elif partition == 'name' and deft_grouping == 'non_layers':
        # The official DeFT split: every `layers.*` tensor (the deep feature blocks) is one group,
        # everything else (shallow conv, patch-embed norm, final norm, conv_after_body, upsampler)
        # the other. We label the blocks stable and the rest unstable; with DeFT's one fixed EMA
        # coefficient the labels only decide which branch trains which group.
        blocks = set(deft_blocks(names))
        unstable = [n not in blocks for n in names]
    elif partition == 'name':
        head = set(head_layers(names, head_patterns, network))
        unstable = [n in head for n in names]
    else:
        raise ValueError(f"unknown partition '{partition}', expected 'criterion' or 'name'")
    forced = forced_layers(names, force_stable, force_unstable, network)
    forced_s, forced_u = ({n for _, hit in forced[o] for n in hit} for o in FORCE_OPTIONS)
    groups = [STABLE if n in forced_s else UNSTABLE if n in forced_u or u else STABLE
              for n, u in zip(names, unstable)]
    coefficients = [w_fixed] * len(names)
    if dpu:
        if statistics is None:
            raise ValueError('DPU coefficients need per-layer statistics')
        for group, (w_base, r_base) in ((STABLE, (w_base_stable, r_base_stable)),
                                        (UNSTABLE, (w_base_unstable, r_base_unstable))):
            idx = [i for i, g in enumerate(groups) if g == group]
            for i, w in zip(idx, dpu_coefficients([statistics[i] for i in idx], w_base, r_base)):
                coefficients[i] = w
    stat = [None if statistics is None else float(s) for s in (statistics or [None] * len(names))]
    if any(s is not None and not math.isfinite(s) for s in stat):
        raise ValueError('build_partition: statistics must be finite')
    result = Partition(tuple(LayerRecord(n, s, g, c, n in forced_s or n in forced_u) for n, s, g, c in
                             zip(names, stat, groups, coefficients)),
                       criterion if partition == 'criterion' else 'name')
    result.validate(names)
    return result


