"""A training step replayed as a CUDA graph (basicsr_ldt/ldt/step_graph.py, ``train.cuda_graph``).

A CPU has no CUDA graphs, so these tests record with :class:`RerunRecorder`: the recording runs the
step once (as the CUDA recorder's eager pass does) and keeps its tensors; a replay runs the step
again and copies what it made into those tensors, as a CUDA graph's replay writes into its recorded
memory. Everything around the recorder (eager steps, keys, input copies, gradients put back, batch
statistics, skipped steps, failures, the option) is the code a GPU runs; the real recording is
checked on a GPU by ``scripts/bench_ldt.py --check-graph`` (a step of ``scripts/gpu_check.sh --speed``).
"""
import math

import pytest
import torch
from torch import nn

from conftest import RerunRecorder, basicsr_log
from test_cli import train_options

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.ldt import MixedPrecision
from basicsr_ldt.ldt.pair import optimizer_step
from basicsr_ldt.ldt.step_graph import EAGER_STEPS, BatchTerms, StepGraph
from basicsr_ldt.models.cuda_graph import graph_decision, graph_mode


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Conv2d(4, 2, 3, padding=1), nn.Conv2d(2, 2, 1))


def _terms(network, lq, gt):
    out = network(lq)
    return {'l_pix': (out - gt).abs().mean(), 'l_sq': 0.1 * (out - gt).pow(2).mean()}


def _batches(count, size=5, seed=1):
    torch.manual_seed(seed)
    return [(torch.randn(2, 2, size, size), torch.randn(2, 2, size, size)) for _ in range(count)]


def _graph(net, recorders=None):
    recorders = [] if recorders is None else recorders

    def new(network):
        recorders.append(RerunRecorder(network))
        return recorders[-1]
    return StepGraph(net, recorder=new)


def _train(net, batches, graph=None, precision=None):
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    losses, terms = [], []
    for lq, gt in batches:
        batch = BatchTerms(_terms, lq, gt)
        losses.append(optimizer_step(net, opt, batch, precision, 'finetune', graph=graph))
        terms.append(batch.terms)
    return losses, terms, opt


