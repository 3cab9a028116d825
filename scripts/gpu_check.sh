#!/usr/bin/env bash
# One run, on a fresh GPU machine, of everything only a CUDA machine can check, inside 6 minutes.
# A lent GPU session has 15 minutes of device time in all, machine start included, so the whole run
# has a budget (GPU_CHECK_BUDGET_S, default 350 s) and every step a hard limit, clamped to what is
# left of the budget (a step that would start with under 5 s left is skipped and reported). Steps,
# with their limits sized for one H100 (16 cores) and a cold Triton cache (first, when basicsr does not
# import, the wheels carried in gpu_carry/wheels/ are installed offline and put on every step's PYTHONPATH):
#   1. versions      10 s  GPU, driver, CUDA, torch, triton, mamba-ssm
#   2. scan_backends 60 s  the selective-scan backends side by side on CUDA (the scan issue's benchmark;
#                          MambaIR's bf16-autocast call, bf16 read as it is, against float32 copies)
#   3. demo_data     15 s  the demo cameras (LR 48) and a second set of larger images (LR 115) if absent
#   4. train         65 s  small MambaIR, LDT in bf16 through every phase (head warm-up, profiling,
#                          dual training with DPU), two validations (iterations 60 and 100) of both
#                          sets with the official cutting in bf16, composite saved at 60 and 100
#   5. test_bf16     30 s  test.py in bf16 on that composite, 32-pixel tiles, both sets
#   6. torchrun      40 s  a 2-process torchrun run (NCCL with a GPU per rank; Gloo when they share one)
#   7. bench_*   50/50/30 s  bench_ldt.py in bf16 for classic MambaIR, HAT and SAFMN x4 (LR 48, batch 4), eager:
#                          FT step, LDT dual step as the defaults run it (on CUDA the branches overlapped
#                          within the sequential step's peak), LDT-S step, peak memory, ratios to FT of the run
#   8. scan_mamba_ssm 110 s only when mamba-ssm's sdist was carried (GPU_CHECK_MAMBA_SDIST, default
#                          gpu_carry/mamba_ssm-*.tar.gz) and mamba_ssm does not import: its selective_scan_cuda
#                          is taken from GPU_CHECK_MAMBA_PREBUILT (default gpu_carry/mamba_ssm_ext, written by
#                          build_mamba_ssm.py --carry-to against this torch) when it imports, else built for
#                          this GPU by scripts/build_mamba_ssm.py in the background from the start (8 compile
#                          jobs, beside steps 1-7), then the scan benchmark runs again with mamba-ssm
#                          beside Triton and torch (Triton / mamba-ssm from the same run), and
#                          scan_static_report.py --mamba-ssm prints both kernels' instructions per update
# With --scan-sweep (the scan issue's GPU session; budget 540 s unless GPU_CHECK_BUDGET_S is set):
#   1b. scan_compile 30 s  right after step 1: scan_static_report.py's cold compile of the Triton scan for
#                          this GPU's architecture, empty cache (the figure archs/README.md gives for
#                          this CPU), beside the mamba-ssm build
#   9. overlap_*  80/65/40 s  bench_ldt.py --overlap-branches for MambaIR, HAT and SAFMN: step 7's figures and
#                          the dual step's other schedules: the branches one after the other, and overlapped (the
#                          auxiliary's forward during the primary's backward, each branch on its own CUDA stream)
#                          without a bound and within ldt.overlap_memory 1.05, time and peak memory as ratios to FT
#  10. bench_ldt_mambair_mamba_ssm 45 s  only when mamba-ssm was built: bench_ldt.py --compare-scan triton
#                          cuda, MambaIR's FT step on the Triton scan against mamba-ssm's, paired per batch,
#                          and one more step on each for its peak memory
#  11. scan_sweep   110 s  bench_scan.py --sweep over the Triton launch settings in SWEEP_CONFIGS (each
#                          against the float64 reference, beside mamba-ssm when it was built), at the
#                          training shape, then the forward alone at a 250x250 tile of batch 1
# With --speed (the training-speed issue's GPU session, #59; budget 540 s unless GPU_CHECK_BUDGET_S is set) only
# these run, so that the compiles fit:
#   1, 2   versions, scan_backends (the four-way scan checked against its float64 reference there too)
#   7.  bench_ldt_mambair 110 s  LDT dual / FT with the defaults (train.compile auto on CUDA: FT compiled, LDT eager;
#                          the run's cold compile)
#   S0. graph_check 60 s   bench_ldt.py --check-graph: FT steps replayed as a CUDA graph (train.cuda_graph) against
#                          the same steps eager, eager and compiled blocks, and LDT's dual step compiled and
#                          side by side in one graph (fails on a FAIL line)
#   S1. upstream_mambair 120 s  bench_ldt.py --compare-upstream, classic MambaIR x4 bf16 (LR 48, batch 4): the FT
#                          step as upstream runs it (mamba-ssm's scan on float32 direction copies, foreach Adam,
#                          eager; waits for the mamba-ssm build) against the Triton kernels on the copies,
#                          mamba-ssm with fused Adam (what scan_backend auto trains with where mamba-ssm imports),
#                          the defaults (the directions inside the kernels, fused Adam) eager and compiled, and both
#                          replayed as a CUDA graph, rotating per batch; peak memory; the SS2D scan forward at a
#                          250x250 tile
#   S2. bench_ldt_mambair_compiled 170 s  step 7 with every network's blocks compiled (--compile true: whether
#                          LDT's dual step gains as FT's did, and its compile time), and beside them FT and the
#                          dual step replayed as CUDA graphs (--cuda-graph: LDT graphed / FT graphed, time, memory;
#                          a graph per branch, and both side by side in one)
# (kernel_time_mambair_compiled 70 s: bench_ldt.py --kernel-time --compile true, the compiled FT step's and branches'
# kernel time by kind and the GPU's busy share; upstream_hat 120 s and upstream_safmn 60 s, the same as S1 for HAT
# and SAFMN, run 9's figures in docs/results.md: run only when GPU_CHECK_STEPS names them.)
# GPU_CHECK_STEPS=name,name,... runs only those steps (a second call that remeasures a few; the mamba-ssm
# build still starts when a sdist is carried). Prints each step's time and a report, written with the
# logs to $OUT/gpu_check/ (results/gpu_check/ when OUT is unset). Exits non-zero when a step fails or
# is skipped, and at once with one line on a machine without CUDA.
#   bash scripts/gpu_check.sh            # PYTHON=... to pick the interpreter
#   bash scripts/gpu_check.sh --scan-sweep
#   bash scripts/gpu_check.sh --speed
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
SWEEP=0
SPEED=0
case "${1:-}" in
  --scan-sweep) SWEEP=1 ;;
  --speed) SPEED=1 ;;
  '') ;;
  *) echo "gpu_check: unknown argument '$1'; expected none, --scan-sweep or --speed" >&2; exit 2 ;;
