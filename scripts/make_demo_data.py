#!/usr/bin/env python
"""Build a mini DRealSR (x4) from the photographs that ship inside scikit-image.

Why: DRealSR cannot be downloaded on the machines this project is developed and tested on, yet
the camera-split loading code, the training pipeline and the domain-generalisation experiments
need data with (a) DRealSR's exact layout and file naming and (b) a *real* shift between cameras.
This script provides both, offline, in a few seconds and a few MB:

    <out>/Train_x4/train_HR/<stem>_x4_<k>.png   <out>/Train_x4/train_LR/<stem>_x1_<k>.png
    <out>/Test_x4/test_HR/<stem>_x4.png         <out>/Test_x4/test_LR/<stem>_x1.png
    <out>/cameras.json                              degradation profiles + where every crop came from

Sources: only image files physically present in the installed ``skimage/data`` directory are
read (directly, with Pillow). The ``skimage.data`` loader functions are *not* used: in
scikit-image 0.26 several of them (eagle, kidney, lily, brain, cells3d, skin, ...) fetch files
with pooch from the internet, which must never happen here. Synthetic or unsuitable files
(chessboards, logo, horse silhouette, phantom, color wheel, tiny images) are not used, nor is
``motorcycle_right`` (the same scene as ``motorcycle_left``, which would leak test content).

The six cameras are one family: each is a fixed setting (``CAMERA_PROFILES``) of the same
pipeline, every parameter inside the shared ``FAMILY_RANGES``, so a network trained on one camera is
partly right on the others; the pretraining camera ``Mix`` draws every pair's parameters from those
ranges (``sample_profile``); the classic-SR pretraining camera ``Clean`` has no degradation at all
(HR = the photo crop, LR = its x4 area resize, ``make_clean_pair``), as the bicubic pairs released
SR weights are trained on. The pipeline of the others:

1. *camera look* (white balance gains, tone curve gamma, saturation) -- applied to the HR and
   therefore inherited by the LR, because in DRealSR both images of a pair are shot with the
   same camera (the two differ in focal length, not in colour rendition);
2. *optics*: blur kernel at HR resolution (anisotropic Gaussian lens blur; ``motion`` also exists);
3. *sensor*: x4 area downsampling (pixel-aperture integration), so ``LR size * 4 == HR size``;
4. *noise* at LR resolution: signal-dependent Poisson-Gaussian, ``var = a * x + b**2``, with a
   camera-specific share of per-channel (chroma) vs shared (luma) noise;
5. *ISP*: optional unsharp-mask sharpening (phones) and JPEG compression at a camera quality.

Content: the photographs are split once into train and test photos (``TRAIN_PHOTOS`` /
``TEST_PHOTOS``), so no test crop shares content with a train crop. Train crops differ per camera
(photo order and position); test crops show the *same* scenes for every camera, so per-camera test
scores differ by the degradation alone. ``cameras.json`` records each pair's photo and crop box.

Determinism: the same arguments give byte-identical files. Random generators are
``np.random.default_rng`` seeded with ``[seed, crc32(camera), split, index]`` (train crop position),
``[seed, split, index]`` (test crop position), ``[seed, crc32(camera), split, index, 1]``
(noise) and ``[seed, crc32(camera), split, index, 2]`` (a Mix pair's parameters) -- independent of the other cameras requested, so ``--cameras Sony`` writes the same Sony
files as a full build. PNG and JPEG encoder parameters are fixed, and ``cameras.json`` holds no
timestamps or machine paths.

The build is written into a temporary folder next to the target and moved into place with
``os.replace`` at the end; a failure leaves nothing half-written.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np
from PIL import Image

SCALE = 4
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / 'datasets' / 'DRealSR_demo'
#: The default camera rule of our dataset code: the leading letters of a file stem.
CAMERA_STEM_PATTERN = r'^[A-Za-z]+'
#: File stems as the published DRealSR names each camera (P1140279 is Olympus, panasonic_158,
#: sony_116, DSC_1265 for the Nikon, IMG_140, Canon_56), numbered from ``n``. As in the release the
#: HR image carries the zoom token ``_x4`` and the LR ``_x1``; training pairs are patches
#: ``<stem>_x4_<k>`` (patch ``k`` of shot ``stem``).
STEM_FORMATS = {'Olympus': 'P114{:04d}', 'Pan': 'panasonic_{}', 'Sony': 'sony_{}', 'DSC': 'DSC_1{:03d}',
                'IMG': 'IMG_{}', 'Canon': 'Canon_{}', 'Mix': 'Mix_{:03d}', 'Clean': 'Clean_{:03d}'}
HR_ZOOM, LR_ZOOM = '_x4', '_x1'


def pair_names(camera: str, number: int, patch: Optional[int] = None) -> Tuple[str, str, str]:
    """(pair stem, HR file name, LR file name) of shot ``number`` of ``camera``, patch ``patch``
    for training. The pair stem is what the loader pairs by: shot stem plus patch index."""
    stem = STEM_FORMATS[camera].format(number)
    tail = '' if patch is None else f'_{patch}'
    return stem + tail, f'{stem}{HR_ZOOM}{tail}.png', f'{stem}{LR_ZOOM}{tail}.png'
#: Context kept around every crop so the blur sees real pixels instead of padding at the border.
MARGIN = 12
#: A crop is accepted when its grey-level standard deviation reaches this (0..255 scale);
#: avoids flat crops (the black border of ``retina``, empty sky in ``hubble_deep_field``).
MIN_CROP_STD = 12.0
CROP_CANDIDATES = 16
PNG_PARAMS = [cv2.IMWRITE_PNG_COMPRESSION, 6, cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_STRATEGY_DEFAULT]

#: Natural photographs from ``skimage/data``, split once and for all so that no test crop ever
#: shares content with a train crop. Files missing from an installation are skipped.
TRAIN_PHOTOS = ('astronaut.png', 'chelsea.png', 'rocket.jpg', 'coins.png', 'brick.png', 'gravel.png',
                'moon.png', 'clock_motion.png', 'ihc.png', 'retina.jpg', 'hubble_deep_field.jpg',
                'cell.png', 'page.png', 'text.png')
TEST_PHOTOS = ('coffee.png', 'motorcycle_left.png', 'camera.png', 'grass.png')
SPLIT_CODES = {'train': 0, 'test': 1}


@dataclass(frozen=True)
class CameraProfile:
    """One camera's degradation, fixed so that results are comparable between runs and users.

    Colour: ``wb`` RGB gains, output ``gamma`` exponent (< 1 brightens), ``saturation`` factor.
    Blur: ``blur`` is ``gaussian`` (``sigma_x``, ``sigma_y``, ``angle`` in degrees) or ``motion``
    (``motion_length`` pixels along ``angle``), applied at HR resolution (``per-pair`` only in the
    documenting profile of a pretraining camera, whose pairs each get their own).
    Noise (on [0, 1] LR values): ``var = noise_a * x + noise_b ** 2``; ``noise_chroma`` is the
    share of independent per-channel noise (0 = identical noise in R, G, B).
    ISP: unsharp-mask ``sharpen`` amount, JPEG ``jpeg_quality``.
    """
    description: str
    wb: Tuple[float, float, float]
    gamma: float
    saturation: float
    blur: str
    sigma_x: float
    sigma_y: float
    angle: float
    motion_length: int
    noise_a: float
    noise_b: float
    noise_chroma: float
    sharpen: float
    jpeg_quality: int


#: The camera family: every parameter of every demo camera lies in these shared ranges (closed
#: intervals). Real cameras of one kind share optics and sensor physics and differ in settings; the
#: demo cameras do too, so what a network learns on one camera is partly right on the others. The
#: pretraining camera (``PRETRAIN_CAMERAS``) draws *every pair's* parameters independently and
#: uniformly from these ranges (``sample_profile``), as real-world SR pretraining randomises its
#: degradations per sample. ``wb`` is the red and blue gain (green is 1); ``sigma_x``/``sigma_y``
#: are the Gaussian lens blur's standard deviations in HR pixels along/across ``angle``; noise is
#: on [0, 1] LR values; ``sharpen`` is an unsharp-mask amount; JPEG quality is an integer.
FAMILY_RANGES: Dict[str, Tuple[float, float]] = {
    'wb_red': (0.94, 1.06), 'wb_blue': (0.94, 1.06), 'gamma': (0.88, 1.08), 'saturation': (0.95, 1.30),
    'sigma_x': (1.2, 3.0), 'sigma_y': (1.2, 3.0), 'angle': (0.0, 180.0),
    'noise_a': (0.0, 0.0006), 'noise_b': (0.0005, 0.004), 'noise_chroma': (0.2, 0.8),
    'sharpen': (0.0, 0.4), 'jpeg_quality': (80, 95),
}


def _family(description: str, wb_red: float, wb_blue: float, gamma: float, saturation: float,
            sigma_x: float, sigma_y: float, angle: float, noise_a: float, noise_b: float,
            noise_chroma: float, sharpen: float, jpeg_quality: int) -> CameraProfile:
    """A family member: Gaussian lens blur, every parameter inside ``FAMILY_RANGES``."""
    values = dict(wb_red=wb_red, wb_blue=wb_blue, gamma=gamma, saturation=saturation, sigma_x=sigma_x,
                  sigma_y=sigma_y, angle=angle, noise_a=noise_a, noise_b=noise_b, noise_chroma=noise_chroma,
                  sharpen=sharpen, jpeg_quality=jpeg_quality)
    for key, value in values.items():
        lo, hi = FAMILY_RANGES[key]
        if not lo <= value <= hi:
            raise ValueError(f'{key} = {value} is outside the family range [{lo}, {hi}]')
    return CameraProfile(description, (wb_red, 1.0, wb_blue), gamma, saturation, 'gaussian', sigma_x, sigma_y,
                         angle, 0, noise_a, noise_b, noise_chroma, sharpen, int(jpeg_quality))


def sample_profile(rng: np.random.Generator) -> CameraProfile:
    """One pretraining pair's degradation: every parameter uniform in its ``FAMILY_RANGES``."""
    draw = {key: float(rng.uniform(lo, hi)) for key, (lo, hi) in FAMILY_RANGES.items()}
    lo, hi = FAMILY_RANGES['jpeg_quality']
    draw['jpeg_quality'] = int(rng.integers(lo, hi + 1))
    return _family('per-pair draw from FAMILY_RANGES', **draw)


