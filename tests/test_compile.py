"""``train.compile``: the networks' repeated blocks compiled for training forwards only (``archs.compile``).

Compiled with ``aot_eager`` (runs on a CPU; it compiles the same forward + backward graphs inductor
gets, without generating code). Each test starts from an empty dynamo cache and counts the graphs it
compiles, so a compile that should not happen (a validation image size, a second instance, a copy)
shows up as a number.
"""
import copy
import re

import pytest
import torch
from timm.layers import DropPath
from torch import nn
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

import archs.compile as arch_compile
from archs.compile import TracedDropPath, compile_blocks, compiled_blocks
from archs.hat_arch import HAT
from archs.mambair_arch import MambaIR
from archs.safmn_arch import AttBlock, SAFMN
from basicsr_ldt.common.errors import InputError
from basicsr_ldt.models.compiled_blocks import CompileSetting, compile_decision, compile_setting
from conftest import basicsr_log, load_script, run_entry
from test_cli import train_options, write

BACKEND = 'aot_eager'
SAFMN_NET = {'type': 'SAFMN', 'dim': 8, 'n_blocks': 2, 'ffn_scale': 2.0, 'upscaling_factor': 4}


def graphs() -> int:
    """Graphs dynamo has compiled in this process (each compile of a function or variant adds one)."""
    return counters['stats']['unique_graphs']


@pytest.fixture(autouse=True)
def empty_dynamo_cache():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------- options
@pytest.mark.parametrize('given, expected', [
    ({}, CompileSetting('auto', 'inductor')),
    ({'compile': None, 'compile_backend': None}, CompileSetting('auto', 'inductor')),
    ({'compile': 'auto'}, CompileSetting('auto', 'inductor')),
    ({'compile': True, 'compile_backend': 'aot_eager'}, CompileSetting('true', 'aot_eager')),
    ({'compile': False}, CompileSetting('false', 'inductor')),
])
def test_compile_option_values(given, expected):
    assert compile_setting(given) == expected


@pytest.mark.parametrize('given, message', [
    ({'compile': 'sometimes'}, "train.compile: expected one of 'auto', true, false, got 'sometimes'"),
    ({'compile': 1}, "train.compile: expected one of 'auto', true, false, got 1"),
    ({'compile': 'TRUE'}, "train.compile: expected one of 'auto', true, false, got 'TRUE' (text: write true or false "
                          'without quotes)'),
    ({'compile': True, 'compile_backend': ''},
     "train.compile_backend: expected the name of a torch.compile backend, got ''"),
    ({'compile_backend': ['inductor']}, 'train.compile_backend: expected the name of a torch.compile backend'),
    ({'compile': True, 'compile_backend': 'inductr'}, "train.compile_backend: 'inductr' is not a torch.compile backend "
                                                      'of this torch (known: aot_eager, '),
])
def test_bad_compile_options_name_the_key(given, message):
    with pytest.raises(InputError) as err:
        compile_setting(given)
    assert str(err.value).startswith(message)
    assert '\n' not in str(err.value)


def test_auto_compiles_listed_architectures_on_cuda_only(monkeypatch):
    net, auto = SAFMN(dim=8, n_blocks=1), CompileSetting('auto', 'inductor')
    assert compile_decision(auto, net, 'cpu') == (False, 'train.compile: auto compiles on CUDA only, this run is on cpu')
    monkeypatch.setattr(arch_compile, 'COMPILE_BY_DEFAULT', frozenset())
    on, reason = compile_decision(auto, net, 'cuda')
    assert not on and reason == ('train.compile: auto, and no GPU measurement put SAFMN in '
                                 'archs.compile.COMPILE_BY_DEFAULT (empty)')
    monkeypatch.setattr(arch_compile, 'COMPILE_BY_DEFAULT', frozenset({'SAFMN'}))
    assert compile_decision(auto, net, 'cuda') == (True, '')
    assert compile_decision(auto, MambaIR(img_size=8, embed_dim=30, depths=(1,)), 'cuda')[0] is False
    assert compile_decision(CompileSetting('false', 'inductor'), net, 'cuda') == (False, 'train.compile: false')
    assert compile_decision(CompileSetting('true', 'inductor'), net, 'cpu') == (True, '')
    # a model type whose compiled step no GPU run timed (LDT's, CorGrad's) stays eager under auto
    assert compile_decision(auto, net, 'cuda', "LDT's steps") == (
        False, "train.compile: auto compiles the FT step only (the one a GPU run timed compiled), not LDT's steps; "
               'true compiles it')
    assert compile_decision(CompileSetting('true', 'inductor'), net, 'cuda', "LDT's steps") == (True, '')


