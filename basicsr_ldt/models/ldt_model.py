"""LDTSRModel: BasicSR's SRModel trained by Layer-Decomposition Training.

A thin adapter: the method lives in ``basicsr_ldt.ldt`` (plain PyTorch). This file turns BasicSR's
options into an ``LDTConfig``, gives LDT an optimizer factory that attaches BasicSR's LR schedulers,
feeds it the loss of each batch, and makes everything BasicSR does with ``net_g`` (validation,
``net_g_*.pth``) use the composite network of eq. 12. Head warm-up and variance profiling read
disjoint halves of the source data (D_S1, D_S2) through their own loaders.
"""
import dataclasses
from collections import OrderedDict
from typing import Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from basicsr.losses import build_loss
from basicsr.models import lr_scheduler
from basicsr.models.sr_model import SRModel
from basicsr.utils import get_root_logger
from basicsr.utils.dist_util import get_dist_info
from basicsr.utils.registry import DATASET_REGISTRY, MODEL_REGISTRY

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.options import closest_key_hint, registered
from basicsr_ldt.common.schema import MULTI_STEP
from basicsr_ldt.data.sampler import ResumableSampler
from basicsr_ldt.ldt import LDT, PRESETS, LDTConfig, Partition, forced_layers, head_layers, preset
from basicsr_ldt.ldt.partition import FORCE_OPTIONS, build_partition, deft_blocks
from basicsr_ldt.ldt.step_graph import BatchTerms, graphs_in_one_pool
from basicsr_ldt.models.best import BestCheckpointMixin, validated_network
from basicsr_ldt.models.guarded_step import GuardedStepMixin
from basicsr_ldt.models.optimizers import adam_kwargs, build_adam
from basicsr_ldt.models.partition_report import write_partition_report
from basicsr_ldt.models.resumable import ResumableMixin
from basicsr_ldt.models.validation import ValidationMixin

#: How a step LDT skipped for a non-finite loss is named in the log.
SKIPPED_STEP = {'warmup': 'the head warm-up', 'profile': 'gradient profiling (sample not used)',
                'finetune': 'fine-tuning', 'ldt_s': 'the LDT-S step', 'primary': 'the primary branch',
                'auxiliary': 'the auxiliary branch'}


def refuse_basicsr_ema(train_opt: Dict) -> None:
    """BasicSR's weight EMA (``train.ema_decay``) is not LDT's: a run asking for it would be tested on
    weights it never kept."""
    if train_opt.get('ema_decay', 0):
        raise InputError('train.ema_decay: LDTSRModel keeps its own EMA between branches; remove ema_decay')
    if train_opt.get('ema_reference_iters') is not None:
        raise InputError('train.ema_reference_iters: rescales BasicSR\'s train.ema_decay, which LDTSRModel does not '
                         'use; its own EMA scales with ldt.ema_reference_iters')


def ldt_config_from_options(opt: Dict) -> LDTConfig:
    """``LDTConfig`` from the ``ldt:`` section: ``method`` picks a preset, other keys override it."""
    section = dict(opt.get('ldt') or {})
    method = section.pop('method', 'ldt')
    if method not in PRESETS:
        methods = PRESETS + ('corgrad',)
        raise InputError(f"ldt.method: expected one of {', '.join(map(repr, methods))}, got {method!r}"
                         f'{closest_key_hint(str(method), methods)}')
    try:
        config = preset(method, **section)
    except ValueError as err:  # typed checks already name 'ldt.<key>'
        raise InputError(str(err) if str(err).startswith('ldt.') else f'ldt: {err}') from None
    if 'seed' not in section and config.reads_seed():   # a random partition per study seed, as the crops
        config = dataclasses.replace(config, seed=int(opt.get('manual_seed') or 0))
    total = int(opt['train']['total_iter'])
    if config.head_warmup_iters + config.counted_profile_iters >= total:
        raise InputError(f'ldt: head_warmup_iters ({config.head_warmup_iters}) + profile_iters ({config.profile_iters}) '
                         f'must be smaller than train.total_iter ({total}), or no training would remain')
    warmup, head = opt['train'].get('warmup_iter', -1), config.head_warmup_iters
    if config.counted_profile_iters and warmup - 1 > head:   # BasicSR ramps iterations 1 .. warmup_iter - 1
        raise InputError(f'train.warmup_iter: {warmup} ramps the rate up to iteration {warmup - 1}, and iterations '
                         f'{head + 1}-{head + config.counted_profile_iters} profile gradients without an optimizer step, '
                         f'so that part of the ramp does nothing and training starts at a rate the file does not say; '
                         f'expected -1 (no warm-up){f" or at most {head + 1} (the head warm-up alone)" if head else ""}')
    try:
        config.check_run_length(total)
    except ValueError as err:
        raise InputError(str(err)) from None
    return config


