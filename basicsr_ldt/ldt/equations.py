"""Every equation of the LDT paper (ICLR 2026, section 2) that the code computes, in one place.

Eq. 4-7 (forward of each branch, its gradients, its optimizer step) are the body of
:meth:`basicsr_ldt.ldt.algorithm.LDT.update`; eq. 13 is plain inference with the composite.
"""
from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence

import torch

STABLE = 'stable'
UNSTABLE = 'unstable'


def unstable_count(n_layers: int, ratio_u: float) -> int:
    """How many layers Top_N marks unstable (eq. 1).

    Rounding is round-half-up of ``ratio_u * n_layers`` (float64), clamped so that both groups
    keep at least one layer (a dual step with an empty group would train nothing in one branch).
    At ratio 0.5 this equals the official code's ``n - int(n * 0.5)`` unstable layers.
    """
    if n_layers < 2:
        raise ValueError(f'a stable/unstable partition needs at least 2 layers, got {n_layers}')
    if not 0.0 < ratio_u < 1.0:
        raise ValueError(f'ratio_u must lie strictly between 0 and 1, got {ratio_u}')
    return min(max(math.floor(ratio_u * n_layers + 0.5), 1), n_layers - 1)


def stable_count(n_layers: int, ratio_s: float) -> int:
    """How many layers are stable when the STABLE share is given (the official ``Par_ratio``).

    The official rule: ``int(n_layers * ratio_s)`` (float64, truncated) lowest-statistic layers are
    stable, the rest unstable; clamped like :func:`unstable_count`. So ``ratio_s`` and
    ``ratio_u = 1 - ratio_s`` pick the same sets whenever ``ratio_s * n_layers`` is a whole number
    and differ by the one boundary layer otherwise (truncation here, round-half-up there).
    """
    if n_layers < 2:
        raise ValueError(f'a stable/unstable partition needs at least 2 layers, got {n_layers}')
    if not 0.0 < ratio_s < 1.0:
        raise ValueError(f'ratio_s must lie strictly between 0 and 1, got {ratio_s}')
    return min(max(int(n_layers * ratio_s), 1), n_layers - 1)


def top_n_unstable(statistics: Sequence[float], ratio_u: Optional[float] = None, *,
                   ratio_s: Optional[float] = None) -> List[bool]:
    """Eq. 1-2: the top ``ratio_u`` share by statistic is unstable, the rest stable (or, with
    ``ratio_s``, the bottom ``ratio_s`` share is stable and the rest unstable).

    Ties are broken by layer order (``named_parameters`` order): the earlier layer wins the
    higher place, so the result never depends on sort stability or hashing.
    """
    _check_finite(statistics)
    if (ratio_u is None) == (ratio_s is None):
        raise ValueError('top_n_unstable: give exactly one of ratio_u and ratio_s')
    n = len(statistics)
    k = unstable_count(n, ratio_u) if ratio_s is None else n - stable_count(n, ratio_s)  # eq. 1: Top_N
    order = sorted(range(len(statistics)), key=lambda i: (-statistics[i], i))
    chosen = set(order[:k])
    return [i in chosen for i in range(len(statistics))]                  # eq. 2: complement


def dpu_coefficients(statistics: Sequence[float], w_base: float, r_base: float) -> List[float]:
    """Eq. 9-10 for one group: ``W_i = W_base + R_base * rank_i / N``.

    rank_i = 0-based position of layer i in ASCENDING order of the statistic within its group
    (ties: earlier layer first), N = group size. So the highest-variance layer gets the largest
    W = W_base + R_base*(N-1)/N (slowest absorption) and the lowest gets W_base. The paper's text
    says "descending", but its stated intent (higher variance -> larger W) and the official code
    (index in the ascending list / N) agree on this reading.
    """
    _check_finite(statistics)
    n = len(statistics)
    order = sorted(range(n), key=lambda i: (statistics[i], i))
    rank = [0] * n
    for position, i in enumerate(order):
        rank[i] = position                                                # eq. 9: Get_index / N
    return [w_base + r_base * rank[i] / n for i in range(n)]              # eq. 10


@torch.no_grad()
def ema_exchange_(frozen: List[torch.Tensor], trained: List[torch.Tensor],
                  coefficients: Sequence[float]) -> None:
    """Eq. 3/8/11: ``theta_frozen <- W * theta_frozen + (1 - W) * theta_trained``, in place.

    One fused foreach lerp over all tensors (lerp(a, b, 1-W) = a + (1-W)(b-a)), per-tensor
    weights, no temporaries; the frozen tensors never enter an optimizer, so this is their only
    writer.
    """
    if not (len(frozen) == len(trained) == len(coefficients)):
        raise ValueError('ema_exchange_: frozen, trained and coefficients differ in length')
    if frozen:
        torch._foreach_lerp_(frozen, trained, [1.0 - float(w) for w in coefficients])


def composite_state(primary: Mapping[str, torch.Tensor], auxiliary: Mapping[str, torch.Tensor],
                    groups: Mapping[str, str], buffers_from: str = 'primary') -> Dict[str, torch.Tensor]:
    """Eq. 12: MC = Cat{frozen stable of A, frozen unstable of P}.

    Entries not in ``groups`` (buffers such as BatchNorm running stats) come from
    ``buffers_from`` (default the primary): they are not parameters, so the paper's layer
    partition does not cover them, and they must come from one branch to stay consistent.
    """
    source = primary if buffers_from == 'primary' else auxiliary
    out: Dict[str, torch.Tensor] = {}
    for name, tensor in primary.items():
        group = groups.get(name)
        if group == STABLE:
            out[name] = auxiliary[name]
        elif group == UNSTABLE:
            out[name] = primary[name]
        else:
            out[name] = source[name]
    return out


def _check_finite(statistics: Sequence[float]) -> None:
    bad = [i for i, s in enumerate(statistics) if not math.isfinite(s)]
    if bad:
        raise ValueError(f'layer statistics must be finite; layers {bad[:5]} are not '
                         '(too few profiling samples?)')
