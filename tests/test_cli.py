"""End to end through the real entry points: Train_pip.py trains and resumes, test.py reports per camera,
and bad input stops with one line before anything is written."""
import json
import re

import pytest
import torch
import yaml

from conftest import run_entry

NETWORK = {'type': 'MSRResNet', 'num_in_ch': 3, 'num_out_ch': 3, 'num_feat': 8, 'num_block': 1, 'upscale': 4}


def dataset(data, split, cameras, **extra):
    lower = split.lower()
    opt = {'name': f'{split}_{"_".join(cameras)}', 'type': 'DRealSRCameraDataset', 'cameras': cameras,
           'dataroot_gt': str(data / f'{split}_x4' / f'{lower}_HR'),
           'dataroot_lq': str(data / f'{split}_x4' / f'{lower}_LR'), 'io_backend': {'type': 'disk'}}
    opt.update(extra)
    return opt


def train_options(data, name='ft', total_iter=6, **overrides):
    opt = {
        'name': name, 'model_type': 'FTSRModel', 'scale': 4, 'num_gpu': 0, 'manual_seed': 0,
        'datasets': {
            'train': dataset(data, 'Train', ['Olympus'], gt_size=32, use_hflip=True, use_rot=True,
                             num_worker_per_gpu=0, batch_size_per_gpu=2, dataset_enlarge_ratio=1),
            'val_targets': dataset(data, 'Test', ['Sony', 'Canon'])},
        'network_g': NETWORK,
        'path': {'pretrain_network_g': None, 'strict_load_g': True, 'resume_state': None},
        'train': {'optim_g': {'type': 'Adam', 'lr': 1e-3, 'betas': [0.9, 0.99]},
                  'scheduler': {'type': 'MultiStepLR', 'milestones': [min(4, total_iter)], 'gamma': 0.5},
                  'total_iter': total_iter, 'warmup_iter': -1,
                  'pixel_opt': {'type': 'L1Loss', 'loss_weight': 1.0, 'reduction': 'mean'}},
        'val': {'val_freq': 1000, 'save_img': False,
                'metrics': {'psnr': {'type': 'calculate_psnr', 'crop_border': 4, 'test_y_channel': True}}},
        'logger': {'print_freq': 1, 'save_checkpoint_freq': 2, 'use_tb_logger': False},
    }
    for key, value in overrides.items():
        opt[key] = value
    return opt


def write(path, opt):
    path.write_text(yaml.safe_dump(opt, sort_keys=False))
    return str(path)


def test_train_then_test_writes_checkpoint_log_and_camera_table(project, demo_data):
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'train.yml', train_options(demo_data)))
    exp = project / 'experiments' / 'ft'
    assert (exp / 'models' / 'net_g_latest.pth').is_file() and (exp / 'training_states' / '6.state').is_file()
    log = next(exp.glob('train_ft_*.log')).read_text()
    assert 'Training data: 6 images' in log and "'Olympus': 6" in log and 'l_pix' in log

    test_opt = {'name': 'eval', 'scale': 4, 'num_gpu': 0,
                'datasets': {'test_1': dataset(demo_data, 'Test', ['Olympus', 'Sony', 'Canon'])},
                'network_g': NETWORK, 'path': {},
                'checkpoints': [{'label': 'iter2', 'path': str(exp / 'models' / 'net_g_2.pth')},
                                {'label': 'final', 'path': str(exp / 'models' / 'net_g_latest.pth')}],
                'test': {'tile_size': 16, 'tile_overlap': 4, 'save_img': True}}
    result = run_entry(project, 'test.py', '-opt', write(project / 'test.yml', test_opt))
    out = project / 'results' / 'eval'
    lines = (out / 'metrics.md').read_text().splitlines()
    assert lines[0] == '| Camera | Images | iter2 PSNR | iter2 SSIM | final PSNR | final SSIM |'
    assert [line.split(' | ')[0] for line in lines[2:6]] == ['| Canon', '| Olympus', '| Sony', '| Mean']
    assert lines[6:] == ['', 'PSNR (dB) / SSIM on the Y channel, crop_border 4; 16-pixel tiles overlapping by 4, fp32']
    summary = json.loads((out / 'metrics.json').read_text())
    assert summary['summary']['final']['Mean']['images'] == 6 and len(summary['images']['final']) == 6
    assert 'Camera' in result.stdout and (out / 'metrics.csv').read_text().startswith('checkpoint,camera,')
    assert len(list((out / 'visualization' / 'final' / 'Sony').glob('*.png'))) == 2


