"""Study files: one YAML naming a base training file, a test file, seeds, methods and a sweep.

A study expands to one run per (method, sweep point, seed). Each run's options are the base
training options with the method's overrides merged in (nested mappings merge, anything else
replaces), then the sweep point's values, then ``manual_seed``. Everything is checked here,
before any run starts and before anything is written: a misspelt override key would otherwise
silently train the base method several times over and the study would compare a method with itself.
"""
import copy
import dataclasses
import itertools
import json
import re
from os import path as osp
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

from basicsr.utils.registry import ARCH_REGISTRY, MODEL_REGISTRY

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.option_file import load_option_file
from basicsr_ldt.common.options import check_known_keys, closest_key_hint, registered
from basicsr_ldt.common.schema import MAX_SEED, TEST, TRAIN, check_options, is_seed, section_keys
from basicsr_ldt.corgrad import CorGradConfig
from basicsr_ldt.ldt import LDTConfig
from basicsr_ldt.ldt.typed import MISSING, lookup
from basicsr_ldt.models.corgrad_model import corgrad_config_from_options, trains_corgrad
from basicsr_ldt.models.option_values import check_option_values
from basicsr_ldt.models.resumable import training_cameras
from basicsr_ldt.weights.releases import fetch_hint, release_file

#: Option keys the study writes into every run, and why.
STUDY_SET = {'name': 'each run is <study>/<run>', 'manual_seed': "the study's seeds list",
             'path.resume_state': 'a started run resumes by itself'}
#: Option keys that fix a random draw for every seed of a study: with one written, the seeds would
#: repeat one partition or one sequence of crops and the bootstrap intervals would treat them as
#: independent draws. Absent, each follows ``manual_seed``.
SEED_PINNING = {'ldt.seed': 'random layer partition and CorGrad camera order',
                'datasets.train.seed': 'training crops and flips'}
#: Keys of a study file. ``overrides`` applies to every method (before the method's own).
STUDY_KEYS = ('name', 'train', 'test', 'seeds', 'methods', 'sweep', 'reference', 'overrides', 'envelope')
#: A method's key naming another base training file than the study's ``train`` (e.g. per network).
METHOD_BASE_KEY = 'base'
#: ``Bicubic: {bicubic: true}``: a method that trains nothing, the LR image upscaled bicubically.
#: It is deterministic, so it is tested once (run name = its label) and paired with every seed.
BICUBIC_KEY = 'bicubic'
#: ``Start: {start: true}``: the weights every run starts from (the base training options'
#: ``path.pretrain_network_g``), tested once like Bicubic. Gains over the start, and the trade-off
#: picture (``report.tradeoff``), are measured from it.
START_KEY = 'start'
#: ``WiSE-FT: {wise_ft: {of: FT, alphas: [0.25, 0.5, 0.75]}}``: no training; per seed and alpha the
#: weights (1 - alpha) theta_start + alpha theta_run of the named method's run are tested
#: (Wortsman et al., CVPR 2022; ``basicsr_ldt.weights.interpolate``).
WISE_FT_KEY = 'wise_ft'
#: The sweep key under which a WiSE-FT run's alpha is recorded (run names show ``alpha=<value>``).
ALPHA = 'wise_ft.alpha'
#: ``ldt:`` keys: ``method`` and the fields of LDT's and CorGrad's configurations, which check the
#: block's values (the schema leaves the block to them).
LDT_BLOCK_KEYS = tuple(dict.fromkeys(['method'] + [f.name for cls in (LDTConfig, CorGradConfig)
                                                   for f in dataclasses.fields(cls)]))
RUN_NAME_CHARS = re.compile(r'[^A-Za-z0-9._+=-]+')


