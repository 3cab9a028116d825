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
