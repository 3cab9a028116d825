#!/usr/bin/env bash
# One-command check of everything that only a CUDA machine can run. About 5-8 minutes on one GPU whose
# Triton cache (~/.triton) holds the scan kernels; on a fresh machine add the kernels' first-call
# compile: 265 s for the float32 forward+backward set measured on an H100 machine (16 cores), and as
# long again for the bfloat16 set the training step uses. The step limits below allow for it.
#   1. device and versions (GPU, driver, CUDA, torch, triton, mamba-ssm);
#   2. the selective-scan backends against each other on CUDA at MambaIR's shapes (bench_scan);
#   3. a short MambaIR LDT training run on the demo data with amp bf16, through every phase
#      (head warm-up, profiling, dual training with DPU, composite checkpoints), then test.py;
#   4. a 2-process torchrun DDP run (NCCL with a GPU per rank; Gloo when ranks share one GPU);
#   5. bench_ldt: FT and LDT dual step, classic MambaIR x4, LR patch 48, bf16.
# Prints a short report and writes it to results/gpu_check/report.txt (full logs beside it).
# Exits non-zero when any step fails, and at once (one line) on a machine without CUDA.
#   bash scripts/gpu_check.sh            # PYTHON=... to pick the interpreter
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  echo "gpu_check: no CUDA device visible to PyTorch (torch.cuda.is_available() is False); run it on a machine with an NVIDIA GPU" >&2
  exit 2
fi

OUT=results/gpu_check
mkdir -p "$OUT"
REPORT="$OUT/report.txt"
: > "$REPORT"
FAILED=0

say() { echo "$*" | tee -a "$REPORT"; }

# run_step NAME LIMIT_S CHECK COMMAND...: runs COMMAND (log in $OUT/NAME.log), then CHECK (a shell
# function that prints the lines to report and returns non-zero when the output is wrong).
run_step() {
  local name="$1" limit="$2" check="$3"; shift 3
  local log="$OUT/$name.log" start=$SECONDS rc
  timeout "$limit" "$@" > "$log" 2>&1
  rc=$?
  local detail
  detail="$("$check" "$log" 2>&1)"
  local check_rc=$?
  local took=$((SECONDS - start))
  if [ "$rc" -eq 0 ] && [ "$check_rc" -eq 0 ]; then
    say "[PASS] $name (${took} s)"
  else
    FAILED=$((FAILED + 1))
    say "[FAIL] $name (${took} s, exit $rc; log: $log)"
    if [ "$rc" -eq 124 ]; then
      detail="timed out after ${limit} s"$'\n'"$(tail -n 5 "$log")"
    elif [ "$rc" -ne 0 ]; then   # the command's error lines, else its last lines
      detail="$(grep -E 'error:|Error' "$log" | tail -n 2)"
      [ -n "$detail" ] || detail="$(tail -n 3 "$log")"
    fi
  fi
  [ -n "$detail" ] && echo "$detail" | sed 's/^/    /' | tee -a "$REPORT"
}

