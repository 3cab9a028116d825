"""The DRealSR loader against the published dataset's real file names, not names we made up.

``tests/data/drealsr_x4_names.txt`` holds the release's 93 test names and 360 of its training patch
names (source and commit in its header). They are written here as tiny images in the two layouts a
user meets: flat as published (``Train_x4/train_HR``) and per camera folder as the official LDT code
keeps them (``Train/HR/P``). The project's own option files then load every camera they select,
with the release's exact counts.
"""
import glob
import re
import shutil
from pathlib import Path
from typing import Dict, List

import cv2
import numpy as np
import pytest
import yaml

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.data.drealsr_dataset import DRealSRCameraDataset

from conftest import load_script, run_entry

REPO = Path(__file__).resolve().parent.parent
NAMES = Path(__file__).parent / 'data' / 'drealsr_x4_names.txt'
#: The release's test pairs per camera (paper branch names); P-files are Olympus.
TEST_COUNTS = {'Olympus': 19, 'Pan': 20, 'Sony': 17, 'DSC': 20, 'IMG': 12, 'Canon': 5}
#: The fixture's training patches per camera (the first 60 of each prefix in the public list).
TRAIN_COUNTS = {camera: 60 for camera in TEST_COUNTS}
#: The official LDT code's per-camera folder names.
OFFICIAL_FOLDERS = {'Olympus': 'P', 'Pan': 'panasonic', 'Sony': 'sony', 'DSC': 'DSC', 'IMG': 'IMG',
                    'Canon': 'Canon'}
PREFIX_CAMERA = {'P': 'Olympus', 'panasonic': 'Pan', 'sony': 'Sony', 'DSC': 'DSC', 'IMG': 'IMG', 'Canon': 'Canon'}


def real_names() -> Dict[str, List[str]]:
    sections: Dict[str, List[str]] = {}
    current = None
    for line in NAMES.read_text().splitlines():
        if line.startswith('#') or not line.strip():
            continue
        if line.startswith('['):
            current = sections.setdefault(line.strip('[]'), [])
        else:
            current.append(line.strip())
    return sections


def lr_name(hr_name: str) -> str:
    """The release's LR partner: the zoom token _x4 becomes _x1 (patch index kept)."""
    return re.sub(r'_x4(_\d+)?\.png$', lambda m: f"_x1{m.group(1) or ''}.png", hr_name)


def png(side: int) -> bytes:
    ok, data = cv2.imencode('.png', np.full((side, side, 3), 128, np.uint8))
    assert ok
    return data.tobytes()


HR_BYTES, LR_BYTES = png(192), png(48)   # the release's patch size: the option files' gt_size 192 fits


def write_pairs(hr_dir: Path, lr_dir: Path, hr_names: List[str], folder_of=None) -> None:
    for name in hr_names:
        sub = folder_of(name) if folder_of else ''
        for folder, file_name, data in ((hr_dir, name, HR_BYTES), (lr_dir, lr_name(name), LR_BYTES)):
            (folder / sub).mkdir(parents=True, exist_ok=True)
            (folder / sub / file_name).write_bytes(data)


def camera_of_name(name: str) -> str:
    return PREFIX_CAMERA[re.match(r'^[A-Za-z]+', name).group(0)]


@pytest.fixture(scope='module')
def flat_release(tmp_path_factory) -> Path:
    """The published layout: DRealSR/Train_x4/train_HR ... with the real names."""
    root = tmp_path_factory.mktemp('release') / 'DRealSR'
    names = real_names()
    write_pairs(root / 'Train_x4' / 'train_HR', root / 'Train_x4' / 'train_LR', names['train_HR'])
    write_pairs(root / 'Test_x4' / 'test_HR', root / 'Test_x4' / 'test_LR', names['test_HR'])
    return root


@pytest.fixture(scope='module')
def official_layout(tmp_path_factory) -> Path:
    """The official LDT code's layout: Train/HR/P/..., Test/LR/panasonic/..."""
    root = tmp_path_factory.mktemp('official') / 'SODA_DRealSR'
    names = real_names()
    folder = lambda name: OFFICIAL_FOLDERS[camera_of_name(name)]  # noqa: E731
    write_pairs(root / 'Train' / 'HR', root / 'Train' / 'LR', names['train_HR'], folder)
    write_pairs(root / 'Test' / 'HR', root / 'Test' / 'LR', names['test_HR'], folder)
    return root


