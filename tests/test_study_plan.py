"""What a study file expands to (basicsr_ldt.study.plan.load_study), beyond test_study's expansion
tests: the whole text of the messages a study author meets, the scale and sections of every run's
test file, runs that never share a folder name or an options object, and the checks of each run's
training options (LDT, CorGrad, L2-SP, compile) at load time."""
import copy
from pathlib import Path

import pytest
import yaml

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.study import plan
from test_cli import NETWORK, write
from test_study import tiny_study

START = {'path': {'pretrain_network_g': 'start.pth'}}


def study_with(tmp_path, data, train=None, test=None, drop_train=(), drop_test=(), **changes):
    """``tiny_study`` with top-level keys of its base training and test files changed or removed."""
    path = tiny_study(tmp_path, data, **changes)
    study = yaml.safe_load(Path(path).read_text())
    for key, changed, dropped in (('train', train, drop_train), ('test', test, drop_test)):
        opt = yaml.safe_load(Path(study[key]).read_text())
        opt.update(changed or {})
        for name in dropped:
            opt.pop(name)
        write(Path(study[key]), opt)
    return path


def load_error(path, root) -> str:
    with pytest.raises(InputError) as err:
        plan.load_study(path, str(root))
    return str(err.value)


@pytest.mark.parametrize('changes, message', [
    ({'name': ''}, "{study}: 'name' is missing or empty"),
    ({'name': 5}, "{study}: name '5' must use only letters, digits and ._+=-"),
    ({'name': 'my study'}, "{study}: name 'my study' must use only letters, digits and ._+=-"),
    ({'seeds': 3}, '{study}: seeds must be a non-empty list of integers in [0, 2147483647], got 3'),
    ({'seeds': [True]}, '{study}: seeds must be a non-empty list of integers in [0, 2147483647], got [True]'),
    ({'seeds': [-1]}, '{study}: seeds must be a non-empty list of integers in [0, 2147483647], got [-1]'),
    ({'seeds': [2 ** 40]}, '{study}: seeds must be a non-empty list of integers in [0, 2147483647], got [1099511627776]'),
    ({'methods': ['FT']}, '{study}: methods must map a label to option overrides'),
    ({'methods': {'FT': ['x']}}, "{study}: method 'FT' must map to option overrides (a mapping)"),
    ({'methods': {'FT': {}, 'B': {'bicubic': True, 'train': {}, 'scale': 4}}},
     "{study}: method 'B' has 'bicubic: true' (it upscales the LR image, nothing is trained), so it takes no "
     'other key, got train, scale'),
    ({'methods': {'FT': {}, 'S': {'start': True, 'train': {}, 'scale': 4}}},
     "{study}: method 'S' has 'start: true' (it tests the starting weights, nothing is trained), so it takes no "
     'other key, got train, scale'),
    ({'methods': {'FT': {}, '..': {'bicubic': True}}},
     "{study}: method label '..' names no folder; expected letters or digits in it (run folders are named after "
     'their method)'),
    ({'methods': {'FT': {}, ' ': {}}},
     "{study}: method label ' ' names no folder; expected letters or digits in it (run folders are named after "
     'their method)'),
    ({'sweep': {'manual_seed': [1, 2]}}, "{study}: sweep 'manual_seed', which the study sets for every run (the "
     "study's seeds list); remove it"),   # both points trained with seed 0 under two labels
    ({'methods': {'FT': {'manual_seed': 5}}}, "{study}: method 'FT' sets 'manual_seed', which the study sets for every "
     "run (the study's seeds list); remove it"),
    ({'overrides': {'path': {'resume_state': 'x.state'}}}, "{study}: overrides sets 'path.resume_state', which the "
     'study sets for every run (a started run resumes by itself); remove it'),
    ({'overrides': {'name': 'x'}}, "{study}: overrides sets 'name', which the study sets for every run (each run is "
     '<study>/<run>); remove it'),
    ({'sweep': ['x']}, '{study}: sweep must map a dotted option key to a list of values'),
    ({'sweep': {'train.optim_g.lr': [1e-3, 0.0010]}},        # was 'two runs would share the folder name ...; rename a method'
     "{study}: sweep 'train.optim_g.lr' lists a value twice: [0.001, 0.001]"),
    ({'reference': 'LTD'}, "{study}: reference 'LTD' is not one of the methods (FT, LDT) (did you mean 'LDT'?)"),
    ({'methods': {'FT': {}, 'S': {'start': True}}},
     "{study}: method 'S': 'start: true' tests the weights the runs start from, and the base training options "
     'name none (path.pretrain_network_g)'),
    ({'overrides': {'traim': 1}}, "study 'tiny' overrides: 'traim' is not an option of the base file (did you mean 'train'?)"),
    ({'overrides': {'traim': 1}, 'methods': {'B': {'bicubic': True}}},
     "study 'tiny' overrides: 'traim' is not an option of the base file (did you mean 'train'?)"),
    ({'methods': {'FT': {'base': 'nope.yml'}}}, "method 'FT': base training file 'nope.yml' does not exist"),
    ({'sweep': {'train.optim_g.lr': [1e-3, 5e-4]}, 'methods': {'FT': {}, 'FT-2': {'train': {'optim_g': {'lr': 2e-3}}}}},
     "{study}: method 'FT-2' sets 'train.optim_g.lr', which the sweep sets for every run (that value would never be "
     'trained); remove one of the two'),    # planned FT-2 at 1e-3 and 5e-4 only: 2e-3 never ran
    ({'sweep': {'train.total_iter': [4, 6]}, 'overrides': {'train': {'total_iter': 8}}},
     "{study}: overrides sets 'train.total_iter', which the sweep sets for every run (that value would never be "
     'trained); remove one of the two'),
    ({'methods': {'FT': {}, 'LDT-random': {'model_type': 'LDTSRModel', 'ldt': {
        'method': 'ldt', 'criterion': 'random', 'profile_iters': 2, 'ema_every': 1, 'seed': 0}}}},
     "{study}: method 'LDT-random' runs with ldt.seed: 0 (from the study file or its base), so every seed would draw "
     "the same random layer partition and CorGrad camera order; remove it (it follows manual_seed, which the study "
     'sets per seed)'),   # two "seeds" of one partition, reported as independent draws
    ({'overrides': {'datasets': {'train': {'seed': 3}}}},
     "{study}: method 'FT' runs with datasets.train.seed: 3 (from the study file or its base), so every seed would "
     'draw the same training crops and flips; remove it (it follows manual_seed, which the study sets per seed)'),
    ({'overrides': START, 'methods': {'S': {'start': True}, 'FT': {},
                                      'FT-other': {'path': {'pretrain_network_g': 'other.pth'}}}},
     "{study}: method 'FT-other' starts from 'other.pth' (key 'params'), not from the study's start 'S' ('start.pth' "
     "(key 'params')): its gains and distance would be measured from weights it did not start from"),
    ({'overrides': START, 'methods': {'S': {'start': True}, 'FT': {}, 'FT-ema': {'path': {'param_key_g': 'params_ema'}}}},
     "{study}: method 'FT-ema' starts from 'start.pth' (key 'params_ema'), not from the study's start 'S' ('start.pth' "
     "(key 'params')): its gains and distance would be measured from weights it did not start from"),  # same file
    ({'methods': {'FT': {'datasets': {'train': {'cameras': 'all'}}}}},
     "{study}: method 'FT' trains on every camera of its training folder (datasets.train.cameras absent or 'all'); "
     'name its source cameras: the report marks them and leaves them out of the Mean'),   # its Mean had its sources
    ({'methods': {'FT': {'datasets': {'train': {'cameras': None}}}}},
     "{study}: method 'FT' trains on every camera of its training folder (datasets.train.cameras absent or 'all'); "
     'name its source cameras: the report marks them and leaves them out of the Mean'),
])
def test_study_file_mistakes_are_one_whole_message_naming_the_file_and_the_key(tmp_path, demo_data, changes, message):
    """Kills mutants that drop or garble the ``where`` of these messages (the study file, the method,
    the overrides), join listed keys with another separator, or let a non-string name, a non-list of
    seeds or a boolean seed through to a TypeError (``or`` -> ``and``)."""
    path = tiny_study(tmp_path, demo_data, **changes)
    assert load_error(path, tmp_path) == message.format(study=f"study file '{path}'")


