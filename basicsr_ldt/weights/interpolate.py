"""WiSE-FT weights: theta(alpha) = (1 - alpha) theta_start + alpha theta_run (Wortsman et al.,
"Robust fine-tuning of zero-shot models", CVPR 2022).

Why: one fine-tuning run and a test per alpha trace every network between the start (alpha 0) and
the run (alpha 1) without training again; that curve is what "moving less than FT" buys by itself,
the control a method claiming generalisation must beat (docs/studies.md, "The trade-off picture").

Every parameter and floating-point buffer is interpolated, in float64 and then cast to the
network's dtype. Integer buffers (e.g. BatchNorm's batch counter) cannot be interpolated: they come
from the run for alpha > 0 and from the start for alpha 0.
"""
from typing import Dict, Mapping, Optional, Tuple

import torch

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.weights.checkpoint import fitting_state


def interpolate_states(start: Mapping[str, torch.Tensor], run: Mapping[str, torch.Tensor],
                       alpha: float) -> Dict[str, torch.Tensor]:
    """(1 - alpha) start + alpha run for every key (both must have the same keys and shapes)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f'alpha must be in [0, 1], got {alpha}')
    mixed = {}
    for key, end in run.items():
        begin = start[key]
        if end.is_floating_point():
            mixed[key] = ((1.0 - alpha) * begin.double() + alpha * end.double()).to(end.dtype)
        else:
            mixed[key] = (end if alpha > 0 else begin).clone()
    return mixed


def wise_ft_state(network: torch.nn.Module, run_path: str, run_key: Optional[str], start_path: str,
                  start_key: Optional[str], alpha: float, where: str,
                  fallback: Tuple[bool, bool] = (True, True)) -> Dict[str, torch.Tensor]:
    """The interpolated state dict for ``network``; ``where`` names the option in errors
    (``checkpoints[2]``): a start or run that does not fit the network, or alpha outside [0, 1].
    ``fallback``: whether the run's and the start's key may fall back to the file's other weights
    (see :func:`basicsr_ldt.weights.checkpoint.extract_state_dict`)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise InputError(f'{where}.wise_ft.alpha: expected a number in [0, 1], got {alpha!r}')
    run = fitting_state(network, run_path, run_key, what=f'{where}.path', fallback=fallback[0])
    start = fitting_state(network, start_path, start_key, what=f'{where}.wise_ft.start', fallback=fallback[1])
    return interpolate_states(start, run, float(alpha))


__all__ = ['interpolate_states', 'wise_ft_state']