#: The six camera branches the LDT paper names for DRealSR: one family (``FAMILY_RANGES``), each
#: camera a fixed setting inside it (synthetic, plausible, not measurements of the real cameras).
#: Olympus, the demo's source, sits in the middle of the family; the targets differ from it in
#: blur shape and size, noise level and colour, sharpening and JPEG, each within the ranges.
CAMERA_PROFILES: Dict[str, CameraProfile] = {
    'Olympus': _family('neutral-cool, medium slightly elliptic blur, low noise, light sharpening, JPEG 90',
                       0.97, 1.04, 1.00, 1.10, 2.0, 1.6, 20.0, 0.0003, 0.002, 0.5, 0.15, 90),
    'Pan': _family('warm, astigmatic blur (elongated at 30 deg), moderate noise, no sharpening, JPEG 87',
                   1.05, 0.95, 0.95, 1.00, 2.8, 1.4, 30.0, 0.0004, 0.0025, 0.6, 0.0, 87),
    'Sony': _family('neutral, sharpest lens of the family, very low noise, fine JPEG 94',
                    1.00, 1.00, 1.05, 1.05, 1.4, 1.3, 0.0, 0.0001, 0.001, 0.3, 0.1, 94),
    'DSC': _family('warm and saturated, horizontally elongated blur (shake-like), medium JPEG 82',
                   1.06, 0.94, 1.00, 1.20, 2.6, 1.5, 0.0, 0.0004, 0.0025, 0.5, 0.25, 82),
    'IMG': _family('phone-like: bright, vivid, chroma noise, strongest sharpening, JPEG 84',
                   1.00, 1.03, 0.90, 1.28, 1.8, 1.7, 60.0, 0.0004, 0.003, 0.8, 0.25, 84),
    'Canon': _family('warm-neutral, soft (widest isotropic blur), luma noise, JPEG 90',
                     1.04, 0.97, 1.02, 1.05, 2.9, 2.8, 0.0, 0.0002, 0.003, 0.2, 0.0, 90),
}
#: The DRealSR branches: the default build.
DEFAULT_CAMERAS = tuple(CAMERA_PROFILES)
#: Not a DRealSR camera: the demo's pretraining data, standing in for the broad synthetic
#: degradations (blur, noise, JPEG, sharpening) of real-world SR pretraining. Each of its pairs has
#: its own parameters drawn by ``sample_profile`` from ``FAMILY_RANGES`` (recorded per pair in
#: ``cameras.json``), so the pretrained start has seen the whole family but no camera's setting in
#: particular. Built only when asked for (``--cameras ... Mix``), with ``pretrain_train_per_camera``
#: train pairs; its profile below only documents the ranges (``blur: per-pair``).
CAMERA_PROFILES['Mix'] = CameraProfile('pretraining mix: every pair its own draw from FAMILY_RANGES',
                                       (1.0, 1.0, 1.0), 1.0, 1.0, 'per-pair', 0.0, 0.0, 0.0, 0,
                                       0.0, 0.0, 0.0, 0.0, 100)
