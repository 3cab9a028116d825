"""LDT-S: the single-network variant of LDT (paper appendix, as the summary describes it).

One network instead of the cross-frozen pair: the stable and unstable groups train in turn, one
interval of ``interval_iters`` iterations each, while the other group is frozen; a weight
buffer in CPU memory holds what the pair would keep in its second network. Training cost is
that of fine-tuning the active group (frozen tensors get no gradient), plus a host copy of the
active group every ``ema_every`` iterations (and at each interval's end) and a swap of
device/buffer contents per interval.

The summary only says "alternately freezes stable and unstable layers across time intervals
within one network, using a CPU weight buffer". Everything else is chosen to stay as close to
LDT (``pair.CrossFrozenPair``) as one network allows:

- **Frozen = EMA weights.** In LDT the primary trains its stable layers next to *frozen, EMA'd*
  unstable layers (eq. 4, 8) and the auxiliary trains its unstable layers next to frozen, EMA'd
  stable layers (eq. 5, 8). So here the device holds the active group's trained weights and the
  frozen group's EMA weights; the buffer holds the active group's EMA and the frozen group's
  trained weights (parked until its next interval).
- **EMA (eq. 8 / 11).** Every ``ema_every`` iterations *counted within the interval*, and at
  the last iteration of every interval, the active group's EMA absorbs its trained weights with
  the partition's coefficients (DPU, eq. 9-10, or ``w_fixed``). So every exchange updates the
  EMA of the group that trained since the previous exchange, and each group's EMA has absorbed
  its last interval before the swap puts that EMA on the device, whatever ``interval_iters`` and
  ``ema_every`` are. (Counting ``ema_every`` over the whole run instead made every exchange land
  in the unstable group's intervals when ``ema_every`` is an even multiple of
  ``interval_iters``, e.g. 5/10 or 10/20: the stable EMA never moved and the final network kept
  its starting stable layers.) The frozen group's trained weights do not change, so its EMA
  does not move either (LDT updates both because both branches train at once).
- **Swap.** At the end of an interval device and buffer exchange their contents tensor by tensor:
  the group that trained parks its weights and gets its EMA on the device, the group that was
  frozen gets its trained weights back. The next interval trains the other group.
- **Optimizer.** One optimizer over all parameters (role ``ldt_s``): a frozen tensor has no
  gradient, so the optimizer skips it and its moments wait, matching the parked weights; this is
  also the memory of fine-tuning's optimizer.
- **Composite (eq. 12).** MC = Cat{EMA of stable, EMA of unstable}, the analogue of LDT's
  Cat{~AL^S, ~PL^U}; buffers (BatchNorm statistics) come from the network.
- ``first_group`` (default ``stable``, LDT's primary) trains in the first interval.

Host buffer and copies. The buffer is host memory, pinned when the network is on CUDA (pinned
pages make the copies asynchronous DMA transfers). On CUDA the EMA runs on the device, a slice of
at most :data:`STAGING_BYTES` of the buffer at a time: the slice comes to the device
(``non_blocking``), the fused foreach lerp runs there and the result goes back (``non_blocking``);
the swap brings each tensor's buffer to the device and parks the device tensor the same way. All
of it is in stream order, so no host sync per step. A CUDA event recorded after the last copy is
waited for by the host before it reads or writes the buffer (``state_dict``,
``composite_state_dict``, ``load_state_dict``), and by the device (no host sync) before the next
exchange or swap, in case the caller changed streams. A network on the CPU has no event and does
the EMA in place in the buffer (staging copies cost allocations there and save nothing); the
staged lines give bitwise the same result, which the tests check on the CPU with a stand-in event.
"""
from __future__ import annotations

import math
from typing import Dict, Iterator, List, Optional, Sequence

import torch
from torch import nn

from basicsr_ldt.ldt.equations import STABLE, UNSTABLE, ema_exchange_
from basicsr_ldt.ldt.freezing import set_trainable
from basicsr_ldt.ldt.pair import BatchLoss, OptimizerFactory, optimizer_step
from basicsr_ldt.ldt.partition import Partition
from basicsr_ldt.ldt.precision import MixedPrecision

GROUPS = (STABLE, UNSTABLE)
#: Most bytes of the buffer on the device at once during an exchange or swap (one tensor larger
#: than this goes alone).
STAGING_BYTES = 32 * 2 ** 20


