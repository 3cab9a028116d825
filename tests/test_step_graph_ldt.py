"""LDT's dual step replayed as CUDA graphs (``train.cuda_graph`` on LDTSRModel): one graph per branch,
both in one memory pool, replayed in the order they were recorded; or, where the branches overlap
without a memory bound, both side by side in one graph, a CUDA stream each.

Recorded here with :class:`conftest.RerunRecorder` (a CPU has no CUDA graphs; test_step_graph.py says
what it stands in for); the real recording is checked on a GPU by ``scripts/bench_ldt.py``.
"""
import pytest
import torch
from torch import nn

from conftest import RerunRecorder, basicsr_log
from test_ldt_model import ldt_options

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.ldt import LDT, LDTConfig
from basicsr_ldt.ldt.step_graph import EAGER_STEPS, BatchTerms, graphs_in_one_pool


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 3, padding=1))


def _terms(network, lq, gt):
    return {'l_pix': (network(lq) - gt).abs().mean()}


def _batch(iteration, size=6):
    g = torch.Generator().manual_seed(iteration)
    return BatchTerms(_terms, torch.randn(2, 2, size, size, generator=g), torch.randn(2, 2, size, size, generator=g))


def _factory(params, role):
    return torch.optim.Adam(params, lr=1e-2)


CFG = dict(head_warmup_iters=2, head_patterns=('5',), profile_iters=2, ratio_u=0.5, ema_every=2)


class Counted(RerunRecorder):
    """RerunRecorder that writes each recording and replay, with its network's role, into ``events``
    (networks side by side: their roles joined by '+')."""

    def __init__(self, network, events, roles):
        super().__init__(network)
        self.events = events
        self.role = roles[id(network)] if id(network) in roles else '+'.join(roles[id(net)] for net in network)

    def record(self, step):
        self.events.append(f'record {self.role}')
        return super().record(step)

    def replay(self):
        self.events.append(f'replay {self.role}')
        super().replay()


def _graphs(events=None):
    """A graphs factory for LDT recording with Counted into ``events``."""
    events = [] if events is None else events

    def graphs(networks, side_by_side=False):
        roles = {id(network): role for role, network in networks.items()}
        return graphs_in_one_pool(networks, lambda network: Counted(network, events, roles), side_by_side=side_by_side)
    return graphs


def test_graphed_dual_steps_train_exactly_as_eager_ones():
    """Losses, weights, batch statistics and the composite after warm-up, profiling and dual steps with
    exchanges: the same with both branches replayed as without."""
    eager, graphed = LDT(_net(), LDTConfig(**CFG), _factory), LDT(_net(), LDTConfig(**CFG), _factory,
                                                                  graphs=_graphs(events := []))
    for iteration in range(1, 12):
        assert eager.update(_batch(iteration), iteration) == graphed.update(_batch(iteration), iteration)
    dual = 11 - 4
    assert events == ['record primary', 'replay primary', 'record auxiliary', 'replay auxiliary'] + \
        ['replay primary', 'replay auxiliary'] * (dual - EAGER_STEPS - 1)
    for which in ('primary', 'auxiliary', 'composite'):
        a, b = eager.network(which).state_dict(), graphed.network(which).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), which
    assert graphed.pair.schedule().startswith('branches one after the other, each replayed as a CUDA graph')


