"""Paired LR/HR dataset over DRealSR, restricted to chosen cameras.

Source cameras (``train``) and target cameras (``val_*``, ``test_*``) are chosen by name in
the YAML; a ``subset`` cuts the selection into disjoint, deterministic parts, because LDT warms
the head up on one part of the source data and profiles gradient variance on another.
"""
import logging
import os
from typing import Dict, List, Optional, Set, Tuple

import cv2
import numpy as np
from PIL import Image
from torch.utils import data

from basicsr.utils import FileClient, img2tensor
from basicsr.utils.registry import DATASET_REGISTRY

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.options import check_known_keys
from basicsr_ldt.common.schema import dataset_keys
from basicsr_ldt.data.cameras import CameraRule, camera_counts, list_images, pair_keys, select_cameras
from basicsr_ldt.ldt.typed import boolean, check_options, choice, integer, mapping, string, strings

#: Every key a section of this dataset may hold in some phase (BasicSR's loader keys and this
#: dataset's own; which phase reads which: ``DATASET_TYPES`` in basicsr_ldt/common/schema.py).
OPTION_KEYS = dataset_keys('DRealSRCameraDataset')
#: Types and ranges of the keys this dataset adds (checked before any folder is read).
OPTION_SPECS = {
    'dataroot_gt': string(), 'dataroot_lq': string(),
    'io_backend': mapping(), 'io_backend.type': choice('disk', 'lmdb'),
    'cameras': strings(),
    'camera_rule': mapping(), 'camera_rule.source': choice('auto', 'folder', 'filename'),
    'camera_rule.pattern': string(), 'camera_rule.aliases': mapping(string()),
    'filename_tmpl_gt': string(), 'filename_tmpl_lq': string(),
    'subset': mapping(), 'subset.parts': integer(1), 'subset.index': integer(0), 'subset.seed': integer(0),
    'gt_size': integer(1), 'use_hflip': boolean(), 'use_rot': boolean(), 'seed': integer(0),
}


def check_dataset_options(section: str, opt: Dict) -> None:
    """Unknown keys and wrong types of a dataset section, named by its path (``datasets.train``)."""
    check_known_keys(section, opt, OPTION_KEYS)
    check_options(section, opt, OPTION_SPECS, InputError)


def subset_indices(count: int, parts: int, index: int, seed: int = 0) -> List[int]:
    """Indices of part ``index`` of ``parts`` disjoint parts of ``range(count)``.

    The parts are contiguous slices of one seeded permutation, so together they cover every item
    exactly once and the same options always give the same part.
    """
    if not (isinstance(parts, int) and parts >= 1 and isinstance(index, int) and 0 <= index < parts):
        raise InputError(f'subset needs integers parts >= 1 and 0 <= index < parts; got parts={parts}, '
                         f'index={index}')
    order = np.random.default_rng(seed).permutation(count)
    bounds = np.linspace(0, count, parts + 1).round().astype(int)
    return sorted(order[bounds[index]:bounds[index + 1]].tolist())


def _lmdb_keys(root: str) -> List[str]:
    meta = os.path.join(root, 'meta_info.txt')
    if not os.path.isfile(meta):
        raise InputError(f"lmdb folder '{root}' has no meta_info.txt (expected BasicSR's lmdb layout)")
    with open(meta) as handle:
        return sorted(os.path.splitext(line.split(' ')[0])[0] for line in handle if line.strip())


#: What BasicSR's FileClient backends take besides ``type`` (lmdb: its ``LmdbBackend`` arguments; the
#: database paths are the dataroots).
IO_BACKEND_KEYS = {'disk': ('type',), 'lmdb': ('type', 'readonly', 'lock', 'readahead')}


