"""Atomic checkpoint writes and safe checkpoint reads.

A job killed while writing must never leave a truncated file where the last good checkpoint
was, and a checkpoint from elsewhere must never run code when it is opened: writes go to a
temporary file in the same folder that is renamed into place, reads use ``weights_only=True``.
"""
import logging
import os
import pickle
import re
import tempfile
from typing import Any, List, NamedTuple, Optional, Tuple

import torch

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.weights.releases import fetch_hint, resolve_checkpoint


class UnreadableCheckpoint(InputError):
    """The file is there but is not a readable checkpoint (truncated, empty, not a torch file)."""


class Weights(dict):
    """A state dict and the checkpoint key it was read from (``None``: a bare state dict), so a log
    line names the weights loaded, not the key asked for when that one fell back to the other."""
    key: Optional[str] = None


class Loaded(NamedTuple):
    """What :func:`load_weights` loaded: the network's tensors the file lacks, the key read, and the
    file's tensors the network has no place for (a non-strict load drops them)."""
    missing: List[str]
    key: Optional[str]
    unused: List[str]


def save_atomic(obj: Any, path: str) -> None:
    """``torch.save`` to ``path`` so that readers see the old file or the complete new one."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix='.' + os.path.basename(path) + '.', suffix='.tmp', dir=folder)
    try:
        with os.fdopen(handle, 'wb') as stream:
            torch.save(obj, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_safe(path: str, what: str = 'checkpoint') -> Any:
    """Load a checkpoint on the CPU with ``weights_only=True``; refuse pickled code with a reason."""
    if os.path.isdir(path):
        raise InputError(f"{what} '{path}' is a folder; expected a file saved by torch.save (.pth, .state)")
    if not os.path.isfile(path):
        raise InputError(f"{what} '{path}' does not exist{fetch_hint(path) if what == 'checkpoint' else ''}")
    try:
        return torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as err:
        named = re.search(r'GLOBAL ([\w.]+)', str(err))
        if named is None:   # not an object torch refused to build, but bytes no unpickler reads
            raise UnreadableCheckpoint(f"cannot read {what} '{path}': damaged or not a file saved by torch.save "
                                       f'({_unpickler_complaint(err)})') from None
        raise InputError(f"refusing to load {what} '{path}': it contains pickled objects other than tensors "
                         f'and plain containers ({named[1]}), and loading them could run arbitrary code') from None
    except (RuntimeError, EOFError, OSError) as err:
        reason = str(err).split('\n')[0] or type(err).__name__
        raise UnreadableCheckpoint(f"cannot read {what} '{path}': damaged or truncated ({reason})") from None
    except (LookupError, ValueError) as err:   # text (a URL, a download's error page) or bytes the unpickler trips on
        raise UnreadableCheckpoint(f"cannot read {what} '{path}': damaged or not a file saved by torch.save (the "
                                   f'unpickler met {type(err).__name__}: {err})') from None


def _unpickler_complaint(err: Exception) -> str:
    """The line of torch's weights-only error that says what it met (its advice to load unsafely left out)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    after = [line for before, line in zip(lines, lines[1:]) if before.endswith('WeightsUnpickler error:')]
    return (after or ['not a pickle torch reads'])[0]


def extract_state_dict(checkpoint: Any, path: str, param_key: Optional[str] = 'params',
                       fallback: bool = True) -> Weights:
    """The network weights in a BasicSR-style checkpoint (``params``/``params_ema``) or a bare dict.

    ``param_key=None`` takes ``params_ema``, else ``params``, else a bare state dict, silently (the
    order a user of a released file expects). A named key that is absent falls back to the other
    with a warning, as BasicSR's ``param_key_g`` does (option files name ``params_ema`` for releases
    that hold only ``params``); with ``fallback`` False (a key the user named for this file: a test
    entry's ``param_key``) it is refused, or a row labelled EMA would show other weights.
    """
    if param_key is None and isinstance(checkpoint, dict):
        param_key = next((k for k in ('params_ema', 'params') if k in checkpoint), None)
    used: Optional[str] = param_key
    if isinstance(checkpoint, dict) and param_key in checkpoint:
        state = checkpoint[param_key]
    elif (fallback and isinstance(checkpoint, dict) and param_key is not None
          and {'params', 'params_ema'} & set(checkpoint)):
        used = 'params_ema' if 'params_ema' in checkpoint else 'params'
        logging.getLogger('basicsr').warning(f"checkpoint '{path}' has no '{param_key}' weights: loading '{used}'")
        state = checkpoint[used]
    elif isinstance(checkpoint, dict) and all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
        state, used = checkpoint, None
    else:
        keys = list(checkpoint)[:5] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise InputError(f"checkpoint '{path}' has no '{param_key or 'params'}' weights (top-level keys: {keys})")
    weights = Weights((k[7:] if k.startswith('module.') else k, v) for k, v in state.items())
    weights.key = used
    return weights


