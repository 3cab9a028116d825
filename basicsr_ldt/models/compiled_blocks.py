"""``train.compile`` / ``train.compile_backend``: the network's repeated blocks compiled with
``torch.compile`` for training steps (``archs.compile`` says what is compiled and why).

One place serves every model type: :class:`CompiledBlocksMixin` (a base of ``GuardedStepMixin``,
which FT, LP-FT, DeFT, LDT, LDT-S and CorGrad all use) marks the blocks once the model is built,
its network on its device and its weights loaded, before the first step. LDT's auxiliary branch
and its composite copies are deep copies of that network and keep the marks.
"""
from dataclasses import dataclass
from typing import Any, Dict, Tuple

import torch
from torch import nn

from basicsr.utils import get_root_logger

import archs.compile as arch_compile
from basicsr_ldt.common.errors import InputError
from basicsr_ldt.ldt.typed import auto_or_boolean_mode

#: Defaults of the ``train:`` keys read here (documented in docs/options.md).
COMPILE_DEFAULTS = {'compile': 'auto', 'compile_backend': 'inductor'}


@dataclass(frozen=True)
class CompileSetting:
    """``mode``: 'auto', 'true' or 'false'; ``backend``: a ``torch.compile`` backend name."""
    mode: str
    backend: str


def compile_setting(train_opt: Dict[str, Any]) -> CompileSetting:
    """The checked ``train.compile`` / ``train.compile_backend``; bad values are one-line errors
    naming the key. A backend other than the default is looked up among torch's registered ones
    (listing them imports every backend: seconds, so only when one is named)."""
    mode = auto_or_boolean_mode(train_opt, 'compile', COMPILE_DEFAULTS['compile'], 'train', InputError)
    backend = train_opt.get('compile_backend')
    backend = COMPILE_DEFAULTS['compile_backend'] if backend is None else backend
    if not isinstance(backend, str) or not backend:
        raise InputError(f'train.compile_backend: expected the name of a torch.compile backend, got {backend!r}')
    if backend != COMPILE_DEFAULTS['compile_backend']:
        known = torch.compiler.list_backends(exclude_tags=())
        if backend not in known:
            raise InputError(f"train.compile_backend: '{backend}' is not a torch.compile backend of this torch "
                             f"(known: {', '.join(known)})")
    return CompileSetting(mode, backend)


def refuse_uncompilable(setting: CompileSetting, arch: str) -> None:
    """``true`` for a network type (``network_g.type``) without blocks to compile is refused: the user
    asked for something that cannot happen."""
    if setting.mode == 'true' and arch not in arch_compile.BLOCK_CLASSES:
        raise InputError(f"train.compile: true, but network_g type '{arch}' has no blocks to compile (only "
                         f"{', '.join(sorted(arch_compile.BLOCK_CLASSES))} have); use auto or false")


def compile_decision(setting: CompileSetting, network: nn.Module, device_type: str,
                     auto_model: str = '') -> Tuple[bool, str]:
    """Whether ``network``'s blocks are compiled, and why not when they are not (for the log).

    ``auto`` compiles only on CUDA, only architectures in ``archs.compile.COMPILE_BY_DEFAULT``, and
    not for a model type named in ``auto_model`` (one whose compiled step no GPU run has timed);
    ``true`` compiles on any device (so CPU runs and tests exercise it), and refuses a network
    with no blocks to compile (:func:`refuse_uncompilable`).
    """
    arch = type(network).__name__
    refuse_uncompilable(setting, arch)
    if setting.mode == 'false':
        return False, 'train.compile: false'
    if setting.mode == 'true':
        return True, ''
    if device_type != 'cuda':
        return False, f'train.compile: auto compiles on CUDA only, this run is on {device_type}'
    if auto_model:
        return False, (f'train.compile: auto compiles the FT step only (the one a GPU run timed compiled), '
                       f'not {auto_model}; true compiles it')
    if arch not in arch_compile.COMPILE_BY_DEFAULT:
        listed = ', '.join(sorted(arch_compile.COMPILE_BY_DEFAULT)) or 'empty'
        return False, (f'train.compile: auto, and no GPU measurement put {arch} in '
                       f'archs.compile.COMPILE_BY_DEFAULT ({listed})')
    return True, ''


class CompiledBlocksMixin:
    """Compiles the blocks of ``net_g`` after a training model is built (``train.compile``)."""

    #: Set by a model type whose compiled training step no GPU run has timed: ``auto`` leaves it
    #: eager (docs/results.md); ``true`` still compiles it.
    compile_auto_untimed = ''

    def __init__(self, opt: Dict) -> None:
        # checked before anything is built: a typo costs no model construction
        setting = compile_setting(opt.get('train') or {}) if opt.get('is_train') else None
        super().__init__(opt)
        if setting is not None:
            self.setup_compiled_blocks(setting)

    def setup_compiled_blocks(self, setting: CompileSetting) -> int:
        """Mark ``net_g``'s blocks per ``setting`` and log one line; returns how many were marked."""
        network = self.get_bare_model(self.net_g)
        compile_on, reason = compile_decision(setting, network, self.device.type, self.compile_auto_untimed)
        logger = get_root_logger()
        if not compile_on:
            logger.info(f'torch.compile: off ({reason})')
            return 0
        count = arch_compile.compile_blocks(network, setting.backend)
        names = '/'.join(c.__name__ for c in arch_compile.block_classes(network))
        where = '' if count else ' (none found outside use_checkpoint containers: all stay eager)'
        logger.info(f'torch.compile: on for {count} {type(network).__name__} {names} blocks{where}, backend '
                    f'{setting.backend}; training forwards only (validation and inference run eager), the first '
                    'training call of each block eager, then one compile per block variant, every frozen pattern in it')
        return count