check_versions() { cat "$1"; }
check_scan() { tail -n 12 "$1"; }
check_train() {
  local log exp=experiments/gpu_check_mambair_ldt ok=0
  log="$(ls -t "$exp"/train_gpu_check_mambair_ldt_*.log 2>/dev/null | head -n 1)"
  [ -n "$log" ] || { echo "no training log in $exp"; return 1; }
  for text in 'Mixed precision: autocast bf16' 'LDT phase: head warm-up' 'LDT phase: gradient profiling' \
              'LDT phase: dual training' 'LDT partition (var)'; do
    grep -q "$text" "$log" || { echo "missing in the log: '$text'"; ok=1; }
  done
  if grep -q 'non-finite loss' "$log"; then echo "non-finite losses were skipped:"; grep 'non-finite loss' "$log" | head -n 3; ok=1; fi
  for file in models/net_g_150.pth models/net_g_latest.pth ldt_partition.json; do
    [ -f "$exp/$file" ] || { echo "missing $exp/$file"; ok=1; }
  done
  grep 'LDT partition' "$log" | tail -n 1 | sed 's/^.*INFO: //'
  grep -E '# (psnr|ssim)' "$log" | tail -n 2 | sed 's/^\s*//'
  grep -E 'iter:\s*300,' "$log" | tail -n 1 | sed 's/^.*INFO: //'
  return $ok
}
check_test() {
  local table=results/gpu_check_mambair_test/metrics.md
  [ -f "$table" ] || { echo "no $table"; return 1; }
  grep '| Mean' "$table"
  "$PY" - "$table" <<'EOF'
import math, sys
cells = [line for line in open(sys.argv[1]) if line.startswith('| Mean')][0].split('|')
psnr = float(cells[3])
sys.exit(0 if math.isfinite(psnr) and psnr > 10 else f'mean PSNR {psnr} is not a plausible SR output')
EOF
}
check_ddp() {
  local log
  log="$(ls -t experiments/gpu_check_ddp/train_gpu_check_ddp_*.log 2>/dev/null | head -n 1)"
  [ -n "$log" ] || { echo 'no DDP training log'; return 1; }
  if grep -q 'NCCL needs one GPU per rank' "$1"; then
    echo 'backend: Gloo (both ranks share one GPU; NCCL needs a GPU per rank, so NCCL itself is not checked)'
  else
    echo 'backend: NCCL'
  fi
  grep 'replicas identical on 2 ranks at iteration 60' "$log" | tail -n 1 | sed 's/^.*INFO: //'
  grep -q 'replicas identical on 2 ranks at iteration 60' "$log"
}
check_bench() { grep -E 'bench_ldt:|partition:|step ratio|memory ratio|time/iter' "$1"; }

say "gpu_check $(date -u '+%Y-%m-%d %H:%M UTC') in $(pwd)"
run_step versions 60 check_versions "$PY" - <<'EOF'
import importlib.util, subprocess
import torch
props = torch.cuda.get_device_properties(0)
try:
    driver = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
                            capture_output=True, text=True, check=True).stdout.split()[0]
except (OSError, subprocess.CalledProcessError, IndexError):
    driver = 'unknown (no nvidia-smi)'
try:
    import triton
    triton_version = triton.__version__
except ImportError:
    triton_version = 'absent'
mamba = 'present' if importlib.util.find_spec('mamba_ssm') else 'absent'
print(f'GPU {torch.cuda.get_device_name(0)} ({props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor}) '
      f'x{torch.cuda.device_count()}, driver {driver}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}')
print(f'torch {torch.__version__}, triton {triton_version}, mamba-ssm {mamba}, bf16 {torch.cuda.is_bf16_supported()}')
EOF

run_step scan_backends 480 check_scan "$PY" scripts/bench_scan.py --device cuda

if [ ! -f datasets/DRealSR_demo/Test_x4/test_HR/Mix_023_x4.png ]; then   # the current demo build (DRealSR's names; Mix: 192 train + 10 test pairs)
  "$PY" scripts/make_demo_data.py --force --cameras Olympus Pan Sony DSC IMG Canon Mix > "$OUT/demo_data.log" 2>&1 \
    || say "[FAIL] demo data (log: $OUT/demo_data.log)"
fi
run_step train_mambair_ldt_bf16 600 check_train \
  "$PY" Train_pip.py -opt options/demo/train_demo_mambair_ldt_gpu.yml
run_step test_bf16 90 check_test "$PY" test.py -opt options/demo/test_demo_mambair_gpu.yml
run_step torchrun_ddp_2 150 check_ddp \
  "$PY" -m torch.distributed.run --nproc_per_node=2 --master_port="${GPU_CHECK_PORT:-29511}" Train_pip.py \
  -opt options/demo/train_demo_mambair_ldt_gpu.yml --launcher pytorch --force_yml name=gpu_check_ddp \
  datasets:train:batch_size_per_gpu=2 train:total_iter=60 ldt:head_warmup_iters=10 ldt:profile_iters=10 logger:save_checkpoint_freq=30 \
  logger:print_freq=30 val:val_freq=60
run_step bench_ldt_mambair_lr48 480 check_bench \
  "$PY" scripts/bench_ldt.py --device cuda --arch mambair --amp bf16 --patch 48 --iters 5 --samples 10 50

say "result: $([ "$FAILED" -eq 0 ] && echo 'all steps passed' || echo "$FAILED step(s) failed") (report: $REPORT)"
[ "$FAILED" -eq 0 ]
