"""The training entry point: BasicSR's pipeline, with resuming that works on CPU and repeats itself.

Differences from ``basicsr.train.train_pipeline`` (same options, flags and output folders):
- training states are loaded on the CPU with ``weights_only=True`` (BasicSR maps them to CUDA);
- ``--auto_resume`` looks under ``<root>/experiments/<name>`` instead of the current directory;
- a resumed run continues mid-epoch at the batch where the saved run stopped, with the same crops
  (the sampler passes draw numbers that seed each sample's augmentation) and RNG state, so it
  reproduces an uninterrupted run;
- bad input raises :class:`InputError` before training starts: data and the models' option values
  before any folder is made (``basicsr_ldt.models.option_values``), the rest with the new experiment
  folder removed again (an archived previous run is put back).
"""
import datetime
import logging
import math
import os
import sys
import time
from os import path as osp
from typing import Dict, List, Optional, Tuple

import torch
from torch.utils.data import Dataset

from basicsr.data import build_dataloader
from basicsr.data.prefetch_dataloader import CPUPrefetcher, CUDAPrefetcher
from basicsr.models import build_model
from basicsr.train import init_tb_loggers
from basicsr.utils import AvgTimer, MessageLogger, check_resume, get_env_info, get_root_logger, get_time_str
from basicsr.utils.options import copy_opt_file, dict2str
from basicsr.utils.registry import ARCH_REGISTRY, DATASET_REGISTRY, MODEL_REGISTRY

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.options import registered, validate_dataset_options
from basicsr_ldt.common.outputs import OutputFolder, fail
from basicsr_ldt.common.option_file import parse_options
from basicsr_ldt.common.process_group import end_process_group
from basicsr_ldt.data.sampler import training_sampler
from basicsr_ldt.models.best import BestCheckpointMixin
from basicsr_ldt.models.l2_sp import START_KEY, START_PARAM_KEY
from basicsr_ldt.models.network_check import probe_network
from basicsr_ldt.models.option_values import check_option_values, gpus_used, warm_up_rate_warning
from basicsr_ldt.models.resumable import resume_fixed, training_cameras, unsaved_states_warning
from basicsr_ldt.models.validation import basicsr_device_type, check_validation_crops
from basicsr_ldt.weights.checkpoint import UnreadableCheckpoint, load_safe


def training_states(opt: Dict) -> List[str]:
    """Paths of this experiment's ``<iter>.state`` files, newest first."""
    folder = opt['path']['training_states']
    if not osp.isdir(folder):
        return []
    iters = [int(f[:-len('.state')]) for f in os.listdir(folder) if f.endswith('.state') and f[:-6].isdigit()]
    return [osp.join(folder, f'{it}.state') for it in sorted(iters, reverse=True)]


def newest_readable_state(opt: Dict) -> Tuple[Optional[str], Optional[Dict]]:
    """``--auto_resume``: the newest training state that loads, and the state itself.

    A damaged newer state (truncated or empty after a full disk or a failed copy; our own writes are
    atomic) is moved aside to ``<name>.corrupt`` with one warning line, so that the run goes on from
    the newest state that loads and later resumes do not trip over it again. When none loads,
    nothing is moved and the newest one's error stops the run.
    """
    damaged: List[Tuple[str, UnreadableCheckpoint]] = []
    for path in training_states(opt):
        try:
            state = load_safe(path, 'training state')
        except UnreadableCheckpoint as err:
            damaged.append((path, err))
            continue
        for bad, err in damaged:
            if opt['rank'] == 0:
                os.replace(bad, f'{bad}.corrupt')
                print(f"warning: {err}; moved it to '{bad}.corrupt' and resuming from '{path}'",
                      file=sys.stderr, flush=True)
        return path, state
    if damaged:
        more = f' (nor any of the {len(damaged) - 1} older one(s))' if len(damaged) > 1 else ''
        raise InputError(f'{damaged[0][1]}{more}')
    return None, None