@dataclasses.dataclass
class Run:
    """One training + test of a study: a method at a sweep point with a seed; or, for a method
    without training (Bicubic), one test (``train_opt`` and ``seed`` None)."""
    index: int
    name: str
    method: str
    seed: Optional[int]
    sweep: Dict[str, Any]
    train_opt: Optional[Dict[str, Any]]
    test_opt: Dict[str, Any]
    #: Without training: the study's source cameras (the base training file's), marked and left
    #: out of the Mean like the trained methods' sources.
    untrained_sources: List[str] = dataclasses.field(default_factory=list)
    #: The run whose final checkpoint this test reads (WiSE-FT), which must finish first.
    after: Optional[str] = None
    #: Files of other runs this test reads: results older than any of them are stale.
    inputs: List[str] = dataclasses.field(default_factory=list)
    #: What a run without training tests, for ``--dry-run``.
    description: str = ''

    @property
    def trained(self) -> bool:
        return self.train_opt is not None

    @property
    def uses_ema(self) -> bool:
        """Whether BasicSR keeps an EMA copy of the weights (``train.ema_decay`` > 0)."""
        return self.trained and bool((self.train_opt.get('train') or {}).get('ema_decay', 0))

    def source_cameras(self) -> List[str]:
        if not self.trained:
            return list(self.untrained_sources)
        return train_cameras(self.train_opt)


@dataclasses.dataclass
class Study:
    """A parsed and validated study file."""
    path: str
    name: str
    train: str
    test: str
    seeds: List[int]
    methods: Dict[str, Dict[str, Any]]
    sweep: Dict[str, List[Any]]
    reference: str
    runs: List[Run]
    #: Methods without training and seed (``bicubic: true``, ``start: true``): one run each.
    untrained: List[str] = dataclasses.field(default_factory=list)
    #: The ``start: true`` method, if any: what gains are measured from.
    start: Optional[str] = None
    #: WiSE-FT methods: label -> (the method interpolated, its alphas).
    interpolations: Dict[str, Tuple[str, List[float]]] = dataclasses.field(default_factory=dict)
    #: The WiSE-FT methods whose upper envelope the report takes (``envelope:``); empty: all, if two or more.
    envelope: List[str] = dataclasses.field(default_factory=list)

    def method_points(self, method: str) -> List[Dict[str, Any]]:
        """The sweep points a method has results at: one for a method without training and seed,
        every (sweep point, alpha) for WiSE-FT, else the study's sweep points."""
        if method in self.untrained:
            return [{}]
        if method in self.interpolations:
            return [{**point, ALPHA: alpha} for point in self.sweep_points()
                    for alpha in self.interpolations[method][1]]
        return self.sweep_points()

    def sweep_points(self) -> List[Dict[str, Any]]:
        return sweep_points(self.sweep)

    def cameras(self) -> List[str]:
        """Target cameras in the order the test file lists them."""
        cameras: List[str] = []
        for dataset in (self.runs[0].test_opt.get('datasets') or {}).values() if self.runs else []:
            for camera in dataset.get('cameras') or []:
                if camera not in cameras:
                    cameras.append(camera)
        return cameras


def train_cameras(opt: Mapping[str, Any]) -> List[str]:
    """The source cameras of training options (``datasets.train.cameras``: a list or one name), as a
    training state records them; none named (or no training set): []."""
    return (training_cameras(opt) or []) if (opt.get('datasets') or {}).get('train') else []


def without_alpha(point: Mapping[str, Any]) -> Dict[str, Any]:
    """A WiSE-FT run's sweep point less its alpha: the point of the run it interpolates."""
    return {k: v for k, v in point.items() if k != ALPHA}


def read_yaml(path: str, what: str) -> Dict[str, Any]:
    """A YAML mapping from ``path``, read as the entry points read option files (plain values only:
    a Python tag, a key given twice, an empty file or a non-mapping is bad input naming ``what``)."""
    return load_option_file(path, what)


def merge_options(base: Dict[str, Any], overrides: Mapping[str, Any], where: str, prefix: str = '') -> Dict[str, Any]:
    """``base`` with ``overrides`` merged in; an override key that is not an option raises.

    A key is an option when the base has it or when the schema (basicsr_ldt.common.schema) lists
    it for its section; a section that the base lacks (e.g. ``ldt`` on an FT base) is checked against
    that list too. Sections of constructor arguments and datasets take any key here: the options
    of each run are checked as a whole afterwards (:func:`check_training_options`).
    """
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        dotted = f'{prefix}{key}'
        section = prefix[:-1]
        listed = LDT_BLOCK_KEYS if section == 'ldt' else section_keys(section)
        known = key in merged or listed is None or key in listed
        if not known:
            valid = list(merged) + list(listed)
            hint = closest_key_hint(str(key), valid)
            raise InputError(f"{where}: '{dotted}' is not an option of the base file{hint}")
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_options(merged[key], value, where, f'{dotted}.')
        elif isinstance(value, Mapping):
            merged[key] = merge_options({}, value, where, f'{dotted}.')
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _check_sweep_section(opt: Mapping[str, Any], dotted: str, where: str) -> None:
    """A sweep varies an option of every method, so its section must exist in each method's options
    (sweeping ``ldt.ratio_u`` over an FT method would silently train FT several times)."""
    parts = dotted.split('.')
    section: Any = opt
    for depth, part in enumerate(parts[:-1]):
        section = section.get(part) if isinstance(section, Mapping) else None
        if not isinstance(section, Mapping):
            raise InputError(f"{where}: the options have no section '{'.'.join(parts[:depth + 1])}' to set "
                             f"'{parts[-1]}' in")