def read_state(path: str, param_key: Optional[str] = 'params', fallback: bool = True) -> Tuple[str, Weights]:
    """The resolved file and its network weights (``path`` may be a release name, see ``releases``)."""
    path = resolve_checkpoint(path)
    return path, extract_state_dict(load_safe(path), path, param_key, fallback)


def fitting_state(network: torch.nn.Module, path: str, param_key: Optional[str] = 'params', strict: bool = True,
                  what: str = 'checkpoint', fallback: bool = True) -> Weights:
    """The file's weights, refused in one line naming a few mismatched keys when they do not fit
    ``network`` (``what`` names the file's option in that line)."""
    path, state = read_state(path, param_key, fallback)
    own = network.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong_shape = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    problems = []
    if strict and missing:
        problems.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
    if strict and unexpected:
        problems.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
    if wrong_shape:
        k = wrong_shape[0]
        problems.append(f'{len(wrong_shape)} with another shape (e.g. {k}: checkpoint {tuple(state[k].shape)}, '
                        f'network {tuple(own[k].shape)})')
    if problems:
        raise InputError(f"{what} '{path}' does not fit network {type(network).__name__}: keys "
                         + '; '.join(problems))
    weights = dict(network.named_parameters())
    broken = sorted(k for k in set(weights) & set(state)
                    if state[k].is_floating_point() and not torch.isfinite(state[k]).all())
    if broken:
        raise InputError(f"{what} '{path}' holds NaN or inf in {len(broken)} of its weight tensors (e.g. {broken[0]}): "
                         'the file of a run that diverged? Every output of the network would be NaN')
    if own and len(missing) == len(own):   # strict off: a network left wholly at its random start
        raise InputError(f"{what} '{path}' holds none of network {type(network).__name__}'s {len(own)} tensors "
                         f"(it has e.g. {', '.join(unexpected[:2]) or 'nothing'}): another network's weights? A "
                         'non-strict load (strict_load_g: false) loads the tensors that match, and none does')
    return state


def load_weights(network: torch.nn.Module, path: str, param_key: Optional[str] = 'params',
                 strict: bool = True, fallback: bool = True) -> Loaded:
    """Load weights into ``network``, naming a few mismatched keys instead of a wall of text; returns
    the network's tensors the file lacks (only a non-strict load leaves any: callers say so) and the
    key the weights were read from.

    ``path`` may be a release name (``HAT_SRx4``: ``pretrained/HAT_SRx4.pth``, see ``releases``)."""
    state = fitting_state(network, path, param_key, strict, fallback=fallback)
    own = set(network.state_dict())
    network.load_state_dict(state, strict=strict)
    return Loaded(sorted(own - set(state)), state.key, sorted(set(state) - own))


def describe_unloaded(loaded: Loaded, network: torch.nn.Module) -> str:
    """'' for a whole load, else what a log says of the tensors left at their initial values and of
    the file's tensors left out."""
    parts = []
    if loaded.missing:
        parts.append(f'{len(loaded.missing)} of its {len(network.state_dict())} tensors are not in the file and keep '
                     f"their initial values (e.g. {', '.join(loaded.missing[:3])})")
    if loaded.unused:
        parts.append(f'{len(loaded.unused)} tensors of the file are not in the network and were not loaded (e.g. '
                     f"{', '.join(loaded.unused[:3])})")
    return ''.join(f'; {part}' for part in parts)
