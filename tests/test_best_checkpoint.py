"""val: save_best keeps the weights of the best-validating iteration in net_g_best.pth, across resumes,
and its options fail early with one clear line."""
import json
import os
import re

import cv2
import numpy as np
import pytest
import torch

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.models.best import best_selection
from conftest import basicsr_log, run_entry
from test_cli import dataset, train_options, write


def best_options(data, name, total_iter=6):
    """FT with a large learning rate (PSNR rises, then falls), validated every iteration on held-out
    images of the source camera, every iteration saved so each one's weights can be compared."""
    opt = train_options(data, name, total_iter=total_iter)
    opt['datasets']['val_source'] = dataset(data, 'Test', ['Olympus'])
    opt['train']['optim_g']['lr'] = 2e-2
    opt['logger']['save_checkpoint_freq'] = 1
    opt['val'].update(val_freq=1, save_best=True, best_metric='psnr', best_dataset='Test_Olympus')
    return opt


def weights(path):
    return torch.load(path, weights_only=True)['params']


def best_lines(log):
    found = re.findall(r'New best psnr on Test_Olympus: ([0-9.]+) at iteration (\d+)', log)
    return [(int(i), float(v)) for v, i in found]


def test_best_iteration_weights_are_saved_and_survive_resume(project, demo_data):
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'full.yml', best_options(demo_data, 'full')))
    exp = project / 'experiments' / 'full'
    log = next(exp.glob('train_full_*.log')).read_text()
    psnr = [float(v) for v in re.findall(r'Validation Test_Olympus\n\t # psnr: ([0-9.]+)', log)]
    assert len(psnr) == 6   # iterations 1..6; after the loop iteration 6's weights are not validated again
    assert 'Validation Test_Olympus: iteration 6 was validated already, with no training step since; not repeated' in log
    best = best_lines(log)
    # Every improvement and only improvements (strictly greater) are saved, and the last one is the maximum.
    running = []
    for value in psnr:
        if not running or value > running[-1]:
            running.append(value)
    assert [round(v, 4) for _, v in best] == [round(v, 4) for v in running]
    best_iter = best[-1][0]
    assert 1 < best_iter < 6, f'the large learning rate was meant to make an early best, PSNRs {psnr}'
    saved = weights(exp / 'models' / 'net_g_best.pth')
    assert all(torch.equal(saved[k], v) for k, v in weights(exp / 'models' / f'net_g_{best_iter}.pth').items())
    state = torch.load(exp / 'training_states' / '6.state', weights_only=True)
    assert state['extra']['best']['iter'] == best_iter

    # Killed after iteration `best_iter` (only what existed then is kept), then resumed.
    cut = project / 'experiments' / 'cut'
    (cut / 'training_states').mkdir(parents=True)
    (cut / 'models').mkdir()
    for source, target in ((exp / 'training_states' / f'{best_iter}.state', cut / 'training_states'),
                           (exp / 'models' / f'net_g_{best_iter}.pth', cut / 'models'),
                           (exp / 'models' / 'net_g_best.pth', cut / 'models')):
        target.joinpath(source.name).write_bytes(source.read_bytes())
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'cut.yml', best_options(demo_data, 'cut')),
              '--auto_resume')
    resumed_log = next(cut.glob('train_cut_*.log')).read_text()
    assert f'Resumed best psnr on Test_Olympus: {best[-1][1]:.4f} at iteration {best_iter}' in resumed_log
    assert best_lines(resumed_log) == []   # nothing after the resume point beats the restored best
    resumed = weights(cut / 'models' / 'net_g_best.pth')
    assert all(torch.equal(resumed[k], v) for k, v in saved.items())
    assert torch.load(cut / 'training_states' / '6.state', weights_only=True)['extra']['best']['iter'] == best_iter


def test_plain_srmodel_is_refused_before_training(project, demo_data):
    opt = best_options(demo_data, 'plain')
    opt['model_type'] = 'SRModel'
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'plain.yml', opt), check=False)
    assert result.returncode == 2 and 'val.save_best needs a model type of this project' in result.stderr
    assert not (project / 'experiments' / 'plain').exists()


def _opt(val=None, datasets=('val_a', 'val_b'), model_type='FTSRModel'):
    return {'model_type': model_type, 'datasets': {'train': {'name': 't'}, **{k: {'name': k[4:]} for k in datasets}},
            'val': {'metrics': {'psnr': {}, 'niqe': {'better': 'lower'}}, **(val or {})}}


