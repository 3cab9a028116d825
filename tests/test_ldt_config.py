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
    ({'dpu': 'yes'}, r"^ldt\.dpu: expected true or false, got 'yes' \(text: write true or false without quotes\)$"),
    ({'overlap_branches': True, 'overlap_memory': 0.99},
     r'^ldt\.overlap_memory: expected a number in \[1, inf\), or null, got 0\.99$'),
    ({'overlap_branches': False, 'overlap_memory': 1.05},
     r'^ldt\.overlap_memory: bounds the memory of overlapped branches, and overlap_branches is false; expected '
     r'the default 1\.0 \(or null\) there, got 1\.05$'),
    ({'overlap_branches': 'yes'}, r"^ldt\.overlap_branches: expected one of 'auto', true, false, got 'yes' \(text: "
                                  r'write true or false without quotes\)$'),
])
def test_values_just_past_their_ranges_name_the_range(options, message):
    """A value just past a range's end is refused, the error naming the range. Mutation testing (issue
    #33): kills the mutants that accepted ``w_base_*: 1`` or ``ratio_u: 0`` / ``1``; the hand-applied
    ones of 2026-11-27 that accepted ``overlap_memory`` just below 1."""
    with pytest.raises(ValueError, match=message):
        LDTConfig.from_dict(options)


@pytest.mark.parametrize('method', ['ft', 'lp_ft', 'ldt_s'])
def test_the_overlap_keys_are_refused_where_one_network_trains(method):
    """``overlap_branches: true`` or a memory bound on FT, LP-FT or LDT-S (modes 'single', 'alternating')
    would do nothing: refused, naming the key and the mode, as a bound with ``overlap_branches: false`` is.
    What does nothing anyway (auto, false, the default bound, null) is accepted, so a study may switch
    ``method`` alone in an LDT option file."""
    mode = preset(method).mode
    with pytest.raises(ValueError, match=rf"^ldt\.overlap_branches: overlaps the two branches of mode 'dual', and "
                                         rf"mode '{mode}' trains one network, where it would do nothing; expected "
                                         r"'auto' or false there, got true$"):
        preset(method, overlap_branches=True)
    with pytest.raises(ValueError, match=rf"^ldt\.overlap_memory: bounds the memory of the two branches of mode "
                                         rf"'dual', and mode '{mode}' .* expected the default 1\.0 or null there, got 1\.5$"):
        preset(method, overlap_memory=1.5)
    for accepted in ({'overlap_branches': 'auto'}, {'overlap_branches': False}, {'overlap_memory': None},
                     {'overlap_memory': 1.0}):
        assert preset(method, **accepted).mode == mode
    assert preset('ldt', overlap_branches=True, overlap_memory=1.5).overlap_memory == 1.5   # dual: what they are for


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


def test_ratio_s_alone_is_the_stable_share_and_both_shares_are_refused():
    """A YAML ``ratio_s`` (the official code's ``Par_ratio``) replaces the default ``ratio_u``. Mutation
    testing (issue #58): kills the ``from_dict`` mutants that misread the key or left ``ratio_u`` set."""
    cfg = LDTConfig.from_dict({'ratio_s': 0.6})
    assert (cfg.ratio_u, cfg.ratio_s) == (None, 0.6)
    assert LDTConfig.from_dict({'ratio_s': None}).ratio_u == LDTConfig().ratio_u   # null = not given
    with pytest.raises(ValueError, match=r'^ldt\.ratio_s: expected either ratio_u \(unstable share\) or '
                                         r'ratio_s \(stable share\), not both$'):
        LDTConfig.from_dict({'ratio_s': 0.6, 'ratio_u': 0.4})
    with pytest.raises(ValueError, match=r'^ldt\.ratio_s: expected exactly one of ratio_u \(unstable share\) '
                                         r'and ratio_s \(stable share\), got ratio_u=None, ratio_s=None$'):
        LDTConfig(ratio_u=None)


