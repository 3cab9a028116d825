"""Retention controls (issue 57): the Start row, WiSE-FT weights and study runs, and the trade-off
figure "targets' Mean above the WiSE-FT curve at the same source gain".

What a user relies on: WiSE-FT tests exactly (1 - alpha) theta_start + alpha theta_run of every
parameter and buffer (the EMA weights where the run is tested by them), runs after the run it
reads and is redone when that run changes; bad alphas, specs and starts are one line with nothing
written; and the trade-off figure is the height above each seed's curve, interpolated along it,
never extrapolated. References are computed here by hand.
"""
import json
import os
import time

import numpy as np
import pytest
import torch
from torch import nn

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.study import cli, plan, report, run as runner, tradeoff
from basicsr_ldt.weights.interpolate import interpolate_states, wise_ft_state
from conftest import run_entry
from test_cli import NETWORK, dataset, write
from test_hardening import assert_one_line_failure, last_line
from test_study import tiny_study


class WithBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.norm = nn.BatchNorm2d(4)            # float running stats and an integer counter


def _states(seed_start: int = 0, seed_run: int = 1):
    torch.manual_seed(seed_start)
    start = WithBuffers()
    start.norm.running_mean.normal_()
    start.norm.num_batches_tracked.fill_(0)
    torch.manual_seed(seed_run)
    run = WithBuffers()
    run.norm.running_var.uniform_(0.5, 2.0)
    run.norm.num_batches_tracked.fill_(500)
    return start.state_dict(), run.state_dict()


@pytest.mark.parametrize('alpha', [0.0, 0.25, 0.5, 0.75, 1.0])
def test_wise_ft_is_the_float64_interpolation_of_every_parameter_and_buffer(alpha):
    start, run = _states()
    mixed = interpolate_states(start, run, alpha)
    assert list(mixed) == list(run)
    for key, end in run.items():
        if end.is_floating_point():
            expected = (1 - alpha) * start[key].double() + alpha * end.double()
            torch.testing.assert_close(mixed[key].double(), expected, rtol=0, atol=1e-6)
            assert mixed[key].dtype == end.dtype
        else:                                                   # the counter: the run's, the start's at 0
            assert int(mixed[key]) == (int(end) if alpha > 0 else int(start[key]))


def _checkpoints(tmp_path):
    """A start and a run of the test network (the run with distinct params and params_ema)."""
    from basicsr.archs import build_network
    torch.manual_seed(0)
    start = build_network(dict(NETWORK)).state_dict()
    torch.manual_seed(1)
    run = build_network(dict(NETWORK)).state_dict()
    torch.manual_seed(2)
    ema = build_network(dict(NETWORK)).state_dict()
    torch.save({'params': start}, tmp_path / 'start.pth')
    torch.save({'params': run, 'params_ema': ema}, tmp_path / 'run.pth')
    return start, run, ema


def test_the_named_weights_of_the_run_are_interpolated(tmp_path):
    start, run, ema = _checkpoints(tmp_path)
    from basicsr.archs import build_network
    network = build_network(dict(NETWORK))
    state = wise_ft_state(network, str(tmp_path / 'run.pth'), 'params_ema', str(tmp_path / 'start.pth'), 'params',
                          0.3, 'checkpoints[0]')
    for key in start:
        torch.testing.assert_close(state[key].double(), 0.7 * start[key].double() + 0.3 * ema[key].double())


