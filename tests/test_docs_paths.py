"""What the documentation names exists, so that a rename cannot leave a page stale (issue 55).

Checked files: every Markdown file git tracks except CHANGELOG.md (README.md, docs/*.md, the
READMEs of archs/, datasets/ and basicsr_ldt/ldt/); CHANGELOG.md is history and may name what was
removed, so only its links are checked. tests/test_docs_links.py checks links and anchors; this
file checks, anywhere in the text (prose, code spans, code blocks):

* Repository paths: a token that starts with a tracked top-level folder (``archs/``,
  ``basicsr_ldt/``, ``docs/``, ``options/``, ``scripts/``, ``tests/``, ``.ci/``,
  ``pretrained/demo/``, ``datasets/README.md``) or names a root file (``Train_pip.py``,
  ``test.py``, ``inference.py``, ``requirements*.txt``, ``pytest.ini``, ...) must exist on the
  filesystem. ``<arch>`` and ``*`` stand for any part of a name and ``{a,b}`` for each of a and b
  (every alternative must exist), as in tests/test_docs_links.py. Outputs and downloads are not
  checked: ``results/``, ``experiments/``, ``tb_logger/``, ``datasets/<anything but README.md>``,
  ``pretrained/<anything outside demo/>``.
* Test ids: ``tests/<file>.py::<test>`` must name a function or class of that file.
* Bare script and option-file names (``bench_ldt.py``, ``train_demo_ldt.yml``: a name without a
  folder, ending in .py, .sh or .yml) must be the name of a tracked file, unless listed in
  ``EXTERNAL_FILES`` (files of the official LDT code, upstream repositories and tools the pages
  cite).
* Option keys of the ``ldt:``, ``val:`` and ``test:`` sections, written ``ldt.ratio_u``,
  ``val.best_network``, ``test.compare.crops``, ``--force_yml ... test:tile_mode=whole``,
  ``ldt: {method: ldt_s}`` or ``ldt: method:``, must be keys those sections accept, and a
  ``method`` value one of the methods. Where the option schema of issue 56
  (``basicsr_ldt.common.schema.section_keys``) is importable it gives the keys; otherwise the lists
  below, read from the code that checks each section.

And: the README's test command is the one ``.ci/run`` runs, and the size limits of issue 55 hold.
"""
import ast
import re
import subprocess
from pathlib import Path

import pytest

from test_docs_links import REPO, link_problems, missing_paths, prose_lines

# --------------------------------------------------------------------------------------- the files
HISTORY = 'CHANGELOG.md'


def tracked(root=REPO):
    out = subprocess.run(['git', 'ls-files'], cwd=root, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line]


def markdown_files(root=REPO, files=None):
    names = [f for f in (files if files is not None else tracked(root)) if f.endswith('.md')]
    return [root / f for f in sorted(names) if f != HISTORY and (root / f).exists()]


# ----------------------------------------------------------------------------------------- paths
ROOT_FILES = r'Train_pip\.py|test\.py|inference\.py|requirements(?:-gpu)?\.txt|pytest\.ini|README\.md|CHANGELOG\.md'
FOLDERS = r'archs|basicsr_ldt|docs|options|scripts|tests|\.ci|pretrained/demo|datasets/README\.md'
PATH = re.compile(
    r'(?<![\w./<>{}*-])('
    rf'(?:{FOLDERS})(?:/[\w.<>{{}},*-]*)*'
    rf'|(?:{ROOT_FILES})'
    r')(?![\w/])')
TEST_ID = re.compile(r'(?<![\w./-])(tests/[\w/]+\.py)::([A-Za-z_]\w*)')
BARE_FILE = re.compile(r'(?<![\w./<>{}*-])([A-Za-z][\w-]*\.(?:py|sh|yml))(?![\w/])')   # not _lpft.yml
# Files the pages name that are not in this repository (the official LDT code, upstream projects,
# the tools they cite) or that a command writes. Add a name here only when it is not one of ours.
EXTERNAL_FILES = {
    'Selecte_layer_tools.py', 'Test_tool.py', 'DG_validation_dataset.py', 'trainer.py',   # LDT, CorGrad code
    'setup.py', 'constant.py',                     # BasicSR's and mamba-ssm's setup.py, DADA's constant.py
    'jobs.sh',                                     # scripts/study.py --commands jobs.sh writes it
}