def load_resume_state(opt: Dict) -> Optional[Dict]:
    """The training state to resume from (``--auto_resume`` or ``path.resume_state``), on the CPU."""
    if opt['auto_resume']:
        path, state = newest_readable_state(opt)
    else:
        path = opt['path'].get('resume_state')
        folder = opt['path']['training_states']
        if path is not None and osp.realpath(osp.dirname(path)) != osp.realpath(folder):
            raise InputError(f"path.resume_state '{path}' is not in this experiment's training states ({folder}): a "
                             f"resumed run reads its weights from {opt['path']['models']}; set name to the state's "
                             'experiment')
        state = None if path is None else load_safe(path, 'training state')
    if path is None:
        return None
    opt['path']['resume_state'] = path
    if not isinstance(state, dict) or 'iter' not in state or 'epoch' not in state:
        raise InputError(f"training state '{path}' has no epoch/iter: not a BasicSR training state")
    total = opt['train']['total_iter']
    if state['iter'] > total:
        raise InputError(f"train.total_iter {total} is below iteration {state['iter']}, which training state '{path}' "
                         'reached; raise total_iter, or give the run a new name to train a shorter one')
    cameras = training_cameras(opt)
    if 'train_cameras' in state and state['train_cameras'] != cameras:   # states before the record: not compared
        raise InputError(f"datasets.train.cameras {cameras} differ from the {state['train_cameras']} that training "
                         f"state '{path}' was trained on; restore them, or give the run a new name")
    saved, now = state.get('fixed_options') or {}, resume_fixed(opt)
    changed = [key for key in saved if saved[key] != now.get(key)]
    if changed:
        more = f' ({len(changed) - 1} more option(s) differ too)' if len(changed) > 1 else ''
        why = ("the state holds that model's optimizers and method state" if changed[0] == 'model_type' else
               "a resumed run keeps the state's optimizer, schedule and data draws, so the new value would be logged "
               'and not used')
        raise InputError(f"{changed[0]} is {now.get(changed[0])!r} in the option file but {saved[changed[0]]!r} in "
                         f"training state '{path}'{more}: {why}; restore it, or give the run a new name")
    paths = opt['path']   # BasicSR points pretrain_network_g at the state's weights; L2-SP still anchors to the start
    paths[START_KEY], paths[START_PARAM_KEY] = paths.get('pretrain_network_g'), paths.get('param_key_g', 'params')
    check_resume(opt, state['iter'])
    return state


def remove_partial_writes(opt: Dict) -> None:
    """Delete temporary files of checkpoints whose writing a killed run left unfinished."""
    for key in ('models', 'training_states'):
        folder = opt['path'][key]
        for name in os.listdir(folder) if osp.isdir(folder) else []:
            if name.startswith('.') and name.endswith('.tmp'):
                os.remove(osp.join(folder, name))
                get_root_logger().info(f'Removed the unfinished write {name} of the interrupted run.')


def build_datasets(opt: Dict) -> Tuple[Dataset, List[Tuple[Dict, Dataset]]]:
    """Build every dataset before any folder is created, so bad data options cost nothing."""
    train_set, val_sets = None, []
    for phase, dataset_opt in opt['datasets'].items():
        kind = phase.split('_')[0]
        if kind not in ('train', 'val'):
            raise InputError(f"dataset section '{phase}': training accepts 'train' and 'val*' sections")
        dataset_cls = registered(DATASET_REGISTRY, dataset_opt.get('type'), f"datasets.{phase}.type")
        validate_dataset_options(dataset_cls, phase, dataset_opt)
        if kind == 'train':
            if getattr(dataset_cls, 'accepts_draw_numbers', False):
                dataset_opt.setdefault('seed', opt['manual_seed'])
            train_set = dataset_cls(dataset_opt)
        else:
            val_sets.append((dataset_opt, dataset_cls(dataset_opt)))
    if train_set is None:
        raise InputError("the option file has no 'datasets: train' section")
    return train_set, val_sets


def _build_model(opt: Dict):
    """BasicSR's ``build_model`` with unknown registry names reported as bad input."""
    registered(MODEL_REGISTRY, opt.get('model_type'), 'model_type')
    registered(ARCH_REGISTRY, (opt.get('network_g') or {}).get('type'), 'network_g.type')
    return build_model(opt)