#: Not a DRealSR camera either: the demo's *classic-SR* pretraining data, standing in for the
#: bicubic DF2K pairs that released SR weights (the paper's start) are trained on. HR = the photo
#: crop as it is (no camera look), LR = its x4 ``INTER_AREA`` resize (the pipeline's sensor step,
#: the same exact x4 pixel-area integration every camera applies) with nothing else: no blur, no
#: noise, no sharpening, lossless PNG. So a network trained on it knows the scale and the sampling
#: and none of the cameras' degradations, as a bicubic-trained network knows none of a real
#: camera's. (The issue that introduced it also tried MATLAB-style bicubic LR; area is chosen
#: because it is the cameras' own sampling, so the gap the demo measures is the degradation alone.)
CAMERA_PROFILES['Clean'] = CameraProfile('classic-SR pretraining pairs: no look, no blur, x4 area resize, '
                                         'no noise, no sharpening, PNG', (1.0, 1.0, 1.0), 1.0, 1.0, 'none',
                                         0.0, 0.0, 0.0, 0, 0.0, 0.0, 0.0, 0.0, 100)
#: Pretraining cameras get more train pairs (``--pretrain-train-per-camera``): one network learns
#: from them for many iterations. ``Mix`` draws per-pair degradations, ``Clean`` has none.
PRETRAIN_CAMERAS = ('Mix', 'Clean')
CLEAN_CAMERAS = ('Clean',)


