"""The option values a project model checks as it is built, checked before the run makes anything.

Why: the schema (``basicsr_ldt.common.schema``) knows every key, and the models own their values
(``train.compile``, ``train.cuda_graph``, ``train.amp``, ``train.optim_g.fused``, ``val:``, the
``ldt:`` block, ...). A model is built after the experiment folder, the log and BasicSR's banner, so
a slip there used to print a screen of log lines before its one error. The same functions the
models call run here first, with the device and process layout BasicSR will pick; what depends on
the model (``cuda_graph: true`` for a mode without a recorded step) is still checked when it is built.
The values of the training keys BasicSR itself reads (optimizer, scheduler, logger, loader,
metrics) are checked here too, for every model type: BasicSR reads them without a check.
"""
import importlib.util
import math
from typing import Any, Dict, Optional

import torch
from torch.utils.data import Dataset

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.schema import MULTI_STEP, PROJECT_MODELS
from basicsr_ldt.ldt.typed import boolean, check_options, choice, integer, items, number, optional, whole
from basicsr_ldt.models.best import refuse_missing_branch
from basicsr_ldt.models.compiled_blocks import compile_setting, refuse_uncompilable
from basicsr_ldt.models.corgrad_model import (corgrad_config_from_options, refuse_unread_alpha, source_cameras,
                                              trains_corgrad)
from basicsr_ldt.models.cuda_graph import graph_mode, refuse_true, unrecordable_run
from basicsr_ldt.models.ema_decay import scaled_ema_decay
from basicsr_ldt.models.guarded_step import max_bad_steps_from_options, precision_from_options
from basicsr_ldt.models.l2_sp import l2_sp_setting
from basicsr_ldt.models.ldt_model import ldt_config_from_options, refuse_basicsr_ema
from basicsr_ldt.models.optimizers import fused_choice
from basicsr_ldt.models.validation import basicsr_device_type, validation_settings


#: Values of training keys BasicSR reads (``train.py``, ``base_model.py``, ``lr_scheduler.py``, its data
#: loader): a YAML number without a dot (``lr: 2e-4``, ``milestones: [1e5]``) is a string there, and a
#: string milestone never matches an iteration, so the learning rate silently never decays.
BASICSR_TRAINING_VALUES = {
    'train.total_iter': whole(1), 'train.warmup_iter': whole(-1),
    'train.optim_g.lr': number(0, math.inf), 'train.optim_g.weight_decay': number(0, math.inf, '[)'),
    'train.optim_g.betas': items(number(0, 1, '[)'), length=2), 'train.optim_g.eps': number(0, math.inf),
    'train.scheduler.milestones': items(whole(1)),
    'train.scheduler.gamma': number(0, 1, '(]'),     # above 1 the rate grows at each milestone
    'train.pixel_opt.loss_weight': number(0, math.inf), 'train.pixel_opt.reduction': choice('mean', 'sum'),
    'train.scheduler.periods': items(whole(1)), 'train.scheduler.restarts': items(whole(1)),
    'train.scheduler.restart_weights': items(number(0, math.inf)),   # 0: the rate is 0 from the restart on
    'train.scheduler.eta_min': number(0, math.inf, '[)'),
    'logger.print_freq': whole(1), 'logger.save_checkpoint_freq': whole(1), 'logger.use_tb_logger': boolean(),
    'path.strict_load_g': boolean(),   # 'false' as text was read as true
}
#: ``datasets.train``'s loader keys (BasicSR's ``build_dataloader`` and prefetchers).
BASICSR_LOADER_VALUES = {
    'batch_size_per_gpu': integer(1), 'num_worker_per_gpu': integer(0), 'dataset_enlarge_ratio': integer(1),
    'prefetch_mode': optional(choice('cpu', 'cuda')), 'num_prefetch_queue': integer(1), 'pin_memory': boolean(),
    'persistent_workers': boolean(),
}
#: Each ``val.metrics.<name>``'s arguments besides ``type`` (BasicSR's ``calculate_psnr``/``calculate_ssim``).
BASICSR_METRIC_VALUES = {'crop_border': integer(0), 'test_y_channel': boolean(), 'input_order': choice('HWC', 'CHW'),
                         'better': choice('higher', 'lower')}

#: Which way BasicSR's metrics improve; ``better`` the other way would select the worst checkpoint.
METRIC_DIRECTION = {'calculate_psnr': 'higher', 'calculate_ssim': 'higher', 'calculate_psnr_pt': 'higher',
                    'calculate_ssim_pt': 'higher', 'calculate_niqe': 'lower'}