def train_pipeline(root_path: str) -> None:
    """Run training as ``python Train_pip.py -opt X.yml [--auto_resume] [--launcher ...]``."""
    opt, args = parse_options(root_path, is_train=True)
    opt['root_path'] = root_path
    torch.backends.cudnn.benchmark = True

    outputs = OutputFolder()
    try:
        resume_state = load_resume_state(opt)
        train_set, val_sets = build_datasets(opt)
        check_option_values(opt, train_set)
        check_validation_crops(opt, val_sets)
        probe_network(opt['network_g'], opt.get('scale'), device_type=basicsr_device_type(gpus_used(opt)))
        if resume_state is None and opt['rank'] == 0:
            outputs.create(opt['path']['experiments_root'])
            for key in ('models', 'training_states', 'visualization'):
                os.makedirs(opt['path'][key], exist_ok=True)
        log_file = osp.join(opt['path']['log'], f"train_{opt['name'].replace('/', '_')}_{get_time_str()}.log")
        if opt['rank'] == 0:   # a resumed run writes into its folder: a refusal removes what it wrote there
            outputs.keep(osp.join(opt['path']['experiments_root'], osp.basename(args.opt)))
            outputs.keep(log_file)
        copy_opt_file(args.opt, opt['path']['experiments_root'])
        logger = get_root_logger(logger_name='basicsr', log_level=logging.INFO, log_file=log_file)
        logger.info(get_env_info())
        if args.option_defaults:
            logger.info(args.option_defaults)
        logger.info(dict2str(opt))
        for warning in (unsaved_states_warning(opt), warm_up_rate_warning(opt)):
            if warning is not None:
                logger.warning(warning)
        if opt['name'].startswith('debug'):
            logger.warning("BasicSR's debug mode (the name starts with 'debug'): validation and checkpoints every 8 "
                           'iterations, printing every one, no tensorboard, whatever the option file says')
        model = _build_model(opt)
        if (opt.get('val') or {}).get('save_best') and not isinstance(model, BestCheckpointMixin):
            raise InputError(f"val.save_best needs a model type of this project (FTSRModel = BasicSR's SRModel with "
                             f"atomic, resumable checkpoints, or LDTSRModel); got {opt['model_type']}")
        if resume_state is not None:
            model.resume_training(resume_state)
            if opt['rank'] == 0:
                remove_partial_writes(opt)
        loaders = build_loaders(opt, model, train_set, val_sets)
    except InputError as err:
        outputs.rollback()
        fail(str(err))
    except BaseException:   # a traceback (or Ctrl-C) while setting up: nothing half-made stays behind
        outputs.rollback()
        raise
    tb_logger = init_tb_loggers(opt)
    _train(opt, model, train_set, val_sets, loaders, resume_state, tb_logger, logger)
    end_process_group()


def build_loaders(opt: Dict, model, train_set: Dataset, val_sets) -> Tuple:
    """The training sampler and loader and the validation loaders (the sampler asks the model whether
    batches are camera-balanced), refused while the new experiment folder can still be rolled back."""
    train_opt = opt['datasets']['train']
    sampler = training_sampler(train_set, opt, getattr(model, 'camera_balanced_batches', False))
    train_loader = build_dataloader(train_set, train_opt, num_gpu=opt['num_gpu'], dist=opt['dist'],
                                    sampler=sampler, seed=opt['manual_seed'])
    val_loaders = [build_dataloader(ds, dopt, num_gpu=opt['num_gpu'], dist=opt['dist'], sampler=None,
                                    seed=opt['manual_seed']) for dopt, ds in val_sets]
    if len(train_loader) == 0:
        raise InputError(f"training dataset '{train_opt['name']}' has {len(train_set)} images, fewer than one "
                         f"batch of {train_opt['batch_size_per_gpu']}")
    return sampler, train_loader, val_loaders