def _same_state(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_replayed_steps_train_exactly_as_eager_steps():
    """Weights, batch-norm statistics, losses and reported terms after eager and replayed steps are
    equal: the batch reaches the graph's inputs, every gradient reaches .grad, the extra pass before
    the recording leaves no trace."""
    batches = _batches(6)
    eager, graphed = _net(), _net()
    recorders = []
    graph = _graph(graphed, recorders)
    losses_e, terms_e, _ = _train(eager, batches)
    losses_g, terms_g, opt = _train(graphed, batches, graph)
    assert losses_e == losses_g
    assert [{k: v.item() for k, v in t.items()} for t in terms_e] == [{k: v.item() for k, v in t.items()} for t in terms_g]
    assert _same_state(eager, graphed)
    assert graph.recordings == 1 and len(recorders) == 1 and recorders[0].replays == len(batches) - EAGER_STEPS
    assert all(p.grad is None for p in graphed.parameters())   # the optimizer dropped them after the step


def test_networks_side_by_side_replay_each_ones_eager_step():
    """One graph of several networks on the same batch (LDT's branches side by side): each network's loss
    and gradients are those of its own eager step, each of its trainable tensors gets its own gradient,
    the reported terms are the last network's (the dual step's report reads the auxiliary's), and the
    recording says how many networks it holds. (Mutation testing: three networks kill a split of the
    recorded outputs that is right only for the first two.)"""
    nets = [_net(0), _net(1), _net(2)]
    nets[1][0].weight.requires_grad_(False)
    graph = StepGraph(nets, recorder=RerunRecorder)
    lq, gt = _batches(1)[0]
    for _ in range(EAGER_STEPS):
        assert graph.run(BatchTerms(_terms, lq, gt), MixedPrecision()) is None
    batch = BatchTerms(_terms, lq, gt)
    with basicsr_log() as lines:
        losses = graph.run(batch, MixedPrecision())
    assert lines == ['CUDA graph: step recorded (3 networks side by side, 23 tensors train)']
    replayed = {id(p): p.grad.clone() for net in nets for p in net.parameters() if p.grad is not None}
    for net, loss in zip(nets, losses):
        for p in net.parameters():
            p.grad = None
        eager = BatchTerms(_terms, lq, gt)
        assert eager(net).item() == loss.item()
        eager.terms['l_pix'].add(eager.terms['l_sq']).backward()
    assert {k: v.item() for k, v in batch.terms.items()} == {k: v.item() for k, v in eager.terms.items()}
    assert len(replayed) == 8 + 7 + 8 and all(torch.equal(replayed[id(p)], p.grad)
                                              for net in nets for p in net.parameters() if p.grad is not None)


def test_the_recording_steps_several_networks_on_streams_of_their_own(monkeypatch):
    """Several networks on a CUDA device get a stream each, made once on that device, and the recorded step
    hands them to ``side_by_side``; one network, or a CPU, gets none (stand-ins for the device and
    torch.cuda: a CPU has neither)."""
    import types
    import basicsr_ldt.ldt.step_graph as step_graph
    made, handed = [], []
    monkeypatch.setattr(torch.cuda, 'Stream', lambda device: made.append(device) or f'stream {len(made)}')
    on_gpu = types.SimpleNamespace(device=torch.device('cuda', 1))
    graph = StepGraph([_net(0), _net(1)], recorder=RerunRecorder)
    cpu_streams = graph._side_streams()
    graph.network = types.SimpleNamespace(parameters=lambda: iter([on_gpu]))
    assert cpu_streams is None and graph._side_streams() == ['stream 1', 'stream 2'] == graph._side_streams()
    assert made == [torch.device('cuda', 1)] * 2
    alone = StepGraph(_net(), recorder=RerunRecorder)
    alone.network = graph.network
    assert alone._side_streams() is None and len(made) == 2
    monkeypatch.setattr(step_graph, 'side_by_side', lambda steps, streams: handed.append(streams) or [s() for s in steps])
    two = StepGraph([_net(0), _net(1)], recorder=RerunRecorder, eager_steps=0)
    monkeypatch.setattr(two, '_side_streams', lambda: ['s0', 's1'])
    two.run(BatchTerms(_terms, *_batches(1)[0]), MixedPrecision())
    assert handed == [['s0', 's1']] * 2   # the recording, and the stand-in's rerun at the replay


def test_the_first_steps_run_eager_and_a_new_key_records_again():
    net = _net()
    recorders = []
    graph = _graph(net, recorders)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)

    def step(lq, gt):
        optimizer_step(net, opt, BatchTerms(_terms, lq, gt), None, 'finetune', graph=graph)

    small, large = _batches(8), _batches(3, size=7)
    for lq, gt in small[:EAGER_STEPS]:
        step(lq, gt)
    assert graph.recordings == 0
    step(*small[2])
    assert graph.recordings == 1 and recorders[0].replays == 1
    for lq, gt in large:   # another shape: eager twice, then recorded anew
        step(lq, gt)
    assert graph.recordings == 2 and recorders[1].replays == 1 and recorders[0].replays == 1
    net[0].weight.requires_grad_(False)   # what trains changed
    for lq, gt in small[3:6]:
        step(lq, gt)
    assert graph.recordings == 3
    assert net[0].weight.grad is None
    with torch.no_grad():   # copied into: the same tensor, the recording still holds
        net[3].weight.mul_(0.5)
    step(*small[6])
    assert graph.recordings == 3 and recorders[2].replays == 2
    net[3].weight = nn.Parameter(net[3].weight.detach().clone())   # set anew: another address
    for lq, gt in small[:3]:
        step(lq, gt)
    assert graph.recordings == 4


def test_a_replayed_non_finite_loss_skips_the_step():
    net = _net()
    graph = _graph(net)
    batches = _batches(4)
    _train(net, batches[:3], graph)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    lq, gt = batches[3]
    lq = lq.clone()
    lq[0, 0, 0, 0] = float('nan')
    losses, _, _ = _train(net, [(lq, gt)], graph)
    assert math.isnan(losses[0]) and graph.recordings == 1
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())   # batch-norm statistics too
    assert all(p.grad is None for p in net.parameters())


def test_reported_terms_are_not_overwritten_by_the_next_replay():
    net = _net()
    graph = _graph(net)
    _, terms, _ = _train(net, _batches(5), graph)
    assert terms[3]['l_pix'].item() != terms[4]['l_pix'].item()


class _FailingRecorder:
    message = 'operation not permitted when stream is capturing\nmore'

    def __init__(self, network):
        pass

    def record(self, step):
        raise RuntimeError(self.message)

    def replay(self):
        raise AssertionError('never recorded')


