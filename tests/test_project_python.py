"""scripts/project_python.py + python_env.sh: an externally managed Python (PEP 668) gets the project's .venv,
any other interpreter is used as it is (what CI runs)."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, load_script

project_python = load_script('project_python')


def fake_stdlib(tmp_path, managed):
    folder = tmp_path / ('managed' if managed else 'plain') / 'lib' / 'python3.11'
    folder.mkdir(parents=True)
    if managed:
        (folder / 'EXTERNALLY-MANAGED').write_text('[externally-managed]\nError=use apt or a venv\n')
    return str(folder)


def test_detection_reads_the_marker_outside_environments(tmp_path):
    managed, plain = fake_stdlib(tmp_path, True), fake_stdlib(tmp_path, False)
    system = dict(prefix='/usr', base_prefix='/usr', environ={})
    assert project_python.externally_managed(managed, **system)
    assert not project_python.externally_managed(plain, **system)
    # Inside a virtual environment the base's marker does not apply (PEP 668).
    assert not project_python.externally_managed(managed, prefix=str(tmp_path / 'venv'), base_prefix='/usr', environ={})
    # A conda environment is used as it is.
    conda = tmp_path / 'conda'
    (conda / 'conda-meta').mkdir(parents=True)
    assert not project_python.externally_managed(managed, prefix=str(conda), base_prefix=str(conda), environ={})
    # The user told pip to install anyway.
    assert not project_python.externally_managed(managed, prefix='/usr', base_prefix='/usr',
                                                 environ={'PIP_BREAK_SYSTEM_PACKAGES': '1'})


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ('PIP_BREAK_SYSTEM_PACKAGES', 'PYTHON')}
    env.update(extra)
    return env


def source_python_env(repo, python):
    return subprocess.run(['bash', '-c', 'set -euo pipefail; source scripts/python_env.sh; echo "PY=$PY PYTHON=$PYTHON"'],
                          cwd=repo, env=clean_env(PYTHON=python), capture_output=True, text=True, timeout=300)


def test_an_interpreter_without_the_marker_is_used_as_it_is():
    """CI's case (pyenv's python3, or the environment running these tests): nothing changes, nothing is said."""
    if project_python.externally_managed():
        pytest.skip('this test process runs on an externally managed Python; the next test covers that case')
    result = source_python_env(REPO, sys.executable)
    assert result.returncode == 0 and result.stderr == ''
    assert result.stdout.strip() == f'PY={sys.executable} PYTHON={sys.executable}'


def test_an_externally_managed_interpreter_gets_the_project_venv(tmp_path):
    """A copy of the scripts in a scratch repository, run by an interpreter whose standard library holds the marker
    and which is not in an environment: .venv is created once, reused, and PY points into it."""
    repo = tmp_path / 'repo'
    (repo / 'scripts').mkdir(parents=True)
    for name in ('project_python.py', 'python_env.sh'):
        shutil.copy(REPO / 'scripts' / name, repo / 'scripts' / name)
    stdlib = fake_stdlib(tmp_path, True)
    # The system interpreter as PEP 668 sees it: base prefix = prefix, the marker in its stdlib folder.
    fake = tmp_path / 'python3'
    fake.write_text('#!/bin/sh\n'
                    f'exec {sys.executable} -c "import runpy, sys, sysconfig; sys.base_prefix = sys.prefix; '
                    'get = sysconfig.get_path; '
                    f"sysconfig.get_path = lambda name, *a, **k: {stdlib!r} if name == 'stdlib' else get(name, *a, **k); "
                    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')\" \"$@\"\n")
    fake.chmod(0o755)
    first = source_python_env(repo, str(fake))
    venv_python = repo / '.venv' / 'bin' / 'python'
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f'PY={venv_python} PYTHON={venv_python}'
    (line,) = first.stderr.strip().splitlines()
    assert line.endswith("is externally managed (PEP 668): created the project's virtual environment .venv/ and "
                         'installing there (activate it with: source .venv/bin/activate)')
    check = subprocess.run([str(venv_python), '-c', 'import sys, pip; print(sys.prefix != sys.base_prefix)'],
                           capture_output=True, text=True)
    assert check.stdout.strip() == 'True'   # a real virtual environment, with pip
    stamp = (repo / '.venv' / 'pyvenv.cfg').stat().st_mtime_ns
    again = source_python_env(repo, str(fake))
    assert again.stdout.strip() == f'PY={venv_python} PYTHON={venv_python}'
    assert "using the project's virtual environment .venv/" in again.stderr
    assert (repo / '.venv' / 'pyvenv.cfg').stat().st_mtime_ns == stamp   # reused, not rebuilt
    # install.sh, sourced again with PYTHON=.venv/bin/python (as run_tests.sh hands it on): used as it is, silently.
    inner = source_python_env(repo, str(venv_python))
    assert inner.stdout.strip() == f'PY={venv_python} PYTHON={venv_python}' and inner.stderr == ''


def test_venv_is_git_ignored():
    result = subprocess.run(['git', 'check-ignore', '-q', '.venv/bin/python'], cwd=REPO)
    assert result.returncode == 0


FAKE_PIP_PYTHON = """#!/usr/bin/env bash
case "$*" in
  scripts/project_python.py) exit 0;;                          # not externally managed
  *interpreter_numpy_conflict*) [ "$FAKE_CONFLICT" = broken ] && { echo 'ImportError: no torch' >&2; exit 1; }
    [ "$FAKE_CONFLICT" = yes ] || exit 0
    echo "Triton 3.6.0's CPU interpreter fails with numpy 2.5.2 (...)"; exit 3;;
  *'-m pip install'*) echo "$*" >> "$PIP_LOG";;
  *) echo 'basicsr-ldt ready';;
esac
"""


@pytest.mark.parametrize('conflict', ['no', 'yes', 'broken'])
def test_install_keeps_numpy_below_2_4_only_where_tritons_interpreter_needs_it(tmp_path, conflict):
    """Triton < 3.7 (torch <= 2.11 pins it) cannot run the kernel tests on numpy >= 2.4
    (archs/scan/dispatch.py, interpreter_numpy_conflict): install.sh then installs numpy<2.4, and
    leaves numpy alone everywhere else (CI's torch brings a Triton with the fix); a check that cannot
    run at all stops the install instead of changing numpy."""
    (tmp_path / 'scripts').mkdir()
    for name in ('install.sh', 'python_env.sh'):
        shutil.copy(REPO / 'scripts' / name, tmp_path / 'scripts' / name)
    shutil.copy(REPO / 'requirements.txt', tmp_path / 'requirements.txt')
    fake = tmp_path / 'fake_python'
    fake.write_text(FAKE_PIP_PYTHON)
    fake.chmod(0o755)
    log = tmp_path / 'pip.log'
    result = subprocess.run(['bash', str(tmp_path / 'scripts' / 'install.sh')], capture_output=True, text=True,
                            env=clean_env(PYTHON=str(fake), PIP_LOG=str(log), FAKE_CONFLICT=conflict))
    installs = log.read_text().splitlines()
    assert installs[1] == '-m pip install --quiet --no-build-isolation -r requirements.txt'
    assert installs[2:] == (['-m pip install --quiet numpy<2.4'] if conflict == 'yes' else [])
    assert ("CPU interpreter fails with numpy" in result.stdout) == (conflict == 'yes')
    assert result.returncode == (1 if conflict == 'broken' else 0), result.stderr
    assert ('basicsr-ldt ready' in result.stdout) == (conflict != 'broken')
