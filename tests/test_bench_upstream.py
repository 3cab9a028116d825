"""scripts/bench_ldt.py --compare-upstream on the CPU: three copies of one network stepped on the
same batches in a rotating order (upstream's way, the project's eager and compiled), the per-batch
ratios to upstream, the warm-up (compile) time, and the SS2D forward at a tile beside the other
scan; the GPU run's figures (docs/results.md) come from these lines."""
import re

import pytest
import torch

from conftest import RerunRecorder, fake_cuda_allocator, load_script


def test_compare_upstream_rotates_three_setups_over_the_same_batches(monkeypatch, capsys):
    bench = load_script('bench_ldt')
    monkeypatch.setattr(bench, 'UPSTREAM_SETUPS', {'upstream': ('torch', False, False, False),
                                                   'torch copies': ('torch copies', True, False, False),
                                                   'ours eager': ('torch', True, False, False),
                                                   'ours compiled': ('torch', True, True, False),
                                                   'ours graphed': ('torch', True, False, True)})
    monkeypatch.setattr(bench, 'COMPILE_BACKEND', 'aot_eager')
    monkeypatch.setattr(bench, 'TILE', (5, 'torch', 'torch'))
    built, stepped, nets = {}, [], []
    build, step = bench.build_network, bench.optimizer_step

    def build_and_note(arch, scale, scan_backend=None):
        net = build(arch, scale, scan_backend=scan_backend)
        built[id(net)] = (len(built), {k: v.clone() for k, v in net.state_dict().items()})
        nets.append(net)
        return net
    monkeypatch.setattr(bench, 'build_network', build_and_note)
    monkeypatch.setattr(bench, 'optimizer_step', lambda net, *a, **k: stepped.append(built[id(net)][0]) or step(net, *a, **k))
    compiled = []
    import archs.compile as compile_module
    real_compile = compile_module.compile_blocks
    monkeypatch.setattr(compile_module, 'compile_blocks',
                        lambda net, backend: compiled.append((built[id(net)][0], backend)) or real_compile(net, backend))
    bench.main(['--arch', 'mambair_small', '--device', 'cpu', '--patch', '4', '--batch', '1', '--iters', '2',
                '--warm', '1', '--compare-upstream'])
    out = capsys.readouterr().out
    assert stepped == [0, 1, 2, 3, 1, 2, 3, 0, 2, 3, 0, 1]   # 1 warm-up + 2 timed batches, the order rotating
    assert compiled == [(3, 'aot_eager')]                     # only 'ours compiled' is compiled
    assert [sorted({m.directions_in_kernels for m in net.modules() if hasattr(m, 'directions_in_kernels')})
            for net in nets] == [[True], [False], [True], [True]]   # 'torch copies': the direction copies
    states = [state for _, state in built.values()][:4]
    assert all(torch.equal(states[0][k], s[k]) for s in states[1:] for k in states[0])   # one seed, one start
    for name in ('upstream', 'torch copies', 'ours eager', 'ours compiled'):
        assert re.search(rf'^FT step {name} / upstream: \d+\.\d+ \(median of 2 per-batch ratios \[.*\], order '
                         rf'rotating\) \| median [\d.]+ ms, 1 warm-up steps \(a compile included\) [\d.]+ s$', out, re.M), out
    assert re.search(r'^SS2D scan forward at a 5x5 tile, batch 1: torch \(as validation runs it\) [\d.]+ ms, '
                     r'torch on direction copies [\d.]+ ms: torch / torch \d+\.\d+ \(max \|diff\| 0\.00e\+00\)$', out, re.M), out
    assert 'SS2D scan forward at a 5x5 tile, batch 1: torch (directions in the kernels): not run on torch\n' in out
    assert 'FT step ours graphed: not run (CUDA graphs need --device cuda)\n' in out
    assert re.search(r'^summary upstream: arch=mambair_small torch copies/upstream time \d+\.\d+ \| ours eager/upstream time \d+\.\d+ \| ours compiled/upstream '
                     r'time \d+\.\d+ \| tile forward/upstream time \d+\.\d+$', out, re.M), out


