"""The Python API: ``load_network`` and ``upscale``, for notebooks and for ``inference.py``.

Modelled on timm's ``create_model`` + ``load_checkpoint`` habit: one call builds the network and
loads weights from any checkpoint this project or an upstream release writes, one call runs it on
an image. ``inference.py`` is a thin loop over files around these two functions, so the command
line and a notebook produce the same pixels.
"""
import os
import warnings
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import numpy as np
import torch
from torch import nn

from basicsr.archs import build_network
from basicsr.utils.registry import ARCH_REGISTRY

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.option_file import load_option_file
from basicsr_ldt.common.options import registered
from basicsr_ldt.common.schema import SCALE_KEYS, check_network, describe_file
from basicsr_ldt.inference.settings import INFERENCE_DEFAULTS, InferenceSettings, inference_settings
from basicsr_ldt.inference.tiling import run_inference
from basicsr_ldt.models.network_check import probe_network
from basicsr_ldt.weights.checkpoint import load_weights
from basicsr_ldt.weights.releases import ARCH_DEFAULTS


def network_options(arch: Optional[str] = None, opt: Union[str, Mapping, None] = None,
                    scale: Optional[int] = None) -> Dict[str, Any]:
    """The ``network_g`` section to build: from an option file/dict, or an arch's classic defaults."""
    if (arch is None) == (opt is None):
        raise InputError('give exactly one of arch (MambaIR, HAT, SAFMN) or opt (an option file or dict)')
    if opt is not None:
        where = 'options'
        if isinstance(opt, (str, os.PathLike)):   # plain YAML only: a Python tag in the file is refused, not run
            where, opt = describe_file(os.fspath(opt)), load_option_file(os.fspath(opt))
        if not isinstance(opt, Mapping) or not isinstance(opt.get('network_g'), Mapping):
            raise InputError(f"{where}: no 'network_g' section naming the network to build")
        check_network(opt['network_g'], 'network_g', where)
        section = dict(opt['network_g'])
    else:
        if arch not in ARCH_DEFAULTS:
            raise InputError(f"arch '{arch}' has no built-in defaults (known: {', '.join(ARCH_DEFAULTS)}); "
                             'give an option file with a network_g section instead')
        section = {'type': arch, **ARCH_DEFAULTS[arch]}
    if scale is not None:
        if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1:
            raise InputError(f'scale: expected an integer >= 1, got {scale!r}')
        key = next((k for k in SCALE_KEYS if k in section), None)
        if key is None:
            raise InputError(f"network_g of type '{section.get('type')}' has no scale argument "
                             f"({', '.join(SCALE_KEYS)}) to set to {scale}")
        section[key] = scale
    return section


def load_network(checkpoint: str, arch: Optional[str] = None, opt: Union[str, Mapping, None] = None,
                 device: Union[str, torch.device, None] = None, scale: Optional[int] = None,
                 param_key: Optional[str] = None) -> nn.Module:
    """Build a network and load ``checkpoint`` into it, ready for :func:`upscale` (eval mode).

    The network comes from ``opt`` (an option file path or dict; its ``network_g``) or from
    ``arch`` with that architecture's classic x4 defaults; ``scale`` overrides the factor of
    either. Checkpoints: this project's ``net_g_*.pth`` (LDT's composite included), upstream
    releases (``params`` / ``params_ema``) and bare state dicts, all read with
    ``weights_only=True``; ``param_key`` picks the entry (default: ``params_ema`` when the file
    has it, else ``params``; a key named that the file lacks is an error). A checkpoint of
    another network raises :class:`InputError` naming the missing/unexpected keys.
    """
    return loaded_network(checkpoint, arch, opt, device, scale, param_key)[0]


def loaded_network(checkpoint: str, arch: Optional[str] = None, opt: Union[str, Mapping, None] = None,
                   device: Union[str, torch.device, None] = None, scale: Optional[int] = None,
                   param_key: Optional[str] = None) -> Tuple[nn.Module, Optional[str]]:
    """:func:`load_network`, and the key its weights were read from (None: a bare state dict), for
    ``inference.py`` to say which of a file's weights (``params`` or ``params_ema``) it ran."""
    section = network_options(arch, opt, scale)
    registered(ARCH_REGISTRY, section.get('type'), 'network_g.type')
    device = resolve_device(device)
    probe_network(section, device_type=device.type)
    network = build_network(dict(section))
    key = load_weights(network, checkpoint, param_key, fallback=False).key
    network.requires_grad_(False)
    return network.to(device).eval(), key


def resolve_device(device: Union[str, torch.device, None] = None) -> torch.device:
    """``device``, by default CUDA when torch sees it, else the CPU; CUDA asked for without it is an error."""
    if device is None:
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"device: expected 'cpu', 'cuda' or 'cuda:<index>', got {device!r}") from None
    if device.type not in ('cpu', 'cuda'):   # the networks and the Triton scan run on these two
        raise InputError(f"device: expected 'cpu', 'cuda' or 'cuda:<index>', got {str(device)!r}")
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise InputError("device 'cuda' was asked for, but torch sees no CUDA device")
    return device


def network_scale(network: nn.Module) -> int:
    """The upscaling factor of ``network``: its scale attribute, else measured on a small input."""
    for key in SCALE_KEYS:
        value = getattr(network, key, None)
        if isinstance(value, int) and value >= 1:
            return value
    parameter = next(network.parameters())
    with torch.no_grad():
        out = network(torch.zeros(1, 3, 16, 16, device=parameter.device, dtype=parameter.dtype))
    return out.shape[-1] // 16


