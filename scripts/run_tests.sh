#!/usr/bin/env bash
# Set up and run the test suite (this is what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
bash scripts/install.sh
"$PY" -m pytest -q "$@"