def test_a_single_pattern_string_is_one_pattern_and_to_dict_is_plain_yaml():
    """``head_patterns: upsample`` in YAML is one pattern, and ``to_dict`` (written into partition files and
    checkpoints) holds lists, not tuples, so ``yaml.safe_dump`` accepts it. Mutation testing (issue #58)."""
    import yaml
    cfg = LDTConfig.from_dict({'head_patterns': 'upsample', 'force_stable': 'conv_first'})
    assert (cfg.head_patterns, cfg.force_stable) == (('upsample',), ('conv_first',))
    plain = cfg.to_dict()
    assert plain['head_patterns'] == ['upsample'] and isinstance(plain['force_unstable'], list)
    assert LDTConfig.from_dict(yaml.safe_load(yaml.safe_dump(plain))) == cfg


@pytest.mark.parametrize('options, profiles', [
    ({'partition': 'criterion', 'dpu': False, 'profile_iters': 5}, True),   # the split alone needs them
    ({'partition': 'name', 'dpu': False, 'deft_grouping': 'non_layers', 'head_patterns': [], 'profile_iters': 0}, False),
])
def test_profiling_without_dpu_follows_the_partition(options, profiles):
    """Mutation testing (issue #58): kills ``needs_profiling``'s misspelt ``'criterion'`` (every other case
    had DPU on) and the ``deft_grouping`` / ``head_patterns`` rule read the other way round."""
    assert LDTConfig.from_dict(options).needs_profiling() is profiles


def test_rules_that_join_several_keys():
    """Mutation testing (issue #58): each rule at the edge where it starts to refuse."""
    # LDT-S profiles like the pair: no profiling iterations is refused for 'alternating' too
    with pytest.raises(ValueError, match=r"^ldt\.profile_iters: criterion 'var' \(or dpu\) needs"):
        LDTConfig.from_dict({'mode': 'alternating', 'profile_iters': 0})
    # one exchange is enough to rescale for
    assert LDTConfig.from_dict({'ema_reference_iters': 10, 'ema_every': 10}).ema_reference_iters == 10
    with pytest.raises(ValueError, match=r'^ldt\.ema_reference_iters: expected at least ema_reference_every '
                                         r'\(10\) iterations, i\.e\. one exchange, got 9$'):
        LDTConfig.from_dict({'ema_reference_iters': 9, 'ema_reference_every': 10})
    # the head patterns are needed by partition 'name' with the head grouping only
    assert LDTConfig.from_dict({'head_patterns': [], 'head_warmup_iters': 0}).head_patterns == ()
    with pytest.raises(ValueError, match=r"^ldt\.head_patterns: expected patterns naming the head's parameters "
                                         r"with partition 'name', got \[\]$"):
        LDTConfig.from_dict({'partition': 'name', 'dpu': False, 'profile_iters': 0, 'head_patterns': [],
                             'head_warmup_iters': 0})


def test_run_length_message_names_the_interval_for_ldt_s_only():
    """The refusal of a run too short to rescale for says which setting to change. Mutation testing
    (issue #58): kills the mutants of its ``interval_iters`` clause and wording."""
    pair = LDTConfig.from_dict({'ema_reference_iters': 1000, 'ema_every': 10, 'head_warmup_iters': 0})
    with pytest.raises(ValueError, match=r'\(ema_every 10\): nothing to rescale for; train longer or exchange '
                                         r'more often$'):
        pair.check_run_length(pair.counted_profile_iters + 5)
    ldt_s = LDTConfig.from_dict({'mode': 'alternating', 'ema_reference_iters': 1000, 'ema_every': 10,
                                 'interval_iters': 50, 'head_warmup_iters': 0})
    with pytest.raises(ValueError, match=r'\(ema_every 10, interval_iters 50\): nothing to rescale for'):
        ldt_s.check_run_length(ldt_s.counted_profile_iters + 40)


def test_unknown_names_list_what_is_known():
    """Mutation testing (issue #58): kills the mutants of the 'valid keys' / 'known' lists and of the hint
    shown when nothing is close."""
    with pytest.raises(ValueError) as error:
        LDTConfig.from_dict({'zzzz': 1})
    assert str(error.value) == ("unknown LDT option 'zzzz'; valid keys: "
                                + ', '.join(LDTConfig().to_dict()))
    with pytest.raises(ValueError) as error:
        preset('zzzz')
    assert str(error.value) == f"unknown LDT preset 'zzzz' (known: {', '.join(PRESETS)})"


