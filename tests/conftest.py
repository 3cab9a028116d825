"""Shared fixtures: a small demo dataset and a way to run the real command-line entry points."""
import contextlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch  # (does not import triton)

# Triton's CPU interpreter is chosen when triton is first imported, and basicsr_ldt's imports
# already pull triton in (through torch._dynamo): without a GPU, switch it on now so that
# tests/test_scan_triton.py can run the Triton scan kernels on CPU tensors.
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')

import basicsr_ldt  # noqa: E402,F401  (torchvision shim + registration before any basicsr import)

REPO = Path(__file__).resolve().parents[1]
# The longest tests (minutes of Triton compiling, a CPU training of every GPU-check option file) run
# first, so that with several workers (scripts/run_tests.sh runs pytest-xdist) they start at once
# instead of leaving one worker busy after the others have finished.
LONGEST_FIRST = ('test_scan_static.py', 'test_gpu_check.py')


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # a stable sort: order kept otherwise


def load_script(name: str):
    """Import ``scripts/<name>.py`` as a module (scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / 'scripts' / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='session')
def demo_module():
    return load_script('make_demo_data')


@pytest.fixture(scope='session')
def demo_data(tmp_path_factory, demo_module) -> Path:
    """A mini DRealSR with three cameras (six train / two test pairs each), built once."""
    out = tmp_path_factory.mktemp('data') / 'DRealSR_demo'
    demo_module.make_demo_data(out, seed=0, cameras=('Olympus', 'Sony', 'Canon'), train_per_camera=6,
                               test_per_camera=2, hr_size=64, test_hr_size=96)
    return out


@pytest.fixture
def project(tmp_path) -> Path:
    """A scratch project root: the entry scripts copied in, so experiments/ and results/ land here."""
    for script in ('Train_pip.py', 'test.py'):
        shutil.copy(REPO / script, tmp_path / script)
    return tmp_path


def on_two_gloo_ranks(worker, *args) -> None:
    """``worker(rank, *args)`` in two spawned processes that form a gloo process group (torchrun's
    collectives on the CPU); ``worker`` is a module-level function, so that the children can import it."""
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    mp.spawn(_gloo_rank, args=(port, worker, args), nprocs=2)


def _gloo_rank(rank: int, port: int, worker, args: tuple) -> None:
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=2)
    try:
        worker(rank, *args)
    finally:
        dist.destroy_process_group()


def fake_cuda_allocator(monkeypatch, bench) -> dict:
    """A benchmark script's CUDA-only branches on a CPU: ``bench.on_cuda`` says yes, synchronising
    does nothing, and the allocator counters read the returned dict (``now``: allocated, ``peak``:
    the peak since the last reset), which a faked step sets."""
    allocated = {'now': 0, 'peak': 0}
    monkeypatch.setattr(bench, 'on_cuda', lambda device: True)
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda: None)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: 'a GPU')
    monkeypatch.setattr(torch.cuda, 'reset_peak_memory_stats', lambda: allocated.update(peak=allocated['now']))
    monkeypatch.setattr(torch.cuda, 'memory_allocated', lambda: allocated['now'])
    monkeypatch.setattr(torch.cuda, 'max_memory_allocated', lambda: allocated['peak'])
    return allocated


def run_entry(project: Path, script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python <script> ...`` in ``project`` the way a user would."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''),
               CUDA_VISIBLE_DEVICES='')
    result = subprocess.run([sys.executable, script, *args], cwd=project, env=env, capture_output=True, text=True,
                            timeout=600)
    if check and result.returncode != 0:
        raise AssertionError(f'{script} {" ".join(args)} failed ({result.returncode}):\n'
                             f'{result.stdout[-3000:]}\n{result.stderr[-3000:]}')
    return result


class _Messages(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def basicsr_log():
    """The INFO messages BasicSR's logger gets inside the block, as a list (it does not propagate to
    pytest's caplog, and it is at INFO only if BasicSR first created it with a log file)."""
    messages, logger = _Messages(), logging.getLogger('basicsr')
    level = logger.level
    logger.addHandler(messages)
    logger.setLevel(logging.INFO)
    try:
        yield messages.lines
    finally:
        logger.removeHandler(messages)
        logger.setLevel(level)


class RerunRecorder:
    """A step graph's recorder for the CPU (basicsr_ldt.ldt.step_graph.Recorder): the recording runs
    the step once and keeps the tensors it returned; a replay runs the step again and copies what it
    made into them, as a CUDA graph's replay writes into the memory it recorded, and leaves the
    network's ``.grad`` attributes as they were (a replay sets no attribute)."""

    def __init__(self, network):
        self.network, self.step, self.outputs, self.replays = network, None, None, 0

    def record(self, step):
        self.step, self.outputs = step, step()
        return self.outputs

    def replay(self):
        self.replays += 1
        params = list(self.network.parameters())
        grads = [p.grad for p in params]
        for kept, new in zip(self.outputs, self.step()):
            kept.copy_(new)
        for p, grad in zip(params, grads):
            p.grad = grad
