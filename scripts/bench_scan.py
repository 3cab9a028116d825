"""Forward+backward time of our selective scan against a step-by-step loop, at MambaIR's shapes.

MambaIR's SS2D calls the scan once per block with u, delta of shape (batch, K*d_inner, H*W),
K=4 scan directions, grouped B, C of shape (batch, K, d_state, H*W), D and delta_bias of shape
(K*d_inner,) and delta_softplus=True. The classic SR config (embed_dim 180, mlp_ratio 2) has
d_inner 360 and d_state 16; a 48x48 LR training patch gives L=2304.

The loop baseline is a fair one: decays and inputs are precomputed in time-major contiguous
layout and unbound once (indexing a big tensor inside the loop would make its backward O(L^2)).

With ``--device cuda`` the scan backends run against each other on CUDA tensors: torch, triton
and mamba-ssm's kernel (those that import), at MambaIR's x4 training shape (batch 4, 48x48), then
a small MambaIR built on each backend (output and gradients against torch's), then a 250x250
validation tile (batch 1); each checked against a float64 sequential reference (largest
difference of the output and of every gradient; the output only for the tile) and timed with
warm-up runs (Triton compiles on its first call, timed apart) and torch.cuda.synchronize() around
every timed run (the torch scan once at the tile, where it takes seconds a call); the ratio
triton / mamba-ssm from the same run, and the GPU, driver, torch, triton and mamba-ssm versions
first. ``--sweep`` times the Triton scan at several launch configurations instead (each checked
against the float64 reference, beside mamba-ssm), at the training shape forward and backward,
then the forward alone at a 250x250 tile of batch 1 (``--sweep-tile``), the call validation and
test.py make.

    python scripts/bench_scan.py                 # classic x4 shapes, batch 4, 48x48
    python scripts/bench_scan.py --side 24 --threads 1
    python scripts/bench_scan.py --device cuda   # backends against each other on a GPU
    python scripts/bench_scan.py --device cuda --sweep 16,4,2,1,4,2,1 16,4,2,3,4,2,3
    python scripts/bench_scan.py --launch-overhead   # host time of describing the Triton launches

With ``--device cuda`` (and ``--sweep``) every compared quantity (the output and each gradient)
is held to a bound (FLOAT32_BOUND, NETWORK_BOUND, BF16_BOUND below): each one over its bound
prints a line starting ``FAIL:`` as it is found, the run ends with a ``reference check: PASS`` or
``FAIL`` summary, and a failure makes the exit status 1 (timings are printed either way).

``--launch-overhead`` needs no GPU: it times, on the host, what the Triton backend does per call
before Triton's own launcher (preparing the inputs, allocating the outputs, building the launch:
``triton_launches.forward_launch`` / ``backward_launch``) for MambaIR's bf16 call, on CPU tensors
of its channels and a short sequence (``--side`` 4: the work does not depend on the length, but a
large CPU allocation would be timed too; meta tensors cost several times more per operation). A
step of classic MambaIR makes 36 such calls, and on a GPU at batch 4 the step waits for its host
(docs/results.md).
"""
import argparse
import importlib
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from archs.scan.dispatch import ScanKernelFailed, select_kernel, selective_scan  # noqa: E402
from basicsr_ldt.common.flags import non_negative_int, positive_int  # noqa: E402

NAMES = ('u', 'delta', 'A', 'B', 'C', 'D', 'delta_bias')
#: What :func:`output_and_grads` returns, in its order, as the FAIL lines name it.
QUANTITIES = ('output',) + tuple(f'grad {n}' for n in NAMES)
LABELS = {'torch': 'torch', 'triton': 'triton', 'cuda': 'mamba-ssm'}
# (batch, LR side) of classic MambaIR x4 training: the defaults, and where issue #38 sets its goal
TRAINING_SHAPE = (4, 48)

# Bounds on each compared quantity's largest difference from its reference, relative to the
# reference's largest magnitude (:func:`relative_differences`); NaN is over every bound.
# A float32 scan against the float64 sequential loop differs by rounding accumulated along the
# sequence: every backend on an H100 and an H200 was within 1.7e-6 in the output and all gradients
# at the training shape (L 2304) and 1.7e-7 in the output at the 250x250 tile (archs/README.md); the
# torch and Triton scans under Triton's CPU interpreter are held to 1e-5 in tests/test_scan_triton.py.
# 1e-4 leaves about 60x for other GPUs and shapes, while a wrong index, a lost carry between chunks or
# a race is off by 1e-2 or more. Every backend and every swept launch configuration is held to it.
FLOAT32_BOUND = 1e-4
# A small MambaIR on one backend against the same network on the torch backend (not float64): the
# scan's float32 rounding goes through two blocks' norms, projections and convolutions and their
# backward. Measured on an H200: mamba-ssm 4.9e-5, Triton 4.7e-6 (output and 66 gradients); the
# interpreter's Triton is held to 1e-4 (output) and 1e-3 (gradients) in tests/test_scan_triton.py.
NETWORK_BOUND = 1e-3
# MambaIR's bf16-autocast call (bf16 u, delta, B, C; float32 output) on Triton against the same call on
# float32 copies (itself held to FLOAT32_BOUND above): the gradients of u, delta, B and C are bf16, whose
# step is 2**-8 to 2**-7 (3.9e-3 to 7.8e-3) of a value, two roundings of one value can be a step apart, and
# B's and C's are summed by atomics in an order that changes between runs. Measured on an H200: 1.8e-3,
# as far as the copies' call is from itself run again; under the interpreter one step in u's and delta's.
# 2e-2 is 2.5 to 5 bf16 steps of the largest value; a kernel reading bf16 wrongly is off by far more.
BF16_BOUND = 2e-2


