"""CorGrad on problems small enough to check by hand: projection, slicing, smoothing, alpha."""
import math

import pytest
import torch
from torch import nn

from basicsr_ldt.corgrad.algorithm import (CorGrad, CorGradConfig, alpha_at, correct_layer_official,
                                           remove_conflicts, smooth_dominant)


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


def test_conflicting_pair_is_projected_onto_each_others_normal_plane():
    # <g1, g2> = -1 < 0: g1' = g1 - (-1/2) g2 = [0.5, 0.5]; g2' = g2 - (-1/1) g1 = [0, 1]
    (g1, g2), n_f, n_t = remove_conflicts([t(1, 0), t(-1, 1)], slices=1, order=[0, 1])
    assert torch.allclose(g1, t(0.5, 0.5)) and torch.allclose(g2, t(0, 1))
    assert float(g1 @ t(-1, 1)) == pytest.approx(0, abs=1e-15)    # orthogonal after projection
    assert float(g2 @ t(1, 0)) == pytest.approx(0, abs=1e-15)
    assert (n_f, n_t) == (2, 2)


def test_no_conflict_leaves_gradients_unchanged():
    grads = [t(1, 2, 0), t(2, 1, 5), t(0, 1, 1)]
    out, n_f, n_t = remove_conflicts(grads, slices=1, order=[2, 0, 1])
    assert all(torch.equal(a, b) for a, b in zip(out, grads)) and (n_f, n_t) == (0, 6)


def test_slices_find_a_conflict_the_whole_layer_hides():
    # whole vectors: <g1, g2> = -1 + 1 = 0, no conflict; in 2 slices the first conflicts (-1)
    g1, g2 = t(1, 0, 1, 0), t(-1, 1, 1, 1)
    whole, n_f, _ = remove_conflicts([g1, g2], slices=1, order=[0, 1])
    assert n_f == 0 and torch.equal(whole[0], g1)
    (s1, s2), n_f, n_t = remove_conflicts([g1, g2], slices=2, order=[0, 1])
    assert (n_f, n_t) == (2, 4)
    assert torch.allclose(s1, t(0.5, 0.5, 1, 0))                 # slice 2 kept as it was
    assert torch.allclose(s2, t(0, 1, 1, 1))
    assert float(s1[:2] @ g2[:2]) == pytest.approx(0, abs=1e-15)


def test_shapes_and_uneven_slices_are_kept():
    torch.manual_seed(0)
    grads = [torch.randn(3, 7) for _ in range(3)]            # 21 entries in 5 slices of 5,5,5,5,1
    out, _, n_t = remove_conflicts(grads, slices=5, order=[1, 2, 0])
    assert all(o.shape == (3, 7) for o in out) and n_t == 3 * 2 * 5
    tiny, _, n_t = remove_conflicts([t(1.0), t(-2.0)], slices=10, order=[0, 1])   # 1 entry: 1 slice
    assert n_t == 2 and tiny[0].item() == pytest.approx(0) and tiny[1].item() == pytest.approx(0)


def test_camera_order_decides_the_result_like_sequential_gram_schmidt():
    g = [t(1, 0, 0), t(-1, 1, 0), t(-1, 0, 1)]

    def by_hand(i, order):
        out = g[i].clone()
        for j in order:
            if j != i and float(out @ g[j]) < 0:
                out = out - float(out @ g[j]) / float(g[j] @ g[j]) * g[j]
        return out
    for order in ([0, 1, 2], [0, 2, 1]):
        out, _, _ = remove_conflicts(g, slices=1, order=order)
        for i in range(3):
            assert torch.allclose(out[i], by_hand(i, order))
    a, _, _ = remove_conflicts(g, slices=1, order=[0, 1, 2])
    b, _, _ = remove_conflicts(g, slices=1, order=[0, 2, 1])
    assert torch.allclose(a[0], t(0.25, 0.5, 0.25)) and torch.allclose(b[0], t(0.25, 0.25, 0.5))


