"""LDT as one small algorithm object (DomainBed style): ``update`` shows the whole method.

Phases are driven by the (1-based) iteration: head warm-up -> gradient profiling -> training
(dual = cross-frozen pair with EMA exchange, alternating = LDT-S on one network, single = plain
fine-tuning for FT / LP-FT). Warm-up, profiling and the partition are the same for every mode. The
caller supplies the loss of one batch as a closure over the network, so the same object drives
an SR model, a classifier or anything else with a scalar loss.

A batch whose loss is not finite is skipped before any step (see ``precision``): no optimizer
step, no profiling sample, no EMA/DPU exchange; ``last_skipped`` names the step for the caller.
"""
from __future__ import annotations

import copy
import math
from typing import Dict, Iterable, List, Optional

import torch
from torch import nn

from basicsr_ldt.ldt.config import EXECUTION_OPTIONS, ONE_GROUP_OR_NONE, LDTConfig
from basicsr_ldt.ldt.ema_horizon import horizon_warnings, scale_partition
from basicsr_ldt.ldt.freezing import clear_routing, set_trainable
from basicsr_ldt.ldt.ldt_s import AlternatingFreezing
from basicsr_ldt.ldt.pair import BatchLoss, CrossFrozenPair, OptimizerFactory, optimizer_step
from basicsr_ldt.ldt.partition import Partition, build_partition, head_layers
from basicsr_ldt.ldt.precision import MixedPrecision, RunningStatistics, finite_on_all_ranks
from basicsr_ldt.ldt.statistics import GradientStatistics, all_reduce_statistics, random_statistic
from basicsr_ldt.ldt.step_graph import GraphsFactory

PHASES = ('warmup', 'profile', 'train')
STATE_FORMAT = 1


