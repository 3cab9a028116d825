"""scripts/gpu_check.sh on a machine without CUDA; its budget, limits, report and commands with a
stand-in interpreter; and the option files it trains and tests with (run on the CPU, shortened, so
a typo in them is not first found on a lent GPU)."""
import copy
import json
import math
import os
import re
import shutil
import subprocess
import time
import types

import pytest
import torch
import yaml

from conftest import REPO, fake_cuda_allocator, load_script, run_entry
from test_cli import write

STEPS = ['versions', 'scan_backends', 'demo_data', 'train_mambair_ldt_bf16', 'test_bf16', 'torchrun_ddp_2',
         'bench_ldt_mambair', 'bench_ldt_hat', 'bench_ldt_safmn']
#: A stand-in for python: says CUDA is there, logs its arguments, then sleeps FAKE_SLEEP seconds.
FAKE_PYTHON = """#!/usr/bin/env bash
case "$*" in *cuda.is_available*) exit 0;; *'import mamba_ssm'*) exit 1;; *get_device_capability*) echo 90; exit 0;; esac
case "$*" in *find_spec*basicsr*) [ "${FAKE_NO_BASICSR:-0}" = 1 ] && exit 1; exit 0;; esac   # basicsr installed?
case "$*" in *bench_scan.py*) [ -n "${FAKE_SCAN_LOG:-}" ] && { cat "$FAKE_SCAN_LOG"; exit "${FAKE_SCAN_RC:-0}"; };; esac
case "$*" in *'-m pip install'*) case "$*" in *not-for-this-python*) exit 1;; esac; echo "pip $*"; exit 0;; esac
echo "fake-python $*"
case "${PYTHONPATH:-}" in *carried_site*) echo "carried site on PYTHONPATH";; esac
case "$*" in *scan_static_report.py*) echo "TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-}";; esac
case "${PYTHONPATH:-}" in *--print-path*) echo "on PYTHONPATH: $PYTHONPATH";; esac   # a mamba-ssm build's path
case "$*" in *bench_ldt.py*--compare-upstream*)   # the FT step against upstream's way, MambaIR's tile forward
  echo "FT step ours eager / upstream: 0.700 (median of 10 per-batch ratios [0.7], order rotating) | median 70.0 ms, 3 warm-up steps (a compile included) 1.0 s"
  echo "FT step ours compiled / upstream: 0.800 (median of 10 per-batch ratios [0.8], order rotating) | median 80.0 ms, 3 warm-up steps (a compile included) 30.0 s"
  echo "FT step ours mamba-ssm / upstream: 0.875 (median of 10 per-batch ratios [0.875], order rotating) | median 87.5 ms, 3 warm-up steps (a compile included) 1.0 s"
  echo "FT step ours graphed / upstream: 0.600 (median of 10 per-batch ratios [0.6], order rotating) | median 60.0 ms, 3 warm-up steps (a compile included) 2.0 s"
  echo "FT step ours compiled graphed / upstream: 0.500 (median of 10 per-batch ratios [0.5], order rotating) | median 50.0 ms, 3 warm-up steps (a compile included) 3.0 s"
  echo "FT step peak memory above what stays allocated: upstream 100 MiB (1.000 of upstream), ours eager 90 MiB (0.900 of upstream), ours compiled 95 MiB (0.950 of upstream), ours graphed 110 MiB (1.100 of upstream), ours compiled graphed 99 MiB (0.990 of upstream)"
  echo "SS2D scan forward at a 250x250 tile, batch 1: triton (directions in the kernels) 5.00 ms, cuda on direction copies 4.00 ms: triton / cuda 1.250 (max |diff| 1.00e-06)"
  echo "summary upstream: arch=mambair ours eager/upstream time 0.700 | ours compiled/upstream time 0.800 | tile forward/upstream time 1.250";;
  *bench_ldt.py*--check-graph*)   # replayed against eager, eager and compiled blocks (FAKE_GRAPH_FAIL=1: compiled fails)
  echo "graph check, eager blocks: 3 of 5 steps replayed (1 recording); ...: PASS"
  echo "graph check, compiled blocks: 3 of 5 steps replayed (1 recording); ...: PASS"
  [ "${FAKE_GRAPH_FAIL:-0}" = 1 ] && { echo "graph check, LDT dual step, both branches in one graph (a stream each), eager blocks: ...: FAIL"; echo "summary graph: eager PASS | compiled PASS | dual compiled PASS | dual side by side FAIL"; exit 1; }
  echo "summary graph: eager PASS | compiled PASS | dual compiled PASS | dual side by side PASS";;
  *bench_ldt.py*--compare-scan*)   # FT steps paired per batch: 104 ms on Triton, 100 ms on mamba-ssm
  echo "FT step scan triton / cuda: 1.040 (median of 10 per-batch ratios [1.04], order alternating) | triton 104.0 ms, cuda 100.0 ms (medians)";;
  *bench_ldt.py*--kernel-time*)   # kernel time by kind (FT and the branches; none with FAKE_NO_SUMMARY=1)
  echo "kernel time per step (torch.profiler, CUDA kernels, ms, count in brackets; the wall time is the same steps without the profiler):"
  [ "${FAKE_NO_SUMMARY:-0}" = 1 ] || echo "  FT: 100.0 ms in 2000 kernels (scan 30.0 (72), other 70.0 (1928)) | wall 150.0 ms, kernels 67% of it";;
  *bench_ldt.py*--overlap-branches*)   # with the overlapped dual step's ratios (none with FAKE_NO_SUMMARY=1)
  echo "  reserved (torch.cuda.max_memory_reserved after empty_cache; what the process holds on the GPU): FT 10.0 MiB"
  [ "${FAKE_NO_SUMMARY:-0}" = 1 ] || echo "summary: arch=mambair amp=bf16 LR patch 48 batch 4, GPU: FT 104.0 ms | LDT/FT time 1.800 | LDT/FT memory 0.980 | LDT-S/FT time 0.900 | LDT-S/FT memory n/a | LDT sequential/FT time 1.700 | LDT sequential/FT memory 1.010 | LDT overlapped/FT time 1.300 | LDT overlapped/FT memory 1.600 | LDT bounded x1.05/FT time 1.450 | LDT bounded x1.05/FT memory 1.050"
  sleep "${FAKE_OVERLAP_SLEEP:-0}";;
  *bench_ldt.py*--cuda-graph*)   # every network compiled, and the steps replayed as CUDA graphs beside them
  echo "summary: arch=mambair amp=bf16 LR patch 48 batch 4, GPU: FT 80.0 ms | LDT/FT time 1.600 | LDT/FT memory 1.010 | LDT-S/FT time 0.950 | LDT-S/FT memory n/a | FT graphed/FT time 0.700 | LDT graphed/FT graphed time 1.900 | LDT graphed/FT graphed memory 1.020 | LDT side by side/FT graphed time 1.300 | LDT side by side/FT graphed memory 1.800";;
  *bench_ldt.py*)   # bench_ldt's warm-up and summary lines
  echo "2 warm-up steps (a compile falls there): FT 45.0 s, dual 1.0 s; graphs compiled: 2 in them, 0 in the timed steps"
  echo "summary: arch=mambair amp=bf16 LR patch 48 batch 4, GPU: FT 104.0 ms | LDT/FT time 1.500 | LDT/FT memory 1.100 | LDT-S/FT time 1.020 | LDT-S/FT memory n/a";;
esac
case "$*:${PYTHONPATH:-}" in *bench_scan.py*--print-path*)   # the scan benchmark with mamba-ssm on the path
  echo "triton / mamba-ssm fwd+bwd: 0.95 (medians, this run; goal <= 1.0)"; echo "triton / mamba-ssm fwd+bwd: 1.30 (tile)";;
esac
sleep "${FAKE_SLEEP:-0}"
"""


