"""Partition (eq. 1-2), DPU coefficients (eq. 9-10), the JSON file, and which names a pattern selects."""
import functools
import json
import os

import pytest

from basicsr_ldt.ldt import (Partition, build_partition, dpu_coefficients, forced_layers, head_layers, top_n_unstable,
                             unstable_count)

NAMES = ['a', 'b', 'c', 'd', 'e']
STATS = [0.3, 0.1, 0.5, 0.2, 0.4]   # ranking high -> low: c, e, a, d, b


def test_top_share_by_statistic_is_unstable():
    assert top_n_unstable(STATS, 0.4) == [False, False, True, False, True]   # 2 of 5: c, e


@pytest.mark.parametrize('n, ratio, expected', [
    (5, 0.5, 3),    # 2.5 rounds half up (official code at 0.5: 5 - int(2.5) = 3)
    (10, 0.45, 5),  # 4.5 -> 5
    (10, 0.44, 4),
    (74, 0.5, 37),
    (4, 0.01, 1),   # both groups keep a layer
    (4, 0.99, 3),
])
def test_unstable_count_rounding(n, ratio, expected):
    assert unstable_count(n, ratio) == expected


def test_ties_break_by_layer_order():
    assert top_n_unstable([1.0, 1.0, 1.0, 1.0], 0.5) == [True, True, False, False]
    assert dpu_coefficients([1.0, 1.0], 0.5, 0.5) == [0.5, 0.75]


def test_dpu_values_for_known_ranking():
    # ascending ranks of [0.3, 0.1, 0.5] are [1, 0, 2]; N = 3
    assert dpu_coefficients([0.3, 0.1, 0.5], 0.99, 0.01) == pytest.approx(
        [0.99 + 0.01 / 3, 0.99, 0.99 + 0.02 / 3], abs=1e-15)


def test_build_partition_groups_and_coefficients():
    p = build_partition(NAMES, STATS, partition='criterion', ratio_u=0.4)
    assert p.unstable == ['c', 'e'] and p.stable == ['a', 'b', 'd']
    w = p.dpu_coefficients
    assert w['e'] == pytest.approx(0.999) and w['c'] == pytest.approx(0.9995)      # N_U = 2
    assert [w['b'], w['d'], w['a']] == pytest.approx([0.99, 0.99 + 0.01 / 3, 0.99 + 0.02 / 3])
    fixed = build_partition(NAMES, STATS, partition='criterion', ratio_u=0.4, dpu=False, w_fixed=0.9)
    assert set(fixed.dpu_coefficients.values()) == {0.9}
    assert p.criterion == 'var'   # the default criterion, recorded in the partition file, is the paper's variance


def test_name_partition_and_forced_layers():
    names = ['body.0.weight', 'body.0.bias', 'conv_last.weight', 'conv_last.bias']
    p = build_partition(names, None, partition='name', ratio_u=0.5, head_patterns=['conv_last'],
                        dpu=False)
    assert p.unstable == ['conv_last.weight', 'conv_last.bias']
    p = build_partition(NAMES, STATS, partition='criterion', ratio_u=0.4,
                        force_stable=['c'], force_unstable=['b'])
    assert p.unstable == ['b', 'e']
    with pytest.raises(ValueError, match=r"^ldt\.force_stable: pattern 'zz' matches no parameter of the network"):
        build_partition(NAMES, STATS, partition='criterion', ratio_u=0.4, force_stable=['zz'])
    with pytest.raises(ValueError, match='both stable and unstable'):
        build_partition(NAMES, STATS, partition='criterion', ratio_u=0.4, force_stable=['a'],
                        force_unstable=['a'])
    with pytest.raises(ValueError, match='match no parameter'):
        build_partition(names, None, partition='name', ratio_u=0.5, head_patterns=['upsample'], dpu=False)


