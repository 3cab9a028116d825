"""The cross-frozen primary/auxiliary pair (paper section 2.3.3, Algorithm 2).

Cost discipline, so a dual step stays close to one fine-tuning step: frozen tensors have
``requires_grad=False`` (their weight gradients are never computed, see ``freezing``), each
branch's optimizer holds state only for its trainable tensors, a branch's graph is freed by its
backward before the other branch runs forward, and the EMA exchange is one fused foreach op under
``no_grad``. The losses are read (a host sync on a GPU) once both backward passes are queued, so the
host queues the auxiliary's forward while the GPU still runs the primary's backward; the price is
the primary's gradients (its trainable layers only), kept until then. The updates follow, P's first.

``overlap_branches`` also runs the auxiliary's forward while the primary's backward runs on the host
(``overlap``: a helper thread, a CUDA stream per branch, optionally a memory bound): every random
draw and update keeps the order above, so the results are the same. With ``graphs``
(``train.cuda_graph``) each branch's forward and backward is instead replayed as a CUDA graph, one
branch after the other, both graphs in one memory pool; or, where the branches overlap without a
memory bound, both branches side by side in one graph, a CUDA stream each (``step_graph``).
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn

from basicsr_ldt.ldt.config import OVERLAP_AUTO
from basicsr_ldt.ldt.equations import composite_state, ema_exchange_
from basicsr_ldt.ldt.freezing import set_trainable
from basicsr_ldt.ldt.overlap import BRANCHES, OverlappedBranches
from basicsr_ldt.ldt.partition import Partition
from basicsr_ldt.ldt.precision import MixedPrecision, RunningStatistics, reported_loss, several_ranks
from basicsr_ldt.ldt.step_graph import BatchTerms, GraphsFactory, StepGraph

BatchLoss = Callable[[nn.Module], torch.Tensor]
# (trainable parameters, role) -> optimizer; role is 'warmup', 'finetune', 'primary' or
# 'auxiliary', so a caller can attach LR schedulers or per-role options.
OptimizerFactory = Callable[[List[nn.Parameter], str], torch.optim.Optimizer]


def trainable_parameters(module: nn.Module) -> List[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def optimizer_step(network: nn.Module, optimizer: torch.optim.Optimizer, batch_loss: BatchLoss,
                   precision: Optional[MixedPrecision] = None, key: str = 'train', synchronise: bool = True,
                   graph: Optional[StepGraph] = None) -> float:
    """One forward/backward/step of one network; its graph and gradients are gone on return.

    Returns the loss. A non-finite loss (on any rank) skips the step (its gradients are dropped)
    and is returned as it is (NaN on ranks whose own loss was finite), so ``math.isfinite`` of
    the result tells the caller whether the network changed. ``synchronise=False`` leaves gradient
    averaging to a DDP wrapper. With ``graph`` and a :class:`BatchTerms` loss, forward and
    backward are that graph's replay whenever it can replay (``step_graph``).
    """
    return started_step(network, optimizer, batch_loss, precision or MixedPrecision(), key, graph).finish(synchronise)


def started_step(network: nn.Module, optimizer: torch.optim.Optimizer, batch_loss: BatchLoss,
                 precision: MixedPrecision, key: str, graph: Optional[StepGraph] = None) -> 'PendingStep':
    """A step's forward and backward (``graph``'s replay when it can replay), not yet checked or applied."""
    return started_steps({key: network}, {key: optimizer}, batch_loss, precision, graph)[key]


def started_steps(networks: Dict[str, nn.Module], optimizers: Dict[str, torch.optim.Optimizer], batch_loss: BatchLoss,
                  precision: MixedPrecision, graph: Optional[StepGraph] = None) -> Dict[str, 'PendingStep']:
    """Each network's step on the batch, keyed as given (the key names its precision scaler): one replay
    of ``graph``, which steps them all, when it can replay; else each one's forward and backward in turn."""
    if graph is not None and isinstance(batch_loss, BatchTerms):
        replayed = ReplayedStep.all_of(graph, networks, optimizers, batch_loss, precision)
        if replayed is not None:
            return replayed
    steps = {}
    for key, network in networks.items():
        steps[key] = PendingStep(network, optimizers[key], batch_loss, precision, key)
        steps[key].backward()
    return steps


class PendingStep:
    """One network's step, split where the dual step can overlap two of them: built = forward and
    loss, then :meth:`backward`, then :meth:`finish` (check, update) or :meth:`discard`."""

    def __init__(self, network: nn.Module, optimizer: torch.optim.Optimizer, batch_loss: BatchLoss,
                 precision: MixedPrecision, key: str) -> None:
        self.optimizer, self.precision, self.key = optimizer, precision, key
        optimizer.zero_grad(set_to_none=True)
        self.running = RunningStatistics(network)
        with precision.autocast():
            self.loss = batch_loss(network)

    def backward(self) -> None:
        # Backward first, then one host sync reads the loss for the check and the report: checking
        # before backward stopped the CPU until a GPU had run the forward, and reading the loss after
        # the step was a second sync. A non-finite loss costs one backward whose gradients are dropped.
        self.precision.backward(self.loss, self.key)

    def finish(self, synchronise: bool = True) -> float:
        """Read the loss; update when it is finite on every rank, else :meth:`discard`."""
        value = reported_loss(self.loss)
        if math.isfinite(value):
            if synchronise:
                average_gradients(self.optimizer)
            self.precision.step(self.optimizer, self.key)
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.discard()
        return value

    def discard(self) -> None:
        """Leave the network as it was: gradients dropped, batch-norm statistics put back."""
        self.running.restore()
        self.optimizer.zero_grad(set_to_none=True)