@pytest.mark.parametrize('change, message', [
    (lambda e: e['wise_ft'].update(alpha=1.5), r'checkpoints\[0\]\.wise_ft\.alpha: expected a number in \[0, 1\], got 1\.5'),
    (lambda e: e['wise_ft'].update(alpha=-0.1), r'checkpoints\[0\]\.wise_ft\.alpha: expected a number in \[0, 1\]'),
    (lambda e: e['wise_ft'].pop('alpha'), r'checkpoints\[0\]\.wise_ft\.alpha: required'),
    (lambda e: e['wise_ft'].update(alhpa=0.5), r"unknown option 'alhpa' in checkpoints\[0\]\.wise_ft"),
    (lambda e: e['wise_ft'].update(start='OTHER'), r"checkpoints\[0\]\.wise_ft\.start '.*other\.pth' does not fit "
                                                   r'network MSRResNet: keys'),
])
def test_test_py_refuses_a_bad_wise_ft_entry_in_one_line_and_writes_nothing(project, demo_data, tmp_path, change,
                                                                           message):
    _checkpoints(tmp_path)
    torch.save({'params': {'conv.weight': torch.zeros(1)}}, tmp_path / 'other.pth')
    entry = {'label': 'wise', 'path': str(tmp_path / 'run.pth'),
             'wise_ft': {'start': str(tmp_path / 'start.pth'), 'alpha': 0.5}}
    change(entry)
    if entry['wise_ft'].get('start') == 'OTHER':
        entry['wise_ft']['start'] = str(tmp_path / 'other.pth')
    opt = {'name': 'bad', 'scale': 4, 'num_gpu': 0, 'network_g': NETWORK, 'path': {}, 'checkpoints': [entry],
           'datasets': {'test_1': dataset(demo_data, 'Test', ['Sony'])}, 'test': {'tile_size': 0}}
    result = run_entry(project, 'test.py', '-opt', write(project / 'bad.yml', opt), check=False)
    assert result.returncode == 2 and 'Traceback' not in result.stderr
    import re
    assert re.search(message, last_line(result)), last_line(result)
    assert not (project / 'results' / 'bad').exists()


def _wise_study(tmp_path, data, **changes):
    start, _, _ = _checkpoints(tmp_path)
    methods = {'Start': {'start': True}, 'FT': {}, 'FT+EMA': {'train': {'ema_decay': 0.9}},
               'WiSE-FT': {'wise_ft': {'of': 'FT', 'alphas': [0.25, 0.5]}},
               'WiSE-EMA': {'wise_ft': {'of': 'FT+EMA', 'alphas': [0.5]}}}
    path = tiny_study(tmp_path, data, methods=changes.pop('methods', methods), **changes)
    base = plan.read_yaml(str(tmp_path / 'base.yml'), 'base')
    base['path']['pretrain_network_g'] = str(tmp_path / 'start.pth')
    write(tmp_path / 'base.yml', base)
    return path


def test_start_and_wise_ft_expand_into_test_only_runs_after_the_runs_they_read(tmp_path, demo_data):
    study = plan.load_study(_wise_study(tmp_path, demo_data), str(tmp_path))
    names = [r.name for r in study.runs]
    assert names == ['Start', 'FT_seed0', 'FT+EMA_seed0', 'FT_seed1', 'FT+EMA_seed1',
                     'WiSE-FT_alpha=0.25_seed0', 'WiSE-FT_alpha=0.5_seed0', 'WiSE-EMA_alpha=0.5_seed0',
                     'WiSE-FT_alpha=0.25_seed1', 'WiSE-FT_alpha=0.5_seed1', 'WiSE-EMA_alpha=0.5_seed1']
    assert study.start == 'Start' and study.untrained == ['Start']
    assert study.interpolations == {'WiSE-FT': ('FT', [0.25, 0.5]), 'WiSE-EMA': ('FT+EMA', [0.5])}
    start = study.runs[0]
    assert start.test_opt['checkpoints'] == [{'label': 'Start', 'path': str(tmp_path / 'start.pth')}]
    assert start.test_opt['path'] == {'param_key_g': 'params'}   # BasicSR's key: a release without it falls back
    wise = study.runs[names.index('WiSE-FT_alpha=0.5_seed1')]
    checkpoint = plan.final_checkpoint(str(tmp_path), 'tiny', 'FT_seed1')
    assert not wise.trained and wise.seed == 1 and wise.after == 'FT_seed1' and wise.inputs == [checkpoint]
    assert wise.sweep == {plan.ALPHA: 0.5} and wise.source_cameras() == ['Olympus']
    assert wise.test_opt['checkpoints'] == [{'label': wise.name, 'path': checkpoint, 'param_key': 'params',
                                             'wise_ft': {'start': str(tmp_path / 'start.pth'), 'alpha': 0.5}}]
    assert wise.test_opt['path'] == {'param_key_g': 'params'}
    ema = study.runs[names.index('WiSE-EMA_alpha=0.5_seed0')]
    assert ema.test_opt['checkpoints'][0]['param_key'] == 'params_ema'      # what FT+EMA is tested by


