"""The one schema of option files: every key that ``Train_pip.py``, ``test.py``, ``inference.py --opt``
and ``scripts/study.py`` read, where it may appear, which model types read it, what is required
and which defaults are filled in.

Why one place: BasicSR 1.4.2 reads its options with ``opt['key']`` and ``opt.get('key')`` spread
over a dozen files and says nothing about a key it does not read, so ``vall:`` for ``val:`` trained
to the end without validation, and an ``ldt:`` block on an FT file trained FT labelled as LDT.
The lists below were taken from the code that reads the keys (BasicSR 1.4.2's
``utils/options.py``, ``train.py``, ``data/__init__.py``, ``models/base_model.py``,
``sr_model.py``, ``srgan_model.py``, ``utils/logger.py``, ``utils/dist_util.py``, and this
project's models, pipelines and dataset); docs/options.md gives each key's meaning. A key a
section does not list is refused with one line naming it and the closest known key.

Sections whose keys are a constructor's arguments (``network_g``, ``train.optim_g``,
``train.scheduler``, the losses, each ``val.metrics`` entry) are checked against that
constructor's signature, read with :mod:`inspect` (nothing is built). The ``ldt:`` block's own
keys and every value are checked by their owners (``basicsr_ldt.ldt``, the dataset, the models).
"""
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.options import closest_key_hint

TRAIN, TEST = 'train', 'test'
#: The constructor argument that holds a network's upscaling factor, per architecture.
SCALE_KEYS = ('upscale', 'upscaling_factor', 'scale')
#: What each role is, in messages.
ROLE_NAMES = {TRAIN: 'training (Train_pip.py)', TEST: 'test.py'}

#: BasicSR's two names of its multi-step schedule (both build ``MultiStepRestartLR``).
MULTI_STEP = ('MultiStepLR', 'MultiStepRestartLR')
#: Model types of this project, then BasicSR's image SR models that the training pipeline runs.
PROJECT_MODELS = ('FTSRModel', 'LDTSRModel', 'CorGradSRModel')
BASICSR_SR_MODELS = ('SRModel', 'SwinIRModel')
GAN_MODELS = ('SRGANModel', 'ESRGANModel')
MODEL_TYPES = PROJECT_MODELS + BASICSR_SR_MODELS + GAN_MODELS
#: Model types whose ``ldt:`` block selects the method (``ldt.method``).
LDT_BLOCK_MODELS = ('LDTSRModel', 'CorGradSRModel')
_NOT_LDT = tuple(m for m in MODEL_TYPES if m != 'LDTSRModel')
_NO_DEFAULT = object()


@dataclass(frozen=True)
class Key:
    """One option key: the entry points (roles) and model types that read it, whether it is
    required, the default filled in when it is absent, and who sets it instead of the file."""
    roles: Tuple[str, ...] = (TRAIN, TEST)
    models: Tuple[str, ...] = MODEL_TYPES
    required: bool = False
    default: Any = _NO_DEFAULT
    set_by: Optional[str] = None


def _keys(names: Sequence[str], **spec: Any) -> Dict[str, Key]:
    return {name: Key(**spec) for name in names}


