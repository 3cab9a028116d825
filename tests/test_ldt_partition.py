"""Partition (eq. 1-2), DPU coefficients (eq. 9-10) and the JSON file."""
import json
import os

import pytest

from basicsr_ldt.ldt import Partition, build_partition, dpu_coefficients, top_n_unstable, unstable_count

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


def test_name_partition_and_forced_layers():
    names = ['body.0.weight', 'body.0.bias', 'conv_last.weight', 'conv_last.bias']
    p = build_partition(names, None, partition='name', ratio_u=0.5, head_patterns=['conv_last'],
                        dpu=False)
    assert p.unstable == ['conv_last.weight', 'conv_last.bias']
    p = build_partition(NAMES, STATS, partition='criterion', ratio_u=0.4,
                        force_stable=['c'], force_unstable=['b'])
    assert p.unstable == ['b', 'e']
    with pytest.raises(ValueError, match="force pattern 'zz'"):
        build_partition(NAMES, STATS, partition='criterion', ratio_u=0.4, force_stable=['zz'])
    with pytest.raises(ValueError, match='both stable and unstable'):
        build_partition(NAMES, STATS, partition='criterion', ratio_u=0.4, force_stable=['a'],
                        force_unstable=['a'])
    with pytest.raises(ValueError, match='match no parameter'):
        build_partition(names, None, partition='name', ratio_u=0.5, head_patterns=['upsample'], dpu=False)


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
    the bottom 60% of 5 layers stable leaves the top 2 unstable, 80% leaves the top one."""
    assert build_partition(NAMES, STATS, partition='criterion', ratio_s=0.6).unstable == ['c', 'e']
    assert build_partition(NAMES, STATS, partition='criterion', ratio_s=0.8).unstable == ['c']


def test_the_partition_file_keeps_each_statistic_and_the_criterion(tmp_path):
    """What users plot from partition.json: every layer's statistic as measured, and the criterion
    that produced it ('name' for a split by names, which has no statistic)."""
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
    with pytest.raises(ValueError, match=message):
        build_partition(NAMES, **kwargs)


def _write(path, layers, **extra):
    json.dump({'version': 1, **extra, 'layers': layers}, open(path, 'w'))
    return str(path)


def test_an_edited_partition_file_is_read_as_written(tmp_path):
    """A partition file edited by hand (``partition_file:``): coefficients at both ends of [0, 1] are
    kept, a statistic may be null (a split by names has none), a file without a criterion reads as
    'var', and a split by names saved and loaded again is the same partition."""
    layers = [dict(name='a', statistic=None, group='stable', coefficient=0.0),
              dict(name='b', statistic=0.5, group='unstable', coefficient=1.0)]
    p = Partition.load(_write(tmp_path / 'edited.json', layers), ['a', 'b'])
    assert p.dpu_coefficients == {'a': 0.0, 'b': 1.0} and [r.statistic for r in p.layers] == [None, 0.5]
    assert p.criterion == 'var'
    by_name = build_partition(['body.weight', 'conv_last.weight'], None, partition='name',
                              head_patterns=['conv_last'], dpu=False)
    by_name.save(str(tmp_path / 'by_name.json'))
    assert Partition.load(str(tmp_path / 'by_name.json'), by_name.names) == by_name


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
    with pytest.raises(ValueError, match=message):
        Partition.load(_write(tmp_path / 'edited.json', layers), ['a', 'b'])
