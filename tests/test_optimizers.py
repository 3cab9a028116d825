"""``train.optim_g.fused``: the resolution (fused Adam where the parameters are on CUDA unless the
user says otherwise), the one-line refusals, every model's optimizers built through it, and resume
between fused and foreach/loop Adam. There is no GPU here: CUDA is faked through the one device
check of ``basicsr_ldt.models.optimizers`` (``_on_cuda``), and torch >= 2.4 runs fused Adam on CPU
tensors too, so the fused optimizers the models build really step."""
import copy
import os

import pytest
import torch

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.models import optimizers
from basicsr_ldt.models.optimizers import adam_kwargs, build_adam
from conftest import basicsr_log, run_entry
from test_cli import train_options, write
from test_corgrad_model import corgrad_options
from test_hardening import assert_one_line_failure, last_line
from test_ldt_model import ldt_options

OPTIM = {'type': 'Adam', 'lr': 1e-3, 'betas': [0.9, 0.99]}
BAD_VALUE = ('train.optim_g.fused: expected true, false or no value (fused Adam where the parameters are on CUDA), '
             'got {!r}')


@pytest.fixture
def fake_cuda(monkeypatch):
    """Every parameter counts as a CUDA tensor for the resolution (and for the logged implementation)."""
    monkeypatch.setattr(optimizers, '_on_cuda', lambda tensor: True)


def _params(count=3):
    return [torch.nn.Parameter(torch.randn(4, 3)) for _ in range(count)]


# -- the resolution ---------------------------------------------------------------------------------------
@pytest.mark.parametrize('given', [{}, {'fused': None}], ids=['absent', 'null'])
def test_not_set_on_cuda_is_fused(fake_cuda, given):
    assert adam_kwargs({**OPTIM, **given}, _params()) == {'lr': 1e-3, 'betas': [0.9, 0.99], 'fused': True}


@pytest.mark.parametrize('given', [{}, {'fused': None}], ids=['absent', 'null'])
def test_not_set_on_the_cpu_leaves_torch_its_default(given):
    assert adam_kwargs({**OPTIM, **given}, _params()) == {'lr': 1e-3, 'betas': [0.9, 0.99]}


def test_not_set_fuses_only_when_every_parameter_is_on_cuda(monkeypatch):
    params = _params()
    monkeypatch.setattr(optimizers, '_on_cuda', lambda tensor: tensor is not params[1])
    assert 'fused' not in adam_kwargs(OPTIM, params)
    assert 'fused' not in adam_kwargs(OPTIM, [])


@pytest.mark.parametrize('other', [{'foreach': True}, {'foreach': False}, {'differentiable': True}])
def test_not_set_leaves_an_implementation_the_user_chose(fake_cuda, other):
    assert adam_kwargs({**OPTIM, **other}, _params()) == {'lr': 1e-3, 'betas': [0.9, 0.99], **other}


def test_false_on_cuda_is_not_fused(fake_cuda):
    kwargs = adam_kwargs({**OPTIM, 'fused': False}, _params())
    assert kwargs['fused'] is False
    with basicsr_log() as lines:
        optimizer = build_adam(_params(), {**OPTIM, 'fused': False}, 'net_g')
    assert optimizer.defaults['fused'] is False
    assert lines == ['Adam for net_g (3 parameter tensors): foreach (train.optim_g.fused: false)']


def test_true_fuses_where_torch_can_and_is_one_line_where_it_cannot(monkeypatch):
    with basicsr_log() as lines:
        optimizer = build_adam(_params(), {**OPTIM, 'fused': True}, 'primary')   # CPU: fused since torch 2.4
    assert optimizer.defaults['fused'] is True
    assert lines == ['Adam for primary (3 parameter tensors): fused (train.optim_g.fused: true)']
    monkeypatch.setattr(optimizers, '_fused_devices', lambda: ('cuda',))       # a torch without CPU fused Adam
    with pytest.raises(InputError) as err:
        adam_kwargs({**OPTIM, 'fused': True}, _params())
    assert str(err.value) == (f"train.optim_g.fused: true, but torch {torch.__version__} has no fused Adam for "
                              "parameters torch.float32 on cpu (it fuses floating-point tensors on cuda); set it to "
                              "false or leave it out")


