"""The results, the docs and the code speak of the project alone: no names of who measured or wrote
something ("helper-C", "the lead") and no work periods ("session 4", "this round"). A device call may
still be called a visit; measurement rounds ("40 interleaved rounds", ``--rounds 3``) are not periods."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Built from pieces so that this file does not match itself.
WHO = r"\bhelp" r"ers?\b|\bthe le" r"ad\b|\ble" r"ad's\b"
NUMBERED = r"\bsess" r"ions? \d+\b|\bro" r"und \d+\b"
WHEN = NUMBERED + r"|\b(?:this|last|next|previous|earlier|later|first|second|third|fourth) (?:ro" r"und|sess" r"ion)\b"
PROSE = re.compile(f"{WHO}|{WHEN}", re.I)
#: In code and data only the unambiguous forms: "helper" alone is ordinary English there (a helper module).
CODE = re.compile(r"\bhelp" r"er-\w+|" + NUMBERED
                  + r"|\b(?:this|last|next|previous) (?:ro" r"und|sess" r"ion)\b|\bthe le" r"ad\b", re.I)


def _prose_files():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "bench").glob("*.md")),
            *sorted((ROOT / "bench" / "results").glob("*.md"))]


def _code_files():
    for top in ("perfcheck", "tests", "scripts", "bench"):
        for f in sorted((ROOT / top).rglob("*")):
            if (f.suffix in (".py", ".json", ".sh") and "__pycache__" not in f.parts and "gpu_results" not in f.parts
                    and f != Path(__file__).resolve()):
                yield f


def _hits(files, pattern):
    out = []
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            m = pattern.search(line)
            if m:
                out.append(f"{f.relative_to(ROOT).as_posix()}:{n}: {m.group()!r} in {line.strip()[:90]}")
    return out


def test_readme_docs_and_results_name_no_one_and_no_work_period():
    hits = _hits(_prose_files(), PROSE)
    assert not hits, "words about who or when, not about the project:\n" + "\n".join(hits)


def test_code_comments_and_data_name_no_one_and_no_work_period():
    hits = _hits(_code_files(), CODE)
    assert not hits, "words about who or when, not about the project:\n" + "\n".join(hits)


@pytest.mark.parametrize("text", ["measured by help" "er-C", "issue 12, sess" "ion 4", "a one-line change for the le" "ad",
                                  "not re-checked in this sess" "ion", "Ro" "und 3 found", "the previous ro" "und's figure"])
def test_the_patterns_catch_what_they_should(text):
    assert PROSE.search(text)


@pytest.mark.parametrize("text", ["40 interleaved rounds", "--rounds 3 --steps 10", "a measuring session (PerfCheck)",
                                  "the H100 visit's calibration", "perfcheck/measure/session.py", "leads to"])
def test_the_patterns_leave_ordinary_words(text):
    assert not PROSE.search(text)
    assert not CODE.search(text)


@pytest.mark.parametrize("text", ["a helper thread", "a presentation helper to format", "the first rounds carry the skew"])
def test_code_may_use_helper_and_rounds_as_plain_words(text):
    assert not CODE.search(text)
