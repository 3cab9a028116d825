"""Parity options with the official LDT script: the stable share (ratio_s), profiling outside
total_iter in file order, and the official DeFT grouping; each checked against the official rule."""
import numpy as np
import pytest
import torch

from basicsr_ldt.ldt import LDT, LDTConfig, build_partition, preset, top_n_unstable
from test_ldt_algorithm import CFG, _factory, _loss, _net


def official_stable(statistics, ratio):
    """ZaizuoTang/LDT Utils/Selecte_layer_tools.py, Get_specific_name: argsort ascending, the first
    int(N * Par_ratio) layers are the stable ("Spe") ones, the rest unstable ("Inv")."""
    order = np.argsort(np.asarray(statistics))
    return set(order[:int(len(statistics) * ratio)].tolist())


@pytest.mark.parametrize('n', [2, 5, 10, 37, 100, 311])
@pytest.mark.parametrize('ratio_s', [0.1, 0.3, 0.45, 0.5, 0.6, 0.9])
def test_ratio_s_follows_the_official_rule_and_complements_ratio_u(n, ratio_s):
    statistics = torch.rand(n, generator=torch.Generator().manual_seed(n), dtype=torch.float64).tolist()
    by_s = top_n_unstable(statistics, ratio_s=ratio_s)
    by_u = top_n_unstable(statistics, 1.0 - ratio_s)
    stable_s = {i for i, u in enumerate(by_s) if not u}
    if 1 <= int(n * ratio_s) <= n - 1:  # inside the clamp (both groups keep a layer)
        assert stable_s == official_stable(statistics, ratio_s)
    # Same statistics, complementary shares: the same sets, up to the one boundary layer that
    # truncation (ratio_s) and round-half-up (ratio_u) may place differently.
    assert sum(a != b for a, b in zip(by_s, by_u)) <= 1
    if (n * ratio_s).is_integer():   # a whole number of stable layers: both rules agree exactly
        assert by_s == by_u


def test_ratio_s_at_one_half_equals_ratio_u_at_one_half():
    statistics = [0.3, 0.1, 0.9, 0.5, 0.7, 0.2, 0.8]    # odd count: 3 stable (int 3.5), 4 unstable
    assert top_n_unstable(statistics, ratio_s=0.5) == top_n_unstable(statistics, 0.5)
    assert sum(top_n_unstable(statistics, ratio_s=0.5)) == 4


@pytest.mark.parametrize('options, message', [
    ({'ratio_u': 0.4, 'ratio_s': 0.5}, "ldt.ratio_s: expected either ratio_u .* or ratio_s .*not both"),
    ({'ratio_s': 1.0}, r"ldt.ratio_s: expected a number in \(0, 1\), got 1.0"),
    ({'ratio_s': 'half'}, r"ldt.ratio_s: expected a number in \(0, 1\), got 'half'"),
    ({'ratio_u': None}, "ldt.ratio_s: expected exactly one of ratio_u \\(unstable share\\) and ratio_s"),
    ({'profile_order': 'sorted'}, "ldt.profile_order: expected one of 'shuffled', 'file_order', got 'sorted'"),
    ({'profile_order': 'file_order'}, "ldt.profile_counts_in_total_iter: expected false with profile_order 'file_order'"),
    ({'profile_counts_in_total_iter': 'no'}, "ldt.profile_counts_in_total_iter: expected true or false, got 'no'"),
    ({'deft_grouping': 'layers'}, "ldt.deft_grouping: expected one of 'head', 'non_layers', got 'layers'"),
    ({'deft_grouping': 'non_layers'}, "applies to partition 'name' only"),
])
def test_parity_option_errors(options, message):
    with pytest.raises(ValueError, match=message):
        LDTConfig.from_dict(options)


def test_ratio_s_round_trips_and_defaults_stay():
    cfg = LDTConfig.from_dict({'ratio_s': 0.5})
    assert (cfg.ratio_u, cfg.ratio_s) == (None, 0.5) and LDTConfig.from_dict(cfg.to_dict()) == cfg
    default = LDTConfig()
    assert (default.ratio_u, default.ratio_s, default.profile_order, default.profile_counts_in_total_iter,
            default.deft_grouping) == (0.4, None, 'shuffled', True, 'head')


def test_profiling_outside_total_iter():
    cfg = LDTConfig(**{**CFG, 'profile_counts_in_total_iter': False})
    algo = LDT(_net(), cfg, _factory)
    assert [algo.phase(i) for i in range(1, 5)] == ['warmup'] * 2 + ['train'] * 2
    algo.update(_loss(1), 1)
    algo.update(_loss(2), 2)
    with pytest.raises(ValueError, match=r'call LDT.profile'):
        algo.update(_loss(3), 3)
    algo = LDT(_net(), cfg, _factory)
    [algo.update(_loss(i), i) for i in (1, 2)]
    assert algo.profile(_loss(100 + k) for k in range(5)) == 5 and algo.statistics.samples == 5
    assert set(algo.update(_loss(3), 3)) == {'l_primary', 'l_auxiliary'}
    # Counted profiling of the same batches gives the same partition.
    counted = LDT(_net(), LDTConfig(**{**CFG, 'profile_iters': 5}), _factory)
    [counted.update(_loss(i), i) for i in (1, 2)]
    [counted.update(_loss(100 + k), 3 + k) for k in range(5)]
    counted.enter(8)
    assert counted.partition == algo.partition


def test_state_of_an_older_version_without_the_new_options_still_resumes():
    algo = LDT(_net(), LDTConfig(**CFG), _factory)
    [algo.update(_loss(i), i) for i in range(1, 7)]
    state = algo.state_dict()
    for key in ('ratio_s', 'profile_order', 'profile_counts_in_total_iter', 'deft_grouping'):
        del state['config'][key]
    LDT(_net(), LDTConfig(**CFG), _factory).load_state_dict(state)
    with pytest.raises(ValueError, match='profile_order'):
        LDT(_net(), LDTConfig(**{**CFG, 'profile_order': 'file_order', 'profile_counts_in_total_iter': False}),
            _factory).load_state_dict(state)


def test_deft_non_layers_grouping_is_the_official_split():
    """``ldt.deft_grouping: non_layers`` is the official code's split (``Get_DLDFT_name``: every
    ``layers`` tensor in one group, the rest in the other). Outside the mutation selection: the
    ``build_partition`` mutant that dropped this grouping survived mutmut only for that reason."""
    from archs.mambair_arch import MambaIR
    network = MambaIR(upscale=4, img_size=16, embed_dim=8, depths=[1, 1], d_state=4, mlp_ratio=1.0,
                      upsampler='pixelshuffle')
    names = [n for n, _ in network.named_parameters()]
    partition = build_partition(names, None, partition='name', deft_grouping='non_layers', dpu=False, w_fixed=0.9999)
    # Official Get_DLDFT_name: every name containing "layers" in one list, the rest in the other.
    assert set(partition.stable) == {n for n in names if 'layers' in n}
    assert {n.split('.')[0] for n in partition.unstable} == {
        'conv_first', 'patch_embed', 'norm', 'conv_after_body', 'conv_before_upsample', 'upsample', 'conv_last'}
    head = build_partition(names, None, partition='name', head_patterns=preset('deft').head_patterns, dpu=False)
    assert set(head.unstable) < set(partition.unstable)
    with pytest.raises(ValueError, match="needs 'layers"):
        build_partition(['conv.weight', 'to_img.weight'], None, partition='name', deft_grouping='non_layers',
                        dpu=False)