_ENTRY = 'the entry point (from the command line and the section names)'
#: Top level. ``num_gpu`` and ``path`` are read by BasicSR's ``parse_options`` unconditionally:
#: their obvious defaults are filled in (``auto`` is what BasicSR's own option files write).
TOP_LEVEL: Dict[str, Key] = {
    'name': Key(required=True),
    'model_type': Key(roles=(TRAIN,), required=True),
    'scale': Key(),
    'num_gpu': Key(default='auto'),
    'manual_seed': Key(),
    'datasets': Key(required=True),
    'network_g': Key(required=True),
    'network_d': Key(roles=(TRAIN,), models=GAN_MODELS, required=True),
    'path': Key(default={}),
    'train': Key(roles=(TRAIN,), required=True),
    'val': Key(roles=(TRAIN,)),
    'logger': Key(roles=(TRAIN,), required=True),
    'dist_params': Key(),
    'find_unused_parameters': Key(roles=(TRAIN,), models=_NOT_LDT),   # DDP; LDT synchronises itself
    'ldt': Key(roles=(TRAIN,), models=LDT_BLOCK_MODELS),
    'checkpoints': Key(roles=(TEST,)),
    'test': Key(roles=(TEST,)),
    **_keys(('dist', 'rank', 'world_size', 'auto_resume', 'is_train', 'root_path'), set_by=_ENTRY),
}
TRAIN_KEYS: Dict[str, Key] = {
    'total_iter': Key(required=True),
    'optim_g': Key(required=True),
    'scheduler': Key(required=True),
    'warmup_iter': Key(),
    'ema_decay': Key(),                                   # LDTSRModel refuses it with its own line
    'pixel_opt': Key(),
    'perceptual_opt': Key(models=_NOT_LDT),
    **_keys(('optim_d', 'gan_opt', 'ldl_opt', 'net_d_iters', 'net_d_init_iters'), models=GAN_MODELS),
    **_keys(('amp', 'max_bad_steps', 'compile', 'compile_backend', 'ema_reference_iters', 'l2_sp_weight'),
            models=PROJECT_MODELS),
    'cuda_graph': Key(models=('FTSRModel', 'LDTSRModel')),   # LDTSRModel: the dual step; refused otherwise
}
#: ``val:``: BasicSR's keys, then this project's inference keys (basicsr_ldt.inference.settings)
#: and best-checkpoint keys (basicsr_ldt.models.best).
INFERENCE_KEYS = ('tile_mode', 'tile_size', 'tile_overlap', 'precision')
BEST_KEYS = ('save_best', 'best_metric', 'best_dataset', 'best_network')
VAL_KEYS: Dict[str, Key] = {
    'val_freq': Key(required=True),
    'save_img': Key(default=False),   # train.py reads opt['val']['save_img']; 'suffix' only BasicSR's test.py
    'pbar': Key(),
    'metrics': Key(),
    **_keys(INFERENCE_KEYS + BEST_KEYS, models=PROJECT_MODELS),
}
#: ``test:`` of test.py (basicsr_ldt.pipelines.evaluate; ``compare`` is checked by inference.compare).
TEST_KEYS: Dict[str, Key] = _keys(INFERENCE_KEYS + ('save_img', 'crop_border', 'test_y_channel', 'compare'))
PATH_KEYS: Dict[str, Key] = {
    **_keys(('pretrain_network_g', 'param_key_g', 'strict_load_g')),
    'resume_state': Key(roles=(TRAIN,)),
    **_keys(('pretrain_network_d', 'param_key_d', 'strict_load_d'), roles=(TRAIN,), models=GAN_MODELS),
    **_keys(('experiments_root', 'models', 'training_states', 'log', 'visualization', 'results_root'),
            set_by=f'{_ENTRY} under experiments/<name> or results/<name>'),
}
LOGGER_KEYS: Dict[str, Key] = {
    'print_freq': Key(required=True),
    'save_checkpoint_freq': Key(required=True),
    'use_tb_logger': Key(default=False),      # MessageLogger reads it as opt['logger']['use_tb_logger']
    'wandb': Key(),
}
WANDB_KEYS: Dict[str, Key] = _keys(('project', 'resume_id'))
#: Passed to BasicSR's ``init_dist`` with ``--launcher slurm`` only.
DIST_PARAMS_KEYS: Dict[str, Key] = _keys(('backend', 'port'))

#: Sections of fixed keys, by dotted path.
SECTIONS: Dict[str, Dict[str, Key]] = {
    '': TOP_LEVEL, 'train': TRAIN_KEYS, 'val': VAL_KEYS, 'test': TEST_KEYS, 'path': PATH_KEYS,
    'logger': LOGGER_KEYS, 'logger.wandb': WANDB_KEYS, 'dist_params': DIST_PARAMS_KEYS,
}

#: Keys of every ``datasets.<section>``: BasicSR's (``build_dataloader``, ``train.py``) by phase.
#: ``phase`` comes from the section's name; ``scale`` from the top-level ``scale`` when given.
DATASET_COMMON = ('name', 'type', 'scale')
DATASET_SET_BY = ('phase',)
DATASET_LOADER = {
    'train': ('batch_size_per_gpu', 'num_worker_per_gpu', 'dataset_enlarge_ratio', 'prefetch_mode',
              'num_prefetch_queue', 'pin_memory', 'persistent_workers'),
    'val': ('pin_memory', 'persistent_workers'),   # validation loaders: batch 1, no workers
    'test': (),                                     # test.py reads the dataset itself
}
DATASET_REQUIRED = {'train': ('batch_size_per_gpu', 'num_worker_per_gpu')}
#: Keys each dataset type reads, for every phase (``any``) and for training only (``train``).
DATASET_TYPES: Dict[str, Dict[str, Tuple[str, ...]]] = {
    'DRealSRCameraDataset': {
        'any': ('dataroot_gt', 'dataroot_lq', 'io_backend', 'cameras', 'camera_rule', 'filename_tmpl_gt',
                'filename_tmpl_lq', 'subset'),
        'train': ('gt_size', 'use_hflip', 'use_rot', 'seed'),
    },
}


