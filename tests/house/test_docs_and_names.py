"""A reader of this repository alone can follow every name and citation.

* every repository path the README and docs/ mention in backticks exists (symlinks included);
* every ``perfcheck.x.y`` name they mention resolves to a module or attribute;
* no file names the private inputs the project started from (numbered seeds, research notes): the
  example models are named by what they are, citations point at public papers, docs and issues;
* every number in a system file has a public source or says plainly that perfcheck chose it;
* ``perfcheck <cmd> --help`` is complete (a description that ends a sentence, help on every
  argument) and every "(default: X)" it states is the argument's real default.
"""
from __future__ import annotations

import argparse
import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Top-level entries of the repository a backticked path can start with.
REPO_ROOTS = ("perfcheck", "tests", "docs", "bench", "scripts", "configs", ".ci")
_SPAN = re.compile(r"```.*?```|`[^`\n]+`", re.S)
_PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./<>*-]*)" % "|".join(re.escape(r) for r in REPO_ROOTS))
_BARE_FILE = re.compile(r"(?<![\w/.-])([\w-]+\.(?:py|sh|md))\b")
_DOTTED = re.compile(r"(?<![\w./-])(perfcheck(?:\.[A-Za-z_]\w*)+)")


def _spans(doc: Path) -> list:
    return _SPAN.findall(doc.read_text(encoding="utf-8"))


def _mentions(pattern) -> list:
    return sorted({(doc.relative_to(ROOT).as_posix(), m.group(1).rstrip("."))
                   for doc in DOCS for span in _spans(doc) for m in pattern.finditer(span)})


def _exists(path: str, base: Path = ROOT) -> bool:
    """A path, a folder or a pattern (``stage<S>.json``, ``*.json``) with at least one match."""
    pattern = re.sub(r"<[^>]*>", "*", path.rstrip("/"))
    return any(base.glob(pattern)) if "*" in pattern else (base / pattern).exists()


def _path_mentions() -> list:
    """(doc, path, folders named before it on the same line): a README table row names its folder
    first (`perfcheck/integrations/deepspeed/` ... `configs/*.json`), so a path may be relative to it."""
    out = set()
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        # Fenced blocks are checked apart; blank them out, keeping the line count.
        text = re.sub(r"```.*?```", lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
        seen = {}  # line number -> folders named so far on it
        for span in re.finditer(r"`[^`]+`", text):  # an inline span may wrap onto the next line
            folders = seen.setdefault(text.count("\n", 0, span.start()), [])
            for m in _PATH.finditer(span.group()):
                out.add((doc.relative_to(ROOT).as_posix(), m.group(1).rstrip("."), tuple(folders)))
                if m.group(1).endswith("/"):
                    folders.append(m.group(1))
    return sorted(out)


def test_the_scan_finds_what_it_checks():
    # Guards the regexes: a change that matched nothing would make the tests below vacuous.
    paths = {p for _, p, _ in _path_mentions()}
    assert {"scripts/zero_sweep.sh", "configs/systems/", "docs/estimator.md"} <= paths
    assert "perfcheck.estimate" in {n for _, n in _mentions(_DOTTED)}
    assert not _exists("perfcheck/no_such_module.py") and _exists("configs/deepspeed/stage<S>.json")


@pytest.mark.parametrize("doc,path,folders", _path_mentions())
def test_repository_paths_in_readme_and_docs_exist(doc, path, folders):
    assert _exists(path) or any(_exists(path, ROOT / f) for f in folders), \
        f"{doc} names `{path}`, which is not in the repository"


def test_fenced_code_paths_are_checked_too():
    # The README's main command lives in a fenced block; its scripts must exist like any other path.
    fenced = {m.group(1) for doc in DOCS for block in re.findall(r"```.*?```", doc.read_text(), re.S)
              for m in _PATH.finditer(block)}
    assert "scripts/zero_sweep.sh" in fenced
    missing = sorted(p for p in fenced if not _exists(p))
    assert not missing, f"fenced code names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc,name", _mentions(_BARE_FILE))
def test_bare_file_names_in_readme_and_docs_exist_somewhere(doc, name):
    # `findings.py` in prose must still be a file of the repository (any folder).
    hits = [p for p in ROOT.rglob(name) if ".git" not in p.parts and "runs" not in p.parts]
    assert hits, f"{doc} names `{name}`, which no file of the repository is called"


def _resolve(dotted: str):
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[:i + 1]))
    return obj


@pytest.mark.parametrize("doc,name", _mentions(_DOTTED))
def test_perfcheck_names_in_readme_and_docs_resolve(doc, name):
    try:
        _resolve(name)
    except ImportError as exc:
        if name.startswith("perfcheck.integrations.") and ("needs " in str(exc) or "importing " in str(exc)):
            pytest.skip(f"{name}: its framework is absent or broken here ({exc})")  # an optional dependency
        pytest.fail(f"{doc} names `{name}`, which does not resolve: {exc}")
    except AttributeError as exc:
        pytest.fail(f"{doc} names `{name}`, which does not resolve: {exc}")


