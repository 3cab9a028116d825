"""A training step's forward, loss and backward replayed as one CUDA graph (``train.cuda_graph``).

Why: on a GPU, MambaIR's training step waits on the host. In issue 59's measurement the GPU was
busy for 61-70% of an eager step; the rest was Python and the launch of thousands of small
kernels. A CUDA graph records every kernel of the forward, loss and backward once and then
launches them all at once at each step. The kernels are the same, so the results are those of
the eager step (up to the order of float atomics, which already differs between two eager steps).

Outside the graph: the loss check and report (the step's one host sync), the optimizer step
(fused Adam: a few launches), the EMA, and everything LDT does between steps.

What a graph assumes, and how each assumption is kept:

* **The same shapes and tensors.** A replay reads every parameter and buffer at the address it
  recorded, and its inputs from tensors of its own, into which each batch is copied. The key
  (:meth:`StepGraph.key`) holds the batch's shapes and dtypes, the autocast dtype, the training
  mode, and each parameter's and buffer's address and ``requires_grad``. A change in any of them
  (a differently shaped batch, a parameter set anew rather than copied into, a change in which
  tensors train) records again after the eager steps below.
* **No first-call work inside the recording.** After each new key, the first ``eager_steps``
  steps run eager: a compiled block's first training call is eager and its compile falls in the
  next one (``archs/compile.py``). One more eager pass then runs on the graph's own stream, so
  per-stream state (cuBLAS workspaces) exists before the recording. That pass's batch-norm
  statistics are put back. The recording itself runs nothing: the step it was made for is its
  first replay.
* **Gradients.** The backward inside the recording leaves each gradient in memory the graph owns.
  After each replay they are put back in ``.grad``: the optimizer's ``zero_grad(set_to_none=True)``
  drops only the reference.
* **Random draws** (stochastic depth) come from the CUDA generator's graph-safe stream, so each
  replay draws new ones.
* **Autocast's cache of cast weights** is off inside the recording, as torch requires.

**Several graphs, one pool** (:func:`graphs_in_one_pool`: LDT's primary and auxiliary). A graph
keeps its memory pool for as long as it lives; two pools would hold two steps' activations. In one
pool the second graph reuses what the first freed, as the eager dual step does. CUDA's condition for
that: graphs in one pool replay in the order they were recorded, so a new recording of one drops the
recordings after it in the order, and they record again after it (in the same step).

**Several networks side by side in one graph** (``graphs_in_one_pool(side_by_side=True)``: LDT's
branches with ``ldt.overlap_branches`` and no ``ldt.overlap_memory`` bound). One graph holds each
network's forward, loss and backward on the same batch, on CUDA each on a stream of its own, so the
GPU can run one branch's kernels beside the other's; a replay steps them all. Replayed one after the
other, the branches take the sum of their kernel times (1.75x FT's in issue 59's measurement), which
no graph can shorten. The price is memory: the caching allocator does not hand a block one stream
freed to another stream, so the graph holds both branches' activations at once.

If a recording fails, graphs are off for the rest of the run (:attr:`StepGraph.off` says why,
logged once) and the step runs eager. fp16 steps are never recorded: GradScaler's overflow check
and the step it skips happen on the host.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Union

import torch
from torch import nn

from basicsr_ldt.ldt.precision import MixedPrecision, RunningStatistics

#: Eager steps after each new key before the step is recorded.
EAGER_STEPS = 2

TermsOf = Callable[..., Dict[str, torch.Tensor]]
#: Step graphs for named networks run in that order at each step (:func:`graphs_in_one_pool`'s form).
#: Called with the networks and ``side_by_side`` (whether one graph records them all, on streams of their own).
GraphsFactory = Callable[..., Dict[str, 'StepGraph']]
_LOG = logging.getLogger('basicsr')


class BatchTerms:
    """A batch loss given as named terms of ``terms_of(network, *inputs)``: the form a step graph
    can record, since it swaps ``inputs`` for copies of its own. Called on a network it is a plain
    batch loss (the sum of the terms), and ``terms`` then holds that call's terms for the report."""

    def __init__(self, terms_of: TermsOf, *inputs: torch.Tensor) -> None:
        self.terms_of, self.inputs = terms_of, inputs
        self.terms: Dict[str, torch.Tensor] = {}

    def __call__(self, network: nn.Module) -> torch.Tensor:
        self.terms = self.terms_of(network, *self.inputs)
        return sum(self.terms.values())


class Recorder(Protocol):
    """Records a function's kernels once, then replays them into the same output tensors."""

    def record(self, step: Callable[[], List[torch.Tensor]]) -> List[torch.Tensor]: ...

    def replay(self) -> None: ...


