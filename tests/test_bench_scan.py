"""bench_scan.py fails, not only prints, when a scan backend disagrees with its reference: one ``FAIL:``
line per backend and quantity over its bound, a PASS/FAIL summary, exit status 1. Run here on CPU
tensors through ``main --device cuda`` with stand-ins (torch's scan in each backend's place, a
deliberate error added where a test wants one), as tests/test_scan_triton.py runs the benchmark's
other logic; the real kernels' agreement is tested there."""
import argparse
import re
import sys

import pytest
import torch

from conftest import load_script

SMALL = ['--batch', '1', '--d-inner', '3', '--d-state', '3', '--side', '3', '--repeats', '1', '--warmup', '0',
         '--skip-loop']


class _ScaledGrad(torch.autograd.Function):
    """Identity forward; the gradient scaled by ``factor`` (a backend whose backward is off)."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


@pytest.fixture
def bench(monkeypatch):
    """bench_scan with ``--device cuda`` running on CPU tensors: 'triton' and 'cuda' are the torch scan
    (mamba-ssm 'not run'), versions and the GPU-only comparisons stubbed unless a test restores them."""
    module = load_script('bench_scan')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(module, 'versions', lambda device: 'versions')
    monkeypatch.setattr(module, 'available_backends', lambda device: [('triton', ''), ('cuda', 'no mamba-ssm')])
    real = {name: getattr(module, name) for name in ('compare_backends', 'compare_mambair', 'compare_bf16_call',
                                                     'sweep_triton')}
    monkeypatch.setattr(module, 'compare_backends',
                        lambda args, device: real['compare_backends'](args, torch.device('cpu')))
    monkeypatch.setattr(module, 'compare_mambair', lambda device: None)
    monkeypatch.setattr(module, 'compare_four_way', lambda device: None)   # tests/test_scan_four_way.py runs it
    monkeypatch.setattr(module, 'compare_bf16_call', lambda args, device: None)
    monkeypatch.setattr(module, 'sweep_triton',
                        lambda args, device, configs: real['sweep_triton'](args, torch.device('cpu'), configs))
    module.real = real
    return module


def _triton_is(bench, monkeypatch, wrong):
    """'triton' = torch's scan passed through ``wrong(inputs) -> inputs, output -> output``."""
    torch_scan = bench.backend_fn('torch')

    def backend_fn(name):
        if name != 'triton':
            return torch_scan
        return lambda *inputs: wrong['output'](torch_scan(*wrong['inputs'](inputs)))
    monkeypatch.setattr(bench, 'backend_fn', backend_fn)


def _main(bench, monkeypatch, *argv):
    monkeypatch.setattr(sys, 'argv', ['bench_scan.py', '--device', 'cuda', *argv])
    try:
        bench.main()
    except SystemExit as exit:
        return exit.code
    return 0


def _fail_lines(out):
    return [line for line in out.splitlines() if line.startswith('FAIL')]


def test_backends_that_agree_with_the_float64_reference_pass_and_exit_0(bench, monkeypatch, capsys):
    _triton_is(bench, monkeypatch, {'inputs': lambda x: x, 'output': lambda y: y})
    assert _main(bench, monkeypatch, *SMALL) == 0
    out = capsys.readouterr().out
    assert _fail_lines(out) == []
    assert out.splitlines()[-1] == ('reference check: PASS (16 quantities within their bounds: float32 scans 1e-04 '
                                    'of float64, networks 1e-03 of the torch backend, bf16 calls 2e-02 of float32 '
                                    'copies)')


def test_a_wrong_gradient_is_one_fail_line_naming_backend_and_quantity_and_exits_1(bench, monkeypatch, capsys):
    """Only B's gradient off by 5%: one FAIL line (triton, grad B, its value and bound), the summary
    says FAIL and names it, the exit status is 1; torch and every other quantity still pass."""
    _triton_is(bench, monkeypatch, {'inputs': lambda x: x[:3] + (_ScaledGrad.apply(x[3], 1.05),) + x[4:],
                                    'output': lambda y: y})
    assert _main(bench, monkeypatch, *SMALL) == 1
    out = capsys.readouterr().out
    fails = _fail_lines(out)
    assert len(fails) == 1, out
    line = re.fullmatch(r'FAIL: triton at batch 1, L 9 grad B: max \|diff\| / max \|float64 reference\| (\S+) > '
                        r'bound 1e-04', fails[0])
    assert line and float(line.group(1)) == pytest.approx(0.05, rel=1e-3), fails
    assert re.fullmatch(r'reference check: FAIL \(1 of 16 quantities over their bounds: triton at batch 1, L 9 grad B '
                        r'5\.0e-02\)', out.splitlines()[-1]), out
    assert re.search(r'^triton +fwd\+bwd: median', out, re.M)    # the timings are still there


def test_a_small_error_within_the_bound_passes_and_nan_fails(bench, monkeypatch, capsys):
    _triton_is(bench, monkeypatch, {'inputs': lambda x: x, 'output': lambda y: y * (1 + 2e-5)})
    assert _main(bench, monkeypatch, *SMALL) == 0 and _fail_lines(capsys.readouterr().out) == []
    _triton_is(bench, monkeypatch, {'inputs': lambda x: x, 'output': lambda y: y * float('nan')})
    assert _main(bench, monkeypatch, *SMALL) == 1
    fails = _fail_lines(capsys.readouterr().out)
    assert fails[0] == 'FAIL: triton at batch 1, L 9 output: max |diff| / max |float64 reference| nan > bound 1e-04'
    assert len(fails) == 8                       # the output and all seven gradients