@pytest.mark.parametrize('methods, message', [
    ({'FT': {}, 'W': {'wise_ft': {'of': 'FT', 'alphas': [0.5, 1.2]}}}, r"wise_ft\.alphas: expected a non-empty list "
                                                                        r'of distinct numbers in \[0, 1\]'),
    ({'FT': {}, 'W': {'wise_ft': {'of': 'FT', 'alphas': []}}}, r'wise_ft\.alphas: expected a non-empty list'),
    ({'FT': {}, 'W': {'wise_ft': {'of': 'Ft', 'alphas': [0.5]}}}, r"wise_ft\.of 'Ft' is not another method of the study \(FT\)"),
    ({'FT': {}, 'B': {'bicubic': True}, 'W': {'wise_ft': {'of': 'B', 'alphas': [0.5]}}}, r"wise_ft\.of 'B' trains nothing"),
    ({'FT': {}, 'W': {'wise_ft': {'of': 'FT', 'alphas': [0.5]}, 'train': {}}}, r'so it takes no other key, got train'),
    ({'FT': {}, 'W': {'wise_ft': {'of': 'FT'}}}, r'wise_ft: expected \{of: <method>, alphas'),
    ({'FT': {}, 'S': {'start': True}, 'T': {'start': True}}, r"methods S, T all have 'start: true'"),
    ({'FT': {}, 'S': {'start': 'yes'}},
     r"method 'S': start: expected true \(it tests the starting weights; to leave the method out, remove it\), got 'yes'"),
])
def test_bad_retention_methods_are_one_error_before_anything_is_written(tmp_path, demo_data, capsys, methods, message):
    path = _wise_study(tmp_path, demo_data, methods=methods)
    with pytest.raises(InputError, match=message):
        plan.load_study(path, str(tmp_path))
    with pytest.raises(SystemExit):
        cli.main(str(tmp_path), ['-opt', path])
    assert capsys.readouterr().err.strip().count('\n') == 0
    assert not (tmp_path / 'experiments').exists() and not (tmp_path / 'results').exists()


def test_a_wise_ft_reference_is_refused(tmp_path, demo_data):
    """``reference: WiSE-FT`` passed --dry-run, and the report then paired no method with it."""
    with pytest.raises(InputError, match=r"reference 'WiSE-FT' is a WiSE-FT method, one row per alpha, which no other "
                                         r'method is paired with; expected a method that trains'):
        plan.load_study(_wise_study(tmp_path, demo_data, reference='WiSE-FT'), str(tmp_path))
    for reference in ('Start', 'FT+EMA'):
        assert plan.load_study(_wise_study(tmp_path, demo_data, reference=reference), str(tmp_path)).reference == reference


def test_a_start_row_needs_a_start_and_wise_ft_a_run_that_has_one(tmp_path, demo_data):
    for methods, message in (({'FT': {}, 'S': {'start': True}}, r"'start: true' tests the weights the runs start "
                                                               r'from, and the base training options name none'),
                             ({'FT': {}, 'W': {'wise_ft': {'of': 'FT', 'alphas': [0.5]}}},
                              r"wise_ft\.of 'FT' starts from no weights")):
        path = tiny_study(tmp_path, demo_data, methods=methods)
        with pytest.raises(InputError, match=message):
            plan.load_study(path, str(tmp_path))


