"""tests/ mirrors the package: each test file sits in a folder named after the part of perfcheck it tests
(or ``base``, ``house``, ``e2e``), and test file names are unique across folders, which pytest's default
import mode needs (a second ``test_x.py`` elsewhere is an import-file-mismatch error)."""
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
#: Folders that test no single package folder: the bottom floor's top-level modules, the repository's shape and
#: docs, and whole pipelines.
OWN_FOLDERS = {"base", "house", "e2e", "data"}


def _test_files():
    return [p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts and "data" not in p.parts]


def test_no_test_file_is_left_flat_in_tests():
    flat = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not flat, f"move these into the folder of what they test (tests/<folder>/): {flat}"


def test_every_test_folder_mirrors_a_package_folder():
    package = {p.name for p in (ROOT / "perfcheck").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    package |= {p.parent.name for p in (ROOT / "perfcheck").rglob("__init__.py")}
    folders = {p.relative_to(TESTS).parts[0] for p in _test_files() if len(p.relative_to(TESTS).parts) > 1}
    stray = sorted(folders - package - OWN_FOLDERS)
    assert not stray, f"tests/ folders named after no perfcheck folder: {stray}"


def test_test_file_names_are_unique():
    counts = Counter(p.name for p in _test_files())
    twice = sorted(name for name, n in counts.items() if n > 1)
    assert not twice, f"test file names used in two folders: {twice}"
