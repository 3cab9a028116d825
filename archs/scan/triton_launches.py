"""The launches of the Triton selective scan: for given inputs, which kernel of
:mod:`archs.scan.triton_kernels` runs on which grid, with which arguments, constexprs and
compiler options, and the tensors each launch writes.

:func:`forward_launch` and :func:`backward_launch` are the one description of the launches: the
autograd function (:mod:`archs.scan.triton_function`) runs them, and
``scripts/scan_static_report.py`` compiles them for GPUs this machine lacks from ``meta`` tensors.
"""
import contextlib
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional, Tuple

import torch

from archs.scan.triton_kernels import _scan_backward_kernel, _scan_forward_kernel
from basicsr_ldt.common.errors import InputError

# Options every launch passes to Triton's compiler. FP fusion (``a * b + c`` as one FFMA) is
# Triton's default today, but Triton 3.9 warns at the first launch that the default will change.
COMPILE_OPTIONS = {'enable_fp_fusion': True}

# Positions per chunk (the kernels' T, a power of two): the programs walk the sequence in a
# runtime loop over chunks of this many positions, so L never changes the compiled code.
CHUNK = 8
# Channels per program of the forward and of the backward kernel (powers of two; at most the
# channels of one B/C group, rounded up), their warps per program, and the software-pipelining
# stages of each chunk loop (``tl.range(num_stages=...)``; 1 is the plain loop). Chosen by
# ``scripts/bench_scan.py --device cuda --sweep`` beside mamba-ssm 2.3.2.post1 in the same run,
# float32 forward+backward at MambaIR's training shape (batch 4, 1440 channels, L 2304). On an H100
# (driver 580.159.04, torch 2.11.0+cu130, triton 3.6.0) the forward: 8,4,1,1 was the fastest at a
# 250x250 tile of batch 1 (validation, test.py) among the eight-position chunks, 6.02 ms against
# 8,8,2,1's 7.93 (mamba-ssm 3.59). On an H200 (same versions, 2026-11-27) the backward: four
# channels and one warp per program took 0.80 ms where eight channels and two warps took 1.41 (the
# same registers and warps per SM by the static report; likely cause, not measured: with one warp
# the sums of dB and dC over a program's channels need no exchange between warps through shared
# memory), so forward+backward 1.28 ms against mamba-ssm's 2.61 (0.49; 8,4,1,1,8,2,1 0.70, the
# former defaults 16,4,2,1,4,2,1 0.98). Sixteen-position backwards take over 200 registers with
# Triton 3.6 (8 warps per SM); eight-position ones about 165 (12). archs/README.md has the sweeps
# (``--sweep`` takes CHUNK,FWD_BLOCK_D,FWD_WARPS,FWD_STAGES,BWD_BLOCK_D,BWD_WARPS,BWD_STAGES).
FORWARD_BLOCK_D = 4
BACKWARD_BLOCK_D = 4
FORWARD_WARPS = 1
BACKWARD_WARPS = 1
FORWARD_STAGES = 1
BACKWARD_STAGES = 1
#: The launch settings above, in the order ``bench_scan.py --sweep`` and
#: ``scan_static_report.py --sweep`` take them.
LAUNCH_SETTINGS = ('CHUNK', 'FORWARD_BLOCK_D', 'FORWARD_WARPS', 'FORWARD_STAGES', 'BACKWARD_BLOCK_D',
                   'BACKWARD_WARPS', 'BACKWARD_STAGES')
# A forward without a backward whose grid has fewer programs than SPLIT_BELOW_PROGRAMS (a 250x250
# validation tile of batch 1: 360 programs of one warp, a few per SM, each walking 62,500 positions)
# is split along the sequence into segments of at least SPLIT_MIN_CHUNKS chunks, about SPLIT_PROGRAMS
# programs in all; the split reads u, delta and B twice (archs/README.md has its figures).
SPLIT_BELOW_PROGRAMS = 1024
SPLIT_PROGRAMS = 4096
SPLIT_MIN_CHUNKS = 64
# CUDA's grid limit along its second axis (the channel blocks; the batch is the first axis).
MAX_GRID_Y = 65535


def check_launch_settings(values: Dict[str, int]) -> None:
    """Refuse a name that is not one of :data:`LAUNCH_SETTINGS` or a value that is not an integer >= 1."""
    for name, value in values.items():
        if name not in LAUNCH_SETTINGS:
            raise ValueError(f'unknown Triton scan launch setting {name!r}; expected one of '
                             f'{", ".join(LAUNCH_SETTINGS)}')
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f'Triton scan launch setting {name}: expected an integer >= 1, got {value!r}')