class CudaGraphRecorder:
    """``torch.cuda.CUDAGraph`` recorded on a stream of its own (on the network's device), after one
    eager pass there."""

    def __init__(self, network: nn.Module, pool: Optional[tuple] = None) -> None:
        self.stream = torch.cuda.Stream(next(network.parameters()).device)
        self.pool = pool   # None: a pool of the graph's own
        self.graph: Optional[torch.cuda.CUDAGraph] = None

    def record(self, step: Callable[[], List[torch.Tensor]]) -> List[torch.Tensor]:
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            step()
        torch.cuda.current_stream().wait_stream(self.stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a data loader's pin-memory thread may allocate while this thread records
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode='thread_local'):
            outputs = step()
        self.graph = graph
        return outputs

    def replay(self) -> None:
        self.graph.replay()

    def held_bytes(self) -> int:
        """Device memory the graph's private pool holds (its activations, gradients and outputs):
        reserved for the recording as long as it lives."""
        pool = tuple(self.graph.pool())
        try:   # one pool's segments, without traces (torch 2.11 can); each segment names its pool too
            segments = torch.cuda.memory_snapshot(mempool_id=pool, include_traces=False)
        except TypeError:
            segments = torch.cuda.memory_snapshot()
        return sum(segment['total_size'] for segment in segments
                   if tuple(segment.get('segment_pool_id', pool)) == pool)


@dataclass
class Recording:
    """A recorded step: its recorder, its own input tensors, and where each replay leaves each network's
    loss, the last network's terms and the gradients of the ``trained`` tensors."""
    recorder: Recorder
    inputs: List[torch.Tensor]
    losses: List[torch.Tensor]
    terms: Dict[str, torch.Tensor]
    trained: List[nn.Parameter]
    grads: List[torch.Tensor]


class StepGraph:
    """The forward, loss and backward of one network, or of several on the same batch side by side,
    recorded once per key and replayed at each step.

    ``recorder(network)`` builds the recorder of a new recording (default: a CUDA graph; the CPU
    tests pass one that reruns the step into the recorded tensors); several networks reach it as one
    ``nn.ModuleList``."""

    def __init__(self, network: Union[nn.Module, Sequence[nn.Module]],
                 recorder: Optional[Callable[[nn.Module], Recorder]] = None, eager_steps: int = EAGER_STEPS) -> None:
        self.networks: List[nn.Module] = [network] if isinstance(network, nn.Module) else list(network)
        #: The network, or the networks in one ModuleList: what the recorder is given.
        self.network = self.networks[0] if len(self.networks) == 1 else nn.ModuleList(self.networks)
        self.eager_steps = eager_steps
        self.recordings = 0
        #: Why graphs are off for the rest of the run (None while they are on).
        self.off: Optional[str] = None
        self._new_recorder = recorder or CudaGraphRecorder
        self._key: Optional[tuple] = None   # a new key (the first step's too) releases and counts eager steps
        self._eager_left = eager_steps
        self._recording: Optional[Recording] = None
        self._streams: Optional[List['torch.cuda.Stream']] = None
        #: Graphs recorded into the same pool after this one (:func:`graphs_in_one_pool`).
        self.later: List['StepGraph'] = []

    def key(self, batch: BatchTerms, precision: MixedPrecision) -> tuple:
        """What a recording depends on; a step with another key cannot replay it."""
        net = self.network
        return (tuple((t.shape, t.dtype, t.device) for t in batch.inputs), precision.dtype,
                tuple(network.training for network in self.networks),
                tuple((p.data_ptr(), p.requires_grad) for p in net.parameters()),
                tuple(b.data_ptr() for b in net.buffers()))

    def run(self, batch: BatchTerms, precision: MixedPrecision) -> Optional[List[torch.Tensor]]:
        """The step on ``batch``, replayed (recorded first when the key is new and its eager steps
        are done): gradients in ``.grad``, ``batch.terms`` set (the last network's); returns each
        network's loss. None: this step is to run eager (the caller runs it)."""
        if self.off is not None or precision.dtype is torch.float16:
            return None
        key = self.key(batch, precision)
        if key != self._key:
            self.release()
            self._key, self._eager_left = key, self.eager_steps
        if self._eager_left > 0:
            self._eager_left -= 1
            return None
        if self._recording is None:
            self._recording = self._record(batch, precision)
            if self._recording is None:
                return None
        recording = self._recording
        for mine, given in zip(recording.inputs, batch.inputs):
            mine.copy_(given)
        recording.recorder.replay()
        for parameter, grad in zip(recording.trained, recording.grads):
            parameter.grad = grad
        # copies: the next replay overwrites the recorded terms, and the report may read them later
        batch.terms = {name: value.detach().clone() for name, value in recording.terms.items()}
        return recording.losses

    def held_bytes(self) -> Optional[int]:
        """Memory the recording holds (None without one, or where its recorder cannot tell)."""
        held = getattr(self._recording and self._recording.recorder, 'held_bytes', None)
        return None if held is None else held()

    def release(self) -> None:
        """Drop the recording (its memory goes once nothing holds its tensors)."""
        self._recording = None

    def _record(self, batch: BatchTerms, precision: MixedPrecision) -> Optional[Recording]:
        inputs = [t.detach().clone() for t in batch.inputs]
        params = [[p for p in network.parameters() if p.requires_grad] for network in self.networks]
        names: List[List[str]] = [[] for _ in self.networks]

        def step_of(index: int) -> Callable[[], List[torch.Tensor]]:
            network, trained = self.networks[index], params[index]

            def step() -> List[torch.Tensor]:
                for p in trained:
                    p.grad = None
                with precision.autocast(cache=False):
                    terms = batch.terms_of(network, *inputs)
                    loss = sum(terms.values())
                loss.backward()
                names[index] = list(terms)
                return [loss, *terms.values(), *(p.grad for p in trained if p.grad is not None)]
            return step

        steps = [step_of(index) for index in range(len(self.networks))]
        sizes: List[int] = []

        def step() -> List[torch.Tensor]:
            outputs = side_by_side(steps, self._side_streams())
            sizes[:] = [len(made) for made in outputs]
            return [tensor for made in outputs for tensor in made]

        running = RunningStatistics(self.network)
        try:
            outputs = (recorder := self._new_recorder(self.network)).record(step)
        except Exception as err:   # whatever failed, the run goes on eager
            for p in (p for trained in params for p in trained):
                p.grad = None
            running.restore()
            self.off = f'recording the step failed ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ""})'
            _LOG.warning(f'CUDA graph off for the rest of the run: {self.off}; the steps run eager')
            return None
        running.restore()   # the eager pass before the recording updated them; the replay does it again
        self.recordings += 1
        for graph in self.later:   # recorded before this one: they would overwrite what it now uses
            graph.release()
        losses, grads, terms, start = [], [], {}, 0
        for size, named in zip(sizes, names):   # each network's [loss, *terms, *grads]
            made = outputs[start:start + size]
            losses.append(made[0])
            terms = dict(zip(named, made[1:]))   # the last network's are kept
            grads += made[1 + len(named):]
            start += size
        recording = Recording(recorder, inputs, losses, terms,
                              trained=[p for trained in params for p in trained if p.grad is not None], grads=grads)
        held = getattr(recorder, 'held_bytes', None)
        together = '' if len(self.networks) == 1 else f'{len(self.networks)} networks side by side, '
        _LOG.info(f'CUDA graph: step recorded ({together}{len(recording.trained)} tensors train'
                  + ('' if held is None else f', the graph holds {held() / 2 ** 20:.0f} MiB') + ')')
        return recording

    def _side_streams(self) -> Optional[List['torch.cuda.Stream']]:
        """A stream per network (made once) where several are on a CUDA device; else None."""
        device = next(self.network.parameters()).device
        if len(self.networks) == 1 or device.type != 'cuda':
            return None
        if self._streams is None:
            self._streams = [torch.cuda.Stream(device) for _ in self.networks]
        return self._streams


