"""Static figures of the Triton selective-scan kernels, compiled for GPUs this machine lacks.

    python scripts/scan_static_report.py                       # sm_90, float32, MambaIR's call
    python scripts/scan_static_report.py --arch 90 80 --dtype fp32 bf16 --combos all
    taskset -c 0 python scripts/scan_static_report.py          # the cold compile time on one core
    python scripts/scan_static_report.py --shape train --sweep 16,4,2,1,4,2,1 16,8,2,1,8,2,1   # launch settings
    python scripts/scan_static_report.py --shape train --mamba-ssm build/mamba_ssm  # beside mamba-ssm

No GPU is needed: each launch is described by :func:`archs.scan.triton_launches.forward_launch` and
:func:`archs.scan.triton_launches.backward_launch` (the functions the autograd function runs), called with
``meta`` tensors of the real shapes and dtypes. Triton's own JIT binder turns those arguments into
the specialisation a real launch gets (its key: signature, constexprs, the attributes of each
argument such as 16-byte alignment, compile options), and ``triton.compile`` with a
``GPUTarget`` runs Triton's passes and its bundled ptxas for sm_80 / sm_90. These are figures of
the compiled code, not timings.

Shapes: MambaIR's training patch, validation tiles and images of several sizes, batch and channel
counts (:data:`SHAPES`). The report binds every shape and checks that each kernel gets **one**
specialisation key for all of them (the kernels take every shape-dependent integer unspecialised),
then compiles each key once, with an empty Triton cache (a temporary directory unless
``--cache-dir`` is given), and prints the wall time of each compile: the cold compile a user's
first call waits for. Per kernel it prints registers per thread; spills (local-memory bytes
ptxas reserved and the STL/LDL instructions in the SASS); shared memory per program; resident
warps per SM (registers, shared memory and the architecture's limits); the pointer arguments whose
first offset is computed in 32 bits (they must only be small per-channel tensors); and, at the
training shape, the bytes the launch moves (each tensor it reads or writes once) against the
bytes the call needs (its inputs, outputs and gradients); the ``cp.async`` copies in the PTX (the
loads a pipelined chunk loop issues ahead); and the warp-instructions one warp issues per pass of
the chunk loop, per state update (the loop found in the control-flow graph of the SASS).
``--mamba-ssm BUILD_DIR`` reads mamba-ssm's kernels from a build of ``scripts/build_mamba_ssm.py``
(``--arch 90`` builds one without a GPU) and prints the same figures for the instance MambaIR's
training call runs, and the Triton / mamba-ssm ratio of instructions per update. ``--sweep``
compiles other launch settings (:data:`archs.scan.triton_launches.LAUNCH_SETTINGS`, the format of
``bench_scan.py --sweep``), ``--launch NAME=VALUE`` changes some of them.

No time estimate: an earlier version of this script modelled each launch's time from such
figures and promised 0.47 ms forward + backward at the training shape for the kernels then in
place; an H100 measured 5.28 ms (11x more; archs/README.md). Static figures cannot price how
loads are spread, latencies or the L2, so ``--estimate`` now only says so.

Triton's interpreter must be off: this script sets ``TRITON_INTERPRET=0`` before importing
triton (run it in its own process).
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

os.environ['TRITON_INTERPRET'] = '0'  # compile, do not interpret (before triton is imported)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

import archs.scan.triton_launches as triton_launches  # noqa: E402

# MambaIR classic SR x4: K = 4 scan directions x d_inner 360 channels, d_state 16, B/C grouped
# per direction ((b, 4, n, L)); D, delta_bias and softplus on, no z.
GROUPS, DSTATE = 4, 16
# name: (batch, channels (4 directions x d_inner), L)
SHAPES = {
    'train': (4, 4 * 360, 48 * 48),        # batch 4, 48x48 LR training patch
    'train-b2': (2, 4 * 360, 64 * 64),     # batch 2, 64x64 patch
    'light': (8, 4 * 120, 64 * 64),        # lightweight MambaIR (d_inner 120), batch 8
    'val-57x86': (1, 4 * 360, 57 * 86),    # a validation image of odd size
    'tile-250': (1, 4 * 360, 250 * 250),   # a validation tile
    'val-1000x700': (1, 4 * 360, 1000 * 700),
}
MEASURED = 'train'  # the shape whose bytes are reported (MambaIR's training call)
DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}
# Architecture limits per SM (CUDA programming guide, compute capabilities 8.0 and 9.0).
ARCHS = {
    80: dict(gpu='A100', sms=108, max_warps=64, max_blocks=32, regs=65536, smem=164 * 1024),
    90: dict(gpu='H100 SXM', sms=132, max_warps=64, max_blocks=32, regs=65536, smem=228 * 1024),
}
SMEM_RESERVED_PER_BLOCK = 1024  # bytes the driver keeps per resident block (sm_80 and later)
REG_ALLOC_UNIT = 256            # registers are allocated per warp in units of 256
SUB_PARTITIONS = 4              # an SM's register file is split over 4 schedulers
ESTIMATE_REMOVED = ('no time estimate: the static model this script had promised 0.47 ms forward + '
                    'backward at the training shape for the kernels then in place, and an H100 '
                    'measured 5.28 ms (11x more; archs/README.md). Static figures cannot price '
                    'load spread, latency or L2, so no seconds are estimated; measure with '
                    'scripts/bench_scan.py --device cuda.')
UNSUPPORTED_TRITON = 77  # exit status when this triton lacks the JIT internals used below


@dataclass(frozen=True)
class Combo:
    """One input combination: the dtype of u, delta, z, B, C, which optional inputs exist, and
    the output's dtype (None: u's)."""
    dtype: str
    z: bool
    bias: bool
    D: bool
    out: Optional[str] = None
    four_way: bool = False   # SS2D's four directions in one launch (u = x, a quarter of the channels)

    @property
    def label(self) -> str:
        flags = [name for name, on in (('z', self.z), ('bias', self.bias), ('D', self.D)) if on]
        into = f' -> {self.out}' if self.out not in (None, self.dtype) else ''
        return f"{self.dtype} {'+'.join(flags) or 'none'}{into}{' four-way' if self.four_way else ''}"

    @property
    def out_dtype(self) -> torch.dtype:
        return DTYPES[self.out or self.dtype]


def combos(which: str, dtypes: Sequence[str]) -> List[Combo]:
    """'mambair': the call MambaIR makes (its four directions in one launch, D and bias, no z; its
    activations in their autocast dtype, a float32 output); 'all': every z/bias/D combination of
    the plain scan, the output in the inputs' dtype."""
    if which == 'mambair':
        return [Combo(dt, False, True, True, 'fp32', four_way=True) for dt in dtypes]
    return [Combo(dt, z, bias, D) for dt in dtypes
            for z in (False, True) for bias in (False, True) for D in (False, True)]


