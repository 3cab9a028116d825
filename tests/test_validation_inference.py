"""Validation and testing run the network the same way, and ``tile_mode: official`` is the official
LDT code's cutting (``Tools/Test_tool.py`` ``SR_slice``, also ``MambaIRModel.test`` upstream).

The reference below is written from reading ``SR_slice``, in float64, without the project's helpers:
per axis ``n // 200 + 1`` sections; reflect padding at the bottom/right up to a multiple of that
count; each section widened by ``section // 10`` towards each inner neighbour (not at the image
border); the first section keeps its first ``section`` rows of output, the others skip
``shave * scale`` rows first; the padded output is cut back to LR size x scale.
"""
import copy
import logging
import os

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.inference.settings import inference_settings
from basicsr_ldt.inference.tiling import official_forward, run_inference
from basicsr_ldt.models.validation import validation_settings

SCALE = 4


def sr_slice_reference(model, lr: torch.Tensor, s: int) -> torch.Tensor:
    """Tools/Test_tool.py SR_slice, re-derived: returns the super-resolved image (float64)."""
    _, c, h, w = lr.shape
    tokens_h, tokens_w = h // 200 + 1, w // 200 + 1
    pad_h = 0 if h % tokens_h == 0 else tokens_h - h % tokens_h
    pad_w = 0 if w % tokens_w == 0 else tokens_w - w % tokens_w
    img = F.pad(lr, (0, pad_w, 0, pad_h), mode='reflect')
    big_h, big_w = img.shape[-2:]
    split_h, split_w = big_h // tokens_h, big_w // tokens_w
    shave_h, shave_w = split_h // 10, split_w // 10
    n_rows, n_cols = big_h // split_h, big_w // split_w

    def span(k, n, split, shave):
        start = k * split if k == 0 else k * split - shave
        stop = (k + 1) * split if k == n - 1 else (k + 1) * split + shave
        return start, stop

    merged = torch.zeros(1, c, big_h * s, big_w * s, dtype=torch.float64)
    for i in range(n_rows):
        for j in range(n_cols):
            r0, r1 = span(i, n_rows, split_h, shave_h)
            c0, c1 = span(j, n_cols, split_w, shave_w)
            out = model(img[..., r0:r1, c0:c1])
            keep_r = 0 if i == 0 else shave_h * s
            keep_c = 0 if j == 0 else shave_w * s
            merged[..., i * split_h * s:(i + 1) * split_h * s, j * split_w * s:(j + 1) * split_w * s] = \
                out[..., keep_r:keep_r + split_h * s, keep_c:keep_c + split_w * s]
    return merged[..., :big_h * s - pad_h * s, :big_w * s - pad_w * s]


class PositionNet(torch.nn.Module):
    """Nearest x4 of a 3x3 zero-padded blur, plus a ramp over the output coordinates of whatever it is
    given: every output pixel depends on where it sits in its section, so a pixel pasted from the
    wrong section, offset or padding changes the result."""

    scale = SCALE

    def forward(self, x):
        blur = F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=True)
        up = F.interpolate(blur, scale_factor=SCALE, mode='nearest')
        rows = torch.arange(up.shape[-2], dtype=x.dtype).view(-1, 1)
        cols = torch.arange(up.shape[-1], dtype=x.dtype).view(1, -1)
        return up + (rows * 7 + cols * 3) / 1e4