esac
BUDGET_S="${GPU_CHECK_BUDGET_S:-$([ "$SWEEP" -eq 1 ] || [ "$SPEED" -eq 1 ] && echo 540 || echo 350)}"
# The Triton launch settings the sweep times, CHUNK,FWD_BLOCK_D,FWD_WARPS,FWD_STAGES,BWD_BLOCK_D,BWD_WARPS,BWD_STAGES
# (none spills when compiled for sm_90 with Triton 3.8); the first is the default. The H100 sweeps found
# eight-position chunks fastest forward+backward at the training shape and sixteen-position forwards with
# one warp fastest at the batch-1 tile; the H200 sweep (archs/README.md) a one-warp backward of four
# channels fastest: 2 is the former default, 3-8 vary the default's blocks, warps and pipelining one at
# a time, 9-11 are sixteen-position chunks with backwards of one warp or two, 12 the defaults before
# the eight-position chunks, as a baseline.
SWEEP_CONFIGS="${GPU_CHECK_SWEEP_CONFIGS:-8,4,1,1,4,1,1 8,4,1,1,8,2,1 8,8,2,1,4,1,1 8,4,1,1,4,1,2 8,4,1,2,4,1,1 8,4,1,1,8,1,1 8,2,1,1,4,1,1 8,8,1,1,4,1,1 16,4,1,1,4,1,1 16,4,1,1,4,2,1 16,4,1,1,4,2,3 16,4,2,1,4,2,1}"
# The ldt.overlap_memory bounds the --scan-sweep overlap steps measure besides the default step's 1.0 (the
# goals name them as given here)
OVERLAP_BOUNDS="1.05"
KILL_S=5   # a step that ignores SIGTERM at its limit is killed this much later
ONLY="${GPU_CHECK_STEPS:-}"   # comma-separated step names: run only these (the others are not reported)
SPEED_STEPS="versions,scan_backends,bench_ldt_mambair,graph_check,upstream_mambair,bench_ldt_mambair_compiled"
[ "$SPEED" -eq 1 ] && [ -z "$ONLY" ] && ONLY="$SPEED_STEPS"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  echo "gpu_check: no CUDA device visible to PyTorch (torch.cuda.is_available() is False); run it on a machine with an NVIDIA GPU" >&2
  exit 2
fi

DIR="${OUT:-results}/gpu_check"
mkdir -p "$DIR"
REPORT="$DIR/report.txt"
: > "$REPORT"
FAILED=0

say() { echo "$*" | tee -a "$REPORT"; }

