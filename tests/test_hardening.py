"""When things go wrong: bad input stops in one line and writes nothing, a killed run resumes to the
same weights, checkpoints with code are refused, NaN losses are skipped and then stop training, torchrun works on CPU."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO, run_entry
from test_cli import NETWORK as TINY_RESNET
from test_cli import dataset, train_options, write
from test_ldt_model import ldt_options, uninterrupted, weights  # noqa: F401  (module fixture)


def last_line(result):
    return result.stderr.strip().splitlines()[-1]


def assert_one_line_failure(project, result, name, code=2):
    assert result.returncode == code, result.stderr[-2000:]
    assert 'Traceback' not in result.stderr
    assert not (project / 'experiments' / name).exists()


@pytest.mark.parametrize('change, message', [
    (lambda o: o['ldt'].update(ratio=0.5), "error: ldt: unknown LDT option 'ratio'; did you mean 'ratio_u'?"),
    (lambda o: o['ldt'].update(ratio_u=1.5), "error: ldt.ratio_u: expected a number in (0, 1), got 1.5"),
    (lambda o: o['ldt'].update(head_patterns=['tail']), "error: ldt.head_patterns ['tail'] match no parameter of SAFMN"),
    (lambda o: o['ldt'].update(force_stable=['feat.1']),
     "error: ldt.force_stable: pattern 'feat.1' matches no parameter of SAFMN"),
    (lambda o: o['ldt'].update(profile_iters=20), 'error: ldt: head_warmup_iters (2) + profile_iters (20) must be smaller'),
    (lambda o: o['datasets']['train'].pop('dataroot_gt'), "error: dataset 'Train_Olympus' needs option 'dataroot_gt'"),
    (lambda o: o['datasets']['val_targets'].update(cameras=['Leica']), "error: unknown camera(s) 'Leica'"),
    (lambda o: o['train'].update(amp='fp16'), 'error: train.amp: fp16 needs a CUDA device and this run is on the CPU'),
    (lambda o: o['train'].update(amp='fp8'), "error: train.amp: expected one of 'none', 'bf16', 'fp16', got 'fp8'"),
    (lambda o: o['train'].update(max_bad_steps=0), 'error: train.max_bad_steps: expected an integer >= 1, got 0'),
    (lambda o: o['datasets']['train'].update(gt_size='big'),
     "error: datasets.train.gt_size: expected an integer >= 1, got 'big'"),
    (lambda o: o['ldt'].update(partition_file='nope.json', profile_iters=0),   # a traceback after the warm-up
     "error: cannot read partition file nope.json: [Errno 2] No such file or directory: 'nope.json'"),
    (lambda o: o['ldt'].update(method='deft', deft_grouping='non_layers', profile_iters=0),
     "error: ldt.deft_grouping 'non_layers' needs 'layers.*' parameters, and the network has none (first names: "),
], ids=['ldt_key', 'ratio_u', 'head_patterns', 'force_pattern', 'phase_lengths', 'dataroot', 'camera', 'amp_fp16_cpu', 'amp_value',
        'max_bad_steps', 'typed', 'partition_file', 'deft_non_layers'])
def test_bad_options_fail_in_one_line_and_write_nothing(project, demo_data, change, message):
    opt = ldt_options(demo_data, 'bad')
    change(opt)
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'bad.yml', opt), check=False)
    assert_one_line_failure(project, result, 'bad')
    assert last_line(result).startswith(message)


def test_corrupt_image_fails_before_training(project, demo_data, tmp_path):
    import shutil
    data = tmp_path / 'data'
    shutil.copytree(demo_data, data)
    (data / 'Train_x4' / 'train_LR' / 'Olympus_003_x4.png').write_bytes(b'\x89PNG broken')
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'c.yml', train_options(data, 'bad')), check=False)
    assert_one_line_failure(project, result, 'bad')
    assert 'Olympus_003_x4.png' in last_line(result) and 'corrupt' in last_line(result)


def test_mismatched_pretrained_keys_are_listed(project, demo_data):
    other = torch.nn.Conv2d(3, 3, 3)
    torch.save({'params': other.state_dict()}, project / 'other.pth')
    opt = train_options(demo_data, 'bad', path={'pretrain_network_g': str(project / 'other.pth')})
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'p.yml', opt), check=False)
    assert_one_line_failure(project, result, 'bad')
    line = last_line(result)
    assert "does not fit network MSRResNet: keys" in line and '14 missing (e.g. body.0.conv1.bias' in line
    assert '2 unexpected (e.g. bias, weight)' in line


class CodeInCheckpoint:
    """Anything that is not tensors and plain containers: unpickling it could run code."""

    def __reduce__(self):
        return (os.system, ('echo pwned',))


def test_checkpoint_carrying_code_is_refused(project, demo_data):
    torch.save({'params': {}, 'payload': CodeInCheckpoint()}, project / 'evil.pth')
    test_opt = {'name': 'evil', 'scale': 4, 'num_gpu': 0, 'network_g': TINY_RESNET, 'path': {},
                'datasets': {'test_1': dataset(demo_data, 'Test', ['Sony'])},
                'checkpoints': [{'label': 'x', 'path': str(project / 'evil.pth')}]}
    result = run_entry(project, 'test.py', '-opt', write(project / 'e.yml', test_opt), check=False)
    assert result.returncode == 2 and 'pwned' not in result.stdout
    assert last_line(result).startswith(f"error: refusing to load checkpoint '{project / 'evil.pth'}': it contains "
                                        'pickled objects')
    assert not (project / 'results' / 'evil').exists()


@pytest.mark.parametrize('model', ['FTSRModel', 'LDTSRModel'])
def test_consecutive_non_finite_losses_are_skipped_then_stop_the_run(project, demo_data, model):
    make = (lambda **kw: ldt_options(demo_data, 'nan', **kw)) if model == 'LDTSRModel' else \
        (lambda **kw: train_options(demo_data, 'nan', **kw))
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'n.yml', make(total_iter=6)))
    models = project / 'experiments' / 'nan' / 'models'
    before = (models / 'net_g_6.pth').read_bytes()
    opt = make(total_iter=12)
    opt['train']['pixel_opt']['loss_weight'] = 1e300      # finite, accepted; the float32 loss overflows to inf
    opt['train']['max_bad_steps'] = 3
    opt['logger']['save_checkpoint_freq'] = 1
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'n.yml', opt), '--auto_resume', check=False)
    assert result.returncode == 3 and 'Traceback' not in result.stderr
    where, values = ('the primary branch', 'l_primary=inf') if model == 'LDTSRModel' else ('fine-tuning', 'l_pix=inf')
    assert last_line(result) == (f'error: non-finite loss at iteration 9 in {where} ({values}): 3 consecutive bad '
                                 'steps (train.max_bad_steps = 3); training stopped, the last saved checkpoint is intact')
    log = sorted((project / 'experiments' / 'nan').glob('train_nan_*.log'))[-1].read_text()
    for iteration, count in ((7, 1), (8, 2)):
        assert (f'non-finite loss at iteration {iteration} in {where} ({values}): step skipped, weights unchanged '
                f'({count} consecutive, stop at 3)') in log
    # Skipped steps leave the weights as they were; the stopping step writes nothing.
    assert (models / 'net_g_6.pth').read_bytes() == before and not (models / 'net_g_9.pth').exists()
    assert all(torch.equal(a, b) for a, b in zip(weights(models / 'net_g_6.pth').values(),
                                                  weights(models / 'net_g_8.pth').values()))


@pytest.mark.parametrize('after_state', [1, 3, 6], ids=['warmup', 'profile', 'dual'])
def test_sigkill_then_auto_resume_gives_the_uninterrupted_weights(uninterrupted, demo_data, after_state):  # noqa: F811
    project, _ = uninterrupted
    name = f'killed{after_state}'
    yml = write(project / f'{name}.yml', ldt_options(demo_data, name))
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES='')
    process = subprocess.Popen([sys.executable, 'Train_pip.py', '-opt', yml], cwd=project, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = project / 'experiments' / name / 'training_states' / f'{after_state}.state'
    deadline = time.time() + 300
    while not state.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert state.exists(), 'the run ended or timed out before the kill point'
    run_entry(project, 'Train_pip.py', '-opt', yml, '--auto_resume')
    expected = weights(project / 'experiments' / 'ldt' / 'models' / 'net_g_latest.pth')
    got = weights(project / 'experiments' / name / 'models' / 'net_g_latest.pth')
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize('model', ['FTSRModel', 'LDTSRModel', 'LDTSRModel, overlapped branches'])
def test_torchrun_two_cpu_processes(project, demo_data, model):
    """Two CPU processes under torchrun (gloo) train, agree and save. The ranks are subprocesses that
    mutmut cannot see; applied by hand, the mutants of ``check_replicas_agree``, ``model_to_device``,
    ``pair._average_gradients`` and the ``synchronise`` defaults of ``optimizer_step`` and ``finish``
    fail it."""
    opt = ldt_options(demo_data, 'ddp') if model.startswith('LDTSRModel') else train_options(demo_data, 'ddp')
    if model.endswith('overlapped branches'):   # gradients averaged after both backward passes, in order
        opt['ldt']['overlap_branches'] = True
    opt['datasets']['train']['batch_size_per_gpu'] = 1
    opt['logger']['save_checkpoint_freq'] = 4
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES='', OMP_NUM_THREADS='1')
    command = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2', f'--master_port={free_port()}',
               'Train_pip.py', '-opt', write(project / 'ddp.yml', opt), '--launcher', 'pytorch']
    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    exp = project / 'experiments' / 'ddp'
    log = next(exp.glob('train_ddp_*.log')).read_text()
    assert 'World size (gpu number)' not in log and 'replicas identical on 2 ranks at iteration 4' in log
    assert 'replicas identical on 2 ranks at iteration 8' in log or model == 'FTSRModel'
    assert len(list(exp.glob('train_ddp_*.log'))) == 1 and (exp / 'models' / 'net_g_latest.pth').is_file()
    if model.startswith('LDTSRModel'):
        partition = json.loads((exp / 'ldt_partition.json').read_text())
        assert {layer['group'] for layer in partition['layers']} == {'stable', 'unstable'}


def test_a_test_image_damaged_past_its_header_leaves_the_earlier_results_in_place(project, demo_data, tmp_path):
    """A test LR image whose header reads but whose pixels are cut off is found only as test.py reads it,
    after the results folder was made: one line naming it, the new folder gone, the earlier results back."""
    import shutil
    data = tmp_path / 'data'
    shutil.copytree(demo_data / 'Test_x4', data / 'Test_x4')
    lr = sorted((data / 'Test_x4' / 'test_LR').glob('sony*'))[-1]
    opt = {'name': 'damaged', 'scale': 4, 'num_gpu': 0, 'path': {}, 'checkpoints': [{'bicubic': True}],
           'datasets': {'test_1': dataset(data, 'Test', ['Sony'])}}
    (project / 'results' / 'damaged').mkdir(parents=True)
    (project / 'results' / 'damaged' / 'metrics.md').write_text('earlier')
    lr.write_bytes(lr.read_bytes()[:200])   # header intact, pixels missing
    result = run_entry(project, 'test.py', '-opt', write(project / 'damaged.yml', opt), check=False)
    assert result.returncode == 2 and 'Traceback' not in result.stderr
    assert last_line(result) == f"error: image '{lr}' of dataset 'Test_Sony' is corrupt or not an image"
    assert [p.name for p in (project / 'results').iterdir()] == ['damaged']
    assert (project / 'results' / 'damaged' / 'metrics.md').read_text() == 'earlier'
