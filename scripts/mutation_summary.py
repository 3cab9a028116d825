"""Summarise ``mutmut results --all true`` per module: killed / survived / other per file.

Used by ``scripts/mutation_test.sh``; reads the results file given as the only argument. Lines look like
``    basicsr_ldt.ldt.ldt_s.xǁAlternatingFreezingǁstep__mutmut_3: survived``. "Killed" counts timeouts
and type-check kills too (the mutant was detected); "no tests" means no selected test runs that
function in-process (see docs/development.md).
"""
import re
import sys
from collections import Counter, defaultdict
from typing import Dict, Tuple

KILLED = {'killed', 'timeout', 'caught by type check', 'segfault'}


def parse(path: str) -> Dict[str, Counter]:
    """``{module: Counter(status)}``, the module being the dotted prefix before ``.x_``/``.xǁ``."""
    per_module: Dict[str, Counter] = defaultdict(Counter)
    with open(path, encoding='utf-8') as stream:
        for line in stream:
            match = re.match(r'\s*(\S+?)\.x(?:_|ǁ)\S*__mutmut_\d+: (.+)$', line.rstrip('\n'))
            if match:
                per_module[match.group(1)][match.group(2)] += 1
    return per_module


def row(counts: Counter) -> Tuple[int, int, int, int]:
    killed = sum(counts[s] for s in KILLED)
    survived = counts['survived']
    untested = counts['no tests']
    return killed, survived, untested, sum(counts.values())


def main(path: str) -> int:
    per_module = parse(path)
    total = Counter()
    print(f"{'module':<40} {'killed':>7} {'survived':>9} {'no tests':>9} {'total':>6} {'score':>6}")
    for module in sorted(per_module):
        counts = per_module[module]
        total.update(counts)
        killed, survived, untested, all_ = row(counts)
        tested = killed + survived
        score = f'{100 * killed / tested:.0f}%' if tested else '-'
        print(f'{module:<40} {killed:>7} {survived:>9} {untested:>9} {all_:>6} {score:>6}')
    killed, survived, untested, all_ = row(total)
    tested = killed + survived
    print(f"{'all':<40} {killed:>7} {survived:>9} {untested:>9} {all_:>6} "
          f"{(f'{100 * killed / tested:.0f}%' if tested else '-'):>6}")
    other = {s: n for s, n in total.items() if s not in KILLED | {'survived', 'no tests'}}
    if other:
        print('other statuses:', ', '.join(f'{s}: {n}' for s, n in sorted(other.items())))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1]))
