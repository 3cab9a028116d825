"""inference.py and the Python API on a tiny SAFMN: the formats users feed it, corrupt files,
existing outputs, wrong checkpoints, precision and tiling."""
import shutil

import cv2
import numpy as np
import pytest
import torch
import yaml

from basicsr.archs import build_network
from basicsr_ldt import load_network, upscale
from basicsr_ldt.common.errors import InputError
from conftest import REPO, run_entry

TINY = {'type': 'SAFMN', 'dim': 8, 'n_blocks': 1, 'ffn_scale': 2.0, 'upscaling_factor': 4}


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    """A tiny SAFMN checkpoint in BasicSR's format and an option file describing it."""
    folder = tmp_path_factory.mktemp('tiny')
    torch.manual_seed(0)
    network = build_network(dict(TINY))
    torch.save({'params': network.state_dict()}, folder / 'net_g_latest.pth')
    (folder / 'net.yml').write_text(yaml.safe_dump({'network_g': TINY}))
    return folder


@pytest.fixture
def photos(tmp_path):
    """A folder as users have it: 8-bit RGB, 16-bit grayscale, RGBA, JPEG and one corrupt file."""
    rng = np.random.default_rng(0)
    folder = tmp_path / 'photos'
    folder.mkdir()
    cv2.imwrite(str(folder / 'rgb.png'), (rng.random((20, 24, 3)) * 255).astype(np.uint8))
    cv2.imwrite(str(folder / 'gray16.png'), (rng.random((18, 16)) * 65535).astype(np.uint16))
    cv2.imwrite(str(folder / 'alpha.png'), (rng.random((16, 16, 4)) * 255).astype(np.uint8))
    cv2.imwrite(str(folder / 'photo.jpg'), (rng.random((16, 20, 3)) * 255).astype(np.uint8))
    (folder / 'broken.png').write_bytes(b'\x89PNG\r\n\x1a\n' + b'\x00' * 40)
    (folder / 'notes.txt').write_text('not an image, not picked up')
    return folder


def run_inference(tmp_path, *args, check=False):
    shutil.copy(REPO / 'inference.py', tmp_path / 'inference.py')
    return run_entry(tmp_path, 'inference.py', *args, check=check)


def test_folder_with_a_corrupt_file(tmp_path, tiny, photos):
    out = tmp_path / 'out'
    args = ('--input', str(photos), '--output', str(out), '--checkpoint', str(tiny / 'net_g_latest.pth'),
            '--opt', str(tiny / 'net.yml'))
    result = run_inference(tmp_path, *args)
    assert result.returncode == 1
    assert "failed: '" in result.stdout and 'broken.png' in result.stdout
    assert '4 written, 1 failed' in result.stdout
    assert 'img/s' in result.stderr  # tqdm's progress bar with images per second
    assert sorted(p.name for p in out.iterdir()) == ['alpha_x4.png', 'gray16_x4.png', 'photo_x4.png', 'rgb_x4.png']
    rgb = cv2.imread(str(out / 'rgb_x4.png'), cv2.IMREAD_UNCHANGED)
    assert rgb.shape == (80, 96, 3) and rgb.dtype == np.uint8
    gray = cv2.imread(str(out / 'gray16_x4.png'), cv2.IMREAD_UNCHANGED)
    assert gray.shape == (72, 64) and gray.dtype == np.uint16
    alpha_in = cv2.imread(str(photos / 'alpha.png'), cv2.IMREAD_UNCHANGED)
    alpha = cv2.imread(str(out / 'alpha_x4.png'), cv2.IMREAD_UNCHANGED)
    assert alpha.shape == (64, 64, 4)
    expected_alpha = cv2.resize(alpha_in[..., 3].astype(np.float32), (64, 64), interpolation=cv2.INTER_CUBIC)
    assert np.abs(alpha[..., 3].astype(float) - np.clip(np.round(expected_alpha), 0, 255)).max() == 0

    # A second run refuses to overwrite anything, before reading any image.
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()}
    again = run_inference(tmp_path, *args)
    assert again.returncode == 2 and 'exist already' in again.stderr and '--force' in again.stderr
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()} == before
    forced = run_inference(tmp_path, *args, '--force', '--suffix', '')
    assert forced.returncode == 1 and (out / 'rgb.png').is_file()


def test_wrong_checkpoint_fails_before_any_output(tmp_path, tiny, photos):
    out = tmp_path / 'out'
    result = run_inference(tmp_path, '--input', str(photos), '--output', str(out),
                           '--checkpoint', str(tiny / 'net_g_latest.pth'), '--arch', 'SAFMN')
    assert result.returncode == 2
    assert result.stderr.startswith('error: checkpoint') and 'missing (e.g. feats.1.' in result.stderr
    assert not out.exists()


def test_api_matches_across_input_kinds(tiny):
    network = load_network(str(tiny / 'net_g_latest.pth'), opt=str(tiny / 'net.yml'), device='cpu')
    rng = np.random.default_rng(1)
    image = (rng.random((12, 14, 3)) * 255).astype(np.uint8)
    out = upscale(network, image)
    assert out.shape == (48, 56, 3) and out.dtype == np.uint8
    tensor = torch.from_numpy(image.transpose(2, 0, 1)).float().unsqueeze(0) / 255
    out_tensor = upscale(network, tensor)
    assert out_tensor.shape == (1, 3, 48, 56) and out_tensor.dtype == torch.float32
    assert np.array_equal(np.round(out_tensor[0].permute(1, 2, 0).numpy() * 255).astype(np.uint8), out)
    assert upscale(network, tensor[0]).shape == (3, 48, 56)
    # 16 bits in, 16 bits out, same picture as 8 bits up to quantisation.
    out16 = upscale(network, image.astype(np.uint16) * 257)
    assert out16.dtype == np.uint16 and np.abs(out16 / 257.0 - out).max() <= 1
    gray = upscale(network, image[..., 0])
    assert gray.shape == (48, 56) and gray.dtype == np.uint8
    assert upscale(network, image[..., :1]).shape == (48, 56, 1)
    # bf16 autocast on the CPU stays close to fp32; fp16 on the CPU is a clear error.
    assert np.abs(upscale(network, image, precision='bf16').astype(int) - out).mean() < 3
    with pytest.raises(InputError, match="'fp16' needs a CUDA device"):
        upscale(network, image, precision='fp16')
    with pytest.raises(InputError, match='uint8 or uint16'):
        upscale(network, image.astype(np.float32))


def test_api_loads_arch_defaults_ema_weights_and_reports_wrong_keys(tmp_path):
    torch.manual_seed(0)
    released = build_network({'type': 'SAFMN', 'dim': 36, 'n_blocks': 8, 'ffn_scale': 2.0, 'upscaling_factor': 2})
    ema = {k: v + 1 for k, v in released.state_dict().items()}
    torch.save({'params': released.state_dict(), 'params_ema': ema}, tmp_path / 'release.pth')
    network = load_network(str(tmp_path / 'release.pth'), arch='SAFMN', scale=2, device='cpu')
    assert torch.equal(network.state_dict()['to_feat.weight'], ema['to_feat.weight'])
    assert upscale(network, np.zeros((8, 8, 3), np.uint8)).shape == (16, 16, 3)
    with pytest.raises(InputError, match=r'does not fit network SAFMN: .*with another shape \(e\.g\. to_img'):
        load_network(str(tmp_path / 'release.pth'), arch='SAFMN', device='cpu')  # x4 head, x2 weights
    with pytest.raises(InputError, match="arch 'EDSR' has no built-in defaults"):
        load_network(str(tmp_path / 'release.pth'), arch='EDSR')
