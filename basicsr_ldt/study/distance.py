"""How far each run's tested weights lie from the study's start in weight space:

    d = ||theta - theta_start||_2 / ||theta_start||_2

over every parameter and floating-point buffer, in float64 (docs/studies.md, "The trade-off picture").

Why: "a method keeps more of the start because it moves less" is a statement about this distance.
Gains over the start say how much a method kept; only the distance says how far it went to keep it,
so a method can be compared with moving the same distance along FT's direction (WiSE-FT at alpha lies
at alpha times FT's distance) or with L2-SP, which penalises exactly this distance.

The weights are the ones the run was tested with, read from its test options the way test.py reads
them: the EMA copy of an EMA run, LDT's composite, a WiSE-FT interpolation.
"""
import math
from os import path as osp
from typing import Dict, List, Mapping, Optional

import torch

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.pipelines.evaluate import checkpoints_of
from basicsr_ldt.weights.checkpoint import read_state
from basicsr_ldt.weights.interpolate import interpolate_states
from basicsr_ldt.weights.releases import release_name

State = Dict[str, torch.Tensor]


def relative_distance(state: Mapping[str, torch.Tensor], start: Mapping[str, torch.Tensor], what: str) -> float:
    """||state - start|| / ||start|| over the start's floating tensors (``what`` names ``state`` in errors)."""
    keys = [k for k, v in start.items() if v.is_floating_point()]
    absent = [k for k in keys if k not in state]
    wrong = [k for k in keys if k in state and state[k].shape != start[k].shape]
    if absent or wrong:
        example = (absent or wrong)[0]
        raise InputError(f'{what} does not hold the start\'s tensors ({len(absent)} missing, {len(wrong)} with another '
                         f'shape, e.g. {example}): its distance from the start is undefined')
    moved = sum(float(((state[k].double() - start[k].double()) ** 2).sum()) for k in keys)
    size = sum(float((start[k].double() ** 2).sum()) for k in keys)
    if size == 0.0:
        raise InputError('the start\'s weights are all zero: a distance relative to them is undefined')
    return math.sqrt(moved / size)


class WeightsGone(InputError):
    """A tested run's weights file is no longer there (deleted to save space after its test)."""


def tested_state(test_opt: Mapping, root: str) -> Optional[State]:
    """The weights of a study run's one test entry (None for Bicubic: no network)."""
    entry = checkpoints_of(test_opt)[0]
    if entry['bicubic']:
        return None
    state = _read(root, entry['path'], entry['param_key'], entry['exact_key'])
    wise = entry.get('wise_ft')
    if wise is None:
        return state
    start = _read(root, wise['start'], wise['start_param_key'], wise['start_exact'])
    return interpolate_states(start, state, wise['alpha'])


def _read(root: str, path: str, param_key: str, exact: bool) -> State:
    """A file named in a study's test options, read as the test subprocess read it: from the study's
    root (the subprocess's working folder), a release name (``HAT_SRx4``) through ``read_state``."""
    local = path if osp.isabs(path) else osp.join(root, path)
    if osp.isfile(local):
        path = local
    elif release_name(path) is None:
        raise WeightsGone(f"weights '{local}' are gone")
    return read_state(path, param_key, fallback=not exact)[1]


def add_distances(records: List[Dict], runs: Mapping[str, object], start: Optional[str], root: str) -> None:
    """Set each record's ``distance`` from the start's weights (None for Bicubic, or where the run's
    weights or the start's are gone: ``distance_missing`` then names the file). Needs the start's record."""
    start_run = next((runs[r['run']] for r in records if r['method'] == start), None)
    if start_run is None:
        return
    try:
        origin = tested_state(start_run.test_opt, root)
    except WeightsGone as err:   # the report goes on without distances, and says why
        for record in records:
            bicubic = checkpoints_of(runs[record['run']].test_opt)[0]['bicubic']
            record['distance'], record['distance_missing'] = None, None if bicubic else f'the start\'s {err}'
        return
    for record in records:
        run = runs[record['run']]
        try:
            state = tested_state(run.test_opt, root)
        except WeightsGone as err:
            record['distance'], record['distance_missing'] = None, str(err)
            continue
        record['distance'] = None if state is None else relative_distance(state, origin, f"run {run.name}'s weights")


__all__ = ['add_distances', 'relative_distance', 'tested_state']
