"""``torch.compile`` of a network's repeated blocks, for training forwards only.

What is compiled, and why so:

* **Blocks, not the network.** MambaIR's ``VSSBlock``, HAT's ``HAB`` and ``OCAB``, SAFMN's
  ``AttBlock`` (:data:`BLOCK_CLASSES`). The elementwise chains worth fusing (LayerNorm, SiLU
  gating, skip scales, residuals, channel-attention pooling and gating) all sit inside one block,
  a block's graph is small, and every instance of a class runs the same code, so one compile
  serves all blocks whose configuration agrees. A compiled network would be one large graph,
  compiled again for each change anywhere in it.
* **Nothing about the modules changes that a checkpoint or a copy sees.** A block gets an
  instance attribute ``forward`` (a dispatcher bound to it) and two plain attributes; no wrapper
  module, so ``state_dict`` keys stay those of plain BasicSR (no ``_orig_mod.``), and
  ``copy.deepcopy`` (LDT's auxiliary branch, its composite network) rebinds the dispatcher to the
  copy.
* **Training forwards only.** The dispatcher runs the compiled code when the block is in training
  mode with gradients enabled, and the block's own ``forward`` otherwise: validation, ``test.py``
  and inference are eager, so no image size of theirs compiles anything.
* **The first training call of each block is eager.** One-time Python work on a first call
  (MambaIR's scan dispatch tries the Triton kernel and logs the kernel it runs) then happens
  outside the graph; traced, it breaks the graph and its changed state forces a second compile.
* **One graph for every frozen pattern.** ``requires_grad`` of every parameter is part of a
  compiled graph (its backward computes exactly those gradients), and LDT freezes different tensors
  in every block and branch: classic MambaIR's 36 blocks in two branches would be up to 72 graphs,
  each compiled at its first call (measured on the CPU, SAFMN's block: the first graph 19.8 s, each
  further pattern 2.3-3.4 s; a GPU pays more per graph, and twice for the drop-path rates). So a
  compiled call hands its frozen tensors to the graph as leaves that require gradients and share
  their storage: every block, branch, phase and method (FT, profiling, LDT's pair, LDT-S,
  CorGrad) runs the one graph FT compiles, and the gradients computed for frozen tensors land on
  those throwaway leaves and are freed with the graph. The price is their weight gradients, which
  an eager frozen step skips; the parameters themselves, their ``requires_grad`` and ``.grad``
  are untouched, so optimizers, the EMA exchange and checkpoints see no difference.
* **Stochastic depth stays one graph.** timm's ``DropPath`` passes its probability to
  ``bernoulli_``, which makes dynamo compile once per distinct probability (every block of a
  network has its own); :class:`TracedDropPath` draws the same per-sample mask as ``rand < keep``,
  which dynamo can keep symbolic: the first rate it meets compiles as a constant, the next one once
  more with the rate symbolic, and that graph serves every other rate. Same distribution, a
  different random stream than eager timm.

The selective scan inside a compiled ``VSSBlock``: the Triton kernels (SS2D's four-way call) are
``torch.library`` custom operators with a fake and an autograd formula registered
(``archs/scan/triton_function.py``): one opaque node of the block's graph, whose first-call check
runs in the block's eager first call. With the torch kernel dynamo traces the scan's autograd
function into the graph with its position loops unrolled: correct and one graph, but slow to
compile and a large graph. mamba-ssm's kernel (``cuda``) is an unregistered autograd function
around a C++ extension: not checked here (no GPU); expected to split the graph at the scan. A
kernel registered like the Triton one stays inside the graph; nothing here needs to change for it.
"""
import threading
import types
from typing import Callable, Dict, FrozenSet, Iterator, List, Tuple

import torch
from timm.layers import DropPath
from torch import nn

from archs.hat_arch import HAB, OCAB
from archs.mambair_arch import VSSBlock
from archs.safmn_arch import AttBlock
from basicsr_ldt.ldt.freezing import ROUTED_METHOD