def _test_names(path):
    tree = ast.parse(path.read_text(encoding='utf-8'))
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def path_problems(files, root=REPO, tracked_files=None):
    """``file:line: what`` for every named repository path, test id and bare file name that is missing."""
    names = {Path(f).name for f in (tracked_files if tracked_files is not None else tracked(root))}
    problems = []
    for md in files:
        where = md.relative_to(root)
        for number, line in enumerate(md.read_text(encoding='utf-8').split('\n'), 1):
            for match in PATH.finditer(line):
                named = match.group(1).rstrip('.,;:')
                problems += [f'{where}:{number}: {named!r}: {what}' for what in missing_paths(named, root)]
            for match in TEST_ID.finditer(line):
                test_file = root / match.group(1)
                if test_file.exists() and match.group(2) not in _test_names(test_file):
                    problems.append(f'{where}:{number}: {match.group(0)!r}: no test {match.group(2)} '
                                    f'in {match.group(1)}')
            for match in BARE_FILE.finditer(line):
                name, before = match.group(1), line[match.start() - 1:match.start()]
                if before in ('"', "'") and line[match.end():match.end() + 1] == before:
                    continue      # a quoted name is an example in a message ('x.yml'), not a file of ours
                if name not in names and name not in EXTERNAL_FILES and not re.fullmatch(ROOT_FILES, name):
                    problems.append(f'{where}:{number}: {name!r}: no tracked file of that name '
                                    f'(or add it to EXTERNAL_FILES if it is not ours)')
    return problems


# ------------------------------------------------------------------------------------ option keys
# The keys each section accepts, read from the code that checks it, for when the option schema of
# issue 56 (basicsr_ldt.common.schema.section_keys) is not there to ask:
# val: basicsr_ldt/models/validation.py VAL_KEYS (BasicSR's val_freq, save_img, suffix, pbar, metrics;
#   best.py's selection keys; inference/settings.py's four inference keys);
# test: basicsr_ldt/pipelines/evaluate.py TEST_DEFAULTS (the inference keys, save_img, crop_border,
#   test_y_channel, compare);
# ldt: `method`, the fields of LDTConfig (basicsr_ldt/ldt/config.py SPECS) and of CorGradConfig.
FALLBACK_KEYS = {
    'val': ('val_freq', 'save_img', 'suffix', 'pbar', 'metrics', 'save_best', 'best_metric', 'best_dataset',
            'best_network', 'tile_mode', 'tile_size', 'tile_overlap', 'precision'),
    'test': ('tile_mode', 'tile_size', 'tile_overlap', 'precision', 'save_img', 'crop_border', 'test_y_channel',
             'compare'),
}
# test.compare's own keys (basicsr_ldt/inference/compare.py COMPARE_DEFAULTS).
COMPARE_KEYS = ('crops', 'size', 'methods')


def ldt_keys():
    import dataclasses
    from basicsr_ldt.corgrad import CorGradConfig
    from basicsr_ldt.ldt.config import SPECS
    return ('method',) + tuple(SPECS) + tuple(f.name for f in dataclasses.fields(CorGradConfig))


def known_keys(section):
    try:
        from basicsr_ldt.common.schema import section_keys
    except ImportError:
        section_keys = None
    if section_keys is not None:
        keys = section_keys(section)
        if keys is not None:
            return tuple(keys)
    return ldt_keys() if section == 'ldt' else FALLBACK_KEYS[section]


def methods():
    from basicsr_ldt.ldt.config import PRESETS
    return tuple(PRESETS) + ('corgrad',)


DOTTED = re.compile(r'(?<![\w./-])(ldt|val|test)((?:\.[A-Za-z_*][\w*]*)+)')
FORCED = re.compile(r'(?<![\w.:-])(ldt|val|test):([A-Za-z_]\w*)(?:\.\w+)*=')
INLINE = re.compile(r'(?<![\w.-])(ldt|val|test):\s*\{([^{}]*)\}')
SPOKEN = re.compile(r'(?<![\w.-])(ldt|val|test): ([a-z_]+):')
NOT_KEYS = {'py', 'yml', 'md', 'sh'}     # test.py, options/test.yml


