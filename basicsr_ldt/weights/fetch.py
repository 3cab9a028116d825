"""``python scripts/fetch_weights.py NAME ... | --list``: released weights into ``pretrained/``, checked.

A file is kept under ``pretrained/<name>.pth`` only after it loads strictly (every key, every shape)
into the network it is named for, and its SHA-256 matches the one ``pretrained/weights.lock``
recorded the first time (``sha256sum`` format, so ``cd pretrained && sha256sum -c weights.lock``
checks it too). Nothing can be pinned in this repository: upstream publishes no checksums, so the
first download on a machine is trusted and every later one must match it. The transfer goes to a
temporary folder beside the target (BasicSR's ``load_file_from_url``, with torch's progress bar);
only a complete, checked file is renamed into place, so a failed or interrupted download leaves no
file under the final name.
"""
import hashlib
import http.client
import os
import shutil
import sys
import tempfile
import urllib.error
from typing import Dict, Mapping, Optional, Sequence
from urllib.parse import urlparse

from basicsr.archs import build_network
from basicsr.utils.download_util import load_file_from_url

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.flags import FlagParser
from basicsr_ldt.common.outputs import fail
from basicsr_ldt.weights.checkpoint import load_weights
from basicsr_ldt.weights.releases import PRETRAINED_DIR, Release, releases

LOCK = 'weights.lock'
DEFAULT_ENDPOINT = 'https://huggingface.co'