@pytest.mark.parametrize('val, datasets, networks, message', [
    ({'save_best': True}, ('val_a', 'val_b'), (), 'name the one that selects with val.best_dataset'),
    ({'save_best': True}, (), (), "needs a validation set: add a 'datasets: val_\\*' section"),
    ({'save_best': True, 'best_dataset': 'c'}, ('val_a',), (), "val.best_dataset: expected the name of a validation set \\(a\\), got 'c'"),
    ({'save_best': True, 'best_metric': 'ssim'}, ('val_a',), (), "val.best_metric: expected one of val.metrics \\(psnr, niqe\\), got 'ssim'"),
    ({'save_best': 'yes'}, ('val_a',), (), "val.save_best: expected true or false, got 'yes'"),
    ({'best_metric': 'psnr'}, ('val_a',), (), "val.best_metric: expected only with 'val: save_best: true'"),
    ({'best_network': 'primary'}, ('val_a',), (), "val.best_network: expected no value \\(FTSRModel has one network\\), got 'primary'"),
    ({'best_network': 'both'}, ('val_a',), ('composite', 'primary'), "val.best_network: expected one of 'composite', 'primary', got 'both'"),
])
def test_selection_option_errors(val, datasets, networks, message):
    with pytest.raises(InputError, match=message):
        best_selection(_opt(val, datasets), networks)


def test_selection_defaults_and_lower_is_better():
    assert best_selection(_opt({}, ('val_a',))) is None
    assert best_selection(_opt({'save_best': True}, ('val_a',)), ('composite', 'primary')) == {
        'metric': 'psnr', 'dataset': 'a', 'network': 'composite', 'higher': True}
    chosen = best_selection(_opt({'save_best': True, 'best_metric': 'niqe', 'best_dataset': 'b'}))
    assert (chosen['dataset'], chosen['higher'], chosen['network']) == ('b', False, None)


def test_param_key_g_chooses_the_starting_weights_of_every_copy(tmp_path, demo_data):
    """path.param_key_g picks the weights FT starts from (net_g and its EMA copy) and test.py's default."""
    from basicsr.archs import build_network as build
    from basicsr.models import build_model
    from basicsr_ldt.pipelines.evaluate import checkpoints_of
    from test_cli import NETWORK
    torch.manual_seed(0)
    params, params_ema = build(dict(NETWORK)).state_dict(), build(dict(NETWORK)).state_dict()
    torch.save({'params': params, 'params_ema': params_ema}, tmp_path / 'both.pth')
    for key, expected in (('params', params), ('params_ema', params_ema)):
        opt = train_options(demo_data, 'keys', path={'pretrain_network_g': str(tmp_path / 'both.pth'),
                                                     'param_key_g': key, 'strict_load_g': True})
        opt['train']['ema_decay'] = 0.999
        opt.update(is_train=True, dist=False, rank=0, world_size=1)
        model = build_model(opt)
        for network in (model.net_g, model.net_g_ema):
            assert all(torch.equal(v, expected[k]) for k, v in network.state_dict().items())
        entry = checkpoints_of({'path': {'param_key_g': key}, 'checkpoints': [{'path': 'x.pth'}]})[0]
        assert entry['param_key'] == key


def _in_process(monkeypatch, project, script, options):
    """Run ``Train_pip.py`` / ``test.py`` the way a user does, but in this process (so that mutation
    testing can see the code it runs); returns BasicSR's log messages."""
    from basicsr_ldt.pipelines.evaluate import test_pipeline
    from basicsr_ldt.pipelines.train import train_pipeline
    monkeypatch.setattr('sys.argv', [script, '-opt', write(project / f"{options['name']}.yml", options)])
    with basicsr_log() as lines:
        (train_pipeline if script == 'Train_pip.py' else test_pipeline)(str(project))
    return lines


@pytest.mark.parametrize('method', ['ft', 'ldt_s'])
def test_a_branch_named_for_a_one_network_method_is_refused_before_the_run(tmp_path, demo_data, method):
    """``val.best_network: auxiliary`` with LDT-S (or FT through LDTSRModel): validation measured the one
    network while the log said '(auxiliary network validated)'. Refused in the early check; the dual mode
    and the composite pass."""
    from basicsr_ldt.models.option_values import check_option_values
    from test_ldt_model import ldt_options
    opt = ldt_options(demo_data, 'branch')
    ldt = {'ft': {'method': 'ft', 'head_warmup_iters': 0}, 'ldt_s': {'method': 'ldt_s', 'interval_iters': 2,
                                                                     'profile_iters': 2, 'ema_every': 1}}[method]
    mode = {'ft': 'single', 'ldt_s': 'alternating'}[method]
    check_option_values({**opt, 'ldt': ldt, 'val': {**opt['val'], 'best_network': 'composite'}})
    with pytest.raises(InputError) as err:
        check_option_values({**opt, 'ldt': ldt, 'val': {**opt['val'], 'best_network': 'auxiliary'}})
    assert str(err.value) == ("val.best_network: 'auxiliary' is a branch of LDT's two networks (ldt mode 'dual'), and "
                              f"ldt mode '{mode}' trains one network; expected composite (or leave best_network out)")
    with pytest.raises(InputError, match=r"^val\.best_network: 'primary' is a branch"):
        check_option_values({**opt, 'ldt': ldt, 'val': {**opt['val'], 'best_network': 'primary'}})
    check_option_values({**opt, 'val': {**opt['val'], 'best_network': 'primary'}})   # the dual mode has it


