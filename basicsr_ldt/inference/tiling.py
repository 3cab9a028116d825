"""Super-resolving whole test images, in tiles when they are too large for memory.

Two ways of cutting an image: the official LDT code's (:func:`official_forward`, ``tile_mode:
official``: a section count that grows with the image, 10% overlap) and fixed-size tiles
(:func:`tiled_forward`, ``tile_mode: fixed``); :func:`run_inference` picks one from the
``InferenceSettings`` of ``test:`` or ``val:``, for ``test.py`` and for validation alike.
"""
from typing import Callable, List, NamedTuple, Optional

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from basicsr_ldt.inference.settings import InferenceSettings
from basicsr_ldt.ldt.precision import autocast


@torch.no_grad()
def tiled_forward(network: nn.Module, lq: torch.Tensor, scale: int, tile_size: int = 0,
                  tile_overlap: int = 16, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``network(lq)``, computed tile by tile when ``tile_size`` > 0.

    ``dtype`` (bf16/fp16) runs the network under autocast, weights staying fp32; the result is
    always fp32, so metrics and image writing never see half-precision values.

    Tiles are ``tile_size`` LR pixels wide and overlap by ``tile_overlap``. Each tile contributes
    only the part at least ``tile_overlap // 2`` pixels away from its inner borders, so for a
    network whose receptive field radius is at most that margin the result equals whole-image
    inference exactly (no averaged seams). The official LDT evaluation cuts otherwise
    (:func:`official_forward`).
    """
    if tile_size <= 0:
        return _forward(network, lq, dtype)
    if tile_overlap < 0 or tile_overlap >= tile_size:
        raise ValueError(f'tile_overlap must be in [0, tile_size); got {tile_overlap} with tile_size {tile_size}')
    h, w = lq.shape[-2:]
    margin = tile_overlap // 2
    output = None
    for top in _starts(h, tile_size, tile_size - tile_overlap):
        for left in _starts(w, tile_size, tile_size - tile_overlap):
            sr = _forward(network, lq[..., top:top + tile_size, left:left + tile_size], dtype)
            if output is None:
                output = sr.new_zeros(*sr.shape[:-2], h * scale, w * scale)
            rows = _kept(top, min(tile_size, h), h, margin)
            cols = _kept(left, min(tile_size, w), w, margin)
            output[..., rows[0] * scale:rows[1] * scale, cols[0] * scale:cols[1] * scale] = \
                sr[..., (rows[0] - top) * scale:(rows[1] - top) * scale, (cols[0] - left) * scale:(cols[1] - left) * scale]
    return output


#: The official code cuts an axis of ``n`` LR pixels into ``n // OFFICIAL_SECTION + 1`` sections.
OFFICIAL_SECTION = 200


class OfficialAxis(NamedTuple):
    """How ``Tools/Test_tool.py`` ``SR_slice`` cuts one axis of the LR image."""

    count: int     # sections along the axis: length // 200 + 1
    pad: int       # reflect-padded pixels at the far end, so count divides the padded length
    section: int   # padded length // count
    shave: int     # section // 10: how far a section reaches into each inner neighbour


def official_axis(length: int) -> OfficialAxis:
    count = length // OFFICIAL_SECTION + 1
    pad = (count - length % count) % count
    section = (length + pad) // count
    return OfficialAxis(count, pad, section, section // 10)


def _official_spans(axis: OfficialAxis):
    """Per section: (first, end) of the LR pixels it is run on, and the offset of its own
    ``section`` pixels inside them (0 for the first section, ``shave`` for the others)."""
    for k in range(axis.count):
        first = k * axis.section - (axis.shave if k > 0 else 0)
        end = (k + 1) * axis.section + (axis.shave if k < axis.count - 1 else 0)
        yield first, end, k * axis.section - first


@torch.no_grad()
def official_forward(network: nn.Module, lq: torch.Tensor, scale: int,
                     dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``network(lq)`` cut as the official LDT evaluation cuts it (``SR_slice``; the paper's numbers).

    Each axis gets ``length // 200 + 1`` sections; the image is reflect-padded at the bottom and
    right so the count divides it; every section is run with ``section // 10`` extra LR pixels
    towards each inner neighbour and contributes only its own pixels; the padding is cut off the
    result. Sections are at most about 240 LR pixels a side whatever the image size, so memory is
    bounded by a section. Result: fp32, as :func:`tiled_forward`.
    """
    h, w = lq.shape[-2:]
    rows, cols = official_axis(h), official_axis(w)
    padded = F.pad(lq, (0, cols.pad, 0, rows.pad), mode='reflect') if rows.pad or cols.pad else lq
    output = None
    for i, (top, bottom, row_offset) in enumerate(_official_spans(rows)):
        for j, (left, right, col_offset) in enumerate(_official_spans(cols)):
            sr = _forward(network, padded[..., top:bottom, left:right], dtype)
            if output is None:
                output = sr.new_zeros(*sr.shape[:-2], (h + rows.pad) * scale, (w + cols.pad) * scale)
            output[..., i * rows.section * scale:(i + 1) * rows.section * scale,
                   j * cols.section * scale:(j + 1) * cols.section * scale] = \
                sr[..., row_offset * scale:(row_offset + rows.section) * scale,
                   col_offset * scale:(col_offset + cols.section) * scale]
    return output[..., :h * scale, :w * scale]


def _forward(network: Callable, tile: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.Tensor:
    with autocast(tile.device.type, dtype):
        return network(tile).float()


def run_inference(network: nn.Module, lq: torch.Tensor, scale: int, settings: InferenceSettings) -> torch.Tensor:
    """``network(lq)`` as ``settings`` (``test:`` or ``val:``) ask:
    whole image, fixed tiles or the official sections, under the chosen precision; fp32 out."""
    if settings.tile_mode == 'official':
        return official_forward(network, lq, scale, settings.dtype)
    tile = settings.tile_size if settings.tile_mode == 'fixed' else 0
    return tiled_forward(network, lq, scale, tile, settings.tile_overlap, settings.dtype)


@torch.no_grad()
def bicubic_upscale(lq: torch.Tensor, scale: int) -> torch.Tensor:
    """The Bicubic row of every results table: each LR image of ``lq`` (NCHW float in [0, 1])
    upscaled with ``cv2.resize(..., interpolation=cv2.INTER_CUBIC)`` (OpenCV's bicubic, Keys
    kernel a = -0.75, pixel centres aligned, border pixels replicated) in float32, NOT clipped.

    It is returned like a network's output (float NCHW on ``lq``'s device), so the same metric
    code turns it into uint8 the same way (BasicSR ``tensor2img``: clamp to [0, 1], x 255, round):
    a comparison with bicubic then differs from one with a network only in the upscaler.
    """
    n, c, h, w = lq.shape
    images = lq.detach().float().cpu().numpy().transpose(0, 2, 3, 1)   # NHWC
    out = np.empty((n, h * scale, w * scale, c), np.float32)
    for i, image in enumerate(images):
        out[i] = cv2.resize(np.ascontiguousarray(image), (w * scale, h * scale),
                            interpolation=cv2.INTER_CUBIC).reshape(h * scale, w * scale, c)
    return torch.from_numpy(out.transpose(0, 3, 1, 2).copy()).to(lq.device)


def _starts(length: int, tile: int, stride: int) -> List[int]:
    """Tile origins covering ``[0, length)``; the last tile is flush with the border."""
    if length <= tile:
        return [0]
    return list(range(0, length - tile, stride)) + [length - tile]


def _kept(start: int, size: int, length: int, margin: int):
    """LR range of a tile that is written: inner borders lose ``margin`` pixels, image borders none."""
    return (start + margin if start > 0 else 0, start + size - margin if start + size < length else length)
