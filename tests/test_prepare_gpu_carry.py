"""scripts/prepare_gpu_carry.sh: what a lent GPU machine (no network) needs, prepared here in one command.

Run with stand-ins for python3 and Python 3.12 on PATH (downloads and the build are PyPI's and nvcc's
minutes): they log their arguments and write the files the real ones would.
"""
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAKE = r"""#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$FAKE_LOG"
case "$*" in
  "-c import sys"*) [ "${FAKE_NO_312:-0}" = 1 ] && exit 1; exit 0;;
  "-m venv "*) mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; exit 0;;
esac
args=("$@"); out=
for ((i = 0; i < ${#args[@]}; i++)); do case "${args[i]}" in -d|-w|--carry-to) out="${args[i+1]}";; esac; done
[ -n "$out" ] && mkdir -p "$out"
case "$*" in
  *mamba-ssm==*) touch "$out/mamba_ssm-2.3.2.post1.tar.gz";;
  *" ninja -d "*) touch "$out/ninja-1.13.0-py3-none-manylinux_2_12_x86_64.whl";;
  *"download"*basicsr==1.4.2*) touch "$out/basicsr-1.4.2.tar.gz";;
  *" wheel "*) touch "$out/basicsr-1.4.2-py3-none-any.whl";;
  *" lmdb -d "*) touch "$out/lmdb-1.7.5-cp312-cp312-manylinux_2_17_x86_64.whl";;
  *build_mamba_ssm.py*) mkdir -p "$out/ext-sm90-torch2.11.0"
    truncate -s "${FAKE_LIB_BYTES:-4096}" "$out/ext-sm90-torch2.11.0/selective_scan_cuda.so";;
esac
"""


def _run(tmp_path, **env):
    bin_dir = tmp_path / 'bin'
    if not bin_dir.exists():
        bin_dir.mkdir()
        for name in ('python3', 'python3.12'):
            (bin_dir / name).write_text(FAKE)
            (bin_dir / name).chmod(0o755)
    log = tmp_path / 'calls.log'
    log.write_text('')
    env = dict(os.environ, PATH=f'{bin_dir}:{os.environ["PATH"]}', HOME=str(tmp_path), FAKE_LOG=str(log),
               CARRY_DIR=str(tmp_path / 'gpu_carry'), CARRY_VENV=str(tmp_path / 'venv'), **env)
    if 'PY312' not in env:
        env.pop('PY312', None)
    result = subprocess.run(['bash', str(REPO / 'scripts' / 'prepare_gpu_carry.sh')], env=env, capture_output=True,
                            text=True, timeout=120)
    return result, log.read_text().splitlines()


def test_it_downloads_builds_against_the_images_torch_and_swaps_the_folder_in_whole(tmp_path):
    result, calls = _run(tmp_path)
    assert result.returncode == 0, result.stderr
    carry, venv = tmp_path / 'gpu_carry', tmp_path / 'venv'
    files = [
        'mamba_ssm-2.3.2.post1.tar.gz', 'mamba_ssm_ext/ext-sm90-torch2.11.0/selective_scan_cuda.so',
        'ninja-1.13.0-py3-none-manylinux_2_12_x86_64.whl', 'wheels/basicsr-1.4.2-py3-none-any.whl',
        'wheels/lmdb-1.7.5-cp312-cp312-manylinux_2_17_x86_64.whl']   # the basicsr sdist is not carried
    assert sorted(str(p.relative_to(carry)) for p in carry.rglob('*') if p.is_file()) == files
    assert not (tmp_path / 'gpu_carry.partial').exists()
    partial = f'{carry}.partial'
    assert calls[1:] == [
        f'python3 -m pip download --no-deps --no-binary :all: --no-build-isolation mamba-ssm==2.3.2.post1 -d {partial}',
        f'python3 -m pip download --no-deps --only-binary :all: --platform manylinux2014_x86_64 ninja -d {partial}',
        f'python3 -m pip download --no-deps --no-binary :all: basicsr==1.4.2 -d {partial}/sdists',
        f'python3 -m pip wheel --no-deps --no-build-isolation {partial}/sdists/basicsr-1.4.2.tar.gz -w {partial}/wheels',
        f'python3 -m pip download --no-deps --only-binary :all: --python-version 3.12 --implementation cp '
        f'--platform manylinux2014_x86_64 lmdb -d {partial}/wheels',
        f'python3.12 -m venv {venv}',
        'python -m pip install torch==2.11.0 numpy einops packaging',
        f'python scripts/build_mamba_ssm.py --sdist {partial}/mamba_ssm-2.3.2.post1.tar.gz --arch 90 --jobs '
        f'{os.cpu_count()} --carry-to {partial}/mamba_ssm_ext']
    assert calls[0].startswith('python3.12 -c import sys')   # the interpreter checked first
    assert result.stdout.startswith(f'prepare_gpu_carry: {carry} ready, 0 MiB (')
    _, again = _run(tmp_path, GPU_ARCH='80')   # the venv is reused; another architecture; the new carry replaces the old
    assert f'python3.12 -m venv {venv}' not in again and any('--arch 80 ' in call for call in again)
    assert sorted(str(p.relative_to(carry)) for p in carry.rglob('*') if p.is_file()) == files


def test_a_carry_over_64_mib_or_no_python_3_12_leaves_the_folder_as_it_was(tmp_path):
    carry = tmp_path / 'gpu_carry'
    carry.mkdir()
    (carry / 'kept').write_text('an earlier carry')
    result, _ = _run(tmp_path, FAKE_LIB_BYTES=str(63 * 2 ** 20))   # 63 MiB + the tracked files: over
    assert result.returncode == 1 and result.stderr.startswith(f'prepare_gpu_carry: {carry} would be 63 MiB, with the '
                                                               'tracked files ')
    assert 'over the 64 MiB a device call carries' in result.stderr
    assert [p.name for p in carry.iterdir()] == ['kept'] and not (tmp_path / 'gpu_carry.partial').exists()
    result, calls = _run(tmp_path, FAKE_NO_312='1')
    assert result.returncode == 1 and result.stderr == (
        f"prepare_gpu_carry: no Python 3.12 (the GPU image's) found: python3.12, {tmp_path}/.pyenv/versions/3.12.1/bin/"
        'python3.12; set PY312\n')
    assert len(calls) == 1 and calls[0].startswith('python3.12 -c') and [p.name for p in carry.iterdir()] == ['kept']
    result, calls = _run(tmp_path, PY312='python3', FAKE_NO_312='1')   # a given interpreter that is not 3.12
    assert result.returncode == 1 and result.stderr == (
        "prepare_gpu_carry: PY312=python3: expected a Python 3.12 (the GPU image's)\n")
    assert calls == ['python3 -c import sys; assert sys.version_info[:2] == (3, 12)'] and (carry / 'kept').exists()
