"""LDTSRModel through the real entry points: all three phases, the partition report, a composite
checkpoint test.py reads, exact resume from every phase, and the baselines as configurations."""
import json
import re
import shutil
from fnmatch import fnmatchcase

import pytest
import torch

from basicsr_ldt.common.errors import InputError
from conftest import run_entry
from test_cli import dataset, train_options, write

ONE_NETWORK = ('ft', 'lp_ft', 'ft_stable', 'ft_unstable')
NETWORK = {'type': 'SAFMN', 'dim': 8, 'n_blocks': 1, 'ffn_scale': 2.0, 'upscaling_factor': 4}


def ldt_options(data, name, total_iter=8, **ldt):
    opt = train_options(data, name, total_iter=total_iter, model_type='LDTSRModel', network_g=NETWORK)
    exchanges = {} if ldt.get('method') in ONE_NETWORK else {'ema_every': 2}   # no exchange: refused there
    if ldt.get('method') == 'ldt_s':          # each group trains within the run (else refused: see test_ldt_config)
        exchanges['interval_iters'] = 2
    profiling = 0 if ldt.get('method') == 'deft' else 2      # a split by name without DPU profiles nothing
    opt['ldt'] = {'head_warmup_iters': 2, 'profile_iters': profiling, **exchanges, **ldt}
    opt['logger']['save_checkpoint_freq'] = 1
    return opt


def weights(path):
    return torch.load(path, weights_only=True)['params']


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory, demo_data):
    """One full LDT run (warm-up 1-2, profiling 3-4, dual 5-8) saving a state every iteration."""
    from conftest import REPO
    project = tmp_path_factory.mktemp('ldt_project')
    for script in ('Train_pip.py', 'test.py'):
        shutil.copy(REPO / script, project / script)
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'ldt.yml', ldt_options(demo_data, 'ldt')))
    return project, result


def test_three_phases_partition_report_and_composite_checkpoint(uninterrupted, demo_data):
    project, result = uninterrupted
    exp = project / 'experiments' / 'ldt'
    log = next(exp.glob('train_ldt_*.log')).read_text()
    for text in ('head warm-up on D_S1 (2 iterations) from iteration 1', "profiling on D_S2 (2 batches, criterion 'var')",
                 'dual training (cross-frozen primary/auxiliary) from iteration 5', 'l_primary', 'l_auxiliary',
                 'LDT dual step: branches one after the other (ldt.overlap_branches'):
        assert text in log
    # 4 dual steps, an exchange every 2: the paper's W (0.99 and up: 100 exchanges or more) outlast the
    # run's 2 exchanges, and the log names the option that rescales them.
    assert re.search(r"WARNING: LDT: the stable layers' EMAs \(W 0\.99 \.\. [0-9.]+\) average over 100 exchanges or "
                     r'more, more than the 2 left in this run.*Set ldt\.ema_reference_iters', log)
    partition = json.loads((exp / 'ldt_partition.json').read_text())
    layers = partition['layers']
    params = dict(torch.load(exp / 'models' / 'net_g_latest.pth', weights_only=True)['params'])
    assert [layer['name'] for layer in layers] == [k for k in params if k in {l['name'] for l in layers}]
    unstable = [layer for layer in layers if layer['group'] == 'unstable']
    assert len(unstable) == round(0.4 * len(layers))
    assert min(l['statistic'] for l in unstable) >= max(l['statistic'] for l in layers if l['group'] == 'stable')
    assert (exp / 'ldt_partition.png').stat().st_size > 1000
    # The saved net_g is a plain network state (the composite) that test.py and SRModel load.
    test_opt = {'name': 'eval_ldt', 'scale': 4, 'num_gpu': 0, 'network_g': NETWORK, 'path': {},
                'datasets': {'test_1': dataset(demo_data, 'Test', ['Sony', 'Canon'])},
                'checkpoints': [{'label': 'LDT', 'path': str(exp / 'models' / 'net_g_latest.pth')}]}
    run_entry(project, 'test.py', '-opt', write(project / 'test.yml', test_opt))
    assert '| Mean | 4 |' in (project / 'results' / 'eval_ldt' / 'metrics.md').read_text()


