"""inference.py and the Python API on a tiny SAFMN: the formats users feed it, corrupt files,
existing outputs, wrong checkpoints, precision and tiling (the choice of test: and val:)."""
import copy
import re
import shutil
import warnings

import cv2
import numpy as np
import pytest
import torch
import yaml

from basicsr.archs import build_network
from basicsr_ldt import load_network, upscale
from basicsr_ldt.common.errors import InputError
from basicsr_ldt.pipelines.upscale import main as inference_main
from conftest import REPO, run_entry
from test_validation_inference import sr_slice_reference

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


@pytest.fixture(scope='module')
def tiny_network(tiny):
    return load_network(str(tiny / 'net_g_latest.pth'), opt=str(tiny / 'net.yml'), device='cpu')


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


def test_a_photo_is_read_turned_as_its_exif_orientation_says(tmp_path):
    """A phone JPEG stores its pixels sideways with an orientation tag; IMREAD_UNCHANGED ignored the tag and the
    output came out on its side. Read as viewers show it (tag 6: turned clockwise); 16-bit and alpha kept."""
    from PIL import Image
    from basicsr_ldt.pipelines.upscale import read_image
    stored = np.zeros((20, 30, 3), np.uint8)
    stored[:4] = 255                                           # a white band along the stored top edge
    tag = Image.Exif()
    tag[0x0112] = 6
    Image.fromarray(stored).save(tmp_path / 'phone.jpg', exif=tag, quality=100)
    shown = read_image(str(tmp_path / 'phone.jpg'))
    assert shown.shape == (30, 20, 3) and shown[:, -4:].mean() > 240 and shown[:, :4].mean() < 15   # band on the right
    Image.fromarray(stored[..., 0]).save(tmp_path / 'gray.jpg', exif=tag, quality=100)   # grayscale stays one channel
    assert read_image(str(tmp_path / 'gray.jpg')).shape == (30, 20)
    gray16 = (np.arange(600).reshape(20, 30) * 100).astype(np.uint16)
    cv2.imwrite(str(tmp_path / 'gray16.png'), gray16)
    assert np.array_equal(read_image(str(tmp_path / 'gray16.png')), gray16)
    rgba = np.random.default_rng(0).integers(0, 256, (6, 5, 4), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / 'rgba.png'), rgba)
    assert np.array_equal(read_image(str(tmp_path / 'rgba.png')), cv2.cvtColor(rgba, cv2.COLOR_BGRA2RGBA))
    cv2.imwrite(str(tmp_path / 'float.tif'), np.zeros((4, 4, 3), np.float32))
    with pytest.raises(InputError) as err:
        read_image(str(tmp_path / 'float.tif'))
    assert str(err.value) == 'float32 pixels are not supported (8- or 16-bit integers)'


def test_wrong_checkpoint_fails_before_any_output(tmp_path, tiny, photos):
    out = tmp_path / 'out'
    result = run_inference(tmp_path, '--input', str(photos), '--output', str(out),
                           '--checkpoint', str(tiny / 'net_g_latest.pth'), '--arch', 'SAFMN')
    assert result.returncode == 2
    assert result.stderr.startswith('error: checkpoint') and 'missing (e.g. feats.1.' in result.stderr
    assert not out.exists()


@pytest.mark.parametrize('device', ['gpu', 'CPU', 'auto', 'mps'])
def test_api_a_device_it_cannot_run_on_is_one_error(tiny, device):
    """torch's device errors listed every backend it knows ('Expected one of cpu, cuda, ipu, ...')."""
    with pytest.raises(InputError) as caught:
        load_network(str(tiny / 'net_g_latest.pth'), opt=str(tiny / 'net.yml'), device=device)
    assert str(caught.value) == f"device: expected 'cpu', 'cuda' or 'cuda:<index>', got {device!r}"


def test_api_a_param_key_the_checkpoint_lacks_is_one_error(tiny):
    """It loaded the file's other weights with a warning in a log a notebook user never sees."""
    with pytest.raises(InputError) as caught:
        load_network(str(tiny / 'net_g_latest.pth'), opt=str(tiny / 'net.yml'), device='cpu', param_key='params_ema')
    assert str(caught.value).endswith("has no 'params_ema' weights (top-level keys: ['params'])")


