"""The demo's shipped pretrained start does super-resolution: on the Clean camera's 10 test images
(the ones scripts/demo.sh builds) it beats bicubic upscaling by at least 1.5 dB, and it is the file
whose sha256 is recorded beside it.

The test images are rebuilt here with make_demo_data for the Clean camera alone (test crops depend
only on the seed and the index, and Clean adds no noise, so they are the demo's Clean test images,
under other file stems because fewer train pairs precede them).
"""
import hashlib

import cv2
import numpy as np
import pytest
import torch
import yaml

from basicsr.archs import build_network
from basicsr.metrics.psnr_ssim import calculate_psnr
from conftest import REPO, load_script

CHECKPOINT = REPO / 'pretrained' / 'demo' / 'SAFMN_demo_Clean_x4.pth'
MARGIN_DB = 1.5


@pytest.fixture(scope='module')
def clean_test_pairs(tmp_path_factory, demo_module):
    out = tmp_path_factory.mktemp('clean') / 'DRealSR_demo'
    demo_module.make_demo_data(out, cameras=['Clean'], train_per_camera=1, pretrain_train_per_camera=1)
    hr_dir, lr_dir = out / 'Test_x4' / 'test_HR', out / 'Test_x4' / 'test_LR'
    pairs = [(cv2.imread(str(hr)), cv2.imread(str(lr_dir / hr.name.replace('_x4', '_x1'))))
             for hr in sorted(hr_dir.iterdir())]
    assert len(pairs) == 10 and pairs[0][0].shape == (192, 192, 3)
    return pairs


def test_shipped_checkpoint_is_the_recorded_one():
    recorded = (CHECKPOINT.parent / (CHECKPOINT.name + '.sha256')).read_text().split()
    assert recorded[1] == CHECKPOINT.name
    assert hashlib.sha256(CHECKPOINT.read_bytes()).hexdigest() == recorded[0]
    assert load_script('pretrain_demo').check() == 0


def test_pretrained_start_beats_bicubic_on_the_clean_camera(clean_test_pairs):
    options = yaml.safe_load((REPO / 'options' / 'demo' / 'pretrain_demo.yml').read_text())
    network = build_network(dict(options['network_g'])).eval()
    network.load_state_dict(torch.load(CHECKPOINT, map_location='cpu', weights_only=True)['params'])
    bicubic, pretrained = [], []
    for hr, lr in clean_test_pairs:                       # BGR uint8, as BasicSR's metrics expect
        lr_float = lr.astype(np.float32) / 255.0
        up = cv2.resize(lr_float, (hr.shape[1], hr.shape[0]), interpolation=cv2.INTER_CUBIC)
        with torch.no_grad():
            sr = network(torch.from_numpy(lr_float[..., ::-1].transpose(2, 0, 1).copy())[None])[0]
        sr = sr.numpy().transpose(1, 2, 0)[..., ::-1]
        for values, image in ((bicubic, up), (pretrained, sr)):
            values.append(calculate_psnr(np.round(np.clip(image, 0, 1) * 255).astype(np.uint8), hr, 4,
                                         test_y_channel=True))
    gain = np.mean(pretrained) - np.mean(bicubic)
    assert gain >= MARGIN_DB, f'pretrained {np.mean(pretrained):.2f} dB vs bicubic {np.mean(bicubic):.2f} dB'