def skimage_data_dir() -> Path:
    """The installed ``skimage/data`` folder, found without importing scikit-image at all."""
    spec = importlib.util.find_spec('skimage')
    if spec is None or spec.origin is None:
        raise RuntimeError('scikit-image is not installed: it provides the source photographs')
    return Path(spec.origin).parent / 'data'


def load_photo(path: Path) -> np.ndarray:
    """An RGB uint8 array; grayscale photos become 3 identical channels."""
    with Image.open(path) as img:
        return np.asarray(img.convert('RGB'), dtype=np.uint8).copy()


def available_photos(names: Sequence[str], min_side: int, data_dir: Path) -> Dict[str, np.ndarray]:
    """The listed photos that exist and are large enough for a crop of ``min_side`` pixels."""
    photos = {}
    for name in names:
        path = data_dir / name
        if path.is_file():
            arr = load_photo(path)
            if min(arr.shape[:2]) >= min_side:
                photos[name] = arr
    return photos


def blur_kernel(p: CameraProfile) -> np.ndarray:
    """The camera's normalised point-spread function (odd size, at most 2 * MARGIN + 1)."""
    theta = np.deg2rad(p.angle)
    c, s = np.cos(theta), np.sin(theta)
    if p.blur == 'motion':
        radius = p.motion_length // 2
        size = 2 * radius + 1
        kernel = np.zeros((size, size), np.float64)
        for t in np.linspace(-radius, radius, 4 * size):
            kernel[int(round(radius + t * s)), int(round(radius + t * c))] += 1.0
    elif p.blur == 'gaussian':
        radius = int(np.ceil(3 * max(p.sigma_x, p.sigma_y)))
        yy, xx = np.mgrid[-radius:radius + 1, -radius:radius + 1].astype(np.float64)
        u, v = c * xx + s * yy, -s * xx + c * yy
        kernel = np.exp(-0.5 * ((u / p.sigma_x) ** 2 + (v / p.sigma_y) ** 2))
    else:
        raise ValueError(f"unknown blur type '{p.blur}' (expected gaussian or motion)")
    if kernel.shape[0] > 2 * MARGIN + 1:
        raise ValueError(f'blur kernel of {kernel.shape[0]} px exceeds the crop margin {MARGIN}')
    return kernel / kernel.sum()


