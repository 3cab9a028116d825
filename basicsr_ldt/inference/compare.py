"""Side-by-side comparison grids (the LDT paper's appendix E figures) written by ``test.py``.

With ``test: compare:`` set, every test image gets ``results/<name>/compare/<camera>_<stem>.png``
(just ``<stem>.png`` when the stem already starts with the camera, as in ``Canon_10_x1``):
a top row with the bicubic-upscaled LR (``Bicubic``, the same pixels as test.py's Bicubic row),
each method's output and the HR image, each labelled with
its PSNR, and below it ``crops`` rows of zoomed ``size`` x ``size`` crops taken where the methods
disagree most (their per-pixel spread; with one method, where it is furthest from the HR). The
file names start with the camera, so a camera's images sort together.
"""
import os
from collections import OrderedDict
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import cv2
import numpy as np
import torch

from basicsr.archs import build_network
from basicsr.metrics.psnr_ssim import calculate_psnr
from basicsr.utils import tensor2img

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.options import check_known_keys
from basicsr_ldt.inference.tiling import bicubic_upscale, run_inference
from basicsr_ldt.ldt.typed import integer, mapping, string
from basicsr_ldt.weights.checkpoint import load_weights
from basicsr_ldt.weights.releases import resolve_checkpoint

#: ``test.compare`` keys (``methods`` maps a label to a checkpoint file or a folder of SR images).
COMPARE_SPECS = {'compare': mapping(), 'compare.crops': integer(0, 8), 'compare.size': integer(8),
                 'compare.methods': mapping(string())}
COMPARE_DEFAULTS = {'crops': 2, 'size': 32, 'methods': None}
#: The first panel: the LR image upscaled exactly as the Bicubic row of the tables.
BICUBIC_LABEL = 'Bicubic'
PANEL_MIN, PANEL_MAX, LABEL_HEIGHT = 192, 480, 22
CROP_COLOURS = [(0, 0, 255), (0, 200, 0), (255, 128, 0), (0, 200, 255), (255, 0, 255), (255, 255, 0),
                (128, 0, 255), (0, 128, 128)]


def compare_settings(section: Optional[Mapping]) -> Optional[Dict]:
    """``test.compare`` with defaults, or None when comparisons are off."""
    if section is None:
        return None
    check_known_keys('test.compare', section, COMPARE_DEFAULTS)
    return {**COMPARE_DEFAULTS, **section}


def folder_image_path(folder: str, camera: str, stem: str) -> Optional[str]:
    """Where a method's saved output for one image is: ``<folder>/<stem>.png`` or
    ``<folder>/<camera>/<stem>.png`` (what ``test: save_img`` writes under ``visualization/<label>/``)."""
    for candidate in (os.path.join(folder, f'{stem}.png'), os.path.join(folder, camera, f'{stem}.png')):
        if os.path.isfile(candidate):
            return candidate
    return None


def missing_output(folder: str, camera: str, stem: str) -> str:
    return f"folder '{folder}' has no output for test image '{stem}' (looked for {stem}.png and {camera}/{stem}.png)"


def folder_image(folder: str, camera: str, stem: str) -> np.ndarray:
    """A method's saved output for one image (see :func:`folder_image_path`)."""
    path = folder_image_path(folder, camera, stem)
    if path is None:
        raise InputError(missing_output(folder, camera, stem))
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    if image is None:
        raise InputError(f"comparison image '{path}' is corrupt or not an image")
    return image


def disagreement(outputs: Sequence[np.ndarray], hr: np.ndarray) -> np.ndarray:
    """Per-pixel spread of the methods' outputs (grey levels); with one method, its error to HR."""
    stack = np.stack([o.astype(np.float32) for o in outputs])
    if len(outputs) == 1:
        return np.abs(stack[0] - hr.astype(np.float32)).mean(axis=2)
    return stack.std(axis=0).mean(axis=2)


