"""MambaIR / HAT / SAFMN: checkpoint format and outputs equal to the upstream implementations.

Reference data in tests/data was produced by running the UPSTREAM code (commits recorded in
each file's ``source``) outside this repository:
* arch_keys/<config>.json: ordered state_dict keys and shapes of every released configuration;
* arch_outputs/<name>.pt: input and upstream output of a tiny configuration whose weights come
  from :func:`seeded_weights` (HAT outputs include upstream HATModel's reflect pad + crop).
"""
import copy
import glob
import json
import math
import os
import zlib
from typing import Dict

import pytest
import torch

import basicsr_ldt  # noqa: F401  (must precede basicsr)
import archs
from basicsr.models.base_model import BaseModel
from basicsr.utils.registry import ARCH_REGISTRY

DATA = os.path.join(os.path.dirname(__file__), 'data')
KEY_FILES = sorted(glob.glob(os.path.join(DATA, 'arch_keys', '*.json')))
OUTPUT_FILES = sorted(glob.glob(os.path.join(DATA, 'arch_outputs', '*.pt')))

TINY = {
    'MambaIR': dict(type='MambaIR', upscale=4, img_size=8, embed_dim=30, depths=[1, 1], d_state=4,
                    mlp_ratio=2, upsampler='pixelshuffle'),
    'MambaIR_light': dict(type='MambaIR', upscale=3, img_size=8, embed_dim=30, depths=[1], d_state=4,
                          mlp_ratio=1.2, upsampler='pixelshuffledirect'),
    'HAT': dict(type='HAT', upscale=4, img_size=16, window_size=4, squeeze_factor=6, embed_dim=12,
                depths=[2], num_heads=[2], mlp_ratio=2, upsampler='pixelshuffle'),
    'SAFMN': dict(type='SAFMN', dim=8, n_blocks=2, upscaling_factor=4),
}


def build(network_g: Dict) -> torch.nn.Module:
    """Instantiate through BasicSR's registry, as ``build_network`` does."""
    opt = dict(network_g)
    return ARCH_REGISTRY.get(opt.pop('type'))(**opt)


def seeded_weights(model: torch.nn.Module, seed: int = 0) -> Dict[str, torch.Tensor]:
    """Deterministic weights per parameter name, independent of init order (the same helper
    generated the upstream outputs)."""
    out = {}
    for name, t in model.state_dict().items():
        if not t.is_floating_point():
            out[name] = t.clone()
            continue
        noise = torch.randn(t.shape, generator=torch.Generator().manual_seed(seed + zlib.crc32(name.encode())))
        if t.dim() >= 2:
            out[name] = noise * (0.5 / math.sqrt(t[0].numel()))
        else:
            one = name.endswith('weight') or 'skip_scale' in name or name.endswith('Ds')
            out[name] = noise * 0.1 + (1.0 if one else 0.0)
    return out


def test_registered_under_upstream_names_without_clashing():
    assert ARCH_REGISTRY.get('MambaIR') is archs.MambaIR
    assert ARCH_REGISTRY.get('HAT') is archs.HAT
    assert ARCH_REGISTRY.get('SAFMN') is archs.SAFMN
    assert len(KEY_FILES) == 23 and len(OUTPUT_FILES) == 5


@pytest.mark.parametrize('path', KEY_FILES, ids=lambda p: os.path.basename(p)[:-5])
def test_state_dict_equals_upstream_and_loads_strict(path):
    with open(path) as f:
        ref = json.load(f)
    with torch.device('meta'):
        net = build(ref['network_g'])
    ours = [(k, list(v.shape)) for k, v in net.state_dict().items()]
    assert ours == list(ref['state_dict'].items())
    fake_release = {k: torch.empty(shape, device='meta') for k, shape in ref['state_dict'].items()}
    net.load_state_dict(fake_release, strict=True, assign=True)


