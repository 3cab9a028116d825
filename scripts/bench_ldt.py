#!/usr/bin/env python
"""Cost of an LDT dual step against an ordinary fine-tuning step, and profiling memory vs N.

    python scripts/bench_ldt.py [--arch msrresnet] [--device cpu|cuda] [--amp none|bf16|fp16] [--iters 5]
    python scripts/bench_ldt.py --device cuda --arch mambair --amp bf16     # classic MambaIR x4, LR 48
    python scripts/bench_ldt.py --device cuda --arch hat --amp bf16 --no-profile-memory   # also safmn
    python scripts/bench_ldt.py --device cuda --arch mambair --amp bf16 --compare-scan triton cuda

The last line is the summary the results table takes, every figure a ratio to FT from this run:
``summary: arch=... FT <ms> ms | LDT/FT time <r> | LDT/FT memory <r> | LDT-S/FT time <r> | LDT-S/FT memory <r>``
(wall-clock times; goals LDT/FT <= 1.7 time and <= 1.05 memory, LDT-S/FT <= 1.05 time). LDT's dual
step is timed as LDT's defaults run it on the run's device (``ldt.overlap_branches: auto``,
``overlap_memory: 1.0``: on CUDA the branches overlap within the sequential step's peak, elsewhere
they run one after the other; a line before the figures says which). ``--overlap-branches`` adds the
other ways, each timed in the same iterations and measured alone: on CUDA
``| LDT sequential/FT time <r> | LDT sequential/FT memory <r>`` (one branch after the other), then
everywhere ``| LDT overlapped/FT ...`` (``ldt.overlap_branches: true``, no bound), and on CUDA
``| LDT bounded x<f>/FT ...`` for each ``ldt.overlap_memory`` factor of ``--overlap-memory`` (default 1.05).
``--cuda-graph`` adds FT and the dual step with forward and backward replayed as CUDA graphs
(``train.cuda_graph: true``: FT one graph, the dual step one per branch in one pool, and the dual step
with both branches side by side in one graph, a stream each: ``ldt.overlap_branches: true``,
``overlap_memory: null``), on copies compiled as the unreplayed ones, timed in the same iterations:
``| FT graphed/FT time <r> | LDT graphed/FT graphed time <r> | LDT graphed/FT graphed memory <r> |
LDT side by side/FT graphed time <r> | LDT side by side/FT graphed memory <r>`` (memory on CUDA: one
more step's peak plus what the graphs hold).

LDT-S (single network) is measured the same way against FT: step time including its EMA and its
swap amortised over ``--ldt-s-interval`` iterations, and peak memory (targets 1.10 and 1.05).

Time: FT and dual steps alternate in one process on the same batches (so machine load hits
both alike), reported as wall time and as process CPU time (steadier on a shared CPU); a dual step
is one call of both branches as ``LDT.update`` makes it (``CrossFrozenPair.step_both``: one loss
read after both backward passes), and its time includes the EMA exchange amortised over
``ema_every`` steps. On CUDA every timed region
starts and ends with ``torch.cuda.synchronize`` and ``--warm`` untimed steps of each kind run
first (kernel selection, autotuning, allocator growth). ``--amp`` runs forward and loss under
autocast exactly as ``train: amp`` does (fp16 with one GradScaler per optimizer).
Memory: on CUDA, torch.cuda.max_memory_allocated after a reset, per configuration, measured in
this process (``--in-process`` is implied); beside it, for FT and the dual steps, the peak of
torch.cuda.max_memory_reserved after emptying the cache (what the allocator took from the GPU, what
nvidia-smi shows besides the CUDA context; a stream per branch keeps its freed blocks for itself); on
CPU, each configuration runs in a fresh subprocess and reports the growth of the resident-set
high-water mark (/proc VmHWM, reset through /proc/self/clear_refs after imports, batch creation and
backend warm-up; getrusage ru_maxrss where that is unavailable) over the RSS at that point.
tracemalloc does not see torch's CPU allocations, so it is not used. On CPU with ``--in-process``
peak memory is not measured (one line says why; the summary shows n/a): memory the timed steps
freed stays resident in this process, so a later configuration grows the RSS by next to nothing.
The partition is a real variance partition (ratio_u 0.5) from a short profiling pass.

``--count-ops`` counts instead the aten operators of one FT, primary and auxiliary step, and the
dual/FT ratio they predict for a step bound by its kernel launches (on a GPU at a small batch).
On a CPU it counts what the same step dispatches on a GPU: convolutions whose weight is frozen
and bias trains stay fused (``basicsr_ldt.ldt.freezing`` splits them on CPUs only), and MambaIR's
scan runs the Triton backend's host code, each of its two kernel launches replaced by
zero-filling what the launch writes, uncounted (a Triton kernel is not an aten operator; the
CPU's torch scan would add hundreds of operators per call that a GPU never runs).
``--kernel-time`` (CUDA only) runs FT, primary and auxiliary steps under torch.profiler instead and
prints each one's GPU kernel time by kind (scan, convolution, matmul, optimizer, other) and dual/FT
by kind: where the dual step's cost above FT comes from, and the kinds freezing can shorten.
``--compare-scan A B`` (MambaIR only) times instead FT steps of two copies of the network (same
seed) whose selective scans run on backends A and B, alternating which goes first on every batch,
and prints ``FT step scan A / B: <median of the per-iteration ratios>``: a ratio close to 1 (the
goal Triton / mamba-ssm <= 1.05) is below the drift between two separate runs, which a per-batch
pairing cancels.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import basicsr_ldt  # noqa: E402,F401  (torchvision shim before basicsr)
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from archs.scan.dispatch import BACKENDS as SCAN_BACKENDS  # noqa: E402
from basicsr_ldt.common.flags import non_negative_int, positive_int  # noqa: E402
from basicsr_ldt.models.optimizers import adam_kwargs  # noqa: E402
from basicsr_ldt.models.ldt_model import LDTSRModel as LDT_MODEL  # noqa: E402  (what train.compile: auto does for it)
from basicsr_ldt.ldt import (AMP_DTYPES, LDT, GradientStatistics, LDTConfig, MixedPrecision,  # noqa: E402
                             optimizer_step, preset, resolve_dtype)
from basicsr_ldt.ldt.freezing import ROUTED_METHOD  # noqa: E402
from basicsr_ldt.ldt.pair import CrossFrozenPair  # noqa: E402
from basicsr_ldt.ldt.step_graph import EAGER_STEPS, BatchTerms, StepGraph, graphs_in_one_pool  # noqa: E402

#: MambaIR configurations: the released classic SR x4 one (the paper's network) and the small
#: CPU variant of options/train_mambair_ldt.yml.
MAMBAIR = {
    'mambair': dict(upscale=4, img_size=64, d_state=16, depths=(6,) * 6, embed_dim=180, mlp_ratio=2.,
                    upsampler='pixelshuffle', resi_connection='1conv'),
    'mambair_small': dict(upscale=4, img_size=64, d_state=8, depths=(2, 2), embed_dim=30, mlp_ratio=1.2,
                          upsampler='pixelshuffledirect', resi_connection='1conv'),
}
#: The paper's other networks in their released classic x4 configuration (basicsr_ldt.weights.releases).
CLASSIC = {'hat': 'HAT', 'safmn': 'SAFMN'}
ARCHS = ('msrresnet', 'edsr', 'rrdbnet') + tuple(MAMBAIR) + tuple(CLASSIC)


def build_network(arch: str, scale: int, scan_backend: Optional[str] = None) -> nn.Module:
    if arch == 'msrresnet':
        from basicsr.archs.srresnet_arch import MSRResNet
        return MSRResNet(upscale=scale)
    if arch == 'edsr':
        from basicsr.archs.edsr_arch import EDSR
        return EDSR(num_in_ch=3, num_out_ch=3, upscale=scale, num_block=16)
    if arch == 'rrdbnet':
        from basicsr.archs.rrdbnet_arch import RRDBNet
        return RRDBNet(3, 3, scale=scale, num_block=6)
    if arch in MAMBAIR:
        from archs.mambair_arch import MambaIR
        return MambaIR(**{**MAMBAIR[arch], 'upscale': scale}, scan_backend=scan_backend)
    if arch in CLASSIC:
        from basicsr.archs import build_network as build
        from basicsr_ldt.inference.api import network_options
        return build(network_options(arch=CLASSIC[arch], scale=scale))
    raise ValueError(f"unknown --arch '{arch}' ({', '.join(ARCHS)})")


def batches(args: argparse.Namespace, count: int, patch: int, batch: int, device: str) -> list:
    g = torch.Generator().manual_seed(0)
    return [(torch.rand(batch, 3, patch, patch, generator=g).to(device),
             torch.rand(batch, 3, patch * args.scale, patch * args.scale, generator=g).to(device))
            for _ in range(count)]


def _l1_terms(net: nn.Module, lq: torch.Tensor, gt: torch.Tensor) -> Dict[str, torch.Tensor]:
    return {'l_pix': (net(lq) - gt).abs().mean()}


def l1(lq: torch.Tensor, gt: torch.Tensor) -> BatchTerms:
    """The L1 batch loss, in the form a step graph can record (called on a network: the loss)."""
    return BatchTerms(_l1_terms, lq, gt)


# Adam's implementation: the project's default for the device (fused on CUDA, torch's loop over the
# tensors on the CPU); --count-ops sets foreach, so that the CPU counts the optimizer as a GPU's
# multi-tensor kernels (fused Adam would count as one operator per group).
ADAM_FOREACH: Optional[bool] = None
# How LDT runs its dual step unless told otherwise (ldt.overlap_branches, ldt.overlap_memory): the
# 'dual' figures and the summary's LDT/FT are that step's, on whatever device the run is on.
DEFAULT_SCHEDULE: Tuple[Union[bool, str], Optional[float]] = (LDTConfig().overlap_branches, LDTConfig().overlap_memory)


def adam(params, role):
    """Adam as the project's training builds it (fused on CUDA: basicsr_ldt.models.optimizers)."""
    params = list(params)
    options = {'lr': 1e-4} if ADAM_FOREACH is None else {'lr': 1e-4, 'foreach': ADAM_FOREACH}
    return torch.optim.Adam(params, **adam_kwargs(options, params))