def meta_launches(shape: str, combo: Combo):
    """The forward and backward launches of ``combo`` at this shape, on meta tensors, as MambaIR
    makes them: B and C are views of one projection (b, 4, dt_rank + 2 n, L) split along its
    third axis (read in place, not copied); no last-state gradient (MambaIR never uses it)."""
    batch, dim, length = SHAPES[shape]
    dtype = DTYPES[combo.dtype]

    def meta(*size, dtype=dtype):
        return torch.empty(*size, dtype=dtype, device='meta')
    x_dim = dim // GROUPS if combo.four_way else dim
    u = meta(batch, x_dim, length)
    A = meta(dim, DSTATE, dtype=torch.float32)
    projection = meta(batch, GROUPS, 12 + 2 * DSTATE, length)  # dt_rank 12: embed_dim 180 / 16
    B, C = projection[:, :, 12:12 + DSTATE], projection[:, :, 12 + DSTATE:]
    D = meta(dim, dtype=torch.float32) if combo.D else None
    z = meta(batch, dim, length) if combo.z else None
    bias = meta(dim, dtype=torch.float32) if combo.bias else None
    height = image_height(length) if combo.four_way else None
    fwd = triton_launches.forward_launch(u, meta(batch, dim, length), A, B, C, D, z, bias, True,
                                         out_dtype=combo.out_dtype, height=height)
    bwd = triton_launches.backward_launch(u, meta(batch, dim, length), A, B, C, D, z, bias,
                                          fwd.outputs['states'], meta(batch, x_dim, length, dtype=combo.out_dtype),
                                          None, True, height=height)
    return [fwd.launch, bwd.launch]


def image_height(length: int) -> int:
    """The height of the most nearly square image of ``length`` pixels (57 for 57x86)."""
    return next(h for h in range(math.isqrt(length), 0, -1) if length % h == 0)


def needed_bytes(shape: str, combo: Combo) -> Dict[str, int]:
    """Bytes a forward and a backward call cannot avoid moving: the (b, d, L) and (b, G, n, L)
    inputs, outputs and gradients, each once (per-channel tensors are negligible)."""
    batch, dim, length = SHAPES[shape]
    size = DTYPES[combo.dtype].itemsize
    seq = batch * dim * length * size
    x = seq // GROUPS if combo.four_way else seq   # the four-way launch reads x once for its 4 directions
    bc = batch * GROUPS * DSTATE * length * size
    z = seq if combo.z else 0
    out = x // size * combo.out_dtype.itemsize
    dbc = batch * GROUPS * DSTATE * length * 4   # summed over channels in float32 (so are mamba-ssm's)
    du = x // size * 4 if combo.four_way else x   # the four directions' du summed in float32
    return {'forward': x + seq + 2 * bc + z + out,                        # u, delta, B, C, z -> out
            'backward': x + seq + 2 * bc + z + out + du + seq + 2 * dbc + z}  # + dout -> du, ddelta, dB, dC, dz


