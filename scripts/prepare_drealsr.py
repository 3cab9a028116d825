#!/usr/bin/env python
"""Check a DRealSR download before training: cameras x splits, layout, naming, every image's header and size;
regroup, crop, lmdb.

    python scripts/prepare_drealsr.py datasets/DRealSR                     # report cameras and counts
    python scripts/prepare_drealsr.py datasets/DRealSR --by-camera OUT     # copy into per-camera subfolders
    python scripts/prepare_drealsr.py datasets/DRealSR --crop 480 --step 240   # whole images only: *_sub
    python scripts/prepare_drealsr.py datasets/DRealSR --lmdb             # *.lmdb beside the training folders

Why: the report shows how the camera rule splits the data, the layout (flat as published:
``Train_x4/train_HR``, or per-camera folders as the official LDT code keeps them: ``Train/HR/P``)
and the naming it found (the release's HR ``_x4`` / LR ``_x1``, training patches ``_x4_<k>``), so
the ``cameras:`` names in option files can be checked against the real download first. The
published training split is already cut into 192x192 HR patches: ``--crop`` is for users who have
whole training images (thousands of pixels, where reading a whole PNG per 48-pixel patch wastes
most of the I/O), and the report says which case it found.
"""
import os
import shutil
import sys
from os import path as osp
from typing import Dict, List, Optional, Sequence

import cv2

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
import basicsr_ldt  # noqa: E402,F401  (torchvision shim before basicsr)
from basicsr_ldt.data.cameras import (CameraRule, camera_counts, drealsr_name_parts, list_images,  # noqa: E402
                                      pair_keys, split_extension)
from basicsr_ldt.common.errors import InputError  # noqa: E402
from basicsr_ldt.common.flags import FlagParser, positive_int  # noqa: E402
from basicsr_ldt.data.drealsr_dataset import DRealSRCameraDataset  # noqa: E402

#: (split, HR folder, LR folder): the published layout first, then the official LDT code's.
SPLITS = (('Train_x4', 'train_HR', 'train_LR'), ('Test_x4', 'test_HR', 'test_LR'),
          ('Train', 'HR', 'LR'), ('Test', 'HR', 'LR'))
#: Training HR images at most this large on both sides are patches already (the release: 192x192).
PATCH_SIDE = 256


def scan_split(root: str, split: str, hr: str, lr: str, scale: int, rule: CameraRule) -> Optional[Dict]:
    """Pairs and cameras of one split, or ``None`` when the split is absent."""
    gt_dir, lq_dir = osp.join(root, split, hr), osp.join(root, split, lr)
    if not osp.isdir(gt_dir) and not osp.isdir(lq_dir):
        return None
    for folder in (gt_dir, lq_dir):
        if not osp.isdir(folder):
            raise InputError(f"'{folder}' does not exist but its partner folder does")
    gt_files, lq_files = list_images(gt_dir), list_images(lq_dir)
    if not gt_files and not lq_files:
        raise InputError(f"no images in '{gt_dir}' or '{lq_dir}'")
    where = f'{split} ({gt_dir} | {lq_dir})'
    pairs = pair_keys(gt_files, lq_files, None, None, where)
    cameras = rule.cameras_of([stem for stem, _, _ in pairs], where)
    return {'gt_dir': gt_dir, 'lq_dir': lq_dir, 'pairs': pairs, 'cameras': cameras}


def check_images(info: Dict, split: str, scale: int, camera_rule: Optional[Dict]) -> None:
    """Every pair's headers as training and test.py read them (the dataset's own check): an image that is
    not one, or an LR whose size x scale is not its HR's, stops here instead of in a run."""
    DRealSRCameraDataset({'name': split, 'dataroot_gt': info['gt_dir'], 'dataroot_lq': info['lq_dir'],
                          'io_backend': {'type': 'disk'}, 'scale': scale, 'phase': 'test',
                          **({'camera_rule': camera_rule} if camera_rule else {})})


def naming(pairs: Sequence[tuple]) -> str:
    """The naming convention of a split's pairs, in words."""
    order = {('4', '1'): "DRealSR's (HR _x4, LR _x1)", ('1', '4'): 'earlier basicsr-ldt (HR _x1, LR _x4)'}
    kinds = set()
    for _, gt_key, lq_key in pairs:
        gt, lq = (drealsr_name_parts(split_extension(key.split('/')[-1])[0]) for key in (gt_key, lq_key))
        if gt and lq:
            zooms = (gt[1], lq[1])
            kinds.add(order.get(zooms, f'HR _x{zooms[0]}, LR _x{zooms[1]}') + (' patches _<k>' if gt[2] else ''))
        else:
            kinds.add('identical names in HR and LR')
    return '; '.join(sorted(kinds))


def layout(info: Dict) -> str:
    """'per-camera folders (...)' or 'flat' for one split."""
    folders = sorted({stem.split('/')[0] for stem, _, _ in info['pairs'] if '/' in stem})
    return f"per-camera folders ({', '.join(folders)})" if folders else 'flat'


def training_images_are_patches(info: Dict) -> bool:
    """Whether the training HR images are small patches already (a sample of the first 20)."""
    from PIL import Image
    for _, gt_key, _ in info['pairs'][:20]:
        with Image.open(osp.join(info['gt_dir'], gt_key)) as image:
            if max(image.size) > PATCH_SIDE:
                return False
    return True


