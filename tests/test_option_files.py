"""Option files that cannot mislead (issue 56), through the real entry points: an empty file, a file
without num_gpu or datasets, ``vall:`` for ``val:``, an ``ldt:`` block on an FT file and a Python tag
each stop with one line (or, for num_gpu, get BasicSR's default and say so), and leave no
experiment or results folder behind and no existing one archived."""
import copy
import re

import pytest
import torch
import yaml

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.option_file import force_options, load_option_file, parse_yaml
from basicsr_ldt.common.schema import check_network, check_options
from conftest import REPO, run_entry
from test_cli import NETWORK, dataset, train_options, write

DEMO = REPO / 'options' / 'demo'
#: A shell command an option file must never run: it would create this file.
MARKER = 'pwned.txt'


def one_line_failure(project, result, name, kind='experiments'):
    """The last stderr line; exit status 2, no traceback, nothing of ``name`` written or moved aside."""
    assert result.returncode == 2, result.stderr[-2000:]
    assert 'Traceback' not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith('error: '), result.stderr
    for folder in ('experiments', 'results', 'tb_logger'):
        assert not (project / folder / name).exists(), f'{folder}/{name} was written'
        assert not list((project / folder).glob(f'{name}_archived_*')), f'{folder}/{name} was archived'
    return line


def bicubic_test_options(data, name):
    return {'name': name, 'scale': 4, 'num_gpu': 0, 'path': {}, 'checkpoints': [{'bicubic': True}],
            'datasets': {'test_1': dataset(data, 'Test', ['Sony'])}}


@pytest.mark.parametrize('script', ['Train_pip.py', 'test.py'])
def test_empty_file_is_one_line(project, script):
    (project / 'empty.yml').write_text('# nothing but a comment\n')
    result = run_entry(project, script, '-opt', 'empty.yml', check=False)
    line = one_line_failure(project, result, 'empty')
    assert line == ("error: option file 'empty.yml' is empty: expected a YAML mapping of options (name, model_type, "
                    'datasets, network_g, ...)')


@pytest.mark.parametrize('script', ['Train_pip.py', 'test.py'])
def test_python_tag_runs_nothing_and_names_the_file_and_line(project, demo_data, script):
    opt = train_options(demo_data, 'tagged') if script == 'Train_pip.py' else bicubic_test_options(demo_data, 'tagged')
    text = yaml.safe_dump(opt, sort_keys=False) + f'extra: !!python/object/apply:os.system ["touch {MARKER}"]\n'
    (project / 'tagged.yml').write_text(text)
    line_number = text.count('\n')
    result = run_entry(project, script, '-opt', 'tagged.yml', check=False)
    line = one_line_failure(project, result, 'tagged')
    assert not (project / MARKER).exists(), 'the option file ran a command'
    assert line == (f"error: option file 'tagged.yml', line {line_number}: tag '!!python/object/apply:os.system' would "
                    "build a Python object (BasicSR's loader runs it); option files hold plain YAML values only "
                    '(mappings, lists, strings, numbers, true/false, null)')


def test_python_tag_in_inference_and_study_files_runs_nothing(project, tmp_path):
    import numpy as np
    from PIL import Image
    (project / 'in').mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(project / 'in' / 'a.png')
    (project / 'net.yml').write_text(f'network_g: !!python/object/apply:os.system ["touch {MARKER}"]\n')
    result = run_entry(project, str(REPO / 'inference.py'), '--input', 'in', '--output', 'out', '--checkpoint',
                       'x.pth', '--opt', 'net.yml', check=False)
    assert result.returncode == 2 and not (project / MARKER).exists() and not (project / 'out').exists()
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: option file 'net.yml', line 1: tag '!!python/object/apply:os.system' would build a Python object")
    from basicsr_ldt.study import plan
    (tmp_path / 'study.yml').write_text(f'name: s\ntrain: !!python/object/apply:os.system ["touch {MARKER}"]\n')
    with pytest.raises(InputError, match=r"^study file '.*study.yml', line 2: tag '!!python/object/apply:os.system'"):
        plan.load_study(str(tmp_path / 'study.yml'), str(tmp_path))
    assert not (tmp_path / MARKER).exists()


def test_missing_datasets_is_one_line_from_both_commands(project, demo_data):
    opt = train_options(demo_data, 'nodata')
    del opt['datasets']
    (project / 'experiments' / 'nodata').mkdir(parents=True)   # an earlier run: neither archived nor touched
    (project / 'experiments' / 'nodata' / 'keep').write_text('x')
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'nodata.yml', opt), check=False)
    assert result.returncode == 2 and 'Traceback' not in result.stderr
    assert (project / 'experiments' / 'nodata' / 'keep').read_text() == 'x'
    assert [p.name for p in (project / 'experiments').iterdir()] == ['nodata']
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: option file '{project / 'nodata.yml'}': datasets: required, missing (training (Train_pip.py) "
        "needs a 'datasets' mapping with a 'train' section)")
    opt = bicubic_test_options(demo_data, 'nodata_test')
    del opt['datasets']
    result = run_entry(project, 'test.py', '-opt', write(project / 'nodata_test.yml', opt), check=False)
    assert one_line_failure(project, result, 'nodata_test').endswith(
        "datasets: required, missing (test.py needs a 'datasets' mapping of test sets)")


def test_without_num_gpu_and_path_the_defaults_are_used_and_logged(project, demo_data):
    """BasicSR reads ``opt['num_gpu']`` and ``opt['path']`` unconditionally (a KeyError traceback);
    its own option files write ``num_gpu: auto``, which is what a file without the key now gets."""
    opt = train_options(demo_data, 'nogpu', total_iter=1)
    del opt['num_gpu'], opt['path']
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'nogpu.yml', opt))
    log = next((project / 'experiments' / 'nogpu').glob('train_nogpu_*.log')).read_text()
    assert 'Defaults for keys the option file leaves out: num_gpu: auto, path: {}' in log
    assert (project / 'experiments' / 'nogpu' / 'models' / 'net_g_latest.pth').is_file()
    opt = bicubic_test_options(demo_data, 'nogpu_test')
    del opt['num_gpu'], opt['path']
    run_entry(project, 'test.py', '-opt', write(project / 'nogpu_test.yml', opt))
    log = next((project / 'results' / 'nogpu_test').glob('test_nogpu_test_*.log')).read_text()
    assert 'Defaults for keys the option file leaves out: num_gpu: auto, path: {}' in log


def _demo_variant(project, name, change):
    """A shipped demo option file with one slip written into its text (comments kept)."""
    text = (DEMO / name).read_text()
    slipped = change(text)
    assert slipped != text
    (project / name).write_text(slipped)
    return yaml.safe_load(slipped)['name']