def test_compare_upstream_reports_each_peak_as_a_fraction_of_upstreams(monkeypatch, capsys):
    """On CUDA, one more step of each copy for its peak memory above what stays allocated, printed
    beside upstream's (faked allocator counters: upstream peaks 400 MiB above, the others 300); a
    replayed step adds all its graph holds (faked: 50 MiB)."""
    bench = load_script('bench_ldt')
    monkeypatch.setattr(bench, 'UPSTREAM_SETUPS', {'upstream': ('torch', False, False, False),
                                                   'ours eager': ('torch', True, False, False),
                                                   'ours graphed': ('torch', True, False, True)})

    class Holding(RerunRecorder):
        def held_bytes(self):
            return 50 * 2 ** 20
    monkeypatch.setattr(bench, 'GRAPH_RECORDER', Holding)
    monkeypatch.setattr(bench, 'TILE', (4, 'torch', 'torch'))
    allocated = fake_cuda_allocator(monkeypatch, bench)
    step = bench.optimizer_step

    def step_taking_memory(net, opt, *a, **k):
        fused = bool(opt.defaults.get('fused'))
        allocated['peak'] = allocated['now'] + (300 if fused else 400) * 2 ** 20
        return step(net, opt, *a, **k)
    monkeypatch.setattr(bench, 'optimizer_step', step_taking_memory)
    monkeypatch.setattr(bench, 'adam_kwargs', lambda options, params: {**options, 'fused': 'foreach' not in options})
    bench.main(['--arch', 'mambair_small', '--device', 'cpu', '--patch', '4', '--batch', '1', '--iters', '1',
                '--warm', '2', '--compare-upstream'])   # the graph records in the third step
    assert re.search(r'^FT step peak memory above what stays allocated: upstream 400 MiB \(1\.000 of upstream\), '
                     r'ours eager 300 MiB \(0\.750 of upstream\), ours graphed 350 MiB \(0\.875 of upstream\)$',
                     out := capsys.readouterr().out, re.M), out


def test_compare_upstream_replays_a_graphed_setup(monkeypatch, capsys):
    """A graphed setup runs its step through a step graph: eager in its first steps, then recorded
    once and replayed, timed beside upstream's (the CPU records with RerunRecorder)."""
    bench = load_script('bench_ldt')
    monkeypatch.setattr(bench, 'UPSTREAM_SETUPS', {'upstream': ('torch', False, False, False),
                                                   'ours graphed': ('torch', True, False, True)})
    monkeypatch.setattr(bench, 'TILE', (4, 'torch', 'torch'))
    recorders = []
    monkeypatch.setattr(bench, 'GRAPH_RECORDER', lambda net: recorders.append(RerunRecorder(net)) or recorders[-1])
    bench.main(['--arch', 'mambair_small', '--device', 'cpu', '--patch', '4', '--batch', '1', '--iters', '2',
                '--warm', '3', '--compare-upstream'])
    out = capsys.readouterr().out
    assert len(recorders) == 1 and recorders[0].replays == 3   # warm-up: 2 eager, then recorded; 2 timed replays
    assert re.search(r'^FT step ours graphed / upstream: \d+\.\d+ \(median of 2 per-batch ratios', out, re.M), out
    assert re.search(r'^summary upstream: arch=mambair_small ours graphed/upstream time \d+\.\d+ \| tile', out, re.M), out


def test_check_graph_passes_a_faithful_replay_and_fails_a_stale_one(monkeypatch, capsys):
    """--check-graph: replayed steps against eager ones, FT with eager and compiled blocks and LDT's dual
    step compiled and side by side in one graph; a recorder whose replays never see the new batch (stale
    inputs) is caught, and the exit status says so."""
    bench = load_script('bench_ldt')
    monkeypatch.setattr(bench, 'COMPILE_BACKEND', 'aot_eager')
    monkeypatch.setattr(bench, 'GRAPH_RECORDER', RerunRecorder)
    argv = ['--arch', 'mambair_small', '--device', 'cpu', '--patch', '4', '--batch', '1', '--iters', '3',
            '--warm', '1', '--check-graph']
    import archs.compile
    compiled, compile_blocks = [], archs.compile.compile_blocks
    monkeypatch.setattr(archs.compile, 'compile_blocks', lambda net, backend: compiled.append(net) or compile_blocks(net, backend))
    bench.main(argv)
    out = capsys.readouterr().out
    assert len(compiled) == 2 + 4   # compiled FT: two copies; the dual step: two copies of two branches
    for kind, recordings in (('eager blocks', '1'), ('compiled blocks', '1'), ('LDT dual step, compiled blocks', '1/1'),
                             (r'LDT dual step, both branches in one graph \(a stream each\), eager blocks', '1')):
        assert re.search(rf'^graph check, {kind}: 2 of 4 steps replayed \({recordings} recording\); loss replayed / '
                         r'eager: max relative gap 0\.0e\+00 \(bound 0\.001; the batches\' losses [\d.]+-[\d.]+\); '
                         r'weight change: relative gap 0\.0e\+00 \(bound 0\.05\): PASS$', out, re.M), out
    assert out.rstrip().endswith('summary graph: eager PASS | compiled PASS | dual compiled PASS | dual side by side PASS')

    class Stale(RerunRecorder):
        def record(self, step):
            outputs = super().record(step)
            self.outputs = [t.clone() for t in outputs]   # replays write where nobody reads
            return outputs
    monkeypatch.setattr(bench, 'GRAPH_RECORDER', Stale)
    with pytest.raises(SystemExit) as exit_:
        bench.main(argv)
    out = capsys.readouterr().out
    assert exit_.value.code == 1 and out.rstrip().endswith(
        'summary graph: eager FAIL | compiled FAIL | dual compiled FAIL | dual side by side FAIL'), out
    monkeypatch.setattr(bench, 'GRAPH_RECORDER', RerunRecorder)
    with pytest.raises(SystemExit):   # too few steps to record: nothing was compared
        bench.main(argv[:-5] + ['--iters', '1', '--warm', '1', '--check-graph'])
    out = capsys.readouterr().out
    assert 'graph check, eager blocks: 0 of 2 steps replayed (0 recordings); ' in out
    assert 'graph check, LDT dual step, compiled blocks: 0 of 2 steps replayed (0/0 recordings); ' in out
    assert out.rstrip().endswith('summary graph: eager FAIL | compiled FAIL | dual compiled FAIL | dual side by side FAIL'), out