def test_gpu_check_without_cuda_is_one_line_and_non_zero():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='')
    result = subprocess.run(['bash', str(REPO / 'scripts' / 'gpu_check.sh')], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and result.stdout == ''
    assert result.stderr.splitlines() == ['gpu_check: no CUDA device visible to PyTorch (torch.cuda.is_available() is '
                                          'False); run it on a machine with an NVIDIA GPU']


def _run_with_fake_python(tmp_path, budget, sleep, *args):
    """gpu_check.sh copied into a scratch project (it cd's to its parent folder), run with the stand-in."""
    (tmp_path / 'scripts').mkdir()
    shutil.copy(REPO / 'scripts' / 'gpu_check.sh', tmp_path / 'scripts' / 'gpu_check.sh')
    fake = tmp_path / 'fake_python'
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    out = tmp_path / 'out'
    env = dict(os.environ, PYTHON=str(fake), OUT=str(out), FAKE_SLEEP=str(sleep))
    if budget is not None:
        env['GPU_CHECK_BUDGET_S'] = str(budget)
    start = time.monotonic()
    result = subprocess.run(['bash', str(tmp_path / 'scripts' / 'gpu_check.sh'), *args], env=env, capture_output=True,
                            text=True, timeout=(budget or 600) + 60)
    return result, time.monotonic() - start, out / 'gpu_check'


def test_every_step_runs_under_its_limit_and_the_limits_fit_six_minutes(tmp_path):
    """The steps in order, each reported with its time and limit; the limits add up to the 350 s
    budget (6 minutes less the start-up check and kill margins); the commands the issue asks for."""
    result, _, folder = _run_with_fake_python(tmp_path, budget=350, sleep=0)
    assert result.returncode != 0      # the stand-in writes no logs, so the checks fail
    report = (folder / 'report.txt').read_text()
    assert report == result.stdout
    steps = re.findall(r'^\[(PASS|FAIL|SKIP)\] (\S+) \((\d+) s, limit (\d+) s', report, re.M)
    assert [name for _, name, _, _ in steps] == STEPS
    limits = {name: int(limit) for _, name, _, limit in steps}
    assert limits == {'versions': 10, 'scan_backends': 60, 'demo_data': 15, 'train_mambair_ldt_bf16': 65,
                      'test_bf16': 30, 'torchrun_ddp_2': 40, 'bench_ldt_mambair': 50, 'bench_ldt_hat': 50,
                      'bench_ldt_safmn': 30}
    assert sum(limits.values()) <= 350
    log = {name: (folder / f'{name}.log').read_text() for name in STEPS}
    assert 'scripts/bench_scan.py --device cuda' in log['scan_backends']
    assert 'mamba-ssm: no sdist carried' in report                     # nothing to build: no step 8
    assert 'Train_pip.py -opt options/demo/train_demo_mambair_ldt_gpu.yml' in log['train_mambair_ldt_bf16']
    assert 'test.py -opt options/demo/test_demo_mambair_gpu.yml' in log['test_bf16']
    assert '-m torch.distributed.run --nproc_per_node=2' in log['torchrun_ddp_2']
    for arch in ('mambair', 'hat', 'safmn'):
        assert f'scripts/bench_ldt.py --device cuda --arch {arch} --amp bf16' in log[f'bench_ldt_{arch}']
    assert re.search(r'^\[FAIL\] scan_backends', report, re.M)   # the stand-in prints no timing
    assert 'test pairs: 0 of LR 48 (datasets/DRealSR_demo), 0 of LR 115' in report
    assert re.search(r'^\[PASS\] bench_ldt_hat', report, re.M)   # the stand-in prints a summary line there
    assert re.search(r'^result: 6 step\(s\) failed or skipped in \d+ s of the 350 s budget', report, re.M)


def test_basicsr_missing_on_the_gpu_image_is_installed_from_carried_wheels_for_every_step(tmp_path, monkeypatch):
    """The device's python3 has torch and most of requirements.txt but not basicsr (device tool, KINDS.md);
    the wheels carried in gpu_carry/wheels/ are installed offline, one by one, into a folder that every
    step then has on PYTHONPATH; a wheel that does not fit is named and the others still install."""
    wheels = tmp_path / 'gpu_carry' / 'wheels'
    wheels.mkdir(parents=True)
    for name in ('basicsr-1.4.2-py3-none-any.whl', 'lmdb-0-not-for-this-python.whl'):
        (wheels / name).write_bytes(b'')
    monkeypatch.setenv('FAKE_NO_BASICSR', '1')
    monkeypatch.setenv('GPU_CHECK_SITE', str(tmp_path / 'carried_site'))
    result, _, folder = _run_with_fake_python(tmp_path, budget=350, sleep=0)
    report = (folder / 'report.txt').read_text()
    assert 'packages: lmdb-0-not-for-this-python.whl did not install' in report
    assert f'packages: basicsr absent; installed into {tmp_path / "carried_site"}: basicsr-1.4.2-py3-none-any.whl' in report
    for step in STEPS[1:]:   # every step after the versions runs with the carried packages importable
        assert 'carried site on PYTHONPATH' in (folder / f'{step}.log').read_text(), step
    (tmp_path / 'bare').mkdir()   # no gpu_carry/wheels/ there: said once, before the steps that need it
    result, _, folder = _run_with_fake_python(tmp_path / 'bare', budget=350, sleep=0)
    assert 'packages: basicsr is not installed and no wheels are carried in gpu_carry/wheels' in \
        (folder / 'report.txt').read_text()


@pytest.mark.parametrize('prebuilt', [False, True])
def test_a_carried_mamba_ssm_sdist_is_built_in_the_background_and_benchmarked_last(tmp_path, prebuilt):
    """With mamba-ssm's sdist in gpu_carry/ and no mamba_ssm importable, its build starts before the
    first step, beside the others, and a last step benchmarks the scan again with it on the path.
    With an extension carried in gpu_carry/mamba_ssm_ext/, the build is asked to try that first."""
    (tmp_path / 'gpu_carry').mkdir()
    (tmp_path / 'gpu_carry' / 'mamba_ssm-2.3.2.post1.tar.gz').write_bytes(b'')
    if prebuilt:
        (tmp_path / 'gpu_carry' / 'mamba_ssm_ext' / 'ext-sm90-torch2.11.0-cu130').mkdir(parents=True)
    build = tmp_path / 'mamba_build'
    os.environ['GPU_CHECK_MAMBA_BUILD'] = str(build)
    try:
        result, _, folder = _run_with_fake_python(tmp_path, budget=350, sleep=0)
    finally:
        del os.environ['GPU_CHECK_MAMBA_BUILD']
    report = (folder / 'report.txt').read_text()
    tried = 'from gpu_carry/mamba_ssm_ext if it imports, else ' if prebuilt else ''
    assert (f'mamba-ssm: selective_scan_cuda {tried}built from gpu_carry/mamba_ssm-2.3.2.post1.tar.gz in the '
            'background') in report
    steps = re.findall(r'^\[(?:PASS|FAIL|SKIP)\] (\S+) \(\d+ s, limit (\d+) s', report, re.M)
    assert [name for name, _ in steps] == STEPS + ['scan_mamba_ssm'] and steps[-1][1] == '110'
    built = (folder / 'mamba_ssm_build.log').read_text()
    assert 'scripts/build_mamba_ssm.py --sdist gpu_carry/mamba_ssm-2.3.2.post1.tar.gz' in built
    options = ' --prebuilt gpu_carry/mamba_ssm_ext' if prebuilt else ''
    assert f'--build-dir {build} --jobs 8{options}\n' in built and (build / 'rc').read_text().strip() == '0'
    scan_log = (folder / 'scan_mamba_ssm.log').read_text()
    assert 'scripts/bench_scan.py --device cuda' in scan_log
    # then both kernels' instructions per update, read from the build just made, for this GPU
    assert f'fake-python scripts/scan_static_report.py --arch 90 --shape train --mamba-ssm {build}\n' in scan_log


def test_the_scan_sweep_session_times_launch_settings_beside_mamba_ssm_within_one_device_call(tmp_path):
    """--scan-sweep (the scan issue's GPU session): after the check and the mamba-ssm benchmark, the
    dual step with overlapped branches for the three networks, then MambaIR's FT step on mamba-ssm
    against step 7's on Triton, then the Triton launch sweep with mamba-ssm on the path; first, right
    after the versions, the Triton scan's cold compile; a 540 s budget, inside one 600 s device call."""
    (tmp_path / 'gpu_carry').mkdir()
    (tmp_path / 'gpu_carry' / 'mamba_ssm-2.3.2.post1.tar.gz').write_bytes(b'')
    build = tmp_path / 'mamba_build'
    os.environ.update(GPU_CHECK_MAMBA_BUILD=str(build), FAKE_OVERLAP_SLEEP='3')   # the overlap steps: 3 s each
    try:
        result, _, folder = _run_with_fake_python(tmp_path, None, 0, '--scan-sweep')
    finally:
        del os.environ['GPU_CHECK_MAMBA_BUILD'], os.environ['FAKE_OVERLAP_SLEEP']
    report = (folder / 'report.txt').read_text()
    assert 'budget 540 s' in report.splitlines()[0]
    steps = re.findall(r'^\[(?:PASS|FAIL|SKIP)\] (\S+) \(\d+ s, limit (\d+) s', report, re.M)
    names = STEPS[:1] + ['scan_compile'] + STEPS[1:] + ['scan_mamba_ssm', 'overlap_mambair', 'overlap_hat',
                                                        'overlap_safmn', 'bench_ldt_mambair_mamba_ssm', 'scan_sweep']
    assert [name for name, _ in steps] == names
    limits = dict(steps)
    assert (limits['scan_compile'], limits['scan_sweep'], limits['bench_ldt_mambair_mamba_ssm']) == ('30', '110', '45')
    assert (limits['overlap_mambair'], limits['overlap_hat'], limits['overlap_safmn']) == ('80', '65', '40')
    assert report.count('\n      reserved (torch.cuda.max_memory_reserved after empty_cache') == 3   # in the report
    for arch in ('mambair', 'hat', 'safmn'):
        assert (f'scripts/bench_ldt.py --device cuda --arch {arch} --amp bf16 --patch 48 --batch 4 --warm 2 --iters 8 '
                '--no-profile-memory --overlap-branches --overlap-memory 1.05'
                ) in (folder / f'overlap_{arch}.log').read_text()
    compile_log = (folder / 'scan_compile.log').read_text()
    assert 'fake-python scripts/scan_static_report.py --arch 90\n' in compile_log   # this GPU's architecture
    sweep = (folder / 'scan_sweep.log').read_text()
    assert f'on PYTHONPATH: fake-python scripts/build_mamba_ssm.py --sdist gpu_carry/mamba_ssm-2.3.2.post1.tar.gz ' \
           f'--build-dir {build} --print-path' in sweep                     # the built mamba-ssm on the path
    configs = re.search(r'--sweep (.*)$', sweep, re.M).group(1).split()
    assert configs[0] == '8,4,1,1,4,1,1' and len(configs) == 12
    bench = load_script('bench_scan')
    assert len(bench.parse_sweep(configs)) == 12      # every configuration well formed
    mamba_bench = (folder / 'bench_ldt_mambair_mamba_ssm.log').read_text()
    assert ('scripts/bench_ldt.py --device cuda --arch mambair --amp bf16 --patch 48 --batch 4 --warm 2 --iters 10 '
            '--compare-scan triton cuda') in mamba_bench and 'on PYTHONPATH' in mamba_bench
    assert 'on PYTHONPATH' not in (folder / 'bench_ldt_mambair.log').read_text()    # step 7: Triton
    assert re.search(r'^\[PASS\] bench_ldt_mambair_mamba_ssm', report, re.M), report
    assert ('    FT step: Triton 104.0 ms, mamba-ssm 100.0 ms (medians), paired per batch: Triton / mamba-ssm 1.040 '
            '(goal <= 1.05)') in report.splitlines()
    # the issues' goals from this run's logs, last: the training shape's scan ratio (not the tile's), the
    # FT step's, each network's LDT/FT and LDT-S/FT (memory n/a: not measured), the check's own seconds
    goals = report[report.index('goals (ratios from this run):'):].splitlines()[1:31]
    assert goals == [
        '  scan fwd+bwd Triton / mamba-ssm, training shape: 0.95 (goal <= 1.0) met',
        '  FT step Triton / mamba-ssm: 1.040 (goal <= 1.05) met',
        *[line for arch in ('mambair', 'hat', 'safmn') for line in (
            f'  {arch} LDT/FT time: 1.500 (goal <= 1.7) met', f'  {arch} LDT/FT memory: 1.100 (goal <= 1.05) MISSED',
            f'  {arch} LDT-S/FT time: 1.020 (goal <= 1.05) met')],
        *[line for arch in ('mambair', 'hat', 'safmn') for line in (
            f'  {arch} LDT/FT time, one after the other: 1.700 (goal <= 1.7) met',   # at a bound: met
            f'  {arch} LDT/FT memory, one after the other: 1.010 (goal <= 1.05) met',
            f'  {arch} LDT/FT time, overlapped branches: 1.300 (goal <= 1.7) met',
            f'  {arch} LDT/FT memory, overlapped branches: 1.600 (goal <= 1.05) MISSED',
            f'  {arch} LDT/FT time, overlapped within x1.05 memory: 1.450 (goal <= 1.7) met',
            f'  {arch} LDT/FT memory, overlapped within x1.05 memory: 1.050 (goal <= 1.05) met')],
        goals[29]]
    # the stand-in steps take a second or two on a loaded machine: the seconds are this run's own, and
    # leave out the steps only --scan-sweep runs (the overlap steps' 9 s among them)
    assert re.fullmatch(r'  seconds of the steps gpu_check runs without --scan-sweep: [0-5] \(goal <= 360\) met',
                        goals[29]), goals[29]
    # then which ways of running the dual step keep all three networks within both goals
    assert report.splitlines()[-2] == (
        '  the dual step with every network within both LDT/FT goals: default: no (3 of 6 goals met) | one after the '
        'other: yes (6 of 6 goals met) | overlapped branches: no (3 of 6 goals met) | overlapped within x1.05 memory: '
        'yes (6 of 6 goals met)')
    assert report.splitlines()[-1].startswith('result: ')


def test_the_speed_session_times_the_defaults_against_upstreams_way_within_one_device_call(tmp_path):
    """--speed (the training-speed issue's GPU session): only the versions, the scan check, LDT/FT
    with the defaults, the CUDA graph check, MambaIR's --compare-upstream step (it waits for the
    mamba-ssm build and runs with it on the path) and LDT/FT with every network compiled, and replayed
    as CUDA graphs, 540 s in all, and each goal read from their lines: the fake MambaIR log misses the
    compiled (default) FT step's goal and the tile's, the eager replayed step's memory goal, and LDT/FT
    compiled and replayed. The compiled steps' kernel time
    runs when named, and a graph check with a FAIL line fails."""
    (tmp_path / 'gpu_carry').mkdir()
    (tmp_path / 'gpu_carry' / 'mamba_ssm-2.3.2.post1.tar.gz').write_bytes(b'')
    os.environ['GPU_CHECK_MAMBA_BUILD'] = str(tmp_path / 'mamba_build')
    try:
        result, _, folder = _run_with_fake_python(tmp_path, None, 0, '--speed')
    finally:
        del os.environ['GPU_CHECK_MAMBA_BUILD']
    report = (folder / 'report.txt').read_text()
    assert 'budget 540 s' in report.splitlines()[0]
    steps = dict(re.findall(r'^\[(?:PASS|FAIL|SKIP)\] (\S+) \(\d+ s, limit (\d+) s', report, re.M))
    assert list(steps) == ['versions', 'scan_backends', 'bench_ldt_mambair', 'graph_check', 'upstream_mambair',
                           'bench_ldt_mambair_compiled']
    assert sum(map(int, steps.values())) <= 540
    assert '--arch mambair --amp bf16 --patch 48 --batch 4 --warm 2 --iters 3 --check-graph' in \
        (folder / 'graph_check.log').read_text()
    assert re.search(r'^\[PASS\] graph_check .*\n(    .*\n)*    summary graph: eager PASS \| compiled PASS \| dual compiled PASS '
                     r'\| dual side by side PASS$', report, re.M)
    mambair = (folder / 'upstream_mambair.log').read_text()
    assert '--arch mambair --amp bf16 --patch 48 --batch 4 --warm 3 --iters 10 --compare-upstream' in mambair
    assert 'on PYTHONPATH' in mambair                        # mamba-ssm's build on the path
    # LDT/FT as the defaults run it (FT compiled, LDT eager), then with every network compiled
    assert '--no-profile-memory --compile auto' in (folder / 'bench_ldt_mambair.log').read_text()
    assert '--arch mambair --amp bf16 --patch 48 --batch 4 --warm 2 --iters 8 --no-profile-memory --compile true ' \
        '--cuda-graph' in (folder / 'bench_ldt_mambair_compiled.log').read_text()
    assert re.search(r'^\[PASS\] bench_ldt_mambair .*\n(    .*\n)*    2 warm-up steps \(a compile falls there\): FT 45.0 s',
                     report, re.M)   # the run's cold compile
    assert re.search(r'^\[PASS\] upstream_mambair', report, re.M)
    for line in ('MambaIR FT step, defaults (compiled) / upstream: 0.800 (goal <= 0.75) MISSED',
                 'MambaIR FT peak memory, defaults (compiled) / upstream: 0.950 (goal <= 1.0) met',
                 'MambaIR FT step, eager / upstream: 0.700 (goal <= 0.75) met',
                 'MambaIR FT peak memory, eager / upstream: 0.900 (goal <= 1.0) met',
                 'MambaIR FT step, compiled + CUDA graph / upstream: 0.500 (goal <= 0.75) met',
                 'MambaIR FT peak memory, compiled + CUDA graph / upstream: 0.990 (goal <= 1.0) met',
                 'MambaIR FT step, eager + CUDA graph / upstream: 0.600 (goal <= 0.75) met',
                 'MambaIR FT peak memory, eager + CUDA graph / upstream: 1.100 (goal <= 1.0) MISSED',
                 'MambaIR FT step eager, Triton / mamba-ssm (what auto runs where mamba-ssm imports): 0.800 (goal <= '
                 '1.0) met',                                   # 0.700 / 0.875: whether auto should prefer Triton
                 'SS2D scan forward at a 250x250 tile, Triton / mamba-ssm: 1.250 (goal <= 1.0) MISSED',
                 'mambair LDT/FT time with the defaults: 1.500 (goal <= 1.5) met',
                 'mambair LDT/FT time, every network compiled: 1.600 (goal <= 1.5) MISSED',
                 'mambair LDT/FT time, compiled + CUDA graphs: 1.900 (goal <= 1.5) MISSED',
                 'mambair LDT/FT memory, compiled + CUDA graphs: 1.020 (goal <= 1.05) met',
                 'mambair LDT/FT time, compiled + one CUDA graph side by side: 1.300 (goal <= 1.5) met',
                 'mambair LDT/FT memory, compiled + one CUDA graph side by side: 1.800 (goal <= 1.05) MISSED'):
        assert f'  {line}' in report.splitlines(), line
    # named: where the compiled steps' time goes; a failed graph check fails its step
    os.environ.update(GPU_CHECK_STEPS='kernel_time_mambair_compiled,graph_check', FAKE_GRAPH_FAIL='1')
    (tmp_path / 'again').mkdir()
    try:
        _, _, folder = _run_with_fake_python(tmp_path / 'again', None, 0, '--speed')
    finally:
        del os.environ['GPU_CHECK_STEPS'], os.environ['FAKE_GRAPH_FAIL']
    report = (folder / 'report.txt').read_text()
    assert '--arch mambair --amp bf16 --patch 48 --batch 4 --warm 2 --iters 3 --kernel-time --compile true' in \
        (folder / 'kernel_time_mambair_compiled.log').read_text()
    assert re.search(r'^\[PASS\] kernel_time_mambair_compiled', report, re.M)
    assert '      FT: 100.0 ms in 2000 kernels (scan 30.0 (72), other 70.0 (1928)) | wall 150.0 ms, kernels 67% of it' in \
        report.splitlines()
    assert re.search(r'^\[FAIL\] graph_check .*\n(    .*\n)*    summary graph: eager PASS \| compiled PASS \| dual compiled '
                     r'PASS \| dual side by side FAIL$', report, re.M)
    os.environ.update(GPU_CHECK_STEPS='kernel_time_mambair_compiled', FAKE_NO_SUMMARY='1')   # no FT line: it fails
    (tmp_path / 'third').mkdir()
    try:
        _, _, folder = _run_with_fake_python(tmp_path / 'third', None, 0, '--speed')
    finally:
        del os.environ['GPU_CHECK_STEPS'], os.environ['FAKE_NO_SUMMARY']
    assert re.search(r'^\[FAIL\] kernel_time_mambair_compiled', (folder / 'report.txt').read_text(), re.M)


def test_the_cold_compile_runs_on_an_empty_triton_cache_of_its_own(tmp_path, monkeypatch):
    """The compile figure is a cold one: the step gives the static report a fresh, empty Triton cache
    (never the user's ~/.triton, which would make it a cache load)."""
    monkeypatch.setenv('TRITON_CACHE_DIR', str(tmp_path / 'users_cache'))
    result, _, folder = _run_with_fake_python(tmp_path, None, 0, '--scan-sweep')
    compile_log = (folder / 'scan_compile.log').read_text()
    assert 'fake-python scripts/scan_static_report.py --arch 90' in compile_log
    cache = re.search(r'^TRITON_CACHE_DIR=(.*)$', compile_log, re.M).group(1)
    assert cache != str(tmp_path / 'users_cache') and os.path.isdir(cache) and not os.listdir(cache)


def test_an_unknown_argument_is_one_line():
    result = subprocess.run(['bash', str(REPO / 'scripts' / 'gpu_check.sh'), '--sweep'], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and result.stdout == ''
    assert result.stderr.splitlines() == ["gpu_check: unknown argument '--sweep'; expected none, --scan-sweep or --speed"]


def test_the_budget_cuts_a_step_short_and_skips_the_rest(tmp_path):
    """With 22 s of budget and steps that would run 30 s: the first is stopped at its own 10 s
    limit, the second at what is left (22 - 10 to 12 - 5 s kill margin: the 2 s spare absorb the
    script's start and the first step's check on a loaded machine, where at 20 s the second step
    was once skipped), the others are skipped."""
    budget = 22
    result, took, folder = _run_with_fake_python(tmp_path, budget=budget, sleep=30)
    report = (folder / 'report.txt').read_text()
    assert result.returncode != 0 and took < budget + 5
    assert re.search(r'^\[FAIL\] versions \(1[01] s, limit 10 s, exit 124', report, re.M), report
    assert 'timed out after 10 s' in report
    assert re.search(r'^\[FAIL\] scan_backends \(\d s, limit [5-9] s, exit 124', report, re.M), report
    skipped = re.findall(rf'^\[SKIP\] (\S+) \(\d+ s left of the {budget} s budget\)', report, re.M)
    assert skipped == STEPS[2:]


def _load(name):
    return yaml.safe_load((REPO / 'options' / 'demo' / name).read_text())


def _point_at(dataset_opt, data, split):
    lower = split.lower()
    dataset_opt['dataroot_gt'] = str(data / f'{split}_x4' / f'{lower}_HR')
    dataset_opt['dataroot_lq'] = str(data / f'{split}_x4' / f'{lower}_LR')


def test_gpu_check_option_files_train_and_test_on_cpu(project, demo_data, demo_module, tmp_path):
    """Every phase in bf16, two validations of two sets of different image sizes with the official
    cutting in bf16, then test.py in bf16 on 32-pixel tiles: the GPU run's plan, shortened, on the CPU."""
    large = tmp_path / 'large'       # stands in for datasets/DRealSR_demo_large: other image sizes (LR 40)
    demo_module.make_demo_data(large, seed=0, cameras=('Sony',), train_per_camera=1, test_per_camera=2, hr_size=64,
                               test_hr_size=160)
    train = _load('train_demo_mambair_ldt_gpu.yml')
    assert train['train']['amp'] == 'bf16' and train['network_g']['type'] == 'MambaIR'
    assert (train['val']['tile_mode'], train['val']['precision']) == ('official', 'bf16')
    assert train['val']['val_freq'] < train['train']['total_iter'] < 2 * train['val']['val_freq']   # 2 validations
    train['num_gpu'] = 0
    _point_at(train['datasets']['train'], demo_data, 'Train')
    _point_at(train['datasets']['val_targets'], demo_data, 'Test')
    _point_at(train['datasets']['val_large'], large, 'Test')
    train['datasets']['train'].update(gt_size=32, num_worker_per_gpu=0, batch_size_per_gpu=2, dataset_enlarge_ratio=1)
    train['datasets']['val_targets']['cameras'] = ['Sony']          # the fixture's target cameras
    train['datasets']['val_large']['cameras'] = ['Sony']
    train['ldt'].update(head_warmup_iters=1, profile_iters=2, ema_every=1)
    train['train']['total_iter'] = 4
    train['train']['scheduler']['milestones'] = [2]                  # within the shortened run
    train['logger'].update(print_freq=1, save_checkpoint_freq=4)
    train['val']['val_freq'] = 3      # at 3 and at the end (4)
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'train.yml', train))
    exp = project / 'experiments' / train['name']
    log = next(exp.glob(f"train_{train['name']}_*.log")).read_text()
    for text in ('Mixed precision: autocast bf16', 'LDT phase: head warm-up', 'LDT phase: gradient profiling',
                 'LDT phase: dual training', '# psnr',
                 'Validation inference: official LDT sections (n // 200 + 1 per axis, 10% overlap), bf16'):
        assert text in log
    assert log.count('Validation demo_targets') == log.count('Validation demo_large') == 2

    test = _load('test_demo_mambair_gpu.yml')
    assert test['network_g'] == train['network_g'] and test['test']['precision'] == 'bf16'
    assert test['checkpoints'][0]['path'] == f"experiments/{train['name']}/models/net_g_latest.pth"
    test['num_gpu'] = 0
    _point_at(test['datasets']['test_targets'], demo_data, 'Test')
    _point_at(test['datasets']['test_large'], large, 'Test')
    test['datasets']['test_targets']['cameras'] = ['Canon']
    test['datasets']['test_large']['cameras'] = ['Sony']
    run_entry(project, 'test.py', '-opt', write(project / 'test.yml', test))
    log = next((project / 'results' / test['name']).glob(f"test_{test['name']}_*.log")).read_text()
    assert 'Inference: 32-pixel tiles overlapping by 8, bf16' in log
    summary = json.loads((project / 'results' / test['name'] / 'metrics.json').read_text())['summary']
    assert math.isfinite(summary['LDT-bf16']['Mean']['psnr']) and summary['LDT-bf16']['Sony']['images'] == 2


