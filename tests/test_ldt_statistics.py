"""Streaming gradient statistics against hand-computed values."""
import math

import pytest
import torch

from conftest import on_two_gloo_ranks

from basicsr_ldt.ldt import GradientStatistics, random_statistic


def _feed(stats, samples):
    for sample in samples:
        stats.accumulate(sample.items())


def test_two_known_samples_give_exact_var_and_mean():
    # layer a: samples [1, 3] and [5, 7] -> entries 1,3,5,7: mean 4, unbiased var 20/3
    # layer b: samples [-2] and [2] -> entries -2, 2: var 8, mean |g| 2
    stats = GradientStatistics(['a', 'b'])
    _feed(stats, [{'a': torch.tensor([1., 3.]), 'b': torch.tensor([-2.])},
                  {'a': torch.tensor([5., 7.]), 'b': torch.tensor([2.])}])
    assert stats.criterion('var') == pytest.approx([20 / 3, 8.0], rel=1e-15)
    assert stats.criterion('mean') == pytest.approx([4.0, 2.0], rel=1e-15)
    assert stats.criterion('var_over_mean') == pytest.approx([20 / 12, 4.0], rel=1e-15)
    assert stats.samples == 2


def test_var_equals_torch_var_of_the_stacked_gradients():
    torch.manual_seed(0)
    grads = [torch.randn(3, 4) * 1e-3 + 2e-3 for _ in range(7)]
    stats = GradientStatistics(['w'])
    _feed(stats, [{'w': g} for g in grads])
    expected = torch.stack(grads).double().var().item()
    assert stats.criterion('var')[0] == pytest.approx(expected, rel=1e-12)


def test_shifted_sums_stay_accurate_far_from_zero():
    # entries 1e9 + {0, 1, 2, 3}: var 5/3; naive float64 sum of squares loses it entirely
    stats = GradientStatistics(['w'])
    _feed(stats, [{'w': torch.tensor([1e9, 1e9 + 1], dtype=torch.float64)},
                  {'w': torch.tensor([1e9 + 2, 1e9 + 3], dtype=torch.float64)}])
    assert stats.criterion('var')[0] == pytest.approx(5 / 3, rel=1e-12)


def test_state_size_does_not_grow_with_samples():
    stats = GradientStatistics(['w', 'b'])
    sizes = []
    for n in (1, 50):
        while stats.samples < n:
            stats.accumulate([('w', torch.randn(16, 16)), ('b', torch.randn(16))])
        sizes.append(sum(t.numel() for t in stats.state_dict().values() if torch.is_tensor(t)))
    assert sizes[0] == sizes[1] == 5 * 2


def test_merge_equals_single_accumulator_over_the_union():
    torch.manual_seed(1)
    samples = [{'w': torch.randn(5) + 3.0} for _ in range(6)]
    whole, left, right = (GradientStatistics(['w']) for _ in range(3))
    _feed(whole, samples)
    _feed(left, samples[:2])
    _feed(right, samples[2:])
    left.merge_(right)
    assert left.criterion('var') == pytest.approx(whole.criterion('var'), rel=1e-12)
    assert left.criterion('mean') == pytest.approx(whole.criterion('mean'), rel=1e-12)
    assert left.samples == 6


def test_state_dict_round_trip_resumes_exactly():
    samples = [{'w': torch.tensor([float(i), -2.0 * i])} for i in range(5)]
    whole, first = GradientStatistics(['w']), GradientStatistics(['w'])
    _feed(whole, samples)
    _feed(first, samples[:3])
    resumed = GradientStatistics(['w'])
    resumed.load_state_dict(first.state_dict())
    _feed(resumed, samples[3:])
    assert resumed.criterion('var') == whole.criterion('var')
    with pytest.raises(ValueError, match='layer names'):
        GradientStatistics(['x']).load_state_dict(first.state_dict())


def test_missing_gradient_counts_as_zeros_and_unknown_layer_raises():
    net = torch.nn.Linear(2, 1)
    stats = GradientStatistics(['weight', 'bias'])
    net.weight.grad = torch.tensor([[2.0, 2.0]])
    stats.accumulate_module(net)   # bias.grad is None -> zeros
    stats.accumulate_module(net)
    assert stats.criterion('var') == [0.0, 0.0]
    assert stats.criterion('mean') == [2.0, 0.0]
    with pytest.raises(KeyError, match='bias'):
        stats.accumulate([('weight', torch.ones(1, 2))])


def test_random_criterion_is_seeded_and_needs_no_samples():
    stats = GradientStatistics(['a', 'b', 'c'])
    assert stats.criterion('random', seed=3) == random_statistic(3, 3)
    assert random_statistic(3, 3) != random_statistic(3, 4)
    with pytest.raises(ValueError, match='at least 2'):
        stats.criterion('var')
    with pytest.raises(ValueError, match='unknown criterion'):
        stats.criterion('variance')


def test_all_reduce_without_process_group_is_identity():
    from basicsr_ldt.ldt import all_reduce_statistics
    stats = GradientStatistics(['w'])
    _feed(stats, [{'w': torch.tensor([1.0, 2.0])}, {'w': torch.tensor([3.0, 4.0])}])
    before = stats.criterion('var')
    assert all_reduce_statistics(stats).criterion('var') == before
    assert math.isclose(before[0], 5 / 3)