@pytest.mark.parametrize('options, message, fixed', [
    (dict(profile_order='file_order'),
     "ldt.profile_counts_in_total_iter: expected false with profile_order 'file_order' (one pass of the data before "
     "training, possibly fewer than profile_iters batches), got true",
     dict(profile_counts_in_total_iter=False)),
    (dict(partition='criterion', deft_grouping='non_layers'),
     "ldt.deft_grouping: 'non_layers' applies to partition 'name' only, got partition 'criterion'",
     dict(partition='name')),
    (dict(profile_iters=1),
     "ldt.profile_iters: criterion 'var' (or dpu) needs gradient statistics: expected >= 2 (got 1), or dpu: false "
     "with criterion 'random' / partition 'name', or a 'partition_file'",
     dict(profile_iters=2)),
    (dict(partition_file='p.json', profile_iters=5),
     'ldt.profile_iters: expected 0 with a partition_file (it replaces profiling), got 5',
     dict(profile_iters=0)),
    (dict(mode='single', profile_iters=3),
     "ldt.profile_iters: expected 0 with mode 'single' (FT / LP-FT do not profile), got 3",
     dict(profile_iters=0)),
    (dict(mode='single', profile_iters=0, ema_reference_iters=100),
     "ldt.ema_reference_iters: rescales the EMA coefficients of the cross-frozen pair or LDT-S; mode 'single' "
     "(FT / LP-FT) has no EMA (got 100); for BasicSR's weight EMA use train.ema_reference_iters",
     dict(ema_reference_iters=None)),
    (dict(partition_file='p.json', profile_iters=0, ema_reference_iters=100),
     'ldt.ema_reference_iters: a partition_file carries its own coefficients, used as written; remove one of the '
     'two (got 100)',
     dict(ema_reference_iters=None)),
    (dict(head_warmup_iters=5, head_patterns=[]),
     "ldt.head_patterns: expected patterns naming the head's parameters when head_warmup_iters > 0, got []",
     dict(head_warmup_iters=0)),
])
def test_each_cross_key_rule_is_one_whole_message(options, message, fixed):
    """What a user reads when two keys of ``ldt:`` contradict each other: the whole line, naming the
    key to change and what was expected (pinned entire, so a reworded or truncated message is seen;
    the profile_order 'file_order' rule had no test at all). The passing neighbour of each case is
    accepted. Kills the message and condition mutants of ``_validate`` (mutation testing, issue 58)."""
    with pytest.raises(ValueError) as err:
        LDTConfig.from_dict(options)
    assert str(err.value) == message
    LDTConfig.from_dict({**options, **fixed})


