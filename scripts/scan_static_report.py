"""Static figures of the Triton selective-scan kernels, compiled for GPUs this machine lacks.

    python scripts/scan_static_report.py                      # every MambaIR combination
    python scripts/scan_static_report.py --arch 90 --shape infer --combos mambair --markdown

No GPU is needed: each launch is described by :func:`archs.scan.triton_launches.forward_launch` and
:func:`archs.scan.triton_launches.backward_launch` (the functions the autograd function runs), called with
``meta`` tensors of the real shapes and dtypes. Triton's own JIT binder turns those arguments into
the specialisation a real launch gets (16-byte aligned pointers, as fresh CUDA allocations are;
ints divisible by 16; ints past 2**31 - 1 passed as int64), and ``triton.compile`` with a
``GPUTarget`` runs Triton's passes and its bundled ptxas for sm_80 / sm_90. These are figures of
the compiled code, not timings.

Per kernel it prints: registers per thread; spills (the local-memory bytes ptxas reserved and the
STL/LDL instructions in the SASS); shared memory per program; programs and warps per launch;
resident warps per SM (the occupancy limit from registers, shared memory, warps per program and
the architecture's limits) and the warps the busiest SM actually gets at this launch (programs
spread over the SMs: 132 for an H100 SXM at sm_90, 108 for an A100 at sm_80); the SASS
instructions of each innermost loop (see :func:`innermost_loops`) and, from the state updates
per pass of each that the launch declares, the SASS warp-instructions per state update (every
update passes once through each of those loops); and the pointer arguments whose first offset is
computed in 32 bits (see :func:`narrow_offsets`), which must only be small per-channel tensors.

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

os.environ['TRITON_INTERPRET'] = '0'  # compile, do not interpret (before triton is imported)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

import archs.scan.triton_kernels as triton_kernels  # noqa: E402
import archs.scan.triton_launches as triton_launches  # noqa: E402

# MambaIR classic SR x4: K = 4 scan directions x d_inner 360 channels, d_state 16, B/C grouped
# per direction ((b, 4, n, L)); D, delta_bias and softplus on, no z.
DIM, GROUPS, DSTATE = 4 * 360, 4, 16
SHAPES = {'train': (4, 48 * 48),       # batch 4, 48x48 LR training patch
          'infer': (1, 1024 * 1024)}   # batch 1, a 1024x1024 LR image at inference
DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}
# Architecture limits per SM (CUDA programming guide, compute capabilities 8.0 and 9.0).
ARCHS = {
    80: dict(gpu='A100', sms=108, max_warps=64, max_blocks=32, regs=65536, smem=164 * 1024),
    90: dict(gpu='H100 SXM', sms=132, max_warps=64, max_blocks=32, regs=65536, smem=228 * 1024),
}
# For the time ESTIMATE only (--estimate): boost clock, per-SM throughputs per cycle (CUDA
# programming guide: 4 schedulers issuing one warp-instruction each; MUFU 16 lanes, shuffles 32
# lanes), HBM bandwidth, and what one pass of a serial loop (the carry kernel's, one chunk after
# another in one program) is taken to cost: a memory round trip plus its instructions at the
# FMA latency. A100: the 80 GB SXM part.
MODEL = {
    80: dict(clock=1.41e9, issue=4, mufu=16, shfl=32, hbm=2.04e12, round_trip=600, latency=4),
    90: dict(clock=1.755e9, issue=4, mufu=16, shfl=32, hbm=3.35e12, round_trip=600, latency=4),
}
SMEM_RESERVED_PER_BLOCK = 1024  # bytes the driver keeps per resident block (sm_80 and later)
REG_ALLOC_UNIT = 256            # registers are allocated per warp in units of 256
SUB_PARTITIONS = 4              # an SM's register file is split over 4 schedulers


@dataclass(frozen=True)
class Combo:
    """One input combination: the dtype of u, delta, z, B, C and which optional inputs exist."""
    dtype: str
    z: bool
    bias: bool
    D: bool

    @property
    def label(self) -> str:
        flags = [name for name, on in (('z', self.z), ('bias', self.bias), ('D', self.D)) if on]
        return f"{self.dtype} {'+'.join(flags) or 'none'}"


def estimate(row: 'Row') -> Dict[str, float]:
    """Seconds one launch would take on the ``row.arch`` GPU by each limit of :data:`MODEL`, and
    their maximum ('time'): a chunk kernel's instruction issue, MUFU and shuffle throughput over
    all SMs (every state update of the call passes once through each loop) and the tensors its
    launch declares (``traffic``) moved from HBM as listed; a carry kernel's serial chain. A model
    read off the static figures, not a measurement."""
    gpu, m = ARCHS[row.arch], MODEL[row.arch]
    per_sm = gpu['sms'] * m['clock']  # SM-cycles per second
    limits = dict(memory=row.tensor_bytes / m['hbm'])
    if row.updates_per_pass:
        limits.update(issue=row.per_update * row.updates / (m['issue'] * per_sm),
                      mufu=row.per_update_of(row.loop_mufu) * row.updates * 32 / (m['mufu'] * per_sm),
                      shuffle=row.per_update_of(row.loop_shuffles) * row.updates * 32 / (m['shfl'] * per_sm))
    else:
        cycles = sum(row.loop_instructions) * m['latency'] + m['round_trip']
        limits.update(chain=row.serial_passes * cycles / m['clock'])
    limits['time'] = max(limits.values())
    return limits


def combos(which: str, dtypes: Sequence[str]) -> List[Combo]:
    """'mambair': the call MambaIR makes (D and bias, no z); 'all': every z/bias/D combination."""
    if which == 'mambair':
        return [Combo(dt, False, True, True) for dt in dtypes]
    return [Combo(dt, z, bias, D) for dt in dtypes
            for z in (False, True) for bias in (False, True) for D in (False, True)]


def meta_launches(batch: int, length: int, combo: Combo):
    """The forward and backward launches of ``combo`` at this shape, on meta tensors. The
    backward has no last-state gradient: MambaIR never uses the last state."""
    def meta(*shape, dtype=DTYPES[combo.dtype]):
        return torch.empty(*shape, dtype=dtype, device='meta')
    u = meta(batch, DIM, length)
    A = meta(DIM, DSTATE, dtype=torch.float32)
    B, C = meta(batch, GROUPS, DSTATE, length), meta(batch, GROUPS, DSTATE, length)
    D = meta(DIM, dtype=torch.float32) if combo.D else None
    z = meta(batch, DIM, length) if combo.z else None
    bias = meta(DIM, dtype=torch.float32) if combo.bias else None
    fwd = triton_launches.forward_launch(u, meta(batch, DIM, length), A, B, C, D, z, bias, True)
    bwd = triton_launches.backward_launch(u, meta(batch, DIM, length), A, B, C, D, z, bias,
                                      fwd.outputs['saved'], fwd.outputs['dsum'],
                                      meta(batch, DIM, length), None, True)
    return fwd.launches + bwd.launches


UNSUPPORTED_TRITON = 77  # exit status when this triton lacks the JIT internals used below


def compile_launch(launch, arch: int):
    """Compile ``launch`` for sm_<arch> exactly as ``kernel[grid](...)`` would on that GPU: the
    JIT's own binder computes the signature, constexprs and divisibility attributes (Triton
    3.x internals: ``create_function_from_signature`` and ``JITFunction._pack_args``)."""
    target = GPUTarget('cuda', arch, 32)
    backend = make_backend(target)
    fn = launch.kernel
    kwargs = dict(launch.constexprs, num_warps=launch.num_warps, **launch.options,
                  debug=fn.debug or knobs.runtime.debug,
                  instrumentation_mode=knobs.compilation.instrumentation_mode)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization,
                                                          options)
    # The same specialisation compiles to the same code (the shapes' programs differ, not their
    # kernels, unless an int passes 2**31 - 1): compile it once per process.
    key = repr((fn.__name__, arch, signature, constexprs, attrs, sorted(options.__dict__.items())))
    if key not in _COMPILED:
        _COMPILED[key] = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                        options=options.__dict__)
    return _COMPILED[key]


_COMPILED: Dict[str, Any] = {}


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
    line = re.search(r'REG:.*', usage)
    return {k: int(v) for k, v in re.findall(r'(\w+):(\d+)', line.group(0))}, sass


_INSTRUCTION = re.compile(r'^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;', re.M)
_LABEL = re.compile(r'^(\.L_x_\d+):\s*$', re.M)
_BRANCH = re.compile(r'\bBRA(?:\.\w+)*\s+`?\(?(\.L_x_\d+)\)?`?')


def sass_instructions(sass: str) -> List[Tuple[int, str]]:
    """(address, instruction text) of every SASS instruction in nvdisasm's output."""
    return [(int(a, 16), text) for a, text in _INSTRUCTION.findall(sass)]


