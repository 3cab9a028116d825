"""``python scripts/study.py -opt options/study/<name>.yml [--dry-run | --commands FILE | --collect] [--jobs N]``."""
import argparse
import os
import sys
from os import path as osp
from typing import List, Optional, Sequence

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.flags import FlagParser, positive_int
from basicsr_ldt.common.outputs import fail
from basicsr_ldt.study import report
from basicsr_ldt.study.plan import Study, load_study, missing_inputs
from basicsr_ldt.study.run import DONE, RunFailed, check_unchanged, commands, execute, run_state, shell_line
from basicsr_ldt.study.run import write_option_files


#: The first line of a ``--commands`` file: only such a file is overwritten by the next ``--commands``.
COMMANDS_MARK = '# written by scripts/study.py --commands:'


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = FlagParser('python scripts/study.py',
                        description='Train and test every (method, sweep point, seed) run of a study, skip finished '
                                    'runs, resume interrupted ones, and aggregate the results.')
    parser.add_argument('-opt', required=True, help='study file (options/study/<name>.yml)')
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument('--dry-run', action='store_true', help='validate the study and print the planned runs')
    mode.add_argument('--commands', metavar='FILE',
                      help='write one shell command per pending run to FILE instead of running them')
    mode.add_argument('--collect', action='store_true', help='only aggregate the results that exist')
    parser.add_argument('--jobs', type=positive_int, default=1, metavar='N',
                        help='runs trained at a time (default 1); each gets OMP_NUM_THREADS = cores / N '
                             'unless OMP_NUM_THREADS is set')
    return parser.parse_args(argv)


def describe(root: str, study: Study) -> List[str]:
    """One line per planned run with its state."""
    lines = [f"study '{study.name}': {len(study.methods)} method(s) x {len(study.sweep_points())} sweep point(s) "
             f'x {len(study.seeds)} seed(s) = {len(study.runs)} runs; reference {study.reference}']
    for run in study.runs:
        sweep = ''.join(f' {k}={v}' for k, v in run.sweep.items())
        ema = ' (tests params_ema)' if run.uses_ema else ''
        what = f"{run.train_opt['model_type']}{sweep} seed {run.seed}{ema}" if run.trained else run.description
        lines.append(f'  [{run.index + 1}/{len(study.runs)}] {run.name}: {run_state(root, study, run)}; {what}')
    return lines


def main(root: str, argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; ``root`` is where ``Train_pip.py``, ``experiments/`` and ``results/`` are."""
    root = osp.abspath(root)
    try:
        args = parse_args(argv)
        if args.commands:
            check_commands_file(args.commands)
        study = load_study(args.opt, root)
        missing = missing_inputs(study, root)
        check_unchanged(root, study)   # also before --collect: a run's results under options it was not trained with
        if args.dry_run:
            print('\n'.join(describe(root, study)))
            for item in missing:
                print(f'  not found (needed to train/test; not checked by --dry-run): {item}')
            return 0
        if args.collect:
            return _report(root, study)
        if missing:
            raise InputError(f"study '{study.name}' cannot run: {missing[0]} not found"
                             + (f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''))
    except InputError as err:
        fail(str(err))
    if args.commands:
        return _write_commands(root, study, args.commands)
    print('\n'.join(describe(root, study)), flush=True)
    try:
        execute(root, study, study.runs, say=lambda line: print(line, flush=True), jobs=args.jobs)
    except RunFailed as err:
        print(f'error: {err}', file=sys.stderr, flush=True)
        _report(root, study)
        return 1
    return _report(root, study)


def check_commands_file(path: str) -> None:
    """``--commands FILE`` names a file this run can write (checked before any option file is written)."""
    if osp.isdir(path):
        raise InputError(f"--commands '{path}' is a folder; expected a file to write the commands to")
    folder = osp.dirname(osp.abspath(path))
    if not osp.isdir(folder):
        raise InputError(f"--commands '{path}': its folder '{folder}' does not exist")
    if path.lower().endswith(('.yml', '.yaml')):
        raise InputError(f"--commands '{path}' names an option file; expected a shell file to write the commands to "
                         '(e.g. jobs.sh)')
    if osp.isfile(path) and osp.getsize(path):
        with open(path, encoding='utf-8', errors='replace') as handle:
            first = handle.readline()
        if not first.startswith(COMMANDS_MARK):
            raise InputError(f"--commands '{path}' exists and was not written by --commands; expected a new file (or "
                             'one an earlier --commands wrote), so that nothing else is overwritten')


def _write_commands(root: str, study: Study, path: str) -> int:
    lines = []
    for run in study.runs:
        state = run_state(root, study, run)
        if state != DONE:
            write_option_files(root, study, run)
            lines.append(shell_line(root, commands(root, study, run, state)))
    tmp = f'{path}.tmp'
    with open(tmp, 'w', encoding='utf-8') as handle:
        handle.write(f"{COMMANDS_MARK} pending runs of study '{study.name}' ({study.path})\n")
        handle.write(''.join(line + '\n' for line in lines))
    os.replace(tmp, path)
    print(f'{len(lines)} pending run(s) of {len(study.runs)} written to {path}; when they are done: '
          f"python scripts/study.py -opt {study.path} --collect")
    return 0


def _report(root: str, study: Study) -> int:
    result = report.collect(root, study)
    if not result['runs']:
        print(f"study '{study.name}': no run has test results yet; nothing to aggregate")
        return 0
    folder = osp.join(root, 'results', study.name)
    paths = report.write_report(folder, result)
    print(report.markdown(result))
    stale = f"; {len(result['stale'])} left out, tested before their weights changed" if result['stale'] else ''
    print(f"{len(result['runs'])} of {len(study.runs)} runs aggregated into {', '.join(paths)}{stale}")
    return 0