def test_a_wrong_sweep_configuration_fails_the_sweep(bench, monkeypatch, capsys):
    """--sweep: a launch configuration whose output is off by 1% is marked WRONG (as before) and now
    also fails the run, per quantity; a sweep of correct configurations passes."""
    from archs.scan import triton_launches
    torch_scan = bench.backend_fn('torch')
    monkeypatch.setattr(bench, 'backend_fn', lambda name: torch_scan if name != 'triton' else
                        (lambda *x: torch_scan(*x) * (1.01 if triton_launches.CHUNK == 4 else 1.0)))
    assert _main(bench, monkeypatch, *SMALL, '--sweep-tile', '0', '--sweep', '8,2,1,1,4,1,1') == 0
    out = capsys.readouterr().out
    assert _fail_lines(out) == [] and out.splitlines()[-1].startswith('reference check: PASS (8 quantities')
    assert _main(bench, monkeypatch, *SMALL, '--sweep-tile', '0', '--sweep', '8,2,1,1,4,1,1', '4,1,1,2,2,1,3') == 1
    out = capsys.readouterr().out
    fails = _fail_lines(out)
    assert len(fails) == 8 and all(f.startswith('FAIL: sweep 4,1,1,2,2,1,3 ') for f in fails), fails
    assert fails[0].startswith('FAIL: sweep 4,1,1,2,2,1,3 output: max |diff| / max |float64 reference| 1.0e-02 > ')
    assert re.search(r'^sweep 4,1,1,2,2,1,3: .* WRONG', out, re.M)
    assert out.splitlines()[-1].startswith('reference check: FAIL (8 of 16 quantities over their bounds: sweep '
                                           '4,1,1,2,2,1,3 output 1.0e-02; ')


def test_a_bf16_call_over_its_looser_bound_fails(bench, monkeypatch, capsys):
    """The bf16 call is held to BF16_BOUND (2%) against the float32 copies: 0.5% off passes (with the
    bf16 rounding of the gradients on top), 5% off fails in the output and every gradient."""
    real_scan = bench.selective_scan
    error = {'factor': 1.0}

    def stand_in(u, dl, A, B, C, D, z, db, softplus, backend=None, out_dtype=None):
        y = real_scan(u.float(), dl.float(), A, B.float(), C.float(), D, z, db, softplus, backend='torch')
        return y * error['factor'] if out_dtype is not None else y
    monkeypatch.setattr(bench, 'selective_scan', stand_in)
    monkeypatch.setattr(bench, 'compare_bf16_call', lambda args, device: bench.real['compare_bf16_call'](
        args, torch.device('cpu')))
    monkeypatch.setattr(bench, 'compare_backends', lambda args, device: None)
    error['factor'] = 1.005
    assert _main(bench, monkeypatch, *SMALL) == 0
    assert _fail_lines(capsys.readouterr().out) == []
    error['factor'] = 1.05
    assert _main(bench, monkeypatch, *SMALL) == 1
    fails = _fail_lines(capsys.readouterr().out)
    assert [f.split(':')[1] for f in fails] == [f' bf16 call triton vs float32 copies {q}' for q in bench.QUANTITIES]
    assert fails[0].endswith("max |diff| / max |float32 copies' call| 5.0e-02 > bound 2e-02")


def test_a_network_on_a_backend_over_its_bound_fails(bench, monkeypatch, capsys):
    """A small MambaIR on 'triton' whose output is 1% off the torch backend's (the scan inside it is
    torch's here): the output and the gradients fail NETWORK_BOUND; 0.01% off passes."""
    import archs
    real_net = archs.MambaIR
    error = {'factor': 1.0}

    class Net(real_net):
        def __init__(self, *args, scan_backend='torch', **kwargs):
            super().__init__(*args, scan_backend='torch', **kwargs)
            self.off = scan_backend == 'triton'

        def forward(self, x):
            out = super().forward(x)
            return out * error['factor'] if self.off else out
    monkeypatch.setattr(archs, 'MambaIR', Net)
    monkeypatch.setattr(bench, 'compare_backends', lambda args, device: None)
    monkeypatch.setattr(bench, 'compare_mambair', lambda device: bench.real['compare_mambair'](
        torch.device('cpu'), ('torch', 'triton'), embed_dim=30, d_state=3, size=(5, 3), blocks=1))
    error['factor'] = 1.0001
    assert _main(bench, monkeypatch, *SMALL) == 0
    out = capsys.readouterr().out
    assert _fail_lines(out) == [] and 'reference check: PASS' in out
    error['factor'] = 1.01
    assert _main(bench, monkeypatch, *SMALL) == 1
    fails = _fail_lines(capsys.readouterr().out)
    assert fails[0] == ('FAIL: MambaIR scan_backend triton vs torch output: max |diff| / max |torch backend| 1.0e-02 > '
                        'bound 1e-03')
    assert any(' grad conv_first.weight: ' in f for f in fails), fails   # gradients named by parameter


def test_the_cpu_timing_and_launch_overhead_compare_nothing_and_print_no_summary(monkeypatch, capsys):
    bench = load_script('bench_scan')
    monkeypatch.setattr(sys, 'argv', ['bench_scan.py', '--launch-overhead', '--side', '2', '--d-inner', '4'])
    bench.main()
    assert 'reference check' not in capsys.readouterr().out
    assert bench.CHECK.finish() == 0


def test_the_check_itself_bounds_each_quantity_inclusively():
    bench = load_script('bench_scan')
    check = bench.ReferenceCheck()
    assert check.check('x', ['a', 'b'], [1e-4, 0.0], 1e-4, 'ref')
    assert not check.check('y', ['a', 'b'], [0.0, 2e-4], 1e-4, 'ref')
    assert (check.checked, check.failures) == (4, ['y b 2.0e-04'])
    assert check.finish() == 1