def test_bench_ldt_compares_two_scan_backends_batch_by_batch(monkeypatch, capsys):
    """The GPU check's FT step Triton / mamba-ssm: two separate benchmark runs drifted by 9% on the
    H100, more than the goal's 5%, so --compare-scan steps two copies of MambaIR (same seed, one scan
    backend each) on the same batches, alternating which goes first, and reports the median of the
    per-batch ratios. Here with two CPU backends; a network without a scan is refused in one line."""
    bench = load_script('bench_ldt')
    backend_of, stepped = {}, []
    build, step = bench.build_network, bench.optimizer_step

    def built(arch, scale, scan_backend=None):
        net = build(arch, scale, scan_backend=scan_backend)
        backend_of[id(net)] = (scan_backend, copy.deepcopy(net.state_dict()))
        return net
    monkeypatch.setattr(bench, 'build_network', built)
    def slower_on_auto(net, *a, **k):    # the second backend's steps take 300 ms more: the ratio says which
        stepped.append(backend_of[id(net)][0])
        time.sleep(0.3 if stepped[-1] == 'auto' else 0)
        return step(net, *a, **k)
    monkeypatch.setattr(bench, 'optimizer_step', slower_on_auto)
    bench.main(['--arch', 'mambair_small', '--device', 'cpu', '--patch', '4', '--batch', '1', '--iters', '3',
                '--warm', '1', '--compare-scan', 'torch', 'auto'])
    out = capsys.readouterr().out
    assert stepped == ['torch', 'auto', 'auto', 'torch'] * 2          # 1 warm-up + 3 timed batches
    (first, a), (second, b) = backend_of.values()
    assert (first, second) == ('torch', 'auto') and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    line = re.search(r'^FT step scan torch / auto: (\d+\.\d+) \(median of 3 per-batch ratios \[.*\], order '
                     r'alternating\) \| torch [\d.]+ ms, auto [\d.]+ ms \(medians\)$', out, re.M)
    assert line and 0 < float(line.group(1)) < 0.5, out     # torch / auto: the first over the second
    assert 'peak memory' not in out                               # a CPU has no allocator peak to read
    # on CUDA, one more step on each network for its peak memory above what stays allocated
    allocated = fake_cuda_allocator(monkeypatch, bench)

    def step_taking_memory(net, *a, **k):       # 'torch' peaks 300 MiB above what is allocated, 'auto' 200
        stepped.append(backend_of[id(net)][0])
        allocated['peak'] = allocated['now'] + (300 if stepped[-1] == 'torch' else 200) * 2 ** 20
        return step(net, *a, **k)
    monkeypatch.setattr(bench, 'optimizer_step', step_taking_memory)
    stepped.clear()
    bench.main(['--arch', 'mambair_small', '--device', 'cpu', '--patch', '4', '--batch', '1', '--iters', '1',
                '--warm', '0', '--compare-scan', 'torch', 'auto'])
    assert stepped == ['torch', 'auto', 'torch', 'auto']               # 1 timed batch, then one step each
    assert re.search(r'^FT step peak memory above what stays allocated: torch 300 MiB, auto 200 MiB: '
                     r'torch / auto 1.500$', capsys.readouterr().out, re.M)
    with pytest.raises(SystemExit):
        bench.main(['--arch', 'msrresnet', '--compare-scan', 'torch', 'auto'])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(   # prog: the script's name, or pytest's here
        "error: --compare-scan: the selective scan is MambaIR's; expected --arch mambair or mambair_small, got msrresnet")