def crop_boxes(score: np.ndarray, size: int, count: int) -> List[Tuple[int, int]]:
    """Top-left corners of ``count`` non-overlapping ``size`` squares with the highest mean score."""
    h, w = score.shape
    size = min(size, h, w)
    box = cv2.boxFilter(score, -1, (size, size), normalize=True, borderType=cv2.BORDER_CONSTANT)
    # box[y, x] is the mean over the square centred at (y, x); keep centres whose square fits.
    half = size // 2
    valid = np.full_like(box, -np.inf)
    valid[half:h - size + half + 1, half:w - size + half + 1] = box[half:h - size + half + 1, half:w - size + half + 1]
    boxes = []
    for _ in range(count):
        y, x = np.unravel_index(np.argmax(valid), valid.shape)
        if not np.isfinite(valid[y, x]):
            break
        top, left = int(y) - half, int(x) - half
        boxes.append((top, left))
        valid[max(0, top - half):top + size + half + 1, max(0, left - half):left + size + half + 1] = -np.inf
    return boxes


def _labelled(panel: np.ndarray, text: str) -> np.ndarray:
    strip = np.full((LABEL_HEIGHT, panel.shape[1], 3), 255, np.uint8)
    cv2.putText(strip, text, (4, LABEL_HEIGHT - 7), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    return np.concatenate([strip, panel], axis=0)


def comparison_grid(panels: Mapping[str, np.ndarray], psnr: Mapping[str, Optional[float]], boxes: Sequence[Tuple[int, int]],
                    size: int) -> np.ndarray:
    """Top row: every panel (same HR size, BGR uint8) labelled with its PSNR, crop boxes drawn;
    one row per box below: that crop of every panel, enlarged with nearest-neighbour pixels."""
    h, w = next(iter(panels.values())).shape[:2]
    factor = min(max(PANEL_MIN / w, 1.0), PANEL_MAX / w)
    width, height = int(round(w * factor)), int(round(h * factor))
    size = min(size, h, w)
    top_row, crop_rows = [], [[] for _ in boxes]
    for label, image in panels.items():
        shown = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA if factor < 1 else cv2.INTER_NEAREST)
        for i, (top, left) in enumerate(boxes):
            corner = (int(left * factor), int(top * factor))
            far = (int((left + size) * factor) - 1, int((top + size) * factor) - 1)
            cv2.rectangle(shown, corner, far, CROP_COLOURS[i % len(CROP_COLOURS)], 2)
            crop = image[top:top + size, left:left + size]
            crop_rows[i].append(cv2.resize(crop, (width, width), interpolation=cv2.INTER_NEAREST))
        value = psnr.get(label)
        top_row.append(_labelled(shown, label if value is None else f'{label} {value:.2f} dB'))
    gap = lambda rows: np.full((rows, 4, 3), 255, np.uint8)  # noqa: E731
    rows = [np.concatenate([x for p in top_row for x in (p, gap(p.shape[0]))][:-1], axis=1)]
    for i, crops in enumerate(crop_rows):
        framed = [cv2.copyMakeBorder(c, 3, 3, 3, 3, cv2.BORDER_CONSTANT, value=CROP_COLOURS[i % len(CROP_COLOURS)])
                  for c in crops]
        framed = [cv2.resize(c, (width, width), interpolation=cv2.INTER_NEAREST) for c in framed]
        rows.append(np.concatenate([x for c in framed for x in (c, gap(width))][:-1], axis=1))
    spacer = np.full((6, rows[0].shape[1], 3), 255, np.uint8)
    return np.concatenate([x for r in rows for x in (r, spacer)][:-1], axis=0)


def grid_name(camera: str, stem: str) -> str:
    """``<camera>_<stem>.png``, camera first so a camera's images sort together; a stem that already
    starts with the camera in any case (``Canon_10_x1``, ``sony_116_x1``) is not prefixed a second
    time, while DRealSR's ``P1140279_x1`` (Olympus) and ``panasonic_158_x1`` (Pan) are."""
    starts_with_camera = (stem.lower().startswith(camera.lower())
                          and not stem[len(camera):len(camera) + 1].isalpha())
    return f'{stem}.png' if starts_with_camera else f'{camera}_{stem}.png'