def test_api_an_option_file_given_as_a_path_object(tiny, tiny_network):
    """A ``pathlib.Path`` was read as a dict of options: 'no network_g section' of a file that has one."""
    network = load_network(str(tiny / 'net_g_latest.pth'), opt=tiny / 'net.yml', device='cpu')
    assert all(torch.equal(a, b) for a, b in zip(network.state_dict().values(), tiny_network.state_dict().values()))


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
    with pytest.raises(InputError, match='^precision: fp16 needs a CUDA device and this run is on the CPU'):
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


def test_api_alpha_is_resized_on_its_own_and_the_colour_is_the_rgb_result(tiny_network):
    """RGBA in: the colour is what the RGB image alone gives, the alpha a bicubic resize (clipped,
    rounded), 8 and 16 bits alike."""
    rng = np.random.default_rng(5)
    for dtype in (np.uint8, np.uint16):
        peak = np.iinfo(dtype).max
        rgba = (rng.random((10, 12, 4)) * peak).astype(dtype)
        out = upscale(tiny_network, rgba)
        assert out.shape == (40, 48, 4) and out.dtype == dtype
        assert np.array_equal(out[..., :3], upscale(tiny_network, np.ascontiguousarray(rgba[..., :3])))
        alpha = cv2.resize(rgba[..., 3].astype(np.float32), (48, 40), interpolation=cv2.INTER_CUBIC)
        assert np.array_equal(out[..., 3], np.clip(np.round(alpha), 0, peak).astype(dtype))


def test_api_grayscale_is_the_mean_of_the_replicated_rgb_result(tiny_network):
    gray = (np.random.default_rng(6).random((10, 12)) * 255).astype(np.uint8)
    rgb = upscale(tiny_network, np.repeat(gray[..., None], 3, axis=2))
    expected = np.round(rgb.astype(np.float64).mean(axis=2)).astype(np.uint8)
    assert np.array_equal(upscale(tiny_network, gray), expected)
    assert np.array_equal(upscale(tiny_network, gray[..., None]), expected[..., None])


def test_api_runs_a_network_kept_in_another_float_dtype(tiny_network):
    """The image is given to the network in the network's dtype (float64 here; fp16/bf16 weights on a GPU)."""
    image = (np.random.default_rng(7).random((10, 12, 3)) * 255).astype(np.uint8)
    double = copy.deepcopy(tiny_network).double()
    assert np.abs(upscale(double, image).astype(int) - upscale(tiny_network, image)).max() <= 1
    tensor = torch.from_numpy(image.transpose(2, 0, 1)).float().div(255)
    assert upscale(double, tensor).dtype == torch.float32


@pytest.mark.parametrize('image, message', [
    (torch.zeros(1, 4, 8, 8), 'expected a float tensor NCHW or CHW with 3 channels in [0, 1], got torch.float32 of '
                              'shape (1, 4, 8, 8)'),
    (torch.zeros(1, 3, 8, 8, dtype=torch.uint8), 'expected a float tensor NCHW or CHW with 3 channels in [0, 1], got '
                                                 'torch.uint8 of shape (1, 3, 8, 8)'),
    (torch.zeros(2, 1, 3, 8, 8), 'expected a float tensor NCHW or CHW with 3 channels in [0, 1], got torch.float32 '
                                 'of shape (2, 1, 3, 8, 8)'),
    ([[0, 0], [0, 0]], 'expected a numpy array or a torch tensor, got list'),
    (np.zeros((8, 8, 5), np.uint8), 'expected a non-empty image of shape HxW, HxWx1, HxWx3 or HxWx4, got (8, 8, 5)'),
    (np.zeros((8, 8, 2), np.uint8), 'expected a non-empty image of shape HxW, HxWx1, HxWx3 or HxWx4, got (8, 8, 2)'),
    (np.zeros((1, 8, 8, 3), np.uint8), 'expected a non-empty image of shape HxW, HxWx1, HxWx3 or HxWx4, got (1, 8, 8, 3)'),
    (np.zeros((0, 0, 3), np.uint8), 'expected a non-empty image of shape HxW, HxWx1, HxWx3 or HxWx4, got (0, 0, 3)'),
    (torch.zeros(1, 3, 0, 5), 'expected a float tensor NCHW or CHW with 3 channels in [0, 1], got torch.float32 of '
                              'shape (1, 3, 0, 5)'),
    (torch.full((3, 8, 8), 255.0), 'expected a float tensor with values in [0, 1], got values in [255, 255] (divide '
                                   'by 255)'),   # was clipped to a white image
    (torch.full((3, 8, 8), float('nan')), 'expected a float tensor with values in [0, 1], got values in [nan, nan]'),
    (torch.full((3, 8, 8), -0.5), 'expected a float tensor with values in [0, 1], got values in [-0.5, -0.5]'),
], ids=['4-channels', 'uint8-tensor', '5-d', 'list', 'hxwx5', 'hxwx2', 'batch-of-arrays', 'empty', 'empty-tensor',
        '0-255', 'nan', 'negative'])