def test_wise_ft_waits_for_its_run_and_is_redone_when_the_run_changes(tmp_path, demo_data, monkeypatch):
    study = plan.load_study(_wise_study(tmp_path, demo_data, seeds=[0]), str(tmp_path))
    order = []
    monkeypatch.setattr(runner, '_call', lambda root, study, run, step, *a, **k: order.append(run.name))
    runner.execute(str(tmp_path), study, list(reversed(study.runs)), say=lambda line: None, jobs=2)
    trained = {'Start', 'FT_seed0', 'FT+EMA_seed0'}
    first_wise = min(i for i, name in enumerate(order) if name.startswith('WiSE'))
    assert set(order[:first_wise]) == trained and len(order) - first_wise == 3
    wise = next(r for r in study.runs if r.name == 'WiSE-FT_alpha=0.5_seed0')
    results, checkpoint = plan.results_file(str(tmp_path), 'tiny', wise.name), wise.inputs[0]
    for path in (checkpoint, results):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, 'w').close()
    assert runner.run_state(str(tmp_path), study, wise) == runner.DONE
    later = time.time() + 10
    os.utime(checkpoint, (later, later))                          # FT trained again after the test
    assert runner.run_state(str(tmp_path), study, wise) == runner.TEST


# ---------------------------------------------------------------- the trade-off figure

def _record(method, seed, source, target, sweep=None):
    """One run: source camera Olympus, one target Sony (so the gains are these PSNRs minus the start's)."""
    return {'run': f'{method}_{seed}', 'method': method, 'seed': seed, 'sweep': sweep or {}, 'sources': ['Olympus'],
            'cameras': {'Olympus': {'psnr': source, 'ssim': 0.5}, 'Sony': {'psnr': target, 'ssim': 0.5}}}


def _tradeoff_records():
    start = {**_record('Start', None, 30.0, 30.0), 'seed': None}
    records = [start, {**_record('Bicubic', None, 29.0, 29.0), 'seed': None}]   # not fine-tuned: not a point
    # Seed 0's curve: (0, 0) -> alpha 0.5 (0.2, 0.3) -> FT (0.4, -0.1). Seed 1's: (0, 0) -> (0.2, 0.1) -> (0.6, 0.1).
    curves = {0: [(0.2, 0.3), (0.4, -0.1)], 1: [(0.2, 0.1), (0.6, 0.1)]}
    for seed, ((wx, wy), (fx, fy)) in curves.items():
        records.append(_record('WiSE', seed, 30 + wx, 30 + wy, {plan.ALPHA: 0.5}))
        records.append(_record('FT', seed, 30 + fx, 30 + fy))
    # LDT at source gain 0.3: seed 0 curve there 0.1 (halfway 0.3 -> -0.1), seed 1 curve 0.1.
    records += [_record('LDT', 0, 30.3, 30.25), _record('LDT', 1, 30.3, 30.05)]
    # Far: source gain 0.7 on seed 0 (curve ends at 0.4) and 0.9 on seed 1 (ends at 0.6).
    records += [_record('Far', 0, 30.7, 30.0), _record('Far', 1, 30.9, 30.1)]
    return records


class FakeStudy:
    seeds = [0, 1]
    start = 'Start'
    untrained = ['Start', 'Bicubic']
    interpolations = {'WiSE': ('FT', [0.5])}
    envelope = []
    methods = {'Start': {}, 'Bicubic': {}, 'FT': {}, 'WiSE': {}, 'LDT': {}, 'Far': {}}

    def sweep_points(self):
        return [{}]

    method_points = plan.Study.method_points


