"""Checkpoint files are replaced atomically and read safely."""
import argparse
import logging
import os

import pytest
import torch

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.weights import checkpoint
from basicsr_ldt.weights.checkpoint import UnreadableCheckpoint, describe_unloaded, load_safe, load_weights, save_atomic


def test_failed_write_leaves_previous_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / 'net_g_10.pth'
    save_atomic({'params': {'w': torch.ones(2)}}, str(path))
    before = path.read_bytes()

    def dies_mid_write(obj, stream):
        stream.write(b'partial')
        raise KeyboardInterrupt  # e.g. the job is stopped while writing

    monkeypatch.setattr(checkpoint.torch, 'save', dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        save_atomic({'params': {'w': torch.zeros(2)}}, str(path))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ['net_g_10.pth']


def test_truncated_checkpoint_is_named(tmp_path):
    path = tmp_path / 'net_g_latest.pth'
    save_atomic({'params': {'w': torch.ones(100)}}, str(path))
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(InputError, match="cannot read checkpoint '.*net_g_latest.pth'"):
        load_safe(str(path))


def test_params_ema_fallback_and_module_prefix(tmp_path):
    net = torch.nn.Linear(2, 2)
    path = tmp_path / 'x.pth'
    torch.save({'params': {f'module.{k}': v for k, v in net.state_dict().items()}}, path)
    fresh = torch.nn.Linear(2, 2)
    load_weights(fresh, str(path), param_key='params_ema')
    assert torch.equal(fresh.weight, net.weight)


def _experiment(tmp_path, iterations):
    """An experiment folder whose training_states hold ``<it>.state`` for each iteration, and the
    options ``--auto_resume`` reads (``network_g``: BasicSR then points the weights at that iteration)."""
    from basicsr_ldt.pipelines.train import load_resume_state  # noqa: F401  (imported here: train pulls in BasicSR)
    states = tmp_path / 'experiments' / 'run' / 'training_states'
    for it in iterations:
        save_atomic({'epoch': it // 100, 'iter': it}, str(states / f'{it}.state'))
    return {'auto_resume': True, 'rank': 0, 'network_g': {'type': 'MSRResNet'}, 'train': {'total_iter': 20000},
            'datasets': {'train': {'cameras': ['Olympus']}},
            'path': {'training_states': str(states), 'models': str(tmp_path / 'experiments' / 'run' / 'models'),
                     'resume_state': None, 'pretrain_network_g': None}}


def test_auto_resume_takes_the_highest_iteration_not_the_last_name(tmp_path):
    """Past 9,999 iterations the newest state's name sorts first as text ('15000' < '5000' < '9999'):
    resuming must still go on from 15000.state and its net_g_15000.pth, not from 9999 or 5000."""
    from basicsr_ldt.pipelines.train import load_resume_state
    opt = _experiment(tmp_path, [1, 2, 5000, 9999, 10000, 15000])
    state = load_resume_state(opt)
    assert state['iter'] == 15000
    assert opt['path']['resume_state'] == str(tmp_path / 'experiments' / 'run' / 'training_states' / '15000.state')
    assert opt['path']['pretrain_network_g'].endswith('net_g_15000.pth')
    # A damaged newest state is moved aside and the run goes on from the next one by number, 10000.
    states = tmp_path / 'experiments' / 'run' / 'training_states'
    (states / '15000.state').write_bytes(b'')
    opt = _experiment(tmp_path, [])
    assert load_resume_state(opt)['iter'] == 10000
    assert opt['path']['resume_state'] == str(states / '10000.state')
    assert {p.name for p in states.iterdir()} == {'1.state', '2.state', '5000.state', '9999.state', '10000.state',
                                                  '15000.state.corrupt'}


@pytest.mark.parametrize('change, message', [
    ({'train': {'total_iter': 4}}, "train.total_iter 4 is below iteration 6, which training state '{state}' reached; "
                                   'raise total_iter, or give the run a new name to train a shorter one'),
    ({'datasets': {'train': {'cameras': ['Pan']}}},
     "datasets.train.cameras ['Pan'] differ from the ['Olympus'] that training state '{state}' was trained on; "
     'restore them, or give the run a new name'),
    ({'datasets': {'train': {}}}, "datasets.train.cameras None differ from the ['Olympus'] that training state "),
])
def test_a_resume_under_a_shorter_run_or_other_cameras_is_refused(tmp_path, change, message):
    """Resumed under a total_iter below the iteration reached, the run saved iteration 6's weights as the
    shorter run's; resumed on other source cameras, it mixed two trainings under one name. Both trained on
    silently. The run's own cameras (as a string too) and a state without the record resume."""
    from basicsr_ldt.pipelines.train import load_resume_state
    opt = _experiment(tmp_path, [])
    states = tmp_path / 'experiments' / 'run' / 'training_states'
    save_atomic({'epoch': 0, 'iter': 6, 'train_cameras': ['Olympus']}, str(states / '6.state'))
    with pytest.raises(InputError) as err:
        load_resume_state({**opt, **change})
    assert str(err.value).startswith(message.format(state=states / '6.state'))
    assert load_resume_state({**opt, 'train': {'total_iter': 6}})['iter'] == 6
    assert load_resume_state({**_experiment(tmp_path, []), 'datasets': {'train': {'cameras': 'Olympus'}}})['iter'] == 6
    save_atomic({'epoch': 0, 'iter': 6}, str(states / '6.state'))   # written before states recorded cameras
    assert load_resume_state({**_experiment(tmp_path, []), 'datasets': {'train': {'cameras': ['Pan']}}})['iter'] == 6


def test_a_damaged_state_is_moved_aside_by_rank_0_only(tmp_path, capsys):
    """Under torchrun every rank picks the same readable state; only rank 0 renames the damaged one
    (two ranks renaming the same file would race) and says so."""
    from basicsr_ldt.pipelines.train import load_resume_state
    opt = _experiment(tmp_path, [2, 4])
    states = tmp_path / 'experiments' / 'run' / 'training_states'
    (states / '4.state').write_bytes(b'')
    opt['rank'] = 1
    assert load_resume_state(opt)['iter'] == 2 and opt['path']['resume_state'] == str(states / '2.state')
    assert {p.name for p in states.iterdir()} == {'2.state', '4.state'} and 'warning' not in capsys.readouterr().err
    opt = _experiment(tmp_path, [])
    assert load_resume_state(opt)['iter'] == 2
    assert {p.name for p in states.iterdir()} == {'2.state', '4.state.corrupt'}
    assert "moved it to '" in capsys.readouterr().err
    # The file moved aside is not a training state any more: the next resume goes straight to 2.state.
    assert load_resume_state(_experiment(tmp_path, []))['iter'] == 2 and capsys.readouterr().err == ''


def test_released_file_with_both_keys_gives_its_ema_weights(tmp_path):
    """``param_key=None`` (fetch_weights, a release used as a checkpoint) takes ``params_ema`` when a
    file holds both, whichever comes first in it; a named key takes that one."""
    torch.manual_seed(0)
    plain, ema = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    path = tmp_path / 'release.pth'
    torch.save({'params': plain.state_dict(), 'params_ema': ema.state_dict()}, path)
    for key, expected in ((None, ema), ('params', plain), ('params_ema', ema)):
        fresh = torch.nn.Linear(2, 2)
        load_weights(fresh, str(path), param_key=key)
        assert torch.equal(fresh.weight, expected.weight), key


def test_non_strict_loading_skips_key_differences_but_never_a_shape(tmp_path):
    """``strict_load_g: false`` loads the keys both sides have and ignores the others; a tensor of
    another shape is still refused with its name."""
    torch.manual_seed(0)
    source = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 2))
    state = dict(source.state_dict())
    del state['1.bias']
    state['2.weight'] = torch.ones(1)
    torch.save({'params': state}, tmp_path / 'partial.pth')
    target = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 2))
    bias_before = target[1].bias.clone()
    with pytest.raises(InputError, match=r'keys 1 missing \(e\.g\. 1\.bias\); 1 unexpected \(e\.g\. 2\.weight\)$'):
        load_weights(target, str(tmp_path / 'partial.pth'))
    loaded = load_weights(target, str(tmp_path / 'partial.pth'), strict=False)      # both said in the logs
    assert (loaded.missing, loaded.unused) == (['1.bias'], ['2.weight'])
    assert describe_unloaded(loaded, target) == ('; 1 of its 4 tensors are not in the file and keep their initial '
                                                 'values (e.g. 1.bias); 1 tensors of the file are not in the network '
                                                 'and were not loaded (e.g. 2.weight)')
    assert torch.equal(target[0].weight, source[0].weight) and torch.equal(target[1].weight, source[1].weight)
    assert torch.equal(target[1].bias, bias_before)
    state['0.weight'] = torch.zeros(4, 2)
    torch.save({'params': state}, tmp_path / 'shape.pth')
    with pytest.raises(InputError, match=r'keys 1 with another shape \(e\.g\. 0\.weight: checkpoint \(4, 2\), '
                                         r'network \(3, 2\)\)$'):
        load_weights(target, str(tmp_path / 'shape.pth'), strict=False)
    torch.save({'params': {'conv.weight': torch.ones(1)}}, tmp_path / 'other.pth')   # another network's weights
    with pytest.raises(InputError, match=r"holds none of network Sequential's 4 tensors \(it has e\.g\. conv\.weight\): "
                                         r'another network'):
        load_weights(target, str(tmp_path / 'other.pth'), strict=False)   # tested the random start as a method
    torch.save({'params': source.state_dict()}, tmp_path / 'whole.pth')
    assert describe_unloaded(load_weights(target, str(tmp_path / 'whole.pth')), target) == ''