def apply_look(rgb: np.ndarray, p: CameraProfile) -> np.ndarray:
    """White balance, tone curve and saturation on [0, 1] float RGB (the camera's colour)."""
    x = np.clip(rgb * np.asarray(p.wb, np.float64), 0.0, 1.0) ** p.gamma
    luma = x @ np.array([0.299, 0.587, 0.114])
    return np.clip(luma[..., None] + p.saturation * (x - luma[..., None]), 0.0, 1.0)


def degrade(hr_context: np.ndarray, p: CameraProfile, rng: np.random.Generator) -> np.ndarray:
    """LR uint8 RGB from the look-applied HR *with* its MARGIN context (float [0, 1])."""
    blurred = cv2.filter2D(hr_context, -1, blur_kernel(p), borderType=cv2.BORDER_REFLECT)
    blurred = blurred[MARGIN:-MARGIN, MARGIN:-MARGIN]
    h, w = blurred.shape[:2]
    lr = cv2.resize(blurred, (w // SCALE, h // SCALE), interpolation=cv2.INTER_AREA)
    std = np.sqrt(p.noise_a * np.clip(lr, 0.0, 1.0) + p.noise_b ** 2)
    chroma = rng.standard_normal(lr.shape)
    luma = rng.standard_normal(lr.shape[:2])[..., None]
    lr = lr + std * (p.noise_chroma * chroma + np.sqrt(1.0 - p.noise_chroma ** 2) * luma)
    if p.sharpen > 0:
        lr = lr + p.sharpen * (lr - cv2.GaussianBlur(lr, (0, 0), 1.0, borderType=cv2.BORDER_REFLECT))
    lr8 = to_uint8(lr)
    ok, buf = cv2.imencode('.jpg', lr8[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, p.jpeg_quality,
                                                    cv2.IMWRITE_JPEG_OPTIMIZE, 0])
    if not ok:
        raise RuntimeError('JPEG encoding failed')
    return cv2.imdecode(buf, cv2.IMREAD_COLOR)[..., ::-1]


def to_uint8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x * 255.0), 0, 255).astype(np.uint8)


def pick_crop(photo: np.ndarray, size: int, rng: np.random.Generator) -> Tuple[int, int]:
    """Top-left corner of a textured ``size + 2 * MARGIN`` window (first good of a few tries)."""
    full = size + 2 * MARGIN
    h, w = photo.shape[:2]
    gray = photo.mean(axis=2)
    best, best_std = (0, 0), -1.0
    for _ in range(CROP_CANDIDATES):
        y, x = int(rng.integers(0, h - full + 1)), int(rng.integers(0, w - full + 1))
        std = float(gray[y:y + full, x:x + full].std())
        if std >= MIN_CROP_STD:
            return y, x
        if std > best_std:
            best, best_std = (y, x), std
    return best


def make_pair(photo: np.ndarray, size: int, p: CameraProfile, crop_rng: np.random.Generator,
              noise_rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray, Tuple[int, int]]:
    """(HR uint8, LR uint8, top-left of the HR in the source photo) for one crop and camera."""
    y, x = pick_crop(photo, size, crop_rng)
    full = size + 2 * MARGIN
    context = apply_look(photo[y:y + full, x:x + full].astype(np.float64) / 255.0, p)
    hr = to_uint8(context[MARGIN:-MARGIN, MARGIN:-MARGIN])
    lr = degrade(context, p, noise_rng)
    return hr, lr, (y + MARGIN, x + MARGIN)