def shipped_sections():
    """Every DRealSR dataset section of the project's option files: (file, key, section)."""
    for path in sorted(glob.glob(str(REPO / 'options' / '*.yml'))):
        opt = yaml.safe_load(Path(path).read_text())
        for key, section in (opt.get('datasets') or {}).items():
            if section.get('type') == 'DRealSRCameraDataset':
                yield Path(path).name, key, section


def build(section: dict, key: str, **replace) -> DRealSRCameraDataset:
    opt = dict(section, scale=4, phase='train' if key == 'train' else 'val', **replace)
    return DRealSRCameraDataset(opt)


def test_fixture_holds_the_release_counts():
    names = real_names()
    assert len(names['test_HR']) == 93 and len(names['train_HR']) == 360
    counts = {camera: 0 for camera in TEST_COUNTS}
    for name in names['test_HR']:
        counts[camera_of_name(name)] += 1
    assert counts == TEST_COUNTS


def test_every_shipped_camera_selection_loads_the_release(flat_release):
    """The shipped option files, only the data root changed, load the real names with exact counts."""
    sections = list(shipped_sections())
    assert len(sections) >= 18
    for file_name, key, section in sections:
        roots = {k: section[k].replace('datasets/DRealSR', str(flat_release)) for k in ('dataroot_gt', 'dataroot_lq')}
        dataset = build(section, key, **roots)
        counts = TRAIN_COUNTS if key == 'train' else TEST_COUNTS
        expected = {camera: counts[camera] for camera in section['cameras']}
        assert dataset.cameras == expected, (file_name, key)


def test_olympus_is_the_p_files_and_pairs_follow_the_zoom_tokens(flat_release):
    test = build({'name': 't', 'dataroot_gt': str(flat_release / 'Test_x4' / 'test_HR'),
                  'dataroot_lq': str(flat_release / 'Test_x4' / 'test_LR'), 'cameras': ['Olympus']}, 'val')
    assert len(test) == 19
    for item in test.items:
        assert re.fullmatch(r'P\d{7}', item['stem'])
        assert item['gt_path'].endswith(f"test_HR/{item['stem']}_x4.png")
        assert item['lq_path'].endswith(f"test_LR/{item['stem']}_x1.png")
    train = build({'name': 't', 'dataroot_gt': str(flat_release / 'Train_x4' / 'train_HR'),
                   'dataroot_lq': str(flat_release / 'Train_x4' / 'train_LR'), 'cameras': ['Pan'],
                   'gt_size': 192}, 'train')
    assert len(train) == 60
    item = next(i for i in train.items if i['gt_path'].endswith('panasonic_141_x4_28.png'))
    assert item['lq_path'].endswith('train_LR/panasonic_141_x1_28.png') and item['camera'] == 'Pan'


def test_official_per_camera_folders(official_layout):
    for key, split, counts in (('train', 'Train', TRAIN_COUNTS), ('val', 'Test', TEST_COUNTS)):
        for camera, count in counts.items():
            dataset = build({'name': camera, 'dataroot_gt': str(official_layout / split / 'HR'),
                             'dataroot_lq': str(official_layout / split / 'LR'), 'cameras': [camera],
                             'gt_size': 192}, key)
            assert len(dataset) == count, (split, camera)
            assert all(f'/{OFFICIAL_FOLDERS[camera]}/' in item['gt_path'] for item in dataset.items)


def test_the_earlier_project_naming_still_loads(tmp_path):
    """HR _x1 / LR _x4, as this project's README once told users to name their data."""
    hr, lr = tmp_path / 'HR', tmp_path / 'LR'
    hr.mkdir()
    lr.mkdir()
    for stem in ('P1140279', 'sony_116', 'DSC_1265'):
        (hr / f'{stem}_x1.png').write_bytes(HR_BYTES)
        (lr / f'{stem}_x4.png').write_bytes(LR_BYTES)
    dataset = build({'name': 'old', 'dataroot_gt': str(hr), 'dataroot_lq': str(lr)}, 'val')
    assert dataset.cameras == {'DSC': 1, 'Olympus': 1, 'Sony': 1}
    assert sorted(i['stem'] for i in dataset.items) == ['DSC_1265', 'P1140279', 'sony_116']


