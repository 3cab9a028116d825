#!/usr/bin/env python
"""The demo's pretrained starts: check them, or re-create one.

    python scripts/pretrain_demo.py --check     # the demo's shipped start against the sha256 recorded beside it
    python scripts/pretrain_demo.py             # re-create the demo's start: demo data if missing, then
                                                #   Train_pip.py -opt options/demo/pretrain_demo.yml on 1 thread,
                                                #   and say whether the result is byte-identical to the shipped file
    python scripts/pretrain_demo.py --replace   # ... and install the result (and its sha256) as the shipped file
    python scripts/pretrain_demo.py --start mix [--check | --replace]   # the same for the extra Mix start
    python scripts/pretrain_demo.py --start mambair [--check | --replace]   # ... and the small MambaIR start

Three starts (``STARTS``): ``clean``, the demo's start, ``pretrained/demo/SAFMN_demo_Clean_x4.pth``,
trained on classic-SR pairs without any degradation (the ``Clean`` camera: HR crop, LR its x4 area
resize), as the released DF2K weights the paper fine-tunes are trained on bicubic pairs;
``mix``, ``pretrained/demo/SAFMN_demo_Mix_x4.pth``, trained on per-pair draws from the demo cameras'
degradation family (the demo's start before; the second demo study still uses it); and
``mambair``, ``pretrained/demo/MambaIR_demo_Clean_x4.pth``, a small MambaIR trained as the
``clean`` start: the start of the MambaIR distortion study (options/study/distortion_mambair.yml).

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
from typing import NamedTuple, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
PRETRAINED = REPO / 'pretrained' / 'demo'
DATA = REPO / 'datasets' / 'DRealSR_demo'
#: The demo's cameras; ``Mix`` and ``Clean`` are the pretraining cameras (192 train pairs each).
DEMO_CAMERAS = ('Olympus', 'Pan', 'Sony', 'DSC', 'IMG', 'Canon', 'Mix', 'Clean')
#: The last file a complete demo build writes (the last Clean test HR image, DRealSR's naming).
LAST_PAIR = DATA / 'Test_x4' / 'test_HR' / 'Clean_023_x4.png'


class Start(NamedTuple):
    """One shipped start: its option file, the checkpoint it ships as, what Train_pip.py writes."""
    options: Path
    checkpoint: Path
    trained: Path

    @property
    def digest(self) -> Path:
        return self.checkpoint.with_name(self.checkpoint.name + '.sha256')


STARTS = {
    'clean': Start(REPO / 'options' / 'demo' / 'pretrain_demo.yml', PRETRAINED / 'SAFMN_demo_Clean_x4.pth',
                   REPO / 'experiments' / 'demo_pretrain_Clean' / 'models' / 'net_g_latest.pth'),
    'mix': Start(REPO / 'options' / 'demo' / 'pretrain_demo_mix.yml', PRETRAINED / 'SAFMN_demo_Mix_x4.pth',
                 REPO / 'experiments' / 'demo_pretrain_Mix' / 'models' / 'net_g_latest.pth'),
    'mambair': Start(REPO / 'options' / 'demo' / 'pretrain_demo_mambair.yml', PRETRAINED / 'MambaIR_demo_Clean_x4.pth',
                     REPO / 'experiments' / 'demo_pretrain_mambair_Clean' / 'models' / 'net_g_latest.pth'),
}
DEMO_START = 'clean'
THREADS = 1

sys.path.insert(0, str(REPO))
from basicsr_ldt.weights.fetch import sha256  # noqa: E402  (one file digest for the project)


def recorded_digest(start: Start) -> str:
    """The sha256 in ``<checkpoint>.sha256`` (``sha256sum`` format: ``<hex>  <file name>``)."""
    digest, name = start.digest, start.checkpoint.name
    if not digest.is_file():
        raise FileNotFoundError(f"'{digest.relative_to(REPO)}' does not exist: no sha256 recorded for the shipped checkpoint")
    fields = digest.read_text(encoding='utf-8').split()
    if len(fields) != 2 or fields[1] != name or len(fields[0]) != 64:
        raise ValueError(f"'{digest.relative_to(REPO)}' must hold one line '<sha256>  {name}'")
    return fields[0]


def _recreate(start: Start) -> str:
    key = next(k for k, v in STARTS.items() if v == start)
    return 'python scripts/pretrain_demo.py --replace' + ('' if key == DEMO_START else f' --start {key}')


def check(start: Start = STARTS[DEMO_START]) -> int:
    """0 when the shipped checkpoint has its recorded sha256; 1 with a one-line reason otherwise."""
    try:
        expected = recorded_digest(start)
    except (FileNotFoundError, ValueError) as err:
        print(f'pretrain_demo: error: {err}', file=sys.stderr)
        return 1
    shipped = start.checkpoint.relative_to(REPO)
    if not start.checkpoint.is_file():
        print(f"pretrain_demo: error: '{shipped}' does not exist; re-create it with {_recreate(start)}",
              file=sys.stderr)
        return 1
    actual = sha256(start.checkpoint)
    if actual != expected:
        print(f"pretrain_demo: error: '{shipped}' has sha256 {actual}, not the recorded {expected}; restore it "
              f'(git checkout -- pretrained/demo) or re-create it with {_recreate(start)}', file=sys.stderr)
        return 1
    print(f'pretrained start {shipped}: sha256 {actual} (as recorded)')
    return 0


def train(start: Start, python: str) -> Path:
    """Build the demo data if it is missing, train on ``THREADS`` thread(s); the trained file."""
    if not LAST_PAIR.is_file():
        subprocess.run([python, str(REPO / 'scripts' / 'make_demo_data.py'), '--force', '--cameras', *DEMO_CAMERAS],
                       cwd=REPO, check=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), MKL_NUM_THREADS=str(THREADS))
    subprocess.run([python, str(REPO / 'Train_pip.py'), '-opt', str(start.options)], cwd=REPO, env=env, check=True)
    return start.trained


def install(start: Start, trained: Path) -> None:
    """Copy the trained file and write its sha256 beside it, each whole or not at all."""
    checkpoint = start.checkpoint
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    digest = sha256(trained)
    for target, write in ((checkpoint, lambda tmp: shutil.copyfile(trained, tmp)),
                          (start.digest, lambda tmp: Path(tmp).write_text(f'{digest}  {checkpoint.name}\n',
                                                                          encoding='utf-8'))):
        handle, tmp = tempfile.mkstemp(prefix=f'.{target.name}.', suffix='.tmp', dir=target.parent)
        os.close(handle)
        try:
            write(tmp)
            os.chmod(tmp, 0o644)   # mkstemp creates 0600
            os.replace(tmp, target)
        except BaseException:
            os.remove(tmp)
            raise
    print(f'installed {checkpoint.relative_to(REPO)} (sha256 {digest}) and {start.digest.relative_to(REPO)}')


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--start', choices=tuple(STARTS), default=DEMO_START,
                        help=f'which start (default {DEMO_START}: the demo\'s; mix: the second demo study\'s; '
                             'mambair: the MambaIR distortion study\'s)')
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument('--check', action='store_true', help='only verify the shipped checkpoint against its sha256')
    mode.add_argument('--replace', action='store_true', help='install the re-created checkpoint as the shipped one')
    args = parser.parse_args(argv)
    start = STARTS[args.start]
    if args.check:
        return check(start)
    trained = train(start, sys.executable or 'python3')
    digest = sha256(trained)
    print(f'trained {trained.relative_to(REPO)}: sha256 {digest}')
    try:
        expected = recorded_digest(start)
    except (FileNotFoundError, ValueError):
        expected = None
    if expected is not None:
        print('identical to the shipped checkpoint' if digest == expected else
              f'differs from the shipped checkpoint (sha256 {expected}): expected with another thread count or '
              'CPU type, or after a change of the data, options or code')
    if args.replace:
        install(start, trained)
    return 0


if __name__ == '__main__':
    sys.exit(main())