@pytest.mark.parametrize('name, change, message', [
    ('train_demo_ldt.yml', lambda t: t.replace('\nval:\n', '\nvall:\n'),
     "unknown key 'vall' (did you mean 'val'?); the top level takes: datasets, dist_params, ldt, logger, "),
    ('train_demo_ft.yml', lambda t: t + '\nldt: {method: ldt, ratio_u: 0.4}\n',
     'the ldt: block needs a model type of this project that reads it (LDTSRModel, CorGradSRModel); model_type '
     'FTSRModel ignores it: set model_type: LDTSRModel, or remove it'),
    ('train_demo_ft.yml', lambda t: t + '\nldt: {method: corgrad}\n',
     'the ldt: block needs a model type of this project that reads it (LDTSRModel, CorGradSRModel); model_type '
     'FTSRModel ignores it: set model_type: CorGradSRModel, or remove it'),
    ('train_demo_ft.yml', lambda t: t + '\ncorgrad: {slices: 5}\n',
     "unknown key 'corgrad' (CorGrad's options go in the ldt: block with method: corgrad"),
    ('train_demo_corgrad.yml',
     lambda t: t.replace('model_type: LDTSRModel', 'model_type: CorGradSRModel').replace('method: corgrad', 'method: ldt'),
     "ldt.method 'ldt' is not CorGrad, and model_type CorGradSRModel trains CorGrad whatever the block says: set "
     'model_type: LDTSRModel (or ldt.method: corgrad)'),
], ids=['vall', 'ldt_on_ft', 'corgrad_method_on_ft', 'corgrad_block', 'ldt_method_on_corgrad'])
def test_slips_in_shipped_demo_files_are_one_line(project, name, change, message):
    experiment = _demo_variant(project, name, change)
    result = run_entry(project, 'Train_pip.py', '-opt', name, check=False)
    line = one_line_failure(project, result, experiment)
    assert line.startswith(f"error: option file '{name}': {message}"), line


# ------------------------------------------------------------------------------ the schema, in-process
def _train(data, **changes):
    opt = copy.deepcopy(train_options(data, 'x'))   # train_options shares test_cli's NETWORK dict
    for path, value in changes.items():
        *parents, key = path.split('.')
        section = opt
        for part in parents:
            section = section.setdefault(part, {})
        if value is None:
            section.pop(key, None)
        else:
            section[key] = value
    return opt


@pytest.mark.parametrize('changes, message', [
    ({'val.metrics': {'psnr': {'type': 'calculate_psnr', 'crop_bordr': 4}}},
     "unknown key 'val.metrics.psnr.crop_bordr' (did you mean 'crop_border'?); calculate_psnr takes: type, "
     'crop_border, input_order, test_y_channel, better'),
    ({'val.metrics': {'psnr': {'type': 'calculate_psnr'}}}, 'val.metrics.psnr.crop_border: required by calculate_psnr, missing'),
    ({'network_g.num_feet': 8}, "unknown key 'network_g.num_feet' (did you mean 'num_feat'?); network_g type MSRResNet "
                                'takes: type, num_in_ch, num_out_ch, num_feat, num_block, upscale'),
    ({'train.optim_g.learning_rate': 1e-3}, "unknown key 'train.optim_g.learning_rate'; Adam takes: type, lr, "),
    ({'train.optim_g.type': 'SGD'}, "train.optim_g.type: expected 'Adam' (the optimizer BasicSR 1.4.2 builds), got 'SGD'"),
    ({'train.scheduler.milestone': [2]}, "unknown key 'train.scheduler.milestone' (did you mean 'milestones'?)"),
    ({'train.pixel_opt.weight': 1}, "unknown key 'train.pixel_opt.weight' (did you mean 'loss_weight'?)"),
    ({'train.pixel_opt': None}, 'train.pixel_opt: required, missing (FTSRModel needs a loss'),
    ({'train.total_iters': 5}, "unknown key 'train.total_iters' (did you mean 'total_iter'?)"),
    ({'logger.print_freq': None}, 'logger.print_freq: required, missing'),
    ({'val.val_freq': None}, 'val.val_freq: required, missing'),
    ({'val.suffix': 'x'}, "unknown key 'val.suffix'; val takes: "),
    ({'path.resume': 'x'}, "unknown key 'path.resume' (did you mean 'resume_state'?)"),
    ({'path.models': 'x'}, 'path.models: set by the entry point'),
    ({'rank': 0}, 'rank: set by the entry point'),
    ({'dist_params.backnd': 'gloo'}, "unknown key 'dist_params.backnd' (did you mean 'backend'?)"),
    ({'test': {'save_img': True}}, 'test: read by test.py only, not by training (Train_pip.py); remove it'),
    ({'prefetch_mode': 'cpu'}, "unknown key 'prefetch_mode' (a key of datasets.train)"),
    ({'train.prefetch_mode': 'cpu'}, "unknown key 'train.prefetch_mode' (a key of datasets.train)"),
    ({'val.print_freq': 1}, "unknown key 'val.print_freq' (a key of logger)"),
    ({'datasets.train.batch_size_per_gpu': None}, 'datasets.train.batch_size_per_gpu: required, missing'),
    ({'datasets.val_targets.batch_size_per_gpu': 4},
     "unknown key 'datasets.val_targets.batch_size_per_gpu' (read for training sections only)"),
    ({'datasets.val_targets.phase': 'val'}, 'datasets.val_targets.phase: set by the entry point'),
    ({'datasets.test_1': {'type': 'DRealSRCameraDataset'}}, "datasets.test_1: training (Train_pip.py) accepts 'train' "
                                                            "and 'val*' sections"),
    ({'datasets.train.type': 'PairedImageDataset'}, "datasets.train.type: 'PairedImageDataset' is registered, but its "
                                                    'keys are not listed'),
    ({'model_type': 'SRModel', 'val.tile_mode': 'official'},
     'val.tile_mode needs a model type of this project that reads it (FTSRModel, LDTSRModel, CorGradSRModel); '
     'model_type SRModel ignores it: set model_type: FTSRModel, or remove it'),
    ({'model_type': 'LDTSRModel', 'train.perceptual_opt': {'type': 'L1Loss'}},
     'train.perceptual_opt needs a model type that reads it'),
    ({'model_type': 'VideoBaseModel'}, "model_type 'VideoBaseModel' is registered, but the training pipeline"),
    ({'model_type': 'FTModel'}, "model_type 'FTModel' is not registered (did you mean 'FTSRModel'?)"),
    ({'num_gpu': 'two'}, "num_gpu: expected 'auto' or an integer >= 0, got 'two'"),
    ({'logger.wandb': {'project': 'p'}}, 'logger.wandb.project: needs logger.use_tb_logger: true'),
    ({'network_g.upscale': 2}, 'network_g.upscale: 2, but scale is 4; the data, crops and metrics follow scale, the '
                               'network upscales by its own factor: make them equal'),   # a shape error at iteration 1
])
def test_every_section_is_checked_with_one_line_naming_the_key(demo_data, changes, message):
    with pytest.raises(InputError) as caught:
        check_options(_train(demo_data, **changes), 'train', "option file 'x.yml'")
    assert str(caught.value).startswith(f"option file 'x.yml': {message}"), str(caught.value)
    assert '\n' not in str(caught.value)