def dataset_keys(dataset_type: str) -> Tuple[str, ...]:
    """Every key a section of ``dataset_type`` may hold in any phase (the dataset's own check)."""
    own = DATASET_TYPES[dataset_type]
    loader = tuple(k for keys in DATASET_LOADER.values() for k in keys)
    return tuple(dict.fromkeys(DATASET_COMMON + DATASET_SET_BY + loader + own['any'] + own['train']))


def section_keys(dotted: str) -> Optional[Tuple[str, ...]]:
    """Keys a section may hold for some entry point and model type; None for sections whose keys
    are checked otherwise (constructor arguments, datasets, the ``ldt:`` block by its owners)."""
    if dotted in ('train.optim_g', 'train.optim_d'):
        import torch
        return ('type',) + tuple(_signature_keys(torch.optim.Adam, ('params',))[0])
    section = SECTIONS.get(dotted)
    return None if section is None else tuple(k for k, spec in section.items() if spec.set_by is None)


# ---------------------------------------------------------------------------------------- checking
@dataclass
class Default:
    """A key the file leaves out that gets its obvious default (applied and logged by the caller)."""
    section: Dict
    key: str
    value: Any
    path: str

    def describe(self) -> str:
        """``path: value`` as YAML writes the value."""
        shown = {True: 'true', False: 'false', None: 'null'}[self.value] \
            if isinstance(self.value, (bool, type(None))) else self.value
        return f'{self.path}: {shown}'


def _join(prefix: str, key: Any) -> str:
    return f'{prefix}.{key}' if prefix else str(key)


def _elsewhere(key: str, here: str) -> str:
    """' (a key of datasets.train)': where a key that is unknown here belongs instead."""
    places = [path for path, section in SECTIONS.items() if path != here and key in section
              and section[key].set_by is None]
    loader = [f"datasets.{'train' if phase == 'train' else phase + '_*'}" for phase, keys in DATASET_LOADER.items()
              if key in keys]
    places += loader[:1]
    return f' (a key of {places[0] or "the top level"})' if places else ''


