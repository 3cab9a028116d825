"""The package's layout rules, read from the imports of every module (docs/development.md, "Layout").

A reader relies on them: the methods (``ldt/``, ``corgrad/``) are plain PyTorch that can be lifted
into another code base, ``common/`` can be imported from anywhere without pulling in the rest,
and no two modules import each other through a circle (which breaks as soon as one of them is
imported first, and makes the order of imports matter).
"""
import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parent.parent / 'basicsr_ldt'


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def modules() -> Dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob('*.py'))}


def imported(path: Path, known: Set[str]) -> Dict[str, List[int]]:
    """Every module this file imports (at any depth in the file, function bodies included), with lines.

    ``from basicsr_ldt.a import b`` counts as importing ``basicsr_ldt.a.b`` when that is a module,
    and ``basicsr_ldt.a`` otherwise (``b`` is then a name defined there).
    """
    found: Dict[str, List[int]] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f'{node.module}.{alias.name}' if f'{node.module}.{alias.name}' in known else node.module
                     for alias in node.names]
        for name in names:
            found.setdefault(name, []).append(node.lineno)
    return found


def graph() -> Dict[str, Dict[str, List[int]]]:
    known = modules()
    return {name: imported(path, set(known)) for name, path in known.items()}


def test_the_methods_are_plain_pytorch():
    """ldt/ and corgrad/ import no BasicSR and nothing of this package outside ldt/ and themselves."""
    wrong = []
    for name, imports in graph().items():
        if not name.startswith(('basicsr_ldt.ldt', 'basicsr_ldt.corgrad')):
            continue
        own = name.split('.')[1]
        for target, lines in imports.items():
            top = target.split('.')[0]
            inside = target.startswith(('basicsr_ldt.ldt', f'basicsr_ldt.{own}'))
            if top == 'basicsr' or (top == 'basicsr_ldt' and not inside):
                wrong.append(f'{name} line {lines[0]} imports {target}')
    assert not wrong, '\n'.join(wrong)


def test_common_imports_nothing_else_of_the_package():
    wrong = [f'{name} line {lines[0]} imports {target}'
             for name, imports in graph().items() if name.startswith('basicsr_ldt.common')
             for target, lines in imports.items()
             if target.startswith('basicsr_ldt') and not target.startswith('basicsr_ldt.common')]
    assert not wrong, '\n'.join(wrong)


def test_no_import_circle():
    """No module reaches itself through the imports of the package (the root ``__init__``, which
    only registers everything and re-exports the API, is left out: every import of a submodule runs
    it first, by Python's rules, whatever the layout)."""
    edges = {name: {target for target in imports if target.startswith('basicsr_ldt.') and target != name}
             for name, imports in graph().items() if name != 'basicsr_ldt'}
    circles, state = [], {}

    def visit(node: str, trail: List[str]) -> None:
        state[node] = 'open'
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 'open':
                circles.append(' -> '.join(trail[trail.index(target):] + [target]))
            elif target not in state:
                visit(target, trail + [target])
        state[node] = 'done'

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert not circles, 'import circles:\n' + '\n'.join(circles)


def test_the_top_of_the_package_is_folders_by_role():
    """New code goes into the folder of its role; the top holds only the package's ``__init__``."""
    loose = sorted(path.name for path in PACKAGE.glob('*.py') if path.name != '__init__.py')
    assert not loose, f'modules at the top of basicsr_ldt/: {loose}; put each in the folder of its role'
    folders = sorted(path.name for path in PACKAGE.iterdir() if (path / '__init__.py').is_file())
    assert folders == ['common', 'corgrad', 'data', 'inference', 'ldt', 'models', 'pipelines', 'study', 'weights']


def test_the_networks_need_neither_scan_kernel_package_on_a_cpu():
    """``import archs`` and a MambaIR forward and backward on the CPU load the torch scan only:
    mamba-ssm and the Triton kernels (``archs/scan/triton_*.py``) are optional, GPU-only, and imported
    at the first call that needs them, so a CPU machine without triton runs every network."""
    code = ('import sys, torch, basicsr_ldt, archs\n'
            'net = archs.MambaIR(upscale=2, img_size=8, embed_dim=30, depths=[1], d_state=2, mlp_ratio=1, '
            'upsampler="pixelshuffle", scan_backend="auto")\n'
            'net(torch.rand(1, 3, 8, 8)).mean().backward()\n'
            'print(" ".join(sorted(m for m in sys.modules if m.startswith(("archs.scan", "mamba_ssm")))))')
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='')
    run = subprocess.run([sys.executable, '-c', code], cwd=PACKAGE.parent, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ['archs.scan', 'archs.scan.dispatch', 'archs.scan.linear_scan', 'archs.scan.torch_scan']
