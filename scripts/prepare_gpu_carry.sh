#!/usr/bin/env bash
# Fill gpu_carry/ (ignored) with what scripts/gpu_check.sh needs on a lent GPU machine, which has no
# network and whose image lacks basicsr: mamba-ssm's sdist and a ninja wheel (its build), basicsr and lmdb
# wheels for the image's Python 3.12 (gpu_carry/wheels/), and mamba-ssm's selective_scan extension built
# here, for one architecture, against the image's torch (gpu_carry/mamba_ssm_ext/; the whole script 5.5 min
# on 2 cores), so the device spends none of its minutes compiling. A device call carries at most 64 MiB with
# the tracked files: the result is refused when it would not fit.
#
#   bash scripts/prepare_gpu_carry.sh          # then one device call with carry ["gpu_carry"]
#
# Settings (environment): PY312 a Python 3.12 to build the venv with (default python3.12, else pyenv's
# 3.12.1); GPU_TORCH the image's torch (default torch==2.11.0 = 2.11.0+cu130); GPU_ARCH (default 90: H100,
# H200); CARRY_DIR (default gpu_carry); CARRY_VENV (default /tmp/venv_gpu; reused when it exists).
# Needs PyPI and nvcc (no GPU). Built in CARRY_DIR.partial, which replaces CARRY_DIR only when complete:
# a failed or oversized run leaves CARRY_DIR as it was.
set -euo pipefail
cd "$(dirname "$0")/.."

CARRY_DIR="${CARRY_DIR:-gpu_carry}"
GPU_TORCH="${GPU_TORCH:-torch==2.11.0}"
GPU_ARCH="${GPU_ARCH:-90}"
CARRY_VENV="${CARRY_VENV:-/tmp/venv_gpu}"
LIMIT_MIB=64
MAMBA=mamba-ssm==2.3.2.post1
fail() { echo "prepare_gpu_carry: $*" >&2; exit 1; }

is_312() { "$1" -c 'import sys; assert sys.version_info[:2] == (3, 12)' > /dev/null 2>&1; }
if [ -n "${PY312:-}" ]; then
  is_312 "$PY312" || fail "PY312=$PY312: expected a Python 3.12 (the GPU image's)"
else
  for candidate in python3.12 "$HOME/.pyenv/versions/3.12.1/bin/python3.12"; do
    if is_312 "$candidate"; then PY312=$candidate; break; fi
  done
  [ -n "${PY312:-}" ] || fail "no Python 3.12 (the GPU image's) found: python3.12, $HOME/.pyenv/versions/3.12.1/bin/python3.12; set PY312"
fi

partial="$CARRY_DIR.partial"
rm -rf "$partial"
trap 'rm -rf "$partial"' EXIT
mkdir -p "$partial/wheels"
pip_() { python3 -m pip "$@"; }
MAMBA_SKIP_CUDA_BUILD=TRUE pip_ download --no-deps --no-binary :all: --no-build-isolation "$MAMBA" -d "$partial"
pip_ download --no-deps --only-binary :all: --platform manylinux2014_x86_64 ninja -d "$partial"
pip_ download --no-deps --no-binary :all: basicsr==1.4.2 -d "$partial/sdists"
pip_ wheel --no-deps --no-build-isolation "$partial"/sdists/basicsr-1.4.2.tar.gz -w "$partial/wheels"
rm -rf "$partial/sdists"
pip_ download --no-deps --only-binary :all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 lmdb -d "$partial/wheels"

[ -x "$CARRY_VENV/bin/python" ] || "$PY312" -m venv "$CARRY_VENV"
"$CARRY_VENV/bin/python" -m pip install "$GPU_TORCH" numpy einops packaging
sdist=$(ls "$partial"/mamba_ssm-*.tar.gz | head -n 1)
"$CARRY_VENV/bin/python" scripts/build_mamba_ssm.py --sdist "$sdist" --arch "$GPU_ARCH" --jobs "$(getconf _NPROCESSORS_ONLN)" \
  --carry-to "$partial/mamba_ssm_ext"

carry=$(du -sb "$partial" | cut -f1)
tracked=$(git ls-files -z | xargs -0 du -cb 2> /dev/null | tail -n 1 | cut -f1)
total_mib=$(( (carry + tracked) / 1048576 ))
[ $(( carry + tracked )) -le $(( LIMIT_MIB * 1048576 )) ] \
  || fail "$CARRY_DIR would be $(( carry / 1048576 )) MiB, with the tracked files ${total_mib} MiB: over the ${LIMIT_MIB} MiB a device call carries; $CARRY_DIR left as it was"
rm -rf "$CARRY_DIR"
mv "$partial" "$CARRY_DIR"
echo "prepare_gpu_carry: $CARRY_DIR ready, $(( carry / 1048576 )) MiB (${total_mib} MiB with the tracked files, of ${LIMIT_MIB}):"
(cd "$CARRY_DIR" && find . -type f | sort | sed 's/^/  /')