class _Checker:
    """Walks one option mapping; every problem is an :class:`InputError` of one line."""

    def __init__(self, opt: Mapping, role: str, where: str, required: bool) -> None:
        self.opt, self.role, self.where, self.required = opt, role, where, required
        self.defaults: List[Default] = []
        #: Required keys not required of this file (network_g of a test file with only Bicubic entries).
        self.exempt = set() if role == TRAIN or needs_network(opt) else {'network_g'}
        model_type = opt.get('model_type') if role == TRAIN else None
        self.model_type = model_type if isinstance(model_type, str) else None

    def fail(self, message: str) -> None:
        raise InputError(f'{self.where}: {message}')

    def mapping(self, value: Any, path: str) -> Dict:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(f'{path}: expected a mapping of options, got {value!r}')
        return value

    def section(self, given: Mapping, path: str, spec: Dict[str, Key]) -> None:
        """Unknown keys, keys of another entry point or model type, required keys, defaults."""
        for key in given:
            self.key(key, path, spec, given[key] is None)
        for key, entry in spec.items():
            if self.role not in entry.roles or (self.model_type and self.model_type not in entry.models):
                continue
            if given.get(key) is not None or (key in given and entry.default is None):
                continue
            if entry.default is not _NO_DEFAULT:
                self.defaults.append(Default(given, key, entry.default, _join(path, key)))
            elif entry.required and self.required and _join(path, key) not in self.exempt:
                got = 'null' if key in given else 'missing'
                self.fail(f"{_join(path, key)}: required, {got}{self.requirement(path, key)}")

    def requirement(self, path: str, key: str) -> str:
        why = {'datasets': f" ({ROLE_NAMES[self.role]} needs a 'datasets' mapping"
                           + (" with a 'train' section)" if self.role == TRAIN else ' of test sets)'),
               'network_g': ' (the network: its type and constructor arguments)',
               'model_type': ' (FTSRModel, LDTSRModel, CorGradSRModel, or BasicSR\'s SRModel)'}
        return why.get(key, '') if not path else ''

    def key(self, key: Any, path: str, spec: Dict[str, Key], null: bool = False) -> None:
        """One given key; a null value (BasicSR's "not given") is only checked for being a known key."""
        dotted = _join(path, key)
        entry = spec.get(key) if isinstance(key, str) else None
        if entry is None:
            valid = [k for k, e in spec.items() if e.set_by is None and self.role in e.roles
                     and (not self.model_type or self.model_type in e.models)]
            hint = closest_key_hint(str(key), valid) or _elsewhere(str(key), path) or _MISPLACED.get(dotted, '')
            self.fail(f"unknown key '{dotted}'{hint}; {path or 'the top level'} takes: {', '.join(sorted(valid))}")
        if entry.set_by is not None:
            self.fail(f"{dotted}: set by {entry.set_by}, not by the option file; remove it")
        if null:
            return
        if self.role not in entry.roles:
            other = (set(entry.roles) - {self.role}).pop()
            self.fail(f'{dotted}: read by {ROLE_NAMES[other]} only, not by {ROLE_NAMES[self.role]}; '
                      f'remove it{_ROLE_HINT.get(self.role, "")}')
        if self.model_type and self.model_type not in entry.models:
            self.wrong_model(dotted, entry.models)

    def wrong_model(self, dotted: str, readers: Sequence[str]) -> None:
        what = 'the ldt: block' if dotted == 'ldt' else dotted
        suggest = _suggested_model(dotted, readers, self.opt)
        ours = 'of this project ' if set(readers) <= set(PROJECT_MODELS) else ''
        self.fail(f"{what} needs a model type {ours}that reads it ({', '.join(readers)}); model_type "
                  f"{self.model_type} ignores it: set model_type: {suggest}, or remove it")


#: What a misplaced block means, where the closest-key hint has nothing to offer.
_MISPLACED = {'corgrad': " (CorGrad's options go in the ldt: block with method: corgrad, model_type: "
                         "CorGradSRModel or LDTSRModel)"}
_ROLE_HINT = {TEST: ' (test.py evaluates the weights that checkpoints or path.pretrain_network_g name, with '
                    'test: options)',
              TRAIN: ' (a test file for test.py holds it)'}


def _suggested_model(dotted: str, readers: Sequence[str], opt: Mapping) -> str:
    """The model type to set for a key that the file's model type does not read."""
    if dotted == 'ldt':
        method = (opt.get('ldt') or {}).get('method') if isinstance(opt.get('ldt'), Mapping) else None
        return 'CorGradSRModel' if method == 'corgrad' else 'LDTSRModel'
    for model in ('FTSRModel',) + tuple(readers):
        if model in readers:
            return model
    return readers[0]


def _check_ldt_method(checker: _Checker) -> None:
    """CorGradSRModel trains CorGrad whatever ``ldt.method`` says: a block naming an LDT method is refused."""
    block = checker.opt.get('ldt')
    method = block.get('method') if isinstance(block, Mapping) else None
    if checker.model_type == 'CorGradSRModel' and method not in (None, 'corgrad'):
        checker.fail(f"ldt.method '{method}' is not CorGrad, and model_type CorGradSRModel trains CorGrad whatever "
                     "the block says: set model_type: LDTSRModel (or ldt.method: corgrad)")


