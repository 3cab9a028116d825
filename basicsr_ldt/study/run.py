"""Running a study's runs: each one ``Train_pip.py --auto_resume`` then ``test.py`` in a subprocess.

Why subprocesses: every run then is exactly what a user gets from the two entry points (same
code, same logs, same folders), BasicSR's once-per-process logger and registries start clean, and
the same command lines can be handed to a cluster scheduler instead (``--commands``).

Where things go (BasicSR's own layout, one level deeper):
    experiments/<study>/<run>/          the run's experiment folder (models, training_states, log)
    experiments/<study>/_study/         the generated option files and each run's console output
    results/<study>/<run>/metrics.json  the run's test results (test.py)
A run is finished when its final checkpoint and test results newer than it exist; a run with
training states resumes from the newest (``--auto_resume``). While a run trains, one live line
(on a terminal) shows its iteration, iterations/s and time left, read from its console output
(with ``--jobs`` > 1, several runs at a time, only the per-run lines).
"""
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from os import path as osp
from typing import Callable, List, Optional, TextIO

import yaml
from tqdm import tqdm

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.study.plan import Run, Study, final_checkpoint, read_yaml, results_file

DONE, TEST, RESUME, NEW = 'finished', 'test only', 'resume', 'new'
#: Where the package lives, so that subprocesses import it whatever their working directory.
PACKAGE_PARENT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


class RunFailed(RuntimeError):
    """A run's training or test command exited with an error."""


def study_folder(root: str, study: Study) -> str:
    return osp.join(root, 'experiments', study.name, '_study')


def option_files(root: str, study: Study, run: Run) -> List[str]:
    """The run's training and test option files (only the test file for a run without training)."""
    folder = study_folder(root, study)
    test = osp.join(folder, f'{run.name}.test.yml')
    return [osp.join(folder, f'{run.name}.train.yml'), test] if run.trained else [test]


def run_state(root: str, study: Study, run: Run) -> str:
    """``finished``, ``test only`` (trained, not tested since), ``resume`` or ``new``; a run
    without training is ``finished`` once it has test results, else ``test only``."""
    checkpoint = final_checkpoint(root, study.name, run.name)
    results = results_file(root, study.name, run.name)
    if not run.trained or osp.isfile(checkpoint):   # tested weights: WiSE-FT's inputs, or the run's final ones
        return DONE if osp.isfile(results) and not stale_results(root, study, run) else TEST
    states = osp.join(root, 'experiments', study.name, run.name, 'training_states')
    if osp.isdir(states) and any(f.endswith('.state') for f in os.listdir(states)):
        return RESUME
    return NEW


def stale_results(root: str, study: Study, run: Run) -> bool:
    """Whether the run's test results are older than weights they were tested from (a run trained again,
    or a test that failed after its training finished): they describe other weights. Weights deleted
    since (to save disk) leave the results standing."""
    results = results_file(root, study.name, run.name)
    tested = run.inputs if not run.trained else [final_checkpoint(root, study.name, run.name)]
    return osp.isfile(results) and any(osp.getmtime(f) > osp.getmtime(results) for f in tested if osp.isfile(f))


def check_unchanged(root: str, study: Study) -> None:
    """Refuse to continue a started run whose options the study file no longer produces, and to use
    results tested with other test options (another camera list, start or test file): they would be
    attributed to options the run was not trained or tested with, or pooled with runs tested otherwise."""
    retest = []
    for run in study.runs:
        files = option_files(root, study, run)
        started = osp.isdir(osp.join(root, 'experiments', study.name, run.name))
        if run.trained and started and osp.isfile(files[0]) \
                and read_yaml(files[0], 'option file') != _plain(run.train_opt):
            raise InputError(f"run '{run.name}' was started with other options ({files[0]}); delete "
                             f"experiments/{study.name}/{run.name} and results/{study.name}/{run.name} to "
                             'train it again, or give the study another name')
        tested = osp.isfile(results_file(root, study.name, run.name)) and osp.isfile(files[-1])
        if tested and read_yaml(files[-1], 'option file') != _plain(run.test_opt):
            retest.append((run.name, files[-1]))
    if retest:
        name, file = retest[0]
        more = f' (and {len(retest) - 1} more run(s))' if len(retest) > 1 else ''
        raise InputError(f"run '{name}'{more} was tested with other test options ({file}), which the study no longer "
                         f"makes; delete results/{study.name} (trained weights are kept and tested again) or give "
                         'the study another name')