def test_side_by_side_dual_steps_train_exactly_as_eager_ones():
    """Overlapped branches without a memory bound: one graph holds both branches, recorded once and
    replayed once per dual step, with the eager step's losses, weights, batch statistics and composite,
    also across a batch whose non-finite primary loss skips the step (both branches left as they were:
    their batch statistics from before the replay)."""
    side = LDT(_net(), LDTConfig(**CFG, overlap_branches=True, overlap_memory=None), _factory,
               graphs=_graphs(events := []))
    eager = LDT(_net(), LDTConfig(**CFG, overlap_branches=False), _factory)
    skipped = []
    for iteration in range(1, 13):
        batch = [_batch(iteration) for _ in range(2)]
        if iteration == 9:   # a replay, two after the recording
            for copy in batch:
                copy.inputs = (copy.inputs[0] * float('nan'), copy.inputs[1])
        assert repr(eager.update(batch[0], iteration)) == repr(side.update(batch[1], iteration))
        skipped.append((eager.last_skipped, side.last_skipped))
    assert skipped[8] == ('primary', 'primary') and all(s == (None, None) for s in skipped[:8] + skipped[9:])
    dual = 12 - 4
    assert events == ['record primary+auxiliary'] + ['replay primary+auxiliary'] * (dual - EAGER_STEPS)
    for which in ('primary', 'auxiliary', 'composite'):
        a, b = eager.network(which).state_dict(), side.network(which).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), which
    assert side.pair.graphs['primary'] is side.pair.graphs['auxiliary']
    assert side.pair.schedule() == ('branches side by side in one CUDA graph after their first steps, a stream each '
                                    '(no memory bound: ldt.overlap_memory is null)')


@pytest.mark.parametrize('overlap, memory, schedule', [
    (True, 1.0, 'each replayed as a CUDA graph after its first steps (one memory pool), as ldt.overlap_memory '
                'bounds their overlap'),
    (False, None, 'each replayed as a CUDA graph after its first steps (one memory pool)'),
    ('auto', None, 'each replayed as a CUDA graph after its first steps (one memory pool)')])   # auto on a CPU
def test_graphs_keep_the_branches_apart_unless_they_overlap_unbounded(overlap, memory, schedule):
    """With graphs the branches run one after the other where they would not overlap, and where a memory
    bound holds their overlap (one graph of both holds both branches' activations); a replay leaves no
    host work for the eager overlap."""
    algo = LDT(_net(), LDTConfig(**CFG, overlap_branches=overlap, overlap_memory=memory), _factory,
               graphs=_graphs())
    for iteration in range(1, 5):   # warm-up and profiling
        algo.update(_batch(iteration), iteration)
    algo.enter(5)
    graphs = algo.pair.graphs
    assert graphs['primary'] is not graphs['auxiliary'] and not algo.pair.overlaps()
    assert algo.pair.schedule() == f'branches one after the other, {schedule}'


def test_side_by_side_forks_each_step_onto_its_stream_and_joins_them(monkeypatch):
    """On CUDA (stand-ins for torch.cuda: a CPU has none) each network's step runs on its own stream after
    what the current stream queued, and the current stream then waits for all of them: recorded, one
    graph with a branch per stream. Without streams (off CUDA, or one network) the steps run in turn."""
    import contextlib
    from basicsr_ldt.ldt.step_graph import StepGraph, side_by_side
    calls, state = [], {'stream': 'current'}

    class Stream:
        def __init__(self, name, device='cuda:1'):
            self.name, self.device = name, device

        def wait_stream(self, other):
            calls.append(f'{self.name} waits for {other.name}')

    @contextlib.contextmanager
    def on_stream(stream):
        before, state['stream'] = state['stream'], stream.name
        yield
        state['stream'] = before

    devices = []
    monkeypatch.setattr(torch.cuda, 'current_stream', lambda device: devices.append(device) or Stream('current'))
    monkeypatch.setattr(torch.cuda, 'stream', on_stream)

    def step(name):
        return lambda: calls.append(f"{name} on {state['stream']}") or [name]

    assert side_by_side([step('P'), step('A')], [Stream('s0'), Stream('s1', 'cuda:9')]) == [['P'], ['A']]
    assert calls == ['s0 waits for current', 'P on s0', 's1 waits for current', 'A on s1',
                     'current waits for s0', 'current waits for s1'] and devices == ['cuda:1']
    calls.clear()
    assert side_by_side([step('P'), step('A')], None) == [['P'], ['A']] and calls == ['P on current', 'A on current']
    assert StepGraph([_net(0), _net(1)])._side_streams() is None and StepGraph(_net())._side_streams() is None   # CPU


