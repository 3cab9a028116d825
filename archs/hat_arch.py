"""HAT, Hybrid Attention Transformer (Chen et al., CVPR 2023), checkpoint-compatible with
github.com/XPixelGroup/HAT (HAT, HAT-S, HAT-L, Real-HAT-GAN are configurations of one class).

Constructor arguments, defaults, state_dict keys (including the relative-position-index
buffers) and outputs follow upstream. Differences: the network pads its input to a multiple of
``window_size`` itself (reflect, as upstream's ``HATModel.pre_process``) and crops the output,
so any input size works under plain BasicSR ``SRModel``; ``use_checkpoint`` is honoured
(upstream ignores it); an ``upsampler`` other than 'pixelshuffle' or an unknown
``resi_connection`` is rejected (upstream silently builds a network that returns its input).
"""
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.utils.checkpoint as checkpoint
from basicsr.archs.arch_util import Upsample
from basicsr.archs.rcan_arch import ChannelAttention
from basicsr.utils.registry import ARCH_REGISTRY
from einops import rearrange
from timm.layers import DropPath, to_2tuple, trunc_normal_
from torch import nn

from archs.arch_common import (PatchEmbed, PatchUnEmbed, drop_path_rates, init_transformer_weights,
                                pad_to_multiple, rgb_mean)


class CAB(nn.Module):
    """Channel attention block: conv-GELU-conv then RCAN channel attention."""

    def __init__(self, num_feat: int, compress_ratio: int = 3, squeeze_factor: int = 30):
        super().__init__()
        self.cab = nn.Sequential(
            nn.Conv2d(num_feat, num_feat // compress_ratio, 3, 1, 1),
            nn.GELU(),
            nn.Conv2d(num_feat // compress_ratio, num_feat, 3, 1, 1),
            ChannelAttention(num_feat, squeeze_factor))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cab(x)


class Mlp(nn.Module):
    """Two-layer token MLP."""

    def __init__(self, in_features: int, hidden_features=None, out_features=None, act_layer=nn.GELU,
                 drop: float = 0.):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features or in_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features or in_features, out_features or in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


def window_partition(x: torch.Tensor, window_size: int) -> torch.Tensor:
    """(b, h, w, c) -> (b * windows, window_size, window_size, c)."""
    b, h, w, c = x.shape
    x = x.view(b, h // window_size, window_size, w // window_size, window_size, c)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, c)


def window_reverse(windows: torch.Tensor, window_size: int, h: int, w: int) -> torch.Tensor:
    """Inverse of :func:`window_partition`."""
    b = int(windows.shape[0] / (h * w / window_size / window_size))
    x = windows.view(b, h // window_size, w // window_size, window_size, window_size, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(b, h, w, -1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float,
            mask: Optional[torch.Tensor] = None, dropout: Optional[nn.Module] = None) -> torch.Tensor:
    """Scaled dot-product attention with a per-head position bias and an optional window mask."""
    attn = (q * scale) @ k.transpose(-2, -1) + bias.unsqueeze(0)
    if mask is not None:
        nw, heads, n = mask.shape[0], attn.shape[1], attn.shape[2]
        attn = attn.view(-1, nw, heads, n, attn.shape[3]) + mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, heads, n, attn.shape[4])
    attn = attn.softmax(dim=-1)
    return (attn if dropout is None else dropout(attn)) @ v


class WindowAttention(nn.Module):
    """Window multi-head self-attention with a learned relative-position bias table."""

    def __init__(self, dim: int, window_size: Tuple[int, int], num_heads: int, qkv_bias: bool = True,
                 qk_scale=None, attn_drop: float = 0., proj_drop: float = 0.):
        super().__init__()
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size[0] - 1) * (2 * window_size[1] - 1), num_heads))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        trunc_normal_(self.relative_position_bias_table, std=.02)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor, rpi: torch.Tensor, mask=None) -> torch.Tensor:
        b_, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b_, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        area = self.window_size[0] * self.window_size[1]
        bias = self.relative_position_bias_table[rpi.view(-1)].view(area, area, -1).permute(2, 0, 1)
        x = _attend(q, k, v, bias.contiguous(), self.scale, mask, self.attn_drop)
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(b_, n, c)))