@pytest.mark.parametrize('stop', [1, 3, 6], ids=['warmup', 'profile', 'dual'])
def test_resume_in_each_phase_reproduces_the_uninterrupted_run(uninterrupted, demo_data, stop):
    project, _ = uninterrupted
    assert_resume_reproduces(project, 'ldt', stop, ldt_options(demo_data, f'cut{stop}'))
    # the resumed log says where the run is, and how the dual step runs (its options may change on resume)
    log = next((project / 'experiments' / f'cut{stop}').glob(f'train_cut{stop}_*.log')).read_text()
    phase = {1: 'head warm-up on D_S1 (2 iterations)', 3: "gradient profiling on D_S2 (2 batches, criterion 'var')",
             6: 'dual training (cross-frozen primary/auxiliary)'}[stop]
    resumed = re.search(rf'LDT phase: {re.escape(phase)} resumed after iteration {stop}\n.*\n', log)
    assert resumed, log[-3000:]
    assert ('INFO: LDT dual step: branches one after the other' in resumed[0]) is (stop == 6)   # the next line


def assert_resume_reproduces(project, name, stop, options):
    """Resume a copy of experiment ``name`` killed right after iteration ``stop`` (only what existed
    then) with ``options`` (named ``cut<stop>``); its final net_g must equal the uninterrupted one."""
    full = project / 'experiments' / name
    cut = project / 'experiments' / options['name']
    (cut / 'training_states').mkdir(parents=True)
    (cut / 'models').mkdir()
    shutil.copy(full / 'training_states' / f'{stop}.state', cut / 'training_states')
    shutil.copy(full / 'models' / f'net_g_{stop}.pth', cut / 'models')
    run_entry(project, 'Train_pip.py', '-opt', write(project / f"{options['name']}.yml", options), '--auto_resume')
    expected, got = weights(full / 'models' / 'net_g_latest.pth'), weights(cut / 'models' / 'net_g_latest.pth')
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected), f'resume from iteration {stop} diverged'


@pytest.mark.parametrize('method', ['lp_ft', 'deft', 'ldt_no_dpu', 'ldt_mean', 'ldt_var_over_mean', 'ldt_random'])
def test_baselines_run_as_configurations(project, demo_data, method):
    extra = {'method': method}
    if method in ('lp_ft', 'deft', 'ldt_random'):  # nothing to profile: partition by name / by seed
        extra['profile_iters'] = 0
    opt = ldt_options(demo_data, method, total_iter=6, **extra)
    run_entry(project, 'Train_pip.py', '-opt', write(project / f'{method}.yml', opt))
    exp = project / 'experiments' / method
    assert (exp / 'models' / 'net_g_latest.pth').is_file()
    log = next(exp.glob(f'train_{method}_*.log')).read_text()
    assert ('l_finetune' in log) if method == 'lp_ft' else ('l_auxiliary' in log)
    if method != 'lp_ft':
        partition = json.loads((exp / 'ldt_partition.json').read_text())
        groups = {layer['group'] for layer in partition['layers']}
        assert groups == {'stable', 'unstable'}
        if method == 'deft':  # head (upsampler) unstable, backbone stable, one fixed coefficient
            assert all((layer['group'] == 'unstable') == layer['name'].startswith('to_img')
                       for layer in partition['layers'])
            assert {layer['coefficient'] for layer in partition['layers']} == {0.9999}