def make_clean_pair(photo: np.ndarray, size: int, crop_rng: np.random.Generator
                    ) -> Tuple[np.ndarray, np.ndarray, Tuple[int, int]]:
    """A classic-SR pair (``CLEAN_CAMERAS``): the photo crop and its x4 area resize, nothing else.

    The crop is picked as for every camera (same window with its MARGIN, so the same photos and
    texture rule); the LR is computed from the uint8 HR, so the pair is exactly HR and its resize."""
    y, x = pick_crop(photo, size, crop_rng)
    hr = photo[y + MARGIN:y + MARGIN + size, x + MARGIN:x + MARGIN + size].copy()
    lr = cv2.resize(hr.astype(np.float64) / 255.0, (size // SCALE, size // SCALE), interpolation=cv2.INTER_AREA)
    return hr, to_uint8(lr), (y + MARGIN, x + MARGIN)


def write_png(path: Path, rgb: np.ndarray) -> None:
    if not cv2.imwrite(str(path), np.ascontiguousarray(rgb[..., ::-1]), PNG_PARAMS):
        raise RuntimeError(f'could not write {path}')


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob('*') if f.is_file())


def _check_args(cameras: Sequence[str], train_per_camera: int, test_per_camera: int,
                hr_size: int, test_hr_size: int, pretrain_train_per_camera: int = 1, seed: int = 0) -> None:
    if not 0 <= seed < 2 ** 32:   # numpy's generators take no other seed
        raise ValueError(f'--seed must be an integer in [0, 2**32 - 1], got {seed}')
    for flag, value in (('--hr-size', hr_size), ('--test-hr-size', test_hr_size)):
        if value <= 0 or value % SCALE:
            raise ValueError(f'{flag} must be a positive multiple of {SCALE} (the x{SCALE} scale), '
                             f'got {value}')
    for flag, value in (('--train-per-camera', train_per_camera), ('--test-per-camera', test_per_camera),
                        ('--pretrain-train-per-camera', pretrain_train_per_camera)):
        if value < 1:
            raise ValueError(f'{flag} must be at least 1, got {value}')
    if not cameras:
        raise ValueError('--cameras must name at least one camera')
    unknown = [c for c in cameras if c not in CAMERA_PROFILES]
    if unknown:
        raise ValueError(f"unknown camera(s) {', '.join(unknown)}; known: {', '.join(CAMERA_PROFILES)}")
    if len(set(cameras)) != len(cameras):
        raise ValueError(f"--cameras lists a camera twice: {', '.join(cameras)}")


def _build(root: Path, seed: int, cameras: Sequence[str], counts: Dict[str, Dict[str, int]],
           sizes: Dict[str, int], data_dir: Path) -> List[dict]:
    """Write every pair under ``root``; returns the manifest rows (one per pair)."""
    split_photos = {'train': TRAIN_PHOTOS, 'test': TEST_PHOTOS}
    rows = []
    for split in ('train', 'test'):
        photos = available_photos(split_photos[split], sizes[split] + 2 * MARGIN, data_dir)
        if not photos:
            flag = '--hr-size' if split == 'train' else '--test-hr-size'
            raise ValueError(f'no {split} photo in {data_dir} is large enough for a {sizes[split]} px crop '
                             f'(plus {MARGIN} px blur margin per side); use a smaller {flag}')
        names = sorted(photos)
        hr_dir = root / f'{split.capitalize()}_x{SCALE}' / f'{split}_HR'
        lr_dir = root / f'{split.capitalize()}_x{SCALE}' / f'{split}_LR'
        hr_dir.mkdir(parents=True)
        lr_dir.mkdir(parents=True)
        for cam in cameras:
            cam_code = zlib.crc32(cam.encode())
            # Train: each camera starts its round-robin at another photo and crops elsewhere.
            # Test: every camera shows the same scenes, so per-camera test scores differ only
            # by the degradation (the noise still differs: it is drawn per camera).
            offset = cam_code % len(names) if split == 'train' else 0
            for i in range(counts[split][cam]):
                name = names[(offset + i) % len(names)]
                crop_key = [seed, cam_code, SPLIT_CODES[split], i] if split == 'train' else [seed, SPLIT_CODES[split], i]
                crop_rng = np.random.default_rng(crop_key)
                noise_rng = np.random.default_rng([seed, cam_code, SPLIT_CODES[split], i, 1])
                if cam in CLEAN_CAMERAS:
                    profile = CAMERA_PROFILES[cam]
                    hr, lr, (y, x) = make_clean_pair(photos[name], sizes[split], crop_rng)
                else:
                    profile = (sample_profile(np.random.default_rng([seed, cam_code, SPLIT_CODES[split], i, 2]))
                               if cam in PRETRAIN_CAMERAS else CAMERA_PROFILES[cam])
                    hr, lr, (y, x) = make_pair(photos[name], sizes[split], profile, crop_rng, noise_rng)
                if split == 'train':   # one shot per photo, its crops are patches 0, 1, ...
                    stem, hr_name, lr_name = pair_names(cam, names.index(name), i // len(names))
                else:                  # test shots are numbered after every train shot
                    stem, hr_name, lr_name = pair_names(cam, len(TRAIN_PHOTOS) + i)
                write_png(hr_dir / hr_name, hr)
                write_png(lr_dir / lr_name, lr)
                row = {'split': split, 'stem': stem, 'hr': hr_name, 'lr': lr_name, 'camera': cam, 'source': name,
                       'hr_box_yxhw': [y, x, sizes[split], sizes[split]]}
                if cam in PRETRAIN_CAMERAS and cam not in CLEAN_CAMERAS:   # its own degradation, rounded for the record only
                    row['profile'] = {k: (round(v, 6) if isinstance(v, float) else v)
                                      for k, v in asdict(profile).items() if k not in ('description', 'motion_length')}
                rows.append(row)
    return rows


def make_demo_data(out: Path = DEFAULT_OUT, seed: int = 0, cameras: Sequence[str] = DEFAULT_CAMERAS,
                   train_per_camera: int = 12, test_per_camera: int = 10, hr_size: int = 128,
                   test_hr_size: int = 192, force: bool = False, verbose: bool = False,
                   pretrain_train_per_camera: int = 192) -> dict:
    """Build the demo dataset at ``out`` and return a summary dict.

    Raises ``ValueError`` for bad arguments and ``FileExistsError`` when ``out`` exists and
    ``force`` is false -- both before anything is written. The returned dict has ``out``,
    ``cameras``, ``counts`` ({split: {camera: n}}), ``bytes``, ``seconds`` and ``pairs``.
    """
    start = time.perf_counter()
    out = Path(out).resolve()
    cameras = list(cameras)
    _check_args(cameras, train_per_camera, test_per_camera, hr_size, test_hr_size, pretrain_train_per_camera, seed)
    if out.exists() and not force:
        raise FileExistsError(f'{out} already exists; pass --force to overwrite it')
    if out.exists() and not (out / 'cameras.json').is_file():   # --force replaces what this script wrote, nothing else
        raise FileExistsError(f'{out} exists and is no demo dataset (it has no cameras.json, which this script '
                              'writes); --force replaces only a demo dataset: choose another --out')
    data_dir = skimage_data_dir()
    counts = {'train': {cam: pretrain_train_per_camera if cam in PRETRAIN_CAMERAS else train_per_camera
                        for cam in cameras},
              'test': {cam: test_per_camera for cam in cameras}}
    sizes = {'train': hr_size, 'test': test_hr_size}

    if out.parent.exists() and not out.parent.is_dir():
        raise FileExistsError(f'--out {out}: {out.parent} is a file, not a folder')
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f'.{out.name}.tmp-', dir=out.parent))
    try:
        rows = _build(tmp, seed, cameras, counts, sizes, data_dir)
        manifest = {
            'description': 'Mini DRealSR (x4) built by scripts/make_demo_data.py from scikit-image '
                           'sample photographs; every camera is a synthetic degradation profile.',
            'scale': SCALE, 'seed': seed, 'hr_size': {'train': hr_size, 'test': test_hr_size},
            'camera_rule': CAMERA_STEM_PATTERN,
            'pipeline': ['look (wb, gamma, saturation) on HR; LR inherits it',
                         'blur kernel at HR resolution', f'x{SCALE} area downsampling',
                         'Poisson-Gaussian noise at LR resolution', 'unsharp-mask sharpening',
                         'JPEG at the camera quality'],
            'family_ranges': {k: list(v) for k, v in FAMILY_RANGES.items()},
            'cameras': {cam: asdict(CAMERA_PROFILES[cam]) for cam in cameras},
            'source_photos': {'train': sorted({r['source'] for r in rows if r['split'] == 'train'}),
                              'test': sorted({r['source'] for r in rows if r['split'] == 'test'})},
            'pairs': rows,
        }
        (tmp / 'cameras.json').write_text(json.dumps(manifest, indent=2) + '\n', encoding='utf-8')
        os.chmod(tmp, 0o755)  # mkdtemp creates 0700
        if out.exists():  # --force: swap the old folder out, then drop it
            old = Path(tempfile.mkdtemp(prefix=f'.{out.name}.old-', dir=out.parent))
            os.replace(out, old / 'data')
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    summary = {
        'out': str(out), 'cameras': cameras,
        'counts': counts,
        'bytes': folder_size(out), 'seconds': time.perf_counter() - start, 'pairs': rows,
    }
    if verbose:
        print(format_summary(summary))
    return summary