class HAB(nn.Module):
    """Hybrid attention block: (shifted) window attention + a small-weighted conv branch + MLP."""

    def __init__(self, dim: int, input_resolution, num_heads: int, window_size: int = 7,
                 shift_size: int = 0, compress_ratio: int = 3, squeeze_factor: int = 30,
                 conv_scale: float = 0.01, mlp_ratio: float = 4., qkv_bias: bool = True, qk_scale=None,
                 drop: float = 0., attn_drop: float = 0., drop_path: float = 0., act_layer=nn.GELU,
                 norm_layer=nn.LayerNorm):
        super().__init__()
        self.dim, self.input_resolution, self.num_heads = dim, input_resolution, num_heads
        self.window_size, self.shift_size, self.mlp_ratio = window_size, shift_size, mlp_ratio
        if min(input_resolution) <= window_size:  # as upstream: no partition for tiny images
            self.shift_size, self.window_size = 0, min(input_resolution)
        if not 0 <= self.shift_size < self.window_size:
            raise ValueError(f'shift_size {self.shift_size} must be in [0, window_size={self.window_size})')
        self.norm1 = norm_layer(dim)
        self.attn = WindowAttention(dim, window_size=to_2tuple(self.window_size), num_heads=num_heads,
                                    qkv_bias=qkv_bias, qk_scale=qk_scale, attn_drop=attn_drop, proj_drop=drop)
        self.conv_scale = conv_scale
        self.conv_block = CAB(num_feat=dim, compress_ratio=compress_ratio, squeeze_factor=squeeze_factor)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer, drop=drop)

    def forward(self, x: torch.Tensor, x_size: Tuple[int, int], rpi_sa: torch.Tensor,
                attn_mask: torch.Tensor) -> torch.Tensor:
        h, w = x_size
        b, _, c = x.shape
        ws, shift = self.window_size, self.shift_size
        shortcut = x
        x = self.norm1(x).view(b, h, w, c)
        conv_x = self.conv_block(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1).contiguous().view(b, h * w, c)
        if shift > 0:
            x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
        windows = window_partition(x, ws).view(-1, ws * ws, c)
        windows = self.attn(windows, rpi=rpi_sa, mask=attn_mask if shift > 0 else None)
        x = window_reverse(windows.view(-1, ws, ws, c), ws, h, w)
        if shift > 0:
            x = torch.roll(x, shifts=(shift, shift), dims=(1, 2))
        x = shortcut + self.drop_path(x.view(b, h * w, c)) + conv_x * self.conv_scale
        return x + self.drop_path(self.mlp(self.norm2(x)))


class OCAB(nn.Module):
    """Overlapping cross-attention block: queries from windows, keys/values from larger
    overlapping windows, so information crosses window borders."""

    def __init__(self, dim: int, input_resolution, window_size: int, overlap_ratio: float, num_heads: int,
                 qkv_bias: bool = True, qk_scale=None, mlp_ratio: float = 2, norm_layer=nn.LayerNorm):
        super().__init__()
        self.dim, self.input_resolution = dim, input_resolution
        self.window_size, self.num_heads = window_size, num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.overlap_win_size = int(window_size * overlap_ratio) + window_size
        ows = self.overlap_win_size
        self.norm1 = norm_layer(dim)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.unfold = nn.Unfold(kernel_size=(ows, ows), stride=window_size, padding=(ows - window_size) // 2)
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((window_size + ows - 1) * (window_size + ows - 1), num_heads))
        trunc_normal_(self.relative_position_bias_table, std=.02)
        self.softmax = nn.Softmax(dim=-1)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=nn.GELU)

    def forward(self, x: torch.Tensor, x_size: Tuple[int, int], rpi: torch.Tensor) -> torch.Tensor:
        h, w = x_size
        b, _, c = x.shape
        ws, ows, heads = self.window_size, self.overlap_win_size, self.num_heads
        shortcut = x
        qkv = self.qkv(self.norm1(x).view(b, h, w, c)).reshape(b, h, w, 3, c).permute(3, 0, 4, 1, 2)
        q = window_partition(qkv[0].permute(0, 2, 3, 1), ws).view(-1, ws * ws, c)
        kv = self.unfold(torch.cat((qkv[1], qkv[2]), dim=1))
        kv = rearrange(kv, 'b (nc ch owh oww) nw -> nc (b nw) (owh oww) ch', nc=2, ch=c, owh=ows,
                       oww=ows).contiguous()
        d = self.dim // heads
        q = q.reshape(q.shape[0], ws * ws, heads, d).permute(0, 2, 1, 3)
        k = kv[0].reshape(q.shape[0], ows * ows, heads, d).permute(0, 2, 1, 3)
        v = kv[1].reshape(q.shape[0], ows * ows, heads, d).permute(0, 2, 1, 3)
        bias = self.relative_position_bias_table[rpi.view(-1)].view(ws * ws, ows * ows, -1).permute(2, 0, 1)
        out = _attend(q, k, v, bias.contiguous(), self.scale)
        out = out.transpose(1, 2).reshape(-1, ws * ws, self.dim).view(-1, ws, ws, self.dim)
        x = self.proj(window_reverse(out, ws, h, w).view(b, h * w, self.dim)) + shortcut
        return x + self.mlp(self.norm2(x))


