"""Which Python the install, test and demo scripts use: the one they were given, or the project's ``.venv``.

Run by ``scripts/python_env.sh`` with the interpreter it was given (``$PYTHON``, else ``python3``);
prints the path of the project's virtual environment's Python when that one must be used, and
nothing when the given interpreter is used as it is. Standard library only: it runs before anything
is installed.

Why: a system Python that marks itself EXTERNALLY-MANAGED (PEP 668: Debian 12, Ubuntu 23.04 and
later) refuses ``pip install``, so the Quick start's first command would fail there. Such an
interpreter gets a virtual environment in ``<repo>/.venv`` (created once, reused afterwards). An
active virtual environment or conda environment is used as it is (PEP 668 does not apply inside a
virtual environment), and so is any interpreter without the marker (pyenv's, CI's), as before.
``PIP_BREAK_SYSTEM_PACKAGES`` set to a true value means the user told pip to install anyway.
"""
import importlib.util
import os
import shutil
import sys
import sysconfig
import venv
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(REPO, '.venv')
MARKER = 'EXTERNALLY-MANAGED'


def in_environment(prefix: str = sys.prefix, base_prefix: str = sys.base_prefix) -> bool:
    """A virtual environment (its prefix differs from the base) or a conda environment."""
    return prefix != base_prefix or os.path.isdir(os.path.join(prefix, 'conda-meta'))


def externally_managed(stdlib: Optional[str] = None, prefix: str = sys.prefix, base_prefix: str = sys.base_prefix,
                       environ=os.environ) -> bool:
    """True when pip would refuse to install into this interpreter (PEP 668)."""
    if in_environment(prefix, base_prefix):
        return False
    if environ.get('PIP_BREAK_SYSTEM_PACKAGES', '').lower() in ('1', 'true', 'yes', 'on'):
        return False
    return os.path.isfile(os.path.join(stdlib or sysconfig.get_path('stdlib'), MARKER))


def venv_python(folder: str = VENV) -> str:
    return os.path.join(folder, 'Scripts' if os.name == 'nt' else 'bin', 'python.exe' if os.name == 'nt' else 'python')


def ensure_venv(folder: str = VENV) -> bool:
    """Create the virtual environment unless a complete one is there; True when it was created now.

    ``pyvenv.cfg`` is written first by ``venv``, so completeness is the Python and pip inside it; a
    creation that fails or is interrupted removes the folder again, so the next run starts clean.
    """
    python = venv_python(folder)
    if os.path.isfile(python) and os.path.isfile(os.path.join(folder, 'pyvenv.cfg')):
        return False
    if importlib.util.find_spec('ensurepip') is None:
        raise SystemExit(f"error: {sys.executable} is externally managed (PEP 668) and has no venv/ensurepip "
                         f"module to create the project's environment '{folder}': install it (Debian/Ubuntu: "
                         'apt install python3-venv), or activate a virtual environment of your own first')
    if os.path.exists(folder):
        shutil.rmtree(folder)
    try:
        venv.create(folder, with_pip=True)
    except BaseException as err:
        shutil.rmtree(folder, ignore_errors=True)
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        raise SystemExit(f"error: cannot create the virtual environment '{folder}' for the externally managed "
                         f'{sys.executable}: {err}') from None
    return True


def main() -> int:
    if not externally_managed():
        return 0
    created = ensure_venv()
    shown = os.path.relpath(VENV) if os.path.abspath(os.getcwd()) == REPO else VENV
    print(f"{sys.executable} is externally managed (PEP 668): {'created' if created else 'using'} the project's "
          f'virtual environment {shown}/ and installing there (activate it with: source {shown}/bin/activate)',
          file=sys.stderr)
    print(venv_python())
    return 0


if __name__ == '__main__':
    sys.exit(main())
