"""The README's map of the house and docs/map.md are what scripts/house_map.py writes from the modules'
own docstrings: complete (every module of perfcheck/ named), current, and the README short enough to read."""
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _house_map():
    spec = importlib.util.spec_from_file_location("house_map", ROOT / "scripts" / "house_map.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_map_is_the_generated_one():
    hm = _house_map()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert hm.readme_with_map(readme) == readme, "README.md's map is stale: run python3 scripts/house_map.py"


def test_docs_map_is_the_generated_one():
    hm = _house_map()
    assert (ROOT / "docs" / "map.md").read_text(encoding="utf-8") == hm.map_doc(), \
        "docs/map.md is stale: run python3 scripts/house_map.py"


def test_every_module_is_on_both_maps():
    # Independent of the script's walk: every .py file under perfcheck/ by a glob of its own.
    modules = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "perfcheck").rglob("*.py")
                     if "__pycache__" not in p.parts)
    doc = (ROOT / "docs" / "map.md").read_text(encoding="utf-8")
    missing = [m for m in modules if f"`{m}`" not in doc and not m.endswith("/__init__.py")]
    assert not missing, f"docs/map.md does not name: {missing}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("<!-- house map", 1)[1].split("<!-- end of house map -->", 1)[0]
    names = set(re.findall(r"`([\w]+)`", section))
    missing = [m for m in modules if Path(m).stem not in names and Path(m).name != "__init__.py"]
    assert not missing, f"README.md's map does not name: {missing}"


def test_first_sentence_cuts_at_the_first_full_stop():
    hm = _house_map()
    path = ROOT / "perfcheck" / "errors.py"
    assert hm.first_sentence(path) == "Errors perfcheck raises for bad user input: always one line that names the bad field."


def test_readme_is_short_and_links_the_model_in_one_click():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 120
    assert "](docs/model.md)" in text
    for command in ("bash scripts/install.sh && bash scripts/zero_sweep.sh", "bash scripts/test.sh"):
        assert command in "\n".join(text.splitlines()[:8]), command