def check_basicsr_values(opt: Dict[str, Any], device_type: str) -> None:
    """The values of the training keys BasicSR reads, for every model type: one line naming the key
    instead of a traceback (or a silently constant learning rate) once the run has started."""
    check_options('', opt, BASICSR_TRAINING_VALUES, InputError)
    check_schedule(opt.get('train') or {})
    datasets = opt.get('datasets') or {}
    train_data = datasets.get('train') or {}
    check_options('datasets.train', train_data, BASICSR_LOADER_VALUES, InputError)
    if 'num_prefetch_queue' in train_data and train_data.get('prefetch_mode') != 'cpu':
        raise InputError(f"datasets.train.num_prefetch_queue: read only with prefetch_mode: cpu, and prefetch_mode "
                         f"is {train_data.get('prefetch_mode')!r}, so it changes nothing; remove it, or set "
                         'prefetch_mode: cpu')
    if train_data.get('prefetch_mode') == 'cuda' and device_type != 'cuda':
        raise InputError(f"datasets.train.prefetch_mode: cuda copies batches to a GPU, and this run is on "
                         f"{device_type}; use cpu (or leave it out)")
    val = opt.get('val')
    if isinstance(val, dict) and val and not val.get('metrics') and not val.get('save_img'):
        raise InputError("val.metrics: validation measures nothing without metrics and keeps nothing without "
                         "save_img: true; expected metrics (e.g. psnr: {type: calculate_psnr, crop_border: 4, "
                         "test_y_channel: true}), save_img: true, or no val section")
    if isinstance(val, dict) and val and 'train' in datasets and not any(str(k).startswith('val') for k in datasets):
        raise InputError("val: the option file has no 'datasets: val_*' section, so validation would never run and "
                         'val.metrics measure nothing; add a validation dataset, or remove val (val: ~)')
    for name, metric in ((val or {}).get('metrics') or {}).items():
        check_options(f'val.metrics.{name}', metric or {}, BASICSR_METRIC_VALUES, InputError)
        direction = METRIC_DIRECTION.get((metric or {}).get('type'))
        said = (metric or {}).get('better', 'higher')    # BasicSR's default when absent, as best.py reads it
        if direction is not None and said != direction:
            given = f'the file says {said}' if 'better' in metric else f"better is absent (BasicSR's default: {said})"
            raise InputError(f"val.metrics.{name}.better: {metric['type']} is better {direction}, and {given}: the "
                             f'best value logged and net_g_best.pth would be the worst; expected {direction}'
                             + (' (or leave better out)' if direction == 'higher' else ''))
    names: Dict[str, str] = {}
    for section, dataset in datasets.items():   # validation results, best checkpoints and logs go by name
        name = (dataset or {}).get('name', section)
        if not str(section).startswith('val'):
            continue
        if name in names:
            raise InputError(f"datasets.{section}.name '{name}' is also the name of datasets.{names[name]}; each "
                             'validation set needs its own name (its results are kept under it)')
        names[name] = section
    wandb = (opt.get('logger') or {}).get('wandb') or {}
    if wandb.get('project') is not None and importlib.util.find_spec('wandb') is None:
        raise InputError('logger.wandb.project: wandb is not installed (pip install wandb), or remove the project')


def check_schedule(train: Dict[str, Any]) -> None:
    """The learning-rate schedule against the run's length: a milestone, a cosine period or a warm-up
    the run never reaches leaves the rate where the file says it changes (a study's shorter override
    of ``total_iter`` kept the base file's milestones, and the rate never halved)."""
    total = train.get('total_iter')
    scheduler = train.get('scheduler') or {}
    if total is None:
        return
    for key in ('milestones', 'restarts'):
        beyond = [m for m in scheduler.get(key) or [] if m > total]
        if beyond:
            raise InputError(f'train.scheduler.{key}: {beyond[0]:g} lies beyond train.total_iter ({total:g}), so the '
                             f'rate never changes there; expected {key} <= total_iter'
                             + (f' (for a constant rate: milestones: [{total:g}])' if key == 'milestones' else ''))
    periods = scheduler.get('periods')
    if periods is not None and sum(periods) != total:
        raise InputError(f'train.scheduler.periods: sum to {sum(periods):g}, and train.total_iter is {total:g}; '
                         'expected the periods to cover the run exactly (shorter: BasicSR fails once they end; '
                         'longer: the rate never reaches eta_min)')
    weights = scheduler.get('restart_weights') or [1]   # BasicSR's default (1,); both schedulers assert one each
    for key in ('periods', 'restarts'):
        entries = scheduler.get(key)
        if entries is not None and len(weights) != len(entries):
            raise InputError(f'train.scheduler.restart_weights: {len(weights)} weights for {len(entries)} {key}; '
                             f'expected one per {key[:-1]}')
    lr, eta_min = (train.get('optim_g') or {}).get('lr'), scheduler.get('eta_min')
    if isinstance(lr, (int, float)) and isinstance(eta_min, (int, float)) and eta_min > lr:
        raise InputError(f'train.scheduler.eta_min: {eta_min:g} is above train.optim_g.lr ({lr:g}), so the cosine '
                         'would raise the rate; expected eta_min <= lr (0: decay to 0)')
    warmup = train.get('warmup_iter', -1)
    if warmup >= total:
        raise InputError(f'train.warmup_iter: {warmup:g} is not below train.total_iter ({total:g}), so the rate never '
                         'reaches optim_g.lr; expected fewer warm-up iterations (or -1: none)')
    # BasicSR's scheduler applies milestone m from iteration m + 1; the warm-up sets the rate itself at
    # iterations 1 .. warmup_iter - 1, so a decay that falls there is overwritten and never happens.
    lost = [m for m in scheduler.get('milestones') or [] if m + 1 < warmup]
    if lost:
        raise InputError(f'train.scheduler.milestones: {lost[0]:g} takes effect at iteration {lost[0] + 1:g}, inside '
                         f'the warm-up (train.warmup_iter {warmup:g} sets the rate at iterations 1-{warmup - 1:g}), '
                         f'which overwrites it: the rate would never decay there; expected milestones >= '
                         f'{warmup - 1:g}')


