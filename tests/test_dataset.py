"""DRealSRCameraDataset and camera rules: what a user selects is exactly what the loader yields."""
import os
import shutil

import cv2
import numpy as np
import torch
import pytest
from hypothesis import given, settings, strategies as st

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.data.cameras import CameraRule, pair_keys, strip_template
from basicsr_ldt.data.drealsr_dataset import DRealSRCameraDataset, random_crop_and_flip, subset_indices


def options(root, split='Train', **extra):
    lower = split.lower()
    opt = {'name': 'd', 'type': 'DRealSRCameraDataset', 'phase': 'train' if split == 'Train' else 'val', 'scale': 4,
           'dataroot_gt': str(root / f'{split}_x4' / f'{lower}_HR'),
           'dataroot_lq': str(root / f'{split}_x4' / f'{lower}_LR'), 'io_backend': {'type': 'disk'}}
    if split == 'Train':
        opt.update(gt_size=32, use_hflip=True, use_rot=True)
    opt.update(extra)
    return opt


def test_default_rule_names_drealsr_cameras():
    rule = CameraRule()
    assert rule.camera_of('DSC_1412') == 'DSC'
    assert rule.camera_of('IMG_0031') == 'IMG'
    # DRealSR's P-files (P1140279: P + month + day + number) are the Olympus camera, not Panasonic.
    assert rule.camera_of('P1140279') == 'Olympus'
    assert rule.camera_of('panasonic_158') == 'Pan' and rule.camera_of('sony_116') == 'Sony'
    assert rule.camera_of('Sony/DSC01234') == 'Sony'  # per-camera subfolder wins in 'auto'
    assert rule.camera_of('P/P1140279') == 'Olympus'  # the official code's folder name


def test_custom_rule_and_aliases():
    rule = CameraRule.from_options({'source': 'filename', 'pattern': r'_(?P<camera>[a-z]+)$',
                                    'aliases': {'nik': 'Nikon'}})
    assert rule.camera_of('x/0001_nik') == 'Nikon'
    with pytest.raises(InputError, match="did you mean 'pattern'"):
        CameraRule.from_options({'patern': 'x'})
    with pytest.raises(InputError, match='not a valid regular expression'):
        CameraRule(pattern='(')


def test_strip_template_and_pairing():
    assert strip_template('Sony/DSC_1_x4', '{}_x4') == 'Sony/DSC_1'
    assert strip_template('DSC_1_x1', '{}_x4') is None
    pairs = pair_keys(['A_1_x1', 'B_2_x1'], ['B_2_x4', 'A_1_x4'], '{}_x1', '{}_x4', 'here')
    assert pairs == [('A_1', 'A_1_x1', 'A_1_x4'), ('B_2', 'B_2_x1', 'B_2_x4')]
    with pytest.raises(InputError, match="1 HR image\\(s\\) without an LR partner, e.g. 'C_3_x1'"):
        pair_keys(['A_1_x1', 'C_3_x1'], ['A_1_x4'], '{}_x1', '{}_x4', 'here')
    # No template: DRealSR's names, paired by stem and patch index whatever the zoom token.
    pairs = pair_keys(['sony_1_x4_2.png', 'sony_1_x4_10.png', 'Canon_5_x4.png'],
                      ['Canon_5_x1.png', 'sony_1_x1_10.png', 'sony_1_x1_2.png'], None, None, 'here')
    assert pairs == [('Canon_5', 'Canon_5_x4.png', 'Canon_5_x1.png'), ('sony_1_10', 'sony_1_x4_10.png', 'sony_1_x1_10.png'),
                     ('sony_1_2', 'sony_1_x4_2.png', 'sony_1_x1_2.png')]


def test_camera_selection_and_items(demo_data):
    dataset = DRealSRCameraDataset(options(demo_data, cameras=['Sony', 'Canon']))
    assert dataset.cameras == {'Canon': 6, 'Sony': 6}
    item = dataset[0]
    assert item['camera'] in ('Sony', 'Canon')
    assert tuple(item['gt'].shape) == (3, 32, 32) and tuple(item['lq'].shape) == (3, 8, 8)
    full = DRealSRCameraDataset(options(demo_data))
    assert full.cameras == {'Canon': 6, 'Olympus': 6, 'Sony': 6}


def test_validation_items_are_whole_images(demo_data):
    dataset = DRealSRCameraDataset(options(demo_data, 'Test', cameras='Olympus'))
    item = dataset[0]
    assert item['camera'] == 'Olympus'
    assert item['gt'].shape[-1] == 4 * item['lq'].shape[-1] and item['gt'].shape[-2] == 96


def test_unknown_camera_lists_found_cameras(demo_data):
    with pytest.raises(InputError) as err:
        DRealSRCameraDataset(options(demo_data, cameras=['Nikon']))
    message = str(err.value)
    assert "'Nikon'" in message and 'Canon (6), Olympus (6), Sony (6)' in message and '\n' not in message


def test_subset_parts_are_disjoint_and_deterministic(demo_data):
    assert subset_indices(10, 3, 0, seed=1) == subset_indices(10, 3, 0, seed=1)
    parts = [set(subset_indices(10, 3, i, seed=1)) for i in range(3)]
    assert set().union(*parts) == set(range(10)) and sum(len(p) for p in parts) == 10
    stems = [{it['stem'] for it in DRealSRCameraDataset(options(demo_data, subset={'parts': 2, 'index': i})).items}
             for i in (0, 1)]
    assert not stems[0] & stems[1] and len(stems[0] | stems[1]) == 18
    with pytest.raises(InputError, match='subset'):
        DRealSRCameraDataset(options(demo_data, subset={'parts': 2, 'index': 2}))