@pytest.mark.parametrize('value', ['yes', 'true', 1, 0, [True]])
def test_a_value_that_is_not_a_boolean_is_one_line_naming_the_option(value):
    with pytest.raises(InputError) as err:
        adam_kwargs({**OPTIM, 'fused': value}, _params())
    assert str(err.value) == BAD_VALUE.format(value) and '\n' not in str(err.value)


def test_true_with_foreach_and_another_optimizer_type_are_one_line():
    with pytest.raises(InputError, match=r"^train\.optim_g\.fused: true cannot be combined with "
                                         r"train\.optim_g\.foreach: true \(torch's fused Adam refuses it\)$"):
        adam_kwargs({**OPTIM, 'fused': True, 'foreach': True}, _params())
    with pytest.raises(InputError, match=r"^train\.optim_g\.type: expected 'Adam' .*, got 'SGD'$"):
        adam_kwargs({**OPTIM, 'type': 'SGD'}, _params())


def test_the_log_says_fused_or_torchs_default(fake_cuda, monkeypatch):
    with basicsr_log() as lines:
        build_adam(_params(), OPTIM, 'auxiliary')
        monkeypatch.setattr(optimizers, '_on_cuda', lambda tensor: False)
        build_adam(_params(2), OPTIM, 'net_g')
    assert lines == ['Adam for auxiliary (3 parameter tensors): fused (train.optim_g.fused not set: the parameters '
                     'are on CUDA)',
                     "Adam for net_g (2 parameter tensors): single-tensor (train.optim_g.fused not set: torch's "
                     'default for these parameters)']