def one_line_error(section: dict) -> str:
    with pytest.raises(InputError) as err:
        build(section, 'val')
    message = str(err.value)
    assert '\n' not in message
    return message


def copy_test_split(flat_release: Path, tmp_path: Path) -> Path:
    root = tmp_path / 'copy'
    shutil.copytree(flat_release / 'Test_x4', root)
    return root


def section_for(root: Path, **extra) -> dict:
    return dict({'name': 'targets', 'dataroot_gt': str(root / 'test_HR'), 'dataroot_lq': str(root / 'test_LR')},
                **extra)


def test_unknown_prefix_lists_prefixes_with_counts_and_cameras(flat_release, tmp_path):
    root = copy_test_split(flat_release, tmp_path)
    (root / 'test_HR' / 'Nikon1_3_x4.png').write_bytes(HR_BYTES)  # 'Nikon' is an alias; 'Nikonx' would not be
    (root / 'test_HR' / 'huawei_3_x4.png').write_bytes(HR_BYTES)
    (root / 'test_LR' / 'huawei_3_x1.png').write_bytes(LR_BYTES)
    (root / 'test_LR' / 'Nikon1_3_x1.png').write_bytes(LR_BYTES)
    message = one_line_error(section_for(root, cameras=['Sony']))
    assert "unknown camera prefix(es) 'huawei'" in message and "e.g. 'huawei_3'" in message
    assert 'P (19 -> Olympus)' in message and 'panasonic (20 -> Pan)' in message and 'huawei (1 -> ?)' in message
    assert 'Nikon (1 -> DSC)' in message and 'camera_rule.aliases' in message
    # Named by an alias, the same folder loads.
    dataset = build(section_for(root, cameras=['Huawei'], camera_rule={'aliases': {'huawei': 'Huawei'}}), 'val')
    assert dataset.cameras == {'Huawei': 1}


def test_an_alias_that_names_nothing_found_is_warned_about(flat_release, tmp_path):
    """A misspelt alias in a folder layout: its images would carry the unaliased name unnoticed."""
    from conftest import basicsr_log
    root = copy_test_split(flat_release, tmp_path)
    with basicsr_log() as lines:
        build(section_for(root, cameras=['Sony'], camera_rule={'aliases': {'sony': 'Sony'}}), 'val')
        assert not lines
        build(section_for(root, cameras=['Sony'], camera_rule={'aliases': {'sonny': 'Sony', 'panasonic': 'Pan',
                                                                          'nikon1': 'DSC'}}), 'val')
    assert lines == [
        f"camera_rule.aliases 'sonny', 'nikon1' name(s) no camera folder or file prefix in dataset 'targets' "
        f"({root / 'test_HR'} | {root / 'test_LR'}) (found: Canon, DSC, IMG, P, panasonic, sony); check the spelling"]


def test_two_files_for_one_pair_is_named(flat_release, tmp_path):
    """Both zooms in the HR folder (a user who merged test_LR into test_HR): which one is HR?"""
    root = copy_test_split(flat_release, tmp_path)
    (root / 'test_HR' / 'Canon_10_x1.png').write_bytes(LR_BYTES)
    message = one_line_error(section_for(root))
    assert "two HR images for one pair 'Canon_10'" in message
    assert "'Canon_10_x1.png'" in message and "'Canon_10_x4.png'" in message


def test_unpaired_names_say_how_pairs_are_matched(flat_release, tmp_path):
    root = copy_test_split(flat_release, tmp_path)
    (root / 'test_LR' / 'sony_116_x1.png').rename(root / 'test_LR' / 'sony_116_LR.png')
    message = one_line_error(section_for(root))
    assert "1 HR image(s) without an LR partner, e.g. 'sony_116_x4.png'" in message
    assert "1 LR image(s) without an HR partner, e.g. 'sony_116_LR.png'" in message
    assert 'stem and patch index' in message


def test_a_camera_the_data_lacks_lists_the_cameras_found(flat_release):
    message = one_line_error(section_for(flat_release / 'Test_x4', cameras=['Panasonic']))
    assert "unknown camera(s) 'Panasonic'" in message
    assert 'Canon (5), DSC (20), IMG (12), Olympus (19), Pan (20), Sony (17)' in message