def test_a_failed_recording_leaves_the_run_eager():
    batches = _batches(5)
    eager, graphed = _net(), _net()
    graph = StepGraph(graphed, recorder=_FailingRecorder)
    _train(eager, batches)
    with basicsr_log() as lines:
        _train(graphed, batches, graph)
    assert _same_state(eager, graphed)
    assert graph.off == 'recording the step failed (RuntimeError: operation not permitted when stream is capturing)'
    assert [line for line in lines if 'CUDA graph' in line] == [
        f'CUDA graph off for the rest of the run: {graph.off}; the steps run eager']


def test_fp16_steps_and_plain_batch_losses_are_never_recorded():
    net = _net()
    recorders = []
    graph = _graph(net, recorders)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for lq, gt in _batches(4):
        optimizer_step(net, opt, lambda m, lq=lq, gt=gt: sum(_terms(m, lq, gt).values()), None, 'finetune',
                       graph=graph)
    fp16 = MixedPrecision(torch.float16, 'cpu')
    for lq, gt in _batches(4):
        assert graph.run(BatchTerms(_terms, lq, gt), fp16) is None
    assert recorders == [] and graph.recordings == 0


@pytest.mark.parametrize('given, expected', [(None, 'auto'), ('auto', 'auto'), (True, 'true'), (False, 'false')])
def test_cuda_graph_option_values(given, expected):
    assert graph_mode({} if given is None else {'cuda_graph': given}) == expected


@pytest.mark.parametrize('given', ['yes', 1, [], 'on', 'False', 'AUTO'])
def test_cuda_graph_option_refuses_other_values(given):
    with pytest.raises(InputError, match=r"^train\.cuda_graph: expected one of 'auto', true, false, got "):
        graph_mode({'cuda_graph': given})


def test_the_decision_says_why_a_step_is_not_recorded():
    net = _net()
    assert graph_decision('false', net, 'cuda', None, True) == (False, 'train.cuda_graph: false')
    assert graph_decision('true', net, 'cuda', torch.bfloat16, True) == (True, '')
    assert graph_decision('auto', net, 'cpu', None, True) == (
        False, 'train.cuda_graph: auto, and CUDA graphs need a CUDA device, this run is on cpu')
    fp16 = graph_decision('auto', net, 'cuda', torch.float16, True)
    assert fp16 == (False, "train.cuda_graph: auto, and train.amp fp16's loss scaling checks for overflow on the host "
                           'at every step; bf16 or none can be recorded')
    for device, amp, single, why in (('cpu', None, True, 'need a CUDA device, this run is on cpu'),
                                     ('cuda', torch.float16, True, "fp16's loss scaling checks for overflow on the host"),
                                     ('cuda', None, False, 'wrapped for several GPUs')):
        with pytest.raises(InputError, match=rf'^train\.cuda_graph: true, but .*{why}.*; use auto or false$'):
            graph_decision('true', net, device, amp, single)
        assert why in graph_decision('auto', net, device, amp, single)[1]


def _ft_model(tmp_path, weights=None, **train):
    from basicsr.models import build_model
    opt = train_options(tmp_path / 'no_data', 'weights')
    opt['train'].update(train)
    opt['path']['pretrain_network_g'] = weights
    opt['path'].update(models=str(tmp_path / 'models'), training_states=str(tmp_path / 'states'))
    opt.update(is_train=True, dist=False, rank=0, world_size=1)
    torch.manual_seed(0)
    return build_model(opt)


def test_ft_model_replays_its_step_as_it_trains_eager(tmp_path):
    """FTSRModel's own step (losses, L2-SP, log) through a step graph: the same weights and log as eager."""
    from basicsr.archs import build_network
    from test_cli import NETWORK
    torch.manual_seed(1)
    weights = str(tmp_path / 'start.pth')
    torch.save({'params': build_network(dict(NETWORK)).state_dict()}, weights)
    with basicsr_log() as lines:
        eager = _ft_model(tmp_path / 'e', weights, l2_sp_weight=0.01)
    assert eager.step_graph is None
    assert 'CUDA graph: off (train.cuda_graph: auto, and CUDA graphs need a CUDA device, this run is on cpu)' in lines
    graphed = _ft_model(tmp_path / 'g', weights, l2_sp_weight=0.01)
    graphed.step_graph = _graph(graphed.net_g)
    torch.manual_seed(3)
    for it in range(1, 6):
        lq = torch.rand(2, 3, 8, 8)
        batch = {'lq': lq, 'gt': torch.rand(2, 3, 32, 32)}
        logs = []
        for model in (eager, graphed):
            model.feed_data(batch)
            model.optimize_parameters(it)
            logs.append({k: round(float(v), 6) for k, v in model.get_current_log().items()})
        assert logs[0] == logs[1] and set(logs[0]) == {'l_pix', 'l_l2sp'}
    assert graphed.step_graph.recordings == 1
    assert _same_state(eager.net_g, graphed.net_g)


