"""scripts/fetch_weights.py against a local HTTP server standing in for Hugging Face (offline), and release names
as checkpoints."""
import hashlib
import http.server
import io
import json
import os
import re
import subprocess
import sys
import threading

import cv2
import numpy as np
import pytest
import torch

from basicsr.archs import build_network
from basicsr_ldt.common.errors import InputError
from basicsr_ldt.weights import fetch as fw
from basicsr_ldt.weights import releases as rel
from conftest import REPO

TINY = {'type': 'SAFMN', 'dim': 8, 'n_blocks': 1, 'ffn_scale': 2.0, 'upscaling_factor': 4}
PAGE = 'https://example.org/model-zoo'
TABLE = {
    'Tiny_x4': rel.Release(TINY, PAGE, repo='authors/tiny', file='ckpt/tiny_x4.pth'),
    'Cut_x4': rel.Release(TINY, PAGE, repo='authors/tiny', file='ckpt/cut_x4.pth'),
    'Gone_x4': rel.Release(TINY, PAGE, repo='authors/tiny', file='ckpt/gone_x4.pth'),
    'Drive_x4': rel.Release(TINY, PAGE, manual='Google Drive https://drive.google.com/x'),
    'Drop_x4': rel.Release(TINY, PAGE, repo='authors/tiny', file='ckpt/drop_x4.pth'),
}


def checkpoint_bytes(path, seed, key='params'):
    torch.manual_seed(seed)
    torch.save({key: build_network(dict(TINY)).state_dict()}, path)
    return path.read_bytes()


