"""scripts/demo_calibration.py: the three calibration checks read from test.py / study.py results."""
import json

from conftest import load_script

cal = load_script('demo_calibration')
CAMERAS = ('Clean', 'Olympus', 'Pan', 'Sony')


def write(tmp_path, start_gain=1.0, ft_gain=0.8, ldt_pan=24.0):
    bicubic = {c: {'psnr': 23.0, 'ssim': 0.6} for c in CAMERAS}
    pretrained = {c: {'psnr': 23.0 + start_gain, 'ssim': 0.7} for c in CAMERAS}
    metrics = {'summary': {'Bicubic': dict(bicubic, Mean={'psnr': 23.0, 'ssim': 0.6}), 'Pretrained': pretrained}}

    def row(method, pan):
        cams = {'Olympus': 23.0 + start_gain + ft_gain, 'Pan': pan, 'Sony': 24.5, 'Mean': 0.0}
        return {'method': method, 'sweep': {}, 'n': 5, 'sources': ['Olympus'],
                'cameras': {c: {'psnr': {'mean': v, 'std': 0.01}} for c, v in cams.items()}}
    study = {'summary': [row('FT', 24.2), row('LDT', ldt_pan)]}
    (tmp_path / 'metrics.json').write_text(json.dumps(metrics))
    (tmp_path / 'study.json').write_text(json.dumps(study))
    return ['--pretrained', str(tmp_path / 'metrics.json'), '--study', str(tmp_path / 'study.json')]


def test_passing_results_pass(tmp_path, capsys):
    assert cal.main(write(tmp_path) + ['--strict']) == 0
    out = capsys.readouterr().out
    assert 'FAIL' not in out and 'calibration: every check passes' in out
    assert 'Olympus   24.80 vs  24.00  +0.80 dB  PASS' in out


def test_each_failing_check_is_named_with_its_numbers(tmp_path, capsys):
    args = write(tmp_path, start_gain=-0.1, ft_gain=0.08, ldt_pan=22.9)
    assert cal.main(args) == 0                        # reports, does not stop demo.sh
    assert cal.main(args + ['--strict']) == 1
    out = capsys.readouterr().out
    assert 'Pan       22.90 vs  23.00  -0.10 dB  FAIL' in out
    assert 'Olympus   22.98 vs  22.90  +0.08 dB  FAIL' in out
    assert 'LDT      worst Pan -0.10 dB over 2 targets  FAIL: Pan' in out


def test_the_regime_s_thresholds_a_small_start_gain_passes_a_still_ft_fails(tmp_path, capsys):
    """Any gain of the start over bicubic passes (check 1); FT must move the source by 0.1 dB (check 2)."""
    assert cal.main(write(tmp_path, start_gain=0.01, ft_gain=0.1) + ['--strict']) == 0
    assert 'Pan       23.01 vs  23.00  +0.01 dB  PASS' in capsys.readouterr().out
    assert cal.main(write(tmp_path, start_gain=0.5, ft_gain=0.09) + ['--strict']) == 1
    assert 'Olympus   23.59 vs  23.50  +0.09 dB  FAIL' in capsys.readouterr().out
    assert cal.main(write(tmp_path, start_gain=0.0, ft_gain=0.5) + ['--strict']) == 1
    assert 'Pan       23.00 vs  23.00  +0.00 dB  FAIL' in capsys.readouterr().out


def test_missing_results_are_one_clear_error(tmp_path, capsys):
    assert cal.main(['--pretrained', str(tmp_path / 'nope.json'), '--study', str(tmp_path / 's.json')]) == 2
    assert "nope.json' does not exist: run test.py -opt options/demo/test_demo_pretrained.yml first" in capsys.readouterr().err