@pytest.mark.parametrize('method, overrides, message', [
    ('deft', {'ratio_u': 0.3}, "ldt.ratio_u: method 'deft' does not read it (partition 'name' splits by name (DeFT)), "
                               'so 0.3 would change nothing; remove it'),
    ('lp_ft', {'ratio_u': 0.5}, "ldt.ratio_u: method 'lp_ft' does not read it (mode 'single' (FT, LP-FT) trains one "
                                'network without groups)'),
    ('ft', {'criterion': 'mean'}, "ldt.criterion: method 'ft' does not read it"),
    ('lp_ft', {'head_warmup_iters': 0}, "ldt.head_warmup_iters: 0 leaves method 'lp_ft' without its linear-probing "
                                        'phase, so it would train plain FT under the LP-FT label; use method: ft, or '
                                        'give warm-up iterations'),
    ('ldt', {'interval_iters': 50}, "ldt.interval_iters: method 'ldt' does not read it (mode 'dual' (LDT-S's "
                                    'alternation only))'),
    ('ldt', {'w_fixed': 0.9}, "ldt.w_fixed: method 'ldt' does not read it (dpu: true ranks W per layer (eq. 10))"),
    ('ldt_no_dpu', {'w_base_stable': 0.9}, "ldt.w_base_stable: method 'ldt_no_dpu' does not read it (dpu: false "
                                           'gives every layer w_fixed)'),
    ('ldt_s', {'buffers_from': 'auxiliary'}, "ldt.buffers_from: method 'ldt_s' does not read it (mode 'alternating' "
                                             '(LDT-S) trains one network)'),
    ('ldt', {'seed': 3}, "ldt.seed: method 'ldt' does not read it (criterion 'var' ranks by gradients; only 'random' "
                         'draws from the seed), so 3 would change nothing; remove it'),
    ('deft', {'seed': 3}, "ldt.seed: method 'deft' does not read it (partition 'name' without dpu ranks nothing)"),
    ('ldt_random', {'seed': 3, 'partition_file': 'p.json', 'profile_iters': 0},
     "ldt.seed: method 'ldt_random' does not read it (a partition_file gives the groups)"),
    ('ft', {'seed': 3}, "ldt.seed: method 'ft' does not read it (mode 'single'"),
    ('ldt_no_dpu', {'seed': 3}, "ldt.seed: method 'ldt_no_dpu' does not read it (criterion 'var' ranks by gradients"),
    ('ldt', {'partition_file': 'p.json', 'profile_iters': 0, 'ratio_u': 0.3},
     "ldt.ratio_u: method 'ldt' does not read it (a partition_file gives the groups and their "
     'coefficients)'),
    # a criterion sweep over DeFT, or beside a partition file, trained one run twice (audit 2026-11-29)
    ('deft', {'criterion': 'fisher'}, "ldt.criterion: method 'deft' does not read it (partition 'name' without dpu "
                                      "ranks nothing), so 'fisher' would change nothing; remove it"),
    ('ldt', {'partition_file': 'p.json', 'profile_iters': 0, 'criterion': 'fisher'},
     "ldt.criterion: method 'ldt' does not read it (a partition_file gives the groups and their "
     'coefficients)'),
    ('ldt', {'partition_file': 'p.json', 'profile_iters': 0, 'force_stable': ['conv_first']},
     "ldt.force_stable: method 'ldt' does not read it (a partition_file gives the groups and their "
     'coefficients)'),
    ('deft', {'profile_order': 'file_order', 'profile_counts_in_total_iter': False},
     "ldt.profile_order: method 'deft' does not read it (profile_iters 0: nothing is profiled)"),
    ('deft', {'profile_counts_in_total_iter': False},
     "ldt.profile_counts_in_total_iter: method 'deft' does not read it (profile_iters 0: nothing is profiled)"),
    ('ldt', {'head_patterns': ['nosuch']}, "ldt.head_patterns: method 'ldt' does not read it (head_warmup_iters 0 "
                                           "and no split by the head's name (DeFT): no head is chosen)"),
    ('ft', {'head_patterns': ['conv_last']}, "ldt.head_patterns: method 'ft' does not read it (head_warmup_iters 0"),
    # a partition file's coefficients replaced these silently; a reference interval without a reference length
    ('ldt', {'partition_file': 'p.json', 'profile_iters': 0, 'w_base_stable': 0.5},
     "ldt.w_base_stable: method 'ldt' does not read it (a partition_file gives the groups and their coefficients)"),
    ('ldt', {'partition_file': 'p.json', 'profile_iters': 0, 'dpu': False},
     "ldt.dpu: method 'ldt' does not read it (a partition_file gives the groups and their coefficients)"),
    ('ldt_no_dpu', {'partition_file': 'p.json', 'profile_iters': 0, 'w_fixed': 0.5},
     "ldt.w_fixed: method 'ldt_no_dpu' does not read it (a partition_file gives the groups and their coefficients)"),
    ('deft', {'partition_file': 'p.json', 'deft_grouping': 'non_layers'},
     "ldt.deft_grouping: method 'deft' does not read it (a partition_file gives the groups"),
    ('deft', {'partition_file': 'p.json', 'ratio_u': 0.3},     # the file's groups, not DeFT's split by name
     "ldt.ratio_u: method 'deft' does not read it (a partition_file gives the groups and their coefficients)"),
    ('ldt', {'ema_reference_every': 1}, "ldt.ema_reference_every: method 'ldt' does not read it (no "
                                        'ema_reference_iters: the coefficients are used as written)'),
])
def test_a_value_the_method_never_reads_is_refused(method, overrides, message):
    """A study sweeping ratio_u over DeFT trained the same run under two labels; a slip set a key its
    method ignores. The preset's own value (a study's shared overrides) is accepted, as is what the
    method reads (ratio_u for LDT, interval_iters for LDT-S, w_fixed without DPU)."""
    with pytest.raises(ValueError) as err:
        preset(method, **overrides)
    assert str(err.value).startswith(message)
    key = next(iter(overrides))
    assert getattr(preset(method, **{key: getattr(preset(method), key)}), key) == getattr(preset(method), key)
    preset('ldt', ratio_u=0.3)
    preset('ldt', head_warmup_iters=10, head_patterns=['conv_last'])     # what each method reads stays allowed
    preset('deft', head_patterns=['conv_last'])
    preset('lp_ft', head_patterns=['conv_last'])
    preset('ldt', criterion='fisher', profile_order='file_order', profile_counts_in_total_iter=False)
    preset('ldt_no_dpu', criterion='fisher')                              # the partition ranks by it
    preset('ldt', partition='name', criterion='fisher')                   # dpu ranks by the criterion
    preset('ldt_s', interval_iters=50)
    preset('ldt_no_dpu', w_fixed=0.9)
    assert preset('ldt_random', seed=3).seed == preset('ldt', criterion='random', partition='name', seed=3).seed == 3