def test_dominant_gradient_is_smoothed_towards_the_mean():
    # norms 10, 1, 1: mean 4, population std sqrt(18) = 4.24; 10 - 4 > 4.24 -> camera 0 dominant
    grads = [t(10, 0), t(0, 1), t(0, -1)]
    mean = (grads[0] + grads[1] + grads[2]) / 3
    assert smooth_dominant(grads, alpha=0.25) == [0]
    assert torch.allclose(grads[0], 0.25 * t(10, 0) + 0.75 * mean)               # eq. 11
    assert torch.equal(grads[1], t(0, 1)) and torch.equal(grads[2], t(0, -1))
    two = [t(10, 0), t(0, 1)]       # with two cameras nobody is > 1 std above the mean
    assert smooth_dominant(two, alpha=0.0) == [] and torch.equal(two[0], t(10, 0))


def test_two_cameras_are_never_dominant_whatever_the_rounding():
    # |norm - mean| equals the population std identically for two norms; a bare `>` flagged about
    # a quarter of random float32 pairs (one-sided) by rounding alone
    torch.manual_seed(0)
    for _ in range(3000):
        scale = torch.rand(2) * 10 ** torch.randint(-6, 3, (2,)).float()
        pair = [torch.randn(50) * scale[0], torch.randn(50) * scale[1]]
        kept = [g.clone() for g in pair]
        assert smooth_dominant(kept, alpha=0.0) == [] and all(torch.equal(a, b) for a, b in zip(kept, pair))
        summed, _, _ = correct_layer_official([g.view(5, 10).abs() for g in pair], slices=5, alpha=0.0)
        assert torch.equal(summed, pair[0].view(5, 10).abs() + pair[1].view(5, 10).abs())   # no smoothing


@pytest.mark.parametrize('norms, two_sided_expected, one_sided_expected', [
    ((1.0, 2.0, 2.6), [0, 2], [2]),          # 2.6 - mean = 0.733: population std 0.660 < it < sample 0.808
    ((1.0, 2.0, 2.8, 3.0), [0, 3], [3]),     # 3.0 - mean = 0.8:   population std 0.787 < it < sample 0.909
])
def test_dominance_uses_the_population_standard_deviation(norms, two_sided_expected, one_sided_expected):
    n = len(norms)
    mean = sum(norms) / n
    spread = sum((x - mean) ** 2 for x in norms)
    top = max(norms) - mean
    assert math.sqrt(spread / n) < top < math.sqrt(spread / (n - 1))   # the boundary case itself
    # positive, non-parallel directions: no conflict, only the dominance test acts
    directions = [torch.arange(1, 5, dtype=torch.float64) ** k for k in range(n)]
    grads = [x * d / d.norm() for x, d in zip(norms, directions)]
    alpha = 0.25
    paper = [g.clone() for g in grads]
    assert smooth_dominant(paper, alpha) == one_sided_expected         # paper: one-sided, mean of all
    mean_all = sum(grads) / n
    for i in range(n):
        expected = alpha * grads[i] + (1 - alpha) * mean_all if i in one_sided_expected else grads[i]
        assert torch.allclose(paper[i], expected, rtol=0, atol=1e-15)
    summed, n_f, _ = correct_layer_official(grads, slices=5, alpha=alpha)   # official: two-sided
    assert n_f == 0
    rest = sum(g for i, g in enumerate(grads) if i not in two_sided_expected) / (n - len(two_sided_expected))
    expected = sum(alpha * g + (1 - alpha) * rest if i in two_sided_expected else g for i, g in enumerate(grads))
    assert torch.allclose(summed, expected, rtol=0, atol=1e-14)