def sweep_points(sweep: Mapping[str, List[Any]]) -> List[Dict[str, Any]]:
    """Every combination of the sweep's values (one empty point without a sweep)."""
    keys = list(sweep)
    return [dict(zip(keys, values)) for values in itertools.product(*(sweep[k] for k in keys))]


def nested(dotted: str, value: Any) -> Dict[str, Any]:
    """``'ldt.ratio_u', 0.3`` -> ``{'ldt': {'ratio_u': 0.3}}``."""
    result: Any = value
    for part in reversed(dotted.split('.')):
        result = {part: result}
    return result


def run_name(method: str, point: Mapping[str, Any], seed: Optional[int]) -> str:
    """A folder name: the method label, each sweep value as ``<last key part>=<value>``, the seed
    (none for a method without training)."""
    parts = [method] + [f"{key.split('.')[-1]}={value}" for key, value in point.items()]
    parts += [] if seed is None else [f'seed{seed}']
    return RUN_NAME_CHARS.sub('-', re.sub(r'\s+', '', '_'.join(str(p) for p in parts)))


def _check_study_keys(study: Mapping[str, Any], path: str) -> None:
    check_known_keys(f"study file '{path}'", study, STUDY_KEYS)
    for key in ('name', 'train', 'test', 'seeds', 'methods'):
        if study.get(key) in (None, '', [], {}):
            raise InputError(f"study file '{path}': '{key}' is missing or empty")
    if not isinstance(study['name'], str) or RUN_NAME_CHARS.search(study['name']):
        raise InputError(f"study file '{path}': name '{study['name']}' must use only letters, digits and ._+=-")
    seeds = study['seeds']
    if not isinstance(seeds, list) or not all(is_seed(s) for s in seeds):
        raise InputError(f"study file '{path}': seeds must be a non-empty list of integers in [0, {MAX_SEED}], got "
                         f'{seeds!r}')
    if len(set(seeds)) != len(seeds):
        raise InputError(f"study file '{path}': seeds list a seed twice: {seeds}")
    if not isinstance(study['methods'], dict):
        raise InputError(f"study file '{path}': methods must map a label to option overrides")
    for label, overrides in study['methods'].items():
        if run_name(str(label), {}, None).strip('.') == '':   # its runs' folder would be the study's or above it
            raise InputError(f"study file '{path}': method label {label!r} names no folder; expected letters or "
                             'digits in it (run folders are named after their method)')
        if not isinstance(overrides, (dict, type(None))):
            raise InputError(f"study file '{path}': method '{label}' must map to option overrides (a mapping)")
        for key, what in ((BICUBIC_KEY, 'it upscales the LR image'), (START_KEY, 'it tests the starting weights')):
            if overrides and key in overrides:
                if overrides[key] is not True:   # false left the method as FT under this label
                    raise InputError(f"study file '{path}': method '{label}': {key}: expected true ({what}; to leave "
                                     f'the method out, remove it), got {overrides[key]!r}')
                extra = [str(k) for k in overrides if k != key]
                if extra:
                    raise InputError(f"study file '{path}': method '{label}' has '{key}: true' ({what}, nothing "
                                     f"is trained), so it takes no other key, got {', '.join(extra)}")
        if overrides and WISE_FT_KEY in overrides:
            _check_wise_ft(study, path, str(label), overrides)
    sweep = study.get('sweep') or {}
    if not isinstance(sweep, dict):
        raise InputError(f"study file '{path}': sweep must map a dotted option key to a list of values")
    for key, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise InputError(f"study file '{path}': sweep '{key}' must be a non-empty list of values")
        if len({json.dumps(v, sort_keys=True) for v in values}) < len(values):   # 0.4 and 0.40 are one value
            raise InputError(f"study file '{path}': sweep '{key}' lists a value twice: {values}")
    # The study writes these keys into every run: a value given for one would be dropped unseen.
    sources = [('overrides', study.get('overrides'))] + [(f"method '{m}'", o) for m, o in study['methods'].items()]
    given = [(f"sweep '{key}'", key) for key in sweep if key in STUDY_SET] + [
        (f"{where} sets '{key}'", key) for where, overrides in sources if isinstance(overrides, Mapping)
        for key in STUDY_SET if lookup(overrides, key) is not MISSING]
    if given:
        what, key = given[0]
        raise InputError(f"study file '{path}': {what}, which the study sets for every run ({STUDY_SET[key]}); "
                         'remove it')
    swept = [(where, key) for where, overrides in sources if isinstance(overrides, Mapping)
             for key in sweep if lookup(overrides, key) is not MISSING]
    if swept:
        where, key = swept[0]
        raise InputError(f"study file '{path}': {where} sets '{key}', which the sweep sets for every run (that value "
                         'would never be trained); remove one of the two')
    reference = study.get('reference')
    if reference is not None and reference not in study['methods']:
        hint = closest_key_hint(str(reference), study['methods'])
        raise InputError(f"study file '{path}': reference '{reference}' is not one of the methods "
                         f"({', '.join(map(str, study['methods']))}){hint}")
    if reference is not None and isinstance(study['methods'][reference], Mapping) \
            and WISE_FT_KEY in study['methods'][reference]:
        raise InputError(f"study file '{path}': reference '{reference}' is a WiSE-FT method, one row per alpha, which "
                         'no other method is paired with; expected a method that trains (or the start, or Bicubic)')
    envelope = study.get('envelope')
    curves = [str(m) for m, o in study['methods'].items() if isinstance(o, Mapping) and WISE_FT_KEY in o]
    if envelope is not None and (not isinstance(envelope, list) or len(envelope) < 2 or len(set(map(str, envelope)))
                                 != len(envelope) or not set(map(str, envelope)) <= set(curves)):
        raise InputError(f"study file '{path}': envelope: expected a list of two or more distinct WiSE-FT methods "
                         f"({', '.join(curves) or 'the study has none'}), got {envelope!r}")