def test_a_missing_study_file_and_a_test_file_with_an_unknown_key_are_named(tmp_path, demo_data):
    assert load_error(str(tmp_path / 'nope.yml'), tmp_path) == f"study file '{tmp_path / 'nope.yml'}' does not exist"
    path = study_with(tmp_path, demo_data, test={'tset': 1})
    assert load_error(path, tmp_path) == (
        f"test file '{tmp_path / 'test.yml'}': unknown key 'tset' (did you mean 'test'?); the top level takes: "
        'checkpoints, datasets, dist_params, manual_seed, name, network_g, num_gpu, path, scale, test')


@pytest.mark.parametrize('methods, folder', [
    ({'FT_seed0': {'bicubic': True}, 'FT': {}}, 'FT_seed0'),             # an untrained run against a trained one
    ({'F T': {}, 'FT': {}}, 'FT_seed0'),                                  # spaces leave a folder name
    ({'FT': {}, 'W_alpha=0.5': {}, 'W': {'wise_ft': {'of': 'FT', 'alphas': [0.5]}}}, 'W_alpha=0.5_seed0'),
    ({'FT': {}, 'W a': {'wise_ft': {'of': 'FT', 'alphas': [0.5]}}, 'Wa': {'wise_ft': {'of': 'FT', 'alphas': [0.5]}}},
     'Wa_alpha=0.5_seed0'),                                               # two WiSE-FT tests
    ({'FT': {}, 'Bi cubic': {'bicubic': True}, 'Bicubic': {'bicubic': True}}, 'Bicubic'),   # two untrained runs
])
def test_two_runs_never_share_a_folder(tmp_path, demo_data, methods, folder):
    """Two runs in one folder would overwrite each other's checkpoints and tables. Kills mutants that
    record ``None`` instead of a run's name (untrained, trained or WiSE-FT) or drop the message."""
    path = tiny_study(tmp_path, demo_data, overrides=START, seeds=[0], methods=methods)
    assert load_error(path, tmp_path) == f"study 'tiny': two runs would share the folder name '{folder}'; rename a method"