@pytest.mark.parametrize('options, reads', [
    ({'criterion': 'random'}, True),
    ({'criterion': 'random', 'partition': 'name'}, True),                 # DPU ranks within the named groups
    ({'criterion': 'random', 'partition': 'name', 'dpu': False, 'profile_iters': 0}, False),  # nothing ranked
    ({'criterion': 'random', 'dpu': False}, True),                        # the partition itself is drawn
    ({'criterion': 'random', 'partition_file': 'p.json', 'profile_iters': 0}, False),
    ({'criterion': 'random', 'mode': 'single', 'profile_iters': 0}, False),
    ({'criterion': 'var'}, False),
])
def test_the_seed_is_read_only_where_something_is_drawn(options, reads):
    """Where the seed decides nothing, a study seed's run keeps ldt.seed 0 (its saved state resumes) and
    an ldt.seed written is refused; where it does, each study seed draws its own ranking."""
    assert LDTConfig.from_dict(options).reads_seed() is reads


@pytest.mark.parametrize('method, overrides, total, message', [
    ('ldt', {'ema_every': 50, 'profile_iters': 2}, 4, "ldt.ema_every: a run of 4 iterations leaves 2 training "
     "iterations, in which the stable and unstable EMAs get no exchange (ema_every 50), so the saved network would "
     "keep the start's stable and unstable layers; train longer or exchange more often"),
    ('ldt', {'profile_iters': 2}, 11, 'ldt.ema_every: a run of 11 iterations leaves 9 training iterations'),  # default 10
    ('ldt_s', {'interval_iters': 100, 'profile_iters': 2, 'ema_every': 1}, 4, "ldt.interval_iters: a run of 4 "
     "iterations leaves 2 training iterations, in which the unstable EMA gets no exchange (ema_every 1, "
     "interval_iters 100), so the saved network would keep the start's unstable layers"),
])
def test_a_run_in_which_a_group_never_gets_an_exchange_is_refused(method, overrides, total, message):
    """The audit's run: ema_every 50 in a 4-iteration run saved a composite equal to the start, rc 0, with only
    a warning about horizons; LDT-S with an interval longer than the run left the unstable group untrained."""
    config = preset(method, **overrides)
    with pytest.raises(ValueError) as err:
        config.check_run_length(total)
    assert str(err.value).startswith(message)
    config.check_run_length(total + 100)                                   # long enough: every group exchanges
    preset('ft').check_run_length(1)                                       # one network: no exchange to miss


def test_one_exchange_is_enough_and_the_key_named_is_the_longer_spacing():
    """The edges of the rule above (mutation testing: '< 1' as '<= 1', the key chosen on equal spacings):
    a run whose groups get one exchange each trains; LDT-S with equal spacings names ema_every."""
    preset('ldt', profile_iters=2, ema_every=4).check_run_length(6)         # 4 training iterations: one exchange
    with pytest.raises(ValueError, match=r'^ldt\.ema_every: a run of 6 iterations leaves 4 training iterations, in '
                                         r'which the stable and unstable EMAs get no exchange \(ema_every 5\)'):
        preset('ldt', profile_iters=2, ema_every=5).check_run_length(6)
    with pytest.raises(ValueError, match=r'^ldt\.ema_every: .*\(ema_every 50, interval_iters 50\)'):
        preset('ldt_s', profile_iters=2, ema_every=50, interval_iters=50).check_run_length(6)
    preset('deft', head_warmup_iters=0, head_patterns=['conv_last'])        # a split by the head's name reads them


