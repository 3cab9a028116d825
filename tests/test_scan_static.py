"""The Triton scan kernels compiled for an H100 (sm_90) and an A100 (sm_80) without a GPU, as a
real launch would specialise them (scripts/scan_static_report.py): they compile, no kernel spills,
the chunk kernels fill an H100 (16 warps per SM at training, 8 at inference), the report finds the
sequence loops in the machine code and puts them per state update, and every offset into a tensor
sized by batch or length is computed in 64 bits.

Compiling is most of this file's time (about 2.5 min a set of six kernels on one core, with an
empty Triton cache), so the default run compiles one representative set per architecture:
sm_90 at a 1024x1024 image in bfloat16 (b*dim*L = 1.5e9 elements: the 64-bit offsets, the
inference launch) and sm_80 at MambaIR's x4 training shape in float32. Together they cover both
shapes, both dtypes MambaIR trains in and both architectures. ``BASICSR_LDT_STATIC_FULL=1`` also
compiles sm_90 at both shapes in both dtypes (four sets); ``python scripts/scan_static_report.py``
prints every combination (docs/development.md, "Tests and CI").
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip('triton', reason='triton is not installed (it ships with the Linux torch wheel)')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Small per-channel tensors (dim or dim x d_state elements), the only ones with 32-bit offsets.
PER_CHANNEL = {'A_ptr', 'D_ptr', 'bias_ptr'}
# The default run compiles sm_90 at the inference shape in bfloat16; BASICSR_LDT_STATIC_FULL=1 adds
# the training shape and float32 (see the module docstring).
FULL = os.environ.get('BASICSR_LDT_STATIC_FULL', '') not in ('', '0')
SM90_SHAPES = ('train', 'infer') if FULL else ('infer',)
SM90_DTYPES = ('fp32', 'bf16') if FULL else ('bf16',)


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


FIRSTS = {'forward': 'chunks from zero', 'backward': 'states, adjoints from zero'}
KERNELS = [f'{d}: {k}' for d, first in FIRSTS.items() for k in (first, 'carries')] + \
    ['forward: output', 'backward: gradients']


def _check(rows):
    """What every compiled set must show, on either architecture."""
    # SASS warp-instructions per state update of each direction's two chunk launches: the issue's
    # goals are 0.35 forward and 0.9 backward, met in float32 and bfloat16 on sm_90 (forward 0.343
    # and 0.3499, 0.347 and 0.354 with the softplus before; backward 0.879 and 0.885, 0.884 and
    # 0.888 before the states kernel's end-of-walk offsets, 1.24 and 1.29 when it walked each
    # chunk three times, 2.15 and 2.31 before that) and on sm_80 (0.343 and 0.882 in float32)
    for shape, combo in {(shape, combo) for shape, combo, _ in rows}:
        for direction, bound in (('forward', 0.35), ('backward', 0.89)):
            second = 'output' if direction == 'forward' else 'gradients'
            total = sum(rows[shape, combo, f'{direction}: {k}']['per_update'] for k in (FIRSTS[direction], second))
            assert total <= bound, (shape, combo, direction, total)
    for (shape, combo, kernel), row in rows.items():
        batch, chunks = (4, 36) if shape == 'train' else (1, 128)  # L/64, or at most 128 chunks
        if 'carries' in kernel:  # one program per 32 channels and batch element, walking the chunks
            assert row['programs'] == batch * 45 and row['per_update'] is None, row
        else:  # chunks x (4 groups x 12 blocks of 32 of 360 channels) x batch
            assert row['programs'] == chunks * 48 * batch, row
            assert row['launch_warps'] >= (16 if shape == 'train' else 8), row  # warps per SM
            assert 0 < row['per_update'] < 2.5, row  # SASS per state update (the old kernel: 2.5 bwd)
        assert 0 < row['registers'] <= 255, row
        assert row['loop_instructions'] and min(row['loop_instructions']) > 10, row
        assert 0 < row['launch_warps'] <= row['occupancy_warps'] <= 64, row
        assert set(row['narrow_offsets']) <= PER_CHANNEL, row
        assert row['spill_bytes'] == 0 and row['spill_instructions'] == 0, row
        assert row['fp_fusion'] is True, row  # asked for by every launch, whatever Triton's default
        # the time estimate: every limit of the model is read off this kernel's figures
        estimate = row['estimate']
        limits = ('chain',) if 'carries' in kernel else ('issue', 'mufu', 'memory')
        assert all(estimate[k] > 0 for k in limits + ('memory',)), row
        assert estimate['time'] == max(v for k, v in estimate.items() if k != 'time'), row


def test_kernels_compile_for_sm90_without_spills_and_with_64_bit_offsets(tmp_path):
    """An H100 at a 1024x1024 image in bfloat16 (with BASICSR_LDT_STATIC_FULL=1 also at the
    training shape, and in float32)."""
    rows, out = _report(tmp_path, '--arch', '90', '--shape', *SM90_SHAPES, '--dtype', *SM90_DTYPES,
                        '--combos', 'mambair')
    assert set(rows) == {(s, f'{d} bias+D', k) for s in SM90_SHAPES for d in SM90_DTYPES for k in KERNELS}
    assert 'not timings' in out and 'H100' in out
    assert all(row['arch'] == 90 for row in rows.values())
    _check(rows)


def test_kernels_compile_for_sm80_without_spills(tmp_path):
    """An A100 (sm_80) has fewer registers per SM to spare than an H100: the kernels at MambaIR's
    x4 training shape in float32 compile for it, spill nothing, keep 64-bit offsets, fill its SMs
    and meet the same instructions-per-update goals."""
    rows, out = _report(tmp_path, '--arch', '80', '--shape', 'train', '--dtype', 'fp32',
                        '--combos', 'mambair')
    assert set(rows) == {('train', 'fp32 bias+D', k) for k in KERNELS} and 'A100' in out
    assert all(row['arch'] == 80 for row in rows.values())
    _check(rows)