class AttenBlocks(nn.Module):
    """``depth`` HABs with alternating shift, then one OCAB."""

    def __init__(self, dim: int, input_resolution, depth: int, num_heads: int, window_size: int,
                 compress_ratio: int, squeeze_factor: int, conv_scale: float, overlap_ratio: float,
                 mlp_ratio: float = 4., qkv_bias: bool = True, qk_scale=None, drop: float = 0.,
                 attn_drop: float = 0., drop_path=0., norm_layer=nn.LayerNorm, downsample=None,
                 use_checkpoint: bool = False):
        super().__init__()
        self.dim, self.input_resolution, self.depth = dim, input_resolution, depth
        self.use_checkpoint = use_checkpoint
        self.blocks = nn.ModuleList([
            HAB(dim=dim, input_resolution=input_resolution, num_heads=num_heads, window_size=window_size,
                shift_size=0 if i % 2 == 0 else window_size // 2, compress_ratio=compress_ratio,
                squeeze_factor=squeeze_factor, conv_scale=conv_scale, mlp_ratio=mlp_ratio,
                qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop, attn_drop=attn_drop,
                drop_path=drop_path[i] if isinstance(drop_path, list) else drop_path,
                norm_layer=norm_layer) for i in range(depth)])
        self.overlap_attn = OCAB(dim=dim, input_resolution=input_resolution, window_size=window_size,
                                 overlap_ratio=overlap_ratio, num_heads=num_heads, qkv_bias=qkv_bias,
                                 qk_scale=qk_scale, mlp_ratio=mlp_ratio, norm_layer=norm_layer)
        self.downsample = None if downsample is None else downsample(input_resolution, dim=dim,
                                                                     norm_layer=norm_layer)

    def forward(self, x: torch.Tensor, x_size: Tuple[int, int], params: Dict[str, torch.Tensor]) -> torch.Tensor:
        for blk in self.blocks:
            if self.use_checkpoint and torch.is_grad_enabled():
                x = checkpoint.checkpoint(blk, x, x_size, params['rpi_sa'], params['attn_mask'],
                                          use_reentrant=False)
            else:
                x = blk(x, x_size, params['rpi_sa'], params['attn_mask'])
        x = self.overlap_attn(x, x_size, params['rpi_oca'])
        return x if self.downsample is None else self.downsample(x)


class RHAG(nn.Module):
    """Residual Hybrid Attention Group: attention blocks + conv, with a long skip."""

    def __init__(self, dim: int, input_resolution, depth: int, num_heads: int, window_size: int,
                 compress_ratio: int, squeeze_factor: int, conv_scale: float, overlap_ratio: float,
                 mlp_ratio: float = 4., qkv_bias: bool = True, qk_scale=None, drop: float = 0.,
                 attn_drop: float = 0., drop_path=0., norm_layer=nn.LayerNorm, downsample=None,
                 use_checkpoint: bool = False, img_size=224, patch_size=4, resi_connection: str = '1conv'):
        super().__init__()
        self.dim, self.input_resolution = dim, input_resolution
        self.residual_group = AttenBlocks(
            dim=dim, input_resolution=input_resolution, depth=depth, num_heads=num_heads,
            window_size=window_size, compress_ratio=compress_ratio, squeeze_factor=squeeze_factor,
            conv_scale=conv_scale, overlap_ratio=overlap_ratio, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
            qk_scale=qk_scale, drop=drop, attn_drop=attn_drop, drop_path=drop_path, norm_layer=norm_layer,
            downsample=downsample, use_checkpoint=use_checkpoint)
        self.conv = _residual_conv(dim, resi_connection)
        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=0, embed_dim=dim)
        self.patch_unembed = PatchUnEmbed(img_size=img_size, patch_size=patch_size, in_chans=0, embed_dim=dim)

    def forward(self, x: torch.Tensor, x_size: Tuple[int, int], params: Dict[str, torch.Tensor]) -> torch.Tensor:
        y = self.patch_unembed(self.residual_group(x, x_size, params), x_size)
        return self.patch_embed(self.conv(y)) + x