# -- resume between implementations --------------------------------------------------------------------
def _stepped(optimizer, params, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        optimizer.step()


@pytest.mark.parametrize('saved_fused, resumed_fused', [(True, None), (None, True), (True, False)],
                         ids=['fused_to_auto_cpu', 'loop_to_fused', 'fused_to_false'])
def test_a_state_saved_by_one_implementation_resumes_in_the_other_and_keeps_the_new_one(saved_fused, resumed_fused):
    """torch's load_state_dict copies the saved group options, ``fused`` included: without the
    pre-hook a state written by fused Adam would switch the resumed optimizer to fused (and one
    written on a CPU would switch a GPU run off it). The moments and steps carry over either way."""
    params = _params()
    start = [p.detach().clone() for p in params]
    first = build_adam(params, {**OPTIM, 'fused': saved_fused}, 'net_g')
    _stepped(first, params, 3, seed=0)
    saved = copy.deepcopy(first.state_dict())
    _stepped(first, params, 2, seed=1)                              # the uninterrupted run

    again = [torch.nn.Parameter(p.detach().clone()) for p in params]
    twin = [torch.nn.Parameter(s.clone()) for s in start]          # the resumed run repeats the first 3 steps' weights
    replay = build_adam(twin, {**OPTIM, 'fused': saved_fused}, 'net_g')
    _stepped(replay, twin, 3, seed=0)
    for p, q in zip(again, twin):
        p.data.copy_(q.data)
    resumed = build_adam(again, {**OPTIM, 'fused': resumed_fused}, 'net_g')
    resumed.load_state_dict(saved)
    assert [g['fused'] for g in resumed.param_groups] == [resumed_fused]
    assert resumed.param_groups[0]['foreach'] is None
    step = resumed.state[again[0]]['step']
    assert step.item() == 3 and step.dtype is torch.float32
    _stepped(resumed, again, 2, seed=1)
    for p, q in zip(again, params):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert saved['param_groups'][0]['fused'] == saved_fused      # the caller's state is not changed


def test_a_state_with_another_number_of_groups_is_still_refused_by_torch():
    optimizer = build_adam(_params(), OPTIM, 'net_g')
    saved = optimizer.state_dict()
    saved['param_groups'] = saved['param_groups'] * 2
    with pytest.raises(ValueError, match='different number of parameter groups'):
        optimizer.load_state_dict(saved)


# -- every model's optimizers are built through it -------------------------------------------------------
def _build(opt, tmp_path):
    from basicsr.models import build_model
    opt = copy.deepcopy(opt)
    opt.update(is_train=True, dist=False, rank=0, world_size=1)
    opt['path'].update(models=str(tmp_path / 'models'), training_states=str(tmp_path / 'states'))
    return build_model(opt)


def _batch(i, cameras=None):
    g = torch.Generator().manual_seed(100 + i)
    batch = {'lq': torch.rand(3, 3, 8, 8, generator=g), 'gt': torch.rand(3, 3, 32, 32, generator=g)}
    if cameras:
        batch['camera'] = cameras
    return batch


def _optimizers_of(model, iterations, cameras=None):
    """Train ``iterations`` steps as the training loop does; the optimizers (by role) alive at any
    point of them."""
    seen = {}
    for i in range(1, iterations + 1):
        model.update_learning_rate(i)
        model.feed_data(_batch(i, cameras))
        model.optimize_parameters(i)
        ldt = getattr(model, 'ldt', None)
        seen.update(ldt.optimizers if ldt is not None else {'net_g': model.optimizer_g})
    return seen


CASES = {
    'FT': (lambda d: train_options(d, 'ft_fused'), 2, {'net_g'}),
    'CorGrad': (lambda d: corgrad_options(d, 'cg_fused'), 2, {'net_g'}),
    'LDT': (lambda d: ldt_options(d, 'ldt_fused', total_iter=6), 5, {'warmup', 'primary', 'auxiliary'}),
    'LP-FT': (lambda d: ldt_options(d, 'lpft_fused', total_iter=4, method='lp_ft', head_warmup_iters=1,
                                    profile_iters=0), 2, {'warmup', 'finetune'}),
    'LDT-S': (lambda d: ldt_options(d, 'ldt_s_fused', total_iter=6, method='ldt_s', interval_iters=1, ema_every=1),
              5, {'warmup', 'ldt_s'}),
}


@pytest.mark.parametrize('case', list(CASES))
def test_every_model_builds_every_adam_through_the_resolution(case, fake_cuda, demo_data, tmp_path, monkeypatch):
    """On (faked) CUDA every optimizer of every method is fused with the option not set, and none
    with ``fused: false``: FT's and CorGrad's through BasicSR's setup_optimizers, LDT's head warm-up,
    both branches, LP-FT's fine-tuning and LDT-S's through LDT's optimizer factory."""
    make, iterations, roles = CASES[case]
    opt = make(demo_data)
    cameras = ['Olympus', 'Sony', 'Canon'] if case == 'CorGrad' else None
    resolved = []
    real = optimizers.adam_kwargs
    monkeypatch.setattr(optimizers, 'adam_kwargs', lambda o, p: resolved.append(len(list(p))) or real(o, p))
    with basicsr_log() as lines:
        built = _optimizers_of(_build(opt, tmp_path), iterations, cameras)
    assert set(built) == roles
    assert all(o.defaults['fused'] is True and all(g['fused'] for g in o.param_groups) for o in built.values())
    assert {line.split(' (')[0] for line in lines if line.startswith('Adam for ')} == {f'Adam for {r}' for r in roles}
    assert all(line.endswith(': fused (train.optim_g.fused not set: the parameters are on CUDA)')
               for line in lines if line.startswith('Adam for '))
    assert len(resolved) >= len(roles)
    opt['train']['optim_g']['fused'] = False
    built = _optimizers_of(_build(opt, tmp_path / 'false'), iterations, cameras)
    assert all(o.defaults['fused'] is False for o in built.values())


def test_a_fused_ft_run_resumes_on_the_cpu_with_torchs_default_and_continues(demo_data, tmp_path, monkeypatch):
    """A training state written by a (faked) GPU run with fused Adam, resumed where nothing is
    fused: the resumed optimizer is the loop Adam, its moments are the saved ones, and the weights
    follow the uninterrupted fused run."""
    opt = train_options(demo_data, 'ft_resume')
    monkeypatch.setattr(optimizers, '_on_cuda', lambda tensor: True)
    model = _build(opt, tmp_path)
    _optimizers_of(model, 2)
    model.save_training_state(0, 2)
    state = torch.load(os.path.join(tmp_path, 'states', '2.state'), weights_only=True)
    assert state['optimizers'][0]['param_groups'][0]['fused'] is True
    monkeypatch.setattr(optimizers, '_on_cuda', lambda tensor: False)
    again = _build(opt, tmp_path)
    again.net_g.load_state_dict(model.net_g.state_dict())
    again.resume_training(state)
    assert again.optimizer_g.param_groups[0]['fused'] is None
    for i in (3, 4):
        for m in (model, again):
            m.feed_data(_batch(i))
            m.optimize_parameters(i)
    for name, value in model.net_g.state_dict().items():
        torch.testing.assert_close(again.net_g.state_dict()[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('make', [lambda d: train_options(d, 'bad'), lambda d: ldt_options(d, 'bad')],
                         ids=['FT', 'LDT'])
def test_a_bad_value_stops_training_in_one_line_before_anything_is_written(project, demo_data, make):
    opt = make(demo_data)
    opt['train']['optim_g']['fused'] = 'yes'
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'bad.yml', opt), check=False)
    assert_one_line_failure(project, result, 'bad')
    assert last_line(result) == 'error: ' + BAD_VALUE.format('yes')


def test_a_study_may_set_the_option_and_a_bad_value_is_refused_when_planned(demo_data):
    from basicsr_ldt.study.plan import check_training_options, merge_options
    base = train_options(demo_data, 'ft')
    merged = merge_options(base, {'train': {'optim_g': {'fused': False}}}, 'study')
    assert merged['train']['optim_g'] == {**base['train']['optim_g'], 'fused': False}
    with pytest.raises(InputError, match=r"'train\.optim_g\.fuse' is not an option of the base file \(did you mean "
                                         r"'fused'\?\)"):
        merge_options(base, {'train': {'optim_g': {'fuse': False}}}, 'study')
    check_training_options(merged, 'study: FT')
    merged['train']['optim_g']['fused'] = 'no'
    with pytest.raises(InputError) as err:
        check_training_options(merged, 'study: FT')
    assert str(err.value) == 'study: FT: ' + BAD_VALUE.format('no')


def test_fused_adam_under_fp16_loss_scaling_skips_overflows_and_trains_as_the_loop_adam(demo_data, tmp_path,
                                                                                      monkeypatch):
    """``amp: fp16`` (CUDA only, so faked as test_cuda_branches does) with fused Adam: GradScaler hands
    the fused kernel its scale and overflow flag instead of unscaling first. An overflowing step
    must leave the weights as they were and a finite one train as the loop Adam does."""
    from basicsr_ldt.models import guarded_step
    real = guarded_step.resolve_dtype
    monkeypatch.setattr(guarded_step, 'resolve_dtype', lambda key, value, choices, device: real(key, value, choices,
                                                                                                 'cuda'))
    opt = train_options(demo_data, 'fp16_fused')
    opt['train']['amp'] = 'fp16'
    models = {}
    for fused in (True, False):
        monkeypatch.setattr(optimizers, '_on_cuda', lambda tensor, fused=fused: fused)
        models[fused] = _build(opt, tmp_path / str(fused))
        models[fused].net_g.load_state_dict(models[True].net_g.state_dict())
    assert models[True].optimizer_g.defaults['fused'] is True and models[False].optimizer_g.defaults['fused'] is None
    for i in (1, 2, 3):
        for model in models.values():
            if i > 1:   # step 2's scaled gradients overflow, step 3's do not
                model.precision.scaler('net_g').update(2.0 ** 100 if i == 2 else 4096.0)
            before = {k: v.clone() for k, v in model.net_g.state_dict().items()}
            model.feed_data(_batch(i))
            model.optimize_parameters(i)
            changed = any(not torch.equal(before[k], v) for k, v in model.net_g.state_dict().items())
            assert changed == (i != 2), i
    for name, value in models[False].net_g.state_dict().items():
        torch.testing.assert_close(models[True].net_g.state_dict()[name], value, rtol=1e-5, atol=1e-6)
    assert models[True].optimizer_g.state_dict()['state'][0]['step'].item() == 2
