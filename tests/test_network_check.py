"""``network_g`` values, and one small image through the network, before a run writes anything: a bad
value was a torch traceback after the experiment folder and log existed, or (``n_blocks: 0``,
``depths: [0]``, ``mlp_ratio: 0``) a run of a network without a body (an audit of about 95 values)."""
import pytest
import torch
import yaml

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.models.network_check import probe_network
from test_cli import NETWORK, train_options, write

SAFMN = {'type': 'SAFMN', 'dim': 8, 'n_blocks': 1, 'upscaling_factor': 4}
HAT = {'type': 'HAT', 'img_size': 16, 'window_size': 4, 'embed_dim': 12, 'depths': [1], 'num_heads': [2],
       'squeeze_factor': 4, 'compress_ratio': 3, 'mlp_ratio': 2, 'upsampler': 'pixelshuffle', 'upscale': 4}
MAMBAIR = {'type': 'MambaIR', 'img_size': 16, 'embed_dim': 30, 'depths': [1], 'd_state': 4, 'mlp_ratio': 2,
           'upsampler': 'pixelshuffle', 'upscale': 4}


@pytest.mark.parametrize('network, change, message', [
    (SAFMN, {'n_blocks': 0}, 'network_g.n_blocks: expected an integer >= 1, got 0'),           # ran without a body
    (SAFMN, {'n_blocks': True}, 'network_g.n_blocks: expected an integer >= 1, got True'),     # ran with one block
    (SAFMN, {'dim': '8'}, "network_g.dim: expected an integer >= 1, got '8'"),
    (SAFMN, {'dim': 10}, 'network_g.dim: 10, but SAFMN splits its channels into 4 levels: use a multiple of 4'),
    (SAFMN, {'ffn_scale': 0}, 'network_g.ffn_scale: expected a number in (0, inf), got 0'),
    (HAT, {'depths': [0]}, 'network_g.depths: expected a non-empty list, each an integer >= 1, got [0]'),
    (HAT, {'mlp_ratio': 0}, 'network_g.mlp_ratio: expected a number in (0, inf), got 0'),   # MLPs were their biases
    (HAT, {'img_range': 0}, 'network_g.img_range: expected a number in (0, inf), got 0'),
    (HAT, {'in_chans': 1}, 'network_g.in_chans: expected 3 (the data is RGB), got 1'),
    (HAT, {'num_heads': 2}, 'network_g.num_heads: expected a non-empty list, each an integer >= 1, got 2'),
    (HAT, {'num_heads': [5]}, 'network_g.num_heads: 5 does not divide embed_dim 12'),
    (HAT, {'squeeze_factor': 30}, 'network_g.embed_dim: 12 // squeeze_factor 30 leaves no channel: use embed_dim >= 30'),
    (HAT, {'compress_ratio': 24}, 'network_g.embed_dim: 12 // compress_ratio 24 leaves no channel'),
    (HAT, {'window_size': 3}, 'network_g.overlap_ratio: int(window_size 3 x overlap_ratio 0.5) = 1 is odd'),
    (HAT, {'depths': [1, 1]}, 'network_g type HAT: cannot be built: ValueError: num_heads [2] must have one entry per '
                              'group in depths [1, 1]'),
    (MAMBAIR, {'embed_dim': 24}, "network_g.embed_dim: 24, but MambaIR's channel attention divides it by 30"),
    (MAMBAIR, {'d_state': 0}, 'network_g.d_state: expected an integer >= 1, got 0'),
    (MAMBAIR, {'upsampler': ''}, "network_g type MambaIR: a 16x16 RGB image comes out (1, 3, 16, 16), and scale 4 "
                                 "needs (1, 3, 64, 64) (upsampler '')"),
    (MAMBAIR, {'scan_backend': 'cuda'}, "network_g.scan_backend: 'cuda' runs on CUDA tensors, and this run is on the "
                                        "CPU: use 'auto' (or 'torch')"),
    (MAMBAIR, {'scan_backend': 'triton'}, "network_g.scan_backend: 'triton' runs on CUDA tensors"),
    (MAMBAIR, {'scan_backend': 'fast'}, "network_g.scan_backend='fast': expected one of"),
    (HAT, {'window_size': 32}, 'network_g type HAT: a 16x16 RGB image fails in its forward: IndexError: index '),
    # embed_dim left to its default (96), as upstream's files do for HAT-S
    (HAT, {'overlap_ratio': 0.75}, 'network_g.overlap_ratio: int(window_size 4 x overlap_ratio 0.75) = 3 is odd'),
    ({k: v for k, v in HAT.items() if k != 'embed_dim'}, {'squeeze_factor': 100, 'num_heads': [6]},
     'network_g.embed_dim: 96 // squeeze_factor 100 leaves no channel: use embed_dim >= 100'),
    (NETWORK, {'num_block': 0}, 'network_g.num_block: expected an integer >= 1, got 0'),
    (NETWORK, {'upscale': 8}, 'network_g.upscale: expected one of 2, 3, 4, got 8'),   # an AttributeError at build
])
def test_a_bad_network_value_is_one_line_naming_the_key(network, change, message):
    with pytest.raises(InputError) as err:
        probe_network({**network, **change}, 4)
    assert str(err.value).startswith(message), str(err.value)
    assert '\n' not in str(err.value)
    probe_network(network, 4)


