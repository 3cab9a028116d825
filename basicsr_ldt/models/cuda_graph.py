"""``train.cuda_graph``: a training step's forward, loss and backward replayed as a CUDA graph
(``basicsr_ldt.ldt.step_graph`` says what is recorded, when, and why it is faster).

FTSRModel records its step; LDTSRModel the dual phase's two branches, one graph each in one memory
pool, or both side by side in one graph where ``ldt.overlap_branches`` overlaps them without an
``ldt.overlap_memory`` bound (warm-up, profiling, LDT-S and its FT / LP-FT modes run eager, and ``true``
is refused there).
CorGrad's step is not recorded; the schema refuses the key for other model types.
"""
from typing import Any, Dict, FrozenSet, Optional, Tuple

import torch
from torch import nn

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.ldt.typed import auto_or_boolean_mode

#: Defaults of the ``train:`` keys read here (documented in docs/options.md).
GRAPH_DEFAULTS = {'cuda_graph': 'auto'}

#: Architectures whose FT step ``train.cuda_graph: auto`` records on a CUDA device: those a GPU run
#: measured faster replayed than without (``scripts/bench_ldt.py --compare-upstream``, 'ours graphed'
#: against 'ours eager' and 'ours compiled'). Empty: no GPU run has timed a replayed step yet.
GRAPH_BY_DEFAULT: FrozenSet[str] = frozenset()


def graph_mode(train_opt: Dict[str, Any]) -> str:
    """The checked ``train.cuda_graph``: 'auto', 'true' or 'false'; anything else is a one-line error."""
    return auto_or_boolean_mode(train_opt, 'cuda_graph', GRAPH_DEFAULTS['cuda_graph'], 'train', InputError)


def graph_decision(mode: str, network: nn.Module, device_type: str, amp: Optional[torch.dtype],
                   single_process: bool, auto_model: str = '', unrecorded: str = '') -> Tuple[bool, str]:
    """Whether the step is recorded, and why not when it is not (for the log). ``true`` asks for it,
    so a run that cannot record it is refused rather than run otherwise than asked. ``auto_model``
    names a model's step no GPU run has timed replayed (``auto`` leaves it eager); ``unrecorded``
    says why a run has no step to record."""
    arch = type(network).__name__
    cannot = unrecorded or unrecordable_run(device_type, amp, single_process)
    refuse_true(mode, cannot)
    if mode == 'false':
        return False, 'train.cuda_graph: false'
    if mode == 'true':
        return True, ''
    if cannot:
        return False, f'train.cuda_graph: auto, and {cannot}'
    if auto_model:
        return False, f'train.cuda_graph: auto, and no GPU run has timed {auto_model} replayed; true records it'
    if arch not in GRAPH_BY_DEFAULT:
        listed = ', '.join(sorted(GRAPH_BY_DEFAULT)) or 'empty'
        return False, (f'train.cuda_graph: auto, and no GPU measurement put {arch} in '
                       f'basicsr_ldt.models.cuda_graph.GRAPH_BY_DEFAULT ({listed})')
    return True, ''


def refuse_true(mode: str, cannot: str) -> None:
    """``true`` where the step cannot be recorded (``cannot`` says why; '' when it can) is refused rather
    than run otherwise than asked."""
    if mode == 'true' and cannot:
        raise InputError(f'train.cuda_graph: true, but {cannot}; use auto or false')


def unrecordable_run(device_type: str, amp: Optional[torch.dtype], single_process: bool) -> str:
    """Why a run on this device, precision and process layout cannot record its step ('' when it can)."""
    if device_type != 'cuda':
        return f'CUDA graphs need a CUDA device, this run is on {device_type}'
    if amp is torch.float16:
        return ("train.amp fp16's loss scaling checks for overflow on the host at every step; "
                'bf16 or none can be recorded')
    if not single_process:
        return 'the network is wrapped for several GPUs (DDP or DataParallel); one process on one GPU can be recorded'
    return ''