@pytest.mark.parametrize('changes, message', [
    ({'model_type': 'FTSRModel'}, 'model_type: read by training (Train_pip.py) only, not by test.py'),
    ({'ldt': {'ratio_u': 0.4}}, 'ldt: read by training (Train_pip.py) only'),
    ({'path': {'resume_state': 'x'}}, 'path.resume_state: read by training (Train_pip.py) only'),
    ({'datasets': {'train': dataset(REPO, 'Test', ['Sony'])}}, "datasets.train: test.py accepts 'test*' and 'val*'"),
    ({'checkpoints': [{'path': 'x.pth'}]}, 'network_g: required, missing'),
    ({'tset': {}}, "unknown key 'tset' (did you mean 'test'?)"),
])
def test_test_files_are_checked_for_test_py(demo_data, changes, message):
    opt = {**bicubic_test_options(demo_data, 't'), **changes}
    with pytest.raises(InputError, match='^' + re.escape(f't.yml: {message}')):
        check_options(opt, 'test', 't.yml')


def test_a_file_with_only_bicubic_entries_needs_no_network(demo_data):
    assert check_options(bicubic_test_options(demo_data, 't'), 'test', 't.yml') == []
    opt = {**bicubic_test_options(demo_data, 't'), 'network_g': dict(NETWORK)}
    assert check_options(opt, 'test', 't.yml') == []


def test_keys_given_twice_and_broken_yaml_are_one_line(tmp_path):
    with pytest.raises(InputError, match=r"^o.yml, line 4: key 'val' is given twice in the same mapping$"):
        parse_yaml('name: a\nval: {val_freq: 1}\ntrain: {}\nval: {val_freq: 2}\n', 'o.yml')
    with pytest.raises(InputError, match=r'^o.yml, line 2: ') as caught:
        parse_yaml('name: a\n  b: [1\n', 'o.yml')
    assert '\n' not in str(caught.value)
    assert parse_yaml('a: &x {b: 1}\nc:\n  <<: *x\n  d: !!float 1e-4\n', 'o.yml') == {'a': {'b': 1}, 'c': {'b': 1, 'd': 1e-4}}
    assert list(parse_yaml('z: 1\na: 2\nm: 3\n', 'o.yml')) == ['z', 'a', 'm']   # the file's order, as BasicSR
    (tmp_path / 'l.yml').write_text('[1, 2]\n')
    with pytest.raises(InputError, match=r"^option file '.*l.yml' holds a list, expected a YAML mapping"):
        load_option_file(str(tmp_path / 'l.yml'))
    with pytest.raises(InputError, match=r"^option file 'nope.yml' does not exist$"):
        load_option_file('nope.yml')


def test_network_keys_are_the_constructors_arguments():
    """MambaIR and HAT take ``**kwargs`` and drop what they do not name: a misspelt argument would
    build the default network without a word, so only named arguments count."""
    check_network({'type': 'MambaIR', 'embed_dim': 30, 'depths': [1]})
    with pytest.raises(InputError, match=r"^o: unknown key 'network_g.embed_dims' \(did you mean 'embed_dim'\?\)"):
        check_network({'type': 'MambaIR', 'embed_dims': 30}, where='o')
    with pytest.raises(InputError, match=r'^o: network_g.dim: required by network_g type SAFMN, missing$'):
        check_network({'type': 'SAFMN', 'n_blocks': 1}, where='o')
    with pytest.raises(InputError, match=r"^o: network_g.type: 'SAFMNN' is not registered \(did you mean 'SAFMN'\?\)"):
        check_network({'type': 'SAFMNN'}, where='o')


def test_inference_opt_checks_the_network_section(tmp_path):
    from basicsr_ldt.inference.api import network_options
    (tmp_path / 'n.yml').write_text(yaml.safe_dump({'network_g': {**NETWORK, 'num_feet': 4}}))
    with pytest.raises(InputError, match=r"^option file '.*n.yml': unknown key 'network_g.num_feet'"):
        network_options(opt=str(tmp_path / 'n.yml'))


def test_study_runs_are_checked_against_the_schema(tmp_path, demo_data):
    """A method that adds an ldt: block without the model type that reads it stops the study before
    anything runs (the merged options of each run go through the same check)."""
    from basicsr_ldt.study import plan
    base = train_options(demo_data, total_iter=6, val=None)
    test = {**bicubic_test_options(demo_data, 'test'), 'network_g': dict(NETWORK)}
    study = {'name': 's', 'train': write(tmp_path / 'b.yml', base), 'test': write(tmp_path / 't.yml', test),
             'seeds': [0], 'methods': {'FT': {}, 'LDT?': {'ldt': {'method': 'ldt', 'profile_iters': 2}}}}
    with pytest.raises(InputError, match=r"^run 'LDT-_seed0': the ldt: block needs a model type .*set model_type: "
                                         'LDTSRModel, or remove it$'):
        plan.load_study(write(tmp_path / 's.yml', study), str(tmp_path))
    assert not (tmp_path / 'experiments').exists()


def test_force_yml_sets_plain_values_without_running_code():
    """BasicSR applies ``--force_yml`` with ``exec`` and reads ``[...]`` values with ``eval``; here the
    same values are set as data (and then checked with the rest of the file)."""
    opt = {'train': {'scheduler': {'milestones': [1]}, 'total_iter': 5}, 'val': {'save_img': True}}
    force_options(opt, ['train:total_iter=10', 'train:scheduler:milestones=[2, 4]', 'val:save_img=false',
                        'train:ema_decay=!!float 0.9', 'name=run', 'train:warmup_iter=-1', 'train:x=-0.5',
                        'train:y=1.2.3', 'train:z=-', 'train:v=v5', 'train:a=~', 'train:b=None', 'train:c=TRUE'])
    assert opt == {'train': {'scheduler': {'milestones': [2, 4]}, 'total_iter': 10, 'ema_decay': 0.9,
                             'warmup_iter': -1, 'x': -0.5, 'y': '1.2.3', 'z': '-', 'v': 'v5', 'a': None,
                             'b': None, 'c': True},   # -1 was the text '-1'
                   'val': {'save_img': False}, 'name': 'run'}
    with pytest.raises(InputError, match=r"^--force_yml: '\[__import__\(\"os\"\)\]' is not a list of plain values$"):
        force_options(opt, ['train:x=[__import__("os")]'])
    with pytest.raises(InputError, match=r"^--force_yml logger:print_freq=1: the option file has no section 'logger'$"):
        force_options(opt, ['logger:print_freq=1'])


