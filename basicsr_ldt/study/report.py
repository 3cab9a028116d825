"""Aggregating a study: per-run test results -> means, spreads and paired differences over seeds.

Why paired differences: runs of two methods with the same seed share the data order, crops and
starting weights, so the per-seed difference removes what the seed alone does to PSNR; its
bootstrap interval says whether a gap is larger than seed noise. With few seeds the interval is
coarse (3 seeds give 10 distinct resampled means), which the report states.
"""
import csv
import json
import os
from os import path as osp
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from basicsr_ldt.study import tradeoff
from basicsr_ldt.study.distance import add_distances
from basicsr_ldt.study.plan import Run, Study, results_file, without_alpha
from basicsr_ldt.study.run import stale_results

METRICS = ('psnr', 'ssim')
MEAN = 'Mean'
BOOTSTRAP = {'resamples': 10000, 'seed': 0, 'level': 0.95}


def read_run(path: str, run: Run) -> Dict[str, Any]:
    """A run's record for ``study.json``: per-camera PSNR/SSIM from its ``metrics.json``."""
    with open(path, encoding='utf-8') as handle:
        summary = json.load(handle)['summary'][run.name]
    cameras = {cam: {m: float(v[m]) for m in METRICS} for cam, v in summary.items() if cam != MEAN}
    return {'run': run.name, 'method': run.method, 'seed': run.seed, 'sweep': dict(run.sweep),
            'sources': run.source_cameras(), 'cameras': cameras}


def with_mean(record: Mapping[str, Any]) -> Dict[str, Dict[str, float]]:
    """A run's per-camera values plus their mean over the target cameras (every camera weighs the
    same; cameras the run trained on are left out of the mean, as in the paper's tables)."""
    cameras = record['cameras']
    table = {cam: dict(v) for cam, v in cameras.items()}
    targets = [v for cam, v in cameras.items() if cam not in record['sources']] or list(cameras.values())
    table[MEAN] = {m: float(np.mean([v[m] for v in targets])) for m in METRICS}
    return table


def mean_std(values: Sequence[float]) -> Dict[str, Optional[float]]:
    """Mean and sample standard deviation (n - 1); the deviation is ``None`` for one value."""
    arr = np.asarray(values, dtype=np.float64)
    return {'mean': float(arr.mean()), 'std': float(arr.std(ddof=1)) if arr.size > 1 else None}


def bootstrap_ci(values: Sequence[float], resamples: int = BOOTSTRAP['resamples'], seed: int = BOOTSTRAP['seed'],
                 level: float = BOOTSTRAP['level']) -> Tuple[Optional[float], Optional[float]]:
    """Percentile bootstrap interval of the mean (seeded: the same values give the same interval)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size < 2:
        return None, None
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, arr.size, size=(resamples, arr.size))].mean(axis=1)
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return float(low), float(high)


def point_key(method: str, sweep: Mapping[str, Any]) -> str:
    """A row label: the method, then each sweep value (``LDT (ldt.ratio_u=0.3)``)."""
    if not sweep:
        return method
    return f"{method} ({', '.join(f'{k}={v}' for k, v in sweep.items())})"


def summarise(study: Study, records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per method and sweep point: mean and sample std over seeds, per camera and for the mean
    (a method without training has one seed-less run: n = 1, no std)."""
    rows = []
    for method in study.methods:
        for point in study.method_points(method):
            runs = [with_mean(r) for r in records if r['method'] == method and r['sweep'] == point]
            if not runs:
                continue
            cameras = list(runs[0])
            rows.append({'method': method, 'sweep': point, 'n': len(runs),
                         'seeds': [r['seed'] for r in records if r['method'] == method and r['sweep'] == point],
                         'sources': next(r['sources'] for r in records if r['method'] == method and r['sweep'] == point),
                         'cameras': {cam: {m: mean_std([run[cam][m] for run in runs]) for m in METRICS}
                                     for cam in cameras}})
    return rows


def shared_targets(first: Mapping[str, Any], second: Mapping[str, Any]) -> List[str]:
    """The cameras two runs' Means are compared on: tested for both and a source of neither (where both
    trained on the same cameras and every tested camera is one, all of them, as ``with_mean`` does).

    Why: a method trained on Pan against a reference trained on Olympus would otherwise compare a Mean
    that holds Olympus with one that holds Pan (+0.43 dB from a method worse on every camera)."""
    tested = [cam for cam in first['cameras'] if cam in second['cameras']]
    targets = [cam for cam in tested if cam not in first['sources'] and cam not in second['sources']]
    return targets or (tested if set(first['sources']) == set(second['sources']) else [])


