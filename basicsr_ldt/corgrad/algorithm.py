"""CorGrad (Zhou et al., "Rethinking Domain Generalization from Perspective of Gradient
Granularity"): the multi-source gradient-surgery baseline the LDT paper compares with.

Plain PyTorch, no BasicSR import, independent of the LDT family. One step: one gradient per
source domain (here: camera), each layer's gradient split into ``slices`` pieces, the
conflicting component of every slice removed against the other cameras' slices (Gram-Schmidt),
dominant gradients smoothed (eq. 11), then one optimizer step on the combined gradient.

Two variants (``corgrad_variant``), because the paper (Algorithm 1, sections 3.5-3.7) and its
official code (github libzwo/CorGrad, ``domainbed/gradient.py::correct_grad`` as called by
``domainbed/algorithms/algorithms.py::GradSurgery.update``) differ:

``paper`` (default; where the paper is ambiguous the choice is written down here):

- **Conflict test.** Algorithm 1 line 6 and step (2) of section 3.7 project when the inner
  product is *negative* (PCGrad's rule); the prose of section 3.3 states the opposite sign. We
  follow Algorithm 1 and the code. The projection divides by ``||g_j||^2`` (step 2, code);
  eq. 13 prints ``||g_j||_2``, which would not remove the component exactly.
- **Against which g_j.** Each camera's gradient is projected against the *original* gradients
  of the other cameras (PCGrad), in one random order of cameras drawn per step (step 3).
- **Layer.** A layer is one named parameter tensor (as in the rest of this project); every
  trainable tensor is corrected. Slices are contiguous pieces of its flattened gradient of size
  ceil(numel / slices) (``torch.chunk``: fewer slices when a tensor has fewer entries).
- **Dominant gradient (eq. 11).** Per layer: a camera's gradient is dominant when its L2 norm
  exceeds the mean norm over cameras by more than one population standard deviation (Algorithm
  1 line 10, one-sided); it becomes ``alpha g_i + (1 - alpha) g_mean`` with ``g_mean`` the mean
  gradient over all cameras (eq. 11's definition).
- **Two cameras.** With two norms, ``norm - mean`` equals the population std *exactly* (both
  are half the difference of the norms), so under the paper's test no camera is ever dominant;
  a bare ``>`` decided it by float rounding (17-25% of random float32 pairs, by how they are
  drawn; the larger norm then moved by its whole difference to the mean when alpha is small).
  The test therefore asks for a margin: dominant when ``norm - mean - std >
  DOMINANCE_TOLERANCE * max norm`` (1e-9: ten million times float64 rounding of the
  statistics, far below any real gap).
- **Alpha schedule: the paper's.** Section 4.1 starts alpha in [0.5, 1] and lets it "gradually
  decay to 0" without a formula. ``alpha_decay: log`` (default) is ``alpha (1 - ln t / ln T)``
  for iteration t of T (1-based), our choice of shape; ``linear`` (``alpha (1 - (t-1)/(T-1))``)
  and ``none`` are available. (The official code defines ``1 - log(t+1)/log(T)`` but never
  applies it: it trains with a constant alpha, 0.6 in its README commands.)
- **Combination.** The update uses the *mean* of the corrected camera gradients: eq. 1 defines
  the training loss as the mean over domains, so without conflicts the step equals plain
  fine-tuning on a camera-balanced batch (Algorithm 1 writes the sum; with Adam the two differ
  only through epsilon).
- ``slices`` default 10 (the code's ``n_parts``; the paper sets n in [5, 100]).

``official`` (what ``correct_grad`` does, read in the code; a rounding case and the
uncorrected parameters are handled differently, marked below):

- only the parameters of ``nn.Conv2d`` and ``nn.Linear`` modules (weights *and* biases,
  ``get_conv_grads``) are corrected; each gradient is cut along dim 0 (output channels) into
  ``torch.chunk(g, slices)`` pieces;
- cameras are projected in the fixed order of the source cameras, *in place*: camera i is
  projected against cameras 0..i-1 already corrected and i+1.. still original, and each
  projection of camera i sees its own earlier projections;
- dominance is two-sided (``|norm - mean| > std``, population std, with the margin above);
  dominant gradients are smoothed towards the mean of the *non-dominant* cameras. With two
  cameras both deviations equal the std exactly; the official code's numpy statistics of
  float32 norms happen to keep that exact, ours (float64 norms) need the margin;
- (differs) an anti-parallel chunk (every 1-entry chunk, e.g. of a 3-channel ``conv_last``
  bias) projects to exactly 0; left as float rounding noise (as the official code does), a
  later camera would be projected against that noise with a coefficient of order 1, and
  whether its chunk is zeroed would be decided by rounding. A result within
  ``PARALLEL_TOLERANCE`` eps of its previous norm is set to 0;
- alpha is constant (``alpha_decay`` defaults to ``none`` for this variant);
- the update is the *sum* of the corrected camera gradients (``set_conv_grads``);
- (differs) other parameters get the plain sum of the camera gradients. The official code
  leaves them the last domain's gradient (a side effect of ``zero_grad`` before each domain's
  backward); its README runs have none (their flags switch on BatchNorm correction as well through a swapped
  positional argument, and a ResNet has only Conv2d, BatchNorm2d and Linear parameters).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from basicsr_ldt.ldt.config import reject_unknown_keys
from basicsr_ldt.ldt.precision import MixedPrecision, RunningStatistics, finite_on_all_ranks
from basicsr_ldt.ldt.typed import check_options, choice, integer, number, optional

ALPHA_DECAYS = ('log', 'linear', 'none')
VARIANTS = ('paper', 'official')
SLICE_RANGE = (5, 100)                          # the paper's range of n
#: Margin of the dominance test, relative to the largest norm (module docstring: two cameras).
DOMINANCE_TOLERANCE = 1e-9
#: A projected chunk this many float eps of its norm or smaller is anti-parallel: its exact
#: projection is 0 (module docstring: in-place projection).
PARALLEL_TOLERANCE = 64
#: Type and range of each key (paper: alpha starts in [0.5, 1]).
SPECS = {'slices': integer(*SLICE_RANGE), 'alpha': number(0, 1, '[]'), 'alpha_decay': optional(choice(*ALPHA_DECAYS)),
         'seed': integer(0), 'corgrad_variant': choice(*VARIANTS)}


@dataclass(frozen=True)
class CorGradConfig:
    """CorGrad's hyperparameters (the ``ldt:`` block with ``method: corgrad``)."""

    slices: int = 10
    alpha: float = 1.0
    alpha_decay: Optional[str] = None   # None: the variant's own (paper: log, official: none)
    seed: int = 0
    corgrad_variant: str = 'paper'

    def __post_init__(self) -> None:
        check_options('ldt', dataclasses.asdict(self), SPECS)

    @property
    def decay(self) -> str:
        """The alpha schedule in force: ``alpha_decay`` if given, else the variant's."""
        if self.alpha_decay is not None:
            return self.alpha_decay
        return 'log' if self.corgrad_variant == 'paper' else 'none'

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> 'CorGradConfig':
        """Build from the ``ldt:`` block less ``method``; unknown keys raise with a suggestion."""
        reject_unknown_keys(options, [f.name for f in dataclasses.fields(cls)], 'CorGrad')
        return cls(**dict(options))