# run_step NAME LIMIT_S CHECK COMMAND...: runs COMMAND (log in $DIR/NAME.log) for at most LIMIT_S
# seconds or what is left of the budget, then CHECK (a shell function that prints the lines to
# report and returns non-zero when the output is wrong).
run_step() {
  local name="$1" limit="$2" check="$3"; shift 3
  [ -z "$ONLY" ] || [[ ",$ONLY," == *",$name,"* ]] || return 0   # GPU_CHECK_STEPS: a second call reruns a few
  local log="$DIR/$name.log" left=$((BUDGET_S - SECONDS - KILL_S)) start=$SECONDS rc
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    FAILED=$((FAILED + 1))
    say "[SKIP] $name ($((BUDGET_S - SECONDS)) s left of the ${BUDGET_S} s budget)"
    return
  fi
  timeout -k "$KILL_S" "$limit" "$@" > "$log" 2>&1
  rc=$?
  local detail
  detail="$("$check" "$log" 2>&1)"
  local check_rc=$?
  local took=$((SECONDS - start))
  if [ "$rc" -eq 0 ] && [ "$check_rc" -eq 0 ]; then
    say "[PASS] $name (${took} s, limit ${limit} s)"
  else
    FAILED=$((FAILED + 1))
    say "[FAIL] $name (${took} s, limit ${limit} s, exit $rc; log: $log)"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      detail="timed out after ${limit} s"$'\n'"$(tail -n 5 "$log")"
    elif [ "$rc" -ne 0 ]; then   # the command's error lines, else its last lines
      detail="$(grep -E 'error:|Error' "$log" | tail -n 2)"
      [ -n "$detail" ] || detail="$(tail -n 3 "$log")"
    fi
  fi
  [ -n "$detail" ] && echo "$detail" | sed 's/^/    /' | tee -a "$REPORT"
}

newest_log() { ls -t "$1"/train_"$(basename "$1")"_*.log 2>/dev/null | head -n 1; }

check_versions() { cat "$1"; grep -q '^GPU ' "$1" && grep -q '^torch ' "$1"; }
check_data() {
  local small large
  small=$(ls datasets/DRealSR_demo/Test_x4/test_LR 2>/dev/null | wc -l)
  large=$(ls datasets/DRealSR_demo_large/Test_x4/test_LR 2>/dev/null | wc -l)
  echo "test pairs: $small of LR 48 (datasets/DRealSR_demo), $large of LR 115 (datasets/DRealSR_demo_large)"
  [ "$small" -ge 50 ] && [ "$large" -ge 10 ]
}
check_train() {
  local exp=experiments/gpu_check_mambair_ldt ok=0 log
  log="$(newest_log "$exp")"
  [ -n "$log" ] || { echo "no training log in $exp"; return 1; }
  for text in 'Mixed precision: autocast bf16' 'Validation inference: official LDT sections' 'LDT phase: head warm-up' \
              'LDT phase: gradient profiling' 'LDT phase: dual training' 'LDT partition (var)'; do
    grep -q "$text" "$log" || { echo "missing in the log: '$text'"; ok=1; }
  done
  for set in demo_targets demo_large; do
    [ "$(grep -c "Validation $set" "$log")" -eq 2 ] || { echo "expected 2 validations of $set"; ok=1; }
  done
  if grep -q 'non-finite loss' "$log"; then echo "non-finite losses were skipped:"; grep 'non-finite loss' "$log" | head -n 3; ok=1; fi
  for file in models/net_g_60.pth models/net_g_latest.pth ldt_partition.json; do
    [ -f "$exp/$file" ] || { echo "missing $exp/$file"; ok=1; }
  done
  grep 'LDT partition' "$log" | tail -n 1 | sed 's/^.*INFO: //'
  grep -E '# (psnr|ssim)' "$log" | tail -n 4 | sed 's/^\s*//'
  grep -E 'iter:\s*100,' "$log" | tail -n 1 | sed 's/^.*INFO: //'
  return $ok
}
check_test() {
  local table=results/gpu_check_mambair_test/metrics.md
  [ -f "$table" ] || { echo "no $table"; return 1; }
  grep -h 'Inference: ' "$(ls -t results/gpu_check_mambair_test/test_*.log | head -n 1)" | tail -n 1 | sed 's/^.*INFO: //'
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
  log="$(newest_log experiments/gpu_check_ddp)"
  [ -n "$log" ] || { echo 'no DDP training log'; return 1; }
  if grep -q 'NCCL needs one GPU per rank' "$1"; then
    echo 'backend: Gloo (both ranks share one GPU; NCCL needs a GPU per rank, so NCCL itself is not checked)'
  else
    echo 'backend: NCCL'
  fi
  grep 'replicas identical on 2 ranks at iteration 40' "$log" | tail -n 1 | sed 's/^.*INFO: //'
  grep -q 'replicas identical on 2 ranks at iteration 40' "$log"
}
check_kernel_time() { grep -E '^kernel time per step|^  (FT|primary|auxiliary):|^  dual/FT by kind' "$1"; grep -q '^  FT: .* kernels' "$1"; }
# (the warm-up line: the first step of a run that compiles shows the cold compile; inductor's caches on disk
# make the later ones warm)
check_bench() { grep -E "bench_ldt:|^dual step:|step ratio|memory ratio|reserved|time/iter|overlapped branches|one after the other|warm-up steps|replayed steps' memory|^summary:" "$1"; grep -q '^summary:' "$1"; }