@pytest.mark.parametrize('path', OUTPUT_FILES, ids=lambda p: os.path.basename(p)[:-3])
def test_output_equals_upstream_with_same_weights(path):
    ref = torch.load(path, weights_only=True)
    net = build(ref['network_g']).eval()
    net.load_state_dict(seeded_weights(net), strict=True)
    with torch.no_grad():
        out = net(ref['input'])
    assert out.shape == ref['output'].shape
    torch.testing.assert_close(out, ref['output'], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('param_key', ['params', 'params_ema'])
@pytest.mark.parametrize('name', ['MambaIR', 'HAT', 'SAFMN'])
def test_upstream_format_checkpoint_roundtrips_through_basicsr_loader(tmp_path, name, param_key):
    src = build(TINY[name]).eval()
    src.load_state_dict(seeded_weights(src, seed=1))
    other = seeded_weights(src, seed=2)
    keys = {'params': src.state_dict(), 'params_ema': other}
    if param_key == 'params_ema':
        keys = {'params': other, 'params_ema': src.state_dict()}
    torch.save(keys, tmp_path / 'net_g.pth')
    dst = build(TINY[name]).eval()
    BaseModel.load_network(object.__new__(BaseModel), dst, str(tmp_path / 'net_g.pth'), strict=True,
                           param_key=param_key)
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k], v), k
    x = torch.rand(1, 3, 9, 10)
    with torch.no_grad():
        assert torch.equal(dst(x), src(x))