class ReferenceCheck:
    """Every quantity this run compares, against its bound: a ``FAIL:`` line for each one over it,
    printed when found (a run stopped at a time limit keeps them), and the summary that ends ``main``."""

    def __init__(self) -> None:
        self.checked = 0
        self.failures: List[str] = []

    def check(self, label: str, names: Sequence[str], differences: Sequence[float], bound: float,
              reference: str) -> bool:
        """``differences`` (:func:`relative_differences`, one per name) against ``bound``; False when any is over."""
        within = True
        for name, value in zip(names, differences):
            self.checked += 1
            if not value <= bound:          # NaN included
                within = False
                self.failures.append(f'{label} {name} {value:.1e}')
                print(f'FAIL: {label} {name}: max |diff| / max |{reference}| {value:.1e} > bound {bound:.0e}',
                      flush=True)
        return within

    def finish(self) -> int:
        """Print the summary (when anything was compared); the exit status: 1 when any quantity failed."""
        if not self.checked:
            return 0
        if not self.failures:
            print(f'reference check: PASS ({self.checked} quantities within their bounds: float32 scans '
                  f'{FLOAT32_BOUND:.0e} of float64, networks {NETWORK_BOUND:.0e} of the torch backend, bf16 calls '
                  f'{BF16_BOUND:.0e} of float32 copies)', flush=True)
            return 0
        print(f'reference check: FAIL ({len(self.failures)} of {self.checked} quantities over their bounds: '
              f'{"; ".join(self.failures)})', flush=True)
        return 1


#: The checks of this run (``main`` starts a fresh one).
CHECK = ReferenceCheck()


