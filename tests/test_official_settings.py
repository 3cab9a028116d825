"""options/train_mambair_ldt_official.yml runs (tiny MambaIR, demo data), and its file-order
profiling reads the first batches of one unshuffled pass, as the official profiling loader."""
import json

import pytest
import torch
import yaml

from conftest import REPO, run_entry
from test_cli import write

OFFICIAL = REPO / 'options' / 'train_mambair_ldt_official.yml'
TINY_MAMBAIR = {'type': 'MambaIR', 'upscale': 4, 'in_chans': 3, 'img_size': 8, 'embed_dim': 30, 'depths': [1],
                'd_state': 4, 'mlp_ratio': 1.0, 'upsampler': 'pixelshuffle', 'resi_connection': '1conv'}


@pytest.fixture(scope='module')
def olympus_data(tmp_path_factory, demo_module):
    """Six Olympus training pairs (one pass of batch 4 = a full and a partial batch), two test pairs:
    the official code's source camera, its folder P (DRealSR's Olympus files are P1140279...)."""
    out = tmp_path_factory.mktemp('olympus') / 'DRealSR_demo'
    demo_module.make_demo_data(out, seed=0, cameras=('Olympus',), train_per_camera=6, test_per_camera=2,
                               hr_size=64, test_hr_size=96)
    return out


def official_on_demo(data, name, total_iter=4):
    opt = yaml.safe_load(OFFICIAL.read_text())
    opt.update(name=name, num_gpu=0, network_g=dict(TINY_MAMBAIR))
    for phase, split in (('train', 'Train'), ('val_source', 'Test')):
        opt['datasets'][phase].update(dataroot_gt=str(data / f'{split}_x4' / f'{split.lower()}_HR'),
                                      dataroot_lq=str(data / f'{split}_x4' / f'{split.lower()}_LR'))
    opt['datasets']['train'].update(gt_size=32, num_worker_per_gpu=0)
    opt['path']['pretrain_network_g'] = None
    opt['train']['total_iter'] = total_iter
    opt['train']['scheduler']['milestones'] = [total_iter]         # the official constant rate, over this run
    opt['ldt']['ema_every'] = 1        # the official 10 gives a 4-iteration run no exchange (refused: nothing trained)
    opt['val']['val_freq'] = 2
    opt['logger'].update(print_freq=1, save_checkpoint_freq=2, use_tb_logger=False)
    return opt


def test_official_settings_as_written():
    opt = yaml.safe_load(OFFICIAL.read_text())
    assert opt['train']['optim_g']['betas'] == [0 ** 0.8, 0.99 ** 0.8]
    assert (opt['ldt']['ratio_s'], opt['ldt']['ema_every'], opt['ldt']['head_warmup_iters']) == (0.5, 10, 0)
    assert opt['path']['param_key_g'] == 'params' and opt['datasets']['train']['cameras'] == ['Olympus']
    assert opt['datasets']['val_source']['cameras'] == ['Olympus'] and opt['val']['val_freq'] == 500


def test_file_order_profiling_reads_the_first_batches_of_one_pass(olympus_data):
    from basicsr_ldt.models.ldt_model import PhaseBatches
    opt = official_on_demo(olympus_data, 'x')['datasets']['train']
    opt.update(phase='train', seed=0)
    phase = PhaseBatches(opt, 0, 1, seed=0, device=torch.device('cpu'), file_order=True)
    batches = list(phase.first_in_file_order(300))
    assert [len(b['lq']) for b in batches] == [4, 2]           # one pass: 6 images, the last batch partial
    items = [phase.dataset[i] for i in range(6)]              # file order, each sample's own seeded crop
    assert [item['lq_path'] for item in items] == sorted(item['lq_path'] for item in items)
    assert torch.equal(torch.cat([b['lq'] for b in batches]), torch.stack([item['lq'] for item in items]))
    assert len(list(phase.first_in_file_order(1))) == 1


def test_official_settings_run_on_demo_data(project, olympus_data):
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'official.yml', official_on_demo(olympus_data, 'official')))
    exp = project / 'experiments' / 'official'
    log = next(exp.glob('train_official_*.log')).read_text()
    assert ("gradient profiling on D_S2 (2 batches, file_order, criterion 'var') before iteration 1, "
            'not counted in total_iter') in log
    assert 'dual training (cross-frozen primary/auxiliary) from iteration 1' in log
    assert 'New best psnr on Olympus: ' in log and '(auxiliary network validated)' in log
    layers = json.loads((exp / 'ldt_partition.json').read_text())['layers']
    assert sum(layer['group'] == 'stable' for layer in layers) == int(len(layers) * 0.5)   # ratio_s
    assert (exp / 'models' / 'net_g_best.pth').is_file() and (exp / 'training_states' / '4.state').is_file()
    assert not (exp / 'training_states' / '5.state').exists()   # profiling did not use up iterations
    extra = torch.load(exp / 'training_states' / '4.state', weights_only=True)['extra']
    assert extra['best']['iter'] == 4 and extra['ldt']['phase'] == 'train'

    # Killed after iteration 2 and resumed: the best so far comes back with the LDT state, and the
    # run ends with the uninterrupted run's best weights.
    cut = project / 'experiments' / 'cut'
    for folder, name in (('training_states', '2.state'), ('models', 'net_g_2.pth')):
        (cut / folder).mkdir(parents=True, exist_ok=True)
        (cut / folder / name).write_bytes((exp / folder / name).read_bytes())
    # What net_g_best.pth held then: the composite of iteration 2, the best so far.
    (cut / 'models' / 'net_g_best.pth').write_bytes((exp / 'models' / 'net_g_2.pth').read_bytes())
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'cut.yml', official_on_demo(olympus_data, 'cut')),
              '--auto_resume')
    resumed_log = next(cut.glob('train_cut_*.log')).read_text()
    assert 'Resumed best psnr on Olympus: ' in resumed_log and 'at iteration 2' in resumed_log
    expected = torch.load(exp / 'models' / 'net_g_best.pth', weights_only=True)['params']
    got = torch.load(cut / 'models' / 'net_g_best.pth', weights_only=True)['params']
    assert all(torch.equal(expected[k], got[k]) for k in expected)
