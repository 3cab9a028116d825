"""The Triton scan's launch settings as the GPU sweep and the static report change them: one
configuration text read into every setting, a bad one refused before any work, and a changed
setting seen by the next launch and restored afterwards (fast: no kernel runs, launches are
described on the ``meta`` device)."""
import pytest
import torch

pytest.importorskip('triton', reason='triton is not installed (it ships with the Linux torch wheel)')

import archs.scan.triton_launches as launches  # noqa: E402

NAMES = ('CHUNK', 'FORWARD_BLOCK_D', 'FORWARD_WARPS', 'FORWARD_STAGES', 'BACKWARD_BLOCK_D', 'BACKWARD_WARPS',
         'BACKWARD_STAGES')


def current():
    return {name: getattr(launches, name) for name in NAMES}


def forward_on_meta(dim=32, length=40, dstate=4):
    """The forward launch for MambaIR-like shapes: (b, d, L) inputs, (d, n) A, (b, 1, n, L) B and C."""
    meta = dict(device='meta')
    u = torch.empty(1, dim, length, **meta)
    A = torch.empty(dim, dstate, **meta)
    bc = torch.empty(1, 1, dstate, length, **meta)
    return launches.forward_launch(u, torch.empty_like(u), A, bc, bc, None, None, None, True)


def test_the_settings_are_the_sweeps_fields_in_its_order():
    assert launches.LAUNCH_SETTINGS == NAMES


@pytest.mark.parametrize('text, expected', [
    ('16,4,2,1,4,2,1', (16, 4, 2, 1, 4, 2, 1)),
    ('8,32,4,3,16,8,2', (8, 32, 4, 3, 16, 8, 2)),
    (' 8, 2,1 ,1,4 ,1,1 ', (8, 2, 1, 1, 4, 1, 1)),   # spaces around a field, as a shell list may leave them
])
def test_a_sweep_configuration_names_each_setting_in_order(text, expected):
    before = current()
    assert launches.parse_launch_settings(text) == dict(zip(NAMES, expected))
    assert current() == before   # reading a configuration changes no setting


@pytest.mark.parametrize('text, message', [
    ('16,4,2,1,4,2', "'16,4,2,1,4,2': expected 7 integers CHUNK,FORWARD_BLOCK_D,FORWARD_WARPS,FORWARD_STAGES,"
                     'BACKWARD_BLOCK_D,BACKWARD_WARPS,BACKWARD_STAGES'),
    ('16,4,2,1,4,2,1,1', "'16,4,2,1,4,2,1,1': expected 7 integers"),
    ('16,4,2,x,4,2,1', "'16,4,2,x,4,2,1': expected 7 integers"),
    ('16,4,2,-1,4,2,1', "'16,4,2,-1,4,2,1': expected 7 integers"),
    ('16,4,2,,4,2,1', "'16,4,2,,4,2,1': expected 7 integers"),
    ('16,4,2,1.5,4,2,1', "'16,4,2,1.5,4,2,1': expected 7 integers"),
    ('16,4,2,1,4,2,0', "'16,4,2,1,4,2,0': Triton scan launch setting BACKWARD_STAGES: expected an integer >= 1, got 0"),
    ('0,4,2,1,4,2,1', "'0,4,2,1,4,2,1': Triton scan launch setting CHUNK: expected an integer >= 1, got 0"),
])
def test_a_bad_sweep_configuration_is_one_error_naming_it(text, message):
    before = current()
    with pytest.raises(ValueError) as caught:
        launches.parse_launch_settings(text)
    assert str(caught.value).startswith(message), str(caught.value)
    assert '\n' not in str(caught.value)
    assert current() == before


def test_changed_settings_reach_the_next_launch_and_are_restored():
    default = forward_on_meta().launch
    before = current()
    with launches.launch_settings(CHUNK=8, FORWARD_BLOCK_D=8, FORWARD_WARPS=4, FORWARD_STAGES=3):
        assert current() == {**before, 'CHUNK': 8, 'FORWARD_BLOCK_D': 8, 'FORWARD_WARPS': 4, 'FORWARD_STAGES': 3}
        launch = forward_on_meta().launch
    assert (launch.constexprs['T'], launch.constexprs['BLOCK_D'], launch.num_warps, launch.constexprs['STAGES']) == \
        (8, 8, 4, 3)
    assert launch.grid == (1, 32 // 8)
    assert current() == before
    again = forward_on_meta().launch
    assert (again.constexprs, again.num_warps, again.grid) == (default.constexprs, default.num_warps, default.grid)


def test_settings_are_restored_when_the_block_fails():
    before = current()
    with pytest.raises(RuntimeError, match='compile failed'):
        with launches.launch_settings(BACKWARD_STAGES=4, BACKWARD_WARPS=8):
            assert (launches.BACKWARD_STAGES, launches.BACKWARD_WARPS) == (4, 8)
            raise RuntimeError('compile failed')
    assert current() == before


def test_the_smallest_setting_is_one():
    with launches.launch_settings(FORWARD_STAGES=1, BACKWARD_WARPS=1):
        assert (launches.FORWARD_STAGES, launches.BACKWARD_WARPS) == (1, 1)


@pytest.mark.parametrize('values, message', [
    ({'STAGES': 2}, "unknown Triton scan launch setting 'STAGES'; expected one of CHUNK, FORWARD_BLOCK_D, "
                    'FORWARD_WARPS, FORWARD_STAGES, BACKWARD_BLOCK_D, BACKWARD_WARPS, BACKWARD_STAGES'),
    ({'MAX_GRID_Y': 2}, "unknown Triton scan launch setting 'MAX_GRID_Y'"),   # a module constant, not a setting
    ({'FORWARD_WARPS': 0}, 'Triton scan launch setting FORWARD_WARPS: expected an integer >= 1, got 0'),
    ({'FORWARD_WARPS': -2}, 'Triton scan launch setting FORWARD_WARPS: expected an integer >= 1, got -2'),
    ({'CHUNK': 16.0}, 'Triton scan launch setting CHUNK: expected an integer >= 1, got 16.0'),
    ({'CHUNK': '16'}, "Triton scan launch setting CHUNK: expected an integer >= 1, got '16'"),
    ({'FORWARD_STAGES': True}, 'Triton scan launch setting FORWARD_STAGES: expected an integer >= 1, got True'),
    # Checked before anything changes: a good setting beside a bad one is not applied either.
    ({'CHUNK': 8, 'BACKWARD_STAGES': 0}, 'Triton scan launch setting BACKWARD_STAGES: expected an integer >= 1'),
])
def test_a_bad_setting_is_refused_and_nothing_changes(values, message):
    before = current()
    with pytest.raises(ValueError) as caught:
        with launches.launch_settings(**values):
            pytest.fail('the block ran with a bad setting')
    assert str(caught.value).startswith(message), str(caught.value)
    assert current() == before
