"""Distance from the start in weight space, and the retention figure at the same distance.

What a user relies on: each run's distance is ||theta - theta_start|| / ||theta_start|| of exactly the
weights it was tested with (the EMA copy of an EMA run, a WiSE-FT interpolation), over every parameter
and floating buffer; a run whose weights are gone is named, not given a made-up distance; and the
height above the WiSE-FT curve at the same distance is read off each seed's curve, never extrapolated.
References are computed here by hand.
"""
import json
import math
import os

import numpy as np
import pytest
import torch

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.study import plan, report, tradeoff
from basicsr_ldt.study.distance import relative_distance
from test_retention_controls import FakeStudy, FakeStudyForReport, _checkpoints, _record, _tradeoff_records, _wise_study


def _hand_distance(state, start):
    keys = [k for k, v in start.items() if v.is_floating_point()]
    moved = sum(float(((state[k].double() - start[k].double()) ** 2).sum()) for k in keys)
    return math.sqrt(moved / sum(float((start[k].double() ** 2).sum()) for k in keys))


def test_relative_distance_counts_every_floating_tensor_and_no_integer_one():
    start = {'w': torch.tensor([[3.0, 0.0], [0.0, 4.0]]), 'mean': torch.tensor([0.0]),
             'count': torch.tensor(7)}
    moved = {'w': torch.tensor([[3.0, 1.0], [0.0, 4.0]]), 'mean': torch.tensor([2.0]),
             'count': torch.tensor(900)}                  # an integer counter is not a weight
    assert relative_distance(moved, start, 'run') == pytest.approx(math.sqrt(1.0 + 4.0) / 5.0)
    assert relative_distance(start, start, 'run') == 0.0
    with pytest.raises(InputError, match=r"^run X does not hold the start's tensors \(1 missing, 0 with another "
                                         r'shape, e.g. mean\): its distance from the start is undefined$'):
        relative_distance({'w': moved['w']}, start, 'run X')
    with pytest.raises(InputError, match=r'\(0 missing, 1 with another shape, e.g. w\)'):
        relative_distance({**moved, 'w': torch.zeros(3)}, start, 'run X')
    with pytest.raises(InputError, match="the start's weights are all zero"):
        relative_distance(moved, {k: torch.zeros_like(v) for k, v in start.items()}, 'run X')