def innermost_loops(sass: str) -> List[Tuple[int, int]]:
    """(first, last) instruction addresses of every innermost loop of the SASS, in address order.

    A loop is a backward branch: a BRA at address ``e`` to a label at ``s <= e`` makes
    ``[s, e]`` a loop body (nvdisasm names branch targets ``.L_x_N`` and prints the label on the
    line before the instruction it marks). Innermost: no other loop lies inside it. A branch to
    itself (the ``BRA`` trap ptxas puts after ``EXIT``) is not a loop."""
    labels = {}
    for m in _LABEL.finditer(sass):
        nxt = _INSTRUCTION.search(sass, m.end())
        if nxt:
            labels[m.group(1)] = int(nxt.group(1), 16)
    loops = []
    for address, text in sass_instructions(sass):
        m = _BRANCH.search(text)
        if m and m.group(1) in labels and labels[m.group(1)] < address:
            loops.append((labels[m.group(1)], address))
    return sorted(loop for loop in loops
                  if not any(o != loop and loop[0] <= o[0] and o[1] <= loop[1] for o in loops))


def loop_body(sass: str, loop: Tuple[int, int]) -> List[str]:
    return [text for address, text in sass_instructions(sass) if loop[0] <= address <= loop[1]]


_SSA = r'%[\w#.]+'
_TTIR_OP = re.compile(rf'({_SSA}) = tt\.(splat|addptr|broadcast|expand_dims|reshape)\s+({_SSA})'
                      rf'(?:,\s*({_SSA}))?[^:\n]*:\s*([^\n]*?)\s+loc\(')


