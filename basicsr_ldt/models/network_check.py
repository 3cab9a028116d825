"""``network_g`` checked before a run writes anything: its values, then one small image through it.

The networks take their arguments unchecked. A zero or negative size is a traceback from torch
inside the constructor; a channel count that does not divide (HAT's heads, SAFMN's four levels,
MambaIR's channel attention below 30 channels) or an output of the wrong size (MambaIR without an
upsampler at scale 4) is one at the first forward, after the experiment folder and log exist; and
some slips run silently (``n_blocks: 0`` or ``depths: [0]`` train a network without a body,
``mlp_ratio: 0`` one whose MLPs are their biases). So the values each shipped architecture reads
are typed here, and the network is built on the CPU and given one 16x16 RGB image (what the data
gives) before anything is written: any failure is one line naming ``network_g`` and the cause.
"""
import inspect
import math
import warnings
from typing import Any, Dict, Mapping, Optional

import torch

from archs.mambair_arch import CAB
from archs.safmn_arch import SAFM_LEVELS
from archs.scan.dispatch import resolve_backend
from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.schema import SCALE_KEYS
from basicsr_ldt.ldt.typed import Spec, check_options, integer, items, number

PROBE_SIDE = 16   # LR pixels: at most the demo's training patch, and every shipped network's padding unit

_RGB = Spec(lambda v: v == 3 and not isinstance(v, bool), '3 (the data is RGB)')
_POSITIVE = number(0, math.inf)
_TRANSFORMER = {'img_size': integer(1), 'in_chans': _RGB, 'embed_dim': integer(1), 'depths': items(integer(1)),
                'mlp_ratio': _POSITIVE, 'img_range': _POSITIVE, 'upscale': integer(1)}
#: The value of each argument the shipped architectures (and BasicSR's MSRResNet) read; the rules across keys
#: (HAT's heads dividing embed_dim, SAFMN's dim in four levels) are in ``_check_channel_splits``.
NETWORK_VALUES: Dict[str, Dict[str, Spec]] = {
    'SAFMN': {'dim': integer(1), 'n_blocks': integer(1), 'ffn_scale': _POSITIVE, 'upscaling_factor': integer(1)},
    'HAT': {**_TRANSFORMER, 'num_heads': items(integer(1)), 'window_size': integer(1), 'compress_ratio': integer(1),
            'squeeze_factor': integer(1), 'overlap_ratio': number(0, 1, '[)')},
    'MambaIR': {**_TRANSFORMER, 'd_state': integer(1)},
    'MSRResNet': {'num_in_ch': _RGB, 'num_out_ch': _RGB, 'num_feat': integer(1), 'num_block': integer(1),
                  'upscale': Spec(lambda v: v in (2, 3, 4) and not isinstance(v, bool), 'one of 2, 3, 4')},
}


def probe_network(section: Mapping[str, Any], scale: Optional[int] = None, path: str = 'network_g',
                  device_type: str = 'cpu') -> None:
    """Refuse a ``network_g`` whose values are off their type, that cannot be built, or that does not
    turn a 16x16 RGB image into a (16 scale)-pixel one; the network is built on the CPU and dropped.
    ``scale`` None: the network's own factor (its scale argument, else that argument's default);
    ``device_type``: where the run puts the network (a CUDA-only scan kernel is refused elsewhere)."""
    from basicsr.utils.registry import ARCH_REGISTRY
    kind = section.get('type')
    check_options(path, section, NETWORK_VALUES.get(kind, {}), InputError)
    arch = ARCH_REGISTRY.get(kind)
    _check_channel_splits({**_defaults(arch), **section}, path)
    if 'scan_backend' in section and device_type != 'cuda':
        backend = resolve_backend(section['scan_backend'])   # the scan's own check of the name
        if backend in ('cuda', 'triton'):
            raise InputError(f'{path}.scan_backend: {backend!r} runs on CUDA tensors, and this run is on the '
                             f"{device_type.upper()}: use 'auto' (or 'torch')")
    arguments, parameters = {k: v for k, v in section.items() if k != 'type'}, inspect.signature(arch).parameters
    if 'scan_backend' in parameters:
        arguments['scan_backend'] = 'torch'   # the probe runs on the CPU whatever kernel the run will use
    with torch.random.fork_rng(devices=[]):   # the run's own draws (its weights, crops) stay as without the probe
        out = _probe(arch, arguments, f'{path} type {kind}')
    if scale is None:
        key = next((k for k in SCALE_KEYS if k in section or k in parameters), None)
        scale = section.get(key, parameters[key].default) if key else None
    if not isinstance(scale, int):
        return
    wanted = (1, 3, PROBE_SIDE * scale, PROBE_SIDE * scale)
    if tuple(out.shape) != wanted:
        upsampler = f" (upsampler {section.get('upsampler', '')!r})" if 'upsampler' in parameters else ''
        raise InputError(f'{path} type {kind}: a {PROBE_SIDE}x{PROBE_SIDE} RGB image comes out {tuple(out.shape)}, '
                         f'and scale {scale} needs {wanted}{upsampler}')