def test_a_file_in_another_cameras_folder_is_named(official_layout, tmp_path):
    root = tmp_path / 'Test'
    shutil.copytree(official_layout / 'Test', root)
    shutil.move(str(root / 'HR' / 'sony' / 'sony_116_x4.png'), str(root / 'HR' / 'P' / 'sony_116_x4.png'))
    shutil.move(str(root / 'LR' / 'sony' / 'sony_116_x1.png'), str(root / 'LR' / 'P' / 'sony_116_x1.png'))
    message = one_line_error({'name': 'o', 'dataroot_gt': str(root / 'HR'), 'dataroot_lq': str(root / 'LR')})
    assert "'P/sony_116' in" in message and "camera folder 'P' (Olympus) but its name says Sony" in message


def test_prepare_reports_the_release(flat_release, official_layout, capsys):
    prepare = load_script('prepare_drealsr')
    assert prepare.main([str(flat_release)]) == 0
    out = capsys.readouterr().out
    for camera, count in TEST_COUNTS.items():
        assert re.search(rf'^{camera}\s+60\s+{count}$', out, re.M), camera
    assert re.search(r'^total\s+360\s+93$', out, re.M)
    assert "Train_x4: flat, naming DRealSR's (HR _x4, LR _x1) patches _<k>" in out
    assert "Test_x4: flat, naming DRealSR's (HR _x4, LR _x1)" in out
    assert 'patches already' in out and '--crop SIZE' not in out
    assert prepare.main([str(official_layout)]) == 0
    out = capsys.readouterr().out
    assert 'Test: per-camera folders (Canon, DSC, IMG, P, panasonic, sony)' in out
    assert re.search(r'^Olympus\s+60\s+19$', out, re.M)


def test_train_pip_stops_before_training_on_an_unknown_prefix(project, flat_release, tmp_path):
    """One line naming the file, and no experiment folder left behind."""
    root = tmp_path / 'data'
    shutil.copytree(flat_release, root)
    (root / 'Train_x4' / 'train_HR' / 'vivo_1_x4_0.png').write_bytes(HR_BYTES)
    (root / 'Train_x4' / 'train_LR' / 'vivo_1_x1_0.png').write_bytes(LR_BYTES)
    opt = yaml.safe_load((REPO / 'options' / 'train_safmn_ft.yml').read_text())
    for section in opt['datasets'].values():
        for key in ('dataroot_gt', 'dataroot_lq'):
            section[key] = section[key].replace('datasets/DRealSR', str(root))
    opt['path']['pretrain_network_g'] = None
    (project / 'bad.yml').write_text(yaml.safe_dump(opt))
    result = run_entry(project, 'Train_pip.py', '-opt', 'bad.yml', check=False)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "unknown camera prefix(es) 'vivo'" in last and "'vivo_1_0'" in last
    assert not (project / 'experiments').exists() or not any((project / 'experiments').iterdir())


def test_a_camera_named_by_its_own_prefix_in_another_folder_is_named(tmp_path):
    """DSC/IMG/Canon files need no alias (their prefix is the camera's name); a DSC file in the
    Olympus folder P, after a correctly placed flat file (IMG_140 sorts first), still stops the run.
    Mutation testing (issue #31): kills two ``cameras.py`` survivors, ``aliases.get(named, None)`` (a
    DSC/IMG/Canon file in another camera's folder unnoticed) and ``continue`` -> ``break`` (a flat file
    sorting first switched the folder check off)."""
    hr, lr = tmp_path / 'HR', tmp_path / 'LR'
    for folder, data, zoom in ((hr, HR_BYTES, '_x4'), (lr, LR_BYTES, '_x1')):
        (folder / 'P').mkdir(parents=True)
        (folder / f'IMG_140{zoom}.png').write_bytes(data)
        (folder / 'P' / f'DSC_1265{zoom}.png').write_bytes(data)
    message = one_line_error({'name': 'mixed', 'dataroot_gt': str(hr), 'dataroot_lq': str(lr)})
    assert "'P/DSC_1265' in" in message and "camera folder 'P' (Olympus) but its name says DSC" in message