def test_a_name_pattern_error_names_the_network_and_the_parameters_to_look_at():
    """A head pattern that selects nothing shows the network's last parameters (where a head is), a
    force pattern its first ones, layers forced into both groups the first five; the network is
    named as the caller says (the model's class), else 'the network'."""
    names = [f'body.{i}.weight' for i in range(8)] + ['conv_last.weight', 'conv_last.bias']
    with pytest.raises(ValueError) as caught:
        head_layers(names, ['upsample', 'conv_hr'])
    assert str(caught.value) == ("ldt.head_patterns ['upsample', 'conv_hr'] match no parameter of the network (its "
                                 'last parameters: body.6.weight, body.7.weight, conv_last.weight, conv_last.bias)')
    with pytest.raises(ValueError) as caught:
        build_partition(names, None, partition='name', head_patterns=['upsample'], dpu=False, network='SAFMN')
    assert str(caught.value).startswith("ldt.head_patterns ['upsample'] match no parameter of SAFMN (its last")
    with pytest.raises(ValueError) as caught:
        forced_layers(names, force_stable=['body.0'], force_unstable=['conv_first'])
    assert str(caught.value) == ("ldt.force_unstable: pattern 'conv_first' matches no parameter of the network (its "
                                 'first parameters: body.0.weight, body.1.weight, body.2.weight, body.3.weight)')
    with pytest.raises(ValueError) as caught:
        forced_layers(names, force_stable=['body.*'], force_unstable=['conv_last', 'body.*.weight'])
    assert str(caught.value) == ("layers forced both stable and unstable: ldt.force_stable 'body.*' and "
                                 "ldt.force_unstable 'body.*.weight' both select ['body.0.weight', 'body.1.weight', "
                                 "'body.2.weight', 'body.3.weight', 'body.4.weight']")
    from basicsr_ldt.ldt.partition import deft_blocks
    assert deft_blocks(['conv_first.weight', 'layers.0.norm.weight', 'layers.1.x', 'norm.weight']) == [
        'layers.0.norm.weight', 'layers.1.x']
    with pytest.raises(ValueError) as caught:
        build_partition(names, None, partition='name', deft_grouping='non_layers', dpu=False)
    assert str(caught.value) == ("ldt.deft_grouping 'non_layers' needs 'layers.*' parameters, and the network has none "
                                 '(first names: body.0.weight, body.1.weight, body.2.weight, body.3.weight); use '
                                 'deft_grouping: head')


def test_invalid_ratio_and_statistics():
    with pytest.raises(ValueError, match='ratio_u'):
        top_n_unstable(STATS, 1.0)
    with pytest.raises(ValueError, match='finite'):
        top_n_unstable([1.0, float('nan')], 0.5)


def test_json_round_trip_and_validation(tmp_path):
    p = build_partition(NAMES, STATS, partition='criterion', ratio_u=0.4)
    path = str(tmp_path / 'sub' / 'partition.json')
    p.save(path)
    assert os.listdir(tmp_path / 'sub') == ['partition.json']   # no temp file left behind
    assert Partition.load(path, NAMES) == p
    with pytest.raises(ValueError, match=r'partition\.json does not match the model: 1 model '
                                         r"parameters missing \(e\.g\. \['f'\]\)"):
        Partition.load(path, NAMES + ['f'])
    with pytest.raises(ValueError, match="names not in the model"):
        Partition.load(path, NAMES[:-1])
    data = json.load(open(path))
    data['layers'][0]['group'] = 'frozen'
    json.dump(data, open(path, 'w'))
    with pytest.raises(ValueError, match="group 'frozen'"):
        Partition.load(path)
    open(path, 'w').write('{not json')
    with pytest.raises(ValueError, match='cannot read partition file'):
        Partition.load(path)


def test_ratio_s_gives_the_stable_share():
    """``ratio_s`` (the official code's ``Par_ratio``) sets the stable share instead of ``ratio_u``:
    the bottom 60% of 5 layers stable leaves the top 2 unstable, 80% leaves the top one.
    Mutation testing (issue #33): kills the ``build_partition`` mutant that ignored ``ratio_s``."""
    assert build_partition(NAMES, STATS, partition='criterion', ratio_s=0.6).unstable == ['c', 'e']
    assert build_partition(NAMES, STATS, partition='criterion', ratio_s=0.8).unstable == ['c']