def _signature_keys(target: Callable, skip: Sequence[str]) -> Optional[Tuple[List[str], List[str]]]:
    """(accepted, required) keyword names of ``target``; None when it only takes ``**kwargs``
    (nothing to check against)."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return None
    named = [n for n, p in params.items() if n not in skip
             and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    if not named and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return named, [n for n in named if params[n].default is inspect.Parameter.empty]


def check_arguments(path: str, given: Mapping, target: Callable, what: str, skip: Sequence[str] = (),
                    extra: Sequence[str] = (), required: bool = True, where: Optional[str] = None) -> None:
    """Keys of a section that is passed to ``target(**section)`` (minus ``type``): each must be one
    of its named parameters (a ``**kwargs`` catch-all is not counted: MambaIR's, HAT's and SwinIR's
    swallow unknown keys), and every parameter without a default must be given. ``what`` names
    the target in messages (``network_g type MambaIR``)."""
    keys = _signature_keys(target, skip)
    if keys is None:
        return
    accepted, needed = keys
    valid = ['type'] + accepted + list(extra)
    prefix = f'{where}: ' if where else ''
    for key in given:
        if key not in valid:
            hint = closest_key_hint(str(key), valid)
            raise InputError(f"{prefix}unknown key '{_join(path, key)}'{hint}; {what} takes: {', '.join(valid)}")
    missing = [k for k in needed if k not in given]
    if missing and required:
        raise InputError(f"{prefix}{_join(path, missing[0])}: required by {what}, missing")


def _registered(registry: Any, name: Any, path: str, where: str) -> Any:
    if not isinstance(name, str) or name not in registry:
        known = ', '.join(sorted(k for k, _ in registry))
        shown = 'missing' if name is None else f"'{name}' is not registered"
        hint = closest_key_hint(str(name), [k for k, _ in registry]) if name is not None else ''
        raise InputError(f'{where}: {path}.type: {shown}{hint} (known: {known})')
    return registry.get(name)


def check_network(section: Any, path: str = 'network_g', where: str = 'options', required: bool = True) -> None:
    """``network_g`` (or ``network_d``): a registered architecture and its constructor's arguments."""
    from basicsr.utils.registry import ARCH_REGISTRY
    if not isinstance(section, Mapping):
        raise InputError(f'{where}: {path}: expected a mapping with the network type and its arguments, '
                         f'got {section!r}')
    arch = _registered(ARCH_REGISTRY, section.get('type'), path, where)
    check_arguments(path, section, arch, f"{path} type {section['type']}", required=required, where=where)


def _check_train_calls(checker: _Checker, train: Mapping) -> None:
    """``train.optim_g``/``optim_d`` (torch's Adam: BasicSR 1.4.2 builds no other), ``train.scheduler``
    (the two BasicSR schedulers its models build) and the losses, by their constructors."""
    import torch
    from basicsr.models import lr_scheduler
    from basicsr.utils.registry import LOSS_REGISTRY
    for name in ('optim_g', 'optim_d'):
        if name not in train:
            continue
        optim = checker.mapping(train[name], f'train.{name}')
        kind = optim.get('type', 'Adam')
        if kind != 'Adam':
            checker.fail(f"train.{name}.type: expected 'Adam' (the optimizer BasicSR 1.4.2 builds), got {kind!r}")
        check_arguments(f'train.{name}', optim, torch.optim.Adam, 'Adam', skip=('params',), where=checker.where)
        if 'lr' not in optim and checker.required:
            checker.fail(f'train.{name}.lr: required, missing (BasicSR passes it to Adam by position)')
    if 'scheduler' in train:
        sched = checker.mapping(train['scheduler'], 'train.scheduler')
        classes = {**{name: lr_scheduler.MultiStepRestartLR for name in MULTI_STEP},
                   'CosineAnnealingRestartLR': lr_scheduler.CosineAnnealingRestartLR}
        kind = sched.get('type')
        if kind not in classes:
            checker.fail(f"train.scheduler.type: expected one of {', '.join(classes)} (what BasicSR 1.4.2 builds), "
                         f'got {kind!r}{closest_key_hint(str(kind), classes)}')
        check_arguments('train.scheduler', sched, classes[kind], kind, skip=('optimizer',), where=checker.where,
                        required=checker.required)
    for name in ('pixel_opt', 'perceptual_opt', 'gan_opt', 'ldl_opt'):
        if train.get(name) is not None:
            loss = checker.mapping(train[name], f'train.{name}')
            cls = _registered(LOSS_REGISTRY, loss.get('type'), f'train.{name}', checker.where)
            check_arguments(f'train.{name}', loss, cls, loss['type'], where=checker.where, required=checker.required)
    model = checker.model_type
    if checker.required and model in PROJECT_MODELS + BASICSR_SR_MODELS and model != 'LDTSRModel' \
            and train.get('pixel_opt') is None and train.get('perceptual_opt') is None:
        checker.fail(f'train.pixel_opt: required, missing ({model} needs a loss: pixel_opt, perceptual_opt or both)')


