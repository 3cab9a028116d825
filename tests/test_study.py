"""Studies (scripts/study.py): expansion, validation before anything runs, skipping finished runs,
aggregation against hand-computed values, and one tiny study end to end through the entry points."""
import io
import itertools
import json
import os
import re
import copy
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.study import cli, plan, report, run as runner
from conftest import REPO
from test_cli import dataset, train_options, write

PAPER_STUDIES = ['paper_table1', 'paper_table2', 'paper_table5', 'paper_table6', 'paper_table9']


def tiny_study(tmp_path, data, **changes):
    """A study file over the tiny MSRResNet options of test_cli: FT and LDT, two seeds."""
    base = train_options(data, total_iter=6, val=None)
    base['logger']['save_checkpoint_freq'] = 3
    test = {'name': 'test', 'scale': 4, 'num_gpu': 0, 'path': {},
            'datasets': {'test_1': dataset(data, 'Test', ['Sony', 'Canon'])},
            'network_g': base['network_g'], 'test': {'tile_size': 0}}
    study = {'name': 'tiny', 'train': write(tmp_path / 'base.yml', base), 'test': write(tmp_path / 'test.yml', test),
             'seeds': [0, 1],
             'methods': {'FT': {}, 'LDT': {'model_type': 'LDTSRModel',
                                          'ldt': {'method': 'ldt', 'profile_iters': 2, 'ema_every': 1}}}}
    study.update(changes)
    return write(tmp_path / 'study.yml', study)


def test_expansion_crosses_methods_sweep_and_seeds(tmp_path, demo_data):
    path = tiny_study(tmp_path, demo_data, seeds=[3, 5],
                      methods={'FT': {}, 'FT+EMA': {'train': {'ema_decay': 0.999}},
                               'LDT': {'model_type': 'LDTSRModel',
                                       'ldt': {'method': 'ldt_no_dpu', 'profile_iters': 2, 'ema_every': 1}}},
                      sweep={'train.optim_g.lr': [1e-3, 5e-4]}, reference='LDT')
    study = plan.load_study(path, str(tmp_path))
    assert len(study.runs) == 3 * 2 * 2 and study.reference == 'LDT'
    # Seed-major: every method and sweep point for seed 3 before seed 5.
    assert [r.seed for r in study.runs] == [3] * 6 + [5] * 6
    names = [r.name for r in study.runs]
    assert names[:2] == ['FT_lr=0.001_seed3', 'FT_lr=0.0005_seed3'] and len(set(names)) == 12
    ldt = next(r for r in study.runs if r.method == 'LDT' and r.seed == 5 and r.sweep['train.optim_g.lr'] == 5e-4)
    assert ldt.train_opt['model_type'] == 'LDTSRModel' and ldt.train_opt['ldt']['method'] == 'ldt_no_dpu'
    assert ldt.train_opt['train']['optim_g'] == {'type': 'Adam', 'lr': 5e-4, 'betas': [0.9, 0.99]}
    assert ldt.train_opt['manual_seed'] == 5 and ldt.train_opt['name'] == 'tiny/LDT_lr=0.0005_seed5'
    assert ldt.train_opt['datasets']['train']['cameras'] == ['Olympus']  # untouched base keys kept
    ema = next(r for r in study.runs if r.method == 'FT+EMA')
    assert ema.uses_ema and ema.test_opt['checkpoints'][0]['param_key'] == 'params_ema'
    assert ema.test_opt['checkpoints'][0]['path'] == plan.final_checkpoint(str(tmp_path), 'tiny', ema.name)
    ft = study.runs[0]
    assert not ft.uses_ema and ft.test_opt['checkpoints'][0]['param_key'] == 'params'
    assert 'ldt' not in ft.train_opt and 'ema_decay' not in ft.train_opt['train']
    assert ft.test_opt['name'] == 'tiny/FT_lr=0.001_seed3' and ft.test_opt['network_g'] == ft.train_opt['network_g']
    assert study.cameras() == ['Sony', 'Canon']


def test_a_corgrad_method_sweeps_the_keys_corgrad_reads(tmp_path, demo_data):
    path = tiny_study(tmp_path, demo_data, methods={'CG': {'model_type': 'LDTSRModel', 'ldt': {'method': 'corgrad'}}},
                      sweep={'ldt.slices': [5, 10]})
    runs = plan.load_study(path, str(tmp_path)).runs
    assert [r.train_opt['ldt']['slices'] for r in runs] == [5, 10, 5, 10]


def test_method_with_its_own_base_file(tmp_path, demo_data):
    other = train_options(demo_data, network_g={'type': 'SAFMN', 'dim': 8, 'n_blocks': 1, 'ffn_scale': 2.0,
                                                'upscaling_factor': 4})
    path = tiny_study(tmp_path, demo_data, methods={'FT': {}, 'SAFMN': {'base': write(tmp_path / 'b.yml', other)}})
    study = plan.load_study(path, str(tmp_path))
    assert {r.method: r.train_opt['network_g']['type'] for r in study.runs} == {'FT': 'MSRResNet', 'SAFMN': 'SAFMN'}
    assert study.runs[1].test_opt['network_g']['type'] == 'SAFMN'


PSNR = {'psnr': {'type': 'calculate_psnr', 'crop_border': 4, 'test_y_channel': True}}


def test_a_method_sets_how_validation_cuts_images(tmp_path, demo_data):
    """The val: inference keys (test:'s, docs/options.md) are options a method may override, though the
    base file has no val: section; the run validates as they say."""
    from basicsr_ldt.models.validation import validation_settings
    inference = {'tile_mode': 'fixed', 'tile_size': 24, 'tile_overlap': 8, 'precision': 'bf16'}
    path = tiny_study(tmp_path, demo_data, seeds=[0],
                      methods={'FT': {}, 'FT tiled': {'val': {**inference, 'save_best': False, 'metrics': PSNR}}})
    runs = plan.load_study(path, str(tmp_path)).runs
    assert runs[0].train_opt['val'] is None
    assert runs[1].train_opt['val'] == {**inference, 'save_best': False, 'metrics': PSNR}
    settings = validation_settings(runs[1].train_opt)
    assert (settings.tile_mode, settings.tile_size, settings.tile_overlap, settings.precision) == \
        ('fixed', 24, 8, 'bf16')