def _check_wise_ft(study: Mapping[str, Any], path: str, label: str, overrides: Mapping[str, Any]) -> None:
    where = f"study file '{path}': method '{label}'"
    extra = [str(k) for k in overrides if k != WISE_FT_KEY]
    if extra:
        raise InputError(f"{where} has '{WISE_FT_KEY}' (it interpolates another method's runs, nothing is trained), "
                         f"so it takes no other key, got {', '.join(extra)}")
    spec = overrides[WISE_FT_KEY]
    if not isinstance(spec, Mapping) or set(spec) != {'of', 'alphas'}:
        raise InputError(f"{where}: {WISE_FT_KEY}: expected {{of: <method>, alphas: [numbers in [0, 1]]}}, got {spec!r}")
    of = spec['of']
    others = study['methods']
    if of not in others or of == label:
        names = [str(m) for m in others if m != label]
        raise InputError(f"{where}: {WISE_FT_KEY}.of '{of}' is not another method of the study "
                         f"({', '.join(names)}){closest_key_hint(str(of), names)}")
    if any(k in (others[of] or {}) for k in (BICUBIC_KEY, START_KEY, WISE_FT_KEY)):
        raise InputError(f"{where}: {WISE_FT_KEY}.of '{of}' trains nothing; WiSE-FT interpolates a trained method")
    alphas = spec['alphas']
    if not isinstance(alphas, list) or not alphas or not all(
            isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a <= 1 for a in alphas) \
            or len({float(a) for a in alphas}) != len(alphas):   # 1 and 1.0: one alpha, one folder
        raise InputError(f"{where}: {WISE_FT_KEY}.alphas: expected a non-empty list of distinct numbers in [0, 1], "
                         f'got {alphas!r}')