def report(splits: Dict[str, Dict]) -> str:
    """A cameras x splits table of pair counts, then each split's layout and naming."""
    counts = {name: camera_counts(info['cameras']) for name, info in splits.items()}
    cameras = sorted({c for table in counts.values() for c in table})
    lines = ['camera    ' + ''.join(f'{name:>10}' for name in counts)]
    for camera in cameras:
        lines.append(f'{camera:<10}' + ''.join(f'{counts[name].get(camera, 0):>10}' for name in counts))
    lines.append(f'{"total":<10}' + ''.join(f'{len(info["pairs"]):>10}' for info in splits.values()))
    for name, info in splits.items():
        lines.append(f'{name}: {layout(info)}, naming {naming(info["pairs"])}')
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
                target = osp.join(tmp, osp.relpath(folder, root), camera, key.split('/')[-1])
                os.makedirs(osp.dirname(target), exist_ok=True)
                shutil.copy2(osp.join(folder, key), target)
    os.replace(tmp, out)


def crop_positions(length: int, size: int, step: int) -> List[int]:
    """Origins of overlapping crops along one axis; the last crop is flush with the border."""
    if length <= size:
        return [0]
    starts = list(range(0, length - size + 1, step))
    if starts[-1] != length - size:
        starts.append(length - size)
    return starts


def crop_step(crop: Optional[int], step: Optional[int], scale: int) -> Optional[int]:
    """The HR step between sub-images (``step``, by default ``crop / 2``), checked before anything is
    read or written: crop and step must cut the LR image at whole pixels."""
    if crop is None:
        if step is not None:
            raise InputError(f'--step {step}: it is the step between --crop sub-images; give --crop SIZE too')
        return None
    named = f'--step {step}'
    if step is None:
        step = max(crop // 2, 1)
        named = f'the default --step (crop / 2 = {step})'
    if crop % scale or step % scale:
        raise InputError(f'--crop {crop} and {named} must be multiples of --scale {scale}')
    return step


def crop_subimages(info: Dict, size: int, step: int, scale: int) -> int:
    """Write aligned HR/LR sub-images to ``<side>_sub`` folders, named as the release names its
    patches: sub-image ``k`` of ``Canon_10_x4.png`` is ``Canon_10_x4_<k>.png`` (LR ``Canon_10_x1_<k>``)."""
    written = 0
    outputs = {side: info[f'{side}_dir'].rstrip('/') + '_sub' for side in ('gt', 'lq')}
    tmps = {side: folder + '.tmp' for side, folder in outputs.items()}
    for side in ('gt', 'lq'):
        if osp.exists(outputs[side]):
            raise InputError(f"output folder '{outputs[side]}' already exists")
        shutil.rmtree(tmps[side], ignore_errors=True)
    for stem, gt_key, lq_key in info['pairs']:
        gt = cv2.imread(osp.join(info['gt_dir'], gt_key), cv2.IMREAD_UNCHANGED)
        lq = cv2.imread(osp.join(info['lq_dir'], lq_key), cv2.IMREAD_UNCHANGED)
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
                for side, key in (('gt', gt_key), ('lq', lq_key)):
                    target = osp.join(tmps[side], f'{split_extension(key)[0]}_{index}.png')
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
    parser = FlagParser('python scripts/prepare_drealsr.py', description=__doc__.split('\n\n')[0])
    parser.add_argument('root', help='DRealSR x4 folder holding Train_x4/ and/or Test_x4/ (or Train/, Test/)')
    parser.add_argument('--scale', type=positive_int, default=4)
    parser.add_argument('--camera-pattern', help='regex with a (?P<camera>...) group applied to file stems')
    parser.add_argument('--by-camera', metavar='OUT', help='copy into per-camera subfolders under OUT')
    parser.add_argument('--crop', type=positive_int,
                        help="HR sub-image size for whole training images (e.g. 480); not for the release's 192-px "
                             'patches')
    parser.add_argument('--step', type=positive_int, help='HR step between sub-images (default: crop / 2)')
    parser.add_argument('--lmdb', action='store_true', help='pack the training images (sub-images if cropped)')
    try:
        args = parser.parse_args(argv)
        step = crop_step(args.crop, args.step, args.scale)
        camera_rule = {'pattern': args.camera_pattern} if args.camera_pattern else None
        rule = CameraRule.from_options(camera_rule)
        splits = {}
        for split, hr, lr in SPLITS:
            info = scan_split(args.root, split, hr, lr, args.scale, rule)
            if info is not None:
                check_images(info, split, args.scale, camera_rule)
                splits[split] = info
        if not splits:
            raise InputError(f"'{args.root}' has neither Train_x4/train_HR|train_LR nor Test_x4/test_HR|test_LR "
                             '(the published layout) nor Train/HR|LR, Test/HR|LR (the official LDT code\'s)')
        print(report(splits))
        train = splits.get('Train_x4') or splits.get('Train')
        if train is not None:
            patches = training_images_are_patches(train)
            print('training images are patches already (HR at most %d px): train on them as they are'
                  % PATCH_SIDE if patches else
                  'training images are whole photographs: --crop SIZE --step STEP cuts sub-images once '
                  '(BasicSR practice), --lmdb packs them')
        if (args.crop or args.lmdb) and train is None:
            raise InputError(f"'{args.root}' has no training split to crop or pack")
        if args.by_camera:
            by_camera(splits, args.root, args.by_camera)
            print(f'per-camera copy written to {args.by_camera}')
        folders = [train['gt_dir'], train['lq_dir']] if train else []
        if args.crop:
            count = crop_subimages(train, args.crop, step, args.scale)
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