def _probe(arch: Any, arguments: Mapping[str, Any], what: str) -> torch.Tensor:
    """The network's output for one random 16x16 RGB image; a failure to build or run it is one line."""
    try:
        with warnings.catch_warnings():   # zero-size layers warn before they fail; the error says it
            warnings.simplefilter('ignore')
            network = arch(**arguments).eval()
    except Exception as err:   # the constructor's own words: torch's or the architecture's check
        raise InputError(f'{what}: cannot be built: {_first_line(err)}') from None
    try:
        with torch.no_grad():
            return network(torch.rand(1, 3, PROBE_SIDE, PROBE_SIDE))
    except Exception as err:
        raise InputError(f'{what}: a {PROBE_SIDE}x{PROBE_SIDE} RGB image fails in its forward: '
                         f'{_first_line(err)}') from None


def _defaults(target: Any) -> Dict[str, Any]:
    """A constructor's default arguments (what a ``network_g`` leaving a key out builds)."""
    return {name: p.default for name, p in inspect.signature(target).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _check_channel_splits(values: Mapping[str, Any], path: str) -> None:
    """The channel splits the shipped architectures make, named before torch fails on a zero or a
    remainder: SAFMN's four levels, HAT's heads, the channel attention's squeeze (MambaIR's CAB keeps
    its default); ``values`` holds the constructor's defaults for what the section leaves out."""
    kind = values.get('type')
    if kind == 'SAFMN' and values.get('dim') is not None and values['dim'] % SAFM_LEVELS:
        raise InputError(f"{path}.dim: {values['dim']}, but SAFMN splits its channels into {SAFM_LEVELS} levels: "
                         'use a multiple of 4 (released: 36, 128)')
    if kind == 'MambaIR':
        dim, squeeze = values['embed_dim'], _defaults(CAB)['squeeze_factor']
        if dim < squeeze:
            raise InputError(f"{path}.embed_dim: {dim}, but MambaIR's channel attention divides it by {squeeze} (as "
                             f'upstream): use embed_dim >= {squeeze}')
    if kind != 'HAT':
        return
    dim = values['embed_dim']
    for heads in values['num_heads']:
        if dim % heads:
            raise InputError(f'{path}.num_heads: {heads} does not divide embed_dim {dim}')
    for key in ('squeeze_factor', 'compress_ratio'):
        if dim < values[key]:
            raise InputError(f'{path}.embed_dim: {dim} // {key} {values[key]} leaves no channel: use embed_dim >= '
                             f'{values[key]}')
    window, ratio = values['window_size'], values['overlap_ratio']
    if int(window * ratio) % 2:
        raise InputError(f"{path}.overlap_ratio: int(window_size {window} x overlap_ratio {ratio}) = "
                         f"{int(window * ratio)} is odd, and HAT's overlapping window needs it even (released: 16 x 0.5)")


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return f'{type(err).__name__}: {text[0] if text else ""}'.rstrip(': ')