def alpha_at(config: CorGradConfig, iteration: int, total_iters: int) -> float:
    """The smoothing weight of eq. 11 at 1-based ``iteration`` of ``total_iters``: the paper's
    decay to 0 (section 4.1) in the shape ``config.decay`` names, or constant."""
    if config.decay == 'none' or total_iters <= 1:
        return float(config.alpha)
    t = min(max(iteration, 1), total_iters)
    if config.decay == 'log':
        return float(config.alpha) * max(0.0, 1.0 - math.log(t) / math.log(total_iters))
    return float(config.alpha) * (1.0 - (t - 1) / (total_iters - 1))


def _as_slices(flat: torch.Tensor, slices: int) -> torch.Tensor:
    """[slices', size] view-equivalent of ``torch.chunk(flat, slices)``, zero-padded at the end
    (zeros change no inner product and no norm)."""
    size = math.ceil(flat.numel() / slices) if flat.numel() else 1
    rows = math.ceil(flat.numel() / size) if flat.numel() else 1
    padded = flat.new_zeros(rows * size)
    padded[:flat.numel()] = flat
    return padded.view(rows, size)


def remove_conflicts(grads: Sequence[torch.Tensor], slices: int, order: Sequence[int]) -> Tuple[List[torch.Tensor], int, int]:
    """Steps (1)-(3) of section 3.7 for one layer: ``grads[i]`` is camera i's flat gradient.

    Every slice of g_i that has a negative inner product with the same slice of g_j is replaced
    by its projection onto the normal plane of g_j's slice (eq. 12-13), for the other cameras j
    in ``order``. Returns the corrected gradients, the number of projections (n_f of eq. 3) and
    of comparisons (n_t).
    """
    originals = [_as_slices(g.reshape(-1), slices) for g in grads]
    squared = [(o * o).sum(dim=1) for o in originals]
    corrected, projected, compared = [], 0, 0
    for i in range(len(grads)):
        g_i = originals[i].clone()
        for j in order:
            if j == i:
                continue
            g_j = originals[j]
            dot = (g_i * g_j).sum(dim=1)                                 # <g_i, g_j> per slice
            conflict = (dot < 0) & (squared[j] > 0)
            coefficient = torch.where(conflict, dot / squared[j].clamp_min(torch.finfo(dot.dtype).tiny),
                                      torch.zeros_like(dot))
            g_i -= coefficient.unsqueeze(1) * g_j                          # eq. 12-13
            projected += int(conflict.sum())
            compared += conflict.numel()
        corrected.append(g_i.reshape(-1)[:grads[i].numel()].view_as(grads[i]))
    return corrected, projected, compared