def specialisation(launch, arch: int):
    """(key, compile arguments) of ``launch`` for sm_<arch> exactly as ``kernel[grid](...)``
    would get them on that GPU: the JIT's own binder computes the signature, constexprs and
    attributes (Triton 3.x internals: ``create_function_from_signature`` and
    ``JITFunction._pack_args``). Equal keys mean one compiled kernel."""
    target = GPUTarget('cuda', arch, 32)
    backend = make_backend(target)
    fn = launch.kernel
    kwargs = dict(launch.constexprs, num_warps=launch.num_warps, **launch.options,
                  debug=fn.debug or knobs.runtime.debug,
                  instrumentation_mode=knobs.compilation.instrumentation_mode)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, options)
    key = repr((fn.__name__, arch, signature, constexprs, attrs, sorted(options.__dict__.items())))
    return key, (ASTSource(fn, signature, constexprs, attrs), target, options.__dict__)


def _tool(name: str, *args: str) -> str:
    path = getattr(knobs.nvidia, name).path  # the copies bundled with triton
    return subprocess.run([path, *args], check=True, capture_output=True, text=True).stdout


def resources(cubin: bytes) -> Tuple[Dict[str, int], str]:
    """(cuobjdump's resource usage: REG, STACK, SHARED, LOCAL, ...; nvdisasm's SASS text)."""
    with tempfile.NamedTemporaryFile(suffix='.cubin', delete=False) as f:
        f.write(cubin)
    try:
        usage = _tool('cuobjdump', '--dump-resource-usage', f.name)
        sass = _tool('nvdisasm', '-c', f.name)
    finally:
        os.remove(f.name)
    return resource_numbers(re.search(r'REG:.*', usage).group(0)), sass


def resource_numbers(line: str) -> Dict[str, int]:
    """A cuobjdump resource-usage line (``REG:168 STACK:0 SHARED:1024 ...``) as numbers by name."""
    return {k: int(v) for k, v in re.findall(r'(\w+):(\d+)', line)}


_SSA = r'%[\w#.]+'
_TTIR_OP = re.compile(rf'({_SSA}) = tt\.(splat|addptr|broadcast|expand_dims|reshape)\s+({_SSA})'
                      rf'(?:,\s*({_SSA}))?[^:\n]*:\s*([^\n]*?)\s+loc\(')


def narrow_offsets(ttir: str) -> List[str]:
    """Pointer arguments whose first offset is computed in fewer than 64 bits.

    In Triton IR a load of ``ptr + offsets`` is ``tt.addptr`` of the argument (or its splat/
    broadcast) and the offsets; the offsets' integer type is the width the whole offset
    expression was computed in. Only the first ``addptr`` applied to an argument is checked."""
    view_of: Dict[str, str] = {a: a for a in re.findall(r'(%\w+): !tt\.ptr', ttir)}
    widths: Dict[str, set] = {}
    for name, op, src, _offset, types in _TTIR_OP.findall(ttir):
        if src not in view_of:
            continue
        if op == 'addptr':
            width = re.search(r'i(\d+)>?\s*$', types)
            widths.setdefault(view_of[src], set()).add(int(width.group(1)) if width else 0)
        else:  # a splat, broadcast or reshape of the argument: still the argument itself
            view_of[name] = view_of[src]
    return sorted(a.lstrip('%') for a, w in widths.items() if min(w) < 64)


_SASS_INSTRUCTION = re.compile(r'^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;')
_SASS_LABEL = re.compile(r'^\s*(\.L_x_\d+):')
_BRANCH_TARGET = re.compile(r'\bBRA(?:\.[\w.]+)?\s+(0x[0-9a-f]+)')
_ENDS_BLOCK = re.compile(r'\b(BRA|EXIT|RET|BRX|JMX)\b')
_PREDICATED = re.compile(r'@!?U?P[0-6]\b')   # @PT (always true) is not a condition


def sass_instructions(sass: str) -> List[Tuple[int, str]]:
    """(address, instruction) of one function's SASS, from ``nvdisasm -c`` (labels) or ``cuobjdump
    -sass`` (addresses); a branch to a label is rewritten as a branch to the label's address."""
    found, pending, where = [], [], {}
    for line in sass.splitlines():
        label = _SASS_LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        match = _SASS_INSTRUCTION.match(line)
        if match:
            address = int(match.group(1), 16)
            where.update((name, address) for name in pending)
            pending = []
            found.append((address, match.group(2)))
    return [(a, re.sub(r'`?\(?(\.L_x_\d+)\)?', lambda m: hex(where.get(m.group(1), -1)), text))
            for a, text in found]


@dataclass
class Block:
    """A basic block of SASS: its instructions and the blocks control can pass to."""
    instructions: List[str]
    successors: List[int]


