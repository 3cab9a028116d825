#!/usr/bin/env bash
# Quick start: install, build the mini DRealSR (six cameras of one family + the Mix and Clean
# pretraining cameras), check the shipped pretrained small SAFMN (trained on Clean: classic SR pairs
# without degradation, as the paper's start is trained on bicubic DF2K) against bicubic, then run the
# demo study: FT, FT+EMA, LP-FT, DeFT, LDT (the paper's EMA coefficients, and rescaled to the run),
# LDT-S and the retention controls L2-SP (three lambdas) and WiSE-FT (FT interpolated with the start)
# fine-tuned on the Olympus camera from that start, 5 seeds each, plus Bicubic and the start, tested
# per camera and compared (results/demo/study.md, tradeoff.png), and print the calibration checks
# (scripts/demo_calibration.py).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh    # PY: the given Python, or the project's .venv on an externally managed one
# One thread per process, two study runs at a time (--jobs 2): the small demo network gains almost
# nothing from a second thread, so this halves the study's time on 2 cores. The demo tables in docs/results.md
# were computed this way; the thread count changes floating-point summation order and so the last
# digits (docs/results.md, "Reproducing the figures"). Set OMP_NUM_THREADS / DEMO_JOBS to override.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
bash scripts/install.sh
if [ ! -f datasets/DRealSR_demo/Test_x4/test_HR/Clean_023_x4.png ]; then   # the current build: one family, 12 train + 10 test pairs per camera, Mix and Clean 192 + 10, DRealSR's names
  "$PY" scripts/make_demo_data.py --force --cameras Olympus Pan Sony DSC IMG Canon Mix Clean
fi
if [ -f pretrained/demo/SAFMN_demo_Clean_x4.pth ]; then
  "$PY" scripts/pretrain_demo.py --check      # the shipped pretrained start, verified by the sha256 beside it
else
  "$PY" scripts/pretrain_demo.py --replace    # re-create it (stands in for released DF2K weights)
fi
"$PY" test.py -opt options/demo/test_demo_pretrained.yml   # Bicubic vs the pretrained start on every camera
"$PY" scripts/study.py -opt options/study/demo.yml --jobs "${DEMO_JOBS:-2}"   # finished runs are skipped on a re-run
"$PY" test.py -opt options/demo/test_demo.yml               # seed 0 side by side + comparison grids
"$PY" scripts/demo_calibration.py                          # start vs bicubic, FT vs start, methods vs bicubic
echo "Pretrained start vs Bicubic: results/demo_pretrained/metrics.md"
echo "Study tables: results/demo/study.md (also study.json, study.csv, study.png, tradeoff.png)"
echo "Seed-0 networks side by side: results/demo_test/metrics.md, grids in results/demo_test/compare/"