def _check_metrics(checker: _Checker, metrics: Mapping) -> None:
    """Each ``val.metrics.<name>`` is ``calculate_metric``'s call of a registered metric function:
    its keyword arguments besides the two images, plus ``better`` (higher | lower)."""
    from basicsr.utils.registry import METRIC_REGISTRY
    for name, metric in metrics.items():
        path = f'val.metrics.{name}'
        metric = checker.mapping(metric, path)
        func = _registered(METRIC_REGISTRY, metric.get('type'), path, checker.where)
        check_arguments(path, metric, func, metric['type'], skip=('img', 'img2'), extra=('better',),
                        where=checker.where, required=checker.required)


def _check_datasets(checker: _Checker, datasets: Mapping) -> None:
    """Section names (their phase), registered types, and each section's keys for its phase."""
    from basicsr.utils.registry import DATASET_REGISTRY
    phases = ('train', 'val') if checker.role == TRAIN else ('test', 'val')
    for name, section in datasets.items():
        path = f'datasets.{name}'
        phase = str(name).split('_')[0]
        if phase not in phases:
            accepted = "'train' and 'val*'" if checker.role == TRAIN else "'test*' and 'val*'"
            checker.fail(f"{path}: {ROLE_NAMES[checker.role]} accepts {accepted} sections (the phase is the "
                         "name up to its first '_')")
        section = checker.mapping(section, path)
        kind = section.get('type')
        _registered(DATASET_REGISTRY, kind, path, checker.where)
        if kind not in DATASET_TYPES:
            checker.fail(f"{path}.type: '{kind}' is registered, but its keys are not listed in "
                         f"basicsr_ldt/common/schema.py (DATASET_TYPES: {', '.join(DATASET_TYPES)}); add them there to "
                         'use it')
        loader = DATASET_LOADER[phase if checker.role == TRAIN else 'test']
        own = DATASET_TYPES[kind]['any'] + (DATASET_TYPES[kind]['train'] if phase == 'train' else ())
        valid = DATASET_COMMON + loader + own
        for key in section:
            if key in DATASET_SET_BY:
                checker.fail(f"{path}.{key}: set by {_ENTRY}, not by the option file; remove it")
            if key not in valid:
                hint = closest_key_hint(str(key), valid)
                if not hint and key in dataset_keys(kind):
                    hint = f' (read for {"training" if phase != "train" else "validation"} sections only)'
                checker.fail(f"unknown key '{path}.{key}'{hint}; a {phase} section of {kind} takes: "
                             f"{', '.join(valid)}")
        scale = checker.opt.get('scale')
        if 'scale' in section and scale is not None and section['scale'] != scale:
            checker.fail(f'{path}.scale: {section["scale"]!r}, but BasicSR replaces it with the top-level scale '
                         f'{scale!r}; remove it')
        if 'name' not in section:
            checker.defaults.append(Default(section, 'name', str(name), f'{path}.name'))
        for key in DATASET_REQUIRED.get(phase, ()) if checker.role == TRAIN and checker.required else ():
            if key not in section:
                checker.fail(f'{path}.{key}: required, missing')
    if checker.role == TRAIN and checker.required and 'train' not in datasets:
        checker.fail("datasets.train: required, missing (training reads its images from a 'datasets: train' "
                     'section)')


#: The largest ``manual_seed`` (a study's seeds too): BasicSR seeds numpy with it plus the rank.
MAX_SEED = 2 ** 31 - 1


