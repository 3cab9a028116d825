"""Super-resolving whole test images, in tiles when they are too large for memory."""
from typing import List, Optional

import cv2
import numpy as np
import torch
from torch import nn

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
    inference exactly (no averaged seams). The official LDT evaluation also tiles DRealSR's large
    test images (~200 px), because whole-image inference does not fit in GPU memory.
    """
    def forward(tile: torch.Tensor) -> torch.Tensor:
        with autocast(tile.device.type, dtype):
            return network(tile).float()

    if tile_size <= 0:
        return forward(lq)
    if tile_overlap < 0 or tile_overlap >= tile_size:
        raise ValueError(f'tile_overlap must be in [0, tile_size); got {tile_overlap} with tile_size {tile_size}')
    h, w = lq.shape[-2:]
    margin = tile_overlap // 2
    output = None
    for top in _starts(h, tile_size, tile_size - tile_overlap):
        for left in _starts(w, tile_size, tile_size - tile_overlap):
            sr = forward(lq[..., top:top + tile_size, left:left + tile_size])
            if output is None:
                output = sr.new_zeros(*sr.shape[:-2], h * scale, w * scale)
            rows = _kept(top, min(tile_size, h), h, margin)
            cols = _kept(left, min(tile_size, w), w, margin)
            output[..., rows[0] * scale:rows[1] * scale, cols[0] * scale:cols[1] * scale] = \
                sr[..., (rows[0] - top) * scale:(rows[1] - top) * scale, (cols[0] - left) * scale:(cols[1] - left) * scale]
    return output


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
