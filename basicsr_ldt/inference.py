"""Super-resolving whole test images, in tiles when they are too large for memory."""
import torch
from torch import nn


@torch.no_grad()
def tiled_forward(network: nn.Module, lq: torch.Tensor, scale: int, tile_size: int = 0,
                  tile_overlap: int = 16) -> torch.Tensor:
    """``network(lq)``, computed tile by tile when ``tile_size`` > 0.

    Tiles are ``tile_size`` LR pixels wide and overlap by ``tile_overlap``; overlapping outputs are
    averaged, which hides seams. The official LDT evaluation cuts DRealSR's large test images into
    ~200-pixel tiles for the same reason: whole-image inference does not fit in GPU memory.
    """
    if tile_size <= 0:
        return network(lq)
    if tile_overlap < 0 or tile_overlap >= tile_size:
        raise ValueError(f'tile_overlap must be in [0, tile_size); got {tile_overlap} with tile_size {tile_size}')
    b, c, h, w = lq.shape
    stride = tile_size - tile_overlap
    output, weight = None, None
    for top in _starts(h, tile_size, stride):
        for left in _starts(w, tile_size, stride):
            patch = lq[..., top:top + tile_size, left:left + tile_size]
            sr = network(patch)
            if output is None:
                output = sr.new_zeros(b, sr.shape[1], h * scale, w * scale)
                weight = sr.new_zeros(1, 1, h * scale, w * scale)
            rows = slice(top * scale, top * scale + sr.shape[-2])
            cols = slice(left * scale, left * scale + sr.shape[-1])
            output[..., rows, cols] += sr
            weight[..., rows, cols] += 1
    return output / weight


def _starts(length: int, tile: int, stride: int):
    """Tile origins covering ``[0, length)``; the last tile is flush with the border."""
    if length <= tile:
        return [0]
    starts = list(range(0, length - tile, stride))
    return starts + [length - tile]