def test_auto_resume_reproduces_uninterrupted_run(project, demo_data):
    def halved_at_2(name, total_iter=6):     # one schedule for all three runs, the milestone inside the shortest
        opt = train_options(demo_data, name, total_iter=total_iter)
        opt['train']['scheduler']['milestones'] = [2]
        return opt
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'a.yml', halved_at_2('full')))
    # Interrupted twin: stop after iteration 2 (its last state), then resume to the end.
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'b.yml', halved_at_2('cut', total_iter=3)))
    states = project / 'experiments' / 'cut' / 'training_states'
    (states / '3.state').unlink(missing_ok=True)
    partial = states / '.3.state.x1y2.tmp'  # what a kill during the write of 3.state leaves
    partial.write_bytes(b'half a checkpoint')
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'b.yml', halved_at_2('cut')), '--auto_resume')
    full = torch.load(project / 'experiments' / 'full' / 'models' / 'net_g_latest.pth', weights_only=True)['params']
    cut = torch.load(project / 'experiments' / 'cut' / 'models' / 'net_g_latest.pth', weights_only=True)['params']
    assert full.keys() == cut.keys()
    assert all(torch.equal(full[k], cut[k]) for k in full)
    assert not partial.exists()


@pytest.mark.parametrize('change, key, now, saved', [
    (lambda o: o['train']['optim_g'].update(lr=0.01), 'train.optim_g',
     "{'type': 'Adam', 'lr': 0.01, 'betas': [0.9, 0.99]}", "{'type': 'Adam', 'lr': 0.001, 'betas': [0.9, 0.99]}"),
    (lambda o: o['train']['scheduler'].update(milestones=[3]), 'train.scheduler',
     "{'type': 'MultiStepLR', 'milestones': [3], 'gamma': 0.5}", "{'type': 'MultiStepLR', 'milestones': [2], 'gamma': 0.5}"),
    (lambda o: o['datasets']['train'].update(gt_size=16), 'datasets.train.gt_size', '16', '32'),
    (lambda o: o.update(manual_seed=5), 'manual_seed', '5', '0'),
])
def test_auto_resume_refuses_options_the_state_would_silently_override(project, demo_data, change, key, now, saved):
    """The log's option dump said lr 0.01 while the run went on at the state's 1e-3 (BasicSR restores the
    optimizer and scheduler states); other crops or seeds mixed two trainings under one name. An extended
    total_iter and execution choices (fused Adam, workers) still resume."""
    opt = train_options(demo_data, 'cut', total_iter=2)
    opt['train']['scheduler']['milestones'] = [2]
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'cut.yml', opt))
    opt['train']['total_iter'] = 4
    change(opt)
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'cut.yml', opt), '--auto_resume', check=False)
    state = project / 'experiments' / 'cut' / 'training_states' / '2.state'
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
        f"error: {key} is {now} in the option file but {saved} in training state '{state}': a resumed run keeps the "
        "state's optimizer, schedule and data draws, so the new value would be logged and not used; restore it, or "
        'give the run a new name')
    assert not (project / 'experiments' / 'cut' / 'training_states' / '4.state').exists()