def format_summary(summary: dict) -> str:
    lines = [f"DRealSR demo data (x{SCALE}) written to {summary['out']}"]
    for cam in summary['cameras']:
        lines.append(f"  {cam:<8} train {summary['counts']['train'][cam]:>3}  "
                     f"test {summary['counts']['test'][cam]:>3}   {CAMERA_PROFILES[cam].description}")
    n_train = sum(summary['counts']['train'].values())
    n_test = sum(summary['counts']['test'].values())
    lines.append(f"  total: {n_train} train pairs, {n_test} test pairs, "
                 f"{summary['bytes'] / 1e6:.2f} MB on disk, built in {summary['seconds']:.1f} s")
    return '\n'.join(lines)


class _FlagParser(argparse.ArgumentParser):
    """Flag errors as one line, like every other error of this script (argparse prints its usage block
    first). Not ``basicsr_ldt.common.flags``: importing the package would load torch and BasicSR into
    a script that needs neither."""

    def error(self, message: str) -> None:
        raise ValueError(f'{message} (make_demo_data.py -h lists the flags)')


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = _FlagParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--out', type=Path, default=DEFAULT_OUT, help='output folder')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--cameras', nargs='+', default=list(DEFAULT_CAMERAS),
                        help=f"camera profiles to build (known: {', '.join(CAMERA_PROFILES)})")
    parser.add_argument('--train-per-camera', type=int, default=12)
    parser.add_argument('--pretrain-train-per-camera', type=int, default=192,
                        help=f"train pairs of the pretraining camera(s) ({', '.join(PRETRAIN_CAMERAS)})")
    parser.add_argument('--test-per-camera', type=int, default=10,
                        help='test pairs per camera (10: per-camera means over enough images to compare methods)')
    parser.add_argument('--hr-size', type=int, default=128, help='train HR crop side (multiple of 4)')
    parser.add_argument('--test-hr-size', type=int, default=192, help='test HR crop side (multiple of 4)')
    parser.add_argument('--force', action='store_true', help='overwrite an existing output folder')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = parse_args(argv)
        make_demo_data(args.out, seed=args.seed, cameras=args.cameras,
                       train_per_camera=args.train_per_camera, test_per_camera=args.test_per_camera,
                       pretrain_train_per_camera=args.pretrain_train_per_camera,
                       hr_size=args.hr_size, test_hr_size=args.test_hr_size, force=args.force,
                       verbose=True)
    except (ValueError, FileExistsError, RuntimeError) as err:
        print(f'make_demo_data: error: {err}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main())
