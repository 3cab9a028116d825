#!/usr/bin/env python
"""The demo's pretrained start, ``pretrained/demo/SAFMN_demo_Mix_x4.pth``: check it, or re-create it.

    python scripts/pretrain_demo.py --check     # the shipped file against the sha256 recorded beside it
    python scripts/pretrain_demo.py             # re-create it: demo data if missing, then
                                                #   Train_pip.py -opt options/demo/pretrain_demo.yml on 1 thread,
                                                #   and say whether the result is byte-identical to the shipped file
    python scripts/pretrain_demo.py --replace   # ... and install the result (and its sha256) as the shipped file

Why a shipped checkpoint: the demo fine-tunes from a network that really does super-resolution
(the paper starts from released DF2K weights), and training one takes longer than the rest of
the demo. Shipping it keeps ``scripts/demo.sh`` short; the sha256 beside it says exactly which
file the numbers in docs/results.md come from, and this script re-creates it from the seeded data and
options. Training runs on ``THREADS`` thread(s): the thread count (and the CPU's vector
instructions) sets the floating-point summation order, so the same bytes come back on the same
kind of CPU with the same thread count, and a file within rounding differences elsewhere.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
CHECKPOINT = REPO / 'pretrained' / 'demo' / 'SAFMN_demo_Mix_x4.pth'
DIGEST = CHECKPOINT.with_name(CHECKPOINT.name + '.sha256')
OPTIONS = REPO / 'options' / 'demo' / 'pretrain_demo.yml'
TRAINED = REPO / 'experiments' / 'demo_pretrain_Mix' / 'models' / 'net_g_latest.pth'
DATA = REPO / 'datasets' / 'DRealSR_demo'
#: The demo's cameras; ``Mix`` is the pretraining camera (192 train pairs, each its own degradation).
DEMO_CAMERAS = ('Olympus', 'Pan', 'Sony', 'DSC', 'IMG', 'Canon', 'Mix')
#: The last file a complete demo build writes (the last Mix test HR image, DRealSR's naming).
LAST_MIX_PAIR = DATA / 'Test_x4' / 'test_HR' / 'Mix_023_x4.png'
THREADS = 1

sys.path.insert(0, str(REPO))
from basicsr_ldt.weights.fetch import sha256  # noqa: E402  (one file digest for the project)


def recorded_digest() -> str:
    """The sha256 in ``<checkpoint>.sha256`` (``sha256sum`` format: ``<hex>  <file name>``)."""
    if not DIGEST.is_file():
        raise FileNotFoundError(f"'{DIGEST.relative_to(REPO)}' does not exist: no sha256 recorded for the shipped checkpoint")
    fields = DIGEST.read_text(encoding='utf-8').split()
    if len(fields) != 2 or fields[1] != CHECKPOINT.name or len(fields[0]) != 64:
        raise ValueError(f"'{DIGEST.relative_to(REPO)}' must hold one line '<sha256>  {CHECKPOINT.name}'")
    return fields[0]


def check() -> int:
    """0 when the shipped checkpoint has its recorded sha256; 1 with a one-line reason otherwise."""
    try:
        expected = recorded_digest()
    except (FileNotFoundError, ValueError) as err:
        print(f'pretrain_demo: error: {err}', file=sys.stderr)
        return 1
    if not CHECKPOINT.is_file():
        print(f"pretrain_demo: error: '{CHECKPOINT.relative_to(REPO)}' does not exist; re-create it with "
              'python scripts/pretrain_demo.py --replace', file=sys.stderr)
        return 1
    actual = sha256(CHECKPOINT)
    if actual != expected:
        print(f"pretrain_demo: error: '{CHECKPOINT.relative_to(REPO)}' has sha256 {actual}, not the recorded "
              f'{expected}; restore it (git checkout -- pretrained/demo) or re-create it with '
              'python scripts/pretrain_demo.py --replace', file=sys.stderr)
        return 1
    print(f'pretrained start {CHECKPOINT.relative_to(REPO)}: sha256 {actual} (as recorded)')
    return 0


def train(python: str) -> Path:
    """Build the demo data if it is missing, train on ``THREADS`` thread(s); the trained file."""
    if not LAST_MIX_PAIR.is_file():
        subprocess.run([python, str(REPO / 'scripts' / 'make_demo_data.py'), '--force', '--cameras', *DEMO_CAMERAS],
                       cwd=REPO, check=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), MKL_NUM_THREADS=str(THREADS))
    subprocess.run([python, str(REPO / 'Train_pip.py'), '-opt', str(OPTIONS)], cwd=REPO, env=env, check=True)
    return TRAINED


def install(trained: Path) -> None:
    """Copy the trained file and write its sha256 beside it, each whole or not at all."""
    CHECKPOINT.parent.mkdir(parents=True, exist_ok=True)
    digest = sha256(trained)
    for target, write in ((CHECKPOINT, lambda tmp: shutil.copyfile(trained, tmp)),
                          (DIGEST, lambda tmp: Path(tmp).write_text(f'{digest}  {CHECKPOINT.name}\n', encoding='utf-8'))):
        handle, tmp = tempfile.mkstemp(prefix=f'.{target.name}.', suffix='.tmp', dir=target.parent)
        os.close(handle)
        try:
            write(tmp)
            os.chmod(tmp, 0o644)   # mkstemp creates 0600
            os.replace(tmp, target)
        except BaseException:
            os.remove(tmp)
            raise
    print(f'installed {CHECKPOINT.relative_to(REPO)} (sha256 {digest}) and {DIGEST.relative_to(REPO)}')


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument('--check', action='store_true', help='only verify the shipped checkpoint against its sha256')
    mode.add_argument('--replace', action='store_true', help='install the re-created checkpoint as the shipped one')
    args = parser.parse_args(argv)
    if args.check:
        return check()
    trained = train(sys.executable or 'python3')
    digest = sha256(trained)
    print(f'trained {trained.relative_to(REPO)}: sha256 {digest}')
    try:
        expected = recorded_digest()
    except (FileNotFoundError, ValueError):
        expected = None
    if expected is not None:
        print('identical to the shipped checkpoint' if digest == expected else
              f'differs from the shipped checkpoint (sha256 {expected}): expected with another thread count or '
              'CPU type, or after a change of the data, options or code')
    if args.replace:
        install(trained)
    return 0


if __name__ == '__main__':
    sys.exit(main())