def _train(opt: Dict, model, train_set: Dataset, val_sets, loaders: Tuple, resume_state, tb_logger, logger) -> None:
    train_opt = opt['datasets']['train']
    sampler, train_loader, val_loaders = loaders
    iters_per_epoch = len(train_loader)
    total_iters = int(opt['train']['total_iter'])
    total_epochs = math.ceil(total_iters / iters_per_epoch)
    logger.info(f'Training data: {len(train_set)} images {getattr(train_set, "cameras", "")}, '
                f'{iters_per_epoch} iterations per epoch, {total_epochs} epochs, {total_iters} iterations.')
    trained = set(getattr(train_set, 'cameras', None) or ())
    for dopt, ds in val_sets:
        logger.info(f'Validation data {dopt["name"]}: {len(ds)} images {getattr(ds, "cameras", "")}')
        shared = sorted(trained & set(getattr(ds, 'cameras', None) or ()))
        if shared:   # legitimate (watching the source), but a mean over it is not a target figure
            logger.warning(f'Validation data {dopt["name"]} includes {", ".join(shared)}, which the run trains on: '
                           'its figures, and the checkpoint val.save_best picks, mix source and target cameras')
    for name, metric in (((opt.get('val') or {}).get('metrics') or {}) if val_sets else {}).items():
        if metric.get('type') in ('calculate_psnr', 'calculate_ssim') and 'test_y_channel' not in metric:
            logger.warning(f'val.metrics.{name} measures RGB (test_y_channel absent: BasicSR\'s default), and '
                           "test.py measures the Y channel unless told otherwise (the paper's way; RGB reads about "
                           '1.7 dB lower): set test_y_channel to say which')

    start_epoch, current_iter = 0, 0
    if resume_state is not None:
        start_epoch, current_iter = resume_state['epoch'], resume_state['iter']
        logger.info(f'Resuming training from epoch: {start_epoch}, iter: {current_iter}.')
    msg_logger = MessageLogger(opt, current_iter, tb_logger)
    prefetch_mode = train_opt.get('prefetch_mode')
    if prefetch_mode in (None, 'cpu'):
        prefetcher = CPUPrefetcher(train_loader)
    elif prefetch_mode == 'cuda':
        prefetcher = CUDAPrefetcher(train_loader, opt)
    else:
        raise InputError(f"prefetch_mode must be cpu or cuda, got '{prefetch_mode}'")

    data_timer, iter_timer = AvgTimer(), AvgTimer()
    start_time = time.time()
    epoch = start_epoch
    for epoch in range(start_epoch, total_epochs + 1):
        sampler.set_epoch(epoch)
        # Batches of this epoch that the saved run had already consumed.
        sampler.skip = max(0, current_iter - epoch * iters_per_epoch) * train_loader.batch_size
        prefetcher.reset()
        train_data = prefetcher.next()
        while train_data is not None:
            data_timer.record()
            current_iter += 1
            if current_iter > total_iters:
                break
            model.update_learning_rate(current_iter, warmup_iter=opt['train'].get('warmup_iter', -1))
            model.feed_data(train_data)
            model.optimize_parameters(current_iter)
            iter_timer.record()
            if current_iter == 1:
                msg_logger.reset_start_time()
            if current_iter % opt['logger']['print_freq'] == 0:
                log_vars = {'epoch': epoch, 'iter': current_iter, 'lrs': model.get_current_learning_rate(),
                            'time': iter_timer.get_avg_time(), 'data_time': data_timer.get_avg_time()}
                log_vars.update(model.get_current_log())
                msg_logger(log_vars)
            # Validate before saving (BasicSR saves first): the training state of this iteration then
            # holds the best value its validation found, and the RNG draws validation makes.
            if opt.get('val') is not None and current_iter % opt['val']['val_freq'] == 0:
                for val_loader in val_loaders:
                    model.validation(val_loader, current_iter, tb_logger, opt['val']['save_img'])
            if current_iter % opt['logger']['save_checkpoint_freq'] == 0:
                logger.info('Saving models and training states.')
                model.save(epoch, current_iter)
            data_timer.start()
            iter_timer.start()
            train_data = prefetcher.next()
        sampler.skip = 0
        if current_iter > total_iters:
            break

    current_iter = min(current_iter, total_iters)  # the loop overshoots by one; the weights are total_iter's
    logger.info(f'End of training. Time consumed: {datetime.timedelta(seconds=int(time.time() - start_time))}')
    logger.info('Save the latest model.')
    model.save(epoch=-1, current_iter=-1)
    if opt.get('val') is not None:
        for val_loader in val_loaders:
            model.validation(val_loader, current_iter, tb_logger, opt['val']['save_img'])
    if tb_logger:
        tb_logger.close()
