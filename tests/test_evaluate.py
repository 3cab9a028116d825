"""test.py's numbers are BasicSR's numbers, grouped by camera; tiling does not change them; the
Bicubic row is OpenCV's bicubic of the LR image, measured by the same code as the networks."""
import json
import logging

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from basicsr.metrics.psnr_ssim import calculate_psnr, calculate_ssim
from basicsr.utils import tensor2img

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.inference.tiling import bicubic_upscale, tiled_forward
from basicsr_ldt.pipelines.evaluate import checkpoints_of, evaluate_image, format_table, summarise
from conftest import basicsr_log


class LocalSR(nn.Module):
    """Receptive-field radius 3 (three 3x3 convs) then pixel shuffle x2."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(8, 12, 3, padding=1), nn.PixelShuffle(2))

    def forward(self, x):
        return self.body(x)


def test_tiled_inference_equals_whole_image():
    torch.manual_seed(0)
    net, lq = LocalSR().eval(), torch.rand(1, 3, 37, 29)
    whole = net(lq)
    tiled = tiled_forward(net, lq, scale=2, tile_size=12, tile_overlap=6)
    assert tiled.shape == whole.shape
    assert torch.allclose(tiled, whole, atol=1e-6)
    assert torch.equal(tiled_forward(net, lq, 2, tile_size=0), whole)


def test_metrics_are_basicsr_functions():
    torch.manual_seed(1)
    gt = torch.rand(1, 3, 40, 36)
    sr = (gt + 0.05 * torch.randn_like(gt)).clamp(0, 1)
    values = evaluate_image(sr, gt, crop_border=4, test_y_channel=True)
    a, b = tensor2img(sr), tensor2img(gt)
    assert values['psnr'] == calculate_psnr(a, b, 4, test_y_channel=True)
    assert values['ssim'] == calculate_ssim(a, b, 4, test_y_channel=True)


def test_summary_groups_by_camera_and_averages_cameras():
    rows = [{'camera': 'Sony', 'psnr': 30.0, 'ssim': 0.9}, {'camera': 'Sony', 'psnr': 32.0, 'ssim': 0.7},
            {'camera': 'Canon', 'psnr': 28.0, 'ssim': 0.5}]
    table = summarise(rows)
    assert list(table) == ['Canon', 'Sony', 'Mean']
    assert table['Sony'] == {'psnr': 31.0, 'ssim': 0.8, 'images': 2}
    assert table['Mean']['psnr'] == 29.5 and abs(table['Mean']['ssim'] - 0.65) < 1e-12
    markdown = format_table({'FT': table, 'LDT': table}, markdown=True).splitlines()
    assert markdown[0] == '| Camera | Images | FT PSNR | FT SSIM | LDT PSNR | LDT SSIM |'
    assert markdown[3] == '| Sony | 2 | 31.00 | 0.8000 | 31.00 | 0.8000 |'


def keys_bicubic(image: np.ndarray, scale: int, a: float = -0.75) -> np.ndarray:
    """Reference in float64: Keys' cubic convolution kernel, output pixel i sampling the input at
    (i + 0.5) / scale - 0.5, indices outside the image clamped to its border (OpenCV's convention)."""
    def weights(n: int) -> np.ndarray:
        matrix = np.zeros((n * scale, n))
        for i in range(n * scale):
            src = (i + 0.5) / scale - 0.5
            base = np.floor(src)
            for k in range(-1, 3):
                x = abs(src - (base + k))
                w = (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1 if x <= 1 else a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a
                matrix[i, min(max(int(base) + k, 0), n - 1)] += w
        return matrix
    h, w = image.shape[:2]
    return np.einsum('ij,jkc,lk->ilc', weights(h), image.astype(np.float64), weights(w))


def test_bicubic_is_keys_cubic_convolution_of_the_lr_and_is_not_clipped():
    rng = np.random.default_rng(0)
    lq = np.zeros((2, 3, 7, 9), np.float32)
    lq[0] = rng.random((3, 7, 9))
    lq[1, :, :, 5:] = 1.0                      # a step edge: the cubic overshoots above 1 and below 0
    sr = bicubic_upscale(torch.from_numpy(lq), 4)
    assert sr.shape == (2, 3, 28, 36) and sr.dtype == torch.float32
    for i in range(2):
        reference = keys_bicubic(lq[i].transpose(1, 2, 0), 4).transpose(2, 0, 1)
        assert np.abs(sr[i].numpy() - reference).max() < 1e-5
    assert sr[1].max() > 1.01 and sr[1].min() < -0.01  # clipping is left to tensor2img, as for networks


def test_bicubic_checkpoint_entry():
    entries = checkpoints_of({'checkpoints': [{'label': 'Bicubic', 'bicubic': True}, {'label': 'FT', 'path': 'ft.pth'}]})
    assert entries[0] == {'label': 'Bicubic', 'bicubic': True}   # a second Bicubic entry: refused, the same column
    assert entries[1] == {'label': 'FT', 'path': 'ft.pth', 'bicubic': False, 'param_key': 'params', 'exact_key': False}
    assert checkpoints_of({'checkpoints': [{'bicubic': True}]})[0]['label'] == 'Bicubic'
    with pytest.raises(InputError, match=r"checkpoints\[0\]: an entry with 'bicubic: true' .* takes no path"):
        checkpoints_of({'checkpoints': [{'bicubic': True, 'path': 'x.pth'}]})
    with pytest.raises(InputError, match=r"checkpoints\[0\].bicubic: expected true or false, got 'yes'"):
        checkpoints_of({'checkpoints': [{'label': 'B', 'bicubic': 'yes'}]})
    with pytest.raises(InputError, match=r'checkpoints\[0\] has no path'):
        checkpoints_of({'checkpoints': [{'label': 'B', 'bicubic': False}]})


@pytest.fixture
def fresh_test_log(monkeypatch):
    """BasicSR's logger as a fresh test.py process finds it: without the log file of an earlier
    in-process run (test_logger adds a file only where there is none); files added are closed after."""
    import logging
    logger = logging.getLogger('basicsr')
    monkeypatch.setattr(logger, 'handlers', [h for h in logger.handlers if not isinstance(h, logging.FileHandler)])
    yield logger
    for handler in logger.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.close()


def _test_py(monkeypatch, folder, name, data, test_section):
    """Run test.py's pipeline in-process on the demo's Sony test pairs with the Bicubic entry; the
    per-image PSNR/SSIM it reports (metrics.json), in dataset order."""
    from basicsr_ldt.pipelines.evaluate import test_pipeline
    from test_cli import dataset
    opt = {'name': name, 'scale': 4, 'num_gpu': 0, 'datasets': {'test_1': dataset(data, 'Test', ['Sony'])},
           'path': {}, 'checkpoints': [{'bicubic': True}], 'test': test_section}
    yml = folder / f'{name}.yml'
    yml.write_text(yaml.safe_dump(opt))
    monkeypatch.setattr('sys.argv', ['test.py', '-opt', str(yml)])
    test_pipeline(str(folder))
    return json.loads((folder / 'results' / name / 'metrics.json').read_text())['images']['Bicubic']


def test_explicit_crop_border_zero_is_honoured(tmp_path, monkeypatch, demo_data):
    """``test: {crop_border: 0}`` measures the whole image; only an absent crop_border means the scale."""
    from basicsr_ldt.data.drealsr_dataset import DRealSRCameraDataset
    from test_cli import dataset
    whole = _test_py(monkeypatch, tmp_path, 'whole', demo_data, {'crop_border': 0})
    default = _test_py(monkeypatch, tmp_path, 'default', demo_data, {})
    items = DRealSRCameraDataset(dataset(demo_data, 'Test', ['Sony']))
    assert len(whole) == len(default) == len(items) == 2
    for k in range(len(items)):
        item = items[k]
        sr = tensor2img(bicubic_upscale(item['lq'].unsqueeze(0), 4))
        gt = tensor2img(item['gt'].unsqueeze(0))
        assert whole[k]['psnr'] == pytest.approx(calculate_psnr(sr, gt, 0, test_y_channel=True), abs=1e-9)
        assert whole[k]['ssim'] == pytest.approx(calculate_ssim(sr, gt, 0, test_y_channel=True), abs=1e-9)
        assert default[k]['psnr'] == pytest.approx(calculate_psnr(sr, gt, 4, test_y_channel=True), abs=1e-9)
        assert whole[k]['psnr'] != pytest.approx(default[k]['psnr'], abs=1e-3)


def test_checkpoint_without_param_key_evaluates_the_weights_path_param_key_g_names(tmp_path, monkeypatch, demo_data):
    """test.py with ``path: {param_key_g: params_ema}`` and a ``checkpoints:`` entry that names no
    ``param_key``: the user relies on the table row being the ``params_ema`` network's numbers (an
    entry's own ``param_key`` still wins). The file holds two different networks; each row is checked
    per image against PSNR/SSIM computed here from the network loaded with the expected weights.
    Kills the slip that ignores ``path.param_key_g`` for listed entries (the row then measures
    ``params`` under the label the user gave the EMA weights)."""
    from basicsr.archs import build_network
    from basicsr_ldt.data.drealsr_dataset import DRealSRCameraDataset
    from basicsr_ldt.pipelines.evaluate import test_pipeline
    from test_cli import NETWORK, dataset
    torch.manual_seed(0)
    raw = build_network(dict(NETWORK)).state_dict()
    ema = {k: v + 0.05 * torch.randn_like(v) for k, v in raw.items()}   # another network, measurably so
    torch.save({'params': raw, 'params_ema': ema}, tmp_path / 'both.pth')
    test_set = dataset(demo_data, 'Test', ['Sony'])
    opt = {'name': 'keys', 'scale': 4, 'num_gpu': 0, 'network_g': NETWORK, 'datasets': {'test_1': test_set},
           'path': {'param_key_g': 'params_ema'}, 'test': {'tile_size': 0},
           'checkpoints': [{'label': 'EMA', 'path': str(tmp_path / 'both.pth')},
                           {'label': 'raw', 'path': str(tmp_path / 'both.pth'), 'param_key': 'params'}]}
    yml = tmp_path / 'keys.yml'
    yml.write_text(yaml.safe_dump(opt))
    monkeypatch.setattr('sys.argv', ['test.py', '-opt', str(yml)])
    test_pipeline(str(tmp_path))
    images = json.loads((tmp_path / 'results' / 'keys' / 'metrics.json').read_text())['images']
    items = DRealSRCameraDataset(test_set)
    for label, weights in (('EMA', ema), ('raw', raw)):
        network = build_network(dict(NETWORK))
        network.load_state_dict(weights)
        network.eval()
        assert len(images[label]) == len(items) == 2
        for k in range(len(items)):
            with torch.no_grad():
                sr = tensor2img(network(items[k]['lq'].unsqueeze(0)))
            gt = tensor2img(items[k]['gt'].unsqueeze(0))
            assert images[label][k]['psnr'] == pytest.approx(calculate_psnr(sr, gt, 4, test_y_channel=True), abs=1e-9)
            assert images[label][k]['ssim'] == pytest.approx(calculate_ssim(sr, gt, 4, test_y_channel=True), abs=1e-9)
    assert all(abs(a['psnr'] - b['psnr']) > 1e-3 for a, b in zip(images['EMA'], images['raw']))


def test_test_py_in_process_writes_every_table_image_and_log_line_for_each_kind_of_entry(tmp_path, monkeypatch,
                                                                                        demo_data, capsys,
                                                                                        fresh_test_log):
    """One test.py run over two cameras with a network entry, the Bicubic row and a WiSE-FT entry,
    ``save_img: true`` and comparison grids: what a user reads afterwards (each file holds the other
    weights under the key an entry does not name). Every row of metrics.json is PSNR/SSIM computed
    here from the network (or interpolation, or bicubic) the entry names; the per-camera and Mean
    rows are those images' means (cameras weigh the same); metrics.csv and metrics.md carry the same
    numbers; the saved SR images are the measured ones, under visualization/<label>/<camera>/; the
    log file holds the table. Kills the mutants of test_pipeline, write_results, _wise_ft_entry and
    test_logger that the single-entry runs above pass (mutation testing, issue 58)."""
    import csv
    import re
    import cv2
    from basicsr.archs import build_network
    from basicsr_ldt.data.drealsr_dataset import DRealSRCameraDataset
    from basicsr_ldt.pipelines.evaluate import test_pipeline
    from test_cli import NETWORK, dataset
    torch.manual_seed(3)
    start = build_network(dict(NETWORK)).state_dict()
    tuned = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v for k, v in start.items()}
    decoy = {k: v + 0.1 for k, v in start.items()}          # under the key each entry does not name
    torch.save({'params': start, 'params_ema': decoy}, tmp_path / 'start.pth')
    torch.save({'params': tuned, 'params_ema': decoy}, tmp_path / 'tuned.pth')
    alpha = 0.25
    test_set = dataset(demo_data, 'Test', ['Sony', 'Olympus'])
    opt = {'name': 'three', 'scale': 4, 'num_gpu': 0, 'network_g': NETWORK, 'datasets': {'test_1': test_set},
           'path': {}, 'test': {'tile_size': 0, 'save_img': True, 'compare': {'crops': 1, 'size': 8}},
           'checkpoints': [{'label': 'tuned', 'path': str(tmp_path / 'tuned.pth')},
                           {'bicubic': True},
                           {'label': 'wise', 'path': str(tmp_path / 'tuned.pth'), 'param_key': 'params',
                            'wise_ft': {'start': str(tmp_path / 'start.pth'), 'alpha': alpha}}]}
    yml = tmp_path / 'three.yml'
    yml.write_text(yaml.safe_dump(opt))
    monkeypatch.setattr('sys.argv', ['test.py', '-opt', str(yml)])
    returned = test_pipeline(str(tmp_path))
    folder = tmp_path / 'results' / 'three'
    saved = json.loads((folder / 'metrics.json').read_text())
    assert list(saved['summary']) == ['tuned', 'Bicubic', 'wise'] == list(returned)

    def network_with(weights):
        network = build_network(dict(NETWORK))
        network.load_state_dict(weights)
        return network.eval()

    mixed = {k: (1 - alpha) * start[k] + alpha * tuned[k] if start[k].is_floating_point() else tuned[k] for k in start}
    runs = {'tuned': network_with(tuned), 'Bicubic': lambda lq: bicubic_upscale(lq, 4), 'wise': network_with(mixed)}
    items = DRealSRCameraDataset(test_set)
    assert len(items) == 4 and {items[k]['camera'] for k in range(4)} == {'Sony', 'Olympus'}
    for label, run in runs.items():
        rows = saved['images'][label]
        assert [(r['camera'], r['image']) for r in rows] == [
            (items[k]['camera'], items[k]['lq_path'].rsplit('/', 1)[1].rsplit('.', 1)[0]) for k in range(4)]
        for k, row in enumerate(rows):
            with torch.no_grad():
                sr = tensor2img(run(items[k]['lq'].unsqueeze(0)))
            gt = tensor2img(items[k]['gt'].unsqueeze(0))
            assert row['psnr'] == pytest.approx(calculate_psnr(sr, gt, 4, test_y_channel=True), abs=1e-9)
            assert row['ssim'] == pytest.approx(calculate_ssim(sr, gt, 4, test_y_channel=True), abs=1e-9)
            png = folder / 'visualization' / label / row['camera'] / f"{row['image']}.png"
            assert np.array_equal(cv2.imread(str(png), cv2.IMREAD_UNCHANGED), sr), png
        table = saved['summary'][label]
        assert list(table) == ['Olympus', 'Sony', 'Mean']
        for camera in ('Olympus', 'Sony'):
            mine = [r for r in rows if r['camera'] == camera]
            assert table[camera]['images'] == len(mine) == 2
            for m in ('psnr', 'ssim'):
                assert table[camera][m] == pytest.approx(sum(r[m] for r in mine) / 2, abs=1e-12)
        assert table['Mean']['images'] == 4
        for m in ('psnr', 'ssim'):
            assert table['Mean'][m] == pytest.approx((table['Olympus'][m] + table['Sony'][m]) / 2, abs=1e-12)
    with open(folder / 'metrics.csv', newline='') as handle:
        csv_rows = list(csv.reader(handle))
    assert csv_rows[0] == ['checkpoint', 'camera', 'images', 'psnr', 'ssim'] and len(csv_rows) == 1 + 3 * 3
    for label, camera, images, psnr, ssim in csv_rows[1:]:
        values = saved['summary'][label][camera]
        assert (int(images), psnr, ssim) == (values['images'], f"{values['psnr']:.4f}", f"{values['ssim']:.6f}")
    markdown = (folder / 'metrics.md').read_text()
    caption = 'PSNR (dB) / SSIM on the Y channel, crop_border 4; whole images, fp32'
    assert markdown == format_table(saved['summary'], markdown=True) + f'\n\n{caption}\n'
    assert saved['measured'] == {'channel': 'Y', 'crop_border': 4, 'inference': 'whole images, fp32'}
    assert markdown.splitlines()[0].startswith('| Camera | Images | tuned PSNR | tuned SSIM | Bicubic PSNR')
    grids = sorted(path.name for path in (folder / 'compare').iterdir())
    assert len(grids) == 4 and all(any(g.endswith(f"{r['image']}.png") for g in grids) for r in saved['images']['tuned'])
    logs = list((folder).glob('test_three_*.log'))
    assert len(logs) == 1
    log = logs[0].read_text()
    assert format_table(saved['summary'], markdown=False) in log and 'Results written to' in log
    assert re.match(r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO: ', log), log[:80]
    console = capsys.readouterr()
    assert format_table(saved['summary'], markdown=False) + f'\n{caption}\n' in console.out   # printed too
    assert format_table(saved['summary'], markdown=False) not in console.err   # once: the logger writes it to the file


@pytest.mark.parametrize('wise_ft, message', [
    ({'start': 's.pth'}, 'checkpoints[1].wise_ft.alpha: required (WiSE-FT tests (1 - alpha) start + alpha <path>)'),
    ({'start': 's.pth', 'alpha': 2}, 'checkpoints[1].wise_ft.alpha: expected a number in [0, 1], got 2'),
    ({'start': 's.pth', 'alpha': 0.5, 'beta': 1},
     "unknown option 'beta' in checkpoints[1].wise_ft; valid keys: alpha, start, start_param_key"),
    ('s.pth', "checkpoints[1].wise_ft: expected a mapping {start, alpha[, start_param_key]}, got 's.pth'"),
])
def test_a_bad_wise_ft_block_is_one_line_naming_its_entry(wise_ft, message):
    """test.py's ``wise_ft:`` of the second entry, checked before any weights are read: the line
    names ``checkpoints[1]`` and what was expected; a good block keeps its ``start_param_key``
    (default ``path.param_key_g``, else ``params``). Kills the message and key mutants of ``_wise_ft_entry`` (issue 58)."""
    with pytest.raises(InputError) as err:
        checkpoints_of({'checkpoints': [{'label': 'A', 'path': 'a.pth'}, {'path': 'r.pth', 'wise_ft': wise_ft}]})
    assert str(err.value) == message
    entries = checkpoints_of({'checkpoints': [
        {'path': 'r.pth', 'wise_ft': {'start': 's.pth', 'alpha': 1, 'start_param_key': 'params_ema'}},
        {'path': 'q.pth', 'wise_ft': {'start': 's.pth', 'alpha': 0}}]})
    assert [e['wise_ft'] for e in entries] == [
        {'start': 's.pth', 'alpha': 1.0, 'start_param_key': 'params_ema', 'start_exact': True},
        {'start': 's.pth', 'alpha': 0.0, 'start_param_key': 'params', 'start_exact': False}]
    ema_default = checkpoints_of({'path': {'param_key_g': 'params_ema'},
                                  'checkpoints': [{'path': 'q.pth', 'wise_ft': {'start': 's.pth', 'alpha': 0}}]})
    assert ema_default[0]['wise_ft']['start_param_key'] == 'params_ema'   # the file's key, falling back


def test_the_test_log_gets_one_file_handler_however_often_it_is_asked(tmp_path, fresh_test_log):
    """Asking for test.py's logger twice (or after an earlier file) must not write every line twice."""
    import logging
    from basicsr_ldt.pipelines.evaluate import test_logger
    test_logger(str(tmp_path / 'a.log'))
    test_logger(str(tmp_path / 'a.log'))
    files = [h for h in fresh_test_log.handlers if isinstance(h, logging.FileHandler)]
    assert len(files) == 1 and fresh_test_log.level == logging.INFO


def test_strict_load_g_decides_whether_a_partial_checkpoint_is_tested(tmp_path, monkeypatch, demo_data, capsys):
    """A checkpoint missing some of the network's weights is refused in one line by default and
    tested when ``path.strict_load_g: false`` (BasicSR's key); a WiSE-FT start that does not fit
    names its entry. Kills the mutants of test_pipeline that drop or default strict_load_g or the
    entry's name in the WiSE-FT message (issue 58)."""
    from basicsr.archs import build_network
    from basicsr_ldt.pipelines.evaluate import test_pipeline
    from test_cli import NETWORK, dataset
    full = build_network(dict(NETWORK)).state_dict()
    torch.save({'params': {k: v for k, v in full.items() if not k.startswith('conv_last')}}, tmp_path / 'part.pth')
    torch.save({'params': full}, tmp_path / 'full.pth')

    def run(name, path, checkpoints, **test):
        opt = {'name': name, 'scale': 4, 'num_gpu': 0, 'network_g': NETWORK, 'path': path,
               'test': {'tile_size': 0, **test},
               'datasets': {'test_1': dataset(demo_data, 'Test', ['Sony'])}, 'checkpoints': checkpoints}
        yml = tmp_path / f'{name}.yml'
        yml.write_text(yaml.safe_dump(opt))
        monkeypatch.setattr('sys.argv', ['test.py', '-opt', str(yml)])
        return test_pipeline(str(tmp_path))

    part = {'label': 'part', 'path': str(tmp_path / 'part.pth')}
    with pytest.raises(SystemExit):
        run('strict', {}, [part])
    assert "does not fit network MSRResNet: keys 2 missing (e.g. conv_last.bias, conv_last.weight)" in capsys.readouterr().err
    assert not (tmp_path / 'results' / 'strict').exists()
    with basicsr_log() as lines:   # the log says which weights were not loaded
        assert list(run('loose', {'strict_load_g': False}, [part])) == ['part']
    assert any(line.startswith(f"part: {tmp_path / 'part.pth'} loaded with strict_load_g false; 2 of its 14 tensors "
                               'are not in the file') for line in lines), lines
    full = {'label': 'full', 'path': str(tmp_path / 'full.pth')}
    with pytest.raises(SystemExit):   # a crop that leaves SSIM no window: NaN in every cell, exit 0
        run('crop', {}, [full], crop_border=43)
    assert "error: test.crop_border: 43 leaves 10 pixels of image '" in capsys.readouterr().err
    assert not (tmp_path / 'results' / 'crop').exists()
    assert list(run('crop_fits', {}, [full], crop_border=42)) == ['full']
    with pytest.raises(SystemExit):
        run('wise', {}, [{'label': 'w', 'path': str(tmp_path / 'full.pth'),
                          'wise_ft': {'start': str(tmp_path / 'part.pth'), 'alpha': 0.5}}])
    assert "checkpoints[0].wise_ft.start '" in capsys.readouterr().err
    # A param_key written in the entry is exact (a row labelled EMA showed the file's params); BasicSR's
    # path.param_key_g falls back as BasicSR does (the option files name params_ema for releases without it).
    for name, path, entry in (('named', {}, {'param_key': 'params_ema'}),
                              ('named_start', {}, {'wise_ft': {'start': str(tmp_path / 'full.pth'), 'alpha': 0.5,
                                                               'start_param_key': 'params_ema'}})):
        with pytest.raises(SystemExit):
            run(name, path, [{'label': 'e', 'path': str(tmp_path / 'full.pth'), **entry}])
        assert "full.pth' has no 'params_ema' weights (top-level keys: ['params'])" in capsys.readouterr().err
    assert list(run('file_key', {'param_key_g': 'params_ema'}, [{'label': 'e', 'path': str(tmp_path / 'full.pth'),
                                                                 'wise_ft': {'start': str(tmp_path / 'full.pth'),
                                                                             'alpha': 0.5}}])) == ['e']
    basicsr = logging.getLogger('basicsr')   # one test per process in test.py: this run gets its own log file
    for handler in [h for h in basicsr.handlers if isinstance(h, logging.FileHandler)]:
        basicsr.removeHandler(handler)
        handler.close()
    with basicsr_log() as lines:   # the fallback's console warning came before the test log began: the log says it too
        assert list(run('fallback', {'param_key_g': 'params_ema'}, [full])) == ['full']
    assert [line for line in lines if 'weights: load' in line] == [     # once, not again when the log begins
        f"checkpoint '{tmp_path / 'full.pth'}' has no 'params_ema' weights: loading 'params'"]
    log = next((tmp_path / 'results' / 'fallback').glob('test_fallback_*.log')).read_text()
    assert f"WARNING: full: {tmp_path / 'full.pth'} has no 'params_ema' weights: loaded 'params'\n" in log


def test_the_printed_table_and_the_markdown_copy_are_exactly_laid_out():
    """The console table right-aligns numbers under left-aligned camera names, two spaces apart; the
    Markdown copy has its separator row (mutation testing of ``format_table``, issue 58)."""
    from collections import OrderedDict
    table = OrderedDict([('Sony', {'psnr': 31.0, 'ssim': 0.8, 'images': 2}),
                         ('Mean', {'psnr': 29.5, 'ssim': 0.65, 'images': 3})])
    assert format_table({'FT': table, 'LDT-long': table}, markdown=False) == (
        'Camera  Images  FT PSNR  FT SSIM  LDT-long PSNR  LDT-long SSIM\n'
        'Sony         2    31.00   0.8000          31.00         0.8000\n'
        'Mean         3    29.50   0.6500          29.50         0.6500')
    assert format_table({'FT': table}, markdown=True) == ('| Camera | Images | FT PSNR | FT SSIM |\n|---|---|---|---|\n'
                                                          '| Sony | 2 | 31.00 | 0.8000 |\n| Mean | 3 | 29.50 | 0.6500 |')


@pytest.mark.parametrize('opt, message', [
    ({}, "give the weights to test as 'path: pretrain_network_g' or a 'checkpoints' list"),
    ({'path': {'pretrain_network_g': 'b.pth'}, 'checkpoints': [{'path': 'a.pth'}]},    # b.pth was never tested
     "path.pretrain_network_g and 'checkpoints' both name weights to test, and only the checkpoints list would be "
     "tested; make the file an entry of 'checkpoints', or remove one of the two"),
    ({'checkpoints': 'x.pth'}, "'checkpoints' must be a non-empty list of {label, path[, param_key]} entries"),
    ({'checkpoints': []}, "'checkpoints' must be a non-empty list of {label, path[, param_key]} entries"),
    ({'checkpoints': [{'path': 'a.pth', 'lable': 'x'}]},
     "unknown option 'lable' in checkpoints[0] (did you mean 'label'?); valid keys: bicubic, label, param_key, path"),
    ({'checkpoints': [{'path': 'a/x.pth'}, {'path': 'b/x.pth'}]}, "checkpoint labels must be unique, got ['x', 'x']"),
    ({'checkpoints': [{'path': 'ft.pth', 'label': 'FT'}, {'path': 'ft.pth', 'label': 'LDT'}]},   # LDT's column was FT's
     "checkpoints[1] ('LDT') tests the same weights as checkpoints[0] ('FT'): its column would repeat that one; remove "
     'one, or correct its path, param_key or wise_ft'),
    ({'checkpoints': [{'path': 'ft.pth', 'label': 'FT'}, {'path': './ft.pth', 'label': 'LDT'}]},   # audit 6: one file
     "checkpoints[1] ('LDT') tests the same weights as checkpoints[0] ('FT'): its column would repeat that one; remove "
     'one, or correct its path, param_key or wise_ft'),
    ({'checkpoints': [{'bicubic': True}, {'bicubic': True, 'label': 'Bicubic 2'}]},
     "checkpoints[1] ('Bicubic 2') tests the same weights as checkpoints[0] ('Bicubic'): its column would repeat that "
     'one; remove one, or correct its path, param_key or wise_ft'),
    ({'checkpoints': [{'path': 'a.pth', 'label': '../../escape'}]},   # save_img wrote outside results/
     "checkpoints[0].label: '../../escape' also names the folder of its images; expected no '/' and not only dots"),
    ({'checkpoints': [{'path': 'a.pth'}, {'bicubic': True, 'label': '..'}]},
     "checkpoints[1].label: '..' also names the folder of its images; expected no '/' and not only dots"),
])
def test_bad_checkpoint_lists_are_one_whole_line(opt, message):
    with pytest.raises(InputError) as err:
        checkpoints_of(opt)
    assert str(err.value) == message


def test_one_file_under_two_labels_passes_when_they_test_different_weights():
    """Another param_key or WiSE-FT alpha of one file are other weights: two columns, as meant."""
    entries = checkpoints_of({'checkpoints': [
        {'path': 'ft.pth', 'label': 'A'}, {'path': 'ft.pth', 'label': 'B', 'param_key': 'params_ema'},
        {'path': 'ft.pth', 'label': 'C', 'wise_ft': {'start': 's.pth', 'alpha': 0.5}},
        {'path': 'ft.pth', 'label': 'D', 'wise_ft': {'start': 's.pth', 'alpha': 0.7}}]})
    assert [e['label'] for e in entries] == ['A', 'B', 'C', 'D']


def test_test_section_keys_datasets_and_crop_border_default_are_checked_before_anything_runs(demo_data):
    """``_build`` (test.py before any weights are read): an unknown ``test:`` key, a file without
    datasets, an unknown dataset or network type are whole lines naming the key; ``crop_border``
    defaults to the file's ``scale`` (4 without one)."""
    from basicsr_ldt.pipelines.evaluate import _build
    from test_cli import NETWORK, dataset
    cpu = torch.device('cpu')
    base = {'scale': 2, 'network_g': {**NETWORK, 'upscale': 2}, 'checkpoints': [{'path': 'a.pth'}],
            'datasets': {'test_1': dataset(demo_data, 'Test', ['Sony'])}}
    assert _build(base, cpu)[0]['crop_border'] == 2
    assert _build({**{k: v for k, v in base.items() if k != 'scale'}, 'network_g': NETWORK}, cpu)[0]['crop_border'] == 4
    for change, message in (
            ({'test': {'tile_sise': 8}}, "unknown option 'tile_sise' in test (did you mean 'tile_size'?)"),
            ({'path': {'strict_load_g': 'false'}}, "path.strict_load_g: expected true or false, got 'false'"),
            ({'datasets': {}}, "the option file has no 'datasets' section to test on"),
            ({'datasets': {'test_1': {**base['datasets']['test_1'], 'type': 'DRealSRDataset'}}},
             "datasets.test_1.type 'DRealSRDataset' is not registered (known: DRealSRCameraDataset,"),
            ({'network_g': {'type': 'MSRResnet'}}, "network_g.type 'MSRResnet' is not registered (known: "),
            ({'datasets': {**base['datasets'], 'test_2': dataset(demo_data, 'Train', ['Canon', 'Sony'])}},
             "camera 'Sony' is in datasets.test_1 and datasets.test_2; the table has one row per camera, so give each "
             'camera in one section only')):   # their images were pooled in one row
        with pytest.raises(InputError) as err:
            _build({**base, **change}, cpu)
        assert str(err.value).startswith(message), str(err.value)


def test_a_metric_crop_leaves_at_least_what_the_metric_needs():
    """SSIM needs its 11-pixel window after the crop (exactly 11 is enough), any other metric one pixel;
    the message names the metric."""
    from basicsr_ldt.common.metric_crop import check_crop_border
    check_crop_border('k', 42, 'calculate_ssim', 'a', 95, 200)          # 11 left
    with pytest.raises(InputError, match=r"^k: 42 leaves 10 pixels of image 'a' \(94x200\) on its short side, and "
                                         r'SSIM needs at least 11$'):
        check_crop_border('k', 42, 'calculate_ssim', 'a', 94, 200)
    check_crop_border('k', 47, 'calculate_psnr', 'a', 200, 95)          # 1 left
    with pytest.raises(InputError, match=r'and PSNR needs at least 1$'):
        check_crop_border('k', 47, 'calculate_psnr', 'a', 200, 94)
    with pytest.raises(InputError, match=r'and calculate_niqe needs at least 1$'):
        check_crop_border('k', 47, 'calculate_niqe', 'a', 200, 94)


def test_the_tables_say_how_they_were_measured():
    """RGB without a crop read about 1.7 dB below the default Y channel with crop 4 under the same "PSNR"
    header: the files now carry the channel, the crop and the inference."""
    from basicsr_ldt.inference.settings import inference_settings
    from basicsr_ldt.pipelines.evaluate import measured_as, measurement_line
    test_opt = {'test_y_channel': False, 'crop_border': 0,
                'inference': inference_settings('test', {'tile_size': 64, 'tile_overlap': 8}, 'cpu')}
    assert measured_as(test_opt) == {'channel': 'RGB', 'crop_border': 0,
                                     'inference': '64-pixel tiles overlapping by 8, fp32'}
    assert measurement_line(measured_as(test_opt)) == ('PSNR (dB) / SSIM on RGB, crop_border 0; '
                                                       '64-pixel tiles overlapping by 8, fp32')