def test_bench_ldt_counts_the_operators_of_each_step_and_the_ratio_they_predict(capsys):
    """On an H100 at batch 4 the three networks' steps cost 19-22 us per aten operator: launch-bound,
    so a branch, which runs the whole forward and input-gradient backward, costs its share of FT's
    operators whatever it freezes. --count-ops prints those counts and the dual/FT they predict."""
    bench = load_script('bench_ldt')
    bench.main(['--arch', 'msrresnet', '--device', 'cpu', '--patch', '6', '--batch', '1', '--count-ops',
                '--profile-passes', '2'])
    out = capsys.readouterr().out
    line = re.search(r'^aten ops per step \(kernel-launching / all; .*\): FT (\d+) / (\d+) \| primary (\d+) / (\d+) '
                     r'\(([\d.]+) / ([\d.]+) of FT\) \| auxiliary (\d+) / (\d+) \(([\d.]+) / ([\d.]+) of FT\)$', out, re.M)
    assert line, out
    ft_k, ft_a, p_k, p_a, _, _, a_k, a_a, _, _ = (float(v) for v in line.groups())
    assert 0 < p_k < p_a and 0 < a_k < a_a and 0 < ft_k < ft_a     # views and allocations: not kernels
    ratio = re.search(r'^  dual/FT if every op cost the same \(a launch-bound step\): ([\d.]+) by kernel-launching '
                      r'ops, ([\d.]+) by all ops$', out, re.M)
    assert ratio and abs(float(ratio.group(1)) - (p_k + a_k) / ft_k) < 1e-3 and \
        abs(float(ratio.group(2)) - (p_a + a_a) / ft_a) < 1e-3
    assert 'time/iter' not in out     # counted, not timed
    assert bench.ADAM_FOREACH is True     # the optimizer counted as CUDA runs it
    x = torch.ones(2, 3)
    with bench.OpCounter() as counter:   # views, a detach, an allocation, a host read: no kernel; an add: one
        x.view(-1), x.t(), x[0], x.detach(), torch.empty(3), x.sum().item(), x + 1
    assert (counter.kernels, counter.all) == (2, 8), (counter.kernels, counter.all)   # the sum and the add
    with bench.OpCounter() as counter:   # reshape of a transposed tensor: a copy, then a view untracked as one
        x.t().reshape(-1)
    assert (counter.kernels, counter.all) == (1, 3), (counter.kernels, counter.all)   # t, clone, _unsafe_view