def test_ft_model_refuses_a_graph_it_cannot_record(tmp_path):
    with pytest.raises(InputError, match=r'^train\.cuda_graph: true, but CUDA graphs need a CUDA device'):
        _ft_model(tmp_path, cuda_graph=True)
    with pytest.raises(InputError, match=r"^train\.cuda_graph: expected one of"):
        _ft_model(tmp_path, cuda_graph='sometimes')


def test_other_model_types_refuse_the_key():
    """CorGrad's and BasicSR's own models never record a step: the option file says so before anything
    runs (FTSRModel and LDTSRModel read the key)."""
    import yaml
    from conftest import REPO
    from basicsr_ldt.common.schema import TRAIN, check_options
    opt = yaml.safe_load((REPO / 'options' / 'demo' / 'train_demo_ldt.yml').read_text())
    opt['train']['cuda_graph'] = True
    check_options(opt, TRAIN, 'ldt.yml')
    for model_type in ('CorGradSRModel', 'SRModel'):
        opt['model_type'] = model_type
        if model_type == 'SRModel':
            del opt['ldt']
        with pytest.raises(InputError, match=rf'^ldt\.yml: train\.cuda_graph needs a model type of this project that '
                                             rf'reads it \(FTSRModel, LDTSRModel\); model_type {model_type} ignores it'):
            check_options(opt, TRAIN, 'ldt.yml')


def test_ft_model_records_only_a_network_one_process_trains_alone(tmp_path, monkeypatch):
    """On a CUDA device (faked: the decision reads only its type), ``true`` records the bare network,
    and a network wrapped for several GPUs, or a run of several ranks, is refused; ``auto`` says why."""
    import types
    import basicsr_ldt.models.cuda_graph as cuda_graph
    import basicsr_ldt.models.guarded_step as guarded_step
    model = _ft_model(tmp_path)
    model.device = types.SimpleNamespace(type='cuda')
    model.opt['train']['cuda_graph'] = True
    model.setup_step_graph()
    assert model.step_graph is not None and model.step_graph.network is model.net_g
    monkeypatch.setattr(guarded_step, 'several_ranks', lambda: True)
    with pytest.raises(InputError, match=r'^train\.cuda_graph: true, but the network is wrapped for several GPUs'):
        model.setup_step_graph()
    monkeypatch.setattr(guarded_step, 'several_ranks', lambda: False)
    model.net_g = nn.DataParallel(model.net_g)
    with pytest.raises(InputError, match=r'^train\.cuda_graph: true, but the network is wrapped for several GPUs'):
        model.setup_step_graph()
    monkeypatch.setattr(cuda_graph, 'GRAPH_BY_DEFAULT', frozenset({'MSRResNet'}))
    model.opt['train']['cuda_graph'] = 'auto'
    with basicsr_log() as lines:
        model.setup_step_graph()
    assert model.step_graph is None and lines == [
        'CUDA graph: off (train.cuda_graph: auto, and the network is wrapped for several GPUs (DDP or DataParallel); '
        'one process on one GPU can be recorded)']
    model.net_g = model.net_g.module
    with basicsr_log() as lines:
        model.setup_step_graph()
    assert model.step_graph is not None and lines == [
        'CUDA graph: the forward, loss and backward of each step replayed as one graph after the first steps']


def test_a_recording_says_what_trains_and_what_its_graph_holds():
    class Holding(RerunRecorder):
        def held_bytes(self):
            return 3 * 2 ** 20 + 2 ** 19   # 3.5 MiB: printed as 4

    for recorder, held in ((Holding, ', the graph holds 4 MiB'), (RerunRecorder, '')):
        net = _net()
        net[4].weight.requires_grad_(False)
        graph = StepGraph(net, recorder=recorder)
        with basicsr_log() as lines:
            _train(net, _batches(3), graph)
        assert lines == [f'CUDA graph: step recorded (7 tensors train{held})']   # 8, one frozen
        assert graph.held_bytes() == (3.5 * 2 ** 20 if held else None)