def yaml_block_keys(text):
    """{line of a ```yaml block's opening: [(section, [key, sub-key], text)]} for the ``ldt:``,
    ``val:`` and ``test:`` sections of every fenced YAML block (one that does not parse is left to
    the eye)."""
    import yaml
    found, lines = {}, text.split('\n')
    for start, line in enumerate(lines):
        if re.match(r'^\s*```ya?ml\s*$', line):
            end = next((i for i in range(start + 1, len(lines)) if lines[i].strip().startswith('```')), len(lines))
            try:
                block = yaml.safe_load('\n'.join(lines[start + 1:end]))
            except yaml.YAMLError:
                continue
            for section in ('ldt', 'val', 'test'):
                value = block.get(section) if isinstance(block, dict) else None
                for key, sub in (value.items() if isinstance(value, dict) else ()):
                    named = found.setdefault(start + 1, [])
                    named.append((section, [str(key)], f'yaml {section}: {key}'))
                    if key == 'compare' and isinstance(sub, dict):
                        named += [(section, ['compare', str(k)], f'yaml {section}: compare: {k}') for k in sub]
    return found


def _key_matches(key, keys):
    return any(re.fullmatch(re.escape(key).replace(r'\*', '.*'), k) for k in keys)


def key_problems(files, root=REPO, keys=known_keys, method_names=methods):
    """``file:line: what`` for every named ``ldt:``/``val:``/``test:`` key (or method) the code does not accept."""
    cache = {}

    def accepted(section):
        if section not in cache:
            cache[section] = keys(section)
        return cache[section]

    problems = []
    for md in files:
        where = md.relative_to(root)
        yaml_keys = yaml_block_keys(md.read_text(encoding='utf-8'))
        for number, line in enumerate(md.read_text(encoding='utf-8').split('\n'), 1):
            named = []
            for match in DOTTED.finditer(line):
                parts = match.group(2).lstrip('.').split('.')
                if parts[0] not in NOT_KEYS:
                    named.append((match.group(1), parts, match.group(0)))
            for match in FORCED.finditer(line):
                named.append((match.group(1), [match.group(2)], match.group(0)))
            for match in SPOKEN.finditer(line):
                named.append((match.group(1), [match.group(2)], match.group(0)))
            for match in INLINE.finditer(line):
                for key, value in re.findall(r'([A-Za-z_]\w*)\s*:\s*([^,{}]*)', match.group(2)):
                    named.append((match.group(1), [key], match.group(0)))
                    value = value.strip()
                    if match.group(1) == 'ldt' and key == 'method' and re.fullmatch(r'\w+', value) \
                            and value not in method_names():
                        problems.append(f'{where}:{number}: {match.group(0)!r}: no method {value!r}')
            for section, parts, text in named + yaml_keys.get(number, []):
                if not _key_matches(parts[0], accepted(section)):
                    problems.append(f'{where}:{number}: {text!r}: {section}: has no key {parts[0]!r}')
                elif section == 'test' and parts[0] == 'compare' and len(parts) > 1 \
                        and not _key_matches(parts[1], COMPARE_KEYS):
                    problems.append(f'{where}:{number}: {text!r}: test.compare has no key {parts[1]!r}')
    return problems


# ---------------------------------------------------------------------------------------- the tests
def test_every_named_repository_path_test_and_file_exists():
    problems = path_problems(markdown_files())
    assert not problems, f'{len(problems)} missing name(s):\n' + '\n'.join(problems)


def test_every_named_option_key_is_one_the_code_accepts():
    problems = key_problems(markdown_files())
    assert not problems, f'{len(problems)} unknown key(s):\n' + '\n'.join(problems)


def test_the_changelogs_links_resolve():
    problems = link_problems([REPO / HISTORY])
    assert not problems, '\n'.join(problems)


def test_the_readmes_test_command_is_the_one_ci_runs():
    commands = [line.strip() for line in (REPO / '.ci' / 'run').read_text().splitlines()
                if line.strip() and not line.startswith('#') and not line.startswith(('set ', 'cd '))]
    assert commands == ['bash scripts/run_tests.sh'], commands
    code = [line.split('#')[0].strip() for _, line in prose_lines((REPO / 'README.md').read_text(), blank_code=False)
            if line.startswith('    ')]
    assert commands[0] in code and 'bash scripts/demo.sh' in code, code


LIMITS = {'README.md': 150, 'archs/README.md': 250}
DOCS_PAGE_LIMIT, ALL_MARKDOWN_LIMIT = 300, 2000


