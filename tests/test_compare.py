"""Comparison grids from test.py (test: compare:) and where their zoomed crops land."""
import json

import cv2
import numpy as np
import torch

from basicsr.archs import build_network
from basicsr.metrics.psnr_ssim import calculate_psnr
from basicsr_ldt.inference.compare import comparison_grid, crop_boxes, disagreement, grid_name
from conftest import run_entry
from test_cli import dataset, write
from test_evaluate import keys_bicubic

TINY = {'type': 'SAFMN', 'dim': 8, 'n_blocks': 1, 'ffn_scale': 2.0, 'upscaling_factor': 4}


def test_crops_go_where_the_methods_disagree():
    hr = np.full((64, 80, 3), 100, np.uint8)
    a, b = hr.copy(), hr.copy()
    b[40:52, 10:22] = 200   # the methods differ here only
    a[5:9, 60:64] = 180      # and, less, here
    boxes = crop_boxes(disagreement([a, b], hr), size=12, count=2)
    assert boxes[0] == (40, 10)
    assert 60 - 12 < boxes[1][1] <= 60 and 5 - 12 < boxes[1][0] <= 5
    # One method: the crop goes where it is furthest from the HR image.
    assert crop_boxes(disagreement([b], hr), size=12, count=1) == [(40, 10)]
    panels = {'LR (bicubic)': hr, 'A': a, 'B': b, 'HR': hr}
    grid = comparison_grid(panels, {'LR (bicubic)': 20.0, 'A': 30.0, 'B': 25.0}, boxes, 12)
    # 4 panels 192 wide (80 px x 2.4) and 4 px apart; label 22 + image 154 high, two 192-pixel crop rows.
    assert grid.dtype == np.uint8 and grid.shape == (22 + 154 + 2 * (6 + 192), 4 * 192 + 3 * 4, 3)


def test_grid_names_put_the_camera_first_once():
    assert grid_name('Canon', 'Canon_10_x1') == 'Canon_10_x1.png'
    assert grid_name('DSC', 'DSC_1265_x1') == 'DSC_1265_x1.png'
    assert grid_name('IMG', 'IMG0031_x1') == 'IMG0031_x1.png'
    assert grid_name('Sony', 'sony_116_x1') == 'sony_116_x1.png'   # DRealSR's lower-case prefix
    # DRealSR's Olympus files (P1140279) and Panasonic files (panasonic_158) get the camera first.
    assert grid_name('Olympus', 'P1140279_x1') == 'Olympus_P1140279_x1.png'
    assert grid_name('Pan', 'panasonic_158_x1') == 'Pan_panasonic_158_x1.png'
    # A stem that only begins with the camera's letters is another word: prefixed.
    assert grid_name('Pan', 'Panorama_3_x4') == 'Pan_Panorama_3_x4.png'
    assert grid_name('Sony', 'a7_0001_x4') == 'Sony_a7_0001_x4.png'