def test_above_the_curve_is_the_height_over_each_seeds_curve_at_the_same_source_gain():
    table = tradeoff.tradeoff(FakeStudy(), _tradeoff_records(), report.bootstrap_ci)
    rows = {r['method']: r for r in table['rows']}
    assert set(rows) == {'FT', 'WiSE', 'LDT', 'Far'}
    ldt = rows['LDT']
    assert ldt['source_gain']['mean'] == pytest.approx(0.3) and ldt['target_gain']['mean'] == pytest.approx(0.15)
    # Heights: seed 0 0.25 - 0.1 = 0.15; seed 1 0.05 - 0.1 = -0.05; mean 0.05, bootstrap over two values.
    assert ldt['above_curve']['mean'] == pytest.approx(0.05)
    assert (ldt['above_curve']['ci_low'], ldt['above_curve']['ci_high']) == pytest.approx((-0.05, 0.15))
    assert rows['FT']['above_curve']['mean'] == pytest.approx(0.0)           # its own end of the curve
    far = rows['Far']['above_curve']
    assert 'mean' not in far and [o['seed'] for o in far['outside']] == [0, 1]
    assert far['outside'][0]['curve_range'] == pytest.approx([0.0, 0.4])
    # Nearest points: seed 0 (0.7, 0) to FT (0.4, -0.1); seed 1 (0.9, 0.1) to FT (0.6, 0.1).
    assert [o['distance'] for o in far['outside']] == pytest.approx([np.hypot(0.3, 0.1), 0.3])
    (curve,) = table['curves']
    assert curve['alphas'] == [0.0, 0.5, 1.0]
    np.testing.assert_allclose(curve['mean'], [[0.0, 0.0], [0.2, 0.2], [0.5, 0.0]], atol=1e-9)
    text = '\n'.join(tradeoff.markdown_lines(table, report.point_key))
    assert '| LDT | +0.300 ± 0.000 | +0.150 ± 0.141 | **+0.050** [-0.050, +0.150] | 2 |' in text
    assert "outside the curve's range for 2 of 2 seeds" in text and '(the curve)' in text


def test_where_the_curve_passes_a_source_gain_twice_the_highest_value_counts():
    curve = [(0.0, 0.0), (0.4, 0.2), (0.2, -0.3)]         # goes out to 0.4 and comes back
    assert tradeoff.curve_value(curve, 0.3) == pytest.approx(max(0.15, -0.3 + 0.5 * 0.5))
    assert tradeoff.curve_value(curve, 0.5) is None


def test_every_study_with_a_start_writes_the_picture_and_section(tmp_path):
    result = report.aggregate(FakeStudyForReport(), _tradeoff_records())
    paths = report.write_report(str(tmp_path), result)
    assert str(tmp_path / 'tradeoff.png') in paths and (tmp_path / 'tradeoff.png').stat().st_size > 5000
    text = (tmp_path / 'study.md').read_text()
    assert '## Trade-off: gains over the start' in text
    assert ("Bicubic: the LR image upscaled bicubically (`cv2.resize` INTER_CUBIC), measured by the same code; Start: "
            "the weights every run starts from (the base training options' `path.pretrain_network_g`). No training;"
            in text)   # the start was described as bicubic upscaling
    saved = json.loads((tmp_path / 'study.json').read_text())['tradeoff']
    assert [r['method'] for r in saved['rows']] == ['FT', 'WiSE', 'LDT', 'Far']
    no_start = report.aggregate(FakeStudyForReport(), _tradeoff_records()[1:])
    assert no_start['tradeoff'] is None
    assert 'needs the start tested' in report.markdown(no_start)


class FakeStudyForReport(FakeStudy):
    name, path, train, test, reference, sweep = 'fake', 'fake.yml', 'train.yml', 'test.yml', 'FT', {}
    runs = []

    def cameras(self):
        return ['Olympus', 'Sony']