def _finish(tmp_path, study, states):
    """Each trained run's final checkpoint (``states``: run -> saved dict) and every run's metrics."""
    for run in study.runs:
        if run.name in states:
            path = plan.final_checkpoint(str(tmp_path), study.name, run.name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.save(states[run.name], path)
        results = plan.results_file(str(tmp_path), study.name, run.name)
        os.makedirs(os.path.dirname(results), exist_ok=True)
        summary = {cam: {'psnr': 30.0, 'ssim': 0.5, 'images': 1} for cam in ('Sony', 'Canon', 'Olympus')}
        with open(results, 'w', encoding='utf-8') as handle:
            json.dump({'summary': {run.name: summary}}, handle)


def test_each_run_is_measured_by_the_weights_it_was_tested_with(tmp_path, demo_data):
    start, run, ema = _checkpoints(tmp_path)
    study = plan.load_study(_wise_study(tmp_path, demo_data, seeds=[0]), str(tmp_path))
    _finish(tmp_path, study, {'FT_seed0': {'params': run}, 'FT+EMA_seed0': {'params': start, 'params_ema': ema}})
    distances = {r['run']: r['distance'] for r in report.collect(str(tmp_path), study)['runs']}
    ft = _hand_distance(run, start)
    assert distances['Start'] == 0.0
    assert distances['FT_seed0'] == pytest.approx(ft, rel=1e-12)
    assert distances['FT+EMA_seed0'] == pytest.approx(_hand_distance(ema, start), rel=1e-12)   # not its params
    assert distances['WiSE-FT_alpha=0.25_seed0'] == pytest.approx(0.25 * ft, rel=1e-6)
    assert distances['WiSE-FT_alpha=0.5_seed0'] == pytest.approx(0.5 * ft, rel=1e-6)
    assert distances['WiSE-EMA_alpha=0.5_seed0'] == pytest.approx(0.5 * _hand_distance(ema, start), rel=1e-6)

    os.remove(plan.final_checkpoint(str(tmp_path), study.name, 'FT+EMA_seed0'))      # deleted to save space
    result = report.collect(str(tmp_path), study)
    gone = {r['run']: r.get('distance_missing') for r in result['runs'] if r['distance'] is None}
    path = plan.final_checkpoint(str(tmp_path), study.name, 'FT+EMA_seed0')
    assert gone == {'FT+EMA_seed0': f"weights '{path}' are gone", 'WiSE-EMA_alpha=0.5_seed0': f"weights '{path}' are gone"}
    rows = {r['method']: r for r in result['tradeoff']['rows']}
    assert rows['FT+EMA']['distance'] is None and rows['FT']['distance']['mean'] == pytest.approx(ft)
    assert ('No distance for FT+EMA_seed0, WiSE-EMA_alpha=0.5_seed0: the weights these runs were tested with, or '
            "the start's, are gone (study.json's `distance_missing` names the file).") in report.markdown(result)

    os.remove(tmp_path / 'start.pth')                 # the start too: the report goes on without any distance
    result = report.collect(str(tmp_path), study)
    gone = {r['run']: r.get('distance_missing') for r in result['runs'] if r['distance'] is None}
    assert set(gone) == {r.name for r in study.runs}
    assert set(gone.values()) == {f"the start's weights '{tmp_path / 'start.pth'}' are gone"}
    assert all(r['distance'] is None for r in result['tradeoff']['rows'])
    assert "No distance for Start, FT_seed0" in report.markdown(result)


def _with_distances():
    """The trade-off records of test_retention_controls with distances: seed 0's curve (distance,
    source, targets) runs (0, 0, 0) -> (0.1, 0.2, 0.3) -> FT (0.2, 0.4, -0.1); seed 1's (0, 0, 0) ->
    (0.15, 0.2, 0.1) -> FT (0.3, 0.6, 0.1)."""
    distance = {('WiSE', 0): 0.1, ('FT', 0): 0.2, ('WiSE', 1): 0.15, ('FT', 1): 0.3,
                ('LDT', 0): 0.15, ('LDT', 1): 0.075, ('Far', 0): 0.25, ('Far', 1): 0.2}
    records = _tradeoff_records()
    for record in records:
        record['distance'] = distance.get((record['method'], record['seed']), 0.0)
    records[1]['distance'] = None                                    # Bicubic: no weights
    return records


def test_the_height_at_the_same_distance_is_read_off_each_seeds_curve():
    table = tradeoff.tradeoff(FakeStudy(), _with_distances(), report.bootstrap_ci)
    rows = {r['method']: r for r in table['rows']}
    ldt = rows['LDT']
    # LDT gains: (0.3, 0.25) on seed 0, (0.3, 0.05) on seed 1. Seed 0 at 0.15: half-way from (0.1, 0.2, 0.3) to
    # (0.2, 0.4, -0.1), the curve (0.3, 0.1): heights targets 0.15, source 0. Seed 1 at 0.075: half-way from the
    # start to (0.15, 0.2, 0.1), the curve (0.1, 0.05): heights targets 0, source 0.2.
    targets, source = ldt['at_distance']['targets'], ldt['at_distance']['source']
    assert targets.pop('per_seed') == pytest.approx([0.15, 0.0]) and source.pop('per_seed') == pytest.approx([0.0, 0.2])
    assert targets == pytest.approx({'mean': 0.075, 'ci_low': 0.0, 'ci_high': 0.15})
    assert source == pytest.approx({'mean': 0.1, 'ci_low': 0.0, 'ci_high': 0.2})
    assert ldt['at_distance']['seeds'] == [0, 1]
    assert ldt['distance'] == pytest.approx({'mean': 0.1125, 'std': float(np.std([0.15, 0.075], ddof=1))})
    assert rows['FT']['at_distance']['targets']['mean'] == pytest.approx(0.0)       # its own end of the curve
    far = rows['Far']['at_distance']
    assert 'targets' not in far and far['outside'] == [{'seed': 0, 'distance': 0.25, 'curve_end': 0.2}]
    assert 'at_distance' not in rows['WiSE'] and rows['WiSE']['distance']['mean'] == pytest.approx(0.125)
    (curve,) = table['curves']
    np.testing.assert_allclose(curve['by_distance'], [[0.0, 0.0, 0.0], [0.125, 0.2, 0.2], [0.25, 0.5, 0.0]],
                               atol=1e-12)
    text = '\n'.join(tradeoff.markdown_lines(table, report.point_key))
    assert ('| LDT | +0.300 ± 0.000 | +0.150 ± 0.141 | **+0.050** [-0.050, +0.150] | 0.1125 ± 0.0530 | **+0.075** '
            '[+0.000, +0.150] / **+0.100** [+0.000, +0.200] | 2 |') in text
    assert 'outside: farther than the run for 1 of 2 seeds (e.g. seed 0: 0.2500 against 0.2000)' in text
    assert 'above WiSE at the same distance: targets / source |' in text


def test_two_methods_heights_are_compared_seed_by_seed():
    """Does one method keep more than another at the same distance (the partition control's question):
    their heights' differences per seed, not the difference of the two means alone."""
    records = _with_distances()
    for record in records:            # Far moved in: seed 0 at 0.1 (curve targets 0.3), seed 1 at 0.15 (0.1)
        if record['method'] == 'Far':
            record['distance'] = {0: 0.1, 1: 0.15}[record['seed']]
    table = tradeoff.tradeoff(FakeStudy(), records, report.bootstrap_ci)
    # Heights on the targets: LDT 0.15, 0.0 (above); Far 0.0 - 0.3 = -0.3 and 0.1 - 0.1 = 0.0. FT, the run the
    # curve interpolates (height 0 by construction), and WiSE (the curve) are not paired.
    (pair,) = table['height_pairs']
    assert (pair['method'], pair['minus'], pair['seeds']) == ('LDT', 'Far', [0, 1])
    assert pair['per_seed'] == pytest.approx([0.45, 0.0])
    assert (pair['mean'], pair['ci_low'], pair['ci_high']) == pytest.approx((0.225, 0.0, 0.45))
    text = '\n'.join(tradeoff.markdown_lines(table, report.point_key))
    assert '| LDT - Far | **+0.225** [+0.000, +0.450] | +0.450, +0.000 | 2 |' in text
    records = [r for r in records if not (r['method'] == 'Far' and r['seed'] == 1)]
    (pair,) = tradeoff.tradeoff(FakeStudy(), records, report.bootstrap_ci)['height_pairs']
    assert pair['seeds'] == [0] and pair['per_seed'] == pytest.approx([0.45])      # only the seeds both have
    records = [r for r in _with_distances() if not (r['method'] == 'LDT' and r['seed'] == 1)]
    for record in records:
        if record['method'] == 'Far':
            record['distance'] = {0: 0.1, 1: 0.15}[record['seed']]
    (pair,) = tradeoff.tradeoff(FakeStudy(), records, report.bootstrap_ci)['height_pairs']
    assert pair['seeds'] == [0] and pair['per_seed'] == pytest.approx([0.45])      # the first one lacking a seed too


def test_without_distances_the_table_and_picture_keep_their_one_panel_form(tmp_path):
    plain = report.aggregate(FakeStudyForReport(), _tradeoff_records())
    assert 'distance from the start' not in '\n'.join(tradeoff.markdown_lines(plain['tradeoff'], report.point_key))
    report.write_report(str(tmp_path / 'plain'), plain)
    measured = report.aggregate(FakeStudyForReport(), _with_distances())
    report.write_report(str(tmp_path / 'measured'), measured)
    import matplotlib.image
    one = matplotlib.image.imread(str(tmp_path / 'plain' / 'tradeoff.png'))
    two = matplotlib.image.imread(str(tmp_path / 'measured' / 'tradeoff.png'))
    assert two.shape[1] > 1.5 * one.shape[1]                         # a second panel: gains against distance


def test_a_start_named_by_its_release_is_read_from_pretrained(tmp_path, demo_data, monkeypatch):
    """The paper's studies start from a release name (``MambaIR_SR_x4``): test.py resolves it to
    pretrained/<name>.pth, and so must the distance, or every run would be called 'gone'."""
    from basicsr_ldt.weights import releases
    start, run, _ = _checkpoints(tmp_path)
    monkeypatch.setattr(releases, 'PRETRAINED_DIR', str(tmp_path / 'pretrained'))
    os.makedirs(tmp_path / 'pretrained')
    os.replace(tmp_path / 'start.pth', tmp_path / 'pretrained' / 'HAT_SRx4.pth')
    path = _wise_study(tmp_path, demo_data, seeds=[0], methods={'Start': {'start': True}, 'FT': {}})
    base = plan.read_yaml(str(tmp_path / 'base.yml'), 'base')
    base['path']['pretrain_network_g'] = 'HAT_SRx4'
    with open(tmp_path / 'base.yml', 'w', encoding='utf-8') as handle:
        json.dump(base, handle)                                            # YAML reads JSON
    study = plan.load_study(path, str(tmp_path))
    _finish(tmp_path, study, {'FT_seed0': {'params': run}})
    distances = {r['run']: r['distance'] for r in report.collect(str(tmp_path), study)['runs']}
    assert distances == {'Start': 0.0, 'FT_seed0': pytest.approx(_hand_distance(run, start), rel=1e-12)}


def test_relative_paths_keys_and_untrained_rows_are_read_as_test_py_read_them(tmp_path, demo_data, monkeypatch):
    """Study files name the start relative to the project (``pretrained/demo/...``), read from the study's
    root whatever the working folder; each entry's key is the one test.py read (a start file may hold an EMA
    copy beside the ``params`` the runs started from); Bicubic has no weights; without the start's results
    there is no distance. (Mutation testing: the root join, the key and the Bicubic test survived.)"""
    start, run, ema = _checkpoints(tmp_path)
    os.makedirs(tmp_path / 'pretrained')
    torch.save({'params': start, 'params_ema': ema}, tmp_path / 'pretrained' / 'start.pth')
    methods = {'Start': {'start': True}, 'Bicubic': {'bicubic': True}, 'FT': {},
               'WiSE-FT': {'wise_ft': {'of': 'FT', 'alphas': [0.5]}}}
    path = _wise_study(tmp_path, demo_data, seeds=[0], methods=methods)
    base = plan.read_yaml(str(tmp_path / 'base.yml'), 'base')
    base['path']['pretrain_network_g'] = 'pretrained/start.pth'          # relative, as the shipped studies
    with open(tmp_path / 'base.yml', 'w', encoding='utf-8') as handle:
        json.dump(base, handle)
    study = plan.load_study(path, str(tmp_path))
    _finish(tmp_path, study, {'FT_seed0': {'params': run}})
    monkeypatch.chdir(tmp_path / 'pretrained')                            # not the study's root
    records = report.collect(str(tmp_path), study)['runs']
    distances = {r['run']: r['distance'] for r in records}
    assert distances['Start'] == 0.0 and distances['Bicubic'] is None
    assert distances['FT_seed0'] == pytest.approx(_hand_distance(run, start), rel=1e-12)   # from params, not the EMA
    assert distances['WiSE-FT_alpha=0.5_seed0'] == pytest.approx(0.5 * _hand_distance(run, start), rel=1e-6)
    os.remove(plan.results_file(str(tmp_path), study.name, 'Start'))
    assert all('distance' not in r for r in report.collect(str(tmp_path), study)['runs'])


def test_a_seed_without_a_curve_is_left_out_of_the_height_not_the_rest():
    """A seed whose WiSE-FT runs have not finished has no curve: its LDT run gets no height, and the
    other seeds still do (mutation testing: 'or' as 'and', 'continue' as 'break')."""
    records = _with_distances()
    records.insert(2, {**records[-4], 'run': 'LDT_7', 'seed': 7})           # an LDT run of seed 7, listed first
    study = FakeStudy()
    study.seeds = [7, 0, 1]
    ldt = {r['method']: r for r in tradeoff.tradeoff(study, records, report.bootstrap_ci)['rows']}['LDT']
    assert ldt['at_distance']['seeds'] == [0, 1] and ldt['at_distance']['targets']['mean'] == pytest.approx(0.075)


# ---------------------------------------------------------------- the envelope of several retention curves

class TwoCurves(FakeStudyForReport):
    interpolations = {'WiSE': ('FT', [0.5]), 'WiSE2': ('FT2', [0.5])}
    methods = {'Start': {}, 'Bicubic': {}, 'FT': {}, 'FT2': {}, 'WiSE': {}, 'WiSE2': {}, 'LDT': {}, 'Far': {}}


def _two_curves():
    """_with_distances plus a second curve, WiSE2 of FT2 (distance, source, targets): seed 0 (0, 0, 0) ->
    (0.1, 0.3, 0.24) -> FT2 (0.4, 0.8, 0.0); seed 1 (0, 0, 0) -> (0.2, 0.4, 0.08) -> FT2 (0.4, 0.8, -0.2)."""
    records = _with_distances()
    for seed, wise, run in ((0, (0.1, 0.3, 0.24), (0.4, 0.8, 0.0)), (1, (0.2, 0.4, 0.08), (0.4, 0.8, -0.2))):
        records.append({**_record('WiSE2', seed, 30 + wise[1], 30 + wise[2], {plan.ALPHA: 0.5}), 'distance': wise[0]})
        records.append({**_record('FT2', seed, 30 + run[1], 30 + run[2]), 'distance': run[0]})
    return records


def test_above_the_envelope_is_the_height_over_the_best_of_several_curves_one_network_at_a_time(tmp_path):
    """A retention curve depends on the run it interpolates: with several, a method is compared with the
    highest of them where it lies, each seed on its own, and at the same distance with one curve's
    point for both gains (not the targets of one and the source of another)."""
    table = tradeoff.tradeoff(TwoCurves(), _two_curves(), report.bootstrap_ci)
    rows = {r['method']: r for r in table['rows']}
    assert table['envelope'] == ['WiSE', 'WiSE2']
    assert {m for m, r in rows.items() if 'above_envelope' in r} == {'LDT', 'Far'}    # not the curves, nor their runs
    ldt = rows['LDT']
    assert ldt['above_curve']['mean'] == pytest.approx(0.05)             # FT's curve alone: as before
    # Source gain 0.3: seed 0 WiSE 0.1, WiSE2 0.24 -> 0.25 - 0.24; seed 1 WiSE 0.1, WiSE2 0.06 -> 0.05 - 0.1.
    above = ldt['above_envelope']
    assert (above['mean'], above['ci_low'], above['ci_high']) == pytest.approx((-0.02, -0.05, 0.01))
    assert above['by'] == ['WiSE2', 'WiSE']
    # Distance 0.15 on seed 0: WiSE (0.3, 0.1), WiSE2 1/6 of the way to FT2 (0.38333, 0.2): WiSE2's, both gains.
    # Distance 0.075 on seed 1: WiSE (0.1, 0.05), WiSE2 (0.15, 0.03): WiSE's.
    at = ldt['at_distance_envelope']
    assert at['targets']['per_seed'] == pytest.approx([0.05, 0.0])
    assert at['source']['per_seed'] == pytest.approx([0.3 - (0.3 + 0.5 / 6), 0.3 - 0.1])
    assert at['by'] == ['WiSE2', 'WiSE']
    # Far: seed 0 beyond FT's curve (0.25 > 0.2) but within WiSE2's: (0.55, 0.12); seed 1 at 0.2, WiSE's (0.3333, 0.1).
    far = rows['Far']
    assert 'targets' not in far['at_distance']
    assert far['at_distance_envelope']['targets']['per_seed'] == pytest.approx([-0.12, 0.0])
    assert far['at_distance_envelope']['source']['per_seed'] == pytest.approx([0.15, 0.9 - 0.2 - 0.4 / 3])
    # Source gain 0.9 on seed 1 is beyond both curves: outside, the nearest point FT's end (0.6, 0.1).
    assert [o['seed'] for o in far['above_envelope']['outside']] == [1]
    assert far['above_envelope']['outside'][0]['distance'] == pytest.approx(0.3)
    assert far['above_envelope']['outside'][0]['curve_range'] == pytest.approx([0.0, 0.8])
    (pair,) = table['envelope_pairs']
    assert (pair['method'], pair['minus'], pair['per_seed']) == ('LDT', 'Far', pytest.approx([0.17, 0.0]))
    assert table['height_pairs'] == []
    assert [(c['wise_ft'], c['of']) for c in table['curves']] == [('WiSE', 'FT'), ('WiSE2', 'FT2')]
    text = '\n'.join(tradeoff.markdown_lines(table, report.point_key))
    assert '### Above the envelope of WiSE, WiSE2' in text
    assert ('| LDT | **-0.020** [-0.050, +0.010] | WiSE2 x1, WiSE x1 | **+0.025** [+0.000, +0.050] / **+0.058** '
            '[-0.083, +0.200] | WiSE2 x1, WiSE x1 | 2 |') in text
    assert '| LDT - Far | **+0.085** [+0.000, +0.170] | +0.170, +0.000 | 2 |' in text
    paths = report.write_report(str(tmp_path), report.aggregate(TwoCurves(), _two_curves()))
    assert str(tmp_path / 'tradeoff.png') in paths


def test_one_curve_has_no_envelope_and_a_seed_missing_any_curve_gets_no_envelope_height():
    assert 'envelope' not in tradeoff.tradeoff(FakeStudy(), _with_distances(), report.bootstrap_ci)
    records = [r for r in _two_curves() if not (r['method'] == 'FT2' and r['seed'] == 1)]
    ldt = {r['method']: r for r in tradeoff.tradeoff(TwoCurves(), records, report.bootstrap_ci)['rows']}['LDT']
    assert ldt['above_envelope']['seeds'] == [0] and ldt['above_envelope']['mean'] == pytest.approx(0.01)
    assert ldt['at_distance_envelope']['seeds'] == [0]
    assert ldt['above_curve']['seeds'] == [0, 1]                         # FT's curve has both seeds


class ChosenEnvelope(TwoCurves):
    """The envelope of WiSE and WiSE2 only: WiSE3 (of LDT) and WiSE4 (of Far) are curves measured against it."""
    envelope = ['WiSE', 'WiSE2']
    interpolations = {**TwoCurves.interpolations, 'WiSE3': ('LDT', [0.5]), 'WiSE4': ('Far', [0.5])}
    methods = {**TwoCurves.methods, 'WiSE3': {}, 'WiSE4': {}}


def _four_curves():
    records = _two_curves()
    for method, points in (('WiSE3', ((0.075, 0.15, 0.2), (0.0375, 0.15, 0.1))),
                           ('WiSE4', ((0.05, 0.15, 0.1), (0.05, 0.15, 0.0)))):
        for seed, (d, source, targets) in enumerate(points):
            records.append({**_record(method, seed, 30 + source, 30 + targets, {plan.ALPHA: 0.5}), 'distance': d})
    return records


def test_a_curve_outside_the_chosen_envelope_is_measured_against_it_along_its_alphas():
    """Is WiSE-FT of LDT above fine-tuning's retention? Its points' heights above the envelope of the
    curves the study names, per seed averaged over its alphas, and two such curves compared seed by seed."""
    table = tradeoff.tradeoff(ChosenEnvelope(), _four_curves(), report.bootstrap_ci)
    assert table['envelope'] == ['WiSE', 'WiSE2']
    rows = {(r['method'], r['sweep'].get(plan.ALPHA)): r for r in table['rows']}
    assert 'above_envelope' not in rows[('FT2', None)] and 'above_envelope' in rows[('LDT', None)]
    # Source gain 0.15: seed 0 envelope 0.225 (WiSE), seed 1 0.075 (WiSE). Distance 0.075 / 0.0375: WiSE's 0.225, 0.025.
    three = rows[('WiSE3', 0.5)]
    assert three['above_envelope']['per_seed'] == pytest.approx([-0.025, 0.025])
    assert three['at_distance_envelope']['targets']['per_seed'] == pytest.approx([-0.025, 0.075])
    assert three['at_distance_envelope']['source']['per_seed'] == pytest.approx([0.0, 0.1])
    curves = {c['method']: c for c in table['envelope_curves']}
    assert set(curves) == {'WiSE3', 'WiSE4'}
    assert curves['WiSE3']['source_gain']['alphas'] == [0.5] and curves['WiSE3']['source_gain']['mean'] == pytest.approx(0)
    assert curves['WiSE3']['distance']['per_seed'] == pytest.approx([-0.025, 0.075])
    assert curves['WiSE4']['source_gain']['per_seed'] == pytest.approx([-0.125, -0.075])
    (pair,) = table['envelope_curve_pairs']
    assert (pair['method'], pair['minus']) == ('WiSE3', 'WiSE4')
    assert pair['source_gain']['per_seed'] == pytest.approx([0.1, 0.1])
    assert pair['distance']['per_seed'] == pytest.approx([0.025, 0.075 + 0.1 / 3])
    text = '\n'.join(tradeoff.markdown_lines(table, report.point_key))
    assert '| WiSE3 | **+0.000** [-0.025, +0.025] (0.5) | **+0.025** [-0.025, +0.075] (0.5) |' in text
    assert '| WiSE3 - WiSE4 | **+0.100** [+0.100, +0.100] (0.5) | **+0.067** [+0.025, +0.108] (0.5) |' in text
    # The first curve's pairs leave every curve's points out; the envelope's pair the two curves at alpha 0.5.
    assert all(plan.ALPHA not in p['sweep'] for p in table['height_pairs'])
    assert [(p['method'], p['minus']) for p in table['envelope_pairs']] == [('LDT', 'Far'), ('WiSE3', 'WiSE4')]


@pytest.mark.parametrize('envelope', [['WiSE'], ['WiSE', 'WiSE'], ['WiSE', 'FT'], 'WiSE'])
def test_an_envelope_of_fewer_than_two_wise_ft_curves_is_refused(tmp_path, demo_data, envelope):
    from test_study_plan import load_error, tiny_study
    methods = {'FT': {}, 'S': {'start': True}, 'WiSE': {'wise_ft': {'of': 'FT', 'alphas': [0.5]}},
               'WiSE2': {'wise_ft': {'of': 'FT', 'alphas': [0.7]}}}
    path = tiny_study(tmp_path, demo_data, overrides={'path': {'pretrain_network_g': 'start.pth'}}, methods=methods,
                      envelope=envelope)
    assert load_error(path, tmp_path) == (f"study file '{path}': envelope: expected a list of two or more distinct "
                                          f'WiSE-FT methods (WiSE, WiSE2), got {envelope!r}')
    path = tiny_study(tmp_path, demo_data, overrides={'path': {'pretrain_network_g': 'start.pth'}}, methods=methods,
                      envelope=['WiSE2', 'WiSE'])
    assert plan.load_study(path, str(tmp_path)).envelope == ['WiSE2', 'WiSE']


def test_a_curve_is_averaged_over_the_alphas_every_seed_has_and_pairs_need_the_same_seeds():
    """While a study runs, some alphas or seeds are missing: a mean over alphas measured on other seeds,
    or a difference zipping unrelated seeds, would be wrong without saying so."""
    study = ChosenEnvelope()
    study.interpolations = {**study.interpolations, 'WiSE3': ('LDT', [0.5, 0.7])}
    records = _four_curves() + [{**_record('WiSE3', 0, 30.2, 30.2, {plan.ALPHA: 0.7}), 'distance': 0.1}]
    records = [r for r in records if not (r['method'] == 'WiSE4' and r['seed'] == 1)]
    table = tradeoff.tradeoff(study, records, report.bootstrap_ci)
    three = {c['method']: c for c in table['envelope_curves']}['WiSE3']
    assert three['source_gain']['alphas'] == [0.5] and three['source_gain']['seeds'] == [0, 1]
    (pair,) = table['envelope_curve_pairs']
    assert 'source_gain' not in pair and 'distance' not in pair       # WiSE4 has seed 0 only


def test_two_curves_are_compared_over_the_alphas_both_have():
    """One curve measured at an alpha the other lacks (or has outside the envelope): their difference is
    taken over the alphas both have, not between means over different alphas."""
    study = ChosenEnvelope()
    study.interpolations = {**study.interpolations, 'WiSE3': ('LDT', [0.5, 0.7])}
    extra = [{**_record('WiSE3', seed, 30.2, 30.2 + seed / 10, {plan.ALPHA: 0.7}), 'distance': 0.1} for seed in (0, 1)]
    table = tradeoff.tradeoff(study, _four_curves() + extra, report.bootstrap_ci)
    three = {c['method']: c for c in table['envelope_curves']}['WiSE3']['source_gain']
    assert three['alphas'] == [0.5, 0.7] and len(three['per_seed']) == 2
    (pair,) = table['envelope_curve_pairs']
    assert pair['source_gain']['alphas'] == [0.5] and pair['source_gain']['per_seed'] == pytest.approx([0.1, 0.1])


ENVELOPE_SECTION = '''
### Above the envelope of WiSE, WiSE2

Per seed, the highest of these curves at the method's source gain and, at its distance from the start, the curve with \
the highest targets' gain there (its source gain read off the same curve); "by": which curve that is, counted over \
seeds. Mean over seeds [95% bootstrap interval].

| Method | above the envelope at the same source gain | by | above it at the same distance: targets / source | by | n |
|---|---|---|---|---|---|
| LDT | **-0.020** [-0.050, +0.010] | WiSE2 x1, WiSE x1 | **+0.025** [+0.000, +0.050] / **+0.058** [-0.083, +0.200] | \
WiSE2 x1, WiSE x1 | 2 |
| Far | outside the curve's range for 1 of 2 seeds (e.g. seed 1: source gain +0.900, curve +0.000 .. +0.800); nearest \
point 0.300 dB away | - | **-0.060** [-0.120, +0.000] / **+0.358** [+0.150, +0.567] | WiSE2 x1, WiSE x1 | 2 |
| WiSE3 (wise_ft.alpha=0.5) | **+0.000** [-0.025, +0.025] | WiSE x2 | **+0.025** [-0.025, +0.075] / **+0.050** [-0.000, \
+0.100] | WiSE x2 | 2 |
| WiSE4 (wise_ft.alpha=0.5) | **-0.100** [-0.125, -0.075] | WiSE x2 | **-0.042** [-0.050, -0.033] / **+0.067** [+0.050, \
+0.083] | WiSE x2 | 2 |

Targets' heights above the envelope at the same distance, paired by seed:

| Methods | difference of the targets' heights | per seed | n |
|---|---|---|---|
| LDT - Far | **+0.085** [+0.000, +0.170] | +0.170, +0.000 | 2 |
| WiSE3 (wise_ft.alpha=0.5) - WiSE4 (wise_ft.alpha=0.5) | **+0.067** [+0.025, +0.108] | +0.025, +0.108 | 2 |

Curves outside the envelope: per seed, the mean of their points' heights above it over the alphas inside it on every \
seed (listed), then mean over seeds [95% bootstrap interval]:

| Curve | at the same source gain (alphas) | at the same distance, targets (alphas) |
|---|---|---|
| WiSE3 | **+0.000** [-0.025, +0.025] (0.5) | **+0.025** [-0.025, +0.075] (0.5) |
| WiSE4 | **-0.100** [-0.125, -0.075] (0.5) | **-0.042** [-0.050, -0.033] (0.5) |
| WiSE3 - WiSE4 | **+0.100** [+0.100, +0.100] (0.5) | **+0.067** [+0.025, +0.108] (0.5) |
'''


def test_the_envelope_section_reads_as_written():
    """The whole section of study.md for the four-curve records above (values worked out in the tests
    above: WiSE3 0 and +0.025, WiSE4 -0.100 and -0.042, Far beyond both curves on seed 1). Mutation
    testing: 52 survivors rewrote its wording, table rules and blank lines."""
    table = tradeoff.tradeoff(ChosenEnvelope(), _four_curves(), report.bootstrap_ci)
    lines = tradeoff.markdown_lines(table, report.point_key)
    start = lines.index('### Above the envelope of WiSE, WiSE2') - 1
    assert '\n'.join(lines[start:]) == ENVELOPE_SECTION