class ReplayedStep(PendingStep):
    """A step whose forward and backward were one replay of a :class:`StepGraph`."""

    def __init__(self, optimizer: torch.optim.Optimizer, precision: MixedPrecision, key: str,
                 running: RunningStatistics, loss: torch.Tensor) -> None:   # no forward here: the replay ran it
        self.optimizer, self.precision, self.key, self.running, self.loss = optimizer, precision, key, running, loss

    @classmethod
    def all_of(cls, graph: StepGraph, networks: Dict[str, nn.Module], optimizers: Dict[str, torch.optim.Optimizer],
               batch: BatchTerms, precision: MixedPrecision) -> Optional[Dict[str, 'ReplayedStep']]:
        """The steps of ``graph``'s networks (given in its order) replayed, or None when ``graph`` says this
        step runs eager."""
        assert [id(n) for n in networks.values()] == [id(n) for n in graph.networks], 'not the networks of the graph'
        running = {key: RunningStatistics(network) for key, network in networks.items()}
        losses = graph.run(batch, precision)
        return None if losses is None else {key: cls(optimizers[key], precision, key, running[key], loss)
                                            for key, loss in zip(networks, losses)}

    def backward(self) -> None:
        """Done: the replay ran it."""


def average_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Average gradients over ranks (one flat all-reduce) when a process group is running.

    The branches are plain modules (no DDP wrapper: a DDP module cannot be deep-copied into an
    auxiliary branch), so gradient synchronisation is done here.
    """
    if not several_ranks():
        return
    grads = [p.grad for group in optimizer.param_groups for p in group['params'] if p.grad is not None]
    if not grads:
        return
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat.div_(dist.get_world_size())
    for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
        g.copy_(synced)


class CrossFrozenPair:
    """Primary P (unstable frozen) and auxiliary A = copy of P (stable frozen).

    ``primary`` is used in place (the caller's network object becomes P), so code holding it
    (e.g. BasicSR's ``net_g``) keeps a valid reference.
    """

    def __init__(self, primary: nn.Module, partition: Partition, optimizer_factory: OptimizerFactory,
                 buffers_from: str = 'primary', overlap_branches: Union[bool, str] = False,
                 overlap_memory: Optional[float] = None, graphs: Optional[GraphsFactory] = None) -> None:
        names = [n for n, _ in primary.named_parameters()]
        partition.validate(names)
        self.partition = partition
        self.buffers_from = buffers_from
        self.overlap_branches = overlap_branches
        self.overlap_memory = overlap_memory
        self.primary = primary
        self.auxiliary = copy.deepcopy(primary)
        stable, unstable = partition.stable, partition.unstable
        set_trainable(self.primary, set(stable))        # P = Cat{PL^S, ~PL^U}  (eq. 4)
        set_trainable(self.auxiliary, set(unstable))    # A = Cat{~AL^S, AL^U}  (eq. 5)
        self.optimizers: Dict[str, torch.optim.Optimizer] = {
            'primary': optimizer_factory(trainable_parameters(self.primary), 'primary'),
            'auxiliary': optimizer_factory(trainable_parameters(self.auxiliary), 'auxiliary'),
        }
        p, a = dict(self.primary.named_parameters()), dict(self.auxiliary.named_parameters())
        w = partition.dpu_coefficients
        # frozen stable of A <- P's stable ; frozen unstable of P <- A's unstable (eq. 8 / 11)
        self._frozen = [a[n] for n in stable] + [p[n] for n in unstable]
        self._trained = [p[n] for n in stable] + [a[n] for n in unstable]
        self._coefficients = [w[n] for n in stable] + [w[n] for n in unstable]
        self._overlap: Optional[OverlappedBranches] = None
        #: Each branch's step graph (``train.cuda_graph``), recorded into one pool; None: eager steps.
        #: Side by side, one graph of both is under both names.
        self.graphs: Optional[Dict[str, StepGraph]] = None if graphs is None else graphs(
            {'primary': self.primary, 'auxiliary': self.auxiliary}, side_by_side=self._overlap_wanted()
            and self.overlap_memory is None)

    def network(self, branch: str) -> nn.Module:
        """The branch's network, the auxiliary first put in the primary's train/eval mode (the SR
        model switches only the primary, for validation)."""
        if branch == 'auxiliary' and self.auxiliary.training != self.primary.training:
            self.auxiliary.train(self.primary.training)   # a walk over every module: only on a change
        return self.primary if branch == 'primary' else self.auxiliary

    def step(self, branch: str, batch_loss: BatchLoss, precision: Optional[MixedPrecision] = None) -> float:
        """Eq. 4-7 for one branch: forward, loss, gradients of its trainable layers, update
        (skipped, and the loss returned non-finite, when the loss is not finite)."""
        return optimizer_step(self.network(branch), self.optimizers[branch], batch_loss, precision, branch)

    def step_both(self, batch_loss: BatchLoss, precision: Optional[MixedPrecision] = None
                  ) -> Tuple[Dict[str, float], Optional[str]]:
        """Eq. 4-7 for P, then for A, on one batch: the losses, and the branch whose non-finite loss
        ended the step (None when both updated). After a skipped primary the auxiliary has not
        changed, as if it had not run."""
        precision = precision or MixedPrecision()
        if self.overlaps():
            return self._step_overlapped(batch_loss, precision)
        graphs = self.graphs or {}
        pending: Dict[str, PendingStep] = {}
        for branch in BRANCHES:        # forward, backward; P's graph is gone before A's forward
            if branch in pending:      # stepped by P's graph, which holds both branches side by side
                continue
            graph = graphs.get(branch)
            stepped = [b for b in BRANCHES if graphs.get(b) is graph] if graph is not None else [branch]
            pending.update(started_steps({b: self.network(b) for b in stepped}, self.optimizers, batch_loss,
                                         precision, graph))
        return _finish_in_order(pending)

    def overlaps(self) -> bool:
        """Whether :meth:`step_both` overlaps the branches. 'auto' does on a CUDA device, where the overlap
        was measured faster (docs/results.md); on a CPU both branches would share the same cores. Never
        with step graphs: a replay is one launch, which leaves no host work to overlap (side by side in one
        graph, the GPU overlaps them)."""
        return self.graphs is None and self._overlap_wanted()

    def _overlap_wanted(self) -> bool:
        if self.overlap_branches == OVERLAP_AUTO:
            return self._on_cuda()
        return bool(self.overlap_branches)

    def _on_cuda(self) -> bool:
        return next(self.auxiliary.parameters()).device.type == 'cuda'

    def schedule(self) -> str:
        """How :meth:`step_both` runs the branches, in words for the training log (what 'auto' chose)."""
        if self.graphs is not None and self.graphs['primary'] is self.graphs['auxiliary']:
            return ('branches side by side in one CUDA graph after their first steps, a stream each (no memory bound: '
                    'ldt.overlap_memory is null)')
        if self.graphs is not None:
            bounded = ', as ldt.overlap_memory bounds their overlap' if self._overlap_wanted() else ''
            return f'branches one after the other, each replayed as a CUDA graph after its first steps (one memory pool){bounded}'
        if not self.overlaps():
            return 'branches one after the other'
        if not self._on_cuda():
            return 'branches overlapped (a helper thread; no memory bound off CUDA)'
        bound = ('no memory bound' if self.overlap_memory is None else
                 f'the auxiliary forward held while the GPU holds over x{self.overlap_memory:g} its memory at the '
                 'primary backward start')
        return f'branches overlapped on two CUDA streams, {bound}'

    def _forward(self, branch: str, batch_loss: BatchLoss, precision: MixedPrecision) -> PendingStep:
        return PendingStep(self.network(branch), self.optimizers[branch], batch_loss, precision, branch)

    def _step_overlapped(self, batch_loss: BatchLoss, precision: MixedPrecision
                         ) -> Tuple[Dict[str, float], Optional[str]]:
        """P's backward on a helper thread while this thread runs A's forward and backward
        (``overlap``); the updates then run as in the sequential step."""
        if self._overlap is None:
            self._overlap = OverlappedBranches(self.auxiliary)
        primary, auxiliary = self._overlap.run(lambda: self._forward('primary', batch_loss, precision),
                                               lambda: self._forward('auxiliary', batch_loss, precision),
                                               self.overlap_memory)
        return _finish_in_order({'primary': primary, 'auxiliary': auxiliary})

    def exchange(self) -> None:
        """Eq. 8 / 11 for all frozen tensors of both branches at once."""
        ema_exchange_(self._frozen, self._trained, self._coefficients)

    def composite_state_dict(self) -> Dict[str, torch.Tensor]:
        """Eq. 12 (tensors are shared with the branches; copy before mutating)."""
        return composite_state(self.primary.state_dict(), self.auxiliary.state_dict(),
                               self.partition.groups, self.buffers_from)


def _finish_in_order(pending: Dict[str, PendingStep]) -> Tuple[Dict[str, float], Optional[str]]:
    """P's check and update, then A's; a non-finite P loss discards A's step as if A had not run."""
    losses = {'l_primary': pending['primary'].finish()}
    if not math.isfinite(losses['l_primary']):
        pending['auxiliary'].discard()
        return losses, 'primary'
    losses['l_auxiliary'] = pending['auxiliary'].finish()
    return losses, None if math.isfinite(losses['l_auxiliary']) else 'auxiliary'