def test_test_py_writes_one_grid_per_image(project, demo_data, tmp_path):
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        network = build_network(dict(TINY))
        paths.append(tmp_path / f'net{seed}.pth')
        torch.save({'params': network.state_dict()}, paths[-1])
    first = {'name': 'first', 'scale': 4, 'num_gpu': 0, 'network_g': TINY, 'path': {},
             'datasets': {'test_1': dataset(demo_data, 'Test', ['Sony', 'Canon'])},
             'checkpoints': [{'label': 'Bicubic', 'bicubic': True}, {'label': 'A', 'path': str(paths[0])},
                             {'label': 'B', 'path': str(paths[1])}],
             'test': {'save_img': True, 'compare': {'crops': 2, 'size': 16}}}
    run_entry(project, 'test.py', '-opt', write(project / 'first.yml', first))
    folder = project / 'results' / 'first' / 'compare'
    names = sorted(p.name for p in folder.iterdir())
    # The demo stems already start with the camera (Canon_14_x1, sony_14_x1): no second camera prefix.
    lr_names = sorted(p.name for prefix in ('sony', 'Canon')
                      for p in (demo_data / 'Test_x4' / 'test_LR').glob(f'{prefix}_*_x1.png'))
    assert names == lr_names and len(names) == 4 and names[0].startswith('Canon_') and names[2].startswith('sony_')
    grid = cv2.imread(str(folder / names[0]))
    # Bicubic (always first, not repeated for the Bicubic entry), A, B, HR; two crop rows.
    assert grid.shape == (22 + 192 + 2 * (6 + 192), 4 * 192 + 3 * 4, 3)
    # The Bicubic row: the float LR upscaled (Keys cubic, in the reference), converted to uint8 as a
    # network output (clip, x255, round), BasicSR's PSNR on Y with crop 4.
    bicubic = json.loads((project / 'results' / 'first' / 'metrics.json').read_text())['images']['Bicubic']
    assert len(bicubic) == 4
    for row in bicubic:
        lr = cv2.imread(str(demo_data / 'Test_x4' / 'test_LR' / f"{row['image']}.png")).astype(np.float64) / 255.0
        hr = cv2.imread(str(demo_data / 'Test_x4' / 'test_HR' / f"{row['image'][:-3]}_x4.png"))
        up = np.round(np.clip(keys_bicubic(lr, 4), 0, 1) * 255).astype(np.uint8)
        assert abs(row['psnr'] - calculate_psnr(up, hr, 4, test_y_channel=True)) < 0.01

    # Methods from a checkpoint file and from the saved images of the first run.
    second = dict(first, name='second', checkpoints=[{'label': 'A', 'path': str(paths[0])}],
                  test={'compare': {'crops': 1, 'size': 16, 'methods': {
                      'B': str(paths[1]), 'B saved': str(project / 'results' / 'first' / 'visualization' / 'B')}}})
    run_entry(project, 'test.py', '-opt', write(project / 'second.yml', second))
    grid2 = cv2.imread(str(project / 'results' / 'second' / 'compare' / names[0]))
    assert grid2.shape[1] == grid.shape[1]
    # 'B' (run again) and 'B saved' (read back) are the same pixels, so the panels are identical.
    panel = 192 + 4
    assert np.array_equal(grid2[30:200, panel:2 * panel - 4], grid2[30:200, 2 * panel:3 * panel - 4])

    bad = dict(second, name='bad', test={'compare': {'methods': {'C': str(tmp_path / 'nothing')}}})
    result = run_entry(project, 'test.py', '-opt', write(project / 'bad.yml', bad), check=False)
    assert result.returncode == 2 and 'test.compare.methods.C: expected a checkpoint file or a folder' in result.stderr
    assert not (project / 'results' / 'bad').exists()


def test_what_a_comparison_cannot_show_is_refused_when_it_is_built(demo_data, tmp_path):
    """Checked before test.py makes its folder: a comparison with only the Bicubic baseline (a ValueError
    at the first image), a folder whose saved output has another size than LR x scale (an AssertionError
    after the first image). A checkpoint file in ``methods`` gives the weights ``path.param_key_g`` names,
    as a ``checkpoints`` entry without ``param_key`` does (it always gave ``params``)."""
    import pytest
    from basicsr_ldt.common.errors import InputError
    from basicsr_ldt.data.drealsr_dataset import DRealSRCameraDataset
    from basicsr_ldt.inference.compare import COMPARE_DEFAULTS, Comparison
    datasets = [DRealSRCameraDataset({**dataset(demo_data, 'Test', ['Sony']), 'phase': 'test', 'scale': 4})]
    opt = {'scale': 4, 'network_g': TINY, 'path': {'param_key_g': 'params_ema'}}
    cpu = torch.device('cpu')
    with pytest.raises(InputError, match=r'^test\.compare: no method to compare, as every checkpoint is the Bicubic'):
        Comparison(dict(COMPARE_DEFAULTS), opt, [{'label': 'Bicubic', 'bicubic': True}], datasets, cpu)
    folder = tmp_path / 'saved'
    folder.mkdir()
    for item in datasets[0].items:
        stem = item['lq_path'].rsplit('/', 1)[-1][:-4]
        lq = cv2.imread(item['lq_path'])
        cv2.imwrite(str(folder / f'{stem}.png'), cv2.resize(lq, (lq.shape[1] * 4, lq.shape[0] * 4)))
    Comparison({**COMPARE_DEFAULTS, 'methods': {'S': str(folder)}}, opt, [], datasets, cpu)
    cv2.imwrite(str(folder / f'{stem}.png'), cv2.resize(lq, (lq.shape[1] * 2, lq.shape[0] * 2)))
    with pytest.raises(InputError, match=rf"^test\.compare\.methods\.S: '.*{stem}\.png' is {lq.shape[1] * 2}x"
                                         rf"{lq.shape[0] * 2}, expected {lq.shape[1] * 4}x{lq.shape[0] * 4} \(LR x "):
        Comparison({**COMPARE_DEFAULTS, 'methods': {'S': str(folder)}}, opt, [], datasets, cpu)
    torch.manual_seed(0)
    plain, ema = build_network(dict(TINY)), build_network(dict(TINY))
    torch.save({'params': plain.state_dict(), 'params_ema': ema.state_dict()}, tmp_path / 'both.pth')
    comparison = Comparison({**COMPARE_DEFAULTS, 'methods': {'N': str(tmp_path / 'both.pth')}}, opt, [], datasets, cpu)
    loaded = comparison.sources['N'][1].state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in ema.state_dict().items())
