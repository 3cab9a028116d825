"""scripts/hand_mutant.py: the check that a new test fails on its behaviour's wrong variant."""
import subprocess
import sys

from conftest import REPO

SCRIPT = str(REPO / 'scripts' / 'hand_mutant.py')


def run(folder, *args):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=folder, capture_output=True, text=True)


def test_a_noticed_mutant_is_killed_an_equivalent_one_survives_and_the_file_is_restored(tmp_path):
    source = 'def add(a, b):\n    return a + b\n'
    (tmp_path / 'calc.py').write_text(source)
    (tmp_path / 'test_calc.py').write_text('from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n')
    killed = run(tmp_path, 'calc.py', 'a + b', 'a - b', 'test_calc.py')
    assert killed.returncode == 0 and killed.stdout.startswith("KILLED: calc.py: 'a + b' -> 'a - b'"), killed
    survived = run(tmp_path, 'calc.py', 'a + b', 'b + a', 'test_calc.py')
    assert survived.returncode == 1 and survived.stdout.startswith('SURVIVED: calc.py'), survived
    deleted = run(tmp_path, 'calc.py', '    return a + b\n', '', 'test_calc.py')   # a mutant that deletes a line
    assert deleted.returncode == 0 and deleted.stdout.startswith("KILLED: calc.py: 'return a + b' -> ''"), deleted
    assert (tmp_path / 'calc.py').read_text() == source


def test_an_ambiguous_or_missing_text_is_refused_and_nothing_changes(tmp_path):
    source = 'x = 1\ny = 1\n'
    (tmp_path / 'm.py').write_text(source)
    twice = run(tmp_path, 'm.py', '= 1', '= 2')
    assert twice.returncode == 2 and "OLD occurs 2 times in 'm.py'; expected exactly once" in twice.stderr
    absent = run(tmp_path, 'm.py', 'z = 1', 'z = 2')
    assert absent.returncode == 2 and 'OLD occurs 0 times' in absent.stderr
    missing = run(tmp_path, 'nope.py', 'a', 'b')
    assert missing.returncode == 2 and "FILE 'nope.py' does not exist" in missing.stderr
    assert (tmp_path / 'm.py').read_text() == source