class ConvNet(torch.nn.Module):
    """Two 3x3 convolutions and a pixel shuffle: receptive field radius 2 LR pixels."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 3 * SCALE * SCALE, 3, padding=1)

    def forward(self, x):
        return F.pixel_shuffle(self.b(torch.relu(self.a(x))), SCALE)


@pytest.mark.parametrize('h, w', [(57, 86), (201, 199), (401, 650), (200, 400)])   # 200 | 400: 2 | 3 sections
def test_official_tiling_is_sr_slice_pixel_for_pixel(h, w):
    lr = torch.rand(1, 3, h, w, generator=torch.Generator().manual_seed(h * w), dtype=torch.float64)
    net = PositionNet()
    expected = sr_slice_reference(net, lr, SCALE)
    got = official_forward(net, lr, SCALE)
    assert got.shape == (1, 3, h * SCALE, w * SCALE) == expected.shape
    assert torch.equal(got, expected.float())
    # The ramp makes the cutting visible: cut once per image, the result would be another one.
    if h >= 200 or w >= 200:
        assert not torch.equal(got, net(lr).float())


def test_official_tiling_equals_whole_image_when_the_receptive_field_fits_in_the_shave():
    """Sections overlap by section // 10 >= 13 LR pixels here, the network sees 2: with no padding
    (402 = 3 x 134, 652 = 4 x 163) the pasted sections are exactly the whole-image result; with
    reflect padding (401 x 650) only the pixels within reach of the padded border differ."""
    net = ConvNet().double()
    with torch.no_grad():
        lr = torch.rand(1, 3, 402, 652, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        assert torch.allclose(official_forward(net, lr, SCALE), net(lr).float(), rtol=0, atol=1e-6)
        lr = lr[..., :401, :650]
        tiled, whole = official_forward(net, lr, SCALE), net(lr).float()
        inner = (..., slice(0, (401 - 2) * SCALE), slice(0, (650 - 2) * SCALE))
        assert torch.allclose(tiled[inner], whole[inner], rtol=0, atol=1e-6)
        assert not torch.allclose(tiled, whole, rtol=0, atol=1e-3)   # the reflect padding is really there


def test_run_inference_follows_the_mode_and_precision():
    net = PositionNet()
    lr = torch.rand(1, 3, 230, 90, generator=torch.Generator().manual_seed(3))
    official = inference_settings('test', {'tile_mode': 'official'}, 'cpu')
    assert torch.equal(run_inference(net, lr, SCALE, official), official_forward(net, lr, SCALE))
    whole = inference_settings('test', {}, 'cpu')
    assert (whole.tile_mode, whole.dtype) == ('whole', None)
    assert torch.equal(run_inference(net, lr, SCALE, whole), net(lr))
    fixed = inference_settings('test', {'tile_size': 64, 'tile_overlap': 8}, 'cpu')
    assert fixed.tile_mode == 'fixed' and not torch.equal(run_inference(net, lr, SCALE, fixed), net(lr))
    conv = ConvNet()
    bf16 = inference_settings('test', {'tile_mode': 'official', 'precision': 'bf16'}, 'cpu')
    low, full = run_inference(conv, lr, SCALE, bf16), run_inference(conv, lr, SCALE, official)
    assert low.dtype == torch.float32 and 0 < (low - full).abs().max() < 0.05
    # What the log says validation and test.py run with ("Validation inference: ...").
    assert bf16.describe() == 'official LDT sections (n // 200 + 1 per axis, 10% overlap), bf16'
    assert fixed.describe() == '64-pixel tiles overlapping by 8, fp32'


@pytest.mark.parametrize('section, message', [
    ({'tile_mode': 'tiles'}, "val.tile_mode: expected one of 'official', 'fixed', 'whole', or null, got 'tiles'"),
    ({'tile_mode': 'official', 'tile_size': 200}, "val.tile_size: only tile_mode 'fixed' uses it"),
    ({'tile_mode': 'official', 'tile_overlap': 0}, "val.tile_overlap: only tile_mode 'fixed' uses it"),
    ({'tile_mode': 'fixed'}, "val.tile_size: tile_mode 'fixed' needs the tile size"),
    ({'tile_size': 32, 'tile_overlap': 32}, r'val.tile_overlap: expected an integer in \[0, tile_size=32\), got 32'),
    ({'precision': 'fp16'}, 'val.precision: fp16 needs a CUDA device'),
    ({'tile_size': '8'}, r"val.tile_size: expected an integer >= 0, got '8' \(text: YAML reads numbers"),
    ({'precision': 'half'}, "val.precision: expected one of 'fp32', 'bf16', 'fp16', got 'half'"),
    ({'tile_mod': 'official'}, "unknown option 'tile_mod' in val \\(did you mean 'tile_mode'\\?\\)"),
    ({'val_freq': 'often'}, "val.val_freq: expected a whole number >= 1, got 'often'"),
    ({'val_freq': 1.5}, r'val.val_freq: expected a whole number >= 1, got 1.5$'),   # validated every 3rd iteration
    ({'val_freq': 0}, r'val.val_freq: expected a whole number >= 1, got 0$'),
    ({'save_img': 'no'}, "val.save_img: expected true or false, got 'no'"),
])
def test_bad_val_options_are_one_line_naming_the_key(section, message):
    opt = {'scale': 4, 'num_gpu': 0, 'val': {'val_freq': 5, 'save_img': False, **section}}
    with pytest.raises(InputError, match=message) as caught:
        validation_settings(opt)
    assert '\n' not in str(caught.value)


def test_val_keys_of_basicsr_and_best_selection_are_accepted():
    val = {'val_freq': 5e3, 'save_img': False, 'pbar': True, 'metrics': {'psnr': {'type': 'x'}},
           'save_best': True, 'best_metric': 'psnr', 'best_dataset': 'a', 'best_network': 'composite',
           'tile_mode': 'official', 'precision': 'bf16'}
    settings = validation_settings({'scale': 4, 'num_gpu': 0, 'val': val})
    assert (settings.tile_mode, settings.dtype) == ('official', torch.bfloat16)
    assert validation_settings({'num_gpu': 0}).tile_mode == 'whole'
    assert inference_settings('test', {'tile_mode': None, 'tile_size': 8, 'tile_overlap': 2}, 'cpu').tile_mode == 'fixed'


def _model(demo_data, model_type, val):
    from basicsr.models import build_model
    from test_cli import train_options
    from test_ldt_model import NETWORK
    opt = train_options(demo_data, 'v', model_type=model_type, network_g=dict(NETWORK))
    if model_type == 'LDTSRModel':
        opt['ldt'] = {'head_warmup_iters': 1, 'profile_iters': 2, 'ema_every': 1}
    if model_type == 'CorGradSRModel':
        opt['datasets']['train']['cameras'] = ['Olympus', 'Sony']
    opt['val'].update(val)
    opt.update(is_train=True, dist=False, rank=0, world_size=1)
    return build_model(opt)


@pytest.mark.parametrize('model_type', ['FTSRModel', 'LDTSRModel', 'CorGradSRModel'])
def test_every_model_type_validates_with_the_val_settings(demo_data, model_type):
    """What BasicSR's validation calls per image (``test()``) cuts as ``val:`` says, with the network
    the model validates (LDT: the composite), and leaves a training network in training mode."""
    model = _model(demo_data, model_type, {'tile_mode': 'official'})
    lq = torch.rand(1, 3, 210, 45, generator=torch.Generator().manual_seed(5))
    model.feed_data({'lq': lq, 'gt': torch.zeros(1, 3, 840, 180)})
    model.test()
    assert model.net_g.training
    network = copy.deepcopy(model.inference_network()).eval()
    assert torch.equal(model.output, official_forward(network, lq, SCALE))
    assert not torch.equal(model.output, network(lq))   # 2 sections along the height: not a whole-image run


def test_a_bad_val_key_stops_training_before_anything_is_written(project, demo_data):
    from conftest import run_entry
    from test_cli import train_options, write
    opt = train_options(demo_data, 'badval')
    opt['val']['tile_overlap'] = -1
    result = run_entry(project, 'Train_pip.py', '-opt', write(project / 'bad.yml', opt), check=False)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].endswith('val.tile_overlap: expected an integer >= 0, got -1')
    assert not (project / 'experiments' / 'badval').exists()


@pytest.mark.parametrize('model_type', ['FTSRModel', 'LDTSRModel'])
def test_each_validation_set_runs_once_per_validation_iteration(project, demo_data, model_type):
    """total_iter a multiple of val_freq: BasicSR's loop validates the last iteration inside the loop
    and again after it. Each set now runs once per iteration (2 and 4), the repeat is one log line,
    and the best-checkpoint selection sees each validation once."""
    import re
    from conftest import run_entry
    from test_cli import dataset, train_options, write
    from test_ldt_model import NETWORK
    opt = train_options(demo_data, 'once', total_iter=4, model_type=model_type, network_g=dict(NETWORK))
    opt['datasets']['val_source'] = dataset(demo_data, 'Test', ['Olympus'])
    opt['val'].update(val_freq=2, save_best=True, best_dataset='Test_Olympus')
    if model_type == 'LDTSRModel':   # profiling at 1 and 2, dual training at 3 and 4
        opt['ldt'] = {'head_warmup_iters': 0, 'profile_iters': 2, 'ema_every': 1}
    run_entry(project, 'Train_pip.py', '-opt', write(project / 'once.yml', opt))
    log = next((project / 'experiments' / 'once').glob('train_once_*.log')).read_text()
    for name in ('Test_Sony_Canon', 'Test_Olympus'):
        assert len(re.findall(rf'Validation {name}\n\t # psnr: ', log)) == 2, log[-3000:]
        assert log.count(f'Validation {name}: iteration 4 was validated already, with no training step since; '
                         'not repeated') == 1
    selections = re.findall(r'(?:New best psnr|Best psnr) on Test_Olympus.*?(?:at )?iteration (\d+)', log)
    assert len(selections) == 2, selections


def _val_loader(demo_data, cameras):
    from basicsr.data import build_dataloader, build_dataset
    from test_cli import dataset
    opt = dict(dataset(demo_data, 'Test', cameras), phase='val', scale=SCALE)
    return build_dataloader(build_dataset(opt), opt, num_gpu=0, dist=False)


@pytest.mark.parametrize('metrics', [True, False], ids=['psnr', 'no-metrics'])
def test_a_validation_set_runs_once_per_iteration_in_process(tmp_path, demo_data, metrics):
    """What BasicSR's loop does when total_iter is a multiple of val_freq (each set at 4 inside the
    loop, then each again after it): the repeat of a set at the same iteration runs no image, logs
    one line, leaves that set's metric results as its run left them (not the other set's) and does
    not reach the best-checkpoint selection; another iteration, or another set, runs.
    In process, so that mutmut sees it: kills the mutants of ``ValidationMixin.validation`` that ran a
    repeated set again, kept another set's metric results, selected a best checkpoint twice or dropped
    the start-of-run line."""
    from conftest import basicsr_log
    val = {'save_best': True, 'best_dataset': 'Test_Sony_Canon'} if metrics else {'metrics': None}
    with basicsr_log() as built:
        model = _model(demo_data, 'FTSRModel', val)
    assert 'Validation inference: whole images, fp32' in built   # how it validates, said once at the start
    model.opt['path']['models'] = str(tmp_path)   # where net_g_best.pth goes
    best, other = _val_loader(demo_data, ['Sony', 'Canon']), _val_loader(demo_data, ['Olympus'])
    runs = []
    test = model.test
    model.test = lambda: (runs.append(model.lq.shape), test())
    with basicsr_log() as lines:
        model.validation(best, 4, None)
        first = dict(getattr(model, 'metric_results', {}))
        model.validation(other, 4, None)
        assert len(runs) == 6   # two images per camera
        model.validation(best, 4, None)
        assert len(runs) == 6
        assert getattr(model, 'metric_results', {}) == first
        model.validation(other, 4, None)
        assert len(runs) == 6
        model.validation(best, 6, None)
        assert len(runs) == 10
    repeats = [line for line in lines if 'validated already' in line]
    assert repeats == [f'Validation {name}: iteration 4 was validated already, with no training step since; '
                       'not repeated' for name in ('Test_Sony_Canon', 'Test_Olympus')]
    if metrics:
        assert set(first) == {'psnr'} and first['psnr'] > 0
        selections = [line for line in lines if 'best psnr on' in line.lower()]   # at 4, then at 6 (same weights)
        assert len(selections) == 2 and selections[0].startswith('New best psnr on Test_Sony_Canon'), selections
        assert selections[1].startswith('Best psnr on Test_Sony_Canon stays'), selections
    else:
        assert first == {}


# ----------------------------------------------------------------------------- HR crop (item 2)
def _pair(root, stem, lr_size, hr_size):
    rng = np.random.default_rng(0)
    for split, size, suffix in (('test_LR', lr_size, 'x1'), ('test_HR', hr_size, 'x4')):
        (root / split).mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(root / split / f'{stem}_{suffix}.png'), rng.integers(0, 256, (size[1], size[0], 3), np.uint8))


def _dataset(root, phase='val'):
    from basicsr_ldt.data.drealsr_dataset import DRealSRCameraDataset
    extra = {'gt_size': 32} if phase == 'train' else {}
    return DRealSRCameraDataset({'name': 'pairs', 'type': 'DRealSRCameraDataset', 'phase': phase, 'scale': 4,
                                 'dataroot_gt': str(root / 'test_HR'), 'dataroot_lq': str(root / 'test_LR'),
                                 'io_backend': {'type': 'disk'}, **extra})


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_hr_a_few_pixels_larger_is_cropped_like_the_official_code_and_logged_once(tmp_path):
    """DG_validation_dataset.py: hr[0:lr_h * scale, 0:lr_w * scale]; here HR is 3 wider, 1 taller."""
    _pair(tmp_path, 'Canon_10', (20, 15), (83, 61))
    dataset = _dataset(tmp_path)
    hr = cv2.imread(str(tmp_path / 'test_HR' / 'Canon_10_x4.png'))
    expected = torch.from_numpy(np.ascontiguousarray(hr[:60, :80, ::-1]).astype(np.float32).transpose(2, 0, 1) / 255)
    logger, handler = logging.getLogger('basicsr'), _Lines()   # the entry points set it to INFO
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        first, second = dataset[0], dataset[0]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert first['gt'].shape == (3, 60, 80) and torch.equal(first['gt'], expected) and torch.equal(second['gt'], expected)
    lines = [line for line in handler.lines if 'Canon_10' in line]
    assert len(lines) == 1 and 'is 83x61, LR 20x15 x 4 is 80x60: HR cropped' in lines[0]


@pytest.mark.parametrize('hr_size, phase', [((84, 60), 'val'), ((80, 64), 'test'), ((79, 60), 'val'),
                                            ((81, 60), 'train')])
def test_other_size_mismatches_stay_one_line_errors(tmp_path, hr_size, phase):
    """scale or more pixels larger, smaller, or any mismatch in training data: a wrong pair."""
    _pair(tmp_path, 'Canon_10', (20, 15), hr_size)
    with pytest.raises(InputError, match=f"size mismatch for 'Canon_10' in dataset 'pairs': LR 20x15 times scale 4 "
                                         f'is 80x60, HR is {hr_size[0]}x{hr_size[1]}'):
        _dataset(tmp_path, phase)


# ----------------------------------------------------------------------------- memory (item 3)
# Peak resident memory of one validation forward, in a fresh process per measurement: writing 5 to
# /proc/self/clear_refs resets the kernel's high-water mark (VmHWM), so VmHWM - VmRSS afterwards is
# the peak of that call alone, whatever torch's CPU allocator (malloc) does (tracemalloc does not see
# torch's buffers). A fresh process keeps memory freed by an earlier call from hiding a later one.
PEAK_PROBE = '''
import re, sys
import torch
import basicsr_ldt, archs
from basicsr_ldt.models.validation import ValidationMixin, validation_settings
torch.set_num_threads(1)
def kib(key):
    return int(re.search(key + r':\\s+(\\d+)', open('/proc/self/status').read()).group(1)) * 1024
class Model(ValidationMixin):          # the validation step of every model type, without the training part
    def __init__(self, val, size):
        self.opt = {'scale': 4, 'num_gpu': 0, 'val': val}
        self.validation_inference = validation_settings(self.opt)
        torch.manual_seed(0)
        self.net_g = archs.MambaIR(upscale=4, img_size=16, embed_dim=30, depths=[1], d_state=4, mlp_ratio=1,
                                   upsampler='pixelshuffle')
        self.lq = torch.rand(1, 3, size, size)
val = {'tile_mode': sys.argv[1], **({'tile_size': 32, 'tile_overlap': 8} if sys.argv[1] == 'fixed' else {})}
model = Model(val, int(sys.argv[2]))
warm = Model(val, 40)
warm.net_g = model.net_g
warm.test()                             # first-call allocations (thread pools, kernels) out of the way
del warm.output
open('/proc/self/clear_refs', 'w').write('5')
base = kib('VmRSS')
model.test()
print(kib('VmHWM') - base)
'''


def _validation_peak(mode: str, size: int) -> int:
    import subprocess
    import sys
    from conftest import REPO
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES='', OMP_NUM_THREADS='1')
    run = subprocess.run([sys.executable, '-c', PEAK_PROBE, mode, str(size)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return int(run.stdout.split()[-1])


@pytest.mark.skipif(not os.path.exists('/proc/self/clear_refs'), reason='needs Linux /proc/self/clear_refs')
def test_validation_peak_memory_does_not_grow_with_the_image_under_tiling():
    """A small MambaIR validating a 64 and a 192 pixel LR image (9x the pixels) in 32-pixel tiles: the
    peak is a tile's plus the image buffers (LR, output: 7 MB at 192), about 15 MiB at both sizes
    here; the whole 192 image (the control: the measurement sees what the image costs) about 375 MiB."""
    whole = _validation_peak('whole', 192)
    tiled = {size: _validation_peak('fixed', size) for size in (64, 192)}
    mib = {'whole 192': round(whole / 2**20, 1), **{f'tiled {s}': round(v / 2**20, 1) for s, v in tiled.items()}}
    assert whole > 150 * 2**20, mib
    assert tiled[192] - tiled[64] < 0.1 * whole, mib
    assert tiled[192] < 0.15 * whole, mib


def test_val_section_shape_scale_and_device_rules():
    """``val:`` that is not a mapping, and tiles without an integer top-level ``scale``, are one
    whole line each; a run on a GPU (``num_gpu`` not 0, as BasicSR picks the device) may validate in
    fp16, a CPU run (``num_gpu`` absent) may not; a missing or null ``val:`` validates whole images.
    Kills the message and device mutants of ``validation_settings`` (mutation testing, issue 58)."""
    with pytest.raises(InputError) as caught:
        validation_settings({'scale': 4, 'val': 'yes'})
    assert str(caught.value) == "val: expected a mapping of validation options, got 'yes'"
    with pytest.raises(InputError) as caught:
        validation_settings({'num_gpu': 0, 'val': {'tile_mode': 'official'}})
    assert str(caught.value) == ("scale: val.tile_mode 'official' pastes tiles at the network's scale; give the "
                                 "top-level 'scale' (an integer), got None")
    with pytest.raises(InputError, match=r"^scale: val\.tile_mode 'fixed' .* got 4\.0$"):
        validation_settings({'scale': 4.0, 'val': {'tile_mode': 'fixed', 'tile_size': 16, 'tile_overlap': 4}})
    assert validation_settings({'scale': 4, 'num_gpu': 1, 'val': {'precision': 'fp16'}}).dtype == torch.float16
    with pytest.raises(InputError, match='^val.precision: fp16 needs a CUDA device'):
        validation_settings({'scale': 4, 'val': {'precision': 'fp16'}})
    assert validation_settings({'scale': 4, 'val': None}).tile_mode == 'whole'
    assert validation_settings({'val': {'tile_mode': 'whole'}}).tile_mode == 'whole'


@pytest.mark.parametrize('metric, crop_border, left, needs', [('calculate_ssim', 43, 10, 'SSIM needs at least 11'),
                                                             ('calculate_psnr', 48, 0, 'PSNR needs at least 1')])
def test_a_validation_crop_too_large_for_the_images_is_refused_before_the_run(project, demo_data, monkeypatch, capsys,
                                                                              metric, crop_border, left, needs):
    """BasicSR logged NaN at every validation of such a run and exited 0; now it is one line naming the
    metric's key and the image, and no experiment folder is made. One pixel less crop trains and validates."""
    from basicsr_ldt.pipelines.train import train_pipeline
    from test_cli import train_options, write

    def run(name, crop):
        opt = train_options(demo_data, name, total_iter=1)
        opt['val']['metrics'] = {'m': {'type': metric, 'crop_border': crop, 'test_y_channel': True}}
        monkeypatch.setattr('sys.argv', ['Train_pip.py', '-opt', write(project / f'{name}.yml', opt)])
        train_pipeline(str(project))
    with pytest.raises(SystemExit):
        run('crop', crop_border)
    err = capsys.readouterr().err
    assert f"error: val.metrics.m.crop_border: {crop_border} leaves {left} pixels of image '" in err, err
    assert f'(96x96) on its short side, and {needs}\n' in err
    assert not (project / 'experiments' / 'crop').exists()
    run('crop_fits', crop_border - 1)
    assert (project / 'experiments' / 'crop_fits' / 'models' / 'net_g_latest.pth').is_file()