def test_a_new_recording_drops_the_recordings_after_it():
    """Graphs in one pool replay in the order they were recorded: when the primary records again (what
    trains changed), the auxiliary's recording is dropped and records again after it in the same step;
    the auxiliary recording again alone leaves the primary's."""
    nets = {'primary': _net(0), 'auxiliary': _net(1)}
    events = []
    roles = {id(network): role for role, network in nets.items()}
    graphs = graphs_in_one_pool(nets, lambda network: Counted(network, events, roles))
    opts = {role: torch.optim.Adam(net.parameters(), lr=1e-2) for role, net in nets.items()}
    from basicsr_ldt.ldt.pair import optimizer_step

    def step(iteration):
        for role in graphs:
            optimizer_step(nets[role], opts[role], _batch(iteration), None, role, graph=graphs[role])

    for iteration in range(EAGER_STEPS + 2):
        step(iteration)
    assert events == ['record primary', 'replay primary', 'record auxiliary', 'replay auxiliary',
                      'replay primary', 'replay auxiliary']
    events.clear()
    nets['primary'][0].weight.requires_grad_(False)
    for iteration in range(EAGER_STEPS + 1):
        step(iteration)
    assert events == ['replay auxiliary'] * EAGER_STEPS + [
        'record primary', 'replay primary', 'record auxiliary', 'replay auxiliary']
    events.clear()
    nets['auxiliary'][0].weight.requires_grad_(False)
    for iteration in range(EAGER_STEPS + 1):
        step(iteration)
    assert events == ['replay primary'] * EAGER_STEPS + ['replay primary', 'record auxiliary', 'replay auxiliary']


def _ldt_model(tmp_path, data, ldt=None, **train):
    from basicsr.models import build_model
    opt = ldt_options(data, 'graph')
    if ldt is not None:
        opt['ldt'] = ldt
    opt['train'].update(train)
    opt['path'].update(models=str(tmp_path / 'models'), training_states=str(tmp_path / 'states'))
    opt.update(is_train=True, dist=False, rank=0, world_size=1)
    torch.manual_seed(0)
    return build_model(opt)


@pytest.mark.parametrize('side_by_side', [False, True])
def test_ldt_model_replays_its_dual_step_as_it_trains_eager(tmp_path, demo_data, side_by_side):
    """LDTSRModel's own step (its batches per phase, losses, log) through the branches' graphs, apart or
    side by side: the same log and composite as eager, and the dual phase says how it runs."""
    with basicsr_log() as lines:
        eager = _ldt_model(tmp_path / 'e', demo_data)
    assert ("CUDA graph: off (train.cuda_graph: auto, and CUDA graphs need a CUDA device, this run is on cpu)"
            in lines)
    ldt = {**ldt_options(demo_data, 'graph')['ldt'], 'overlap_branches': True, 'overlap_memory': None}
    graphed = _ldt_model(tmp_path / 'g', demo_data, ldt if side_by_side else None)
    graphed.ldt.graphs = _graphs(events := [])
    torch.manual_seed(3)
    for it in range(1, 9):
        batch = {'lq': torch.rand(2, 3, 8, 8), 'gt': torch.rand(2, 3, 32, 32)}
        logs = []
        for model in (eager, graphed):
            model.feed_data(batch)
            with basicsr_log() as lines:
                model.optimize_parameters(it)
            logs.append({k: round(float(v), 6) for k, v in model.get_current_log().items()})
        assert logs[0] == logs[1]
        if it == 5:
            assert set(logs[0]) == {'l_primary', 'l_auxiliary'}
            schedule = 'side by side in one CUDA graph' if side_by_side else 'one after the other, each replayed'
            assert any(line.startswith(f'LDT dual step: branches {schedule}') for line in lines)
    recorded = ['record primary+auxiliary'] if side_by_side else ['record primary', 'record auxiliary']
    assert [event for event in events if event.startswith('record')] == recorded
    a, b = eager.composite_network().state_dict(), graphed.composite_network().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ldt_model_records_only_the_dual_step_and_auto_waits_for_a_gpu_run(tmp_path, demo_data, monkeypatch):
    """``true`` on a CUDA device (faked: the decision reads only its type) gives LDT the graphs; ``auto``
    leaves LDT eager until a GPU run has timed its replayed dual step, even for a listed network; an
    LDT mode without the dual step refuses ``true``; on a CPU ``true`` is refused."""
    import types
    import basicsr_ldt.models.cuda_graph as cuda_graph
    with pytest.raises(InputError, match=r'^train\.cuda_graph: true, but CUDA graphs need a CUDA device'):
        _ldt_model(tmp_path / 'cpu', demo_data, cuda_graph=True)
    model = _ldt_model(tmp_path / 'm', demo_data)
    model.device = types.SimpleNamespace(type='cuda')
    model.opt['train']['cuda_graph'] = True
    with basicsr_log() as lines:
        assert model.step_graph_wanted("each branch's step of the dual phase")
    assert lines == ["CUDA graph: the forward, loss and backward of each branch's step of the dual phase replayed "
                     'as one graph after the first steps']
    monkeypatch.setattr(cuda_graph, 'GRAPH_BY_DEFAULT', frozenset({'SAFMN'}))
    model.opt['train']['cuda_graph'] = 'auto'
    with basicsr_log() as lines:
        assert not model.step_graph_wanted("each branch's step of the dual phase")
    assert lines == ["CUDA graph: off (train.cuda_graph: auto, and no GPU run has timed LDT's dual step replayed; "
                     'true records it)']
    import basicsr_ldt.models.guarded_step as guarded_step
    monkeypatch.setattr(guarded_step, 'graph_decision', lambda *args: (True, ''))   # what true on a GPU decides
    assert _ldt_model(tmp_path / 'on', demo_data).ldt.graphs is graphs_in_one_pool
    monkeypatch.undo()
    for ldt, mode in (({'method': 'ft'}, 'single'), (ldt_options(demo_data, 's', method='ldt_s')['ldt'], 'alternating')):
        with pytest.raises(InputError, match=rf"^train\.cuda_graph: true, but ldt\.mode '{mode}' has no dual step"):
            _ldt_model(tmp_path / mode, demo_data, cuda_graph=True, ldt=ldt)   # refused before the device is asked


