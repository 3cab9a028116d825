"""L2-SP (``train.l2_sp_weight``): fine-tuning with (lambda / 2) ||theta - theta_start||^2.

A user relies on the penalty being exactly L2-SP's over the parameters the start holds (head
included), on its gradient reaching the weights the way the data term's does, on it being logged
beside the loss, and on a bad value, a missing start or a method with two trained networks being
refused before anything is written. The references are written here in float64.
"""
import copy

import pytest
import torch
from torch import nn

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.models.l2_sp import L2SPPenalty
from test_cli import NETWORK, train_options, write
from conftest import run_entry
from test_hardening import assert_one_line_failure, last_line
from test_optimizers import CASES, _batch, _build


def toy() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def test_the_penalty_and_its_gradient_are_l2_sp_over_the_parameters_of_the_start():
    network = toy()
    start = {name: p.detach() + 0.1 * torch.randn_like(p) for name, p in network.named_parameters()
             if name != '2.bias'}                                  # one parameter the start lacks
    lam = 0.37
    penalty = L2SPPenalty(network, start, lam)(network)
    expected = lam / 2 * sum(((p.detach().double() - start[n].double()) ** 2).sum()
                             for n, p in network.named_parameters() if n in start)
    assert float(penalty) == pytest.approx(float(expected), rel=1e-6)
    penalty.backward()
    for name, p in network.named_parameters():
        if name in start:
            torch.testing.assert_close(p.grad.double(), lam * (p.detach().double() - start[name].double()),
                                       rtol=1e-6, atol=1e-9)
        else:
            assert p.grad is None                                  # no start value, no penalty


def test_start_values_that_do_not_fit_the_network_are_refused():
    network = toy()
    with pytest.raises(ValueError, match='do not match'):
        L2SPPenalty(network, {'0.weight': torch.zeros(2, 2)}, 1.0)


def _start_file(tmp_path, network_opt=NETWORK) -> str:
    """A start checkpoint: a randomly initialised network (seeded), saved BasicSR-style."""
    from basicsr.archs import build_network
    torch.manual_seed(3)
    network = build_network(dict(network_opt))
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"start_{network_opt['type']}.pth"
    torch.save({'params': network.state_dict()}, path)
    return str(path)


def _with_l2_sp(opt, start, lam):
    opt = copy.deepcopy(opt)
    opt['path']['pretrain_network_g'] = start
    opt['train']['l2_sp_weight'] = lam
    return opt


def test_an_ft_step_descends_the_data_loss_plus_the_penalty(demo_data, tmp_path, monkeypatch):
    """The gradient Adam receives at a step after the first equals, in float64, the L1 data term's
    gradient plus lambda (theta - theta_start), theta_start read from the file, head included."""
    start = _start_file(tmp_path)
    lam = 2.5
    model = _build(_with_l2_sp(train_options(demo_data, 'l2sp_ft'), start, lam), tmp_path)
    states = torch.load(start)['params']
    head = [n for n in model.l2_sp.names if n.startswith(('upconv', 'conv_last'))]
    assert head and sorted(model.l2_sp.names) == sorted(n for n, _ in model.net_g.named_parameters())
    seen = {}

    def record(*args, **kwargs):
        seen['grads'] = {n: p.grad.detach().clone() for n, p in model.net_g.named_parameters()}
        return original(*args, **kwargs)

    for i in (1, 2):
        model.update_learning_rate(i)
        model.feed_data(_batch(i))
        if i == 2:
            before = copy.deepcopy(model.net_g).double()
            original = model.optimizer_g.step
            monkeypatch.setattr(model.optimizer_g, 'step', record)
        model.optimize_parameters(i)
    batch = _batch(2)
    loss = nn.functional.l1_loss(before(batch['lq'].double()), batch['gt'].double())
    data = torch.autograd.grad(loss, list(before.parameters()))
    for (name, p), g in zip(before.named_parameters(), data):
        expected = g + lam * (p.detach() - states[name].double())
        torch.testing.assert_close(seen['grads'][name].double(), expected, rtol=1e-4, atol=1e-6)
    penalty = lam / 2 * sum(((p.detach() - states[n].double()) ** 2).sum() for n, p in before.named_parameters())
    assert float(model.log_dict['l_l2sp']) == pytest.approx(float(penalty), rel=1e-5)


@pytest.mark.parametrize('case', ['FT', 'CorGrad', 'LP-FT', 'LDT-S'])
def test_every_single_network_method_trains_with_the_penalty_and_logs_it(case, demo_data, tmp_path):
    """The logged l_l2sp is the penalty of the weights the step started from; a large lambda keeps
    the network nearer its start than lambda 0 does over the same batches."""
    make, iterations, _ = CASES[case]
    start = _start_file(tmp_path, make(demo_data)['network_g'])
    states = torch.load(start)['params']
    distances = {}
    for lam in (0.0, 50.0):
        model = _build(_with_l2_sp(make(demo_data), start, lam), tmp_path / str(lam))
        cameras = ['Olympus', 'Sony', 'Canon'] if case == 'CorGrad' else None
        network = model.get_bare_model(model.net_g)
        for i in range(1, iterations + 1):
            model.update_learning_rate(i)
            model.feed_data(_batch(i, cameras))
            weights = {n: p.detach().double().clone() for n, p in network.named_parameters()}
            model.optimize_parameters(i)
            if lam and 'l_l2sp' in model.log_dict:
                expected = lam / 2 * sum(((w - states[n].double()) ** 2).sum() for n, w in weights.items())
                assert float(model.log_dict['l_l2sp']) == pytest.approx(float(expected), rel=1e-4, abs=1e-9)
        assert (lam == 0) == ('l_l2sp' not in model.log_dict)
        distances[lam] = sum(((p.detach().double() - states[n].double()) ** 2).sum()
                             for n, p in network.named_parameters())
    assert distances[50.0] < distances[0.0]


