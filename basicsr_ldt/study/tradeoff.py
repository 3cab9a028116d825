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

The same comparison at the same distance from the start in weight space (``distance.py``): along the
WiSE-FT curve the distance grows as alpha times the run's, so per seed the curve over distance is
single-valued; a method's height above it on the targets (and on the source) says whether it keeps
more of the start than moving as far along FT's direction does. A method farther from the start than
the run the curve interpolates is outside it.

With several WiSE-FT methods (curves of several fine-tuning runs) the same heights are also taken above
their upper envelope (``tradeoff``'s docstring): the first method's curve alone is not the best retention
fine-tuning can give.
"""
import json
from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from basicsr_ldt.study.plan import ALPHA, Study, without_alpha

Point = Tuple[float, float]
MARKERS = ('o', 's', '^', 'D', 'v', 'P', 'X', '<', '>', 'h', 'p', '*')
LINES = ('-', '--', ':', '-.')


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


def _curves_of(study: Study, by_key: Mapping[str, Dict[str, Any]], start: Mapping[str, Any], wise: str
               ) -> Tuple[Dict[str, List[Point]], Dict[str, List[Tuple[float, float, float]]]]:
    """One WiSE-FT method's curve per (sweep point, seed): over source gain, and over distance where every
    point has one; a seed lacking any of its alphas or its run has no curve."""
    of, alphas = study.interpolations[wise]
    curves: Dict[str, List[Point]] = {}            # (sweep point, seed) -> the seed's curve
    by_distance: Dict[str, List[Tuple[float, float, float]]] = {}     # ... -> (distance, source, targets)
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
            distances = [0.0] + [by_key[_key(wise, {**point, ALPHA: a}, seed)].get('distance') for a in alphas]
            distances.append(run.get('distance'))
            if all(d is not None for d in distances):
                ordered = sorted(zip([0.0] + list(alphas) + [1.0], distances, [g for _, g in ends]))
                by_distance[_key('', point, seed)] = [(d, g[0], g[1]) for _, d, g in ordered]
    return curves, by_distance


def tradeoff(study: Study, records: List[Dict[str, Any]], bootstrap) -> Optional[Dict[str, Any]]:
    """Every method's gains over the start per seed and, with a WiSE-FT method, its height above the
    curve (the first WiSE-FT method listed); with several, also above their upper envelope. None without
    a start row (``start: true``) with results. ``bootstrap`` is ``report.bootstrap_ci``.

    Why an envelope: a retention curve depends on the fine-tuning run it interpolates (another learning
    rate draws another), so "above FT's curve" does not say that no fine-tuning run keeps more. Per seed,
    the envelope at a source gain is the highest of the curves there; at a distance, the curve with the
    highest targets' gain there, its source gain read off the same curve (one network, not a mix)."""
    start = next((r for r in records if r['method'] == study.start), None)
    if start is None:
        return None
    by_key = {_key(r['method'], r['sweep'], r['seed']): r for r in records}
    wises = list(study.interpolations)
    built = {wise: _curves_of(study, by_key, start, wise) for wise in wises}
    wise = wises[0] if wises else None
    envelope = list(study.envelope) or (wises if len(wises) > 1 else [])
    family = set(envelope) | {study.interpolations[w][0] for w in envelope}     # the curves and the runs they end at
    rows = []
    for method in study.methods:
        if method in study.untrained:     # the start, and Bicubic: no network fine-tuned from the start
            continue
        for point in study.method_points(method):
            runs = [r for r in records if r['method'] == method and r['sweep'] == point]
            tested = [(r, g) for r in runs if (g := run_gains(r, start)) is not None]   # source cameras tested
            gains = [(r['seed'], g) for r, g in tested]
            if not gains:
                continue
            row = {'method': method, 'sweep': point, 'n': len(gains), 'seeds': [s for s, _ in gains],
                   'source_gain': _spread([g[0] for _, g in gains]), 'target_gain': _spread([g[1] for _, g in gains])}
            distances = [r.get('distance') for r, _ in tested]
            row['distance'] = _spread(distances) if all(d is not None for d in distances) else None
            if wise is not None and method != wise:
                row['above_curve'] = _above([built[wise][0]], [wise], point, gains, bootstrap)
                if row['distance'] is not None:
                    row['at_distance'] = _at_distance([built[wise][1]], [wise], point, tested, bootstrap)
            if envelope and method not in family:
                row['above_envelope'] = _above([built[w][0] for w in envelope], envelope, point, gains, bootstrap)
                if row['distance'] is not None:
                    row['at_distance_envelope'] = _at_distance([built[w][1] for w in envelope], envelope, point,
                                                               tested, bootstrap)
            rows.append(row)
    curve_rows = []
    for name in wises:
        curves, by_distance = built[name]
        alphas = study.interpolations[name][1]
        for point in study.sweep_points():
            seeds = [s for s in study.seeds if _key('', point, s) in curves]
            if seeds:
                stacked = np.array([curves[_key('', point, s)] for s in seeds])       # seeds x points x 2
                curve_rows.append({'wise_ft': name, 'of': study.interpolations[name][0], 'sweep': point,
                                   'seeds': seeds, 'alphas': [0.0] + sorted(alphas) + [1.0],
                                   'mean': stacked.mean(axis=0).tolist()})
                if all(_key('', point, s) in by_distance for s in seeds):    # (distance, source, targets)
                    curve_rows[-1]['by_distance'] = np.array([by_distance[_key('', point, s)] for s in seeds]
                                                             ).mean(axis=0).tolist()
    of = study.interpolations[wise][0] if wise else None
    table = {'start': study.start, 'wise_ft': wise, 'of': of, 'rows': rows, 'curves': curve_rows,
             'height_pairs': _height_pairs(rows, 'at_distance', set(wises) | {of}, bootstrap),
             'distance_missing': [r['run'] for r in records if r.get('distance_missing')]}
    if envelope:
        table['envelope'] = envelope
        table['envelope_pairs'] = _height_pairs(rows, 'at_distance_envelope', set(), bootstrap)   # none of the family
        table['envelope_curves'] = _curve_heights(rows, [w for w in wises if w not in envelope], bootstrap)
        table['envelope_curve_pairs'] = _curve_pairs(table['envelope_curves'], bootstrap)
    return table


def _over_alphas(per_alpha: Mapping[float, Sequence[float]], bootstrap) -> Dict[str, Any]:
    """Per seed the mean over the alphas of their heights (``per_alpha``: alpha -> per-seed heights)."""
    per_seed = np.mean(list(per_alpha.values()), axis=0).tolist()
    low, high = bootstrap(per_seed)
    return {'alphas': list(per_alpha), 'per_alpha': {str(a): list(h) for a, h in per_alpha.items()},
            'per_seed': per_seed, 'mean': float(np.mean(per_seed)), 'ci_low': low, 'ci_high': high}


def _curve_pairs(summaries: Sequence[Mapping[str, Any]], bootstrap) -> List[Dict[str, Any]]:
    """Every two curves' heights above the envelope (same sweep point), the first's minus the second's
    per seed, averaged over the alphas both have inside it, at the same source gain and at the same distance."""
    pairs = []
    for i, first in enumerate(summaries):
        for second in summaries[i + 1:]:
            if first['sweep'] != second['sweep']:
                continue
            pair: Dict[str, Any] = {'method': first['method'], 'minus': second['method'], 'sweep': first['sweep']}
            for name in ('source_gain', 'distance'):
                if name in first and name in second and first[name]['seeds'] == second[name]['seeds']:
                    shared = [a for a in first[name]['per_alpha'] if a in second[name]['per_alpha']]
                    if shared:
                        pair[name] = _over_alphas({float(a): np.subtract(first[name]['per_alpha'][a],
                                                                          second[name]['per_alpha'][a]).tolist()
                                                   for a in shared}, bootstrap)
            pairs.append(pair)
    return pairs


def _curve_heights(rows: Sequence[Mapping[str, Any]], curves: Sequence[str], bootstrap) -> List[Dict[str, Any]]:
    """Per WiSE-FT method outside the envelope (and sweep point): its points' heights above the envelope,
    per seed the mean over the alphas inside the envelope on every seed, with a bootstrap interval; at
    the same source gain and, on the targets, at the same distance.

    Why: whether interpolating another run with the start (LDT's, say) keeps more than fine-tuning's
    retention along the whole curve, not at one alpha picked after the fact."""
    reads = (('source_gain', 'above_envelope', lambda h: h.get('per_seed')),
             ('distance', 'at_distance_envelope', lambda h: (h.get('targets') or {}).get('per_seed')))
    summaries = []
    for curve in curves:
        points = [r for r in rows if r['method'] == curve]
        sweeps: List[Dict[str, Any]] = []
        for r in points:
            if without_alpha(r['sweep']) not in sweeps:
                sweeps.append(without_alpha(r['sweep']))
        for sweep in sweeps:
            summary: Dict[str, Any] = {'method': curve, 'sweep': sweep}
            for name, key, read in reads:
                inside = [(r['sweep'][ALPHA], r[key]['seeds'], read(r[key])) for r in points
                          if without_alpha(r['sweep']) == sweep and r.get(key) and read(r[key]) is not None]
                inside = [i for i in inside if i[1] == inside[0][1]]          # the same seeds throughout
                if inside:
                    summary[name] = {'seeds': inside[0][1], **_over_alphas({a: h for a, _, h in inside}, bootstrap)}
            summaries.append(summary)
    return summaries


def _height_pairs(rows: Sequence[Mapping[str, Any]], heights_key: str, left_out: Set[Optional[str]],
                  bootstrap) -> List[Dict[str, Any]]:
    """Every two methods with heights at the same distance (same sweep point; not those ``left_out``: the
    run a curve interpolates, whose height is 0 by construction, and curves' points): the first's targets'
    height minus the second's, paired by seed over the seeds both have, with a bootstrap interval.

    Why: "does the variance ranking protect beyond the distance" compares two methods' heights seed by
    seed (each seed's curve is its own FT's); their means' difference has no interval of its own."""
    measured = [r for r in rows if 'targets' in (r.get(heights_key) or {}) and r['method'] not in left_out]
    pairs = []
    for i, first in enumerate(measured):
        for second in measured[i + 1:]:
            if first['sweep'] != second['sweep']:
                continue
            heights = [dict(zip(r[heights_key]['seeds'], r[heights_key]['targets']['per_seed']))
                       for r in (first, second)]
            seeds = [s for s in heights[0] if s in heights[1]]
            if not seeds:
                continue
            differences = [heights[0][s] - heights[1][s] for s in seeds]
            low, high = bootstrap(differences)
            pairs.append({'method': first['method'], 'minus': second['method'], 'sweep': first['sweep'],
                          'seeds': seeds, 'mean': float(np.mean(differences)), 'ci_low': low, 'ci_high': high,
                          'per_seed': differences})
    return pairs


def _spread(values: Sequence[float]) -> Dict[str, Optional[float]]:
    arr = np.asarray(values, dtype=np.float64)
    return {'mean': float(arr.mean()), 'std': float(arr.std(ddof=1)) if arr.size > 1 else None}


def _above(curve_sets: Sequence[Mapping[str, List[Point]]], names: Sequence[str], point: Mapping[str, Any],
           gains: Sequence[Tuple[int, Point]], bootstrap) -> Dict[str, Any]:
    """Per seed with every curve: the height above the highest of them at the seed's source gain (``by``
    names it), or the distance to their nearest point when none covers it."""
    heights, outside, seeds, by = [], [], [], []
    for seed, (x, y) in gains:
        key = _key('', without_alpha(point), seed)
        if any(key not in curves for curves in curve_sets):
            continue
        seeds.append(seed)
        values = [(value, name) for name, curves in zip(names, curve_sets)
                  if (value := curve_value(curves[key], x)) is not None]
        if not values:
            xs = [c[0] for curves in curve_sets for c in curves[key]]
            outside.append({'seed': seed, 'source_gain': x, 'curve_range': [min(xs), max(xs)],
                            'distance': min(nearest_distance(curves[key], (x, y)) for curves in curve_sets)})
            continue
        value, name = max(values, key=lambda v: v[0])
        heights.append(y - value)
        by.append(name)
    result: Dict[str, Any] = {'seeds': seeds, 'outside': outside}
    if heights and not outside:
        low, high = bootstrap(heights)
        result.update(mean=float(np.mean(heights)), ci_low=low, ci_high=high, by=by, per_seed=heights)
    return result


def _at_distance(curve_sets: Sequence[Mapping[str, List[Tuple[float, float, float]]]], names: Sequence[str],
                 point: Mapping[str, Any], tested: Sequence[Tuple[Mapping[str, Any], Point]],
                 bootstrap) -> Dict[str, Any]:
    """Per seed with every curve (``tested``: each run with its gains): the targets' and the source's gain
    minus those of the curve with the highest targets' gain at the run's distance from the start (``by`` names
    it), or, beyond every curve's farthest point, the two distances."""
    heights: Dict[str, List[float]] = {'targets': [], 'source': []}
    seeds, outside, by = [], [], []
    for record, gains in tested:
        key = _key('', without_alpha(point), record['seed'])
        if any(key not in curves for curves in curve_sets):
            continue
        seeds.append(record['seed'])
        distance = record['distance']
        values = []
        for name, curves in zip(names, curve_sets):
            targets = curve_value([(d, t) for d, _, t in curves[key]], distance)
            if targets is not None:      # the source's curve has the same distances: covered too
                values.append((targets, curve_value([(d, s) for d, s, _ in curves[key]], distance), name))
        if not values:
            outside.append({'seed': record['seed'], 'distance': distance,
                            'curve_end': max(d for curves in curve_sets for d, _, _ in curves[key])})
            continue
        targets, source, name = max(values, key=lambda v: v[0])
        heights['source'].append(gains[0] - source)
        heights['targets'].append(gains[1] - targets)
        by.append(name)
    result: Dict[str, Any] = {'seeds': seeds, 'outside': outside}
    if heights['targets'] and not outside:
        for name, values in heights.items():    # per seed too: paired differences between methods (by seed)
            low, high = bootstrap(values)
            result[name] = {'mean': float(np.mean(values)), 'ci_low': low, 'ci_high': high, 'per_seed': values}
        result['by'] = by
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
    distances = any(row.get('distance') for row in table['rows'])
    if distances:
        lines[-1] += (' Distance: ||theta - theta_start|| / ||theta_start|| of the tested weights (every parameter and '
                      'floating buffer). "At the same distance": the gains minus the curve\'s at the method\'s distance '
                      'from the start (the curve over distance: the start, each alpha, the run), targets / source, mean '
                      'over seeds [95% bootstrap interval]; a method farther from the start than the run is outside.')
    header = f"| Method | source gain | targets' Mean gain | above {table['wise_ft'] or 'the curve'} |"
    rule = '|---|---|---|---|'
    if distances:
        header += f" distance from the start | above {table['wise_ft'] or 'the curve'} at the same distance: targets / source |"
        rule += '---|---|'
    lines += ['', header + ' n |', rule + '---|']
    gone = table.get('distance_missing') or []
    for row in table['rows']:
        above = '(the curve)' if row['method'] == table['wise_ft'] else _above_cell(row.get('above_curve'))
        cells = [_cell(row['source_gain']), _cell(row['target_gain']), above]
        if distances:
            cells.append('-' if row.get('distance') is None else _cell(row['distance'], '.4f', ''))
            cells.append('(the curve)' if row['method'] == table['wise_ft'] else _at_distance_cell(row.get('at_distance')))
        lines.append(f"| {point_key(row['method'], row['sweep'])} | " + ' | '.join(cells) + f" | {row['n']} |")
    if table.get('height_pairs'):
        lines += ['', "Targets' heights at the same distance, paired by seed (the first method's minus the second's, "
                      'over the seeds both have; mean [95% bootstrap interval]):', '',
                  '| Methods | difference of the targets\' heights | per seed | n |', '|---|---|---|---|']
        lines += [_pair_line(pair, point_key) for pair in table['height_pairs']]
    if table.get('envelope'):
        lines += _envelope_lines(table, point_key, distances)
    if gone:
        lines += ['', f"No distance for {', '.join(gone)}: the weights these runs were tested with, or the "
                          "start's, are gone (study.json's `distance_missing` names the file)."]
    return lines + ['']


def _envelope_lines(table: Mapping[str, Any], point_key, distances: bool) -> List[str]:
    """The heights above the upper envelope of every WiSE-FT curve, for the methods that are none of them."""
    names = ', '.join(table['envelope'])
    lines = ['', f'### Above the envelope of {names}', '',
             'Per seed, the highest of these curves at the method\'s source gain and, at its distance from the start, '
             'the curve with the highest targets\' gain there (its source gain read off the same curve); "by": which '
             'curve that is, counted over seeds. Mean over seeds [95% bootstrap interval].', '']
    header, rule = '| Method | above the envelope at the same source gain | by |', '|---|---|---|'
    if distances:
        header, rule = header + ' above it at the same distance: targets / source | by |', rule + '---|---|'
    lines += [header + ' n |', rule + '---|']
    for row in table['rows']:
        if 'above_envelope' not in row:
            continue
        above, at = row['above_envelope'], row.get('at_distance_envelope')
        cells = [_above_cell(above), _by_cell(above)]
        if distances:
            cells += [_at_distance_cell(at), _by_cell(at)]
        lines.append(f"| {point_key(row['method'], row['sweep'])} | " + ' | '.join(cells) + f" | {row['n']} |")
    if table.get('envelope_pairs'):
        lines += ['', "Targets' heights above the envelope at the same distance, paired by seed:", '',
                  '| Methods | difference of the targets\' heights | per seed | n |', '|---|---|---|---|']
        lines += [_pair_line(pair, point_key) for pair in table['envelope_pairs']]
    if table.get('envelope_curves'):
        lines += ['', 'Curves outside the envelope: per seed, the mean of their points\' heights above it over the alphas '
                      'inside it on every seed (listed), then mean over seeds [95% bootstrap interval]:', '',
                  '| Curve | at the same source gain (alphas) | at the same distance, targets (alphas) |', '|---|---|---|']
        for curve in table['envelope_curves']:
            cells = [f"{_interval(curve[name])} ({', '.join(f'{a:g}' for a in curve[name]['alphas'])})"
                     if name in curve else '-' for name in ('source_gain', 'distance')]
            lines.append(f"| {point_key(curve['method'], curve['sweep'])} | " + ' | '.join(cells) + ' |')
        for pair in table['envelope_curve_pairs']:
            names = f"{point_key(pair['method'], pair['sweep'])} - {point_key(pair['minus'], pair['sweep'])}"
            cells = [f"{_interval(pair[name])} ({', '.join(f'{a:g}' for a in pair[name]['alphas'])})" if name in pair
                     else '-' for name in ('source_gain', 'distance')]
            lines.append(f'| {names} | ' + ' | '.join(cells) + ' |')
    return lines


def _by_cell(heights: Optional[Mapping[str, Any]]) -> str:
    counts = Counter((heights or {}).get('by') or [])
    return ', '.join(f'{name} x{count}' for name, count in counts.most_common()) or '-'


def _pair_line(pair: Mapping[str, Any], point_key) -> str:
    names = f"{point_key(pair['method'], pair['sweep'])} - {point_key(pair['minus'], pair['sweep'])}"
    per_seed = ', '.join(f'{v:+.3f}' for v in pair['per_seed'])
    return f"| {names} | {_interval(pair)} | {per_seed} | {len(pair['seeds'])} |"


def _at_distance_cell(at: Optional[Mapping[str, Any]]) -> str:
    if not at:
        return '-'
    if at['outside']:
        farthest = max(at['outside'], key=lambda o: o['distance'] - o['curve_end'])
        return (f"outside: farther than the run for {len(at['outside'])} of {len(at['seeds'])} seeds (e.g. seed "
                f"{farthest['seed']}: {farthest['distance']:.4f} against {farthest['curve_end']:.4f})")
    if 'targets' not in at:
        return '-'
    return ' / '.join(_interval(at[name]) for name in ('targets', 'source'))


def _interval(stats: Mapping[str, Optional[float]]) -> str:
    if stats['ci_low'] is None:
        return f"**{stats['mean']:+.3f}**"
    return f"**{stats['mean']:+.3f}** [{stats['ci_low']:+.3f}, {stats['ci_high']:+.3f}]"


def _cell(stats: Mapping[str, Optional[float]], digits: str = '.3f', sign: str = '+') -> str:
    return f"{stats['mean']:{sign}{digits}}" + ('' if stats['std'] is None else f" ± {stats['std']:{digits}}")


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
    return _interval(above)


def plot(path: str, table: Mapping[str, Any], point_key, title: str) -> None:
    """Targets' Mean gain against source gain: methods as points (seed std as error bars), the WiSE-FT
    curve as a line through the start, its alphas and the interpolated run; with distances, a second
    panel of the targets' gain against the distance from the start."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    curve_names = [table['wise_ft']] + [c['wise_ft'] for c in table['curves'] if c['wise_ft'] != table['wise_ft']]
    points = [row for row in table['rows'] if row['method'] not in curve_names]     # the curves are lines
    # a curve outside the envelope (of LDT, say) in its run's colour; the first curve and the envelope's grey
    colours = {row['method']: f'C{number % 10}' for number, row in enumerate(points)}
    grey = set(table.get('envelope') or curve_names)
    with_distance = any(row.get('distance') for row in points)
    fig, axes = plt.subplots(1, 2 if with_distance else 1, figsize=(13.0 if with_distance else 7.0, 5.0), squeeze=False)
    panels = [(axes[0][0], 'mean', lambda row: row['source_gain'], 'source gain over the start (dB PSNR)')]
    if with_distance:
        panels.append((axes[0][1], 'by_distance', lambda row: row.get('distance'),
                       'distance from the start, ||theta - theta_start|| / ||theta_start||'))
    for ax, curve_key, x_of, x_label in panels:
        ax.axhline(0.0, color='0.6', lw=0.8)
        ax.axvline(0.0, color='0.6', lw=0.8)
        for curve in table['curves']:
            if curve_key not in curve:
                continue
            xs, ys = [p[0] for p in curve[curve_key]], [p[-1] for p in curve[curve_key]]
            suffix = f" ({', '.join(f'{k}={v}' for k, v in curve['sweep'].items())})" if curve['sweep'] else ''
            number = curve_names.index(curve['wise_ft'])          # the first curve solid, alphas marked
            colour = '0.35' if curve['wise_ft'] in grey else colours.get(curve['of'], '0.35')
            ax.plot(xs, ys, LINES[number % len(LINES)], color=colour, lw=1.5, zorder=1,
                    label=f"{curve['wise_ft']} curve{suffix}: start, alpha, {curve['of']}")
            for alpha, x, y in zip(curve['alphas'], xs, ys) if number == 0 else ():
                ax.annotate(f'{alpha:g}', (x, y), textcoords='offset points', xytext=(4, -10), fontsize=7, color='0.35')
        ax.plot([0.0], [0.0], 'k*', ms=10, label=f"{table['start']} (0, 0)", zorder=3)
        for number, row in enumerate(points):     # colours repeat after ten: the marker tells them apart
            sx, sy = x_of(row), row['target_gain']
            if sx is None:
                continue
            ax.errorbar([sx['mean']], [sy['mean']], xerr=[sx['std'] or 0.0], yerr=[sy['std'] or 0.0],
                        fmt=MARKERS[number % len(MARKERS)], color=f'C{number % 10}', capsize=3, zorder=2,
                        label=f"{point_key(row['method'], row['sweep'])} (n={row['n']})")
        ax.set_xlabel(x_label)
        ax.set_ylabel("targets' Mean gain over the start (dB PSNR)")
        ax.grid(alpha=0.3)
    axes[0][0].set_title(title)
    axes[0][0].legend(fontsize=7, loc='best')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ['curve_value', 'markdown_lines', 'nearest_distance', 'plot', 'run_gains', 'tradeoff']
