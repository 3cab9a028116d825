"""Apply one hand-written mutant, run the tests, restore the file: did a test notice?

    python3 scripts/hand_mutant.py FILE OLD NEW [pytest arguments ...]

Replaces the one occurrence of the text OLD in FILE by NEW, runs ``pytest -x -q`` with the given
arguments, puts FILE back as it was (also on Ctrl-C or an error) and prints ``KILLED`` (a test
failed) or ``SURVIVED``, exiting 0 or 1. It is how a new behaviour's test is checked against the
behaviour's wrong variant before the change lands, and how mutants that mutmut cannot reach
(subprocess entry points, decorated functions, scripts/) are applied (docs/development.md,
"Mutation testing").
"""
import argparse
import subprocess
import sys
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('file', type=Path)
    parser.add_argument('old', help='text to replace; must occur exactly once in FILE')
    parser.add_argument('new', help='its replacement (the mutant)')
    parser.add_argument('pytest_args', nargs=argparse.REMAINDER, help='test files, -k expressions, ...')
    args = parser.parse_args(argv)
    if not args.file.is_file():
        parser.error(f"FILE '{args.file}' does not exist")
    source = args.file.read_text()
    count = source.count(args.old)
    if count != 1:
        parser.error(f"OLD occurs {count} times in '{args.file}'; expected exactly once (add context to it)")
    if args.new == args.old:
        parser.error('NEW equals OLD: that mutant changes nothing')
    args.file.write_text(source.replace(args.old, args.new))
    try:
        result = subprocess.run([sys.executable, '-m', 'pytest', '-x', '-q', '-p', 'no:cacheprovider',
                                 *args.pytest_args], capture_output=True, text=True)
    finally:
        args.file.write_text(source)
    killed = result.returncode != 0
    print(f"{'KILLED' if killed else 'SURVIVED'}: {args.file}: {_first_line(args.old)!r} -> {_first_line(args.new)!r}")
    if killed and result.returncode not in (1,):   # 1: tests failed; anything else: pytest itself did not run
        print(f'  (pytest exited {result.returncode}: check that the tests ran)\n{result.stdout[-1500:]}')
    return 0 if killed else 1


def _first_line(text: str) -> str:
    """The text's first line, shortened for the report ('' for a mutant that deletes)."""
    return (text.strip().splitlines() or [''])[0][:70]


if __name__ == '__main__':
    sys.exit(main())