def warm_up_rate_warning(opt: Dict[str, Any]) -> Optional[str]:
    """The log's warning for a warm-up before a multi-step schedule: BasicSR ramps the rate at iterations 1 ..
    W - 1 and ``MultiStepRestartLR`` keeps the rate it finds, so it stays at (W - 1) / W of ``optim_g.lr`` (upstream's
    behaviour, kept so runs compare with upstream's; the cosine schedule recomputes its rate from ``lr``)."""
    train = opt.get('train') or {}
    warmup, lr = train.get('warmup_iter', -1), (train.get('optim_g') or {}).get('lr')
    kind = (train.get('scheduler') or {}).get('type')
    if not (isinstance(warmup, int) and warmup >= 2 and isinstance(lr, (int, float)) and kind in MULTI_STEP):
        return None
    return (f'train.warmup_iter {warmup} with {kind}: after the warm-up the rate stays at {warmup - 1}/{warmup} of '
            f'train.optim_g.lr ({lr * (warmup - 1) / warmup:g} instead of {lr:g}; milestones scale that), as in '
            'BasicSR; CosineAnnealingRestartLR reaches lr')


def gpus_used(opt: Dict[str, Any]) -> int:
    """``num_gpu`` as BasicSR reads it on this machine (``auto``: the GPUs torch sees)."""
    num_gpu = opt.get('num_gpu', 0)
    return torch.cuda.device_count() if num_gpu == 'auto' else num_gpu


def check_option_values(opt: Dict[str, Any], train_set: Optional[Dataset] = None) -> None:
    """Raise the model's one-line :class:`InputError` for a bad value of a key it reads without a network,
    on the device BasicSR picks from ``num_gpu`` on this machine (``auto``: the GPUs torch sees), and,
    given the training set, what the model checks of its data (CorGrad's source cameras)."""
    num_gpu = gpus_used(opt)
    device_type = basicsr_device_type(num_gpu)
    check_basicsr_values(opt, device_type)
    model_type = opt.get('model_type')
    if model_type not in PROJECT_MODELS:   # BasicSR's own models read none of these keys
        return
    train = opt.get('train') or {}
    validation_settings({**opt, 'num_gpu': num_gpu})
    refuse_uncompilable(compile_setting(train), (opt.get('network_g') or {}).get('type'))
    fused_choice(train.get('optim_g') or {})
    precision = precision_from_options(train, device_type)
    single_process = not opt.get('dist') and num_gpu <= 1   # BasicSR wraps the network otherwise
    refuse_true(graph_mode(train), unrecordable_run(device_type, precision.dtype, single_process))
    max_bad_steps_from_options(train)
    trained_networks = 1
    if trains_corgrad(opt):
        config, _ = corgrad_config_from_options(opt)
        scaled_ema_decay(train)
        if train_set is not None:
            refuse_unread_alpha(config, source_cameras(opt, train_set))
    elif model_type == 'LDTSRModel':
        refuse_basicsr_ema(train)
        mode = ldt_config_from_options(opt).mode
        refuse_missing_branch(opt, mode)
        trained_networks = 2 if mode == 'dual' else 1
    else:
        scaled_ema_decay(train)
    l2_sp_setting(opt, trained_networks)