def test_bench_ldt_counts_on_a_cpu_what_a_gpu_step_dispatches(monkeypatch, capsys):
    """--count-ops on a CPU: MambaIR's scan runs the Triton backend's host code with its launches
    replaced by uncounted zero-fills (a few allocations and sums per call, where the CPU's torch
    scan runs hundreds of operators), a conv whose weight is frozen and bias trains stays one
    fused convolution, and everything is as before once the count is done."""
    from basicsr_ldt.ldt import freezing
    from test_selective_scan import make_inputs
    import archs.scan.dispatch as dispatch
    bench = load_script('bench_ldt')
    monkeypatch.delenv(dispatch.BACKEND_ENV, raising=False)
    args, _ = make_inputs('grouped', 20, 'D+bias+softplus', dim=8, groups=4)

    def count(fn):
        with bench.OpCounter() as counter:
            fn()
        return counter.kernels

    def scan():
        out = dispatch.selective_scan(**args, delta_softplus=True)
        torch.autograd.grad(out.sum(), list(args.values()))
    conv = torch.nn.Conv2d(3, 3, 3)
    freezing.set_trainable(conv, {'bias'})
    x = torch.ones(1, 3, 5, 5)
    on_cpu = (count(scan), count(lambda: conv(x)))
    earlier = ('cuda:1', 'forward', ())            # a check made before: still there after the count
    monkeypatch.setattr(dispatch, '_triton_checked', {earlier})
    with bench.dispatched_as_on_a_gpu():
        scan()                                     # the variant's first-call check, uncounted as in count_ops
        as_on_gpu = (count(scan), count(lambda: conv(x)))
        assert torch.equal(dispatch.selective_scan(**args, delta_softplus=True), torch.zeros(2, 8, 20))
        import archs.scan.triton_launches as launches
        with monkeypatch.context() as m:     # the zero-fills are not counted: as many as launches that do nothing
            m.setattr(launches.ScanLaunch, 'run', lambda launch: launch.outputs)
            assert count(scan) == as_on_gpu[0]
    assert on_cpu[0] > 100 and as_on_gpu[0] < 25, (on_cpu, as_on_gpu)
    assert (on_cpu[1], as_on_gpu[1]) == (2, 1)     # convolution + add_ of the bias, or the fused one
    assert (count(scan), count(lambda: conv(x))) == on_cpu and dispatch.BACKEND_ENV not in os.environ
    assert dispatch._triton_checked == {earlier}
    monkeypatch.setenv(dispatch.BACKEND_ENV, 'torch')
    with pytest.raises(ValueError, match='inside'):   # restored when the body raises, its own error kept
        with bench.dispatched_as_on_a_gpu():
            os.environ.pop(dispatch.BACKEND_ENV)
            raise ValueError('inside')
    assert os.environ[dispatch.BACKEND_ENV] == 'torch' and not dispatch._on_gpu(torch.device('cpu'))
    monkeypatch.delenv(dispatch.BACKEND_ENV)
    profiled_as = []                              # the partition comes from real profiling, on the CPU's scan
    partition = bench.profile_partition
    monkeypatch.setattr(bench, 'profile_partition',
                        lambda *a: profiled_as.append(dispatch._on_gpu(torch.device('cpu'))) or partition(*a))
    bench.main(['--arch', 'mambair_small', '--device', 'cpu', '--patch', '6', '--batch', '1', '--count-ops',
                '--profile-passes', '2'])
    assert profiled_as == [False]
    out = capsys.readouterr().out
    assert "the Triton scan's host code with its kernel launches replaced by uncounted zero-fills" in out
    assert re.search(r'^  dual/FT if every op cost the same', out, re.M), out


