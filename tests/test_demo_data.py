"""Tests for scripts/make_demo_data.py: the offline mini DRealSR every other data test relies on.

The demo data stands in for DRealSR, so it must have DRealSR's exact layout and naming, be
reproducible to the byte, keep train and test content apart, and carry a real camera shift.
"""
import importlib.util
import json
import re
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location('make_demo_data', REPO / 'scripts' / 'make_demo_data.py')
mdd = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = mdd  # dataclasses look their module up there
_spec.loader.exec_module(mdd)

SPLITS = {'train': ('Train_x4', 'train_HR', 'train_LR'), 'test': ('Test_x4', 'test_HR', 'test_LR')}
SMALL = dict(cameras=['Sony', 'IMG'], train_per_camera=3, test_per_camera=2)


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
    """One build with the default arguments (all six cameras), shared by the read-only tests."""
    out = tmp_path_factory.mktemp('demo') / 'DRealSR_demo'
    summary = mdd.make_demo_data(out)
    return out, summary


def all_files(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob('*')) if p.is_file()}


def read_rgb(path: Path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert img is not None, path
    return img[..., ::-1].astype(np.float64) / 255.0


def pairs(root: Path, split: str):
    """(pair stem, HR path, LR path) for every HR file of a split, in name order. DRealSR's names:
    HR ``<stem>_x4.png`` with LR ``<stem>_x1.png``; training patches ``<stem>_x4_<k>.png``."""
    top, hr_name, lr_name = SPLITS[split]
    for hr in sorted((root / top / hr_name).iterdir()):
        shot, _, patch = hr.stem.partition('_x4')
        yield shot + patch, hr, root / top / lr_name / f'{shot}_x1{patch}.png'


#: The release's file prefixes and the paper's camera each names (P1140279 is an Olympus file).
PREFIX_CAMERA = {'P': 'Olympus', 'panasonic': 'Pan', 'sony': 'Sony', 'DSC': 'DSC', 'IMG': 'IMG', 'Canon': 'Canon'}
STEM_PATTERN = r'(P\d{7}|panasonic_\d+|sony_\d+|DSC_\d{4}|IMG_\d+|Canon_\d+)'


def y_channel(rgb: np.ndarray) -> np.ndarray:
    return rgb @ np.array([65.481, 128.553, 24.966]) / 255.0 + 16.0 / 255.0


def psnr(a: np.ndarray, b: np.ndarray, crop: int = 4) -> float:
    a, b = a[crop:-crop, crop:-crop], b[crop:-crop, crop:-crop]
    return float(10 * np.log10(1.0 / np.mean((a - b) ** 2)))


def test_layout_naming_and_sizes(demo):
    out, summary = demo
    assert sorted(p.name for p in out.iterdir()) == ['Test_x4', 'Train_x4', 'cameras.json']
    expected = {'train': 12, 'test': 10}
    stems_by_split = {}
    for split, (top, hr_name, lr_name) in SPLITS.items():
        assert sorted(p.name for p in (out / top).iterdir()) == sorted([hr_name, lr_name])
        hr_files = list((out / top / hr_name).iterdir())
        lr_files = list((out / top / lr_name).iterdir())
        assert all(p.is_file() for p in hr_files + lr_files), 'folders must be flat'
        patch = r'_\d+' if split == 'train' else ''
        assert all(re.fullmatch(STEM_PATTERN + '_x4' + patch + r'\.png', p.name) for p in hr_files), hr_name
        assert all(re.fullmatch(STEM_PATTERN + '_x1' + patch + r'\.png', p.name) for p in lr_files), lr_name
        hr_stems = {stem for stem, _, _ in pairs(out, split)}
        lr_stems = {p.name.replace('_x1', '', 1)[:-len('.png')] for p in lr_files}
        assert hr_stems == lr_stems, 'every HR needs its LR partner and vice versa'
        stems_by_split[split] = hr_stems
        per_camera = {}
        for stem in hr_stems:
            camera = PREFIX_CAMERA[re.match(r'^[A-Za-z]+', stem).group(0)]
            per_camera[camera] = per_camera.get(camera, 0) + 1
        assert per_camera == {cam: expected[split] for cam in mdd.DEFAULT_CAMERAS}
        assert summary['counts'][split] == per_camera
        for _, hr_path, lr_path in pairs(out, split):
            hr, lr = cv2.imread(str(hr_path)), cv2.imread(str(lr_path))
            side = 128 if split == 'train' else 192
            assert hr.shape == (side, side, 3)
            assert (lr.shape[0] * 4, lr.shape[1] * 4, lr.shape[2]) == hr.shape
    assert not stems_by_split['train'] & stems_by_split['test'], 'stems are unique across splits'
    assert set(mdd.DEFAULT_CAMERAS) == {'Olympus', 'Pan', 'Sony', 'DSC', 'IMG', 'Canon'}
    assert mdd.DEFAULT_OUT == REPO / 'datasets' / 'DRealSR_demo'


def test_manifest_documents_cameras_and_keeps_train_test_content_disjoint(demo):
    out, _ = demo
    manifest = json.loads((out / 'cameras.json').read_text())
    assert list(manifest['cameras']) == list(mdd.DEFAULT_CAMERAS)
    for name, params in manifest['cameras'].items():
        assert params['description'] and 1 <= params['jpeg_quality'] <= 100
        assert params['blur'] in ('gaussian', 'motion')
    train_src, test_src = set(manifest['source_photos']['train']), set(manifest['source_photos']['test'])
    assert train_src and test_src and not train_src & test_src
    rows = {(r['split'], r['stem']): r for r in manifest['pairs']}
    on_disk = {(split, stem) for split in SPLITS for stem, _, _ in pairs(out, split)}
    assert set(rows) == on_disk
    for (split, _), row in rows.items():
        assert row['source'] in (train_src if split == 'train' else test_src)
    # Train content also differs from test content pixel-wise (no identical HR anywhere).
    train_hr = {p.read_bytes() for _, p, _ in pairs(out, 'train')}
    assert not train_hr & {p.read_bytes() for _, p, _ in pairs(out, 'test')}


def test_same_seed_is_byte_identical_and_other_seed_differs(tmp_path, demo):
    a = mdd.make_demo_data(tmp_path / 'a', seed=3, **SMALL)
    b = mdd.make_demo_data(tmp_path / 'b', seed=3, **SMALL)
    c = mdd.make_demo_data(tmp_path / 'c', seed=4, **SMALL)
    files_a, files_b, files_c = (all_files(Path(s['out'])) for s in (a, b, c))
    assert len(files_a) == 2 * 2 * (3 + 2) + 1
    assert files_a == files_b
    assert files_a.keys() == files_c.keys()
    assert all(files_a[k] != files_c[k] for k in files_a if re.search(r'_x1(_\d+)?\.png$', k))
    # A camera's files do not depend on which other cameras are built alongside it.
    sony = all_files(Path(mdd.make_demo_data(tmp_path / 'sony', cameras=['Sony'])['out']))
    full = all_files(demo[0])
    assert all(sony[k] == full[k] for k in sony if k.endswith('.png'))


def test_cameras_are_one_family_with_a_real_shift(demo):
    """The cameras differ, yet they are one family: a model fitted on the source transfers partly.

    The "model" is a ridge regression from a 7x7 neighbourhood of the bicubic-upsampled LR (Y) to
    the HR pixel: a tiny linear SR network, trained per camera on its train split in a second.
    Shift: on every camera some other camera's filter is >= 0.3 dB worse than the camera's own.
    Family: the filter fitted on Olympus (the demo's source) beats bicubic on most targets and on
    their mean. (A linear filter cannot denoise: it does not beat bicubic on the noisy,
    oversharpened IMG camera, where the networks do; docs/results.md.)
    """
    out, _ = demo
    manifest = json.loads((out / 'cameras.json').read_text())
    assert manifest['family_ranges'] == {k: list(v) for k, v in mdd.FAMILY_RANGES.items()}
    for name, params in manifest['cameras'].items():     # every setting inside the shared ranges
        values = dict(params, wb_red=params['wb'][0], wb_blue=params['wb'][2])
        assert params['wb'][1] == 1.0 and params['blur'] == 'gaussian', name
        for key, (lo, hi) in mdd.FAMILY_RANGES.items():
            assert lo <= values[key] <= hi, (name, key, values[key])
    data = {}
    for split in SPLITS:
        for stem, hr_path, lr_path in pairs(out, split):
            camera = PREFIX_CAMERA[re.match(r'^[A-Za-z]+', stem).group(0)]
            hr, lr = read_rgb(hr_path), read_rgb(lr_path)
            up = cv2.resize(lr, hr.shape[1::-1], interpolation=cv2.INTER_CUBIC)
            data.setdefault((camera, split), []).append((y_channel(hr), y_channel(np.clip(up, 0, 1))))
    cameras = list(mdd.DEFAULT_CAMERAS)

    bicubic = {c: np.mean([psnr(up, hr) for hr, up in data[(c, 'test')]]) for c in cameras}
    assert max(bicubic.values()) - min(bicubic.values()) > 1.0, bicubic

    r = 3

    def features(up):
        padded = np.pad(up, r, mode='reflect')
        h, w = up.shape
        cols = [padded[i:i + h, j:j + w] for i in range(2 * r + 1) for j in range(2 * r + 1)]
        return np.stack(cols + [np.ones_like(up)], axis=-1)

    weights = {}
    for c in cameras:
        x = np.concatenate([features(up)[4:-4, 4:-4].reshape(-1, (2 * r + 1) ** 2 + 1)
                            for _, up in data[(c, 'train')]])
        t = np.concatenate([hr[4:-4, 4:-4].ravel() for hr, _ in data[(c, 'train')]])
        weights[c] = np.linalg.solve(x.T @ x + 1e-3 * np.eye(x.shape[1]), x.T @ t)
    gain = {(m, c): np.mean([psnr(np.clip(features(up) @ weights[m], 0, 1), hr)
                             for hr, up in data[(c, 'test')]]) - bicubic[c]
            for m in cameras for c in cameras}
    for c in cameras:
        worst = min(gain[(m, c)] for m in cameras if m != c)
        assert gain[(c, c)] > worst + 0.3, (c, gain[(c, c)], worst)
    targets = [c for c in cameras if c != 'Olympus']
    from_source = [gain[('Olympus', c)] for c in targets]
    assert sum(g > 0 for g in from_source) >= 3 and np.mean(from_source) > 0, dict(zip(targets, from_source))


def test_pretraining_pairs_each_draw_their_own_degradation(tmp_path):
    summary = mdd.make_demo_data(tmp_path / 'demo', cameras=['Mix'], pretrain_train_per_camera=6,
                                 test_per_camera=2)
    rows = [r for r in summary['pairs'] if r['camera'] == 'Mix']
    assert len(rows) == 8 and all('profile' in r for r in rows)
    draws = [tuple(r['profile'][k] for k in ('sigma_x', 'noise_b', 'jpeg_quality')) for r in rows]
    assert len(set(draws)) == len(draws)                 # no two pairs share a degradation
    for r in rows:
        values = dict(r['profile'], wb_red=r['profile']['wb'][0], wb_blue=r['profile']['wb'][2])
        for key, (lo, hi) in mdd.FAMILY_RANGES.items():
            assert lo - 1e-6 <= values[key] <= hi + 1e-6, (key, values[key])
    # The same pair index gets the same draw whatever else is built (seeded per pair).
    again = mdd.make_demo_data(tmp_path / 'again', cameras=['Sony', 'Mix'], pretrain_train_per_camera=3,
                               test_per_camera=2, train_per_camera=1)
    first = {(r['split'], r['stem']): r['profile'] for r in rows}
    assert all(first[(r['split'], r['stem'])] == r['profile'] for r in again['pairs'] if r['camera'] == 'Mix')


def test_a_camera_setting_outside_the_family_is_refused():
    with pytest.raises(ValueError, match=r'sigma_x = 3.5 is outside the family range \[1.2, 3.0\]'):
        mdd._family('too soft', 1.0, 1.0, 1.0, 1.0, 3.5, 1.5, 0.0, 0.0, 0.002, 0.5, 0.0, 90)


def test_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / 'demo'
    args = ['--out', str(out), '--cameras', 'Canon', '--train-per-camera', '1', '--test-per-camera', '1']
    assert mdd.main(args) == 0
    before = all_files(out)
    capsys.readouterr()
    assert mdd.main(args + ['--seed', '1']) == 2
    err = capsys.readouterr().err.strip()
    assert '\n' not in err and 'already exists' in err and '--force' in err
    assert all_files(out) == before
    with pytest.raises(FileExistsError):
        mdd.make_demo_data(out, cameras=['Canon'])
    assert mdd.main(args + ['--seed', '1', '--force']) == 0
    after = all_files(out)
    assert after.keys() == before.keys() and after != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ['demo'], 'no temp folders left behind'
    # --force replaces a demo dataset only: any other folder (datasets/DRealSR, '.') stays as it is.
    other = tmp_path / 'mine'
    (other / 'photos').mkdir(parents=True)
    assert mdd.main(['--out', str(other), '--force'] + args[2:]) == 2
    assert 'is no demo dataset (it has no cameras.json' in capsys.readouterr().err
    assert (other / 'photos').is_dir()
    for flags, message in ((['--seed', '-1'], '--seed must be an integer in [0, 2**32 - 1], got -1'),
                           (['--out', str(out / 'cameras.json' / 'sub')], 'cameras.json is a file, not a folder')):
        assert mdd.main(args + flags) == 2
        assert message in capsys.readouterr().err
    for flags, message in ((['--camras', 'Sony'], 'unrecognized arguments: --camras Sony'),
                           (['--seed', 'x'], "argument --seed: invalid int value: 'x'")):
        assert mdd.main(args + flags) == 2     # one line, not argparse's usage block
        assert capsys.readouterr().err == f'make_demo_data: error: {message} (make_demo_data.py -h lists the flags)\n'


@pytest.mark.parametrize('flag', ['--hr-size', '--test-hr-size'])
def test_size_not_divisible_by_four_is_a_clear_error(tmp_path, capsys, flag):
    out = tmp_path / 'demo'
    assert mdd.main(['--out', str(out), flag, '130']) == 2
    err = capsys.readouterr().err.strip()
    assert '\n' not in err and flag in err and 'multiple of 4' in err and '130' in err
    assert not out.exists()
    with pytest.raises(ValueError, match='multiple of 4'):
        mdd.make_demo_data(out, hr_size=126)


def test_bad_cameras_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match='unknown camera.*Nikon'):
        mdd.make_demo_data(tmp_path / 'x', cameras=['Nikon'])
    with pytest.raises(ValueError, match='twice'):
        mdd.make_demo_data(tmp_path / 'x', cameras=['Sony', 'Sony'])
    assert not (tmp_path / 'x').exists()