def basic_blocks(instructions: List[Tuple[int, str]]) -> Dict[int, Block]:
    """The function's basic blocks by start address: a block starts at the first instruction, at every
    branch target and after every branch or exit; a predicated branch or exit also falls through."""
    targets = {a: int(m.group(1), 16) for a, text in instructions for m in [_BRANCH_TARGET.search(text)] if m}
    addresses = [a for a, _ in instructions]
    starts = {addresses[0]} | (set(targets.values()) & set(addresses))
    starts |= {addresses[i + 1] for i, (_, text) in enumerate(instructions[:-1]) if _ENDS_BLOCK.search(text)}
    blocks: Dict[int, Block] = {}
    current: Optional[int] = None
    for i, (address, text) in enumerate(instructions):
        if address in starts:
            current = address
            blocks[current] = Block([], [])
        blocks[current].instructions.append(text)
        following = addresses[i + 1] if i + 1 < len(addresses) else None
        if following is not None and following not in starts:
            continue
        ends = _ENDS_BLOCK.search(text)
        if ends and ends.group(1) == 'BRA' and address in targets:
            blocks[current].successors.append(targets[address])
        if following is not None and (not ends or _PREDICATED.match(text)):   # falls through
            blocks[current].successors.append(following)
    return blocks


@dataclass
class Loop:
    """A natural loop: its blocks, and those every iteration runs (they dominate each back edge)."""
    body: set
    always: set


def natural_loops(blocks: Dict[int, Block]) -> Dict[int, Loop]:
    """The loops of a control-flow graph by header: for each back edge (a block to one that
    dominates it), the blocks that reach it without passing the header. Dominators by the iterative
    data-flow method over reverse postorder; blocks unreachable from the entry are left out."""
    entry = min(blocks)
    postorder, seen, stack = [], {entry}, [(entry, iter(blocks[entry].successors))]
    while stack:
        node, successors = stack[-1]
        following = next((s for s in successors if s in blocks and s not in seen), None)
        if following is None:
            postorder.append(node)
            stack.pop()
        else:
            seen.add(following)
            stack.append((following, iter(blocks[following].successors)))
    order = postorder[::-1]
    predecessors: Dict[int, List[int]] = {n: [] for n in order}
    for n in order:
        for s in blocks[n].successors:
            if s in predecessors:
                predecessors[s].append(n)
    dominators = {n: set(order) for n in order}
    dominators[entry] = {entry}
    changed = True
    while changed:
        changed = False
        for n in order[1:]:
            new = set.intersection(*(dominators[p] for p in predecessors[n])) | {n}
            if new != dominators[n]:
                dominators[n], changed = new, True
    loops: Dict[int, Loop] = {}
    for latch in order:
        for header in blocks[latch].successors:
            if header not in dominators[latch]:
                continue
            loop = loops.setdefault(header, Loop({header}, set(order)))
            loop.always &= dominators[latch]
            work = [latch]
            while work:
                node = work.pop()
                if node not in loop.body:
                    loop.body.add(node)
                    work.extend(predecessors[node])
    for loop in loops.values():
        loop.always &= loop.body
    return loops


def chunk_loop_instructions(sass: str, inner_repeats: int = 1) -> Tuple[int, int]:
    """Instructions one warp issues per pass of the chunk loop (the largest loop of the SASS):
    (counting every block of the loop, counting only the blocks every pass runs). The loop nested
    in it that computes exponentials (mamba-ssm's loop over states) counts ``inner_repeats`` times.
    Triton's chunk loop has no inner loop; its two figures differ by the blocks behind ``if``."""
    blocks = basic_blocks(sass_instructions(sass))
    loops = natural_loops(blocks)
    if not loops:
        return 0, 0
    size = lambda chosen: sum(len(blocks[b].instructions) for b in chosen)  # noqa: E731
    chunk = max(loops.values(), key=lambda loop: size(loop.body))
    exponentials = lambda loop: sum('MUFU.EX2' in t for b in loop.body for t in blocks[b].instructions)  # noqa: E731
    inner = [loop for loop in loops.values() if loop is not chunk and loop.body < chunk.body and exponentials(loop)]
    if not inner:
        return size(chunk.body), size(chunk.always)
    state = max(inner, key=exponentials)
    return (size(chunk.body - state.body) + inner_repeats * size(state.body),
            size(chunk.always - state.body) + inner_repeats * size(state.always))


def updates_per_chunk(launch) -> int:
    """State updates one program makes per chunk: positions x states x channels of its tiles."""
    c = launch.constexprs
    return c['T'] * c['BLOCK_N'] * c['BLOCK_D']


