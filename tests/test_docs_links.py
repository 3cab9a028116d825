"""The documentation's links and the files it names exist.

Checked files: README.md, every docs/*.md, and the READMEs of archs/, datasets/ and
basicsr_ldt/ldt/.

Links. Every relative markdown link ``[text](target)`` or ``[text](target#anchor)`` outside code
(fenced blocks and inline code spans are skipped, so a formula such as ``a[t](C[t] dy[t])`` in
backticks is not a link) must name a file or folder that exists, relative to the markdown file.
An anchor must be the GitHub slug of a heading of the target file (lowercase; every character
other than a letter, digit, space, hyphen or underscore dropped, backticks and dots included;
spaces become hyphens; a repeated heading gets -1, -2, ...); ``(#anchor)`` alone is a heading of
the same file. http(s) and mailto links are not checked (no network).

Named files. Every path written anywhere in the text (prose, code spans, code blocks) that
matches ``options/...yml``, ``scripts/...py|sh``, ``basicsr_ldt/...py`` or ``archs/...py`` must
exist, relative to the repository root. A path with a placeholder must match at least one file:
``<arch>`` and ``*`` stand for any part of a name, ``{a,b}`` for each of a and b (every
alternative must exist).

Outputs and downloads are not sources and are not checked: the four patterns above never name
them, and a relative link into results/, experiments/, tb_logger/, datasets/ or pretrained/ (the
git-ignored output and download folders) need not exist unless the file is in git (e.g.
datasets/README.md, which is then checked like any other).

Each test reports every problem at once, one line each: ``file:line: what``.
"""
import glob
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXTRA_READMES = ['archs/README.md', 'datasets/README.md', 'basicsr_ldt/ldt/README.md']
OUTPUT_FOLDERS = {'results', 'experiments', 'tb_logger', 'datasets', 'pretrained'}

FENCE = re.compile(r'^\s*(```|~~~)')
INLINE_CODE = re.compile(r'(`+)(.+?)\1')
LINK = re.compile(r'\[([^\]\n]*)\]\(\s*([^)\s]+)(?:\s+"[^"]*")?\s*\)')
HEADING = re.compile(r'^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$')
NAMED_PATH = re.compile(
    r'(?<![\w./<>{}*-])('
    r'options/[\w./<>{},*-]*?\.yml'
    r'|scripts/[\w./<>{},*-]*?\.(?:py|sh)'
    r'|(?:basicsr_ldt|archs)/[\w./<>{},*-]*?\.py'
    r')(?![\w])')


def doc_files(root=REPO):
    files = [root / 'README.md'] + sorted((root / 'docs').glob('*.md'))
    files += [root / name for name in EXTRA_READMES if (root / name).exists()]
    return files


def prose_lines(text, blank_code=True):
    """(line number, line) outside fenced code blocks; inline code spans blanked unless told."""
    in_fence = None
    for number, line in enumerate(text.split('\n'), 1):
        fence = FENCE.match(line)
        if fence:
            if in_fence is None:
                in_fence = fence.group(1)
            elif fence.group(1) == in_fence:
                in_fence = None
            continue
        if in_fence is None:
            yield number, INLINE_CODE.sub(lambda m: ' ' * len(m.group(0)), line) if blank_code else line


def slug(heading):
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading)   # a link in a heading: its text
    text = re.sub(r'[^\w\- ]', '', text.lower())
    return text.replace(' ', '-')


def anchors(path):
    """The GitHub anchors of a markdown file's headings (code in a heading keeps its text)."""
    found, seen = set(), {}
    for _, line in prose_lines(path.read_text(encoding='utf-8'), blank_code=False):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f'{base}-{count}')
    return found


def tracked_or_source(path, root):
    """False for a path inside a git-ignored output/download folder (see the module docstring)."""
    try:
        first = path.resolve().relative_to(root.resolve()).parts[0]
    except (ValueError, IndexError):
        return True
    return first not in OUTPUT_FOLDERS