def dominant_cameras(norms: Sequence[float], two_sided: bool = False) -> List[int]:
    """Cameras whose gradient norm lies more than one population standard deviation above the
    mean norm (Algorithm 1 line 10), or on either side (``two_sided``, the official code).

    Computed in float64 with the margin ``DOMINANCE_TOLERANCE * max norm``: with two cameras the
    deviation equals the std exactly, so without a margin rounding alone would decide.
    """
    values = [float(n) for n in norms]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))       # population (ddof 0)
    margin = DOMINANCE_TOLERANCE * max(abs(v) for v in values)
    deviation = (lambda v: abs(v - mean)) if two_sided else (lambda v: v - mean)
    return [i for i, v in enumerate(values) if deviation(v) - std > margin]


def smooth_dominant(grads: List[torch.Tensor], alpha: float) -> List[int]:
    """Steps (4)-(6) of section 3.7 / eq. 11 for one layer, in place; returns the dominant cameras."""
    dominant = dominant_cameras([float(g.double().norm()) for g in grads])
    if dominant:
        g_mean = torch.stack(grads).mean(dim=0)                            # eq. 11's g_mean
        for i in dominant:
            grads[i].mul_(alpha).add_(g_mean, alpha=1.0 - alpha)          # eq. 11
    return dominant


def correct_layer_official(grads: Sequence[torch.Tensor], slices: int, alpha: float) -> Tuple[torch.Tensor, int, int]:
    """One Conv2d/Linear parameter as the official ``correct_grad`` treats it; returns the summed
    update, the number of projections and of comparisons.

    Dim-0 chunks (``torch.chunk``); cameras in the given order, each projected in place, so a
    later camera meets the already-corrected chunks of the earlier ones; two-sided dominance;
    smoothing towards the mean of the non-dominant cameras; sum over cameras.
    """
    corrected = [g.clone() for g in grads]
    chunks = [torch.chunk(g, slices, dim=0) for g in corrected]           # views into `corrected`
    projected = compared = 0
    for i in range(len(corrected)):
        for k, piece in enumerate(chunks[i]):
            for j in range(len(corrected)):
                if j == i:
                    continue
                other = chunks[j][k]
                dot = torch.sum(piece * other)
                compared += 1
                if dot < 0:                                                 # eq. 12-13, in place
                    before = float(piece.norm())
                    piece.sub_(other, alpha=float(dot / torch.sum(other * other)))
                    if float(piece.norm()) <= PARALLEL_TOLERANCE * torch.finfo(piece.dtype).eps * before:
                        piece.zero_()               # anti-parallel (e.g. 1-entry chunks): exactly 0
                    projected += 1
    dominant = dominant_cameras([float(g.norm()) for g in corrected], two_sided=True)
    if dominant:
        rest = torch.stack([g for i, g in enumerate(corrected) if i not in dominant]).mean(dim=0)
        for i in dominant:
            corrected[i].mul_(alpha).add_(rest, alpha=1.0 - alpha)
    return torch.stack(corrected).sum(dim=0), projected, compared