def test_bench_ldt_builds_the_three_networks_in_their_released_configuration():
    from conftest import load_script
    bench = load_script('bench_ldt')
    hat, safmn = bench.build_network('hat', 4), bench.build_network('safmn', 4)
    assert (type(hat).__name__, hat.window_size, hat.embed_dim, len(hat.layers)) == ('HAT', 16, 180, 6)
    assert (type(safmn).__name__, len(safmn.feats), safmn.to_feat.out_channels) == ('SAFMN', 8, 36)
    assert type(bench.build_network('mambair', 4)).__name__ == 'MambaIR'


def test_bench_ldt_summary_line_holds_each_ratio_to_ft_of_the_run(monkeypatch, capsys):
    """The line gpu_check.sh and the results table read: FT ms, LDT/FT and LDT-S/FT time and memory;
    --no-profile-memory leaves out only the profiling-vs-N section."""
    from conftest import load_script
    from test_cuda_branches import _Tiny
    bench = load_script('bench_ldt')
    peaks = {'ft': 100 * 2**20, 'dual': 103 * 2**20, 'ldt_s': 101 * 2**20}
    monkeypatch.setattr(bench, 'build_network', lambda arch, scale: _Tiny(scale))
    monkeypatch.setattr(bench, 'worker_runs', lambda args, kind, **extra: [{'peak_bytes': peaks[kind]}])
    bench.main(['--device', 'cpu', '--patch', '6', '--batch', '1', '--scale', '2', '--iters', '2', '--warm', '1',
                '--profile-passes', '2', '--no-profile-memory'])
    out = capsys.readouterr().out
    assert 'profiling peak memory' not in out
    last = out.strip().splitlines()[-1]
    match = re.fullmatch(r'summary: arch=msrresnet amp=none LR patch 6 batch 1, threads \d+: FT ([\d.]+) ms \| '
                         r'LDT/FT time ([\d.]+) \| LDT/FT memory 1\.030 \| LDT-S/FT time ([\d.]+) \| '
                         r'LDT-S/FT memory 1\.010', last)
    assert match, last
    dual = re.search(r'wall time/iter .*\n  step ratio dual/FT = ([\d.]+)', out).group(1)
    ldt_s = re.search(r'LDT-S wall time/iter .*\n  step ratio LDT-S/FT = ([\d.]+)', out).group(1)
    assert (match.group(2), match.group(3)) == (dual, ldt_s)