def test_crops_follow_draw_numbers(demo_data):
    dataset = DRealSRCameraDataset(options(demo_data, seed=3))
    a, b = dataset[5], dataset[5]
    assert np.array_equal(a['gt'].numpy(), b['gt'].numpy())
    # Same image (draw 5 + len), another crop/flip: augmentation depends on the draw, not the image.
    c = dataset[5 + len(dataset)]
    assert c['gt_path'] == a['gt_path'] and not np.array_equal(a['gt'].numpy(), c['gt'].numpy())


@pytest.mark.parametrize('change, message', [
    ({'io_backend': {'typ': 'lmdb'}}, "unknown option 'typ' in dataset 'd' io_backend (did you mean 'type'?)"),
    ({'io_backend': {'type': 'disk', 'readonly': True}},   # a TypeError from BasicSR's FileClient at the first image
     "unknown option 'readonly' in dataset 'd' io_backend (type disk)"),
    ({'dataroot_lq': '{gt}'}, "dataset 'd': dataroot_gt and dataroot_lq are the same folder '{gt}'; expected the "
                              'HR images and the LR images in two folders'),   # it said 'size mismatch' only
])
def test_a_backend_or_folder_slip_is_named(tmp_path, change, message):
    hr, lr = synthetic_pair(seed=2)
    write_pair(tmp_path, hr, lr)
    opt = options(tmp_path)
    change = {k: v.format(gt=opt['dataroot_gt']) if isinstance(v, str) else v for k, v in change.items()}
    with pytest.raises(InputError) as err:
        DRealSRCameraDataset({**opt, **change})
    assert str(err.value).startswith(message.format(gt=opt['dataroot_gt']))


def test_missing_folder(tmp_path):
    with pytest.raises(InputError, match=f"folder '{tmp_path / 'nope'}' does not exist"):
        DRealSRCameraDataset(options(tmp_path, dataroot_gt=str(tmp_path / 'nope'), dataroot_lq=str(tmp_path)))
    (tmp_path / 'cameras.json').write_text('{}')   # a file given as the folder was said not to exist
    with pytest.raises(InputError, match=f"folder '{tmp_path / 'cameras.json'}' is a file; expected the folder of its "
                                         'images$'):
        DRealSRCameraDataset(options(tmp_path, dataroot_gt=str(tmp_path / 'cameras.json'), dataroot_lq=str(tmp_path)))


def test_empty_folder(tmp_path):
    (tmp_path / 'hr').mkdir()
    (tmp_path / 'lr').mkdir()
    with pytest.raises(InputError, match='no images found'):
        DRealSRCameraDataset(options(tmp_path, dataroot_gt=str(tmp_path / 'hr'), dataroot_lq=str(tmp_path / 'lr')))


def test_empty_selection(demo_data):
    with pytest.raises(InputError, match='is empty'):
        DRealSRCameraDataset(options(demo_data, cameras=['Sony'], subset={'parts': 13, 'index': 0}))


def copy_split(demo_data, tmp_path):
    root = tmp_path / 'copy'
    shutil.copytree(demo_data / 'Train_x4', root / 'Train_x4')
    return root


def first_pair(root, prefix):
    """(pair stem, HR file, LR file) of the first training pair whose name starts with ``prefix``."""
    hr = sorted((root / 'Train_x4' / 'train_HR').glob(f'{prefix}*'))[0]
    lr = root / 'Train_x4' / 'train_LR' / hr.name.replace('_x4_', '_x1_')
    shot, _, patch = hr.stem.partition('_x4_')
    return f'{shot}_{patch}', hr, lr


def test_unpaired_files(demo_data, tmp_path):
    root = copy_split(demo_data, tmp_path)
    _, hr, lr = first_pair(root, 'sony')
    os.remove(lr)
    with pytest.raises(InputError, match=f"HR image\\(s\\) without an LR partner, e.g. '{hr.name}'"):
        DRealSRCameraDataset(options(root))


def test_size_mismatch_is_found_before_training(demo_data, tmp_path):
    root = copy_split(demo_data, tmp_path)
    stem, _, path = first_pair(root, 'sony')
    cv2.imwrite(str(path), cv2.imread(str(path))[:-1])
    with pytest.raises(InputError, match=f"size mismatch for '{stem}'.*LR 16x15 times scale 4 is 64x60, HR is 64x64"):
        DRealSRCameraDataset(options(root, cameras=['Sony']))


