"""Build mamba-ssm's ``selective_scan_cuda`` extension from its PyPI sdist, for one GPU
architecture only, against the torch installed here; make ``selective_scan_fn`` importable
without the rest of mamba-ssm (issue #38: the GPU machine has nvcc and torch but no network).

    pip download --no-deps --no-binary :all: --no-build-isolation mamba-ssm==2.3.2.post1 -d gpu_carry/
    pip download --no-deps --only-binary :all: --platform manylinux2014_x86_64 ninja -d gpu_carry/
    python scripts/build_mamba_ssm.py --sdist gpu_carry/mamba_ssm-2.3.2.post1.tar.gz   # on the GPU machine
    export PYTHONPATH=$(python scripts/build_mamba_ssm.py --sdist ... --print-path):$PYTHONPATH

The packaged setup.py compiles its ten ``.cu`` files for about ten architectures; here
``torch.utils.cpp_extension.load`` compiles them for the architecture of the GPU present (or
``--arch``), ``MAX_JOBS`` (default: every core) at once, into ``--build-dir`` (default
``build/mamba_ssm``; the sdist's code is extracted there and never committed). The
package's own ``mamba_ssm/__init__.py`` imports its models (and through them packages this
project does not install), so the extracted copy gets an ``__init__`` that only sets the
version: ``mamba_ssm.ops.selective_scan_interface`` then imports with torch, triton and einops.

``--carry-to DIR`` copies the built library (about 58 MB for one architecture) to
``DIR/ext-sm<arch>-torch<version>/``; on the GPU machine ``--prebuilt DIR`` uses it when it imports
there and compiles only when it does not. A build against the GPU machine's torch (2.11.0+cu130,
the same wheel as PyPI's ``torch==2.11.0``) can so be made on this CPU machine and carried:

    python scripts/build_mamba_ssm.py --sdist gpu_carry/mamba_ssm-2.3.2.post1.tar.gz --arch 90 \
        --carry-to gpu_carry/mamba_ssm_ext       # with that torch, e.g. in a Python 3.12 venv

``--nvcc-one FILE`` compiles one of the ``.cu`` files with nvcc and the same flags, no GPU needed
(a check of the command and its time on a CPU machine). The whole build needs no GPU either with
``--arch``: on this project's 2-core CPU machine (nvcc 13.0, torch 2.14.1) ``--arch 90 --jobs 2``
took 412 s and the extension imported; ``scripts/scan_static_report.py --mamba-ssm BUILD_DIR`` reads
its kernels' SASS from that build.
"""
import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[1]
# Where CUDA toolkits are installed (cuda, cuda-13.0, ...), when CUDA_HOME does not say.
TOOLKIT_ROOT = Path('/usr/local')
SOURCES = ['selective_scan.cpp'] + [f'selective_scan_fwd_{t}.cu' for t in ('fp32', 'fp16', 'bf16')] + \
    [f'selective_scan_bwd_{t}_{k}.cu' for t in ('fp32', 'fp16', 'bf16') for k in ('real', 'complex')]
# The extension's shared library, as torch.utils.cpp_extension.load names it.
LIBRARY = 'selective_scan_cuda.so'
# mamba-ssm's own nvcc flags (its setup.py), less the architecture list and -v/-lineinfo, and
# less its '-std=c++17': the C++ standard is the one the installed torch's headers need
# (:func:`cxx_standard`).
NVCC_FLAGS = ['-O3', '-U__CUDA_NO_HALF_OPERATORS__', '-U__CUDA_NO_HALF_CONVERSIONS__',
              '-U__CUDA_NO_BFLOAT16_OPERATORS__', '-U__CUDA_NO_BFLOAT16_CONVERSIONS__',
              '-U__CUDA_NO_BFLOAT162_OPERATORS__', '-U__CUDA_NO_BFLOAT162_CONVERSIONS__',
              '--expt-relaxed-constexpr', '--expt-extended-lambda', '--use_fast_math']