@pytest.mark.parametrize('method, trained', [('ft_stable', 'stable'), ('ft_unstable', 'unstable')])
def test_freezing_controls_train_one_group_and_save_it(project, demo_data, method, trained):
    """The controls through Train_pip.py: profiling, the partition report, then only the named group's
    tensors move; the other group is saved with the start's weights (net_g_1: after a profiling step)."""
    opt = ldt_options(demo_data, method, total_iter=6, method=method, head_warmup_iters=0)
    run_entry(project, 'Train_pip.py', '-opt', write(project / f'{method}.yml', opt))
    exp = project / 'experiments' / method
    log = next(exp.glob(f'train_{method}_*.log')).read_text()
    kept = 'unstable' if trained == 'stable' else 'stable'
    assert f'fine-tuning the {trained} layers alone (the {kept} stay frozen) from iteration 3' in log
    assert 'l_finetune' in log and 'l_auxiliary' not in log
    groups = {layer['name']: layer['group'] for layer in json.loads((exp / 'ldt_partition.json').read_text())['layers']}
    start, end = weights(exp / 'models' / 'net_g_1.pth'), weights(exp / 'models' / 'net_g_latest.pth')
    moved = {name for name, group in groups.items() if not torch.equal(start[name], end[name])}
    assert moved == {name for name, group in groups.items() if group == trained}


def test_run_prints_no_warning_and_branches_join_the_global_schedule(uninterrupted):
    """Branches created at a phase change start at the iteration's learning rate (milestone 4 halves
    1e-3), and torch no longer warns 'lr_scheduler.step() before optimizer.step()'."""
    project, result = uninterrupted
    assert 'Warning' not in result.stderr, result.stderr[-2000:]
    log = next((project / 'experiments' / 'ldt').glob('train_ldt_*.log')).read_text()
    lrs = dict(re.findall(r'iter:\s+(\d+), lr:\(([0-9.e+-]+),', log))
    assert [lrs[str(i)] for i in (1, 2, 5, 8)] == ['1.000e-03', '1.000e-03', '5.000e-04', '5.000e-04']


def _built(tmp_path, data, **ldt):
    """An LDTSRModel built in-process on a SAFMN with 11 blocks (feats.0 .. feats.10): what it logs."""
    from basicsr.models import build_model
    from conftest import basicsr_log
    opt = ldt_options(data, 'patterns', **ldt)
    opt['network_g'] = dict(NETWORK, n_blocks=11)
    opt['path'].update(models=str(tmp_path / 'models'), training_states=str(tmp_path / 'states'))
    opt.update(is_train=True, dist=False, rank=0, world_size=1)
    with basicsr_log() as lines:
        build_model(opt)
    return lines


def test_each_name_pattern_logs_the_parameters_it_selects_before_training(tmp_path, demo_data):
    """What a pattern took is in the log before warm-up starts: the head, and each force pattern
    (``feats.1`` is block 1, not block 10); a force pattern that selects nothing stops the run there,
    not after warm-up and profiling."""
    lines = _built(tmp_path, demo_data, force_stable=['feats.1'], force_unstable=['to_feat.weight'])
    assert "ldt.head_patterns ['conv_before_upsample', 'upsample', 'upconv*', 'conv_hr', 'conv_last', " \
           "'to_img'] select 2 parameters: to_img.0.weight, to_img.0.bias" in lines
    # A SAFMN block holds 18 tensors: norm1, norm2, four mfr convs, aggr, two ccm convs (weight, bias).
    first = [f'feats.1.{m}.{p}' for m in ('norm1', 'norm2', 'safm.mfr.0', 'safm.mfr.1', 'safm.mfr.2', 'safm.mfr.3')
             for p in ('weight', 'bias')]
    assert [line for line in lines if line.startswith('ldt.force_stable')] == [
        f"ldt.force_stable 'feats.1' selects 18 parameters: {', '.join(first)} and 6 more"]
    assert "ldt.force_unstable 'to_feat.weight' selects 1 parameter: to_feat.weight" in lines
    with pytest.raises(InputError, match=r"^ldt.force_unstable: pattern 'feat.1' matches no parameter of SAFMN "
                                         r"\(its first parameters: to_feat.weight, to_feat.bias, feats.0"):
        _built(tmp_path, demo_data, force_unstable=['feat.1'])