def _plain(opt):
    """Options as they read back from YAML (tuples become lists)."""
    return yaml.safe_load(yaml.safe_dump(opt, sort_keys=False))


def write_option_files(root: str, study: Study, run: Run) -> List[str]:
    """Write the run's training and test option files (each written whole, then renamed)."""
    files = option_files(root, study, run)
    os.makedirs(osp.dirname(files[0]), exist_ok=True)
    for path, opt in zip(files, (run.train_opt, run.test_opt) if run.trained else (run.test_opt,)):
        tmp = f'{path}.tmp'
        with open(tmp, 'w', encoding='utf-8') as handle:
            handle.write(f'# Generated by scripts/study.py from {study.path} (run {run.name}); edit the study file.\n')
            yaml.safe_dump(_plain(opt), handle, sort_keys=False)
        os.replace(tmp, path)
    return files


def commands(root: str, study: Study, run: Run, state: str) -> List[List[str]]:
    """The command lines that bring a run to ``finished`` from ``state`` (run with cwd = root)."""
    files = option_files(root, study, run)
    python = sys.executable or 'python'
    steps = []
    if state in (NEW, RESUME):
        steps.append([python, osp.join(root, 'Train_pip.py'), '-opt', files[0], '--auto_resume'])
    if state != DONE:
        steps.append([python, osp.join(root, 'test.py'), '-opt', files[-1]])
    return steps


def shell_line(root: str, steps: List[List[str]]) -> str:
    """One shell line for ``--commands``: cd to the root, then each step, stopping at a failure."""
    env = f'PYTHONPATH={shlex.quote(PACKAGE_PARENT)}${{PYTHONPATH:+:$PYTHONPATH}}'
    return f'cd {shlex.quote(root)} && ' + ' && '.join(f'{env} {shlex.join(step)}' for step in steps)


def execute(root: str, study: Study, runs: List[Run], say: Callable[[str], None] = print,
            live: Optional[TextIO] = None, jobs: int = 1) -> None:
    """Bring every run to ``finished``, printing a progress line per run as it finishes.

    ``jobs`` runs train at a time (each in its own processes). A small network gains little from
    a second thread, so on a 2-core CPU two 1-thread runs side by side take about half the time of
    one 2-thread run after another. With one job, a live line shows the training run (on ``live``;
    default: stderr when it is a terminal); with several, their lines would interleave, so there is
    none. After a failure no new run starts; the runs under way finish, then the failure is raised.
    Runs that read another run's weights (WiSE-FT) start after every run that reads none.
    """
    start = time.time()
    durations: List[float] = []
    pending = [run for run in runs if run_state(root, study, run) != DONE]
    total = len(runs)
    lock = threading.Lock()
    # Several runs at a time share the cores: unless the user chose, each gets its share of them.
    threads = None if jobs == 1 or os.environ.get('OMP_NUM_THREADS') else max(1, (os.cpu_count() or 1) // jobs)
    failed = threading.Event()

    def bring(position: int, run: Run) -> None:
        if failed.is_set():     # after a failure, a run that has not started never starts
            return
        state = run_state(root, study, run)
        if state == DONE:
            say(f'[{position}/{total}] {run.name}: finished earlier, skipped')
            return
        write_option_files(root, study, run)
        began = time.time()
        try:
            for step in commands(root, study, run, state):
                _call(root, study, run, step, live, shown=jobs == 1, threads=threads)
        except RunFailed:
            failed.set()
            raise
        with lock:
            durations.append(time.time() - began)
            left = len(pending) - len(durations)
            eta = sum(durations) / len(durations) * left / min(jobs, max(left, 1))
            say(f'[{position}/{total}] {run.name}: {state}, done in {_clock(durations[-1])} | elapsed '
                f'{_clock(time.time() - start)} | about {_clock(eta)} left for {left} run(s)')

    numbered = list(enumerate(runs, 1))
    for wave in ([p for p in numbered if p[1].after is None], [p for p in numbered if p[1].after is not None]):
        if jobs == 1:
            for position, run in wave:
                bring(position, run)
            continue
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(bring, position, run) for position, run in wave]
        for future in futures:
            if future.exception() is not None:
                raise future.exception()