def test_weights_holding_nan_or_inf_are_refused_by_name(tmp_path):
    """The file of a run that diverged: tested, it scored a few dB with no complaint; trained from, every step
    was skipped and the run blamed its own training."""
    network = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 2))
    state = dict(network.state_dict())
    state['1.weight'] = state['1.weight'].clone()
    state['1.weight'][0, 0] = float('inf')
    state['0.bias'] = torch.full((3,), float('nan'))
    torch.save({'params': state}, tmp_path / 'diverged.pth')
    with pytest.raises(InputError) as err:
        load_weights(network, str(tmp_path / 'diverged.pth'))
    assert str(err.value) == (f"checkpoint '{tmp_path / 'diverged.pth'}' holds NaN or inf in 2 of its weight tensors "
                              '(e.g. 0.bias): the file of a run that diverged? Every output of the network would be NaN')


def test_a_write_cut_short_leaves_a_hidden_temporary_that_the_next_run_removes(tmp_path, monkeypatch):
    """What a SIGKILL mid-write leaves is ``.<name>.<random>.tmp`` beside the checkpoint (hidden, and
    named after it); the next run deletes exactly such files and keeps the checkpoints."""
    from basicsr_ldt.pipelines.train import remove_partial_writes
    models, states = tmp_path / 'models', tmp_path / 'training_states'
    written, folders = [], []
    real_mkstemp = checkpoint.tempfile.mkstemp

    def mkstemp_and_note(*args, **kwargs):
        handle, path = real_mkstemp(*args, **kwargs)
        written.append(os.path.basename(path))
        folders.append(os.path.dirname(path))
        return handle, path

    monkeypatch.setattr(checkpoint.tempfile, 'mkstemp', mkstemp_and_note)
    save_atomic({'params': {'w': torch.ones(2)}}, str(models / 'net_g_10.pth'))
    save_atomic({'epoch': 0, 'iter': 10}, str(states / '10.state'))
    monkeypatch.undo()
    assert written[0].startswith('.net_g_10.pth.') and written[0].endswith('.tmp')
    assert written[1].startswith('.10.state.') and written[1].endswith('.tmp')
    assert folders == [str(models), str(states)]       # beside the checkpoint: the rename stays on one disk
    assert load_safe(str(models / 'net_g_10.pth'))['params']['w'].tolist() == [1.0, 1.0]
    assert load_safe(str(states / '10.state')) == {'epoch': 0, 'iter': 10}
    (models / written[0]).write_bytes(b'half')          # as a killed run leaves them
    (states / written[1]).write_bytes(b'half')
    (models / 'notes.tmp').write_text('mine')           # not ours: not hidden
    remove_partial_writes({'path': {'models': str(models), 'training_states': str(states)}})
    assert sorted(os.listdir(models)) == ['net_g_10.pth', 'notes.tmp'] and os.listdir(states) == ['10.state']