def test_head_patterns_are_checked_before_training_exactly_when_something_uses_them(tmp_path, demo_data):
    """The head is used by the warm-up and by a split by name (``partition: name``); with neither,
    nothing reads head patterns, so patterns other than the preset's are refused as unread (they would
    change nothing; before, ones that selected nothing passed unnoticed)."""
    message = (r"^ldt\.head_patterns \['upsample'\] match no parameter of SAFMN \(its last parameters: "
               r'feats\.10\.ccm\.ccm\.2\.weight, feats\.10\.ccm\.ccm\.2\.bias, to_img\.0\.weight, to_img\.0\.bias\)$')
    with pytest.raises(InputError, match=message):
        _built(tmp_path, demo_data, head_warmup_iters=0, partition='name', head_patterns=['upsample'])
    with pytest.raises(InputError, match=message):
        _built(tmp_path, demo_data, head_warmup_iters=1, head_patterns=['upsample'])
    with pytest.raises(InputError, match=r"^ldt\.head_patterns: method 'ldt' does not read it \(head_warmup_iters 0"):
        _built(tmp_path, demo_data, head_warmup_iters=0, head_patterns=['upsample'])
    lines = _built(tmp_path, demo_data, head_warmup_iters=0)
    assert not [line for line in lines if line.startswith('ldt.head_patterns')]


def test_a_partition_file_and_deft_non_layers_are_checked_when_the_model_is_built(tmp_path, demo_data):
    """Before training, not after the warm-up (mutation testing: the file read without the network's names,
    the deft split's check dropped): a missing file, a file of another network, and DeFT's ``non_layers``
    split on SAFMN, which has no ``layers.*``, each stop in one line; a file of this network passes."""
    from basicsr_ldt.ldt.partition import build_partition
    missing = str(tmp_path / 'nope.json')
    with pytest.raises(InputError, match=rf"^cannot read partition file {re.escape(missing)}: "):
        _built(tmp_path, demo_data, partition_file=missing, profile_iters=0)
    other = tmp_path / 'other.json'
    build_partition(['a.weight', 'b.weight'], [1.0, 2.0], partition='criterion', ratio_u=0.5).save(str(other))
    with pytest.raises(InputError, match=rf'^partition file {re.escape(str(other))} does not match the model: '):
        _built(tmp_path, demo_data, partition_file=str(other), profile_iters=0)
    from basicsr.utils.registry import ARCH_REGISTRY
    arguments = dict(NETWORK, n_blocks=11)
    names = [n for n, _ in ARCH_REGISTRY.get(arguments.pop('type'))(**arguments).named_parameters()]
    own = tmp_path / 'own.json'
    build_partition(names, [float(i) for i in range(len(names))], partition='criterion', ratio_u=0.4).save(str(own))
    assert any('ldt.head_patterns' in line for line in _built(tmp_path, demo_data, partition_file=str(own),
                                                                profile_iters=0))
    with pytest.raises(InputError, match=r"^ldt\.deft_grouping 'non_layers' needs 'layers\.\*' parameters, and the "
                                         r'network has none \(first names: to_feat\.weight, '):
        _built(tmp_path, demo_data, method='deft', deft_grouping='non_layers', profile_iters=0)



def test_a_split_that_leaves_a_group_empty_stops_when_the_model_is_built(tmp_path, demo_data):
    """Audit 6: force patterns taking every layer stopped the run with a traceback after profiling (after 1,000
    warm-up iterations for DeFT), leaving its folder; what no statistic can change is refused before training."""
    with pytest.raises(InputError, match=r"^ldt\.force_unstable: its patterns select every parameter of SAFMN, so the "
                                         r'stable group would be empty; expected some parameters left to the split$'):
        _built(tmp_path, demo_data, force_unstable=['*'])
    with pytest.raises(InputError, match=r"^ldt\.force_stable: .* so the unstable group would be empty"):
        _built(tmp_path, demo_data, force_stable=['to_feat', 'feats', 'to_img'])
    with pytest.raises(InputError, match=r"^ldt\.partition 'name': partition: both groups need at least one layer "
                                         r'\(\d+ stable, 0 unstable\)'):
        _built(tmp_path, demo_data, method='deft', profile_iters=0, force_stable=['to_img'])
    with pytest.raises(InputError, match=r"^ldt\.partition 'name': partition: both groups need at least one layer "
                                         r'\(0 stable, \d+ unstable\)'):
        _built(tmp_path, demo_data, method='deft', profile_iters=0, force_unstable=['to_feat', 'feats'])
    assert _built(tmp_path, demo_data, force_stable=['to_feat', 'feats'])      # the head is left to the split


