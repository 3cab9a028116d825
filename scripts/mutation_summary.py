"""Summarise ``mutmut results --all true`` per module: killed / survived / no tests per file.

Used by ``scripts/mutation_test.sh``: ``mutation_summary.py RESULTS [LATER ...] [--merged OUT]
[--only GLOB ...]``. Lines look like ``    basicsr_ldt.ldt.ldt_s.xǁAlternatingFreezingǁstep__mutmut_3: survived``.
A later file's verdict replaces an earlier one's unless it is "not checked" (``--retest`` reruns only some
mutants); ``--merged`` writes the combined verdicts; ``--only`` counts only the mutants whose names match
one of the globs (a run restricted to some functions by ``MUTATION_NAMES``, whose other mutants mutmut
lists as "not checked"). "Killed" counts timeouts and segfaults too (the tests noticed the mutant);
"no tests" means no selected test runs that function in-process (see docs/development.md).
"""
import argparse
import fnmatch
import re
from collections import Counter, defaultdict
from typing import Dict, List, Tuple

KILLED = {'killed', 'timeout', 'caught by type check', 'segfault'}
LINE = re.compile(r'\s*(\S+__mutmut_\d+): (.+)$')


def read(paths: List[str]) -> Dict[str, str]:
    """``{mutant: verdict}``, later files overriding earlier ones where they checked the mutant."""
    verdicts: Dict[str, str] = {}
    for path in paths:
        with open(path, encoding='utf-8') as stream:
            for line in stream:
                match = LINE.match(line.rstrip('\n'))
                if match and (match.group(2) != 'not checked' or match.group(1) not in verdicts):
                    verdicts[match.group(1)] = match.group(2)
    return verdicts


def module_of(mutant: str) -> str:
    return re.split(r'\.x(?:_|ǁ)', mutant, maxsplit=1)[0]


def row(counts: Counter) -> Tuple[int, int, int, int]:
    return sum(counts[s] for s in KILLED), counts['survived'], counts['no tests'], sum(counts.values())


def table(verdicts: Dict[str, str]) -> str:
    per_module: Dict[str, Counter] = defaultdict(Counter)
    for mutant, verdict in verdicts.items():
        per_module[module_of(mutant)][verdict] += 1
    total: Counter = Counter()
    lines = [f"{'module':<40} {'killed':>7} {'survived':>9} {'no tests':>9} {'total':>6} {'score':>6}"]
    for name in sorted(per_module) + ['all']:
        counts = total if name == 'all' else per_module[name]
        if name != 'all':
            total.update(counts)
        killed, survived, untested, everything = row(counts)
        score = f'{100 * killed / (killed + survived):.0f}%' if killed + survived else '-'
        lines.append(f'{name:<40} {killed:>7} {survived:>9} {untested:>9} {everything:>6} {score:>6}')
    other = {s: n for s, n in total.items() if s not in KILLED | {'survived', 'no tests'}}
    if other:
        lines.append('other verdicts: ' + ', '.join(f'{s}: {n}' for s, n in sorted(other.items())))
    return '\n'.join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('results', nargs='+', help='outputs of mutmut results --all true, oldest first')
    parser.add_argument('--merged', help='write the combined verdicts here, in the same format')
    parser.add_argument('--only', action='append', default=[], metavar='GLOB',
                        help='count only mutants whose names match this glob (repeatable)')
    args = parser.parse_args()
    verdicts = read(args.results)
    if args.merged:   # every verdict, so that a later run restricted to other functions keeps these
        with open(args.merged, 'w', encoding='utf-8') as stream:
            stream.writelines(f'    {m}: {v}\n' for m, v in verdicts.items())
    if args.only:
        verdicts = {m: v for m, v in verdicts.items() if any(fnmatch.fnmatchcase(m, g) for g in args.only)}
    print(table(verdicts))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