@pytest.mark.parametrize('changes, message', [
    ({'methods': {'FT': {'traim': {'total_iter': 3}}}}, "method 'FT': 'traim' is not an option.*did you mean 'train'"),
    ({'methods': {'FT': {'val': {'tile_mod': 'official'}}}},
     "method 'FT': 'val.tile_mod' is not an option of the base file.*did you mean 'tile_mode'"),
    ({'methods': {'FT': {'train': {'ema_decy': 0.9}}}}, "method 'FT': 'train.ema_decy' is not an option"),
    ({'methods': {'LDT': {'model_type': 'LDTSRModel', 'ldt': {'method': 'ldt_fast'}}}},
     "ldt.method: expected one of 'ft', "),
    ({'methods': {'X': {'model_type': 'NoSuchModel'}}}, "model_type 'NoSuchModel' is not registered"),
    ({'sweep': {'train.optim_g.learning_rate': [1e-3]}}, "sweep 'train.optim_g.learning_rate'.*is not an option"),
    ({'sweep': {'ldt.ratio_u': [0.3]}}, r"sweep 'ldt.ratio_u' \(method 'FT'\)"),
    ({'sweep': {'train.total_iter': []}}, "sweep 'train.total_iter' must be a non-empty list"),
    ({'seeds': []}, "'seeds' is missing or empty"),
    ({'seeds': [0, 0]}, 'seeds list a seed twice'),
    ({'train': 'options/nope.yml'}, "base training file 'options/nope.yml' does not exist"),
    ({'test': 'options/nope_test.yml'}, "test file 'options/nope_test.yml' does not exist"),
    ({'reference': 'Baseline'}, "reference 'Baseline' is not one of the methods"),
    ({'seed': [1]}, "unknown option 'seed' in study file.*did you mean 'seeds'"),
    ({'methods': {'FT': {}, 'FT best': {'val': {'save_best': True, 'val_freq': 3, 'metrics': PSNR}}}},
     r"run 'FTbest_seed0': val\.save_best keeps the best validated weights in net_g_best\.pth, and a study tests each "
     r"run's final weights \(net_g_latest\.pth\), so the selection would not be what is reported; remove save_best "
     r'\(or test the best weights with test\.py\)$'),          # the row was labelled by a selection never tested
    ({'methods': {'CG': {'model_type': 'LDTSRModel', 'ldt': {'method': 'corgrad'}}},
      'sweep': {'ldt.ratio_u': [0.3, 0.5]}},
     r"sweep 'ldt\.ratio_u' \(method 'CG'\): CorGrad does not read ldt\.ratio_u \(an LDT option it ignores\), so "
     'every point of the sweep would train the same run'),       # two identical runs under two sweep points
])
def test_bad_study_is_one_error_before_anything_is_written(tmp_path, demo_data, capsys, changes, message):
    path = tiny_study(tmp_path, demo_data, **changes)
    with pytest.raises(InputError, match=message):
        plan.load_study(path, str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(str(tmp_path), ['-opt', path])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('error: ') and '\n' not in err
    assert not (tmp_path / 'experiments').exists() and not (tmp_path / 'results').exists()


@pytest.mark.parametrize('flags, message', [
    (['--jobs', '0'], "argument --jobs: expected an integer >= 1, got '0' (python scripts/study.py -h lists the flags)"),
    (['--colect'], 'unrecognized arguments: --colect (python scripts/study.py -h lists the flags)'),
    (['--commands', '{tmp}'], "--commands '{tmp}' is a folder; expected a file to write the commands to"),
    (['--commands', '{tmp}/no/such/x.sh'], "--commands '{tmp}/no/such/x.sh': its folder '{tmp}/no/such' does not exist"),
    (['--commands', '{tmp}/study.yml'], "--commands '{tmp}/study.yml' names an option file; expected a shell file to "
     'write the commands to (e.g. jobs.sh)'),                    # the study file itself was emptied
    (['--commands', '{tmp}/notes.txt'], "--commands '{tmp}/notes.txt' exists and was not written by --commands; "
     'expected a new file (or one an earlier --commands wrote), so that nothing else is overwritten'),
])
def test_bad_flags_are_one_line_before_anything_is_written(tmp_path, demo_data, capsys, flags, message):
    """A slip on the command line reads like a slip in the study file: one ``error:`` line, exit code
    2, no option file of any run written (``--commands`` used to write them, then fail on the file)."""
    path = tiny_study(tmp_path, demo_data)
    (tmp_path / 'notes.txt').write_text('my notes\n')
    with pytest.raises(SystemExit) as exit_info:
        cli.main(str(tmp_path), ['-opt', path] + [f.format(tmp=tmp_path) for f in flags])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f'error: {message.format(tmp=tmp_path)}\n'
    assert not (tmp_path / 'experiments').exists()
    assert (tmp_path / 'notes.txt').read_text() == 'my notes\n' and os.path.getsize(path) > 0


def test_missing_data_stops_a_real_run_but_not_a_dry_run(tmp_path, demo_data, capsys):
    path = tiny_study(tmp_path, demo_data / 'nowhere')
    assert cli.main(str(tmp_path), ['-opt', path, '--dry-run']) == 0
    out = capsys.readouterr().out
    assert '4 runs' in out and 'not found' in out and 'nowhere' in out
    with pytest.raises(SystemExit):
        cli.main(str(tmp_path), ['-opt', path])
    assert 'cannot run' in capsys.readouterr().err
    assert not (tmp_path / 'experiments').exists()


def test_run_state_skips_finished_runs_and_resumes_started_ones(tmp_path, demo_data, capsys):
    root = str(tmp_path)
    study = plan.load_study(tiny_study(tmp_path, demo_data), root)
    first = study.runs[0]
    assert runner.run_state(root, study, first) == runner.NEW
    states = tmp_path / 'experiments' / 'tiny' / first.name / 'training_states'
    states.mkdir(parents=True)
    (states / '3.state').write_bytes(b'')
    assert runner.run_state(root, study, first) == runner.RESUME
    steps = runner.commands(root, study, first, runner.RESUME)
    assert steps[0][1:] == [str(tmp_path / 'Train_pip.py'), '-opt', runner.option_files(root, study, first)[0],
                            '--auto_resume'] and steps[1][1] == str(tmp_path / 'test.py')
    checkpoint = Path(plan.final_checkpoint(root, 'tiny', first.name))
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b'')
    assert runner.run_state(root, study, first) == runner.TEST
    assert [s[1] for s in runner.commands(root, study, first, runner.TEST)] == [str(tmp_path / 'test.py')]
    results = Path(plan.results_file(root, 'tiny', first.name))
    results.parent.mkdir(parents=True)
    results.write_text('{}')
    os.utime(checkpoint, (1, 1))
    assert runner.run_state(root, study, first) == runner.DONE
    os.utime(results, (0, 0))  # re-trained after its test: test again
    assert runner.run_state(root, study, first) == runner.TEST
    os.utime(results, (2, 2))
    runner.execute(root, study, [first], say=print)
    assert capsys.readouterr().out.strip() == f'[1/1] {first.name}: finished earlier, skipped'


def test_collect_leaves_out_results_older_than_the_weights_they_test(tmp_path, demo_data, capsys):
    """A run trained again, or a --commands job whose test failed after its training: --collect reported
    the old metrics.json as the new weights' figures. They are left out and named; results whose weights
    were deleted since (to save disk) still count."""
    root = str(tmp_path)
    path = tiny_study(tmp_path, demo_data, seeds=[0])
    study = plan.load_study(path, root)
    for run in study.runs:
        checkpoint = Path(plan.final_checkpoint(root, 'tiny', run.name))
        results = Path(plan.results_file(root, 'tiny', run.name))
        for file in (checkpoint, results):
            file.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.write_bytes(b'')
        results.write_text(json.dumps({'summary': {run.name: {'Sony': {'psnr': 24.0, 'ssim': 0.7}}}}))
        os.utime(checkpoint, (1, 1))
    ft, ldt = study.runs
    assert [r['run'] for r in report.collect(root, study)['runs']] == ['FT_seed0', 'LDT_seed0']
    os.utime(plan.final_checkpoint(root, 'tiny', ldt.name), None)    # trained again after its test
    assert runner.stale_results(root, study, ldt) and not runner.stale_results(root, study, ft)
    assert cli.main(root, ['-opt', path, '--collect']) == 0
    out = capsys.readouterr().out
    assert '1 of 2 runs aggregated' in out and out.rstrip().endswith('; 1 left out, tested before their weights changed')
    assert ('Left out: 1 run(s) whose test results are older than the weights they test (trained again, or the test '
            'failed after training; run the study to test them): LDT_seed0.') in out
    result = json.loads((tmp_path / 'results' / 'tiny' / 'study.json').read_text())
    assert [r['run'] for r in result['runs']] == ['FT_seed0'] and result['stale'] == ['LDT_seed0']
    os.remove(plan.final_checkpoint(root, 'tiny', ldt.name))          # weights deleted: the results stand
    assert [r['run'] for r in report.collect(root, study)['runs']] == ['FT_seed0', 'LDT_seed0']


def test_a_commands_file_is_written_only_where_nothing_else_is_lost(tmp_path):
    """A new file, an empty one, or one an earlier --commands wrote; not a file in another encoding
    (a binary file: one line, not a UnicodeDecodeError), nor .yaml (mutation testing)."""
    cli.check_commands_file(str(tmp_path / 'jobs.sh'))
    (tmp_path / 'empty.sh').write_text('')
    cli.check_commands_file(str(tmp_path / 'empty.sh'))
    (tmp_path / 'ours.sh').write_text(cli.COMMANDS_MARK + " pending runs of study 'x' (x.yml)\n")
    cli.check_commands_file(str(tmp_path / 'ours.sh'))
    (tmp_path / 'photo.bin').write_bytes(b'\xff\xd8\xff\xe0 not text')
    for name in ('photo.bin', 'study.YAML'):
        with pytest.raises(InputError, match=rf"^--commands '.*{re.escape(name)}' "):
            cli.check_commands_file(str(tmp_path / name))


def test_stale_results_of_an_interpolation_follow_the_run_it_reads(tmp_path, demo_data):
    """A WiSE-FT test reads another run's weights: its results are stale once that run's weights are newer,
    fresh when as new (same mtime)."""
    root = str(tmp_path)
    path = tiny_study(tmp_path, demo_data, seeds=[0], overrides={'path': {'pretrain_network_g': str(tmp_path / 's.pth')}},
                      methods={'FT': {}, 'W': {'wise_ft': {'of': 'FT', 'alphas': [0.5]}}})
    study = plan.load_study(path, root)
    ft, wise = study.runs
    checkpoint = Path(plan.final_checkpoint(root, 'tiny', ft.name))
    results = Path(plan.results_file(root, 'tiny', wise.name))
    for file in (checkpoint, results):
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text('{}')
        os.utime(file, (5, 5))
    assert not runner.stale_results(root, study, wise)
    os.utime(checkpoint, (6, 6))
    assert runner.stale_results(root, study, wise) and runner.run_state(root, study, wise) == runner.TEST


