"""The demo's shipped pretrained start does super-resolution on every camera of the family: on the
10 test images of each camera (the ones scripts/demo.sh builds) it beats bicubic upscaling (PSNR,
Y channel, crop 4) -- the premise of the paper's regime the demo study relies on (a classic SR start
trained on clean pairs; docs/results.md, scripts/demo_calibration.py check 1) -- and it is the file
whose sha256 is recorded beside it. The extra Mix start (the second demo study's) is the recorded
file too.

The test images are rebuilt here with make_demo_data (test crops, noise and the Mix pairs'
degradations depend only on the seed, the camera and the index, not on the number of train pairs,
so they are byte for byte the demo's test images). The small MambaIR start (the MambaIR distortion
study's) is held to the same two checks.
"""
import hashlib
import re

import cv2
import numpy as np
import pytest
import torch
import yaml

from basicsr.archs import build_network
from basicsr.metrics.psnr_ssim import calculate_psnr
from conftest import REPO, load_script

CHECKPOINT = REPO / 'pretrained' / 'demo' / 'SAFMN_demo_Clean_x4.pth'
MIX_CHECKPOINT = REPO / 'pretrained' / 'demo' / 'SAFMN_demo_Mix_x4.pth'
MAMBAIR_CHECKPOINT = REPO / 'pretrained' / 'demo' / 'MambaIR_demo_Clean_x4.pth'
MARGIN_DB = 0.0    # scripts/demo_calibration.py START_MARGIN_DB: any gain over bicubic
CAMERAS = ('Clean', 'Olympus', 'Pan', 'Sony', 'DSC', 'IMG', 'Canon')
PREFIXES = {'Clean': 'Clean', 'Olympus': 'P', 'Pan': 'panasonic', 'Sony': 'sony', 'DSC': 'DSC', 'IMG': 'IMG',
            'Canon': 'Canon'}


@pytest.fixture(scope='module')
def test_pairs(tmp_path_factory, demo_module):
    out = tmp_path_factory.mktemp('family') / 'DRealSR_demo'
    demo_module.make_demo_data(out, cameras=list(CAMERAS), train_per_camera=1, pretrain_train_per_camera=1)
    hr_dir, lr_dir = out / 'Test_x4' / 'test_HR', out / 'Test_x4' / 'test_LR'
    pairs = {}
    for camera in CAMERAS:
        hrs = sorted(p for p in hr_dir.iterdir() if re.match(r'[A-Za-z]+', p.name).group(0) == PREFIXES[camera])
        pairs[camera] = [(cv2.imread(str(hr)), cv2.imread(str(lr_dir / hr.name.replace('_x4', '_x1'))))
                         for hr in hrs]
        assert len(pairs[camera]) == 10 and pairs[camera][0][0].shape == (192, 192, 3), camera
    return pairs


@pytest.mark.parametrize('checkpoint, start', [(CHECKPOINT, 'clean'), (MIX_CHECKPOINT, 'mix'),
                                               (MAMBAIR_CHECKPOINT, 'mambair')])
def test_shipped_checkpoint_is_the_recorded_one(checkpoint, start):
    recorded = (checkpoint.parent / (checkpoint.name + '.sha256')).read_text().split()
    assert recorded[1] == checkpoint.name
    assert hashlib.sha256(checkpoint.read_bytes()).hexdigest() == recorded[0]
    script = load_script('pretrain_demo')
    assert script.check(script.STARTS[start]) == 0
    assert script.STARTS[start].checkpoint == checkpoint


def mean_psnr(network, pairs):
    """(bicubic, network) mean PSNR over ``pairs``: BGR uint8 images, as BasicSR's metrics expect."""
    bicubic, sr_values = [], []
    for hr, lr in pairs:
        lr_float = lr.astype(np.float32) / 255.0
        up = cv2.resize(lr_float, (hr.shape[1], hr.shape[0]), interpolation=cv2.INTER_CUBIC)
        with torch.no_grad():
            sr = network(torch.from_numpy(lr_float[..., ::-1].transpose(2, 0, 1).copy())[None])[0]
        sr = sr.numpy().transpose(1, 2, 0)[..., ::-1]
        for values, image in ((bicubic, up), (sr_values, sr)):
            values.append(calculate_psnr(np.round(np.clip(image, 0, 1) * 255).astype(np.uint8), hr, 4,
                                         test_y_channel=True))
    return float(np.mean(bicubic)), float(np.mean(sr_values))


@pytest.mark.parametrize('options, checkpoint', [('pretrain_demo.yml', CHECKPOINT),
                                                  ('pretrain_demo_mambair.yml', MAMBAIR_CHECKPOINT)])
def test_pretrained_start_beats_bicubic_on_every_camera(test_pairs, options, checkpoint):
    options = yaml.safe_load((REPO / 'options' / 'demo' / options).read_text())
    network = build_network(dict(options['network_g'])).eval()
    network.load_state_dict(torch.load(checkpoint, map_location='cpu', weights_only=True)['params'])
    scores = {camera: mean_psnr(network, pairs) for camera, pairs in test_pairs.items()}
    short = {c: f'{s:.2f} vs bicubic {b:.2f} dB' for c, (b, s) in scores.items() if s - b <= MARGIN_DB}
    assert not short, f'the pretrained start is not above bicubic on: {short}'