def check_training_options(opt: Mapping[str, Any], where: str) -> None:
    """What can be checked without data: registered types, every key, the budget, and the values the
    models check without a network (``basicsr_ldt.models.option_values``)."""
    registered(MODEL_REGISTRY, opt.get('model_type'), f'{where}: model_type')
    registered(ARCH_REGISTRY, (opt.get('network_g') or {}).get('type'), f'{where}: network_g.type')
    check_options(opt, TRAIN, where, required=False)
    total = (opt.get('train') or {}).get('total_iter')
    if not isinstance(total, (int, float)) or int(total) < 1:
        raise InputError(f'{where}: train.total_iter must be a positive number, got {total!r}')
    if 'train' not in (opt.get('datasets') or {}):
        raise InputError(f"{where}: the training options have no 'datasets: train' section")
    if (opt.get('val') or {}).get('save_best'):
        raise InputError(f'{where}: val.save_best keeps the best validated weights in net_g_best.pth, and a study tests '
                         "each run's final weights (net_g_latest.pth), so the selection would not be what is reported; "
                         'remove save_best (or test the best weights with test.py)')
    try:   # for this machine, where study.py runs them (amp fp16 or cuda_graph: true need its GPU)
        check_option_values(opt)
    except InputError as err:
        raise InputError(f'{where}: {err}') from None


def check_test_options(opt: Mapping[str, Any], where: str) -> None:
    check_options(opt, TEST, where)


def evaluation_options(base: Dict[str, Any], study: str, name: str, train_opt: Mapping[str, Any], root: str,
                 ema: bool) -> Dict[str, Any]:
    """The test file evaluating this run's final weights (the EMA copy when the run keeps one)."""
    return _network_test(base, study, name, train_opt,
                         {'path': final_checkpoint(root, study, name), 'param_key': 'params_ema' if ema else 'params'})


def start_evaluation_options(base: Dict[str, Any], study: str, name: str, train_opt: Mapping[str, Any],
                             where: str) -> Dict[str, Any]:
    """The test file of ``start: true``: the weights the training options start from."""
    path = train_opt.get('path') or {}
    if not path.get('pretrain_network_g'):
        raise InputError(f"{where}: '{START_KEY}: true' tests the weights the runs start from, and the base training "
                         'options name none (path.pretrain_network_g)')
    opt = _network_test(base, study, name, train_opt, {'path': path['pretrain_network_g']})
    opt['path']['param_key_g'] = path.get('param_key_g', 'params')   # as training read it: falling back when absent
    return opt


def wise_ft_run(base: Dict[str, Any], study: str, label: str, of: Run, alpha: float, root: str) -> Run:
    """The WiSE-FT test of ``of``'s final weights at ``alpha``: same seed, sweep point and start."""
    start = (of.train_opt.get('path') or {})
    if not start.get('pretrain_network_g'):
        raise InputError(f"method '{label}': {WISE_FT_KEY}.of '{of.method}' starts from no weights "
                         '(path.pretrain_network_g); WiSE-FT interpolates between a start and a run')
    point = {**of.sweep, ALPHA: alpha}
    name = run_name(label, point, of.seed)
    checkpoint = final_checkpoint(root, study, of.name)
    entry = {'path': checkpoint, 'param_key': 'params_ema' if of.uses_ema else 'params',
             'wise_ft': {'start': start['pretrain_network_g'], 'alpha': alpha}}
    opt = _network_test(base, study, name, of.train_opt, entry)
    opt['path']['param_key_g'] = start.get('param_key_g', 'params')   # the start's, as training read it
    return Run(0, name, label, of.seed, point, None, opt, untrained_sources=of.source_cameras(), after=of.name,
               inputs=[checkpoint], description=f"no training: WiSE-FT of {of.name}{' (params_ema)' if of.uses_ema else ''}"
                                                f' at alpha {alpha}')


def bicubic_evaluation_options(base: Dict[str, Any], study: str, name: str, scale: int) -> Dict[str, Any]:
    """The test file of a method without training: one ``{bicubic: true}`` entry, no network."""
    opt = _single_entry_test(base, study, name, scale, {'bicubic': True})
    opt.pop('network_g', None)
    return opt


def _network_test(base: Dict[str, Any], study: str, name: str, train_opt: Mapping[str, Any],
                  entry: Dict[str, Any]) -> Dict[str, Any]:
    """A one-entry test file for weights of the training options' network, at their scale."""
    opt = _single_entry_test(base, study, name, train_opt.get('scale', base.get('scale', 4)), entry)
    opt['network_g'] = copy.deepcopy(train_opt['network_g'])
    return opt