def test_wise_ft_alphas_equal_as_numbers_are_one_alpha(tmp_path, demo_data):
    """1 and 1.0 are one interpolation (and one folder name): refused as a repeated alpha."""
    path = tiny_study(tmp_path, demo_data, overrides=START, seeds=[0],
                      methods={'FT': {}, 'W': {'wise_ft': {'of': 'FT', 'alphas': [1, 1.0]}}})
    assert load_error(path, tmp_path) == (
        f"study file '{path}': method 'W': wise_ft.alphas: expected a non-empty list of distinct numbers in [0, 1], "
        'got [1, 1.0]')


@pytest.mark.parametrize('method, message', [
    ({'train': {'total_iter': 0}}, 'train.total_iter must be a positive number, got 0'),
    ({'train': {'total_iter': 'six'}}, "train.total_iter must be a positive number, got 'six'"),
    ({'train': {'compile': 'sometimes'}}, "train.compile: expected one of 'auto', true, false, got 'sometimes'"),
    ({'ldt': {'method': 'ldt'}}, 'the ldt: block needs a model type of this project that reads it (LDTSRModel, '
     'CorGradSRModel); model_type FTSRModel ignores it: set model_type: LDTSRModel, or remove it'),
    # LDTSRModel without an ldt: block runs LDT's defaults (300 profiling iterations)
    ({'model_type': 'LDTSRModel'}, 'ldt: head_warmup_iters (0) + profile_iters (300) must be smaller than '
     'train.total_iter (6), or no training would remain'),
    ({'model_type': 'CorGradSRModel', 'ldt': {'slices': 0}}, 'ldt.slices: expected an integer in [5, 100], got 0'),
    ({'model_type': 'LDTSRModel', 'ldt': {'method': 'deft', 'ratio_u': 0.3}},   # a sweep's points: one run twice
     "ldt.ratio_u: method 'deft' does not read it (partition 'name' splits by name (DeFT)), so 0.3 would change "
     'nothing; remove it'),
    ({'model_type': 'LDTSRModel', 'ldt': {'method': 'ldt', 'profile_iters': 2, 'ema_every': 1}, 'train': {'l2_sp_weight': 0.01},
      **START}, 'train.l2_sp_weight: L2-SP anchors the one network a run trains; this method trains 2 (a '
     'cross-frozen pair). Use it with FT, LP-FT, LDT-S or CorGrad'),
])
def test_each_runs_training_options_are_checked_at_load_naming_the_run(tmp_path, demo_data, method, message):
    """Kills mutants that skip the LDT/CorGrad check when only one of ``ldt:`` and ``model_type`` says
    LDT, read another key, count the pair as three networks, or drop the run's name."""
    path = tiny_study(tmp_path, demo_data, seeds=[0], methods={'X': method})
    assert load_error(path, tmp_path) == f"run 'X_seed0': {message}"


