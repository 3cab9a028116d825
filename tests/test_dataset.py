"""DRealSRCameraDataset and camera rules: what a user selects is exactly what the loader yields."""
import os
import shutil

import cv2
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.data.cameras import CameraRule, pair_keys, strip_template
from basicsr_ldt.data.drealsr_dataset import DRealSRCameraDataset, subset_indices


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


def test_missing_folder(tmp_path):
    with pytest.raises(InputError, match=f"folder '{tmp_path / 'nope'}' does not exist"):
        DRealSRCameraDataset(options(tmp_path, dataroot_gt=str(tmp_path / 'nope'), dataroot_lq=str(tmp_path)))


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
    both sizes; one exactly the patch's size gives that one patch."""
    hr, lr = synthetic_pair(seed=2, lr_h=lr_size[0], lr_w=lr_size[1])
    write_pair(tmp_path, hr, lr)
    dataset = DRealSRCameraDataset(options(tmp_path, gt_size=16))
    if fits:
        assert tuple(dataset[0]['lq'].shape) == (3, 4, 4)
        return
    h, w = lr_size
    with pytest.raises(InputError, match=rf"^LR image 'P1140279_1' is {w}x{h}, smaller than the LR patch 4x4 "
                                         r'\(gt_size 16 / scale 4\)$'):
        dataset[0]


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
