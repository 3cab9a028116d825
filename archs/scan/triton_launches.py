"""The launches of the Triton selective scan: for given inputs, which kernel of
:mod:`archs.scan.triton_kernels` runs on which grid, with which arguments, constexprs and
compiler options, and the tensors each launch writes.

:func:`forward_launch` and :func:`backward_launch` are the one description of the launches: the
autograd function (:mod:`archs.scan.triton_function`) runs them, and
``scripts/scan_static_report.py`` compiles them for GPUs this machine lacks from ``meta`` tensors.
The tiling constants below are the kernels' launch parameters (the kernels take them as
constexprs; the module docstring of :mod:`archs.scan.triton_kernels` explains the work split).
"""
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
import triton

from archs.scan.triton_kernels import (_backward_chunk_kernel, _backward_states_kernel, _carry_kernel,
                                       _forward_chunk_kernel)
from basicsr_ldt.common.errors import InputError

# Options every launch passes to Triton's compiler. FP fusion (``a * b + c`` as one FFMA) is
# Triton's default today, but Triton 3.9 warns at the first launch that the default will change;
# the recurrence, C . h and every gradient sum are multiply-adds, and the loops' instruction
# counts (the static goals, archs/README.md) assume them fused.
COMPILE_OPTIONS = {'enable_fp_fusion': True}

# Positions per chunk (at least; longer sequences get longer chunks, see MAX_CHUNKS).
CHUNK = 64
# At most this many chunks: the carry kernel walks them one after another.
MAX_CHUNKS = 128
# Channels per program (rounded to a power of two, at most the channels of one B/C group).
BLOCK_D = 32
# Consecutive positions per lane and sub-tile: one 16-byte float32 load per row (backward).
SUB = 4
# The same for the forward kernels (a chunk is a whole number of both; a (BLOCK_D, FORWARD_SUB)
# float32 tile is one 16-byte load per lane, wider tiles would be spread over lanes).
FORWARD_SUB = 4
# Positions per pass of the backward's states loop (a divisor of SUB): with all states' state,
# decay product and adjoint carried, two positions' B and C fit the register cap, four do not.
STATES_STEP = 2
# Sub-tiles per pass of the forward's loop: the per-pass pointer and loop work shared by more
# positions (4: 16 positions, 8192 state updates per pass at BLOCK_D 32 and 16 states).
FORWARD_UNROLL = 4
INT32_MAX = 2 ** 31 - 1