#: The repeated blocks compiled in each architecture (``network_g.type``).
BLOCK_CLASSES: Dict[str, Tuple[type, ...]] = {'MambaIR': (VSSBlock,), 'HAT': (HAB, OCAB), 'SAFMN': (AttBlock,)}

#: Architectures whose blocks ``train.compile: auto`` compiles on a CUDA device: those whose FT
#: training step a GPU run measured faster compiled than eager (``scripts/bench_ldt.py
#: --compare-upstream``, 'ours compiled' against 'ours eager') with a cold compile within 60 s.
#: H200, 2026-11-28 (docs/results.md), step / upstream's compiled against eager: MambaIR 0.762 against
#: 0.858, compile in 41.7 s; SAFMN 0.728 against 0.923, 29.6 s. HAT is left out: 0.817 against 0.924,
#: but 79.9 s to compile.
COMPILE_BY_DEFAULT: FrozenSet[str] = frozenset({'MambaIR', 'SAFMN'})

_BACKEND = '_compile_backend'   # instance attribute: the backend its training forwards compile with
_WARM = '_compile_warm'         # instance attribute: whether its first (eager) training call has run
_compiled: Dict[Tuple[type, str], Callable] = {}
_lock = threading.Lock()        # LDT may run the auxiliary branch's forward on a helper thread