def test_auto_compiles_mambair_and_safmn_ft_on_cuda_as_measured():
    """The GPU run of 2026-11-28: MambaIR's and SAFMN's FT steps faster compiled with a cold compile
    within 60 s; HAT's compile took 80 s; LDT's and CorGrad's compiled steps were not timed."""
    from basicsr_ldt.models.corgrad_model import CorGradSRModel
    from basicsr_ldt.models.ft_model import FTSRModel
    from basicsr_ldt.models.ldt_model import LDTSRModel
    assert arch_compile.COMPILE_BY_DEFAULT == {'MambaIR', 'SAFMN'}
    assert (FTSRModel.compile_auto_untimed, bool(LDTSRModel.compile_auto_untimed),
            bool(CorGradSRModel.compile_auto_untimed)) == ('', True, True)


def test_true_refuses_a_network_without_blocks_to_compile():
    from basicsr.archs.srresnet_arch import MSRResNet
    with pytest.raises(InputError, match=r"^train.compile: true, but network_g type 'MSRResNet' has no blocks to compile "
                                         r'\(only HAT, MambaIR, SAFMN have\); use auto or false$'):
        compile_decision(CompileSetting('true', 'inductor'), MSRResNet(num_feat=8, num_block=1), 'cpu')
    # auto and false do not mind: a study may switch architectures under one setting
    assert compile_decision(CompileSetting('auto', 'inductor'), MSRResNet(num_feat=8, num_block=1), 'cuda')[0] is False


# ---------------------------------------------------------------------------------------------- blocks
def _step(network: nn.Module, x: torch.Tensor):
    network.zero_grad(set_to_none=True)
    out = network(x)
    out.square().mean().backward()
    return out.detach(), {n: None if p.grad is None else p.grad.clone() for n, p in network.named_parameters()}


def _assert_close(a, b):
    """Outputs, gradients (None where frozen) or state dicts agree to float rounding."""
    if isinstance(a, tuple):
        for x, y in zip(a, b):
            _assert_close(x, y)
        return
    if isinstance(a, dict):
        assert a.keys() == b.keys()
    for x, y in ([(a[k], b[k]) for k in a] if isinstance(a, dict) else [(a, b)]):
        assert (x is None) == (y is None)
        if x is not None:
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


NETWORKS = {
    # (network, a training batch, a validation image of another size, block classes)
    'SAFMN': (lambda: SAFMN(dim=8, n_blocks=2, upscaling_factor=2), (2, 3, 16, 16), (1, 3, 12, 20), 'AttBlock'),
    # drop_path_rate 0 here: TracedDropPath draws other random numbers than timm's (tested below)
    'HAT': (lambda: HAT(img_size=8, embed_dim=12, depths=(2,), num_heads=(2,), window_size=4, squeeze_factor=4,
                        upscale=2, upsampler='pixelshuffle', drop_path_rate=0.), (2, 3, 8, 8), (1, 3, 8, 12), 'HAB/OCAB'),
    'MambaIR': (lambda: MambaIR(img_size=4, embed_dim=30, depths=(2,), d_state=2, mlp_ratio=1., upscale=2,
                                upsampler='pixelshuffledirect', scan_backend='torch', drop_path_rate=0.),
                (1, 3, 4, 4), (1, 3, 3, 5), 'VSSBlock'),
}
# graphs per training step: SAFMN one (both blocks alike), HAT three (unshifted HAB, shifted HAB,
# OCAB), MambaIR one (the torch scan traced into the block's graph)
GRAPHS = {'SAFMN': 1, 'HAT': 3, 'MambaIR': 1}