def is_seed(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED


def check_options(opt: Any, role: str, where: str, required: bool = True) -> List[Default]:
    """Check a parsed option file for ``role`` (``train`` or ``test``) before anything is built.

    Raises :class:`InputError` (one line starting with ``where``) at the first unknown key, key of
    the other entry point or of another model type, missing required key, or wrong section name;
    returns the defaults for the keys the file leaves out (see :func:`apply_defaults`). With
    ``required`` False only what is present is checked (a study's partial options).
    """
    if not isinstance(opt, Mapping):
        raise InputError(f'{where}: expected a mapping of options, got {type(opt).__name__}')
    checker = _Checker(opt, role, where, required)
    model = opt.get('model_type')
    if role == TRAIN and model is not None:
        from basicsr.utils.registry import MODEL_REGISTRY
        if not isinstance(model, str) or model not in MODEL_REGISTRY:
            checker.fail(f"model_type '{model}' is not registered{closest_key_hint(str(model), MODEL_TYPES)} "
                         f"(known: {', '.join(sorted(k for k, _ in MODEL_REGISTRY))})")
        if model not in MODEL_TYPES:
            checker.fail(f"model_type '{model}' is registered, but the training pipeline of this project runs image "
                         f"SR models only: {', '.join(MODEL_TYPES)}")
    checker.section(opt, '', TOP_LEVEL)
    name = opt.get('name', '')
    if not isinstance(name, str) or name == '':
        checker.fail(f"name: expected the experiment's name (a string), got {name!r}")
    if os.path.isabs(name) or {'..', ''} & set(name.replace('\\', '/').split('/')):   # BasicSR allows 'group/run'
        checker.fail(f"name: expected a folder name under experiments/ and results/ ('group/run' allowed), not "
                     f"absolute and without '..' or empty parts, got {name!r}")
    seed = opt.get('manual_seed')
    if seed is not None and not is_seed(seed):
        checker.fail(f'manual_seed: expected an integer in [0, {MAX_SEED}] (numpy seeds each rank with it plus the '
                     f'rank, below 2**32), got {seed!r}')
    num_gpu = opt.get('num_gpu', 'auto')
    if num_gpu != 'auto' and (isinstance(num_gpu, bool) or not isinstance(num_gpu, int) or num_gpu < 0):
        checker.fail(f"num_gpu: expected 'auto' or an integer >= 0, got {num_gpu!r}")
    for path in ('train', 'val', 'test', 'path', 'logger', 'dist_params'):
        if opt.get(path) is not None and role in TOP_LEVEL[path].roles:   # null: not given, as BasicSR reads it
            checker.section(checker.mapping(opt[path], path), path, SECTIONS[path])
    logger = checker.mapping(opt.get('logger'), 'logger') if role == TRAIN else {}
    if logger.get('wandb') is not None:
        wandb = checker.mapping(logger['wandb'], 'logger.wandb')
        checker.section(wandb, 'logger.wandb', WANDB_KEYS)
        if wandb.get('project') is not None and logger.get('use_tb_logger') is not True:
            checker.fail('logger.wandb.project: needs logger.use_tb_logger: true (BasicSR syncs wandb from tensorboard)')
    if role == TRAIN:
        train = checker.mapping(opt.get('train'), 'train')
        _check_train_calls(checker, train)
        metrics = checker.mapping(checker.mapping(opt.get('val'), 'val').get('metrics'), 'val.metrics')
        _check_metrics(checker, metrics)
        _check_ldt_method(checker)
    datasets = checker.mapping(opt.get('datasets'), 'datasets')
    _check_datasets(checker, datasets)
    for net in ('network_g', 'network_d'):
        if opt.get(net) is not None:
            check_network(opt[net], net, where, required)
    network, scale = opt.get('network_g'), opt.get('scale')
    factor = next((k for k in SCALE_KEYS if k in network), None) if isinstance(network, Mapping) else None
    if factor is not None and scale is not None and network[factor] != scale:   # BasicSR reads both, never together
        checker.fail(f'network_g.{factor}: {network[factor]!r}, but scale is {scale!r}; the data, crops and metrics '
                     'follow scale, the network upscales by its own factor: make them equal')
    return checker.defaults


def needs_network(opt: Mapping) -> bool:
    """test.py builds no network when every ``checkpoints`` entry is the Bicubic baseline."""
    entries = opt.get('checkpoints')
    return not (isinstance(entries, list) and entries
                and all(isinstance(e, Mapping) and e.get('bicubic') is True for e in entries))


def apply_defaults(defaults: List[Default]) -> Optional[str]:
    """Fill in the defaults :func:`check_options` returned; the log line that lists them (None: none)."""
    for default in defaults:
        default.section[default.key] = default.value if not isinstance(default.value, dict) else {}
    if not defaults:
        return None
    return 'Defaults for keys the option file leaves out: ' + ', '.join(d.describe() for d in defaults)


def describe_file(path: str) -> str:
    """How messages name an option file: as the user gave it."""
    return f"option file '{os.path.normpath(path)}'"