def test_a_run_refused_after_its_folders_were_made_leaves_no_experiments_folder(project, demo_data):
    """On a first run there is no ``experiments/``: BasicSR makes it with the run's folder. A value refused
    once the folders exist (``train.cuda_graph: true`` on the CPU, checked as the model is built) rolls
    back both, so the project looks as before the command."""
    opt = train_options(demo_data, 'graphed')
    opt['train']['cuda_graph'] = True
    assert not (project / 'experiments').exists()
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'graphed.yml', opt), check=False)
    assert one_line_failure(project, result, 'graphed').startswith('error: train.cuda_graph: true, but CUDA graphs '
                                                                   'need a CUDA device, this run is on cpu')
    assert not (project / 'experiments').exists() and not (project / 'tb_logger').exists()
    (project / 'experiments' / 'other').mkdir(parents=True)   # someone else's run: experiments/ stays
    result = run_entry(project, 'Train_pip.py', '-opt', 'graphed.yml', check=False)
    assert result.returncode == 2 and [p.name for p in (project / 'experiments').iterdir()] == ['other']


def test_more_gpus_than_the_machine_has_is_one_line(project, demo_data):
    """``num_gpu: 2`` where torch sees no GPU (the tests hide CUDA): BasicSR would move the network to
    CUDA and fail in the model's setup with a driver traceback, after making the run's folders."""
    opt = train_options(demo_data, 'twogpus', num_gpu=2)
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'twogpus.yml', opt), check=False)
    assert one_line_failure(project, result, 'twogpus') == (
        "error: num_gpu: 2, but torch sees no CUDA device here; expected at most 0 ('auto' takes what there is: "
        'the CPU)')
    assert not (project / 'experiments').exists()
    test_opt = {'name': 'onegpu', 'scale': 4, 'num_gpu': 1, 'network_g': opt['network_g'], 'path': {},
                'datasets': {'test_1': opt['datasets']['val_targets']}, 'checkpoints': [{'bicubic': True}]}
    result = run_entry(project, 'test.py', '-opt', write(project / 'onegpu.yml', test_opt), check=False)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (   # it tested on the CPU silently
        "error: num_gpu: 1, but torch sees no CUDA device here; expected at most 0 ('auto' takes what there is: the "
        'CPU)')
    assert not (project / 'results').exists()


def test_launcher_pytorch_outside_torchrun_is_one_line(project, demo_data):
    """``--launcher pytorch`` reads the rank and world size torchrun sets; started by hand, torch's own
    error is a traceback about an environment variable."""
    opt = train_options(demo_data, 'launched')
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'launched.yml', opt), '--launcher', 'pytorch',
                       check=False)
    assert one_line_failure(project, result, 'launched') == (
        'error: --launcher pytorch: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set, as torchrun sets them; '
        'start the run with torchrun --nproc_per_node=N ... --launcher pytorch, or drop --launcher')


#: (where in the options, value, the error's start): values a model checks without a network.
MODEL_VALUE_SLIPS = [
    (('train', 'cuda_graph'), 'yes please', "train.cuda_graph: expected one of 'auto', true, false, got 'yes please'"),
    (('train', 'cuda_graph'), True, 'train.cuda_graph: true, but CUDA graphs need a CUDA device, this run is on cpu'),
    (('train', 'compile'), 'on', "train.compile: expected one of 'auto', true, false, got 'on'"),
    (('train', 'compile'), True, "train.compile: true, but network_g type 'MSRResNet' has no blocks to compile"),
    (('train', 'amp'), 'fp16', 'train.amp: fp16'),
    (('train', 'optim_g', 'fused'), 'no', "train.optim_g.fused: expected true, false or no value"),
    (('train', 'max_bad_steps'), 0, 'train.max_bad_steps: expected an integer >= 1, got 0'),
    (('train', 'ema_decay'), '0.99', "train.ema_decay: expected a number in [0, 1) (0: no weight EMA), got '0.99'"),
    (('train', 'ema_decay'), 2.0, 'train.ema_decay: expected a number in [0, 1) (0: no weight EMA), got 2.0'),
    (('train', 'l2_sp_weight'), -1, 'train.l2_sp_weight: '),
    (('val', 'tile_overlap'), -1, 'val.tile_overlap: expected an integer >= 0, got -1'),
    (('ldt', 'ratio_u'), 1.5, 'ldt.ratio_u: expected a number in (0, 1), got 1.5'),
    (('ldt', 'slices'), 1, 'ldt.slices: expected'),
    (('train', 'scheduler', 'milestones'), ['1e5'], 'train.scheduler.milestones: expected a non-empty list'),
]


def slipped_options(data, where, value, model_type=None):
    """Valid training options with ``value`` at ``where``; an ``ldt`` key makes them LDT's (or, for CorGrad's
    ``slices``, CorGrad's through ``ldt.method``, or ``model_type``)."""
    opt = train_options(data, 'slip')
    if where[0] == 'ldt':
        opt['model_type'] = model_type or 'LDTSRModel'
        opt['ldt'] = {'method': 'corgrad'} if where[1] == 'slices' else {'profile_iters': 2, 'ema_every': 1}
        if opt['model_type'] == 'CorGradSRModel':
            del opt['ldt']['method']
    section = opt
    for key in where[:-1]:
        section = section.setdefault(key, {})
    section[where[-1]] = value
    return opt


@pytest.mark.parametrize('where, value, message', MODEL_VALUE_SLIPS)
def test_a_models_bad_value_is_the_only_line_printed(project, demo_data, where, value, message):
    """The values a model checks as it is built (``basicsr_ldt.models.option_values``) are checked before the
    run makes a folder, writes its log or prints BasicSR's banner: the error is all the output."""
    opt = slipped_options(demo_data, where, value)
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'slip.yml', opt), check=False)
    assert one_line_failure(project, result, 'slip').startswith(f'error: {message}')
    assert (result.stdout + result.stderr).strip().count('\n') == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert not (project / 'experiments').exists()