def test_alpha_schedules_start_at_alpha_and_decay_to_zero():
    log = CorGradConfig(alpha=0.8)
    assert alpha_at(log, 1, 100) == pytest.approx(0.8)
    assert alpha_at(log, 10, 100) == pytest.approx(0.4)        # 0.8 (1 - ln 10 / ln 100)
    assert alpha_at(log, 100, 100) == pytest.approx(0.0)
    linear = CorGradConfig(alpha=0.5, alpha_decay='linear')
    assert [alpha_at(linear, i, 5) for i in (1, 3, 5)] == pytest.approx([0.5, 0.25, 0.0])
    assert alpha_at(CorGradConfig(alpha=0.6, alpha_decay='none'), 50, 100) == 0.6
    values = [alpha_at(log, i, 1000) for i in range(1, 1001)]
    assert all(a >= b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize('options, message', [
    ({'slices': 4}, r"ldt.slices: expected an integer in \[5, 100\], got 4"),
    ({'slices': 101}, r"ldt.slices: expected an integer in \[5, 100\], got 101"),
    ({'alpha': 1.5}, r"ldt.alpha: expected a number in \[0, 1\], got 1.5"),
    ({'alpha_decay': 'exp'}, "ldt.alpha_decay: expected one of 'log', 'linear', 'none', or null, got 'exp'"),
    ({'corgrad_variant': 'github'}, "ldt.corgrad_variant: expected one of 'paper', 'official', got 'github'"),
    ({'slice': 10}, "unknown CorGrad option 'slice'; did you mean 'slices'"),
])
def test_bad_options_name_the_key(options, message):
    with pytest.raises(ValueError, match=message):
        CorGradConfig.from_dict(options)


def test_step_without_conflicts_equals_fine_tuning_on_the_mean_loss():
    torch.manual_seed(0)
    x = torch.randn(6, 3)
    y = x @ torch.tensor([[1.0], [2.0], [-1.0]])
    nets = [nn.Linear(3, 1), nn.Linear(3, 1)]
    nets[1].load_state_dict(nets[0].state_dict())
    loss = lambda rows: (lambda net: (net(x[rows]) - y[rows]).pow(2).mean())  # noqa: E731
    # both "cameras" see the same images: identical gradients never conflict, nobody dominates
    corgrad = CorGrad(nets[0], torch.optim.SGD(nets[0].parameters(), lr=0.1), CorGradConfig(), total_iters=10)
    logs = corgrad.step([loss([0, 1, 2]), loss([0, 1, 2])], iteration=1)
    sgd = torch.optim.SGD(nets[1].parameters(), lr=0.1)
    loss([0, 1, 2])(nets[1]).backward()
    sgd.step()
    assert all(torch.allclose(a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters()))
    assert logs['corgrad_fm'] == 0.0 and logs['corgrad_alpha'] == 1.0
    assert all(p.grad is None for p in nets[0].parameters())


def test_camera_order_is_seeded_and_one_camera_is_refused():
    # the step itself is checked against independent references in test_corgrad_reference.py
    net = nn.Linear(4, 1, bias=False)
    corgrad = CorGrad(net, torch.optim.SGD(net.parameters(), lr=1.0), CorGradConfig(slices=5, seed=3), total_iters=4)
    orders = {tuple(corgrad.camera_order(4, i)) for i in range(1, 30)}
    assert corgrad.camera_order(4, 2) == corgrad.camera_order(4, 2) and len(orders) > 5
    other = CorGrad(net, corgrad.optimizer, CorGradConfig(slices=5, seed=4), total_iters=4)
    assert [other.camera_order(4, i) for i in range(1, 30)] != [corgrad.camera_order(4, i) for i in range(1, 30)]
    with pytest.raises(ValueError, match='at least two source cameras'):
        corgrad.step([lambda m: m(torch.ones(1, 4)).sum()], iteration=3)


def test_a_non_finite_camera_loss_skips_the_whole_step():
    torch.manual_seed(2)
    net = nn.Linear(3, 1)
    start = [p.detach().clone() for p in net.parameters()]
    x = torch.randn(4, 3)
    good = lambda m: m(x).pow(2).mean()  # noqa: E731
    bad = lambda m: m(x).pow(2).mean() * float('nan')  # noqa: E731
    corgrad = CorGrad(net, torch.optim.SGD(net.parameters(), lr=0.5), CorGradConfig(), total_iters=4)
    logs = corgrad.step([good, bad], iteration=1)
    assert math.isnan(logs['l_corgrad'])
    assert all(torch.equal(a, b) for a, b in zip(start, net.parameters()))
    assert all(p.grad is None for p in net.parameters())
    corgrad.step([good, good], iteration=2)                # the next finite step trains again
    assert not all(torch.equal(a, b) for a, b in zip(start, net.parameters()))