@pytest.mark.parametrize('arch', sorted(NETWORKS))
def test_compiled_blocks_train_like_eager_and_leave_the_network_as_it_was(arch):
    build, train_shape, val_shape, classes = NETWORKS[arch]
    torch.manual_seed(0)
    eager = build().train()
    compiled = copy.deepcopy(eager)
    count = compile_blocks(compiled, BACKEND)
    blocks = compiled_blocks(compiled)
    assert count == len(blocks) >= 2 and '/'.join(c.__name__ for c in arch_compile.block_classes(compiled)) == classes
    assert list(compiled.state_dict()) == list(eager.state_dict())   # no _orig_mod. or other new keys
    x = torch.rand(train_shape)

    # first training call of each block: eager (no compile); then compiled, both like eager
    before = graphs()
    _assert_close(_step(compiled, x), _step(eager, x))
    assert graphs() == before
    _assert_close(_step(compiled, x), _step(eager, x))
    assert graphs() == before + GRAPHS[arch]
    _assert_close(_step(compiled, x), _step(eager, x))   # the same graphs again
    assert graphs() == before + GRAPHS[arch]

    # a copy (LDT's auxiliary branch) runs its own weights through the same graphs
    twin = copy.deepcopy(compiled)
    assert len(compiled_blocks(twin)) == count
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(0.01)
    reference = copy.deepcopy(eager)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.01)
    _assert_close(_step(twin, x), _step(reference, x))
    assert graphs() == before + GRAPHS[arch]

    # validation: eager at any size, nothing compiled
    compiled.eval()
    eager.eval()
    with torch.no_grad():
        y = torch.rand(val_shape)
        _assert_close(compiled(y), eager(y))
    assert graphs() == before + GRAPHS[arch]
    # training-mode forward without gradients (nothing compiled for it either)
    compiled.train()
    with torch.no_grad():
        compiled(x)
    assert graphs() == before + GRAPHS[arch]


def test_marking_twice_keeps_one_dispatcher_and_checkpointed_blocks_stay_eager():
    net = SAFMN(dim=8, n_blocks=2)
    assert compile_blocks(net, BACKEND) == 2 and compile_blocks(net, 'eager') == 2
    assert {b.__dict__['_compile_backend'] for b in compiled_blocks(net)} == {'eager'}
    hat = HAT(img_size=8, embed_dim=12, depths=(2,), num_heads=(2,), window_size=4, squeeze_factor=4,
              upsampler='pixelshuffle', use_checkpoint=True)
    assert compile_blocks(hat, BACKEND) == 0 and compiled_blocks(hat) == []


def _safmn_pair_after_first_call():
    """An eager SAFMN and its compiled copy, a training batch, and the copy's (eager) first call made."""
    torch.manual_seed(0)
    eager = SAFMN(dim=8, n_blocks=2, upscaling_factor=2).train()
    compiled = copy.deepcopy(eager)
    compile_blocks(compiled, BACKEND)
    x = torch.rand(2, 3, 16, 16)
    _step(compiled, x)
    return eager, compiled, x


def test_every_frozen_pattern_runs_the_one_all_trainable_graph():
    """LDT freezes different tensors per block and branch. Each compiled call hands its frozen
    tensors to the graph as leaves that require gradients, so every pattern (and LDT-S alternating
    between two) runs the graph FT compiled: frozen tensors get no gradient and stay the same
    objects, trained ones get eager's gradients."""
    eager, compiled, x = _safmn_pair_after_first_call()
    before = graphs()
    _assert_close(_step(compiled, x), _step(eager, x))   # FT: every tensor trains
    assert graphs() == before + 1

    def freeze(network, pattern):
        for name, p in network.named_parameters():
            p.requires_grad_(not (name.startswith('feats.') and pattern(name)))

    patterns = [lambda n: 'norm' in n, lambda n: 'ccm' in n,             # each the same in both blocks
                lambda n: n.startswith('feats.1.ccm.ccm.0.')]            # one block unlike the other
    for _ in range(2):
        for pattern in patterns:
            freeze(compiled, pattern)
            freeze(eager, pattern)
            parameters = dict(compiled.named_parameters())
            got, want = _step(compiled, x), _step(eager, x)
            _assert_close(got, want)
            assert all(p is parameters[n] for n, p in compiled.named_parameters())
            assert all(got[1][n] is None and p.grad is None for n, p in parameters.items() if not p.requires_grad)
    assert graphs() == before + 1
    assert [k for k in arch_compile._compiled if k[0] is AttBlock] == [(AttBlock, BACKEND)]
    code = arch_compile._compiled[(AttBlock, BACKEND)]._torchdynamo_orig_callable.__code__
    assert len(_debug_get_cache_entry_list(code)) == 1