def test_collect_says_when_nothing_has_results_and_names_only_the_files_it_wrote(tmp_path, demo_data, capsys):
    root = str(tmp_path)
    path = tiny_study(tmp_path, demo_data, seeds=[0])
    assert cli.main(root, ['-opt', path, '--collect']) == 0
    assert capsys.readouterr().out == "study 'tiny': no run has test results yet; nothing to aggregate\n"
    study = plan.load_study(path, root)
    for run in study.runs:
        results = Path(plan.results_file(root, 'tiny', run.name))
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(json.dumps({'summary': {run.name: {'Sony': {'psnr': 24.0, 'ssim': 0.7}}}}))
    assert cli.main(root, ['-opt', path, '--collect']) == 0
    folder = tmp_path / 'results' / 'tiny'
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == (
        f"2 of 2 runs aggregated into {folder / 'study.json'}, {folder / 'study.md'}, {folder / 'study.csv'}, "
        f"{folder / 'study.png'}")


def test_changed_options_of_a_started_run_are_refused(tmp_path, demo_data):
    root = str(tmp_path)
    study = plan.load_study(tiny_study(tmp_path, demo_data), root)
    runner.write_option_files(root, study, study.runs[0])
    (tmp_path / 'experiments' / 'tiny' / study.runs[0].name).mkdir()
    runner.check_unchanged(root, study)  # same options: fine
    changed = plan.load_study(tiny_study(tmp_path, demo_data, methods={'FT': {'train': {'total_iter': 7}}}), root)
    with pytest.raises(InputError) as err:
        runner.check_unchanged(root, changed)
    assert str(err.value) == (f"run 'FT_seed0' was started with other options ({runner.option_files(root, study, study.runs[0])[0]}"
                              "); delete experiments/tiny/FT_seed0 and results/tiny/FT_seed0 to train it again, or give "
                              'the study another name')


@pytest.mark.parametrize('mode', ['--collect', '--dry-run'])
def test_collect_and_dry_run_refuse_results_of_other_options(tmp_path, demo_data, capsys, mode):
    """--collect wrote a started run's old results under the edited study's method, and --dry-run called
    it finished; both now refuse as a run does. Nothing is aggregated."""
    root = str(tmp_path)
    study = plan.load_study(tiny_study(tmp_path, demo_data), root)
    runner.write_option_files(root, study, study.runs[0])
    (tmp_path / 'experiments' / 'tiny' / study.runs[0].name).mkdir()
    edited = tiny_study(tmp_path, demo_data, methods={'FT': {'train': {'total_iter': 7}}})
    with pytest.raises(SystemExit):
        cli.main(root, ['-opt', edited, mode])
    assert capsys.readouterr().err.startswith("error: run 'FT_seed0' was started with other options")
    assert not (tmp_path / 'results').exists()


def test_results_tested_with_other_test_options_are_refused_not_pooled(tmp_path, demo_data, capsys):
    """A camera added to the study's test file: every run that has results was tested without it. Skipped
    as finished, they were pooled with runs tested with it (a Mean over other cameras) and the report
    crashed on the missing column; a run without training (here: a new start) kept its old results too."""
    root = str(tmp_path)
    study = plan.load_study(tiny_study(tmp_path, demo_data), root)
    tested = study.runs[1]
    runner.write_option_files(root, study, tested)
    results = Path(plan.results_file(root, 'tiny', tested.name))
    results.parent.mkdir(parents=True)
    results.write_text('{}')
    runner.check_unchanged(root, study)                   # same test options: fine
    untested = study.runs[0]                              # a test file written, no results yet: fine
    runner.write_option_files(root, study, untested)
    test = yaml.safe_load((tmp_path / 'test.yml').read_text())
    test['datasets']['test_1']['cameras'] = ['Sony', 'Canon', 'Olympus']
    write(tmp_path / 'test.yml', test)
    edited = plan.load_study(str(tmp_path / 'study.yml'), root)
    with pytest.raises(InputError, match=rf"^run '{tested.name}' was tested with other test options "
                                         rf"\({re.escape(runner.option_files(root, study, tested)[-1])}\), which the study "
                                         r'no longer makes; delete results/tiny \(trained weights are kept and tested '
                                         r'again\) or give the study another name$'):
        runner.check_unchanged(root, edited)
    with pytest.raises(SystemExit):
        cli.main(root, ['-opt', str(tmp_path / 'study.yml'), '--collect'])
    assert capsys.readouterr().err.startswith(f"error: run '{tested.name}' was tested with other test options")
    runner.write_option_files(root, study, study.runs[2])
    Path(plan.results_file(root, 'tiny', study.runs[2].name)).parent.mkdir(parents=True)
    Path(plan.results_file(root, 'tiny', study.runs[2].name)).write_text('{}')
    with pytest.raises(InputError, match=rf"^run '{tested.name}' \(and 1 more run\(s\)\) was tested"):
        runner.check_unchanged(root, edited)


def record(method, seed, values):
    """A run record with PSNR values per camera and SSIM = PSNR / 100."""
    return {'run': f'{method}_seed{seed}', 'method': method, 'seed': seed, 'sweep': {}, 'sources': ['Olympus'],
            'cameras': {cam: {'psnr': v, 'ssim': v / 100} for cam, v in values.items()}}


def test_aggregation_matches_hand_computed_values(tmp_path, demo_data):
    study = plan.load_study(tiny_study(tmp_path, demo_data, seeds=[0, 1, 2]), str(tmp_path))
    records = [record('FT', 0, {'Sony': 20.0, 'Canon': 22.0}), record('FT', 1, {'Sony': 21.0, 'Canon': 22.0}),
               record('FT', 2, {'Sony': 22.0, 'Canon': 22.0}),
               record('LDT', 0, {'Sony': 20.5, 'Canon': 23.0}), record('LDT', 1, {'Sony': 21.5, 'Canon': 22.0})]
    result = report.aggregate(study, records)
    ft, ldt = result['summary']
    assert ft['n'] == 3 and ldt['n'] == 2 and result['cameras'] == ['Sony', 'Canon']
    # FT Sony: 20, 21, 22 -> mean 21, sample std 1. Canon constant -> std 0.
    assert ft['cameras']['Sony']['psnr'] == pytest.approx({'mean': 21.0, 'std': 1.0})
    assert ft['cameras']['Canon']['psnr'] == pytest.approx({'mean': 22.0, 'std': 0.0})
    # Mean over cameras per seed: 21, 21.5, 22 -> mean 21.5, std 0.5.
    assert ft['cameras']['Mean']['psnr'] == pytest.approx({'mean': 21.5, 'std': 0.5})
    assert ft['cameras']['Mean']['ssim'] == pytest.approx({'mean': 0.215, 'std': 0.005})
    # LDT Canon: 23, 22 -> mean 22.5, std sqrt(0.5).
    assert ldt['cameras']['Canon']['psnr'] == pytest.approx({'mean': 22.5, 'std': 0.5 ** 0.5})
    (diff,) = result['differences']
    assert diff['reference'] == 'FT' and diff['seeds'] == [0, 1] and diff['n'] == 2
    # Paired over seeds 0 and 1: Sony +0.5, +0.5; Canon +1.0, 0.0 -> mean 0.5, bootstrap [0, 1];
    # the mean over cameras: +0.75, +0.25.
    assert diff['cameras']['Sony']['psnr'] == pytest.approx({'mean': 0.5, 'ci_low': 0.5, 'ci_high': 0.5})
    assert diff['cameras']['Canon']['psnr'] == pytest.approx({'mean': 0.5, 'ci_low': 0.0, 'ci_high': 1.0})
    assert diff['cameras']['Mean']['psnr'] == pytest.approx({'mean': 0.5, 'ci_low': 0.25, 'ci_high': 0.75})
    text = report.markdown(result)
    assert '| FT | 21.00 ± 1.00 | 22.00 ± 0.00 | 21.50 ± 0.50 | 3 |' in text
    assert '| LDT | +0.50 [+0.50, +0.50] | +0.50 [+0.00, +1.00] | +0.50 [+0.25, +0.75] | 2 |' in text


