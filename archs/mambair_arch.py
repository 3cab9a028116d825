"""MambaIR (Guo et al., ECCV 2024), checkpoint-compatible with github.com/csguoh/MambaIR.

Constructor arguments, defaults, parameter names/shapes and outputs follow the upstream
``MambaIR`` class, so released ``*.pth`` files (``params`` / ``params_ema``) load with
``strict=True``. Differences: the selective scan comes from :mod:`archs.scan.dispatch`
(mamba-ssm is optional; ``scan_backend`` picks the kernel), and ``use_checkpoint`` works
(upstream passes the wrong arguments to its blocks).
"""
import math
from functools import partial
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint
from basicsr.archs.arch_util import Upsample
from basicsr.archs.rcan_arch import ChannelAttention
from basicsr.utils.registry import ARCH_REGISTRY
from timm.layers import DropPath
from torch import nn

from archs.arch_common import (PatchEmbed, PatchUnEmbed, UpsampleOneStep, drop_path_rates,
                                init_transformer_weights, rgb_mean)
from archs.scan.dispatch import (four_way_runs_in_triton, four_way_scan, log_configuration_once,
                                 resolve_backend, selective_scan)

SCAN_DIRECTIONS = 4  # row-major, column-major, and both reversed


class CAB(nn.Module):
    """Convolutional channel-attention block; the lightweight variant uses depthwise and
    dilated convolutions for a larger receptive field at fewer parameters."""

    def __init__(self, num_feat: int, is_light_sr: bool = False, compress_ratio: int = 3,
                 squeeze_factor: int = 30):
        super().__init__()
        if is_light_sr:
            hidden = num_feat // 2
            self.cab = nn.Sequential(
                nn.Conv2d(num_feat, hidden, 1, 1, 0),
                nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden),
                nn.GELU(),
                nn.Conv2d(hidden, num_feat, 1, 1, 0),
                nn.Conv2d(num_feat, num_feat, 3, 1, padding=2, groups=num_feat, dilation=2),
                ChannelAttention(num_feat, squeeze_factor))
        else:
            hidden = num_feat // compress_ratio
            self.cab = nn.Sequential(
                nn.Conv2d(num_feat, hidden, 3, 1, 1),
                nn.GELU(),
                nn.Conv2d(hidden, num_feat, 3, 1, 1),
                ChannelAttention(num_feat, squeeze_factor))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cab(x)