def _single_entry_test(base: Dict[str, Any], study: str, name: str, scale: int, entry: Dict[str, Any]) -> Dict[str, Any]:
    opt = copy.deepcopy(base)
    opt['name'] = f'{study}/{name}'
    opt['scale'] = scale
    opt['path'] = {}
    opt['checkpoints'] = [{'label': name, **entry}]
    # Comparison grids set one network against others; a study run has one (compare afterwards
    # with a test file that lists the runs, as options/demo/test_demo.yml does).
    (opt.get('test') or {}).pop('compare', None)
    return opt


def final_checkpoint(root: str, study: str, name: str) -> str:
    """BasicSR's last save: ``experiments/<study>/<run>/models/net_g_latest.pth``."""
    return osp.join(root, 'experiments', study, name, 'models', 'net_g_latest.pth')


def results_file(root: str, study: str, name: str) -> str:
    """test.py's table for the run: ``results/<study>/<run>/metrics.json``."""
    return osp.join(root, 'results', study, name, 'metrics.json')


def load_study(path: str, root: str) -> Study:
    """Parse, expand and validate a study file; raises :class:`InputError` naming what is wrong."""
    raw = read_yaml(path, 'study file')
    _check_study_keys(raw, path)
    name = raw['name']
    base_train = read_yaml(raw['train'], 'base training file')
    base_test = read_yaml(raw['test'], 'test file')
    check_test_options(base_test, f"test file '{raw['test']}'")
    common = raw.get('overrides') or {}
    sweep = raw.get('sweep') or {}
    methods = {str(label): dict(overrides or {}) for label, overrides in raw['methods'].items()}
    bicubic = [label for label, overrides in methods.items() if overrides.pop(BICUBIC_KEY, False)]
    starts = [label for label, overrides in methods.items() if overrides.pop(START_KEY, False)]
    if len(starts) > 1:
        raise InputError(f"study file '{path}': methods {', '.join(starts)} all have '{START_KEY}: true'; give one")
    interpolations = {label: (str(overrides[WISE_FT_KEY]['of']), [float(a) for a in overrides[WISE_FT_KEY]['alphas']])
                      for label, overrides in methods.items() if WISE_FT_KEY in overrides}
    untrained = [label for label in methods if label in bicubic or label in starts]
    points: List[Tuple[str, Dict[str, Any], Dict[str, Any]]] = []   # (method, sweep point, options)
    for label, overrides in methods.items():
        if label in untrained or label in interpolations:
            continue
        overrides = dict(overrides)
        base_file = overrides.pop(METHOD_BASE_KEY, None)
        base = read_yaml(base_file, f"method '{label}': base training file") if base_file else base_train
        merged = merge_options(base, common, f"study '{name}' overrides")
        merged = merge_options(merged, overrides, f"method '{label}'")
        for point in sweep_points(sweep):
            opt = merged
            for key, value in point.items():
                where = f"sweep '{key}' (method '{label}')"
                _check_sweep_section(merged, key, where)
                opt = merge_options(opt, nested(key, value), where)
                if trains_corgrad(opt) and key.startswith('ldt.') and key[4:] in corgrad_config_from_options(opt)[1]:
                    raise InputError(f"study file '{path}': {where}: CorGrad does not read {key} (an LDT option it "
                                     'ignores), so every point of the sweep would train the same run; sweep a key '
                                     'CorGrad reads, or leave this method out of the sweep')
            points.append((label, point, opt))
    runs: List[Run] = []
    names: Set[str] = set()
    # Methods without training come first: one test each, seconds long, valid for every seed.
    merged = merge_options(base_train, common, f"study '{name}' overrides") if untrained else {}
    for label in untrained:
        run = _claim(names, run_name(label, {}, None), name)
        if label in starts:
            test_opt = start_evaluation_options(base_test, name, run, merged, f"study file '{path}': method '{label}'")
            what = f"no training: the starting weights {merged['path']['pretrain_network_g']}, tested once"
        else:
            test_opt = bicubic_evaluation_options(base_test, name, run, merged.get('scale', base_test.get('scale', 4)))
            what = 'no training: bicubic upscaling of the LR image, tested once'
        runs.append(Run(len(runs), run, label, None, {}, None, test_opt, untrained_sources=train_cameras(merged),
                        description=what + ', paired with every seed'))
    # Seed-major order: a study stopped half-way has every method for its first seeds (paired data).
    for seed in raw['seeds']:
        for label, point, opt in points:
            run = _claim(names, run_name(label, point, seed), name)
            train_opt = copy.deepcopy(opt)
            train_opt['name'] = f'{name}/{run}'
            train_opt['manual_seed'] = seed
            train_opt.setdefault('path', {})['resume_state'] = None
            pinned = [key for key in SEED_PINNING if lookup(train_opt, key) is not MISSING]
            if pinned and len(raw['seeds']) > 1:
                raise InputError(f"study file '{path}': method '{label}' runs with {pinned[0]}: "
                                 f"{lookup(train_opt, pinned[0])!r} (from the study file or its base), so every "
                                 f"seed would draw the same {SEED_PINNING[pinned[0]]}; remove it (it follows "
                                 'manual_seed, which the study sets per seed)')
            check_training_options(train_opt, f"run '{run}'")
            if not set(train_cameras(train_opt)) - {'all'}:
                raise InputError(f"study file '{path}': method '{label}' trains on every camera of its training "
                                 "folder (datasets.train.cameras absent or 'all'); name its source cameras: the "
                                 'report marks them and leaves them out of the Mean')
            if starts and _start_of(train_opt) != _start_of(merged):
                raise InputError(f"study file '{path}': method '{label}' starts from {_start_of(train_opt)}, not "
                                 f"from the study's start '{starts[0]}' ({_start_of(merged)}): its gains and "
                                 'distance would be measured from weights it did not start from')
            ema = bool((train_opt.get('train') or {}).get('ema_decay', 0))
            runs.append(Run(len(runs), run, label, seed, dict(point), train_opt,
                            evaluation_options(base_test, name, run, train_opt, root, ema)))
    # WiSE-FT tests read finished runs' weights: after every trained run (execute runs them last).
    by_point = {(r.method, json.dumps(r.sweep, sort_keys=True), r.seed): r for r in runs if r.trained}
    for seed in raw['seeds']:
        for label, (of, alphas) in interpolations.items():
            for point in sweep_points(sweep):
                for alpha in alphas:
                    run = wise_ft_run(base_test, name, label, by_point[(of, json.dumps(point, sort_keys=True), seed)],
                                      alpha, root)
                    _claim(names, run.name, name)
                    run.index = len(runs)
                    runs.append(run)
    reference = raw.get('reference') or next(iter(methods))
    return Study(path, name, raw['train'], raw['test'], list(raw['seeds']), methods, dict(sweep), reference, runs,
                 untrained, starts[0] if starts else None, interpolations, [str(m) for m in raw.get('envelope') or []])