class _Layout:
    """Shapes, chunking and launch grid shared by the kernels."""

    def __init__(self, u: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                 chunk: int, block_d: int):
        self.batch, self.dim, self.length = u.shape
        self.dstate = A.shape[1]
        groups = 1
        for m in (B, C):  # the finest grouping: every program's channels share one B and C slice
            if m.dim() == 4:
                groups = groups * m.shape[1] // math.gcd(groups, m.shape[1])
        self.group_size = self.dim // groups
        self.b_chans = self.dim // B.shape[1] if B.dim() == 4 else 1
        self.c_chans = self.dim // C.shape[1] if C.dim() == 4 else 1
        # whole sub-tiles per chunk, and no more than MAX_CHUNKS chunks
        chunk = max(int(chunk), -(-self.length // MAX_CHUNKS), 1)
        step = SUB * FORWARD_SUB // math.gcd(SUB, FORWARD_SUB)
        self.chunk = -(-chunk // step) * step
        self.n_chunks = -(-self.length // self.chunk)
        # (at least 2: the gradient walk pairs each lane with the lane BLOCK_D / 2 away)
        self.block_d = max(2, min(triton.next_power_of_2(max(1, int(block_d))),
                                  triton.next_power_of_2(self.group_size)))
        self.block_n = triton.next_power_of_2(self.dstate)
        # a position's states in the position-major B/C copies: ``vec`` at a time, ``nq`` in all
        self.vec = min(4, self.block_n)
        self.nq = -(-self.dstate // self.vec) * self.vec
        self.blocks = -(-self.group_size // self.block_d)
        self.fine = groups
        self.grid = (self.n_chunks, groups * self.blocks, self.batch)
        self.carry_grid = (triton.cdiv(self.dim, BLOCK_D), self.batch)
        self.programs = math.prod(self.grid)
        self._check_limits(tuple(u.shape))

    def _check_limits(self, shape: Tuple[int, ...]) -> None:
        """Refuse, before any work, what the kernels' 32-bit indices (positions within one
        sequence, offsets within one program's slot, the A tile) or CUDA's grid (at most 65535
        programs along its second and third axes) cannot address."""
        for what, value, limit in (('positions L + chunk', self.length + self.chunk, INT32_MAX),
                                   ('chunk x state tile', self.chunk * self.block_d * self.block_n, INT32_MAX),
                                   ('dim x d_state', self.dim * self.dstate, INT32_MAX),
                                   ('channel blocks', self.grid[1], 65535),
                                   ('batch', self.batch, 65535)):
            if value > limit:
                raise InputError(
                    f'the Triton selective scan cannot take u of shape {shape} (batch, dim, L): '
                    f'its {what} = {value} passes {limit}, the most its indices or launch grid '
                    f'address. Split the input, or use scan_backend: torch.')

    def args(self) -> Tuple[int, ...]:
        return (self.dim, self.length, self.group_size, self.b_chans, self.c_chans,
                self.n_chunks, self.chunk)

    def per_channel(self, t: torch.Tensor, width: int) -> torch.Tensor:
        """Per-program partial sums (programs, ...) -> (dim, width), summed over batch and chunks."""
        t = t.reshape(self.batch, self.fine, self.blocks, self.n_chunks, self.block_d, -1).sum((0, 3))
        t = t.reshape(self.fine, self.blocks * self.block_d, -1)[:, :self.group_size]
        return t.reshape(self.dim, -1)[:, :width]

    def per_position(self, part: torch.Tensor, groups: int) -> torch.Tensor:
        """dB/dC partial sums (b, channel blocks, n, L) -> (b, groups, n, L)."""
        part = part.view(self.batch, groups, self.fine // groups * self.blocks, self.dstate, self.length)
        return part.sum(2)


@dataclass
class KernelLaunch:
    """One kernel launch, complete: ``kernel[grid](*args, num_warps=num_warps, **constexprs)``.

    ``args`` are the kernel's non-constexpr parameters in order (tensors and Python ints; on a GPU
    Triton specialises on them: pointer alignment, ints divisible by 16, ints past 2**31 - 1 as
    int64), ``constexprs`` its constexpr parameters by name. ``updates_per_pass``: for each
    innermost loop of the compiled kernel, in code order, the state updates (channel, state,
    position) one warp makes per pass (empty for the carry kernel, whose loop walks chunks), so
    that static figures can be put per update. ``options``: other launch options
    (:data:`COMPILE_OPTIONS` always, added to those given; ``maxnreg``: the registers per
    thread ptxas may use, so that enough programs stay resident per SM; Triton's interpreter
    ignores them).
    ``serial_passes``: the passes of its loop that one program makes one after another (the
    carry kernel's chunks), for the time estimate's serial chain.
    ``traffic``: the tensors it reads or writes, each once (one listed twice is moved twice;
    None: absent), for the estimate's memory time."""
    name: str
    kernel: Any
    grid: Tuple[int, ...]
    args: Tuple[Any, ...]
    constexprs: Dict[str, Any]
    num_warps: int
    updates_per_pass: Tuple[int, ...] = ()
    options: Dict[str, Any] = field(default_factory=dict)
    serial_passes: int = 0
    traffic: Tuple[Optional[torch.Tensor], ...] = ()

    def __post_init__(self) -> None:
        self.options = {**COMPILE_OPTIONS, **self.options}

    def run(self) -> None:
        device = self.args[0].device
        with torch.cuda.device(device) if device.type == 'cuda' else _nothing():
            self.kernel[self.grid](*self.args, num_warps=self.num_warps, **self.options,
                                   **self.constexprs)


@dataclass
class ScanLaunches:
    """The launches of one direction, run in order, the tensors they write (``outputs``) and
    the shapes the caller needs afterwards (``layout``)."""
    launches: List[KernelLaunch]
    outputs: Dict[str, Optional[torch.Tensor]]
    layout: _Layout

    def run(self) -> Dict[str, Optional[torch.Tensor]]:
        for launch in self.launches:
            launch.run()
        return self.outputs


def _prepare(u, delta, A, B, C, D, z, delta_bias, softplus, chunk, block_d):
    """Contiguous inputs in the kernels' argument order, the flags they are compiled for, and
    the layout. A shape past the kernels' limits raises :class:`InputError` naming it, before
    any input is copied."""
    lay = _Layout(u, A, grouped_view(B), grouped_view(C), chunk, block_d)  # checks limits first
    u, delta = u.contiguous(), delta.contiguous()
    z = None if z is None else z.contiguous()
    Bn, Cn = grouped_view(B).contiguous(), grouped_view(C).contiguous()
    A32, D32, bias32 = A.float().contiguous(), _float(D), _float(delta_bias)
    inputs = (u, delta, A32, Bn, Cn, _or(D32, A32), _or(z, u), _or(bias32, A32))
    flags = dict(VAR_B=Bn.dim() == 4, VAR_C=Cn.dim() == 4, HAS_D=D is not None, HAS_Z=z is not None,
                 HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(softplus), dstate=lay.dstate,
                 BLOCK_D=lay.block_d, BLOCK_N=lay.block_n, SUB=SUB)
    return inputs, flags, lay


def _chunk_launch(name, kernel, lay, args, flags, loops, traffic, max_registers, **mode) -> KernelLaunch:
    """``loops``: per innermost loop, whether one pass covers all states of a sub-tile ('tile')
    or the gradient walk's states of one pass for each of the lanes' two channels ('states'):
    two passes of the lanes' two parities when d_state is a multiple of 4, else one."""
    step = 4 if lay.dstate % 4 == 0 else 2
    per = dict(tile=lay.block_d * lay.dstate * SUB, states=lay.block_d * SUB * step,
               step=lay.block_d * lay.dstate * mode.get('STEP', 1))
    return KernelLaunch(name, kernel, lay.grid, args, dict(flags, **mode), num_warps=1,
                        updates_per_pass=tuple(per[loop] for loop in loops),
                        options=dict(maxnreg=max_registers), traffic=tuple(traffic))


def _carry_launch(name, lay, A32, own, dsum, start, last, reverse: bool) -> KernelLaunch:
    return KernelLaunch(name, _carry_kernel, lay.carry_grid,
                        (A32, own, dsum, _or(start, A32), last, lay.dim, lay.dstate, lay.n_chunks),
                        dict(REVERSE=reverse, HAS_START=start is not None, BLOCK_D=BLOCK_D,
                             BLOCK_N=lay.block_n), num_warps=1, serial_passes=lay.n_chunks,
                        traffic=(own, own, dsum, start, last))


def forward_launch(u, delta, A, B, C, D, z, delta_bias, softplus: bool, chunk: int = CHUNK,
                   block_d: int = BLOCK_D) -> ScanLaunches:
    """The forward's launches for these inputs (shapes and dtypes as :func:`selective_scan_triton`).
    Outputs: ``out`` (u's dtype), ``last`` (float32 last state), ``saved`` (the float32 states
    entering the chunks, kept for backward) and ``dsum`` (each chunk's sum of delta).

    This is the one description of the launches: :class:`SelectiveScanTriton` runs them, and
    ``scripts/scan_static_report.py`` compiles them for GPUs it does not have, by calling this
    with tensors on the ``meta`` device (shapes and dtypes only, nothing allocated). So it must
    do nothing but prepare inputs (here also the position-major B/C copies), allocate outputs
    and temporaries (the float32 delta after softplus) on the inputs' device and describe the
    launches; it must never read tensor values."""
    inputs, flags, lay = _prepare(u, delta, A, B, C, D, z, delta_bias, softplus, chunk, block_d)
    u = inputs[0]
    fwd_inputs = list(inputs)
    for i in (3, 4):  # varying B and C: position-major float32 copies
        if inputs[i].dim() == 4:
            fwd_inputs[i] = _positions_major(inputs[i], lay.n_chunks * lay.chunk, lay.nq)
    fwd_flags = {k: v for k, v in flags.items() if k != 'BLOCK_N'}
    fwd_flags.update(NQ=lay.nq, VEC=lay.vec, SUB=FORWARD_SUB, UNROLL=FORWARD_UNROLL)
    out = torch.empty_like(u)
    last = u.new_empty(lay.batch, lay.dim, lay.dstate, dtype=torch.float32)
    saved = u.new_empty(lay.batch, lay.dim, lay.n_chunks, lay.dstate, dtype=torch.float32)
    dsum = u.new_empty(lay.batch, lay.dim, lay.n_chunks, dtype=torch.float32)
    dt = u.new_empty(lay.batch, lay.dim, lay.length, dtype=torch.float32)  # freed after the forward
    args = (*fwd_inputs, dt, out, saved, dsum, *lay.args())
    per_pass = lay.block_d * lay.dstate * FORWARD_SUB * FORWARD_UNROLL
    return ScanLaunches([
        KernelLaunch('forward: chunks from zero', _forward_chunk_kernel, lay.grid, args,
                     dict(fwd_flags, OUTPUT=False), num_warps=1, updates_per_pass=(per_pass,),
                     traffic=(u, inputs[1], fwd_inputs[3], dt, saved, dsum)),
        _carry_launch('forward: carries', lay, inputs[2], saved, dsum, None, last, reverse=False),
        KernelLaunch('forward: output', _forward_chunk_kernel, lay.grid, args,
                     dict(fwd_flags, OUTPUT=True), num_warps=1, updates_per_pass=(per_pass,),
                     traffic=(u, dt, fwd_inputs[3], fwd_inputs[4], _or_none(z, inputs[6]), saved, out)),
    ], dict(out=out, last=last, saved=saved, dsum=dsum), lay)


def _positions_major(m: torch.Tensor, padded: int, nq: int) -> torch.Tensor:
    """A varying (b, G, n, L) B or C as the forward reads it: float32 (b, G, padded, nq), the
    ``n`` states of a position contiguous (zero beyond n and beyond L), so that a position's
    states are ``nq / 4`` 16-byte loads at fixed offsets from one address."""
    b, g, n, length = m.shape
    out = m.new_zeros(b, g, padded, nq, dtype=torch.float32)
    out[:, :, :length, :n] = m.transpose(2, 3)
    return out


def _states_major(m: torch.Tensor, padded: int) -> torch.Tensor:
    """A varying (b, G, n, L) B or C as the gradient walk reads it: float32 (b, G, n, padded),
    zero beyond L, so that the walk's loads of a state's positions need no mask nor widening."""
    out = m.new_zeros(*m.shape[:3], padded, dtype=torch.float32)
    out[..., :m.shape[3]] = m
    return out


def backward_launch(u, delta, A, B, C, D, z, delta_bias, saved: torch.Tensor, dsum: torch.Tensor,
                    dout: torch.Tensor, dlast: Optional[torch.Tensor], softplus: bool,
                    chunk: int = CHUNK, block_d: int = BLOCK_D) -> ScanLaunches:
    """The backward's launches (same contract as :func:`forward_launch`): the forward's inputs,
    its ``saved`` states and ``dsum``, the output gradient ``dout`` and the last state's gradient
    ``dlast`` (None: not needed, the carry kernel is compiled without it). Outputs: ``du``,
    ``ddelta``, ``dz`` (or None), and the partial sums ``dB_part``/``dC_part`` (variable B/C,
    else None), ``dtile`` (dA, constant dB, dC) and ``dvec`` (dD, d delta_bias) that ``layout``
    reduces."""
    inputs, flags, lay = _prepare(u, delta, A, B, C, D, z, delta_bias, softplus, chunk, block_d)
    u, delta = inputs[0], inputs[1]
    dout = dout.contiguous()
    dlast = None if dlast is None else dlast.float().contiguous()
    du, ddelta = torch.empty_like(u), torch.empty_like(delta)
    dz = None if z is None else torch.empty_like(inputs[6])
    f32 = dict(dtype=torch.float32)
    tile_size = lay.block_d * lay.block_n
    adj = torch.empty_like(saved)
    dinit = u.new_empty(lay.batch, lay.dim, lay.dstate, **f32)  # gradient of the zero initial state
    scratch = u.new_empty(lay.programs * (lay.chunk // SUB) * tile_size, **f32)
    const = 0 if flags['VAR_B'] and flags['VAR_C'] else 2  # dtile's constant-gradient tiles, if any
    dtile = u.new_empty(lay.programs, const + 4, lay.block_d, lay.block_n, **f32)
    dtile[:, :const].zero_()
    dvec = u.new_empty(lay.programs, 2, lay.block_d, **f32)
    dB_part = u.new_empty(lay.batch, lay.grid[1], lay.dstate, lay.length, **f32) if flags['VAR_B'] else None
    dC_part = u.new_empty(lay.batch, lay.grid[1], lay.dstate, lay.length, **f32) if flags['VAR_C'] else None
    positions = [_positions_major(m, lay.n_chunks * lay.chunk, lay.nq) if m.dim() == 4 else m
                 for m in inputs[3:5]]  # as the forward reads them
    rows = [_states_major(m, lay.n_chunks * lay.chunk) if m.dim() == 4 else m for m in inputs[3:5]]
    args = (*inputs[:3], *rows, *inputs[5:], dout, adj, scratch, du, ddelta, _or(dz, du), _or(dB_part, scratch),
            _or(dC_part, scratch), dtile, dvec, *lay.args())
    states_args = (u, delta, inputs[2], inputs[6], inputs[7], dout, saved, adj, scratch, *positions,
                   *lay.args())
    states_flags = {k: v for k, v in flags.items() if k != 'HAS_D'}
    return ScanLaunches([
        _chunk_launch('backward: states, adjoints from zero', _backward_states_kernel, lay, states_args,
                      states_flags, ['step'],
                      (u, delta, dout, positions[0], positions[1], _or_none(z, inputs[6]), saved, scratch, adj),
                      max_registers=128 if z is None else 144, NQ=lay.nq, VEC=lay.vec,
                      STEP=STATES_STEP),  # 16 per SM (14 with z)
        _carry_launch('backward: carries', lay, inputs[2], adj, dsum, dlast, dinit, reverse=True),
        _chunk_launch('backward: gradients', _backward_chunk_kernel, lay, args, flags, ['states'],
                      (u, delta, dout, *rows, _or_none(z, inputs[6]), adj, scratch,
                       du, ddelta, dz, dB_part, dC_part, dtile, dvec),
                      max_registers=128 if z is None else 168, CONST=const),  # 16 per SM; 12 with z (its gate needs more)
    ], dict(du=du, ddelta=ddelta, dz=dz, dB_part=dB_part, dC_part=dC_part, dtile=dtile, dvec=dvec), lay)


def grouped_view(m: torch.Tensor) -> torch.Tensor:
    """(b, n, L) -> (b, 1, n, L) (a view); (d, n) and (b, G, n, L) unchanged."""
    return m.unsqueeze(1) if m.dim() == 3 else m


def _float(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.float().contiguous()


class _nothing:
    """A do-nothing context manager (CPU tensors under TRITON_INTERPRET=1)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _or_none(flag: Optional[torch.Tensor], t: torch.Tensor) -> Optional[torch.Tensor]:
    """``t`` where the optional input ``flag`` is given, else None (a launch's traffic)."""
    return None if flag is None else t


def _or(t: Optional[torch.Tensor], fallback: torch.Tensor) -> torch.Tensor:
    """A real tensor for a pointer argument the kernel never touches (its flag is off); never an
    empty one, whose null data pointer Triton's launcher rejects on a GPU."""
    return fallback if t is None else t
