"""What every model adds to BasicSR's loading and saving (models/resumable.py), seen from the options a
user sets: ``path.strict_load_g`` and an EMA copy (``train.ema_decay``) whose weights went bad."""
import os

import pytest
import torch

from basicsr.archs import build_network
from basicsr.models import build_model

from basicsr_ldt.common.errors import InputError
from conftest import basicsr_log
from test_cli import NETWORK, train_options


def _model(tmp_path, **path):
    """An FTSRModel with an EMA copy, built in-process (no dataset is read: their folders need not exist)."""
    opt = train_options(tmp_path / 'no_data', 'weights', path={'strict_load_g': True, **path})
    opt['train']['ema_decay'] = 0.999
    opt['path'].update(models=str(tmp_path / 'models'), training_states=str(tmp_path / 'states'))
    opt.update(is_train=True, dist=False, rank=0, world_size=1)
    return build_model(opt)


def test_strict_load_g_decides_whether_other_keys_are_refused(tmp_path):
    torch.manual_seed(0)
    state = dict(build_network(dict(NETWORK)).state_dict(), extra_head=torch.zeros(2))
    torch.save({'params': state}, tmp_path / 'extra.pth')
    with pytest.raises(InputError, match=r"does not fit network MSRResNet: keys 1 unexpected \(e\.g\. extra_head\)"):
        _model(tmp_path, pretrain_network_g=str(tmp_path / 'extra.pth'))
    model = _model(tmp_path, pretrain_network_g=str(tmp_path / 'extra.pth'), strict_load_g=False)
    assert all(torch.equal(v, state[k]) for k, v in model.net_g.state_dict().items())
    del state['conv_last.bias']
    torch.save({'params': state}, tmp_path / 'part.pth')
    with basicsr_log() as lines:   # the log said 'Loaded' of a start that was partly random
        _model(tmp_path, pretrain_network_g=str(tmp_path / 'part.pth'), strict_load_g=False)
    assert any(line.endswith('[params]; 1 of its 14 tensors are not in the file and keep their initial values (e.g. '
                             'conv_last.bias); 1 tensors of the file are not in the network and were not loaded (e.g. '
                             'extra_head)') for line in lines), lines       # and one the file has was dropped


def test_the_log_names_the_weights_loaded_when_the_key_asked_for_falls_back(tmp_path):
    """``param_key_g: param`` (a typo) fell back to 'params' with a warning, and the next line said
    'Loaded ... [param]'; a bare state dict has no key at all."""
    torch.manual_seed(0)
    state = build_network(dict(NETWORK)).state_dict()
    torch.save({'params': state}, tmp_path / 'start.pth')
    torch.save(state, tmp_path / 'bare.pth')
    with basicsr_log() as lines:
        _model(tmp_path, pretrain_network_g=str(tmp_path / 'start.pth'), param_key_g='param')
    loaded = [line for line in lines if 'Loaded MSRResNet from' in line]
    assert loaded and loaded[0].endswith(f"from {tmp_path / 'start.pth'} [params]"), lines
    with basicsr_log() as lines:                 # the key asked for and found (the EMA copy falls back to it)
        _model(tmp_path, pretrain_network_g=str(tmp_path / 'start.pth'))
    loaded = [line for line in lines if 'Loaded MSRResNet from' in line]
    assert len(loaded) == 2 and all(line.endswith(f"from {tmp_path / 'start.pth'} [params]") for line in loaded), lines
    with basicsr_log() as lines:
        _model(tmp_path, pretrain_network_g=str(tmp_path / 'bare.pth'))
    assert any(line.endswith(f"from {tmp_path / 'bare.pth'} [a bare state dict]") for line in lines), lines


def test_nan_in_the_ema_copy_is_not_saved(tmp_path):
    """``net_g_<iter>.pth`` holds the EMA copy as ``params_ema`` beside ``params``; NaN in the EMA copy
    stops the save like NaN in net_g (neither weights nor training state written)."""
    model = _model(tmp_path)
    model.save(0, 2)
    assert sorted(os.listdir(tmp_path / 'models')) == ['net_g_2.pth'] and os.listdir(tmp_path / 'states') == ['2.state']
    saved = torch.load(tmp_path / 'models' / 'net_g_2.pth', weights_only=True)
    assert set(saved) == {'params', 'params_ema'}
    assert all(torch.equal(v, saved['params_ema'][k]) for k, v in model.net_g_ema.state_dict().items())
    with torch.no_grad():
        next(model.net_g_ema.parameters()).view(-1)[0] = float('nan')
    with pytest.raises(FloatingPointError, match='1 weight tensors hold NaN/inf at iteration 4: not saving'):
        model.save(0, 4)
    with torch.no_grad():
        next(model.net_g.parameters()).view(-1)[0] = float('inf')
    with pytest.raises(FloatingPointError, match='2 weight tensors hold NaN/inf at iteration 6: not saving'):
        model.save(0, 6)
    assert os.listdir(tmp_path / 'models') == ['net_g_2.pth'] and os.listdir(tmp_path / 'states') == ['2.state']


def test_a_training_state_records_what_it_fixes_and_leaves_execution_choices_out():
    """What ``--auto_resume`` compares (``RESUME_FIXED``): the optimizer without fused/foreach (an execution
    choice), the schedule, seed and crops; an absent key as None; copies, so BasicSR's later pops of
    ``optim_g.type`` and ``scheduler.type`` from the live options do not change the record."""
    from basicsr_ldt.models.resumable import RESUME_FIXED, resume_fixed
    opt = {'scale': 4, 'manual_seed': 3,
           'train': {'optim_g': {'type': 'Adam', 'lr': 1e-3, 'fused': True, 'foreach': False},
                     'scheduler': {'type': 'MultiStepLR', 'milestones': [2], 'gamma': 0.5}, 'pixel_opt': {}},
           'datasets': {'train': {'gt_size': 32, 'batch_size_per_gpu': 2, 'cameras': ['Olympus']}}}
    record = resume_fixed(opt)
    assert list(record) == list(RESUME_FIXED)
    assert record['train.optim_g'] == {'type': 'Adam', 'lr': 1e-3}
    assert record['train.scheduler'] == {'type': 'MultiStepLR', 'milestones': [2], 'gamma': 0.5}
    assert (record['scale'], record['manual_seed'], record['datasets.train.gt_size']) == (4, 3, 32)
    assert record['datasets.train.batch_size_per_gpu'] == 2 and record['datasets.train.cameras'] == ['Olympus']
    assert record['datasets.train.use_rot'] is None and record['datasets.train.subset'] is None
    opt['train']['optim_g'].pop('type')
    opt['train']['scheduler'].pop('type')
    opt['datasets']['train']['cameras'].append('Pan')
    opt['train']['scheduler']['milestones'].append(9)       # nested: a shallow copy would follow it
    assert record['train.optim_g']['type'] == 'Adam' and record['train.scheduler']['type'] == 'MultiStepLR'
    assert record['train.scheduler']['milestones'] == [2]
    assert record['datasets.train.cameras'] == ['Olympus']
    assert resume_fixed({'train': None})['train.optim_g'] is None      # a section absent or empty
