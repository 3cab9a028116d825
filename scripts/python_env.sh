# Sourced by install.sh, run_tests.sh and demo.sh (from the repository root): sets PY, and exports it
# as PYTHON, to the interpreter to install into and run with. That is $PYTHON (default python3) as
# given, or, when that one is externally managed (PEP 668) and not in a virtual or conda environment,
# the project's virtual environment .venv/ (created on the first run, reused afterwards; one line
# on stderr says so). scripts/project_python.py decides.
PY="${PYTHON:-python3}"
_project_python=$("$PY" scripts/project_python.py)
if [ -n "$_project_python" ]; then
  PY="$_project_python"
fi
export PYTHON="$PY"