@pytest.mark.parametrize('where, value, message', MODEL_VALUE_SLIPS)
def test_each_model_value_slip_is_caught_by_the_early_check_itself(tmp_path, where, value, message):
    """The same slips through ``check_option_values`` in-process, for every project model type that reads
    the key (CorGrad's block also as ``model_type: CorGradSRModel``); the options without the key pass, with
    ``num_gpu`` absent read as BasicSR reads it (the CPU)."""
    from basicsr_ldt.models.option_values import check_option_values
    for model_type in (None, 'CorGradSRModel') if where[1] == 'slices' else (None,):
        opt = slipped_options(tmp_path, where, value, model_type)
        del opt['num_gpu']
        with pytest.raises(InputError, match='^' + re.escape(message)):
            check_option_values(opt)
        section = opt
        for key in where[:-1]:
            section = section[key]
        del section[where[-1]]   # the key left out: its default
        check_option_values(opt)


#: (where in the options, value, the error): values of keys BasicSR reads without a check.
BASICSR_VALUE_SLIPS = [
    (('train', 'scheduler', 'milestones'), ['1e5'], "train.scheduler.milestones: expected a non-empty list, each a "
     "whole number >= 1, got ['1e5']"),   # the learning rate silently never decayed
    (('train', 'scheduler', 'gamma'), '5e-1', "train.scheduler.gamma: expected a number in (0, 1], got '5e-1' (text: "
     'YAML reads numbers like 1e-4 without a dot as strings; write 1.0e-4 or !!float 1e-4)'),
    (('train', 'optim_g', 'lr'), '2e-4', "train.optim_g.lr: expected a number in (0, inf), got '2e-4'"),
    (('train', 'scheduler', 'gamma'), 2.0, 'train.scheduler.gamma: expected a number in (0, 1], got 2.0'),   # grew
    (('train', 'optim_g', 'betas'), [0.9], 'train.optim_g.betas: expected a list of 2 items, each a number in [0, 1), '
     'got [0.9]'),                                              # a torch IndexError once the run had started
    (('train', 'pixel_opt', 'loss_weight'), 0, 'train.pixel_opt.loss_weight: expected a number in (0, inf), got 0'),
    (('train', 'pixel_opt', 'loss_weight'), -1.0, 'train.pixel_opt.loss_weight: expected a number in (0, inf)'),
    (('train', 'pixel_opt', 'reduction'), 'none', "train.pixel_opt.reduction: expected one of 'mean', 'sum', got 'none'"),
    (('train', 'scheduler', 'milestones'), [800], 'train.scheduler.milestones: 800 lies beyond train.total_iter (6), '
     'so the rate never changes there; expected milestones <= total_iter (for a constant rate: milestones: [6])'),
    (('train', 'warmup_iter'), 6, 'train.warmup_iter: 6 is not below train.total_iter (6), so the rate never reaches '
     'optim_g.lr; expected fewer warm-up iterations (or -1: none)'),
    (('train', 'total_iter'), 2.5, 'train.total_iter: expected a whole number >= 1, got 2.5'),
    (('logger', 'print_freq'), 0, 'logger.print_freq: expected a whole number >= 1, got 0'),
    (('logger', 'save_checkpoint_freq'), -1, 'logger.save_checkpoint_freq: expected a whole number >= 1, got -1'),
    (('datasets', 'train', 'batch_size_per_gpu'), 0, 'datasets.train.batch_size_per_gpu: expected an integer >= 1, '
     'got 0'),
    (('datasets', 'train', 'num_worker_per_gpu'), -1, 'datasets.train.num_worker_per_gpu: expected an integer >= 0'),
    (('datasets', 'train', 'dataset_enlarge_ratio'), '10', "datasets.train.dataset_enlarge_ratio: expected an integer "
     ">= 1, got '10'"),
    (('datasets', 'train', 'prefetch_mode'), 'cuda', 'datasets.train.prefetch_mode: cuda copies batches to a GPU, and '
     'this run is on cpu; use cpu (or leave it out)'),
    (('val', 'metrics', 'psnr', 'test_y_channel'), 'false', "val.metrics.psnr.test_y_channel: expected true or false, "
     "got 'false' (text: write true or false without quotes)"),   # was read as true
    (('val', 'metrics', 'psnr', 'crop_border'), -4, 'val.metrics.psnr.crop_border: expected an integer >= 0, got -4'),
    (('path', 'strict_load_g'), 'false', "path.strict_load_g: expected true or false, got 'false'"),   # read as true
    (('datasets', 'train', 'num_prefetch_queue'), 3, 'datasets.train.num_prefetch_queue: read only with '
     'prefetch_mode: cpu, and prefetch_mode is None, so it changes nothing; remove it, or set prefetch_mode: cpu'),
    (('val', 'metrics', 'psnr', 'better'), 'lower', 'val.metrics.psnr.better: calculate_psnr is better higher, and '
     'the file says lower: the best value logged and net_g_best.pth would be the worst; expected higher (or leave '
     'better out)'),                                            # copied from an LPIPS block: kept the worst weights
    (('datasets', 'val_more', 'name'), 'Test_Sony_Canon', "datasets.val_more.name 'Test_Sony_Canon' is also the name "
     'of datasets.val_targets; each validation set needs its own name (its results are kept under it)'),
]


@pytest.mark.parametrize('model_type', ['FTSRModel', 'SRModel'])
@pytest.mark.parametrize('where, value, message', BASICSR_VALUE_SLIPS)
def test_values_basicsr_reads_are_checked_before_the_run(tmp_path, model_type, where, value, message):
    """A value BasicSR reads unchecked (a traceback at the first milestone, a save, a batch; or a silently
    constant learning rate, a Y-channel PSNR asked off, a validation set never measured) is one line naming the
    key, for this project's models and BasicSR's alike; without the key the options pass."""
    from basicsr_ldt.models.option_values import check_option_values
    opt = train_options(tmp_path, 'slip', model_type=model_type)
    if where[1] == 'val_more':
        opt['datasets']['val_more'] = dict(opt['datasets']['val_targets'], cameras=['Pan'])
    section = opt
    for key in where[:-1]:
        section = section[key]
    section[where[-1]] = value
    with pytest.raises(InputError) as err:
        check_option_values(opt)
    assert str(err.value).startswith(message)
    if where[1] == 'val_more':
        section[where[-1]] = 'Test_Pan'
    else:
        del section[where[-1]]
    check_option_values(opt)