def loop_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
              D: torch.Tensor, delta_bias: torch.Tensor) -> torch.Tensor:
    """Sequential reference: one recurrence step per token, autograd through every step."""
    batch, dim, length = u.shape
    groups, dstate = B.shape[1], A.shape[1]
    delta = F.softplus(delta + delta_bias[:, None])
    dl = delta.permute(2, 0, 1).reshape(length, batch, groups, dim // groups, 1)
    ul = u.permute(2, 0, 1).reshape(length, batch, groups, dim // groups, 1)
    Bl = B.permute(3, 0, 1, 2).unsqueeze(3)  # (L, b, G, 1, n)
    Cl = C.permute(3, 0, 1, 2).unsqueeze(3)
    decay = torch.exp(dl * A.view(1, 1, groups, dim // groups, dstate))
    inputs = dl * ul * Bl
    state = u.new_zeros(batch, groups, dim // groups, dstate)
    ys = []
    for a_t, x_t, c_t in zip(decay.unbind(0), inputs.unbind(0), Cl.unbind(0)):
        state = a_t * state + x_t
        ys.append((state * c_t).sum(-1))
    y = torch.stack(ys, dim=-1).reshape(batch, dim, length)
    return y + u * D[:, None]


def make_inputs(batch: int, d_inner: int, d_state: int, side: int, seed: int = 0) -> Tuple[torch.Tensor, ...]:
    """Random tensors with MambaIR's shapes and value ranges (A = -[1..d_state], S4D-real init)."""
    gen = torch.Generator().manual_seed(seed)
    k, length = 4, side * side
    u = torch.randn(batch, k * d_inner, length, generator=gen)
    delta = torch.randn(batch, k * d_inner, length, generator=gen) * 0.5
    A = -torch.arange(1, d_state + 1, dtype=torch.float32).repeat(k * d_inner, 1)
    B = torch.randn(batch, k, d_state, length, generator=gen)
    C = torch.randn(batch, k, d_state, length, generator=gen)
    D = torch.ones(k * d_inner)
    delta_bias = torch.rand(k * d_inner, generator=gen) * 4 - 6  # softplus -> dt in [0.0025, 0.13]
    return tuple(t.requires_grad_() for t in (u, delta, A, B, C, D, delta_bias))


def on_cuda(device: torch.device) -> bool:
    """Whether the CUDA clock (synchronize) and memory counters are used: one place for every
    CUDA-only branch of this script, so a test can run them with CPU tensors."""
    return device.type == 'cuda'


def time_fwd_bwd(fn: Callable[..., torch.Tensor], inputs: Tuple[torch.Tensor, ...], repeats: int,
                 warmup: int = 0, backward: bool = True) -> List[float]:
    """Seconds for one forward and backward pass (the forward alone, as training runs it, when not
    ``backward``), ``repeats`` times after ``warmup`` untimed runs. On CUDA the clock stops only
    once the device has finished (kernels run asynchronously)."""
    cuda = on_cuda(inputs[0].device)
    times = []
    for i in range(warmup + repeats):
        for t in inputs:
            t.grad = None
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn(*inputs).sum()
        if backward:
            out.backward()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def backend_fn(backend: str) -> Callable[..., torch.Tensor]:
    """MambaIR's call of the scan, on one backend."""
    return lambda u, dl, A, B, C, D, db: selective_scan(u, dl, A, B, C, D, None, db, True, backend=backend)


def output_and_grads(fn: Callable[..., torch.Tensor], inputs: Tuple[torch.Tensor, ...]) -> List[torch.Tensor]:
    """The output and the gradients of every input for a fixed random output gradient."""
    for t in inputs:
        t.grad = None
    out = fn(*inputs)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
    (out * weight).sum().backward()
    return [out.detach()] + [t.grad.detach().clone() for t in inputs]


def available_backends(device: torch.device) -> List[Tuple[str, str]]:
    """(backend, why not) for triton and cuda (mamba-ssm); why-not is '' when it can run here."""
    found = []
    for name in ('triton', 'cuda'):
        try:
            select_kernel(name, device)
            found.append((name, ''))
        except (ImportError, ValueError) as err:
            found.append((name, str(err).split('. ')[0]))
    return found


# Longest sequence whose float64 reference runs forward and backward (autograd through every
# step keeps a few (b, d, n) float64 tensors per position); longer ones check the output only.
REFERENCE_GRAD_LENGTH = 4096


def float64_reference(inputs: Tuple[torch.Tensor, ...], with_grads: bool) -> List[Optional[torch.Tensor]]:
    """Output (and, when ``with_grads``, every gradient for the same output weights as
    :func:`output_and_grads`) of the sequential loop in float64: mamba's selective_scan_ref
    semantics, written here, not one of the backends."""
    copies = tuple(t.detach().double().requires_grad_(with_grads) for t in inputs)
    with torch.set_grad_enabled(with_grads):
        out = loop_scan(*copies)
        if not with_grads:
            return [out] + [None] * len(inputs)
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
        (out * weight).sum().backward()
    return [out.detach()] + [t.grad for t in copies]


def relative_differences(values: Sequence[torch.Tensor],
                         reference: Sequence[Optional[torch.Tensor]]) -> List[float]:
    """For each value beside a reference (None: skipped), its largest difference from it relative
    to the reference's largest magnitude, computed in the reference's dtype."""
    return [(v.to(r.dtype) - r).abs().max().item() / max(r.abs().max().item(), 1e-30)
            for v, r in zip(values, reference) if r is not None]


def versions(device: torch.device) -> str:
    """GPU, driver, torch, triton and mamba-ssm versions (what every figure is measured with)."""
    parts = [f'torch {torch.__version__}']
    if on_cuda(device) and torch.cuda.is_available():
        parts.insert(0, f'{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}')
        try:
            smi = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
                                 capture_output=True, text=True, timeout=20)
            parts.insert(1, f'driver {smi.stdout.strip().splitlines()[0]}')
        except (OSError, subprocess.SubprocessError, IndexError):
            parts.insert(1, 'driver unknown')
    for package in ('triton', 'mamba_ssm'):
        try:
            parts.append(f'{package} {importlib.import_module(package).__version__}')
        except ImportError:
            parts.append(f'{package} not installed')
    return '; '.join(parts)


def compare_backends(args: argparse.Namespace, device: torch.device) -> Dict[str, float]:
    """Every backend that can run on ``device``: its largest difference from the float64
    reference (output and gradients; the output only for sequences longer than
    :data:`REFERENCE_GRAD_LENGTH`) and its forward+backward time; ratios from this one run.
    Meant for CUDA tensors; the tests run it on CPU tensors with Triton's interpreter. Returns
    the median times by backend."""
    cuda = on_cuda(device)
    inputs = tuple(t.detach().to(device).requires_grad_()
                   for t in make_inputs(args.batch, args.d_inner, args.d_state, args.side))
    device_name = torch.cuda.get_device_name(device) if cuda else str(device)
    length = args.side ** 2
    print(f'device: {device_name}; torch {torch.__version__}; shapes: u/delta '
          f'({args.batch}, {4 * args.d_inner}, {length}), B/C ({args.batch}, 4, {args.d_state}, '
          f'{length}); {args.warmup} warm-up run(s), {args.repeats} timed', flush=True)
    reference = None
    if getattr(args, 'reference', True):
        start = time.perf_counter()
        reference = float64_reference(inputs, length <= REFERENCE_GRAD_LENGTH)
        print(f'float64 reference (sequential loop{"" if length <= REFERENCE_GRAD_LENGTH else ", output only"}): '
              f'{time.perf_counter() - start:.1f} s', flush=True)
    medians: Dict[str, float] = {}
    for name, missing in [('torch', '')] + available_backends(device):
        if missing:
            print(f'{LABELS[name]:10s} not run: {missing}')
            continue
        first = time.perf_counter()
        try:
            ours = output_and_grads(backend_fn(name), inputs)
        except ScanKernelFailed as err:   # compiled or launched at its first call, and failed
            print(f'{LABELS[name]:10s} not run: {err}')
            continue
        if name != 'torch':
            if cuda:
                torch.cuda.synchronize()
            # Triton compiles (or loads from its cache, ~/.triton) at the first call: users wait this long once.
            print(f'{LABELS[name]:10s} first fwd+bwd call (compile or cache load included): '
                  f'{time.perf_counter() - first:.1f} s', flush=True)
        memory = ''
        if cuda:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        # The torch scan at a validation tile takes seconds a call: timed once, so that the GPU check's
        # step ends inside its limit (it is the slow baseline, not a goal).
        long_torch = name == 'torch' and length > REFERENCE_GRAD_LENGTH
        times = time_fwd_bwd(backend_fn(name), inputs, 1 if long_torch else args.repeats,
                             0 if long_torch else args.warmup)
        if cuda:
            extra = (torch.cuda.max_memory_allocated(device) - base) / 2 ** 20
            memory = f', peak memory {extra:.0f} MB above the inputs'
        medians[name] = statistics.median(times)
        print(f'{LABELS[name]:10s} fwd+bwd: median {medians[name] * 1e3:.2f} ms, best {min(times) * 1e3:.2f} ms'
              f'{" (one timed run)" if long_torch else ""}{memory}', flush=True)
        if reference is not None:
            worst = relative_differences(ours, reference)
            print(f'{"":10s} max |diff| / max |float64 reference|: output {worst[0]:.1e}' +
                  (', grads ' + ', '.join(f'{n} {e:.1e}' for n, e in zip(NAMES, worst[1:])) if len(worst) > 1 else ''))
            CHECK.check(f'{LABELS[name]} at batch {args.batch}, L {length}', QUANTITIES, worst, FLOAT32_BOUND,
                        'float64 reference')
    for name in medians:
        if name != 'torch':
            print(f'speed-up of {LABELS[name]} over torch: {medians["torch"] / medians[name]:.1f}x (medians)')
    if 'triton' in medians and 'cuda' in medians:
        goal = '; goal <= 1.0' if (args.batch, args.side) == TRAINING_SHAPE else ''   # issue #38's goal is there
        print(f'triton / mamba-ssm fwd+bwd: {medians["triton"] / medians["cuda"]:.2f} (medians, this run{goal})')
    if not args.skip_loop:
        loop = time_fwd_bwd(loop_scan, inputs, 1, 1)[0]
        print(f'sequential loop fwd+bwd: {loop * 1e3:.1f} ms; '
              f'torch path {loop / medians["torch"]:.1f}x faster')
    return medians


def parse_sweep(configs: Sequence[str]) -> List[Dict[str, int]]:
    """``['16,4,2,1,4,2,1', ...]`` -> one dict of launch settings per configuration
    (:func:`archs.scan.triton_launches.parse_launch_settings`); checked before any GPU work."""
    from archs.scan.triton_launches import parse_launch_settings
    try:
        return [parse_launch_settings(config) for config in configs]
    except ValueError as err:
        raise ValueError(f'--sweep {err}') from None


def sweep_triton(args: argparse.Namespace, device: torch.device, configs: List[str]) -> None:
    """The Triton scan at several launch configurations (:func:`parse_sweep`), to pick the defaults
    of archs/scan/triton_launches.py on a GPU. At the shape of ``args`` (training): for each, the
    first call (its compile), the largest difference from the float64 reference (a configuration
    over :data:`FLOAT32_BOUND` is marked wrong, never chosen, and fails the run), the forward alone and forward+
    backward (medians; the backward as their difference), and the ratio to mamba-ssm's kernel timed
    in the same run when it imports; then the fastest correct forward and backward settings for
    each chunk length (the two kernels' settings are independent but for the chunk). Then, unless
    ``args.sweep_tile`` is 0, the forward alone at a validation tile (batch 1, that side), as
    validation and test.py run it: a batch of one gives the forward a quarter of the training
    call's programs, so its best settings may differ."""
    settings = parse_sweep(configs)
    results = _sweep_at(args, device, settings, args.batch, args.side, backward=True, prefix='sweep')
    for chunk in sorted({v['CHUNK'] for v, ok, *_ in results if ok}):
        fwd = min((r for r in results if r[1] and r[0]['CHUNK'] == chunk), key=lambda r: r[2])
        bwd = min((r for r in results if r[1] and r[0]['CHUNK'] == chunk), key=lambda r: r[3])
        best = {k: v for k, v in fwd[0].items() if k.startswith(('CHUNK', 'FORWARD'))}
        best.update({k: v for k, v in bwd[0].items() if k.startswith('BACKWARD')})
        print(f'fastest correct at chunk {chunk}: forward {fwd[2] * 1e3:.3f} ms, backward {bwd[3] * 1e3:.3f} ms '
              f'(measured in different configurations; time the combination before choosing it): '
              + ','.join(map(str, best.values())), flush=True)
    if args.sweep_tile:
        tile = _sweep_at(args, device, settings, 1, args.sweep_tile, backward=False, prefix='sweep tile')
        correct = [r for r in tile if r[1]]
        if correct:
            fastest = min(correct, key=lambda r: r[2])
            print(f'fastest correct forward at the tile: {fastest[2] * 1e3:.3f} ms: '
                  + ','.join(map(str, fastest[0].values())), flush=True)


def _sweep_at(args: argparse.Namespace, device: torch.device, settings: List[Dict[str, int]], batch: int,
              side: int, backward: bool, prefix: str) -> List[Tuple[Dict[str, int], bool, float, float]]:
    """Each configuration at one shape: (settings, within the tolerance, forward median, backward
    median (0 without ``backward``: the forward alone, no gradients, the output checked)), printed
    one line each after mamba-ssm's line when it imports."""
    from archs.scan.triton_launches import launch_settings
    inputs = tuple(t.detach().to(device).requires_grad_(backward)
                   for t in make_inputs(batch, args.d_inner, args.d_state, side))
    length = side ** 2
    reference = float64_reference(inputs, backward and length <= REFERENCE_GRAD_LENGTH)
    print(f'{prefix} at u/delta ({batch}, {4 * args.d_inner}, {length}), d_state {args.d_state}, '
          f'{"forward and backward" if backward else "forward alone"}; {args.warmup} warm-up run(s), '
          f'{args.repeats} timed; settings {",".join(settings[0])}', flush=True)

    def measure(backend: str, label: str) -> Tuple[bool, float, float, float]:
        """(within FLOAT32_BOUND in every quantity, the largest difference, forward median, fwd+bwd median)."""
        if backward:
            ours = output_and_grads(backend_fn(backend), inputs)
        else:
            with torch.no_grad():
                ours = [backend_fn(backend)(*inputs)]
        differences = relative_differences(ours, reference)
        within = CHECK.check(f'{prefix} {label}', QUANTITIES, differences, FLOAT32_BOUND, 'float64 reference')
        forward = statistics.median(time_fwd_bwd(backend_fn(backend), inputs, args.repeats, args.warmup,
                                                 backward=False))
        both = statistics.median(time_fwd_bwd(backend_fn(backend), inputs, args.repeats, args.warmup)) \
            if backward else forward
        return within, max(differences), forward, both

    anchor = None
    if dict(available_backends(device)).get('cuda') == '':
        _, worst, forward, both = measure('cuda', 'mamba-ssm')
        anchor = both
        print(f'{prefix} mamba-ssm: ' + (f'fwd+bwd median {both * 1e3:.3f} ms (forward {forward * 1e3:.3f} ms)'
                                        if backward else f'forward median {forward * 1e3:.3f} ms')
              + f', max rel diff {worst:.1e}', flush=True)
    results = []
    for values in settings:
        label = ','.join(map(str, values.values()))
        with launch_settings(**values):
            start = time.perf_counter()
            try:
                time_fwd_bwd(backend_fn('triton'), inputs, 0, 1, backward=backward)
            except ScanKernelFailed as err:
                print(f'{prefix} {label}: failed: {err}', flush=True)
                continue
            first = time.perf_counter() - start
            ok, worst, forward, both = measure('triton', label)
        results.append((values, ok, forward, both - forward))
        ratio = f', triton/mamba-ssm {both / anchor:.2f}' if anchor else ''
        timing = (f'fwd+bwd median {both * 1e3:.3f} ms (forward {forward * 1e3:.3f} ms, backward '
                  f'{(both - forward) * 1e3:.3f} ms)' if backward else f'forward median {forward * 1e3:.3f} ms')
        print(f'{prefix} {label}: {timing}, max rel diff {worst:.1e}{"" if ok else " WRONG"}{ratio} '
              f'(first call {first:.1f} s)', flush=True)
    return results


def compare_mambair(device: torch.device, backends: Sequence[str] = ('torch', 'triton', 'cuda'),
                    embed_dim: int = 60, d_state: int = 16, size: Tuple[int, int] = (24, 20),
                    blocks: int = 2) -> None:
    """A small MambaIR (two blocks; by default d_state 16, 60 channels, 24x20) built once per scan backend from the same seed:
    its output and every parameter's gradient on each backend against the torch backend's
    (largest difference relative to the largest torch value). The first time the ``cuda``
    backend runs inside the network."""
    import archs
    x = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(2)).to(device)
    results = {}
    for backend in backends:
        torch.manual_seed(0)
        net = archs.MambaIR(upscale=2, img_size=max(size), embed_dim=embed_dim, depths=[blocks], d_state=d_state, mlp_ratio=1.5,
                            upsampler='pixelshuffle', scan_backend=backend).to(device)
        try:
            out = net(x)
        except (ImportError, ValueError, ScanKernelFailed) as err:
            print(f'MambaIR {LABELS[backend]:10s} not run: {str(err).splitlines()[0][:200]}')
            continue
        out.square().mean().backward()
        results[backend] = [out.detach()] + [p.grad.detach().clone() for p in net.parameters() if p.grad is not None]
        names = ['output'] + [f'grad {n}' for n, p in net.named_parameters() if p.grad is not None]
    if 'torch' not in results:
        return
    ref = results['torch']
    for backend, values in results.items():
        if backend == 'torch':
            continue
        diffs = relative_differences(values, ref)
        worst, out_diff = max(diffs), diffs[0]
        print(f'MambaIR scan_backend {LABELS[backend]} vs torch: output {out_diff:.1e}, '
              f'largest over {len(values) - 1} parameter gradients {worst:.1e} (relative to the largest torch value)')
        CHECK.check(f'MambaIR scan_backend {LABELS[backend]} vs torch', names, diffs, NETWORK_BOUND, 'torch backend')


def compare_four_way(device: torch.device, d_model: int = 60, d_state: int = 16,
                     sizes: Sequence[Tuple[int, int]] = ((24, 20), (7, 33), (1, 40))) -> None:
    """SS2D's four directions inside the Triton kernels (``SS2D._scan_in_kernels``) against the
    direction copies on the torch scan in float64 (``SS2D._scan_direction_copies``): the sum's output
    and the gradients of x and the scan's parameters, per image size (odd, unequal, one pixel high),
    each held to :data:`FLOAT32_BOUND`."""
    import copy
    import archs.mambair_arch as mambair_arch
    torch.manual_seed(0)
    block = mambair_arch.SS2D(d_model=d_model, d_state=d_state, scan_backend='triton').to(device)
    with torch.no_grad():   # off their init, so that the directions differ
        for p in (block.A_logs, block.Ds, block.dt_projs_bias):
            p.add_(0.3 * torch.randn_like(p))
    reference = copy.deepcopy(block).double()
    reference.scan_backend = 'torch'
    reference.directions_in_kernels = False
    names = ('x', 'x_proj_weight', 'dt_projs_weight', 'dt_projs_bias', 'A_logs', 'Ds')

    def output_and_grads_of(module, x, weight):
        x = x.detach().requires_grad_(True)
        y = module.forward_core(x)
        params = dict(module.named_parameters())
        grads = torch.autograd.grad((y.double() * weight).sum(), [x] + [params[n] for n in names[1:]])
        return [y.detach()] + list(grads)

    scan = mambair_arch.selective_scan
    for h, w in sizes:
        x = torch.randn(2, block.d_inner, h, w, generator=torch.Generator().manual_seed(h * w)).to(device)
        weight = torch.randn(2, block.d_inner, h * w, generator=torch.Generator().manual_seed(1)).to(device, torch.float64)
        got = output_and_grads_of(block, x, weight)
        # the copy path asks its scan for a float32 output: the float64 reference keeps float64
        mambair_arch.selective_scan = lambda *a, out_dtype=None, **k: scan(*a, **k)
        try:
            ref = output_and_grads_of(reference, x.double(), weight)
        finally:
            mambair_arch.selective_scan = scan
        diffs = relative_differences(got, ref)
        print(f'four-way Triton scan vs float64 direction copies, {h}x{w}: output {diffs[0]:.1e}, largest gradient '
              f'{max(diffs[1:]):.1e}', flush=True)
        CHECK.check(f'four-way scan {h}x{w}', ('output',) + tuple(f'grad {n}' for n in names), diffs, FLOAT32_BOUND,
                    'float64 reference')


def compare_bf16_call(args: argparse.Namespace, device: torch.device) -> Optional[float]:
    """MambaIR's call under bf16 autocast, at the training shape: u, delta, B, C in bf16 and a float32
    output. On the Triton scan the kernels read the bf16 tensors as they are; upstream (and the
    torch and mamba-ssm kernels, through the dispatch) casts them to float32 copies first. Prints
    how far the Triton call is from the call on float32 copies (output and the gradients of A, B,
    C, D and delta_bias, relative to the largest value; u's and delta's bf16 gradients as the
    elements that differ and by how many bf16 steps), beside how far the copies' call is from itself run again: on a GPU dB
    and dC are summed with atomic adds in an order that changes from run to run, and the kernel
    that reads bf16 is compiled apart from the one that reads float32, so neither call is bit-exact
    there (under Triton's CPU interpreter both are). Then the forward+backward times, casts
    included, with mamba-ssm's in the same run. Returns Triton / mamba-ssm (None without mamba-ssm)."""
    half = {0, 1, 3, 4}   # u, delta, B, C
    inputs = tuple(t.detach().to(device, torch.bfloat16 if i in half else torch.float32).requires_grad_()
                   for i, t in enumerate(make_inputs(args.batch, args.d_inner, args.d_state, args.side)))

    def direct(u, dl, A, B, C, D, db):
        return selective_scan(u, dl, A, B, C, D, None, db, True, backend='triton', out_dtype=torch.float32)

    def copies(backend: str) -> Callable[..., torch.Tensor]:
        return lambda u, dl, A, B, C, D, db: selective_scan(u.float(), dl.float(), A, B.float(), C.float(), D,
                                                            None, db, True, backend=backend)
    try:
        ours, theirs, again = (output_and_grads(fn, inputs) for fn in (direct, copies('triton'), copies('triton')))
    except ScanKernelFailed as err:
        print(f'bf16 call: not run: {err}')
        return None
    full = [i for i in range(len(ours)) if i not in (1, 2)]   # output and the gradients of A, B, C, D, delta_bias

    def apart(values: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> str:
        worst = max(relative_differences([values[i] for i in full], [reference[i] for i in full]))
        return 'bit-equal' if worst == 0 else f'within {worst:.1e}'
    differing, steps = 0, 0.0
    for a, b in zip(ours[1:3], theirs[1:3]):
        differing += int((a != b).sum())
        _, exponent = torch.frexp(b.float())               # |b| = m * 2**e, m in [0.5, 1): a bf16 step is 2**(e - 8)
        steps = max(steps, ((a.float() - b.float()).abs() / torch.ldexp(torch.ones_like(b, dtype=torch.float32),
                                                                          exponent - 8)).max().item())
    print(f'MambaIR bf16 call (bf16 u, delta, B, C; float32 output), Triton against float32 copies: output and '
          f'the other gradients {apart(ours, theirs)} (the copies\' call against itself: {apart(again, theirs)}); '
          f'u and delta gradients: {differing} of {ours[1].numel() + ours[2].numel()} elements differ, '
          f'by at most {steps:.0f} bf16 step(s)', flush=True)
    CHECK.check('bf16 call triton vs float32 copies', QUANTITIES,
                relative_differences([t.float() for t in ours], [t.float() for t in theirs]), BF16_BOUND,
                'float32 copies\' call')
    rows = [('triton', direct)] + [(name, copies(name)) for name, missing in available_backends(device)
                                   if name == 'cuda' and not missing]
    medians = {}
    for name, fn in rows:
        times = time_fwd_bwd(fn, inputs, args.repeats, args.warmup)
        medians[name] = statistics.median(times)
        how = 'reads bf16' if name == 'triton' else 'float32 copies'
        print(f'{LABELS[name]:10s} bf16 call fwd+bwd ({how}, casts included): median {medians[name] * 1e3:.2f} ms, '
              f'best {min(times) * 1e3:.2f} ms', flush=True)
    if 'cuda' not in medians:
        return None
    ratio = medians['triton'] / medians['cuda']
    print(f'triton / mamba-ssm bf16 call fwd+bwd: {ratio:.2f} (medians, this run)')
    return ratio


def launch_overhead(args: argparse.Namespace, calls: int = 2000) -> Dict[str, float]:
    """Microseconds per call of describing the forward and the backward launch (inputs prepared,
    outputs allocated, launch built; no kernel runs) for MambaIR's bf16 call at these shapes, on
    CPU tensors, the median of five rounds of ``calls``."""
    from archs.scan import triton_launches

    def tensor(*size, dtype=torch.bfloat16):
        return torch.empty(*size, dtype=dtype)
    k, length = 4, args.side ** 2
    dim = k * args.d_inner
    u, delta = tensor(args.batch, dim, length), tensor(args.batch, dim, length)
    projection = tensor(args.batch, k, 2 * args.d_state + 12, length)
    B, C = projection[:, :, 12:12 + args.d_state], projection[:, :, 12 + args.d_state:]
    A, D, bias = (tensor(*size, dtype=torch.float32) for size in ((dim, args.d_state), (dim,), (dim,)))
    states = triton_launches.forward_launch(u, delta, A, B, C, D, None, bias, True,
                                            out_dtype=torch.float32).outputs['states']
    dout = tensor(args.batch, dim, length, dtype=torch.float32)
    launches = {
        'forward': lambda: triton_launches.forward_launch(u, delta, A, B, C, D, None, bias, True,
                                                          out_dtype=torch.float32),
        'backward': lambda: triton_launches.backward_launch(u, delta, A, B, C, D, None, bias, states, dout,
                                                            None, True)}
    result = {}
    for name, describe in launches.items():
        rounds = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                describe()
            rounds.append((time.perf_counter() - start) / calls * 1e6)
        result[name] = statistics.median(rounds)
    print(f'Triton launch descriptions on the host (MambaIR bf16 call, u ({args.batch}, {dim}, {length}); '
          f'torch {torch.__version__}, {torch.get_num_threads()} threads): forward {result["forward"]:.1f} us, '
          f'backward {result["backward"]:.1f} us per call (median of 5 x {calls}; Triton\'s own launcher not '
          f'included)')
    return result


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--batch', type=positive_int, default=4)
    parser.add_argument('--d-inner', type=positive_int, default=360, help='embed_dim * mlp_ratio (classic: 180*2)')
    parser.add_argument('--d-state', type=positive_int, default=16)
    parser.add_argument('--side', type=positive_int, default=48, help='LR patch side; L = side**2')
    parser.add_argument('--repeats', type=positive_int, default=3, help='runs of our scan (median and best shown)')
    parser.add_argument('--skip-loop', action='store_true', help='time our scan only')
    parser.add_argument('--threads', type=non_negative_int, default=0, help='torch threads (0: leave default)')
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu',
                        help='cuda: the scan backends against each other on CUDA tensors')
    parser.add_argument('--warmup', type=non_negative_int, default=2, help='untimed runs per backend first (cuda only)')
    parser.add_argument('--sweep-tile', type=int, default=250, metavar='SIDE',
                        help='with --sweep: then time the forward alone at a validation tile of this side, '
                             'batch 1 (0: skip)')
    parser.add_argument('--launch-overhead', action='store_true',
                        help='time the host side of the Triton launches instead (no GPU needed)')
    parser.add_argument('--sweep', nargs='+',
                        metavar='CHUNK,FWD_BLOCK_D,FWD_WARPS,FWD_STAGES,BWD_BLOCK_D,BWD_WARPS,BWD_STAGES',
                        help='cuda only: time the Triton scan at these launch configurations instead')
    args = parser.parse_args()
    if args.sweep:
        try:
            parse_sweep(args.sweep)
        except ValueError as err:
            parser.error(str(err))
    args.side_given = (args.batch, args.side) != TRAINING_SHAPE
    global CHECK
    CHECK = ReferenceCheck()
    if args.launch_overhead:
        launch_overhead(args)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == 'cuda':
        if not torch.cuda.is_available():
            sys.exit('bench_scan.py --device cuda: no CUDA device is available to torch '
                     f'{torch.__version__} (torch.cuda.is_available() is False)')
        device = torch.device('cuda')
        print(versions(device), flush=True)
        if args.sweep:
            sweep_triton(args, device, args.sweep)
        else:
            # MambaIR x4 training, the backends inside a small MambaIR, then a 250x250 validation tile
            # (the slowest part last, so that a step limit cuts the least).
            compare_backends(args, device)
            compare_mambair(device)
            compare_four_way(device)
            compare_bf16_call(args, device)
            if not args.side_given:
                compare_backends(argparse.Namespace(**dict(vars(args), batch=1, side=250)), device)
        if CHECK.finish():
            sys.exit(1)
        return
    inputs = make_inputs(args.batch, args.d_inner, args.d_state, args.side)
    rss_inputs = peak_rss_mb()
    ours = time_fwd_bwd(backend_fn('torch'), inputs, args.repeats)
    rss_ours = peak_rss_mb()
    print(f'shapes: u/delta ({args.batch}, {4 * args.d_inner}, {args.side ** 2}), B/C ({args.batch}, 4, '
          f'{args.d_state}, {args.side ** 2}); torch threads {torch.get_num_threads()}')
    print(f'our scan (torch)    fwd+bwd: median {statistics.median(ours):.3f} s, best {min(ours):.3f} s '
          f'({", ".join(f"{t:.3f}" for t in ours)})')
    print(f'peak RSS: {rss_inputs:.0f} MB after making inputs, {rss_ours:.0f} MB after our scan', flush=True)
    if args.skip_loop:
        return
    loop = time_fwd_bwd(loop_scan, inputs, 1)[0]
    print(f'sequential loop     fwd+bwd: {loop:.3f} s (peak RSS {peak_rss_mb():.0f} MB)')
    print(f'speed-up: {loop / statistics.median(ours):.1f}x (vs our median), '
          f'{loop / min(ours):.1f}x (vs our best)')


if __name__ == '__main__':
    main()