def narrow_offsets(ttir: str) -> List[str]:
    """Pointer arguments whose first offset is computed in fewer than 64 bits.

    In Triton IR a load of ``ptr + offsets`` is ``tt.addptr`` of the argument (or its splat/
    broadcast) and the offsets; the offsets' integer type is the width the whole offset
    expression was computed in. Only the first ``addptr`` applied to an argument is checked: the
    kernels add the large row offset first (``u_ptr + row + t``), so a 32-bit first offset into
    a tensor sized by batch or length is a product of sizes that can wrap. Pointers advanced
    through loop-carried values are not traced."""
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


@dataclass
class Row:
    """One compiled kernel's static figures."""
    arch: int
    shape: str
    combo: str
    kernel: str
    registers: int
    spill_bytes: int
    spill_instructions: int
    shared_bytes: int
    programs: int
    warps_per_program: int
    occupancy_warps: int
    launch_warps: int
    loop_instructions: List[int]
    updates_per_pass: List[int]
    narrow_offsets: List[str]
    loop_mufu: List[int]        # MUFU (exp2, log2, rcp, rsqrt) instructions per loop pass
    loop_shuffles: List[int]    # SHFL instructions per loop pass
    tensor_bytes: int           # bytes the launch reads and writes (its declared traffic)
    serial_passes: int          # passes of its loop that one program makes in order (carries)
    updates: int                # state updates of the whole call (batch x dim x L x d_state)
    fp_fusion: bool             # the launch asks for fused multiply-adds and was compiled with them

    @property
    def per_update(self) -> Optional[float]:
        """SASS warp-instructions per state update: each innermost loop's instructions over the
        state updates one warp makes per pass of it, summed over the loops (every state update
        goes through each loop once). None for a kernel without a sequence loop (the carries)."""
        if not self.updates_per_pass:
            return None
        if len(self.updates_per_pass) != len(self.loop_instructions):
            raise RuntimeError(f'{self.kernel}: {len(self.loop_instructions)} innermost loops in the '
                               f'SASS, {len(self.updates_per_pass)} described by its launch')
        return self.per_update_of(self.loop_instructions)

    def per_update_of(self, counts: List[int]) -> Optional[float]:
        if not self.updates_per_pass:
            return None
        return sum(i / u for i, u in zip(counts, self.updates_per_pass))


