"""The study report's two statistics a reader takes at face value: the bootstrap interval is the
level it is labelled with (checked against the exact bootstrap distribution, enumerated here),
and the Mean column leaves out the cameras a run trained on even when they were tested."""
import itertools
import math
from collections import Counter

import pytest

from basicsr_ldt.study import plan, report
from test_study import record, tiny_study


def exact_bootstrap_cdf(values):
    """Distribution of the mean of n draws with replacement from ``values``: every multiset of
    indices with its multinomial probability n! / (k_1! ... k_n!) / n^n."""
    n = len(values)
    atoms = Counter()
    for draw in itertools.combinations_with_replacement(range(n), n):
        counts = Counter(draw)
        ways = math.factorial(n)
        for k in counts.values():
            ways //= math.factorial(k)
        atoms[sum(values[i] for i in draw) / n] += ways / n ** n

    def cdf(x, strict=False):
        return sum(p for mean, p in atoms.items() if (mean < x if strict else mean <= x))
    return cdf


@pytest.mark.parametrize('values', [[0.1, 0.4, 0.5, 1.3, 2.0, 2.2, 3.1], [-1.0, 0.2, 0.3, 0.35, 0.9, 1.7, 4.0]])
def test_bootstrap_interval_has_the_labelled_level(values):
    level = report.BOOTSTRAP['level']
    assert level == 0.95
    low, high = report.bootstrap_ci(values)
    cdf = exact_bootstrap_cdf(values)
    tail = (1 - level) / 2                                  # 2.5% of resampled means below, 2.5% above
    # 10000 resamples: the empirical tail is within about +-0.3% (two standard errors) of 2.5%;
    # a 90% interval would put 5% in each tail
    assert cdf(low, strict=True) <= tail + 0.006 and cdf(low) >= tail - 0.006, (cdf(low, True), cdf(low))
    assert 1 - cdf(high) <= tail + 0.006 and 1 - cdf(high, strict=True) >= tail - 0.006
    assert f"{level:.0%}" == '95%'


def test_mean_column_leaves_out_a_tested_source_camera(tmp_path, demo_data):
    study = plan.load_study(tiny_study(tmp_path, demo_data), str(tmp_path))
    # trained on Olympus and tested there too: Olympus must not enter the Mean
    records = [record('FT', 0, {'Olympus': 30.0, 'Sony': 20.0, 'Canon': 22.0}),
               record('FT', 1, {'Olympus': 31.0, 'Sony': 21.0, 'Canon': 22.0}),
               record('LDT', 0, {'Olympus': 29.0, 'Sony': 21.0, 'Canon': 23.0}),
               record('LDT', 1, {'Olympus': 33.0, 'Sony': 20.0, 'Canon': 22.0})]
    assert report.with_mean(records[0])['Mean'] == pytest.approx({'psnr': 21.0, 'ssim': 0.21})
    result = report.aggregate(study, records)
    ft, ldt = result['summary']
    assert ft['cameras']['Mean']['psnr'] == pytest.approx({'mean': 21.25, 'std': 0.5 ** 0.5 / 2})   # 21, 21.5
    assert ft['cameras']['Olympus']['psnr']['mean'] == pytest.approx(30.5)                       # still shown
    (diff,) = result['differences']
    # LDT - FT over Sony and Canon only: seed 0 +1.0, seed 1 -0.5 (Olympus: -1, +2 would give other values)
    assert diff['cameras']['Mean']['psnr'] == pytest.approx({'mean': 0.25, 'ci_low': -0.5, 'ci_high': 1.0})
    text = report.markdown(result)
    assert '30.50 ± 0.71 (source)' in text and '21.25 ± 0.35' in text