def test_bench_ldt_in_process_on_cpu_prints_its_times_and_says_why_memory_is_not_measured(monkeypatch, capsys):
    """``--in-process`` on CPU divided by zero: after the timed steps the process already holds the
    memory a configuration needs, so its RSS growth read 0 bytes. Now every time figure is printed,
    memory is one line saying why it is not measured (no memory worker runs), and the summary says n/a."""
    from conftest import load_script
    from test_cuda_branches import _Tiny
    bench = load_script('bench_ldt')
    monkeypatch.setattr(bench, 'build_network', lambda arch, scale: _Tiny(scale))
    monkeypatch.setattr(bench, 'run_worker', lambda *a, **k: pytest.fail('a memory worker ran in-process on CPU'))
    bench.main(['--device', 'cpu', '--in-process', '--patch', '6', '--batch', '1', '--scale', '2', '--iters', '2',
                '--warm', '1', '--profile-passes', '2', '--samples', '2', '3'])
    out = capsys.readouterr().out
    assert re.search(r'^peak memory: not measured \(--in-process on CPU: memory the timed steps freed stays resident '
                     r'.*run without --in-process for a fresh process per configuration\)$', out, re.M), out
    assert 'LDT-S peak memory: not measured (as above)\n' in out and 'profiling peak memory' not in out
    for figure in (r'wall time/iter', r'process CPU time/iter', r'step ratio dual/FT = \d+\.\d+',
                   r'LDT-S wall time/iter', r'step ratio LDT-S/FT = \d+\.\d+'):
        assert re.search(figure, out), figure
    assert re.fullmatch(r'summary: arch=msrresnet amp=none LR patch 6 batch 1, threads \d+: FT [\d.]+ ms \| '
                        r'LDT/FT time [\d.]+ \| LDT/FT memory n/a \| LDT-S/FT time [\d.]+ \| LDT-S/FT memory n/a',
                        out.strip().splitlines()[-1]), out


def test_bench_ldt_kernel_time_sorts_kernels_by_kind_and_prints_dual_over_ft_by_kind(capsys):
    """--kernel-time (the GPU check's breakdown of the dual step's cost): CUDA kernel events summed
    by kind, the launching operators' events left out, and dual/FT printed for each kind."""
    bench = load_script('bench_ldt')
    names = {'_scan_forward_kernel': 'scan', '_scan_backward_kernel': 'scan',
             'void selective_scan_fwd_kernel<Ktraits>(SSMParamsBase)': 'scan',
             'void at::native::conv_depthwise2d_forward_kernel<1, float, int>': 'convolution',
             'sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64': 'convolution',
             'sm80_xmma_dgrad_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nchw': 'convolution',
             'sm90_xmma_wgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc': 'convolution',
             'void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false>':
                 'convolution',
             'nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNT': 'matmul',
             'void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_64x1_tn_align8>': 'matmul',
             'void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, false, true>': 'matmul',
             'void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>': 'optimizer',
             'void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda>': 'other',
             'void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>': 'other'}
    assert {name: bench.kernel_kind(name) for name in names} == names

    def event(name, micro, device):
        return types.SimpleNamespace(name=name, device_type=device,
                                     time_range=types.SimpleNamespace(elapsed_us=lambda: micro))
    cuda, cpu = bench.DeviceType.CUDA, bench.DeviceType.CPU
    events = [event('_scan_forward_kernel', 30.0, cuda), event('aten::addmm', 500.0, cpu),
              event('nvjet_hsh_64x8', 5.0, cuda), event('_scan_backward_kernel', 70.0, cuda),
              event('aten::copy_', 9.0, cpu), event('elementwise_kernel', 2.5, cuda)]
    assert bench.kernel_times(events) == {'scan': (100.0, 2), 'matmul': (5.0, 1), 'other': (2.5, 1)}

    def step(scan, matmul, wall):
        return {'wall_ms': wall, 'kinds': {'scan': (scan, 2), 'matmul': (matmul, 4)}}
    bench.report_kernel_time({'FT': step(10.0, 10.0, 25.0), 'primary': step(10.0, 6.0, 20.0),
                              'auxiliary': step(10.0, 4.0, 22.0)})
    out = capsys.readouterr().out.splitlines()
    assert out[1] == '  FT: 20.0 ms in 6 kernels (scan 10.0 (2), matmul 10.0 (4)) | wall 25.0 ms, kernels 80% of it'
    assert out[-1] == ('  dual/FT by kind (share of the FT kernel time): scan 2.00 (50% of FT), matmul 1.00 (50% of FT); '
                       'all kernels 1.500; wall 1.680')
    bench.report_kernel_time({'FT': {'wall_ms': 5.0, 'kinds': {}}, 'primary': step(1.0, 1.0, 4.0),
                              'auxiliary': step(1.0, 1.0, 4.0)})   # a profiler that saw no CUDA activity
    assert capsys.readouterr().out.splitlines()[-1] == ('  no CUDA kernel was recorded in the FT steps (the profiler '
                                                        'saw no CUDA activity)')


def test_bench_ldt_kernel_time_needs_cuda(capsys):
    bench = load_script('bench_ldt')
    with pytest.raises(SystemExit):
        bench.parse_args(['--arch', 'msrresnet', '--device', 'cpu', '--kernel-time'])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        'error: --kernel-time sums the CUDA kernels a step runs; expected --device cuda, got cpu')