def test_failure_leaves_nothing_half_written(tmp_path, monkeypatch):
    calls = []

    def failing_write(path, rgb):
        calls.append(path)
        if len(calls) == 3:
            raise RuntimeError('disk full')
        mdd.cv2.imwrite(str(path), rgb)

    monkeypatch.setattr(mdd, 'write_png', failing_write)
    with pytest.raises(RuntimeError, match='disk full'):
        mdd.make_demo_data(tmp_path / 'demo', **SMALL)
    assert list(tmp_path.iterdir()) == []


def test_pretraining_camera_gets_its_own_train_count(tmp_path, capsys):
    summary = mdd.make_demo_data(tmp_path / 'demo', cameras=['Sony', 'Mix'], train_per_camera=2,
                                 pretrain_train_per_camera=3, test_per_camera=1)
    assert summary['counts'] == {'train': {'Sony': 2, 'Mix': 3}, 'test': {'Sony': 1, 'Mix': 1}}
    names = sorted(p.name for p in (tmp_path / 'demo' / 'Train_x4' / 'train_HR').iterdir())
    assert len(names) == 5 and [n.split('_')[0] for n in names] == ['Mix'] * 3 + ['sony'] * 2
    assert all(re.fullmatch(r'(Mix_\d{3}|sony_\d+)_x4_0\.png', n) for n in names)
    assert mdd.main(['--out', str(tmp_path / 'bad'), '--pretrain-train-per-camera', '0']) == 2
    err = capsys.readouterr().err
    assert '--pretrain-train-per-camera must be at least 1, got 0' in err and not (tmp_path / 'bad').exists()