def test_api_an_image_it_cannot_take_is_one_error_saying_what_it_takes(tiny_network, image, message):
    with pytest.raises(InputError) as caught:
        upscale(tiny_network, image)
    assert str(caught.value) == message


# ------------------------------------------------------------- tiling: the choice of test: and val:
def _official_reference(network, image: np.ndarray) -> np.ndarray:
    """What the official evaluation makes of an 8-bit RGB image: SR_slice (the test's own
    re-implementation), then BasicSR's clamp, x 255 and round."""
    lr = torch.from_numpy(image.transpose(2, 0, 1)).float().div(255).unsqueeze(0)
    with torch.no_grad():
        sr = sr_slice_reference(network, lr, 4).float().clamp(0, 1)
    return np.round(sr[0].permute(1, 2, 0).numpy() * 255).astype(np.uint8)


def test_api_official_tile_mode_is_the_official_cutting_pixel_for_pixel(tiny_network):
    """231 x 205 LR: two sections per axis, each reflect-padded by one pixel, as the paper's numbers were made."""
    image = (np.random.default_rng(2).random((231, 205, 3)) * 255).astype(np.uint8)
    got = upscale(tiny_network, image, tile_mode='official')
    assert np.array_equal(got, _official_reference(tiny_network, image))
    assert not np.array_equal(got, upscale(tiny_network, image))           # whole image: another result
    tensor = torch.from_numpy(image.transpose(2, 0, 1)).float().div(255)
    with torch.no_grad():
        expected = sr_slice_reference(tiny_network, tensor.unsqueeze(0), 4).float().clamp(0, 1)[0]
    assert torch.equal(upscale(tiny_network, tensor, tile_mode='official'), expected)


def test_api_tile_keeps_meaning_fixed_tiles(tiny_network):
    """``upscale(net, img, tile=64)`` (the older keyword) is ``tile_size=64``: fixed 64-pixel tiles."""
    image = (np.random.default_rng(3).random((100, 90, 3)) * 255).astype(np.uint8)
    fixed = upscale(tiny_network, image, tile_mode='fixed', tile_size=64, tile_overlap=16)
    assert not np.array_equal(fixed, upscale(tiny_network, image))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        assert np.array_equal(upscale(tiny_network, image, tile=64), fixed)
        assert np.array_equal(upscale(tiny_network, image, 64), fixed)   # tile_size is still the third argument
    assert np.array_equal(upscale(tiny_network, image, None), upscale(tiny_network, image))   # None: whole, as before
    assert [str(w.message) for w in caught] == ['upscale(tile=...) is now upscale(tile_size=...)']
    assert issubclass(caught[0].category, DeprecationWarning)