# Built from pieces so this file does not match itself: "seed 000", "seed_001", "seeds 000 and 001",
# "research notes", "shared/research/...".
PRIVATE = re.compile(r"(?<![a-z])s[e]eds?[ _-]?0\d\d|\bs[e]ed (?:model|notebook)s?\b|r[e]search[ _]notes?|shared/r[e]search"
                     r"|_anch[o]rs\.md", re.I)
SCANNED = ["perfcheck", "tests", "docs", "scripts", "bench", "README.md", "setup.cfg", "setup.py", "pyproject.toml"]
SUFFIXES = {".py", ".md", ".json", ".sh", ".cfg", ".toml", ".txt", ".html", ".yaml", ".yml"}
#: bench/RESULTS.md keeps its history as recorded; its legend (checked below) maps the old names.
EXEMPT = {"bench/RESULTS.md", "tests/house/test_docs_and_names.py"}  # this file: the patterns' own examples


def _scanned_files():
    for entry in SCANNED:
        top = ROOT / entry
        files = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            if f.is_file() and f.suffix in SUFFIXES and "__pycache__" not in f.parts and rel not in EXEMPT:
                yield rel, f


def test_no_file_names_private_seeds_or_research_notes():
    hits = []
    for rel, f in _scanned_files():
        for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if PRIVATE.search(line):
                hits.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not hits, "private names a reader cannot follow:\n" + "\n".join(hits)


def test_the_private_name_pattern_catches_what_it_should():
    for text in ("seed 000's LeNet", "seeds 000 and 001", "test_seed001_jsc", "the seed notebook",
                 "research notes section 4.3", "see shared/research/x.md"):
        assert PRIVATE.search(text), text
    for text in ("torch.manual_seed(0)", "--seed 0", '"seed": 0', "a research paper"):
        assert not PRIVATE.search(text), text


def test_results_history_has_a_legend_for_the_old_names():
    text = (ROOT / "bench" / "RESULTS.md").read_text(encoding="utf-8")
    if not PRIVATE.search(text):
        return  # no old names left to explain
    legend = next((line for line in text.splitlines()[:15] if line.startswith("Legend")), None)
    assert legend, "bench/RESULTS.md uses old seed names without a legend near the top"


# -------------------------------------------------------------------------- system files
#: A public source: a URL, a paper, an issue, or a named public document (datasheet, whitepaper, ...).
PUBLIC = re.compile(r"https?://|arXiv|\bdata ?sheets?\b|whitepaper|product brief|\w[\w.-]*\.(?:com|org|io|ai)/\S"
                    r"|\w+/[\w.-]+#\d+"
                    r"|bench/(?:gpu_)?results/[\w./-]+\.(?:json|csv|csv\.gz)", re.I)  # a measurement shipped here
#: Or it says plainly that the number is perfcheck's own choice.
OWN_CHOICE = re.compile(r"default chosen by perfcheck|NOT a measurement", re.I)


@pytest.mark.parametrize("spec", [*sorted((ROOT / "perfcheck" / "hardware" / "specs").glob("*.json")),
                                  ROOT / "perfcheck" / "hardware" / "host_defaults.json"], ids=lambda p: p.stem)
def test_every_system_source_is_public_or_says_perfcheck_chose_it(spec):
    sources = json.loads(spec.read_text())["sources"]
    bad = {k: v for k, v in sources.items() if not (PUBLIC.search(v) or OWN_CHOICE.search(v))}
    assert not bad, f"{spec.name}: sources a reader cannot check: {bad}"


# -------------------------------------------------------------------------- CLI help
def _subparsers():
    from perfcheck.commands.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action


def test_every_subcommand_is_listed_with_a_one_line_help():
    from perfcheck.commands.cli import SUBCOMMANDS

    listed = {a.dest: a.help for a in _subparsers()._choices_actions}
    assert set(listed) == set(SUBCOMMANDS)
    assert all(h and h.strip() for h in listed.values()), listed


def _number(text):
    m = re.search(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", text)
    return float(m.group()) if m else None


@pytest.mark.parametrize("command", sorted(_subparsers().choices))
def test_help_is_complete_and_states_the_real_defaults(command):
    sub = _subparsers().choices[command]
    description = (sub.description or "").strip()
    # A description that stops mid-sentence ("Two front-ends, one set of formulas:") is the bug.
    assert description and description[-1] in ".)`", f"{command}: description ends {description[-40:]!r}"
    assert sub.format_help()  # renders
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help.strip(), f"perfcheck {command} {name}: no help text"
        said = re.search(r"\(default:? ([^);]+)", action.help)
        if said is None or action.default is None or isinstance(action.default, bool):
            continue
        if isinstance(action.default, (int, float)):
            assert _number(said.group(1)) == float(action.default), \
                f"perfcheck {command} {name}: help says default {said.group(1)!r}, code has {action.default!r}"
        else:
            assert str(action.default) in said.group(1), \
                f"perfcheck {command} {name}: help says default {said.group(1)!r}, code has {action.default!r}"