def _count(body: List[str], opcode: str) -> int:
    return sum(1 for text in body if re.match(rf'(@!?U?P\w+\s+)?{opcode}\b', text))


def tensor_bytes(launch) -> int:
    """Bytes the launch moves: its ``traffic`` tensors, each once as listed."""
    return sum(t.numel() * t.element_size() for t in launch.traffic if t is not None)


def occupancy_warps(registers: int, shared: int, warps: int, limits: dict) -> int:
    """Resident warps per SM allowed by registers, shared memory and the per-SM limits."""
    regs_per_warp = math.ceil(registers * 32 / REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    warps_by_regs = SUB_PARTITIONS * ((limits['regs'] // SUB_PARTITIONS) // regs_per_warp)
    blocks = min(limits['max_blocks'], limits['max_warps'] // warps, warps_by_regs // warps,
                 limits['smem'] // (shared + SMEM_RESERVED_PER_BLOCK))
    return blocks * warps


def analyse(launch, arch: int, shape: str, combo: Combo, compiled=None) -> Row:
    kernel = compiled or compile_launch(launch, arch)
    usage, sass = resources(kernel.asm['cubin'])
    spills = sum(1 for _, text in sass_instructions(sass) if re.search(r'\b(STL|LDL)\b', text))
    limits = ARCHS[arch]
    warps = launch.num_warps
    shared = max(kernel.metadata.shared, usage.get('SHARED', 0))
    occupancy = occupancy_warps(usage['REG'], shared, warps, limits)
    programs = math.prod(launch.grid)
    busiest = min(math.ceil(programs / limits['sms']) * warps, occupancy)
    bodies = [loop_body(sass, lp) for lp in innermost_loops(sass)]
    batch, length = SHAPES[shape]
    return Row(arch, shape, combo.label, launch.name, usage['REG'],
               usage.get('LOCAL', 0) + usage.get('STACK', 0), spills, shared, programs, warps,
               occupancy, busiest, [len(b) for b in bodies],
               list(launch.updates_per_pass), narrow_offsets(kernel.asm['ttir']),
               [_count(b, 'MUFU') for b in bodies], [_count(b, 'SHFL') for b in bodies],
               tensor_bytes(launch), launch.serial_passes, batch * DIM * length * DSTATE,
               launch.options.get('enable_fp_fusion') is True and bool(kernel.metadata.enable_fp_fusion))


def collect(arches: Iterable[int], shapes: Iterable[str], cases: Iterable[Combo],
            log=None) -> List[Row]:
    """Every launch compiled and analysed; a compile error names kernel, inputs, shape, arch."""
    rows = []
    for shape in shapes:
        batch, length = SHAPES[shape]
        for combo in cases:
            for launch in meta_launches(batch, length, combo):
                for arch in arches:
                    try:
                        rows.append(analyse(launch, arch, shape, combo))
                    except Exception as err:
                        raise RuntimeError(f'{launch.name} kernel, {combo.label}, {shape} shape, '
                                           f'sm_{arch}: compile failed: {err}') from err
                    if log:
                        log(rows[-1])
    return rows


HEADER = ('arch', 'shape', 'inputs', 'kernel', 'regs', 'spill B / STL+LDL', 'smem B',
          'programs', 'warps/prog', 'warps/SM limit', 'warps/SM this launch',
          'SASS per loop pass', 'SASS per state update', '32-bit offsets into')


def cells(row: Row) -> Tuple[str, ...]:
    return (f'sm_{row.arch}', row.shape, row.combo, row.kernel, str(row.registers),
            f'{row.spill_bytes} / {row.spill_instructions}', str(row.shared_bytes),
            str(row.programs), str(row.warps_per_program), str(row.occupancy_warps),
            str(row.launch_warps), ' + '.join(map(str, row.loop_instructions)) or '-',
            '-' if row.per_update is None else f'{row.per_update:.3f}',
            ', '.join(row.narrow_offsets) or '-')


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--arch', type=int, nargs='+', choices=sorted(ARCHS), default=[90, 80])
    parser.add_argument('--shape', nargs='+', choices=sorted(SHAPES), default=['train', 'infer'])
    parser.add_argument('--dtype', nargs='+', choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument('--combos', choices=('mambair', 'all'), default='all',
                        help="'mambair': D and bias, no z (MambaIR's call); 'all': every z/bias/D")
    parser.add_argument('--markdown', action='store_true', help='print a Markdown table')
    parser.add_argument('--json', type=Path, help='also write the rows to this JSON file')
    parser.add_argument('--estimate', action='store_true',
                        help='then an ESTIMATE of each launch\'s time per SS2D call from these figures')
    args = parser.parse_args(argv)
    for arch in args.arch:
        lim = ARCHS[arch]
        print(f"sm_{arch}: warps per SM for {lim['gpu']} ({lim['sms']} SMs, {lim['max_warps']} "
              f"warps, {lim['regs']} registers, {lim['smem'] // 1024} KB shared memory per SM)")
    print('static figures of compiled code (Triton %s, bundled ptxas), not timings' % triton.__version__)
    if args.markdown:
        print('| ' + ' | '.join(HEADER) + ' |\n|' + '---|' * len(HEADER))
        log = lambda row: print('| ' + ' | '.join(cells(row)) + ' |', flush=True)  # noqa: E731
    else:
        widths = [max(len(h), w) for h, w in zip(HEADER, (5, 5, 16, 26) + (6,) * 10)]
        line = lambda values: '  '.join(v.ljust(w) for v, w in zip(values, widths)).rstrip()  # noqa: E731
        print(line(HEADER))
        log = lambda row: print(line(cells(row)), flush=True)  # noqa: E731
    if not hasattr(triton_kernels._forward_chunk_kernel, '_pack_args'):
        print(f'error: triton {triton.__version__} lacks the JIT internals this report uses '
              f'(JITFunction._pack_args); written for triton 3.8', file=sys.stderr)
        return UNSUPPORTED_TRITON
    try:
        rows = collect(args.arch, args.shape, combos(args.combos, args.dtype), log)
    except RuntimeError as err:
        print(f'error: {err}', file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps([dict(asdict(r), per_update=r.per_update, estimate=estimate(r))
                                         for r in rows], indent=1))
    if args.estimate:
        print_estimates(rows, args.markdown)
    return 0


def print_estimates(rows: List['Row'], markdown: bool) -> None:
    """Each launch's estimated time by each limit, and each direction's total, in microseconds."""
    print('\nESTIMATE per SS2D call from the static figures (a model: see MODEL), microseconds')
    head = ('arch', 'shape', 'inputs', 'kernel', 'issue', 'MUFU', 'shuffle', 'memory', 'chain', 'time')
    fmt = (lambda v: '| ' + ' | '.join(v) + ' |') if markdown else (lambda v: '  '.join(
        x.ljust(w) for x, w in zip(v, (5, 5, 16, 26, 7, 7, 7, 7, 7, 7))).rstrip())
    print(fmt(head))
    if markdown:
        print('|' + '---|' * len(head))
    totals: Dict[Tuple[int, str, str, str], float] = {}
    for row in rows:
        e = estimate(row)
        cell = lambda k: f'{e[k] * 1e6:.1f}' if k in e else '-'  # noqa: E731
        print(fmt((f'sm_{row.arch}', row.shape, row.combo, row.kernel,
                   *(cell(k) for k in ('issue', 'mufu', 'shuffle', 'memory', 'chain', 'time')))))
        key = (row.arch, row.shape, row.combo, row.kernel.split(':')[0])
        totals[key] = totals.get(key, 0.0) + e['time']
    for (arch, shape, combo, direction), seconds in totals.items():
        print(f'sm_{arch} {shape} {combo} {direction}: {seconds * 1e6:.0f} us (sum of its launches)')


if __name__ == '__main__':
    sys.exit(main())
