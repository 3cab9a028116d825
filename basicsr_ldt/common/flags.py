"""Command-line flags that fail like every other bad input: one ``error: ...`` line, exit code 2.

argparse prints its usage block before the error, so a misspelt flag looked unlike a misspelt
option key or path. :class:`FlagParser` raises :class:`InputError` instead, and the entry points
print it as they print any other.
"""
import argparse
from typing import Any

from basicsr_ldt.common.errors import InputError


class FlagParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are :class:`InputError` naming ``command -h`` for the flags."""

    def __init__(self, command: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.command = command

    def error(self, message: str) -> None:
        raise InputError(f'{message} ({self.command} -h lists the flags)')


def positive_int(text: str) -> int:
    """An argparse ``type`` for counts and sizes: an integer >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f'expected an integer >= 1, got {text!r}')
    return int(text)


def non_negative_int(text: str) -> int:
    """An argparse ``type`` for counts that may be 0 (warm-up steps, "leave the default")."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f'expected an integer >= 0, got {text!r}')
    return int(text)