def rss_bytes() -> int:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def reset_rss_peak() -> bool:
    """Reset the kernel's RSS high-water mark (VmHWM) so import-time peaks do not count."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False


def rss_peak_bytes() -> int:
    """VmHWM from /proc (resettable); getrusage's ru_maxrss when /proc is unavailable."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('VmHWM:'):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def precision(args: argparse.Namespace) -> MixedPrecision:
    """What ``train: amp`` gives a training run, for ``--amp``."""
    device_type = torch.device(args.device).type
    return MixedPrecision(resolve_dtype('--amp', args.amp, AMP_DTYPES, device_type), device_type)


def make_ldt(args, partition_file: str | None, device: str, graphs=None) -> LDT:
    torch.manual_seed(0)
    net = build_network(args.arch, args.scale).to(device)
    cfg = LDTConfig(profile_iters=0, partition_file=partition_file, ema_every=args.ema_every,
                    overlap_branches=args.overlap, overlap_memory=args.bound)
    algo = LDT(net, cfg, adam, precision(args), graphs=graphs)
    return algo


def branch_graphs(networks: Dict[str, nn.Module], side_by_side: bool = False) -> Dict[str, StepGraph]:
    """LDT's branch graphs as ``train.cuda_graph`` makes them, recorded by :data:`GRAPH_RECORDER`."""
    return graphs_in_one_pool(networks, GRAPH_RECORDER, side_by_side=side_by_side)


def graphed_steps(args: argparse.Namespace, partition_file: str) -> Dict[str, tuple]:
    """``--cuda-graph``: an FT network with its step graph and an LDT whose pair replays its branches
    (``train.cuda_graph: true``), built and compiled as the unreplayed ones: name -> (step on a batch,
    what its graphs hold in bytes, the graphs' recordings)."""
    torch.manual_seed(0)
    net = build_network(args.arch, args.scale).to(args.device)
    opt, amp = adam(list(net.parameters()), 'finetune'), precision(args)
    graph = StepGraph(net, recorder=GRAPH_RECORDER)
    compile_as_training(args, (net,))
    return {'FT graphed': (lambda lq, gt: optimizer_step(net, opt, l1(lq, gt), amp, 'finetune', graph=graph),
                           lambda: graph.held_bytes() or 0, lambda: [graph.recordings]),
            'dual graphed': graphed_dual_step(args, partition_file, *DEFAULT_SCHEDULE),
            'dual side by side': graphed_dual_step(args, partition_file, True, None)}


def graphed_dual_step(args: argparse.Namespace, partition_file: str, overlap: Union[bool, str],
                      bound: Optional[float]) -> tuple:
    """An LDT whose pair replays its branches under that ``ldt.overlap_branches`` and ``overlap_memory``
    (side by side in one graph when they overlap unbounded, else a graph each): (its dual step on a
    batch, what its graphs hold in bytes, each graph's recordings)."""
    algo = make_ldt(argparse.Namespace(**{**vars(args), 'overlap': overlap, 'bound': bound}),
                    partition_file, args.device, graphs=branch_graphs)
    algo.enter(1)   # builds the pair
    compile_as_training(args, (algo.primary, algo.auxiliary), auto_model=LDT_MODEL.compile_auto_untimed)
    pair = algo.pair
    graphs = pair_graphs(pair)
    return (lambda lq, gt: pair.step_both(l1(lq, gt), algo.precision),
            lambda: graphs[0].held_bytes() or 0,   # one pool: counted once
            lambda: [graph.recordings for graph in graphs])


def pair_graphs(pair: CrossFrozenPair) -> List[StepGraph]:
    """The pair's step graphs, each once (side by side, one graph is under both branches' names)."""
    return list({id(graph): graph for graph in pair.graphs.values()}.values())


def dynamo_graphs() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far (a recompile counts too)."""
    from torch._dynamo.utils import counters
    return counters['stats']['unique_graphs']


def compile_as_training(args: argparse.Namespace, networks: Sequence[nn.Module], auto_model: str = '') -> str:
    """Compile the networks' blocks as ``train.compile: --compile`` would on this device (the
    inductor backend) for a model type that ``auto`` leaves eager when ``auto_model`` names it;
    says what was done, for the log."""
    from archs.compile import compile_blocks
    from basicsr_ldt.models.compiled_blocks import CompileSetting, compile_decision
    setting = CompileSetting(args.compile, COMPILE_BACKEND)
    on, reason = compile_decision(setting, networks[0], torch.device(args.device).type, auto_model)
    if not on:
        return f'none ({reason})'
    return f'{sum(compile_blocks(net, COMPILE_BACKEND) for net in networks)} in {len(networks)} networks ({COMPILE_BACKEND})'


def on_cuda(device: str) -> bool:
    """Whether timing and memory use the CUDA clock and allocator counters (one place for every
    CUDA-only branch of this script, so a test can run them with CPU tensors)."""
    return device.startswith('cuda')


def sync(device: str) -> None:
    if on_cuda(device):
        torch.cuda.synchronize()


# -- workers (one configuration each; fresh process on CPU) --------------------------------------
def worker(args: argparse.Namespace) -> dict:
    device = args.device
    if args.worker == 'profile':
        data = batches(args, 2, args.profile_patch, args.profile_batch, device)
    else:
        data = batches(args, 2, args.patch, args.batch, device)
    warm = nn.Conv2d(3, 3, 3).to(device)   # lazy backend init (oneDNN, pools) is not ours
    warm(data[0][0][:1]).sum().backward()
    del warm
    base = rss_bytes()
    reset_rss_peak()
    if on_cuda(device):
        torch.cuda.empty_cache()    # what is reserved below, this configuration made the allocator take
        torch.cuda.reset_peak_memory_stats()
        base, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.manual_seed(0)
    amp = precision(args)
    if args.worker == 'ft':
        net = build_network(args.arch, args.scale).to(device)
        opt = adam(list(net.parameters()), 'finetune')
        for i in range(args.mem_iters):
            optimizer_step(net, opt, l1(*data[i % 2]), amp, 'finetune')
    elif args.worker == 'dual':
        algo = make_ldt(args, args.partition, device)
        for i in range(args.mem_iters):
            algo.update(l1(*data[i % 2]), i + 1)
        algo.pair.exchange()
    elif args.worker == 'ldt_s':
        # interval 1: both groups get optimizer state and every step swaps (the memory worst case)
        algo = make_ldt_s(args, args.partition, device, interval=1)
        for i in range(max(args.mem_iters, 2)):
            algo.update(l1(*data[i % 2]), i + 1)
    else:
        net = build_network(args.arch, args.scale).to(device)
        stats = GradientStatistics([n for n, _ in net.named_parameters()], device=device)
        for i in range(args.profile_samples):
            net.zero_grad(set_to_none=True)
            with amp.autocast():
                loss = l1(*data[i % 2])(net)
            if amp.backward_unscaled(loss, net.parameters(), 'profile'):
                stats.accumulate_module(net)
            net.zero_grad(set_to_none=True)
        stats.variance()
    sync(device)
    if on_cuda(device):
        return {'peak_bytes': torch.cuda.max_memory_allocated() - base,
                'reserved_bytes': torch.cuda.max_memory_reserved() - base_reserved}
    return {'peak_bytes': rss_peak_bytes() - base}


def memory_unmeasured(args: argparse.Namespace) -> Optional[str]:
    """Why this run cannot measure peak memory, or ``None`` when it can.

    On CPU a peak is the growth of the RSS high-water mark. In a process that already ran the
    timed steps, the memory they freed stays resident (the allocators keep it) and is reused, so
    a configuration's growth reads as next to nothing, and ratios of such figures are noise or a
    division by zero (what ``--in-process`` on CPU used to print or raise).
    """
    if args.in_process and not on_cuda(args.device):
        return ('peak memory: not measured (--in-process on CPU: memory the timed steps freed stays resident in '
                'this process and is reused, so the RSS high-water mark hardly grows; run without --in-process '
                'for a fresh process per configuration)')
    return None


def ratio_text(value: Optional[float]) -> str:
    return 'n/a' if value is None else f'{value:.3f}'


def peak_of(args: argparse.Namespace, kind: str, **extra) -> list:
    """Peak bytes of ``--mem-reps`` fresh runs (CPU RSS varies run to run with the allocator)."""
    return peaks_of(worker_runs(args, kind, **extra))


def peaks_of(runs: List[dict]) -> list:
    """The peak bytes of a configuration's runs, sorted (``mib`` prints median and range)."""
    return sorted(run['peak_bytes'] for run in runs)


