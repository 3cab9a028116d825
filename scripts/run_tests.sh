#!/usr/bin/env bash
# Set up and run the test suite (this is what CI runs).
# The tests run in one worker process per core (pytest-xdist; TEST_WORKERS=0 runs them in this one
# process), each with one thread, and work is stolen between workers so that none idles at the end.
# Extra arguments go to pytest (e.g. tests/test_cli.py, -k resume).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh    # PY: the given Python, or the project's .venv on an externally managed one
bash scripts/install.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
"$PY" -m pytest -q -n "${TEST_WORKERS:-auto}" --dist worksteal "$@"