def test_api_tile_warning_points_at_the_callers_line(tiny_network):
    """The deprecation warning names the user's line that passes ``tile=`` (the one to change),
    not a line inside the package.
    mutmut cannot kill ``upscale``'s ``stacklevel`` mutants (2 -> 1 or 3: its trampoline is one more
    stack frame), so scripts/mutation_test.sh deselects this test; applied by hand, both fail it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        upscale(tiny_network, np.zeros((8, 8, 3), np.uint8), tile=4, tile_overlap=0)
    assert [(w.filename, w.category) for w in caught] == [(__file__, DeprecationWarning)]


@pytest.mark.parametrize('keywords, message', [
    ({'tile_mode': 'tiles'}, "tile_mode: expected one of 'official', 'fixed', 'whole', got 'tiles'"),
    ({'tile_mode': 'official', 'tile_size': 64},
     "tile_size: only tile_mode 'fixed' uses it (tile_mode is 'official'); remove it or set it to 0"),
    ({'tile_overlap': 8}, "tile_overlap: only tile_mode 'fixed' uses it (tile_mode is 'whole'); remove it or set it "
                          'to 16'),
    ({'tile_mode': 'fixed'}, "tile_size: tile_mode 'fixed' needs the tile size in LR pixels (an integer >= 1), got 0"),
    ({'tile_size': -1}, 'tile_size: expected an integer >= 0, got -1'),
    ({'tile_size': '8'}, "tile_size: expected an integer >= 0, got '8'"),   # Python: no hint about YAML
    ({'tile_size': 8, 'tile_overlap': 8}, 'tile_overlap: expected an integer in [0, tile_size=8), got 8'),
    ({'precision': 'half'}, "precision: expected one of 'fp32', 'bf16', 'fp16', got 'half'"),
    ({'precision': 'fp16'}, 'precision: fp16 needs a CUDA device and this run is on the CPU; use bf16 or fp32'),
    ({'tile': 8, 'tile_size': 16}, 'give tile_size or its older name tile, not both'),
])
def test_api_bad_inference_values_are_one_line_naming_the_keyword(tiny_network, keywords, message):
    with pytest.raises(InputError) as caught:
        upscale(tiny_network, np.zeros((8, 8, 3), np.uint8), **keywords)
    assert str(caught.value) == message


def test_cli_tile_mode_official_writes_the_official_cutting(tmp_path, tiny, tiny_network):
    image = (np.random.default_rng(4).random((205, 40, 3)) * 255).astype(np.uint8)   # 2 sections, 1 padded row
    cv2.imwrite(str(tmp_path / 'photo.png'), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    run_inference(tmp_path, '--input', str(tmp_path / 'photo.png'), '--output', str(tmp_path / 'out'),
                  '--checkpoint', str(tiny / 'net_g_latest.pth'), '--opt', str(tiny / 'net.yml'),
                  '--tile-mode', 'official', check=True)
    written = cv2.cvtColor(cv2.imread(str(tmp_path / 'out' / 'photo_x4.png')), cv2.COLOR_BGR2RGB)
    assert np.array_equal(written, _official_reference(tiny_network, image))
    assert not np.array_equal(written, upscale(tiny_network, image))


@pytest.mark.parametrize('flags, message', [
    (['--tile-mode', 'tiles'], "--tile-mode: expected one of 'official', 'fixed', 'whole', got 'tiles'"),
    (['--tile-mode', 'official', '--tile', '200'],
     "--tile-size: only --tile-mode 'fixed' uses it (--tile-mode is 'official'); remove it or set it to 0"),
    (['--tile-mode', 'official', '--tile-overlap', '32'],
     "--tile-overlap: only --tile-mode 'fixed' uses it (--tile-mode is 'official'); remove it or set it to 16"),
    (['--tile-mode', 'fixed'],
     "--tile-size: --tile-mode 'fixed' needs the tile size in LR pixels (an integer >= 1), got 0"),
    (['--tile-size', '-8'], '--tile-size: expected an integer >= 0, got -8'),
    (['--tile-size', '32', '--tile-overlap', '40'],
     '--tile-overlap: expected an integer in [0, --tile-size=32), got 40'),
    (['--precision', 'half'], "--precision: expected one of 'fp32', 'bf16', 'fp16', got 'half'"),
    (['--precision', 'fp16', '--device', 'cpu'],
     '--precision: fp16 needs a CUDA device and this run is on the CPU; use bf16 or fp32'),
    (['--tile-size', 'big'], "argument --tile-size/--tile: invalid int value: 'big' (python inference.py -h lists the "
                             'flags)'),
])
def test_cli_bad_inference_flags_are_one_line_and_write_nothing(tmp_path, tiny, photos, flags, message):
    out = tmp_path / 'out'
    with pytest.raises(InputError) as caught:
        inference_main(['--input', str(photos), '--output', str(out), '--checkpoint', str(tiny / 'net_g_latest.pth'),
                        '--opt', str(tiny / 'net.yml'), *flags])
    assert str(caught.value) == message
    assert not out.exists()


def test_cli_in_process_writes_each_image_as_its_flags_say(tmp_path, tiny, tiny_network, photos, capsys, monkeypatch):
    """``main`` as ``inference.py`` runs it: each image through ``upscale`` with the tiling flags, named
    ``<stem>_x4.png`` (or ``--suffix``/``--ext``), on the device asked for; a corrupt file is one line
    and exit code 1; existing outputs are refused unless ``--force``."""
    import basicsr_ldt.pipelines.upscale as pipeline
    devices = []
    load = pipeline.loaded_network
    monkeypatch.setattr(pipeline, 'loaded_network', lambda *a, **k: devices.append(k['device']) or load(*a, **k))
    out = tmp_path / 'out'
    args = ['--input', str(photos), '--output', str(out), '--checkpoint', str(tiny / 'net_g_latest.pth'),
            '--opt', str(tiny / 'net.yml'), '--device', 'cpu']
    tiles = ['--tile-mode', 'fixed', '--tile-size', '8', '--tile-overlap', '2']
    assert inference_main(args + tiles) == 1
    printed = capsys.readouterr().out
    assert f"failed: '{photos / 'broken.png'}': cannot read it: not an image, or the file is corrupt" in printed
    assert f"weights: {tiny / 'net_g_latest.pth'} [params]\n" in printed        # which of the file's weights ran
    assert re.search(rf'^4 written, 1 failed, to {re.escape(str(out))} \(', printed, re.M), printed
    assert devices == [torch.device('cpu')]
    assert sorted(p.name for p in out.iterdir()) == ['alpha_x4.png', 'gray16_x4.png', 'photo_x4.png', 'rgb_x4.png']
    rgb = cv2.cvtColor(cv2.imread(str(photos / 'rgb.png')), cv2.COLOR_BGR2RGB)
    written = cv2.cvtColor(cv2.imread(str(out / 'rgb_x4.png')), cv2.COLOR_BGR2RGB)
    assert np.array_equal(written, upscale(tiny_network, rgb, tile_mode='fixed', tile_size=8, tile_overlap=2))
    assert not np.array_equal(written, upscale(tiny_network, rgb))   # the flags made a difference
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(InputError, match=r"^4 output file\(s\) exist already .*pass --force to overwrite them$"):
        inference_main(args)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (photos / 'broken.png').unlink()
    assert inference_main(args + ['--force']) == 0
    rewritten = cv2.cvtColor(cv2.imread(str(out / 'rgb_x4.png')), cv2.COLOR_BGR2RGB)
    assert np.array_equal(rewritten, upscale(tiny_network, rgb))   # overwritten, now whole-image
    assert inference_main(args + ['--suffix', '_big', '--ext', 'tif']) == 0
    assert {'rgb_big.tif', 'gray16_big.tif'} <= {p.name for p in out.iterdir()}
    assert re.search(r'^4 written, 0 failed', capsys.readouterr().out, re.M)



def test_cli_an_option_files_test_section_runs_the_images_as_test_py_does(tmp_path, tiny, tiny_network, capsys):
    """Audit 6: ``--opt`` took network_g alone, so a test file's ``tile_mode``/``tile_size`` were dropped and the
    pixels differed from what test.py measured. Its ``test:`` keys apply, a flag wins over them, the run says which
    it took, and a bad value is named as the file's key before anything is written."""
    photo = tmp_path / 'in'
    photo.mkdir()
    rgb = (np.random.default_rng(1).random((20, 24, 3)) * 255).astype(np.uint8)
    cv2.imwrite(str(photo / 'rgb.png'), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    opt = tmp_path / 'test.yml'
    opt.write_text(yaml.safe_dump({'network_g': TINY, 'test': {'tile_mode': 'fixed', 'tile_size': 8, 'tile_overlap': 2}}))
    base = ['--input', str(photo), '--checkpoint', str(tiny / 'net_g_latest.pth'), '--opt', str(opt), '--device', 'cpu']

    def written(out, *flags):
        assert inference_main(base + ['--output', str(tmp_path / out), *flags]) == 0
        return cv2.cvtColor(cv2.imread(str(tmp_path / out / 'rgb_x4.png')), cv2.COLOR_BGR2RGB)
    assert np.array_equal(written('a'), upscale(tiny_network, rgb, tile_mode='fixed', tile_size=8, tile_overlap=2))
    assert f'from {opt} test: tile_mode fixed, tile_size 8, tile_overlap 2\n' in capsys.readouterr().out
    assert np.array_equal(written('b', '--tile-overlap', '4'),
                          upscale(tiny_network, rgb, tile_mode='fixed', tile_size=8, tile_overlap=4))
    assert np.array_equal(written('c', '--tile-mode', 'whole'), upscale(tiny_network, rgb))
    opt.write_text(yaml.safe_dump({'network_g': TINY, 'test': {'tile_size': -3}}))
    with pytest.raises(InputError, match=r'^test\.tile_size: '):
        inference_main(base + ['--output', str(tmp_path / 'd')])
    opt.write_text(yaml.safe_dump({'network_g': TINY, 'test': {'precision': 'fp16'}}))   # checked for this device
    with pytest.raises(InputError, match=r'^test\.precision: .*fp16'):
        inference_main(base + ['--output', str(tmp_path / 'd')])
    assert not (tmp_path / 'd').exists()


def test_cli_network_flags_in_process(tmp_path, tiny, photos, monkeypatch):
    """Which network ``inference.py`` builds: ``--opt`` or ``--arch`` (one of them; ``--scale``
    overrides), or a release name alone, which implies its network; on the ``--device`` asked for."""
    import basicsr_ldt.pipelines.upscale as pipeline
    out = tmp_path / 'out'
    base = ['--input', str(photos), '--output', str(out)]
    tiny_checkpoint = ['--checkpoint', str(tiny / 'net_g_latest.pth')]
    with pytest.raises(InputError, match=r'^give the network as --opt OPTION_FILE or --arch MambaIR\|HAT\|SAFMN$'):
        inference_main(base + tiny_checkpoint)
    with pytest.raises(InputError, match='^the following arguments are required: --checkpoint '):
        inference_main(base + ['--opt', str(tiny / 'net.yml')])
    for flag, value in (('--ext', 'jpg'), ('--device', 'mps')):   # only the choices offered (jpg: lossy, 8 bits)
        with pytest.raises(InputError, match=f"^argument {flag}: invalid choice: '{value}' "):
            inference_main(base + tiny_checkpoint + ['--opt', str(tiny / 'net.yml'), flag, value])
    with pytest.raises(InputError, match='^give either --opt or --arch, not both$'):
        inference_main(base + tiny_checkpoint + ['--opt', str(tiny / 'net.yml'), '--arch', 'SAFMN'])
    with pytest.raises(InputError, match=r'^checkpoint .*missing \(e\.g\. feats\.1\.'):   # --arch: the x4 SAFMN defaults
        inference_main(base + tiny_checkpoint + ['--arch', 'SAFMN'])
    with pytest.raises(InputError, match='does not fit network SAFMN'):   # --scale 2 overrides the option file's 4
        inference_main(base + tiny_checkpoint + ['--opt', str(tiny / 'net.yml'), '--scale', '2'])
    calls = []

    def loaded_network(checkpoint, **chosen):
        calls.append((checkpoint, chosen))
        raise InputError('stop here')

    monkeypatch.setattr(pipeline, 'loaded_network', loaded_network)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)   # --device cpu is honoured beside a GPU
    for extra, arch, opt in (([], 'HAT', None), (['--opt', str(tiny / 'net.yml')], None, str(tiny / 'net.yml'))):
        with pytest.raises(InputError, match='^stop here$'):
            inference_main(base + ['--checkpoint', 'HAT_SRx4', '--device', 'cpu', '--param-key', 'params'] + extra)
        assert calls[-1] == ('HAT_SRx4', {'arch': arch, 'opt': opt, 'device': torch.device('cpu'), 'scale': None,
                                          'param_key': 'params'})
    assert not out.exists()


