"""Typed option checks: a wrong type or range names the full key path, the value and what was expected."""
import pytest
import torch
import yaml

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.options import validate_dataset_options
from basicsr_ldt.data.drealsr_dataset import DRealSRCameraDataset
from basicsr_ldt.ldt import LDTConfig
from basicsr_ldt.models.ldt_model import ldt_config_from_options
from basicsr_ldt.pipelines.evaluate import _build


@pytest.mark.parametrize('ldt, message', [
    ({'ratio_u': 'forty percent'}, "ldt.ratio_u: expected a number in (0, 1), got 'forty percent'"),
    ({'dpu': 'yes'}, "ldt.dpu: expected true or false, got 'yes'"),
    ({'ema_every': 0}, 'ldt.ema_every: expected an integer >= 1, got 0'),
    ({'profile_iters': 10.5}, 'ldt.profile_iters: expected an integer >= 0, got 10.5'),
    ({'head_patterns': 3}, 'ldt.head_patterns: expected a string or a list of strings, got 3'),
    ({'criterion': 'variance'}, "ldt.criterion: expected one of 'var', 'mean', 'var_over_mean', 'random', 'sample_var', 'fisher', got 'variance'"),
    ({'method': 3}, "ldt.method: expected one of 'ft', 'lp_ft', 'deft', 'ldt'"),
    ({'w_base_stable': 0.995, 'r_base_stable': 0.01}, 'ldt.r_base_stable: expected w_base_stable + r_base_stable <= 1'),
])
def test_ldt_section(ldt, message):
    with pytest.raises(InputError) as err:
        ldt_config_from_options({'train': {'total_iter': 1000}, 'ldt': ldt})
    assert str(err.value).startswith(message)


def test_yaml_exponent_without_dot_is_explained():
    options = yaml.safe_load('w_fixed: 9e-1')
    with pytest.raises(ValueError, match=r"^ldt\.w_fixed: expected a number in \[0, 1\), got '9e-1' \(text: YAML"):
        LDTConfig.from_dict(options)


@pytest.mark.parametrize('change, message', [
    ({'gt_size': '64'}, "datasets.train.gt_size: expected an integer >= 1, got '64'"),
    ({'cameras': 5}, 'datasets.train.cameras: expected a string or a list of strings, got 5'),
    ({'use_rot': 'no'}, "datasets.train.use_rot: expected true or false, got 'no'"),
    ({'subset': {'parts': 0}}, 'datasets.train.subset.parts: expected an integer >= 1, got 0'),
    ({'camera_rule': {'source': 'exif'}}, "datasets.train.camera_rule.source: expected one of 'auto', 'folder', "
                                          "'filename', got 'exif'"),
    ({'camera_rule': {'aliases': {'P': 3}}}, 'datasets.train.camera_rule.aliases: expected a mapping of names to '
                                             'a non-empty string'),
    ({'io_backend': {'type': 'zip'}}, "datasets.train.io_backend.type: expected one of 'disk', 'lmdb', got 'zip'"),
])
def test_dataset_section(change, message):
    section = {'name': 'x', 'type': 'DRealSRCameraDataset', 'dataroot_gt': 'a', 'dataroot_lq': 'b', **change}
    with pytest.raises(InputError) as err:
        validate_dataset_options(DRealSRCameraDataset, 'train', section)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize('change, message', [
    ({'test': {'tile_size': -1}}, 'test.tile_size: expected an integer >= 0, got -1'),
    ({'test': {'tile_size': 8, 'tile_overlap': 8}}, 'test.tile_overlap: expected an integer in [0, tile_size=8), got 8'),
    ({'test': {'save_img': 'true'}}, "test.save_img: expected true or false, got 'true'"),
    ({'test': {'compare': {'crops': 'two'}}}, "test.compare.crops: expected an integer in [0, 8], got 'two'"),
    ({'test': {'compare': {'methods': ['a.pth']}}}, "test.compare.methods: expected a mapping of names to"),
    ({'test': {'compare': {'crop': 2}}}, "unknown option 'crop' in test.compare (did you mean 'crops'?)"),
    ({'checkpoints': [{'label': 7, 'path': 'x.pth'}], 'path': {}}, 'checkpoints[0].label: expected a non-empty string, got 7'),
])
def test_test_section(change, message, demo_data):
    opt = {'scale': 4, 'network_g': {'type': 'SAFMN', 'dim': 8}, 'path': {'pretrain_network_g': 'x.pth'},
           'datasets': {'test_1': {'name': 't', 'type': 'DRealSRCameraDataset', 'cameras': ['Sony'],
                                   'dataroot_gt': str(demo_data / 'Test_x4' / 'test_HR'),
                                   'dataroot_lq': str(demo_data / 'Test_x4' / 'test_LR')}}, **change}
    with pytest.raises(InputError) as err:
        _build(opt, torch.device('cpu'))
    assert str(err.value).startswith(message)