def test_gpu_check_steps_runs_only_the_steps_named(tmp_path):
    """GPU_CHECK_STEPS (a second device call that remeasures a few steps): only the steps named run
    and are reported, in the script's order, and the goal on the whole check's seconds is not
    claimed from a subset."""
    os.environ['GPU_CHECK_STEPS'] = 'bench_ldt_hat,versions,overlap_safmn'
    try:
        result, _, folder = _run_with_fake_python(tmp_path, None, 0, '--scan-sweep')
    finally:
        del os.environ['GPU_CHECK_STEPS']
    report = (folder / 'report.txt').read_text()
    steps = re.findall(r'^\[(PASS|FAIL|SKIP)\] (\S+) \(', report, re.M)
    # (the stand-in prints no versions, so that step fails)
    assert steps == [('FAIL', 'versions'), ('PASS', 'bench_ldt_hat'), ('PASS', 'overlap_safmn')], report
    assert sorted(p.name for p in folder.glob('*.log')) == ['bench_ldt_hat.log', 'overlap_safmn.log', 'versions.log']
    assert ('  seconds of the steps gpu_check runs without --scan-sweep: not measured '
            '(GPU_CHECK_STEPS=bench_ldt_hat,versions,overlap_safmn)') in report.splitlines()
    assert '  hat LDT/FT time: 1.500 (goal <= 1.7) met' in report.splitlines()
    assert '  safmn LDT/FT time: not measured' in report.splitlines()
    assert ('  the dual step with every network within both LDT/FT goals: default: no (1 of 6 goals met) | one after the '
            'other: no (2 of 6 goals met) | overlapped branches: no (1 of 6 goals met)'
            ) == report.splitlines()[-2].split(' | overlapped within')[0]
    assert re.search(r'^result: 1 step\(s\) failed or skipped', report, re.M) and result.returncode != 0
    os.environ.update(GPU_CHECK_STEPS='overlap_hat', FAKE_NO_SUMMARY='1')   # no summary line: the step fails
    (tmp_path / 'again').mkdir()
    try:
        result, _, folder = _run_with_fake_python(tmp_path / 'again', None, 0, '--scan-sweep')
    finally:
        del os.environ['GPU_CHECK_STEPS'], os.environ['FAKE_NO_SUMMARY']
    report = (folder / 'report.txt').read_text()
    assert re.search(r'^\[FAIL\] overlap_hat', report, re.M), report
    assert '  hat LDT/FT time, overlapped branches: not measured' in report.splitlines()


SCAN_LOG = """device: NVIDIA H100 80GB HBM3; torch 2.11.0; shapes: u/delta (4, 1440, 2304), B/C (4, 4, 16, 2304)
torch      fwd+bwd: median 359.38 ms, best 267.77 ms, peak memory 316 MB above the inputs
           max |diff| / max |float64 reference|: output 1.7e-07, grads u 2.3e-07, delta 1.7e-07, A 1.3e-06, B 3.9e-07, C 3.1e-07, D 1.8e-07, delta_bias 2.8e-07
triton     fwd+bwd: median 1.55 ms, best 1.50 ms, peak memory 413 MB above the inputs
           max |diff| / max |float64 reference|: output 1.8e-07, grads u 2.3e-07, delta 1.7e-07, A 1.3e-06, B 3.1e-02, C 3.1e-07, D 1.8e-07, delta_bias 2.8e-07
{fail}speed-up of triton over torch: 231.9x (medians)
{summary}
"""
FAIL_LINE = 'FAIL: triton at batch 4, L 2304 grad B: max |diff| / max |float64 reference| 3.1e-02 > bound 1e-04'


def _gpu_check_function(name):
    """The one-line shell function ``name`` of gpu_check.sh, to run on a log of one's own."""
    return next(l for l in (REPO / 'scripts' / 'gpu_check.sh').read_text().splitlines() if l.startswith(f'{name}() {{'))


@pytest.mark.parametrize('check', ['check_scan', 'check_sweep'])
def test_a_fail_line_of_bench_scan_fails_the_scan_checks_and_is_reported(tmp_path, check):
    """bench_scan.py prints a FAIL line per quantity over its bound against the reference: the scan
    steps' checks fail on one (whatever else the log holds) and show it; without one they pass."""
    last = ('sweep 8,4,1,1,4,1,1: fwd+bwd median 1.284 ms, max rel diff 1.7e-06\n'
            'fastest correct at chunk 8: forward 0.482 ms, backward 0.802 ms: 8,4,1,1,4,1,1')
    results = {}
    for failing in (False, True):
        log = tmp_path / f'{failing}.log'
        log.write_text(SCAN_LOG.format(fail=FAIL_LINE + '\n' if failing else '',
                                       summary=('reference check: FAIL (1 of 16 quantities over their bounds)'
                                                if failing else 'reference check: PASS (16 quantities)')) + last + '\n')
        run = subprocess.run(['bash', '-c', f'{_gpu_check_function(check)}\n{check} "$1"', 'check', str(log)],
                             capture_output=True, text=True, timeout=60)
        results[failing] = run
    assert results[False].returncode == 0, results[False].stdout
    assert results[True].returncode == 1
    assert FAIL_LINE in results[True].stdout.splitlines()
    assert 'reference check: FAIL (1 of 16 quantities over their bounds)' in results[True].stdout.splitlines()


@pytest.mark.parametrize('rc', [1, 0], ids=['bench_exits_1', 'fail_line_only'])
def test_the_scan_step_fails_on_a_backend_over_its_bound(tmp_path, rc):
    """The whole step, with the stand-in printing a scan log whose Triton dB is 3e-2 off: the step is
    reported FAIL with what names the failure, whether the benchmark's exit status (1 with a FAIL line)
    or only its FAIL line (a log the check reads alone) tells."""
    log = tmp_path / 'scan.log'
    summary = 'reference check: FAIL (1 of 16 quantities over their bounds: triton at batch 4, L 2304 grad B 3.1e-02)'
    log.write_text(SCAN_LOG.format(fail=FAIL_LINE + '\n', summary=summary))
    os.environ.update(GPU_CHECK_STEPS='scan_backends', FAKE_SCAN_LOG=str(log), FAKE_SCAN_RC=str(rc))
    try:
        result, _, folder = _run_with_fake_python(tmp_path, None, 0)
    finally:
        for key in ('GPU_CHECK_STEPS', 'FAKE_SCAN_LOG', 'FAKE_SCAN_RC'):
            del os.environ[key]
    report = (folder / 'report.txt').read_text()
    assert re.search(rf'^\[FAIL\] scan_backends \(\d+ s, limit 60 s, exit {rc}; log: ', report, re.M), report
    assert f'    {summary}' in report.splitlines()
    if rc == 0:
        assert f'    {FAIL_LINE}' in report.splitlines()
    assert re.search(r'^result: 1 step\(s\) failed', report, re.M) and result.returncode != 0


def test_the_torchrun_steps_overrides_pass_the_checks_a_run_makes_first():
    """gpu_check.sh shortens the GPU demo run for torchrun with --force_yml; a slip there (a milestone
    beyond the shortened run) would cost a GPU lease to find. The same checks, here on the CPU."""
    import shlex
    from basicsr_ldt.common.option_file import force_options, load_option_file
    from basicsr_ldt.models.ldt_model import ldt_config_from_options
    from basicsr_ldt.models.option_values import check_basicsr_values
    script = (REPO / 'scripts' / 'gpu_check.sh').read_text()
    command = script[script.index('run_step torchrun_ddp_2'):]
    command = command[:command.index('\n#')].replace('\\\n', ' ')
    words = shlex.split(command)
    opt = load_option_file(str(REPO / words[words.index('-opt') + 1]))
    force_options(opt, words[words.index('--force_yml') + 1:])
    assert opt['train']['total_iter'] == 40 and opt['train']['scheduler']['milestones'] == [32]
    check_basicsr_values(opt, 'cuda')
    assert ldt_config_from_options(opt).head_warmup_iters == 10