@DATASET_REGISTRY.register()
class DRealSRCameraDataset(data.Dataset):
    """LR/HR pairs of the selected cameras of a DRealSR-style folder or lmdb.

    Each item carries ``lq``, ``gt``, ``lq_path``, ``gt_path`` and ``camera``. Training crops and
    flips come from a generator seeded by (``seed``, the sampler's draw number), not from global
    random state, so a resumed run sees exactly the crops an uninterrupted one would have.
    """

    #: The training sampler may pass draw numbers >= len(self) (see ``basicsr_ldt.data.sampler``).
    accepts_draw_numbers = True
    #: Understands the ``subset`` option (LDT's disjoint warm-up / profiling parts).
    supports_subset = True
    #: Entry points call this with the section's path before building (typed option errors).
    validate_options = staticmethod(check_dataset_options)

    def __init__(self, opt: Dict) -> None:
        super().__init__()
        check_dataset_options(f"dataset '{opt.get('name', '?')}'", opt)
        self.opt = opt
        self.name = opt.get('name', 'dataset')
        self.scale = int(opt.get('scale', 4))
        self.phase = opt.get('phase', 'test')
        self.seed = int(opt.get('seed', 0))
        for key in ('dataroot_gt', 'dataroot_lq'):
            if not opt.get(key):
                raise InputError(f"dataset '{self.name}' needs option '{key}'")
        self.gt_root, self.lq_root = opt['dataroot_gt'], opt['dataroot_lq']
        if os.path.realpath(self.gt_root) == os.path.realpath(self.lq_root):   # found as a size mismatch otherwise
            raise InputError(f"dataset '{self.name}': dataroot_gt and dataroot_lq are the same folder "
                             f"'{self.gt_root}'; expected the HR images and the LR images in two folders")
        self.io_backend_opt = dict(opt.get('io_backend') or {'type': 'disk'})
        check_known_keys(f"dataset '{self.name}' io_backend", self.io_backend_opt, IO_BACKEND_KEYS['lmdb'])
        backend = self.io_backend_opt.get('type')
        if backend not in IO_BACKEND_KEYS:
            raise InputError(f"dataset '{self.name}': io_backend.type must be 'disk' or 'lmdb', got '{backend}'")
        check_known_keys(f"dataset '{self.name}' io_backend (type {backend})", self.io_backend_opt,
                         IO_BACKEND_KEYS[backend])
        if self.phase == 'train':
            if 'gt_size' not in opt:
                raise InputError(f"training dataset '{self.name}' needs option 'gt_size' (HR patch size)")
            if opt['gt_size'] % self.scale:
                raise InputError(f"dataset '{self.name}': gt_size {opt['gt_size']} is not a multiple of "
                                 f'scale {self.scale}')
        self.rule = CameraRule.from_options(opt.get('camera_rule'))
        self.items = self._scan(backend)
        #: (stem, width, height) of the HR image with the shortest side, as measured; None: not read (lmdb)
        self.smallest_hr: Optional[Tuple[str, int, int]] = None
        if backend == 'disk':
            self._check_headers()
        self.file_client: Optional[FileClient] = None
        self._cropped_logged: Set[str] = set()

    # ---------------------------------------------------------------- listing
    def _scan(self, backend: str) -> List[Dict[str, str]]:
        where = f"dataset '{self.name}' ({self.gt_root} | {self.lq_root})"
        for root in (self.gt_root, self.lq_root):
            if not os.path.isdir(root):
                what = 'is a file; expected the folder of its images' if os.path.exists(root) else 'does not exist'
                raise InputError(f"dataset '{self.name}': folder '{root}' {what}")
        if backend == 'lmdb':
            gt_keys, lq_keys = _lmdb_keys(self.gt_root), _lmdb_keys(self.lq_root)
        else:   # relative file names with their extension, so 'a.png' beside 'a.jpg' is two files
            gt_keys, lq_keys = list_images(self.gt_root), list_images(self.lq_root)
        if not gt_keys and not lq_keys:
            raise InputError(f'{where}: no images found')
        # No template set: DRealSR's own names (HR Canon_10_x4 / LR Canon_10_x1, patches _x4_<k>).
        pairs = pair_keys(gt_keys, lq_keys, self.opt.get('filename_tmpl_gt'), self.opt.get('filename_tmpl_lq'),
                          where)
        cameras = self.rule.cameras_of([stem for stem, _, _ in pairs], where)
        chosen = select_cameras(cameras, self.opt.get('cameras'), where)
        subset = self.opt.get('subset')
        if subset is not None:
            check_known_keys(f"dataset '{self.name}' subset", subset, ('parts', 'index', 'seed'))
            part = subset_indices(len(chosen), subset.get('parts', 1), subset.get('index', 0), subset.get('seed', 0))
            lost = sorted({cameras[i] for i in chosen} - {cameras[chosen[k]] for k in part})
            if lost and part and self.phase != 'train':   # its column would vanish from the table, the Mean change
                raise InputError(f'{where}: subset {subset} leaves camera(s) {lost} with no image (the part is drawn '
                                 'over all cameras together); use fewer parts or list fewer cameras')
            chosen = [chosen[i] for i in part]
        if not chosen:
            raise InputError(f'{where}: the selection (cameras={self.opt.get("cameras")}, subset={subset}) is empty')
        items = []
        for i in chosen:
            stem, gt_key, lq_key = pairs[i]
            if backend == 'lmdb':
                gt_path, lq_path = gt_key, lq_key
            else:
                gt_path, lq_path = os.path.join(self.gt_root, gt_key), os.path.join(self.lq_root, lq_key)
            items.append({'stem': stem, 'camera': cameras[i], 'gt_path': gt_path, 'lq_path': lq_path})
        return items

    def _check_headers(self) -> None:
        """Read every image's header (not its pixels) so that an unreadable file or an LR/HR size
        mismatch stops the run before it starts, not hours into training."""
        for item in self.items:
            sizes = []
            for key in ('gt_path', 'lq_path'):
                try:
                    with Image.open(item[key]) as image:
                        sizes.append(image.size)
                except (OSError, ValueError) as err:
                    raise InputError(f"image '{item[key]}' of dataset '{self.name}' is corrupt or not an image "
                                     f'({type(err).__name__})') from None
            (gw, gh), (lw, lh) = sizes
            self._check_sizes(item['stem'], lw, lh, gw, gh)
            if self.smallest_hr is None or min(lw, lh) < min(self.smallest_hr[1:]) // self.scale:
                self.smallest_hr = (item['stem'], lw * self.scale, lh * self.scale)   # as measured (cropped)
            if self.phase == 'train' and min(lw, lh) < self.opt['gt_size'] // self.scale:   # found at a crop otherwise
                raise InputError(_patch_too_large(item['stem'], lw, lh, self.opt['gt_size'], self.scale))

    def _check_sizes(self, stem: str, lw: int, lh: int, gw: int, gh: int) -> bool:
        """Whether the HR image must be cropped to LR size x scale; raises for a pair that does not fit.

        Outside training an HR up to ``scale - 1`` pixels wider or taller than LR x scale is cropped
        at the bottom/right, as the official LDT code (``DG_validation_dataset.py``:
        ``hr[0:lr_h * scale, 0:lr_w * scale]``) and BasicSR's ``PairedImageDataset`` do: an LR image
        made by an integer division of the HR size loses those pixels. Anything else is a wrong pair.
        """
        extra_w, extra_h = gw - lw * self.scale, gh - lh * self.scale
        if extra_w == extra_h == 0:
            return False
        if self.phase != 'train' and 0 <= extra_w < self.scale and 0 <= extra_h < self.scale:
            return True
        raise InputError(_size_mismatch(stem, self.name, lw, lh, gw, gh, self.scale, self.phase != 'train'))

    @property
    def cameras(self) -> Dict[str, int]:
        """Images per camera in this dataset."""
        return camera_counts(item['camera'] for item in self.items)

    def item_cameras(self) -> List[str]:
        """The camera of each item, in index order (for camera-balanced sampling)."""
        return [item['camera'] for item in self.items]

    def __len__(self) -> int:
        return len(self.items)

    # ---------------------------------------------------------------- reading
    def _read(self, path: str, client_key: str) -> np.ndarray:
        if self.file_client is None:
            backend = dict(self.io_backend_opt)
            kind = backend.pop('type')
            if kind == 'lmdb':
                backend.update(db_paths=[self.lq_root, self.gt_root], client_keys=['lq', 'gt'])
            self.file_client = FileClient(kind, **backend)
        try:
            buffer = self.file_client.get(path, client_key)
        except Exception as err:  # a missing lmdb key or unreadable file: name it
            raise InputError(f"cannot read image '{path}' of dataset '{self.name}': {err}") from None
        if buffer is None:
            raise InputError(f"cannot read image '{path}' of dataset '{self.name}': no data")
        image = cv2.imdecode(np.frombuffer(buffer, np.uint8), cv2.IMREAD_COLOR)
        if image is None:
            raise InputError(f"image '{path}' of dataset '{self.name}' is corrupt or not an image")
        return image.astype(np.float32) / 255.0

    def __getitem__(self, index: int) -> Dict:
        # The sampler may pass a draw number larger than len(self): the image is the draw modulo
        # the dataset size and the draw number itself seeds this sample's crop and flips.
        item = self.items[index % len(self.items)]
        gt = self._read(item['gt_path'], 'gt')
        lq = self._read(item['lq_path'], 'lq')
        gt_size = (gt.shape[1], gt.shape[0])
        h, w = lq.shape[:2]
        if self._check_sizes(item['stem'], w, h, gt.shape[1], gt.shape[0]):
            gt = gt[:h * self.scale, :w * self.scale]
            if item['stem'] not in self._cropped_logged:
                self._cropped_logged.add(item['stem'])
                # The named logger, not basicsr's get_root_logger: that would initialise it before the
                # entry point adds its log file.
                logging.getLogger('basicsr').info(
                    f"dataset '{self.name}': HR of '{item['stem']}' is {gt_size[0]}x{gt_size[1]}, LR {w}x{h} x {self.scale} "
                    f'is {w * self.scale}x{h * self.scale}: HR cropped at the bottom/right before the metric, as the '
                    'official LDT code does')
        if self.phase == 'train':
            rng = np.random.default_rng([self.seed, int(index)])
            gt, lq = random_crop_and_flip(gt, lq, self.opt['gt_size'], self.scale, rng,
                                          self.opt.get('use_hflip', True), self.opt.get('use_rot', True),
                                          item['stem'])
        gt_t, lq_t = img2tensor([gt, lq], bgr2rgb=True, float32=True)
        return {'lq': lq_t, 'gt': gt_t, 'lq_path': item['lq_path'], 'gt_path': item['gt_path'],
                'camera': item['camera']}