def extract(sdist: Path, build_dir: Path) -> Path:
    """The sdist's source tree under ``build_dir/src`` (extracted once), with a light
    ``mamba_ssm/__init__.py``."""
    if not sdist.is_file():
        sys.exit(f'build_mamba_ssm.py: --sdist {sdist}: no such file (download it with pip download '
                 f'--no-deps --no-binary :all: --no-build-isolation mamba-ssm==2.3.2.post1 -d gpu_carry/)')
    src_root = build_dir / 'src'
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split('/')[0]
        tree = src_root / top
        if not (tree / 'csrc').is_dir():
            src_root.mkdir(parents=True, exist_ok=True)
            tar.extractall(src_root, filter='data') if hasattr(tarfile, 'data_filter') else tar.extractall(src_root)
    init = tree / 'mamba_ssm' / '__init__.py'
    version = next((line for line in init.read_text().splitlines() if line.startswith('__version__')), '')
    init.write_text(f'{version}\n')
    return tree


def ensure_ninja(sdist: Path, build_dir: Path) -> str:
    """The ninja that ``torch.utils.cpp_extension.load`` runs: the one on PATH, else the binary
    of a ``ninja-*.whl`` carried beside the sdist (``pip download --no-deps --only-binary :all:
    --platform manylinux2014_x86_64 ninja``), unpacked into ``build_dir/bin`` and put on PATH
    (nothing is installed)."""
    found = shutil.which('ninja')
    if found:
        return found
    wheels = sorted(sdist.parent.glob('ninja-*.whl'))
    if not wheels:
        sys.exit(f'build_mamba_ssm.py: no ninja on PATH and no ninja-*.whl beside {sdist}: torch\'s '
                 f'extension builder needs ninja')
    import zipfile
    bin_dir = build_dir / 'bin'
    bin_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[-1]) as wheel:
        member = next(n for n in wheel.namelist() if n.endswith('/scripts/ninja') or n.endswith('/bin/ninja'))
        (bin_dir / 'ninja').write_bytes(wheel.read(member))
    (bin_dir / 'ninja').chmod(0o755)
    os.environ['PATH'] = f'{bin_dir}{os.pathsep}{os.environ.get("PATH", "")}'
    return str(bin_dir / 'ninja')


def cxx_standard() -> str:
    """``-std=c++20`` when the installed torch's headers refuse anything older, else mamba-ssm's own
    ``-std=c++17``. mamba-ssm 2.3.2.post1's setup.py passes -std=c++17 to both compilers; torch
    2.14's ``ATen/ATen.h`` stops with "C++20 or later compatible compiler is required to use ATen"
    below C++20 (``__cplusplus < 202002L``; seen building here against torch 2.14.1: the C++ file
    failed), and a flag given after torch's own -std=c++20 wins."""
    from torch.utils.cpp_extension import include_paths
    for folder in include_paths():
        header = Path(folder) / 'ATen' / 'ATen.h'
        if header.is_file():
            return '-std=c++20' if '202002L' in header.read_text(errors='replace') else '-std=c++17'
    return '-std=c++17'


def cuda_home() -> str:
    """The CUDA toolkit that torch's extension builder compiles with, exported as ``CUDA_HOME``
    before ``torch.utils.cpp_extension`` is imported (it reads the variable at import). torch
    guesses the toolkit from the folder above ``nvcc`` on PATH; where that ``nvcc`` is a wrapper
    script (``/usr/local/bin/nvcc`` running ``/usr/local/cuda-13.0/bin/nvcc``, seen on this
    project's CPU machines) the guess is ``/usr/local`` and the C++ compile stops on a missing
    ``cuda_runtime.h``. So: ``CUDA_HOME`` or ``CUDA_PATH`` if set, else the first of the real
    ``nvcc``'s toolkit, ``/usr/local/cuda`` and ``/usr/local/cuda-*`` (newest first) that holds both
    ``bin/nvcc`` and ``include/cuda_runtime.h``."""
    for name in ('CUDA_HOME', 'CUDA_PATH'):
        if os.environ.get(name):
            os.environ['CUDA_HOME'] = os.environ[name]
            return os.environ[name]
    candidates = []
    nvcc = shutil.which('nvcc')
    if nvcc:
        candidates.append(Path(os.path.realpath(nvcc)).parent.parent)
        with open(nvcc, 'rb') as f:   # a wrapper script names the real one
            head = f.read(4096)
        if head.startswith(b'#!'):
            candidates += [Path(word).parent.parent for word in head.decode(errors='replace').split()
                           if word.endswith('/bin/nvcc')]
    candidates.append(TOOLKIT_ROOT / 'cuda')
    candidates += sorted(TOOLKIT_ROOT.glob('cuda-*'), key=lambda p: _version_key(p.name), reverse=True)
    for home in candidates:
        if (home / 'bin' / 'nvcc').is_file() and (home / 'include' / 'cuda_runtime.h').is_file():
            os.environ['CUDA_HOME'] = str(home)
            return str(home)
    sys.exit(f'build_mamba_ssm.py: no CUDA toolkit (bin/nvcc and include/cuda_runtime.h) found in '
             f'{", ".join(map(str, candidates)) or "(no nvcc on PATH)"}; set CUDA_HOME to the toolkit folder')