# Scan backends (step 2): the torch scan, the Triton scan and mamba-ssm where it imports, at MambaIR's
# training shape and a 250x250 validation tile, each against a float64 reference.
scan_backends() { "$PY" scripts/bench_scan.py --device cuda --skip-loop --repeats 10; }
# A FAIL line is a quantity over its bound against the reference (bench_scan.py exits 1 then): the step fails.
check_scan() { grep -E '^device:|not run|first fwd\+bwd|fwd\+bwd: median|max \|diff\||triton / mamba-ssm|MambaIR scan_backend|MambaIR bf16 call|bf16 call fwd\+bwd|mamba-ssm (forward|backward)|warp-instructions per update|static report|^FAIL|^reference check' "$1"; grep -q '^FAIL' "$1" && return 1; grep -q 'fwd+bwd: median' "$1"; }

# mamba-ssm built in the background (step 8): MAMBA_BUILD holds the build; MAMBA_BUILD/rc its exit
# status once it ends (the step runs in a child shell, which cannot wait for this shell's job).
MAMBA_SDIST="${GPU_CHECK_MAMBA_SDIST:-$(ls gpu_carry/mamba_ssm-*.tar.gz 2>/dev/null | head -n 1)}"
MAMBA_BUILD="${GPU_CHECK_MAMBA_BUILD:-/tmp/mamba_ssm_build}"
MAMBA_PREBUILT="${GPU_CHECK_MAMBA_PREBUILT:-gpu_carry/mamba_ssm_ext}"
scan_mamba_ssm() {
  until [ -f "$MAMBA_BUILD/rc" ]; do sleep 2; done
  [ "$(cat "$MAMBA_BUILD/rc")" -eq 0 ] || { echo "mamba-ssm build failed (log: $DIR/mamba_ssm_build.log)"; return 1; }
  with_mamba_ssm "$PY" scripts/bench_scan.py --device cuda --skip-loop --repeats 10 || return
  # the static count beside the timing: warp-instructions per update of both kernels, read from their SASS
  "$PY" scripts/scan_static_report.py --arch "$(gpu_arch)" --shape train --mamba-ssm "$MAMBA_BUILD" \
    || echo "the static report of the mamba-ssm build failed (the timing above stands)"
}
gpu_arch() { "$PY" -c 'import torch; major, minor = torch.cuda.get_device_capability(); print(f"{major}{minor}")'; }
# with_mamba_ssm COMMAND...: COMMAND with the built mamba-ssm on PYTHONPATH (as it is when none was built)
with_mamba_ssm() {
  if [ -f "$MAMBA_BUILD/rc" ] && [ "$(cat "$MAMBA_BUILD/rc")" -eq 0 ]; then
    PYTHONPATH="$("$PY" scripts/build_mamba_ssm.py --sdist "$MAMBA_SDIST" --build-dir "$MAMBA_BUILD" --print-path):${PYTHONPATH:-}" "$@"
  else
    "$@"
  fi
}
scan_compile() {
  local arch
  arch=$(gpu_arch) || return
  # Not pinned to a core: pinned to the machine's last core, the first H100 run's compile printed its
  # forward (1.4 s) and then nothing until its 20 s limit; unpinned on the same machine the whole set
  # took 1.9 s. Triton compiles each kernel on one thread either way.
  TRITON_CACHE_DIR="$(mktemp -d)" "$PY" scripts/scan_static_report.py --arch "$arch"
}
check_compile() { grep -E '^static figures|^sm_|^cold compile' "$1"; grep -q '^cold compile of the whole set' "$1"; }
scan_sweep() { with_mamba_ssm "$PY" scripts/bench_scan.py --device cuda --skip-loop --repeats 10 --sweep $SWEEP_CONFIGS; }
check_sweep() { grep -E '^(mamba-ssm|sweep|fastest|FAIL|reference check)' "$1"; grep -q '^FAIL' "$1" && return 1; grep -q '^fastest correct' "$1"; }
bench_mamba_ssm() {
  with_mamba_ssm "$PY" scripts/bench_ldt.py --device cuda --arch mambair --amp bf16 --patch 48 \
    --batch 4 --warm 2 --iters 10 --compare-scan triton cuda
}
# The FT step on Triton against the FT step on mamba-ssm, paired batch by batch in this step's log (two
# separate runs drifted by 9% between them, more than the goal's 5%).
check_bench_mamba_ssm() {
  local line
  line=$(grep -m 1 '^FT step scan triton / cuda: ' "$1") || return 1
  echo "$line" | sed -n 's/^FT step scan triton \/ cuda: \([0-9.]*\) .*| triton \([0-9.]*\) ms, cuda \([0-9.]*\) ms.*/FT step: Triton \2 ms, mamba-ssm \3 ms (medians), paired per batch: Triton \/ mamba-ssm \1 (goal <= 1.05)/p'
  grep -m 1 '^FT step peak memory' "$1"
  return 0
}

