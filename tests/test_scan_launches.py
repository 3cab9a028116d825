"""The Triton scan's launch settings as the GPU sweep and the static report change them: one
configuration text read into every setting, a bad one refused before any work, and a changed
setting seen by the next launch and restored afterwards (fast: no kernel runs, launches are
described on the ``meta`` device)."""
import contextlib
import math

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
    assert launch.grid == (1, 32 // 8, 1)
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


def _named(launch):
    """The launch's arguments by the kernel's own parameter names (``@triton.jit`` keeps them)."""
    return {**dict(zip(launch.kernel.arg_names, launch.args)), **launch.constexprs}


def _ceil(a, b):
    return -(-a // b)


def _as_grouped(m):
    """A varying B or C in the kernels' (b, G, n, L) form: a (b, n, L) one is one group."""
    return m[:, None] if m.dim() == 3 else m


@pytest.mark.parametrize('b_form, c_form, options', [
    ('grouped_view', 'grouped', 'D z bias'),   # MambaIR's call: B a strided view of one projection
    ('const', 'shared', ''),
    ('shared', 'const', 'z'),
])
def test_each_kernel_parameter_gets_what_its_name_says(b_form, c_form, options):
    """The launches hand the kernels their arguments by position; read back by the kernels'
    parameter names, each carries its meaning for these inputs: sizes, the chunk count, the
    finest grouping of B and C, each one's channels per group and strides (zeros for a constant
    one), the flags of the optional inputs, and outputs of the right shapes and dtypes.
    Mutation testing (issue #38): kills the mutants that passed a ``None`` pointer for an absent D, z,
    bias or unsaved chunk states, dropped B's grouping or a stride, ignored the caller's chunk or
    channel block, allocated the output in delta's dtype instead of u's, or counted the static report's
    traffic wrong."""
    batch, dim, length, dstate, chunk, block_d = 2, 12, 37, 5, 4, 2   # not the defaults (8, 4 / 8)
    meta = dict(device='meta')
    u = torch.empty(batch, dim, length, **meta)
    A = torch.empty(dim, dstate, **meta)
    # (b, G=3, dt + B + C rows, L): B starts 4 rows in, 4 x 37 float32 = 16-byte aligned
    projection = torch.empty(batch, 3, 4 + 2 * dstate, length, **meta)

    def form(kind, groups):
        return {'grouped_view': projection[:, :, 4:4 + dstate],
                'grouped': torch.empty(batch, groups, dstate, length, **meta),
                'shared': torch.empty(batch, dstate, length, **meta),
                'const': torch.empty(dim, dstate, **meta)}[kind]
    B, C = form(b_form, 3), form(c_form, 2)
    # D and bias given in bf16, which the kernels must read as float32 copies
    given = {name: (torch.empty(*shape, dtype=dtype, **meta) if name in options.split() else None)
             for name, shape, dtype in (('D', (dim,), torch.bfloat16), ('z', (batch, dim, length), torch.float32),
                                        ('bias', (dim,), torch.bfloat16))}
    fwd = launches.forward_launch(u, torch.empty_like(u), A, B, C, given['D'], given['z'], given['bias'], True,
                                  chunk=chunk, block_d=block_d, out_dtype=torch.float32)
    dlast = torch.empty(batch, dim, dstate, **meta)
    bwd = launches.backward_launch(u.bfloat16(), u.bfloat16(), A, B, C, given['D'], given['z'], given['bias'],
                                   fwd.outputs['states'], u, dlast, True, chunk=chunk, block_d=block_d)

    def groups_of(m):
        return m.shape[1] if m.dim() == 4 else (1 if m.dim() == 3 else None)
    finest = math.lcm(*(g for g in (groups_of(B), groups_of(C)) if g is not None))
    group_size = dim // finest
    block = min(block_d, 1 << (group_size - 1).bit_length())
    for launch, stages, warps in ((fwd.launch, launches.FORWARD_STAGES, launches.FORWARD_WARPS),
                                  (bwd.launch, launches.BACKWARD_STAGES, launches.BACKWARD_WARPS)):
        args = _named(launch)
        assert (args['dim'], args['length'], args['dstate'], args['n_chunks'], args['T']) == \
            (dim, length, dstate, _ceil(length, chunk), chunk)
        assert (args['group_size'], args['BLOCK_D'], args['blocks_per_group']) == \
            (group_size, block, _ceil(group_size, block))
        assert launch.grid[:2] == (batch, finest * _ceil(group_size, block))
        assert launch.grid[2:] == ((1,) if launch is fwd.launch else ())   # one segment: a backward follows
        assert args['BLOCK_N'] == 8 and args['flag'] == 1 and args['SOFTPLUS'] is True
        assert (args['STAGES'], launch.num_warps) == (stages, warps)
        for name, m in (('b', B), ('c', C)):
            varying = m.dim() != 2
            view = _as_grouped(m)
            assert args[f'VAR_{name.upper()}'] is varying
            assert args[f'{name}_chans'] == (dim // view.shape[1] if varying else group_size)
            assert (args[f'{name}_stride_b'], args[f'{name}_stride_g'], args[f'{name}_stride_n']) == \
                ((view.stride(0), view.stride(1), view.stride(2)) if varying else (0, 0, 0))
            assert args[f'{name.upper()}_ptr'].shape == view.shape
        assert (args['HAS_D'], args['HAS_Z'], args['HAS_BIAS']) == tuple(given[k] is not None for k in ('D', 'z', 'bias'))
        # every pointer a real tensor, absent inputs included: a None would be another compiled variant
        assert all(isinstance(args[n], torch.Tensor) for n in launch.kernel.arg_names if n.endswith('_ptr'))
        for key in ('D', 'z', 'bias'):   # D and bias read as float32; z as it is
            if given[key] is not None:
                assert args[f'{key}_ptr'].shape == given[key].shape
                assert args[f'{key}_ptr'].dtype == (given[key].dtype if key == 'z' else torch.float32)
    if b_form == 'grouped_view':   # read in place: a view of the projection keeps its strides, no copy
        assert _named(fwd.launch)['B_ptr'].stride() == B.stride() != B.contiguous().stride()
    args, out = _named(fwd.launch), fwd.outputs
    assert (fwd.launch.name, bwd.launch.name) == ('forward', 'backward')
    assert (args['out_ptr'], args['chunk_states_ptr'], args['last_ptr']) == (out['out'], out['states'], out['last'])
    # what the static report counts as bytes moved: each tensor read or written once, B and C only
    # where they vary along the sequence
    read = [args[n] for n in ('u_ptr', 'delta_ptr')] + [args[n] for n, on in (('B_ptr', 'VAR_B'), ('C_ptr', 'VAR_C'),
                                                                             ('z_ptr', 'HAS_Z')) if args[on]]
    assert [id(t) for t in fwd.launch.traffic if t is not None] == \
        [id(t) for t in read + [out['out'], out['states'], out['last']]]
    back, grads = _named(bwd.launch), bwd.outputs
    read = [back[n] for n in ('u_ptr', 'delta_ptr')] + [back[n] for n, on in (('B_ptr', 'VAR_B'), ('C_ptr', 'VAR_C'),
                                                                              ('z_ptr', 'HAS_Z')) if back[on]]
    written = [grads[n] for n in ('du', 'ddelta', 'dz')] + [grads[n] for n, on in (('dB', 'VAR_B'), ('dC', 'VAR_C'))
                                                              if back[on]]
    assert [id(t) for t in bwd.launch.traffic if t is not None] == \
        [id(t) for t in read + [back['chunk_states_ptr'], back['dout_ptr']] + written if t is not None]
    assert (out['out'].shape, out['out'].dtype) == (u.shape, torch.float32)
    assert out['states'].shape == (batch, dim, _ceil(length, chunk), dstate) and out['last'].shape == (batch, dim, dstate)
    assert grads['du'].dtype == grads['ddelta'].dtype == torch.bfloat16
    assert bwd.layout.grid == bwd.launch.grid and back['dlast_ptr'] is dlast
    for name in ('du', 'ddelta', 'dz', 'dB', 'dC', 'dA', 'dD', 'dbias'):
        assert grads[name] is None or back[f'{name}_ptr'] is grads[name], name
    assert (grads['dA'].shape, grads['dA'].dtype) == ((batch, dim, dstate), torch.float32)
    for name in ('dD', 'dbias'):   # per-batch sums the caller adds up
        assert grads[name] is None or (grads[name].shape, grads[name].dtype) == ((batch, dim), torch.float32)
    assert grads['dz'] is None or (grads['dz'].shape, grads['dz'].dtype) == (u.shape, given['z'].dtype)
    for name, m in (('dB', B), ('dC', C)):
        assert grads[name].dtype == torch.float32
        assert grads[name].shape == (_as_grouped(m).shape if m.dim() != 2 else (batch, dim, dstate))
    assert (grads['dD'] is None) == (given['D'] is None) and (grads['dbias'] is None) == (given['bias'] is None)
    assert (grads['dz'] is None) == (given['z'] is None)


def test_the_backward_reads_the_last_states_gradient_only_when_given():
    u = torch.empty(1, 4, 9, device='meta')
    A, bc = torch.empty(4, 2, device='meta'), torch.empty(1, 2, 9, device='meta')
    fwd = launches.forward_launch(u, u, A, bc, bc, None, None, None, False)
    for dlast, flag in ((None, 0), (torch.empty(1, 4, 2, device='meta'), 1)):
        launch = launches.backward_launch(u, u, A, bc, bc, None, None, None, fwd.outputs['states'], u, dlast,
                                          False).launch
        assert _named(launch)['flag'] == flag
        assert all(isinstance(_named(launch)[n], torch.Tensor) for n in launch.kernel.arg_names if n.endswith('_ptr'))
    alone = launches.forward_launch(u, u, A, bc, bc, None, None, None, False, save_states=False)
    assert alone.outputs['states'] is None and _named(alone.launch)['flag'] == 0
    assert isinstance(_named(alone.launch)['chunk_states_ptr'], torch.Tensor)   # a pointer never written
    # the output has u's dtype (mamba's semantics) unless out_dtype says otherwise
    mixed = launches.forward_launch(u.bfloat16(), u, A, bc, bc, None, None, None, False)
    assert mixed.outputs['out'].dtype == torch.bfloat16


def test_a_launch_runs_its_kernel_on_the_inputs_gpu_with_its_warps_options_and_flags(monkeypatch):
    """On a machine with several GPUs (a torchrun rank per GPU) a launch must target the GPU
    its inputs are on, not the current one; warps, compile options and flags reach the kernel.
    Mutation testing (issue #38): kills the mutants that launched on the current GPU or dropped the
    warps or the compile options."""
    calls, selected = [], []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((grid, args, kwargs))

    class OnGpu:
        device = torch.device('cuda', 1)
    monkeypatch.setattr(torch.cuda, 'device', lambda device: selected.append(device) or contextlib.nullcontext())
    launch = launches.KernelLaunch('forward', Kernel(), (2, 3), (OnGpu(), 7), {'T': 8}, 4)
    launch.run()
    assert selected == [torch.device('cuda', 1)]
    assert calls == [((2, 3), launch.args, {'num_warps': 4, **launches.COMPILE_OPTIONS, 'T': 8})]
    launches.KernelLaunch('forward', Kernel(), (1, 1), (torch.empty(1), 7), {}, 2).run()   # CPU: no device to select
    assert len(selected) == 1 and calls[-1][2] == {'num_warps': 2, **launches.COMPILE_OPTIONS}


def test_the_power_of_two_is_the_smallest_at_least_n():
    """``_power_of_2_at_least(n)`` is the smallest power of two >= n. Mutation testing (issue #38):
    kills the mutant one short of it."""
    for n in range(1, 300):
        p = launches._power_of_2_at_least(n)
        assert p >= n and p & (p - 1) == 0 and (p == 1 or p // 2 < n), n


def test_the_grid_limit_is_the_largest_grid_cuda_takes():
    """CUDA's limit on a grid's second dimension is 65,535 blocks: exactly that many channel
    blocks launch; one more is refused by name before any work.
    Mutation testing (issue #38): kills the mutant that refused exactly 65,535 channel blocks."""
    ok = launches._Layout(1, launches.MAX_GRID_Y, 16, 4, launches.MAX_GRID_Y, None, 8, 1)
    assert ok.grid == (1, 65535) and ok.block_d == 1
    with pytest.raises(ValueError, match=r"65536 channel blocks pass CUDA's grid limit of 65535\. Use scan_backend: torch"):
        launches._Layout(1, launches.MAX_GRID_Y + 1, 16, 4, launches.MAX_GRID_Y + 1, None, 8, 1)
    for chunk in (1, 2, 64):
        assert launches._Layout(1, 4, 16, 4, None, None, chunk, 1).chunk == chunk
    for chunk in (0, 3, 12):
        with pytest.raises(ValueError, match=f'^the Triton scan needs a power-of-two chunk length, got {chunk}$'):
            launches._Layout(1, 4, 16, 4, None, None, chunk, 1)


def test_a_program_takes_the_settings_channel_block_rounded_up_and_at_most_one_group():
    """BLOCK_D is the setting rounded up to a power of two, never more channels than share one
    slice of B and C (one group), and never less than one.
    Mutation testing (issue #38): kills the mutant that read a channel-block setting of 1 as 2."""
    for setting, group_size, expected in ((1, 8, 1), (3, 8, 4), (8, 8, 8), (16, 8, 8), (4, 3, 4), (4, 2, 2), (0, 8, 1)):
        lay = launches._Layout(2, group_size * 3, 16, 4, 3, None, 8, setting)
        assert (lay.group_size, lay.block_d) == (group_size, expected), (setting, group_size)
        assert lay.blocks_per_group == _ceil(group_size, expected) and lay.grid == (2, 3 * lay.blocks_per_group)


@pytest.mark.parametrize('batch, dim, length, save_states, segments', [
    (1, 1440, 250 * 250, False, 12),   # a validation tile of batch 1: 360 programs, 12 segments
    (1, 1440, 250 * 250, True, 1),     # the same with a backward to follow: its chunk states need one walk
    (4, 1440, 48 * 48, False, 1),      # MambaIR's training batch: 1440 programs already
    (1, 1440, 64 * 64, False, 8),      # a small image: segments of at least SPLIT_MIN_CHUNKS chunks
    (1, 1440, 16 * 16, False, 1),
])
def test_a_forward_without_a_backward_splits_a_small_grid_along_the_sequence(batch, dim, length, save_states,
                                                                             segments):
    meta = dict(device='meta')
    u = torch.empty(batch, dim, length, **meta)
    bc = torch.empty(batch, 4, 16, length, **meta)
    launch = launches.forward_launch(u, torch.empty_like(u), torch.empty(dim, 16, **meta), bc, bc, None, None,
                                     None, True, save_states)
    assert launch.launch.grid == (batch, dim // launches.FORWARD_BLOCK_D, segments)
    assert [(b.grid, b.constexprs['SPLIT']) for b in launch.before] == ([] if segments == 1 else [(launch.launch.grid, 1)])
    assert launch.launch.constexprs['SPLIT'] == (0 if segments == 1 else 2)