def _version_key(name: str) -> List[int]:
    """``cuda-13.0`` -> [13, 0], for sorting toolkit folders newest first."""
    return [int(part) for part in name.split('-')[-1].split('.') if part.isdigit()]


def arch_of_gpu(requested: str) -> str:
    if requested:
        return requested
    import torch
    if not torch.cuda.is_available():
        sys.exit('build_mamba_ssm.py: no CUDA device visible to torch; pass --arch (e.g. 90)')
    major, minor = torch.cuda.get_device_capability()
    return f'{major}{minor}'


def nvcc_one(tree: Path, name: str, arch: str) -> None:
    """Compile one ``.cu`` file of the extension with nvcc alone (no GPU, no link), timed."""
    from torch.utils.cpp_extension import include_paths
    includes = [*include_paths(device_type='cuda'), sysconfig.get_paths()['include'],
                str(tree / 'csrc' / 'selective_scan')]
    out = Path(os.environ.get('TMPDIR', '/tmp')) / (Path(name).stem + '.o')
    import torch
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = ['nvcc', '-c', str(tree / 'csrc' / 'selective_scan' / name), '-o', str(out), *NVCC_FLAGS, cxx_standard(),
           '-gencode', f'arch=compute_{arch},code=sm_{arch}', '-Xcompiler', '-fPIC',
           f'-D_GLIBCXX_USE_CXX11_ABI={abi}', '-DTORCH_EXTENSION_NAME=selective_scan_cuda',
           *[f'-I{p}' for p in includes]]
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f'nvcc compiled {name} for sm_{arch} in {time.perf_counter() - start:.1f} s '
          f'({out.stat().st_size / 1e6:.1f} MB object; {shutil.which("nvcc")})')
    out.unlink()


def ext_name(arch: str) -> str:
    """The folder of a build for ``arch`` against the installed torch (a build for another torch
    does not load), under ``--build-dir`` and, carried, under ``--prebuilt``."""
    import torch
    return f'ext-sm{arch}-torch{torch.__version__.replace("+", "-")}'


def build(tree: Path, ext_dir: Path, arch: str, jobs: int) -> None:
    """The extension compiled into ``ext_dir`` and loaded (``import selective_scan_cuda`` works in
    this process)."""
    import torch
    from torch.utils.cpp_extension import load
    os.environ['TORCH_CUDA_ARCH_LIST'] = f'{arch[:-1]}.{arch[-1]}'  # this architecture only
    os.environ['MAX_JOBS'] = str(jobs)
    ext_dir.mkdir(parents=True, exist_ok=True)
    csrc = tree / 'csrc' / 'selective_scan'
    start = time.perf_counter()
    standard = cxx_standard()
    load(name='selective_scan_cuda', sources=[str(csrc / s) for s in SOURCES],
         extra_cflags=['-O3', standard], extra_cuda_cflags=[*NVCC_FLAGS, standard],
         extra_include_paths=[str(csrc)], build_directory=str(ext_dir), verbose=False)
    print(f'built selective_scan_cuda for sm_{arch} against torch {torch.__version__} in '
          f'{time.perf_counter() - start:.0f} s with MAX_JOBS={jobs}: {ext_dir}', flush=True)


def search_path(tree: Path, ext_dir: Path) -> List[str]:
    return [str(ext_dir), str(tree)]