def test_methods_trained_on_other_cameras_compare_their_means_on_the_targets_neither_trained_on(tmp_path, demo_data):
    """A method trained on Pan against a reference trained on Olympus (paper Table 5): its Mean held
    Olympus, the reference's Pan, so a method worse on every camera read +0.43 dB better."""
    study = plan.load_study(tiny_study(tmp_path, demo_data, seeds=[0, 1]), str(tmp_path))
    cameras = ('Olympus', 'Pan', 'Canon')
    records = [record('FT', s, dict(zip(cameras + ('DSC',), (24.0, 23.0, 22.0, 25.0)))) for s in (0, 1)]
    records += [{**record('LDT', s, dict(zip(cameras, (23.9, 22.9, 22.0 - s / 10)))), 'sources': ['Pan']}
                for s in (0, 1)]
    result = report.aggregate(study, records)
    (diff,) = result['differences']
    assert diff['mean_over'] == ['Canon'] and diff['sources'] == ['Olympus', 'Pan']
    assert diff['cameras']['Mean']['psnr'] == pytest.approx({'mean': -0.05, 'ci_low': -0.1, 'ci_high': 0.0})
    assert diff['cameras']['Olympus']['psnr']['mean'] == pytest.approx(-0.1)      # every camera still compared
    assert 'DSC' not in diff['cameras'] and diff['sources_differ']                # the reference's extra camera
    text = report.markdown(result)
    assert ('| LDT | -0.05 [-0.10, +0.00] | - | -0.10 [-0.10, -0.10] (source) | -0.10 [-0.10, -0.10] (source) | -0.05 '
            '[-0.10, +0.00] | 2 |') in text
    assert ('Sources differ from the reference\'s: "(source)" marks a camera either trained on, and Mean is over the '
            'cameras neither did (LDT: Canon).') in text
    only_sources = [{**r, 'cameras': {c: v for c, v in r['cameras'].items() if c != 'Canon'}} for r in records]
    (diff,) = report.aggregate(study, only_sources)['differences']
    assert 'Mean' not in diff['cameras'] and diff['mean_over'] == []              # no camera to compare Means on
    report.write_report(str(tmp_path / 'report'), report.aggregate(study, only_sources))
    assert 'none, no Mean' in (tmp_path / 'report' / 'study.md').read_text()
    same = report.aggregate(study, [record('FT', 0, {'Olympus': 24.0}), record('LDT', 0, {'Olympus': 24.5})])
    assert same['differences'][0]['cameras']['Mean']['psnr']['mean'] == pytest.approx(0.5)   # all cameras sources
    assert 'Sources differ' not in report.markdown(same)


def test_each_sweep_point_marks_its_own_source_cameras(tmp_path, demo_data):
    """A sweep over datasets.train.cameras: each row's "(source)" is its own point's camera."""
    study = plan.load_study(tiny_study(tmp_path, demo_data, seeds=[0]), str(tmp_path))
    study.sweep = {'datasets.train.cameras': [['Olympus'], ['Pan']]}
    records = [{**record(m, 0, {'Olympus': 24.0, 'Pan': 23.0}), 'sweep': {'datasets.train.cameras': [cam]},
                'sources': [cam]} for m in ('FT', 'LDT') for cam in ('Olympus', 'Pan')]
    summary = report.aggregate(study, records)['summary']
    assert [(r['sweep']['datasets.train.cameras'], r['sources']) for r in summary] == [
        (['Olympus'], ['Olympus']), (['Pan'], ['Pan'])] * 2
    assert summary[1]['cameras']['Mean']['psnr']['mean'] == pytest.approx(24.0)


def test_one_camera_named_without_a_list_is_that_camera():
    """``cameras: Olympus`` (the loader takes it) was read as the letters O, l, y, ..."""
    assert plan.train_cameras({'datasets': {'train': {'cameras': 'Olympus'}}}) == ['Olympus']
    assert plan.train_cameras({'datasets': {'train': {}}}) == []


def test_bootstrap_interval_is_seeded_and_brackets_the_mean():
    values = [0.3, -0.1, 0.5, 0.2, 0.0]
    low, high = report.bootstrap_ci(values)
    assert (low, high) == report.bootstrap_ci(values)  # deterministic
    assert min(values) <= low < np.mean(values) < high <= max(values)
    # Hand check on two values: resampled means are a, (a+b)/2, b with probability 1/4, 1/2, 1/4.
    assert report.bootstrap_ci([1.0, 3.0]) == pytest.approx((1.0, 3.0))
    assert report.bootstrap_ci([2.0]) == (None, None)
    assert report.mean_std([2.0]) == {'mean': 2.0, 'std': None}


@pytest.mark.parametrize('name', PAPER_STUDIES)
def test_paper_study_files_validate_without_data(name, capsys):
    before = {p for p in ('experiments', 'results') if (REPO / p).exists() and any((REPO / p).iterdir())}
    path = str(REPO / 'options' / 'study' / f'{name}.yml')
    assert cli.main(str(REPO), ['-opt', path, '--dry-run']) == 0
    out = capsys.readouterr().out
    study = plan.load_study(path, str(REPO))
    assert f'= {len(study.runs)} runs' in out and not (REPO / 'experiments' / study.name).exists()
    header = (REPO / 'options' / 'study' / f'{name}.yml').read_text().split('\n', 1)[0]
    assert header.startswith('# Paper Table')
    assert before == {p for p in ('experiments', 'results') if (REPO / p).exists() and any((REPO / p).iterdir())}


RETENTION = ['WiSE-FT']
DEMO_METHODS = ['Bicubic', 'Start', 'FT', 'FT+EMA', 'LP-FT', 'DeFT', 'LDT-paper', 'LDT-scaled', 'LDT-S-scaled',
                'WiSE-FT', 'L2-SP-0.002', 'L2-SP-0.02', 'L2-SP-0.2']
SECOND_METHODS = ['Bicubic', 'FT', 'FT+EMA', 'LP-FT', 'DeFT', 'LDT', 'LDT-S']
DISTORTION_METHODS = ['Start', 'FT', 'FT+EMA', 'LP-FT', 'DeFT', 'LDT-paper', 'LDT-scaled', 'LDT-S-scaled', 'WiSE-FT',
                      'L2-SP-0.001', 'L2-SP-0.01', 'L2-SP-0.1']
CLEAN_START = 'pretrained/demo/SAFMN_demo_Clean_x4.pth'


@pytest.mark.parametrize('name, seeds, sources, methods, start, budget', [
    ('demo', [0, 1, 2, 3, 4], ['Olympus'], DEMO_METHODS, CLEAN_START, 500),
    ('demo_olympus_pan', [0, 1, 2], ['Olympus', 'Pan'], SECOND_METHODS, 'pretrained/demo/SAFMN_demo_Mix_x4.pth', 500),
    ('distortion', [0, 1, 2, 3, 4], ['Pan'], DISTORTION_METHODS, CLEAN_START, 1500)])
def test_demo_study_files_validate(name, seeds, sources, methods, start, budget):
    study = plan.load_study(str(REPO / 'options' / 'study' / f'{name}.yml'), str(REPO))
    assert list(study.methods) == methods and study.seeds == seeds
    untrained = [m for m in methods if m in ('Bicubic', 'Start')]
    trained = [m for m in methods if m not in untrained and m not in RETENTION]
    alphas = [0.25, 0.5, 0.75] if 'WiSE-FT' in methods else []
    assert study.untrained == untrained and study.interpolations == ({'WiSE-FT': ('FT', alphas)} if alphas else {})
    assert len(study.runs) == len(untrained) + (len(trained) + len(alphas)) * len(seeds)
    assert [r.name for r in study.runs[:len(untrained)]] == untrained and not any(r.trained for r in study.runs[:len(untrained)])
    first = [r for r in study.runs if r.seed == seeds[0] and r.trained]
    assert [r.method for r in first] == trained
    assert [r.uses_ema for r in first] == [m == 'FT+EMA' for m in trained]
    assert next(r for r in first if r.method.startswith('LDT-S')).train_opt['ldt']['method'] == 'ldt_s'
    for run in study.runs:        # one budget and one start for every method, as the study file's rules say
        if run.trained:
            assert run.train_opt['train']['total_iter'] == budget
            assert run.train_opt['datasets']['train']['cameras'] == sources
            assert run.train_opt['path']['pretrain_network_g'] == start
        elif run.after is not None:
            assert run.test_opt['checkpoints'][0]['wise_ft']['start'] == start
    if name != 'demo_olympus_pan':  # the EMA rule: paper coefficients rescaled to the run, one unscaled control
        references = {r.method: (r.train_opt.get('ldt') or {}).get('ema_reference_iters') for r in first}
        assert {m: references[m] for m in ('DeFT', 'LDT-paper', 'LDT-scaled', 'LDT-S-scaled')} == {
            'DeFT': 40000, 'LDT-paper': None, 'LDT-scaled': 200000, 'LDT-S-scaled': 200000}
        lambdas = {r.method: r.train_opt['train'].get('l2_sp_weight') for r in first if r.method.startswith('L2-SP')}
        assert lambdas == {m: float(m.split('-')[-1]) for m in methods if m.startswith('L2-SP')}   # the file's rule
        assert [lambdas[m] for m in sorted(lambdas, key=lambdas.get)][1] * 10 == max(lambdas.values())


