#!/usr/bin/env python
"""FT step with the network's blocks compiled (``train.compile``) against the same step eager.

    python scripts/bench_compile.py --device cuda --amp bf16 --arch mambair hat safmn
    python scripts/bench_compile.py --arch safmn --backend aot_eager --patch 8 --batch 1   # a CPU smoke run

What decides ``archs.compile.COMPILE_BY_DEFAULT`` (an architecture enters when its compiled FT step
is faster). Per architecture (the paper's classic x4 configurations of ``bench_ldt.py``), two
copies of the network from one seed train on the same batches, one eager, one with
``compile_blocks``; which goes first alternates every batch, and the figure is the median of the
per-batch ratios compiled / eager, so drift of the machine cancels. Untimed first: each block's
eager first call and the compile (timed apart: ``first compiled step``, compile included). As a
check that the compiled step trains alike, both copies' L1 loss on the last batch in eval mode
(eager both) is printed: not equal (stochastic depth draws other random numbers compiled, inductor
rounds otherwise), but close. The last line per architecture is
``compile: arch=<a> FT eager <ms> ms | compiled <ms> ms | compiled/eager <r> | first compiled step
<s> s | graphs <n>``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_ldt  # noqa: E402  (puts the repository on the path, imports basicsr_ldt first)
import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

from archs.compile import compile_blocks  # noqa: E402
from basicsr_ldt.ldt import optimizer_step  # noqa: E402

ARCHS = ('mambair', 'hat', 'safmn', 'mambair_small')


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--arch', nargs='+', default=['safmn'], choices=ARCHS)
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--amp', default='none', choices=list(bench_ldt.AMP_DTYPES), help='autocast dtype, as train: amp')
    p.add_argument('--backend', default='inductor', help='train.compile_backend')
    p.add_argument('--patch', type=int, default=48, help='LR patch size')
    p.add_argument('--batch', type=int, default=4)
    p.add_argument('--scale', type=int, default=4)
    p.add_argument('--iters', type=int, default=10, help='timed batches (each both ways)')
    p.add_argument('--warm', type=int, default=3, help='untimed batches after the compile')
    return p.parse_args(argv)


def bench(args: argparse.Namespace, arch: str) -> Dict[str, float]:
    device = args.device
    nets, optimizers = {}, {}
    for kind in ('eager', 'compiled'):
        torch.manual_seed(0)
        nets[kind] = bench_ldt.build_network(arch, args.scale).to(device).train()
        optimizers[kind] = bench_ldt.adam(nets[kind].parameters(), 'finetune')
    blocks = compile_blocks(nets['compiled'], args.backend)
    amp = bench_ldt.precision(args)
    data = bench_ldt.batches(args, 2 + args.warm + args.iters, args.patch, args.batch, device)

    def step(kind: str, lq: torch.Tensor, gt: torch.Tensor) -> float:
        bench_ldt.sync(device)
        start = time.perf_counter()
        optimizer_step(nets[kind], optimizers[kind], bench_ldt.l1(lq, gt), amp, 'finetune')
        bench_ldt.sync(device)
        return time.perf_counter() - start

    graphs = counters['stats']['unique_graphs']
    for kind in ('eager', 'compiled'):
        step(kind, *data[0])                       # the blocks' eager first calls
    first = step('compiled', *data[1])              # the compile
    step('eager', *data[1])
    for lq, gt in data[2:2 + args.warm]:
        step('eager', lq, gt), step('compiled', lq, gt)
    times = {'eager': [], 'compiled': []}
    ratios = []
    for i, (lq, gt) in enumerate(data[2 + args.warm:]):
        order = ('eager', 'compiled') if i % 2 == 0 else ('compiled', 'eager')
        got = {kind: step(kind, lq, gt) for kind in order}
        for kind, seconds in got.items():
            times[kind].append(seconds)
        ratios.append(got['compiled'] / got['eager'])
    losses = {}
    with torch.no_grad(), amp.autocast():
        for kind, net in nets.items():
            net.eval()
            losses[kind] = float(bench_ldt.l1(*data[-1])(net))
            net.train()
    result = {'eager_ms': statistics.median(times['eager']) * 1e3,
              'compiled_ms': statistics.median(times['compiled']) * 1e3,
              'ratio': statistics.median(ratios), 'first_s': first,
              'graphs': counters['stats']['unique_graphs'] - graphs, 'blocks': blocks, **losses}
    print(f"{arch}: {blocks} blocks compiled with {args.backend}; L1 on the last batch after {len(data)} steps "
          f"each (eval): eager {losses['eager']:.5f}, compiled {losses['compiled']:.5f}")
    print(f"compile: arch={arch} FT eager {result['eager_ms']:.2f} ms | compiled {result['compiled_ms']:.2f} ms | "
          f"compiled/eager {result['ratio']:.3f} | first compiled step {first:.1f} s | graphs {result['graphs']}",
          flush=True)
    return result


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, float]]:
    args = parse_args(argv)
    where = torch.cuda.get_device_name(args.device) if bench_ldt.on_cuda(args.device) else \
        f'threads {torch.get_num_threads()}'
    print(f'bench_compile: device={args.device} amp={args.amp} backend={args.backend} LR patch {args.patch} batch '
          f'{args.batch} x{args.scale}, torch {torch.__version__}, {where}')
    return {arch: bench(args, arch) for arch in args.arch}


if __name__ == '__main__':
    main()