def worker_runs(args: argparse.Namespace, kind: str, **extra) -> List[dict]:
    """What each of ``--mem-reps`` fresh runs of one memory configuration reports (one run in this process)."""
    return [run_worker(args, kind, **extra) for _ in range(1 if args.in_process else args.mem_reps)]


def mib(values: list) -> str:
    med = statistics.median(values) / 2**20
    return f'{med:.1f} MiB' + ('' if len(values) == 1 else
                               f' [{values[0] / 2**20:.0f}-{values[-1] / 2**20:.0f}]')


def run_worker(args: argparse.Namespace, kind: str, **extra) -> dict:
    """One memory configuration: in this process (``args.in_process``), else in a fresh one
    given the same options on its command line (``extra`` as ``--key value``; True as a bare flag,
    False and None left out, the child's defaults)."""
    if args.in_process:
        return worker(argparse.Namespace(**{**vars(args), 'worker': kind, **extra}))
    cmd = [sys.executable, os.path.abspath(__file__), '--worker', kind, '--arch', args.arch,
           '--device', args.device, '--patch', str(args.patch), '--batch', str(args.batch),
           '--scale', str(args.scale), '--mem-iters', str(args.mem_iters),
           '--profile-patch', str(args.profile_patch), '--profile-batch', str(args.profile_batch),
           '--ema-every', str(args.ema_every), '--amp', args.amp]
    for key, value in extra.items():
        flag = f"--{key.replace('_', '-')}"
        if key == 'overlap':     # ldt.overlap_branches: a value (true, false, 'auto'), not a flag
            cmd += [flag, str(value)]
        else:
            cmd += [flag] if value is True else [] if value is False or value is None else [flag, str(value)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# -- main ------------------------------------------------------------------------------------
def profile_partition(args: argparse.Namespace, path: str) -> LDT:
    """A short real profiling pass -> variance partition at ratio_u 0.5, saved to ``path``."""
    torch.manual_seed(0)
    net = build_network(args.arch, args.scale).to(args.device)
    cfg = LDTConfig(profile_iters=args.profile_passes, ratio_u=0.5, ema_every=args.ema_every)
    algo = LDT(net, cfg, adam, precision(args))
    data = batches(args, args.profile_passes, args.patch, args.batch, args.device)
    for i, (lq, gt) in enumerate(data):
        algo.update(l1(lq, gt), i + 1)
    algo.enter(args.profile_passes + 1)   # entering 'train' builds the partition and the pair
    algo.partition.save(path)
    return algo


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--arch', default='msrresnet', choices=ARCHS,
                   help='mambair = classic SR x4 (embed_dim 180, 6x6 blocks); mambair_small for CPU runs')
    p.add_argument('--device', choices=('cpu', 'cuda'), default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--amp', default='none', choices=list(AMP_DTYPES), help='autocast dtype, as train: amp')
    p.add_argument('--patch', type=positive_int, default=48, help='LR patch size')
    p.add_argument('--batch', type=positive_int, default=4)
    p.add_argument('--scale', type=positive_int, default=4)
    p.add_argument('--iters', type=positive_int, default=5, help='timed FT and dual steps each')
    p.add_argument('--warm', type=non_negative_int, default=None, help='untimed steps of each first (default 1 on CPU, 3 on CUDA)')
    p.add_argument('--ema-every', type=positive_int, default=10)
    p.add_argument('--profile-passes', type=positive_int, default=3, help='batches profiled for the partition')
    p.add_argument('--samples', type=positive_int, nargs='+', default=[10, 200], help='profiling sample counts')
    p.add_argument('--profile-patch', type=positive_int, default=12, help='LR patch for the profiling-memory runs')
    p.add_argument('--profile-batch', type=positive_int, default=1)
    p.add_argument('--mem-iters', type=positive_int, default=2, help='steps per memory run')
    p.add_argument('--mem-reps', type=positive_int, default=3, help='fresh runs per configuration (CPU)')
    p.add_argument('--ldt-s-interval', type=positive_int, default=100, help='LDT-S interval_iters (swap amortised over it)')
    p.add_argument('--ldt-s-only', action='store_true', help='measure only LDT-S against FT')
    p.add_argument('--no-profile-memory', action='store_true',
                   help='skip profiling peak memory against N (--samples); the step and memory ratios stay')
    p.add_argument('--in-process', action='store_true',
                   help='no subprocesses (always so on CUDA, where memory is measured in this process); on CPU '
                        'peak memory is then not measured: by default each CPU configuration runs in a fresh process')
    p.add_argument('--compare-scan', nargs=2, metavar=('A', 'B'), choices=SCAN_BACKENDS,
                   help='MambaIR only: FT steps with scan backend A against B, alternating per batch '
                        f'({", ".join(SCAN_BACKENDS)})')
    p.add_argument('--compile', choices=('auto', 'true', 'false'), default='auto',
                   help="FT and LDT dual steps with the networks' blocks compiled as train.compile does "
                        '(auto: FT on CUDA for the architectures in archs.compile.COMPILE_BY_DEFAULT, LDT eager)')
    p.add_argument('--compare-upstream', action='store_true',
                   help="FT steps as upstream runs them (MambaIR: mamba-ssm's scan on float32 direction copies; "
                        'foreach Adam; eager) against the defaults of this project, eager and compiled')
    p.add_argument('--check-graph', action='store_true',
                   help='FT steps replayed as a CUDA graph (train.cuda_graph) against the same steps eager, '
                        "with eager and with compiled blocks, and LDT's dual step compiled and side by side in one "
                        'graph: a FAIL line and exit status 1 where they differ')
    p.add_argument('--cuda-graph', action='store_true',
                   help='also FT and the dual step replayed as CUDA graphs (train.cuda_graph: true; the dual step a '
                        'graph per branch, and both branches side by side in one), timed in the same iterations: FT '
                        'graphed / FT, each replayed dual step / FT graphed (--warm is then at least '
                        f'{EAGER_STEPS + 1}: the graphs record after {EAGER_STEPS} eager steps)')
    p.add_argument('--count-ops', action='store_true',
                   help='count the aten operators of one FT, primary and auxiliary step instead of timing')
    p.add_argument('--kernel-time', action='store_true',
                   help='CUDA only: the GPU kernel time of FT, primary and auxiliary steps by kind of kernel '
                        '(torch.profiler), --iters steps each after --warm, instead of timing')
    p.add_argument('--overlap-branches', action='store_true',
                   help="also time and measure the dual step's other schedules beside the default: on CUDA the "
                        "branches one after the other, and the overlapped branches (the auxiliary's forward during "
                        "the primary's backward) without a memory bound")
    p.add_argument('--overlap-memory', type=float, nargs='+', default=[1.05], metavar='FACTOR',
                   help='with --overlap-branches on CUDA: also the overlapped dual step with each of these '
                        'ldt.overlap_memory values (default 1.05; the default step is bounded at 1.0)')
    p.add_argument('--bound', type=float, help=argparse.SUPPRESS)   # a memory worker's ldt.overlap_memory
    p.add_argument('--overlap', default=DEFAULT_SCHEDULE[0], type=lambda v: {'True': True, 'False': False}.get(v, v),
                   help=argparse.SUPPRESS)                          # a memory worker's ldt.overlap_branches
    p.add_argument('--worker', choices=['ft', 'dual', 'profile', 'ldt_s'], help=argparse.SUPPRESS)
    p.add_argument('--partition', help=argparse.SUPPRESS)
    p.add_argument('--profile-samples', type=int, default=10, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if torch.device(args.device).type == 'cuda' and not torch.cuda.is_available():
        p.error('--device cuda: no CUDA device is available')
    try:
        precision(args)
    except ValueError as err:
        p.error(str(err))
    bad = [factor for factor in args.overlap_memory if not factor >= 1.0]
    if bad:
        p.error(f'--overlap-memory: each ldt.overlap_memory is a multiple of the sequential peak, >= 1; got {bad[0]:g}')
    if args.compare_scan and args.arch not in MAMBAIR:
        p.error(f'--compare-scan: the selective scan is MambaIR\'s; expected --arch {" or ".join(MAMBAIR)}, '
                f'got {args.arch}')
    for flag, given in (('--check-graph', args.check_graph), ('--cuda-graph', args.cuda_graph)):
        if given and GRAPH_RECORDER is None and not on_cuda(args.device):
            p.error(f'{flag} records CUDA graphs; expected --device cuda, got {args.device}')
    if args.kernel_time and not on_cuda(args.device):
        p.error(f'--kernel-time sums the CUDA kernels a step runs; expected --device cuda, got {args.device}')
    if args.warm is None:
        args.warm = 3 if on_cuda(args.device) else 1
    if args.cuda_graph:   # the graphs record in the warm-up, after their eager steps
        args.warm = max(args.warm, EAGER_STEPS + 1)
    args.in_process = args.in_process or on_cuda(args.device)
    return args


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return

    global ADAM_FOREACH
    ADAM_FOREACH = True if args.count_ops else None
    device = args.device
    where = torch.cuda.get_device_name(device) if on_cuda(device) else f'threads {torch.get_num_threads()}'
    print(f'bench_ldt: arch={args.arch} device={device} amp={args.amp} LR patch {args.patch} batch {args.batch} '
          f'x{args.scale}, torch {torch.__version__}, {where}')
    if args.compare_scan:
        compare_scan(args)
        return
    if args.compare_upstream:
        compare_upstream(args)
        return
    if args.check_graph:
        if not check_graph(args):
            sys.exit(1)
        return
    as_on_gpu = args.count_ops and not on_cuda(device)
    if as_on_gpu:
        print('counted as a GPU dispatches the step: fused convolutions with a frozen weight'
              + (", the Triton scan's host code with its kernel launches replaced by uncounted zero-fills"
                 if args.arch in MAMBAIR else ''))
    with tempfile.TemporaryDirectory() as tmp:
        part_path = os.path.join(tmp, 'partition.json')
        algo = profile_partition(args, part_path)
        if args.ldt_s_only:
            bench_ldt_s(args, part_path)
            return
        n_u, n = len(algo.partition.unstable), len(algo.partition.names)
        split = sum(1 for m in algo.primary.modules() if ROUTED_METHOD in m.__dict__) + \
            sum(1 for m in algo.auxiliary.modules() if ROUTED_METHOD in m.__dict__)
        print(f'partition: {n_u}/{n} layers unstable (variance, ratio_u 0.5, {args.profile_passes} '
              f'profiled batches); convs with frozen weight + trainable bias (split bias): {split}')

        # time: alternate FT and dual steps on the same batches
        torch.manual_seed(0)
        ft_net = build_network(args.arch, args.scale).to(device)
        ft_opt = adam(list(ft_net.parameters()), 'finetune')
        ft_amp = precision(args)
        print(f'compiled blocks: FT {compile_as_training(args, (ft_net,))}; LDT '
              f"{compile_as_training(args, (algo.primary, algo.auxiliary), auto_model=LDT_MODEL.compile_auto_untimed)}")
        data = batches(args, args.warm + args.iters, args.patch, args.batch, device)
        summary = {}
        # one step of each kind on a batch (the counted and profiled steps are these)
        steps = {'FT': lambda lq, gt: optimizer_step(ft_net, ft_opt, l1(lq, gt), ft_amp, 'finetune'),
                 'primary': lambda lq, gt: algo.pair.step('primary', l1(lq, gt), algo.precision),
                 'auxiliary': lambda lq, gt: algo.pair.step('auxiliary', l1(lq, gt), algo.precision)}

        def dual_step(overlap: Union[bool, str], memory: Optional[float]) -> Callable[[torch.Tensor, torch.Tensor], object]:
            """Both branches in one call, as LDT.update runs them (one loss read after both backward passes)."""
            def step(lq: torch.Tensor, gt: torch.Tensor) -> object:
                algo.pair.overlap_branches, algo.pair.overlap_memory = overlap, memory
                return algo.pair.step_both(l1(lq, gt), algo.precision)
            return step
        algo.pair.overlap_branches, algo.pair.overlap_memory = DEFAULT_SCHEDULE
        print(f"dual step: as LDT's defaults run it here (ldt.overlap_branches '{DEFAULT_SCHEDULE[0]}', overlap_memory "
              f'{DEFAULT_SCHEDULE[1]:g}): {algo.pair.schedule()}')
        timed_steps = {'FT': steps['FT'], 'dual': dual_step(*DEFAULT_SCHEDULE)}
        variants = schedule_variants(args)
        for name, (_, overlap, bound) in variants.items():
            timed_steps[name] = dual_step(overlap, bound)
        graphed = graphed_steps(args, part_path) if args.cuda_graph else {}
        timed_steps.update((name, step) for name, (step, _, _) in graphed.items())
        wall = {name: [] for name in timed_steps}
        cpu = {name: [] for name in timed_steps}
        warm_up = dict.fromkeys(timed_steps, 0.)

        def timed(key: str, fn, keep: bool) -> None:
            sync(device); w0, c0 = time.perf_counter(), time.process_time()
            fn()
            sync(device)
            if keep:
                wall[key].append(time.perf_counter() - w0); cpu[key].append(time.process_time() - c0)
            else:
                warm_up[key] += time.perf_counter() - w0

        if args.kernel_time:
            for lq, gt in data[:args.warm]:
                for step in steps.values():
                    step(lq, gt)
            report_kernel_time({name: profile_kernels(step, data[args.warm:], device)
                                for name, step in steps.items()})
            return
        if args.count_ops:
            lq, gt = data[0]
            # (the partition above came from real profiling: only the counted steps are dispatched so)
            with dispatched_as_on_a_gpu() if as_on_gpu else contextlib.nullcontext():
                count_ops({name: functools.partial(step, lq, gt) for name, step in steps.items()})
            return
        graphs = [dynamo_graphs()]   # before, after the warm-up, after the timed steps
        for i, (lq, gt) in enumerate(data):
            keep = i >= args.warm
            if i == args.warm:
                graphs.append(dynamo_graphs())
            for name, step in timed_steps.items():
                timed(name, functools.partial(step, lq, gt), keep)
        graphs += [dynamo_graphs()] * (3 - len(graphs))
        print(f'{args.warm} warm-up steps (a compile falls there): '
              + ', '.join(f'{name} {seconds:.1f} s' for name, seconds in warm_up.items())
              + f'; graphs compiled: {graphs[1] - graphs[0]} in them, {graphs[2] - graphs[1]} in the timed steps')
        ema = []
        for _ in range(5):
            sync(device); t0 = time.perf_counter(); algo.pair.exchange(); sync(device)
            ema.append(time.perf_counter() - t0)
        ema_per_step = statistics.median(ema) / args.ema_every
        for label, t in (('wall', wall), ('process CPU', cpu)):
            dual_list = [d + ema_per_step for d in t['dual']]
            ratios = [d / f for d, f in zip(dual_list, t['FT'])]
            print(f'{label} time/iter (median of {args.iters}): FT {statistics.median(t["FT"]) * 1e3:.1f} ms'
                  f' | dual {statistics.median(dual_list) * 1e3:.1f} ms (both branches + EMA {ema_per_step * 1e3:.3f})')
            # FT and dual of one iteration run back to back: their ratio cancels slow load drift
            print(f'  step ratio dual/FT = {statistics.median(ratios):.3f} (median of per-iteration '
                  f'ratios {[round(r, 2) for r in ratios]}; target <= 1.7)')
            if label == 'wall':
                summary.update(ft_ms=statistics.median(t['FT']) * 1e3, time=statistics.median(ratios))
            for name, (text, _, _) in variants.items():
                overlapped = [o + ema_per_step for o in t[name]]
                ratios = [o / f for o, f in zip(overlapped, t['FT'])]
                print(f'  {text}: dual {statistics.median(overlapped) * 1e3:.1f} ms, step ratio '
                      f'dual/FT = {statistics.median(ratios):.3f} (per iteration {[round(r, 2) for r in ratios]})')
                if label == 'wall':
                    summary[f'{name}_time'] = statistics.median(ratios)
            if graphed:
                figures = report_graphed(t, ema_per_step, graphed)
                if label == 'wall':
                    summary.update(figures)
        if graphed:
            summary.update(graphed_memory(args, data[-1], graphed, steps['FT']))
        del algo, ft_net, ft_opt, graphed

        unmeasured = memory_unmeasured(args)
        if unmeasured is not None:
            print(unmeasured)
            summary['memory'] = None
        else:
            how = ('torch.cuda.max_memory_allocated' if on_cuda(device) else
                   'RSS high-water (VmHWM, reset via clear_refs; else ru_maxrss) growth over the RSS '
                   'before the model is built, fresh subprocess per configuration')
            runs = {'FT': worker_runs(args, 'ft'),
                    'dual': worker_runs(args, 'dual', partition=part_path, overlap=DEFAULT_SCHEDULE[0],
                                        bound=DEFAULT_SCHEDULE[1])}
            for name, (_, overlap, bound) in variants.items():
                runs[name] = worker_runs(args, 'dual', partition=part_path, overlap=overlap, bound=bound)
            peaks = {name: peaks_of(configuration) for name, configuration in runs.items()}
            m_ft = peaks['FT']
            print(f'peak memory ({how}; median [min-max] of {len(m_ft)} runs): FT {mib(m_ft)} | '
                  f"dual {mib(peaks['dual'])}")
            summary['memory'] = statistics.median(peaks['dual']) / statistics.median(m_ft)
            print(f"  memory ratio dual/FT = {summary['memory']:.3f}  (target <= 1.05)")
            for name, (text, _, _) in variants.items():
                summary[f'{name}_memory'] = statistics.median(peaks[name]) / statistics.median(m_ft)
                print(f"  {text}: dual {mib(peaks[name])}, memory ratio dual/FT = {summary[f'{name}_memory']:.3f}")
            if on_cuda(device):
                report_reserved(runs, variants)
            if not args.no_profile_memory:
                profiling_memory(args)
        summary.update(bench_ldt_s(args, part_path))
        print(f"summary: arch={args.arch} amp={args.amp} LR patch {args.patch} batch {args.batch}, {where}: FT "
              f"{summary['ft_ms']:.1f} ms | LDT/FT time {summary['time']:.3f} | LDT/FT memory "
              f"{ratio_text(summary['memory'])} | LDT-S/FT time {summary['ldt_s_time']:.3f} | LDT-S/FT memory "
              f"{ratio_text(summary['ldt_s_memory'])}"
              + ''.join(f" | LDT {name}/FT time {summary[f'{name}_time']:.3f} | LDT {name}/FT memory "
                        f"{ratio_text(summary.get(f'{name}_memory'))}" for name in variants)
              + (f" | FT graphed/FT time {summary['graphed_ft']:.3f} | LDT graphed/FT graphed time "
                 f"{summary['graphed_time']:.3f} | LDT graphed/FT graphed memory {ratio_text(summary['graphed_memory'])}"
                 f" | LDT side by side/FT graphed time {summary['side_time']:.3f} | LDT side by side/FT graphed memory "
                 f"{ratio_text(summary['side_memory'])}" if args.cuda_graph else ''))


def report_graphed(times: Dict[str, List[float]], ema_per_step: float, graphed: Dict[str, tuple]) -> Dict[str, float]:
    """``--cuda-graph``'s time line (wall or process CPU): the replayed FT step against FT, and each replayed
    dual step (a graph per branch; side by side) against the replayed FT step, per iteration (run back to
    back, as above)."""
    ft = times['FT graphed']
    figures = {'graphed_ft': statistics.median(g / f for g, f in zip(ft, times['FT']))}
    recorded = ', '.join(f"{name} {'/'.join(map(str, recordings()))}" for name, (_, _, recordings) in graphed.items())
    line = (f'  replayed as CUDA graphs (train.cuda_graph: true; recordings: {recorded}): FT '
            f"{statistics.median(ft) * 1e3:.1f} ms, FT graphed/FT = {figures['graphed_ft']:.3f}")
    for name, key in (('dual graphed', 'graphed_time'), ('dual side by side', 'side_time')):
        dual = [d + ema_per_step for d in times[name]]
        ratios = [d / f for d, f in zip(dual, ft)]
        figures[key] = statistics.median(ratios)
        line += (f' | {name} {statistics.median(dual) * 1e3:.1f} ms, step ratio {name}/FT graphed = '
                 f'{figures[key]:.3f} (per iteration {[round(r, 2) for r in ratios]})')
    print(line)
    return figures


def graphed_memory(args: argparse.Namespace, batch: Tuple[torch.Tensor, torch.Tensor], graphed: Dict[str, tuple],
                   ft_step: Callable) -> Dict[str, Optional[float]]:
    """``--cuda-graph`` on CUDA: one more step of each replayed dual step and of the replayed FT step, its
    peak allocated above what stays allocated plus what its graphs hold (a replay allocates nothing: its
    activations live in the graphs' pool); printed with the unreplayed FT step's. Returns each replayed
    dual step's / the replayed FT step's (None off CUDA)."""
    if not on_cuda(args.device):
        print('replayed steps\' memory: not measured (the graphs\' pool is a CUDA allocator\'s)')
        return {'graphed_memory': None, 'side_memory': None}
    peaks = {}
    for name, (step, held, _) in (('FT', (ft_step, lambda: 0, None)), *graphed.items()):
        sync(args.device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step(*batch)
        sync(args.device)
        peaks[name] = torch.cuda.max_memory_allocated() - base + held()
    print('replayed steps\' memory (one more step: peak allocated above what stays, plus what the graphs hold): '
          + ' | '.join(f'{name} {value / 2 ** 20:.1f} MiB' for name, value in peaks.items()))
    return {'graphed_memory': peaks['dual graphed'] / peaks['FT graphed'],
            'side_memory': peaks['dual side by side'] / peaks['FT graphed']}


def schedule_variants(args: argparse.Namespace) -> Dict[str, Tuple[str, Union[bool, str], Optional[float]]]:
    """With ``--overlap-branches``, the other ways of running the dual step measured beside the default
    ('auto' within x1 memory): name -> (label, ldt.overlap_branches, ldt.overlap_memory). The sequential
    step only where the default overlaps (CUDA), the bounds only where the allocator can be read."""
    variants: Dict[str, Tuple[str, Union[bool, str], Optional[float]]] = {}
    if not args.overlap_branches:
        return variants
    if on_cuda(args.device):
        variants['sequential'] = ('branches one after the other', False, None)
    variants['overlapped'] = ('overlapped branches', True, None)
    if on_cuda(args.device):    # the bound reads the GPU's allocator: nothing to bound elsewhere
        for factor in args.overlap_memory:
            variants[f'bounded x{factor:g}'] = (f'overlapped branches within x{factor:g} memory', True, factor)
    else:
        print('overlapped branches within a memory bound: CUDA only (ldt.overlap_memory reads the GPU\'s '
              'allocator), not measured')
    return variants


def report_reserved(runs: Dict[str, List[dict]],
                    variants: Dict[str, Tuple[str, Union[bool, str], Optional[float]]]) -> None:
    """The peak of what the caching allocator took from the GPU per configuration (nvidia-smi's figure
    less the CUDA context; the goals are on allocated memory): a stream per branch keeps the blocks it
    freed for itself, so the overlapped steps may hold more than they allocate."""
    reserved = {name: statistics.median(run['reserved_bytes'] for run in configuration)
                for name, configuration in runs.items()}
    labels = {'FT': 'FT', 'dual': 'dual', **{name: text for name, (text, _, _) in variants.items()}}
    print('  reserved (torch.cuda.max_memory_reserved after empty_cache; what the process holds on the GPU): '
          + ' | '.join(f'{labels[name]} {value / 2**20:.1f} MiB'
                       + ('' if name == 'FT' else f', ratio to FT {value / reserved["FT"]:.3f}')
                       for name, value in reserved.items()))


# Aten operators that launch no GPU kernel, besides views (their schema says so): tensors made
# without computing, a host read of a scalar, the profiler's markers, and ``_unsafe_view`` (a view
# that autograd does not track as one: what ``reshape`` returns after copying).
NO_KERNEL = frozenset({'detach', 'alias', 'lift_fresh', 'empty', 'empty_like', 'empty_strided', 'new_empty',
                       'new_empty_strided', '_local_scalar_dense', '_record_function_enter_new',
                       '_record_function_exit', '_unsafe_view'})


class OpCounter(TorchDispatchMode):
    """Counts the aten operators run inside it: all of them, and those that launch a kernel
    (none while :attr:`paused`)."""
    paused = False

    def __init__(self) -> None:
        super().__init__()
        self.all = self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not OpCounter.paused:
            self.all += 1
            self.kernels += not func.is_view and func.overloadpacket.__name__ not in NO_KERNEL
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def dispatched_as_on_a_gpu():
    """CPU steps that dispatch the aten operators a GPU step does: frozen-weight convolutions stay
    fused, and MambaIR's scans run the Triton backend's host code (``scan_backend`` triton), each
    kernel launch replaced by zero-filling the tensors it writes while :class:`OpCounter` is paused
    (the first-call check of each compiled variant runs too: count after one uncounted step).
    Everything patched is put back on exit, an exception included."""
    import archs.scan.dispatch as dispatch
    import archs.scan.triton_launches as launches
    from basicsr_ldt.ldt import freezing

    def zero_fill(launch):
        OpCounter.paused = True
        try:
            for t in launch.outputs.values():
                if t is not None:
                    t.zero_()
        finally:
            OpCounter.paused = False
        return launch.outputs

    saved = (dispatch._on_gpu, launches.ScanLaunch.run, freezing._on_gpu, os.environ.get(dispatch.BACKEND_ENV),
             set(dispatch._triton_checked))
    try:
        dispatch._on_gpu = freezing._on_gpu = lambda where: True
        launches.ScanLaunch.run = zero_fill
        os.environ[dispatch.BACKEND_ENV] = 'triton'
        yield
    finally:
        dispatch._on_gpu, launches.ScanLaunch.run, freezing._on_gpu = saved[:3]
        os.environ.pop(dispatch.BACKEND_ENV, None)
        if saved[3] is not None:
            os.environ[dispatch.BACKEND_ENV] = saved[3]
        dispatch._triton_checked.clear()
        dispatch._triton_checked.update(saved[4])


def count_ops(steps: Dict[str, Callable[[], object]]) -> Dict[str, Tuple[int, int]]:
    """Aten operators of one step of each kind (after one uncounted step, which creates the
    optimizer's state), and the dual/FT ratio they predict where every operator costs the same, as
    on a GPU whose step is bound by its launches: a branch runs the whole forward and input-gradient
    backward, and freezing removes only weight gradients and optimizer updates."""
    counts = {}
    for name, step in steps.items():
        step()
        with OpCounter() as counter:
            step()
        counts[name] = (counter.kernels, counter.all)
    ft = counts['FT']
    print('aten ops per step (kernel-launching / all; Triton kernels are not aten ops: the scan adds 2 '
          'per call on CUDA): ' + ' | '.join(
              f'{name} {k} / {a}' + ('' if name == 'FT' else f' ({k / ft[0]:.3f} / {a / ft[1]:.3f} of FT)')
              for name, (k, a) in counts.items()))
    dual = [counts['primary'][i] + counts['auxiliary'][i] for i in (0, 1)]
    print(f'  dual/FT if every op cost the same (a launch-bound step): {dual[0] / ft[0]:.3f} by kernel-launching '
          f'ops, {dual[1] / ft[1]:.3f} by all ops')
    return counts


#: Kinds of GPU kernel, matched in this order on the lower-cased kernel name (first match wins):
#: the selective scan (our Triton kernels, mamba-ssm's), convolutions (aten's, cuDNN's, and the
#: implicit GEMMs that name their pass), matrix products, the optimizer's multi-tensor updates; the
#: rest is 'other' (elementwise, normalisation, reductions, copies). The marks overlap on purpose
#: (kernel names vary with library versions); these are the ones the H200 figures in docs/results.md
#: were sorted with.
KERNEL_KINDS = (('scan', ('_scan_forward_kernel', '_scan_backward_kernel', 'selective_scan')),
                ('convolution', ('conv_', 'convolution', 'convolve', 'fprop', 'dgrad', 'wgrad', 'implicit',
                                 'winograd', 'cudnn')),
                ('matmul', ('gemm', 'nvjet', 'cutlass', 'xmma', 'cublas', 'matmul')),
                ('optimizer', ('multi_tensor', 'adam')))


def kernel_kind(name: str) -> str:
    lower = name.lower()
    return next((kind for kind, marks in KERNEL_KINDS if any(mark in lower for mark in marks)), 'other')


def kernel_times(events) -> Dict[str, Tuple[float, int]]:
    """Microseconds and count of the CUDA kernels among profiler events, by :func:`kernel_kind`
    (the events of the operators that launched them are not kernels and are left out)."""
    totals: Dict[str, Tuple[float, int]] = {}
    for event in events:
        if event.device_type != DeviceType.CUDA:
            continue
        kind = kernel_kind(event.name)
        micro, count = totals.get(kind, (0.0, 0))
        totals[kind] = (micro + event.time_range.elapsed_us(), count + 1)
    return totals


def profile_kernels(step: Callable[[torch.Tensor, torch.Tensor], object], data: list, device: str) -> dict:
    """One step per batch timed, then the same batches again under torch.profiler: the kernels' time
    by kind per step, and the wall time per step without the profiler (whose own host work made
    MambaIR's step four times longer on an H200)."""
    sync(device)
    start = time.perf_counter()
    for lq, gt in data:
        step(lq, gt)
    sync(device)
    wall = time.perf_counter() - start
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for lq, gt in data:
            step(lq, gt)
        sync(device)
    return {'wall_ms': wall * 1e3 / len(data),
            'kinds': {kind: (micro / 1e3 / len(data), count / len(data))
                      for kind, (micro, count) in kernel_times(prof.events()).items()}}


def report_kernel_time(steps: Dict[str, dict]) -> None:
    """Prints each step's kernel time by kind, then dual/FT by kind: freezing removes weight
    gradients and optimizer updates only, so the kinds that hold them are where a branch can cost
    less than FT; every other kind runs twice in the dual step."""
    kinds = [kind for kind, _ in KERNEL_KINDS] + ['other']
    total = {name: sum(ms for ms, _ in s['kinds'].values()) for name, s in steps.items()}
    print('kernel time per step (torch.profiler, CUDA kernels, ms, count in brackets; the wall time is '
          'the same steps without the profiler):')
    for name, s in steps.items():
        parts = ', '.join(f'{kind} {s["kinds"][kind][0]:.1f} ({s["kinds"][kind][1]:.0f})'
                          for kind in kinds if kind in s['kinds'])
        print(f'  {name}: {total[name]:.1f} ms in {sum(c for _, c in s["kinds"].values()):.0f} kernels '
              f'({parts}) | wall {s["wall_ms"]:.1f} ms, kernels {total[name] / s["wall_ms"]:.0%} of it')
    ft = steps['FT']['kinds']
    if not total['FT']:
        print('  no CUDA kernel was recorded in the FT steps (the profiler saw no CUDA activity)')
        return

    def dual(kind: str) -> float:
        return sum(steps[b]['kinds'].get(kind, (0.0, 0))[0] for b in ('primary', 'auxiliary'))
    shares = ', '.join(f'{kind} {dual(kind) / ft[kind][0]:.2f} ({ft[kind][0] / total["FT"]:.0%} of FT)'
                       for kind in kinds if kind in ft and ft[kind][0] > 0)
    print(f'  dual/FT by kind (share of the FT kernel time): {shares}; all kernels '
          f'{(total["primary"] + total["auxiliary"]) / total["FT"]:.3f}; wall '
          f'{(steps["primary"]["wall_ms"] + steps["auxiliary"]["wall_ms"]) / steps["FT"]["wall_ms"]:.3f}')


def rotating_ft_steps(args: argparse.Namespace, steps: Dict[str, tuple], amp: MixedPrecision):
    """FT steps of every (network, optimizer, step graph or None) of ``steps`` on the same ``--warm`` + ``--iters``
    batches, the order rotating by one from batch to batch (with two: alternating), so that drift
    of the machine hits each alike. Returns each one's timed step times (s), the total of its
    warm-up steps (s; a compile falls there) and the last batch's loss (for :func:`ft_step_peaks`)."""
    names = list(steps)
    times: Dict[str, List[float]] = {name: [] for name in names}
    warm_up: Dict[str, float] = {name: 0.0 for name in names}
    for i, (lq, gt) in enumerate(batches(args, args.warm + args.iters, args.patch, args.batch, args.device)):
        for name in names[i % len(names):] + names[:i % len(names)]:
            net, opt, graph = steps[name]
            sync(args.device); start = time.perf_counter()
            optimizer_step(net, opt, l1(lq, gt), amp, 'finetune', graph=graph)
            sync(args.device)
            took = time.perf_counter() - start
            if i >= args.warm:
                times[name].append(took)
            else:
                warm_up[name] += took
    return times, warm_up, l1(lq, gt)


def ft_step_peaks(args: argparse.Namespace, steps: Dict[str, tuple], batch_loss, amp: MixedPrecision
                  ) -> Dict[str, float]:
    """One more FT step of each (network, optimizer, step graph or None) of ``steps`` (CUDA): its
    peak allocated memory above what stays allocated (every network and optimizer state), in MiB;
    for a replayed step, plus all its graph holds (a replay allocates nothing: the recorded step's
    activations and gradients live in the graph's own pool, reserved for as long as it lives)."""
    peaks = {}
    for name, (net, opt, graph) in steps.items():
        sync(args.device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        optimizer_step(net, opt, batch_loss, amp, 'finetune', graph=graph)
        sync(args.device)
        held = (graph.held_bytes() or 0) if graph is not None else 0
        peaks[name] = (torch.cuda.max_memory_allocated() - base + held) / 2 ** 20
    return peaks


def compare_scan(args: argparse.Namespace) -> float:
    """FT steps of MambaIR with its scan on ``args.compare_scan`` = (A, B): two copies from one
    seed, stepped on the same batches, A first on even batches and B first on odd ones; returns
    and prints the median of the per-batch ratios A / B."""
    first, second = args.compare_scan
    steps = {}
    for backend in (first, second):
        torch.manual_seed(0)
        net = build_network(args.arch, args.scale, scan_backend=backend).to(args.device)
        steps[backend] = (net, adam(list(net.parameters()), 'finetune'), None)
    amp = precision(args)
    times, _, last_loss = rotating_ft_steps(args, steps, amp)
    ratios = [a / b for a, b in zip(times[first], times[second])]
    ratio = statistics.median(ratios)
    print(f'FT step scan {first} / {second}: {ratio:.3f} (median of {len(ratios)} per-batch ratios '
          f'{[round(r, 2) for r in ratios]}, order alternating) | {first} {statistics.median(times[first]) * 1e3:.1f} ms, '
          f'{second} {statistics.median(times[second]) * 1e3:.1f} ms (medians)')
    if on_cuda(args.device):
        peaks = ft_step_peaks(args, steps, last_loss, amp)
        print(f'FT step peak memory above what stays allocated: {first} {peaks[first]:.0f} MiB, {second} '
              f'{peaks[second]:.0f} MiB: {first} / {second} {peaks[first] / peaks[second]:.3f}')
    return ratio


# --compare-upstream: the project's defaults beside the same network run the way upstream runs it
#: name -> (MambaIR's scan backend, the project's Adam (fused on CUDA) or foreach, blocks compiled,
#: forward and backward replayed as a CUDA graph). Upstream MambaIR: mamba-ssm's scan on float32
#: copies of the four direction copies (scan_backend cuda), foreach Adam, eager. 'triton copies': the
#: Triton kernels on the four direction copies (SS2D.directions_in_kernels False), what the directions
#: inside the kernels gain over. 'ours mamba-ssm': what scan_backend auto trains with where mamba-ssm
#: imports (upstream's scan with fused Adam): whether auto should prefer it to the Triton kernels.
UPSTREAM_SETUPS = {
    'upstream': ('cuda', False, False, False),
    'triton copies': ('triton copies', True, False, False),
    'ours mamba-ssm': ('cuda scan', True, False, False),
    'ours eager': ('triton', True, False, False),
    'ours compiled': ('triton', True, True, False),
    'ours graphed': ('triton', True, False, True),
    'ours compiled graphed': ('triton', True, True, True),
}
#: What records a graphed setup's step: None = a CUDA graph (graphed setups are left out off CUDA);
#: the CPU tests set a recorder that replays by running the step again.
GRAPH_RECORDER: Optional[Callable[[nn.Module], object]] = None
COMPILE_BACKEND = 'inductor'     # what train.compile_backend defaults to
#: The SS2D forward at a validation tile: (side, the backend timed, the backend it is timed against).
TILE = (250, 'triton', 'cuda')


def compare_upstream(args: argparse.Namespace) -> Dict[str, float]:
    """FT steps of copies of one network (same seed) on the same batches, the order of the copies
    rotating from batch to batch: upstream's way, and the project's (the Triton scan with the
    directions inside its kernels, fused Adam) eager, with its blocks compiled, and both of these
    with forward and backward replayed as a CUDA graph (``train.cuda_graph``; its first steps run
    eager and the recording falls in the warm-up). For HAT and SAFMN the scan does not apply: eager
    foreach Adam against fused Adam, eager, compiled and replayed.
    Prints each one's median step, the median per-batch ratio to upstream, the time of its
    ``--warm`` untimed steps (a compiled network's compile falls in them: archs/compile.py runs
    a block's first training call eager and compiles at its second) and the FT step's peak memory
    above what stays allocated, as a ratio to upstream's; returns the time ratios."""
    from archs.compile import compile_blocks
    steps = {}
    for name, (scan, fused, compiled, graphed) in UPSTREAM_SETUPS.items():
        if ' ' in scan and args.arch not in MAMBAIR:
            continue   # another scan on a network without one: the same as 'ours eager'
        if graphed and GRAPH_RECORDER is None and not on_cuda(args.device):
            print(f'FT step {name}: not run (CUDA graphs need --device cuda)')
            continue
        torch.manual_seed(0)
        copies = scan.endswith(' copies')
        net = build_network(args.arch, args.scale,
                            scan_backend=scan.split()[0] if args.arch in MAMBAIR else None).to(args.device)
        for module in net.modules():
            if copies and hasattr(module, 'directions_in_kernels'):
                module.directions_in_kernels = False
        if compiled:
            compile_blocks(net, COMPILE_BACKEND)
        params = list(net.parameters())
        opt = torch.optim.Adam(params, **adam_kwargs({'lr': 1e-4} if fused else
                                                     {'lr': 1e-4, 'foreach': on_cuda(args.device) or None}, params))
        steps[name] = (net, opt, StepGraph(net, recorder=GRAPH_RECORDER) if graphed else None)
    amp = precision(args)
    names = list(steps)
    times, warm_up, last_loss = rotating_ft_steps(args, steps, amp)
    ratios = {}
    for name in names:
        per_batch = [t / u for t, u in zip(times[name], times['upstream'])]
        ratios[name] = statistics.median(per_batch)
        print(f'FT step {name} / upstream: {ratios[name]:.3f} (median of {len(per_batch)} per-batch ratios '
              f'{[round(r, 2) for r in per_batch]}, order rotating) | median {statistics.median(times[name]) * 1e3:.1f} ms, '
              f'{args.warm} warm-up steps (a compile included) {warm_up[name]:.1f} s')
    if on_cuda(args.device):
        peaks = ft_step_peaks(args, steps, last_loss, amp)
        print('FT step peak memory above what stays allocated: ' + ', '.join(
            f'{name} {peaks[name]:.0f} MiB ({peaks[name] / peaks["upstream"]:.3f} of upstream)' for name in names))
    if args.arch in MAMBAIR:
        ratios['tile forward'] = tile_forward(args)
    print('summary upstream: arch=' + args.arch + ' ' + ' | '.join(
        f'{name}/upstream time {ratios[name]:.3f}' for name in ratios if name != 'upstream'))
    return ratios


#: --check-graph's bounds: replayed / eager loss of each step, and the replayed steps' weight change
#: against the eager steps' (relative, over every tensor): a graph fed stale inputs or losing a gradient
#: misses both by far (each batch's intensity differs, so its loss does), float atomics' order does not.
GRAPH_LOSS_BOUND, GRAPH_UPDATE_BOUND = 1e-3, 0.05


def check_graph(args: argparse.Namespace) -> bool:
    """``--check-graph``: steps run eager against the same steps through step graphs, two copies from one
    seed on the same ``--warm`` + ``--iters`` batches (stochastic depth off): FT with eager and with compiled
    blocks, and LDT's dual step (both branches, their exchange) with compiled blocks and, eager blocks, with
    both branches side by side in one graph, as ``train.cuda_graph`` runs them; prints each comparison and
    returns whether all are within the bounds."""
    count = args.warm + args.iters
    data = [(lq * (0.5 + k / count), gt * (0.5 + k / count))
            for k, (lq, gt) in enumerate(batches(args, count, args.patch, args.batch, args.device))]
    passed = {}
    for kind in GRAPH_CHECKS:
        runs = [graph_check_copy(args, kind, graphed) for graphed in (False, True)]
        losses: List[List[float]] = [[], []]
        for iteration, (lq, gt) in enumerate(data, start=1):
            for (step, _, _, _), kept in zip(runs, losses):
                kept.extend(step(l1(lq, gt), iteration))
        (_, eager, _, start), (_, replayed, graphs, _) = runs
        loss_gap = max(abs(g - e) / abs(e) for e, g in zip(*losses))
        moved = [(e.detach() - s, g.detach() - s) for e, g, s in zip(eager, replayed, start)]
        update_gap = (sum((g - e).pow(2).sum() for e, g in moved) / sum(e.pow(2).sum() for e, _ in moved)).sqrt().item()
        off = '; '.join(graph.off for graph in graphs if graph.off is not None)
        recordings = [graph.recordings for graph in graphs]
        passed[kind] = bool(graphs) and not off and recordings == [1] * len(graphs) and loss_gap <= GRAPH_LOSS_BOUND \
            and update_gap <= GRAPH_UPDATE_BOUND
        print(f"graph check, {GRAPH_CHECKS[kind]}: {count - EAGER_STEPS} of {count} steps replayed "
              f"({'/'.join(map(str, recordings))} recording{'' if recordings == [1] * len(graphs) else 's'}"
              f"{', off: ' + off if off else ''}); "
              f'loss replayed / eager: max relative gap {loss_gap:.1e} (bound {GRAPH_LOSS_BOUND:g}; the batches\' '
              f'losses {min(losses[0]):.4f}-{max(losses[0]):.4f}); weight change: relative gap {update_gap:.1e} '
              f"(bound {GRAPH_UPDATE_BOUND:g}): {'PASS' if passed[kind] else 'FAIL'}")
    print('summary graph: ' + ' | '.join(f"{kind} {'PASS' if ok else 'FAIL'}" for kind, ok in passed.items()))
    return all(passed.values())


#: --check-graph's comparisons: name on the summary line -> what it runs
GRAPH_CHECKS = {'eager': 'eager blocks', 'compiled': 'compiled blocks', 'dual compiled': 'LDT dual step, compiled blocks',
                'dual side by side': 'LDT dual step, both branches in one graph (a stream each), eager blocks'}


def graph_check_copy(args: argparse.Namespace, kind: str, graphed: bool
                     ) -> Tuple[Callable[[BatchTerms, int], List[float]], List[nn.Parameter], List[StepGraph],
                                List[torch.Tensor]]:
    """One copy of ``--check-graph``'s ``kind``: its step on a batch (the losses it returns), its parameters,
    its step graphs (none eager) and its parameters' start."""
    from archs.compile import compile_blocks
    torch.manual_seed(0)
    net = build_network(args.arch, args.scale).to(args.device)
    for module in net.modules():   # the same weights only if the same samples are dropped: none
        if hasattr(module, 'drop_prob'):
            module.drop_prob = 0.
        if hasattr(module, 'active'):
            module.active = False
    amp = precision(args)
    if kind.startswith('dual'):   # a random partition: nothing to profile; the exchange every second step
        config = LDTConfig(profile_iters=0, criterion='random', dpu=False, ratio_u=0.5, ema_every=2,
                           overlap_branches=graphed and kind == 'dual side by side', overlap_memory=None)
        algo = LDT(net, config, adam, amp,
                   graphs=branch_graphs if graphed else None)
        algo.enter(1)
        networks = (algo.primary, algo.auxiliary)
        graphs = pair_graphs(algo.pair) if graphed else []

        def step(batch: BatchTerms, iteration: int) -> List[float]:
            return list(algo.update(batch, iteration).values())
    else:
        opt = adam(list(net.parameters()), 'finetune')
        networks, graphs = (net,), [StepGraph(net, recorder=GRAPH_RECORDER)] if graphed else []

        def step(batch: BatchTerms, iteration: int) -> List[float]:
            return [optimizer_step(net, opt, batch, amp, 'finetune', graph=graphs[0] if graphs else None)]
    if 'compiled' in kind:
        for network in networks:
            compile_blocks(network, COMPILE_BACKEND)
    params = [p for network in networks for p in network.parameters()]
    return step, params, graphs, [p.detach().clone() for p in params]


def tile_forward(args: argparse.Namespace, repeats: int = 20) -> float:
    """The scan part of one SS2D forward (its core: the direction projections, the scans and their
    sum) at a validation tile of batch 1 (:data:`TILE`), MambaIR's classic width, under ``--amp``
    autocast, without gradients: as validation runs it (the Triton forward on the direction
    copies, split along the sequence) and with the directions inside the Triton kernels, against
    mamba-ssm on the copies (float32), in rotating order; prints both ratios of the medians and
    returns the first."""
    from archs.mambair_arch import SS2D
    side, ours, theirs = TILE
    config = MAMBAIR[args.arch]
    torch.manual_seed(0)
    # name -> (scan backend, the SS2D method timed, how the line below names it)
    setups = {'default': (ours, 'forward_core', f'{ours} (as validation runs it)'),
              'in kernels': (ours, '_scan_in_kernels', f'{ours} (directions in the kernels)'),
              'reference': (theirs, 'forward_core', f'{theirs} on direction copies')}
    blocks = {}
    for name, (backend, _, _) in setups.items():
        blocks[name] = SS2D(config['embed_dim'], d_state=config['d_state'], expand=config['mlp_ratio'],
                            scan_backend=backend).to(args.device)
        if name != 'default':
            blocks[name].load_state_dict(blocks['default'].state_dict())
    x = torch.randn(1, blocks['default'].d_inner, side, side, device=args.device)
    amp = precision(args)
    names = list(setups)
    times: Dict[str, List[float]] = {name: [] for name in names}
    outs = {}
    with torch.no_grad(), amp.autocast():
        for i in range(repeats + 2):
            for name in names[i % len(names):] + names[:i % len(names)]:
                run = getattr(blocks[name], setups[name][1])
                sync(args.device); start = time.perf_counter()
                outs[name] = run(x)
                sync(args.device)
                if i >= 2:
                    times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(times[name]) for name in names}
    for name, label in (('default', ours), ('in kernels', f'{ours} in kernels')):
        if outs[name] is None:   # SS2D._scan_in_kernels: the four-way kernels do not run for this backend
            print(f'SS2D scan forward at a {side}x{side} tile, batch 1: {setups[name][2]}: not run on {ours}')
            continue
        diff = (outs[name].float() - outs['reference'].float()).abs().max().item()
        print(f'SS2D scan forward at a {side}x{side} tile, batch 1: {setups[name][2]} {median[name] * 1e3:.2f} ms, '
              f"{setups['reference'][2]} {median['reference'] * 1e3:.2f} ms: {label} / {theirs} "
              f"{median[name] / median['reference']:.3f} (max |diff| {diff:.2e})")
    return median['default'] / median['reference']


def profiling_memory(args: argparse.Namespace) -> None:
    """Profiling peak memory against the sample count N (flat: the statistics keep no gradients)."""
    runs = {n: peak_of(args, 'profile', profile_samples=n) for n in args.samples}
    peaks = {n: statistics.median(v) for n, v in runs.items()}
    params = sum(p.numel() * p.element_size() for p in build_network(args.arch, args.scale).parameters())
    desc = ', '.join(f'N={n}: {mib(v)}' for n, v in runs.items())
    lo, hi = min(args.samples), max(args.samples)
    print(f'profiling peak memory (LR patch {args.profile_patch}, batch {args.profile_batch}): {desc}')
    print(f'  ratio N={hi}/N={lo} = {peaks[hi] / peaks[lo]:.3f}  (flat = 1; keeping the '
          f'gradients would add {(hi - lo) * params / 2**20:.0f} MiB)')


# -- LDT-S (single network) ------------------------------------------------------------------
def make_ldt_s(args, partition_file: str, device: str, interval: int) -> LDT:
    torch.manual_seed(0)
    net = build_network(args.arch, args.scale).to(device)
    cfg = preset('ldt_s', profile_iters=0, partition_file=partition_file, ema_every=args.ema_every,
                 interval_iters=interval)
    return LDT(net, cfg, adam, precision(args))


def bench_ldt_s(args: argparse.Namespace, part_path: str) -> dict:
    """FT and LDT-S steps interleaved on the same batches (half of them with the stable group
    trained, half with the unstable group); then peak memory of each."""
    device = args.device
    algo = make_ldt_s(args, part_path, device, interval=args.ldt_s_interval)
    algo.enter(1)
    torch.manual_seed(0)
    ft_net = build_network(args.arch, args.scale).to(device)
    ft_opt = adam(list(ft_net.parameters()), 'finetune')
    ft_amp = precision(args)
    data = batches(args, args.warm + args.iters, args.patch, args.batch, device)
    times = {(clock, key): [] for clock in ('wall', 'process CPU') for key in ('ft', 'ldt_s')}
    algo.alternation.ema_every = 10 ** 9     # EMA and swap are timed apart and amortised below
    for i, (lq, gt) in enumerate(data):
        if i == args.warm + args.iters // 2:
            algo.alternation.swap()          # time both groups' intervals (untimed swap)
        for key, fn in (('ft', lambda: optimizer_step(ft_net, ft_opt, l1(lq, gt), ft_amp, 'finetune')),
                        ('ldt_s', lambda: algo.alternation.step(l1(lq, gt), algo.precision))):
            sync(device); w0, c0 = time.perf_counter(), time.process_time()
            fn()
            sync(device)
            if i >= args.warm:
                times['wall', key].append(time.perf_counter() - w0)
                times['process CPU', key].append(time.process_time() - c0)
    swaps = []
    for _ in range(4):
        sync(device); t0 = time.perf_counter(); algo.alternation.swap(); sync(device)
        swaps.append(time.perf_counter() - t0)
    emas = []
    for _ in range(4):
        sync(device); t0 = time.perf_counter(); algo.alternation.exchange(); sync(device)
        emas.append(time.perf_counter() - t0)
    swap = statistics.median(swaps) / args.ldt_s_interval + statistics.median(emas) / args.ema_every
    for clock in ('wall', 'process CPU'):
        ft, ours = times[clock, 'ft'], [t + swap for t in times[clock, 'ldt_s']]
        ratios = [s_ / f for s_, f in zip(ours, ft)]
        print(f'LDT-S {clock} time/iter (median of {args.iters}): FT {statistics.median(ft) * 1e3:.1f} ms | '
              f'LDT-S {statistics.median(ours) * 1e3:.1f} ms (incl. EMA every {args.ema_every} and swap every '
              f'{args.ldt_s_interval} iterations, amortised: {swap * 1e3:.3f} ms)')
        print(f'  step ratio LDT-S/FT = {statistics.median(ratios):.3f} (per-iteration ratios '
              f'{[round(r, 2) for r in ratios]}; target <= 1.05)')
        if clock == 'wall':
            time_ratio = statistics.median(ratios)
    del algo, ft_net, ft_opt
    if memory_unmeasured(args) is not None:
        print('LDT-S peak memory: not measured (as above)')
        return {'ldt_s_time': time_ratio, 'ldt_s_memory': None}
    m_ft = peak_of(args, 'ft')
    m_s = peak_of(args, 'ldt_s', partition=part_path)
    print(f'LDT-S peak memory (as above; CPU weight buffer included on CPU): FT {mib(m_ft)} | LDT-S {mib(m_s)}')
    memory_ratio = statistics.median(m_s) / statistics.median(m_ft)
    print(f'  memory ratio LDT-S/FT = {memory_ratio:.3f}  (target <= 1.05)')
    return {'ldt_s_time': time_ratio, 'ldt_s_memory': memory_ratio}


if __name__ == '__main__':
    main()