CameraLoss = Callable[[nn.Module], torch.Tensor]


class CorGrad:
    """Algorithm 1 of the paper (or the official code's step) as one ``step`` over a batch that
    holds every source camera."""

    def __init__(self, network: nn.Module, optimizer: torch.optim.Optimizer, config: CorGradConfig,
                 total_iters: int) -> None:
        self.network = network
        self.optimizer = optimizer
        self.config = config
        self.total_iters = int(total_iters)
        self.params = [p for p in network.parameters() if p.requires_grad]
        conv_linear = {id(p) for m in network.modules() if isinstance(m, (nn.Conv2d, nn.Linear))
                       for p in m.parameters(recurse=False)}
        #: per parameter: does the official variant correct it (a Conv2d / Linear weight or bias)
        self.official_layer = [id(p) in conv_linear for p in self.params]

    def camera_order(self, n_cameras: int, iteration: int) -> List[int]:
        """Random camera order of this step, a pure function of (seed, iteration): resumes exactly."""
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + int(iteration))
        return torch.randperm(n_cameras, generator=generator).tolist()

    def step(self, camera_losses: Sequence[CameraLoss], iteration: int,
             precision: Optional[MixedPrecision] = None, penalty: Optional[CameraLoss] = None) -> Dict[str, float]:
        """One update from one loss closure per camera; returns the mean loss, the modification
        frequency f_m (eq. 3) and alpha.

        ``penalty`` (a regulariser of the weights, e.g. L2-SP) is no camera's loss: its gradient is
        added to the combined update after the surgery, so it neither conflicts nor is projected.

        ``precision`` runs the forward passes under autocast (bf16; fp16 loss scaling is refused:
        the surgery compares raw per-camera gradients). A non-finite loss of any camera skips the
        whole step (no optimizer step) and is returned as ``l_corgrad`` = NaN.
        """
        if len(camera_losses) < 2:
            raise ValueError(f'CorGrad needs at least two source cameras in a batch, got {len(camera_losses)}')
        precision = precision or MixedPrecision()
        if precision.dtype is torch.float16:
            raise ValueError('CorGrad compares unscaled per-camera gradients: use amp bf16 or none, not fp16')
        running = RunningStatistics(self.network)
        per_camera: List[List[torch.Tensor]] = []
        losses = []
        for loss_of in camera_losses:                                    # Alg. 1 line 1: g_d per domain
            self.optimizer.zero_grad(set_to_none=True)
            with precision.autocast():
                loss = loss_of(self.network)
            if not finite_on_all_ranks(loss):                            # skip the step, weights untouched
                running.restore()
                self.optimizer.zero_grad(set_to_none=True)
                return {'l_corgrad': math.nan, 'corgrad_fm': 0.0, 'corgrad_alpha': 0.0}
            loss.backward()
            losses.append(float(loss.detach()))
            per_camera.append([p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                               for p in self.params])
        self.optimizer.zero_grad(set_to_none=True)
        alpha = alpha_at(self.config, iteration, self.total_iters)
        official = self.config.corgrad_variant == 'official'
        order = None if official else self.camera_order(len(camera_losses), iteration)
        projected = compared = 0
        for k, param in enumerate(self.params):                           # Alg. 1 line 2: layering
            layer = [grads[k] for grads in per_camera]
            if official:
                if self.official_layer[k]:
                    param.grad, n_f, n_t = correct_layer_official(layer, self.config.slices, alpha)
                    projected, compared = projected + n_f, compared + n_t
                else:
                    param.grad = torch.stack(layer).sum(dim=0)             # not corrected
            else:
                corrected, n_f, n_t = remove_conflicts(layer, self.config.slices, order)
                projected, compared = projected + n_f, compared + n_t
                smooth_dominant(corrected, alpha)
                param.grad = torch.stack(corrected).mean(dim=0)            # combined update
                del corrected
            del layer
        logs = {'l_corgrad': sum(losses) / len(losses),
                'corgrad_fm': projected / compared if compared else 0.0, 'corgrad_alpha': alpha}
        if penalty is not None:
            value = penalty(self.network)
            value.backward()                                              # adds to the combined gradient
            logs['l_penalty'] = float(value.detach())
        self.optimizer.step()                                             # one optimizer step
        self.optimizer.zero_grad(set_to_none=True)
        return logs