def write_grid(folder: str, camera: str, stem: str, grid: np.ndarray) -> str:
    """Write the grid of one test image to ``<folder>/<grid_name>``."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, grid_name(camera, stem))
    if not cv2.imwrite(path, grid):
        raise OSError(f"cannot write '{path}'")
    return path


class Comparison:
    """The methods of ``test.compare`` and the grid of each test image.

    A method is a label of the ``checkpoints`` being tested (the default: all of them), another
    checkpoint file (run here with ``network_g``) or a folder of saved SR images. Everything is
    checked when this is built, before ``test.py`` creates its results folder.
    """

    def __init__(self, settings: Dict, opt: Mapping, checkpoints: Sequence[Mapping], datasets: Sequence,
                 device: torch.device) -> None:
        self.settings = settings
        self.sources: Dict[str, Tuple[str, object]] = OrderedDict()
        if settings['methods'] is None:
            for entry in checkpoints:
                if not entry.get('bicubic'):   # every grid shows Bicubic first anyway
                    self.sources[entry['label']] = ('run', entry['label'])
        for label, path in (settings['methods'] or {}).items():
            path = resolve_checkpoint(path)
            if os.path.isdir(path):
                self._check_folder(label, path, datasets, opt.get('scale', 4))
                self.sources[label] = ('folder', path)
            elif os.path.isfile(path):   # its weights chosen as a checkpoints entry without param_key chooses them
                network = build_network(dict(opt['network_g']))
                load_weights(network, path, (opt.get('path') or {}).get('param_key_g', 'params'))
                self.sources[label] = ('network', network.to(device).eval())
            else:
                raise InputError(f"test.compare.methods.{label}: expected a checkpoint file or a folder of SR "
                                 f"images, got '{path}' (does not exist)")
        if not self.sources:
            raise InputError('test.compare: no method to compare, as every checkpoint is the Bicubic baseline (the '
                             'first panel of every grid anyway); add a network checkpoint or test.compare.methods')

    @staticmethod
    def _check_folder(label: str, folder: str, datasets: Sequence, scale: int) -> None:
        """Every test image has its output in the folder, of LR size x scale (from the headers)."""
        from PIL import Image
        for dataset in datasets:
            for item in getattr(dataset, 'items', []):
                stem = os.path.splitext(os.path.basename(item['lq_path']))[0]
                path = folder_image_path(folder, item['camera'], stem)
                if path is None:
                    raise InputError(f'test.compare.methods.{label}: {missing_output(folder, item["camera"], stem)}')
                if not os.path.isfile(item['lq_path']):   # an lmdb key: no LR header to read here, not checked
                    continue
                with Image.open(item['lq_path']) as lq, Image.open(path) as sr:
                    expected, got = (lq.size[0] * scale, lq.size[1] * scale), sr.size
                if got != expected:
                    raise InputError(f"test.compare.methods.{label}: '{path}' is {got[0]}x{got[1]}, expected "
                                     f'{expected[0]}x{expected[1]} (LR x scale {scale})')

    def write(self, folder: str, item: Mapping, stem: str, results: Mapping[str, torch.Tensor], scale: int,
              test_opt: Mapping) -> str:
        """The grid of one test image; ``results`` are the tested checkpoints' SR tensors."""
        outputs = OrderedDict()
        for label, (kind, source) in self.sources.items():
            if kind == 'run':
                outputs[label] = tensor2img(results[source])
            elif kind == 'folder':
                outputs[label] = folder_image(source, item['camera'], stem)
            else:
                lq = item['lq'].unsqueeze(0).to(next(source.parameters()).device)
                outputs[label] = tensor2img(run_inference(source, lq, scale, test_opt['inference']).cpu())
        hr = tensor2img(item['gt'])
        bicubic = tensor2img(bicubic_upscale(item['lq'].unsqueeze(0), scale))   # the tables' Bicubic row
        panels = OrderedDict([(BICUBIC_LABEL, bicubic), *outputs.items(), ('HR', hr)])
        psnr = {label: float(calculate_psnr(image, hr, test_opt['crop_border'], test_y_channel=test_opt['test_y_channel']))
                for label, image in panels.items() if label != 'HR'}
        size = self.settings['size']
        boxes = crop_boxes(disagreement(list(outputs.values()), hr), size, self.settings['crops'])
        return write_grid(folder, item['camera'], stem, comparison_grid(panels, psnr, boxes, size))
