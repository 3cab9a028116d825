"""EMA speeds that scale with the length of the run (``ema_reference_iters``).

Why: an EMA coefficient W (eq. 3/8/11) fixes how many exchanges the frozen copy averages over,
its horizon ``1 / (1 - W)`` exchanges, not what share of the run that is. The paper's DPU
coefficients were written for 200,000 iterations with an exchange every 10 (the official code):
20,000 exchanges, so an unstable layer's EMA (W 0.999 .. 1.0) averages over 1,000 or more of them,
5% of the run or more. Run 450 iterations with an exchange every iteration and the same W averages
over more than twice the whole run: the frozen copies, and so the composite (eq. 12), stay near
the start. Rescaling every W so that its horizon is the same *share* of the run:

    horizon' / E_run = horizon / E_ref   with horizon = 1 / (1 - W)
    =>  W' = 1 - (1 - W) * E_ref / E_run                                    (scaled eq. 8/11)

E_ref = reference iterations // reference exchange interval; E_run = the exchanges this run's EMA
receives. The map is affine in W, so DPU's eq. 10 keeps its form: with k = E_ref / E_run,

    W_i' = 1 - k (1 - W_base - R_base rank_i / N)
         = (1 - k (1 - W_base)) + (k R_base) rank_i / N                     (scaled eq. 10)

i.e. W_base' = 1 - k (1 - W_base) (the low end of the group's range, rank 0) and the high end
W_base + R_base moves the same way, R_base' = k R_base. A W' below 0 would extrapolate (the copy
would overshoot the trained weights); it is clamped to 0, the shortest average there is (the
copy takes the trained weights: one exchange).

Exchanges per group: the cross-frozen pair exchanges both groups every ``ema_every`` dual steps;
LDT-S (``ldt_s``) moves a group's EMA only in the intervals that group trains, every
``ema_every`` iterations counted within the interval and at the end of a full interval, so each
group's count is its own. Plain PyTorch, no BasicSR.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Dict, List, Mapping

from basicsr_ldt.ldt.equations import STABLE, UNSTABLE
from basicsr_ldt.ldt.partition import Partition

GROUPS = (STABLE, UNSTABLE)


def reference_exchanges(reference_iters: int, reference_every: int) -> int:
    """E_ref: the exchanges of the run the coefficients were written for (200000 // 10 = 20000)."""
    if reference_iters < 1 or reference_every < 1 or reference_iters < reference_every:
        raise ValueError(f'reference run: expected iterations >= exchange interval >= 1, got {reference_iters} '
                         f'iterations, an exchange every {reference_every}')
    return reference_iters // reference_every


def scaled_coefficient(w: float, reference: int, run: int) -> float:
    """W' = 1 - (1 - W) * E_ref / E_run, clamped at 0 (scaled eq. 8/11; see the module docstring)."""
    if run < 1:
        raise ValueError(f'a run with {run} EMA exchanges has no EMA to scale')
    return max(0.0, 1.0 - (1.0 - w) * reference / run)


def horizon(w: float) -> float:
    """Exchanges an EMA with coefficient W averages over: 1 / (1 - W) (inf for W = 1)."""
    return math.inf if w >= 1.0 else 1.0 / (1.0 - w)


def dual_exchanges(train_iters: int, ema_every: int) -> Dict[str, int]:
    """Exchanges of each group's EMA in ``train_iters`` dual steps: both groups every ``ema_every``."""
    count = max(0, train_iters) // ema_every
    return {STABLE: count, UNSTABLE: count}


def alternating_exchanges(train_iters: int, interval_iters: int, ema_every: int,
                          first_group: str) -> Dict[str, int]:
    """Exchanges of each group's EMA in ``train_iters`` LDT-S iterations (``ldt_s.AlternatingFreezing``):
    within an interval every ``ema_every``-th iteration and the interval's last, the groups in turn."""
    counts = {STABLE: 0, UNSTABLE: 0}
    group, left = first_group, max(0, train_iters)
    while left > 0:
        length = min(left, interval_iters)
        full = length == interval_iters
        counts[group] += length // ema_every + (1 if full and length % ema_every else 0)
        left -= length
        group = UNSTABLE if group == STABLE else STABLE
    return counts


def run_exchanges(mode: str, train_iters: int, ema_every: int, interval_iters: int = 1,
                  first_group: str = STABLE) -> Dict[str, int]:
    """E_run per group for ``mode`` ``dual`` or ``alternating`` (``single`` has no EMA: zeros)."""
    if mode == 'alternating':
        return alternating_exchanges(train_iters, interval_iters, ema_every, first_group)
    if mode == 'dual':
        return dual_exchanges(train_iters, ema_every)
    return {STABLE: 0, UNSTABLE: 0}


def scale_partition(partition: Partition, reference: int, run: Mapping[str, int]) -> Partition:
    """The partition with every layer's W rescaled for its group's E_run (groups, statistics, forced marks kept)."""
    layers = tuple(replace(r, coefficient=scaled_coefficient(r.coefficient, reference, run[r.group]))
                   for r in partition.layers)
    return Partition(layers, partition.criterion)


def long_horizons(partition: Partition, remaining: Mapping[str, int]) -> Dict[str, float]:
    """Per group whose *fastest* EMA (its smallest W) averages over more exchanges than remain: that
    horizon. Then no layer of the group gets averaged within the run. (The slowest DPU layers exceed
    even the paper's run by design: W_base + R_base (N-1)/N is 1 - R_base/N, a horizon of N/R_base, so
    a test on the largest W would fire on the paper's own settings.)"""
    out = {}
    for group in GROUPS:
        coefficients = partition.coefficients(group)
        if coefficients:
            fastest = horizon(min(coefficients))
            if fastest > remaining[group]:
                out[group] = fastest
    return out


def horizon_warnings(partition: Partition, remaining: Mapping[str, int], remedy: str) -> List[str]:
    """One line per group whose every EMA is longer than the exchanges that remain, ending with ``remedy``."""
    lines = []
    for group, fastest in long_horizons(partition, remaining).items():
        w = partition.coefficients(group)
        lines.append(f"the {group} layers' EMAs (W {min(w):.6g} .. {max(w):.6g}) average over {fastest:.0f} exchanges or "
                     f'more, more than the {remaining[group]} left in this run: the frozen {group} layers, and so the '
                     f'composite, stay near the start. {remedy}')
    return lines