class SS2D(nn.Module):
    """2-D selective scan: the feature map is read in four orders, each order gets its own
    projections of (dt, B, C), one grouped selective scan runs all four, and the outputs are
    mapped back to image order and summed."""

    #: Whether the Triton kernels read the four directions by index (False: the direction copies
    #: with every kernel; scripts/bench_ldt.py --compare-upstream times both ways).
    directions_in_kernels = True

    def __init__(self, d_model: int, d_state: int = 16, d_conv: int = 3, expand: float = 2.,
                 dt_rank='auto', dt_min: float = 0.001, dt_max: float = 0.1, dt_init: str = 'random',
                 dt_scale: float = 1.0, dt_init_floor: float = 1e-4, dropout: float = 0.,
                 conv_bias: bool = True, bias: bool = False, device=None, dtype=None,
                 scan_backend: Optional[str] = None, **kwargs):
        super().__init__()
        factory = {'device': device, 'dtype': dtype}
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.d_inner = int(expand * d_model)
        self.dt_rank = math.ceil(d_model / 16) if dt_rank == 'auto' else dt_rank
        self.scan_backend = None if scan_backend is None else resolve_backend(scan_backend)
        k = SCAN_DIRECTIONS

        self.in_proj = nn.Linear(d_model, self.d_inner * 2, bias=bias, **factory)
        self.conv2d = nn.Conv2d(self.d_inner, self.d_inner, d_conv, padding=(d_conv - 1) // 2,
                                groups=self.d_inner, bias=conv_bias, **factory)
        self.act = nn.SiLU()
        bound = self.d_inner ** -0.5  # nn.Linear's default init for the (dt, B, C) projections
        self.x_proj_weight = nn.Parameter(
            torch.empty(k, self.dt_rank + 2 * d_state, self.d_inner, **factory).uniform_(-bound, bound))
        dt_w, dt_b = zip(*(self._dt_init(self.dt_rank, self.d_inner, dt_scale, dt_init, dt_min, dt_max,
                                         dt_init_floor, factory) for _ in range(k)))
        self.dt_projs_weight = nn.Parameter(torch.stack(dt_w))  # (k, d_inner, dt_rank)
        self.dt_projs_bias = nn.Parameter(torch.stack(dt_b))  # (k, d_inner)
        # S4D-real init: A = -[1, ..., d_state] for every channel and direction; skip D = 1.
        a = torch.arange(1, d_state + 1, dtype=torch.float32, device=device).repeat(k * self.d_inner, 1)
        self.A_logs = nn.Parameter(torch.log(a))  # (k * d_inner, d_state)
        self.Ds = nn.Parameter(torch.ones(k * self.d_inner, device=device))
        self.A_logs._no_weight_decay = True
        self.Ds._no_weight_decay = True

        self.out_norm = nn.LayerNorm(self.d_inner)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias, **factory)
        self.dropout = nn.Dropout(dropout) if dropout > 0. else None

    @staticmethod
    def _dt_init(dt_rank: int, d_inner: int, dt_scale: float, dt_init: str, dt_min: float, dt_max: float,
                 dt_init_floor: float, factory: dict) -> Tuple[torch.Tensor, torch.Tensor]:
        """dt projection init: variance-preserving weight, bias = softplus^-1 of a log-uniform dt."""
        std = dt_rank ** -0.5 * dt_scale
        weight = torch.empty(d_inner, dt_rank, **factory)
        if dt_init == 'constant':
            nn.init.constant_(weight, std)
        elif dt_init == 'random':
            nn.init.uniform_(weight, -std, std)
        else:
            raise ValueError(f'dt_init={dt_init!r}: expected "random" or "constant"')
        dt = torch.exp(torch.rand(d_inner, **factory) * (math.log(dt_max) - math.log(dt_min))
                       + math.log(dt_min)).clamp(min=dt_init_floor)
        return weight, dt + torch.log(-torch.expm1(-dt))

    def forward_core(self, x: torch.Tensor) -> torch.Tensor:
        """(b, d_inner, h, w) -> (b, d_inner, h*w) in row-major token order (float32).

        With the Triton kernels and gradients the four directions are read by index inside them
        (:meth:`_scan_in_kernels`); without gradients (validation, test.py) and with the other
        kernels, through the direction copies (:meth:`_scan_direction_copies`): at a 250x250 tile
        the copies' contiguous reads took 5.29 ms against 10.14 for the directions in the kernels
        (H200, 2026-11-28, both with the forward split along the sequence; mamba-ssm 5.37)."""
        if self.directions_in_kernels and torch.is_grad_enabled() and \
                four_way_runs_in_triton(self.scan_backend, x.device):
            y = self._scan_in_kernels(x)
            if y is not None:   # None: the Triton kernel failed its first call under 'auto'
                return y
        return self._scan_direction_copies(x)

    def _scan_inputs(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A, D and delta_bias as every kernel takes them (float32, the 4 directions stacked)."""
        return (-torch.exp(self.A_logs.float()), self.Ds.float(),
                self.dt_projs_bias.float().reshape(-1))

    def _scan_in_kernels(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """The four directions without copies: each direction's projections (dt, B, C) are taken
        of x in row-major order (a projection is per position, so the order does not change
        them) and the Triton kernels read position t of direction k where it lies."""
        b, d, h, w = x.shape
        flat = x.reshape(b, d, h * w)
        x_dbl = torch.einsum('bdl,kcd->bkcl', flat, self.x_proj_weight)
        dts, Bs, Cs = torch.split(x_dbl, [self.dt_rank, self.d_state, self.d_state], dim=2)
        dts = torch.einsum('bkrl,kdr->bkdl', dts, self.dt_projs_weight)
        A, D, bias = self._scan_inputs()
        return four_way_scan(flat, dts.reshape(b, SCAN_DIRECTIONS * d, h * w), A, Bs, Cs, D, bias, h,
                             delta_softplus=True, backend=self.scan_backend)

    def _scan_direction_copies(self, x: torch.Tensor) -> torch.Tensor:
        """Upstream's way: the four direction copies xs (b, 4, d, L), one grouped scan, the
        outputs mapped back to row-major order and summed."""
        b, d, h, w = x.shape
        k, length = SCAN_DIRECTIONS, h * w
        rows = x.reshape(b, d, length)
        cols = x.transpose(2, 3).reshape(b, d, length)
        fwd = torch.stack([rows, cols], dim=1)
        xs = torch.cat([fwd, fwd.flip(-1)], dim=1)  # (b, k, d, L)
        x_dbl = torch.einsum('bkdl,kcd->bkcl', xs, self.x_proj_weight)
        dts, Bs, Cs = torch.split(x_dbl, [self.dt_rank, self.d_state, self.d_state], dim=2)
        dts = torch.einsum('bkrl,kdr->bkdl', dts, self.dt_projs_weight)
        # A float32 scan of the activations as autocast left them (upstream casts xs, dts, Bs and
        # Cs to float32 first: the same output, but the Triton kernels read bf16 as it is, so
        # under bf16 autocast the copies, their casts' backward and their memory are saved).
        A, D, bias = self._scan_inputs()
        y = selective_scan(
            xs.reshape(b, k * d, length), dts.reshape(b, k * d, length), A, Bs, Cs, D,
            delta_bias=bias, delta_softplus=True,
            backend=self.scan_backend, out_dtype=torch.float32).view(b, k, d, length)
        back = y[:, 2:4].flip(-1)  # the two reversed scans, back in forward order

        def from_cols(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, d, w, h).transpose(2, 3).reshape(b, d, length)

        # Same summation order as upstream, so float rounding matches too.
        return y[:, 0] + back[:, 0] + from_cols(y[:, 1]) + from_cols(back[:, 1])

    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        b, h, w, _ = x.shape
        x, z = self.in_proj(x).chunk(2, dim=-1)
        x = self.act(self.conv2d(x.permute(0, 3, 1, 2).contiguous()))
        y = self.forward_core(x).transpose(1, 2).reshape(b, h, w, -1)
        out = self.out_proj(self.out_norm(y) * F.silu(z))
        return out if self.dropout is None else self.dropout(out)


class VSSBlock(nn.Module):
    """Residual state-space block: scaled skip + SS2D, then scaled skip + channel attention."""

    def __init__(self, hidden_dim: int = 0, drop_path: float = 0,
                 norm_layer=partial(nn.LayerNorm, eps=1e-6), attn_drop_rate: float = 0,
                 d_state: int = 16, expand: float = 2., is_light_sr: bool = False, **kwargs):
        super().__init__()
        self.ln_1 = norm_layer(hidden_dim)
        self.self_attention = SS2D(d_model=hidden_dim, d_state=d_state, expand=expand,
                                   dropout=attn_drop_rate, **kwargs)
        self.drop_path = DropPath(drop_path)
        self.skip_scale = nn.Parameter(torch.ones(hidden_dim))
        self.conv_blk = CAB(hidden_dim, is_light_sr)
        self.ln_2 = nn.LayerNorm(hidden_dim)
        self.skip_scale2 = nn.Parameter(torch.ones(hidden_dim))

    def forward(self, x: torch.Tensor, x_size: Tuple[int, int]) -> torch.Tensor:
        b, _, c = x.shape
        x = x.view(b, x_size[0], x_size[1], c)
        x = x * self.skip_scale + self.drop_path(self.self_attention(self.ln_1(x)))
        conv = self.conv_blk(self.ln_2(x).permute(0, 3, 1, 2).contiguous()).permute(0, 2, 3, 1)
        x = x * self.skip_scale2 + conv
        return x.reshape(b, -1, c)


class BasicLayer(nn.Module):
    """A sequence of VSS blocks (one residual state-space group without its tail conv)."""

    def __init__(self, dim: int, input_resolution, depth: int, drop_path=0., d_state: int = 16,
                 mlp_ratio: float = 2., norm_layer=nn.LayerNorm, downsample=None,
                 use_checkpoint: bool = False, is_light_sr: bool = False,
                 scan_backend: Optional[str] = None):
        super().__init__()
        self.dim, self.input_resolution, self.depth = dim, input_resolution, depth
        self.mlp_ratio, self.use_checkpoint = mlp_ratio, use_checkpoint
        self.blocks = nn.ModuleList([
            VSSBlock(hidden_dim=dim, drop_path=drop_path[i] if isinstance(drop_path, list) else drop_path,
                     norm_layer=nn.LayerNorm, attn_drop_rate=0, d_state=d_state, expand=mlp_ratio,
                     input_resolution=input_resolution, is_light_sr=is_light_sr,
                     scan_backend=scan_backend) for i in range(depth)])
        self.downsample = None if downsample is None else downsample(input_resolution, dim=dim,
                                                                     norm_layer=norm_layer)

    def forward(self, x: torch.Tensor, x_size: Tuple[int, int]) -> torch.Tensor:
        for blk in self.blocks:
            if self.use_checkpoint and torch.is_grad_enabled():
                x = checkpoint.checkpoint(blk, x, x_size, use_reentrant=False)
            else:
                x = blk(x, x_size)
        return x if self.downsample is None else self.downsample(x)

    def extra_repr(self) -> str:
        return f'dim={self.dim}, input_resolution={self.input_resolution}, depth={self.depth}'


def residual_conv(dim: int, resi_connection: str) -> nn.Module:
    """Conv closing a residual group: '1conv' (3x3) or '3conv' (bottlenecked, fewer params)."""
    if resi_connection == '1conv':
        return nn.Conv2d(dim, dim, 3, 1, 1)
    if resi_connection == '3conv':
        return nn.Sequential(
            nn.Conv2d(dim, dim // 4, 3, 1, 1), nn.LeakyReLU(negative_slope=0.2, inplace=True),
            nn.Conv2d(dim // 4, dim // 4, 1, 1, 0), nn.LeakyReLU(negative_slope=0.2, inplace=True),
            nn.Conv2d(dim // 4, dim, 3, 1, 1))
    raise ValueError(f"resi_connection={resi_connection!r}: expected '1conv' or '3conv'")


class ResidualGroup(nn.Module):
    """Residual State Space Group (RSSG): VSS blocks + conv, with a long skip."""

    def __init__(self, dim: int, input_resolution, depth: int, d_state: int = 16, mlp_ratio: float = 4.,
                 drop_path=0., norm_layer=nn.LayerNorm, downsample=None, use_checkpoint: bool = False,
                 img_size=None, patch_size=None, resi_connection: str = '1conv',
                 is_light_sr: bool = False, scan_backend: Optional[str] = None):
        super().__init__()
        self.dim, self.input_resolution = dim, input_resolution
        self.residual_group = BasicLayer(
            dim=dim, input_resolution=input_resolution, depth=depth, d_state=d_state, mlp_ratio=mlp_ratio,
            drop_path=drop_path, norm_layer=norm_layer, downsample=downsample,
            use_checkpoint=use_checkpoint, is_light_sr=is_light_sr, scan_backend=scan_backend)
        self.conv = residual_conv(dim, resi_connection)
        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=0, embed_dim=dim)
        self.patch_unembed = PatchUnEmbed(img_size=img_size, patch_size=patch_size, in_chans=0, embed_dim=dim)

    def forward(self, x: torch.Tensor, x_size: Tuple[int, int]) -> torch.Tensor:
        y = self.patch_unembed(self.residual_group(x, x_size), x_size)
        return self.patch_embed(self.conv(y)) + x


@ARCH_REGISTRY.register()
class MambaIR(nn.Module):
    """MambaIR image restoration network.

    ``upsampler``: 'pixelshuffle' (classic SR), 'pixelshuffledirect' (lightweight SR, which also
    switches the blocks to the light CAB), or '' (denoising / JPEG, same-size residual output).
    ``scan_backend``: 'auto' | 'torch' | 'triton' | 'cuda' for the selective scan (default: the
    ``BASICSR_LDT_SCAN`` environment variable, else 'auto'); not an upstream option.
    Inputs of any size work: the network has no windows, so no padding is needed.
    """

    def __init__(self, img_size=64, patch_size=1, in_chans: int = 3, embed_dim: int = 96,
                 depths: Sequence[int] = (6, 6, 6, 6), drop_rate: float = 0., d_state: int = 16,
                 mlp_ratio: float = 2., drop_path_rate: float = 0.1, norm_layer=nn.LayerNorm,
                 patch_norm: bool = True, use_checkpoint: bool = False, upscale: int = 2,
                 img_range: float = 1., upsampler: str = '', resi_connection: str = '1conv',
                 scan_backend: Optional[str] = None, **kwargs):
        super().__init__()
        if upsampler not in ('pixelshuffle', 'pixelshuffledirect', ''):
            raise ValueError(f"upsampler={upsampler!r}: expected 'pixelshuffle', 'pixelshuffledirect' or ''")
        num_feat = 64
        self.img_range = img_range
        self.mean = rgb_mean(in_chans)
        self.upscale, self.upsampler, self.mlp_ratio = upscale, upsampler, mlp_ratio
        self.conv_first = nn.Conv2d(in_chans, embed_dim, 3, 1, 1)

        self.num_layers = len(depths)
        self.embed_dim = self.num_features = embed_dim
        self.patch_norm = patch_norm
        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=embed_dim,
                                      embed_dim=embed_dim, norm_layer=norm_layer if patch_norm else None)
        self.patches_resolution = self.patch_embed.patches_resolution
        self.patch_unembed = PatchUnEmbed(img_size=img_size, patch_size=patch_size, in_chans=embed_dim,
                                          embed_dim=embed_dim)
        self.pos_drop = nn.Dropout(p=drop_rate)
        self.is_light_sr = upsampler == 'pixelshuffledirect'
        dpr = drop_path_rates(drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i, depth in enumerate(depths):
            start = sum(depths[:i])
            self.layers.append(ResidualGroup(
                dim=embed_dim, input_resolution=tuple(self.patches_resolution), depth=depth,
                d_state=d_state, mlp_ratio=mlp_ratio, drop_path=dpr[start:start + depth],
                norm_layer=norm_layer, downsample=None, use_checkpoint=use_checkpoint, img_size=img_size,
                patch_size=patch_size, resi_connection=resi_connection, is_light_sr=self.is_light_sr,
                scan_backend=scan_backend))
        self.norm = norm_layer(self.num_features)
        self.conv_after_body = residual_conv(embed_dim, resi_connection)

        if upsampler == 'pixelshuffle':
            self.conv_before_upsample = nn.Sequential(nn.Conv2d(embed_dim, num_feat, 3, 1, 1),
                                                      nn.LeakyReLU(inplace=True))
            self.upsample = Upsample(upscale, num_feat)
            self.conv_last = nn.Conv2d(num_feat, in_chans, 3, 1, 1)
        elif upsampler == 'pixelshuffledirect':
            self.upsample = UpsampleOneStep(upscale, embed_dim, in_chans)
        else:
            self.conv_last = nn.Conv2d(embed_dim, in_chans, 3, 1, 1)
        self.apply(init_transformer_weights)
        # The device is not known yet: log the preference (and how 'auto' chooses) here; the
        # kernel actually run is logged by selective_scan at the first call on each device type.
        log_configuration_once(scan_backend)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x_size = (x.shape[2], x.shape[3])
        x = self.pos_drop(self.patch_embed(x))
        for layer in self.layers:
            x = layer(x, x_size)
        return self.patch_unembed(self.norm(x), x_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.conv_first.in_channels:
            raise ValueError(f'MambaIR expects (batch, {self.conv_first.in_channels}, h, w) input; '
                             f'got {tuple(x.shape)}')
        self.mean = self.mean.type_as(x)
        x = (x - self.mean) * self.img_range
        if self.upsampler == 'pixelshuffle':
            x = self.conv_first(x)
            x = self.conv_after_body(self.forward_features(x)) + x
            x = self.conv_last(self.upsample(self.conv_before_upsample(x)))
        elif self.upsampler == 'pixelshuffledirect':
            x = self.conv_first(x)
            x = self.upsample(self.conv_after_body(self.forward_features(x)) + x)
        else:
            first = self.conv_first(x)
            x = x + self.conv_last(self.conv_after_body(self.forward_features(first)) + first)
        return x / self.img_range + self.mean
