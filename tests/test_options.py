"""Every shipped option file is valid: registered types, known dataset keys, a valid ldt: section."""
from pathlib import Path

import pytest
import yaml

from basicsr.utils.registry import ARCH_REGISTRY, MODEL_REGISTRY

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.options import check_known_keys
from basicsr_ldt.data.drealsr_dataset import _BASICSR_KEYS, _OWN_KEYS
from basicsr_ldt.models.corgrad_model import corgrad_config_from_options
from basicsr_ldt.models.ldt_model import ldt_config_from_options

# Study files (options/study/) are checked by their own --dry-run tests in test_study.py.
OPTIONS = sorted(p for p in (Path(__file__).resolve().parents[1] / 'options').rglob('*.yml') if p.parent.name != 'study')


@pytest.mark.parametrize('path', OPTIONS, ids=[p.name for p in OPTIONS])
def test_option_file_is_valid(path):
    opt = yaml.safe_load(path.read_text())
    assert opt['network_g']['type'] in ARCH_REGISTRY
    for section in opt['datasets'].values():
        assert section['type'] == 'DRealSRCameraDataset'
        check_known_keys(path.name, section, _BASICSR_KEYS + _OWN_KEYS)
    if path.name.startswith('train'):
        assert opt['model_type'] in MODEL_REGISTRY
        assert set(opt['datasets']) - {'train'} and all(k == 'train' or k.startswith('val') for k in opt['datasets'])
    if opt.get('model_type') == 'LDTSRModel':
        corgrad = (opt.get('ldt') or {}).get('method') == 'corgrad'
        (corgrad_config_from_options if corgrad else ldt_config_from_options)(opt)


def test_ldt_section_errors_are_one_line():
    base = {'train': {'total_iter': 100}}
    with pytest.raises(InputError, match="unknown LDT option 'ratio'; did you mean 'ratio_u'"):
        ldt_config_from_options({**base, 'ldt': {'ratio': 0.5}})
    with pytest.raises(InputError, match=r"^ldt\.ratio_u: expected a number in \(0, 1\), got 1\.0$"):
        ldt_config_from_options({**base, 'ldt': {'ratio_u': 1.0}})
    with pytest.raises(InputError, match=r'head_warmup_iters \(50\) \+ profile_iters \(60\) must be smaller'):
        ldt_config_from_options({**base, 'ldt': {'head_warmup_iters': 50, 'profile_iters': 60}})
    with pytest.raises(InputError, match="ldt.method: expected one of 'ft', .*'corgrad', got 'dft'.*did you mean 'deft'"):
        ldt_config_from_options({**base, 'ldt': {'method': 'dft'}})