def _residual_conv(dim: int, resi_connection: str) -> nn.Module:
    if resi_connection == '1conv':
        return nn.Conv2d(dim, dim, 3, 1, 1)
    if resi_connection == 'identity':
        return nn.Identity()
    raise ValueError(f"resi_connection={resi_connection!r}: expected '1conv' or 'identity'")


def relative_position_index_sa(window_size: int) -> torch.Tensor:
    """Index into the (2w-1)^2 bias table for every (query, key) pair of a w x w window."""
    coords = torch.stack(torch.meshgrid(torch.arange(window_size), torch.arange(window_size),
                                        indexing='ij')).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window_size - 1)
    return rel[..., 0] * (2 * window_size - 1) + rel[..., 1]


def relative_position_index_oca(window_size: int, overlap_ratio: float) -> torch.Tensor:
    """Index into OCAB's bias table for (window query, overlapping-window key) pairs."""
    ext = window_size + int(overlap_ratio * window_size)
    ori = torch.stack(torch.meshgrid(torch.arange(window_size), torch.arange(window_size),
                                     indexing='ij')).flatten(1)
    big = torch.stack(torch.meshgrid(torch.arange(ext), torch.arange(ext), indexing='ij')).flatten(1)
    rel = (big[:, None, :] - ori[:, :, None]).permute(1, 2, 0) + (window_size - ext + 1)
    return rel[..., 0] * (window_size + ext - 1) + rel[..., 1]