def test_a_refused_resume_leaves_the_experiment_folder_as_it_was(project, demo_data):
    """An FT state resumed as LDT (the reverse, an LDT-S state resumed as FT, went on as plain FT in the
    LDT-S run's folder; an LDT state as FT was an AssertionError): refused by model_type, with no new log
    and the copied option file as the run that wrote the state left it."""
    opt = train_options(demo_data, 'cut', total_iter=2, network_g={'type': 'SAFMN', 'dim': 8, 'n_blocks': 1,
                                                                  'ffn_scale': 2.0, 'upscaling_factor': 4})
    opt['train']['scheduler']['milestones'] = [2]
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'cut.yml', opt))
    exp = project / 'experiments' / 'cut'
    before = {path.name: path.read_bytes() for path in exp.iterdir() if path.is_file()}
    opt.update(model_type='LDTSRModel', ldt={'head_warmup_iters': 2, 'profile_iters': 2, 'ema_every': 2})
    opt['train']['total_iter'] = 8
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'cut.yml', opt), '--auto_resume', check=False)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
        f"error: model_type is 'LDTSRModel' in the option file but 'FTSRModel' in training state "
        f"'{exp / 'training_states' / '2.state'}': the state holds that model's optimizers and method state; restore "
        'it, or give the run a new name')
    assert {path.name: path.read_bytes() for path in exp.iterdir() if path.is_file()} == before


def test_a_run_that_will_save_no_training_state_says_so(project, demo_data):
    """save_checkpoint_freq above total_iter: BasicSR writes the final network only, so an interrupted run
    could not resume; said once in the log."""
    opt = train_options(demo_data, 'nostate', total_iter=2)
    opt['train']['scheduler']['milestones'] = [2]
    opt['logger']['save_checkpoint_freq'] = 5
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'nostate.yml', opt))
    exp = project / 'experiments' / 'nostate'
    log = next(exp.glob('train_nostate_*.log')).read_text()
    assert log.count('WARNING: logger.save_checkpoint_freq 5 is above train.total_iter 2: no training state will be '
                     'saved, so an interrupted run starts again from iteration 1 (only the final network is '
                     'written)') == 1
    assert not list((exp / 'training_states').iterdir()) and (exp / 'models' / 'net_g_latest.pth').is_file()
    opt['logger']['save_checkpoint_freq'] = 2
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'nostate.yml', opt))
    log = sorted(exp.glob('train_nostate_*.log'))[-1].read_text()
    assert 'no training state will be saved' not in log and (exp / 'training_states' / '2.state').is_file()


def test_auto_resume_accepts_a_longer_run_and_other_execution_choices(project, demo_data):
    opt = train_options(demo_data, 'cut', total_iter=2)
    opt['train']['scheduler']['milestones'] = [2]
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'cut.yml', opt))
    opt['train']['total_iter'] = 3
    opt['train']['optim_g']['fused'] = False
    opt['datasets']['train']['num_worker_per_gpu'] = 1
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'cut.yml', opt), '--auto_resume')
    resumed = sorted((project / 'experiments' / 'cut').glob('train_cut_*.log'))[-1].read_text()
    assert re.search(r'iter:\s+3,', resumed) and not re.search(r'iter:\s+2,', resumed)   # went on from 2