def test_bench_ldt_cuda_graph_times_replayed_ft_and_dual_steps_beside_the_others(monkeypatch, capsys):
    """--cuda-graph: an FT copy and two LDT copies whose branches are replayed, a graph each and side by side
    in one graph (one recording each, after the eager steps, in a warm-up raised to cover them), timed in
    the same iterations; the summary adds FT graphed/FT and each replayed dual step / FT graphed (memory
    n/a off CUDA). Without CUDA or a recorder, one line."""
    from test_cuda_branches import _Tiny
    bench = load_script('bench_ldt')
    monkeypatch.setattr(bench, 'build_network', lambda arch, scale: _Tiny(scale))
    monkeypatch.setattr(bench, 'worker_runs', lambda args, kind, **extra: [{'peak_bytes': 2 ** 20}])
    argv = ['--device', 'cpu', '--patch', '6', '--batch', '1', '--scale', '2', '--iters', '3', '--warm', '1',
            '--profile-passes', '2', '--no-profile-memory', '--cuda-graph']
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert '--cuda-graph records CUDA graphs; expected --device cuda, got cpu' in capsys.readouterr().err
    recorders = []
    monkeypatch.setattr(bench, 'GRAPH_RECORDER', lambda net: recorders.append(RerunRecorder(net)) or recorders[-1])
    bench.main(argv)
    out = capsys.readouterr().out
    # FT, primary, auxiliary, both side by side: warm-up 3 (2 eager), 3 timed
    assert [r.replays for r in recorders] == [4, 4, 4, 4]
    one = len(list(recorders[0].network.parameters()))
    assert [len(list(r.network.parameters())) for r in recorders] == [one, one, one, 2 * one]   # the last: both branches
    assert re.search(r'^3 warm-up steps .*: FT [\d.]+ s, dual [\d.]+ s, FT graphed [\d.]+ s, dual graphed [\d.]+ s, '
                     r'dual side by side [\d.]+ s;', out, re.M)
    line = re.search(r'^  replayed as CUDA graphs \(train\.cuda_graph: true; recordings: FT graphed 1, dual graphed 1/1, '
                     r'dual side by side 1\): FT [\d.]+ ms, FT graphed/FT = ([\d.]+) \| dual graphed [\d.]+ ms, step ratio '
                     r'dual graphed/FT graphed = ([\d.]+) \(per iteration .*\) \| dual side by side [\d.]+ ms, step ratio '
                     r'dual side by side/FT graphed = ([\d.]+) ', out, re.M)
    assert line, out
    assert "replayed steps' memory: not measured (the graphs' pool is a CUDA allocator's)" in out
    assert out.rstrip().endswith(f'| FT graphed/FT time {line.group(1)} | LDT graphed/FT graphed time {line.group(2)} '
                                 f'| LDT graphed/FT graphed memory n/a | LDT side by side/FT graphed time {line.group(3)} '
                                 '| LDT side by side/FT graphed memory n/a'), out


def test_bench_ldt_graphed_memory_adds_what_the_graphs_hold_to_each_steps_peak(monkeypatch, capsys):
    """On CUDA (faked counters) one more step of each: its peak above what stays allocated, plus what
    its graphs hold (the dual step's pool once); the ratio is dual replayed / FT replayed."""
    bench = load_script('bench_ldt')
    allocated = fake_cuda_allocator(monkeypatch, bench)

    def taking(mib):
        return lambda lq, gt: allocated.update(peak=allocated['now'] + mib * 2 ** 20)
    graphed = {'FT graphed': (taking(10), lambda: 90 * 2 ** 20, None),
               'dual graphed': (taking(12), lambda: 93 * 2 ** 20, None),
               'dual side by side': (taking(2), lambda: 178 * 2 ** 20, None)}
    args = bench.parse_args(['--device', 'cpu'])
    ratios = bench.graphed_memory(args, (None, None), graphed, taking(300))
    assert ratios == pytest.approx({'graphed_memory': 105 / 100, 'side_memory': 180 / 100})
    assert capsys.readouterr().out.strip().endswith(
        'FT 300.0 MiB | FT graphed 100.0 MiB | dual graphed 105.0 MiB | dual side by side 180.0 MiB')