@pytest.mark.parametrize('best_network', [None, 'primary'], ids=['default', 'primary'])
def test_validation_measures_the_network_that_is_saved(tmp_path, monkeypatch, demo_data, best_network):
    """A tiny LDT run (dual training from iteration 5) validated every iteration, with images and
    tensorboard on. The PSNR validation logs (and writes to tensorboard) for an iteration is what test.py
    reports for the network it names: that iteration's net_g file by default (the composite, what is
    saved), the primary branch of that iteration's training state with ``val.best_network: primary``;
    the images it saves are that network's output; net_g_best.pth is the composite of the best
    iteration; and the networks not validated measure differently, so the test tells them apart.
    test.py evaluates with the options validation used (the same image set, metric defaults)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from test_ldt_model import NETWORK, ldt_options
    opt = ldt_options(demo_data, 'ldt_val')
    opt['datasets'] = {'train': opt['datasets']['train'], 'val_source': dataset(demo_data, 'Test', ['Olympus'])}
    opt['val'].update(val_freq=1, save_best=True, best_metric='psnr', save_img=True)
    if best_network:
        opt['val']['best_network'] = best_network
    opt['logger']['use_tb_logger'] = True
    lines = _in_process(monkeypatch, tmp_path, 'Train_pip.py', opt)
    logged = [float(v) for v in re.findall(r'Validation Test_Olympus\n\t # psnr: ([0-9.]+)', '\n'.join(lines))]
    assert len(logged) == 8   # iterations 1..8, once each (not again after the loop)
    exp = tmp_path / 'experiments' / 'ldt_val'
    files = {}
    for i in range(1, 9):
        ldt = torch.load(exp / 'training_states' / f'{i}.state', weights_only=True)['extra']['ldt']
        assert (ldt['auxiliary'] is not None) == (i >= 5)
        files[f'composite{i}'] = exp / 'models' / f'net_g_{i}.pth'
        for branch in ('primary', 'auxiliary'):   # the branches as test.py checkpoints
            if ldt[branch] is not None:
                files[f'{branch}{i}'] = exp / f'{branch}_{i}.pth'
                torch.save({'params': ldt[branch]}, files[f'{branch}{i}'])
    validated = [f'{best_network}{i}' if best_network and i >= 5 else f'composite{i}' for i in range(1, 9)]
    _in_process(monkeypatch, tmp_path, 'test.py', {
        'name': 'eval_val', 'scale': 4, 'num_gpu': 0, 'network_g': NETWORK, 'path': {},
        'datasets': {'test_1': opt['datasets']['val_source']}, 'test': {'save_img': True},
        'checkpoints': [{'label': label, 'path': str(path)} for label, path in files.items()]})
    results = tmp_path / 'results' / 'eval_val'
    table = json.loads((results / 'metrics.json').read_text())['summary']
    measured = {label: table[label]['Mean']['psnr'] for label in files}
    for i, label in enumerate(validated, start=1):
        assert abs(logged[i - 1] - measured[label]) < 6e-5, (i, label, logged, measured)
    events = EventAccumulator(str(tmp_path / 'tb_logger' / 'ldt_val'))
    events.Reload()
    assert [round(e.value, 4) for e in events.Scalars('metrics/Test_Olympus/psnr')] == logged
    from basicsr_ldt.data.drealsr_dataset import DRealSRCameraDataset
    stems = [os.path.splitext(os.path.basename(item['lq_path']))[0]
             for item in DRealSRCameraDataset(opt['datasets']['val_source']).items]
    assert len(stems) == 2
    for stem in stems:   # val.save_img: the validated network's output
        for i in (5, 8):
            saved = cv2.imread(str(exp / 'visualization' / stem / f'{stem}_{i}.png'))
            from_test = cv2.imread(str(results / 'visualization' / validated[i - 1] / 'Olympus' / f'{stem}.png'))
            assert saved is not None and np.array_equal(saved, from_test), (stem, i)
    best = torch.load(exp / 'training_states' / '8.state', weights_only=True)['extra']['best']
    assert abs(best['value'] - measured[validated[best['iter'] - 1]]) < 1e-9, (best, measured)
    best_weights = weights(exp / 'models' / 'net_g_best.pth')
    assert all(torch.equal(v, best_weights[k]) for k, v in weights(files[f"composite{best['iter']}"]).items())
    for other in {'composite8', 'primary8', 'auxiliary8'} - {validated[-1]}:
        assert abs(measured[other] - measured[validated[-1]]) > 1e-3, f'{other} measures like {validated[-1]}: {measured}'


@pytest.mark.parametrize('model_type', ['FTSRModel', 'CorGradSRModel'])
def test_with_ema_decay_validation_measures_the_saved_params_ema(tmp_path, monkeypatch, demo_data, model_type):
    """FT and CorGrad with ``train.ema_decay``: BasicSR evaluates ``net_g_ema``, the studies test
    ``params_ema``, so the PSNR validation logs for an iteration must be what test.py reports for that
    iteration's saved ``params_ema`` (not its ``params``), the images it saves must be that network's
    output, and ``net_g_best.pth`` must hold the best iteration's ``params_ema`` with the value it was
    selected on. A decay of 0.5 with a large learning rate keeps the two copies measurably apart, which
    the test checks, so it tells them apart. Kills the slip that validates the raw ``net_g`` (the
    logged numbers and the best-checkpoint choice then describe another network than the one
    evaluated). The LDT model's counterpart: test_validation_measures_the_network_that_is_saved."""
    from test_cli import NETWORK
    opt = best_options(demo_data, f'ema_{model_type}', total_iter=5)
    opt['model_type'] = model_type
    opt['train']['ema_decay'] = 0.5
    opt['val']['save_img'] = True
    opt['datasets'] = {'train': opt['datasets']['train'], 'val_source': opt['datasets']['val_source']}
    if model_type == 'CorGradSRModel':   # one gradient per source camera: every camera in every batch
        opt['datasets']['train'].update(cameras=['Olympus', 'Sony', 'Canon'], batch_size_per_gpu=3)
    lines = _in_process(monkeypatch, tmp_path, 'Train_pip.py', opt)
    logged = [float(v) for v in re.findall(r'Validation Test_Olympus\n\t # psnr: ([0-9.]+)', '\n'.join(lines))]
    assert len(logged) == 5
    exp = tmp_path / 'experiments' / opt['name']
    checkpoints = [{'label': f'{key}{i}', 'path': str(exp / 'models' / f'net_g_{i}.pth'), 'param_key': key}
                   for i in range(1, 6) for key in ('params', 'params_ema')]
    _in_process(monkeypatch, tmp_path, 'test.py', {
        'name': f'eval_{model_type}', 'scale': 4, 'num_gpu': 0, 'network_g': NETWORK, 'path': {},
        'datasets': {'test_1': opt['datasets']['val_source']}, 'test': {'save_img': True},
        'checkpoints': checkpoints})
    results = tmp_path / 'results' / f'eval_{model_type}'
    table = json.loads((results / 'metrics.json').read_text())['summary']
    measured = {e['label']: table[e['label']]['Mean']['psnr'] for e in checkpoints}
    for i in range(1, 6):
        assert abs(logged[i - 1] - measured[f'params_ema{i}']) < 6e-5, (i, logged, measured)
    assert max(abs(measured[f'params{i}'] - measured[f'params_ema{i}']) for i in range(1, 6)) > 1e-2, measured
    stem = os.path.splitext(os.path.basename(sorted((demo_data / 'Test_x4' / 'test_LR').glob('P*'))[0].name))[0]
    for i in range(1, 6):   # val.save_img: the validated network's output
        saved = cv2.imread(str(exp / 'visualization' / stem / f'{stem}_{i}.png'))
        from_test = cv2.imread(str(results / 'visualization' / f'params_ema{i}' / 'Olympus' / f'{stem}.png'))
        assert saved is not None and np.array_equal(saved, from_test), (stem, i)
    best = torch.load(exp / 'training_states' / '5.state', weights_only=True)['extra']['best']
    assert abs(best['value'] - measured[f"params_ema{best['iter']}"]) < 1e-9, (best, measured)
    best_file = torch.load(exp / 'models' / 'net_g_best.pth', weights_only=True)
    that_iteration = torch.load(exp / 'models' / f"net_g_{best['iter']}.pth", weights_only=True)
    for key in ('params', 'params_ema'):
        assert all(torch.equal(v, best_file[key][k]) for k, v in that_iteration[key].items())