def occupancy_warps(registers: int, shared: int, warps: int, limits: dict) -> int:
    """Resident warps per SM allowed by registers, shared memory and the per-SM limits."""
    regs_per_warp = math.ceil(registers * 32 / REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    warps_by_regs = SUB_PARTITIONS * ((limits['regs'] // SUB_PARTITIONS) // regs_per_warp)
    blocks = min(limits['max_blocks'], limits['max_warps'] // warps, warps_by_regs // warps,
                 limits['smem'] // (shared + SMEM_RESERVED_PER_BLOCK))
    return blocks * warps


# mamba-ssm 2.3.2.post1's kernel for a sequence length, (threads per block, positions per thread),
# the same for its forward and backward: selective_scan_fwd_cuda and selective_scan_bwd_cuda at the
# end of csrc/selective_scan/selective_scan_{fwd,bwd}_kernel.cuh (the branch without USE_ROCM):
# (longest length, threads, positions); longer sequences get 128 threads x 16 positions.
MAMBA_SSM_TILES = ((128, 32, 4), (256, 32, 8), (512, 32, 16), (1024, 64, 16))
MAMBA_SSM_LONG = (128, 16)
# Its chunk: the host code cuts the sequence into n_chunks = (seqlen + 2048 - 1) / 2048 (csrc/selective_scan/
# selective_scan.cpp, line 307 of 2.3.2.post1) and each pass of a block's chunk loop works on threads x positions
# slots whether or not they are in the sequence (the loads are guarded, the arithmetic is not).
MAMBA_SSM_CHUNK = 2048
# input_t of its kernels' templates, as the C++ compiler mangles it (weight_t is float: real A)
MANGLED_INPUT = {'fp32': 'f', 'bf16': 'N3c108BFloat16E', 'fp16': 'N3c104HalfE'}


def slots_per_position(length: int, pass_slots: int, passes: int) -> float:
    """Slots the chunk loops work on per position of the sequence: 1 when the passes tile it exactly."""
    return passes * pass_slots / length


def mamba_ssm_kernel(kernel: str, length: int, dtype: str) -> Tuple[str, str, int, int]:
    """(object file, mangled traits of the template instance, threads per block, positions per
    thread) of the mamba-ssm kernel MambaIR's call runs: B and C varying, no z, softplus on; even
    length when L is a multiple of a block's positions. Template parameters (kernel traits in the
    same files): forward <kNThreads, kNItems, kNRows = 1, kIsEvenLen, kIsVariableB, kIsVariableC,
    kHasZ, input_t, weight_t>, backward <kNThreads, kNItems, kIsEvenLen, kIsVariableB,
    kIsVariableC, kDeltaSoftplus, kHasZ, input_t, weight_t>."""
    threads, items = next(((t, i) for longest, t, i in MAMBA_SSM_TILES if length <= longest), MAMBA_SSM_LONG)
    even, t = int(length % (threads * items) == 0), MANGLED_INPUT[dtype]
    if kernel == 'forward':
        return (f'selective_scan_fwd_{dtype}.cuda.o',
                f'Selective_Scan_fwd_kernel_traitsILi{threads}ELi{items}ELi1ELb{even}ELb1ELb1ELb0E{t}fEE', threads, items)
    return (f'selective_scan_bwd_{dtype}_real.cuda.o',
            f'Selective_Scan_bwd_kernel_traitsILi{threads}ELi{items}ELb{even}ELb1ELb1ELb1ELb0E{t}fEE', threads, items)


@dataclass
class MambaSsmRow:
    """Static figures of one mamba-ssm kernel built by scripts/build_mamba_ssm.py, at one shape."""
    arch: int
    dtype: str
    kernel: str
    function: str
    threads: int
    positions_per_thread: int
    registers: int
    stack_bytes: int
    occupancy_warps: int         # by registers and the per-SM limits (its shared memory is sized at launch)
    programs: int                # thread blocks: batch x channels
    instructions_per_update: float         # every block of its chunk loop, the state loop 16 times
    instructions_per_update_always: float  # only the blocks every pass runs
    slots_per_position: float    # the passes' slots over the sequence's positions (the last chunk padded)


def mamba_ssm_function(build: Path, arch: int, name: str, traits: str) -> Tuple[str, str, Dict[str, int]]:
    """(mangled name, SASS, resource usage) of the kernel instance ``traits`` in the object ``name``
    of a build, or in its shared library where only that is there: a build carried to the GPU
    machine (scripts/build_mamba_ssm.py --prebuilt) is one ``selective_scan_cuda*.so``."""
    found = sorted(build.rglob(name)) or sorted(build.rglob('selective_scan_cuda*.so'))
    if not found:
        raise RuntimeError(f'--mamba-ssm {build}: no {name} in it (build mamba-ssm with scripts/'
                           f'build_mamba_ssm.py --arch {arch} --build-dir {build})')
    usage = _tool('cuobjdump', '--dump-resource-usage', str(found[0]))
    function = next((f for f in re.findall(r'Function (\S+):', usage) if traits in f), None)
    if function is None:
        raise RuntimeError(f'{found[0]}: no kernel instance {traits} (a mamba-ssm other than 2.3.2.post1?)')
    sass = _tool('cuobjdump', '-sass', '-fun', function, str(found[0]))
    built_for = sorted(set(re.findall(r'arch = sm_(\d+)', sass)))
    if str(arch) not in built_for:
        raise RuntimeError(f'--mamba-ssm {found[0]}: built for sm_{", sm_".join(built_for)}, not sm_{arch}')
    body = re.search(rf'Function : {re.escape(function)}\n(.*?)(?=\n\s*Function : |\Z)', sass, re.S).group(1)
    line = re.search(rf'Function {re.escape(function)}:\s*\n\s*(REG:.*)', usage).group(1)
    return function, body, resource_numbers(line)


def mamba_ssm_rows(build: Path, arch: int, dtypes: Sequence[str], shape: str = MEASURED) -> List[MambaSsmRow]:
    """mamba-ssm's forward and backward at ``shape`` read from a build (any folder holding its
    objects or its shared library, e.g. ``build/mamba_ssm``; :func:`mamba_ssm_function`), in the
    terms of the Triton rows: warp-instructions of the chunk loop per state update. Its chunk loop
    holds a loop over the states (one state, ``positions per thread`` updates per thread, per pass),
    counted ``DSTATE`` times; blocks behind a condition (the block scan's raking warp, one thread's
    writes) are counted in the first figure as if every warp ran them and left out of the second."""
    batch, dim, length = SHAPES[shape]
    rows = []
    for dtype in dtypes:
        for kernel in ('forward', 'backward'):
            name, traits, threads, items = mamba_ssm_kernel(kernel, length, dtype)
            function, sass, resources = mamba_ssm_function(build, arch, name, traits)
            every, always = chunk_loop_instructions(sass, DSTATE)
            updates = 32 * items * DSTATE   # one warp, one pass of the chunk loop
            rows.append(MambaSsmRow(arch, dtype, kernel, function, threads, items, resources['REG'],
                                    resources.get('STACK', 0),
                                    occupancy_warps(resources['REG'], 0, threads // 32, ARCHS[arch]),
                                    batch * dim, round(every / updates, 3), round(always / updates, 3),
                                    slots_per_position(length, threads * items, -(-length // MAMBA_SSM_CHUNK))))
    return rows


MAMBA_SSM_HEADER = ('arch', 'inputs', 'kernel', 'threads x positions', 'regs', 'stack B', 'warps/SM limit',
                    'programs (train)', 'warp-instr/update (all blocks / every pass)')


def mamba_ssm_cells(row: MambaSsmRow) -> Tuple[str, ...]:
    return (f'sm_{row.arch}', row.dtype, f'mamba-ssm {row.kernel}', f'{row.threads} x {row.positions_per_thread}',
            str(row.registers), str(row.stack_bytes), str(row.occupancy_warps), str(row.programs),
            f'{row.instructions_per_update:.3f} / {row.instructions_per_update_always:.3f}')


@dataclass
class Row:
    """One compiled kernel's static figures."""
    arch: int
    combo: str
    kernel: str
    keys: int                   # distinct specialisation keys over all shapes (the goal: 1)
    shapes: List[str]
    compile_seconds: float      # wall time of its cold compile (Triton passes and ptxas)
    registers: int
    spill_bytes: int
    spill_instructions: int
    shared_bytes: int
    warps_per_program: int
    occupancy_warps: int
    programs: int               # at the training shape
    narrow_offsets: List[str]
    moved_bytes: int            # at the training shape: each tensor the launch touches, once
    needed_bytes: int           # at the training shape: inputs, outputs and gradients, once
    fp_fusion: bool
    async_loads: int            # cp.async copies in the PTX: loads the chunk loop pipelines (STAGES > 1)
    instructions_per_update: float  # warp-instructions of one chunk-loop iteration per state update
    settings: str = ''          # the launch settings compiled with (--sweep), as bench_scan.py --sweep writes them


def collect(arches: Sequence[int], cases: Sequence[Combo], shapes: Sequence[str], log=None) -> List[Row]:
    """Every kernel bound at every shape, each distinct key compiled once and analysed."""
    rows = []
    for combo in cases:
        per_shape = {shape: meta_launches(shape, combo) for shape in shapes}
        for index, name in enumerate(('forward', 'backward')):
            launches = {shape: launches[index] for shape, launches in per_shape.items()}
            for arch in arches:
                keys = {}
                for shape, launch in launches.items():
                    key, compile_args = specialisation(launch, arch)
                    keys.setdefault(key, compile_args)
                launch = launches.get(MEASURED, next(iter(launches.values())))
                source, target, options = keys[specialisation(launch, arch)[0]]
                start = time.perf_counter()
                try:
                    kernel = triton.compile(source, target=target, options=options)
                except Exception as err:
                    raise RuntimeError(f'{name} kernel, {combo.label}, sm_{arch}: compile failed: '
                                       f'{err}') from err
                seconds = time.perf_counter() - start
                rows.append(analyse(kernel, launch, arch, combo, name, len(keys), list(launches),
                                    seconds))
                if log:
                    log(rows[-1])
    return rows


def analyse(kernel, launch, arch: int, combo: Combo, name: str, keys: int, shapes: List[str],
            seconds: float) -> Row:
    usage, sass = resources(kernel.asm['cubin'])
    spills = sum(1 for line in sass.splitlines() if re.search(r'\b(STL|LDL)\b', line))
    shared = max(kernel.metadata.shared, usage.get('SHARED', 0))
    limits = ARCHS[arch]
    moved = sum(t.numel() * t.element_size() for t in launch.traffic if t is not None)
    return Row(arch, combo.label, name, keys, shapes, round(seconds, 2), usage['REG'],
               usage.get('LOCAL', 0) + usage.get('STACK', 0), spills, shared, launch.num_warps,
               occupancy_warps(usage['REG'], shared, launch.num_warps, limits),
               math.prod(launch.grid), narrow_offsets(kernel.asm['ttir']), moved,
               needed_bytes(MEASURED, combo)[name],
               launch.options.get('enable_fp_fusion') is True and bool(kernel.metadata.enable_fp_fusion),
               len(re.findall(r'^\s*cp\.async\.c[ag]\b', kernel.asm['ptx'], re.M)),
               round(chunk_loop_instructions(sass)[0] * launch.num_warps / updates_per_chunk(launch), 3))


HEADER = ('arch', 'inputs', 'kernel', 'keys/shapes', 'compile s', 'regs', 'spill B / STL+LDL',
          'smem B', 'warps/prog', 'warps/SM limit', 'programs (train)', 'MB moved / needed (train)',
          '32-bit offsets into', 'async loads', 'warp-instr/update')


def cells(row: Row) -> Tuple[str, ...]:
    return (f'sm_{row.arch}', row.combo, row.kernel, f'{row.keys}/{len(row.shapes)}',
            f'{row.compile_seconds:.1f}', str(row.registers),
            f'{row.spill_bytes} / {row.spill_instructions}', str(row.shared_bytes),
            str(row.warps_per_program), str(row.occupancy_warps), str(row.programs),
            f'{row.moved_bytes / 1e6:.0f} / {row.needed_bytes / 1e6:.0f}',
            ', '.join(row.narrow_offsets) or '-', str(row.async_loads), f'{row.instructions_per_update:.3f}')


def launch_values(pairs: Sequence[str]) -> Dict[str, int]:
    """``['FORWARD_STAGES=3', ...]`` -> ``{'FORWARD_STAGES': 3}``, names and values checked
    (:func:`archs.scan.triton_launches.check_launch_settings`)."""
    values = {}
    for pair in pairs:
        name, sep, value = pair.partition('=')
        if not sep or not value.strip().isdigit():
            raise ValueError(f'expected NAME=INTEGER, got {pair!r}')
        values[name.strip()] = int(value)
    triton_launches.check_launch_settings(values)
    return values


def print_mamba_ssm(rows: List[Row], build: Path, arches: Sequence[int], dtypes: Sequence[str],
                    markdown: bool) -> None:
    """mamba-ssm's kernels at the training shape, then the Triton kernels' warp-instructions per update
    (forward + backward, MambaIR's inputs) over mamba-ssm's, for each launch setting compiled."""
    print(f"mamba-ssm's kernels at the training shape {SHAPES[MEASURED]} from {build} (cuobjdump; "
          f'instructions per update: every block of the chunk loop / only the blocks every pass runs)')
    widths = [max(len(h), 6) for h in MAMBA_SSM_HEADER[:2]] + [18] + [len(h) for h in MAMBA_SSM_HEADER[3:]]
    line = (lambda cells: '| ' + ' | '.join(cells) + ' |') if markdown else \
        (lambda cells: '  '.join(v.ljust(w) for v, w in zip(cells, widths)).rstrip())  # noqa: E731
    print(line(MAMBA_SSM_HEADER) + ('\n|' + '---|' * len(MAMBA_SSM_HEADER) if markdown else ''))
    for arch in arches:
        theirs = mamba_ssm_rows(build, arch, dtypes)
        for row in theirs:
            print(line(mamba_ssm_cells(row)))
        length = SHAPES[MEASURED][2]
        for dtype in dtypes:
            every = sum(r.instructions_per_update for r in theirs if r.dtype == dtype)
            always = sum(r.instructions_per_update_always for r in theirs if r.dtype == dtype)
            padded = next(r.slots_per_position for r in theirs if r.dtype == dtype)
            label = combos('mambair', [dtype])[0].label
            for settings in dict.fromkeys(r.settings for r in rows):
                ours = sum(r.instructions_per_update for r in rows
                           if r.arch == arch and r.combo == label and r.settings == settings)
                if not ours:
                    continue
                chunk = triton_launches.parse_launch_settings(settings)['CHUNK'] if settings else triton_launches.CHUNK
                ours_padded = slots_per_position(length, chunk, -(-length // chunk))
                print(f'sm_{arch} {dtype}: Triton{" " + settings if settings else ""} / mamba-ssm warp-instructions, '
                      f'forward + backward, per update of a pass: {ours:.3f} / {every:.3f} = {ours / every:.2f} '
                      f'(every block), {ours:.3f} / {always:.3f} = {ours / always:.2f} (blocks every pass runs); '
                      f'per position of the sequence (L = {length}: slots per position, Triton {ours_padded:.2f}, '
                      f'mamba-ssm {padded:.2f}): {ours / (every * padded / ours_padded):.2f} and '
                      f'{ours / (always * padded / ours_padded):.2f}')


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--arch', type=int, nargs='+', choices=sorted(ARCHS), default=[90])
    parser.add_argument('--dtype', nargs='+', choices=list(DTYPES), default=['fp32'],
                        help="MambaIR passes float32 (it calls .float() on every input)")
    parser.add_argument('--combos', choices=('mambair', 'all'), default='mambair',
                        help="'mambair': D and bias, no z (MambaIR's call); 'all': every z/bias/D")
    parser.add_argument('--shape', nargs='+', choices=sorted(SHAPES), default=list(SHAPES),
                        help='shapes bound (each kernel must get one key for all of them)')
    parser.add_argument('--cache-dir', type=Path,
                        help='Triton cache to compile into (default: a fresh temporary one, so '
                             'every compile is cold)')
    parser.add_argument('--markdown', action='store_true', help='print a Markdown table')
    parser.add_argument('--json', type=Path, help='also write the rows to this JSON file')
    parser.add_argument('--estimate', action='store_true', help='(removed: says why)')
    parser.add_argument('--sweep', nargs='+', default=[], metavar=','.join(triton_launches.LAUNCH_SETTINGS),
                        help='compile each of these configurations (the format of bench_scan.py --sweep), to '
                             'see their registers, spills and instructions before a GPU times them')
    parser.add_argument('--launch', nargs='+', default=[], metavar='NAME=VALUE',
                        help='compile with these launch settings of archs/scan/triton_launches.py '
                             f'instead of the defaults ({", ".join(triton_launches.LAUNCH_SETTINGS)}), '
                             'e.g. to see the registers and spills of a configuration before a GPU sweep')
    parser.add_argument('--mamba-ssm', type=Path, metavar='BUILD_DIR',
                        help="also read mamba-ssm's kernels from a build of scripts/build_mamba_ssm.py (no GPU "
                             'needed: build with --arch 90) and print their figures in the same terms, at the '
                             'training shape')
    args = parser.parse_args(argv)
    if args.mamba_ssm and not args.mamba_ssm.is_dir():
        parser.error(f'--mamba-ssm {args.mamba_ssm}: no such folder (a --build-dir of scripts/build_mamba_ssm.py)')
    try:
        settings = launch_values(args.launch)
    except ValueError as err:
        parser.error(f'--launch: {err}')
    if args.sweep and args.launch:
        parser.error('--sweep and --launch: give one (--sweep names every setting of each configuration)')
    try:
        configs = [triton_launches.parse_launch_settings(c) for c in args.sweep]
    except ValueError as err:
        parser.error(f'--sweep {err}')
    if args.estimate:
        print(ESTIMATE_REMOVED)
    if not hasattr(triton_launches.forward_launch, '__call__') or \
            not hasattr(triton.runtime.JITFunction, '_pack_args'):
        print(f'error: triton {triton.__version__} lacks the JIT internals this report uses '
              f'(JITFunction._pack_args); written for triton 3.6 to 3.8', file=sys.stderr)
        return UNSUPPORTED_TRITON
    with tempfile.TemporaryDirectory(prefix='scan-static-cache-') as fresh:
        knobs.cache.dir = str(args.cache_dir or fresh)
        for arch in args.arch:
            lim = ARCHS[arch]
            print(f"sm_{arch}: warps per SM for {lim['gpu']} ({lim['sms']} SMs, {lim['max_warps']} "
                  f"warps, {lim['regs']} registers, {lim['smem'] // 1024} KB shared memory per SM)")
        print(f'static figures of compiled code (Triton {triton.__version__}, bundled ptxas, cache '
              f'{"given" if args.cache_dir else "empty"}; CPU affinity {len(os.sched_getaffinity(0))} '
              f'core(s)), not timings; shapes (batch, channels, L): '
              + ', '.join(f'{s} {SHAPES[s]}' for s in args.shape))
        if args.markdown:
            print('| ' + ' | '.join(HEADER) + ' |\n|' + '---|' * len(HEADER))
            log = lambda row: print('| ' + ' | '.join(cells(row)) + ' |', flush=True)  # noqa: E731
        else:
            widths = [max(len(h), w) for h, w in zip(HEADER, (5, 19, 8) + (6,) * 12)]
            line = lambda values: '  '.join(v.ljust(w) for v, w in zip(values, widths)).rstrip()  # noqa: E731
            print(line(HEADER))
            log = lambda row: print(line(cells(row)), flush=True)  # noqa: E731
        start = time.perf_counter()
        rows = []
        try:
            for config in configs or [settings]:
                if config:
                    print('launch settings: ' + ', '.join(f'{k}={v}' for k, v in config.items()), flush=True)
                with triton_launches.launch_settings(**config):
                    found = collect(args.arch, combos(args.combos, args.dtype), args.shape, log)
                label = ','.join(str(config[name]) for name in triton_launches.LAUNCH_SETTINGS) if configs else ''
                rows += [replace(row, settings=label) for row in found]
        except RuntimeError as err:
            print(f'error: {err}', file=sys.stderr)
            return 1
        total = time.perf_counter() - start
    print(f'cold compile of the whole set: {sum(r.compile_seconds for r in rows):.1f} s '
          f'({len(rows)} kernels; {total:.1f} s with binding and analysis)')
    if args.mamba_ssm:
        try:
            print_mamba_ssm(rows, args.mamba_ssm, args.arch, args.dtype, args.markdown)
        except (RuntimeError, subprocess.CalledProcessError) as err:
            print(f'error: {err}', file=sys.stderr)
            return 1
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == '__main__':
    sys.exit(main())