def test_sample_var_is_per_entry_variance_over_iterations_averaged_per_layer():
    # layer a, 3 iterations: entry 0 takes 1, 2, 3 (var 1), entry 1 takes 10, 10, 10 (var 0)
    #   -> sample_var 0.5 ; `var` pools all six entries and is much larger (spread across entries)
    # layer b: -1, 1, 0 -> var 1
    stats = GradientStatistics(['a', 'b'], per_entry=True)
    _feed(stats, [{'a': torch.tensor([1., 10.]), 'b': torch.tensor([-1.])},
                  {'a': torch.tensor([2., 10.]), 'b': torch.tensor([1.])},
                  {'a': torch.tensor([3., 10.]), 'b': torch.tensor([0.])}])
    assert stats.criterion('sample_var') == pytest.approx([0.5, 1.0], rel=1e-15)
    assert stats.criterion('var')[0] > 10


def test_sample_var_and_fisher_match_numpy_on_random_gradients():
    np = pytest.importorskip('numpy')
    rng = np.random.default_rng(0)
    grads = [rng.normal(3e-3, 1e-3, size=(4, 3)) for _ in range(9)]
    stats = GradientStatistics(['w'], per_entry=True)
    _feed(stats, [{'w': torch.from_numpy(g)} for g in grads])
    stacked = np.stack(grads)                                       # [N, 4, 3]
    assert stats.criterion('sample_var')[0] == pytest.approx(stacked.var(axis=0, ddof=1).mean(), rel=1e-12)
    assert stats.criterion('fisher')[0] == pytest.approx((stacked ** 2).mean(), rel=1e-12)


def test_fisher_is_mean_squared_gradient():
    stats = GradientStatistics(['a'])
    _feed(stats, [{'a': torch.tensor([1., -3.])}, {'a': torch.tensor([2., 0.])}])
    assert stats.criterion('fisher') == pytest.approx([(1 + 9 + 4 + 0) / 4], rel=1e-15)


def test_sample_var_state_resumes_merges_and_does_not_grow():
    torch.manual_seed(2)
    samples = [{'w': torch.randn(6) + 1.0} for _ in range(7)]
    whole, first, left, right = (GradientStatistics(['w'], per_entry=True) for _ in range(4))
    _feed(whole, samples)
    _feed(first, samples[:3])
    size = sum(t.numel() for t in first.state_dict()['entry_m2'].values())
    resumed = GradientStatistics(['w'], per_entry=True)
    resumed.load_state_dict(first.state_dict())
    _feed(resumed, samples[3:])
    assert resumed.criterion('sample_var') == pytest.approx(whole.criterion('sample_var'), rel=1e-14)
    assert sum(t.numel() for t in resumed.state_dict()['entry_m2'].values()) == size == 6
    _feed(left, samples[:2])
    _feed(right, samples[2:])
    assert left.merge_(right).criterion('sample_var') == pytest.approx(whole.criterion('sample_var'), rel=1e-12)
    with pytest.raises(ValueError, match='per-entry'):
        GradientStatistics(['w']).load_state_dict(first.state_dict())
    with pytest.raises(ValueError, match='per_entry=True'):
        _feed_two_and_ask(GradientStatistics(['w']))


def _feed_two_and_ask(stats):
    _feed(stats, [{'w': torch.ones(2)}, {'w': torch.zeros(2)}])
    return stats.criterion('sample_var')


def _two_rank_worker(rank, out):
    from basicsr_ldt.ldt import all_reduce_statistics
    samples = _samples_for_ranks()
    stats = GradientStatistics(['w', 'b'], per_entry=True)
    _feed(stats, samples[:3] if rank == 0 else samples[3:])
    all_reduce_statistics(stats)
    if rank == 0:
        torch.save({c: stats.criterion(c) for c in ('sample_var', 'fisher', 'var')} | {'n': stats.samples}, out)


def _samples_for_ranks():
    g = torch.Generator().manual_seed(0)
    return [{'w': torch.randn(5, generator=g, dtype=torch.float64) + 2,
             'b': torch.randn(2, generator=g, dtype=torch.float64)} for _ in range(7)]


def test_all_reduce_over_two_ranks_equals_one_accumulator(tmp_path):
    """``all_reduce_statistics`` over two gloo ranks equals one accumulator over both ranks' samples. It
    runs in spawned ranks, which mutmut cannot see (its 74 mutants show as survivors); applied by
    hand, a wrong mean weight (``stats.samples / local``) and a sample count left local fail it."""
    out = tmp_path / 'rank0.pt'
    on_two_gloo_ranks(_two_rank_worker, str(out))
    got = torch.load(out, weights_only=True)
    whole = GradientStatistics(['w', 'b'], per_entry=True)
    _feed(whole, _samples_for_ranks())
    assert got['n'] == 7
    for criterion in ('sample_var', 'fisher', 'var'):
        assert got[criterion] == pytest.approx(whole.criterion(criterion), rel=1e-12)


def test_merging_several_accumulators_in_turn_equals_one_over_all_samples():
    """Three accumulators merged one after another (as partial profiles are combined) give every
    criterion of one accumulator over all samples, sample_var included: the merged per-entry mean
    feeds the next merge, so a wrong mean shows from the second merge on.
    Mutation testing (issue #33): kills the ``_merge_moments`` mutants that one merge does not show."""
    torch.manual_seed(3)
    samples = [{'w': torch.randn(5) * 2 + 1.0, 'b': torch.randn(2) - 3.0} for _ in range(9)]
    whole, *parts = (GradientStatistics(['w', 'b'], per_entry=True) for _ in range(4))
    _feed(whole, samples)
    for part, chunk in zip(parts, (samples[:2], samples[2:6], samples[6:])):
        _feed(part, chunk)
    merged = parts[0].merge_(parts[1]).merge_(parts[2])
    for criterion in ('var', 'mean', 'sample_var', 'fisher'):
        assert merged.criterion(criterion) == pytest.approx(whole.criterion(criterion), rel=1e-12), criterion
