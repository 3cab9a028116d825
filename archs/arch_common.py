"""Pieces shared by the MambaIR and HAT re-implementations.

Module attribute names here are part of the checkpoint format (``patch_embed.norm.weight``,
``upsample.0.weight``); do not rename them.
"""
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn


class _TokenGrid(nn.Module):
    """Geometry that upstream stores on its patch (un)embedding modules.

    ``img_size``/``patch_size``/``in_chans`` only derive ``patches_resolution`` (HAT uses it to
    clamp its window size); the forward passes work at any input size.
    """

    def __init__(self, img_size=224, patch_size=4, in_chans=3, embed_dim=96):
        super().__init__()
        img_size, patch_size = _pair(img_size), _pair(patch_size)
        self.img_size, self.patch_size = img_size, patch_size
        self.patches_resolution = [img_size[0] // patch_size[0], img_size[1] // patch_size[1]]
        self.num_patches = self.patches_resolution[0] * self.patches_resolution[1]
        self.in_chans, self.embed_dim = in_chans, embed_dim


class PatchEmbed(_TokenGrid):
    """(b, c, h, w) feature map -> (b, h*w, c) tokens, optionally normalised."""

    def __init__(self, img_size=224, patch_size=4, in_chans=3, embed_dim=96,
                 norm_layer: Optional[Callable[[int], nn.Module]] = None):
        super().__init__(img_size, patch_size, in_chans, embed_dim)
        self.norm = norm_layer(embed_dim) if norm_layer is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(2).transpose(1, 2)
        return x if self.norm is None else self.norm(x)


class PatchUnEmbed(_TokenGrid):
    """(b, h*w, c) tokens -> (b, c, h, w) feature map; has no parameters."""

    def __init__(self, img_size=224, patch_size=4, in_chans=3, embed_dim=96, norm_layer=None):
        super().__init__(img_size, patch_size, in_chans, embed_dim)

    def forward(self, x: torch.Tensor, x_size: Tuple[int, int]) -> torch.Tensor:
        return x.transpose(1, 2).contiguous().view(x.shape[0], self.embed_dim, x_size[0], x_size[1])


class UpsampleOneStep(nn.Sequential):
    """One conv + one pixel shuffle straight to the output channels (lightweight SR head)."""

    def __init__(self, scale: int, num_feat: int, num_out_ch: int):
        self.num_feat = num_feat
        super().__init__(nn.Conv2d(num_feat, scale * scale * num_out_ch, 3, 1, 1), nn.PixelShuffle(scale))


def _pair(v) -> Tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def pad_to_multiple(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Pad bottom/right so h and w are multiples of ``multiple``.

    Reflect padding, as HAT's released test model does before calling the network; sides too
    short to reflect (pad >= size) fall back to edge replication.
    """
    h, w = x.shape[-2:]
    pad_h, pad_w = (-h) % multiple, (-w) % multiple
    if pad_h == 0 and pad_w == 0:
        return x
    mode = 'reflect' if pad_h < h and pad_w < w else 'replicate'
    return F.pad(x, (0, pad_w, 0, pad_h), mode=mode)


def init_transformer_weights(m: nn.Module) -> None:
    """Init used by SwinIR-style networks (HAT, MambaIR): truncated-normal Linear weights,
    zero biases, identity LayerNorms. Applied with ``model.apply``."""
    if isinstance(m, nn.Linear):
        trunc_normal_(m.weight, std=.02)
        if m.bias is not None:
            nn.init.constant_(m.bias, 0)
    elif isinstance(m, nn.LayerNorm):
        nn.init.constant_(m.bias, 0)
        nn.init.constant_(m.weight, 1.0)


def drop_path_rates(rate: float, count: int) -> List[float]:
    """Stochastic-depth rate per block, rising linearly from 0 to ``rate`` (computed on the CPU
    so that models can also be built under ``torch.device('meta')``)."""
    return torch.linspace(0, rate, count, device='cpu').tolist()


def rgb_mean(in_chans: int) -> torch.Tensor:
    """DIV2K RGB mean subtracted before the network (zeros for non-RGB input), shape (1, c, 1, 1)."""
    if in_chans == 3:
        return torch.tensor((0.4488, 0.4371, 0.4040)).view(1, 3, 1, 1)
    return torch.zeros(1, 1, 1, 1)