def upscale(network: nn.Module, image: Union[np.ndarray, torch.Tensor],
            tile_size: Optional[int] = INFERENCE_DEFAULTS['tile_size'],
            precision: Optional[str] = INFERENCE_DEFAULTS['precision'],
            tile_overlap: Optional[int] = INFERENCE_DEFAULTS['tile_overlap'], *,
            tile_mode: Optional[str] = INFERENCE_DEFAULTS['tile_mode'],
            tile: Optional[int] = None) -> Union[np.ndarray, torch.Tensor]:
    """Super-resolve one image (or a batch of tensors) and return it in the same form.

    numpy: ``HxW``, ``HxWx1``, ``HxWx3`` (RGB) or ``HxWx4`` (RGBA), ``uint8`` or ``uint16``; the
    result has the same layout and dtype. Grayscale is replicated to RGB for the network and
    averaged back; alpha is resized bicubically on its own (a mask is not a photograph: the
    network would add camera-like texture to it). torch: ``NCHW`` or ``CHW`` float in [0, 1];
    the result is float32 in [0, 1] on the input's device.

    The image is run as ``test:`` and ``val:`` run theirs (same keys, same checks, same code:
    :mod:`basicsr_ldt.inference.settings`): ``tile_mode`` ``'official'`` cuts it as the official
    LDT evaluation does (what the paper's numbers were measured with), ``'fixed'`` in
    ``tile_size`` LR tiles overlapping by ``tile_overlap``, ``'whole'`` in one pass; left at None
    it is ``'fixed'`` when ``tile_size`` > 0, else ``'whole'``. ``precision`` ``bf16``/``fp16``
    run under autocast. None for any of these is its default. ``tile`` is the older name of
    ``tile_size`` (``tile=64``: fixed tiles, as before; it warns). A bad value raises
    :class:`InputError` in ``test:``'s wording, naming the keyword.
    """
    if tile is not None:
        if tile_size:
            raise InputError('give tile_size or its older name tile, not both')
        warnings.warn('upscale(tile=...) is now upscale(tile_size=...)', DeprecationWarning, stacklevel=2)
        tile_size = tile
    settings = inference_settings(None, {'tile_mode': tile_mode, 'tile_size': tile_size,
                                         'tile_overlap': tile_overlap, 'precision': precision},
                                  next(network.parameters()).device.type)
    return _upscale(network, image, settings)


def _upscale(network: nn.Module, image: Union[np.ndarray, torch.Tensor],
             settings: InferenceSettings) -> Union[np.ndarray, torch.Tensor]:
    if isinstance(image, torch.Tensor):
        if image.dim() not in (3, 4) or image.shape[-3] != 3 or not image.is_floating_point() or not image.numel():
            raise InputError(f'expected a float tensor NCHW or CHW with 3 channels in [0, 1], got '
                             f'{image.dtype} of shape {tuple(image.shape)}')
        low, high = float(image.min()), float(image.max())   # NaN fails both comparisons
        if not (low >= -1e-3 and high <= 1 + 1e-3):   # 0..255 was clipped to a white image
            raise InputError(f'expected a float tensor with values in [0, 1], got values in [{low:g}, {high:g}]'
                             + (' (divide by 255)' if high > 1 and high <= 255 else ''))
        batch = image if image.dim() == 4 else image.unsqueeze(0)
        out = _infer(network, batch, settings)
        return out if image.dim() == 4 else out[0]
    if not isinstance(image, np.ndarray):
        raise InputError(f'expected a numpy array or a torch tensor, got {type(image).__name__}')
    if image.dtype not in (np.uint8, np.uint16):
        raise InputError(f'expected a uint8 or uint16 image, got {image.dtype}')
    if image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 1):
        gray = image.reshape(image.shape[0], image.shape[1], 1)
        out = _upscale(network, np.repeat(gray, 3, axis=2), settings)
        mean = out.astype(np.float64).mean(axis=2, keepdims=True)
        return np.round(mean).astype(image.dtype).reshape(out.shape[:2] + image.shape[2:])
    if image.ndim != 3 or image.shape[2] not in (3, 4) or not image.size:
        raise InputError(f'expected a non-empty image of shape HxW, HxWx1, HxWx3 or HxWx4, got {image.shape}')
    if image.shape[2] == 4:
        rgb = _upscale(network, np.ascontiguousarray(image[..., :3]), settings)
        return np.concatenate([rgb, resize_bicubic(image[..., 3:], rgb.shape[:2])], axis=2)
    peak = float(np.iinfo(image.dtype).max)
    tensor = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))).float().div_(peak).unsqueeze(0)
    out = _infer(network, tensor, settings)[0]
    return np.round(out.permute(1, 2, 0).numpy() * peak).astype(image.dtype)


def _infer(network: nn.Module, batch: torch.Tensor, settings: InferenceSettings) -> torch.Tensor:
    """NCHW float in [0, 1] -> NCHW float32 in [0, 1] on the input's device, through test's and
    validation's :func:`run_inference`."""
    parameter = next(network.parameters())
    out = run_inference(network, batch.to(parameter.device, parameter.dtype), network_scale(network), settings)
    return out.clamp_(0, 1).to(batch.device)


def resize_bicubic(channel: np.ndarray, size) -> np.ndarray:
    """Bicubic resize of an ``HxWx1`` integer image to ``size`` (h, w), clipped to its dtype."""
    import cv2

    resized = cv2.resize(channel[..., 0].astype(np.float32), (size[1], size[0]), interpolation=cv2.INTER_CUBIC)
    peak = np.iinfo(channel.dtype).max
    return np.clip(np.round(resized), 0, peak).astype(channel.dtype)[..., None]
