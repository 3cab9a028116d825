"""Output folders that are either complete or not there at all.

BasicSR renames an existing ``experiments/<name>`` to ``<name>_archived_<time>`` and creates a new
one. If the run then fails on bad input (a wrong camera, a missing checkpoint), the user is left
with an empty experiment folder and their previous results moved aside. :class:`OutputFolder`
undoes both when setup fails, and, for a resumed run that writes into its existing folder, removes
the new log and puts back the option file it overwrote.
"""
import os
import shutil
import sys
import time
from typing import List, Optional, Tuple


class OutputFolder:
    """Create fresh folders (archiving existing ones like BasicSR does) and roll back on failure."""

    def __init__(self) -> None:
        self._created: List[Tuple[str, Optional[str], List[str]]] = []
        self._kept: List[Tuple[str, Optional[bytes]]] = []

    def keep(self, path: str) -> None:
        """Call before writing file ``path`` into a folder that is not this run's own: a rollback
        removes it again, or restores the contents it had now."""
        previous = None
        if os.path.isfile(path):
            with open(path, 'rb') as handle:
                previous = handle.read()
        self._kept.append((path, previous))

    def create(self, path: str) -> None:
        """Make ``path`` fresh; an existing folder is renamed to ``<path>_archived_<time>``."""
        archived = None
        if os.path.exists(path):
            archived = f"{path}_archived_{time.strftime('%Y%m%d_%H%M%S', time.localtime())}"
            os.rename(path, archived)
            print(f'Path already exists. Renamed it to {archived}', flush=True)
        parents, parent = [], os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent):   # experiments/ on a first run: made here, so removed on a rollback
            parents.append(parent)
            parent = os.path.dirname(parent)
        os.makedirs(path)
        self._created.append((path, archived, parents))

    def rollback(self) -> None:
        """Remove what :meth:`create` made (the folders above it too, left empty) and put archived
        folders back; files passed to :meth:`keep` are removed or restored."""
        for handler in _file_handlers():   # closed before its file is removed
            handler.close()
        for path, previous in reversed(self._kept):
            if previous is None:
                if os.path.isfile(path):
                    os.remove(path)
            else:
                with open(path, 'wb') as handle:
                    handle.write(previous)
        self._kept.clear()
        for path, archived, parents in reversed(self._created):
            shutil.rmtree(path, ignore_errors=True)
            if archived is not None and os.path.exists(archived):
                os.rename(archived, path)
            for parent in parents:   # nearest first
                try:
                    os.rmdir(parent)
                except OSError:   # another of this run's folders, or someone else's, is in it
                    break
        self._created.clear()


def _file_handlers():
    import logging
    logger = logging.getLogger('basicsr')
    return [h for h in logger.handlers if isinstance(h, logging.FileHandler)]


def fail(message: str, code: int = 2) -> None:
    """Print one line for the user and exit; used by the entry points for bad input."""
    print(f'error: {message}', file=sys.stderr, flush=True)
    raise SystemExit(code)