class TracedDropPath(DropPath):
    """timm's ``DropPath`` (per-sample stochastic depth, kept samples scaled by 1 / keep) with the
    keep probability held in a 0-d buffer and the mask drawn as ``rand < keep``, so that blocks
    with different rates share one compiled graph. dynamo guards on the Python floats a forward
    reads: timm's ``drop_prob == 0.`` and ``bernoulli_(keep)`` made torch 2.11 compile once per
    rate (on an H200, classic MambaIR's 36 blocks hit the recompile limit); a buffer is a graph
    input instead, and only whether the rate is zero (``active``) is a constant. Not persistent:
    checkpoints are unchanged."""

    def __init__(self, drop_prob: float = 0., scale_by_keep: bool = True):
        super().__init__(drop_prob, scale_by_keep)
        self.active = drop_prob > 0.
        self.register_buffer('keep', torch.tensor(1. - drop_prob), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.active or not self.training:
            return x
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        keep = self.keep.to(x.dtype)
        mask = (torch.rand(shape, device=x.device) < keep).to(x.dtype)
        if self.scale_by_keep:
            mask = mask / keep
        return x * mask


def block_classes(network: nn.Module) -> Tuple[type, ...]:
    """The block classes :func:`compile_blocks` compiles in ``network`` (by its class name)."""
    return BLOCK_CLASSES.get(type(network).__name__, ())


def compiled_blocks(network: nn.Module) -> List[nn.Module]:
    """The blocks of ``network`` that :func:`compile_blocks` has marked."""
    return [m for m in network.modules() if _BACKEND in m.__dict__]


def compile_blocks(network: nn.Module, backend: str = 'inductor') -> int:
    """Mark every repeated block of ``network`` to run its training forwards compiled with
    ``backend``; returns how many blocks were marked (0 for a network this module has no blocks
    for). Marking again changes the backend. Compiling itself happens at the first compiled call."""
    count = 0
    for block in _blocks(network):
        _trace_drop_paths(block)
        block.__dict__[_BACKEND] = backend
        block.__dict__.setdefault(_WARM, False)
        block.forward = types.MethodType(_dispatch, block)
        count += 1
    return count


def _blocks(network: nn.Module) -> Iterator[nn.Module]:
    classes = block_classes(network)
    if not classes:
        return
    # Activation checkpointing recomputes a block under saved-tensor hooks, which compiled graphs
    # do not support: blocks inside a container with use_checkpoint stay eager.
    checkpointed = {id(m) for c in network.modules() if getattr(c, 'use_checkpoint', False) for m in c.modules()}
    for module in network.modules():
        if type(module) in classes and id(module) not in checkpointed:
            yield module


def _trace_drop_paths(block: nn.Module) -> None:
    for parent in list(block.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is DropPath:
                traced = TracedDropPath(child.drop_prob, child.scale_by_keep)
                traced.train(child.training)
                device = next(block.parameters()).device
                setattr(parent, name, traced.to(device))


def _dispatch(self: nn.Module, *args, **kwargs):
    """A marked block's ``forward``: compiled in training with gradients, its own otherwise."""
    forward = type(self).forward
    if not (self.training and torch.is_grad_enabled()) or torch.compiler.is_compiling():
        return forward(self, *args, **kwargs)
    if not self.__dict__.get(_WARM, True):
        self.__dict__[_WARM] = True
        return forward(self, *args, **kwargs)
    features = args[0] if args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point() else None
    frozen, trains = _frozen_parameters(self)
    if features is None or not features.requires_grad:
        if not trains:   # nothing in it needs a gradient (the frozen body of a head-only warm-up)
            return forward(self, *args, **kwargs)
        if features is not None:   # the first trained block after frozen layers: its input becomes
            args = (features.detach().requires_grad_(),) + args[1:]   # a leaf, as for the rest
    compiled = _compiled_forward(type(self), self.__dict__[_BACKEND])
    put_back = _as_all_trainable(frozen)
    try:
        return compiled(self, *args, **kwargs)
    finally:
        for mapping, key, value in put_back:
            mapping[key] = value


_Frozen = List[Tuple[nn.Module, str, nn.Parameter]]


def _frozen_parameters(block: nn.Module) -> Tuple[_Frozen, bool]:
    """``(module, name, parameter)`` of each frozen parameter of ``block``, and whether any trains."""
    frozen, trains = [], False
    for module in block.modules():
        for name, parameter in module._parameters.items():
            if parameter is not None:
                if parameter.requires_grad:
                    trains = True
                else:
                    frozen.append((module, name, parameter))
    return frozen, trains


def _as_all_trainable(frozen: _Frozen) -> List[Tuple[dict, str, object]]:
    """Make a block look all-trainable to the compiled graph for one call: each ``frozen`` parameter
    is replaced by a leaf that requires gradients and shares its storage, and freezing's
    per-instance overrides are set aside. Returns ``(mapping, key, value)`` to put back."""
    put_back = []
    for module, name, parameter in frozen:
        module._parameters[name] = nn.Parameter(parameter.detach(), requires_grad=True)
        put_back.append((module._parameters, name, parameter))
        # freezing's split conv forward (only where a weight is frozen): pointless in this graph, and
        # dynamo would guard on its presence in each instance and compile again wherever it differs
        override = module.__dict__.pop(ROUTED_METHOD, None)
        if override is not None:
            put_back.append((module.__dict__, ROUTED_METHOD, override))
    return put_back


def _compiled_forward(cls: type, backend: str) -> Callable:
    """The compiled ``cls.forward`` for one backend: a copy of the function with its own code
    object, because dynamo keeps one cache (and one recompile limit) per code object."""
    key = (cls, backend)
    compiled = _compiled.get(key)
    if compiled is None:
        with _lock:
            compiled = _compiled.get(key)
            if compiled is None:
                original = cls.forward
                index = sum(1 for k in _compiled if k[0] is cls)
                name = f'{original.__name__}_{index}'
                qualname = f'{cls.__qualname__}.{name}'
                names = {'co_name': name, 'co_qualname': qualname} if hasattr(original.__code__, 'co_qualname') \
                    else {'co_name': name}
                clone = types.FunctionType(original.__code__.replace(**names), original.__globals__, name,
                                           original.__defaults__, original.__closure__)
                clone.__kwdefaults__, clone.__qualname__ = original.__kwdefaults__, qualname
                compiled = _compiled[key] = torch.compile(clone, backend=backend)
    return compiled