def _size_mismatch(stem: str, name: str, lw: int, lh: int, gw: int, gh: int, scale: int, crops: bool) -> str:
    allowed = (f' (outside training an HR up to {scale - 1} pixels wider or taller is cropped; this one is not)'
               if crops else '')
    return (f"size mismatch for '{stem}' in dataset '{name}': LR {lw}x{lh} times scale {scale} is "
            f'{lw * scale}x{lh * scale}, HR is {gw}x{gh}{allowed}')


def _patch_too_large(stem: str, w: int, h: int, gt_size: int, scale: int) -> str:
    lq_size = gt_size // scale
    return (f"LR image '{stem}' is {w}x{h}, smaller than the LR patch {lq_size}x{lq_size} "
            f'(gt_size {gt_size} / scale {scale})')


def random_crop_and_flip(gt: np.ndarray, lq: np.ndarray, gt_size: int, scale: int, rng: np.random.Generator,
                         hflip: bool, rotate: bool, stem: str) -> Tuple[np.ndarray, np.ndarray]:
    """Aligned random crop (``gt_size`` on HR, ``gt_size/scale`` on LR) plus flips/transpose."""
    lq_size = gt_size // scale
    h, w = lq.shape[:2]
    if h < lq_size or w < lq_size:
        raise InputError(_patch_too_large(stem, w, h, gt_size, scale))
    top, left = int(rng.integers(0, h - lq_size + 1)), int(rng.integers(0, w - lq_size + 1))
    # Each step is written once and applied to both images, so that LR and HR cannot be cropped or
    # flipped differently (a misaligned pair has the right shapes and trains silently wrong).
    steps = [lambda image, f: image[top * f:(top + lq_size) * f, left * f:(left + lq_size) * f]]
    flips = rng.random(3)
    if hflip and flips[0] < 0.5:
        steps.append(lambda image, f: image[:, ::-1])
    if rotate and flips[1] < 0.5:
        steps.append(lambda image, f: image[::-1])
    if rotate and flips[2] < 0.5:
        steps.append(lambda image, f: image.transpose(1, 0, 2))
    for step in steps:
        gt, lq = step(gt, scale), step(lq, 1)
    return np.ascontiguousarray(gt), np.ascontiguousarray(lq)

