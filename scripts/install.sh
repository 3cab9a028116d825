#!/usr/bin/env bash
# Install everything the project needs into the current Python environment, or into the project's
# .venv/ when that Python is externally managed (PEP 668; scripts/python_env.sh).
# torch/torchvision come first so basicsr==1.4.2 can then build without build isolation.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
torch_reqs=$(grep -E '^(torch|torchvision)[<>=]' requirements.txt)
# shellcheck disable=SC2086
"$PY" -m pip install --quiet setuptools wheel cython $torch_reqs
"$PY" -m pip install --quiet --no-build-isolation -r requirements.txt
# The kernel tests run Triton's CPU interpreter, which before Triton 3.7 (torch <= 2.11 pins it)
# stops on numpy >= 2.4: there numpy stays below 2.4 (archs/scan/dispatch.py says why). Exit status 3
# is that conflict; any other failure of the check stops the install.
conflict=0
"$PY" -c 'import sys; from archs.scan.dispatch import interpreter_numpy_conflict as c; p = c(); p and print(p); sys.exit(3 if p else 0)' || conflict=$?
if [ "$conflict" -eq 3 ]; then
  "$PY" -m pip install --quiet 'numpy<2.4'
elif [ "$conflict" -ne 0 ]; then
  exit "$conflict"
fi
"$PY" -c "import basicsr_ldt, torch; print('basicsr-ldt ready: torch', torch.__version__)"
