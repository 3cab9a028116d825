"""LDT's dual training against a plain float64 replay of the paper's equations written here.

The project's ``LDT`` object is driven on a tiny float64 conv network with fixed batches
(profiling, then dual training). The reference does not use ``basicsr_ldt.ldt``: it profiles
the gradient variance itself, splits by Top_N (eq. 1-2), computes the DPU coefficients from the
ranks within each group (eq. 9-10), trains the primary's stable and the auxiliary's unstable
layers with its own SGD / Adam on the same batches (eq. 4-7), applies the EMA exchange (eq. 8 /
11) every ``ema_every`` dual steps and assembles the composite (eq. 12).
"""
import math
from typing import Dict, List

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from basicsr_ldt.ldt import LDT, LDTConfig

PROFILE = 4
RATIO_U = 0.5
LR = {'sgd': 0.05, 'adam': 1e-2}
BETAS, EPS = (0.9, 0.99), 1e-8
# eq. 10 bases of the paper: stable (0.99, 0.01), unstable (0.999, 0.001)
BASES = {'stable': (0.99, 0.01), 'unstable': (0.999, 0.001)}


def network(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.Tanh(), nn.Conv2d(4, 4, 3, padding=1), nn.Tanh(),
                         nn.Conv2d(4, 2, 3, padding=1)).double()


