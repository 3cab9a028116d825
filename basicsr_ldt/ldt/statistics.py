"""Streaming per-layer gradient statistics (Algorithm 1, lines 8-11) in O(layers) memory.

The official code keeps every profiled gradient and stacks them (N x model size of RAM). The
criteria only need, per layer, the count, sum, sum of squares and sum of magnitudes of all
gradient entries over all samples (one sample = one batch's gradient, as in the official code),
so that is all we keep.

Numerical stability: sums are float64 and *shifted* by a per-layer constant (the first
sample's mean gradient of that layer), the classic shifted-data variance algorithm: the
cancellation in ``sumsq - sum^2/n`` then depends on the spread around the shift, not on how far
the gradients sit from zero.

Distribution: the state is plain tensors, so an all-reduce (SUM) of ``count``, ``sum``,
``sumsq``, ``abs_sum`` over ranks with a common ``shift`` yields the statistics of the union of
all ranks' samples; :func:`all_reduce_statistics` first moves every rank to rank 0's shift.

``sample_var`` is the one criterion that needs more than per-layer scalars: the variance *over
the profiling iterations* of each gradient entry (not over the entries of one layer). It keeps
per-entry running moments (Welford: mean and M2, float64, two tensors per layer, created only
when ``per_entry=True``), i.e. 2 x model size whatever N is, never N copies.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from basicsr_ldt.ldt.config import CRITERIA
from basicsr_ldt.ldt.precision import several_ranks

_SUM_KEYS = ('count', 'sum', 'sumsq', 'abs_sum')


class GradientStatistics:
    """Running per-layer moments of gradient entries; see the module docstring for why."""

    def __init__(self, names: Sequence[str], device: torch.device | str = 'cpu', per_entry: bool = False) -> None:
        self.names: List[str] = list(names)
        self._index = {n: i for i, n in enumerate(self.names)}
        if len(self._index) != len(self.names):
            raise ValueError('GradientStatistics: layer names must be unique')
        zeros = lambda: torch.zeros(len(self.names), dtype=torch.float64, device=device)  # noqa: E731
        self.count = zeros()
        self.shift = zeros()
        self.sum = zeros()       # sum of (g - shift)
        self.sumsq = zeros()     # sum of (g - shift)^2
        self.abs_sum = zeros()   # sum of |g|
        self.samples = 0
        self.shift_set = False
        # per-entry Welford moments over samples (``sample_var``): mean and M2 per layer
        self.per_entry = per_entry
        self.entry_mean: Dict[str, torch.Tensor] = {}
        self.entry_m2: Dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def accumulate(self, named_grads: Iterable[Tuple[str, Optional[torch.Tensor]]]) -> None:
        """Add one sample: the gradient of every layer after one backward.

        A layer missing from ``named_grads`` or with grad ``None`` contributes zeros: it really
        had zero gradient, and it keeps every layer's count equal to samples x numel.
        """
        grads: Dict[str, Optional[torch.Tensor]] = dict(named_grads)
        first = not self.shift_set
        for name, i in self._index.items():
            g = grads.get(name)
            if g is None:
                raise KeyError(f"GradientStatistics: no tensor given for layer '{name}'")
            g = g.detach().reshape(-1).to(device=self.count.device, dtype=torch.float64)
            if first:
                self.shift[i] = g.mean() if g.numel() else 0.0
            centered = g - self.shift[i]
            self.count[i] += g.numel()
            self.sum[i] += centered.sum()
            self.sumsq[i] += torch.dot(centered, centered)
            self.abs_sum[i] += g.abs().sum()
            if self.per_entry:
                self._welford(name, g)
        self.shift_set = True
        self.samples += 1

    def _welford(self, name: str, g: torch.Tensor) -> None:
        """Per-entry running mean / M2 over samples (Welford), ``self.samples`` not yet counted."""
        n = self.samples + 1
        if name not in self.entry_mean:
            self.entry_mean[name] = torch.zeros_like(g)
            self.entry_m2[name] = torch.zeros_like(g)
        mean, m2 = self.entry_mean[name], self.entry_m2[name]
        delta = g - mean
        mean.add_(delta, alpha=1.0 / n)
        m2.addcmul_(delta, g - mean)

    def accumulate_module(self, module: torch.nn.Module) -> None:
        """Add one sample from ``module``'s ``.grad`` fields (``None`` counts as zeros)."""
        self.accumulate((n, p.grad if p.grad is not None else torch.zeros_like(p))
                        for n, p in module.named_parameters() if n in self._index)

    def merge_(self, other: 'GradientStatistics') -> 'GradientStatistics':
        """Fold another accumulator (e.g. another rank's) into this one, exactly."""
        if other.names != self.names:
            raise ValueError('GradientStatistics.merge_: layer names differ')
        if not other.shift_set:
            return self
        if not self.shift_set:
            self.load_state_dict(other.state_dict())
            return self
        if self.per_entry != other.per_entry:
            raise ValueError('GradientStatistics.merge_: one accumulator keeps per-entry moments, the other not')
        for name in self.entry_mean:
            self.entry_mean[name], self.entry_m2[name] = _merge_moments(
                self.samples, self.entry_mean[name], self.entry_m2[name],
                other.samples, other.entry_mean[name], other.entry_m2[name])
        count, s, sq = _reshift(other.count, other.sum, other.sumsq, other.shift, self.shift)
        self.count += count
        self.sum += s
        self.sumsq += sq
        self.abs_sum += other.abs_sum
        self.samples += other.samples
        return self

    # -- statistics ----------------------------------------------------------------------------
    def variance(self) -> torch.Tensor:
        """Unbiased variance of all entries of the stacked [N, *shape] gradients (= torch.var)."""
        n = self.count
        return (self.sumsq - self.sum * self.sum / n).clamp_min(0.0) / (n - 1)

    def sample_variance(self) -> torch.Tensor:
        """``sample_var``: per layer, the mean over its entries of each entry's unbiased variance
        over the N profiled samples, ``mean_e sum_t (g_te - mean_t g_te)^2 / (N - 1)``.

        Unlike ``var`` it ignores how entries of one layer differ from each other (a layer whose
        entries are all different but never change scores 0): it measures only how much the
        update direction changes from batch to batch, the paper's notion of instability.
        """
        if not self.per_entry:
            raise ValueError("criterion 'sample_var' needs GradientStatistics(per_entry=True)")
        return torch.stack([self.entry_m2[n].mean() if self.entry_m2[n].numel() else self.count.new_zeros(())
                            for n in self.names]) / (self.samples - 1)

    def mean_square(self) -> torch.Tensor:
        """``fisher``: mean squared gradient entry, the diagonal of the empirical Fisher
        E[g g^T] averaged over the layer's entries (one sample = one batch's gradient)."""
        raw = self.sumsq + 2.0 * self.shift * self.sum + self.count * self.shift * self.shift
        return raw.clamp_min(0.0) / self.count

    def mean_magnitude(self) -> torch.Tensor:
        """Mean |gradient entry|: the paper's "mean gradient magnitude" criterion."""
        return self.abs_sum / self.count

    def criterion(self, name: str, seed: int = 0) -> List[float]:
        """Per-layer values of a partition criterion, in layer order (higher = less stable)."""
        if name not in CRITERIA:
            raise ValueError(f"unknown criterion '{name}', expected one of {CRITERIA}")
        if name == 'random':
            return random_statistic(len(self.names), seed)
        if self.samples < 2:
            raise ValueError(f"criterion '{name}' needs at least 2 profiled samples, have {self.samples}")
        if name == 'var':
            values = self.variance()
        elif name == 'mean':
            values = self.mean_magnitude()
        elif name == 'sample_var':
            values = self.sample_variance()
        elif name == 'fisher':
            values = self.mean_square()
        else:
            mean = self.mean_magnitude()
            values = torch.where(mean > 0, self.variance() / mean.clamp_min(1e-300), torch.zeros_like(mean))
        return values.tolist()

    # -- persistence ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {'names': list(self.names), 'samples': self.samples, 'shift_set': self.shift_set,
                 'shift': self.shift.clone(), **{k: getattr(self, k).clone() for k in _SUM_KEYS}}
        if self.per_entry:
            state['entry_mean'] = {n: t.clone() for n, t in self.entry_mean.items()}
            state['entry_m2'] = {n: t.clone() for n, t in self.entry_m2.items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        if list(state['names']) != self.names:
            raise ValueError('GradientStatistics.load_state_dict: layer names differ from the model')
        for key in ('shift',) + _SUM_KEYS:
            getattr(self, key).copy_(state[key])
        self.samples = int(state['samples'])
        self.shift_set = bool(state['shift_set'])
        if ('entry_mean' in state) != self.per_entry:
            raise ValueError('GradientStatistics.load_state_dict: the saved state '
                             f"{'has' if 'entry_mean' in state else 'lacks'} per-entry moments (criterion sample_var)")
        if self.per_entry:
            device = self.count.device
            self.entry_mean = {n: t.to(device).clone() for n, t in state['entry_mean'].items()}
            self.entry_m2 = {n: t.to(device).clone() for n, t in state['entry_m2'].items()}


def random_statistic(n_layers: int, seed: int) -> List[float]:
    """The ``random`` criterion: seeded uniform values, independent of global RNG state."""
    generator = torch.Generator().manual_seed(int(seed))
    return torch.rand(n_layers, generator=generator, dtype=torch.float64).tolist()


def _reshift(count: torch.Tensor, s: torch.Tensor, sq: torch.Tensor, old: torch.Tensor,
             new: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Express shifted sums around ``old`` as sums around ``new`` (exact algebra)."""
    d = old - new
    return count.clone(), s + count * d, sq + 2.0 * d * s + count * d * d


def _merge_moments(n_a: int, mean_a: torch.Tensor, m2_a: torch.Tensor, n_b: int, mean_b: torch.Tensor,
                   m2_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Chan et al.'s pairwise combination of two (count, mean, M2) Welford states."""
    n = n_a + n_b
    delta = mean_b - mean_a
    return mean_a + delta * (n_b / n), m2_a + m2_b + delta * delta * (n_a * n_b / n)


def all_reduce_statistics(stats: GradientStatistics) -> GradientStatistics:
    """Make every rank hold the statistics of all ranks' samples (no-op without a process group)."""
    if not several_ranks():
        return stats
    flags = torch.tensor([float(stats.shift_set)], dtype=torch.float64, device=stats.count.device)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    if flags.item() == 0:
        raise RuntimeError('all_reduce_statistics: some rank profiled no sample')
    common = stats.shift.clone()
    dist.broadcast(common, src=0)
    _, stats.sum, stats.sumsq = _reshift(stats.count, stats.sum, stats.sumsq, stats.shift, common)
    stats.shift = common
    packed = torch.stack([getattr(stats, k) for k in _SUM_KEYS]
                         + [torch.full_like(stats.count, float(stats.samples))])
    dist.all_reduce(packed)
    for i, key in enumerate(_SUM_KEYS):
        setattr(stats, key, packed[i].clone())
    local = stats.samples
    stats.samples = int(round(packed[len(_SUM_KEYS), 0].item()))
    for name in stats.entry_mean:
        # total mean = sum_r n_r mean_r / n ; M2 = sum_r [M2_r + n_r (mean_r - mean)^2]
        mean = stats.entry_mean[name] * (local / stats.samples)
        dist.all_reduce(mean)
        m2 = stats.entry_m2[name] + (stats.entry_mean[name] - mean).pow(2) * local
        dist.all_reduce(m2)
        stats.entry_mean[name], stats.entry_m2[name] = mean, m2
    return stats