def test_partition_control_differs_from_ldt_paper_only_in_the_ranking():
    """options/study/distortion_partition.yml answers one question (does the variance ranking matter?)
    only if its control is LDT-paper with the ranking drawn at random and nothing else changed, each
    seed drawing its own, in the distortion study's regime (its FT and LDT-paper runs are that study's)."""
    from basicsr_ldt.models.ldt_model import ldt_config_from_options
    control = plan.load_study(str(REPO / 'options' / 'study' / 'distortion_partition.yml'), str(REPO))
    distortion = plan.load_study(str(REPO / 'options' / 'study' / 'distortion.yml'), str(REPO))
    assert control.reference == 'LDT-random' and control.seeds == distortion.seeds
    runs = {(r.method, r.seed): r.train_opt for r in control.runs if r.trained}
    same = {(r.method, r.seed): r.train_opt for r in distortion.runs if r.trained}

    def unnamed(opt):
        return {k: v for k, v in opt.items() if k != 'name'}
    for seed in control.seeds:
        for method in ('FT', 'LDT-paper', 'L2-SP-0.001'):
            assert unnamed(runs[method, seed]) == unnamed(same[method, seed])
        paper, random = runs['LDT-paper', seed], runs['LDT-random', seed]
        assert unnamed({**random, 'ldt': {**random['ldt'], 'criterion': 'var'}}) == unnamed(paper)
        assert random['ldt']['criterion'] == 'random' and ldt_config_from_options(random).seed == seed
    replication = plan.load_study(str(REPO / 'options' / 'study' / 'distortion_partition_replication.yml'), str(REPO))
    assert replication.seeds == [5, 6, 7, 8, 9] and replication.reference == 'LDT-random'
    for run in (r for r in replication.runs if r.trained):   # the same runs on new seeds
        first = runs[run.method, 0]
        assert {k: v for k, v in run.train_opt.items() if k not in ('name', 'manual_seed')} == {
            k: v for k, v in first.items() if k not in ('name', 'manual_seed')}


def shipped_studies(*names):
    """The shipped study files, loaded as scripts/study.py loads them."""
    return {name: plan.load_study(str(REPO / 'options' / 'study' / f'{name}.yml'), str(REPO)) for name in names}


def trained_options(study):
    """(method, seed) -> each trained run's options, less its folder name: what two studies must share."""
    return {(r.method, r.seed): {k: v for k, v in r.train_opt.items() if k != 'name'} for r in study.runs if r.trained}


def test_movement_studies_repeat_the_distortion_runs_and_differ_only_in_the_curve():
    """options/study/distortion_movement*.yml measure distances of the networks the distortion and partition
    studies trained: the same training options per method and seed; the fine file samples WiSE-FT closer to FT."""
    load = shipped_studies('distortion', 'distortion_partition', 'distortion_movement', 'distortion_movement_fine')
    earlier = {**trained_options(load['distortion']), **trained_options(load['distortion_partition'])}
    movement, fine = trained_options(load['distortion_movement']), trained_options(load['distortion_movement_fine'])
    assert {m for m, _ in movement} == {'FT', 'FT+EMA', 'LDT-paper', 'LDT-random', 'L2-SP-0.001', 'L2-SP-0.01',
                                        'L2-SP-0.1'}
    assert all(movement[key] == earlier[key] for key in movement) and all(fine[key] == movement[key] for key in fine)
    assert {m for m, _ in fine} == {'FT', 'FT+EMA', 'LDT-paper', 'LDT-random'}
    assert load['distortion_movement'].interpolations == {'WiSE-FT': ('FT', [0.25, 0.5, 0.75])}
    assert load['distortion_movement_fine'].interpolations == {
        'WiSE-FT': ('FT', [0.25, 0.5, 0.75, 0.8, 0.85, 0.9, 0.95])}
    assert all(s.start == 'Start' for s in load.values())


def test_the_far_mambair_study_repeats_the_mambair_runs_and_adds_only_fine_tuning_at_twice_the_lr():
    """distortion_mambair_far.yml answers distortion_mambair.yml's undecided rule on a curve that reaches
    LDT-paper's distance: its FT and LDT runs must be that study's, and FT-2lr FT with only the lr doubled."""
    load = shipped_studies('distortion_mambair', 'distortion_mambair_far')
    first, far = trained_options(load['distortion_mambair']), trained_options(load['distortion_mambair_far'])
    assert {m for m, _ in far} == {'FT', 'FT-2lr', 'LDT-paper', 'LDT-random'}
    assert all(far[key] == first[key] for key in far if key[0] != 'FT-2lr')
    for seed in range(5):
        doubled = far['FT-2lr', seed]
        assert doubled['train']['optim_g'].pop('lr') == 2 * first['FT', seed]['train']['optim_g'].pop('lr')
        assert doubled == first['FT', seed]
    assert load['distortion_mambair_far'].interpolations == {
        'WiSE-FT-2lr': ('FT-2lr', [0.25, 0.4, 0.5, 0.55, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95])}


def test_the_envelope_studies_repeat_the_distortion_runs_and_vary_fine_tuning_in_lr_alone():
    """distortion_envelope*.yml compare LDT-paper with the retention of a family of fine-tuning runs: FT, FT+EMA and
    the LDT runs are the distortion studies' own, FT-2lr and FT-4lr FT with only the lr scaled, and the second
    file adds only LDT's curves, measured against the first file's envelope."""
    load = shipped_studies('distortion', 'distortion_partition', 'distortion_envelope', 'distortion_envelope_ldt')
    earlier = {**trained_options(load['distortion']), **trained_options(load['distortion_partition'])}
    envelope, ldt = trained_options(load['distortion_envelope']), trained_options(load['distortion_envelope_ldt'])
    assert envelope == ldt and {m for m, _ in envelope} == {'FT', 'FT-2lr', 'FT-4lr', 'FT+EMA', 'LDT-paper',
                                                            'LDT-random'}
    assert {m for m, _ in envelope if (m, 0) in earlier} == {'FT', 'FT+EMA', 'LDT-paper', 'LDT-random'}
    assert all(envelope[key] == earlier[key] for key in envelope if key in earlier)
    for (method, seed), factor in ((m, f) for m in envelope for f in [{'FT-2lr': 2, 'FT-4lr': 4}.get(m[0])] if f):
        scaled = copy.deepcopy(envelope[method, seed])
        assert scaled['train']['optim_g'].pop('lr') == factor * earlier['FT', seed]['train']['optim_g']['lr']
        ft = copy.deepcopy(earlier['FT', seed])
        ft['train']['optim_g'].pop('lr')
        assert scaled == ft
    curves = {f'WiSE-FT{suffix}': (of, [0.25, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95])
              for suffix, of in (('', 'FT'), ('-2lr', 'FT-2lr'), ('-4lr', 'FT-4lr'), ('-EMA', 'FT+EMA'))}
    assert load['distortion_envelope'].interpolations == curves and load['distortion_envelope'].envelope == []
    assert load['distortion_envelope_ldt'].envelope == list(curves)
    assert load['distortion_envelope_ldt'].interpolations == {
        **curves, 'WiSE-FT-LDT': ('LDT-paper', [0.5, 0.7, 0.8, 0.85, 0.9, 0.95]),
        'WiSE-FT-LDT-random': ('LDT-random', [0.5, 0.7, 0.8, 0.85, 0.9, 0.95])}


