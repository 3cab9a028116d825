"""The Triton scan kernels compiled for an H100 (sm_90) without a GPU, as a real launch would
specialise them (scripts/scan_static_report.py), at MambaIR's x4 training shape and at a
1024x1024 image (b*dim*L = 1.5e9 elements): they compile, the forward kernel does not spill, the
report finds the sequence loops in the machine code, and every offset into a tensor sized by
batch or length is computed in 64 bits."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip('triton', reason='triton is not installed (it ships with the Linux torch wheel)')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Small per-channel tensors (dim or dim x d_state elements), the only ones with 32-bit offsets.
PER_CHANNEL = {'A_ptr', 'D_ptr', 'bias_ptr'}


def _report(tmp_path, *args):
    out = tmp_path / 'rows.json'
    # The report compiles, so Triton's interpreter (set by conftest.py without a GPU) is off there.
    run = subprocess.run([sys.executable, 'scripts/scan_static_report.py', *args, '--json', str(out)],
                         cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, TRITON_INTERPRET='0'))
    if run.returncode == 77:
        pytest.skip(run.stderr.strip())
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return {(r['shape'], r['combo'], r['kernel']): r for r in json.loads(out.read_text())}, run.stdout


def test_kernels_compile_for_sm90_without_spills_in_forward_and_with_64_bit_offsets(tmp_path):
    rows, out = _report(tmp_path, '--arch', '90', '--shape', 'train', 'infer', '--dtype', 'fp32',
                        'bf16', '--combos', 'mambair')
    assert set(rows) == {(s, c, k) for s in ('train', 'infer') for c in ('fp32 bias+D', 'bf16 bias+D')
                         for k in ('forward', 'backward')}
    assert 'not timings' in out
    for (shape, combo, kernel), row in rows.items():
        batch = 4 if shape == 'train' else 1
        assert row['programs'] == batch * 4 * 23 and row['warps_per_program'] >= 1, row  # b x G x blocks
        assert 0 < row['registers'] <= 255, row
        assert row['loop_instructions'] and min(row['loop_instructions']) > 10, row
        assert 0 < row['launch_warps'] <= row['occupancy_warps'] <= 64, row
        assert set(row['narrow_offsets']) <= PER_CHANNEL, row
        if kernel == 'forward':
            assert row['spill_bytes'] == 0 and row['spill_instructions'] == 0, row