def test_which_weights_a_checkpoint_gives(tmp_path):
    """By default ``params``; a named key that is absent falls back to the other one with a warning; a
    bare state dict loads as is; anything else is refused naming what the file holds, and a missing
    file that is no release gets no fetch hint."""
    torch.manual_seed(0)
    plain, ema = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    torch.save({'params': plain.state_dict(), 'params_ema': ema.state_dict()}, tmp_path / 'both.pth')
    torch.save({'params_ema': ema.state_dict()}, tmp_path / 'ema.pth')
    torch.save(plain.state_dict(), tmp_path / 'bare.pth')
    torch.save({'model': plain.state_dict(), 'optimizer': {}}, tmp_path / 'other.pth')
    torch.save(torch.ones(2), tmp_path / 'tensor.pth')
    fresh = torch.nn.Linear(2, 2)
    load_weights(fresh, str(tmp_path / 'both.pth'))
    assert torch.equal(fresh.weight, plain.weight)
    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger('basicsr').addHandler(handler)      # (BasicSR's logger may not propagate)
    try:
        load_weights(fresh, str(tmp_path / 'ema.pth'), param_key='params')
    finally:
        logging.getLogger('basicsr').removeHandler(handler)
    assert torch.equal(fresh.weight, ema.weight)
    assert warnings == [f"checkpoint '{tmp_path / 'ema.pth'}' has no 'params' weights: loading 'params_ema'"]
    load_weights(fresh, str(tmp_path / 'bare.pth'))
    assert torch.equal(fresh.weight, plain.weight)
    # A key named for this very file (a test.py entry's param_key) does not fall back: a row labelled
    # EMA showed the other weights with only a warning in the log.
    with pytest.raises(InputError) as err:
        load_weights(fresh, str(tmp_path / 'ema.pth'), param_key='params', fallback=False)
    assert str(err.value) == f"checkpoint '{tmp_path / 'ema.pth'}' has no 'params' weights (top-level keys: ['params_ema'])"
    load_weights(fresh, str(tmp_path / 'bare.pth'), param_key='params_ema', fallback=False)   # a bare dict is the weights
    for name, key, holds in (('other', 'params', "['model', 'optimizer']"), ('other', None, "['model', 'optimizer']"),
                             ('tensor', 'params', 'Tensor')):
        with pytest.raises(InputError) as err:
            load_weights(fresh, str(tmp_path / f'{name}.pth'), param_key=key)
        assert str(err.value) == f"checkpoint '{tmp_path / name}.pth' has no 'params' weights (top-level keys: {holds})"
    with pytest.raises(InputError) as err:
        load_weights(fresh, str(tmp_path / 'runs' / 'net_g_latest.pth'))
    assert str(err.value) == f"checkpoint '{tmp_path / 'runs' / 'net_g_latest.pth'}' does not exist"