def test_the_smallest_image_is_known_from_the_headers(demo_data, tmp_path):
    """A metric's crop_border is checked against the image with the shortest side before a run starts
    (validation would log NaN otherwise); the headers tell which one it is, wherever it lies in the list."""
    root = copy_split(demo_data, tmp_path)
    hrs = sorted((root / 'Train_x4' / 'train_HR').glob('sony*'))
    for hr, rows in ((hrs[0], 48), (hrs[1], 40)):
        lr = root / 'Train_x4' / 'train_LR' / hr.name.replace('_x4_', '_x1_')
        cv2.imwrite(str(hr), cv2.imread(str(hr))[:rows])
        cv2.imwrite(str(lr), cv2.imread(str(lr))[:rows // 4])
    shot, _, patch = hrs[1].stem.partition('_x4_')
    assert DRealSRCameraDataset(options(root, cameras=['Sony'])).smallest_hr == (f'{shot}_{patch}', 64, 40)
    assert DRealSRCameraDataset(options(demo_data, 'Test', cameras=['Canon'])).smallest_hr[1:] == (96, 96)


def test_unreadable_image_is_named_before_training(demo_data, tmp_path):
    root = copy_split(demo_data, tmp_path)
    _, hr, _ = first_pair(root, 'Canon')
    hr.write_bytes(b'not a png')
    with pytest.raises(InputError, match=f"{hr.name}' of dataset 'd' is corrupt or not an image"):
        DRealSRCameraDataset(options(root, cameras=['Canon']))


def test_truncated_image_is_named_when_read(demo_data, tmp_path):
    root = copy_split(demo_data, tmp_path)
    stem, path, _ = first_pair(root, 'Canon')
    path.write_bytes(path.read_bytes()[:200])  # header intact, pixels missing
    dataset = DRealSRCameraDataset(options(root, cameras=['Canon']))
    index = [it['stem'] for it in dataset.items].index(stem)
    with pytest.raises(InputError, match=f'{path.name}.*corrupt'):
        dataset[index]


def test_unknown_dataset_key_suggests(demo_data):
    with pytest.raises(InputError, match="unknown option 'camera'.*did you mean 'cameras'"):
        DRealSRCameraDataset(options(demo_data, camera=['Sony']))


def test_lmdb_backend_matches_disk(demo_data, tmp_path):
    from basicsr.utils.lmdb_util import make_lmdb_from_imgs
    from basicsr_ldt.data.cameras import list_images
    for side in ('HR', 'LR'):
        folder = demo_data / 'Test_x4' / f'test_{side}'
        files = list_images(str(folder))
        make_lmdb_from_imgs(str(folder), str(tmp_path / f'{side}.lmdb'), files,
                            [os.path.splitext(f)[0] for f in files], multiprocessing_read=False)
    disk = DRealSRCameraDataset(options(demo_data, 'Test', cameras=['Canon']))
    lmdb = DRealSRCameraDataset(options(demo_data, 'Test', cameras=['Canon'], io_backend={'type': 'lmdb'},
                                        dataroot_gt=str(tmp_path / 'HR.lmdb'), dataroot_lq=str(tmp_path / 'LR.lmdb')))
    assert len(lmdb) == len(disk) == 2
    for i in range(len(disk)):
        assert np.array_equal(disk[i]['gt'].numpy(), lmdb[i]['gt'].numpy())
        assert np.array_equal(disk[i]['lq'].numpy(), lmdb[i]['lq'].numpy())
        assert lmdb[i]['camera'] == 'Canon'


# ---------------------------------------------------------------- LR/HR alignment of training patches
def area_downsample(hr, scale):
    """The mean of each ``scale`` x ``scale`` block (float64): what an exact x``scale`` LR of ``hr`` is."""
    h, w = hr.shape[0] // scale, hr.shape[1] // scale
    return hr.astype(np.float64).reshape(h, scale, w, scale, -1).mean(axis=(1, 3))


def synthetic_pair(seed=0, lr_h=12, lr_w=16, scale=4):
    """An HR image with content at every scale (blocks plus fine noise), and its LR as the exact area
    downsample: any LR patch that is not the one under its HR patch differs by far more than rounding."""
    rng = np.random.default_rng(seed)
    coarse = np.kron(rng.random((lr_h, lr_w, 3)), np.ones((scale, scale, 1)))
    hr = np.clip(coarse * 0.8 + rng.random(coarse.shape) * 0.2, 0, 1).astype(np.float32)
    return hr, area_downsample(hr, scale).astype(np.float32)


class ScriptedDraws:
    """Stands in for the numpy generator ``random_crop_and_flip`` draws from: the crop offsets it
    returns are fixed, and each of the three augmentation draws is 'apply' (0.25) or 'skip' (0.75), so
    every combination is exercised on purpose, not by chance."""

    def __init__(self, top, left, applied):
        self.offsets, self.applied = [top, left], applied

    def integers(self, low, high=None):   # numpy's signature: one argument is the upper bound
        low, high = (0, low) if high is None else (low, high)
        value = self.offsets.pop(0)
        assert low <= value < high
        return value

    def random(self, n):   # the scripted draws first; any further ones say 'skip'
        assert n >= len(self.applied)
        return np.array([0.25 if a else 0.75 for a in self.applied] + [0.75] * (n - len(self.applied)))


def key(a):
    return np.ascontiguousarray(a).tobytes()


def dihedral(a):
    """The eight rotations/mirrorings of an image (the group BasicSR's flip + rotation augmentation spans)."""
    return [np.rot90(b, k) for b in (a, a[:, ::-1]) for k in range(4)]


@pytest.mark.parametrize('hflip,rotate', [(True, True), (True, False), (False, True), (False, False)])
def test_every_crop_and_flip_combination_keeps_lr_under_its_hr(hflip, rotate):
    """For each of the 2**3 augmentation draws and a crop away from the corner: the LR patch is the
    area downsample of its HR patch (same content, not only the same shape), it is a rotation/mirror
    of the LR crop at the drawn offset, and the options switch off exactly the flips they name."""
    from basicsr_ldt.data.drealsr_dataset import random_crop_and_flip
    hr, lr = synthetic_pair()
    scale, gt_size, top, left = 4, 20, 3, 5           # LR patch 5x5 at (3, 5) of the 12x16 LR
    crop = lr[top:top + 5, left:left + 5]
    seen = set()
    for applied in [(a, b, c) for a in (False, True) for b in (False, True) for c in (False, True)]:
        gt_patch, lq_patch = random_crop_and_flip(hr, lr, gt_size, scale, ScriptedDraws(top, left, applied),
                                                  hflip, rotate, 'P1140279_1')
        assert gt_patch.shape == (20, 20, 3) and lq_patch.shape == (5, 5, 3)
        np.testing.assert_allclose(area_downsample(gt_patch, scale), lq_patch, rtol=0, atol=1e-6,
                                   err_msg=f'LR patch not under its HR patch for draws {applied}')
        assert key(lq_patch) in {key(d) for d in dihedral(crop)}, f'not the crop at ({top}, {left})'
        seen.add(key(lq_patch))
    d = dihedral(crop)
    expected = {(True, True): d, (False, False): [crop], (True, False): [crop, crop[:, ::-1]],
                (False, True): [crop, crop[::-1], crop.transpose(1, 0, 2), crop[::-1].transpose(1, 0, 2)]}
    assert seen == {key(e) for e in expected[hflip, rotate]}


def write_pair(root, hr, lr):
    """``hr``/``lr`` (RGB in [0, 1]) as one DRealSR training pair of 8-bit PNGs under ``root``."""
    for side, image, name in (('HR', hr, 'P1140279_x4_1.png'), ('LR', lr, 'P1140279_x1_1.png')):
        folder = root / 'Train_x4' / f'train_{side}'
        folder.mkdir(parents=True)
        cv2.imwrite(str(folder / name), np.round(image[..., ::-1] * 255).astype(np.uint8))


def test_dataset_training_patches_keep_lr_under_hr_and_reach_every_position(tmp_path):
    """Through the dataset, 200 draws of a pair whose LR is the HR's exact area downsample (stored as
    8-bit PNGs): every LR patch is within rounding of its HR patch's downsample, and the patches come
    from every position of the image, corners included, and from nowhere else."""
    hr, lr = synthetic_pair(seed=1)
    write_pair(tmp_path, hr, lr)
    lr = np.round(lr * 255) / 255
    dataset = DRealSRCameraDataset(options(tmp_path, gt_size=16, seed=7))
    where = {key(d): (t, l) for t in range(12 - 4 + 1) for l in range(16 - 4 + 1)
             for d in dihedral(lr[t:t + 4, l:l + 4].astype(np.float32))}
    positions = set()
    for draw in range(200):
        item = dataset[draw]
        gt, lq = item['gt'].numpy().transpose(1, 2, 0), item['lq'].numpy().transpose(1, 2, 0)
        assert gt.shape == (16, 16, 3) and lq.shape == (4, 4, 3)
        np.testing.assert_allclose(area_downsample(gt, 4), lq, rtol=0, atol=1.01 / 255, err_msg=f'draw {draw}')
        assert key(lq) in where, f'draw {draw}: the LR patch is no 4x4 window of the LR image'
        positions.add(where[key(lq)])
    tops, lefts = {t for t, _ in positions}, {l for _, l in positions}
    assert tops == set(range(9)) and lefts == set(range(13)), (sorted(tops), sorted(lefts))


@pytest.mark.parametrize('lr_size, fits', [((3, 16), False), ((12, 3), False), ((4, 4), True)])
def test_an_lr_image_smaller_than_the_patch_is_named(tmp_path, lr_size, fits):
    """An LR image narrower or lower than the LR patch (gt_size / scale = 4) stops with its name and
    both sizes, from its header when the dataset is built (the run used to make its folder, print its
    banner and fail at the first batch), and at the crop for what headers do not show (lmdb); one exactly
    the patch's size gives that one patch."""
    hr, lr = synthetic_pair(seed=2, lr_h=lr_size[0], lr_w=lr_size[1])
    write_pair(tmp_path, hr, lr)
    if fits:
        assert tuple(DRealSRCameraDataset(options(tmp_path, gt_size=16))[0]['lq'].shape) == (3, 4, 4)
        return
    h, w = lr_size
    message = rf"^LR image 'P1140279_1' is {w}x{h}, smaller than the LR patch 4x4 \(gt_size 16 / scale 4\)$"
    with pytest.raises(InputError, match=message):
        DRealSRCameraDataset(options(tmp_path, gt_size=16))
    with pytest.raises(InputError, match=message):
        random_crop_and_flip(hr, lr, 16, 4, np.random.default_rng(0), True, True, 'P1140279_1')


# ---------------------------------------------------------------- subsets of a camera selection (issue 58)

#: DRealSR's file prefixes and the camera each names (DESIGN.md, "Data"), written here, not read from
#: the project's rule; in sorted order the target cameras' files come before and after the sources'.
PREFIXES = {'Canon_{}': 'Canon', 'DSC_14{:02d}': 'DSC', 'IMG_00{:02d}': 'IMG', 'P11402{:02d}': 'Olympus',
            'panasonic_{}': 'Pan', 'sony_{}': 'Sony'}


@pytest.fixture(scope='module')
def six_cameras(tmp_path_factory):
    """A training folder in DRealSR's naming with 5 shots of each of the six cameras (one patch each,
    HR 32x32 over LR 8x8); returns (root, {pair stem: camera})."""
    root = tmp_path_factory.mktemp('six_cameras')
    stems = {}
    rng = np.random.default_rng(0)
    for side in ('HR', 'LR'):
        (root / 'Train_x4' / f'train_{side}').mkdir(parents=True)
    for prefix, camera in PREFIXES.items():
        for shot in range(5):
            name = prefix.format(shot + 10)
            stems[f'{name}_1'] = camera
            for side, size, zoom in (('HR', 32, 'x4'), ('LR', 8, 'x1')):
                image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                cv2.imwrite(str(root / 'Train_x4' / f'train_{side}' / f'{name}_{zoom}_1.png'), image)
    return root, stems


def test_ldt_warmup_and_profiling_subsets_hold_only_the_source_camera(tmp_path, demo_data):
    """LDT's head warm-up (D_S1) and profiling (D_S2) parts of ``datasets.train`` with ``cameras:
    [Olympus]``: a user relies on both holding only the source camera's images, disjoint, together
    every Olympus pair. In the demo folder the Canon files sort first, so the slip that indexes the
    subset's positions into all the folder's pairs (instead of the selected camera's) fills both
    parts with Canon (target) images; this test kills it."""
    from basicsr.models import build_model
    from test_ldt_model import ldt_options
    opt = ldt_options(demo_data, 'subsets')
    opt['path'].update(models=str(tmp_path / 'models'), training_states=str(tmp_path / 'states'))
    opt.update(is_train=True, dist=False, rank=0, world_size=1)
    model = build_model(opt)
    parts = [model._phase_data[phase].dataset.items for phase in ('warmup', 'profile')]
    for items in parts:
        assert items and {item['camera'] for item in items} == {'Olympus'}
        assert all(os.path.basename(item['gt_path']).startswith('P') for item in items)   # Olympus files: P<digits>
    stems = [{item['stem'] for item in items} for items in parts]
    olympus = {item['stem'] for item in DRealSRCameraDataset(options(demo_data, cameras=['Olympus'])).items}
    assert not stems[0] & stems[1] and stems[0] | stems[1] == olympus


@settings(max_examples=40, deadline=None)
@given(cameras=st.sets(st.sampled_from(sorted(set(PREFIXES.values()))), min_size=1).map(sorted),
       parts=st.integers(1, 5), seed=st.integers(0, 2 ** 31 - 1))
def test_every_subset_item_belongs_to_the_selected_cameras(six_cameras, cameras, parts, seed):
    """Property over camera selections, part counts and seeds: each part of ``subset`` holds only
    pairs of the selected cameras (by the file prefix, as DRealSR names them), the parts are disjoint,
    together they are exactly the selected cameras' pairs, and each item's ``camera`` is its file's.
    Kills the slip that takes the subset's positions as indices into all the folder's pairs."""
    root, camera_of = six_cameras
    selected = {stem for stem, camera in camera_of.items() if camera in cameras}
    seen = set()
    for index in range(parts):
        items = DRealSRCameraDataset(options(root, gt_size=16, cameras=cameras,
                                             subset={'parts': parts, 'index': index, 'seed': seed})).items
        stems = {item['stem'] for item in items}
        assert stems <= selected, (cameras, sorted(stems - selected))
        assert all(item['camera'] == camera_of[item['stem']] for item in items)
        assert not stems & seen
        seen |= stems
    assert seen == selected


# ------------------------------------------- what the loader yields and says (mutation testing, issue 58)

def synthetic(root, scale=2, size=(6, 5), names=('Canon_1', 'Canon_2', 'sony_3'), extra=(0, 0), seed=0,
              gt_name='{}_x4.png', lq_name='{}_x1.png'):
    """An HR/LR folder pair of random images: LR ``size`` (w, h), HR ``scale`` times that plus
    ``extra`` (columns, rows); DRealSR's names unless told otherwise."""
    rng = np.random.default_rng(seed)
    for side in ('hr', 'lr'):
        (root / side).mkdir(parents=True, exist_ok=True)
    w, h = size
    for name in names:
        hr = rng.integers(0, 256, (h * scale + extra[1], w * scale + extra[0], 3), dtype=np.uint8)
        lr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        cv2.imwrite(str(root / 'hr' / gt_name.format(name)), hr)
        cv2.imwrite(str(root / 'lr' / lq_name.format(name)), lr)
    return {'name': 'd', 'phase': 'val', 'scale': scale, 'dataroot_gt': str(root / 'hr'),
            'dataroot_lq': str(root / 'lr'), 'io_backend': {'type': 'disk'}}


def rgb(path):
    return np.ascontiguousarray(cv2.imread(str(path))[:, :, ::-1].transpose(2, 0, 1)).astype(np.float32) / 255.0


def test_items_are_the_files_pixels_in_rgb_at_the_datasets_scale(tmp_path):
    """A validation item is the pair's pixels, RGB, in [0, 1], at the option file's ``scale`` (x2
    here: an x4 reading would refuse every pair). Kills the dropped ``bgr2rgb`` and the scale read
    from another key."""
    opt = synthetic(tmp_path)
    dataset = DRealSRCameraDataset(opt)
    assert [it['stem'] for it in dataset.items] == ['Canon_1', 'Canon_2', 'sony_3'] and len(dataset) == 3
    for k, item in enumerate(dataset.items):
        got = dataset[k]
        assert got['camera'] == item['camera'] == ('Sony' if k == 2 else 'Canon')
        assert np.array_equal(got['gt'].numpy(), rgb(item['gt_path'])) and got['gt'].dtype == torch.float32
        assert np.array_equal(got['lq'].numpy(), rgb(item['lq_path']))


def window_of(image, patch):
    """(top, left) of ``patch`` inside ``image`` (C, H, W) as an unflipped window, or None."""
    _, ph, pw = patch.shape
    for top in range(image.shape[1] - ph + 1):
        for left in range(image.shape[2] - pw + 1):
            if np.array_equal(image[:, top:top + ph, left:left + pw], patch):
                return top, left
    return None


def test_training_crops_follow_use_hflip_use_rot_and_seed(tmp_path):
    """``use_hflip: false, use_rot: false`` gives plain aligned windows (LR at the HR position /
    scale); the flips are on by default, as in BasicSR; crops depend on ``seed`` (default 0). Kills
    the mutants that read another key or default for use_hflip, use_rot or seed."""
    base = dict(synthetic(tmp_path, size=(12, 10), names=('Canon_1',)), phase='train', gt_size=8)
    plain = DRealSRCameraDataset({**base, 'use_hflip': False, 'use_rot': False})
    hr, lr = rgb(plain.items[0]['gt_path']), rgb(plain.items[0]['lq_path'])
    for draw in range(12):
        item = plain[draw]
        assert item['gt'].shape == (3, 8, 8) and item['lq'].shape == (3, 4, 4)
        top, left = window_of(hr, item['gt'].numpy())
        assert top % 2 == 0 and left % 2 == 0 and window_of(lr, item['lq'].numpy()) == (top // 2, left // 2)
    default = DRealSRCameraDataset(base)
    explicit = DRealSRCameraDataset({**base, 'use_hflip': True, 'use_rot': True, 'seed': 0})
    draws = [default[d]['gt'].numpy() for d in range(12)]
    assert all(np.array_equal(a, explicit[d]['gt'].numpy()) for d, a in enumerate(draws))
    assert any(window_of(hr, a) is None for a in draws)                     # some draws are flipped
    for key in ('use_hflip', 'use_rot'):   # one of the two off: the other still flips some draws
        only = DRealSRCameraDataset({**base, key: False})
        assert any(window_of(hr, only[d]['gt'].numpy()) is None for d in range(12)), key
    other_seed = DRealSRCameraDataset({**base, 'seed': 1})
    assert any(not np.array_equal(a, other_seed[d]['gt'].numpy()) for d, a in enumerate(draws))


def test_training_needs_a_patch_size_that_the_scale_divides(tmp_path):
    base = dict(synthetic(tmp_path, names=('Canon_1',)), phase='train')
    with pytest.raises(InputError, match=r"^training dataset 'd' needs option 'gt_size' \(HR patch size\)$"):
        DRealSRCameraDataset(base)
    with pytest.raises(InputError, match=r"^dataset 'd': gt_size 9 is not a multiple of scale 2$"):
        DRealSRCameraDataset({**base, 'gt_size': 9})
    assert len(DRealSRCameraDataset({**base, 'phase': 'val'})) == 1         # outside training: whole images


@pytest.mark.parametrize('extra', [(1, 0), (0, 1), (1, 1)])
def test_an_hr_a_little_larger_is_cropped_outside_training_and_logged_once(tmp_path, extra):
    """Outside training an HR up to scale - 1 pixels wider and/or taller than LR x scale is cropped
    at the bottom/right (as the official code does) with one log line per image, in either
    direction alone; an exact pair is not logged. Kills the mutants of ``_check_sizes`` that refuse a
    pair larger in one direction only or log every pair as cropped."""
    from conftest import basicsr_log
    exact = DRealSRCameraDataset(synthetic(tmp_path / 'exact'))
    larger = DRealSRCameraDataset(synthetic(tmp_path / 'larger', extra=extra))
    with basicsr_log() as messages:
        for _ in range(2):
            assert exact[0]['gt'].shape == (3, 10, 12)
        assert not [m for m in messages if 'cropped' in m]
        for _ in range(2):
            item = larger[0]
            assert item['gt'].shape == (3, 10, 12)
            assert np.array_equal(item['gt'].numpy(), rgb(larger.items[0]['gt_path'])[:, :10, :12])
    lines = [m for m in messages if 'cropped' in m]
    assert lines == [f"dataset 'd': HR of 'Canon_1' is {12 + extra[0]}x{10 + extra[1]}, LR 6x5 x 2 is 12x10: HR "
                     'cropped at the bottom/right before the metric, as the official LDT code does']


def test_a_size_mismatch_says_what_is_cropped_only_outside_training(tmp_path):
    opt = synthetic(tmp_path, scale=4, extra=(4, 0))
    message = (r"^size mismatch for 'Canon_1' in dataset 'd': LR 6x5 times scale 4 is 24x20, HR is 28x20")
    with pytest.raises(InputError, match=message + r' \(outside training an HR up to 3 pixels wider or taller is '
                                                   r'cropped; this one is not\)$'):
        DRealSRCameraDataset(opt)
    with pytest.raises(InputError, match=message + '$'):
        DRealSRCameraDataset({**opt, 'phase': 'train', 'gt_size': 8})


def test_naming_templates_pair_the_files_and_are_named_when_a_file_does_not_follow(tmp_path):
    """``filename_tmpl_gt`` / ``filename_tmpl_lq`` pair ``<stem>_hr`` with ``<stem>_lr`` (each side by
    its own template); a file that does not follow its side's template, or a pair missing a side, is
    one error naming the side, the file, the dataset and the templates."""
    opt = {**synthetic(tmp_path, gt_name='{}_hr.png', lq_name='{}_lr.png'),
           'filename_tmpl_gt': '{}_hr', 'filename_tmpl_lq': '{}_lr'}
    dataset = DRealSRCameraDataset(opt)
    assert [(it['stem'], it['camera']) for it in dataset.items] == [('Canon_1', 'Canon'), ('Canon_2', 'Canon'),
                                                                      ('sony_3', 'Sony')]
    assert dataset.items[2]['lq_path'].endswith('sony_3_lr.png') and dataset.items[2]['gt_path'].endswith('sony_3_hr.png')
    where = f"dataset 'd' ({tmp_path / 'hr'} | {tmp_path / 'lr'})"
    cv2.imwrite(str(tmp_path / 'lr' / 'Canon_9_x1.png'), np.zeros((5, 6, 3), np.uint8))
    with pytest.raises(InputError) as err:
        DRealSRCameraDataset(opt)
    assert str(err.value) == (f"LR image 'Canon_9_x1.png' in {where} does not follow the naming template '{{}}_lr' "
                              '(e.g. Canon_10_lr.png)')
    os.rename(tmp_path / 'lr' / 'Canon_9_x1.png', tmp_path / 'lr' / 'Canon_9_lr.png')
    with pytest.raises(InputError) as err:
        DRealSRCameraDataset(opt)
    assert str(err.value) == (f"unpaired files in {where}: 1 LR image(s) without an HR partner, e.g. 'Canon_9_lr.png' "
                              "(templates '{}_hr' / '{}_lr')")
    with pytest.raises(InputError, match=r"^two LR images for one pair 'Canon_1' in dataset 'd': 'Canon_1_lr' and "
                                         r"'Canon_1_lr\.jpg' \(expected one LR image per stem"):
        pair_keys(['Canon_1_hr'], ['Canon_1_lr', 'Canon_1_lr.jpg'], '{}_hr', '{}_lr', "dataset 'd'")


def test_an_empty_side_is_reported_as_unpaired_files_not_as_an_empty_folder(tmp_path):
    opt = synthetic(tmp_path)
    for path in (tmp_path / 'hr').iterdir():
        path.unlink()
    with pytest.raises(InputError, match=r"unpaired files in dataset 'd' .*: 3 LR image\(s\) without an HR partner"):
        DRealSRCameraDataset(opt)


def test_messages_name_the_dataset_and_what_was_selected(tmp_path):
    """Each error names the dataset section it comes from ('?' / 'dataset' when it has no name) and
    the selection: what a user with several datasets in one option file needs to find the line."""
    opt = synthetic(tmp_path)
    where = f"dataset 'd' ({tmp_path / 'hr'} | {tmp_path / 'lr'})"
    with pytest.raises(InputError, match=r"^unknown option 'bogus' in dataset '\?';"):
        DRealSRCameraDataset({k: v for k, v in {**opt, 'bogus': 1}.items() if k != 'name'})
    with pytest.raises(InputError, match=r"^dataset 'dataset': folder '.*nope' does not exist$"):
        DRealSRCameraDataset({k: v for k, v in {**opt, 'dataroot_gt': str(tmp_path / 'nope')}.items() if k != 'name'})
    with pytest.raises(InputError) as err:
        DRealSRCameraDataset({**opt, 'cameras': ['Nikon']})
    assert str(err.value) == f"unknown camera(s) 'Nikon' in {where}; cameras found (images): Canon (2), Sony (1)"
    with pytest.raises(InputError, match=r"^unknown option 'part' in dataset 'd' subset"):
        DRealSRCameraDataset({**opt, 'subset': {'part': 2}})
    with pytest.raises(InputError) as err:
        DRealSRCameraDataset({**opt, 'cameras': ['Sony'], 'subset': {'parts': 2, 'index': 0}})
    assert str(err.value) == f"{where}: the selection (cameras=['Sony'], subset={{'parts': 2, 'index': 0}}) is empty"
    # A test or validation part without one of its cameras: that camera's column would vanish from the table.
    sony_in = [any(it['camera'] == 'Sony' for it in DRealSRCameraDataset({**opt, 'phase': 'train', 'gt_size': 4, 'subset': {
        'parts': 2, 'index': i}}).items) for i in (0, 1)]                  # training parts may lack one (LDT's D_S1/D_S2)
    without = sony_in.index(False)
    with pytest.raises(InputError) as err:
        DRealSRCameraDataset({**opt, 'subset': {'parts': 2, 'index': without}})
    assert str(err.value) == (f"{where}: subset {{'parts': 2, 'index': {without}}} leaves camera(s) ['Sony'] with no "
                              'image (the part is drawn over all cameras together); use fewer parts or list fewer cameras')
    assert len(DRealSRCameraDataset({**opt, 'subset': {'parts': 2, 'index': 1 - without}}).items) == 2   # both cameras
    with pytest.raises(InputError) as err:
        DRealSRCameraDataset({**opt, 'camera_rule': {'source': 'filename', 'pattern': '^Z'}})
    assert str(err.value) == "cannot tell the camera of 'Canon_1': camera_rule.pattern '^Z' does not match its file name"
    (tmp_path / 'hr' / 'Foo_7_x4.png').write_bytes((tmp_path / 'hr' / 'Canon_1_x4.png').read_bytes())
    (tmp_path / 'lr' / 'Foo_7_x1.png').write_bytes((tmp_path / 'lr' / 'Canon_1_x1.png').read_bytes())
    (tmp_path / 'hr' / 'Bar_8_x4.png').write_bytes((tmp_path / 'hr' / 'Canon_1_x4.png').read_bytes())
    (tmp_path / 'lr' / 'Bar_8_x1.png').write_bytes((tmp_path / 'lr' / 'Canon_1_x1.png').read_bytes())
    with pytest.raises(InputError, match=r"^unknown camera prefix\(es\) 'Bar', 'Foo' in dataset 'd' \(.*\(e\.g\. 'Bar_8'\); "
                                         r'prefixes found \(images -> camera\): Bar \(1 -> \?\), Canon \(2 -> Canon\), '
                                         r'Foo \(1 -> \?\), sony \(1 -> Sony\)\. Expected'):
        DRealSRCameraDataset(opt)


def test_a_file_gone_after_the_check_is_named_when_read(tmp_path):
    dataset = DRealSRCameraDataset(synthetic(tmp_path))
    os.remove(dataset.items[1]['lq_path'])
    with pytest.raises(InputError, match=rf"^cannot read image '{dataset.items[1]['lq_path']}' of dataset 'd': "):
        dataset[1]


def test_subset_defaults_and_the_all_selection(tmp_path):
    """``subset`` without ``index``/``seed`` is part 0 with seed 0, without ``parts`` the whole
    selection; ``cameras: all`` (or ``[all]``, or absent) keeps every camera."""
    opt = {**synthetic(tmp_path, names=[f'Canon_{k}' for k in range(6)] + ['sony_9']), 'phase': 'train',
           'gt_size': 4}                            # a training part: a test part losing sony_9 is refused
    stems = lambda **o: [it['stem'] for it in DRealSRCameraDataset({**opt, **o}).items]  # noqa: E731
    everything = stems()
    assert len(everything) == 7 and stems(cameras='all') == stems(cameras=['all']) == everything
    assert stems(subset={}) == everything
    assert stems(subset={'parts': 2}) == stems(subset={'parts': 2, 'index': 0, 'seed': 0}) != everything
    assert stems(subset={'parts': 2, 'seed': 3}) == stems(subset={'parts': 2, 'index': 0, 'seed': 3})
    assert len({tuple(stems(subset={'parts': 2, 'seed': s})) for s in range(6)}) > 1   # the seed matters


def test_camera_rule_edges_a_user_can_reach():
    """source 'folder' with a flat file is refused (not read from the file name); a pattern without
    a 'camera' group names the camera by its whole match; an unknown camera_rule key names the
    section; a stem with a dot keeps it; a template whose prefix and suffix overlap the name
    leaves no stem, and one with a prefix matches inside camera subfolders."""
    from basicsr_ldt.data.cameras import split_extension
    with pytest.raises(InputError, match=r"^camera_rule\.source is 'folder' but 'Canon_1' is not inside a camera "
                                         r'subfolder$'):
        CameraRule(source='folder').camera_of('Canon_1')
    assert CameraRule(source='folder').camera_of('Mine/Canon_1') == 'Mine'
    assert CameraRule(source='filename', pattern='[A-Za-z]+').camera_of('x/Canon_1') == 'Canon'
    with pytest.raises(InputError, match=r"^unknown option 'patern' in camera_rule \(did you mean 'pattern'\?\)"):
        CameraRule.from_options({'patern': 'x'})
    assert split_extension('Canon_1.5_x4') == ('Canon_1.5_x4', '') and split_extension('a.PNG') == ('a', '.PNG')
    assert strip_template('abba', 'ab{}ba') is None and strip_template('aba', 'ab{}ba') is None
    assert strip_template('abxba', 'ab{}ba') == 'x' and strip_template('Sony/hr_1', 'hr_{}') == 'Sony/1'


def test_the_remaining_loader_messages_are_whole_lines(tmp_path):
    """The rest of the loader's one-line errors, pinned whole: a named dataset's unknown key, a missing
    data root, an invalid camera_rule.source, unpaired files
    under DRealSR's naming (both sides, joined), unknown cameras in an empty folder, an lmdb folder
    without meta_info.txt, the class of an unreadable image (mutation testing, issue 58)."""
    from basicsr_ldt.data.cameras import select_cameras
    opt = synthetic(tmp_path)
    where = f"dataset 'd' ({tmp_path / 'hr'} | {tmp_path / 'lr'})"
    with pytest.raises(InputError, match=r"^unknown option 'bogus' in dataset 'd';"):
        DRealSRCameraDataset({**opt, 'bogus': 1})
    with pytest.raises(InputError) as err:
        DRealSRCameraDataset({k: v for k, v in opt.items() if k != 'dataroot_lq'})
    assert str(err.value) == "dataset 'd' needs option 'dataroot_lq'"
    with pytest.raises(InputError) as err:
        CameraRule(source='name')
    assert str(err.value) == "camera_rule.source must be one of auto, folder, filename; got 'name'"
    os.remove(tmp_path / 'lr' / 'Canon_2_x1.png')
    os.rename(tmp_path / 'hr' / 'sony_3_x4.png', tmp_path / 'hr' / 'sony_4_x4.png')
    with pytest.raises(InputError) as err:
        DRealSRCameraDataset(opt)
    assert str(err.value) == (
        f"unpaired files in {where}: 2 HR image(s) without an LR partner, e.g. 'Canon_2_x4.png'; 1 LR image(s) "
        "without an HR partner, e.g. 'sony_3_x1.png' (pairs are matched by stem and patch index, whatever the zoom "
        "token: HR 'Canon_10_x4' with LR 'Canon_10_x1', 'sony_26_x4_24' with 'sony_26_x1_24')")
    with pytest.raises(InputError) as err:
        select_cameras([], ['Sony', 'Canon'], 'here')
    assert str(err.value) == "unknown camera(s) 'Sony', 'Canon' in here; cameras found (images): none"
    (tmp_path / 'db').mkdir()
    (tmp_path / 'db_lq').mkdir()
    with pytest.raises(InputError) as err:
        DRealSRCameraDataset({**opt, 'dataroot_gt': str(tmp_path / 'db'), 'dataroot_lq': str(tmp_path / 'db_lq'),
                              'io_backend': {'type': 'lmdb'}})
    assert str(err.value) == f"lmdb folder '{tmp_path / 'db'}' has no meta_info.txt (expected BasicSR's lmdb layout)"
    second = synthetic(tmp_path / 'second')
    (tmp_path / 'second' / 'hr' / 'Canon_1_x4.png').write_bytes(b'not a png')
    with pytest.raises(InputError, match=r"Canon_1_x4\.png' of dataset 'd' is corrupt or not an image "
                                         r'\(UnidentifiedImageError\)$'):
        DRealSRCameraDataset(second)


def test_subset_seed_defaults_to_0():
    assert subset_indices(10, 3, 1) == subset_indices(10, 3, 1, seed=0)
