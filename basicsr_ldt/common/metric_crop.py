"""How much of an image a metric's ``crop_border`` leaves, checked before anything is measured.

BasicSR's metrics crop ``crop_border`` pixels from every side and say nothing when too little is
left: SSIM's 11x11 window (valid convolution) over a smaller image is NaN, or a cv2 error, and PSNR
of no pixels is NaN, in every cell of a table that otherwise looks finished. test.py and training
validation refuse such a crop with the one rule here.
"""
from typing import Tuple

from basicsr_ldt.common.errors import InputError

#: The side of the Gaussian window of BasicSR's SSIM (``calculate_ssim``, 11x11, valid convolution).
SSIM_WINDOW = 11


def needed_pixels(metric_type: str) -> Tuple[int, str]:
    """The short side a metric needs after cropping (SSIM its window, any other one pixel), and its name."""
    if metric_type == 'calculate_ssim':
        return SSIM_WINDOW, 'SSIM'
    return 1, 'PSNR' if metric_type == 'calculate_psnr' else str(metric_type)


def check_crop_border(key: str, crop_border: int, metric_type: str, stem: str, width: int, height: int) -> None:
    """Refuse a crop that leaves the image ``stem`` too small for the metric; ``key`` names the option."""
    needed, metric = needed_pixels(metric_type)
    left = min(width, height) - 2 * crop_border
    if left < needed:
        raise InputError(f"{key}: {crop_border} leaves {left} pixels of image '{stem}' ({width}x{height}) on its "
                         f'short side, and {metric} needs at least {needed}')
