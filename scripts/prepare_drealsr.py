#!/usr/bin/env python
"""Prepare a DRealSR download for training: report cameras, regroup, crop sub-images, build lmdb.

    python scripts/prepare_drealsr.py datasets/DRealSR                     # report cameras and counts
    python scripts/prepare_drealsr.py datasets/DRealSR --by-camera OUT     # copy into per-camera subfolders
    python scripts/prepare_drealsr.py datasets/DRealSR --crop 480 --step 240   # Train_x4/train_{HR,LR}_sub
    python scripts/prepare_drealsr.py datasets/DRealSR --lmdb             # *.lmdb beside each image folder

Why: DRealSR's training images are large (thousands of pixels), so reading whole PNGs for each
48-pixel LR patch wastes most of the I/O; BasicSR's practice is to crop overlapping sub-images
once and optionally pack them into lmdb. The report shows how the camera rule splits the data,
so the ``cameras:`` names in option files can be checked against the real download first.
"""
import argparse
import os
import shutil
import sys
from os import path as osp
from typing import Dict, List, Optional, Sequence

import cv2

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
import basicsr_ldt  # noqa: E402,F401  (torchvision shim before basicsr)
from basicsr_ldt.data.cameras import CameraRule, camera_counts, list_images, pair_keys  # noqa: E402
from basicsr_ldt.errors import InputError  # noqa: E402

SPLITS = (('Train_x4', 'train_HR', 'train_LR'), ('Test_x4', 'test_HR', 'test_LR'))


def scan_split(root: str, split: str, hr: str, lr: str, scale: int, rule: CameraRule) -> Optional[Dict]:
    """Pairs and cameras of one split, or ``None`` when the split is absent."""
    gt_dir, lq_dir = osp.join(root, split, hr), osp.join(root, split, lr)
    if not osp.isdir(gt_dir) and not osp.isdir(lq_dir):
        return None
    for folder in (gt_dir, lq_dir):
        if not osp.isdir(folder):
            raise InputError(f"'{folder}' does not exist but its partner folder does")
    gt_files, lq_files = list_images(gt_dir), list_images(lq_dir)
    ext = {osp.splitext(f)[0]: osp.splitext(f)[1] for f in gt_files + lq_files}
    pairs = pair_keys([osp.splitext(f)[0] for f in gt_files], [osp.splitext(f)[0] for f in lq_files], '{}_x1',
                      f'{{}}_x{scale}', f'{split} ({gt_dir} | {lq_dir})')
    cameras = [rule.camera_of(stem) for stem, _, _ in pairs]
    return {'gt_dir': gt_dir, 'lq_dir': lq_dir, 'pairs': pairs, 'cameras': cameras, 'ext': ext}


def report(splits: Dict[str, Dict]) -> str:
    """A cameras x splits table of pair counts."""
    counts = {name: camera_counts(info['cameras']) for name, info in splits.items()}
    cameras = sorted({c for table in counts.values() for c in table})
    lines = ['camera    ' + ''.join(f'{name:>10}' for name in counts)]
    for camera in cameras:
        lines.append(f'{camera:<10}' + ''.join(f'{counts[name].get(camera, 0):>10}' for name in counts))
    lines.append(f'{"total":<10}' + ''.join(f'{len(info["pairs"]):>10}' for info in splits.values()))
    return '\n'.join(lines)


def by_camera(splits: Dict[str, Dict], root: str, out: str) -> None:
    """Copy every pair into ``<out>/<split>/<side>/<camera>/`` (the layout the official code uses)."""
    if osp.exists(out):
        raise InputError(f"output folder '{out}' already exists")
    tmp = out + '.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    for info in splits.values():
        for (stem, gt_key, lq_key), camera in zip(info['pairs'], info['cameras']):
            for folder, key in ((info['gt_dir'], gt_key), (info['lq_dir'], lq_key)):
                name = key.split('/')[-1] + info['ext'][key]
                target = osp.join(tmp, osp.relpath(folder, root), camera, name)
                os.makedirs(osp.dirname(target), exist_ok=True)
                shutil.copy2(osp.join(folder, key + info['ext'][key]), target)
    os.replace(tmp, out)


def crop_positions(length: int, size: int, step: int) -> List[int]:
    """Origins of overlapping crops along one axis; the last crop is flush with the border."""
    if length <= size:
        return [0]
    starts = list(range(0, length - size + 1, step))
    if starts[-1] != length - size:
        starts.append(length - size)
    return starts