def test_explicit_resume_state_and_states_that_cannot_be_resumed(tmp_path, capsys):
    """``path.resume_state`` (no ``--auto_resume``) resumes from exactly that file, even with newer ones
    there; files in training_states that are not ``<iter>.state`` are ignored; when no state loads the
    newest one's error names how many older ones failed too."""
    from basicsr_ldt.pipelines.train import load_resume_state
    opt = _experiment(tmp_path, [5000, 15000])
    states = tmp_path / 'experiments' / 'run' / 'training_states'
    (states / 'latest.state').write_bytes(b'not ours')
    opt.update(auto_resume=False)
    assert load_resume_state(opt) is None and opt['path']['resume_state'] is None
    opt['path']['resume_state'] = str(states / '5000.state')
    assert load_resume_state(opt)['iter'] == 5000 and opt['path']['pretrain_network_g'].endswith('net_g_5000.pth')
    other = tmp_path / 'experiments' / 'other' / 'training_states'   # its weights would be read from run/models
    save_atomic({'epoch': 0, 'iter': 4}, str(other / '4.state'))
    opt['path']['resume_state'] = str(other / '4.state')
    with pytest.raises(InputError) as err:
        load_resume_state(opt)
    assert str(err.value) == (f"path.resume_state '{other / '4.state'}' is not in this experiment's training states "
                              f"({states}): a resumed run reads its weights from {tmp_path / 'experiments' / 'run' / 'models'}; "
                              "set name to the state's experiment")
    opt['path']['resume_state'] = str(states / 'latest.state')
    with pytest.raises(InputError, match=r"^cannot read training state '.*latest\.state': damaged or not a file saved "
                                         r'by torch\.save \(Unsupported operand 110\)$'):   # 'n', the file's first byte
        load_resume_state(opt)
    torch.save({'params': {}}, states / 'weights.state')
    opt['path']['resume_state'] = str(states / 'weights.state')
    with pytest.raises(InputError, match=r"weights\.state' has no epoch/iter: not a BasicSR training state$"):
        load_resume_state(opt)
    assert load_resume_state(_experiment(tmp_path, []))['iter'] == 15000     # latest/weights.state ignored
    (states / '15000.state').write_bytes(b'')
    (states / '5000.state').write_bytes(b'')
    with pytest.raises(InputError) as err:
        load_resume_state(_experiment(tmp_path, []))
    assert str(err.value).startswith(f"cannot read training state '{states / '15000.state'}'")
    assert str(err.value).endswith(' (nor any of the 1 older one(s))')
    assert 'warning' not in capsys.readouterr().err


