"""scripts/prepare_drealsr.py: camera report, per-camera copy, aligned sub-images, lmdb the dataset reads."""
import numpy as np
import pytest

from basicsr_ldt.data.drealsr_dataset import DRealSRCameraDataset
from conftest import load_script


@pytest.fixture(scope='module')
def prepare():
    return load_script('prepare_drealsr')


def test_report_counts_cameras(prepare, demo_data, capsys):
    assert prepare.main([str(demo_data)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ['camera', 'Train_x4', 'Test_x4']
    assert lines[1].split() == ['Canon', '6', '2'] and lines[4].split() == ['total', '18', '6']
    assert "Train_x4: flat, naming DRealSR's (HR _x4, LR _x1) patches _<k>" in lines


def test_by_camera_copy_is_read_with_folder_rule(prepare, demo_data, tmp_path):
    out = tmp_path / 'by_camera'
    assert prepare.main([str(demo_data), '--by-camera', str(out)]) == 0
    assert len(list((out / 'Train_x4' / 'train_HR' / 'Sony').glob('sony_*_x4_*.png'))) == 6
    dataset = DRealSRCameraDataset({'name': 'x', 'phase': 'val', 'scale': 4, 'cameras': ['Sony'],
                                    'camera_rule': {'source': 'folder'},
                                    'dataroot_gt': str(out / 'Test_x4' / 'test_HR'),
                                    'dataroot_lq': str(out / 'Test_x4' / 'test_LR')})
    assert dataset.cameras == {'Sony': 2}


def test_subimages_and_lmdb(prepare, demo_data, tmp_path, capsys):
    import shutil
    root = tmp_path / 'd'
    shutil.copytree(demo_data / 'Train_x4', root / 'Train_x4')
    assert prepare.main([str(root), '--crop', '32', '--step', '32', '--lmdb']) == 0
    hr, lr = root / 'Train_x4' / 'train_HR_sub', root / 'Train_x4' / 'train_LR_sub'
    assert len(list(hr.glob('*.png'))) == 18 * 4 and (hr.parent / 'train_HR_sub.lmdb' / 'meta_info.txt').is_file()
    opts = {'name': 'x', 'phase': 'val', 'scale': 4, 'cameras': ['Canon'], 'io_backend': {'type': 'lmdb'},
            'dataroot_gt': str(hr) + '.lmdb', 'dataroot_lq': str(lr) + '.lmdb'}
    lmdb = DRealSRCameraDataset(opts)
    disk = DRealSRCameraDataset(dict(opts, io_backend={'type': 'disk'}, dataroot_gt=str(hr), dataroot_lq=str(lr)))
    assert len(lmdb) == len(disk) == 24
    assert np.array_equal(lmdb[3]['gt'].numpy(), disk[3]['gt'].numpy()) and lmdb[3]['gt'].shape[-1] == 32


@pytest.mark.parametrize('flags, message', [
    (['--crop', '30', '--step', '16'], '--crop 30 and --step 16 must be multiples of --scale 4'),
    (['--crop', '36'], '--crop 36 and the default --step (crop / 2 = 18) must be multiples of --scale 4'),
    (['--crop', '32', '--scale', '0'],
     "argument --scale: expected an integer >= 1, got '0' (python scripts/prepare_drealsr.py -h lists the flags)"),
    (['--crop', '-8'],
     "argument --crop: expected an integer >= 1, got '-8' (python scripts/prepare_drealsr.py -h lists the flags)"),
    (['--crop', '32', '--step', '0'],
     "argument --step: expected an integer >= 1, got '0' (python scripts/prepare_drealsr.py -h lists the flags)"),
    (['--step', '16', '--by-camera', '{out}'], '--step 16: it is the step between --crop sub-images; give --crop SIZE too'),
])
def test_bad_crop_flags_are_one_line_before_anything_is_written(prepare, demo_data, tmp_path, capsys, flags, message):
    """A step the user never gave was named as theirs, 0 was taken as the default, a scale of 0 divided
    by zero, and a step without a crop did nothing; each is now refused before the per-camera copy."""
    out = tmp_path / 'by_camera'
    assert prepare.main([str(demo_data)] + [f.format(out=out) for f in flags]) == 2
    assert capsys.readouterr().err == f'error: {message}\n'
    assert not out.exists() and not (demo_data / 'Train_x4' / 'train_HR_sub').exists()


def test_the_check_of_a_download_reads_every_images_header(prepare, demo_data, tmp_path, capsys):
    """The README's "check what your copy holds" step passed a text file saved as an HR image, an LR image
    of the wrong size and --scale 2 on x4 data; each is named now, as a run would name it, before any run."""
    import shutil
    root = tmp_path / 'd'
    shutil.copytree(demo_data, root)
    assert prepare.main([str(root), '--scale', '2']) == 2
    assert capsys.readouterr().err.startswith("error: size mismatch for 'Canon_0_0' in dataset 'Train_x4': LR "
                                              '16x16 times scale 2 is 32x32, HR is 64x64')
    hr = sorted((root / 'Test_x4' / 'test_HR').iterdir())[0]
    hr.write_text('not an image')
    assert prepare.main([str(root)]) == 2
    assert capsys.readouterr().err == (f"error: image '{hr}' of dataset 'Test_x4' is corrupt or not an image "
                                       '(UnidentifiedImageError)\n')
