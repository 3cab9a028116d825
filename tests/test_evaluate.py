"""test.py's numbers are BasicSR's numbers, grouped by camera; tiling does not change them."""
import torch
from torch import nn

from basicsr.metrics.psnr_ssim import calculate_psnr, calculate_ssim
from basicsr.utils import tensor2img

from basicsr_ldt.evaluate import evaluate_image, format_table, summarise
from basicsr_ldt.inference import tiled_forward


class LocalSR(nn.Module):
    """Receptive-field radius 3 (three 3x3 convs) then pixel shuffle x2."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(8, 12, 3, padding=1), nn.PixelShuffle(2))

    def forward(self, x):
        return self.body(x)


def test_tiled_inference_equals_whole_image():
    torch.manual_seed(0)
    net, lq = LocalSR().eval(), torch.rand(1, 3, 37, 29)
    whole = net(lq)
    tiled = tiled_forward(net, lq, scale=2, tile_size=12, tile_overlap=6)
    assert tiled.shape == whole.shape
    assert torch.allclose(tiled, whole, atol=1e-6)
    assert torch.equal(tiled_forward(net, lq, 2, tile_size=0), whole)


def test_metrics_are_basicsr_functions():
    torch.manual_seed(1)
    gt = torch.rand(1, 3, 40, 36)
    sr = (gt + 0.05 * torch.randn_like(gt)).clamp(0, 1)
    values = evaluate_image(sr, gt, crop_border=4, test_y_channel=True)
    a, b = tensor2img(sr), tensor2img(gt)
    assert values['psnr'] == calculate_psnr(a, b, 4, test_y_channel=True)
    assert values['ssim'] == calculate_ssim(a, b, 4, test_y_channel=True)


def test_summary_groups_by_camera_and_averages_cameras():
    rows = [{'camera': 'Sony', 'psnr': 30.0, 'ssim': 0.9}, {'camera': 'Sony', 'psnr': 32.0, 'ssim': 0.7},
            {'camera': 'Canon', 'psnr': 28.0, 'ssim': 0.5}]
    table = summarise(rows)
    assert list(table) == ['Canon', 'Sony', 'Mean']
    assert table['Sony'] == {'psnr': 31.0, 'ssim': 0.8, 'images': 2}
    assert table['Mean']['psnr'] == 29.5 and abs(table['Mean']['ssim'] - 0.65) < 1e-12
    markdown = format_table({'FT': table, 'LDT': table}, markdown=True).splitlines()
    assert markdown[0] == '| Camera | Images | FT PSNR | FT SSIM | LDT PSNR | LDT SSIM |'
    assert markdown[3] == '| Sony | 2 | 31.00 | 0.8000 | 31.00 | 0.8000 |'
