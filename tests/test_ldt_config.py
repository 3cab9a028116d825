"""LDTConfig validation: typos and out-of-range values fail with a useful message."""
import pytest

from basicsr_ldt.ldt import PRESETS, LDTConfig, preset


def test_defaults_are_the_paper_settings():
    cfg = LDTConfig()
    assert (cfg.criterion, cfg.ema_every, cfg.w_fixed, cfg.profile_iters) == ('var', 10, 0.99, 300)
    assert (cfg.w_base_stable, cfg.r_base_stable, cfg.w_base_unstable, cfg.r_base_unstable) == (
        0.99, 0.01, 0.999, 0.001)


def test_unknown_key_suggests_the_closest():
    with pytest.raises(ValueError, match="unknown LDT option 'ratio_U'; did you mean 'ratio_u'"):
        LDTConfig.from_dict({'ratio_U': 0.5})
    with pytest.raises(ValueError, match="did you mean 'ema_every'"):
        LDTConfig.from_dict({'ema_evry': 5})
    with pytest.raises(ValueError, match='valid keys'):
        LDTConfig.from_dict({'zzzz': 1})


@pytest.mark.parametrize('options, message', [
    ({'ratio_u': 0.0}, 'ratio_u'),
    ({'ratio_u': 1.2}, 'ratio_u'),
    ({'ema_every': 0}, 'ema_every'),
    ({'criterion': 'variance'}, 'criterion'),
    ({'mode': 'triple'}, 'mode'),
    ({'head_warmup_iters': -1}, 'head_warmup_iters'),
    ({'w_fixed': 1.0}, 'w_fixed'),
    ({'w_base_unstable': 0.999, 'r_base_unstable': 0.01}, 'w_base_unstable'),
    ({'profile_iters': 1}, 'profile_iters'),
    ({'partition_file': 'p.json'}, 'profile_iters'),
    ({'mode': 'single', 'profile_iters': 5}, 'single'),
    ({'head_warmup_iters': 3, 'head_patterns': []}, 'head_patterns'),
])
def test_invalid_values_raise(options, message):
    with pytest.raises(ValueError, match=message):
        LDTConfig.from_dict(options)


def test_presets_and_round_trip():
    for name in PRESETS:
        cfg = preset(name)
        assert LDTConfig.from_dict(cfg.to_dict()) == cfg
    deft = preset('deft')
    assert (deft.partition, deft.dpu, deft.w_fixed, deft.ema_every) == ('name', False, 0.9999, 1)
    assert not preset('ldt_random', dpu=False, profile_iters=0).needs_profiling()
    with pytest.raises(ValueError, match="did you mean 'deft'"):
        preset('deft_')


@pytest.mark.parametrize('options', [
    {'w_fixed': 0.0},                                   # [0, 1): 0 is allowed (no averaging)
    {'w_base_stable': 0.0, 'r_base_stable': 1.0},       # r_base in [0, 1]: both ends allowed
    {'w_base_unstable': 0.5, 'r_base_unstable': 0.0},
    {'ema_every': 1, 'interval_iters': 1, 'head_warmup_iters': 0},   # integers at their lowest
    {'ratio_u': 0.01}, {'ratio_u': 0.99},
    {'overlap_branches': True, 'overlap_memory': 1.0},  # the sequential step's peak: [1, inf)
    {'overlap_branches': False, 'overlap_memory': 1.0},  # the defaults' bound, the overlap turned off
    {'overlap_branches': False, 'overlap_memory': None},
    {'overlap_branches': 'auto', 'overlap_memory': None},
    {'overlap_branches': 'auto', 'overlap_memory': 1.05},   # a bound for wherever 'auto' overlaps
])
def test_values_at_the_ends_of_their_ranges_are_accepted(options):
    """Each documented range includes its closed ends: a value exactly there is taken as given.
    Mutation testing (issue #33): kills the range mutants that refused ``w_fixed: 0`` or
    ``r_base_*: 1``."""
    config = LDTConfig.from_dict(options)
    assert {k: getattr(config, k) for k in options} == options


@pytest.mark.parametrize('options, message', [
    ({'w_fixed': 1.0}, r'^ldt\.w_fixed: expected a number in \[0, 1\), got 1\.0$'),
    ({'w_base_stable': 1.0, 'r_base_stable': 0.0}, r'^ldt\.w_base_stable: expected a number in \[0, 1\), got 1\.0$'),
    ({'w_base_stable': 0.0, 'r_base_stable': 1.5}, r'^ldt\.r_base_stable: expected a number in \[0, 1\], got 1\.5$'),
    ({'r_base_unstable': -0.001}, r'^ldt\.r_base_unstable: expected a number in \[0, 1\], got -0\.001$'),
    ({'ratio_u': 1.0}, r'^ldt\.ratio_u: expected a number in \(0, 1\), got 1\.0$'),
    ({'ratio_u': 0.0}, r'^ldt\.ratio_u: expected a number in \(0, 1\), got 0\.0$'),
    ({'ema_every': 0}, r'^ldt\.ema_every: expected an integer >= 1, got 0$'),
    ({'dpu': 'yes'}, r"^ldt\.dpu: expected true or false, got 'yes'$"),
    ({'overlap_branches': True, 'overlap_memory': 0.99},
     r'^ldt\.overlap_memory: expected a number in \[1, inf\), or null, got 0\.99$'),
    ({'overlap_branches': False, 'overlap_memory': 1.05},
     r'^ldt\.overlap_memory: bounds the memory of overlapped branches, and overlap_branches is false; expected '
     r'the default 1\.0 \(or null\) there, got 1\.05$'),
    ({'overlap_branches': 'yes'}, r"^ldt\.overlap_branches: expected true or false, or one of 'auto', got 'yes'$"),
])
def test_values_just_past_their_ranges_name_the_range(options, message):
    """A value just past a range's end is refused, the error naming the range. Mutation testing (issue
    #33): kills the mutants that accepted ``w_base_*: 1`` or ``ratio_u: 0`` / ``1``; the hand-applied
    ones of 2026-11-27 that accepted ``overlap_memory`` just below 1."""
    with pytest.raises(ValueError, match=message):
        LDTConfig.from_dict(options)


@pytest.mark.parametrize('options, profiles', [
    ({'mode': 'single', 'profile_iters': 0}, False),                     # FT: no partition at all
    ({'partition_file': 'p.json', 'profile_iters': 0}, False),           # the partition is given
    ({'partition': 'name', 'dpu': False, 'profile_iters': 0}, False),    # DeFT-like: names, one coefficient
    ({'criterion': 'random', 'profile_iters': 0}, False),                # ranks drawn from the seed
    ({'partition': 'name', 'dpu': True, 'profile_iters': 5}, True),      # DPU ranks layers by a statistic
    ({'profile_iters': 5}, True),                                        # LDT: the variance splits the layers
])
def test_profiling_happens_exactly_when_something_needs_the_statistics(options, profiles):
    """``LDTConfig.needs_profiling``: whether a run profiles at all. Mutation testing (issue #33): kills
    its mutants, which no test reached before."""
    assert LDTConfig.from_dict(options).needs_profiling() is profiles
    if profiles:   # without profiling iterations such a configuration is refused, saying why
        with pytest.raises(ValueError, match=r"^ldt\.profile_iters: criterion 'var' \(or dpu\) needs gradient "
                                             r'statistics: expected >= 2 \(got 0\)'):
            LDTConfig.from_dict({**options, 'profile_iters': 0})
