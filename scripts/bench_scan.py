"""Forward+backward time of our selective scan against a step-by-step loop, at MambaIR's shapes.

MambaIR's SS2D calls the scan once per block with u, delta of shape (batch, K*d_inner, H*W),
K=4 scan directions, grouped B, C of shape (batch, K, d_state, H*W), D and delta_bias of shape
(K*d_inner,) and delta_softplus=True. The classic SR config (embed_dim 180, mlp_ratio 2) has
d_inner 360 and d_state 16; a 48x48 LR training patch gives L=2304.

The loop baseline is a fair one: decays and inputs are precomputed in time-major contiguous
layout and unbound once (indexing a big tensor inside the loop would make its backward O(L^2)).

With ``--device cuda`` the scan backends run against each other on CUDA tensors: torch, triton
and mamba-ssm's kernel (those that import), each checked against the torch path (largest
absolute difference of the output and of every gradient) and timed with warm-up runs (Triton
compiles on its first call) and torch.cuda.synchronize() around every timed run.

    python scripts/bench_scan.py                 # classic x4 shapes, batch 4, 48x48
    python scripts/bench_scan.py --side 24 --threads 1
    python scripts/bench_scan.py --device cuda   # backends against each other on a GPU
"""
import argparse
import os
import resource
import statistics
import sys
import time
from typing import Callable, List, Tuple

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from archs.scan.dispatch import ScanKernelFailed, select_kernel, selective_scan  # noqa: E402

NAMES = ('u', 'delta', 'A', 'B', 'C', 'D', 'delta_bias')
LABELS = {'torch': 'torch', 'triton': 'triton', 'cuda': 'mamba-ssm'}


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
                 warmup: int = 0) -> List[float]:
    """Seconds for one forward and backward pass, ``repeats`` times after ``warmup`` untimed
    runs. On CUDA the clock stops only once the device has finished (kernels run asynchronously)."""
    cuda = on_cuda(inputs[0].device)
    times = []
    for i in range(warmup + repeats):
        for t in inputs:
            t.grad = None
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn(*inputs).sum().backward()
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


def compare_backends(args: argparse.Namespace, device: torch.device) -> None:
    """Every backend that can run on ``device`` against the torch path: error and time. Meant
    for CUDA tensors; the tests run it on CPU tensors with Triton's interpreter."""
    cuda = on_cuda(device)
    inputs = tuple(t.detach().to(device).requires_grad_()
                   for t in make_inputs(args.batch, args.d_inner, args.d_state, args.side))
    device_name = torch.cuda.get_device_name(device) if cuda else str(device)
    print(f'device: {device_name}; torch {torch.__version__}; shapes: u/delta '
          f'({args.batch}, {4 * args.d_inner}, {args.side ** 2}), B/C ({args.batch}, 4, {args.d_state}, '
          f'{args.side ** 2}); {args.warmup} warm-up run(s), {args.repeats} timed')
    reference = output_and_grads(backend_fn('torch'), inputs)
    medians = {}
    for name, missing in [('torch', '')] + available_backends(device):
        if missing:
            print(f'{LABELS[name]:10s} not run: {missing}')
            continue
        errors = ''
        if name != 'torch':
            first = time.perf_counter()
            try:
                ours = output_and_grads(backend_fn(name), inputs)
            except ScanKernelFailed as err:   # compiled or launched at its first call, and failed
                print(f'{LABELS[name]:10s} not run: {err}')
                continue
            if cuda:
                torch.cuda.synchronize()
            # Triton compiles (or loads from its cache, ~/.triton) at the first call: users wait this long once.
            print(f'{LABELS[name]:10s} first fwd+bwd call (compile or cache load included): '
                  f'{time.perf_counter() - first:.1f} s', flush=True)
            worst = [(o - r).abs().max().item() / max(r.abs().max().item(), 1e-30)
                     for o, r in zip(ours, reference)]
            errors = (f'; max |diff| / max |torch|: output {worst[0]:.1e}, grads ' +
                      ', '.join(f'{n} {e:.1e}' for n, e in zip(NAMES, worst[1:])))
        memory = ''
        if cuda:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        times = time_fwd_bwd(backend_fn(name), inputs, args.repeats, args.warmup)
        if cuda:
            extra = (torch.cuda.max_memory_allocated(device) - base) / 2 ** 20
            memory = f', peak memory {extra:.0f} MB above the inputs'
        medians[name] = statistics.median(times)
        print(f'{LABELS[name]:10s} fwd+bwd: median {medians[name] * 1e3:.2f} ms, '
              f'best {min(times) * 1e3:.2f} ms'
              f'{memory}{errors}', flush=True)
    for name in medians:
        if name != 'torch':
            print(f'speed-up of {LABELS[name]} over torch: {medians["torch"] / medians[name]:.1f}x (medians)')
    if not args.skip_loop:
        loop = time_fwd_bwd(loop_scan, inputs, 1, 1)[0]
        print(f'sequential loop fwd+bwd: {loop * 1e3:.1f} ms; '
              f'torch path {loop / medians["torch"]:.1f}x faster')


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--batch', type=int, default=4)
    parser.add_argument('--d-inner', type=int, default=360, help='embed_dim * mlp_ratio (classic: 180*2)')
    parser.add_argument('--d-state', type=int, default=16)
    parser.add_argument('--side', type=int, default=48, help='LR patch side; L = side**2')
    parser.add_argument('--repeats', type=int, default=3, help='runs of our scan (median and best shown)')
    parser.add_argument('--skip-loop', action='store_true', help='time our scan only')
    parser.add_argument('--threads', type=int, default=0, help='torch threads (0: leave default)')
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu',
                        help='cuda: the scan backends against each other on CUDA tensors')
    parser.add_argument('--warmup', type=int, default=2, help='untimed runs per backend first (cuda only)')
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == 'cuda':
        if not torch.cuda.is_available():
            sys.exit('bench_scan.py --device cuda: no CUDA device is available to torch '
                     f'{torch.__version__} (torch.cuda.is_available() is False)')
        compare_backends(args, torch.device('cuda'))
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
