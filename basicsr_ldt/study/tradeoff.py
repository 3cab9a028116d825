"""The trade-off picture: each method's gain on its source against its gain on the targets, both
over the start, beside the WiSE-FT retention curve (docs/studies.md, "The trade-off picture").

Why: a method that moves less far from the start than FT keeps more of the start on cameras it
never saw, which looks like generalisation on a table of target PSNRs. WiSE-FT's weight-space
interpolation between the start and FT traces what moving less buys by itself. A method beats
retention only where its targets' gain is above that curve at the same source gain:

    above = target_gain(method, seed) - curve_seed(source_gain(method, seed))

per seed, where ``curve_seed`` interpolates linearly along that seed's curve (the start at alpha 0,
each alpha, the interpolated run at alpha 1, in order of alpha) and, where the curve passes a source
gain more than once, takes its highest value there (the best retention at that gain). The figure is
the mean over seeds with a bootstrap interval. Where a seed's source gain lies outside the range the
curve covers, the report says so and gives the distance (dB, in the plane of the two gains) to the
curve's nearest point instead of extrapolating.
"""
import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from basicsr_ldt.study.plan import ALPHA, Study

Point = Tuple[float, float]
MARKERS = ('o', 's', '^', 'D', 'v', 'P', 'X', '<', '>', 'h', 'p', '*')


def run_gains(record: Mapping[str, Any], start: Mapping[str, Any]) -> Optional[Point]:
    """(source gain, targets' Mean gain) of one run over the start, PSNR in dB, measured on the
    run's own source and target cameras; None when its source cameras were not tested."""
    cameras, base = record['cameras'], start['cameras']
    sources = [c for c in record['sources'] if c in cameras and c in base]
    targets = [c for c in cameras if c not in record['sources'] and c in base]
    if not sources or not targets:
        return None

    def gain(names: Sequence[str]) -> float:
        return float(np.mean([cameras[c]['psnr'] for c in names]) - np.mean([base[c]['psnr'] for c in names]))
    return gain(sources), gain(targets)


def curve_value(curve: Sequence[Point], x: float) -> Optional[float]:
    """The curve's highest targets' gain at source gain ``x`` (None outside its range)."""
    values = []
    for (x0, y0), (x1, y1) in zip(curve[:-1], curve[1:]):
        low, high = min(x0, x1), max(x0, x1)
        if not low <= x <= high:
            continue
        values.append(max(y0, y1) if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0))
    if len(curve) == 1 and curve[0][0] == x:
        values.append(curve[0][1])
    return max(values) if values else None


def nearest_distance(curve: Sequence[Point], point: Point) -> float:
    """Distance from ``point`` to the curve's nearest point (the start, an alpha or the run)."""
    return float(min(np.hypot(point[0] - x, point[1] - y) for x, y in curve))


def _key(method: str, sweep: Mapping[str, Any], seed: Optional[int]) -> str:
    return json.dumps([method, sweep, seed], sort_keys=True)


def tradeoff(study: Study, records: List[Dict[str, Any]], bootstrap) -> Optional[Dict[str, Any]]:
    """Every method's gains over the start per seed and, with a WiSE-FT method, its height above the
    curve; None without a start row (``start: true``) with results. ``bootstrap`` is
    ``report.bootstrap_ci``."""
    start = next((r for r in records if r['method'] == study.start), None)
    if start is None:
        return None
    wise = next(iter(study.interpolations), None)
    by_key = {_key(r['method'], r['sweep'], r['seed']): r for r in records}
    curves: Dict[str, List[Point]] = {}            # (sweep point, seed) -> the seed's curve
    if wise is not None:
        of, alphas = study.interpolations[wise]
        for point in study.sweep_points():
            for seed in study.seeds:
                ends = [(0.0, (0.0, 0.0))]
                ends += [(a, run_gains(by_key[k], start)) for a in alphas
                         if (k := _key(wise, {**point, ALPHA: a}, seed)) in by_key]
                run = by_key.get(_key(of, point, seed))
                if run is None or len(ends) != len(alphas) + 1 or any(g is None for _, g in ends):
                    continue
                ends.append((1.0, run_gains(run, start)))
                curves[_key('', point, seed)] = [g for _, g in sorted(ends, key=lambda e: e[0])]
    rows = []
    for method in study.methods:
        if method in study.untrained:     # the start, and Bicubic: no network fine-tuned from the start
            continue
        for point in study.method_points(method):
            runs = [r for r in records if r['method'] == method and r['sweep'] == point]
            gains = [(r['seed'], run_gains(r, start)) for r in runs]
            gains = [(seed, g) for seed, g in gains if g is not None]
            if not gains:
                continue
            row = {'method': method, 'sweep': point, 'n': len(gains), 'seeds': [s for s, _ in gains],
                   'source_gain': _spread([g[0] for _, g in gains]), 'target_gain': _spread([g[1] for _, g in gains])}
            if wise is not None and method not in study.untrained and method != wise:
                row['above_curve'] = _above(curves, point, gains, bootstrap)
            rows.append(row)
    curve_rows = []
    if wise is not None:
        for point in study.sweep_points():
            seeds = [s for s in study.seeds if _key('', point, s) in curves]
            if seeds:
                stacked = np.array([curves[_key('', point, s)] for s in seeds])       # seeds x points x 2
                curve_rows.append({'sweep': point, 'seeds': seeds, 'alphas': [0.0] + sorted(alphas) + [1.0],
                                   'mean': stacked.mean(axis=0).tolist()})
    return {'start': study.start, 'wise_ft': wise, 'of': study.interpolations[wise][0] if wise else None,
            'rows': rows, 'curves': curve_rows}