def test_cuda_graph_true_is_judged_on_the_device_and_processes_basicsr_will_use():
    """The early check reads the layout from the options as BasicSR does (no GPU needed to judge it):
    ``num_gpu: 1`` in one process records; two GPUs (DataParallel) or a launcher (DDP) wrap the network; fp16's
    loss scaling is not recorded."""
    from basicsr_ldt.models.option_values import check_option_values
    opt = {'model_type': 'FTSRModel', 'num_gpu': 1, 'network_g': {'type': 'MSRResNet'}, 'train': {'cuda_graph': True}}
    check_option_values(opt)
    for layout in ({'num_gpu': 2}, {'dist': True}):
        with pytest.raises(InputError, match=r'^train\.cuda_graph: true, but the network is wrapped for several GPUs'):
            check_option_values({**opt, **layout})
    fp16 = {**opt, 'train': {'cuda_graph': True, 'amp': 'fp16'}}
    with pytest.raises(InputError, match=r"^train\.cuda_graph: true, but train\.amp fp16's loss scaling checks"):
        check_option_values(fp16)
    check_option_values({**opt, 'model_type': 'SRModel', 'num_gpu': 0})   # BasicSR's models do not read the key


def test_a_rolled_back_output_folder_leaves_the_tree_as_it_was(tmp_path, capsys):
    """``OutputFolder``: a rollback removes each folder it made, and the folders above it that it made and
    that are empty again; an existing folder it archived comes back with its files; a folder above that
    holds anything else (another run) stays."""
    from basicsr_ldt.common.outputs import OutputFolder
    outputs = OutputFolder()
    outputs.create(str(tmp_path / 'experiments' / 'deep' / 'run'))
    outputs.create(str(tmp_path / 'experiments' / 'deep' / 'run' / 'models'))
    (tmp_path / 'results' / 'old').mkdir(parents=True)
    (tmp_path / 'results' / 'old' / 'metrics.md').write_text('kept')
    outputs.create(str(tmp_path / 'results' / 'old'))
    assert 'Path already exists. Renamed it to' in capsys.readouterr().out
    assert sorted(re.sub(r'\d', '0', p.name) for p in (tmp_path / 'results').iterdir()) == [
        'old', 'old_archived_00000000_000000']   # BasicSR's name for the archive, beside the new folder
    outputs.rollback()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['results']
    assert [p.name for p in (tmp_path / 'results').iterdir()] == ['old']
    assert (tmp_path / 'results' / 'old' / 'metrics.md').read_text() == 'kept'
    outputs.create(str(tmp_path / 'tb_logger' / 'run'))
    outputs.create(str(tmp_path / 'experiments' / 'run'))
    (tmp_path / 'experiments' / 'other').mkdir()
    outputs.rollback()   # experiments/ stays, and the folders made before it still go
    assert [p.name for p in (tmp_path / 'experiments').iterdir()] == ['other']
    assert not (tmp_path / 'tb_logger').exists()


@pytest.mark.parametrize('name', ['../escape', '/tmp/abs', 'a//b', 'run/..'])
def test_a_name_that_would_leave_the_project_folders_is_one_line(project, demo_data, name):
    """``name`` is a folder under ``experiments/`` and ``results/``; ``../escape`` wrote test.py's results
    beside the project. BasicSR's ``group/run`` stays allowed (the studies use it)."""
    opt = bicubic_test_options(demo_data, name)
    result = run_entry(project, 'test.py', '-opt', write(project / 'named.yml', opt), check=False)
    assert result.returncode == 2 and 'Traceback' not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: option file '{project / 'named.yml'}': name: expected a folder name under experiments/ and results/ "
        f"('group/run' allowed), not absolute and without '..' or empty parts, got {name!r}")
    assert sorted(p.name for p in project.iterdir()) == ['Train_pip.py', 'named.yml', 'test.py']


def test_debug_mode_is_said_and_only_for_a_name_starting_with_debug(project, demo_data):
    """BasicSR turns on its debug mode for any name containing 'debug' (``ldt_debugged_lr``): validation and
    checkpoints every 8 iterations, no tensorboard, without a word. Such a name is refused; a name starting
    with it (what ``--debug`` makes) keeps the mode, and the log says what it changed."""
    opt = train_options(demo_data, 'ldt_debugged', total_iter=2)
    opt['train']['scheduler']['milestones'] = [2]
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'debugged.yml', opt), check=False)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
        "error: name 'ldt_debugged' contains 'debug', which turns on BasicSR's debug mode (validation and checkpoints "
        "every 8 iterations, printing every one, no tensorboard); expected a name starting with 'debug' for that mode "
        '(or --debug), else one without the word')
    assert not (project / 'experiments').exists()
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'debugged.yml', opt), '--debug')
    log = next((project / 'experiments' / 'debug_ldt_debugged').glob('train_*.log')).read_text()
    assert ("WARNING: BasicSR's debug mode (the name starts with 'debug'): validation and checkpoints every 8 "
            'iterations, printing every one, no tensorboard, whatever the option file says') in log


def test_launcher_slurm_outside_slurm_is_one_line(project, demo_data):
    """BasicSR read SLURM_PROCID unguarded (a KeyError traceback), and on a CPU divided by the GPU count."""
    opt = train_options(demo_data, 'slurm', total_iter=2)
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'slurm.yml', opt), '--launcher', 'slurm',
                       check=False)
    assert result.returncode == 2 and 'Traceback' not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == ('error: --launcher slurm: SLURM_PROCID, SLURM_NTASKS, '
                                                      'SLURM_NODELIST not set, as srun sets them; start the run with '
                                                      'srun, or drop --launcher')


def test_launcher_slurm_names_the_variables_srun_sets(monkeypatch):
    from basicsr_ldt.common.option_file import _start_launcher
    monkeypatch.setenv('SLURM_NTASKS', '1')
    for name in ('SLURM_PROCID', 'SLURM_NODELIST'):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InputError) as err:
        _start_launcher('slurm', {})
    assert str(err.value) == ('--launcher slurm: SLURM_PROCID, SLURM_NODELIST not set, as srun sets them; start the '
                              'run with srun, or drop --launcher')


def test_launcher_slurm_on_a_machine_without_gpus_is_one_line(monkeypatch):
    """Inside a SLURM job on CPU nodes BasicSR divided by the GPU count (a ZeroDivisionError traceback)."""
    from basicsr_ldt.common.option_file import _start_launcher
    for name, value in (('SLURM_PROCID', '0'), ('SLURM_NTASKS', '1'), ('SLURM_NODELIST', 'node1')):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    with pytest.raises(InputError) as err:
        _start_launcher('slurm', {})
    assert str(err.value) == ('--launcher slurm: BasicSR starts one process per GPU, and torch sees no CUDA device; '
                              'use --launcher pytorch with torchrun on a CPU')