class AlternatingFreezing:
    """One network whose stable and unstable groups train in turn (LDT-S); see the module docstring."""

    def __init__(self, network: nn.Module, partition: Partition, optimizer_factory: OptimizerFactory,
                 interval_iters: int, ema_every: int, first_group: str = STABLE) -> None:
        names = [n for n, _ in network.named_parameters()]
        partition.validate(names)
        if first_group not in GROUPS:
            raise ValueError(f"first_group must be one of {GROUPS}, got {first_group!r}")
        self.network = network
        self.partition = partition
        self.interval_iters = int(interval_iters)
        self.ema_every = int(ema_every)
        self.steps = 0
        self.active = first_group
        params = dict(network.named_parameters())
        coefficients = partition.dpu_coefficients
        self._names = {STABLE: partition.stable, UNSTABLE: partition.unstable}
        self._params = {g: [params[n] for n in self._names[g]] for g in GROUPS}
        self._coefficients = {g: [coefficients[n] for n in self._names[g]] for g in GROUPS}
        cuda = _on_cuda(list(params.values()))
        # buffer[g]: EMA of g while g is active, g's parked trained weights while it is frozen.
        # At the start both equal the network's weights (EMA initialised with the weights).
        self.buffer: Dict[str, List[torch.Tensor]] = {
            g: [_host_copy(p, pin=cuda) for p in self._params[g]] for g in GROUPS}
        self._copies = _copy_event(cuda)        # recorded after the last copy into the buffer
        self._copies_pending = False
        self.optimizer = optimizer_factory(list(network.parameters()), 'ldt_s')
        self._freeze()

    @property
    def frozen(self) -> str:
        return UNSTABLE if self.active == STABLE else STABLE

    def step(self, batch_loss: BatchLoss, precision: Optional[MixedPrecision] = None) -> float:
        """One iteration: eq. 6-7 for the active group, EMA (eq. 8/11) every ``ema_every``
        iterations of the interval and at its end, then the swap at the end of an interval. A
        non-finite loss (returned as is) skips the step and is not counted, so neither EMA nor
        swap moves for it."""
        loss = optimizer_step(self.network, self.optimizer, batch_loss, precision, 'ldt_s')
        if not math.isfinite(loss):
            return loss
        self.steps += 1
        within = (self.steps - 1) % self.interval_iters + 1            # iteration within the interval
        if within % self.ema_every == 0 or within == self.interval_iters:
            self.exchange()
        if within == self.interval_iters:
            self.swap()
        return loss

    @torch.no_grad()
    def exchange(self) -> None:
        """Eq. 8/11 for the active group: its EMA (in the buffer) absorbs its trained weights;
        on CUDA computed on the device one slice at a time (see the module docstring)."""
        group = self.active
        if self._copies is None:   # network not on CUDA: the EMA in place in the host buffer
            trained = [p.detach() if p.device == b.device else p.detach().to(b.device)
                       for p, b in zip(self._params[group], self.buffer[group])]
            ema_exchange_(self.buffer[group], trained, self._coefficients[group])
            return
        self._device_waits_for_copies()
        for part in self._slices(group):
            params = [self._params[group][i] for i in part]
            host = [self.buffer[group][i] for i in part]
            ema = [b.to(p.device, non_blocking=True, copy=True) for b, p in zip(host, params)]
            ema_exchange_(ema, [p.detach() for p in params], [self._coefficients[group][i] for i in part])
            for b, e in zip(host, ema):
                b.copy_(e, non_blocking=True)
        self._record_copies()

    @torch.no_grad()
    def swap(self) -> None:
        """Exchange device and buffer contents of every layer, then train the other group."""
        fenced = self._copies is not None      # asynchronous copies only where an event orders them
        self._device_waits_for_copies()
        for group in GROUPS:
            for p, b in zip(self._params[group], self.buffer[group]):
                incoming = b.to(p.device, non_blocking=fenced, copy=True)
                b.copy_(p.detach(), non_blocking=fenced)   # stream order: after the read of b
                p.copy_(incoming)
        self._record_copies()
        self.active = self.frozen
        self._freeze()

    def _slices(self, group: str) -> Iterator[List[int]]:
        """Indices of ``group``'s tensors in runs of at most STAGING_BYTES (one larger tensor alone)."""
        part: List[int] = []
        size = 0
        for i, b in enumerate(self.buffer[group]):
            nbytes = b.numel() * b.element_size()
            if part and size + nbytes > STAGING_BYTES:
                yield part
                part, size = [], 0
            part.append(i)
            size += nbytes
        if part:
            yield part

    def _record_copies(self) -> None:
        if self._copies is not None:
            self._copies.record()
            self._copies_pending = True

    def _device_waits_for_copies(self) -> None:
        """The current stream waits (no host sync) for the last copies, wherever they were issued."""
        if self._copies_pending:
            self._copies.wait()

    def _host_waits_for_copies(self) -> None:
        """Host sync: the buffer holds its final values and no copy reads it any more."""
        if self._copies_pending:
            self._copies.synchronize()
            self._copies_pending = False

    def _freeze(self) -> None:
        set_trainable(self.network, set(self._names[self.active]))

    def composite_state_dict(self) -> Dict[str, torch.Tensor]:
        """MC = Cat{EMA of stable, EMA of unstable} (eq. 12 analogue); tensors are shared."""
        self._host_waits_for_copies()
        state = dict(self.network.state_dict())
        for name, tensor in zip(self._names[self.active], self.buffer[self.active]):
            state[name] = tensor
        return state

    def state_dict(self) -> dict:
        self._host_waits_for_copies()
        return {'steps': self.steps, 'active': self.active,
                'buffer': {g: [t.clone() for t in self.buffer[g]] for g in GROUPS}}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        self._host_waits_for_copies()
        for group in GROUPS:
            saved = state['buffer'][group]
            if len(saved) != len(self.buffer[group]):
                raise ValueError(f'LDT-S state: {len(saved)} {group} buffer tensors, expected {len(self.buffer[group])}')
            for b, t in zip(self.buffer[group], saved):
                b.copy_(t)
        self.steps = int(state['steps'])
        self.active = str(state['active'])
        self._freeze()


def _on_cuda(params: Sequence[torch.Tensor]) -> bool:
    """Whether the network is on CUDA: then the buffer is pinned and copies are fenced by an event."""
    return any(p.is_cuda for p in params) and torch.cuda.is_available()


def _copy_event(cuda: bool) -> Optional[torch.cuda.Event]:
    """The event that orders host access to the buffer after the device's copies (CUDA only)."""
    return torch.cuda.Event() if cuda else None


def _host_copy(tensor: torch.Tensor, pin: bool) -> torch.Tensor:
    out = torch.empty(tensor.shape, dtype=tensor.dtype, device='cpu', pin_memory=pin)
    return out.copy_(tensor.detach())
