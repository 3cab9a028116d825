"""The one place that decides which implementation of Adam every training optimizer runs.

torch's Adam has three: a loop over the tensors (its default off CUDA), ``foreach`` (a few kernels
per operation over the list of tensors, its default on CUDA) and ``fused`` (one kernel updates a
whole parameter group). On a GPU the update of MambaIR's hundreds of tensors is launched by the
host while the GPU waits (issue 59), so fewer launches are faster; the fused kernel is the fewest.
``train.optim_g.fused`` chooses: ``true``, ``false``, or absent (or null) = fused where every
parameter is on CUDA, torch's own default elsewhere (nothing changes on a CPU).

Every optimizer a model of this project trains with is built by :func:`build_adam`: BasicSR's
``setup_optimizers`` (FT, CorGrad) through :class:`AdamBuilderMixin`, LDT's optimizer factory
(head warm-up, fine-tuning, both branches, LDT-S) directly.
"""
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import torch

from basicsr.utils import get_root_logger

from basicsr_ldt.common.errors import InputError

#: The option, as error messages and docs/options.md name it.
FUSED_OPTION = 'train.optim_g.fused'
#: Group options that pick the implementation rather than the update; a resumed optimizer keeps its own.
IMPLEMENTATION_KEYS = ('fused', 'foreach')

Params = Iterable[Union[torch.Tensor, Dict[str, Any]]]


def _on_cuda(tensor: torch.Tensor) -> bool:
    """Whether a parameter lives on a CUDA device (one function, so a CPU test can fake a GPU)."""
    return tensor.is_cuda


def _fused_devices() -> Tuple[str, ...]:
    """Device types the installed torch has a fused Adam for (torch >= 2.4: CUDA and CPU, among others)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:   # a torch that moved the list: assume what every torch with fused Adam supports
        return ('cuda',)
    return tuple(_get_fused_kernels_supported_devices())


def _tensors(params: Params) -> Iterator[torch.Tensor]:
    for entry in params:
        if isinstance(entry, dict):
            group = entry['params']
            yield from ([group] if isinstance(group, torch.Tensor) else group)
        else:
            yield entry


def fused_choice(optim_opt: Mapping[str, Any]) -> Optional[bool]:
    """The user's ``fused`` value: True, False, or None for "decide by device"; anything else is
    refused in one line, before a YAML ``fused: 'no'`` (a string) reaches torch as a truthy value."""
    value = optim_opt.get('fused')
    if value is not None and not isinstance(value, bool):
        raise InputError(f'{FUSED_OPTION}: expected true, false or no value (fused Adam where the parameters are on '
                         f'CUDA), got {value!r}')
    return value


def adam_kwargs(optim_opt: Mapping[str, Any], params: Params) -> Dict[str, Any]:
    """``train.optim_g`` as keyword arguments of ``torch.optim.Adam`` for ``params``: ``type``
    checked and dropped, ``fused`` resolved.

    Absent ``fused`` becomes ``fused=True`` when every parameter is a floating-point tensor on CUDA
    and the user chose no other implementation (``foreach``) and nothing fused Adam refuses
    (``differentiable``); otherwise the options are returned as they are and torch picks its default.
    ``fused: true`` is checked against what the installed torch can fuse, so a refusal is one line
    at build time instead of a RuntimeError at the first step.
    """
    options = dict(optim_opt)
    kind = options.pop('type', 'Adam')
    if kind != 'Adam':
        raise InputError(f"train.optim_g.type: expected 'Adam' (the optimizer BasicSR 1.4.2 builds), got {kind!r}")
    fused = fused_choice(options)
    tensors = list(_tensors(params))
    if fused is None:
        options.pop('fused', None)
        chosen_otherwise = options.get('foreach') is not None or options.get('differentiable')
        if tensors and not chosen_otherwise and all(_on_cuda(t) and t.is_floating_point() for t in tensors):
            options['fused'] = True
        return options
    if fused:
        refused = [key for key in ('foreach', 'differentiable') if options.get(key)]
        if refused:
            raise InputError(f"{FUSED_OPTION}: true cannot be combined with train.optim_g.{refused[0]}: true "
                             "(torch's fused Adam refuses it)")
        devices = _fused_devices()
        unsupported = sorted({f'{t.dtype} on {t.device.type}' for t in tensors
                              if t.device.type not in devices or not t.is_floating_point()})
        if unsupported:
            raise InputError(f"{FUSED_OPTION}: true, but torch {torch.__version__} has no fused Adam for parameters "
                             f"{', '.join(unsupported)} (it fuses floating-point tensors on {', '.join(devices)}); "
                             'set it to false or leave it out')
    return options


def adam_implementation(optimizer: torch.optim.Optimizer) -> str:
    """'fused', 'foreach' or 'single-tensor': what ``optimizer.step`` runs (torch's default when
    the options leave it open: foreach when every parameter is on CUDA)."""
    defaults = optimizer.defaults
    if defaults.get('fused'):
        return 'fused'
    foreach = defaults.get('foreach')
    if foreach is None:
        foreach = not defaults.get('differentiable') and all(
            _on_cuda(p) for group in optimizer.param_groups for p in group['params'])
    return 'foreach' if foreach else 'single-tensor'


def _keep_implementation(optimizer: torch.optim.Optimizer, state_dict: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Load-state pre-hook: the saved moments and steps, this optimizer's implementation.

    The states of fused and foreach Adam hold the same tensors, but ``load_state_dict`` also
    replaces each group's options with the saved ones, ``fused`` and ``foreach`` included: a run
    resumed on a GPU from a state written on a CPU (or before this option) would silently lose
    the fused kernel, and one resumed with ``fused: false`` would fuse again. Keeping the current
    flags before torch reads them also makes torch place each ``step`` where the current
    implementation expects it (on the parameter's device for fused, as saved otherwise).
    """
    saved = state_dict['param_groups']
    if len(saved) != len(optimizer.param_groups):
        return None   # torch's own check reports the mismatch
    groups = [{**old, **{key: now.get(key) for key in IMPLEMENTATION_KEYS}}
              for old, now in zip(saved, optimizer.param_groups)]
    return {**state_dict, 'param_groups': groups}