def test_the_partition_file_keeps_each_statistic_and_the_criterion(tmp_path):
    """What users plot from partition.json: every layer's statistic as measured, and the criterion
    that produced it ('name' for a split by names, which has no statistic).
    Mutation testing (issue #33): kills the mutants that left the statistics or the criterion out of
    partition.json."""
    p = build_partition(NAMES, STATS, partition='criterion', ratio_u=0.4, criterion='mean')
    p.save(str(tmp_path / 'partition.json'))
    data = json.load(open(tmp_path / 'partition.json'))
    assert data['criterion'] == 'mean'
    assert [layer['statistic'] for layer in data['layers']] == STATS
    names = ['body.0.weight', 'conv_last.weight']
    by_name = build_partition(names, None, partition='name', head_patterns=['conv_last'], dpu=False,
                              criterion='mean')
    assert by_name.criterion == 'name' and [r.statistic for r in by_name.layers] == [None, None]


@pytest.mark.parametrize('kwargs, message', [
    (dict(statistics=STATS[:4], partition='criterion', ratio_u=0.4),
     r'^build_partition: one statistic per layer expected$'),
    (dict(statistics=None, partition='criterion', ratio_u=0.4),
     r"^partition 'criterion' needs per-layer statistics$"),
    (dict(statistics=None, partition='name', head_patterns=['e']),
     r'^DPU coefficients need per-layer statistics$'),
    (dict(statistics=STATS, partition='layers', ratio_u=0.4),
     r"^unknown partition 'layers', expected 'criterion' or 'name'$"),
    (dict(statistics=STATS[:4] + [float('inf')], partition='name', head_patterns=['e'], dpu=False),
     r'^build_partition: statistics must be finite$'),
])
def test_each_wrong_partition_request_says_what_is_wrong(kwargs, message):
    """Each request ``build_partition`` cannot serve is a ValueError whose message says what is wrong.
    Mutation testing (issue #33): kills the mutants that raised without the message."""
    with pytest.raises(ValueError, match=message):
        build_partition(NAMES, **kwargs)


def _write(path, layers, **extra):
    json.dump({'version': 1, **extra, 'layers': layers}, open(path, 'w'))
    return str(path)


def test_an_edited_partition_file_is_read_as_written(tmp_path):
    """A partition file edited by hand (``partition_file:``): coefficients at both ends of [0, 1] are
    kept, a statistic may be null (a split by names has none), a file without a criterion reads as
    'var', and a split by names saved and loaded again is the same partition.
    Mutation testing (issue #33): kills the mutants of ``Partition.from_dict`` / ``validate`` that
    refused coefficients 0 or 1, could not read a null statistic, or read a missing criterion as 'None'."""
    layers = [dict(name='a', statistic=None, group='stable', coefficient=0.0),
              dict(name='b', statistic=0.5, group='unstable', coefficient=1.0)]
    p = Partition.load(_write(tmp_path / 'edited.json', layers), ['a', 'b'])
    assert p.dpu_coefficients == {'a': 0.0, 'b': 1.0} and [r.statistic for r in p.layers] == [None, 0.5]
    assert p.criterion == 'var'
    by_name = build_partition(['body.weight', 'conv_last.weight'], None, partition='name',
                              head_patterns=['conv_last'], dpu=False)
    by_name.save(str(tmp_path / 'by_name.json'))
    assert Partition.load(str(tmp_path / 'by_name.json'), by_name.names) == by_name


