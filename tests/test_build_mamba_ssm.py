"""scripts/build_mamba_ssm.py's CPU-side steps (the GPU machine has no network and may lack
ninja): the sdist is unpacked once with a light ``mamba_ssm/__init__.py`` (its version kept, its
model imports gone), a carried ninja wheel's binary is unpacked and put on PATH when none is
there, and a missing sdist or ninja stops with one line naming what to download. The compile
itself needs nvcc and a GPU: run by the GPU step (archs/README.md)."""
import io
import os
import stat
import tarfile
import zipfile

import pytest

from conftest import load_script


def _sdist(folder):
    """A stand-in for mamba_ssm-2.3.2.post1.tar.gz with the files the script touches."""
    path = folder / 'mamba_ssm-9.9.tar.gz'
    files = {'mamba_ssm-9.9/mamba_ssm/__init__.py': '__version__ = "9.9"\n\nfrom mamba_ssm.models import Heavy\n',
             'mamba_ssm-9.9/csrc/selective_scan/selective_scan.cpp': '// source\n'}
    with tarfile.open(path, 'w:gz') as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_sdist_is_unpacked_with_a_light_package_init(tmp_path):
    build = load_script('build_mamba_ssm')
    tree = build.extract(_sdist(tmp_path), tmp_path / 'build')
    init = (tree / 'mamba_ssm' / '__init__.py').read_text()
    assert init.startswith('__version__ = "9.9"')
    assert not any(line.startswith(('import ', 'from ')) for line in init.splitlines()), init
    assert (tree / 'csrc' / 'selective_scan' / 'selective_scan.cpp').is_file()
    assert build.extract(_sdist(tmp_path), tmp_path / 'build') == tree   # again: reused, still light


def test_missing_sdist_names_the_option_and_the_download(tmp_path):
    build = load_script('build_mamba_ssm')
    with pytest.raises(SystemExit, match=r'--sdist .*no such file.*pip download'):
        build.extract(tmp_path / 'absent.tar.gz', tmp_path / 'build')


def test_carried_ninja_wheel_is_unpacked_onto_path_when_none_is_installed(tmp_path, monkeypatch):
    build = load_script('build_mamba_ssm')
    sdist = _sdist(tmp_path)
    monkeypatch.setattr(build.shutil, 'which', lambda name: None)
    monkeypatch.setenv('PATH', '/nowhere')
    with pytest.raises(SystemExit, match='no ninja on PATH and no ninja-\\*.whl'):
        build.ensure_ninja(sdist, tmp_path / 'build')
    with zipfile.ZipFile(tmp_path / 'ninja-1.0-py3-none-manylinux2014_x86_64.whl', 'w') as wheel:
        wheel.writestr('ninja-1.0.data/scripts/ninja', '#!/bin/sh\necho 1.0\n')
    ninja = build.ensure_ninja(sdist, tmp_path / 'build')
    assert ninja == str(tmp_path / 'build' / 'bin' / 'ninja')
    assert os.stat(ninja).st_mode & stat.S_IXUSR
    assert os.environ['PATH'].split(os.pathsep)[0] == str(tmp_path / 'build' / 'bin')
    monkeypatch.setattr(build.shutil, 'which', lambda name: '/usr/bin/ninja')
    assert build.ensure_ninja(sdist, tmp_path / 'other') == '/usr/bin/ninja'   # one on PATH wins


# mamba-ssm 2.3.2.post1's setup.py (the PyPI sdist, read 2026-11-26): CUDAExtension
# 'selective_scan_cuda' with these sources under csrc/selective_scan/ (lines 251-260) and these nvcc
# flags (lines 228-241; then '--threads 4' and one -gencode per architecture, lines 125-126 and 228).
SDIST_SOURCES = ['selective_scan.cpp', 'selective_scan_fwd_fp32.cu', 'selective_scan_fwd_fp16.cu',
                 'selective_scan_fwd_bf16.cu', 'selective_scan_bwd_fp32_real.cu', 'selective_scan_bwd_fp32_complex.cu',
                 'selective_scan_bwd_fp16_real.cu', 'selective_scan_bwd_fp16_complex.cu',
                 'selective_scan_bwd_bf16_real.cu', 'selective_scan_bwd_bf16_complex.cu']
SDIST_NVCC_FLAGS = ['-O3', '-std=c++17', '-U__CUDA_NO_HALF_OPERATORS__', '-U__CUDA_NO_HALF_CONVERSIONS__',
                    '-U__CUDA_NO_BFLOAT16_OPERATORS__', '-U__CUDA_NO_BFLOAT16_CONVERSIONS__',
                    '-U__CUDA_NO_BFLOAT162_OPERATORS__', '-U__CUDA_NO_BFLOAT162_CONVERSIONS__',
                    '--expt-relaxed-constexpr', '--expt-extended-lambda', '--use_fast_math', '--ptxas-options=-v',
                    '-lineinfo']


def test_the_build_compiles_what_the_packaged_setup_py_compiles():
    """The extension is built from the sources mamba-ssm's own setup.py lists and with its nvcc flags,
    less the two that only add output (ptxas's register report and line info); the architecture is
    the GPU present instead of setup.py's list."""
    build = load_script('build_mamba_ssm')
    assert sorted(build.SOURCES) == sorted(SDIST_SOURCES)
    assert build.NVCC_FLAGS == [f for f in SDIST_NVCC_FLAGS if f not in ('--ptxas-options=-v', '-lineinfo')]
