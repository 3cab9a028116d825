"""LDT-S through the real entry point: shared warm-up/profiling, alternating groups, composite
checkpoint, exact resume after a kill mid-interval and right at a swap."""
import shutil

import pytest
import torch

from conftest import run_entry
from test_cli import write
from test_ldt_model import assert_resume_reproduces, ldt_options

# warm-up 1-2, profiling 3-4, LDT-S 5-10 with intervals of 2: swaps after iterations 6, 8, 10
LDT_S = dict(method='ldt_s', interval_iters=2, ema_every=1)


@pytest.fixture(scope='module')
def ldt_s_run(tmp_path_factory, demo_data):
    from conftest import REPO
    project = tmp_path_factory.mktemp('ldt_s_project')
    shutil.copy(REPO / 'Train_pip.py', project / 'Train_pip.py')
    run_entry(project, 'Train_pip.py', '-opt',
              write(project / 'ldt_s.yml', ldt_options(demo_data, 'ldt_s', total_iter=10, **LDT_S)))
    return project


def test_ldt_s_trains_the_groups_in_turn(ldt_s_run):
    exp = ldt_s_run / 'experiments' / 'ldt_s'
    log = next(exp.glob('train_ldt_s_*.log')).read_text()
    assert 'head warm-up on D_S1 (2 iterations) from iteration 1' in log
    assert 'LDT-S (one network, groups frozen alternately every 2 iterations' in log
    assert 'l_stable' in log and 'l_unstable' in log and 'l_auxiliary' not in log
    assert (exp / 'ldt_partition.json').is_file()
    state = torch.load(exp / 'training_states' / '10.state', weights_only=True)
    assert len(state['optimizers']) == 1 and state['extra']['ldt']['alternation']['active'] == 'unstable'


@pytest.mark.parametrize('stop', [5, 6], ids=['mid-interval', 'at-swap'])
def test_resume_reproduces_the_uninterrupted_run(ldt_s_run, demo_data, stop):
    assert_resume_reproduces(ldt_s_run, 'ldt_s', stop,
                             ldt_options(demo_data, f'cut{stop}', total_iter=10, **LDT_S))