def test_the_partition_file_says_which_layers_a_force_pattern_placed(tmp_path):
    """``forced`` in partition.json marks the layers a force pattern, not their statistic, put into
    their group (the picture hatches them); it survives saving, loading and rescaling, a file written
    before the field existed reads as nothing forced, and a value that is not true/false is refused."""
    from basicsr_ldt.ldt.ema_horizon import scale_partition
    p = build_partition(NAMES, STATS, partition='criterion', ratio_u=0.4, force_stable=['c'], force_unstable=['b'])
    assert p.forced == ['b', 'c']   # layer order; 'e' is unstable by its statistic alone
    p.save(str(tmp_path / 'partition.json'))
    assert [layer['forced'] for layer in json.load(open(tmp_path / 'partition.json'))['layers']] == [
        False, True, True, False, False]
    assert Partition.load(str(tmp_path / 'partition.json'), NAMES) == p
    assert scale_partition(p, 20000, {'stable': 450, 'unstable': 450}).forced == ['b', 'c']
    older = [dict(name='a', statistic=1.0, group='stable', coefficient=0.9),
             dict(name='b', statistic=2.0, group='unstable', coefficient=0.9)]
    assert Partition.load(_write(tmp_path / 'older.json', older), ['a', 'b']).forced == []
    with pytest.raises(ValueError, match=r"layer 'b' has forced 'yes', expected true or false$"):
        Partition.load(_write(tmp_path / 'edited.json', [older[0], dict(older[1], forced='yes')]), ['a', 'b'])


@pytest.mark.parametrize('layers, message', [
    ([dict(name='a', statistic=1.0, group='stable', coefficient=1.01),
      dict(name='b', statistic=2.0, group='unstable', coefficient=0.9)],
     r"layer 'a' has coefficient 1\.01, expected a value in \[0, 1\]$"),
    ([dict(name='a', statistic=1.0, group='stable', coefficient=0.9),
      dict(name='b', statistic=2.0, group='stable', coefficient=0.9)],
     r'both groups need at least one layer \(2 stable, 0 unstable\)$'),
    ([dict(name='a', statistic=1.0, group='stable', coefficient=0.9),
      dict(name='b', statistic=2.0, group='unstable', coefficient=0.9),
      dict(name='b', statistic=2.0, group='unstable', coefficient=0.9)],
     r"does not match the model: duplicated names \['b'\]$"),
])
def test_a_partition_file_that_cannot_be_trained_with_is_refused_by_name(tmp_path, layers, message):
    """A hand-edited partition file with a coefficient outside [0, 1], an empty group or a duplicated
    layer is refused, naming it. Mutation testing (issue #33): kills the mutants of
    ``Partition.validate`` that accepted an empty group or a duplicated layer."""
    with pytest.raises(ValueError, match=message):
        Partition.load(_write(tmp_path / 'edited.json', layers), ['a', 'b'])


# ---------------------------------------------------------------- which names a pattern selects
@functools.lru_cache(maxsize=None)
def released_names(config):
    """The parameter names (named_parameters, the layers LDT partitions) of a released configuration,
    built on the meta device from the upstream configuration recorded in tests/data/arch_keys."""
    import torch
    from basicsr.utils.registry import ARCH_REGISTRY
    with open(os.path.join(os.path.dirname(__file__), 'data', 'arch_keys', f'{config}.json')) as handle:
        network_g = dict(json.load(handle)['network_g'])
    with torch.device('meta'):
        network = ARCH_REGISTRY.get(network_g.pop('type'))(**network_g)
    return tuple(name for name, _ in network.named_parameters())


MAMBAIR_BLOCKS = [(g, b) for g in range(6) for b in range(6)]   # released MambaIR SR: 6 groups of 6 blocks
SR_HEAD = ['conv_before_upsample.0.weight', 'conv_before_upsample.0.bias', 'upsample.0.weight', 'upsample.0.bias',
           'upsample.2.weight', 'upsample.2.bias', 'conv_last.weight', 'conv_last.bias']


def under(prefix):
    """Every name inside module ``prefix`` (the module itself, a dot, then anything)."""
    return lambda names: [n for n in names if n.startswith(prefix + '.')]