def test_blocks_after_frozen_layers_and_frozen_bias_apart_convs_share_the_graph():
    """The first block after a frozen stem gets an input without gradients; LDT's freezing routes a
    conv whose weight is frozen and whose bias trains through its own forward (on the CPU). Neither
    compiles a second graph, and the routing is back in place after the call."""
    from basicsr_ldt.ldt.freezing import set_trainable
    eager, compiled, x = _safmn_pair_after_first_call()
    _step(compiled, x)
    before = graphs()
    names = [n for n, _ in compiled.named_parameters()]
    trainable = {n for n in names if not n.startswith('to_feat.') and n != 'feats.0.ccm.ccm.0.weight'}
    for network in (compiled, eager):
        set_trainable(network, trainable)
    routed = compiled.feats[0].ccm.ccm[0]
    assert '_conv_forward' in routed.__dict__
    _assert_close(_step(compiled, x), _step(eager, x))
    assert graphs() == before and '_conv_forward' in routed.__dict__


def test_a_block_with_nothing_to_train_runs_eager():
    """A head-only warm-up freezes the body: a block with no trainable tensor and an input without
    gradients runs its own forward (no graph, nothing recorded for backward)."""
    eager, compiled, x = _safmn_pair_after_first_call()
    for network in (compiled, eager):
        for name, p in network.named_parameters():
            p.requires_grad_(not name.startswith(('to_feat.', 'feats.')))
    before = graphs()
    _assert_close(_step(compiled, x), _step(eager, x))
    assert graphs() == before


def test_ldt_compiles_one_graph_through_profiling_and_the_cross_frozen_pair():
    """A short LDT run on the method's own API: profiling (all trainable) and the cross-frozen
    pair, whose auxiliary is a deep copy of the compiled primary; same weights as eager LDT."""
    from basicsr_ldt.ldt import LDT, preset

    def run(compile_):
        torch.manual_seed(0)
        network = SAFMN(dim=8, n_blocks=2, upscaling_factor=2)
        if compile_:
            compile_blocks(network, BACKEND)
        ldt = LDT(network, preset('ldt', head_warmup_iters=0, profile_iters=2, ema_every=2),
                  lambda params, role: torch.optim.Adam(params, lr=1e-3))
        data = torch.Generator().manual_seed(1)
        for iteration in range(1, 8):
            lq = torch.rand(2, 3, 8, 8, generator=data)
            gt = torch.rand(2, 3, 16, 16, generator=data)
            ldt.update(lambda net: (net(lq) - gt).abs().mean(), iteration)
        return ldt

    before = graphs()
    compiled = run(True)
    # profiling (all trainable) and both cross-frozen branches run the one graph
    assert graphs() == before + 1
    assert len(compiled_blocks(compiled.auxiliary)) == 2
    after = graphs()
    eager = run(False)
    assert graphs() == after
    _assert_close(compiled.composite_state_dict(), eager.composite_state_dict())


# ---------------------------------------------------------------------------------------------- drop path
def test_traced_drop_path_drops_whole_samples_at_its_rate():
    torch.manual_seed(0)
    drop = TracedDropPath(0.3).train()
    x = torch.full((20000, 2, 3), 2.0)
    y = drop(x)
    kept = (y != 0).flatten(1)
    assert bool((kept.all(1) | (~kept).all(1)).all())                  # per sample, all or nothing
    assert abs(float((~kept.all(1)).float().mean()) - 0.3) < 0.015      # dropped at the rate
    assert torch.equal(y[kept.all(1)], torch.full_like(y[kept.all(1)], 2.0 / 0.7))   # kept scaled by 1/keep
    assert torch.equal(TracedDropPath(0.3, scale_by_keep=False).train()(x).unique(), torch.tensor([0., 2.]))
    assert drop.eval()(x) is x and TracedDropPath(0.).train()(x) is x


def test_blocks_with_different_drop_rates_share_one_graph():
    """timm's DropPath compiles once per rate (MambaIR gives each of its blocks its own rate);
    TracedDropPath once for all non-zero rates (the rate is a buffer, a graph input: torch 2.11 on an
    H200 guarded on a float attribute read in the forward and compiled per rate)."""
    net = MambaIR(img_size=4, embed_dim=30, depths=(3,), d_state=2, mlp_ratio=1., upscale=2,
                  upsampler='pixelshuffledirect', scan_backend='torch', drop_path_rate=0.2)
    compile_blocks(net, 'eager')
    assert all(type(b.drop_path) is TracedDropPath for b in compiled_blocks(net))
    assert len({b.drop_path.drop_prob for b in compiled_blocks(net)}) == 3
    rates = (0.1, 0.2, 0.3, 0.4)
    for kind, expected in ((DropPath, len(rates)), (TracedDropPath, 1)):
        torch._dynamo.reset()
        traced = torch.compile(lambda module, x: module(x), backend='eager')
        before = graphs()
        for rate in rates:
            traced(kind(rate).train(), torch.rand(2, 4))
        assert graphs() == before + expected, kind


