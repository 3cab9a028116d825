"""Mixed precision and non-finite-loss guarding for LDT steps, in plain PyTorch.

Autocast runs the forward pass and the loss in bf16/fp16 while parameters, their gradients,
optimizer state, profiling statistics (float64), DPU coefficients and the EMA exchange stay in
fp32: autocast never changes a parameter's dtype, so ``.grad`` of an fp32 parameter is fp32.

fp16 needs loss scaling (small gradients underflow in float16). There is one ``GradScaler``
per optimizer key ('warmup', 'finetune', 'primary', 'auxiliary'; 'profile' for profiling):
the primary and auxiliary branches train disjoint layers with different gradient magnitudes,
and an overflow in one branch must not lower the other's scale or skip its step. Profiling has
no optimizer: its scaler unscales and checks the gradients through a stand-in whose "step" is
"use this sample", so the statistics see true gradients, a sample whose scaled gradients
overflowed is left out, and the scale backs off and grows exactly as in training, with one host
sync per sample. bf16 has fp32's exponent range and needs no scaler.

A non-finite loss skips its step: no optimizer step (a training step runs ``backward`` first
and drops its gradients, so the loss is read once, with the step's one host sync, for the check
and the report; a profiling sample is checked before ``backward``), no statistics, and the
caller skips the EMA/DPU exchange; batch-norm running statistics the forward pass already
updated are put back (:class:`RunningStatistics`), so a corrupted batch leaves no trace. The
decision is taken on all ranks together (one tiny all-reduce), so that every rank skips the
same steps and runs the same collectives (a rank that skipped a ``backward`` another rank ran
would deadlock the gradient all-reduce).
"""
from __future__ import annotations

import contextlib
import math
import weakref
from typing import ContextManager, Dict, Iterable, List, Mapping, Optional

import torch
import torch.distributed as dist
from torch import nn

