"""Selective scan: equal to a sequential float64 reference (outputs, last state, gradients),
stable for strong decays, and the kernel choice ('auto' | 'torch' | 'cuda') is explicit."""
import builtins
import sys
import types

import pytest
import torch
import torch.nn.functional as F

import basicsr_ldt  # noqa: F401
import archs  # noqa: F401  (registers; imports basicsr in the right order)
import archs.scan.dispatch as scan_module
from archs.scan import torch_scan as scan_torch
from archs.scan.linear_scan import chunk_length
from archs.scan.dispatch import BACKEND_ENV, select_kernel, selective_scan
from conftest import basicsr_log


def sequential_reference(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """One step per position, in float64: the semantics of mamba's selective_scan_ref."""
    u, delta, A = u.double(), delta.double(), A.double()
    if delta_bias is not None:
        delta = delta + delta_bias.double()[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    batch, dim, length = u.shape

    def per_channel(m):  # -> (batch, dim, dstate, length)
        m = m.double()
        if m.dim() == 2:
            return m[None, :, :, None].expand(batch, dim, m.shape[1], length)
        if m.dim() == 3:
            m = m[:, None]
        return m.repeat_interleave(dim // m.shape[1], dim=1)

    Bx, Cx = per_channel(B), per_channel(C)
    state = u.new_zeros(batch, dim, A.shape[1])
    ys = []
    for t in range(length):
        state = torch.exp(delta[:, :, t, None] * A) * state + (delta[:, :, t] * u[:, :, t])[..., None] * Bx[..., t]
        ys.append((state * Cx[..., t]).sum(-1))
    out = torch.stack(ys, dim=-1)
    if D is not None:
        out = out + u * D.double()[:, None]
    if z is not None:
        out = out * F.silu(z.double())
    return out, state


def make_inputs(bc: str, length: int, options: str, batch: int = 2, dim: int = 6, dstate: int = 3,
                groups: int = 3, seed: int = 0, delta_scale: float = 0.5):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    bc_shape = {'const': (dim, dstate), 'shared': (batch, dstate, length),
                'grouped': (batch, groups, dstate, length)}[bc]
    args = dict(u=rnd(batch, dim, length), delta=rnd(batch, dim, length).abs() * delta_scale,
                A=-torch.rand(dim, dstate, generator=gen) * 3, B=rnd(*bc_shape), C=rnd(*bc_shape))
    if 'D' in options:
        args['D'] = rnd(dim)
    if 'z' in options:
        args['z'] = rnd(batch, dim, length)
    if 'bias' in options:
        args['delta_bias'] = rnd(dim) * 0.5
    for t in args.values():
        t.requires_grad_()
    return args, 'softplus' in options


def _grads_match(args, softplus, out, last, ref_out, ref_last, rtol=1e-4, atol=1e-4):
    w_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    w_last = torch.randn(last.shape, generator=torch.Generator().manual_seed(8))
    ours = torch.autograd.grad((out * w_out).sum() + (last * w_last).sum(), list(args.values()))
    refs = torch.autograd.grad((ref_out * w_out.double()).sum() + (ref_last * w_last.double()).sum(),
                               list(args.values()))
    for name, g, r in zip(args, ours, refs):
        torch.testing.assert_close(g, r.float(), rtol=rtol, atol=atol, msg=f'gradient of {name}')


@pytest.mark.parametrize('options', ['', 'D', 'z', 'bias+softplus', 'D+z+bias+softplus'])
@pytest.mark.parametrize('bc', ['const', 'shared', 'grouped'])
def test_matches_sequential_reference_forward_and_backward(bc, options):
    args, softplus = make_inputs(bc, 37, options)
    out, last = selective_scan(**args, delta_softplus=softplus, return_last_state=True, backend='torch')
    ref_out, ref_last = sequential_reference(**args, delta_softplus=softplus)
    torch.testing.assert_close(out, ref_out.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, ref_last.float(), rtol=1e-5, atol=1e-5)
    _grads_match(args, softplus, out, last, ref_out, ref_last)


@pytest.mark.parametrize('length', [1, 2, 16, 17, 50])
def test_chunk_and_channel_block_boundaries(monkeypatch, length):
    """Tiny blocks split channels inside a B/C group; lengths hit exact and padded chunking."""
    monkeypatch.setattr(scan_torch, 'BLOCK_ELEMENTS', 40)
    args, _ = make_inputs('grouped', length, 'D+bias', dim=8, groups=2)
    out = selective_scan(**args, backend='torch')
    ref, _ = sequential_reference(**args)
    torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)
    ours = torch.autograd.grad(out.sum(), [args['u'], args['B'], args['A']])
    refs = torch.autograd.grad(ref.sum(), [args['u'], args['B'], args['A']])
    for g, r in zip(ours, refs):
        torch.testing.assert_close(g, r.float(), rtol=1e-4, atol=1e-4)


def test_chunk_length_balances_the_two_loops():
    assert [chunk_length(n) for n in (1, 2, 4, 5, 2304)] == [1, 2, 2, 3, 48]
    with pytest.raises(ValueError, match='sequence length'):
        chunk_length(0)


def test_strong_decay_stays_finite_and_exact():
    """delta*A down to about -150 per step: exp(-cumsum) would overflow float32; we never form it.
    Outputs, last state and every gradient match the float64 reference."""
    args, _ = make_inputs('grouped', 64, 'D', delta_scale=50.0)
    out, last = selective_scan(**args, return_last_state=True, backend='torch')
    ref_out, ref_last = sequential_reference(**args)
    assert torch.isfinite(out).all() and torch.isfinite(last).all()
    torch.testing.assert_close(out, ref_out.float(), rtol=1e-5, atol=1e-5)
    _grads_match(args, False, out, last, ref_out, ref_last)


def test_low_precision_input_keeps_its_dtype():
    args, softplus = make_inputs('grouped', 20, 'D+bias+softplus')
    half = {k: (v.detach().bfloat16() if k in ('u', 'delta') else v.detach()) for k, v in args.items()}
    out = selective_scan(**half, delta_softplus=softplus, backend='torch')
    ref, _ = sequential_reference(**half, delta_softplus=softplus)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.fixture
def no_mamba(monkeypatch):
    """Make ``import mamba_ssm`` and the Triton kernel's import fail; forget cached kernels."""
    monkeypatch.setitem(sys.modules, 'mamba_ssm', None)
    monkeypatch.setitem(sys.modules, 'archs.scan.triton_function', None)
    for name in ('_cuda_fn', '_cuda_error', '_triton_module', '_triton_error'):
        monkeypatch.setattr(scan_module, name, None)
    monkeypatch.delenv(BACKEND_ENV, raising=False)


def test_forcing_cuda_without_mamba_ssm_names_the_package(no_mamba, monkeypatch):
    args, _ = make_inputs('const', 5, '')
    with pytest.raises(ImportError, match='mamba-ssm'):
        selective_scan(**args, backend='cuda')
    monkeypatch.setenv(BACKEND_ENV, 'cuda')
    with pytest.raises(ImportError, match='mamba-ssm'):
        selective_scan(**args)
    assert selective_scan(**args, backend='torch').shape == (2, 6, 5)  # the argument wins


def test_auto_falls_back_to_torch_and_bad_names_are_rejected(no_mamba, monkeypatch):
    assert select_kernel(None, torch.device('cpu')) == 'torch'
    assert select_kernel('auto', torch.device('cuda')) == 'torch'  # mamba-ssm and triton missing
    monkeypatch.setenv(BACKEND_ENV, 'gpu')
    with pytest.raises(ValueError, match=BACKEND_ENV):
        select_kernel(None, torch.device('cpu'))
    with pytest.raises(ValueError, match='scan_backend'):
        select_kernel('fast', torch.device('cpu'))


def test_available_kernel_is_used_on_cuda_tensors_only(no_mamba, monkeypatch):
    calls = []
    monkeypatch.setattr(scan_module, '_cuda_fn', lambda *a: calls.append(a) or 'cuda-result')
    assert select_kernel('auto', torch.device('cuda')) == 'cuda'
    assert select_kernel('auto', torch.device('cpu')) == 'torch'
    with pytest.raises(ValueError, match='CUDA tensors'):
        select_kernel('cuda', torch.device('cpu'))
    args, _ = make_inputs('const', 5, '')
    assert selective_scan(**args).shape == (2, 6, 5) and not calls  # CPU tensors: torch path


def test_mambair_forced_cuda_backend_fails_clearly_on_cpu(no_mamba):
    net = archs.MambaIR(upscale=2, img_size=8, embed_dim=30, depths=[1], d_state=2, mlp_ratio=1,
                        upsampler='pixelshuffle', scan_backend='cuda')
    with pytest.raises(ImportError, match='mamba-ssm'):
        net(torch.rand(1, 3, 4, 4))


@pytest.mark.parametrize('change, message', [
    (dict(delta=torch.zeros(2, 6, 4)), 'u and delta'),
    (dict(A=torch.zeros(5, 3)), 'A must be'),
    (dict(B=torch.zeros(2, 4, 3, 5)), 'B must be'),
    (dict(C=torch.zeros(6, 2)), 'C must be'),
    (dict(D=torch.zeros(5)), 'D must'),
    (dict(z=torch.zeros(2, 6, 4)), 'z must'),
    (dict(delta_bias=torch.zeros(6, 1)), 'delta_bias must'),
])
def test_bad_shapes_name_the_argument(change, message):
    args, _ = make_inputs('const', 5, '')
    args = {k: v.detach() for k, v in args.items()}
    args.update(change)
    with pytest.raises(ValueError, match=message):
        selective_scan(**args, backend='torch')


def test_linear_scan_helpers_match_a_sequential_recurrence():
    """scan_forward with a given chunk decay or saved entry states, and decayed_previous_state_,
    agree with a step-by-step float64 recurrence (chunk layout (T, b, d, nc, n))."""
    from archs.scan.linear_scan import decayed_previous_state_, scan_forward
    gen = torch.Generator().manual_seed(3)
    steps, chunks = 5, 4
    a = torch.rand(steps, 2, 3, chunks, 2, generator=gen)
    x = torch.randn(steps, 2, 3, chunks, 2, generator=gen)
    seq_a = a.permute(1, 2, 4, 3, 0).reshape(2, 3, 2, -1).double()  # (b, d, n, L)
    seq_x = x.permute(1, 2, 4, 3, 0).reshape(2, 3, 2, -1).double()
    h, states, prevs = torch.zeros(2, 3, 2, dtype=torch.float64), [], []
    for t in range(seq_a.shape[-1]):
        prevs.append(seq_a[..., t] * h)
        h = prevs[-1] + seq_x[..., t]
        states.append(h)
    ref = torch.stack(states, -1).view(2, 3, 2, chunks, steps).permute(4, 0, 1, 3, 2).float()
    ref_prev = torch.stack(prevs, -1).view(2, 3, 2, chunks, steps).permute(4, 0, 1, 3, 2).float()
    plain, last, carry = scan_forward(a, x.clone())
    given_decay, _, _ = scan_forward(a, x.clone(), decay=a.prod(0))
    given_carry, _, _ = scan_forward(a, x.clone(), carry=carry)
    for out in (plain, given_decay, given_carry):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(last, ref[-1, ..., -1, :], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(decayed_previous_state_(plain.clone(), a), ref_prev, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('length, steps', [(1, 4), (4, 4), (45, 4), (130, 16), (300, 7)])
@pytest.mark.parametrize('options', ['D+bias+softplus', 'D+z+bias+softplus', ''])
def test_time_major_path_over_many_checkpoint_intervals(monkeypatch, length, steps, options):
    """Grouped B/C run the time-major path; backward recomputes the states one interval at a
    time. Long sequences with moderate decay, lengths that are and are not a multiple of the
    interval, and the last state's gradient. Tiles of 5 make every (b, d, L) <-> (L, b, d)
    transpose run over several tiles, with partial ones at both edges."""
    monkeypatch.setattr(scan_torch, 'CHECKPOINT_STEPS', steps)
    monkeypatch.setattr(scan_torch, 'TRANSPOSE_TILE', 5)
    args, softplus = make_inputs('grouped', length, options, dim=8, groups=4, delta_scale=0.2)
    out, last = selective_scan(**args, delta_softplus=softplus, return_last_state=True, backend='torch')
    ref_out, ref_last = sequential_reference(**args, delta_softplus=softplus)
    torch.testing.assert_close(out, ref_out.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, ref_last.float(), rtol=1e-5, atol=1e-5)
    _grads_match(args, softplus, out, last, ref_out, ref_last)


def test_time_major_path_with_different_groupings_of_b_and_c():
    """B with 2 groups and C with 3 (of 6 channels): the loop runs on the finer grouping (6)
    and sums the gradients back to each tensor's own groups."""
    args, softplus = make_inputs('grouped', 23, 'D+bias+softplus', dim=6, groups=2)
    args['C'] = torch.randn(2, 3, 3, 23, generator=torch.Generator().manual_seed(9)).requires_grad_()
    out, last = selective_scan(**args, delta_softplus=softplus, return_last_state=True, backend='torch')
    ref_out, ref_last = sequential_reference(**args, delta_softplus=softplus)
    torch.testing.assert_close(out, ref_out.float(), rtol=1e-5, atol=1e-5)
    _grads_match(args, softplus, out, last, ref_out, ref_last)


@pytest.mark.parametrize('length', [1, 17, 50])
def test_chunked_path_still_exact_for_grouped_b_and_c(monkeypatch, length):
    """The chunked scan (used for constant B or C) stays correct on grouped B/C and tiny blocks."""
    monkeypatch.setattr(scan_torch, 'TIME_MAJOR', False)
    monkeypatch.setattr(scan_torch, 'BLOCK_ELEMENTS', 40)
    args, softplus = make_inputs('grouped', length, 'D+z+bias+softplus', dim=8, groups=2)
    out, last = selective_scan(**args, delta_softplus=softplus, return_last_state=True, backend='torch')
    ref_out, ref_last = sequential_reference(**args, delta_softplus=softplus)
    torch.testing.assert_close(out, ref_out.float(), rtol=1e-5, atol=1e-5)
    _grads_match(args, softplus, out, last, ref_out, ref_last)


def test_time_major_path_without_grad_matches():
    """Under no_grad the time-major path saves no checkpoints and gives the same output."""
    args, softplus = make_inputs('grouped', 40, 'D+z+bias+softplus')
    with torch.no_grad():
        out, last = selective_scan(**args, delta_softplus=softplus, return_last_state=True, backend='torch')
    ref_out, ref_last = sequential_reference(**args, delta_softplus=softplus)
    torch.testing.assert_close(out, ref_out.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, ref_last.float(), rtol=1e-5, atol=1e-5)


def _installed(monkeypatch, module_name: str, **attributes) -> list:
    """Put a module and its parents in ``sys.modules`` (as an installed package would be once
    imported); returns the list of import attempts of ``module_name`` made after this."""
    parts = module_name.split('.')
    for i in range(1, len(parts) + 1):
        monkeypatch.setitem(sys.modules, '.'.join(parts[:i]), types.ModuleType('.'.join(parts[:i])))
    for key, value in attributes.items():
        setattr(sys.modules[module_name], key, value)
    attempts = []
    real_import = builtins.__import__

    def counting(name, *args, **kwargs):
        if name == module_name:
            attempts.append(name)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr('builtins.__import__', counting)
    return attempts


def test_an_installed_mamba_ssm_is_found_once_and_runs_on_cuda_tensors(no_mamba, monkeypatch):
    """mamba-ssm's kernel is ``mamba_ssm.ops.selective_scan_interface.selective_scan_fn`` (mamba
    2.3.2, the module's own name for it); 'auto' picks it for CUDA tensors when it imports, and
    the import is made once, not at every one of a step's calls.
    Mutation testing (issue #38): kills the mutants of an installed mamba-ssm never used
    (``_load_cuda_kernel`` that does not import it, or forgets what it imported)."""
    def selective_scan_fn(*args):
        return 'from mamba-ssm'
    attempts = _installed(monkeypatch, 'mamba_ssm.ops.selective_scan_interface', selective_scan_fn=selective_scan_fn)
    cuda = torch.device('cuda')
    assert select_kernel('auto', cuda) == select_kernel('cuda', cuda) == 'cuda'
    assert scan_module._cuda_fn is selective_scan_fn and len(attempts) == 1


def test_a_scan_package_that_fails_to_import_is_tried_once_and_its_error_is_named(no_mamba, monkeypatch):
    """The cause (the exception's type and text) reaches the one-line error of a forced backend,
    and a missing package is not looked for again at every call.
    Mutation testing (issue #38): kills the mutants that retried a failed import at each of a step's 36
    calls or dropped its cause from the error, for mamba-ssm and for Triton."""
    attempts = []
    real_import = builtins.__import__

    def failing(name, *args, **kwargs):
        if name in ('mamba_ssm.ops.selective_scan_interface', 'archs.scan.triton_function'):
            attempts.append(name)
            raise OSError(f'{name}: undefined symbol _ZN3c10')
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr('builtins.__import__', failing)
    cuda = torch.device('cuda')
    for backend, package in (('cuda', 'mamba_ssm.ops'), ('triton', 'archs.scan.triton_function')):
        for _ in range(2):
            with pytest.raises(ImportError, match=f'failed to import: OSError: {package}.*undefined symbol'):
                select_kernel(backend, cuda)
    assert select_kernel('auto', cuda) == 'torch'
    assert sorted(set(attempts)) == sorted(attempts) and len(attempts) == 2


def test_b_and_c_with_one_group_are_accepted_and_with_none_refused():
    """(batch, 1, dstate, L) is a valid grouping (every channel reads the one group, as in the
    (batch, dstate, L) form); zero groups is a shape error naming the tensor, not a division by zero.
    Mutation testing (issue #38): kills the mutants that refused a (b, 1, n, L) B or let a zero-group
    one fail with a division by zero."""
    args, _ = make_inputs('shared', 5, '')
    args = {k: v.detach() for k, v in args.items()}
    one_group = dict(args, B=args['B'][:, None], C=args['C'][:, None])
    torch.testing.assert_close(selective_scan(**one_group, backend='torch'), selective_scan(**args, backend='torch'))
    for name in ('B', 'C'):
        with pytest.raises(ValueError, match=f'^{name} must be'):
            selective_scan(**dict(args, **{name: args[name][:, None][:, :0]}), backend='torch')


def test_each_configuration_and_kernel_is_logged_once_by_the_name_it_was_given(monkeypatch):
    """The log names the backend the option chose (not the environment's), once per distinct
    configuration and once per kernel actually run.
    Mutation testing (issue #38): kills the mutants that logged the environment's backend instead of the
    option's, or did not log a second configuration or kernel."""
    monkeypatch.setattr(scan_module, '_logged', set())
    with basicsr_log() as logged:
        monkeypatch.setenv(BACKEND_ENV, 'triton')
        for _ in range(2):
            scan_module.log_configuration_once('torch')
            scan_module.log_configuration_once('auto')
        args, _ = make_inputs('const', 5, '')
        for _ in range(2):
            selective_scan(**args, backend='torch')
        monkeypatch.delenv(BACKEND_ENV)
        selective_scan(**args)
    assert logged == [
        'selective scan: scan_backend=torch',
        'selective scan: scan_backend=auto (for CUDA tensors the first that imports of cuda (mamba-ssm) > triton '
        '> torch; otherwise torch)',
        "selective scan: backend 'torch' runs the 'torch' kernel on cpu tensors",
        "selective scan: backend 'auto' runs the 'torch' kernel on cpu tensors"]
    with pytest.raises(ValueError, match=r"^network_g\.scan_backend='fast': expected one of auto, torch, triton, "
                                         r"cuda \(or mamba_ssm, an alias of cuda\)$"):
        scan_module.resolve_backend('fast')


def test_a_kernel_failure_is_told_in_one_line_of_at_most_300_characters():
    """A kernel failure is told in one line: the exception's first non-empty line, at most 300
    characters. Mutation testing (issue #38): kills the mutants of ``_one_line``'s line choice and
    length."""
    one_line = scan_module._one_line
    assert one_line(RuntimeError('\n  ptxas fatal: out of registers  \nsecond line')) == \
        'RuntimeError: ptxas fatal: out of registers'
    assert one_line(OSError('')) == 'OSError'
    exact, long = 'x' * 300, 'y' * 301
    assert one_line(ValueError(exact)) == f'ValueError: {exact}'
    assert one_line(ValueError(long)) == f"ValueError: {'y' * 297}..."


def test_an_interpreted_triton_failure_names_the_numpy_fix(monkeypatch):
    """Forced 'triton' on CPU tensors runs under Triton's interpreter; when it fails and this
    Triton's interpreter cannot run with this numpy, the one-line error says how to fix that.
    Mutation testing (issue #38): kills the mutant whose interpreted failure left the numpy fix out."""
    def failing(*args, **kwargs):
        raise RuntimeError('only 0-dimensional arrays can be converted to Python scalars')
    monkeypatch.setattr(scan_module, '_triton_module',
                        types.SimpleNamespace(selective_scan_triton=failing, interpreting=lambda: True))
    monkeypatch.setattr(scan_module, '_triton_error', None)
    monkeypatch.setattr(scan_module, '_triton_checked', set())
    monkeypatch.setattr(scan_module, 'interpreter_numpy_conflict', lambda: "pip install 'numpy<2.4'")
    args, _ = make_inputs('const', 5, '')
    with pytest.raises(scan_module.ScanKernelFailed, match=r"^network_g\.scan_backend=triton: .* on cpu at its first "
                       r"call \(RuntimeError: only 0-dimensional .*; pip install 'numpy<2\.4'\)\. Use auto"):
        selective_scan(**args, backend='triton')