@pytest.mark.parametrize('config, pattern, expected', [
    # A module-prefix pattern stops at the dot: skip_scale is not skip_scale2, layers.1 not layers.10/11.
    ('MambaIR_SR_x4', '*.skip_scale', [f'layers.{g}.residual_group.blocks.{b}.skip_scale' for g, b in MAMBAIR_BLOCKS]),
    ('MambaIR_SR_x4', '*.skip_scale2', [f'layers.{g}.residual_group.blocks.{b}.skip_scale2' for g, b in MAMBAIR_BLOCKS]),
    ('HAT-L_SRx4', 'layers.1', under('layers.1')),
    ('HAT-L_SRx4', 'layers.10', under('layers.10')),
    ('HAT-L_SRx4', 'layers.1*', lambda names: under('layers.1')(names) + under('layers.10')(names)
     + under('layers.11')(names)),        # a glob the user writes does take layers.10 and layers.11
    ('SAFMN-L_x4', 'feats.1', under('feats.1')),
    ('SAFMN-L_x4', 'feats.1.*', under('feats.1')),
    # The name's start is a boundary too: 'norm' is the final norm, not patch_embed.norm or norm1/norm2.
    ('HAT_SRx4', 'norm', ['norm.weight', 'norm.bias']),
    ('HAT_SRx4', 'conv_first.weight', ['conv_first.weight']),
    # The shipped head patterns on each network.
    ('MambaIR_SR_x4', 'SR_HEAD_PATTERNS', SR_HEAD),
    ('HAT-L_SRx4', 'SR_HEAD_PATTERNS', SR_HEAD),
    ('HAT_SRx4', 'SR_HEAD_PATTERNS', SR_HEAD),
    ('MambaIR_lightSR_x4', 'SR_HEAD_PATTERNS', ['upsample.0.weight', 'upsample.0.bias']),
    ('SAFMN-L_x4', 'SR_HEAD_PATTERNS', ['to_img.0.weight', 'to_img.0.bias']),
    ('SAFMN_x4', 'SR_HEAD_PATTERNS', ['to_img.0.weight', 'to_img.0.bias']),
])
def test_a_pattern_selects_exactly_the_names_it_names(config, pattern, expected):
    """Each pattern selects exactly the parameters it names on the released networks (a module prefix
    stops at a dot). Pins issue #40's slip in ``partition.matches`` (``'*'`` for ``'.*'``:
    ``layers.1`` also taking ``layers.10``), which mutmut does not generate."""
    from basicsr_ldt.ldt import SR_HEAD_PATTERNS, select
    names = released_names(config)
    patterns = SR_HEAD_PATTERNS if pattern == 'SR_HEAD_PATTERNS' else [pattern]
    expected = expected(names) if callable(expected) else expected
    order = {n: i for i, n in enumerate(names)}
    assert set(expected) <= set(names) and expected
    assert select(names, patterns) == sorted(expected, key=order.get)


def test_force_stable_takes_skip_scale_and_leaves_skip_scale2_to_the_statistic():
    """``force_stable: ['*.skip_scale']`` on the released MambaIR: every skip_scale is stable and
    only those are forced; the skip_scale2 tensors and conv_last, which the statistic ranks highest,
    stay unstable.
    With the test above it pins issue #40's ``partition.matches`` slip (``'*'`` for ``'.*'``)."""
    names = released_names('MambaIR_SR_x4')
    top = [n.endswith(('.skip_scale', '.skip_scale2')) or n.startswith('conv_last.') for n in names]
    stats = [10.0 + i if t else 1.0 / (1 + i) for i, t in enumerate(top)]
    partition = build_partition(names, stats, partition='criterion', ratio_u=sum(top) / len(names),
                                force_stable=['*.skip_scale'])
    groups = partition.groups
    assert [n for n in names if groups[n] == 'unstable'] == [
        n for n in names if n.endswith('.skip_scale2') or n.startswith('conv_last.')]
    assert all(groups[n] == 'stable' for n in names if n.endswith('.skip_scale'))
