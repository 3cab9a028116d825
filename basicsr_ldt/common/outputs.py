"""Output folders that are either complete or not there at all.

BasicSR renames an existing ``experiments/<name>`` to ``<name>_archived_<time>`` and creates a new
one. If the run then fails on bad input (a wrong camera, a missing checkpoint), the user is left
with an empty experiment folder and their previous results moved aside. :class:`OutputFolder`
undoes both when setup fails.
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
        folders back."""
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
        for handler in _file_handlers():
            handler.close()


def _file_handlers():
    import logging
    logger = logging.getLogger('basicsr')
    return [h for h in logger.handlers if isinstance(h, logging.FileHandler)]


def fail(message: str, code: int = 2) -> None:
    """Print one line for the user and exit; used by the entry points for bad input."""
    print(f'error: {message}', file=sys.stderr, flush=True)
    raise SystemExit(code)
