"""How the dual step overlaps its two branches on one device (``ldt.overlap_branches``).

The primary's backward runs on a helper thread while the calling thread runs the auxiliary's
forward and backward; on CUDA each branch runs on a stream of its own, so the GPU can run the
primary's backward kernels beside the auxiliary's forward ones. Nothing here changes what is
computed: the two branches share no tensor between exchanges, the forwards (the only random draws)
keep their order, and the caller updates after both backward passes.

The price is memory: the auxiliary's activations are built while the primary's are still being
freed. ``memory_limit`` (``ldt.overlap_memory``) bounds it on CUDA: the auxiliary's forward then
waits, module by module, while the GPU holds more than ``memory_limit`` times what it held when the
primary's backward began (the peak of a step that runs the branches one after the other), until the
primary's backward has freed enough or has finished. Off CUDA there is no allocator to read and no bound.
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Callable, ContextManager, Dict, List, Optional, Protocol, Tuple

import torch
from torch import nn


#: The dual step's two branches, in the order their forwards and updates run.
BRANCHES = ('primary', 'auxiliary')


class Backward(Protocol):
    """What the overlap needs of a branch's step once its forward has run (``pair.PendingStep``)."""

    def backward(self) -> None: ...


class MemoryGate:
    """Forward pre-hooks on every module of a network that hold its forward while ``allocated()`` is
    above the armed limit and :meth:`release` has not been called.

    Inside a compiled block (``train.compile``) the hooks do nothing: traced, their clock, loop and
    allocator reads would break the block's graph at every module (a GPU run compiled MambaIR's
    dual step for over 150 s). The blocks' own hooks run outside their graphs, so the compiled
    auxiliary is held block by block instead of module by module.

    Reading the CUDA allocator's figure builds a dictionary of all its statistics (not timed here; tens
    of microseconds is the expectation), too much before each of a MambaIR's 607 leaf modules (and their containers): after a
    reading within the limit, the next ``READ_EVERY_S`` seconds of modules go unchecked (what they
    allocate in that time is the bound's overshoot)."""

    READ_EVERY_S = 0.002

    def __init__(self, network: nn.Module, allocated: Callable[[], int]) -> None:
        self.allocated = allocated
        self.limit: Optional[int] = None
        self.released = threading.Event()
        self.waits = 0
        self._within_at = -math.inf
        for module in network.modules():
            module.register_forward_pre_hook(self._hold)

    def arm(self, limit: Optional[int]) -> None:
        self.limit = limit
        self._within_at = -math.inf
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def _hold(self, module: nn.Module, args: tuple) -> None:
        if torch.compiler.is_compiling() or self.limit is None or self.released.is_set():
            return
        now = time.perf_counter()
        if now - self._within_at < self.READ_EVERY_S:
            return
        if self.allocated() > self.limit:
            self.waits += 1
            while not self.released.wait(0.0002) and self.allocated() > self.limit:
                pass
        self._within_at = time.perf_counter()


class OverlappedBranches:
    """The helper thread, the branch streams (made once, on the branches' device) and the
    optional memory gate of the auxiliary's forward."""

    def __init__(self, auxiliary: nn.Module) -> None:
        self.auxiliary = auxiliary
        self.device = next(auxiliary.parameters()).device
        self.gate: Optional[MemoryGate] = None
        self._streams: Optional[Dict[str, 'torch.cuda.Stream']] = None

    def allocated_reader(self) -> Optional[Callable[[], int]]:
        """What the caching allocator holds on the branches' GPU; None off CUDA (no bound there)."""
        if self.device.type != 'cuda':
            return None
        device = self.device
        # torch.cuda.memory_allocated flattens and sorts every statistic first: read the one figure
        return lambda: torch.cuda.memory_stats_as_nested_dict(device)['allocated_bytes']['all']['current']

    def run(self, primary_forward: Callable[[], Backward], auxiliary_forward: Callable[[], Backward],
            memory_limit: Optional[float] = None) -> Tuple[Backward, Backward]:
        """P's forward here, P's backward on the helper thread, A's forward and backward here; returns
        both steps once both backward passes are done (on CUDA, ordered before the caller's stream)."""
        main, streams = self.branch_streams(self.device)
        failures: List[BaseException] = []
        with on_stream(streams, 'primary', waits_for=main):
            primary = primary_forward()
        if memory_limit is not None and self.gate is None:
            reader = self.allocated_reader()
            self.gate = None if reader is None else MemoryGate(self.auxiliary, reader)
        if self.gate is not None:
            self.gate.arm(None if memory_limit is None else int(memory_limit * self.gate.allocated()))

        def primary_backward() -> None:
            try:
                with on_stream(streams, 'primary'):
                    primary.backward()
            except BaseException as error:    # re-raised on the calling thread
                failures.append(error)
            finally:
                if self.gate is not None:
                    self.gate.release()

        helper = threading.Thread(target=primary_backward, name='ldt-primary-backward')
        helper.start()
        try:
            with on_stream(streams, 'auxiliary', waits_for=main):
                auxiliary = auxiliary_forward()
                auxiliary.backward()
        finally:
            helper.join()
            if self.gate is not None:
                self.gate.arm(None)
        if failures:
            raise failures[0]
        if streams:
            for stream in streams.values():
                main.wait_stream(stream)
        return primary, auxiliary

    def branch_streams(self, device: torch.device
                       ) -> Tuple[Optional['torch.cuda.Stream'], Optional[Dict[str, 'torch.cuda.Stream']]]:
        """The caller's current stream on the branches' GPU and one stream per branch (made once);
        (None, None) off CUDA."""
        if device.type != 'cuda':
            return None, None
        if self._streams is None:
            self._streams = {branch: torch.cuda.Stream(device) for branch in BRANCHES}
        return torch.cuda.current_stream(device), self._streams


def on_stream(streams: Optional[Dict[str, 'torch.cuda.Stream']], branch: str,
              waits_for: Optional['torch.cuda.Stream'] = None) -> ContextManager:
    """The branch's stream (on its device, for this thread) as the current one, after it waited for
    ``waits_for``; nothing off CUDA."""
    if not streams:
        return contextlib.nullcontext()
    stream = streams[branch]
    if waits_for is not None:
        stream.wait_stream(waits_for)
    context = contextlib.ExitStack()
    context.enter_context(torch.cuda.device(stream.device))
    context.enter_context(torch.cuda.stream(stream))
    return context