def test_damaged_files_and_folders_are_named_as_such_not_as_code(tmp_path):
    """A checkpoint cut short, random bytes or a folder given as one each get one line that says what is wrong
    with the file; only a pickle of Python objects is refused as code, naming the object, without torch's
    advice to load it unsafely."""
    from basicsr_ldt.weights.checkpoint import load_safe
    torch.save({'params': {'w': torch.zeros(4096)}}, tmp_path / 'whole.pth')
    (tmp_path / 'cut.pth').write_bytes((tmp_path / 'whole.pth').read_bytes()[:2000])
    (tmp_path / 'noise.pth').write_bytes(bytes(range(200, 256)) * 20)
    torch.save({'params': {}, 'opt': argparse.Namespace(lr=1)}, tmp_path / 'objects.pth')
    (tmp_path / 'url.pth').write_text('https://huggingface.co/some/weights.pth\n')   # a link saved as the file
    (tmp_path / 'text.pth').write_text('about this file\n')
    cases = {'cut.pth': r"cannot read checkpoint '.*cut\.pth': damaged or truncated \(.+\)$",
             'noise.pth': r"cannot read checkpoint '.*noise\.pth': damaged or not a file saved by torch\.save \(.+\)$",
             'url.pth': r"cannot read checkpoint '.*url\.pth': damaged or not a file saved by torch\.save \(the "
                        r'unpickler met KeyError: 116\)$',
             'text.pth': r"cannot read checkpoint '.*text\.pth': damaged or not a file saved by torch\.save \(the "
                         r'unpickler met IndexError: pop from empty list\)$',
             'objects.pth': r"refusing to load checkpoint '.*objects\.pth': it contains pickled objects other than "
                            r'tensors and plain containers \(argparse\.Namespace\), and loading them could run '
                            r'arbitrary code$',
             '': r"checkpoint '.*' is a folder; expected a file saved by torch\.save \(\.pth, \.state\)$"}
    for name, message in cases.items():
        with pytest.raises(InputError, match='^' + message) as err:
            load_safe(str(tmp_path / name))
        assert 'weights_only' not in str(err.value) and '\n' not in str(err.value)
        assert isinstance(err.value, UnreadableCheckpoint) is name.startswith(('cut', 'noise', 'url', 'text'))   # moved aside on resume