# ---------------------------------------------------------------------------------------------- models
def _built_model(tmp_path, data, **train):
    from basicsr.models import build_model
    opt = train_options(data, 'built', network_g=dict(SAFMN_NET))
    opt['train'].update(train)
    opt['path'].update(models=str(tmp_path / 'models'), training_states=str(tmp_path / 'states'))
    opt.update(is_train=True, dist=False, rank=0, world_size=1)
    with basicsr_log() as lines:
        model = build_model(opt)
    return model, [line for line in lines if line.startswith('torch.compile:')]


def test_auto_on_a_cpu_changes_nothing(tmp_path, demo_data):
    model, lines = _built_model(tmp_path, demo_data)
    assert lines == ['torch.compile: off (train.compile: auto compiles on CUDA only, this run is on cpu)']
    assert compiled_blocks(model.net_g) == [] and 'forward' not in model.net_g.feats[0].__dict__


def test_true_marks_net_g_and_logs_it(tmp_path, demo_data):
    model, lines = _built_model(tmp_path, demo_data, compile=True, compile_backend=BACKEND)
    assert lines == ['torch.compile: on for 2 SAFMN AttBlock blocks, backend aot_eager; training forwards only '
                     '(validation and inference run eager), the first training call of each block eager, then one '
                     'compile per block variant, every frozen pattern in it']
    assert len(compiled_blocks(model.net_g)) == 2


def test_ft_run_with_compile_saves_a_checkpoint_plain_basicsr_loads(project, demo_data):
    opt = train_options(demo_data, 'compiled', total_iter=3, network_g=dict(SAFMN_NET))
    opt['train'].update(compile=True, compile_backend=BACKEND)
    opt['logger']['save_checkpoint_freq'] = 3
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'c.yml', opt))
    exp = project / 'experiments' / 'compiled'
    log = next(exp.glob('train_compiled_*.log')).read_text()
    assert 'torch.compile: on for 2 SAFMN AttBlock blocks, backend aot_eager' in log and 'l_pix' in log
    saved = torch.load(exp / 'models' / 'net_g_3.pth', weights_only=True)['params']
    fresh = SAFMN(dim=8, n_blocks=2, ffn_scale=2.0, upscaling_factor=4)
    assert list(saved) == list(fresh.state_dict())
    fresh.load_state_dict(saved, strict=True)
    assert fresh(torch.rand(1, 3, 8, 8)).shape == (1, 3, 32, 32)


def test_bad_compile_value_stops_the_entry_point_in_one_line(project, demo_data):
    opt = train_options(demo_data, 'bad')
    opt['train']['compile'] = 'sometimes'
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'b.yml', opt), check=False)
    assert result.returncode == 2 and 'Traceback' not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == ("error: train.compile: expected one of 'auto', true, false, "
                                                      "got 'sometimes'")
    assert not (project / 'experiments' / 'bad').exists()


def test_bench_ldt_counts_the_graphs_compiled_in_the_warm_up_and_the_timed_steps(monkeypatch, capsys):
    """What a GPU run reads for compiled LDT's cost: the warm-up time per step kind and the graphs
    compiled. FT compiles its one graph in the warm-up; the dual step runs it (its branches freeze
    different tensors); a recompile in the timed steps would show as a second count."""
    bench = load_script('bench_ldt')
    monkeypatch.setattr(bench, 'COMPILE_BACKEND', BACKEND)
    # with one warm-up step (each block's first call, eager) the compile falls in the first timed step
    for warm, counts in ((2, '1 in them, 0 in the timed steps'), (1, '0 in them, 1 in the timed steps')):
        torch._dynamo.reset()
        bench.main(['--device', 'cpu', '--arch', 'safmn', '--patch', '6', '--batch', '1', '--scale', '2', '--iters', '2',
                    '--warm', str(warm), '--profile-passes', '2', '--mem-iters', '1', '--in-process',
                    '--no-profile-memory', '--compile', 'true'])
        lines = [line for line in capsys.readouterr().out.splitlines() if 'warm-up steps' in line]
        assert len(lines) == 1 and re.fullmatch(rf'{warm} warm-up steps \(a compile falls there\): FT \d+\.\d s, '
                                                rf'dual \d+\.\d s; graphs compiled: {counts}', lines[0]), lines