@pytest.mark.parametrize('name', list(TINY))
def test_forward_backward_on_odd_sizes(name):
    net = build(TINY[name]).train()
    scale = TINY[name].get('upscale', TINY[name].get('upscaling_factor'))
    x = torch.rand(2, 3, 13, 17)
    out = net(x)
    assert out.shape == (2, 3, 13 * scale, 17 * scale)
    out.square().mean().backward()
    missing = [n for n, p in net.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f'parameters without a finite gradient: {missing}'


def test_hat_pads_inside_like_upstream_test_model():
    """Sizes that are not window multiples give the crop of the reflect-padded result."""
    net = build(TINY['HAT']).eval()
    x = torch.rand(1, 3, 9, 6)
    padded = torch.nn.functional.pad(x, (0, 2, 0, 3), mode='reflect')
    with torch.no_grad():
        torch.testing.assert_close(net(x), net(padded)[..., :36, :24])


def test_safmn_accepts_inputs_smaller_than_its_pyramid():
    net = build(TINY['SAFMN']).eval()
    with torch.no_grad():
        assert net(torch.rand(1, 3, 5, 3)).shape == (1, 3, 20, 12)


def embedded(x: torch.Tensor, height: int, width: int, mode: str) -> torch.Tensor:
    """``x`` as the top-left corner of a ``height`` x ``width`` image whose extra rows/columns (below
    and to the right) repeat the last one (``replicate``) or mirror the image about it (``reflect``)."""
    def source(i: int, n: int) -> int:
        return i if i < n else n - 1 if mode == 'replicate' else 2 * (n - 1) - i
    h, w = x.shape[-2:]
    rows = torch.tensor([source(i, h) for i in range(height)])
    cols = torch.tensor([source(j, w) for j in range(width)])
    return x[..., rows, :][..., cols]


@pytest.mark.parametrize('name, size, padded, mode', [
    ('SAFMN', (5, 7), (8, 8), 'replicate'),    # under SAFMN's 8-pixel pyramid: edge-padded to 8
    ('SAFMN', (3, 9), (8, 9), 'replicate'),    # only the short side is padded
    ('SAFMN', (9, 3), (9, 8), 'replicate'),
    ('SAFMN', (1, 1), (8, 8), 'replicate'),
    ('HAT', (5, 7), (8, 8), 'reflect'),        # window 4: reflect, as upstream's test model
    ('HAT', (2, 7), (4, 8), 'replicate'),      # 2 rows cannot reflect 2 more: edge replication
    ('HAT', (1, 3), (4, 4), 'replicate'),
])
def test_a_small_input_gives_the_crop_of_the_padded_input(name, size, padded, mode):
    """What a user gets for an image smaller than the network's minimum (SAFMN) or not a window
    multiple (HAT): the top-left crop of the output for the image padded at the bottom/right the way
    the network documents, so content stays where it was (not only the size).
    Mutation testing (issue #40): kills the ``SAFMN.forward`` mutants that padded at the top or left,
    with zeros, by one row or column more than needed or far more, or padded only inputs small on both
    sides (the old test checked the output's shape only)."""
    net = build(TINY[name]).eval()
    net.load_state_dict(seeded_weights(net, seed=3))
    scale = TINY[name].get('upscale', TINY[name].get('upscaling_factor'))
    x = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        small, large = net(x), net(embedded(x, *padded, mode))
    assert small.shape == (2, 3, size[0] * scale, size[1] * scale)
    torch.testing.assert_close(small, large[..., :size[0] * scale, :size[1] * scale])


@pytest.mark.parametrize('name', ['MambaIR', 'HAT'])
def test_use_checkpoint_gives_same_outputs_and_gradients(name):
    plain = build(TINY[name])
    ckpt = build({**TINY[name], 'use_checkpoint': True})
    weights = seeded_weights(plain)
    plain.load_state_dict(weights)
    ckpt.load_state_dict(weights)
    x = torch.rand(1, 3, 8, 8)
    for net in (plain, ckpt):
        net.eval()
        net(x).sum().backward()
    torch.testing.assert_close(ckpt(x), plain(x))
    for (n, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=n)


@pytest.mark.parametrize('cfg, message', [
    ({**TINY['HAT'], 'upsampler': ''}, 'upsampler'),
    ({**TINY['HAT'], 'resi_connection': '3conv'}, 'resi_connection'),
    ({**TINY['HAT'], 'num_heads': [2, 2]}, 'num_heads'),
    ({**TINY['MambaIR'], 'upsampler': 'nearest+conv'}, 'upsampler'),
    ({**TINY['MambaIR'], 'resi_connection': 'identity'}, 'resi_connection'),
    ({**TINY['MambaIR'], 'scan_backend': 'tpu'}, 'scan_backend'),
])
def test_bad_options_are_rejected_by_name(cfg, message):
    with pytest.raises(ValueError, match=message):
        build(cfg)


@pytest.mark.parametrize('name', ['MambaIR', 'HAT', 'SAFMN'])
def test_wrong_input_channels_are_rejected(name):
    with pytest.raises(ValueError, match=f'{name} expects'):
        build(TINY[name])(torch.rand(1, 4, 8, 8))


OPTION_RELEASES = {'mambair': 'MambaIR_SR_x4', 'hat': 'HAT_SRx4', 'safmn': 'SAFMN_x4'}


@pytest.mark.parametrize('kind', ['train_{}_ldt', 'test_{}'])
@pytest.mark.parametrize('arch', list(OPTION_RELEASES))
def test_option_files_build_the_released_x4_network(arch, kind):
    """network_g in options/ is the released configuration, and its commented small CPU
    variant builds and runs."""
    import yaml
    from basicsr.utils.options import ordered_yaml

    path = os.path.join(os.path.dirname(DATA), '..', 'options', kind.format(arch) + '.yml')
    with open(path) as f:
        text = f.read()
    opt = yaml.load(text, Loader=ordered_yaml()[0])
    with open(os.path.join(DATA, 'arch_keys', OPTION_RELEASES[arch] + '.json')) as f:
        ref = json.load(f)
    with torch.device('meta'):
        net = build(opt['network_g'])
    assert [(k, list(v.shape)) for k, v in net.state_dict().items()] == list(ref['state_dict'].items())
    assert opt['path']['pretrain_network_g'].startswith('pretrained/') and opt['scale'] == 4
    small_block = text.split('# Small CPU variant')[1].split('\n\n')[0]
    small = yaml.safe_load('\n'.join(line[2:] for line in small_block.splitlines()[1:]))
    with torch.no_grad():
        assert build(small['network_g']).eval()(torch.rand(1, 3, 11, 9)).shape == (1, 3, 44, 36)


def test_hat_builds_its_attention_mask_once_per_size_and_device(monkeypatch):
    """HAT's shifted-window mask was built on the CPU and copied to the network's device at every
    forward (a dozen operators and a copy that waits for the GPU, in every training step at one
    size). It is kept for the last size and device; a new size builds it again; outputs unchanged."""
    net = build(TINY['HAT']).eval()
    built = []
    calculate = net.calculate_mask
    monkeypatch.setattr(net, 'calculate_mask', lambda size: built.append(tuple(size)) or calculate(size))
    x, y = torch.rand(1, 3, 8, 8), torch.rand(1, 3, 12, 8)
    with torch.no_grad():
        first, again = net(x), net(x)
        other, back = net(y), net(x)
    assert built == [(8, 8), (12, 8), (8, 8)]
    assert torch.equal(first, again) and torch.equal(first, back)
    assert torch.equal(net.attention_mask((12, 8), torch.device('cpu')), calculate((12, 8)))
    assert '_attention_mask' not in str(net.state_dict().keys())      # not part of the checkpoint
    twin = copy.deepcopy(net)                                          # LDT's auxiliary is a deep copy
    with torch.no_grad():
        assert torch.equal(twin(x), first)