def test_load_time_checks_accept_what_runs(tmp_path, demo_data):
    """A one-iteration run, and CorGrad (one network) with L2-SP: the model type says CorGrad even
    when the ldt: block names no method."""
    methods = {'One': {'train': {'total_iter': 1, 'scheduler': {'milestones': [1]}}},
               'C': {'model_type': 'CorGradSRModel', 'ldt': {'profile_iters': 2}, 'train': {'l2_sp_weight': 0.01}}}
    study = plan.load_study(tiny_study(tmp_path, demo_data, overrides=START, seeds=[0], methods=methods),
                            str(tmp_path))
    assert [run.name for run in study.runs] == ['One_seed0', 'C_seed0']


def test_unregistered_network_names_the_run(tmp_path, demo_data):
    path = tiny_study(tmp_path, demo_data, seeds=[0], methods={'FT': {'network_g': {'type': 'NoNet'}}})
    assert load_error(path, tmp_path).startswith("run 'FT_seed0': network_g.type 'NoNet' is not registered (known: ")


def test_base_training_options_without_a_train_set_are_refused(tmp_path, demo_data):
    path = study_with(tmp_path, demo_data, train={'datasets': {}}, seeds=[0], methods={'FT': {}})
    assert load_error(path, tmp_path) == "run 'FT_seed0': the training options have no 'datasets: train' section"


@pytest.mark.parametrize('train_scale, test_scale, expected', [(2, 4, 2), (None, 2, 2), (None, None, 4)])
def test_every_runs_test_file_has_the_training_scale(tmp_path, demo_data, train_scale, test_scale, expected):
    """A run (and Bicubic) is tested at the scale it trains at; without one in the training options at
    the test file's, and BasicSR's 4 without either."""
    drop_train = () if train_scale else ('scale',)
    drop_test = () if test_scale else ('scale',)
    network = {**NETWORK, 'upscale': expected}   # the network's factor is the scale it trains and is tested at
    path = study_with(tmp_path, demo_data, train={'scale': train_scale, 'network_g': network} if train_scale
                      else {'network_g': network},
                      test={'scale': test_scale, 'network_g': {**NETWORK, 'upscale': test_scale}} if test_scale
                      else None, drop_train=drop_train,
                      drop_test=drop_test, seeds=[0], methods={'FT': {}, 'B': {'bicubic': True}})
    study = plan.load_study(path, str(tmp_path))
    assert {run.name: run.test_opt['scale'] for run in study.runs} == {'B': expected, 'FT_seed0': expected}


def test_run_test_files_drop_the_base_paths_and_comparison_grids(tmp_path, demo_data):
    """The base test file's ``path`` (e.g. param_key_g) and ``test.compare`` do not reach a run's test
    file: its one checkpoint entry names the weights and their key."""
    path = study_with(tmp_path, demo_data, test={'path': {'param_key_g': 'params_ema'},
                                                 'test': {'tile_size': 0, 'compare': {'crops': 2, 'size': 32}}},
                      seeds=[0], methods={'FT': {}, 'B': {'bicubic': True}})
    for run in plan.load_study(path, str(tmp_path)).runs:
        assert run.test_opt['path'] == {} and run.test_opt['test'] == {'tile_size': 0}, run.name


def containers(value, found=None):
    """The ids of every dict and list inside ``value``."""
    found = set() if found is None else found
    if isinstance(value, (dict, list)):
        found.add(id(value))
        for item in (value.values() if isinstance(value, dict) else value):
            containers(item, found)
    return found


def test_runs_own_their_options(tmp_path, demo_data):
    """Each run's training and test options are its own objects (no section shared with another run,
    the base files or the overrides), so writing one run's files cannot change another's."""
    study = plan.load_study(tiny_study(tmp_path, demo_data, seeds=[0, 1], methods={'FT': {}, 'B': {'bicubic': True}}),
                            str(tmp_path))
    owned = [containers(run.train_opt) | containers(run.test_opt) for run in study.runs]
    assert len(owned) == 3
    for i, mine in enumerate(owned):
        assert all(not (mine & other) for other in owned[i + 1:])