def _spread(values: Sequence[float]) -> Dict[str, Optional[float]]:
    arr = np.asarray(values, dtype=np.float64)
    return {'mean': float(arr.mean()), 'std': float(arr.std(ddof=1)) if arr.size > 1 else None}


def _above(curves: Mapping[str, List[Point]], point: Mapping[str, Any], gains: Sequence[Tuple[int, Point]],
           bootstrap) -> Dict[str, Any]:
    """Per seed: the height above that seed's curve, or the distance to it when outside its range."""
    heights, outside, seeds = [], [], []
    for seed, (x, y) in gains:
        curve = curves.get(_key('', {k: v for k, v in point.items() if k != ALPHA}, seed))
        if curve is None:
            continue
        seeds.append(seed)
        value = curve_value(curve, x)
        if value is None:
            xs = [c[0] for c in curve]
            outside.append({'seed': seed, 'source_gain': x, 'curve_range': [min(xs), max(xs)],
                            'distance': nearest_distance(curve, (x, y))})
        else:
            heights.append(y - value)
    result: Dict[str, Any] = {'seeds': seeds, 'outside': outside}
    if heights and not outside:
        low, high = bootstrap(heights)
        result.update(mean=float(np.mean(heights)), ci_low=low, ci_high=high)
    return result


def markdown_lines(table: Mapping[str, Any], point_key) -> List[str]:
    """The trade-off section of study.md."""
    lines = ['## Trade-off: gains over the start', '',
             f"Per seed, PSNR gain over `{table['start']}` (dB) on the run's source camera(s) and on the targets' "
             'Mean; cells: mean ± sample std over seeds (picture: `tradeoff.png`).']
    if table['wise_ft']:
        lines[-1] += (f" \"Above {table['wise_ft']}\": the targets' gain minus the {table['wise_ft']} curve (the start, "
                      f"each alpha, {table['of']}; per seed, linear along alpha, the highest value where the curve "
                      'passes a source gain twice) at the same source gain, mean over seeds [95% bootstrap interval]. '
                      'A method beats retention only where it is above zero; outside the range of source gains the '
                      'curve covers no value is given, only the distance to its nearest point.')
    lines += ['', f"| Method | source gain | targets' Mean gain | above {table['wise_ft'] or 'the curve'} | n |",
              '|---|---|---|---|---|']
    for row in table['rows']:
        above = '(the curve)' if row['method'] == table['wise_ft'] else _above_cell(row.get('above_curve'))
        cells = [_cell(row['source_gain']), _cell(row['target_gain']), above]
        lines.append(f"| {point_key(row['method'], row['sweep'])} | " + ' | '.join(cells) + f" | {row['n']} |")
    return lines + ['']


def _cell(stats: Mapping[str, Optional[float]]) -> str:
    return f"{stats['mean']:+.3f}" + ('' if stats['std'] is None else f" ± {stats['std']:.3f}")


def _above_cell(above: Optional[Mapping[str, Any]]) -> str:
    if above is None:
        return '-'
    if above['outside']:
        first = above['outside'][0]
        distance = np.mean([o['distance'] for o in above['outside']])
        return (f"outside the curve's range for {len(above['outside'])} of {len(above['seeds'])} seeds (e.g. seed "
                f"{first['seed']}: source gain {first['source_gain']:+.3f}, curve {first['curve_range'][0]:+.3f} .. "
                f"{first['curve_range'][1]:+.3f}); nearest point {distance:.3f} dB away")
    if 'mean' not in above:
        return '-'
    interval = '' if above['ci_low'] is None else f" [{above['ci_low']:+.3f}, {above['ci_high']:+.3f}]"
    return f"**{above['mean']:+.3f}**{interval}"


def plot(path: str, table: Mapping[str, Any], point_key, title: str) -> None:
    """Targets' Mean gain against source gain: methods as points (seed std as error bars), the WiSE-FT
    curve as a line through the start, its alphas and the interpolated run."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 5.0))
    ax.axhline(0.0, color='0.6', lw=0.8)
    ax.axvline(0.0, color='0.6', lw=0.8)
    for curve in table['curves']:
        xs, ys = zip(*curve['mean'])
        suffix = f" ({', '.join(f'{k}={v}' for k, v in curve['sweep'].items())})" if curve['sweep'] else ''
        ax.plot(xs, ys, '-', color='0.35', lw=1.5, zorder=1,
                label=f"{table['wise_ft']} curve{suffix}: start, alpha, {table['of']}")
        for alpha, x, y in zip(curve['alphas'], xs, ys):
            ax.annotate(f'{alpha:g}', (x, y), textcoords='offset points', xytext=(4, -10), fontsize=7, color='0.35')
    ax.plot([0.0], [0.0], 'k*', ms=10, label=f"{table['start']} (0, 0)", zorder=3)
    points = [row for row in table['rows'] if row['method'] != table['wise_ft']]
    for number, row in enumerate(points):     # colours repeat after ten: the marker tells them apart
        sx, sy = row['source_gain'], row['target_gain']
        ax.errorbar([sx['mean']], [sy['mean']], xerr=[sx['std'] or 0.0], yerr=[sy['std'] or 0.0],
                    fmt=MARKERS[number % len(MARKERS)], capsize=3, zorder=2,
                    label=f"{point_key(row['method'], row['sweep'])} (n={row['n']})")
    ax.set_xlabel('source gain over the start (dB PSNR)')
    ax.set_ylabel("targets' Mean gain over the start (dB PSNR)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='best')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ['curve_value', 'markdown_lines', 'nearest_distance', 'plot', 'run_gains', 'tradeoff']