class Unreachable(InputError):
    """The download host cannot be reached at all (no network, DNS, proxy, refused connection)."""


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as stream:
        for block in iter(lambda: stream.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def read_lock(folder: str) -> Dict[str, str]:
    """``{file name: sha256}`` from ``<folder>/weights.lock`` (empty when there is none)."""
    path = os.path.join(folder, LOCK)
    if not os.path.isfile(path):
        return {}
    entries = {}
    with open(path, encoding='utf-8') as stream:
        for number, line in enumerate(stream, 1):
            if not line.strip() or line.startswith('#'):
                continue
            parts = line.split()
            if len(parts) != 2 or len(parts[0]) != 64:
                raise InputError(f"{path}, line {number}: expected '<sha256>  <file name>', got {line.strip()!r}")
            entries[parts[1].lstrip('*')] = parts[0].lower()
    return entries


def write_lock(folder: str, entries: Mapping[str, str]) -> None:
    """Rewrite the lock file whole (temporary file, then rename)."""
    path = os.path.join(folder, LOCK)
    tmp = f'{path}.tmp'
    with open(tmp, 'w', encoding='utf-8') as stream:
        stream.write('# SHA-256 of each released file the first time fetch_weights.py kept it (sha256sum -c format)\n')
        stream.writelines(f'{digest}  {name}\n' for name, digest in sorted(entries.items()))
    os.replace(tmp, path)


def check_network(path: str, name: str, release: Release) -> None:
    """Load ``path`` strictly into the network ``name`` is released for (``params_ema`` else ``params``)."""
    network = build_network(dict(release.network))
    try:
        load_weights(network, path, param_key=None, strict=True)
    except InputError as err:
        raise InputError(f'{name}: {err}') from None


def check_checksum(path: str, file_name: str, lock: Mapping[str, str], shown: str, release: Release) -> str:
    """The file's SHA-256, refused when its authors publish another one or the lock recorded another
    one for this file name. A published checksum is checked first: it holds from the first download
    on, where a lock entry only records what the first download happened to bring."""
    digest = sha256(path)
    if release.sha256 is not None and digest != release.sha256:
        raise InputError(f'{shown} has SHA-256 {digest}, but its authors publish {release.sha256} '
                         f'({release.sha256_source})')
    if file_name in lock and lock[file_name] != digest:
        raise InputError(f'{shown} has SHA-256 {digest}, but {LOCK} recorded {lock[file_name]} for {file_name} when '
                         'it was first fetched (the upstream file changed, or the transfer altered it)')
    return digest


def download(url: str, folder: str, file_name: str, progress: bool) -> str:
    """Download ``url`` to ``<folder>/<file_name>`` with BasicSR's helper; failures become one line."""
    host = urlparse(url).netloc
    try:
        return load_file_from_url(url, model_dir=folder, progress=progress, file_name=file_name)
    except urllib.error.HTTPError as err:
        raise InputError(f'{url}: HTTP {err.code} {err.reason}') from None
    except urllib.error.URLError as err:
        raise Unreachable(f'cannot reach {host} ({err.reason}): no network or no access to it; set HF_ENDPOINT '
                          'to a mirror, or download by hand (see --list)') from None
    except (http.client.HTTPException, ConnectionError, TimeoutError) as err:
        raise InputError(f'the download of {url} was interrupted ({type(err).__name__}: {err})') from None


def fetch(name: str, folder: str = PRETRAINED_DIR, table: Optional[Mapping[str, Release]] = None,
          endpoint: Optional[str] = None, progress: bool = True, say=print) -> str:
    """Bring ``<folder>/<name>.pth`` to a checked state; returns what was done.

    ``table`` defaults to :func:`releases.releases`; ``endpoint`` to ``$HF_ENDPOINT`` or
    https://huggingface.co.
    """
    table = releases() if table is None else table
    if name not in table:
        raise InputError(f"unknown release '{name}'; known: {', '.join(table)} (python scripts/fetch_weights.py --list)")
    release = table[name]
    endpoint = endpoint or os.environ.get('HF_ENDPOINT') or DEFAULT_ENDPOINT
    file_name = f'{name}.pth'
    target = os.path.join(folder, file_name)
    os.makedirs(folder, exist_ok=True)
    lock = read_lock(folder)
    if os.path.exists(target):
        try:
            check_network(target, name, release)
            digest = check_checksum(target, file_name, lock, target, release)
        except InputError as err:
            raise InputError(f'{target} is there but not usable: {err}; delete it to download it again') from None
        if file_name not in lock:
            write_lock(folder, {**lock, file_name: digest})
            return f'{name}: {target} checked (loads into {release.network["type"]}); SHA-256 {digest} recorded'
        return f'{name}: {target} present and checked (SHA-256 as recorded), skipped'
    url = release.url(endpoint)
    if url is None:
        raise InputError(f'{name} has no direct download: its authors publish it only on {release.manual}. '
                         f'Download it by hand to {target}, then run python scripts/fetch_weights.py {name} to check '
                         'it and record its checksum')
    staging = tempfile.mkdtemp(prefix=f'.{name}.', suffix='.download', dir=folder)
    try:
        say(f'{name}: downloading {url} to {target}')
        path = download(url, staging, file_name, progress)
        try:
            check_network(path, name, release)
        except InputError as err:
            raise InputError(f'the file downloaded from {url} is not a complete {release.network["type"]} '
                             f'checkpoint, not kept: {err}') from None
        try:
            digest = check_checksum(path, file_name, lock, f'the file downloaded from {url}', release)
        except InputError as err:
            raise InputError(f'{err}; not kept (delete its line in {LOCK} to accept the new file)') from None
        os.replace(path, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if file_name not in lock:
        write_lock(folder, {**read_lock(folder), file_name: digest})
        return f'{name}: saved {target} (loads into {release.network["type"]}); SHA-256 {digest} recorded in {LOCK}'
    return f'{name}: saved {target}; SHA-256 matches {LOCK}'


def listing(folder: str = PRETRAINED_DIR, table: Optional[Mapping[str, Release]] = None,
            endpoint: Optional[str] = None) -> str:
    """One block per release: network, state on this machine, where it comes from."""
    table = releases() if table is None else table
    endpoint = endpoint or os.environ.get('HF_ENDPOINT') or DEFAULT_ENDPOINT
    lock = read_lock(folder)
    lines = []
    for name, release in table.items():
        target = os.path.join(folder, f'{name}.pth')
        state = ('present' if os.path.exists(target) else 'not downloaded') + (
            f', SHA-256 recorded {lock[name + ".pth"][:16]}...' if f'{name}.pth' in lock else '') + (
            f', SHA-256 {release.sha256[:16]}... published by its authors, pinned before download'
            if release.sha256 else ', SHA-256 pinned at the first download (none published)')
        source = release.url(endpoint) or f'by hand: {release.manual}'
        lines.append(f'{name:<15} {release.network["type"]:<8} {state}\n    from {source}\n    listed at {release.page}')
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None, table: Optional[Mapping[str, Release]] = None) -> int:
    parser = FlagParser('python scripts/fetch_weights.py',
                        description='Download the upstream released weights the option files use into pretrained/, '
                                    'check that each loads into its network, and pin its SHA-256.')
    parser.add_argument('names', nargs='*', help='release names (see --list)')
    parser.add_argument('--list', action='store_true', help='list the releases, their state here and their source')
    parser.add_argument('--dir', default=PRETRAINED_DIR, help=f'where the files go (default {PRETRAINED_DIR})')
    try:
        args = parser.parse_args(argv)
        if os.path.exists(args.dir) and not os.path.isdir(args.dir):
            raise InputError(f"--dir '{args.dir}' is a file; expected the folder the weights go to (made when absent)")
    except InputError as err:
        fail(str(err))
    if args.list or not args.names:
        print(listing(args.dir, table))
        return 0
    failed = 0
    for name in args.names:
        try:
            print(fetch(name, args.dir, table), flush=True)
        except Unreachable as err:
            fail(str(err))
        except InputError as err:
            print(f'error: {err}', file=sys.stderr, flush=True)
            failed += 1
    return 2 if failed else 0
