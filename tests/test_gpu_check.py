"""scripts/gpu_check.sh on a machine without CUDA, and the option files it trains and tests with
(run on the CPU, shortened, so a typo in them is not first found on a lent GPU)."""
import json
import math
import os
import subprocess

import yaml

from conftest import REPO, run_entry
from test_cli import write


def test_gpu_check_without_cuda_is_one_line_and_non_zero():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='')
    result = subprocess.run(['bash', str(REPO / 'scripts' / 'gpu_check.sh')], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and result.stdout == ''
    assert result.stderr.splitlines() == ['gpu_check: no CUDA device visible to PyTorch (torch.cuda.is_available() is '
                                          'False); run it on a machine with an NVIDIA GPU']


def _load(name):
    return yaml.safe_load((REPO / 'options' / 'demo' / name).read_text())


def _point_at(dataset_opt, data, split):
    lower = split.lower()
    dataset_opt['dataroot_gt'] = str(data / f'{split}_x4' / f'{lower}_HR')
    dataset_opt['dataroot_lq'] = str(data / f'{split}_x4' / f'{lower}_LR')


def test_gpu_check_option_files_train_and_test_on_cpu(project, demo_data):
    train = _load('train_demo_mambair_ldt_gpu.yml')
    assert train['train']['amp'] == 'bf16' and train['network_g']['type'] == 'MambaIR'
    train['num_gpu'] = 0
    _point_at(train['datasets']['train'], demo_data, 'Train')
    _point_at(train['datasets']['val_targets'], demo_data, 'Test')
    train['datasets']['train'].update(gt_size=32, num_worker_per_gpu=0, batch_size_per_gpu=2, dataset_enlarge_ratio=1)
    train['datasets']['val_targets']['cameras'] = ['Sony']          # the fixture's target cameras
    train['ldt'].update(head_warmup_iters=1, profile_iters=2, ema_every=1)
    train['train']['total_iter'] = 4
    train['logger'].update(print_freq=1, save_checkpoint_freq=4)
    train['val']['val_freq'] = 4
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'train.yml', train))
    exp = project / 'experiments' / train['name']
    log = next(exp.glob(f"train_{train['name']}_*.log")).read_text()
    for text in ('Mixed precision: autocast bf16', 'LDT phase: head warm-up', 'LDT phase: gradient profiling',
                 'LDT phase: dual training', '# psnr'):
        assert text in log

    test = _load('test_demo_mambair_gpu.yml')
    assert test['network_g'] == train['network_g'] and test['test']['precision'] == 'bf16'
    assert test['checkpoints'][0]['path'] == f"experiments/{train['name']}/models/net_g_latest.pth"
    test['num_gpu'] = 0
    _point_at(test['datasets']['test_targets'], demo_data, 'Test')
    test['datasets']['test_targets']['cameras'] = ['Sony', 'Canon']
    run_entry(project, 'test.py', '-opt', write(project / 'test.yml', test))
    summary = json.loads((project / 'results' / test['name'] / 'metrics.json').read_text())['summary']
    assert math.isfinite(summary['LDT-bf16']['Mean']['psnr'])
