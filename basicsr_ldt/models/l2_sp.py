"""``train.l2_sp_weight``: L2-SP, fine-tuning anchored to its start (Li, Grandvalet and Davoine,
"Explicit inductive bias for transfer learning with convolutional networks", ICML 2018).

Why it is here: a method that fine-tunes less far than FT keeps more of its start, which on the
cameras it never saw can look like generalisation. L2-SP is the standard control for that: FT with
the penalty (lambda / 2) ||theta - theta_start||^2 added to the loss, lambda setting how near the
start the run stays. A method beats retention only where it does better than such controls at the
same distance (docs/studies.md, "The trade-off picture").

theta_start is read from the start the run loads (``path.pretrain_network_g``, ``path.param_key_g``)
and covers every parameter present there with the network's shape. The upsampler head is included:
the start is an SR network of the same scale, so its head holds trained start values like every
other layer. L2-SP's paper leaves out only a new head with no start value (a new classifier); here
that is a parameter the start lacks (e.g. another scale loaded with ``strict_load_g: false``), and
such parameters get no penalty. Buffers are not parameters and get none.

The penalty is part of the training loss (so it passes through Adam's normalisation and any loss
scaling like the data term) and is logged beside it as ``l_l2sp``.
"""
from typing import Dict, List, Mapping, Optional

import torch
from torch import nn

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.weights.checkpoint import read_state

OPTION = 'train.l2_sp_weight'
#: ``path`` keys the training pipeline sets on a resume to the run's start as the option file names it: BasicSR's
#: ``check_resume`` points ``pretrain_network_g`` (and ``param_key_g``) at the resumed state's own weights.
START_KEY, START_PARAM_KEY = 'start_network_g', 'start_param_key_g'


def l2_sp_weight(train_opt: Mapping) -> float:
    """lambda from the options (0: no penalty); a negative or non-numeric value is refused."""
    value = train_opt.get('l2_sp_weight', 0)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float('inf'):
        raise InputError(f'{OPTION}: expected a finite number >= 0 (lambda of the L2-SP penalty '
                         f'(lambda / 2) ||theta - theta_start||^2, 0 = none), got {value!r}')
    return float(value)


class L2SPPenalty(nn.Module):
    """(lambda / 2) sum over anchored parameters of ||theta - theta_start||^2.

    ``start`` maps parameter names to their start values; each name must be a parameter of the
    network with the same shape (the caller picks which ones: those present in the start).
    """

    def __init__(self, network: nn.Module, start: Mapping[str, torch.Tensor], weight: float) -> None:
        super().__init__()
        if weight < 0:
            raise ValueError(f'L2-SP weight must be >= 0, got {weight}')
        params = dict(network.named_parameters())
        wrong = [k for k in start if k not in params or params[k].shape != start[k].shape]
        if wrong:
            raise ValueError(f'L2-SP start values do not match the network: {wrong[:3]}')
        self.weight = weight
        self.names: List[str] = [k for k in params if k in start]
        # Kept off the network's state dict: a checkpoint of the trained network stays a plain network.
        self.starts = [start[k].detach().to(params[k].device, params[k].dtype).clone() for k in self.names]
        self.last: Optional[torch.Tensor] = None

    def forward(self, network: nn.Module) -> torch.Tensor:
        """The penalty of ``network``'s current weights (a graph to them; ``last`` keeps its value)."""
        params = dict(network.named_parameters())
        anchored = [params[k] for k in self.names]
        if not anchored:
            penalty = next(network.parameters()).new_zeros(())
        else:
            differences = torch._foreach_sub(anchored, self.starts)
            penalty = torch.stack([(d.float() ** 2).sum() for d in differences]).sum() * (self.weight / 2)
        self.last = penalty.detach()
        return penalty


def start_values(network: nn.Module, path_opt: Mapping) -> Dict[str, torch.Tensor]:
    """The start's values of the network's parameters it holds (``path.pretrain_network_g``)."""
    resumed = START_KEY in path_opt
    start = path_opt[START_KEY if resumed else 'pretrain_network_g']
    _, state = read_state(start, path_opt[START_PARAM_KEY] if resumed else path_opt.get('param_key_g', 'params'))
    params = dict(network.named_parameters())
    wrong = sorted(k for k in set(params) & set(state) if params[k].shape != state[k].shape)
    if wrong:
        raise InputError(f"{OPTION}: path.pretrain_network_g '{start}' does not fit network {type(network).__name__}: "
                         f'{len(wrong)} parameters with another shape (e.g. {wrong[0]}: start '
                         f'{tuple(state[wrong[0]].shape)}, network {tuple(params[wrong[0]].shape)})')
    present = {k: state[k] for k in params if k in state}
    if not present:
        raise InputError(f"{OPTION}: path.pretrain_network_g '{start}' holds none of network "
                         f'{type(network).__name__}\'s parameters (e.g. {next(iter(params))})')
    return present


def l2_sp_setting(opt: Mapping, trained_networks: int = 1) -> float:
    """lambda of a run's options, checked without reading the start: 0 = no penalty.

    ``trained_networks`` > 1 (LDT's and DeFT's cross-frozen pair) is refused: L2-SP anchors the one
    network a run trains, and the pair's composite is built from two.
    """
    weight = l2_sp_weight(opt.get('train') or {})
    if weight == 0:
        return weight
    if trained_networks > 1:
        raise InputError(f'{OPTION}: L2-SP anchors the one network a run trains; this method trains '
                         f'{trained_networks} (a cross-frozen pair). Use it with FT, LP-FT, LDT-S or CorGrad')
    if not (opt.get('path') or {}).get('pretrain_network_g'):
        raise InputError(f'{OPTION}: L2-SP anchors the run to its start, and path.pretrain_network_g names none')
    return weight


def build_l2_sp(network: nn.Module, opt: Mapping, trained_networks: int = 1) -> Optional[L2SPPenalty]:
    """The penalty for this run's options, or None without ``train.l2_sp_weight``."""
    weight = l2_sp_setting(opt, trained_networks)
    if weight == 0:
        return None
    return L2SPPenalty(network, start_values(network, opt.get('path') or {}), weight)


__all__ = ['L2SPPenalty', 'START_KEY', 'START_PARAM_KEY', 'build_l2_sp', 'l2_sp_setting', 'l2_sp_weight', 'start_values']