def test_the_documentation_stays_within_its_size():
    """Issue 55: README at most 150 lines, a docs page 300, archs/README.md 250, all Markdown
    (CHANGELOG.md included) 2,000."""
    lines = {f: len((REPO / f).read_text(encoding='utf-8').splitlines())
             for f in tracked() + [HISTORY] if f.endswith('.md') and (REPO / f).exists()}
    over = [f'{f}: {n} lines > {LIMITS[f]}' for f, n in lines.items() if f in LIMITS and n > LIMITS[f]]
    over += [f'{f}: {n} lines > {DOCS_PAGE_LIMIT}' for f, n in lines.items()
             if f.startswith('docs/') and n > DOCS_PAGE_LIMIT]
    total = sum(lines.values())
    if total > ALL_MARKDOWN_LIMIT:
        over.append(f'all Markdown: {total} lines > {ALL_MARKDOWN_LIMIT}')
    assert not over, '\n'.join(over)


def test_the_checks_catch_a_renamed_path_test_file_and_key(tmp_path):
    """The checkers themselves, on a tree of their own: a path, a test id, a bare file name, an
    option key and a method that do not exist are each reported with file and line; what exists
    (placeholders, braces, outputs, keys written every way) is not."""
    for name in ('scripts/run.sh', 'options/train_a_ldt.yml', 'options/train_a_ft.yml', 'docs/b.md',
                 'Train_pip.py', 'test.py', 'pretrained/demo/start.pth'):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text('')
    (tmp_path / 'tests').mkdir()
    (tmp_path / 'tests' / 'test_x.py').write_text('def test_here():\n    """x"""\n')
    (tmp_path / 'README.md').write_text(
        'ok `scripts/run.sh`, options/train_<arch>_{ldt,ft}.yml, `Train_pip.py`, `run.sh`, results/x/y.md,\n'
        'datasets/DRealSR/Train_x4, pretrained/HAT_SRx4.pth, pretrained/demo/start.pth, tests/test_x.py::test_here\n'
        '`ldt.ratio_u`, `ldt.w_base_*`, `val.tile_mode`, `test.compare.crops`, test.py, `ldt: {method: ldt_s}`\n'
        '    python test.py -opt options/test_a.yml --force_yml test:tile_mode=whole ldt:ema_every=5\n'
        'gone `scripts/gone.sh` and tests/test_x.py::test_gone and `renamed.py`\n'
        'keys `ldt.ratio`, `val.tile_mod`, `test.compare.crop` and `ldt: {method: ldt_fast}` ldt:w_fixd=1\n'
        '```yaml\nval:\n  tile_mode: official\n  tile_mod: fixed\ntest:\n  compare: {crops: 2, sizes: 3}\n```\n')
    files = [tmp_path / 'README.md']
    paths = path_problems(files, tmp_path, tracked_files=['scripts/run.sh', 'Train_pip.py', 'test.py'])
    assert [p.split(': ')[0] for p in paths] == ['README.md:4', 'README.md:5', 'README.md:5', 'README.md:5'], paths
    assert "'options/test_a.yml'" in paths[0] and "'scripts/gone.sh'" in paths[1] and 'test_gone' in paths[2] \
        and "'renamed.py'" in paths[3], paths
    keys = {'ldt': ('ratio_u', 'w_base_stable', 'ema_every', 'method', 'w_fixed'), 'val': ('tile_mode',),
            'test': ('tile_mode', 'compare')}
    problems = key_problems(files, tmp_path, keys=keys.get, method_names=lambda: ('ldt', 'ldt_s'))
    assert [p.split(': ')[0] for p in problems] == ['README.md:6'] * 5 + ['README.md:7'] * 2, problems
    for wrong in ("'ratio'", "'tile_mod'", "'crop'", "'ldt_fast'", "'w_fixd'", "'sizes'"):
        assert any(wrong in p for p in problems), (wrong, problems)


def test_the_ldt_readme_names_every_config_key():
    """Nothing a user of the core needs is lost: basicsr_ldt/ldt/README.md names every LDTConfig key."""
    from basicsr_ldt.ldt.config import SPECS
    text = (REPO / 'basicsr_ldt' / 'ldt' / 'README.md').read_text(encoding='utf-8')
    missing = [key for key in SPECS if f'`{key}`' not in text]
    assert not missing, missing
