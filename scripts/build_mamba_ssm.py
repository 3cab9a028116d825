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
``gpu_carry/mamba_ssm_build``; the sdist's code is extracted there and never committed). The
package's own ``mamba_ssm/__init__.py`` imports its models (and through them packages this
project does not install), so the extracted copy gets an ``__init__`` that only sets the
version: ``mamba_ssm.ops.selective_scan_interface`` then imports with torch, triton and einops.

``--nvcc-one FILE`` compiles one of the ``.cu`` files with nvcc and the same flags, no GPU needed
(a check of the command and its time on a CPU machine).
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
from typing import List

REPO = Path(__file__).resolve().parents[1]
SOURCES = ['selective_scan.cpp'] + [f'selective_scan_fwd_{t}.cu' for t in ('fp32', 'fp16', 'bf16')] + \
    [f'selective_scan_bwd_{t}_{k}.cu' for t in ('fp32', 'fp16', 'bf16') for k in ('real', 'complex')]
# mamba-ssm's own nvcc flags (its setup.py), less the architecture list and -v/-lineinfo.
NVCC_FLAGS = ['-O3', '-std=c++17', '-U__CUDA_NO_HALF_OPERATORS__', '-U__CUDA_NO_HALF_CONVERSIONS__',
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
    cmd = ['nvcc', '-c', str(tree / 'csrc' / 'selective_scan' / name), '-o', str(out), *NVCC_FLAGS,
           '-gencode', f'arch=compute_{arch},code=sm_{arch}', '-Xcompiler', '-fPIC',
           f'-D_GLIBCXX_USE_CXX11_ABI={abi}', '-DTORCH_EXTENSION_NAME=selective_scan_cuda',
           *[f'-I{p}' for p in includes]]
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f'nvcc compiled {name} for sm_{arch} in {time.perf_counter() - start:.1f} s '
          f'({out.stat().st_size / 1e6:.1f} MB object; {shutil.which("nvcc")})')
    out.unlink()


def build(tree: Path, build_dir: Path, arch: str, jobs: int) -> Path:
    """The extension compiled and loaded (``import selective_scan_cuda`` works in this process);
    returns the folder of its shared library."""
    import torch
    from torch.utils.cpp_extension import load
    os.environ['TORCH_CUDA_ARCH_LIST'] = f'{arch[:-1]}.{arch[-1]}'  # this architecture only
    os.environ['MAX_JOBS'] = str(jobs)
    ext_dir = build_dir / f'ext-sm{arch}-torch{torch.__version__.replace("+", "-")}'
    ext_dir.mkdir(parents=True, exist_ok=True)
    csrc = tree / 'csrc' / 'selective_scan'
    start = time.perf_counter()
    load(name='selective_scan_cuda', sources=[str(csrc / s) for s in SOURCES],
         extra_cflags=['-O3', '-std=c++17'], extra_cuda_cflags=NVCC_FLAGS,
         extra_include_paths=[str(csrc)], build_directory=str(ext_dir), verbose=False)
    print(f'built selective_scan_cuda for sm_{arch} against torch {torch.__version__} in '
          f'{time.perf_counter() - start:.0f} s with MAX_JOBS={jobs}: {ext_dir}', flush=True)
    return ext_dir


def search_path(tree: Path, ext_dir: Path) -> List[str]:
    return [str(ext_dir), str(tree)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--sdist', type=Path, required=True, help='mamba_ssm-2.3.2.post1.tar.gz')
    parser.add_argument('--build-dir', type=Path, default=REPO / 'gpu_carry' / 'mamba_ssm_build')
    parser.add_argument('--arch', default='', help='compute capability as digits (default: the GPU present)')
    parser.add_argument('--jobs', type=int, default=os.cpu_count() or 1, help='parallel compiles (MAX_JOBS)')
    parser.add_argument('--nvcc-one', metavar='FILE', help='only compile this .cu file with nvcc (no GPU)')
    parser.add_argument('--print-path', action='store_true',
                        help='print the PYTHONPATH entries of an existing build and exit')
    args = parser.parse_args()
    tree = extract(args.sdist, args.build_dir.resolve())
    if args.nvcc_one:
        nvcc_one(tree, args.nvcc_one, args.arch or '90')
        return 0
    arch = arch_of_gpu(args.arch)
    import torch
    ext_dir = args.build_dir.resolve() / f'ext-sm{arch}-torch{torch.__version__.replace("+", "-")}'
    if not args.print_path:
        print(f'ninja: {ensure_ninja(args.sdist, args.build_dir.resolve())}', flush=True)
        ext_dir = build(tree, args.build_dir.resolve(), arch, args.jobs)
    paths = search_path(tree, ext_dir)
    if args.print_path:
        print(os.pathsep.join(paths))
        return 0
    check = subprocess.run([sys.executable, '-c', 'from mamba_ssm.ops.selective_scan_interface import '
                            'selective_scan_fn; import selective_scan_cuda; print(selective_scan_cuda.__file__)'],
                           env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                               paths + [os.environ.get('PYTHONPATH', '')])), capture_output=True, text=True)
    if check.returncode != 0:
        print(check.stderr[-3000:], file=sys.stderr)
        sys.exit('build_mamba_ssm.py: the built extension does not import (above)')
    print(f'mamba_ssm.ops.selective_scan_interface.selective_scan_fn imports ({check.stdout.strip()}); '
          f'PYTHONPATH={os.pathsep.join(paths)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