def forward(weights: Dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    h = torch.tanh(F.conv2d(x, weights['0.weight'], weights['0.bias'], padding=1))
    h = torch.tanh(F.conv2d(h, weights['2.weight'], weights['2.bias'], padding=1))
    return F.conv2d(h, weights['4.weight'], weights['4.bias'], padding=1)


def batch(iteration: int):
    g = torch.Generator().manual_seed(1000 + iteration)
    return (torch.randn(3, 2, 6, 6, generator=g, dtype=torch.float64),
            torch.randn(3, 2, 6, 6, generator=g, dtype=torch.float64))


def loss_fn(out, y):
    return ((out - y) ** 2).mean()


def gradients(weights, names, iteration):
    x, y = batch(iteration)
    leaves = {n: w.clone().requires_grad_(n in names) for n, w in weights.items()}
    values = torch.autograd.grad(loss_fn(forward(leaves, x), y), [leaves[n] for n in names])
    return dict(zip(names, values))


class Optimizer:
    """Plain SGD or Adam (Kingma & Ba, bias-corrected), state per tensor, float64."""

    def __init__(self, kind: str, names: List[str]):
        self.kind, self.t = kind, 0
        self.m = {n: 0.0 for n in names}
        self.v = {n: 0.0 for n in names}

    def step(self, weights, grads):
        self.t += 1
        for n, g in grads.items():
            if self.kind == 'sgd':
                weights[n] = weights[n] - LR['sgd'] * g
                continue
            self.m[n] = BETAS[0] * self.m[n] + (1 - BETAS[0]) * g
            self.v[n] = BETAS[1] * self.v[n] + (1 - BETAS[1]) * g * g
            m_hat = self.m[n] / (1 - BETAS[0] ** self.t)
            v_hat = self.v[n] / (1 - BETAS[1] ** self.t)
            weights[n] = weights[n] - LR['adam'] * m_hat / (v_hat.sqrt() + EPS)


def reference(start: Dict[str, torch.Tensor], optimizer: str, ema_every: int, dual_steps: int):
    names = list(start)
    # profiling (no update): variance of all entries of the stacked [N, *shape] gradients
    samples = [gradients(start, names, i) for i in range(1, PROFILE + 1)]
    variance = {n: float(torch.stack([s[n] for s in samples]).var(unbiased=True)) for n in names}
    # eq. 1-2: the top ratio_u share (rounded half up) by variance is unstable
    k = math.floor(RATIO_U * len(names) + 0.5)
    by_variance = sorted(names, key=lambda n: (-variance[n], names.index(n)))
    group = {n: 'unstable' if n in by_variance[:k] else 'stable' for n in names}
    # eq. 9-10: W = W_base + R_base * (index in the ascending order within the group) / N
    w = {}
    for g, (w_base, r_base) in BASES.items():
        members = sorted([n for n in names if group[n] == g], key=lambda n: (variance[n], names.index(n)))
        for rank, n in enumerate(members):
            w[n] = w_base + r_base * rank / len(members)
    stable = [n for n in names if group[n] == 'stable']
    unstable = [n for n in names if group[n] == 'unstable']
    primary, auxiliary = dict(start), dict(start)
    opt_p, opt_a = Optimizer(optimizer, stable), Optimizer(optimizer, unstable)
    composites = []
    for step in range(1, dual_steps + 1):
        iteration = PROFILE + step
        opt_p.step(primary, gradients(primary, stable, iteration))        # eq. 4, 6: P trains its stable layers
        opt_a.step(auxiliary, gradients(auxiliary, unstable, iteration))  # eq. 5, 7: A trains its unstable layers
        if step % ema_every == 0:                                          # eq. 8 / 11
            for n in stable:
                auxiliary[n] = w[n] * auxiliary[n] + (1 - w[n]) * primary[n]
            for n in unstable:
                primary[n] = w[n] * primary[n] + (1 - w[n]) * auxiliary[n]
        composites.append({n: auxiliary[n] if group[n] == 'stable' else primary[n] for n in names})   # eq. 12
    return group, w, composites


def factory(kind):
    def make(params, role):
        if kind == 'sgd':
            return torch.optim.SGD(params, lr=LR['sgd'])
        return torch.optim.Adam(params, lr=LR['adam'], betas=BETAS, eps=EPS)
    return make


def batch_loss(iteration):
    x, y = batch(iteration)
    return lambda net: loss_fn(net(x), y)


@pytest.mark.parametrize('optimizer', ['sgd', 'adam'])
@pytest.mark.parametrize('ema_every', [1, 10])
def test_composite_of_a_dual_run_equals_the_paper_equations(optimizer, ema_every):
    steps = 23 if ema_every == 10 else 6
    net = network()
    start = {n: p.detach().clone() for n, p in net.named_parameters()}
    group, w, composites = reference(start, optimizer, ema_every, steps)
    algo = LDT(net, LDTConfig(head_warmup_iters=0, profile_iters=PROFILE, ratio_u=RATIO_U, ema_every=ema_every,
                              dpu=True), factory(optimizer))
    for i in range(1, PROFILE + 1):
        algo.update(batch_loss(i), i)
    for step in range(1, steps + 1):
        algo.update(batch_loss(PROFILE + step), PROFILE + step)
        if step == 1:
            assert dict(algo.partition.groups) == group
            assert all(algo.partition.dpu_coefficients[n] == pytest.approx(w[n], abs=1e-15) for n in w)
        composite = algo.composite_state_dict()
        for n, expected in composites[step - 1].items():
            assert torch.allclose(composite[n], expected, rtol=0, atol=1e-12), (step, n)
    # the run exercised both groups and (with ema_every 10) two exchanges
    assert set(group.values()) == {'stable', 'unstable'}
    assert not any(torch.equal(composites[-1][n], start[n]) for n in start)


def test_exchange_happens_exactly_every_ema_every_dual_steps():
    # observed through LDT.update: the frozen layers of both branches (P's unstable, A's stable)
    # change only at dual steps 3, 6, 9 (not one step early, not late)
    net = network(1)
    algo = LDT(net, LDTConfig(head_warmup_iters=0, profile_iters=PROFILE, ratio_u=RATIO_U, ema_every=3),
               factory('adam'))
    for i in range(1, PROFILE + 1):
        algo.update(batch_loss(i), i)
    algo.enter(PROFILE + 1)                                     # the pair exists before its first step
    exchanged = []
    for step in range(1, 11):
        p_before = {n: t.clone() for n, t in algo.primary.state_dict().items()}
        a_before = {n: t.clone() for n, t in algo.auxiliary.state_dict().items()}
        algo.update(batch_loss(PROFILE + step), PROFILE + step)
        p_now, a_now = algo.primary.state_dict(), algo.auxiliary.state_dict()
        moved_p = [not torch.equal(p_now[n], p_before[n]) for n in algo.partition.unstable]
        moved_a = [not torch.equal(a_now[n], a_before[n]) for n in algo.partition.stable]
        assert len(set(moved_p + moved_a)) == 1                 # all frozen layers together, or none
        exchanged.append(moved_p[0])
    assert exchanged == [False, False, True, False, False, True, False, False, True, False]