def test_start_and_wise_ft_tests_write_where_a_user_looks_at_the_trained_scale(tmp_path, demo_data):
    """The results of every test-only run land in results/<study>/<run>/ (the test file's name), at
    the scale the runs were trained for, reading the final weights BasicSR saves; written out here,
    not through the planner's own helpers (mutation testing: a survivor compared a path with itself)."""
    path = _wise_study(tmp_path, demo_data, seeds=[1])
    base = plan.read_yaml(str(tmp_path / 'base.yml'), 'base')
    base['scale'] = 2                                              # the test file says 4
    base['network_g'] = {**base['network_g'], **{k: 2 for k in ('upscale', 'upscaling_factor') if k in base['network_g']}}
    write(tmp_path / 'base.yml', base)
    study = plan.load_study(path, str(tmp_path))
    runs = {r.name: r for r in study.runs}
    assert runs['Start'].test_opt['name'] == 'tiny/Start' and runs['Start'].test_opt['scale'] == 2
    wise = runs['WiSE-EMA_alpha=0.5_seed1']
    assert wise.test_opt['name'] == 'tiny/WiSE-EMA_alpha=0.5_seed1' and wise.test_opt['scale'] == 2
    checkpoint = str(tmp_path / 'experiments' / 'tiny' / 'FT+EMA_seed1' / 'models' / 'net_g_latest.pth')
    assert wise.inputs == [checkpoint] and wise.test_opt['checkpoints'][0]['path'] == checkpoint
    assert wise.test_opt['checkpoints'][0]['label'] == wise.name and wise.after == 'FT+EMA_seed1'
    assert wise.test_opt['network_g'] == runs['FT+EMA_seed1'].train_opt['network_g']
    assert plan.results_file(str(tmp_path), 'tiny', wise.name) == str(
        tmp_path / 'results' / 'tiny' / 'WiSE-EMA_alpha=0.5_seed1' / 'metrics.json')
    assert 'compare' not in (wise.test_opt.get('test') or {}) and wise.test_opt['path'] == {'param_key_g': 'params'}
    assert runs['Start'].untrained_sources == ['Olympus'] and 'network_g' in runs['Start'].test_opt


def test_test_py_reads_each_checkpoint_entry_as_written():
    """``checkpoints_of`` in-process (the test.py runs above are subprocesses mutmut cannot see):
    defaults from ``path``, a bare string entry, a WiSE-FT entry beside a plain one, and what a
    Bicubic entry refuses."""
    from basicsr_ldt.pipelines.evaluate import checkpoints_of
    assert checkpoints_of({'path': {'pretrain_network_g': 'w/net_g_5.pth'}}) == [
        {'label': 'net_g_5', 'path': 'w/net_g_5.pth', 'bicubic': False, 'param_key': 'params', 'exact_key': False}]
    assert checkpoints_of({'path': {'pretrain_network_g': 'w/a.pth', 'param_key_g': 'params_ema'}})[0][
        'param_key'] == 'params_ema'
    entries = checkpoints_of({'path': {'param_key_g': 'params_ema'}, 'checkpoints': [
        'runs/ft.pth', {'label': 'W', 'path': 'runs/ft.pth', 'wise_ft': {'start': 's.pth', 'alpha': 1}}]})
    assert entries == [
        {'label': 'ft', 'path': 'runs/ft.pth', 'bicubic': False, 'param_key': 'params_ema', 'exact_key': False},
        {'label': 'W', 'path': 'runs/ft.pth', 'bicubic': False, 'param_key': 'params_ema', 'exact_key': False,
         'wise_ft': {'start': 's.pth', 'alpha': 1.0, 'start_param_key': 'params_ema', 'start_exact': False}}]
    assert isinstance(entries[1]['wise_ft']['alpha'], float)
    with pytest.raises(InputError, match=r"^checkpoints\[0\]: an entry with 'bicubic: true' upscales the LR image "
                                         r'and loads no weights, so it takes no path or param_key$'):
        checkpoints_of({'checkpoints': [{'bicubic': True, 'path': 'a.pth', 'param_key': 'params'}]})
    with pytest.raises(InputError, match=r"^checkpoints\[1\]: an entry with 'bicubic: true' loads no weights to "
                                         r'interpolate \(wise_ft\)$'):
        checkpoints_of({'checkpoints': ['a.pth', {'bicubic': True, 'wise_ft': {'start': 's', 'alpha': 0.5}}]})
    with pytest.raises(InputError, match=r'^checkpoints\[0\]\.wise_ft: expected a mapping'):
        checkpoints_of({'checkpoints': [{'path': 'a.pth', 'wise_ft': 0.5}]})