def test_auto_resume_moves_damaged_states_aside_and_resumes_from_a_readable_one(project, demo_data):
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'a.yml', train_options(demo_data, 'full')))
    yml = write(project / 'b.yml', train_options(demo_data, 'cut'))
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'b4.yml', train_options(demo_data, 'cut', total_iter=4)))
    states = project / 'experiments' / 'cut' / 'training_states'
    assert sorted(p.name for p in states.iterdir()) == ['2.state', '4.state']
    good = (states / '2.state').read_bytes()
    four = (states / '4.state').read_bytes()
    (states / '4.state').write_bytes(four[:len(four) // 2])   # truncated
    (states / '5.state').write_bytes(b'')                       # zero-length (a newer one)

    # None readable: the newest one's error, one line, and nothing is moved.
    (states / '2.state').write_bytes(good[:100])
    result = run_entry(project, 'Train_pip.py', '-opt', yml, '--auto_resume', check=False)
    assert result.returncode == 2 and 'Traceback' not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: cannot read training state '{states / '5.state'}'")
    assert '(nor any of the 2 older one(s))' in result.stderr.strip().splitlines()[-1]
    assert sorted(p.name for p in states.iterdir()) == ['2.state', '4.state', '5.state']

    # 2.state readable again: one warning per damaged state, both moved aside, the run goes on from 2.
    (states / '2.state').write_bytes(good)
    result = run_entry(project, 'Train_pip.py', '-opt', yml, '--auto_resume')
    warnings = [line for line in result.stderr.splitlines() if line.startswith('warning: ')]
    assert len(warnings) == 2
    for name in ('5.state', '4.state'):
        line = next(w for w in warnings if f"'{states / name}'" in w.split(';')[0])
        assert line.startswith(f"warning: cannot read training state '{states / name}'")
        assert line.endswith(f"moved it to '{states / name}.corrupt' and resuming from '{states / '2.state'}'")
    assert (states / '5.state.corrupt').read_bytes() == b''
    assert (states / '4.state.corrupt').read_bytes() == four[:len(four) // 2]
    assert {'4.state', '6.state'} <= {p.name for p in states.iterdir()}   # rewritten by the resumed run
    full = torch.load(project / 'experiments' / 'full' / 'models' / 'net_g_latest.pth', weights_only=True)['params']
    cut = torch.load(project / 'experiments' / 'cut' / 'models' / 'net_g_latest.pth', weights_only=True)['params']
    assert all(torch.equal(full[k], cut[k]) for k in full)


def test_bad_camera_is_one_line_and_writes_nothing(project, demo_data):
    opt = train_options(demo_data, 'bad')
    opt['datasets']['train']['cameras'] = ['Nikon']
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'bad.yml', opt), check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: unknown camera(s) 'Nikon'")
    assert 'Traceback' not in result.stderr
    assert not (project / 'experiments' / 'bad').exists()


def test_missing_pretrained_file_restores_previous_experiment(project, demo_data):
    good = train_options(demo_data, 'keep', total_iter=2)
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'keep.yml', good))
    bad = train_options(demo_data, 'keep', path={'pretrain_network_g': str(project / 'missing.pth')})
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'keep.yml', bad), check=False)
    assert result.returncode == 2 and "missing.pth' does not exist" in result.stderr
    assert (project / 'experiments' / 'keep' / 'models' / 'net_g_latest.pth').is_file()
    assert not list((project / 'experiments').glob('keep_archived_*'))


@pytest.mark.parametrize('script, flags, message', [
    ('Train_pip.py', ['-opt', 'x.yml', '--auto-resume'], 'unrecognized arguments: --auto-resume (python Train_pip.py '
                                                         '-h lists the flags)'),
    ('test.py', [], 'the following arguments are required: -opt (python test.py -h lists the flags)'),
])
def test_a_bad_flag_is_one_line(project, script, flags, message):
    """argparse's usage block before the error made a misspelt flag look unlike any other slip."""
    result = run_entry(project, script, *flags, check=False)
    assert (result.returncode, result.stderr) == (2, f'error: {message}\n')


def test_test_py_bad_checkpoint_is_one_line(project, demo_data):
    test_opt = {'name': 'eval_bad', 'scale': 4, 'num_gpu': 0,
                'datasets': {'test_1': dataset(demo_data, 'Test', ['Sony'])}, 'network_g': NETWORK, 'path': {},
                'checkpoints': [{'label': 'x', 'path': str(project / 'nope.pth')}]}
    result = run_entry(project, 'test.py', '-opt', write(project / 't.yml', test_opt), check=False)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].startswith('error: checkpoint')
    assert not (project / 'results' / 'eval_bad').exists()