def import_check(paths: List[str]) -> subprocess.CompletedProcess:
    """``selective_scan_fn`` and the extension imported in a fresh process with ``paths`` first on
    PYTHONPATH (stdout: the extension's file)."""
    return subprocess.run([sys.executable, '-c', 'from mamba_ssm.ops.selective_scan_interface import '
                           'selective_scan_fn; import selective_scan_cuda; print(selective_scan_cuda.__file__)'],
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(paths + [os.environ.get('PYTHONPATH', '')])),
                          capture_output=True, text=True)


def use_prebuilt(carried: Path, tree: Path, ext_dir: Path) -> Optional[subprocess.CompletedProcess]:
    """The passing :func:`import_check` of the extension carried in ``carried`` (built on another
    machine against this torch, for this architecture), installed into ``ext_dir``; None when none is
    carried or it does not import: a GPU machine's image may lack a library the building machine
    had, so one that does not import is removed and built from the sdist."""
    library = carried / LIBRARY
    if not library.is_file():
        print(f'--prebuilt: no {library} (none carried for this GPU and torch); building from the sdist', flush=True)
        return None
    ext_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(library, ext_dir / LIBRARY)
    check = import_check(search_path(tree, ext_dir))
    if check.returncode == 0:
        print(f'--prebuilt: {library} imports here; not compiling', flush=True)
        return check
    print(check.stderr[-2000:], file=sys.stderr)
    print(f'--prebuilt: {library} does not import here (above); building from the sdist', flush=True)
    (ext_dir / LIBRARY).unlink()
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--sdist', type=Path, required=True, help='mamba_ssm-2.3.2.post1.tar.gz')
    parser.add_argument('--build-dir', type=Path, default=REPO / 'build' / 'mamba_ssm',
                        help='where the sdist is extracted and the extension built (ignored by git; outside '
                             'gpu_carry/, which a device call carries and caps at 64 MiB: a build is about 115 MB)')
    parser.add_argument('--arch', default='', help='compute capability as digits (default: the GPU present)')
    parser.add_argument('--jobs', type=int, default=os.cpu_count() or 1, help='parallel compiles (MAX_JOBS)')
    parser.add_argument('--nvcc-one', metavar='FILE', help='only compile this .cu file with nvcc (no GPU)')
    parser.add_argument('--prebuilt', type=Path, metavar='DIR',
                        help=f'use DIR/ext-sm<arch>-torch<version>/{LIBRARY} (written by --carry-to on another '
                             'machine) when it imports here, instead of compiling')
    parser.add_argument('--carry-to', type=Path, metavar='DIR',
                        help=f'after the build, copy {LIBRARY} (about 58 MB for one architecture) to '
                             'DIR/ext-sm<arch>-torch<version>/, for --prebuilt on a GPU machine with the same torch')
    parser.add_argument('--print-path', action='store_true',
                        help='print the PYTHONPATH entries of an existing build and exit')
    args = parser.parse_args()
    tree = extract(args.sdist, args.build_dir.resolve())
    if args.nvcc_one:
        print(f'CUDA toolkit: {cuda_home()}', flush=True)
        nvcc_one(tree, args.nvcc_one, args.arch or '90')
        return 0
    arch = arch_of_gpu(args.arch)
    ext_dir = args.build_dir.resolve() / ext_name(arch)
    paths = search_path(tree, ext_dir)
    if args.print_path:
        print(os.pathsep.join(paths))
        return 0
    check = use_prebuilt(args.prebuilt / ext_dir.name, tree, ext_dir) if args.prebuilt else None
    if check is None:
        print(f'CUDA toolkit: {cuda_home()}', flush=True)
        print(f'ninja: {ensure_ninja(args.sdist, args.build_dir.resolve())}', flush=True)
        build(tree, ext_dir, arch, args.jobs)
        check = import_check(paths)
    if check.returncode != 0:
        print(check.stderr[-3000:], file=sys.stderr)
        sys.exit('build_mamba_ssm.py: the built extension does not import (above)')
    print(f'mamba_ssm.ops.selective_scan_interface.selective_scan_fn imports ({check.stdout.strip()}); '
          f'PYTHONPATH={os.pathsep.join(paths)}')
    if args.carry_to:
        target = args.carry_to / ext_dir.name
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ext_dir / LIBRARY, target / LIBRARY)
        print(f'carried to {target / LIBRARY} ({(target / LIBRARY).stat().st_size / 2**20:.1f} MiB)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