def _selected(names, pattern):
    """The documented pattern rule, written out: an exact name, an fnmatch glob, or a module prefix."""
    return [n for n in names if n == pattern or n.startswith(pattern + '.') or fnmatchcase(n, pattern)]


@pytest.mark.parametrize('force, error', [
    # A module prefix of 18 tensors (block 1, not block 10) and one exact name.
    ({'force_stable': ['feats.1'], 'force_unstable': ['to_feat.weight']}, None),
    # A glob over blocks 1 and 10 and a prefix of the upsampler, both in one option.
    ({'force_unstable': ['feats.1*', 'to_img']}, None),
    # A typo: the second pattern matches nothing.
    ({'force_stable': ['feats.0'], 'force_unstable': ['to_img', 'feat.1']},
     r"^ldt\.force_unstable: pattern 'feat\.1' matches no parameter of SAFMN \(its first parameters: to_feat\.weight, "),
    # One tensor forced into both groups (through a prefix and an exact name).
    ({'force_stable': ['feats.1'], 'force_unstable': ['to_img', 'feats.1.norm1.weight']},
     r"^layers forced both stable and unstable: ldt\.force_stable 'feats\.1' and ldt\.force_unstable "
     r"'feats\.1\.norm1\.weight' both select \['feats\.1\.norm1\.weight'\]$"),
])
def test_the_check_before_training_and_the_partition_agree_on_force_patterns(tmp_path, demo_data, force, error):
    """What the up-front check accepts and logs for each force pattern is what the partition, built
    later by LDT on the same network, forces into that group; what it refuses, the partition refuses
    with the same line (before, a layer forced into both groups passed the check and stopped the run
    only after warm-up and profiling)."""
    from basicsr.archs import build_network
    from basicsr_ldt.models.ldt_model import ldt_config_from_options
    from basicsr_ldt.ldt import LDT
    ldt = dict(head_warmup_iters=0, profile_iters=0, criterion='random', **force)
    opt = ldt_options(demo_data, 'patterns', **ldt)
    network = build_network(dict(NETWORK, n_blocks=11))
    names = [n for n, _ in network.named_parameters()]
    later = LDT(network, ldt_config_from_options(opt), lambda params, role: torch.optim.Adam(params), total_iters=8)
    if error is not None:
        with pytest.raises(InputError, match=error) as before:
            _built(tmp_path, demo_data, **ldt)
        with pytest.raises(ValueError) as after:
            later.enter(1)
        assert str(after.value) == str(before.value)
        return
    lines = _built(tmp_path, demo_data, **ldt)
    later.enter(1)
    groups = {'force_stable': later.partition.stable, 'force_unstable': later.partition.unstable}
    forced = {n for patterns in force.values() for pattern in patterns for n in _selected(names, pattern)}
    assert later.partition.forced == [n for n in names if n in forced]   # what the picture hatches
    for option, patterns in force.items():
        for pattern in patterns:
            chosen = _selected(names, pattern)
            assert chosen and set(chosen) <= set(groups[option]), (option, pattern)
            shown = ', '.join(chosen[:12]) + (f' and {len(chosen) - 12} more' if len(chosen) > 12 else '')
            plural = 's' if len(chosen) > 1 else ''
            assert f"ldt.{option} '{pattern}' selects {len(chosen)} parameter{plural}: {shown}" in lines