# The FT step as upstream runs it against the project's defaults (--speed): MambaIR waits for mamba-ssm's build
upstream_mambair() {
  if [ "$BUILD_MAMBA" -eq 1 ]; then until [ -f "$MAMBA_BUILD/rc" ]; do sleep 2; done; fi
  with_mamba_ssm "$PY" scripts/bench_ldt.py --device cuda --arch mambair --amp bf16 --patch 48 --batch 4 \
    --warm 3 --iters 10 --compare-upstream
}
check_graph() { grep -E '^graph check|^summary graph' "$1"
  grep -q '^summary graph: eager PASS | compiled PASS | dual compiled PASS | dual side by side PASS$' "$1"; }
check_upstream() { grep -E '^FT step|^SS2D scan forward|^summary upstream' "$1"; grep -q '^summary upstream' "$1"; }
# "<name> / upstream: <ratio>" of a --compare-upstream log; the peak memory of <name> as a fraction of upstream's
upstream_ratio() { sed -n "s/^FT step $2 \/ upstream: \([0-9.]*\) .*/\1/p" "$1" 2>/dev/null | head -n 1; }
upstream_memory() { sed -n "s/^FT step peak memory.* $2 [0-9]* MiB (\([0-9.]*\) of upstream).*/\1/p" "$1" 2>/dev/null | head -n 1; }