def test_the_freezing_controls_read_the_partition_keys_and_refuse_the_exchange_keys():
    """ft_stable / ft_unstable (mode 'partial') split the layers as LDT does and then train one group of one
    network: the EMA keys would change nothing and are refused; trained_group is read there only; DeFT's split
    by name needs no statistic there (nothing ranks the layers for a coefficient), so neither criterion nor seed
    is read; profiling, a ratio and a random draw are what they are for LDT."""
    for key, value in (('dpu', False), ('w_base_stable', 0.5), ('ema_every', 2), ('w_fixed', 0.5),
                       ('interval_iters', 5), ('buffers_from', 'auxiliary')):
        with pytest.raises(ValueError, match=rf"^ldt\.{key}: method 'ft_stable' does not read it \(mode 'partial' "
                                             r'trains one group and freezes the other at the start: no EMA exchange\)'):
            preset('ft_stable', **{key: value})
    with pytest.raises(ValueError, match=r"^ldt\.trained_group: method 'ldt' does not read it \(mode 'dual' trains "
                                         r"both groups"):
        preset('ldt', trained_group='unstable')
    with pytest.raises(ValueError, match=r"^ldt\.ema_reference_iters: .*mode 'partial' \(ft_stable / ft_unstable\) "
                                         r'has no EMA'):
        preset('ft_stable', ema_reference_iters=1000)
    with pytest.raises(ValueError, match=r"^ldt\.profile_iters: criterion 'var' \(or dpu\) needs gradient statistics: "
                                         r'expected >= 2 \(got 1\)'):
        preset('ft_unstable', profile_iters=1)
    by_name = preset('ft_stable', partition='name', profile_iters=0)
    assert not by_name.needs_profiling() and not LDTConfig(mode='partial', partition='name', criterion='random',
                                                           profile_iters=0).reads_seed()
    for key, value in (('criterion', 'random'), ('seed', 3)):
        with pytest.raises(ValueError, match=rf"^ldt\.{key}: method 'ft_stable' does not read it \(partition 'name' "
                                             r'without dpu ranks nothing\)'):
            preset('ft_stable', partition='name', profile_iters=0, **{key: value})
    drawn = preset('ft_unstable', criterion='random', seed=3, profile_iters=0)
    assert drawn.reads_seed() and not drawn.needs_profiling() and drawn.trained_group == 'unstable'
    assert preset('ft_stable', ratio_u=0.3).needs_profiling()
    preset('ft_stable').check_run_length(1)                               # no exchange to miss


def test_the_method_decides_the_mode_and_the_trained_group():
    """Audit 6: ``method: ft_stable, trained_group: unstable`` trained FT-unstable under FT-stable's label, and
    ``method: ldt, mode: partial`` a freezing control under LDT's; the method's own values stay accepted."""
    for method, key, value in (('ft_stable', 'trained_group', 'unstable'), ('ft_unstable', 'trained_group', 'stable'),
                               ('ldt', 'mode', 'partial'), ('ft_stable', 'mode', 'dual'), ('ft', 'mode', 'alternating')):
        with pytest.raises(ValueError, match=rf"^ldt\.{key}: method '{method}' is {key} '.*'; '{value}' would train "
                                             r'another method under its name; choose the method instead'):
            preset(method, **{key: value})
    assert preset('ft_unstable', trained_group='unstable', mode='partial').trained_group == 'unstable'
    assert preset('ldt_s', mode='alternating').mode == 'alternating'


def test_profiling_iterations_nothing_reads_are_refused():
    """Audit 6: ``ft_stable`` (or ``ldt_no_dpu``) with ``partition: name`` spent the default 300 iterations
    profiling statistics that nothing ranks, leaving 10 of 310 iterations to train."""
    for method in ('ft_stable', 'ldt_no_dpu'):
        with pytest.raises(ValueError, match=r"^ldt\.profile_iters: partition 'name' without dpu ranks nothing, so 300 "
                                             r'profiling iterations would train nothing; expected 0$'):
            preset(method, partition='name')
        assert preset(method, partition='name', profile_iters=0).profile_iters == 0
    assert preset('ldt', partition='name').needs_profiling()             # DPU ranks within the named groups
    assert preset('ft_stable', criterion='random').profile_iters == 300  # a length-matched random control