def test_a_group_slash_run_name_is_kept(project, demo_data):
    opt = bicubic_test_options(demo_data, 'group/run')
    run_entry(project, 'test.py', '-opt', write(project / 'grouped.yml', opt))
    assert (project / 'results' / 'group' / 'run' / 'metrics.md').is_file()


@pytest.mark.parametrize('seed', [-1, 2 ** 31, True, 'seven'])
def test_a_seed_numpy_cannot_take_is_one_line_before_anything_runs(tmp_path, seed):
    """``manual_seed`` (plus the rank) seeds numpy, which takes [0, 2**32): a study's seed -1 reached a numpy
    traceback inside Train_pip.py; the schema refuses it with the range."""
    opt = train_options(tmp_path, 'seeded', manual_seed=seed)
    with pytest.raises(InputError, match=r'^options: manual_seed: expected an integer in \[0, 2147483647\] \(numpy '
                                         rf'seeds each rank with it plus the rank, below 2\*\*32\), got {re.escape(repr(seed))}$'):
        check_options(opt, 'train', 'options')
    check_options(train_options(tmp_path, 'seeded', manual_seed=2 ** 31 - 1), 'train', 'options')


def test_the_early_check_reads_auto_gpus_as_this_machine_and_l2_sp_by_the_networks_trained(tmp_path):
    """``num_gpu: auto`` is the GPUs torch sees (none in the tests): fp16 training or validation is refused
    as on the CPU. L2-SP anchors one network: refused for LDT's cross-frozen pair, taken by LDT-S."""
    from basicsr_ldt.models.option_values import check_option_values
    opt = train_options(tmp_path, 'early', num_gpu='auto')
    for fp16 in ({'train': {**opt['train'], 'amp': 'fp16'}}, {'val': {**opt['val'], 'precision': 'fp16'}}):
        with pytest.raises(InputError, match='fp16'):
            check_option_values({**opt, **fp16})
    anchored = {**opt, 'model_type': 'LDTSRModel', 'path': {**opt['path'], 'pretrain_network_g': 'start.pth'},
                'train': {**opt['train'], 'l2_sp_weight': 0.01}}
    with pytest.raises(InputError, match=r'^train\.l2_sp_weight: L2-SP anchors the one network a run trains; this '
                                         r'method trains 2 \(a cross-frozen pair\)'):
        check_option_values({**anchored, 'ldt': {'profile_iters': 2, 'ema_every': 1}})
    check_option_values({**anchored, 'ldt': {'method': 'ldt_s', 'profile_iters': 2, 'ema_every': 1, 'interval_iters': 2}})
    check_option_values({**anchored, 'model_type': 'FTSRModel'})


def test_a_cosine_schedule_must_cover_the_run_exactly(tmp_path):
    """Periods shorter than the run: BasicSR trained until they ended, then failed with a TypeError and left
    a folder; longer: the rate never reached eta_min. Restart weights go one per period."""
    from basicsr_ldt.models.option_values import check_option_values
    opt = train_options(tmp_path, 'cosine', total_iter=6)
    opt['train']['scheduler'] = {'type': 'CosineAnnealingRestartLR', 'periods': [2, 4], 'restart_weights': [1, 0.5],
                                 'eta_min': 1e-7}
    check_option_values(opt)
    for periods, total in (([2], 6), ([4, 4], 6)):
        opt['train']['scheduler'].update(periods=periods, restart_weights=[1] * len(periods))
        with pytest.raises(InputError) as err:
            check_option_values(opt)
        assert str(err.value) == (f'train.scheduler.periods: sum to {sum(periods)}, and train.total_iter is {total}; '
                                  'expected the periods to cover the run exactly (shorter: BasicSR fails once they '
                                  'end; longer: the rate never reaches eta_min)')
    opt['train']['scheduler'].update(periods=[2, 4], restart_weights=[1])
    with pytest.raises(InputError, match=r'^train\.scheduler\.restart_weights: 1 weights for 2 periods; expected one '
                                         r'per period$'):
        check_option_values(opt)


@pytest.mark.parametrize('train, message', [
    ({'warmup_iter': 6, 'scheduler': {'type': 'MultiStepLR', 'milestones': [4], 'gamma': 0.5}},
     'train.scheduler.milestones: 4 takes effect at iteration 5, inside the warm-up (train.warmup_iter 6 sets the '
     'rate at iterations 1-5), which overwrites it: the rate would never decay there; expected milestones >= 5'),
    ({'scheduler': {'type': 'CosineAnnealingRestartLR', 'periods': [8], 'restart_weights': [0], 'eta_min': 0}},
     'train.scheduler.restart_weights: expected a non-empty list, each a number in (0, inf), got [0]'),
    ({'scheduler': {'type': 'MultiStepRestartLR', 'milestones': [4], 'restarts': [3], 'restart_weights': [0.0]}},
     'train.scheduler.restart_weights: expected a non-empty list, each a number in (0, inf), got [0.0]'),
    ({'scheduler': {'type': 'MultiStepRestartLR', 'milestones': [4], 'restarts': [9], 'restart_weights': [1]}},
     'train.scheduler.restarts: 9 lies beyond train.total_iter (8), so the rate never changes there; expected '
     'restarts <= total_iter'),
    ({'scheduler': {'type': 'MultiStepRestartLR', 'milestones': [4], 'restarts': [3, 6]}},
     'train.scheduler.restart_weights: 1 weights for 2 restarts; expected one per restart'),
    ({'scheduler': {'type': 'CosineAnnealingRestartLR', 'periods': [4, 4]}},     # BasicSR's assertion, mid-setup
     'train.scheduler.restart_weights: 1 weights for 2 periods; expected one per period'),
    ({'scheduler': {'type': 'MultiStepLR', 'milestones': [4, 9], 'gamma': 0.5}},
     'train.scheduler.milestones: 9 lies beyond train.total_iter (8), so the rate never changes there; expected '
     'milestones <= total_iter (for a constant rate: milestones: [8])'),
    ({'warmup_iter': 8}, 'train.warmup_iter: 8 is not below train.total_iter (8), so the rate never reaches '
                         'optim_g.lr; expected fewer warm-up iterations (or -1: none)'),
    ({'scheduler': {'type': 'CosineAnnealingRestartLR', 'periods': [8], 'eta_min': 0.01}},
     'train.scheduler.eta_min: 0.01 is above train.optim_g.lr (0.001), so the cosine would raise the rate; expected '
     'eta_min <= lr (0: decay to 0)'),
])
def test_schedules_that_silently_do_something_else_are_refused(tmp_path, train, message):
    """Each of these trained without a word: a milestone inside the warm-up never decayed the rate, a restart
    weight of 0 trained nothing from there on, a restart past the end never came, eta_min above lr raised it."""
    from basicsr_ldt.models.option_values import check_option_values
    opt = train_options(tmp_path, 'schedule', total_iter=8)
    opt['train'].update(train)
    with pytest.raises(InputError) as err:
        check_option_values(opt)
    assert str(err.value) == message