@ARCH_REGISTRY.register()
class HAT(nn.Module):
    """Hybrid Attention Transformer for image super-resolution.

    Released configurations (all ``img_size=64, window_size=16, upsampler='pixelshuffle'``):
    HAT (embed_dim 180, 6 groups of 6, compress_ratio 3, squeeze_factor 30), HAT-S (embed_dim
    144, compress_ratio 24, squeeze_factor 24), HAT-L (12 groups).
    """

    def __init__(self, img_size=64, patch_size=1, in_chans: int = 3, embed_dim: int = 96,
                 depths: Sequence[int] = (6, 6, 6, 6), num_heads: Sequence[int] = (6, 6, 6, 6),
                 window_size: int = 7, compress_ratio: int = 3, squeeze_factor: int = 30,
                 conv_scale: float = 0.01, overlap_ratio: float = 0.5, mlp_ratio: float = 4.,
                 qkv_bias: bool = True, qk_scale=None, drop_rate: float = 0., attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.1, norm_layer=nn.LayerNorm, ape: bool = False,
                 patch_norm: bool = True, use_checkpoint: bool = False, upscale: int = 2,
                 img_range: float = 1., upsampler: str = '', resi_connection: str = '1conv', **kwargs):
        super().__init__()
        if upsampler != 'pixelshuffle':
            raise ValueError(f"HAT upsampler={upsampler!r}: only 'pixelshuffle' is implemented "
                             '(upstream returns the input unchanged for anything else)')
        if len(num_heads) != len(depths):
            raise ValueError(f'num_heads {list(num_heads)} must have one entry per group in depths {list(depths)}')
        self.window_size, self.shift_size, self.overlap_ratio = window_size, window_size // 2, overlap_ratio
        num_feat = 64
        self.img_range = img_range
        self.mean = rgb_mean(in_chans)
        self.upscale, self.upsampler = upscale, upsampler
        self.register_buffer('relative_position_index_SA', relative_position_index_sa(window_size))
        self.register_buffer('relative_position_index_OCA',
                             relative_position_index_oca(window_size, overlap_ratio))
        self.conv_first = nn.Conv2d(in_chans, embed_dim, 3, 1, 1)

        self.num_layers, self.embed_dim, self.ape = len(depths), embed_dim, ape
        self.patch_norm, self.num_features, self.mlp_ratio = patch_norm, embed_dim, mlp_ratio
        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=embed_dim,
                                      embed_dim=embed_dim, norm_layer=norm_layer if patch_norm else None)
        self.patches_resolution = self.patch_embed.patches_resolution
        self.patch_unembed = PatchUnEmbed(img_size=img_size, patch_size=patch_size, in_chans=embed_dim,
                                          embed_dim=embed_dim)
        if ape:
            self.absolute_pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches, embed_dim))
            trunc_normal_(self.absolute_pos_embed, std=.02)
        self.pos_drop = nn.Dropout(p=drop_rate)
        dpr = drop_path_rates(drop_path_rate, sum(depths))
        resolution = (self.patches_resolution[0], self.patches_resolution[1])
        self.layers = nn.ModuleList()
        for i, depth in enumerate(depths):
            start = sum(depths[:i])
            self.layers.append(RHAG(
                dim=embed_dim, input_resolution=resolution, depth=depth, num_heads=num_heads[i],
                window_size=window_size, compress_ratio=compress_ratio, squeeze_factor=squeeze_factor,
                conv_scale=conv_scale, overlap_ratio=overlap_ratio, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                qk_scale=qk_scale, drop=drop_rate, attn_drop=attn_drop_rate,
                drop_path=dpr[start:start + depth], norm_layer=norm_layer, downsample=None,
                use_checkpoint=use_checkpoint, img_size=img_size, patch_size=patch_size,
                resi_connection=resi_connection))
        self.norm = norm_layer(self.num_features)
        self.conv_after_body = _residual_conv(embed_dim, resi_connection)
        self.conv_before_upsample = nn.Sequential(nn.Conv2d(embed_dim, num_feat, 3, 1, 1),
                                                  nn.LeakyReLU(inplace=True))
        self.upsample = Upsample(upscale, num_feat)
        self.conv_last = nn.Conv2d(num_feat, in_chans, 3, 1, 1)
        self.apply(init_transformer_weights)

    def calculate_rpi_sa(self) -> torch.Tensor:
        return relative_position_index_sa(self.window_size)

    def calculate_rpi_oca(self) -> torch.Tensor:
        return relative_position_index_oca(self.window_size, self.overlap_ratio)

    def calculate_mask(self, x_size: Tuple[int, int]) -> torch.Tensor:
        """Attention mask for shifted windows: -100 between pixels from different image regions."""
        h, w = x_size
        ws, shift = self.window_size, self.shift_size
        img_mask = torch.zeros((1, h, w, 1))
        spans = (slice(0, -ws), slice(-ws, -shift), slice(-shift, None))
        for i, hs in enumerate(spans):
            for j, wsl in enumerate(spans):
                img_mask[:, hs, wsl, :] = i * 3 + j
        windows = window_partition(img_mask, ws).view(-1, ws * ws)
        diff = windows.unsqueeze(1) - windows.unsqueeze(2)
        return diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0)

    @torch.jit.ignore
    def no_weight_decay(self):
        return {'absolute_pos_embed'}

    @torch.jit.ignore
    def no_weight_decay_keywords(self):
        return {'relative_position_bias_table'}

    def attention_mask(self, x_size: Tuple[int, int], device: torch.device) -> torch.Tensor:
        """calculate_mask on ``device``, kept for the last size: built on the CPU, it cost a dozen
        operators and a host-to-GPU copy (which waits for the GPU) at every forward of a training
        run, where the size never changes. One size only: a mask of a 200x200 tile is 51 MB."""
        key = (tuple(x_size), device)
        cached = self.__dict__.get('_attention_mask')
        if cached is None or cached[0] != key:
            cached = self.__dict__['_attention_mask'] = (key, self.calculate_mask(x_size).to(device))
        return cached[1]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x_size = (x.shape[2], x.shape[3])
        params = {'attn_mask': self.attention_mask(x_size, x.device),
                  'rpi_sa': self.relative_position_index_SA, 'rpi_oca': self.relative_position_index_OCA}
        x = self.patch_embed(x)
        if self.ape:
            x = x + self.absolute_pos_embed
        x = self.pos_drop(x)
        for layer in self.layers:
            x = layer(x, x_size, params)
        return self.patch_unembed(self.norm(x), x_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.conv_first.in_channels:
            raise ValueError(f'HAT expects (batch, {self.conv_first.in_channels}, h, w) input; '
                             f'got {tuple(x.shape)}')
        h, w = x.shape[-2:]
        x = pad_to_multiple(x, self.window_size)
        self.mean = self.mean.type_as(x)
        x = (x - self.mean) * self.img_range
        x = self.conv_first(x)
        x = self.conv_after_body(self.forward_features(x)) + x
        x = self.conv_last(self.upsample(self.conv_before_upsample(x)))
        x = x / self.img_range + self.mean
        return x[..., :h * self.upscale, :w * self.upscale]