def _call(root: str, study: Study, run: Run, step: List[str], live: Optional[TextIO] = None,
          shown: bool = True, threads: Optional[int] = None) -> None:
    log = osp.join(study_folder(root, study), f'{run.name}.out')
    env = dict(os.environ)
    if threads:
        env['OMP_NUM_THREADS'] = str(threads)
    env['PYTHONPATH'] = PACKAGE_PARENT + (os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH') else '')
    with open(log, 'a', encoding='utf-8') as handle:
        handle.write(f"\n$ {' '.join(step)}\n")
        handle.flush()
        process = subprocess.Popen(step, cwd=root, env=env, stdout=handle, stderr=subprocess.STDOUT)
        if shown and osp.basename(step[1]) == 'Train_pip.py':
            code = follow(process, LiveLine(log, handle.tell(), run.train_opt['train']['total_iter'], run.name, live))
        else:
            code = process.wait()
    if code != 0:
        with open(log, encoding='utf-8', errors='replace') as handle:
            tail = handle.read().splitlines()[-15:]
        raise RunFailed(f"run '{run.name}': {osp.basename(step[1])} exited with {code} (console output: {log}):\n"
                        + '\n'.join(tail))


#: BasicSR's MessageLogger line, e.g. ``[LDT_s..][epoch:  3, iter:   1,200, lr:(1.000e-04,)] [eta: ...``.
LOGGED_ITERATION = re.compile(r'\[epoch:\s*\d+, iter:\s*([\d,]+), lr:')


def logged_iteration(text: str) -> Optional[int]:
    """The last iteration BasicSR's message logger reported in ``text`` (``None`` if none)."""
    found = LOGGED_ITERATION.findall(text)
    return int(found[-1].replace(',', '')) if found else None


class LiveLine:
    """One live tqdm line for a training subprocess, fed by the console output it writes to ``path``.

    The iteration is the one of the run's own log lines (every ``logger.print_freq`` iterations);
    the rate and time left are tqdm's, counted from the first iteration seen, so a resumed run is
    not credited with the iterations it skipped. Shown only on a terminal unless ``stream`` is given.
    """

    def __init__(self, path: str, offset: int, total: int, label: str, stream: Optional[TextIO] = None) -> None:
        self.path, self.offset, self.total, self.label = path, offset, total, label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = stream is not None or self.stream.isatty()
        self.partial = b''
        self.bar: Optional[tqdm] = None

    def poll(self) -> Optional[int]:
        """Read what the run wrote since the last call; update the line; the newest iteration seen."""
        with open(self.path, 'rb') as handle:
            handle.seek(self.offset)
            data = handle.read()
        self.offset += len(data)
        complete, _, self.partial = (self.partial + data).rpartition(b'\n')
        iteration = logged_iteration(complete.decode('utf-8', 'replace'))
        if iteration is not None and self.enabled:
            if self.bar is None:
                self.bar = tqdm(total=self.total, initial=iteration, desc=self.label, unit='it', file=self.stream,
                                leave=False, bar_format='  {desc}: iter {n}/{total} | {rate_fmt} | {remaining} left')
            elif iteration > self.bar.n:
                self.bar.update(iteration - self.bar.n)
        return iteration

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def follow(process: subprocess.Popen, line: LiveLine, every: float = 0.5) -> int:
    """Wait for ``process``, polling ``line`` meanwhile; its exit code."""
    try:
        while True:
            try:
                code = process.wait(timeout=every)
            except subprocess.TimeoutExpired:
                line.poll()
            else:
                line.poll()
                return code
    finally:
        line.close()


def _clock(seconds: Optional[float]) -> str:
    seconds = int(round(seconds or 0))
    return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'
