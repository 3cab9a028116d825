#!/usr/bin/env bash
# Set up and run the test suite (this is what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh    # PY: the given Python, or the project's .venv on an externally managed one
bash scripts/install.sh
"$PY" -m pytest -q "$@"