@pytest.fixture
def server(tmp_path):
    """Serves /authors/tiny/resolve/main/ckpt/<file> from a dict; 'cut_x4.pth' announces its full length and
    closes the connection half-way, 'drop_x4.pth' closes it without a response; anything else is 404. Yields (endpoint, files, requests)."""
    files, requests = {}, []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            name = self.path.rsplit('/', 1)[-1]
            if not self.path.startswith('/authors/tiny/resolve/main/ckpt/') or name not in files:
                self.send_error(404)
                return
            if name == 'drop_x4.pth':          # the connection drops before any response
                self.close_connection = True
                return
            body = files[name]
            self.send_response(200)
            self.send_header('Content-Length', str(len(body)))
            self.end_headers()
            self.wfile.write(body[:len(body) // 2] if name == 'cut_x4.pth' else body)
            self.close_connection = True

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f'http://127.0.0.1:{httpd.server_address[1]}', files, requests
    httpd.shutdown()
    httpd.server_close()


def fetch(name, folder, endpoint):
    return fw.fetch(name, str(folder), TABLE, endpoint=endpoint, progress=False, say=lambda line: None)


def listing_of(folder):
    return sorted(p.name for p in folder.iterdir())


def test_download_checks_records_then_skips(server, tmp_path):
    endpoint, files, requests = server
    files['tiny_x4.pth'] = checkpoint_bytes(tmp_path / 'upstream.pth', seed=0)
    out = tmp_path / 'pretrained'
    message = fetch('Tiny_x4', out, endpoint)
    digest = hashlib.sha256(files['tiny_x4.pth']).hexdigest()
    assert message.startswith(f"Tiny_x4: saved {out / 'Tiny_x4.pth'} (loads into SAFMN)") and digest in message
    assert requests == ['/authors/tiny/resolve/main/ckpt/tiny_x4.pth']
    assert (out / 'Tiny_x4.pth').read_bytes() == files['tiny_x4.pth']
    assert listing_of(out) == ['Tiny_x4.pth', 'weights.lock']      # no temporary file left
    lock_lines = (out / 'weights.lock').read_text().splitlines()
    assert lock_lines[1:] == [f'{digest}  Tiny_x4.pth']
    # sha256sum can check the lock file as it is.
    check = subprocess.run(['sha256sum', '-c', 'weights.lock'], cwd=out, capture_output=True, text=True)
    assert check.returncode == 0 and 'Tiny_x4.pth: OK' in check.stdout
    # Present and valid: skipped, no request.
    assert fetch('Tiny_x4', out, endpoint).endswith('present and checked (SHA-256 as recorded), skipped')
    assert len(requests) == 1
    # The file loads strictly into its network.
    network = build_network(dict(TINY))
    network.load_state_dict(torch.load(out / 'Tiny_x4.pth', weights_only=True)['params'], strict=True)


def test_a_later_download_that_differs_is_refused(server, tmp_path):
    endpoint, files, _ = server
    files['tiny_x4.pth'] = first = checkpoint_bytes(tmp_path / 'a.pth', seed=0)
    out = tmp_path / 'pretrained'
    fetch('Tiny_x4', out, endpoint)
    lock = (out / 'weights.lock').read_text()
    (out / 'Tiny_x4.pth').unlink()
    files['tiny_x4.pth'] = checkpoint_bytes(tmp_path / 'b.pth', seed=1)   # upstream file replaced
    with pytest.raises(InputError) as err:
        fetch('Tiny_x4', out, endpoint)
    new = hashlib.sha256(files['tiny_x4.pth']).hexdigest()
    assert str(err.value) == (f'the file downloaded from {endpoint}/authors/tiny/resolve/main/ckpt/tiny_x4.pth has '
                              f'SHA-256 {new}, but weights.lock recorded {hashlib.sha256(first).hexdigest()} for '
                              'Tiny_x4.pth when it was first fetched (the upstream file changed, or the transfer '
                              'altered it); not kept (delete its line in weights.lock to accept the new file)')
    assert listing_of(out) == ['weights.lock'] and (out / 'weights.lock').read_text() == lock
    # A file put there by hand is checked against the lock as well.
    (out / 'Tiny_x4.pth').write_bytes(files['tiny_x4.pth'])
    with pytest.raises(InputError, match=r'Tiny_x4\.pth is there but not usable: .*Tiny_x4\.pth has SHA-256 .* but '
                                         r'weights\.lock recorded .*; delete it to download it again$'):
        fetch('Tiny_x4', out, endpoint)


def test_interrupted_transfer_leaves_no_file(server, tmp_path):
    endpoint, files, _ = server
    files['cut_x4.pth'] = checkpoint_bytes(tmp_path / 'cut.pth', seed=0)
    out = tmp_path / 'pretrained'
    with pytest.raises(InputError) as err:
        fetch('Cut_x4', out, endpoint)
    message = str(err.value)
    # urllib hands over the short body without an error; the strict load is what catches it.
    assert message.startswith(f'the file downloaded from {endpoint}/authors/tiny/resolve/main/ckpt/cut_x4.pth is not a '
                              'complete SAFMN checkpoint, not kept: Cut_x4: cannot read checkpoint')
    assert listing_of(out) == []          # neither the final name nor a temporary file nor a lock entry


def test_404_and_unreachable_host_are_one_line(server, tmp_path):
    endpoint, _, _ = server
    out = tmp_path / 'pretrained'
    with pytest.raises(InputError, match=r'^http://127\.0\.0\.1:\d+/authors/tiny/resolve/main/ckpt/gone_x4\.pth: '
                                         r'HTTP 404 Not Found$'):
        fetch('Gone_x4', out, endpoint)
    with socket_closed() as port:
        with pytest.raises(fw.Unreachable, match=r'^cannot reach 127\.0\.0\.1:\d+ \(.*refused.*\): no network'):
            fetch('Tiny_x4', out, f'http://127.0.0.1:{port}')
    assert listing_of(out) == []


class socket_closed:
    """A local port nothing listens on."""

    def __enter__(self):
        import socket
        self.sock = socket.socket()
        self.sock.bind(('127.0.0.1', 0))
        return self.sock.getsockname()[1]

    def __exit__(self, *exc):
        self.sock.close()


def test_wrong_network_and_manual_release(server, tmp_path):
    endpoint, files, _ = server
    other = dict(TINY, dim=16)
    torch.save({'params': build_network(other).state_dict()}, tmp_path / 'other.pth')
    files['tiny_x4.pth'] = (tmp_path / 'other.pth').read_bytes()
    out = tmp_path / 'pretrained'
    with pytest.raises(InputError, match='not a complete SAFMN checkpoint, not kept: Tiny_x4: checkpoint .* does not '
                                         'fit network SAFMN: keys .* with another shape'):
        fetch('Tiny_x4', out, endpoint)
    assert listing_of(out) == []
    # No direct link: the user is told where to get it; once there (params_ema here), it is checked and recorded.
    with pytest.raises(InputError, match=r'^Drive_x4 has no direct download: .*Google Drive https://drive.google.com/x'
                                         r'\. Download it by hand to .*Drive_x4\.pth, then run python '
                                         r'scripts/fetch_weights\.py Drive_x4'):
        fetch('Drive_x4', out, endpoint)
    data = checkpoint_bytes(out / 'Drive_x4.pth', seed=2, key='params_ema')
    assert 'checked (loads into SAFMN); SHA-256' in fetch('Drive_x4', out, endpoint)
    assert fw.read_lock(str(out)) == {'Drive_x4.pth': hashlib.sha256(data).hexdigest()}


def test_command_line_list_and_unreachable(tmp_path):
    env = dict(os.environ, HF_ENDPOINT='http://127.0.0.1:9', PYTHONPATH=str(REPO))
    script = str(REPO / 'scripts' / 'fetch_weights.py')
    listed = subprocess.run([sys.executable, script, '--list', '--dir', str(tmp_path)], env=env, capture_output=True,
                            text=True, check=True).stdout
    for name in ('MambaIR_SR_x4', 'HAT_SRx4', 'SAFMN_DF2K_x4'):
        assert name in listed
    assert 'from http://127.0.0.1:9/cguoh/MambaIR/resolve/main/' in listed and 'by hand: Google Drive' in listed
    result = subprocess.run([sys.executable, script, 'SAFMN_DF2K_x4', '--dir', str(tmp_path / 'p')], env=env,
                            capture_output=True, text=True)
    assert result.returncode == 2 and 'Traceback' not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith('error: cannot reach 127.0.0.1:9 (')
    assert not (tmp_path / 'p' / 'SAFMN_DF2K_x4.pth').exists()


@pytest.mark.parametrize('flags, message', [
    (['--dir', '{file}', 'HAT_SRx4'], "--dir '{file}' is a file; expected the folder the weights go to (made when absent)"),
    (['--dir', '{file}', '--list'], "--dir '{file}' is a file; expected the folder the weights go to (made when absent)"),
    (['--lst'], 'unrecognized arguments: --lst (python scripts/fetch_weights.py -h lists the flags)'),
])
def test_bad_flags_are_one_line(tmp_path, capsys, flags, message):
    """A file as --dir was a FileExistsError traceback (and listed every release as 'not downloaded')."""
    (tmp_path / 'weights').write_text('')
    with pytest.raises(SystemExit) as exit_info:
        fw.main([f.format(file=tmp_path / 'weights') for f in flags])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"error: {message.format(file=tmp_path / 'weights')}\n"


@pytest.mark.parametrize('name,keys', [('MambaIR_SR_x4', 'MambaIR_SR_x4'), ('HAT_SRx4', 'HAT_SRx4'),
                                       ('SAFMN_DF2K_x4', 'SAFMN_x4')])
def test_each_release_is_checked_against_its_upstream_layout(name, keys):
    """The network a release is checked with has exactly the keys and shapes of the upstream released file
    (tests/data/arch_keys, produced from the upstream code), so the real file loads strictly."""
    with open(REPO / 'tests' / 'data' / 'arch_keys' / f'{keys}.json') as handle:
        reference = json.load(handle)
    with torch.device('meta'):
        network = build_network(dict(rel.releases()[name].network))
    assert [(k, list(v.shape)) for k, v in network.state_dict().items()] == list(reference['state_dict'].items())


def test_release_names_resolve_to_pretrained(tmp_path, monkeypatch):
    monkeypatch.setattr(rel, 'PRETRAINED_DIR', str(tmp_path))
    assert rel.resolve_checkpoint('runs/net_g_latest.pth') == 'runs/net_g_latest.pth'
    with pytest.raises(InputError, match=r"^checkpoint 'HAT_SRx4' is the released model .*HAT_SRx4\.pth, which is not "
                                         r'there yet: run python scripts/fetch_weights\.py HAT_SRx4$'):
        rel.resolve_checkpoint('HAT_SRx4')
    (tmp_path / 'HAT_SRx4.pth').write_bytes(b'x')
    assert rel.resolve_checkpoint('HAT_SRx4') == str(tmp_path / 'HAT_SRx4.pth')
    assert rel.fetch_hint('pretrained/SAFMN_DF2K_x4.pth') == (' (the released SAFMN_DF2K_x4: python '
                                                              'scripts/fetch_weights.py SAFMN_DF2K_x4)')


def test_release_names_work_as_checkpoints(tmp_path, monkeypatch):
    """inference.py --checkpoint, test.py checkpoints and path.pretrain_network_g all load through load_weights."""
    from basicsr_ldt.inference.api import load_network
    from basicsr_ldt.pipelines.upscale import main as upscale_main
    from basicsr_ldt.weights.checkpoint import load_weights
    monkeypatch.setattr(rel, 'PRETRAINED_DIR', str(tmp_path))
    monkeypatch.chdir(tmp_path)
    released = build_network(dict(rel.releases()['SAFMN_DF2K_x4'].network))
    torch.save({'params': released.state_dict()}, tmp_path / 'SAFMN_DF2K_x4.pth')
    network = load_network('SAFMN_DF2K_x4', arch='SAFMN', device='cpu')
    assert all(torch.equal(a, b) for a, b in zip(network.state_dict().values(), released.state_dict().values()))
    # inference.py: the release name alone gives the file and its network.
    cv2.imwrite(str(tmp_path / 'photo.png'), np.full((12, 10, 3), 128, np.uint8))
    assert upscale_main(['--input', str(tmp_path / 'photo.png'), '--output', str(tmp_path / 'out'),
                         '--checkpoint', 'SAFMN_DF2K_x4', '--device', 'cpu']) == 0
    assert cv2.imread(str(tmp_path / 'out' / 'photo_x4.png')).shape == (48, 40, 3)
    with pytest.raises(InputError, match=r"^checkpoint 'HAT_SRx4' is the released model"):
        load_weights(torch.nn.Conv2d(3, 3, 3), 'HAT_SRx4')
    with pytest.raises(InputError, match=r"^checkpoint 'pretrained/HAT_SRx4\.pth' does not exist \(the released "
                                         r'HAT_SRx4: python scripts/fetch_weights\.py HAT_SRx4\)$'):
        load_weights(torch.nn.Conv2d(3, 3, 3), 'pretrained/HAT_SRx4.pth')


def test_a_published_checksum_holds_from_the_first_download(server, tmp_path):
    """A release whose authors publish its SHA-256 is checked against it before anything is kept: a
    first download that differs is refused (trust-on-first-use would have pinned it)."""
    endpoint, files, _ = server
    good = checkpoint_bytes(tmp_path / 'good.pth', seed=0)
    other = checkpoint_bytes(tmp_path / 'other.pth', seed=1)
    published = hashlib.sha256(good).hexdigest()
    table = {'Pinned_x4': rel.Release(TINY, PAGE, repo='authors/tiny', file='ckpt/pinned_x4.pth', sha256=published,
                                      sha256_source='the LFS pointer')}
    out = tmp_path / 'pretrained'
    files['pinned_x4.pth'] = other
    with pytest.raises(InputError, match=f'but its authors publish {published} \\(the LFS pointer\\)'):
        fw.fetch('Pinned_x4', str(out), table, endpoint=endpoint, progress=False, say=lambda line: None)
    assert listing_of(out) == []   # nothing kept, no lock written
    files['pinned_x4.pth'] = good
    fw.fetch('Pinned_x4', str(out), table, endpoint=endpoint, progress=False, say=lambda line: None)
    assert (out / 'Pinned_x4.pth').read_bytes() == good
    assert fw.read_lock(str(out)) == {'Pinned_x4.pth': published}


def test_safmn_release_is_pinned_to_its_published_checksum():
    """SAFMN_DF2K_x4.pth on huggingface.co/Meloo/SAFMN: its Git LFS pointer publishes this SHA-256."""
    release = rel.releases()['SAFMN_DF2K_x4']
    assert release.sha256 == 'fe4f38fd6c1e3692bfbc6ab94f44adb815bfb54984b8886547657727af67f49d'
    assert 'published by its authors, pinned before download' in fw.listing(table={'SAFMN_DF2K_x4': release})


def state_with(change):
    """A Tiny_x4 checkpoint's bytes after ``change`` edited its state dict (a key dropped or added)."""
    torch.manual_seed(0)
    state = build_network(dict(TINY)).state_dict()
    change(state)
    buffer = io.BytesIO()
    torch.save({'params': state}, buffer)
    return buffer.getvalue()


KEY_PROBLEMS = {
    'missing': (lambda s: s.pop(sorted(s)[0]), '1 missing'),
    'unexpected': (lambda s: s.update(extra_head=torch.zeros(3)), "1 unexpected (e.g. extra_head)"),
}


@pytest.mark.parametrize('problem', sorted(KEY_PROBLEMS))
def test_a_file_with_other_keys_is_not_kept(server, tmp_path, problem):
    """Every shape fits, only the key set differs: the strict load refuses it, so nothing is kept or
    pinned, whether it was downloaded or put there by hand."""
    change, message = KEY_PROBLEMS[problem]
    endpoint, files, _ = server
    files['tiny_x4.pth'] = state_with(change)
    out = tmp_path / 'pretrained'
    with pytest.raises(InputError, match=f'not a complete SAFMN checkpoint, not kept: .* keys {re.escape(message)}'):
        fetch('Tiny_x4', out, endpoint)
    assert listing_of(out) == []
    (out / 'Drive_x4.pth').write_bytes(files['tiny_x4.pth'])
    with pytest.raises(InputError, match=f'Drive_x4.pth is there but not usable: Drive_x4: .* keys {re.escape(message)}'):
        fetch('Drive_x4', out, endpoint)
    assert listing_of(out) == ['Drive_x4.pth']          # no lock entry for it


def test_recording_a_release_keeps_the_pins_of_the_others(server, tmp_path):
    """Three releases in one folder, pinned one after another (downloaded, by hand, downloaded): the
    lock ends with all three lines and sha256sum checks all three files."""
    endpoint, files, _ = server
    table = {**TABLE, 'Second_x4': rel.Release(TINY, PAGE, repo='authors/tiny', file='ckpt/second_x4.pth')}
    out = tmp_path / 'pretrained'
    files['tiny_x4.pth'] = checkpoint_bytes(tmp_path / 'a.pth', seed=0)
    files['second_x4.pth'] = checkpoint_bytes(tmp_path / 'b.pth', seed=1)
    digests = {'Tiny_x4.pth': hashlib.sha256(files['tiny_x4.pth']).hexdigest(),
               'Second_x4.pth': hashlib.sha256(files['second_x4.pth']).hexdigest()}

    def lock_lines():
        return (out / 'weights.lock').read_text().splitlines()[1:]

    def run(name):
        return fw.fetch(name, str(out), table, endpoint=endpoint, progress=False, say=lambda line: None)

    run('Tiny_x4')
    digests['Drive_x4.pth'] = hashlib.sha256(checkpoint_bytes(out / 'Drive_x4.pth', seed=2)).hexdigest()
    run('Drive_x4')
    assert lock_lines() == [f"{digests[n]}  {n}" for n in ('Drive_x4.pth', 'Tiny_x4.pth')]
    run('Second_x4')
    assert lock_lines() == [f"{digests[n]}  {n}" for n in ('Drive_x4.pth', 'Second_x4.pth', 'Tiny_x4.pth')]
    assert run('Tiny_x4').endswith('skipped') and len(lock_lines()) == 3
    check = subprocess.run(['sha256sum', '-c', 'weights.lock'], cwd=out, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.count(': OK') == 3


def test_a_lock_written_by_sha256sum_is_read(server, tmp_path):
    """A lock the user regenerated with ``sha256sum -b`` (``*name``, any case, comments) pins the same
    files: a matching file is skipped, a changed one refused."""
    endpoint, files, requests = server
    out = tmp_path / 'pretrained'
    out.mkdir()
    data = checkpoint_bytes(out / 'Tiny_x4.pth', seed=0)
    (out / 'weights.lock').write_text(f'# mine\n\n{hashlib.sha256(data).hexdigest().upper()} *Tiny_x4.pth\n')
    lock = (out / 'weights.lock').read_text()
    assert fetch('Tiny_x4', out, endpoint).endswith('present and checked (SHA-256 as recorded), skipped')
    assert (out / 'weights.lock').read_text() == lock and requests == []
    checkpoint_bytes(out / 'Tiny_x4.pth', seed=1)
    with pytest.raises(InputError, match=r'Tiny_x4\.pth is there but not usable: .* but weights\.lock recorded'):
        fetch('Tiny_x4', out, endpoint)


def test_a_mirror_endpoint_with_a_trailing_slash(server, tmp_path):
    """HF_ENDPOINT=https://mirror/ (as mirrors often tell users to set it) gives the same URLs as without the
    slash, in what fetch says it downloads and in --list (a local server cannot tell: it folds '//' itself)."""
    endpoint, files, _ = server
    files['tiny_x4.pth'] = checkpoint_bytes(tmp_path / 'a.pth', seed=0)
    said = []
    fw.fetch('Tiny_x4', str(tmp_path / 'pretrained'), TABLE, endpoint=endpoint + '/', progress=False, say=said.append)
    url = f'{endpoint}/authors/tiny/resolve/main/ckpt/tiny_x4.pth'
    assert said == [f"Tiny_x4: downloading {url} to {tmp_path / 'pretrained' / 'Tiny_x4.pth'}"]
    assert f'    from {url}\n' in fw.listing(str(tmp_path / 'pretrained'), TABLE, endpoint=endpoint + '//')


def test_a_dropped_connection_is_one_line(server, tmp_path):
    endpoint, files, _ = server
    files['drop_x4.pth'] = b'never sent'
    with pytest.raises(InputError, match=rf'^the download of {endpoint}/authors/tiny/resolve/main/ckpt/drop_x4\.pth was '
                                         r'interrupted \(RemoteDisconnected: Remote end closed connection'):
        fetch('Drop_x4', tmp_path / 'pretrained', endpoint)
    assert listing_of(tmp_path / 'pretrained') == []


def test_the_download_goes_to_a_hidden_folder_beside_the_target(server, tmp_path):
    """The transfer lands in ``pretrained/.<name>.<random>.download`` (same file system: the final rename is
    atomic; hidden: a killed transfer is not mistaken for a release) and the folder is gone afterwards."""
    endpoint, files, _ = server
    files['tiny_x4.pth'] = checkpoint_bytes(tmp_path / 'a.pth', seed=0)
    out = tmp_path / 'pretrained'
    during = []
    fw.fetch('Tiny_x4', str(out), TABLE, endpoint=endpoint, progress=False, say=lambda line: during.extend(listing_of(out)))
    assert len(during) == 1 and re.fullmatch(r'\.Tiny_x4\..+\.download', during[0]), during
    assert listing_of(out) == ['Tiny_x4.pth', 'weights.lock']


def test_hf_endpoint_and_the_default_table(server, tmp_path, monkeypatch):
    """Without an explicit endpoint HF_ENDPOINT is used (a mirror); without a table the project's releases
    are, and a misspelt name lists them."""
    endpoint, files, requests = server
    files['tiny_x4.pth'] = checkpoint_bytes(tmp_path / 'a.pth', seed=0)
    monkeypatch.setenv('HF_ENDPOINT', endpoint)
    fw.fetch('Tiny_x4', str(tmp_path / 'pretrained'), TABLE, progress=False, say=lambda line: None)
    assert requests == ['/authors/tiny/resolve/main/ckpt/tiny_x4.pth']
    with pytest.raises(InputError, match=r"^unknown release 'SAFMN_x4'; known: MambaIR_SR_x4, HAT_SRx4, SAFMN_DF2K_x4 "
                                         r'\(python scripts/fetch_weights\.py --list\)$'):
        fw.fetch('SAFMN_x4', str(tmp_path / 'pretrained'))


def test_a_malformed_lock_line_is_named(tmp_path):
    (tmp_path / 'weights.lock').write_text('# pins\n\n' + 'a' * 64 + '  Tiny_x4.pth\nabc Second.pth\n')
    with pytest.raises(InputError, match=r"weights\.lock, line 4: expected '<sha256>  <file name>', got 'abc Second\.pth'$"):
        fw.read_lock(str(tmp_path))


def test_where_each_release_comes_from(tmp_path):
    """The authors' files that fetch_weights.py downloads (Hugging Face path under the endpoint), and the
    by-hand source of the one without a direct link, as --list shows them."""
    listed = fw.listing(str(tmp_path), endpoint='https://mirror.example')
    assert '    from https://mirror.example/cguoh/MambaIR/resolve/main/MambaIRv1_ckpt/MambaIR_classicSRx4.pth\n' in listed
    assert '    from https://mirror.example/Meloo/SAFMN/resolve/main/SAFMN_DF2K_x4.pth\n' in listed
    assert ('    from by hand: Google Drive https://drive.google.com/drive/folders/1HpmReFfoUqUbnAOQ7rvOeNU3uf_m69w0 or '
            'Baidu Netdisk https://pan.baidu.com/s/1u2r4Lc2_EEeQqra2-w85Xg (access code qyrl), file HAT_SRx4.pth\n') in listed
