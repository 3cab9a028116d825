"""CorGrad and LDT-S options through the real entry point: a short CorGrad run on three demo
cameras selected by ``ldt: {method: corgrad}``, its exact resume, and bad input (one line,
nothing written)."""
import pytest

from conftest import run_entry
from test_cli import write
from test_hardening import assert_one_line_failure, last_line
from test_ldt_model import assert_resume_reproduces, ldt_options

CAMERAS = ['Olympus', 'Sony', 'Canon']


def corgrad_options(data, name, cameras=CAMERAS, **ldt):
    opt = ldt_options(data, name, total_iter=4)
    opt['ldt'] = {'method': 'corgrad', 'slices': 5, **ldt}
    opt['datasets']['train'].update(cameras=cameras, batch_size_per_gpu=3)
    return opt


def test_corgrad_trains_on_camera_balanced_batches_and_resumes_exactly(project, demo_data):
    # an LDT option file switched to CorGrad by overriding `method` alone (as a study does)
    opt = ldt_options(demo_data, 'cg', total_iter=4, ratio_u=0.5)
    opt['ldt']['method'] = 'corgrad'
    opt['ldt']['slices'] = 5
    opt['datasets']['train'].update(cameras=CAMERAS, batch_size_per_gpu=3)
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'cg.yml', opt))
    exp = project / 'experiments' / 'cg'
    log = next(exp.glob('train_cg_*.log')).read_text()
    assert "CorGrad over source cameras ['Canon', 'Olympus', 'Sony']: 5 slices per layer" in log
    assert 'LDT options ignored by CorGrad: ema_every, head_warmup_iters, profile_iters, ratio_u' in log
    assert 'l_corgrad' in log and 'corgrad_fm' in log and 'l_primary' not in log
    assert (exp / 'models' / 'net_g_latest.pth').is_file()
    assert_resume_reproduces(project, 'cg', 2, corgrad_options(demo_data, 'cut2'))


@pytest.mark.parametrize('make, message', [
    (lambda d: corgrad_options(d, 'bad', cameras=['Olympus']),
     "error: datasets.train.cameras: CorGrad needs at least two source cameras (one gradient per camera), "
     "the training data has ['Olympus']"),
    (lambda d: corgrad_options(d, 'bad', slices=4),
     "error: ldt.slices: expected an integer in [5, 100], got"),
    (lambda d: corgrad_options(d, 'bad', corgrad_variant='github'),
     "error: ldt.corgrad_variant: expected one of 'paper', 'official', got 'github'"),
    (lambda d: corgrad_options(d, 'bad', slice=10),
     "error: ldt: unknown CorGrad option 'slice'; did you mean 'slices'?"),
    (lambda d: ldt_options(d, 'bad', method='ldt_s', interval_iters=0),
     "error: ldt.interval_iters: expected an integer >= 1, got 0"),
    (lambda d: ldt_options(d, 'bad', method='corgad'),
     "error: ldt.method: expected one of 'ft', "),
    (lambda d: ldt_options(d, 'bad', criterion='fischer'),
     "error: ldt.criterion: expected one of"),
], ids=['one_camera', 'slices', 'variant', 'slice_typo', 'interval_iters', 'method', 'criterion'])
def test_bad_method_options_fail_in_one_line_and_write_nothing(project, demo_data, make, message):
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'bad.yml', make(demo_data)), check=False)
    assert_one_line_failure(project, result, 'bad')
    assert last_line(result).startswith(message), last_line(result)


TWO_CAMERAS = ['Olympus', 'Sony']
UNUSED = ('changes nothing on two source cameras {}: no gradient is ever dominant there (norm - mean equals the std), '
          'so alpha and its decay are never used; remove it, or train on three or more cameras')


@pytest.mark.parametrize('cameras, batch, ldt, message', [
    (['Olympus'], 3, {}, "datasets.train.cameras: CorGrad needs at least two source cameras (one gradient per "
                         "camera), the training data has ['Olympus']"),
    (['Olympus', 'Sony', 'Canon'], 2, {}, 'datasets.train.batch_size_per_gpu: 2 is smaller than the 3 source cameras; '
                                          'CorGrad needs every camera in every batch'),
    # an alpha sweep over a camera pair trained one run several times (audit 2026-11-29)
    (TWO_CAMERAS, 2, {'alpha': 0.6}, 'ldt.alpha: 0.6 ' + UNUSED.format(TWO_CAMERAS)),
    (TWO_CAMERAS, 2, {'alpha_decay': 'linear'}, "ldt.alpha_decay: 'linear' " + UNUSED.format(TWO_CAMERAS)),
    (TWO_CAMERAS, 2, {'corgrad_variant': 'official', 'alpha_decay': 'log'},
     "ldt.alpha_decay: 'log' " + UNUSED.format(TWO_CAMERAS)),      # the official variant's own decay is none
])
def test_corgrads_data_is_checked_before_the_run_makes_anything(demo_data, cameras, batch, ldt, message):
    """With the training set, the early check runs CorGrad's data rule (it came after the banner, some 215
    lines into the run); without it, it cannot, and the model checks as it is built. On two cameras a
    value of alpha other than the default is refused; the defaults as the shipped files write them pass."""
    from basicsr_ldt.common.errors import InputError
    from basicsr_ldt.data.drealsr_dataset import DRealSRCameraDataset
    from basicsr_ldt.models.option_values import check_option_values
    if cameras == TWO_CAMERAS:
        shipped = corgrad_options(demo_data, 'early', cameras=cameras, alpha=1.0, alpha_decay='log')
        shipped['datasets']['train']['batch_size_per_gpu'] = batch
        check_option_values(shipped, DRealSRCameraDataset({**shipped['datasets']['train'], 'phase': 'train',
                                                            'scale': 4}))
    opt = corgrad_options(demo_data, 'early', cameras=cameras, **ldt)
    opt['datasets']['train']['batch_size_per_gpu'] = batch
    train_set = DRealSRCameraDataset({**opt['datasets']['train'], 'phase': 'train', 'scale': 4})
    check_option_values(opt)
    with pytest.raises(InputError) as err:
        check_option_values(opt, train_set)
    assert str(err.value) == message



def test_the_log_says_alpha_does_nothing_on_two_cameras():
    """Two norms: norm - mean equals the std, so no camera is dominant and eq. 11 never runs (docs/methods.md);
    an alpha sweep over camera pairs trained one run several times, while the log printed alpha every step."""
    from basicsr_ldt.corgrad.algorithm import CorGradConfig
    from basicsr_ldt.models.corgrad_model import describe_corgrad
    config = CorGradConfig(slices=5, alpha=0.6)
    assert describe_corgrad(config, ['Olympus', 'Pan'], []) == (
        "CorGrad over source cameras ['Olympus', 'Pan']: 5 slices per layer, alpha 0.6 (decay log); with two source "
        'cameras no gradient is ever dominant, so alpha and its decay change nothing, paper variant, camera-balanced '
        'batches')
    assert describe_corgrad(config, CAMERAS, ['ratio_u', 'ema_every']) == (
        "CorGrad over source cameras ['Olympus', 'Sony', 'Canon']: 5 slices per layer, alpha 0.6 (decay log), paper "
        'variant, camera-balanced batches; LDT options ignored by CorGrad: ratio_u, ema_every')