def test_schedules_at_the_edges_of_those_checks_are_accepted(tmp_path):
    from basicsr_ldt.models.option_values import check_option_values
    opt = train_options(tmp_path, 'schedule', total_iter=8)
    for train in ({'warmup_iter': 6, 'scheduler': {'type': 'MultiStepLR', 'milestones': [5], 'gamma': 0.5}},
                  {'scheduler': {'type': 'MultiStepRestartLR', 'milestones': [4], 'restarts': [8],
                                 'restart_weights': [0.5]}},
                  {'scheduler': {'type': 'CosineAnnealingRestartLR', 'periods': [8], 'eta_min': 0.001}}):
        check_option_values({**opt, 'train': {**opt['train'], **train}})


def test_a_prefetch_queue_is_accepted_with_cpu_prefetching(tmp_path):
    from basicsr_ldt.models.option_values import check_option_values
    opt = train_options(tmp_path, 'prefetch')
    opt['datasets']['train'].update(prefetch_mode='cpu', num_prefetch_queue=3)
    check_option_values(opt)
    opt['datasets']['train']['prefetch_mode'] = 'cuda'
    with pytest.raises(InputError, match=r"^datasets\.train\.num_prefetch_queue: read only with prefetch_mode: cpu, "
                                         r"and prefetch_mode is 'cuda', so"):
        check_option_values(opt)


def test_a_metric_is_better_only_the_way_it_improves(tmp_path):
    """NIQE improves downwards: ``better: lower`` passes; ``higher``, or no ``better`` (BasicSR then reads
    higher), is refused; SSIM as PSNR."""
    from basicsr_ldt.models.option_values import check_option_values
    opt = train_options(tmp_path, 'better')
    opt['val']['metrics'] = {'niqe': {'type': 'calculate_niqe', 'crop_border': 4, 'better': 'lower'},
                             'ssim': {'type': 'calculate_ssim', 'crop_border': 4, 'better': 'higher'}}
    check_option_values(opt)
    for name, wrong in (('niqe', 'higher'), ('ssim', 'lower')):
        changed = copy.deepcopy(opt)
        changed['val']['metrics'][name]['better'] = wrong
        with pytest.raises(InputError, match=rf'^val\.metrics\.{name}\.better: calculate_{name} is better '):
            check_option_values(changed)
    del opt['val']['metrics']['niqe']['better']
    with pytest.raises(InputError) as err:
        check_option_values(opt)
    assert str(err.value) == ("val.metrics.niqe.better: calculate_niqe is better lower, and better is absent (BasicSR's "
                              'default: higher): the best value logged and net_g_best.pth would be the worst; expected '
                              'lower')


def test_validation_without_a_validation_set_is_refused(tmp_path):
    """A val section with metrics but no datasets.val_*: the log announced validation settings and nothing was
    ever validated. The reverse (val: ~ beside validation sets) is how studies skip validation: accepted."""
    from basicsr_ldt.models.option_values import check_option_values
    opt = train_options(tmp_path, 'val')
    check_option_values({**opt, 'val': None})
    del opt['datasets']['val_targets']
    with pytest.raises(InputError) as err:
        check_option_values(opt)
    assert str(err.value) == ("val: the option file has no 'datasets: val_*' section, so validation would never run "
                              'and val.metrics measure nothing; add a validation dataset, or remove val (val: ~)')
    check_option_values({**opt, 'val': None})


def test_validation_that_measures_and_keeps_nothing_is_refused(tmp_path):
    """``val: {val_freq: 2}`` without metrics ran the network over every validation image and logged nothing."""
    from basicsr_ldt.models.option_values import check_option_values
    opt = train_options(tmp_path, 'val')
    del opt['val']['metrics']
    with pytest.raises(InputError, match=r'^val\.metrics: validation measures nothing without metrics and keeps '
                                         r'nothing without save_img: true'):
        check_option_values(opt)
    opt['val']['save_img'] = True                                          # images only: BasicSR's own use
    check_option_values(opt)
    opt['val'] = None
    check_option_values(opt)


def test_validating_on_a_camera_the_run_trains_on_is_said_in_the_log(project, demo_data):
    """Also said: a PSNR without test_y_channel measures RGB (BasicSR's default) while test.py measures Y."""
    opt = train_options(demo_data, 'seen', total_iter=2)
    opt['datasets']['val_targets']['cameras'] = ['Olympus', 'Sony']        # Olympus is the source
    del opt['val']['metrics']['psnr']['test_y_channel']
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'seen.yml', opt))
    log = next((project / 'experiments' / 'seen').glob('train_seen_*.log')).read_text()
    assert ('WARNING: Validation data Test_Sony_Canon includes Olympus, which the run trains on: its figures, and '
            'the checkpoint val.save_best picks, mix source and target cameras') in log
    assert ("WARNING: val.metrics.psnr measures RGB (test_y_channel absent: BasicSR's default), and test.py measures "
            "the Y channel unless told otherwise (the paper's way; RGB reads about 1.7 dB lower): set test_y_channel "
            'to say which') in log


def test_the_schedule_rules_allow_what_reaches_the_run_end():
    """The official constant rate (a milestone at total_iter), a one-iteration run without a warm-up key, a
    warm-up shorter than the run (mutation testing: '>' as '>=', the warm-up's default)."""
    from basicsr_ldt.models.option_values import check_option_values
    opt = train_options(REPO / 'unused', 'edges', total_iter=6)
    opt['train']['scheduler']['milestones'] = [6]
    check_option_values(opt)
    opt['train'].update(total_iter=1, scheduler={'type': 'MultiStepLR', 'milestones': [1], 'gamma': 0.5})
    del opt['train']['warmup_iter']
    check_option_values(opt)
    opt['train'].update(total_iter=6, warmup_iter=5, scheduler={'type': 'MultiStepLR', 'milestones': [4], 'gamma': 0.5})
    check_option_values(opt)
    opt['val'] = {'val_freq': 2}
    with pytest.raises(InputError) as err:
        check_option_values(opt)
    assert str(err.value) == ("val.metrics: validation measures nothing without metrics and keeps nothing without "
                              "save_img: true; expected metrics (e.g. psnr: {type: calculate_psnr, crop_border: 4, "
                              "test_y_channel: true}), save_img: true, or no val section")