def test_the_mambair_envelope_study_repeats_the_far_runs_and_adds_the_safmn_family():
    """distortion_mambair_envelope.yml asks the SAFMN envelope questions on MambaIR: FT, FT-2lr and the LDT runs
    are distortion_mambair_far.yml's own (the study reuses them), FT-4lr is FT with only the lr scaled, FT+EMA FT
    with only SAFMN's EMA added, and the envelope is the four fine-tuning curves at the far study's alphas."""
    load = shipped_studies('distortion_mambair_far', 'distortion_mambair_envelope', 'distortion_envelope')
    far = trained_options(load['distortion_mambair_far'])
    envelope = trained_options(load['distortion_mambair_envelope'])
    assert {m for m, _ in envelope} == {'FT', 'FT-2lr', 'FT-4lr', 'FT+EMA', 'LDT-paper', 'LDT-random'}
    assert all(envelope[key] == far[key] for key in far)
    safmn = trained_options(load['distortion_envelope'])
    for seed in range(5):
        scaled, ema = copy.deepcopy(envelope['FT-4lr', seed]), copy.deepcopy(envelope['FT+EMA', seed])
        assert scaled['train']['optim_g'].pop('lr') == 4 * far['FT', seed]['train']['optim_g']['lr']
        ft = copy.deepcopy(far['FT', seed])
        ft['train']['optim_g'].pop('lr')
        assert scaled == ft
        added = {k: ema['train'].pop(k) for k in ('ema_decay', 'ema_reference_iters')}
        assert added == {k: safmn['FT+EMA', seed]['train'][k] for k in added} and ema == far['FT', seed]
    alphas = [0.25, 0.4, 0.5, 0.55, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95]
    curves = {f'WiSE-FT{suffix}': (of, alphas)
              for suffix, of in (('', 'FT'), ('-2lr', 'FT-2lr'), ('-4lr', 'FT-4lr'), ('-EMA', 'FT+EMA'))}
    study = load['distortion_mambair_envelope']
    assert study.envelope == list(curves) and study.interpolations == {
        **curves, 'WiSE-FT-LDT': ('LDT-paper', [0.5, 0.7, 0.8, 0.85, 0.9, 0.95]),
        'WiSE-FT-LDT-random': ('LDT-random', [0.5, 0.7, 0.8, 0.85, 0.9, 0.95])}


def test_the_8lr_envelope_study_repeats_the_mambair_envelope_runs_and_adds_fine_tuning_at_8x_the_lr():
    load = shipped_studies('distortion_mambair_envelope', 'distortion_mambair_envelope_8lr')
    four, five = (trained_options(load[n]) for n in ('distortion_mambair_envelope', 'distortion_mambair_envelope_8lr'))
    assert set(five) - set(four) == {('FT-8lr', s) for s in range(5)} and all(five[k] == four[k] for k in four)
    for seed in range(5):
        scaled, ft = copy.deepcopy(five['FT-8lr', seed]), copy.deepcopy(four['FT', seed])
        assert scaled['train']['optim_g'].pop('lr') == 8 * ft['train']['optim_g'].pop('lr')
        assert scaled == ft
    study = load['distortion_mambair_envelope_8lr']
    curves = load['distortion_mambair_envelope'].interpolations
    assert study.envelope == ['WiSE-FT', 'WiSE-FT-2lr', 'WiSE-FT-4lr', 'WiSE-FT-8lr', 'WiSE-FT-EMA']
    assert study.interpolations == {**{k: v for k, v in curves.items() if 'LDT' not in k},
                                    'WiSE-FT-8lr': ('FT-8lr', curves['WiSE-FT-4lr'][1])}


def test_tiny_study_end_to_end_then_skips_and_collects(project, demo_data, capsys, monkeypatch):
    """Four runs (FT and LDT, two seeds) through the real entry points, in subprocesses."""
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    path = tiny_study(project, demo_data)
    assert cli.main(str(project), ['-opt', path]) == 0
    out = capsys.readouterr().out
    progress = [line for line in out.splitlines() if line.startswith('[') and 'done in' in line]
    assert len(progress) == 4 and progress[0].startswith('[1/4] FT_seed0: new, done in')
    assert 'about' in progress[0] and '3 run(s)' in progress[0] and '0 run(s)' in progress[-1]
    folder = project / 'results' / 'tiny'
    result = json.loads((folder / 'study.json').read_text())
    assert [(r['method'], r['seed']) for r in result['runs']] == [('FT', 0), ('LDT', 0), ('FT', 1), ('LDT', 1)]
    for run in result['runs']:
        metrics = json.loads((folder / run['run'] / 'metrics.json').read_text())['summary'][run['run']]
        assert run['cameras'] == {c: {m: metrics[c][m] for m in ('psnr', 'ssim')} for c in ('Sony', 'Canon')}
        assert (project / 'experiments' / 'tiny' / run['run'] / 'models' / 'net_g_latest.pth').is_file()
    assert [s['n'] for s in result['summary']] == [2, 2] and result['differences'][0]['method'] == 'LDT'
    assert (folder / 'study.png').stat().st_size > 1000
    assert (folder / 'study.csv').read_text().splitlines()[0].startswith('method,sweep,camera,n,psnr_mean')
    assert '## Paired differences to FT' in (folder / 'study.md').read_text()
    log = next((project / 'experiments' / 'tiny' / 'LDT_seed1').glob('train_tiny_LDT_seed1_*.log')).read_text()
    assert 'manual_seed: 1' in log
    # The live line's source: BasicSR's own log lines of the run (print_freq 1, 6 iterations).
    assert runner.logged_iteration(log) == 6
    console = (project / 'experiments' / 'tiny' / '_study' / 'LDT_seed1.out').read_text()
    assert runner.logged_iteration(console) == 6

    stamp = (folder / 'LDT_seed1' / 'metrics.json').stat().st_mtime
    assert cli.main(str(project), ['-opt', path]) == 0
    assert capsys.readouterr().out.count('finished earlier, skipped') == 4
    assert (folder / 'LDT_seed1' / 'metrics.json').stat().st_mtime == stamp

    os.remove(folder / 'FT_seed1' / 'metrics.json')
    commands_file = project / 'pending.sh'
    assert cli.main(str(project), ['-opt', path, '--commands', str(commands_file)]) == 0
    assert cli.main(str(project), ['-opt', path, '--commands', str(commands_file)]) == 0   # its own file: rewritten
    mark, line = commands_file.read_text().splitlines()
    assert mark == f"# written by scripts/study.py --commands: pending runs of study 'tiny' ({path})"
    assert 'test.py' in line and 'FT_seed1.test.yml' in line and 'Train_pip.py' not in line
    assert cli.main(str(project), ['-opt', path, '--collect']) == 0
    collected = json.loads((folder / 'study.json').read_text())
    assert [s['n'] for s in collected['summary']] == [1, 2] and collected['differences'][0]['seeds'] == [0]
    assert subprocess.run(['bash', '-c', line], capture_output=True, timeout=600).returncode == 0
    study = plan.load_study(path, str(project))
    assert [runner.run_state(str(project), study, r) for r in study.runs] == [runner.DONE] * 4


def test_logged_iteration_reads_basicsr_message_lines():
    assert runner.logged_iteration('no training yet') is None
    text = ('2026-11-23 15:00:01,001 INFO: [LDT_s..][epoch:  0, iter:     100, lr:(2.000e-04,)] [eta: 0:00:41, '
            'time (data): 0.041 (0.001)] l_primary: 1.2e-01 l_auxiliary: 1.3e-01\n'
            '2026-11-23 15:00:05,001 INFO: Validation val_targets\n\t # psnr: 22.1000\tBest: 22.1000 @ 900 iter\n'
            '2026-11-23 15:00:09,001 INFO: [LDT_s..][epoch: 12, iter:   1,200, lr:(1.000e-04,1.000e-04,)] '
            '[eta: 0:00:02, time (data): 0.040 (0.001)] l_primary: 1.1e-01\n')
    assert runner.logged_iteration(text) == 1200


def test_live_line_follows_a_training_process(tmp_path):
    """A process writing BasicSR log lines (a resumed run from iteration 400); the live line reports them."""
    log = tmp_path / 'run.out'
    script = ('import sys, time\n'
              'for it in range(400, 1001, 150):\n'
              '    print(f"INFO: [FT_se..][epoch:  1, iter:{it:8,d}, lr:(1.000e-04,)] [eta: 0:00:01] l_pix: 0.1", '
              'flush=True)\n'
              '    time.sleep(0.6)\n')
    stream = io.StringIO()
    with open(log, 'a', encoding='utf-8') as handle:
        handle.write('$ earlier output\n[FT_se..][epoch:  0, iter:     300, lr:(1.000e-04,)]\n')
        handle.flush()
        process = subprocess.Popen([sys.executable, '-c', script], stdout=handle, stderr=subprocess.STDOUT)
        line = runner.LiveLine(str(log), handle.tell(), 1000, 'FT_seed0', stream)
        assert runner.follow(process, line, every=0.2) == 0
    shown = stream.getvalue()
    assert 'FT_seed0: iter 400/1000 | ?it/s | ? left' in shown          # first line seen: no rate yet
    assert re.search(r'FT_seed0: iter (550|700|850)/1000 \| \d+(\.\d+)?it/s \| \d\d:\d\d left', shown)
    assert 'iter 300/' not in shown                                   # output before this step is not read
    assert line.bar.n == 1000                                          # the last line, read after the exit

    from basicsr_ldt.study.plan import evaluation_options
    base = {'test': {'tile_size': 0, 'compare': {'crops': 2}}, 'datasets': {'t': {'name': 't'}}}
    opt = evaluation_options(base, 'demo', 'FT_seed0', {'network_g': {'type': 'SAFMN'}, 'scale': 4}, '/r', ema=True)
    assert opt['test'] == {'tile_size': 0}
    assert opt['checkpoints'][0]['param_key'] == 'params_ema'
    assert base['test']['compare'] == {'crops': 2}       # the study's test file itself is untouched


