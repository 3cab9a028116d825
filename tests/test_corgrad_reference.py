"""CorGrad's whole step against two independent references written here in plain float64 torch:
one from the paper's Algorithm 1 / section 3.7 / eq. 11 (``corgrad_variant: paper``), one
re-derived from the official ``domainbed/gradient.py::correct_grad`` as ``GradSurgery.update``
calls it (``corgrad_variant: official``). Neither calls a helper of ``basicsr_ldt.corgrad``.

The network has two Conv2d and one Linear layer with biases plus a LayerNorm and a free scalar
(parameters the official code does not correct); 2, 3 and 4 cameras, several seeds and alphas.
The paper's random camera order is injected: the test draws it and hands the same order to both.
"""
import copy
import math
import random
from typing import Dict, List

import pytest
import torch
from torch import nn

from basicsr_ldt.corgrad import CorGrad, CorGradConfig

LR = 0.1
SLICES = 5
TOTAL = 20


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 12, 3, padding=1)       # 12 output channels: 4 dim-0 chunks of 3
        self.conv2 = nn.Conv2d(12, 3, 3, padding=1)
        self.fc = nn.Linear(3 * 4 * 4, 7)                  # 7 rows: 4 dim-0 chunks (2, 2, 2, 1)
        self.norm = nn.LayerNorm(7)
        self.gain = nn.Parameter(torch.tensor(1.3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.conv1(x))
        h = torch.tanh(self.conv2(h)).flatten(1)
        return self.gain * self.norm(self.fc(h))


def camera_batches(n_cameras: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    batches = []
    for c in range(n_cameras):
        x = torch.randn(3, 2, 4, 4, generator=g, dtype=torch.float64)
        scale = 6.0 if c == 0 else 1.0                     # camera 0 often dominates
        y = scale * torch.randn(3, 7, generator=g, dtype=torch.float64)
        batches.append((x, y))
    return batches


def loss_of(x, y):
    return lambda net: ((net(x) - y) ** 2).mean()


def camera_gradients(net: nn.Module, batches) -> List[Dict[str, torch.Tensor]]:
    grads = []
    for x, y in batches:
        names, params = zip(*net.named_parameters())
        values = torch.autograd.grad(loss_of(x, y)(net), params)
        grads.append({n: v.detach().clone() for n, v in zip(names, values)})
    return grads


def population_outliers(norms: List[float], two_sided: bool) -> List[int]:
    """One std from the mean; with two cameras |norm - mean| equals the std identically, so no
    camera is an outlier (decided exactly here, not by rounding)."""
    if len(norms) == 2:
        return []
    mean = sum(norms) / len(norms)
    std = math.sqrt(sum((n - mean) ** 2 for n in norms) / len(norms))
    return [i for i, n in enumerate(norms) if (abs(n - mean) if two_sided else n - mean) > std]


def paper_reference(grads, order, alpha, stats):
    """Algorithm 1 / section 3.7: flat slices of ceil(numel / n), each camera's slices projected
    against the ORIGINAL slices of the others in ``order`` when the inner product is negative,
    one-sided dominance on the layer norms, eq. 11 towards the mean of all cameras, mean update."""
    update = {}
    cameras = range(len(grads))
    for name in grads[0]:
        flat = [g[name].reshape(-1) for g in grads]
        size = math.ceil(flat[0].numel() / SLICES)
        bounds = [(s, min(s + size, flat[0].numel())) for s in range(0, flat[0].numel(), size)]
        corrected = []
        for i in cameras:
            g_i = flat[i].clone()
            for j in order:
                if j == i:
                    continue
                for a, b in bounds:
                    dot = float((g_i[a:b] * flat[j][a:b]).sum())
                    if dot < 0:
                        g_i[a:b] = g_i[a:b] - dot / float((flat[j][a:b] ** 2).sum()) * flat[j][a:b]
                        stats['projected'] += 1
            corrected.append(g_i)
        outliers = population_outliers([math.sqrt(float((g ** 2).sum())) for g in corrected], two_sided=False)
        g_mean = sum(corrected) / len(corrected)
        for i in outliers:
            corrected[i] = alpha * corrected[i] + (1 - alpha) * g_mean
        stats['dominant'] += len(outliers)
        update[name] = (sum(corrected) / len(corrected)).view_as(grads[0][name])
    return update


def official_reference(grads, conv_linear_names, alpha, stats):
    """``correct_grad``: Conv2d/Linear weights and biases cut into torch.chunk(g, n_parts) pieces
    along dim 0 (chunk size ceil(d0 / n)); for each domain i in index order, each piece, each
    other domain p in index order: a negative inner product with p's CURRENT piece projects i's
    piece in place (in exact arithmetic: an anti-parallel piece, e.g. any 1-entry piece, becomes
    the zero vector, against which nothing is projected later). Outliers |norm - mean| >
    population std are replaced by alpha g + (1 - alpha) (mean of the non-outliers); the update
    is the sum. Other parameters: the plain sum (the official code leaves them the last
    domain's gradient; the project documents that difference)."""
    update = {}
    for name in grads[0]:
        work = [g[name].clone() for g in grads]
        if name not in conv_linear_names:
            update[name] = sum(work)
            continue
        rows = work[0].shape[0]
        size = math.ceil(rows / SLICES)
        for i in range(len(work)):
            for start in range(0, rows, size):
                stop = min(start + size, rows)
                for p in range(len(work)):
                    if p == i:
                        continue
                    mine, theirs = work[i][start:stop], work[p][start:stop]
                    dot = float((mine * theirs).sum())
                    if dot < 0:
                        cosine = dot / math.sqrt(float((mine ** 2).sum()) * float((theirs ** 2).sum()))
                        if cosine < -1 + 1e-12:                    # anti-parallel: exactly the zero vector
                            work[i][start:stop] = 0
                        else:
                            work[i][start:stop] = mine - dot / float((theirs ** 2).sum()) * theirs
                        stats['projected'] += 1
        outliers = population_outliers([math.sqrt(float((w ** 2).sum())) for w in work], two_sided=True)
        if outliers:
            kept = [w for i, w in enumerate(work) if i not in outliers]
            kept_mean = sum(kept) / len(kept)
            for i in outliers:
                work[i] = alpha * work[i] + (1 - alpha) * kept_mean
        stats['dominant'] += len(outliers)
        update[name] = sum(work)
    return update


def run_project_step(net, batches, config, iteration, order=None):
    corgrad = CorGrad(net, torch.optim.SGD(net.parameters(), lr=LR), config, total_iters=TOTAL)
    if order is not None:
        corgrad.camera_order = lambda n, it: list(order)          # inject the test's order
    corgrad.step([loss_of(x, y) for x, y in batches], iteration=iteration)


def paper_alpha(alpha: float, iteration: int) -> float:
    """Decays to 0 (paper section 4.1) in the log shape alpha (1 - ln t / ln T)."""
    return alpha * (1 - math.log(iteration) / math.log(TOTAL))


CASES = [(n, seed, alpha) for n in (2, 3, 4) for seed in (0, 1, 2) for alpha in (0.0, 0.3, 0.8)]


def assert_step_matches(net, start, update):
    for name, param in net.named_parameters():
        expected = start[name] - LR * update[name]
        assert torch.allclose(param.detach(), expected, rtol=0, atol=1e-12), \
            (name, float((param.detach() - expected).abs().max()))


@pytest.mark.parametrize('variant', ['paper', 'official'])
@pytest.mark.parametrize('n_cameras, seed, alpha', CASES)
def test_step_equals_the_reference(variant, n_cameras, seed, alpha):
    torch.manual_seed(seed)
    net = TinyNet().double()
    batches = camera_batches(n_cameras, seed)
    start = {n: p.detach().clone() for n, p in net.named_parameters()}
    grads = camera_gradients(copy.deepcopy(net), batches)
    iteration = 1 + seed * 3
    stats = {'projected': 0, 'dominant': 0}
    if variant == 'paper':                                         # Algorithm 1, injected camera order
        order = list(range(n_cameras))
        random.Random(seed * 31 + n_cameras).shuffle(order)
        update = paper_reference(grads, order, paper_alpha(alpha, iteration), stats)
    else:                                                          # correct_grad; alpha constant
        order = None
        conv_linear = {f'{m}.{p}' for m in ('conv1', 'conv2', 'fc') for p in ('weight', 'bias')}
        update = official_reference(grads, conv_linear, alpha, stats)
    config = CorGradConfig(slices=SLICES, alpha=alpha, corgrad_variant=variant)
    run_project_step(net, batches, config, iteration, order)
    assert_step_matches(net, start, update)
    assert stats['projected'] > 0                                  # the surgery did something
    if n_cameras > 2 and seed == 0:
        assert stats['dominant'] > 0                               # and so did eq. 11


def test_the_references_tell_the_orders_and_variants_apart():
    # guards the test's power: other camera orders and the other variant give other steps
    torch.manual_seed(0)
    net = TinyNet().double()
    grads = camera_gradients(net, camera_batches(4, 0))
    stats = {'projected': 0, 'dominant': 0}
    a = paper_reference(grads, [0, 1, 2, 3], 0.3, stats)
    b = paper_reference(grads, [3, 2, 1, 0], 0.3, stats)
    c = official_reference(grads, {'conv1.weight', 'conv1.bias', 'conv2.weight', 'conv2.bias', 'fc.weight',
                                   'fc.bias'}, 0.3, stats)
    assert max(float((a[n] - b[n]).abs().max()) for n in a) > 1e-6
    assert max(float((4 * a[n] - c[n]).abs().max()) for n in a) > 1e-6


def test_official_variant_defaults_to_a_constant_alpha_and_the_paper_to_a_decaying_one():
    assert CorGradConfig(corgrad_variant='official').decay == 'none'
    assert CorGradConfig().decay == 'log'
    assert CorGradConfig(corgrad_variant='official', alpha_decay='linear').decay == 'linear'
