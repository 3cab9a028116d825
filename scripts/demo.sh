#!/usr/bin/env bash
# Quick start: install, build the mini DRealSR, pretrain a small SAFMN on the clean camera, then run
# the demo study: FT, FT+EMA, LP-FT, DeFT and LDT fine-tuned on one source camera from that start,
# 3 seeds each, tested per target camera and compared (results/demo/study.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh    # PY: the given Python, or the project's .venv on an externally managed one
# The README's demo table was computed with 2 threads; the thread count changes floating-point
# summation order and so the last digits (README, "Reproducing the figures"). Set it to override.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
bash scripts/install.sh
if [ ! -f datasets/DRealSR_demo/Test_x4/test_HR/Clean_021_x1.png ]; then   # 12 train + 10 test pairs per camera
  "$PY" scripts/make_demo_data.py --force --cameras Olympus Pan Sony DSC IMG Canon Clean
fi
if [ ! -f experiments/demo_pretrain_Clean/models/net_g_latest.pth ]; then
  "$PY" Train_pip.py -opt options/demo/pretrain_demo.yml    # stands in for released DF2K weights
fi
"$PY" scripts/study.py -opt options/study/demo.yml          # finished runs are skipped on a re-run
"$PY" test.py -opt options/demo/test_demo.yml               # seed 0 side by side + comparison grids
echo "Study tables: results/demo/study.md (also study.json, study.csv, study.png)"
echo "Seed-0 networks side by side: results/demo_test/metrics.md, grids in results/demo_test/compare/"