#: ``train: amp`` values and the autocast dtype each selects.
AMP_DTYPES: Dict[str, Optional[torch.dtype]] = {'none': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}
#: ``test: precision`` values.
INFERENCE_DTYPES: Dict[str, Optional[torch.dtype]] = {'fp32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}


def resolve_dtype(key: str, value: object, choices: Mapping[str, Optional[torch.dtype]],
                  device_type: str) -> Optional[torch.dtype]:
    """The autocast dtype an option value names, or ``None`` for full precision.

    Raises ``ValueError`` naming ``key`` for an unknown value, for fp16 off CUDA (fp16 training
    and inference are for GPUs: CPUs have no fast fp16 path; tests run the fp16 code on the CPU
    by building ``MixedPrecision(torch.float16, 'cpu')`` directly) and for bf16 on a GPU without
    bf16 support.
    """
    if value not in choices:
        raise ValueError(f"{key}: expected one of {', '.join(map(repr, choices))}, got {value!r}")
    dtype = choices[value]
    if dtype is torch.float16 and device_type != 'cuda':
        raise ValueError(f'{key}: fp16 needs a CUDA device and this run is on the {device_type.upper()}; '
                         f"use bf16 or {next(iter(choices))}")
    if dtype is torch.bfloat16 and device_type == 'cuda' and not torch.cuda.is_bf16_supported():
        raise ValueError(f'{key}: this GPU has no bfloat16 support; use fp16 or {next(iter(choices))}')
    return dtype


def autocast(device_type: str, dtype: Optional[torch.dtype], cache: bool = True) -> ContextManager:
    """``torch.autocast`` for ``dtype``, or a no-op context for full precision. ``cache=False``
    turns off autocast's cache of cast weights, which a CUDA graph recording must not use."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype, cache_enabled=cache)


class MixedPrecision:
    """Autocast dtype plus one lazily created ``GradScaler`` per optimizer key (fp16 only).

    ``dtype`` None is full precision: every method is then a no-op, so callers need no branch.
    """

    def __init__(self, dtype: Optional[torch.dtype] = None, device_type: str = 'cpu') -> None:
        self.dtype = dtype
        self.device_type = device_type
        self._scalers: Dict[str, torch.amp.GradScaler] = {}

    def autocast(self, cache: bool = True) -> ContextManager:
        return autocast(self.device_type, self.dtype, cache)

    def scaler(self, key: str) -> Optional[torch.amp.GradScaler]:
        """The loss scaler of optimizer ``key``; ``None`` unless training in fp16."""
        if self.dtype is not torch.float16:
            return None
        if key not in self._scalers:
            self._scalers[key] = torch.amp.GradScaler(self.device_type)
        return self._scalers[key]

    def backward(self, loss: torch.Tensor, key: str) -> None:
        scaler = self.scaler(key)
        (loss if scaler is None else scaler.scale(loss)).backward()

    def step(self, optimizer: torch.optim.Optimizer, key: str) -> None:
        """``optimizer.step()``; with fp16 GradScaler unscales, skips on overflow and adapts."""
        scaler = self.scaler(key)
        if scaler is None:
            optimizer.step()
            return
        scaler.step(optimizer)
        scaler.update()

    def backward_unscaled(self, loss: torch.Tensor, parameters: Iterable[nn.Parameter], key: str) -> bool:
        """Backward leaving the true (unscaled) fp32 gradients in ``.grad``, for profiling.

        Returns False when fp16-scaled gradients overflowed (the sample must not be used). The
        scaler of ``key`` runs exactly as for an optimizer: ``scale`` -> ``unscale_`` (one fused
        check-and-unscale per device) -> ``step`` of a stand-in whose step is "use this sample",
        skipped on overflow -> ``update`` (backoff after an overflow, growth after
        ``growth_interval`` clean samples). The one host sync is GradScaler's read of the
        overflow flag, once per sample whatever the number of parameters.
        """
        scaler = self.scaler(key)
        if scaler is None:
            loss.backward()
            return True
        scaler.scale(loss).backward()
        sample = _ProfilingSample([p for p in parameters if p.grad is not None])
        if not sample.param_groups[0]['params']:   # no gradient at all: nothing to check
            return True
        usable = scaler.step(sample) is True
        scaler.update()
        return usable

    def state_dict(self) -> Dict[str, dict]:
        return {key: scaler.state_dict() for key, scaler in self._scalers.items()}

    def load_state_dict(self, state: Mapping[str, dict]) -> None:
        for key, scaler_state in state.items():
            scaler = self.scaler(key)
            if scaler is not None and scaler_state:
                scaler.load_state_dict(scaler_state)


class _ProfilingSample:
    """What ``GradScaler.step`` needs of an optimizer, for profiling: the parameters whose
    gradients it unscales and checks, and a ``step`` (run only when they are finite) that
    reports the sample as usable."""

    def __init__(self, parameters: List[nn.Parameter]) -> None:
        self.param_groups = [{'params': parameters}]

    def step(self) -> bool:
        return True


# The batch-norm layers of each network, found once: a step of a network of a thousand modules
# spent about a millisecond walking them (MambaIR has 846 and none of them).
_NORM_LAYERS: 'weakref.WeakKeyDictionary[nn.Module, List[nn.modules.batchnorm._NormBase]]' = \
    weakref.WeakKeyDictionary()


def _norm_layers(network: nn.Module) -> List[nn.modules.batchnorm._NormBase]:
    layers = _NORM_LAYERS.get(network)
    if layers is None:
        layers = _NORM_LAYERS[network] = [m for m in network.modules()
                                          if isinstance(m, nn.modules.batchnorm._NormBase)]
    return layers


class RunningStatistics:
    """Snapshot of the buffers a training-mode forward changes (batch-norm running statistics),
    restorable when the step turns out to be skipped; empty (free) for networks without them.
    A network's modules are looked up once (they do not change during training)."""

    def __init__(self, network: nn.Module) -> None:
        self.buffers: List[torch.Tensor] = [
            b for m in _norm_layers(network) if m.training and m.track_running_stats
            for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None]
        self.saved = [b.clone() for b in self.buffers]

    @torch.no_grad()
    def restore(self) -> None:
        for buffer, saved in zip(self.buffers, self.saved):
            buffer.copy_(saved)


def several_ranks() -> bool:
    """Whether a process group of more than one rank is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _on_every_rank(flag: torch.Tensor) -> bool:
    """Whether ``flag`` (one element) is true on every rank: one all-reduce (MIN), then a host read."""
    flag = flag.to(torch.float32).reshape(1)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def finite_on_all_ranks(loss: torch.Tensor) -> bool:
    """Whether ``loss`` is finite on this rank and on every other rank of a running group."""
    finite = torch.isfinite(loss.detach()).all()
    return _on_every_rank(finite) if several_ranks() else bool(finite)


def reported_loss(loss: torch.Tensor) -> float:
    """The step's loss as a float, NaN when another rank's loss was not finite (so every rank
    skips the same steps): the one host sync of a training step, where the loss is both checked
    and reported."""
    value = float(loss.detach())
    finite = math.isfinite(value)
    if several_ranks() and not _on_every_rank(torch.tensor(finite, device=loss.device)) and finite:
        return math.nan
    return value