def test_bicubic_method_is_one_untrained_run_paired_with_every_seed(project, demo_data, capsys):
    """Bicubic is tested once through test.py; the FT results are written by hand, so the
    differences below are checked against values computed here."""
    methods = {'FT': {}, 'Bicubic': {'bicubic': True}}
    study = plan.load_study(tiny_study(project, demo_data, seeds=[0, 1], methods=methods), str(project))
    assert [(r.name, r.seed, r.trained) for r in study.runs] == [
        ('Bicubic', None, False), ('FT_seed0', 0, True), ('FT_seed1', 1, True)]
    bicubic = study.runs[0]
    assert study.untrained == ['Bicubic'] and bicubic.source_cameras() == ['Olympus'] and not bicubic.uses_ema
    assert bicubic.test_opt['checkpoints'] == [{'label': 'Bicubic', 'bicubic': True}]
    assert 'network_g' not in bicubic.test_opt
    root = str(project)
    assert runner.run_state(root, study, bicubic) == runner.TEST
    assert [s[1] for s in runner.commands(root, study, bicubic, runner.TEST)] == [str(project / 'test.py')]
    runner.execute(root, study, [bicubic], say=print)
    assert runner.run_state(root, study, bicubic) == runner.DONE
    assert not (project / 'experiments' / 'tiny' / 'Bicubic').exists()   # nothing trained
    values = json.loads((project / 'results' / 'tiny' / 'Bicubic' / 'metrics.json').read_text())['summary']['Bicubic']
    bic = {cam: values[cam]['psnr'] for cam in ('Sony', 'Canon')}
    ft = {0: {'Sony': 30.0, 'Canon': 31.0}, 1: {'Sony': 32.0, 'Canon': 31.5}}
    for seed, cams in ft.items():
        folder = project / 'results' / 'tiny' / f'FT_seed{seed}'
        folder.mkdir(parents=True)
        summary = {cam: {'psnr': v, 'ssim': 0.5, 'images': 2} for cam, v in cams.items()}
        (folder / 'metrics.json').write_text(json.dumps({'summary': {f'FT_seed{seed}': summary}}))
    capsys.readouterr()
    assert cli.main(root, ['-opt', study.path, '--collect']) == 0
    result = json.loads((project / 'results' / 'tiny' / 'study.json').read_text())
    ft_row, bic_row = result['summary']
    assert bic_row['method'] == 'Bicubic' and bic_row['n'] == 1 and bic_row['cameras']['Sony']['psnr']['std'] is None
    assert bic_row['cameras']['Mean']['psnr']['mean'] == pytest.approx((bic['Sony'] + bic['Canon']) / 2)
    (diff,) = result['differences']
    assert diff['method'] == 'Bicubic' and diff['seeds'] == [0, 1]
    sony = [bic['Sony'] - ft[s]['Sony'] for s in (0, 1)]
    assert diff['cameras']['Sony']['psnr'] == pytest.approx({'mean': np.mean(sony), 'ci_low': min(sony),
                                                             'ci_high': max(sony)})
    means = [(bic['Sony'] + bic['Canon']) / 2 - (ft[s]['Sony'] + ft[s]['Canon']) / 2 for s in (0, 1)]
    assert diff['cameras']['Mean']['psnr']['mean'] == pytest.approx(np.mean(means))
    text = (project / 'results' / 'tiny' / 'study.md').read_text()
    assert f"| Bicubic | {bic['Sony']:.2f} | {bic['Canon']:.2f} |" in text and 'tested once (n = 1)' in text


@pytest.mark.parametrize('method, message', [
    ({'bicubic': True, 'train': {'total_iter': 3}}, "method 'B' has 'bicubic: true'.*takes no other key, got train"),
    ({'bicubic': 'yes'}, r"method 'B': bicubic: expected true \(it upscales the LR image; to leave the method out, "
                         r"remove it\), got 'yes'"),
    ({'bicubic': False}, "method 'B': bicubic: expected true .*got False"),    # audit 6: it trained FT as 'B'
    ({'start': False}, r"method 'B': start: expected true \(it tests the starting weights; .*got False"),
])
def test_bad_bicubic_method(tmp_path, demo_data, method, message):
    with pytest.raises(InputError, match=message):
        plan.load_study(tiny_study(tmp_path, demo_data, methods={'FT': {}, 'B': method}), str(tmp_path))