def test_merge_options_leaves_its_inputs_alone():
    base = {'train': {'optim_g': {'lr': 1e-3, 'betas': [0.9, 0.99]}}, 'datasets': {'train': {'cameras': ['A']}},
            'checkpoints': [{'label': 'a'}]}
    overrides = {'train': {'optim_g': {'betas': [0.5, 0.9]}}, 'checkpoints': [{'label': 'b'}]}
    before = copy.deepcopy((base, overrides))
    merged = plan.merge_options(base, overrides, 'here')
    assert merged == {'train': {'optim_g': {'lr': 1e-3, 'betas': [0.5, 0.9]}}, 'datasets': {'train': {'cameras': ['A']}},
                      'checkpoints': [{'label': 'b'}]}
    assert not (containers(merged) & (containers(base) | containers(overrides)))
    merged['datasets']['train']['cameras'].append('B')
    merged['train']['optim_g']['betas'].append(0)
    assert (base, overrides) == before


def test_merge_options_checks_ldt_keys_against_the_ldt_block():
    """An ldt: key is known by the LDT block's schema even when the base has no ldt: section."""
    assert plan.merge_options({}, {'ldt': {'ratio_u': 0.3}}, 'here') == {'ldt': {'ratio_u': 0.3}}
    with pytest.raises(InputError, match=r"^here: 'ldt.ratio_x' is not an option of the base file"):
        plan.merge_options({}, {'ldt': {'ratio_x': 0.3}}, 'here')
    with pytest.raises(InputError, match=r"^here: 'scael' is not an option of the base file"):
        plan.merge_options({'scale': 4}, {'scael': 2}, 'here')


def test_run_names_drop_spaces_and_replace_other_characters():
    assert plan.run_name('L D/T', {'ldt.ratio_u': '0.3 x'}, 2) == 'LD-T_ratio_u=0.3x_seed2'
    assert plan.run_name('Bi cubic', {}, None) == 'Bicubic'


def test_untrained_runs_are_described_and_indexed(tmp_path, demo_data):
    """Runs are numbered in the order they are listed (untrained first, WiSE-FT last), each with its
    method label, sweep point and description; the study keeps its file names."""
    path = tiny_study(tmp_path, demo_data, overrides=START, seeds=[0],
                      methods={'FT': {}, 'B': {'bicubic': True}, 'W': {'wise_ft': {'of': 'FT', 'alphas': [0.5]}}})
    study = plan.load_study(path, str(tmp_path))
    assert [(run.index, run.name, run.method, run.sweep) for run in study.runs] == [
        (0, 'B', 'B', {}), (1, 'FT_seed0', 'FT', {}), (2, 'W_alpha=0.5_seed0', 'W', {'wise_ft.alpha': 0.5})]
    assert study.runs[0].description == 'no training: bicubic upscaling of the LR image, tested once, paired with every seed'
    assert (study.path, study.train, study.test) == (path, str(tmp_path / 'base.yml'), str(tmp_path / 'test.yml'))


def test_a_runs_test_file_owns_its_network_options():
    """MambaIR's network_g holds lists (depths): the test file gets its own copy of them."""
    train_opt = {'scale': 4, 'network_g': {'type': 'MambaIR', 'depths': [6, 6], 'num_heads': [6, 6]}}
    test_opt = plan.evaluation_options({'name': 'test'}, 'study', 'FT_seed0', train_opt, 'root', ema=True)
    assert test_opt['network_g'] == train_opt['network_g']
    assert not (containers(test_opt) & containers(train_opt))
    assert test_opt['checkpoints'] == [{'label': 'FT_seed0', 'path': plan.final_checkpoint('root', 'study', 'FT_seed0'),
                                        'param_key': 'params_ema'}]


def test_a_base_training_file_without_a_path_section_gets_one_that_starts_fresh(tmp_path, demo_data):
    """``path`` is optional in a training file; every run's options then get one with
    ``resume_state: None`` (a study run never resumes another run's state)."""
    path = study_with(tmp_path, demo_data, drop_train=('path',), seeds=[0], methods={'FT': {}})
    (run,) = plan.load_study(path, str(tmp_path)).runs
    assert run.train_opt['path'] == {'resume_state': None}


def test_a_pinned_draw_is_accepted_in_a_one_seed_study(tmp_path, demo_data):
    """One seed has nothing to repeat: a fixed ldt.seed there is the user's choice of partition."""
    path = tiny_study(tmp_path, demo_data, seeds=[4], methods={'LDT-random': {'model_type': 'LDTSRModel', 'ldt': {
        'method': 'ldt', 'criterion': 'random', 'profile_iters': 2, 'ema_every': 1, 'seed': 0}}})
    run = plan.load_study(path, str(tmp_path)).runs[0]
    assert (run.train_opt['manual_seed'], run.train_opt['ldt']['seed']) == (4, 0)