class LDT:
    """Layer-Decomposition Training driven one iteration at a time.

    ``network`` becomes the primary branch in place (its ``requires_grad`` flags change with
    the phase). ``optimizer_factory(params, role)`` is called whenever a phase starts (also
    inside :meth:`load_state_dict`), with role ``warmup``, ``finetune``, ``primary``,
    ``auxiliary`` or ``ldt_s``. ``precision`` (default: full fp32) sets autocast and fp16 loss
    scaling. ``graphs`` (``step_graph``) replays the dual step's branches as CUDA graphs.
    """

    def __init__(self, network: nn.Module, config: LDTConfig, optimizer_factory: OptimizerFactory,
                 precision: Optional[MixedPrecision] = None, total_iters: Optional[int] = None,
                 graphs: Optional[GraphsFactory] = None) -> None:
        if config.ema_reference_iters is not None and total_iters is None:
            raise ValueError('LDT: ema_reference_iters rescales the EMA coefficients to the run: give total_iters')
        if total_iters is not None:
            config.check_run_length(total_iters)
        self.config = config
        #: Iterations of the whole run (warm-up, counted profiling, training), when the caller knows
        #: them: the EMA coefficients scale to it (``ema_reference_iters``) and horizons are checked.
        self.total_iters = total_iters
        #: The run length the partition's EMA coefficients were rescaled for (a resumed run may be longer).
        self.partition_total_iters = total_iters
        self.precision = precision or MixedPrecision()
        self.primary = network
        self.optimizer_factory = optimizer_factory
        self.graphs = graphs
        self.names: List[str] = [n for n, _ in network.named_parameters()]
        self.statistics: Optional[GradientStatistics] = None
        self.partition: Optional[Partition] = None
        self.pair: Optional[CrossFrozenPair] = None
        self.alternation: Optional[AlternatingFreezing] = None
        self.optimizers: Dict[str, torch.optim.Optimizer] = {}
        self.current_phase: Optional[str] = None
        self.last_iteration = 0
        self.dual_steps = 0
        #: The step the last :meth:`update` skipped for a non-finite loss ('warmup', 'profile',
        #: 'finetune', 'primary' or 'auxiliary'), or None when nothing was skipped.
        self.last_skipped: Optional[str] = None

    # -- the algorithm -------------------------------------------------------------------------
    def phase(self, iteration: int) -> str:
        """'warmup' for 1..head_warmup_iters, then 'profile' for profile_iters, then 'train'."""
        if iteration <= self.config.head_warmup_iters:
            return 'warmup'
        if iteration <= self.config.head_warmup_iters + self.config.counted_profile_iters:
            return 'profile'
        return 'train'

    def enter(self, iteration: int) -> str:
        """Start the phase of ``iteration`` without training (idempotent).

        Lets a caller see the new optimizers (to attach schedulers) and, on entering 'train',
        the partition, before the first step of the phase; :meth:`update` calls it too.
        """
        phase = self.phase(iteration)
        self._enter(phase)
        return phase

    def update(self, batch_loss: BatchLoss, iteration: int) -> Dict[str, float]:
        """One training iteration; returns the losses to log (none while profiling)."""
        if iteration <= self.last_iteration:
            raise ValueError(f'LDT.update: iteration {iteration} does not follow {self.last_iteration}')
        phase = self.enter(iteration)
        self.last_iteration = iteration
        self.last_skipped = None
        if phase == 'warmup':                                   # Alg. 1 lines 1-6: head only
            return self._single_step('warmup', batch_loss)
        if phase == 'profile':                                  # Alg. 1 line 8: no step
            self._profile_one(batch_loss)
            return {}
        if self.alternation is not None:                        # LDT-S: the active group trains
            group = self.alternation.active
            loss = self.alternation.step(batch_loss, self.precision)
            if not math.isfinite(loss):
                self.last_skipped = 'ldt_s'
            return {f'l_{group}': loss}
        if self.pair is None:                                   # FT / LP-FT / one group
            return self._single_step('finetune', batch_loss)
        losses, self.last_skipped = self.pair.step_both(batch_loss, self.precision)  # eq. 4-7: P's stable, A's unstable
        if self.last_skipped is not None:                       # a bad batch: no exchange either
            return losses
        self.dual_steps += 1
        if self.dual_steps % self.config.ema_every == 0:
            self.pair.exchange()                                # eq. 8 / 11 (DPU coefficients)
        return losses

    def _single_step(self, role: str, batch_loss: BatchLoss) -> Dict[str, float]:
        loss = optimizer_step(self.primary, self.optimizers[role], batch_loss, self.precision, role)
        if not math.isfinite(loss):
            self.last_skipped = role
        return {f'l_{role}': loss}

    def _profile_one(self, batch_loss: BatchLoss) -> None:
        """One profiling sample from true fp32 gradients (unscaled under fp16 loss scaling)."""
        self.primary.zero_grad(set_to_none=True)
        running = RunningStatistics(self.primary)
        with self.precision.autocast():
            loss = batch_loss(self.primary)
        if not finite_on_all_ranks(loss):
            running.restore()
            self.last_skipped = 'profile'
        elif self.precision.backward_unscaled(loss, self.primary.parameters(), 'profile'):
            self.statistics.accumulate_module(self.primary)
        self.primary.zero_grad(set_to_none=True)

    def profile(self, batch_losses: Iterable[BatchLoss]) -> int:
        """Profile every batch of ``batch_losses`` now, outside the iteration count
        (``profile_counts_in_total_iter: false``, as the official script); returns how many.

        Call it once, after warm-up and before the first training iteration.
        """
        if self.config.profile_counts_in_total_iter:
            raise ValueError('LDT.profile: profiling counts in the iterations here; update() profiles')
        self._enter('profile')
        count = 0
        for batch_loss in batch_losses:
            self._profile_one(batch_loss)
            count += 1
        return count

    def horizon_warnings(self) -> List[str]:
        """Groups whose slowest EMA averages over more exchanges than the run has left (call on entering
        'train'; empty without a partition or ``total_iters``): the trap ``ema_reference_iters`` removes."""
        if self.partition is None or self.total_iters is None or self.config.mode in ONE_GROUP_OR_NONE:
            return []
        remaining = self.config.run_exchanges(self.total_iters)
        if self.config.partition_file is not None:       # its coefficients are used as written
            remedy = (f"Lower the coefficients in {self.config.partition_file} (its 'coefficient' column), or train "
                      'longer')
        else:
            hint = ('200000 for the paper\'s coefficients, with ema_reference_every 10'
                    if self.config.partition == 'criterion' else '40000 for DeFT\'s beta, with ema_reference_every 1')
            remedy = (f'Set ldt.ema_reference_iters to the run length the coefficients were written for ({hint}) to '
                      'rescale them to this run')
        return horizon_warnings(self.partition, remaining, remedy)

    # -- results -------------------------------------------------------------------------------
    @property
    def auxiliary(self) -> Optional[nn.Module]:
        return None if self.pair is None else self.pair.auxiliary

    def composite_state_dict(self) -> Dict[str, torch.Tensor]:
        """Eq. 12 in dual training, its LDT-S analogue (EMA of both groups) in alternating
        training; the (single) primary network otherwise."""
        if self.alternation is not None:
            return self.alternation.composite_state_dict()
        if self.pair is None:
            return self.primary.state_dict()
        return self.pair.composite_state_dict()

    def composite(self) -> nn.Module:
        """A standalone copy of the network holding the composite weights (for validation/saving)."""
        return self.network('composite')

    def network(self, which: str = 'composite') -> nn.Module:
        """A standalone copy of the composite (eq. 12), the primary or the auxiliary branch; a branch
        that does not exist yet (before dual training) is the composite, i.e. the one network."""
        if which not in ('composite', 'primary', 'auxiliary'):
            raise ValueError(f"LDT.network: expected 'composite', 'primary' or 'auxiliary', got {which!r}")
        network = copy.deepcopy(self.primary)
        clear_routing(network)
        if which == 'composite' or self.pair is None:
            network.load_state_dict(self.composite_state_dict())
        else:
            network.load_state_dict(getattr(self.pair, which).state_dict())
        network.requires_grad_(True)
        return network

    # -- phases --------------------------------------------------------------------------------
    def _enter(self, phase: str, saved_partition: Optional[Partition] = None) -> None:
        if phase == self.current_phase:
            return
        start = -1 if self.current_phase is None else PHASES.index(self.current_phase)
        target = PHASES.index(phase)
        if target < start:
            raise ValueError(f'LDT: cannot go back from phase {self.current_phase} to {phase}')
        skipped = [p for p in PHASES[start + 1:target] if self._length(p) > 0]
        if skipped and self.current_phase is not None:
            raise ValueError(f'LDT: phase(s) {skipped} would be skipped; load the saved LDT state '
                             'when resuming')
        if skipped and saved_partition is None and 'profile' in skipped:
            raise ValueError('LDT: training would start without the profiling phase; resume with '
                             'LDT.load_state_dict or start at iteration 1')
        self.optimizers = {}
        self.pair = None
        self.alternation = None
        if phase == 'warmup':
            head = head_layers(self.names, self.config.head_patterns, type(self.primary).__name__)
            set_trainable(self.primary, set(head))
            self.optimizers['warmup'] = self.optimizer_factory(
                [p for n, p in self.primary.named_parameters() if n in set(head)], 'warmup')
        elif phase == 'profile':
            set_trainable(self.primary, set(self.names))
            device = next(self.primary.parameters()).device
            self.statistics = GradientStatistics(self.names, device=device, per_entry=self._per_entry())
        elif self.config.mode == 'single':
            set_trainable(self.primary, set(self.names))
            self.optimizers['finetune'] = self.optimizer_factory(list(self.primary.parameters()), 'finetune')
        elif self.config.mode == 'partial':                  # a control: the other group keeps the start
            self.partition = saved_partition or self._make_partition()
            self.statistics = None
            trained = set(getattr(self.partition, self.config.trained_group))
            set_trainable(self.primary, trained)
            self.optimizers['finetune'] = self.optimizer_factory(
                [p for n, p in self.primary.named_parameters() if n in trained], 'finetune')
        elif self.config.mode == 'alternating':
            self.partition = saved_partition or self._make_partition()
            self.statistics = None
            self.alternation = AlternatingFreezing(self.primary, self.partition, self.optimizer_factory,
                                                   self.config.interval_iters, self.config.ema_every,
                                                   self.config.first_group)
            self.optimizers = {'ldt_s': self.alternation.optimizer}
        else:
            self.partition = saved_partition or self._make_partition()
            self.statistics = None
            self.pair = CrossFrozenPair(self.primary, self.partition, self.optimizer_factory,
                                        self.config.buffers_from, self.config.overlap_branches,
                                        self.config.overlap_memory, self.graphs)
            self.optimizers = dict(self.pair.optimizers)
        self.current_phase = phase

    def _per_entry(self) -> bool:
        return self.config.criterion == 'sample_var'

    def _length(self, phase: str) -> int:
        return {'warmup': self.config.head_warmup_iters, 'profile': self.config.counted_profile_iters}.get(phase, 0)

    def _make_partition(self) -> Partition:
        cfg = self.config
        if cfg.partition_file is not None:
            return Partition.load(cfg.partition_file, self.names)
        values = None
        if cfg.needs_profiling() and not cfg.profile_counts_in_total_iter and not (
                self.statistics is not None and self.statistics.samples):
            raise ValueError('LDT: profiling runs outside the iteration count here: call LDT.profile(...) '
                             'before the first training iteration')
        if self.statistics is not None and self.statistics.samples:
            values = all_reduce_statistics(self.statistics).criterion(cfg.criterion, cfg.seed)
        elif cfg.criterion == 'random':
            values = random_statistic(len(self.names), cfg.seed)
        partition = build_partition(
            self.names, values, partition=cfg.partition, ratio_u=cfg.ratio_u, ratio_s=cfg.ratio_s,
            head_patterns=cfg.head_patterns, deft_grouping=cfg.deft_grouping, force_stable=cfg.force_stable,
            force_unstable=cfg.force_unstable, dpu=cfg.dpu and values is not None, w_base_stable=cfg.w_base_stable,
            r_base_stable=cfg.r_base_stable, w_base_unstable=cfg.w_base_unstable,
            r_base_unstable=cfg.r_base_unstable, w_fixed=cfg.w_fixed, criterion=cfg.criterion,
            network=type(self.primary).__name__)
        reference = cfg.reference_exchanges()
        if reference is None:
            return partition
        # scaled eq. 8/10/11: W' = 1 - (1 - W) E_ref / E_run per layer (ema_horizon)
        return scale_partition(partition, reference, cfg.run_exchanges(self.total_iters))

    # -- resume --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue bit-exactly in any phase (weights_only-loadable)."""
        return {
            'format': STATE_FORMAT, 'config': self.config.to_dict(), 'phase': self.current_phase,
            'last_iteration': self.last_iteration, 'dual_steps': self.dual_steps,
            'primary': self.primary.state_dict(),
            'auxiliary': None if self.pair is None else self.pair.auxiliary.state_dict(),
            'alternation': None if self.alternation is None else self.alternation.state_dict(),
            'statistics': None if self.statistics is None else self.statistics.state_dict(),
            'partition': None if self.partition is None else self.partition.to_dict(),
            'optimizers': {k: o.state_dict() for k, o in self.optimizers.items()},
            'precision': self.precision.state_dict(),
            'total_iters': self.partition_total_iters,
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get('format') != STATE_FORMAT:
            raise ValueError(f"LDT state has format {state.get('format')!r}, expected {STATE_FORMAT}")
        ours = self.config.to_dict()
        # options added after a state was written count as their defaults
        saved = {**LDTConfig().to_dict(), **state['config']}
        changed = sorted(k for k in set(ours) | set(saved)
                         if ours.get(k) != saved.get(k) and k not in EXECUTION_OPTIONS)
        if changed:
            raise ValueError(f'LDT state was saved with different options: {changed} '
                             f"(saved {[saved.get(k) for k in changed]}, now {[ours.get(k) for k in changed]})")
        self.primary.load_state_dict(state['primary'])
        self.current_phase, self.pair, self.alternation, self.optimizers = None, None, None, {}
        self.partition = None if state['partition'] is None else Partition.from_dict(state['partition'])
        # a state written before this was recorded: the run length it was rescaled for is unknown
        self.partition_total_iters = state.get('total_iters', self.total_iters) if self.partition else self.total_iters
        if state['phase'] is not None:
            self._enter(state['phase'], saved_partition=self.partition)
        if state['statistics'] is not None:
            self.statistics = GradientStatistics(self.names, device=next(self.primary.parameters()).device,
                                                 per_entry=self._per_entry())
            self.statistics.load_state_dict(state['statistics'])
        if self.pair is not None:
            self.pair.auxiliary.load_state_dict(state['auxiliary'])
        if self.alternation is not None:
            self.alternation.load_state_dict(state['alternation'])
        for key, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state['optimizers'][key])
        self.precision.load_state_dict(state.get('precision') or {})
        self.last_iteration = int(state['last_iteration'])
        self.dual_steps = int(state['dual_steps'])
