"""SAFMN, Spatially-Adaptive Feature Modulation Network (Sun et al., ICCV 2023),
checkpoint-compatible with github.com/sunny2109/SAFMN (SAFMN and SAFMN-L are configurations).

Arguments, state_dict keys and outputs follow upstream. Difference: upstream fails on inputs
smaller than 2**(n_levels-1) = 8 pixels (its pooled pyramid would have a zero-size level);
here such inputs are edge-padded to 8 and the output cropped. Larger inputs are untouched.
"""
import torch
import torch.nn.functional as F
from basicsr.utils.registry import ARCH_REGISTRY
from torch import nn

SAFM_LEVELS = 4


class LayerNorm(nn.Module):
    """LayerNorm over the channel axis of (b, c, h, w) ('channels_first') or over the last axis."""

    def __init__(self, normalized_shape: int, eps: float = 1e-6, data_format: str = 'channels_first'):
        super().__init__()
        if data_format not in ('channels_last', 'channels_first'):
            raise ValueError(f"data_format={data_format!r}: expected 'channels_last' or 'channels_first'")
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps, self.data_format = eps, data_format
        self.normalized_shape = (normalized_shape, )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.data_format == 'channels_last':
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        mean = x.mean(1, keepdim=True)
        var = (x - mean).pow(2).mean(1, keepdim=True)
        x = (x - mean) / torch.sqrt(var + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class CCM(nn.Module):
    """Convolutional channel mixer: 3x3 expand, GELU, 1x1 project."""

    def __init__(self, dim: int, growth_rate: float = 2.0):
        super().__init__()
        hidden = int(dim * growth_rate)
        self.ccm = nn.Sequential(nn.Conv2d(dim, hidden, 3, 1, 1), nn.GELU(), nn.Conv2d(hidden, dim, 1, 1, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ccm(x)


class SAFM(nn.Module):
    """Spatially-adaptive feature modulation: channel chunks are processed at 1, 1/2, 1/4, 1/8
    resolution (max-pooled, depthwise conv, upsampled), aggregated and used as a GELU gate."""

    def __init__(self, dim: int, n_levels: int = SAFM_LEVELS):
        super().__init__()
        self.n_levels = n_levels
        chunk = dim // n_levels
        self.mfr = nn.ModuleList([nn.Conv2d(chunk, chunk, 3, 1, 1, groups=chunk) for _ in range(n_levels)])
        self.aggr = nn.Conv2d(dim, dim, 1, 1, 0)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        out = []
        for i, xc in enumerate(x.chunk(self.n_levels, dim=1)):
            if i == 0:
                out.append(self.mfr[0](xc))
                continue
            s = self.mfr[i](F.adaptive_max_pool2d(xc, (h // 2**i, w // 2**i)))
            out.append(F.interpolate(s, size=(h, w), mode='nearest'))
        return self.act(self.aggr(torch.cat(out, dim=1))) * x


class AttBlock(nn.Module):
    """Pre-norm SAFM then pre-norm CCM, each with a residual connection."""

    def __init__(self, dim: int, ffn_scale: float = 2.0):
        super().__init__()
        self.norm1 = LayerNorm(dim)
        self.norm2 = LayerNorm(dim)
        self.safm = SAFM(dim)
        self.ccm = CCM(dim, ffn_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.safm(self.norm1(x)) + x
        return self.ccm(self.norm2(x)) + x


@ARCH_REGISTRY.register()
class SAFMN(nn.Module):
    """SAFMN super-resolution network (3-channel in/out, pixel-shuffle head ``to_img``).

    Released: SAFMN dim=36, n_blocks=8 (x2/x3/x4); SAFMN-L dim=128, n_blocks=16 (x2/x3/x4 and
    real-world x4); ffn_scale=2.0 for all.
    """

    def __init__(self, dim: int, n_blocks: int = 8, ffn_scale: float = 2.0, upscaling_factor: int = 4):
        super().__init__()
        self.upscaling_factor = upscaling_factor
        self.to_feat = nn.Conv2d(3, dim, 3, 1, 1)
        self.feats = nn.Sequential(*[AttBlock(dim, ffn_scale) for _ in range(n_blocks)])
        self.to_img = nn.Sequential(nn.Conv2d(dim, 3 * upscaling_factor**2, 3, 1, 1),
                                    nn.PixelShuffle(upscaling_factor))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != 3:
            raise ValueError(f'SAFMN expects (batch, 3, h, w) input; got {tuple(x.shape)}')
        h, w = x.shape[-2:]
        least = 2**(SAFM_LEVELS - 1)
        if h < least or w < least:
            x = F.pad(x, (0, max(0, least - w), 0, max(0, least - h)), mode='replicate')
        x = self.to_feat(x)
        x = self.to_img(self.feats(x) + x)
        return x[..., :h * self.upscaling_factor, :w * self.upscaling_factor]