def differences(study: Study, records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per other method and sweep point: the mean of (method - reference) over the seeds both have,
    per camera and for the mean over the cameras both leave out of their Means (``shared_targets``),
    with a bootstrap interval. A method without training has one result, the same for every seed and
    sweep point: it is paired with each of them."""
    by_key = {(r['method'], json.dumps(r['sweep'], sort_keys=True), r['seed']): r for r in records}

    def result(method: str, sweep: str, seed: int) -> Optional[Dict[str, Any]]:
        if method in study.untrained:
            return by_key.get((method, json.dumps({}), None))
        return by_key.get((method, sweep, seed))

    rows = []
    for method in study.methods:
        if method == study.reference:
            continue
        # WiSE-FT's points are (sweep point, alpha), each paired with the reference at its sweep point.
        for point in study.method_points(method) if method in study.interpolations else study.sweep_points():
            sweep = json.dumps(point, sort_keys=True)
            paired = json.dumps(without_alpha(point), sort_keys=True)
            seeds = [s for s in study.seeds if result(method, sweep, s) and result(study.reference, paired, s)]
            if not seeds:
                continue
            pairs = [(result(method, sweep, s), result(study.reference, paired, s)) for s in seeds]
            shared = shared_targets(*pairs[0])
            tables = [(_mean_over(first, shared), _mean_over(second, shared)) for first, second in pairs]
            table = {}
            for cam in [c for c in tables[0][0] if c in tables[0][1]]:
                table[cam] = {}
                for m in METRICS:
                    diffs = [first[cam][m] - second[cam][m] for first, second in tables]
                    low, high = bootstrap_ci(diffs)
                    table[cam][m] = {'mean': float(np.mean(diffs)), 'ci_low': low, 'ci_high': high}
            rows.append({'method': method, 'sweep': point, 'reference': study.reference, 'n': len(seeds),
                         'seeds': seeds, 'cameras': table, 'mean_over': shared,
                         'sources': sorted(set(pairs[0][0]['sources']) | set(pairs[0][1]['sources'])),
                         'sources_differ': set(pairs[0][0]['sources']) != set(pairs[0][1]['sources'])})
    return rows


def _mean_over(record: Mapping[str, Any], cameras: Sequence[str]) -> Dict[str, Dict[str, float]]:
    """A run's per-camera values plus, with ``cameras``, their Mean over those cameras."""
    table = dict(record['cameras'])
    if cameras:
        table[MEAN] = {m: float(np.mean([record['cameras'][c][m] for c in cameras])) for m in METRICS}
    return table


def aggregate(study: Study, records: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Everything ``study.json`` holds."""
    return {'name': study.name, 'study_file': study.path, 'train': study.train, 'test': study.test,
            'seeds': study.seeds, 'methods': list(study.methods), 'sweep': study.sweep,
            'reference': study.reference, 'untrained': list(study.untrained), 'start': study.start,
            'cameras': ordered_cameras(study, records),
            'planned_runs': len(study.runs), 'runs': records, 'summary': summarise(study, records),
            'differences': differences(study, records), 'bootstrap': dict(BOOTSTRAP),
            'tradeoff': tradeoff.tradeoff(study, records, bootstrap_ci)}


def ordered_cameras(study: Study, records: List[Dict[str, Any]]) -> List[str]:
    """Cameras in the test file's order, then any others the results hold."""
    found = [cam for r in records for cam in r['cameras']]
    order = [cam for cam in study.cameras() if cam in found]
    return order + sorted(set(found) - set(order))


def _cell(stats: Mapping[str, Optional[float]], digits: int) -> str:
    if stats['std'] is None:
        return f"{stats['mean']:.{digits}f}"
    return f"{stats['mean']:.{digits}f} ± {stats['std']:.{digits}f}"


def _diff_cell(stats: Mapping[str, Optional[float]], digits: int) -> str:
    if stats['ci_low'] is None:
        return f"{stats['mean']:+.{digits}f}"
    return f"{stats['mean']:+.{digits}f} [{stats['ci_low']:+.{digits}f}, {stats['ci_high']:+.{digits}f}]"


def markdown(result: Mapping[str, Any]) -> str:
    """Tables laid out like the paper's: rows methods, columns target cameras."""
    columns = result['cameras'] + [MEAN]
    lines = [f"# Study {result['name']}", '',
             f"Study file `{result['study_file']}`: base training options `{result['train']}`, test options "
             f"`{result['test']}`, seeds {result['seeds']}; {len(result['runs'])} of {result['planned_runs']} "
             'runs finished. Cells: mean ± sample standard deviation over seeds; Mean = mean over the target '
             'cameras (each weighs the same; cameras the method trained on, marked "(source)", are left out) '
             'per seed, then over seeds.', '']
    if result.get('stale'):
        lines += [f"Left out: {len(result['stale'])} run(s) whose test results are older than the weights they test "
                  f"(trained again, or the test failed after training; run the study to test them): "
                  f"{', '.join(result['stale'])}.", '']
    untrained, start = result.get('untrained') or [], result.get('start')
    described = [f"{', '.join(m for m in untrained if m != start)}: the LR image upscaled bicubically (`cv2.resize` "
                 'INTER_CUBIC), measured by the same code'] if set(untrained) - {start} else []
    if start in untrained:
        described.append(f"{start}: the weights every run starts from (the base training options' "
                         '`path.pretrain_network_g`)')
    if described:
        lines += ['; '.join(described) + '. No training; deterministic, so tested once (n = 1) and paired with every '
                  'seed in the differences.', '']
    for metric, title, digits in (('psnr', 'PSNR (dB)', 2), ('ssim', 'SSIM', 4)):
        lines += [f'## {title}', '', '| Method | ' + ' | '.join(columns) + ' | n |',
                  '|---|' + '---|' * (len(columns) + 1)]
        for row in result['summary']:
            cells = [_cell(row['cameras'][c][metric], digits) + (' (source)' if c in row['sources'] else '')
                     if c in row['cameras'] else '-' for c in columns]
            lines.append(f"| {point_key(row['method'], row['sweep'])} | " + ' | '.join(cells) + f" | {row['n']} |")
        lines.append('')
    boot = result['bootstrap']
    lines += [f"## Paired differences to {result['reference']}", '',
              f"Per seed, method minus {result['reference']} (same seed and sweep point), averaged over the seeds "
              f"both finished; in brackets a {boot['level']:.0%} percentile bootstrap interval over seeds "
              f"({boot['resamples']} resamples, RNG seed {boot['seed']}). With n seeds the bootstrap can only "
              'reshuffle n values: for n <= 3 the interval is coarse and spans at most the observed '
              'differences; an interval excluding 0 still only says every seed agreed.', '']
    if not result['differences']:
        lines += ['No other method with finished runs to compare.', '']
    for metric, title, digits in (('psnr', 'PSNR (dB)', 2), ('ssim', 'SSIM', 4)):
        if not result['differences']:
            break
        lines += [f'### {title}', '', '| Method | ' + ' | '.join(columns) + ' | n |',
                  '|---|' + '---|' * (len(columns) + 1)]
        for row in result['differences']:
            cells = [_diff_cell(row['cameras'][c][metric], digits) + (' (source)' if c in row['sources'] else '')
                     if c in row['cameras'] else '-' for c in columns]
            lines.append(f"| {point_key(row['method'], row['sweep'])} | " + ' | '.join(cells) + f" | {row['n']} |")
        lines.append('')
    mixed = [row for row in result['differences'] if row['sources_differ']]
    if mixed:
        lines += ['Sources differ from the reference\'s: "(source)" marks a camera either trained on, and Mean is '
                  'over the cameras neither did (' + '; '.join(
                      f"{point_key(row['method'], row['sweep'])}: {', '.join(row['mean_over']) or 'none, no Mean'}"
                      for row in mixed) + ').', '']
    if result.get('tradeoff'):
        lines += tradeoff.markdown_lines(result['tradeoff'], point_key)
    else:
        lines += ['No trade-off picture: it needs the start tested (a method `Start: {start: true}`) with results.', '']
    return '\n'.join(lines)


def write_csv(path: str, result: Mapping[str, Any]) -> None:
    """One row per method, sweep point and camera (and Mean)."""
    diffs = {(d['method'], json.dumps(d['sweep'], sort_keys=True)): d for d in result['differences']}
    with open(path, 'w', newline='', encoding='utf-8') as handle:
        writer = csv.writer(handle)
        writer.writerow(['method', 'sweep', 'camera', 'n', 'psnr_mean', 'psnr_std', 'ssim_mean', 'ssim_std',
                         'reference', 'psnr_diff', 'psnr_diff_ci_low', 'psnr_diff_ci_high', 'ssim_diff',
                         'ssim_diff_ci_low', 'ssim_diff_ci_high'])
        for row in result['summary']:
            sweep = json.dumps(row['sweep'], sort_keys=True)
            diff = diffs.get((row['method'], sweep))
            for cam, stats in row['cameras'].items():
                cells = [row['method'], sweep if row['sweep'] else '', cam, row['n']]
                cells += [_num(stats[m][k]) for m in METRICS for k in ('mean', 'std')]
                cells.append(result['reference'] if diff else '')
                for m in METRICS:
                    d = diff['cameras'].get(cam, {}).get(m, {}) if diff else {}   # no Mean: no shared target
                    cells += [_num(d.get(k)) for k in ('mean', 'ci_low', 'ci_high')]
                writer.writerow(cells)


def _num(value: Optional[float]) -> str:
    return '' if value is None else f'{value:.6f}'


def plot(path: str, result: Mapping[str, Any]) -> None:
    """Per-camera PSNR with error bars (sample std over seeds), one series per method."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    columns = result['cameras'] + [MEAN]
    rows = result['summary']
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(columns) + 2), 4.2))
    width = 0.8 / max(1, len(rows))
    for i, row in enumerate(rows):
        xs = [j + (i - (len(rows) - 1) / 2) * width for j, c in enumerate(columns) if c in row['cameras']]
        stats = [row['cameras'][c]['psnr'] for c in columns if c in row['cameras']]
        ax.errorbar(xs, [s['mean'] for s in stats], yerr=[s['std'] or 0.0 for s in stats], fmt='o', capsize=3,
                    label=f"{point_key(row['method'], row['sweep'])} (n={row['n']})")
    ax.set_xticks(range(len(columns)), columns)
    ax.set_ylabel('PSNR (dB), Y channel')
    ax.set_title(f"{result['name']}: mean ± std over seeds")
    ax.grid(axis='y', alpha=0.3)
    ax.legend(fontsize=8, loc='best')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(folder: str, result: Mapping[str, Any]) -> List[str]:
    """``study.json``, ``study.md``, ``study.csv``, ``study.png`` and, with a start row,
    ``tradeoff.png`` in ``folder``; each file is written under a temporary name and renamed, so a
    reader never sees half a report."""
    os.makedirs(folder, exist_ok=True)
    writers = {
        'study.json': lambda p: _write_text(p, json.dumps(result, indent=2, allow_nan=False) + '\n'),
        'study.md': lambda p: _write_text(p, markdown(result) + '\n'),
        'study.csv': lambda p: write_csv(p, result),
        'study.png': lambda p: plot(p, result),
    }
    if result.get('tradeoff'):
        writers['tradeoff.png'] = lambda p: tradeoff.plot(p, result['tradeoff'], point_key,
                                                          f"{result['name']}: gains over the start")
    paths = []
    for name, write in writers.items():
        path, tmp = osp.join(folder, name), osp.join(folder, f'.tmp.{name}')
        write(tmp)
        os.replace(tmp, path)
        paths.append(path)
    return paths


def _write_text(path: str, text: str) -> None:
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write(text)


def collect(root: str, study: Study) -> Dict[str, Any]:
    """Aggregate the test results of the study's runs that have them, leaving out results older than the
    weights they test (``stale``: they describe weights that no longer exist)."""
    records, stale = [], []
    for run in study.runs:
        path = results_file(root, study.name, run.name)
        if osp.isfile(path):
            if stale_results(root, study, run):
                stale.append(run.name)
            else:
                records.append(read_run(path, run))
    add_distances(records, {run.name: run for run in study.runs}, study.start, root)
    return {**aggregate(study, records), 'stale': stale}


__all__ = ['aggregate', 'bootstrap_ci', 'collect', 'differences', 'markdown', 'mean_std', 'summarise',
           'write_report']