def test_corgrad_through_an_ldt_file_refuses_true(tmp_path, demo_data):
    """``ldt: {method: corgrad}`` on an LDTSRModel file makes a CorGrad model, whose step is not recorded."""
    from basicsr.models import build_model
    opt = ldt_options(demo_data, 'corgrad')
    opt['ldt'] = {'method': 'corgrad'}
    opt['datasets']['train']['cameras'] = ['Olympus', 'Sony']
    opt['train']['cuda_graph'] = True
    opt['path'].update(models=str(tmp_path / 'models'), training_states=str(tmp_path / 'states'))
    opt.update(is_train=True, dist=False, rank=0, world_size=1)
    with pytest.raises(InputError, match=r"^train\.cuda_graph: true, but CorGrad's step is not recorded"):
        build_model(opt)


def test_the_default_recorders_share_one_pool_made_at_the_first_recording(monkeypatch):
    """On CUDA both branches' graphs record into one pool (CUDA calls faked: a CPU has none); a graph
    recorded alone (FT's) gets a pool of its own."""
    from basicsr_ldt.ldt.step_graph import StepGraph
    handles = []
    monkeypatch.setattr(torch.cuda, 'graph_pool_handle', lambda: handles.append((len(handles), 7)) or handles[-1])
    monkeypatch.setattr(torch.cuda, 'Stream', lambda device=None: device)
    graphs = graphs_in_one_pool({'primary': _net(0), 'auxiliary': _net(1)})
    assert handles == []   # building them needs no GPU
    recorders = [graph._new_recorder(graph.network) for graph in graphs.values()]
    assert handles == [(0, 7)] and [recorder.pool for recorder in recorders] == [(0, 7), (0, 7)]
    alone = StepGraph(_net())
    assert alone._new_recorder(alone.network).pool is None
    assert [graph.eager_steps for graph in graphs_in_one_pool({'primary': _net()}, eager_steps=1).values()] == [1]
    together = graphs_in_one_pool({'primary': _net(0), 'auxiliary': _net(1)}, eager_steps=1, side_by_side=True)
    assert [graph.eager_steps for graph in together.values()] == [1, 1] and together['primary'] is together['auxiliary']
    assert together['primary']._new_recorder(together['primary'].network).pool is None   # one graph: a pool of its own