def side_by_side(steps: Sequence[Callable[[], List[torch.Tensor]]],
                 streams: Optional[Sequence['torch.cuda.Stream']]) -> List[List[torch.Tensor]]:
    """What each step returns. With ``streams``, each step runs on its own, forked from the current stream
    and joined back into it: the GPU may then run their kernels together, and recorded they are one
    graph with a branch per stream. Without, in order."""
    if streams is None:
        return [step() for step in steps]
    current = torch.cuda.current_stream(streams[0].device)
    outputs = []
    for step, stream in zip(steps, streams):
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            outputs.append(step())
    for stream in streams:
        current.wait_stream(stream)
    return outputs


def graphs_in_one_pool(networks: Dict[str, nn.Module], recorder: Optional[Callable[[nn.Module], Recorder]] = None,
                       eager_steps: int = EAGER_STEPS, side_by_side: bool = False) -> Dict[str, StepGraph]:
    """A :class:`StepGraph` per network, to be run in the dict's order at every step, recorded into one
    memory pool (why and on what condition: this module's docstring). ``recorder`` as for StepGraph;
    the default is CUDA graphs sharing a pool. ``side_by_side``: one StepGraph of all the networks
    instead, under each of their names (its one replay steps them all)."""
    if side_by_side:
        graph = StepGraph(list(networks.values()), recorder, eager_steps)
        return {name: graph for name in networks}
    if recorder is None:
        pool: List[tuple] = []

        def recorder(network: nn.Module) -> Recorder:
            if not pool:   # made at the first recording: building the graphs needs no GPU
                pool.append(torch.cuda.graph_pool_handle())
            return CudaGraphRecorder(network, pool[0])
    graphs = {name: StepGraph(network, recorder, eager_steps) for name, network in networks.items()}
    order = list(graphs.values())
    for position, graph in enumerate(order):
        graph.later = order[position + 1:]
    return graphs