class PhaseBatches:
    """Batches for warm-up (D_S1) or profiling (D_S2) from a disjoint part of the training data.

    Position ``k`` of a phase is a pure function of ``k`` (epoch = k // batches per epoch,
    skipped batches = the remainder), so a resumed run reads the same batches.
    """

    def __init__(self, dataset_opt: Dict, part: int, parts: int, seed: int, device: torch.device,
                 file_order: bool = False) -> None:
        options = dict(dataset_opt)
        if parts > 1:
            options['subset'] = {'parts': parts, 'index': part, 'seed': seed}
        dataset_cls = registered(DATASET_REGISTRY, options['type'], 'datasets.train.type')
        if parts > 1 and not getattr(dataset_cls, 'supports_subset', False):
            raise InputError(f"ldt: head warm-up and profiling need disjoint parts of the training data; dataset "
                             f"type '{options['type']}' cannot split itself (use DRealSRCameraDataset)")
        self.dataset = dataset_cls(options)
        rank, world = get_dist_info()
        self.sampler = ResumableSampler(self.dataset, world, rank, 1, seed=seed)
        self.batch_size = int(options['batch_size_per_gpu'])
        self.per_epoch = len(self.sampler) // self.batch_size
        if self.per_epoch == 0 and not file_order:  # one unshuffled pass may end in a partial batch
            raise InputError(f"ldt: part {part + 1}/{parts} of '{options.get('name')}' has {len(self.dataset)} "
                             f'images, fewer than one batch of {self.batch_size}')
        if file_order and -(-len(range(rank, len(self.dataset), world)) // self.batch_size) < 2:
            raise InputError(f"ldt: profile_order 'file_order' reads one pass of '{options.get('name')}' "
                             f'({len(self.dataset)} images, batch {self.batch_size}): fewer than the 2 batches '
                             'the statistics need')
        self.workers = int(options.get('num_worker_per_gpu', 0))
        self.device = device
        self._iterator, self._position = None, None

    def first_in_file_order(self, limit: int) -> Iterator[Dict[str, torch.Tensor]]:
        """The first ``limit`` batches of one unshuffled pass, as the official profiling loader
        (fewer when the data hold fewer, the last one possibly partial). Under torchrun rank r
        takes images r, r + world, ... so the ranks' batches together cover the same files."""
        rank, world = get_dist_info()
        shard = list(range(len(self.dataset)))[rank::world]
        loader = DataLoader(self.dataset, batch_size=self.batch_size, sampler=shard, num_workers=self.workers,
                            drop_last=False)
        for count, data in enumerate(loader):
            if count == limit:
                return
            yield {'lq': data['lq'].to(self.device), 'gt': data['gt'].to(self.device)}

    def batch(self, position: int) -> Dict[str, torch.Tensor]:
        """The ``position``-th batch (0-based) of this phase."""
        if self._iterator is None or self._position != position:
            self.sampler.set_epoch(position // self.per_epoch)
            self.sampler.skip = (position % self.per_epoch) * self.batch_size
            loader = DataLoader(self.dataset, batch_size=self.batch_size, sampler=self.sampler,
                                num_workers=self.workers, drop_last=True)
            self._iterator, self._position = iter(loader), position
        try:
            data = next(self._iterator)
        except StopIteration:
            self._iterator = None
            return self.batch(position)
        self._position = position + 1
        if self._position % self.per_epoch == 0:
            self._iterator = None
        return {'lq': data['lq'].to(self.device), 'gt': data['gt'].to(self.device)}


def _listing(names: List[str], shown: int = 12) -> str:
    """``N parameters: a, b, ... and M more`` for a log line."""
    more = f' and {len(names) - shown} more' if len(names) > shown else ''
    return f"{len(names)} parameter{'s' if len(names) != 1 else ''}: {', '.join(names[:shown])}{more}"


@MODEL_REGISTRY.register()
class LDTSRModel(ValidationMixin, BestCheckpointMixin, GuardedStepMixin, ResumableMixin, SRModel):
    """SR model trained with LDT; ``net_g`` checkpoints hold the composite network (eq. 12)."""

    compile_auto_untimed = "LDT's steps"   # the GPU run of 2026-11-28 timed the FT step compiled, not this
    graph_auto_untimed = "LDT's dual step"

    validated_networks = ('composite', 'primary', 'auxiliary')  # val.best_network; default first

    def __new__(cls, opt, *args, **kwargs):
        # ``ldt: {method: corgrad}`` is not an LDT configuration but CorGrad's own model; this
        # lets an option file (or a study override) switch methods through the ``ldt:`` block.
        if cls is LDTSRModel and (opt.get('ldt') or {}).get('method') == 'corgrad':
            from basicsr_ldt.models.corgrad_model import CorGradSRModel
            return CorGradSRModel(opt)
        return super().__new__(cls)

    def model_to_device(self, net):
        # The branches synchronise gradients themselves (``average_gradients``): a DDP wrapper
        # cannot be deep-copied into the auxiliary branch. What DDP would do at construction,
        # starting every rank from rank 0's weights (seeds differ per rank), is done here.
        net = net.to(self.device)
        if self.opt['dist']:
            with torch.no_grad():
                for tensor in list(net.parameters()) + list(net.buffers()):
                    dist.broadcast(tensor, src=0)
        return net

    def init_training_settings(self) -> None:
        train_opt = self.opt['train']
        refuse_basicsr_ema(train_opt)
        self.setup_precision()
        self.net_g.train()
        self.ema_decay = 0
        self.cri_pix = build_loss(dict(train_opt['pixel_opt'])).to(self.device) if train_opt.get('pixel_opt') else None
        if self.cri_pix is None:
            raise InputError('train.pixel_opt is required for LDTSRModel (the paper uses L1Loss)')
        self.config = ldt_config_from_options(self.opt)
        self.setup_l2_sp(2 if self.config.mode == 'dual' else 1)
        # LDT builds its optimizers when each phase starts: check their options now, not mid-run.
        adam_kwargs(train_opt['optim_g'], list(self.net_g.parameters()))
        self._lr_iter = 0
        self._schedulers: Dict[int, object] = {}
        self._phase: Optional[str] = None
        dual = self.config.mode == 'dual'
        unrecorded = '' if dual else (f"ldt.mode '{self.config.mode}' has no dual step, the step LDTSRModel records "
                                      '(FTSRModel records the FT step)')
        graphs = graphs_in_one_pool if self.step_graph_wanted("each branch's step of the dual phase", unrecorded) else None
        self.ldt = LDT(self.get_bare_model(self.net_g), self.config, self._make_optimizer, self.precision,
                       total_iters=int(train_opt['total_iter']), graphs=graphs)
        self._check_patterns()
        seed, parts = self.opt.get('manual_seed', 0), 2 if self.config.head_warmup_iters else 1
        train_data = self.opt['datasets']['train']
        self._phase_data = {
            'warmup': PhaseBatches(train_data, 0, parts, seed, self.device) if self.config.head_warmup_iters else None,
            'profile': PhaseBatches(train_data, parts - 1, parts, seed, self.device,
                                    self.config.profile_order == 'file_order') if self.config.profile_iters else None}
        self.log_dict = OrderedDict()

    def _check_patterns(self) -> None:
        """Before training: fail when a name pattern in use selects nothing, and log what each selects.

        A pattern is an exact name, a glob or a module prefix (``layers.1`` is ``layers.1.*``, not
        ``layers.10``); the log shows at the start of a run which tensors it took, where the partition
        file would show the result only after warm-up and profiling. Force patterns go through
        ``forced_layers``, the rule ``build_partition`` applies later (each must select something, no
        layer forced into both groups), so this check and the partition agree; head patterns together.
        """
        names, network = self.ldt.names, self.opt['network_g']['type']
        logger = get_root_logger()
        by_head = (self.config.partition, self.config.deft_grouping) == ('name', 'head')
        if self.config.head_warmup_iters or by_head:
            try:
                head = head_layers(names, self.config.head_patterns, network)
            except ValueError as err:
                raise InputError(str(err)) from None
            logger.info(f'ldt.head_patterns {list(self.config.head_patterns)} select {_listing(head)}')
        try:
            if self.config.partition_file is not None:   # the file decides the groups; force patterns are unused
                Partition.load(self.config.partition_file, names)   # read now, not after warm-up
                return
            if (self.config.partition, self.config.deft_grouping) == ('name', 'non_layers'):
                deft_blocks(names)
        except ValueError as err:
            raise InputError(str(err)) from None
        try:
            forced = forced_layers(names, self.config.force_stable, self.config.force_unstable, network)
        except ValueError as err:
            raise InputError(str(err)) from None
        for option, selections in forced.items():
            for pattern, chosen in selections:
                logger.info(f"ldt.{option} '{pattern}' selects {_listing(chosen)}")
        self._check_groups_left(names, network, forced)

    def _check_groups_left(self, names: List[str], network: str, forced: Dict) -> None:
        """A split that leaves a group empty whatever profiling finds stops now, not after warm-up and profiling:
        a split by name is known whole before training, a split by statistic when force patterns take every layer."""
        cfg = self.config
        if cfg.partition == 'name':
            try:
                build_partition(names, None, partition='name', head_patterns=cfg.head_patterns,
                                deft_grouping=cfg.deft_grouping, force_stable=cfg.force_stable,
                                force_unstable=cfg.force_unstable, dpu=False, network=network)
            except ValueError as err:
                raise InputError(f"ldt.partition 'name': {err}") from None
            return
        for option, emptied in zip(FORCE_OPTIONS, ('unstable', 'stable')):
            if len({name for _, chosen in forced[option] for name in chosen}) == len(names):
                raise InputError(f'ldt.{option}: its patterns select every parameter of {network}, so the {emptied} '
                                 'group would be empty; expected some parameters left to the split')

    # ------------------------------------------------------------------ optimizers/schedulers
    def _make_optimizer(self, params: List[torch.nn.Parameter], role: str) -> torch.optim.Optimizer:
        optimizer = build_adam(params, self.opt['train']['optim_g'], role)
        scheduler = self._build_scheduler(optimizer)
        self._join_schedule(optimizer, scheduler, max(0, self._lr_iter - 1))
        self._schedulers[id(optimizer)] = scheduler
        return optimizer

    def _build_scheduler(self, optimizer: torch.optim.Optimizer):
        sched_opt = dict(self.opt['train']['scheduler'])
        kind = sched_opt.pop('type')
        if kind in MULTI_STEP:
            return lr_scheduler.MultiStepRestartLR(optimizer, **sched_opt)
        if kind == 'CosineAnnealingRestartLR':
            return lr_scheduler.CosineAnnealingRestartLR(optimizer, **sched_opt)
        raise InputError(f"train.scheduler.type '{kind}' is not one of MultiStepLR, CosineAnnealingRestartLR")

    def _join_schedule(self, optimizer: torch.optim.Optimizer, scheduler, steps: int) -> None:
        """Put a branch created at iteration k where BasicSR's schedulers are after
        ``update_learning_rate(k)``: ``k - 1`` steps into the global schedule.

        The steps are replayed on a stand-in optimizer that steps before its scheduler (the order
        torch expects; stepping the new scheduler itself before its optimizer's first step is what
        made torch warn "lr_scheduler.step() before optimizer.step()"), then the position and the
        learning rate are copied over, so the branch's first step uses iteration k's rate.
        """
        if steps == 0:
            return
        stand_in = torch.optim.SGD([{'params': [torch.zeros(1, requires_grad=True)], 'lr': group['lr']}
                                    for group in optimizer.param_groups])
        replay = self._build_scheduler(stand_in)
        for _ in range(steps):
            stand_in.step()  # no gradients: updates nothing, marks the order as correct
            replay.step()
        scheduler.load_state_dict(replay.state_dict())
        for group, replayed in zip(optimizer.param_groups, stand_in.param_groups):
            group['lr'] = replayed['lr']

    def _sync_optimizer_lists(self) -> None:
        self.optimizers = list(self.ldt.optimizers.values())
        self.schedulers = [self._schedulers[id(o)] for o in self.optimizers]

    def setup_optimizers(self) -> None:  # optimizers are created per phase by LDT
        self.optimizers = []

    def setup_schedulers(self) -> None:
        self.schedulers = []

    def update_learning_rate(self, current_iter: int, warmup_iter: int = -1) -> None:
        self._lr_iter = current_iter
        if not self._enter_phase(current_iter):
            super().update_learning_rate(current_iter, warmup_iter)
            return
        # The branches created just now already sit at this iteration's rate (_join_schedule).
        schedulers, self.schedulers = self.schedulers, []
        super().update_learning_rate(current_iter, warmup_iter)
        self.schedulers = schedulers

    def get_current_learning_rate(self) -> List[float]:
        return [g['lr'] for g in self.optimizers[0].param_groups] if self.optimizers else [0.0]

    # ------------------------------------------------------------------ training
    def _enter_phase(self, current_iter: int) -> bool:
        """Start the phase of ``current_iter`` if it is a new one; returns whether it was."""
        phase = self.ldt.phase(current_iter)
        if phase == self._phase:
            return False
        if phase == 'train' and self.config.profile_iters and not self.config.profile_counts_in_total_iter:
            self._profile_before_training(current_iter)
        self.ldt.enter(current_iter)
        self._sync_optimizer_lists()
        self._log_phase(phase, f'from iteration {current_iter}')
        if phase == 'train' and self.ldt.partition is not None:
            self._report_partition(self.ldt.partition)
            for line in self.ldt.horizon_warnings():
                get_root_logger().warning(f'LDT: {line}')
        self._phase = phase
        return True

    def _log_phase(self, phase: str, when: str) -> None:
        """The log's account of a phase (and of how the dual step runs), on entering it or resuming in it:
        the dual step's schedule depends on execution options a resumed run may change."""
        kept = 'unstable' if self.config.trained_group == 'stable' else 'stable'
        descriptions = {'warmup': f'head warm-up on D_S1 ({self.config.head_warmup_iters} iterations)',
                        'profile': f'gradient profiling on D_S2 ({self.config.profile_iters} batches, '
                                   f"criterion '{self.config.criterion}')",
                        'train': {'dual': 'dual training (cross-frozen primary/auxiliary)',
                                  'alternating': f'LDT-S (one network, groups frozen alternately every '
                                                 f'{self.config.interval_iters} iterations, CPU weight buffer)',
                                  'single': 'fine-tuning',
                                  'partial': f'fine-tuning the {self.config.trained_group} layers alone (the '
                                             f'{kept} stay frozen)'}[self.config.mode]}
        logger = get_root_logger()
        logger.info(f'LDT phase: {descriptions[phase]} {when}')
        if phase == 'train' and self.ldt.pair is not None:
            logger.info(f'LDT dual step: {self.ldt.pair.schedule()} (ldt.overlap_branches, overlap_memory)')

    def _profile_before_training(self, current_iter: int) -> None:
        """Profiling outside ``total_iter`` (``profile_counts_in_total_iter: false``), in one go."""
        data, limit = self._phase_data['profile'], self.config.profile_iters
        if self.config.profile_order == 'file_order':
            batches = data.first_in_file_order(limit)
        else:
            batches = (data.batch(k) for k in range(limit))
        losses = ((lambda network, b=b: self.cri_pix(network(b['lq']), b['gt'])) for b in batches)
        count = self.ldt.profile(losses)
        get_root_logger().info(f"LDT phase: gradient profiling on D_S2 ({count} batches, {self.config.profile_order}, "
                               f"criterion '{self.config.criterion}') before iteration {current_iter}, "
                               'not counted in total_iter')

    def _report_partition(self, partition: Partition) -> None:
        logger = get_root_logger()
        ranked = sorted((r for r in partition.layers if r.statistic is not None), key=lambda r: -r.statistic)
        top = ', '.join(f'{r.name} ({r.statistic:.3g})' for r in ranked[:3]) or 'by name'
        logger.info(f'LDT partition ({partition.criterion}): {len(partition.stable)} stable, '
                    f'{len(partition.unstable)} unstable layers; highest statistic: {top}')
        reference = self.config.reference_exchanges()
        if reference is not None:
            run = self.config.run_exchanges(int(self.opt['train']['total_iter']))
            ranges = '; '.join(f'{g} W {min(w):.6g} .. {max(w):.6g} over {run[g]} exchanges'
                               for g, w in ((g, partition.coefficients(g)) for g in ('stable', 'unstable')))
            logger.info(f'LDT EMA coefficients rescaled from {reference} reference exchanges '
                        f'(ldt.ema_reference_iters {self.config.ema_reference_iters} / ema_reference_every '
                        f'{self.config.ema_reference_every}) to this run: {ranges}')
        if self.opt['rank'] == 0 and self.is_train and 'experiments_root' in self.opt['path']:
            write_partition_report(partition, self.opt['path']['experiments_root'],
                                   exchanged=self.config.mode != 'partial')

    def optimize_parameters(self, current_iter: int) -> None:
        self._enter_phase(current_iter)
        phase = self._phase
        data = self._phase_data.get(phase)
        if data is not None:
            start = 0 if phase == 'warmup' else self.config.head_warmup_iters
            batch = data.batch(current_iter - 1 - start)
            lq, gt = batch['lq'], batch['gt']
        else:
            lq, gt = self.lq, self.gt

        def terms_of(network: torch.nn.Module, lq: torch.Tensor, gt: torch.Tensor) -> Dict[str, torch.Tensor]:
            terms = {'l_pix': self.cri_pix(network(lq), gt)}
            if phase != 'profile':   # profiling samples the data's gradients
                self.add_l2_sp(network, terms)
            return terms

        batch = BatchTerms(terms_of, lq, gt)   # a form the dual step's graphs can replay
        losses = self.ldt.update(batch, current_iter)
        if 'l_l2sp' in batch.terms:   # the last branch's
            losses['l_l2sp'] = float(batch.terms['l_l2sp'].detach())
        losses = OrderedDict((k, torch.tensor(v)) for k, v in losses.items())
        self.log_dict = self.reduce_loss_dict(losses) if losses else losses  # profiling has no loss to log
        skipped = self.ldt.last_skipped
        self.record_step(current_iter, None if skipped is None else SKIPPED_STEP[skipped])

    # ------------------------------------------------------------------ composite network
    def composite_network(self) -> torch.nn.Module:
        """The network validation and ``net_g_*.pth`` use: eq. 12 while dual training."""
        return self.ldt.composite().to(self.device).eval()

    def validation(self, dataloader, current_iter, tb_logger, save_img=False):
        # One network per validation run, not one per image: the composite unless val.best_network
        # names a branch (the official script validates one branch); net_g_best.pth is the composite.
        which = validated_network(self.opt, self.validated_networks)
        self._validated = self.ldt.network(which).to(self.device).eval()
        try:
            super().validation(dataloader, current_iter, tb_logger, save_img)
        finally:
            self._validated = None

    def inference_network(self) -> torch.nn.Module:
        return getattr(self, '_validated', None) or self.composite_network()

    def replica_tensors(self) -> List[torch.Tensor]:
        tensors = list(self.ldt.primary.parameters())
        if self.ldt.auxiliary is not None:
            tensors += list(self.ldt.auxiliary.parameters())
        if self.ldt.partition is not None:
            tensors.append(torch.tensor(list(self.ldt.partition.dpu_coefficients.values()), dtype=torch.float64))
        return tensors

    def best_weights(self):
        return [self.composite_network()], ['params']

    def save(self, epoch: int, current_iter: int) -> None:
        self.check_savable(current_iter)
        self.save_network(self.composite_network(), 'net_g', current_iter)
        self.save_training_state(epoch, current_iter)

    # ------------------------------------------------------------------ resume
    def extra_training_state(self) -> Dict:
        return {**super().extra_training_state(), 'ldt': self.ldt.state_dict()}

    def load_extra_training_state(self, state: Dict) -> None:
        if 'ldt' not in state:
            raise InputError('the training state holds no LDT state: it was not written by LDTSRModel')
        super().load_extra_training_state(state)
        try:
            self.ldt.load_state_dict(state['ldt'])
        except ValueError as err:
            raise InputError(f'cannot resume LDT: {err}') from None
        self._phase = self.ldt.current_phase
        self._sync_optimizer_lists()

    def resume_training(self, resume_state: Dict) -> None:
        super().resume_training(resume_state)
        if self._phase is not None:
            self._log_phase(self._phase, f"resumed after iteration {resume_state['iter']}")
        scaled, total = self.ldt.partition_total_iters, self.ldt.total_iters
        if self.config.ema_reference_iters is not None and self.ldt.partition is not None and scaled != total:
            get_root_logger().warning(f'LDT EMA coefficients stay rescaled for the {scaled} iterations of the run their '
                                      f'partition was made in; train.total_iter is now {total} (ldt.ema_reference_iters '
                                      'rescales once, when the partition is made)')
