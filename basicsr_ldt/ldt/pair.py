"""The cross-frozen primary/auxiliary pair (paper section 2.3.3, Algorithm 2).

Cost discipline, so a dual step stays close to one fine-tuning step: frozen tensors have
``requires_grad=False`` (their weight gradients are never computed, see ``freezing``), each
branch's optimizer holds state only for its trainable tensors, a branch's graph is freed by its
backward and its gradients are dropped (``set_to_none``) before the other branch runs forward,
and the EMA exchange is one fused foreach op under ``no_grad``.
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from basicsr_ldt.ldt.equations import composite_state, ema_exchange_
from basicsr_ldt.ldt.freezing import set_trainable
from basicsr_ldt.ldt.partition import Partition
from basicsr_ldt.ldt.precision import MixedPrecision, RunningStatistics, reported_loss, several_ranks

BatchLoss = Callable[[nn.Module], torch.Tensor]
# (trainable parameters, role) -> optimizer; role is 'warmup', 'finetune', 'primary' or
# 'auxiliary', so a caller can attach LR schedulers or per-role options.
OptimizerFactory = Callable[[List[nn.Parameter], str], torch.optim.Optimizer]


def trainable_parameters(module: nn.Module) -> List[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def optimizer_step(network: nn.Module, optimizer: torch.optim.Optimizer, batch_loss: BatchLoss,
                   precision: Optional[MixedPrecision] = None, key: str = 'train', synchronise: bool = True) -> float:
    """One forward/backward/step of one network; its graph and gradients are gone on return.

    Returns the loss. A non-finite loss (on any rank) skips the step (its gradients are dropped)
    and is returned as it is (NaN on ranks whose own loss was finite), so ``math.isfinite`` of
    the result tells the caller whether the network changed. ``synchronise=False`` leaves gradient
    averaging to a DDP wrapper.
    """
    precision = precision or MixedPrecision()
    optimizer.zero_grad(set_to_none=True)
    running = RunningStatistics(network)
    with precision.autocast():
        loss = batch_loss(network)
    # Backward first, then one host sync reads the loss for the check and the report: checking
    # before backward stopped the CPU until a GPU had run the forward, and reading the loss after
    # the step was a second sync. A non-finite loss costs one backward whose gradients are dropped.
    precision.backward(loss, key)
    value = reported_loss(loss)
    if math.isfinite(value):
        if synchronise:
            average_gradients(optimizer)
        precision.step(optimizer, key)
    else:
        running.restore()
    optimizer.zero_grad(set_to_none=True)
    return value


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
                 buffers_from: str = 'primary') -> None:
        names = [n for n, _ in primary.named_parameters()]
        partition.validate(names)
        self.partition = partition
        self.buffers_from = buffers_from
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

    def step(self, branch: str, batch_loss: BatchLoss, precision: Optional[MixedPrecision] = None) -> float:
        """Eq. 4-7 for one branch: forward, loss, gradients of its trainable layers, update
        (skipped, and the loss returned non-finite, when the loss is not finite)."""
        network = self.primary if branch == 'primary' else self.auxiliary
        if branch == 'auxiliary' and self.auxiliary.training != self.primary.training:
            self.auxiliary.train(self.primary.training)   # a walk over every module: only on a change
        return optimizer_step(network, self.optimizers[branch], batch_loss, precision, branch)

    def exchange(self) -> None:
        """Eq. 8 / 11 for all frozen tensors of both branches at once."""
        ema_exchange_(self._frozen, self._trained, self._coefficients)

    def composite_state_dict(self) -> Dict[str, torch.Tensor]:
        """Eq. 12 (tensors are shared with the branches; copy before mutating)."""
        return composite_state(self.primary.state_dict(), self.auxiliary.state_dict(),
                               self.partition.groups, self.buffers_from)