def link_problems(files, root=REPO):
    problems = []
    for md in files:
        where = md.relative_to(root)
        for number, line in prose_lines(md.read_text(encoding='utf-8')):
            for match in LINK.finditer(line):
                target = match.group(2)
                if re.match(r'^(https?:|mailto:)', target):
                    continue
                if re.match(r'^[a-z][a-z0-9+.-]*:', target):
                    problems.append(f'{where}:{number}: link {target!r}: not a relative path or http(s)')
                    continue
                file_part, _, anchor = target.partition('#')
                dest = (md.parent / file_part).resolve() if file_part else md.resolve()
                try:
                    dest.relative_to(root.resolve())
                except ValueError:
                    problems.append(f'{where}:{number}: link {target!r} leaves the repository')
                    continue
                if not dest.exists():
                    if tracked_or_source(dest, root):
                        problems.append(f'{where}:{number}: link {target!r}: no file or folder '
                                        f'{dest.relative_to(root.resolve())}')
                    continue
                if anchor:
                    if dest.is_dir() or dest.suffix != '.md':
                        problems.append(f'{where}:{number}: link {target!r}: anchor on a file that is not markdown')
                    elif anchor not in anchors(dest):
                        problems.append(f'{where}:{number}: link {target!r}: no heading with slug '
                                        f'{anchor!r} in {dest.relative_to(root.resolve())}')
    return problems


def expand_braces(pattern):
    match = re.search(r'\{([^{}]*)\}', pattern)
    if not match:
        return [pattern]
    out = []
    for alternative in match.group(1).split(','):
        out += expand_braces(pattern[:match.start()] + alternative + pattern[match.end():])
    return out


def path_problems(files, root=REPO):
    problems = []
    for md in files:
        where = md.relative_to(root)
        for number, line in enumerate(md.read_text(encoding='utf-8').split('\n'), 1):
            for match in NAMED_PATH.finditer(line):
                named = match.group(1)
                problems += [f'{where}:{number}: {named!r}: {what}' for what in missing_paths(named, root)]
    return problems


def missing_paths(named, root=REPO):
    """What is missing of the repository path ``named``, one line per alternative that matches no
    file: ``<x>`` stands for any part of a name, ``{a,b}`` for each of a and b; [] when all exist."""
    missing = []
    for candidate in expand_braces(named):
        pattern = re.sub(r'<[^<>/]*>', '*', candidate)
        if not glob.glob(str(root / pattern)):
            missing.append('no such file' if pattern == named else f'no file matches {pattern!r}')
    return missing


def test_doc_files_are_there():
    files = doc_files()
    assert (REPO / 'README.md') in files and len([f for f in files if f.parent.name == 'docs']) >= 5
    assert all(f.exists() for f in files)


def test_every_relative_link_resolves():
    problems = link_problems(doc_files())
    assert not problems, f'{len(problems)} broken link(s):\n' + '\n'.join(problems)


def test_every_named_option_script_and_module_path_exists():
    problems = path_problems(doc_files())
    assert not problems, f'{len(problems)} missing path(s):\n' + '\n'.join(problems)


def test_the_checks_find_broken_links_and_paths(tmp_path):
    """The checker itself: a broken item of every kind is reported, with file and line."""
    (tmp_path / 'docs').mkdir()
    (tmp_path / 'scripts').mkdir()
    (tmp_path / 'options').mkdir()
    (tmp_path / 'scripts' / 'run.sh').write_text('')
    (tmp_path / 'options' / 'train_a_ldt.yml').write_text('')
    (tmp_path / 'docs' / 'b.md').write_text('# B title\n\n## The `val:` keys (x)\n\n```\n# not a heading\n```\n')
    (tmp_path / 'README.md').write_text(
        'ok [b](docs/b.md#b-title) [c](docs/b.md#the-val-keys-x) [d](docs/) [e](https://x.invalid/y)\n'
        'code `a[t](no/such)` is not a link; [out](results/demo/study.md) is an output\n'
        'broken [x](docs/missing.md) and [y](docs/b.md#not-a-heading) [z](#nowhere)\n'
        '    bash scripts/run.sh && bash scripts/gone.sh\n'
        'files `options/train_<arch>_{ldt,ft}.yml`, options/train_*_ldt.yml, basicsr_ldt/x/gone.py\n')
    files = [tmp_path / 'README.md', tmp_path / 'docs' / 'b.md']
    links = link_problems(files, tmp_path)
    assert [p.split(': ')[0] for p in links] == ['README.md:3'] * 3, links
    assert "'docs/missing.md'" in links[0] and 'not-a-heading' in links[1] and '#nowhere' in links[2]
    paths = path_problems(files, tmp_path)
    assert paths == ["README.md:4: 'scripts/gone.sh': no such file",
                     "README.md:5: 'options/train_<arch>_{ldt,ft}.yml': no file matches 'options/train_*_ft.yml'",
                     "README.md:5: 'basicsr_ldt/x/gone.py': no such file"], paths