def _picture_partition():
    """Six layers, the upsampler forced unstable, W rescaled to a 450-exchange run as LDT-scaled does:
    every statistic and every W differ, so a panel drawn in another order shows."""
    from basicsr_ldt.ldt import build_partition
    from basicsr_ldt.ldt.ema_horizon import scale_partition
    names = ['to_feat.weight', 'feats.0.weight', 'feats.0.bias', 'feats.1.weight', 'to_img.0.weight', 'to_img.0.bias']
    statistics = [3e-6, 1e-4, 2e-8, 5e-5, 1e-7, 4e-7]
    built = build_partition(names, statistics, partition='criterion', ratio_u=0.4, force_unstable=['to_img'])
    return scale_partition(built, 20000, {'stable': 450, 'unstable': 450}), statistics


def test_the_partition_picture_shows_each_layers_statistic_and_the_w_the_run_uses(tmp_path):
    """ldt_partition.png (the paper's Figure 2a for one run): on top the statistic per layer, log
    scale, coloured by group, as before; below, on the same layer axis, each layer's EMA coefficient
    W as the run uses it (here rescaled by ema_reference_iters) in layer order; the layers a force
    pattern put into their group are hatched in both panels and named in the legend."""
    from matplotlib import pyplot as plt
    from matplotlib.colors import to_rgba
    from basicsr_ldt.models.partition_report import partition_figure, write_partition_report
    partition, statistics = _picture_partition()
    assert len(set(partition.dpu_coefficients.values())) == 6 and max(partition.dpu_coefficients.values()) < 0.99
    figure = partition_figure(partition)
    try:
        statistic_axis, coefficient_axis = figure.axes
        top, bottom = statistic_axis.containers[0], coefficient_axis.containers[0]
        assert [bar.get_height() for bar in top] == statistics
        assert statistic_axis.get_yscale() == 'log' and statistic_axis.get_ylabel() == 'gradient var'
        assert [bar.get_height() for bar in bottom] == [partition.dpu_coefficients[n] for n in partition.names]
        assert [bar.get_x() for bar in bottom] == [bar.get_x() for bar in top]   # one layer axis
        colour = {'stable': to_rgba('tab:blue'), 'unstable': to_rgba('tab:red')}
        for bars in (top, bottom):
            assert [bar.get_facecolor() for bar in bars] == [colour[r.group] for r in partition.layers]
            assert [bool(bar.get_hatch()) for bar in bars] == [False] * 4 + [True] * 2   # to_img.*: forced
        labels = [text.get_text() for legend in figure.legends for text in legend.get_texts()]
        assert labels == ['stable', 'unstable', 'forced (ldt.force_stable / force_unstable)']
    finally:
        plt.close(figure)
    unused = partition_figure(partition, exchanged=False)      # ft_stable / ft_unstable: no exchange
    try:
        assert unused.axes[1].get_title().startswith("W, unused (mode 'partial'): stable ")
        assert figure.axes[1].get_title().startswith('W the run uses: stable ')
    finally:
        plt.close(unused)
    write_partition_report(partition, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ['ldt_partition.json', 'ldt_partition.png']
    assert json.loads((tmp_path / 'ldt_partition.json').read_text())['layers'][4]['forced'] is True


def test_a_run_extended_on_resume_says_its_coefficients_keep_their_first_rescaling(project, demo_data):
    """ldt.ema_reference_iters rescales W once, when the partition is made; a run resumed with a longer
    total_iter trained on with them without a word."""
    opt = ldt_options(demo_data, 'extended', total_iter=6, ema_reference_iters=20)
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'extended.yml', opt))
    opt['train']['total_iter'] = 8
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'extended.yml', opt), '--auto_resume')
    logs = sorted((project / 'experiments' / 'extended').glob('train_extended_*.log'))
    assert ('LDT EMA coefficients stay rescaled for the 6 iterations of the run their partition was made in; '
            'train.total_iter is now 8') in logs[-1].read_text()
    assert 'stay rescaled' not in logs[0].read_text()