# The issues' goals, each a ratio from this run's logs beside its bound (#38: the scan and the FT step
# against mamba-ssm; #39: LDT/FT and LDT-S/FT for the three networks, the check's own time); "not
# measured" where a step did not run or printed no figure.
goal() {   # goal NAME VALUE BOUND
  if [ -z "$2" ]; then echo "  $1: not measured"
  else awk -v n="$1" -v v="$2" -v b="$3" 'BEGIN { printf "  %s: %s (goal <= %s) %s\n", n, v, b, (v + 0 <= b + 0) ? "met" : "MISSED" }'; fi
}
summary_ratio() { grep -h '^summary:' "$1" 2>/dev/null | tail -n 1 | sed -n "s/.*| $2 \([0-9.]*\).*/\1/p"; }
goals() {
  local before arch
  before=$(cat "$REPORT")   # the steps' lines, read before these lines join them
  echo 'goals (ratios from this run):'
  goal 'scan fwd+bwd Triton / mamba-ssm, training shape' \
    "$(sed -n 's/^triton \/ mamba-ssm fwd+bwd: \([0-9.]*\).*/\1/p' "$DIR/scan_mamba_ssm.log" 2>/dev/null | head -n 1)" 1.0
  goal 'FT step Triton / mamba-ssm' "$(echo "$before" | sed -n 's/.*: Triton \/ mamba-ssm \([0-9.]*\) (goal.*/\1/p' | head -n 1)" 1.05
  for arch in mambair hat safmn; do
    goal "$arch LDT/FT time" "$(summary_ratio "$DIR/bench_ldt_$arch.log" 'LDT\/FT time')" 1.7
    goal "$arch LDT/FT memory" "$(summary_ratio "$DIR/bench_ldt_$arch.log" 'LDT\/FT memory')" 1.05
    goal "$arch LDT-S/FT time" "$(summary_ratio "$DIR/bench_ldt_$arch.log" 'LDT-S\/FT time')" 1.05
  done
  if [ "$SPEED" -eq 1 ]; then   # #59: the defaults against upstream's way, and LDT/FT with the defaults
    local log="$DIR/upstream_mambair.log"
    # train.compile: auto compiles MambaIR's FT step on CUDA: the defaults are the compiled step
    goal 'MambaIR FT step, defaults (compiled) / upstream' "$(upstream_ratio "$log" 'ours compiled')" 0.75
    goal 'MambaIR FT peak memory, defaults (compiled) / upstream' "$(upstream_memory "$log" 'ours compiled')" 1.0
    goal 'MambaIR FT step, eager / upstream' "$(upstream_ratio "$log" 'ours eager')" 0.75
    goal 'MambaIR FT peak memory, eager / upstream' "$(upstream_memory "$log" 'ours eager')" 1.0
    # train.cuda_graph (auto leaves it off until these are met): the step replayed, compiled and eager
    goal 'MambaIR FT step, compiled + CUDA graph / upstream' "$(upstream_ratio "$log" 'ours compiled graphed')" 0.75
    goal 'MambaIR FT peak memory, compiled + CUDA graph / upstream' "$(upstream_memory "$log" 'ours compiled graphed')" 1.0
    goal 'MambaIR FT step, eager + CUDA graph / upstream' "$(upstream_ratio "$log" 'ours graphed')" 0.75
    goal 'MambaIR FT peak memory, eager + CUDA graph / upstream' "$(upstream_memory "$log" 'ours graphed')" 1.0
    # scan_backend auto trains with mamba-ssm where it imports: should it prefer the Triton kernels there?
    local triton mamba
    triton=$(upstream_ratio "$log" 'ours eager'); mamba=$(upstream_ratio "$log" 'ours mamba-ssm')
    goal 'MambaIR FT step eager, Triton / mamba-ssm (what auto runs where mamba-ssm imports)' \
      "$([ -n "$triton" ] && [ -n "$mamba" ] && awk -v a="$triton" -v b="$mamba" 'BEGIN { printf "%.3f", a / b }')" 1.0
    goal 'SS2D scan forward at a 250x250 tile, Triton / mamba-ssm' \
      "$(sed -n 's/^SS2D scan forward.*: triton \/ cuda \([0-9.]*\) .*/\1/p' "$log" 2>/dev/null | head -n 1)" 1.0
    goal 'mambair LDT/FT time with the defaults' "$(summary_ratio "$DIR/bench_ldt_mambair.log" 'LDT\/FT time')" 1.5
    goal 'mambair LDT/FT time, every network compiled' \
      "$(summary_ratio "$DIR/bench_ldt_mambair_compiled.log" 'LDT\/FT time')" 1.5
    # train.cuda_graph on LDTSRModel: each branch replayed, against FT replayed (all compiled)
    goal 'mambair LDT/FT time, compiled + CUDA graphs' \
      "$(summary_ratio "$DIR/bench_ldt_mambair_compiled.log" 'LDT graphed\/FT graphed time')" 1.5
    goal 'mambair LDT/FT memory, compiled + CUDA graphs' \
      "$(summary_ratio "$DIR/bench_ldt_mambair_compiled.log" 'LDT graphed\/FT graphed memory')" 1.05
    # both branches side by side in one graph (overlap_branches true, overlap_memory null), against FT replayed
    goal 'mambair LDT/FT time, compiled + one CUDA graph side by side' \
      "$(summary_ratio "$DIR/bench_ldt_mambair_compiled.log" 'LDT side by side\/FT graphed time')" 1.5
    goal 'mambair LDT/FT memory, compiled + one CUDA graph side by side' \
      "$(summary_ratio "$DIR/bench_ldt_mambair_compiled.log" 'LDT side by side\/FT graphed memory')" 1.05
  fi
  if [ "$SWEEP" -eq 1 ]; then   # ldt.overlap_branches: the same bounds, for the dual step that option runs
    local mode modes bound
    # each mode as 'its words in the goal|its name on the summary line'
    modes=('one after the other|sequential' 'overlapped branches|overlapped')
    for bound in $OVERLAP_BOUNDS; do
      modes+=("overlapped within x$bound memory|bounded x$bound")
    done
    for arch in mambair hat safmn; do
      for mode in "${modes[@]}"; do
        goal "$arch LDT/FT time, ${mode%%|*}" "$(summary_ratio "$DIR/overlap_$arch.log" "LDT ${mode##*|}\/FT time")" 1.7
        goal "$arch LDT/FT memory, ${mode%%|*}" "$(summary_ratio "$DIR/overlap_$arch.log" "LDT ${mode##*|}\/FT memory")" 1.05
      done
    done
  fi
  # the check without --scan-sweep: its steps' times from this report (machine start not included)
  if [ -n "$ONLY" ]; then echo "  seconds of the steps gpu_check runs without --scan-sweep: not measured (GPU_CHECK_STEPS=$ONLY)"; return; fi
  goal 'seconds of the steps gpu_check runs without --scan-sweep' "$(echo "$before" | sed -n 's/^\[[A-Z]*\] \([a-z0-9_]*\) (\([0-9]*\) s.*/\1 \2/p' \
    | awk '$1 != "scan_compile" && $1 != "scan_sweep" && $1 != "bench_ldt_mambair_mamba_ssm" && $1 !~ /^overlap_/ { s += $2 } END { print s + 0 }')" 360
}

# Which ways of running the dual step keep every network within both LDT/FT goals (time and memory), read
# from the goal lines above: the line a session deciding #39 (and the overlap defaults) looks for first.
dual_modes() {
  awk '/^  (mambair|hat|safmn) LDT\/FT (time|memory)/ {
         mode = $0; sub(/^  [a-z]+ LDT\/FT (time|memory)/, "", mode); sub(/:.*/, "", mode); sub(/^, /, "", mode)
         if (mode == "") mode = "default"
         if (!(mode in total)) order[++n] = mode
         total[mode]++; if ($NF == "met") met[mode]++ }
       END { if (!n) exit
             printf "  the dual step with every network within both LDT/FT goals:"
             for (i = 1; i <= n; i++) { m = order[i]
               printf "%s %s: %s (%d of %d goals met)", (i > 1 ? " |" : ""), m, (met[m] == 6 && total[m] == 6 ? "yes" : "no"), met[m], total[m] }
             print "" }' "$REPORT"
}

demo_data() {
  if [ ! -f datasets/DRealSR_demo/Test_x4/test_HR/Mix_023_x4.png ]; then   # the current demo build
    "$PY" scripts/make_demo_data.py --force --cameras Olympus Pan Sony DSC IMG Canon Mix || return
  fi
  if ! ls datasets/DRealSR_demo_large/Test_x4/test_LR/sony_*_x1.png > /dev/null 2>&1; then   # LR 115: other sizes
    "$PY" scripts/make_demo_data.py --force --out datasets/DRealSR_demo_large --cameras Pan Sony \
      --train-per-camera 1 --test-per-camera 5 --test-hr-size 460
  fi
}

export PY DIR MAMBA_SDIST MAMBA_BUILD SWEEP_CONFIGS
export -f scan_backends scan_mamba_ssm with_mamba_ssm gpu_arch scan_compile scan_sweep bench_mamba_ssm demo_data \
  upstream_mambair   # run_step runs them under timeout, in a child bash

say "gpu_check $(date -u '+%Y-%m-%d %H:%M UTC') in $(pwd), budget ${BUDGET_S} s"
# Packages the GPU image lacks: its python3 has torch, triton, einops, timm, OpenCV, scikit-image,
# tensorboard (device tool, KINDS.md) but not basicsr. Wheels carried in gpu_carry/wheels/ are installed,
# without the network, into a folder put on PYTHONPATH for every step (each wheel apart: one that does
# not fit this Python does not stop the others).
WHEELS_DIR="${GPU_CHECK_WHEELS:-gpu_carry/wheels}"
SITE="${GPU_CHECK_SITE:-/tmp/gpu_check_site}"
if ! "$PY" -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("basicsr") else 1)' >/dev/null 2>&1; then
  if ls "$WHEELS_DIR"/*.whl > /dev/null 2>&1; then
    installed=""
    for wheel in "$WHEELS_DIR"/*.whl; do
      if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$wheel" \
          >> "$DIR/wheels.log" 2>&1; then
        installed="$installed $(basename "$wheel")"
      else
        say "packages: $(basename "$wheel") did not install (log: $DIR/wheels.log)"
      fi
    done
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    say "packages: basicsr absent; installed into $SITE:${installed:- none}"
  else
    say "packages: basicsr is not installed and no wheels are carried in $WHEELS_DIR: the training, test and benchmark steps will fail (docs/architectures-and-gpu.md, GPU check)"
  fi
fi
BUILD_MAMBA=0
if [ -n "$MAMBA_SDIST" ] && ! "$PY" -c 'import mamba_ssm' >/dev/null 2>&1; then
  BUILD_MAMBA=1
  mkdir -p "$MAMBA_BUILD" && rm -f "$MAMBA_BUILD/rc"
  prebuilt=()
  [ -d "$MAMBA_PREBUILT" ] && prebuilt=(--prebuilt "$MAMBA_PREBUILT")
  say "mamba-ssm: selective_scan_cuda ${prebuilt:+from $MAMBA_PREBUILT if it imports, else }built from $MAMBA_SDIST in the background (log: $DIR/mamba_ssm_build.log)"
  ( timeout -k "$KILL_S" $((BUDGET_S - KILL_S)) "$PY" scripts/build_mamba_ssm.py --sdist "$MAMBA_SDIST" \
      --build-dir "$MAMBA_BUILD" --jobs 8 "${prebuilt[@]}" > "$DIR/mamba_ssm_build.log" 2>&1; echo $? > "$MAMBA_BUILD/rc" ) &
  MAMBA_PID=$!
  trap 'kill -- -$MAMBA_PID 2>/dev/null; pkill -P $MAMBA_PID 2>/dev/null' EXIT   # no compile outlives the check
elif [ -z "$MAMBA_SDIST" ]; then
  say "mamba-ssm: no sdist carried (gpu_carry/mamba_ssm-*.tar.gz), not built; the scan step compares what imports"
fi
run_step versions 10 check_versions "$PY" - <<'EOF'
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
[ "$SWEEP" -eq 1 ] && run_step scan_compile 30 check_compile bash -c scan_compile
run_step scan_backends 60 check_scan bash -c scan_backends
run_step demo_data 15 check_data bash -c demo_data
run_step train_mambair_ldt_bf16 65 check_train "$PY" Train_pip.py -opt options/demo/train_demo_mambair_ldt_gpu.yml
run_step test_bf16 30 check_test "$PY" test.py -opt options/demo/test_demo_mambair_gpu.yml
run_step torchrun_ddp_2 40 check_ddp \
  "$PY" -m torch.distributed.run --nproc_per_node=2 --master_port="${GPU_CHECK_PORT:-29511}" Train_pip.py \
  -opt options/demo/train_demo_mambair_ldt_gpu.yml --launcher pytorch --force_yml name=gpu_check_ddp \
  datasets:train:batch_size_per_gpu=2 train:total_iter=40 "train:scheduler:milestones=[32]" ldt:head_warmup_iters=10 \
  ldt:profile_iters=10 logger:save_checkpoint_freq=20 logger:print_freq=20 val:val_freq=40
# eager, as every earlier run measured them; with --speed (#59: LDT/FT with the defaults) as train.compile: auto
# runs them on CUDA: MambaIR's FT step compiled, LDT's dual step eager (bench_ldt_mambair_compiled compiles both)
for arch in mambair:50 hat:50 safmn:30; do
  if [ "$SPEED" -eq 1 ]; then compile=auto; limit=110; else compile=false; limit="${arch##*:}"; fi
  run_step "bench_ldt_${arch%%:*}" "$limit" check_bench "$PY" scripts/bench_ldt.py --device cuda --arch "${arch%%:*}" \
    --amp bf16 --patch 48 --batch 4 --warm 2 --iters 8 --no-profile-memory --compile "$compile"
done

if [ "$SPEED" -eq 1 ]; then
  export BUILD_MAMBA
  # train.cuda_graph: the replayed FT step against the eager one, before any figure of it is trusted
  run_step graph_check 60 check_graph "$PY" scripts/bench_ldt.py --device cuda --arch mambair --amp bf16 --patch 48 \
    --batch 4 --warm 2 --iters 3 --check-graph
  run_step upstream_mambair 120 check_upstream bash -c upstream_mambair
  run_step bench_ldt_mambair_compiled 170 check_bench "$PY" scripts/bench_ldt.py --device cuda \
    --arch mambair --amp bf16 --patch 48 --batch 4 --warm 2 --iters 8 --no-profile-memory --compile true --cuda-graph
  run_step kernel_time_mambair_compiled 70 check_kernel_time "$PY" scripts/bench_ldt.py --device cuda --arch mambair \
    --amp bf16 --patch 48 --batch 4 --warm 2 --iters 3 --kernel-time --compile true
  for arch in hat:120 safmn:60; do
    run_step "upstream_${arch%%:*}" "${arch##*:}" check_upstream "$PY" scripts/bench_ldt.py --device cuda \
      --arch "${arch%%:*}" --amp bf16 --patch 48 --batch 4 --warm 3 --iters 10 --compare-upstream
  done
fi
[ "$BUILD_MAMBA" -eq 1 ] && run_step scan_mamba_ssm 110 check_scan bash -c scan_mamba_ssm
if [ "$SWEEP" -eq 1 ]; then
  # first the measurements no earlier run has made, then the goal the scan issue needs, so that a long step
  # before cannot leave them no budget; the sweep, the least needed now, last
  for arch in mambair:80 hat:65 safmn:40; do
    run_step "overlap_${arch%%:*}" "${arch##*:}" check_bench "$PY" scripts/bench_ldt.py --device cuda --arch "${arch%%:*}" \
      --amp bf16 --patch 48 --batch 4 --warm 2 --iters 8 --no-profile-memory --overlap-branches --overlap-memory $OVERLAP_BOUNDS
  done
  [ "$BUILD_MAMBA" -eq 1 ] && run_step bench_ldt_mambair_mamba_ssm 45 check_bench_mamba_ssm bash -c bench_mamba_ssm
  run_step scan_sweep 110 check_sweep bash -c scan_sweep
fi

goals | tee -a "$REPORT"
dual_modes | tee -a "$REPORT"
say "result: $([ "$FAILED" -eq 0 ] && echo 'all steps passed' || echo "$FAILED step(s) failed or skipped") in ${SECONDS} s of the ${BUDGET_S} s budget (report: $REPORT)"
[ "$FAILED" -eq 0 ]