@contextlib.contextmanager
def launch_settings(**values: int) -> Iterator[None]:
    """Run the block with some of :data:`LAUNCH_SETTINGS` changed (for the GPU sweep and the static
    report; every launch reads them at the call), restoring them afterwards. An unknown name or a
    value that is not an integer >= 1 is refused (:func:`check_launch_settings`)."""
    check_launch_settings(values)
    module = globals()
    saved = {name: module[name] for name in values}
    module.update(values)
    try:
        yield
    finally:
        module.update(saved)


def parse_launch_settings(text: str) -> Dict[str, int]:
    """``'16,4,2,1,4,2,1'`` -> every one of :data:`LAUNCH_SETTINGS`, in their order (the format of
    ``bench_scan.py --sweep`` and ``scan_static_report.py --sweep``); a malformed text or a value
    below 1 is refused with the expected format."""
    fields = text.split(',')
    if len(fields) != len(LAUNCH_SETTINGS) or not all(f.strip().isdigit() for f in fields):
        raise ValueError(f'{text!r}: expected {len(LAUNCH_SETTINGS)} integers {",".join(LAUNCH_SETTINGS)}')
    values = dict(zip(LAUNCH_SETTINGS, map(int, fields)))
    try:
        check_launch_settings(values)   # refuses a value < 1
    except ValueError as err:
        raise ValueError(f'{text!r}: {err}') from None
    return values


def _power_of_2_at_least(n: int) -> int:
    """The smallest power of two >= n (n >= 1), in plain Python: ``triton.next_power_of_2`` is a
    JIT-wrapped function since Triton 3.6 and costs microseconds a call on the launch path."""
    return 1 << (n - 1).bit_length()