def _claim(names: Set[str], run: str, study: str) -> str:
    """``run``, added to the folder names taken; two runs in one folder would overwrite each other."""
    if run in names:
        raise InputError(f"study '{study}': two runs would share the folder name '{run}'; rename a method")
    names.add(run)
    return run


def _start_of(train_opt: Mapping[str, Any]) -> str:
    """The weights a run starts from, as training reads them: the file and its key (BasicSR: 'params')."""
    path = train_opt.get('path') or {}
    return f"{path.get('pretrain_network_g')!r} (key {path.get('param_key_g', 'params')!r})"


def missing_inputs(study: Study, root: str) -> List[str]:
    """Data folders and starting weights that a run needs and that are not there (not checked
    by ``--dry-run``, so that study files validate on machines without the data)."""
    missing: List[str] = []
    for run in study.runs:
        opts = [(run.train_opt, 'train'), (run.test_opt, 'test')] if run.trained else [(run.test_opt, 'test')]
        for opt, kind in opts:
            for phase, dataset in (opt.get('datasets') or {}).items():
                for key in ('dataroot_gt', 'dataroot_lq'):
                    folder = dataset.get(key)
                    if folder and not osp.isdir(osp.join(root, folder)):
                        missing.append(f"{kind} datasets.{phase}.{key} '{folder}'")
        weights = ((run.train_opt or {}).get('path') or {}).get('pretrain_network_g')
        if weights and not osp.isfile(release_file(weights) or osp.join(root, weights)):
            missing.append(f"path.pretrain_network_g '{weights}'{fetch_hint(weights)}")
    return list(dict.fromkeys(missing))


__all__ = ['ALPHA', 'Run', 'Study', 'load_study', 'merge_options', 'missing_inputs', 'sweep_points', 'run_name',
           'final_checkpoint', 'results_file', 'read_yaml']