def test_clean_pairs_are_the_photo_crop_and_its_area_resize(tmp_path):
    """The classic-SR pretraining camera: HR = the photograph's pixels at the recorded box (no camera
    look), LR = each 4x4 block's mean (the x4 area resize), no blur, noise, sharpening or JPEG."""
    summary = mdd.make_demo_data(tmp_path / 'demo', cameras=['Clean'], pretrain_train_per_camera=3,
                                 test_per_camera=2)
    assert summary['counts'] == {'train': {'Clean': 3}, 'test': {'Clean': 2}}
    rows = [r for r in summary['pairs'] if r['camera'] == 'Clean']
    assert len(rows) == 5 and all('profile' not in r for r in rows)
    data_dir = mdd.skimage_data_dir()
    for row in rows:
        top, hr_folder, lr_folder = SPLITS[row['split']]
        hr = cv2.imread(str(tmp_path / 'demo' / top / hr_folder / row['hr']))[..., ::-1]
        lr = cv2.imread(str(tmp_path / 'demo' / top / lr_folder / row['lr']))[..., ::-1]
        assert re.fullmatch(r'Clean_\d{3}_x4(_\d+)?\.png', row['hr'])
        y, x, h, w = row['hr_box_yxhw']
        photo = mdd.load_photo(data_dir / row['source'])
        assert np.array_equal(hr, photo[y:y + h, x:x + w])
        blocks = hr.astype(np.float64).reshape(h // 4, 4, w // 4, 4, 3).mean(axis=(1, 3))
        assert np.abs(lr.astype(np.float64) - blocks).max() <= 0.5 + 1e-6, row['lr']   # rounding only