class _Layout:
    """Shapes, grouping and launch grid shared by the two kernels: a function of integers only
    (:func:`_layout` keeps them, so a call with the shapes of an earlier one builds none)."""

    def __init__(self, batch: int, dim: int, length: int, dstate: int, b_groups: Optional[int],
                 c_groups: Optional[int], chunk: int, block_d: int):
        self.batch, self.dim, self.length, self.dstate = batch, dim, length, dstate
        groups = 1
        for g in (b_groups, c_groups):  # the finest grouping: every program's channels share one B and C slice
            if g is not None:
                groups = groups * g // math.gcd(groups, g)
        self.group_size = dim // groups
        self.b_chans = dim // b_groups if b_groups is not None else self.group_size
        self.c_chans = dim // c_groups if c_groups is not None else self.group_size
        if chunk < 1 or chunk & (chunk - 1):
            raise ValueError(f'the Triton scan needs a power-of-two chunk length, got {chunk}')
        self.chunk = chunk
        self.n_chunks = -(-length // chunk)
        self.block_d = min(_power_of_2_at_least(max(1, int(block_d))), _power_of_2_at_least(self.group_size))
        self.block_n = _power_of_2_at_least(dstate)
        self.blocks_per_group = -(-self.group_size // self.block_d)
        self.grid = (batch, groups * self.blocks_per_group)
        if self.grid[1] > MAX_GRID_Y:
            raise InputError(f'the Triton selective scan cannot take u of shape {(batch, dim, length)} '
                             f'(batch, dim, L): {self.grid[1]} channel blocks pass CUDA\'s grid '
                             f'limit of {MAX_GRID_Y}. Use scan_backend: torch.')

    def args(self, B: torch.Tensor, C: torch.Tensor, flag: bool, x_dim: int, height: int) -> Tuple[int, ...]:
        """The kernels' integer arguments after their tensors (every one but the last is in
        ``do_not_specialize``: they depend on the input's shape)."""
        return (self.dim, self.length, self.n_chunks, self.group_size, self.blocks_per_group,
                self.b_chans, self.c_chans, *_bc_strides(B), *_bc_strides(C), int(flag), x_dim, height,
                self.dstate)


@functools.lru_cache(maxsize=256)
def _cached_layout(*key) -> _Layout:
    return _Layout(*key)


def _layout(u: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk: int,
            block_d: int) -> _Layout:
    """The layout of these inputs (B, C as :func:`grouped_view` gives them), built once per shape."""
    batch, dim, length = u.shape
    return _cached_layout(batch, dim, length, A.shape[1], B.shape[1] if B.dim() == 4 else None,
                          C.shape[1] if C.dim() == 4 else None, chunk, block_d)


def _bc_strides(m: torch.Tensor) -> Tuple[int, int, int]:
    """(batch, group, state) strides of a varying (b, G, n, L) B or C; zeros for a constant one."""
    return (m.stride(0), m.stride(1), m.stride(2)) if m.dim() == 4 else (0, 0, 0)


@dataclass
class KernelLaunch:
    """One kernel launch, complete: ``kernel[grid](*args, num_warps=num_warps, **options,
    **constexprs)``. ``traffic``: the tensors it reads or writes, each once (None: absent), for
    the static report's bytes moved."""
    name: str
    kernel: Any
    grid: Tuple[int, ...]
    args: Tuple[Any, ...]
    constexprs: Dict[str, Any]
    num_warps: int
    options: Dict[str, Any] = field(default_factory=dict)
    traffic: Tuple[Optional[torch.Tensor], ...] = ()

    def __post_init__(self) -> None:
        self.options = {**COMPILE_OPTIONS, **self.options}

    def run(self) -> None:
        device = self.args[0].device
        # (CPU tensors run under TRITON_INTERPRET=1, with no device to select)
        with torch.cuda.device(device) if device.type == 'cuda' else contextlib.nullcontext():
            self.kernel[self.grid](*self.args, num_warps=self.num_warps, **self.options,
                                   **self.constexprs)


@dataclass
class ScanLaunch:
    """A direction's launch that writes the outputs, the launches it needs first (``before``: a
    split forward's pass over the segments), the tensors it writes (``outputs``) and the shapes the
    caller needs afterwards (``layout``)."""
    launch: KernelLaunch
    outputs: Dict[str, Optional[torch.Tensor]]
    layout: _Layout
    before: Tuple[KernelLaunch, ...] = ()

    def run(self) -> Dict[str, Optional[torch.Tensor]]:
        for launch in self.before:
            launch.run()
        self.launch.run()
        return self.outputs


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a copy when its data does not start on a 16-byte boundary: Triton specialises
    pointers on that alignment, so a view at an odd offset would compile a second variant."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _sequence(t: torch.Tensor) -> torch.Tensor:
    """A (b, d, L) input as the kernels read it: contiguous and 16-byte aligned."""
    return _aligned(t.contiguous())


def _bc(m: torch.Tensor) -> torch.Tensor:
    """A B or C as the kernels read it: (d, n) contiguous, or (b, G, n, L) (a (b, n, L) one as
    G = 1) with contiguous positions and any other strides (MambaIR's are views of one
    projection, read in place); 16-byte aligned."""
    m = grouped_view(m)
    if m.dim() == 2 or m.stride(3) != 1:
        m = m.contiguous()
    return _aligned(m)


def _prepare(u, delta, A, B, C, D, z, delta_bias, softplus, chunk, block_d, stages, height):
    """The inputs in the kernels' argument order, the flags they are compiled for, and the
    layout (``chunk`` None: :data:`CHUNK`, read at the call, as the kernel's own settings are).
    ``height`` (None: a plain scan): SS2D's four directions of a (height, L / height) image x = u
    in one launch (:func:`check_four_way`)."""
    B, C = _bc(B), _bc(C)
    if height is not None:
        check_four_way(u, delta, B, C, z, height)
    lay = _layout(delta, A, B, C, CHUNK if chunk is None else chunk, block_d)
    u, delta = _sequence(u), _sequence(delta)
    z = None if z is None else _sequence(z)
    A32, D32, bias32 = _float(A), _float(D), _float(delta_bias)
    inputs = (u, delta, A32, B, C, _or(D32, A32), _or(z, u), _or(bias32, A32))
    flags = dict(VAR_B=B.dim() == 4, VAR_C=C.dim() == 4, HAS_D=D is not None, HAS_Z=z is not None,
                 HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(softplus), BLOCK_D=lay.block_d,
                 BLOCK_N=lay.block_n, T=lay.chunk, STAGES=stages, FOUR_WAY=height is not None)
    return inputs, flags, lay


#: The scan directions of SS2D that one four-way launch runs (B and C have one group per direction).
DIRECTIONS = 4


def check_four_way(x: torch.Tensor, delta: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   z: Optional[torch.Tensor], height: int) -> None:
    """The shapes a four-way launch takes: x (b, d, L) with L a multiple of ``height``; delta
    (b, 4 d, L), direction k's channels ``k d .. k d + d - 1``; B and C (b, 4, n, L); no z. Every
    sequence in row-major order of the (height, L / height) image (the kernels read each
    direction's order by index)."""
    batch, dim, length = x.shape
    if height < 1 or length % height:
        raise ValueError(f'the four-way scan needs a height dividing L={length}; got {height}')
    if delta.shape != (batch, DIRECTIONS * dim, length):
        raise ValueError(f'the four-way scan needs delta of shape {(batch, DIRECTIONS * dim, length)} '
                         f'for x {tuple(x.shape)}; got {tuple(delta.shape)}')
    for name, m in (('B', B), ('C', C)):
        if m.dim() != 4 or m.shape[:2] != (batch, DIRECTIONS) or m.shape[3] != length:
            raise ValueError(f'the four-way scan needs {name} of shape ({batch}, {DIRECTIONS}, n, {length}); '
                             f'got {tuple(m.shape)}')
    if z is not None:
        raise ValueError('the four-way scan takes no z')


def forward_launch(u, delta, A, B, C, D, z, delta_bias, softplus: bool, save_states: bool = True,
                   chunk: Optional[int] = None, block_d: Optional[int] = None,
                   out_dtype: Optional[torch.dtype] = None, height: Optional[int] = None,
                   segments: Optional[int] = None) -> ScanLaunch:
    """The forward's launch for these inputs (shapes and dtypes as
    :func:`archs.scan.triton_function.selective_scan_triton`). Outputs: ``out`` (``out_dtype``,
    None: u's; the kernel rounds its float32 result once, to that dtype, as it stores it),
    ``last`` (float32 last state) and, when ``save_states``, ``states`` (the float32 state
    entering each chunk, (b, d, chunks, n), kept for the backward; else None).

    This is the one description of the launch: :class:`SelectiveScanTriton` runs it, and
    ``scripts/scan_static_report.py`` compiles it for GPUs it does not have, by calling this
    with tensors on the ``meta`` device (shapes and dtypes only). So it must do nothing but
    prepare inputs, allocate outputs and describe the launch; it must never read tensor values.

    ``height``: SS2D's four directions (:func:`check_four_way`); ``out`` is then the float32 sum
    of the four directions' outputs, (b, d, L) in row-major order, whatever ``out_dtype``.

    Without ``save_states`` a grid too small for the GPU runs split along the sequence
    (:func:`segment_chunks`; ``segments`` overrides the choice): two launches, ``before`` the
    segments' summaries, then the outputs (the kernel's ``SPLIT``)."""
    inputs, flags, lay = _prepare(u, delta, A, B, C, D, z, delta_bias, softplus, chunk,
                                  FORWARD_BLOCK_D if block_d is None else block_d, FORWARD_STAGES, height)
    u = inputs[0]
    out = (u.new_zeros(u.shape, dtype=torch.float32) if height is not None
           else torch.empty_like(u, dtype=out_dtype))
    last = u.new_empty(lay.batch, lay.dim, lay.dstate, dtype=torch.float32)
    states = (u.new_empty(lay.batch, lay.dim, lay.n_chunks, lay.dstate, dtype=torch.float32)
              if save_states else None)
    seg_chunks = lay.n_chunks if save_states else segment_chunks(lay, segments)
    n_segments = -(-lay.n_chunks // seg_chunks)
    seg_states = seg_dsum = last   # (unread unless split)
    if n_segments > 1:
        seg_states = u.new_empty(lay.batch, lay.dim, n_segments, lay.dstate, dtype=torch.float32)
        seg_dsum = u.new_empty(lay.batch, lay.dim, n_segments, dtype=torch.float32)
    args = (*inputs, out, _or(states, last), last, seg_states, seg_dsum,
            *lay.args(inputs[3], inputs[4], save_states, u.shape[1], height or 1), seg_chunks)
    grid = (*lay.grid, n_segments)
    traffic = (u, inputs[1], *_varying(inputs[3:5]), _or_none(z, inputs[6]), out, states, last)
    if n_segments == 1:
        return ScanLaunch(KernelLaunch('forward', _scan_forward_kernel, grid, args, dict(flags, SPLIT=0),
                                       FORWARD_WARPS, traffic=traffic), dict(out=out, last=last, states=states), lay)
    summaries = KernelLaunch('forward segments', _scan_forward_kernel, grid, args, dict(flags, SPLIT=1),
                             FORWARD_WARPS, traffic=(u, inputs[1], *_varying(inputs[3:4]), seg_states, seg_dsum))
    return ScanLaunch(KernelLaunch('forward', _scan_forward_kernel, grid, args, dict(flags, SPLIT=2), FORWARD_WARPS,
                                   traffic=traffic + (seg_states, seg_dsum)),
                      dict(out=out, last=last, states=states), lay, before=(summaries,))


def segment_chunks(lay: _Layout, segments: Optional[int] = None) -> int:
    """Chunks per segment of a forward without a backward (:func:`forward_launch`): the whole
    sequence (one segment) when the grid has :data:`SPLIT_BELOW_PROGRAMS` programs or more, else
    enough segments of at least :data:`SPLIT_MIN_CHUNKS` chunks to bring it near
    :data:`SPLIT_PROGRAMS` programs (``segments``: that many instead, for tests and benchmarks)."""
    programs = lay.grid[0] * lay.grid[1]
    if segments is None:
        segments = (1 if programs >= SPLIT_BELOW_PROGRAMS else
                    min(-(-SPLIT_PROGRAMS // programs), lay.n_chunks // SPLIT_MIN_CHUNKS))
    return -(-lay.n_chunks // max(1, min(int(segments), lay.n_chunks)))


def backward_launch(u, delta, A, B, C, D, z, delta_bias, states: torch.Tensor, dout: torch.Tensor,
                    dlast: Optional[torch.Tensor], softplus: bool, chunk: Optional[int] = None,
                    block_d: Optional[int] = None, height: Optional[int] = None) -> ScanLaunch:
    """The backward's launch (same contract as :func:`forward_launch`): the forward's inputs,
    its chunk ``states``, the output gradient ``dout`` and the last state's gradient ``dlast``
    (None: not needed). Outputs: ``du``, ``ddelta``, ``dz`` (or None) in the inputs' dtypes;
    float32 ``dB``/``dC`` ((b, G, n, L) sums over channels for a varying one, zeroed first and
    added to with atomics; (b, d, n) sums over positions for a constant one), ``dA`` (b, d, n),
    ``dD`` and ``dbias`` (b, d) (or None): per-batch sums the caller adds up. ``height``: SS2D's
    four directions, as :func:`forward_launch`; ``dout`` is the gradient of their row-major sum
    and ``du`` x's float32 gradient, the four directions' added up."""
    inputs, flags, lay = _prepare(u, delta, A, B, C, D, z, delta_bias, softplus, chunk,
                                  BACKWARD_BLOCK_D if block_d is None else block_d, BACKWARD_STAGES, height)
    u, delta, B, C = inputs[0], inputs[1], inputs[3], inputs[4]
    dout = _sequence(dout)
    dlast = None if dlast is None else _aligned(dlast.float().contiguous())
    du = u.new_zeros(u.shape, dtype=torch.float32) if height is not None else torch.empty_like(u)
    ddelta = torch.empty_like(delta)
    dz = None if z is None else torch.empty_like(inputs[6])
    f32 = dict(dtype=torch.float32)
    per_batch = (lay.batch, lay.dim, lay.dstate)
    dB = u.new_zeros(*B.shape, **f32) if B.dim() == 4 else u.new_empty(*per_batch, **f32)
    dC = u.new_zeros(*C.shape, **f32) if C.dim() == 4 else u.new_empty(*per_batch, **f32)
    dA = u.new_empty(*per_batch, **f32)
    dD = None if D is None else u.new_empty(lay.batch, lay.dim, **f32)
    dbias = None if delta_bias is None else u.new_empty(lay.batch, lay.dim, **f32)
    args = (*inputs, states, dout, _or(dlast, dA), du, ddelta, _or(dz, du), dB, dC, dA,
            _or(dD, dA), _or(dbias, dA), *lay.args(B, C, dlast is not None, u.shape[1], height or 1))
    traffic = (u, delta, *_varying((B, C)), _or_none(z, inputs[6]), states, dout, du, ddelta, dz,
               *_varying((dB, dC)))
    return ScanLaunch(KernelLaunch('backward', _scan_backward_kernel, lay.grid, args, flags,
                                   BACKWARD_WARPS, traffic=traffic),
                      dict(du=du, ddelta=ddelta, dz=dz, dB=dB, dC=dC, dA=dA, dD=dD, dbias=dbias), lay)


def _varying(ms) -> Tuple[Optional[torch.Tensor], ...]:
    """The varying (4-D) ones of B, C (or their gradients): the per-position traffic."""
    return tuple(m if m.dim() == 4 else None for m in ms)


def grouped_view(m: torch.Tensor) -> torch.Tensor:
    """(b, n, L) -> (b, 1, n, L) (a view); (d, n) and (b, G, n, L) unchanged."""
    return m.unsqueeze(1) if m.dim() == 3 else m


def _float(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else _aligned(t.float().contiguous())


def _or_none(flag: Optional[torch.Tensor], t: torch.Tensor) -> Optional[torch.Tensor]:
    """``t`` where the optional input ``flag`` is given, else None (a launch's traffic)."""
    return None if flag is None else t


def _or(t: Optional[torch.Tensor], fallback: torch.Tensor) -> torch.Tensor:
    """A real tensor for a pointer argument the kernel never touches (its flag is off); never an
    empty one, whose null data pointer Triton's launcher rejects on a GPU."""
    return fallback if t is None else t
