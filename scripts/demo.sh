#!/usr/bin/env bash
# Quick start: install, build the mini DRealSR, train FT and LDT on one source camera, compare per target camera.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
bash scripts/install.sh
if [ ! -d datasets/DRealSR_demo ]; then
  "$PY" scripts/make_demo_data.py
fi
"$PY" Train_pip.py -opt options/demo/train_demo_ft.yml      # plain fine-tuning (FT)
"$PY" Train_pip.py -opt options/demo/train_demo_ldt.yml     # LDT, same network, data and budget
"$PY" test.py -opt options/demo/test_demo.yml
echo "Per-camera table: results/demo_test/metrics.md"