@pytest.mark.parametrize('network', [
    {**HAT, 'window_size': 5},            # does not divide img_size: HAT pads its input
    {**HAT, 'overlap_ratio': 0},          # an ablation value
    {**MAMBAIR, 'scan_backend': 'torch'},
    {**{k: v for k, v in HAT.items() if k != 'squeeze_factor'}, 'embed_dim': 30, 'num_heads': [6]},   # 30 // 30
    {**MAMBAIR, 'upsampler': '', 'upscale': 1},   # a same-size (denoising) network at scale 1
    {'type': 'EDSR', 'num_in_ch': 3, 'num_out_ch': 3, 'num_feat': 8, 'num_block': 1, 'upscale': 4},   # no value table
])
def test_values_that_run_are_accepted(network):
    probe_network(network, network['upscale'])


def test_the_scale_defaults_to_the_networks_own_and_a_cuda_scan_passes_for_a_cuda_run():
    probe_network({**SAFMN, 'upscaling_factor': 2})
    probe_network({k: v for k, v in SAFMN.items() if k != 'upscaling_factor'})   # its default, 4
    with pytest.raises(InputError, match=r"needs \(1, 3, 32, 32\) \(upsampler ''\)$"):   # MambaIR's default upscale 2
        probe_network({k: v for k, v in MAMBAIR.items() if k not in ('upscale', 'upsampler')})
    # HAT's defaults for what a file leaves out (heads, squeeze and compress ratios, embed_dim 96)
    probe_network({'type': 'HAT', 'img_size': 16, 'window_size': 4, 'depths': [1], 'num_heads': [6],
                   'upsampler': 'pixelshuffle', 'upscale': 4})
    probe_network({'type': 'HAT', 'img_size': 16, 'window_size': 4, 'depths': [1, 1, 1, 1], 'upsampler': 'pixelshuffle',
                   'upscale': 4})
    with pytest.raises(InputError, match=r'^network_g.overlap_ratio: int\(window_size 7 x overlap_ratio 0.5\) = 3 is odd'):
        probe_network({k: v for k, v in HAT.items() if k != 'window_size'})   # upstream's default window 7: OCAB fails
    with pytest.raises(InputError, match=r'needs \(1, 3, 64, 64\)'):
        probe_network({**SAFMN, 'upscaling_factor': 2}, 4)
    probe_network({**MAMBAIR, 'scan_backend': 'cuda'}, 4, device_type='cuda')   # the probe itself scans in torch


def test_the_probe_leaves_the_runs_random_numbers_alone():
    """The probe builds and runs a network after the run seeded torch: its draws must not move the run's
    weights and crops (the demo's figures are reproduced to the bit)."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    probe_network(SAFMN, 4)
    assert torch.equal(torch.rand(3), expected)


def test_training_refuses_a_bad_network_before_the_experiment_folder(project, demo_data, monkeypatch, capsys):
    """Was a torch traceback at the first forward, with experiments/<name> and its log left behind."""
    from basicsr_ldt.pipelines.train import train_pipeline
    opt = train_options(demo_data, 'bad_net', total_iter=1, network_g={**SAFMN, 'dim': 9})
    monkeypatch.setattr('sys.argv', ['Train_pip.py', '-opt', write(project / 'bad_net.yml', opt)])
    with pytest.raises(SystemExit):
        train_pipeline(str(project))
    assert 'error: network_g.dim: 9, but SAFMN splits its channels' in capsys.readouterr().err
    assert not (project / 'experiments' / 'bad_net').exists()


def test_a_traceback_while_setting_up_training_leaves_nothing_behind(project, demo_data, monkeypatch):
    """Anything but InputError raised after the folder was made (a bug, Ctrl-C) still rolls it back."""
    import basicsr_ldt.pipelines.train as train

    def broken(opt):
        raise RuntimeError('broken model')
    monkeypatch.setattr(train, '_build_model', broken)
    opt = train_options(demo_data, 'broken', total_iter=1)
    monkeypatch.setattr('sys.argv', ['Train_pip.py', '-opt', write(project / 'broken.yml', opt)])
    with pytest.raises(RuntimeError, match='broken model'):
        train.train_pipeline(str(project))
    assert not (project / 'experiments' / 'broken').exists()


def test_testing_and_the_api_refuse_a_network_that_cannot_upscale(project, demo_data, tmp_path, monkeypatch, capsys):
    """test.py tested a MambaIR without an upsampler into an AssertionError after results/ existed; load_network
    gave a network that wrote an x4-named image at the input size."""
    from basicsr_ldt import load_network
    from basicsr_ldt.pipelines.evaluate import test_pipeline
    from test_cli import dataset
    network = {**MAMBAIR, 'upsampler': ''}
    checkpoint = tmp_path / 'net.pth'
    torch.save({'params': {}}, checkpoint)
    opt = {'name': 'no_upsampler', 'scale': 4, 'num_gpu': 0, 'network_g': network, 'path': {'strict_load_g': False},
           'datasets': {'test_1': dataset(demo_data, 'Test', ['Sony'])}, 'checkpoints': [{'path': str(checkpoint)}]}
    monkeypatch.setattr('sys.argv', ['test.py', '-opt', write(project / 'no_upsampler.yml', opt)])
    with pytest.raises(SystemExit):
        test_pipeline(str(project))
    assert "error: network_g type MambaIR: a 16x16 RGB image comes out (1, 3, 16, 16)" in capsys.readouterr().err
    assert not (project / 'results' / 'no_upsampler').exists()
    (tmp_path / 'net.yml').write_text(yaml.safe_dump({'scale': 4, 'network_g': {**network, 'upscale': 4}}))
    with pytest.raises(InputError, match=r'^network_g type MambaIR: a 16x16 RGB image comes out'):
        load_network(str(checkpoint), opt=str(tmp_path / 'net.yml'), device='cpu')