def test_jobs_run_several_runs_at_a_time_each_with_its_share_of_the_cores(tmp_path, demo_data, capsys,
                                                                           monkeypatch):
    """--jobs 2: two runs' processes overlap in time, each gets OMP_NUM_THREADS = cores / 2 when
    the user set none, every run prints its finished line; after a failure no new run starts."""
    root = str(tmp_path)
    study = plan.load_study(tiny_study(tmp_path, demo_data), root)   # 4 runs: FT, LDT x seeds 0, 1
    record = tmp_path / 'record'
    record.mkdir()
    fail = {'name': None}

    def fake_commands(root_, study_, run, state):   # each run: one process that records itself
        pause = 0.0 if run.name == fail['name'] else 1.0
        code = (f"import os, sys, time; t = time.time(); time.sleep({pause}); "
                f"open(r'{record}/{run.name}', 'w').write(f\"{{t}} {{time.time()}} {{os.environ.get('OMP_NUM_THREADS')}}\"); "
                f"sys.exit(1 if {run.name!r} == {fail['name']!r} else 0)")
        return [[sys.executable, '-c', code]]
    monkeypatch.setattr(runner, 'commands', fake_commands)
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    runner.execute(root, study, study.runs, say=print, jobs=2)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and all(': new, done in ' in line for line in lines)
    spans = {p.name: [float(v) for v in p.read_text().split()[:2]] for p in record.iterdir()}
    threads = {p.read_text().split()[2] for p in record.iterdir()}
    assert threads == {str(max(1, (os.cpu_count() or 1) // 2))}
    first, second = (spans[r.name] for r in study.runs[:2])
    assert second[0] < first[1] and first[0] < second[1]        # the first two ran side by side

    # A user's OMP_NUM_THREADS is kept; a failing run stops the study before its last run starts.
    for p in record.iterdir():
        p.unlink()
    monkeypatch.setenv('OMP_NUM_THREADS', '3')
    fail['name'] = study.runs[0].name
    with pytest.raises(runner.RunFailed, match=study.runs[0].name):
        runner.execute(root, study, study.runs, say=print, jobs=2)
    started = {p.name for p in record.iterdir()}     # the failure ends before the second run does
    assert started == {study.runs[0].name, study.runs[1].name}
    assert {p.read_text().split()[2] for p in record.iterdir()} == {'3'}


# ---------------------------------------------------------------- sweeps over several keys (issue 58)

#: Options every method of tiny_study has (FT and LDT), each with two values that pass the checks and
#: differ from the base file's (lr 1e-3, 6 iterations, gamma 0.5, warmup -1, patch 32, batch 2), so a
#: key that is not applied shows.
SWEEPABLE = {'train.optim_g.lr': [5e-4, 2e-4], 'train.total_iter': [8, 10], 'train.scheduler.gamma': [0.1, 0.2],
             'train.warmup_iter': [0, 1], 'datasets.train.gt_size': [48, 64],
             'datasets.train.batch_size_per_gpu': [3, 4]}


def dotted(opt, key):
    for part in key.split('.'):
        opt = opt[part]
    return opt


def assert_every_swept_key_applied(study, sweep):
    """Every run's training options hold the value of every swept key at that run's point, and the
    runs of each method and seed cover every combination once."""
    for run in study.runs:
        assert set(run.sweep) == set(sweep)
        for key, value in run.sweep.items():
            assert dotted(run.train_opt, key) == value, (run.name, key, dotted(run.train_opt, key), value)
    expected = sorted(itertools.product(*sweep.values()))
    for method in study.methods:
        for seed in study.seeds:
            points = sorted(tuple(r.sweep[k] for k in sweep) for r in study.runs
                            if r.method == method and r.seed == seed)
            assert points == expected, (method, seed)


def test_a_sweep_over_two_keys_applies_both_to_every_run(tmp_path, demo_data):
    """A study sweeping the learning rate and the run length: the user relies on run
    'FT_lr=0.0005_total_iter=8_seed0' training with lr 5e-4 for 8 iterations, i.e. on every swept key
    being in every point's options (else differently named runs train the same thing). Kills the slip
    that merges each key into the method's options afresh (only the last key then survives)."""
    sweep = {'train.optim_g.lr': [1e-3, 5e-4], 'train.total_iter': [6, 8]}
    study = plan.load_study(tiny_study(tmp_path, demo_data, sweep=sweep), str(tmp_path))
    assert len(study.runs) == 2 * 4 * 2
    run = next(r for r in study.runs if r.name == 'FT_lr=0.0005_total_iter=8_seed0')
    assert run.train_opt['train']['optim_g']['lr'] == 5e-4 and run.train_opt['train']['total_iter'] == 8
    assert_every_swept_key_applied(study, sweep)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.sampled_from(sorted(SWEEPABLE)), min_size=2, max_size=4, unique=True),
       counts=st.lists(st.integers(1, 2), min_size=4, max_size=4))
def test_every_swept_key_is_in_every_points_options(tmp_path, demo_data, keys, counts):
    """Property over sets of swept keys (two to four, with one or two values each): every run's
    options hold every swept key's value at its point, and each method and seed has every
    combination once. Kills any slip that drops, restarts or reorders the merge of the sweep keys."""
    sweep = {key: SWEEPABLE[key][:n] for key, n in zip(keys, counts)}
    folder = Path(tempfile.mkdtemp(dir=tmp_path))   # one folder per example (tmp_path is shared by all)
    study = plan.load_study(tiny_study(folder, demo_data, sweep=sweep), str(folder))
    assert_every_swept_key_applied(study, sweep)


def test_missing_inputs_name_each_absent_folder_and_start_once_relative_to_the_root(tmp_path, demo_data):
    """Before a study starts (and in --dry-run) the user is told every data folder and starting
    weight file that is not there, each once however many runs need it, with the option that names
    it; relative paths are read from the project root, and a file where a folder is expected is
    missing. Kills mutants of ``missing_inputs`` (it had no in-process test: mutation testing, issue 58)."""
    path = tiny_study(tmp_path, demo_data, methods={'FT': {}, 'B': {'bicubic': True}})
    assert plan.missing_inputs(plan.load_study(path, str(tmp_path)), str(tmp_path)) == []
    (tmp_path / 'here' / 'lr').mkdir(parents=True)
    (tmp_path / 'here' / 'file').write_text('not a folder')
    base = plan.read_yaml(str(tmp_path / 'base.yml'), 'base')
    base['datasets']['train']['dataroot_lq'] = 'gone/train_LR'
    base['datasets']['train']['dataroot_gt'] = 'here/file'
    base['path']['pretrain_network_g'] = 'gone/start.pth'
    write(tmp_path / 'base.yml', base)
    test = plan.read_yaml(str(tmp_path / 'test.yml'), 'test')
    test['datasets']['test_1']['dataroot_gt'] = 'gone/test_HR'
    test['datasets']['test_1']['dataroot_lq'] = 'here/lr'
    write(tmp_path / 'test.yml', test)
    study = plan.load_study(path, str(tmp_path))
    assert [r.trained for r in study.runs] == [False, True, True]
    assert plan.missing_inputs(study, str(tmp_path)) == [
        "test datasets.test_1.dataroot_gt 'gone/test_HR'",      # the Bicubic row's test comes first
        "train datasets.train.dataroot_gt 'here/file'",
        "train datasets.train.dataroot_lq 'gone/train_LR'",
        "path.pretrain_network_g 'gone/start.pth'"]
    (tmp_path / 'gone').mkdir()
    (tmp_path / 'gone' / 'start.pth').write_bytes(b'')
    assert plan.missing_inputs(study, str(tmp_path)) == [
        "test datasets.test_1.dataroot_gt 'gone/test_HR'", "train datasets.train.dataroot_gt 'here/file'",
        "train datasets.train.dataroot_lq 'gone/train_LR'"]


@pytest.mark.parametrize('key, message', [
    ('train.optim_g.nope.lr', "the options have no section 'train.optim_g.nope' to set 'lr' in"),
    ('train.total_iter.x', "the options have no section 'train.total_iter' to set 'x' in"),
    ('nope.lr', "the options have no section 'nope' to set 'lr' in"),
])
def test_a_sweep_into_a_section_the_options_lack_is_one_line_naming_the_missing_part(tmp_path, demo_data, key,
                                                                                    message):
    """A sweep key must land in an existing section of every method (else the points would train the
    same thing); the line names the first missing (or non-mapping) part at any depth and the key
    that would be set. Kills the depth and message mutants of ``_check_sweep_section`` (issue 58)."""
    path = tiny_study(tmp_path, demo_data, methods={'FT': {}}, sweep={key: [1, 2]})
    with pytest.raises(InputError) as err:
        plan.load_study(path, str(tmp_path))
    assert str(err.value) == f"sweep '{key}' (method 'FT'): {message}"


def test_a_start_named_like_a_release_is_looked_up_where_fetch_weights_puts_it(tmp_path, demo_data, monkeypatch):
    """A start named like a released model counts as present when its file is where
    ``fetch_weights.py`` puts it, not under the project root (mutation testing, issue 58)."""
    path = tiny_study(tmp_path, demo_data, methods={'FT': {}})
    fetched = tmp_path / 'pretrained' / 'Release_x4.pth'
    fetched.parent.mkdir()
    fetched.write_bytes(b'')
    monkeypatch.setattr(plan, 'release_file', lambda name: str(fetched) if name == 'Release_x4' else None)
    base = plan.read_yaml(str(tmp_path / 'base.yml'), 'base')
    base['path']['pretrain_network_g'] = 'Release_x4'
    write(tmp_path / 'base.yml', base)
    assert plan.missing_inputs(plan.load_study(path, str(tmp_path)), str(tmp_path)) == []
    fetched.unlink()
    assert plan.missing_inputs(plan.load_study(path, str(tmp_path)), str(tmp_path)) == [
        "path.pretrain_network_g 'Release_x4'"]


@pytest.mark.parametrize('freeze, earlier, alphas', [
    ('distortion_mambair_freeze', ('distortion_mambair',), [0.25, 0.4, 0.5, 0.55, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95]),
    ('distortion_freeze', ('distortion', 'distortion_partition'), [0.25, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95]),
])
def test_the_freezing_studies_repeat_the_distortion_runs_and_differ_from_ldt_only_in_what_trains(freeze, earlier,
                                                                                                alphas):
    """distortion_(mambair_)freeze.yml compare LDT-paper with freezing its unstable layers: FT and LDT-paper are the
    distortion studies' own runs, and each control is LDT-paper's (or LDT-random's) options with the method switched
    and the exchange keys, which a control does not read, left out; the study is read against FT-stable."""
    load = shipped_studies(freeze, *earlier)
    first = {key: options for name in earlier for key, options in trained_options(load[name]).items()}
    runs = trained_options(load[freeze])
    assert {m for m, _ in runs} == {'FT', 'LDT-paper', 'FT-stable', 'FT-stable-random', 'FT-unstable'}
    assert all(runs[key] == first[key] for key in runs if key[0] in ('FT', 'LDT-paper'))
    controls = {'FT-stable': ('LDT-paper', 'ft_stable'), 'FT-stable-random': ('LDT-random', 'ft_stable'),
                'FT-unstable': ('LDT-paper', 'ft_unstable')}
    for seed in range(5):
        for control, (ldt_run, method) in controls.items():
            ldt, options = copy.deepcopy(first[ldt_run, seed]), copy.deepcopy(runs[control, seed])
            assert options['ldt'].pop('method') == method and ldt['ldt'].pop('method') == 'ldt'
            assert {k: ldt['ldt'].pop(k) for k in ('dpu', 'ema_every')} == {'dpu': True, 'ema_every': 1}
            assert options == ldt
    study = load[freeze]
    assert study.reference == 'FT-stable' and study.interpolations == {'WiSE-FT': ('FT', alphas)}