def test_the_recording_runs_without_autocasts_weight_cache():
    """torch requires autocast's cache off inside a CUDA graph recording; eager steps keep it."""
    class Noting(MixedPrecision):
        caches = []

        def autocast(self, cache=True):
            self.caches.append(cache)
            return super().autocast(cache)

    net = _net()
    precision = Noting(torch.bfloat16, 'cpu')
    _train(net, _batches(4), _graph(net), precision)
    # 2 eager steps, then the recording and the stand-in's reruns at the 2 replays
    assert precision.caches == [True, True, False, False, False]


def test_a_failure_without_a_message_is_still_one_line():
    net = _net()

    class Silent(_FailingRecorder):
        message = ''
    graph = StepGraph(net, recorder=Silent)
    _train(net, _batches(3), graph)
    assert graph.off == 'recording the step failed (RuntimeError: )'


def test_auto_records_only_the_architectures_a_gpu_run_measured(monkeypatch):
    import basicsr_ldt.models.cuda_graph as cuda_graph
    net = _net()
    for listed, expected in ((frozenset(), (False, 'train.cuda_graph: auto, and no GPU measurement put Sequential in '
                                                   'basicsr_ldt.models.cuda_graph.GRAPH_BY_DEFAULT (empty)')),
                             (frozenset({'SAFMN', 'HAT'}), (False, 'train.cuda_graph: auto, and no GPU measurement put '
                                                           'Sequential in basicsr_ldt.models.cuda_graph.GRAPH_BY_DEFAULT '
                                                           '(HAT, SAFMN)')),
                             (frozenset({'Sequential'}), (True, ''))):
        monkeypatch.setattr(cuda_graph, 'GRAPH_BY_DEFAULT', listed)
        assert graph_decision('auto', net, 'cuda', torch.bfloat16, True) == expected


def test_the_cuda_recorder_records_after_an_eager_pass_on_its_own_stream(monkeypatch):
    """CudaGraphRecorder's calls, against stand-ins for torch.cuda (the real recording: bench_ldt.py
    --check-graph on a GPU): one eager pass on its stream, ordered after and before the current
    stream's work, then the recording on that stream in thread_local mode; the pool's bytes."""
    import contextlib
    from basicsr_ldt.ldt.step_graph import CudaGraphRecorder
    calls, state = [], {'stream': 'default', 'capturing': False}

    class Stream:
        def __init__(self, device=None, name='side'):
            self.name = name
            if device is not None:
                calls.append(f'a stream on {device}')

        def wait_stream(self, other):
            calls.append(f'{self.name} waits for {other.name}')

    class Graph:
        def pool(self):
            return (7, 1)

        def replay(self):
            calls.append('replay')

    @contextlib.contextmanager
    def on_stream(stream):
        state['stream'] = stream.name
        yield
        state['stream'] = 'default'

    @contextlib.contextmanager
    def recording(graph, pool, stream, capture_error_mode):
        calls.append(f'record {type(graph).__name__} on {stream.name}, {capture_error_mode}, pool {pool}')
        state['capturing'], state['stream'] = True, stream.name
        yield
        state['capturing'], state['stream'] = False, 'default'

    segments = [{'total_size': 3, 'segment_pool_id': (7, 1)}, {'total_size': 5, 'segment_pool_id': (0, 0)},
                {'total_size': 11}]
    per_pool = []

    def snapshot(mempool_id=None, include_traces=True):
        per_pool.append((mempool_id, include_traces))
        return segments

    for name, value in (('Stream', Stream), ('current_stream', lambda: Stream(name='default')), ('stream', on_stream),
                        ('CUDAGraph', Graph), ('graph', recording), ('memory_snapshot', snapshot)):
        monkeypatch.setattr(torch.cuda, name, value)

    def step():
        calls.append(f"step on {state['stream']}{', recorded' if state['capturing'] else ''}")
        return [torch.tensor(len(calls))]

    recorder = CudaGraphRecorder(_net(), (7, 1))   # a pool shared with other graphs (LDT's branches)
    outputs = recorder.record(step)
    recorder.replay()
    assert calls == ['a stream on cpu', 'side waits for default', 'step on side', 'default waits for side',
                     'record Graph on side, thread_local, pool (7, 1)', 'step on side, recorded', 'replay']
    assert outputs[0].item() == 6   # what the recorded call returned (the sixth call)
    assert recorder.held_bytes() == 3 + 11 and per_pool == [((7, 1), False)]   # a segment without a pool id: the pool's

    def old_snapshot(**kwargs):
        if kwargs:
            raise TypeError('memory_snapshot() got an unexpected keyword argument')
        return segments
    monkeypatch.setattr(torch.cuda, 'memory_snapshot', old_snapshot)
    assert recorder.held_bytes() == 3 + 11