def crop_subimages(info: Dict, size: int, step: int, scale: int) -> int:
    """Write aligned HR/LR sub-images to ``<side>_sub`` folders; names keep the ``_x1``/``_x4`` suffix."""
    if size % scale or step % scale:
        raise InputError(f'--crop {size} and --step {step} must be multiples of the scale {scale}')
    written = 0
    outputs = {side: info[f'{side}_dir'].rstrip('/') + '_sub' for side in ('gt', 'lq')}
    tmps = {side: folder + '.tmp' for side, folder in outputs.items()}
    for side in ('gt', 'lq'):
        if osp.exists(outputs[side]):
            raise InputError(f"output folder '{outputs[side]}' already exists")
        shutil.rmtree(tmps[side], ignore_errors=True)
    for stem, gt_key, lq_key in info['pairs']:
        gt = cv2.imread(osp.join(info['gt_dir'], gt_key + info['ext'][gt_key]), cv2.IMREAD_UNCHANGED)
        lq = cv2.imread(osp.join(info['lq_dir'], lq_key + info['ext'][lq_key]), cv2.IMREAD_UNCHANGED)
        if gt is None or lq is None:
            raise InputError(f"cannot read the pair '{stem}' in {info['gt_dir']}")
        if gt.shape[0] != lq.shape[0] * scale or gt.shape[1] != lq.shape[1] * scale:
            raise InputError(f"size mismatch for '{stem}': LR {lq.shape[1]}x{lq.shape[0]} x{scale} != HR "
                             f'{gt.shape[1]}x{gt.shape[0]}')
        index = 0
        for top in crop_positions(gt.shape[0], size, step):
            for left in crop_positions(gt.shape[1], size, step):
                index += 1
                crops = {'gt': gt[top:top + size, left:left + size],
                         'lq': lq[top // scale:(top + size) // scale, left // scale:(left + size) // scale]}
                for side, suffix in (('gt', '_x1'), ('lq', f'_x{scale}')):
                    target = osp.join(tmps[side], f'{stem}_s{index:03d}{suffix}.png')
                    os.makedirs(osp.dirname(target), exist_ok=True)
                    cv2.imwrite(target, crops[side], [cv2.IMWRITE_PNG_COMPRESSION, 3])
                written += 1
    for side in ('gt', 'lq'):
        os.replace(tmps[side], outputs[side])
    return written


def build_lmdb(folder: str) -> str:
    """``<folder>.lmdb`` with BasicSR's own writer; keys are relative paths without extension."""
    from basicsr.utils.lmdb_util import make_lmdb_from_imgs
    files = list_images(folder)
    target = folder.rstrip('/') + '.lmdb'
    if osp.exists(target):
        raise InputError(f"lmdb '{target}' already exists")
    make_lmdb_from_imgs(folder, target, files, [osp.splitext(f)[0] for f in files], multiprocessing_read=False)
    return target


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('root', help='DRealSR folder holding Train_x4/ and/or Test_x4/')
    parser.add_argument('--scale', type=int, default=4)
    parser.add_argument('--camera-pattern', help='regex with a (?P<camera>...) group applied to file stems')
    parser.add_argument('--by-camera', metavar='OUT', help='copy into per-camera subfolders under OUT')
    parser.add_argument('--crop', type=int, help='HR sub-image size for the training split (e.g. 480)')
    parser.add_argument('--step', type=int, help='HR step between sub-images (default: crop / 2)')
    parser.add_argument('--lmdb', action='store_true', help='pack the training images (sub-images if cropped)')
    args = parser.parse_args(argv)
    try:
        rule = CameraRule.from_options({'pattern': args.camera_pattern} if args.camera_pattern else None)
        splits = {}
        for split, hr, lr in SPLITS:
            info = scan_split(args.root, split, hr, lr, args.scale, rule)
            if info is not None:
                splits[split] = info
        if not splits:
            raise InputError(f"'{args.root}' has neither Train_x4/train_HR|train_LR nor Test_x4/test_HR|test_LR")
        print(report(splits))
        if args.by_camera:
            by_camera(splits, args.root, args.by_camera)
            print(f'per-camera copy written to {args.by_camera}')
        train = splits.get('Train_x4')
        if (args.crop or args.lmdb) and train is None:
            raise InputError(f"'{args.root}' has no Train_x4 split to crop or pack")
        folders = [train['gt_dir'], train['lq_dir']] if train else []
        if args.crop:
            count = crop_subimages(train, args.crop, args.step or args.crop // 2, args.scale)
            folders = [f.rstrip('/') + '_sub' for f in folders]
            print(f'{count} sub-image pairs written to {folders[0]} and {folders[1]}')
        if args.lmdb:
            for folder in folders:
                print(f'lmdb written to {build_lmdb(folder)}')
    except InputError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main())