def test_cli_bad_flag_is_one_line_on_stderr(tmp_path, tiny, photos):
    """As the user sees it: ``error: <the line>``, exit code 2, no output folder."""
    result = run_inference(tmp_path, '--input', str(photos), '--output', str(tmp_path / 'out'),
                           '--checkpoint', str(tiny / 'net_g_latest.pth'), '--opt', str(tiny / 'net.yml'),
                           '--tile-mode', 'tiles')
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --tile-mode: expected one of 'official', 'fixed', 'whole', got 'tiles'"]
    assert not (tmp_path / 'out').exists()


def test_output_slips_are_one_line_and_a_run_that_wrote_nothing_leaves_no_folder(tmp_path, tiny, photos):
    """``--output`` naming a file, a ``--suffix`` with a '/', and a misspelt release name are one line each
    (a traceback from ``os.makedirs`` or the image writer before); a run in which every image failed removes
    the output folder it made, as it holds nothing."""
    network = ('--checkpoint', str(tiny / 'net_g_latest.pth'), '--opt', str(tiny / 'net.yml'))
    (tmp_path / 'a_file').write_text('x')
    with pytest.raises(InputError, match=rf"^--output '{re.escape(str(tmp_path / 'a_file'))}' is a file; expected a "
                                         r'folder \(made when absent\)$'):
        inference_main(['--input', str(photos / 'rgb.png'), '--output', str(tmp_path / 'a_file'), *network])
    with pytest.raises(InputError, match=r"^--suffix '/x': expected text for the end of each file name, without '/'$"):
        inference_main(['--input', str(photos / 'rgb.png'), '--output', str(tmp_path / 'out'), '--suffix', '/x',
                        *network])
    assert not (tmp_path / 'out').exists()
    with pytest.raises(InputError, match=r"; --checkpoint 'HAT_SRx5' is no file and no release name \(did you mean "
                                         r"'HAT_SRx4'\?\)$"):
        inference_main(['--input', str(photos), '--output', str(tmp_path / 'out'), '--checkpoint', 'HAT_SRx5'])
    broken = tmp_path / 'broken'
    broken.mkdir()
    (broken / 'bad.png').write_bytes(b'not an image at all')
    assert inference_main(['--input', str(broken), '--output', str(tmp_path / 'out'), *network]) == 1
    assert not (tmp_path / 'out').exists()
    (tmp_path / 'kept').mkdir()   # a folder the user made stays, even empty
    assert inference_main(['--input', str(broken), '--output', str(tmp_path / 'kept'), *network]) == 1
    assert (tmp_path / 'kept').is_dir()


def test_a_second_run_into_the_input_folder_refuses_to_upscale_its_own_outputs(tmp_path, tiny):
    """``--output`` = the input folder writes a_x4.png beside a.png; run again with --force, it upscaled
    a_x4.png into a_x4_x4.png (16x) and overwrote a_x4.png with the x4 of a.png, counting both as written."""
    folder = tmp_path / 'photos'
    folder.mkdir()
    cv2.imwrite(str(folder / 'a.png'), np.full((8, 8, 3), 90, np.uint8))
    network = ('--checkpoint', str(tiny / 'net_g_latest.pth'), '--opt', str(tiny / 'net.yml'))
    assert inference_main(['--input', str(folder), '--output', str(folder), *network]) == 0
    assert (folder / 'a_x4.png').is_file()
    with pytest.raises(InputError, match=rf"^'{re.escape(str(folder / 'a_x4.png'))}' is an input and also the output "
                                         rf"of '{re.escape(str(folder / 'a.png'))}' \(an earlier run's output in the "
                                         r'input folder\?\); choose another --output, or move the earlier outputs away$'):
        inference_main(['--input', str(folder), '--output', str(folder), '--force', *network])
    assert sorted(p.name for p in folder.iterdir()) == ['a.png', 'a_x4.png']