def test_a_profiling_step_has_no_penalty(demo_data, tmp_path):
    """LDT's gradient statistics are of the data term: profiling batches carry no penalty."""
    from test_ldt_model import ldt_options
    opt = _with_l2_sp(ldt_options(demo_data, 'l2sp_profile', total_iter=6, method='ldt_s', interval_iters=1,
                                  ema_every=1, head_warmup_iters=0, profile_iters=2), None, 1.0)
    opt['path']['pretrain_network_g'] = _start_file(tmp_path, opt['network_g'])
    model = _build(opt, tmp_path)
    calls = []
    penalty = model.l2_sp.forward
    model.l2_sp.forward = lambda network: calls.append(model.ldt.current_phase) or penalty(network)
    for i in range(1, 5):
        model.update_learning_rate(i)
        model.feed_data(_batch(i))
        model.optimize_parameters(i)
    assert calls and 'profile' not in calls


@pytest.mark.parametrize('method', ['ldt', 'deft'])
def test_a_method_with_two_trained_networks_is_refused(method, demo_data, tmp_path):
    from test_ldt_model import ldt_options
    opt = _with_l2_sp(ldt_options(demo_data, 'l2sp_pair', total_iter=6, method=method), None, 1.0)
    opt['path']['pretrain_network_g'] = _start_file(tmp_path, opt['network_g'])
    with pytest.raises(InputError, match=r'^train\.l2_sp_weight: .*cross-frozen pair'):
        _build(opt, tmp_path)


@pytest.mark.parametrize('value, start, message', [
    (-0.1, True, r'expected a finite number >= 0'),
    ('big', True, r'expected a finite number >= 0'),
    (1.0, False, r'L2-SP anchors the run to its start, and path\.pretrain_network_g names none'),
])
def test_bad_values_are_refused_when_a_study_is_planned(demo_data, tmp_path, value, start, message):
    from basicsr_ldt.study.plan import check_training_options
    opt = _with_l2_sp(train_options(demo_data, 'l2sp_bad'), _start_file(tmp_path) if start else None, value)
    with pytest.raises(InputError, match=r"^study: L2-SP: train\.l2_sp_weight: " + message):
        check_training_options(opt, 'study: L2-SP')


def test_a_start_of_another_network_stops_training_in_one_line_before_anything_is_written(project, demo_data,
                                                                                         tmp_path):
    other = nn.Conv2d(3, 5, 3)
    torch.save({'params': {'stem.weight': other.weight.detach(), 'stem.bias': other.bias.detach()}},
               tmp_path / 'other.pth')           # loads under strict_load_g: false, anchors nothing
    opt = _with_l2_sp(train_options(demo_data, 'bad'), str(tmp_path / 'other.pth'), 1.0)
    opt['path']['strict_load_g'] = False
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'bad.yml', opt), check=False)
    assert_one_line_failure(project, result, 'bad')
    assert last_line(result).startswith("error: checkpoint '")   # the load refuses it, with L2-SP or without
    assert "holds none of network MSRResNet's 14 tensors (it has e.g. stem.bias, stem.weight)" in last_line(result)


@pytest.mark.parametrize('method, refused', [('ldt', True), ('deft', True), ('ldt_s', False), ('lp_ft', False),
                                             ('corgrad', False)])
def test_a_study_refuses_l2_sp_on_the_pair_when_planned(demo_data, tmp_path, method, refused):
    """Planned, not at iteration 1 of the run (mutation testing: the pair check survived)."""
    from basicsr_ldt.study.plan import check_training_options
    from test_ldt_model import ldt_options
    opt = ldt_options(demo_data, 'plan', total_iter=8, method=method)
    if method == 'lp_ft':
        opt['ldt'].update(profile_iters=0, head_warmup_iters=2)
    if method == 'corgrad':
        opt['ldt'] = {'method': 'corgrad'}
        opt['datasets']['train']['cameras'] = ['Olympus', 'Pan']
    opt = _with_l2_sp(opt, 'start.pth', 0.1)
    if refused:
        with pytest.raises(InputError, match=r'^study: train\.l2_sp_weight: .*cross-frozen pair'):
            check_training_options(opt, 'study')
    else:
        check_training_options(opt, 'study')


def test_a_resumed_run_is_anchored_to_its_start_not_to_the_state_it_resumes_from(project, demo_data, tmp_path):
    """BasicSR's resume points path.pretrain_network_g at the resumed state's weights; an L2-SP run
    resumed there would be pulled toward its own iteration-2 weights (l_l2sp 0 at the first step after
    the resume). Resumed, it must end with the uninterrupted run's weights."""
    start = _start_file(tmp_path)

    def options(name, total_iter=4):
        opt = _with_l2_sp(train_options(demo_data, name, total_iter=total_iter), start, 0.5)
        opt['train']['scheduler']['milestones'] = [2]
        opt['logger']['save_checkpoint_freq'] = 2
        return opt
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'full.yml', options('full')))
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'cut.yml', options('cut', total_iter=2)))
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'cut.yml', options('cut')), '--auto_resume')
    weights = {name: torch.load(project / 'experiments' / name / 'models' / 'net_g_latest.pth',
                                weights_only=True)['params'] for name in ('full', 'cut')}
    assert all(torch.equal(weights['full'][k], weights['cut'][k]) for k in weights['full'])