def test_a_bicubic_row_is_planned_as_one_seedless_test_of_the_lr_upscaled(tmp_path, demo_data):
    """In-process (the end-to-end Bicubic test runs test.py in a subprocess)."""
    study = plan.load_study(tiny_study(tmp_path, demo_data, methods={'FT': {}, 'B': {'bicubic': True}}), str(tmp_path))
    bicubic = study.runs[0]
    assert bicubic.name == 'B' and bicubic.seed is None and not bicubic.trained and study.untrained == ['B']
    assert bicubic.test_opt['checkpoints'] == [{'label': 'B', 'bicubic': True}]
    assert bicubic.test_opt['name'] == 'tiny/B' and bicubic.test_opt['scale'] == 4 and 'network_g' not in bicubic.test_opt
    assert bicubic.description.startswith('no training: bicubic upscaling')


def test_retention_runs_carry_the_start_key_their_description_and_accept_the_ends_of_alpha(tmp_path, demo_data):
    """With ``path.param_key_g: params_ema`` in the base file, the Start row and every WiSE-FT start
    read that key; the plan (``--dry-run``) describes each WiSE-FT run by what it interpolates; alphas
    0 and 1 (the start and the run) are accepted; a run without a start is one whole line. Kills the
    key, description and bound mutants of ``wise_ft_run``, ``start_evaluation_options`` and
    ``_check_wise_ft`` (mutation testing, issue 58)."""
    methods = {'Start': {'start': True}, 'FT': {}, 'FT+EMA': {'train': {'ema_decay': 0.9}},
               'WiSE-FT': {'wise_ft': {'of': 'FT', 'alphas': [0, 1]}},
               'WiSE-EMA': {'wise_ft': {'of': 'FT+EMA', 'alphas': [0.5]}}}
    path = _wise_study(tmp_path, demo_data, methods=methods, seeds=[0])
    base = plan.read_yaml(str(tmp_path / 'base.yml'), 'base')
    base['path']['param_key_g'] = 'params_ema'
    write(tmp_path / 'base.yml', base)
    study = plan.load_study(path, str(tmp_path))
    runs = {r.name: r for r in study.runs}
    assert runs['Start'].test_opt['path']['param_key_g'] == 'params_ema'
    wise = [r for r in study.runs if r.method in ('WiSE-FT', 'WiSE-EMA')]
    assert [(r.name, r.method) for r in wise] == [('WiSE-FT_alpha=0.0_seed0', 'WiSE-FT'), ('WiSE-FT_alpha=1.0_seed0', 'WiSE-FT'),
                                                   ('WiSE-EMA_alpha=0.5_seed0', 'WiSE-EMA')]
    assert {r.test_opt['path']['param_key_g'] for r in wise} == {'params_ema'}
    assert [r.description for r in wise] == ['no training: WiSE-FT of FT_seed0 at alpha 0.0',
                                             'no training: WiSE-FT of FT_seed0 at alpha 1.0',
                                             'no training: WiSE-FT of FT+EMA_seed0 (params_ema) at alpha 0.5']
    bare = tiny_study(tmp_path, demo_data, methods={'FT': {}, 'W': {'wise_ft': {'of': 'FT', 'alphas': [0.5]}}})
    with pytest.raises(InputError) as err:          # tiny_study's base file names no start
        plan.load_study(bare, str(tmp_path))
    assert str(err.value) == ("method 'W': wise_ft.of 'FT' starts from no weights (path.pretrain_network_g); WiSE-FT "
                              'interpolates between a start and a run')


@pytest.mark.parametrize('methods, message', [
    ({'FT': {}, 'W': {'wise_ft': {'of': 'F', 'alphas': [0.5]}}, 'G': {}},
     "study file '{path}': method 'W': wise_ft.of 'F' is not another method of the study (FT, G) (did you mean 'FT'?)"),
    ({'FT': {}, 'W': {'wise_ft': {'of': 'FT', 'alphas': [0.5]}, 'train': {}, 'model_type': 'x'}},
     "study file '{path}': method 'W' has 'wise_ft' (it interpolates another method's runs, nothing is trained), so "
     'it takes no other key, got train, model_type'),
])
def test_wise_ft_spec_messages_are_whole_lines(tmp_path, demo_data, methods, message):
    path = tiny_study(tmp_path, demo_data, methods=methods)
    with pytest.raises(InputError) as err:
        plan.load_study(path, str(tmp_path))
    assert str(err.value) == message.format(path=path)
