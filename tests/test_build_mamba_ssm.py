"""scripts/build_mamba_ssm.py's CPU-side steps (the GPU machine has no network and may lack
ninja): the sdist is unpacked once with a light ``mamba_ssm/__init__.py`` (its version kept, its
model imports gone), a carried ninja wheel's binary is unpacked and put on PATH when none is
there, a missing sdist or ninja stops with one line naming what to download, the CUDA toolkit is
found behind an nvcc wrapper, and the C++ standard is the one torch's headers need. The whole build
runs on a CPU machine with nvcc (``--arch 90``); loading the extension and timing it needs a GPU
(scripts/gpu_check.sh)."""
import io
import os
import re
import stat
import subprocess
import sys
import tarfile
import zipfile

import pytest

from conftest import load_script


def _sdist(folder):
    """A stand-in for mamba_ssm-2.3.2.post1.tar.gz with the files the script touches."""
    path = folder / 'mamba_ssm-9.9.tar.gz'
    files = {'mamba_ssm-9.9/mamba_ssm/__init__.py': '__version__ = "9.9"\n\nfrom mamba_ssm.models import Heavy\n',
             'mamba_ssm-9.9/mamba_ssm/ops/selective_scan_interface.py': 'selective_scan_fn = None\n',
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
    less the two that only add output (ptxas's register report and line info) and its C++ standard
    (the one torch's headers need: below); the architecture is the GPU present instead of setup.py's list."""
    build = load_script('build_mamba_ssm')
    assert sorted(build.SOURCES) == sorted(SDIST_SOURCES)
    assert build.NVCC_FLAGS == [f for f in SDIST_NVCC_FLAGS if f not in ('--ptxas-options=-v', '-lineinfo', '-std=c++17')]


@pytest.mark.parametrize('guard, expected', [
    # torch 2.14.1's include/ATen/ATen.h, lines 4-6
    ('#if !defined(_MSC_VER) && __cplusplus < 202002L\n#error C++20 or later compatible compiler is required '
     'to use ATen.\n#endif\n', '-std=c++20'),
    ('#pragma once\n#include <ATen/Context.h>\n', '-std=c++17'),   # a torch whose headers take C++17
])
def test_cxx_standard_is_the_one_torchs_headers_need(tmp_path, monkeypatch, guard, expected):
    """mamba-ssm's setup.py compiles with -std=c++17; against torch 2.14.1 its C++ file then stops on
    ATen's C++20 guard (seen here), so the standard follows the installed torch's ATen.h."""
    import torch.utils.cpp_extension
    build = load_script('build_mamba_ssm')
    (tmp_path / 'ATen').mkdir()
    (tmp_path / 'ATen' / 'ATen.h').write_text(guard)
    monkeypatch.setattr(torch.utils.cpp_extension, 'include_paths', lambda *a, **k: [str(tmp_path)])
    assert build.cxx_standard() == expected


def _toolkit(folder):
    """A stand-in CUDA toolkit: bin/nvcc and include/cuda_runtime.h."""
    (folder / 'bin').mkdir(parents=True)
    (folder / 'include').mkdir()
    (folder / 'bin' / 'nvcc').write_text('#!/bin/sh\n')
    (folder / 'include' / 'cuda_runtime.h').write_text('// header\n')
    return folder


def test_cuda_toolkit_is_found_behind_an_nvcc_wrapper_script(tmp_path, monkeypatch):
    """torch guesses CUDA_HOME as the folder above nvcc on PATH; on this project's CPU machines that
    nvcc is /usr/local/bin/nvcc, a script running /usr/local/cuda-13.0/bin/nvcc, and the guess
    (/usr/local) has no cuda_runtime.h: the build failed there. The script exports the real one."""
    build = load_script('build_mamba_ssm')
    toolkit = _toolkit(tmp_path / 'cuda-13.0')
    wrapper = tmp_path / 'wrapper' / 'bin' / 'nvcc'
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f'#!/bin/sh\nexec {toolkit}/bin/nvcc "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.delenv('CUDA_HOME', raising=False)
    monkeypatch.delenv('CUDA_PATH', raising=False)
    monkeypatch.setattr(build, 'TOOLKIT_ROOT', tmp_path / 'none')
    monkeypatch.setattr(build.shutil, 'which', lambda name: str(wrapper))
    assert build.cuda_home() == str(toolkit)
    assert os.environ['CUDA_HOME'] == str(toolkit)
    monkeypatch.setenv('CUDA_HOME', '/opt/given')   # a given CUDA_HOME is kept as it is
    assert build.cuda_home() == '/opt/given'


def test_cuda_toolkit_newest_installed_folder_or_one_line_naming_cuda_home(tmp_path, monkeypatch):
    build = load_script('build_mamba_ssm')
    monkeypatch.delenv('CUDA_HOME', raising=False)
    monkeypatch.delenv('CUDA_PATH', raising=False)
    monkeypatch.setattr(build.shutil, 'which', lambda name: None)
    monkeypatch.setattr(build, 'TOOLKIT_ROOT', tmp_path)
    with pytest.raises(SystemExit, match='no CUDA toolkit .* set CUDA_HOME'):
        build.cuda_home()
    _toolkit(tmp_path / 'cuda-12.8')
    _toolkit(tmp_path / 'cuda-13.0')
    (tmp_path / 'cuda-13.1').mkdir()   # no compiler in it: passed over
    assert build.cuda_home() == str(tmp_path / 'cuda-13.0')


def _main(build, tmp_path, monkeypatch, *args):
    """main() on the stand-in sdist for sm_90, the compile replaced by one that writes a library and
    counts its calls."""
    calls = []

    def compile_(tree, ext_dir, arch, jobs):
        assert ext_dir == tmp_path / 'build' / f'ext-sm{arch}-torch{build_torch_version()}'
        ext_dir.mkdir(parents=True, exist_ok=True)
        (ext_dir / build.LIBRARY).write_bytes(b'built here')
        calls.append(arch)
    monkeypatch.setattr(build, 'build', compile_)
    monkeypatch.setattr(build, 'cuda_home', lambda: '/usr/local/cuda')
    monkeypatch.setattr(build, 'ensure_ninja', lambda sdist, build_dir: 'ninja')
    monkeypatch.setattr(sys, 'argv', ['build_mamba_ssm.py', '--sdist', str(_sdist(tmp_path)), '--build-dir',
                                      str(tmp_path / 'build'), '--arch', '90', *args])
    assert build.main() == 0
    return calls, tmp_path / 'build' / f'ext-sm90-torch{build_torch_version()}' / build.LIBRARY


def build_torch_version():
    import torch
    return torch.__version__.replace('+', '-')


def _carried(build, tmp_path):
    """A library carried for sm_90 and this torch, as --carry-to on another machine writes it."""
    carried = tmp_path / 'carried' / f'ext-sm90-torch{build_torch_version()}'
    carried.mkdir(parents=True)
    (carried / build.LIBRARY).write_bytes(b'built elsewhere')
    return carried


def _import_checks(build, monkeypatch, *results):
    """import_check answering ``results`` in turn (exit status 0: the extension imports)."""
    answers = iter(results)
    monkeypatch.setattr(build, 'import_check', lambda paths: subprocess.CompletedProcess(
        [], next(answers), stdout='selective_scan_cuda.so\n', stderr='ImportError: libfoo.so.1: not found\n'))


def test_a_carried_extension_that_imports_is_used_without_compiling(tmp_path, monkeypatch, capsys):
    """The GPU machine's lease is short: an extension built elsewhere against the same torch for the
    same GPU (--carry-to there) is installed into the build folder and used when it imports."""
    build = load_script('build_mamba_ssm')
    carried = _carried(build, tmp_path)
    _import_checks(build, monkeypatch, 0)       # imported once: no second check after it
    calls, library = _main(build, tmp_path, monkeypatch, '--prebuilt', str(tmp_path / 'carried'))
    assert calls == [] and library.read_bytes() == b'built elsewhere'
    out = capsys.readouterr().out
    assert f'--prebuilt: {carried / build.LIBRARY} imports here; not compiling' in out
    assert 'CUDA toolkit' not in out        # nothing compiled: no toolkit needed


def test_a_carried_extension_that_does_not_import_is_removed_and_built(tmp_path, monkeypatch, capsys):
    """A binary from another machine may miss a system library on the GPU machine's image: the error
    is shown, the copy removed, and the extension compiled from the sdist."""
    build = load_script('build_mamba_ssm')
    carried = _carried(build, tmp_path)
    _import_checks(build, monkeypatch, 1, 0)
    calls, library = _main(build, tmp_path, monkeypatch, '--prebuilt', str(tmp_path / 'carried'))
    assert calls == ['90'] and library.read_bytes() == b'built here'
    captured = capsys.readouterr()
    assert 'libfoo.so.1: not found' in captured.err
    assert f'--prebuilt: {carried / build.LIBRARY} does not import here (above); building from the sdist' in captured.out


def test_no_carried_extension_for_this_torch_is_built(tmp_path, monkeypatch, capsys):
    build = load_script('build_mamba_ssm')
    (tmp_path / 'carried' / 'ext-sm90-torch0.0.1').mkdir(parents=True)      # another torch's
    _import_checks(build, monkeypatch, 0)
    calls, library = _main(build, tmp_path, monkeypatch, '--prebuilt', str(tmp_path / 'carried'))
    assert calls == ['90'] and library.read_bytes() == b'built here'
    assert '(none carried for this GPU and torch); building from the sdist' in capsys.readouterr().out


def test_a_garbage_library_fails_the_real_import_check_and_is_removed(tmp_path, capsys):
    build = load_script('build_mamba_ssm')
    tree = build.extract(_sdist(tmp_path), tmp_path / 'build')
    (tmp_path / 'carried').mkdir()
    (tmp_path / 'carried' / build.LIBRARY).write_bytes(b'not an ELF file ' * 16)
    ext_dir = tmp_path / 'build' / 'ext-sm90-torch-x'
    assert not build.use_prebuilt(tmp_path / 'carried', tree, ext_dir)
    assert not (ext_dir / build.LIBRARY).exists()
    assert re.search(r'ImportError: .*selective_scan_cuda\.so: invalid ELF header', capsys.readouterr().err)


def test_carry_to_copies_the_built_library_under_its_architecture_and_torch(tmp_path, monkeypatch, capsys):
    build = load_script('build_mamba_ssm')
    _import_checks(build, monkeypatch, 0)
    calls, library = _main(build, tmp_path, monkeypatch, '--carry-to', str(tmp_path / 'gpu_carry' / 'mamba_ssm_ext'))
    copy = tmp_path / 'gpu_carry' / 'mamba_ssm_ext' / f'ext-sm90-torch{build_torch_version()}' / build.LIBRARY
    assert calls == ['90'] and copy.read_bytes() == library.read_bytes() == b'built here'
    assert f'carried to {copy}' in capsys.readouterr().out