def build_adam(params: Params, optim_opt: Mapping[str, Any], role: str) -> torch.optim.Optimizer:
    """``torch.optim.Adam`` over ``params`` from ``train.optim_g`` (:func:`adam_kwargs`), its
    implementation logged once, kept on resume (:func:`_keep_implementation`). ``role`` names the
    optimizer in the log (``net_g``, or LDT's ``warmup``, ``finetune``, ``primary``, ``auxiliary``,
    ``ldt_s``)."""
    params = list(params)
    kwargs = adam_kwargs(optim_opt, params)
    optimizer = torch.optim.Adam(params, **kwargs)
    optimizer.register_load_state_dict_pre_hook(_keep_implementation)
    implementation = adam_implementation(optimizer)
    if optim_opt.get('fused') is not None:
        why = f"{FUSED_OPTION}: {str(optim_opt['fused']).lower()}"
    elif implementation == 'fused':
        why = f'{FUSED_OPTION} not set: the parameters are on CUDA'
    else:
        why = f"{FUSED_OPTION} not set: torch's default for these parameters"
    count = sum(1 for _ in _tensors(params))
    get_root_logger().info(f'Adam for {role} ({count} parameter tensors): {implementation} ({why})')
    return optimizer


class AdamBuilderMixin:
    """BasicSR's ``get_optimizer`` (called by ``SRModel.setup_optimizers`` with ``train.optim_g``)
    through :func:`build_adam`."""

    def get_optimizer(self, optim_type: str, params: List[torch.nn.Parameter], lr: float,
                      **kwargs: Any) -> torch.optim.Optimizer:
        return build_adam(params, {'type': optim_type, 'lr': lr, **kwargs}, 'net_g')
