"""The map of the house: every perfcheck module, named by the first sentence of its own docstring.

    python3 scripts/house_map.py           # rewrite the README's map section and docs/map.md
    python3 scripts/house_map.py --check   # exit 1 (saying which) when either is out of date

The README gets one line per package (its ``__init__`` docstring's first sentence and its modules'
names); docs/map.md one line per module. Both are read from the source with ``ast`` (nothing is
imported), so a moved or added module appears on the next run; a module without a docstring is an
error. tests/house/test_house_map.py keeps both equal to what this script writes.
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "perfcheck"
README = ROOT / "README.md"
MAP_DOC = ROOT / "docs" / "map.md"
BEGIN = "<!-- house map: written by `python3 scripts/house_map.py`; do not edit by hand -->"
END = "<!-- end of house map -->"
#: Floors, bottom to top; a folder not listed here goes after the listed ones, by name.
FLOORS = ("rundir", "hardware", "predict", "calibrate", "measure", "analysis", "report", "session",
          "integrations", "examples", "commands")
#: Top-level modules on the top floor (the facade and the CLI); every other top-level module is at the bottom.
FACADE = ("__init__", "__main__", "cli", "deepspeed")


def first_sentence(path: Path) -> str:
    """The first sentence of the module docstring of ``path`` (its first paragraph up to '. ', on one line)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not doc or not doc.strip():
        raise SystemExit(f"{path.relative_to(ROOT)}: no module docstring (the map is read from them)")
    para = " ".join(doc.strip().split("\n\n")[0].split())
    m = re.search(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)\.(\s|$)", para)
    sentence = para[: m.start() + 1] if m else para
    if len(sentence) > 240:
        sentence = sentence[:239].rsplit(" ", 1)[0] + " …"
    return sentence.replace("|", "\\|")


def _packages() -> list:
    """(relative folder, its modules) per package under perfcheck/, bottom floor to top."""
    out = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        folder = init.parent
        if "__pycache__" in folder.parts:
            continue
        mods = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
        out.append((folder.relative_to(ROOT).as_posix(), folder, mods))

    def floor(item):
        rel = item[0].split("/")
        if len(rel) == 1:
            return (-1, "")
        top = rel[1]
        return (FLOORS.index(top) if top in FLOORS else len(FLOORS), item[0])
    return sorted(out, key=floor)


def _top_level_split(mods) -> tuple:
    base = [m for m in mods if m.stem not in FACADE]
    facade = [PACKAGE / "__init__.py"] + [m for m in mods if m.stem in FACADE]
    return base, facade


def readme_section() -> str:
    """The README's map: one line per package (bottom floor first), every module named."""
    lines = [BEGIN, "", "| floor | what | modules |", "|---|---|---|"]
    facade_row = None
    for rel, folder, mods in _packages():
        if folder == PACKAGE:
            base, facade = _top_level_split(mods)
            lines.append("| `perfcheck/` (base) | data, errors and names every floor shares | "
                         + ", ".join(f"`{m.stem}`" for m in base) + " |")
            facade_row = ("| `perfcheck/` (facade) | " + first_sentence(PACKAGE / "__init__.py") + " | "
                          + ", ".join(f"`{m.stem}`" for m in facade[1:]) + " |")
            continue
        lines.append(f"| `{rel}/` | {first_sentence(folder / '__init__.py')} | "
                     + ", ".join(f"`{m.stem}`" for m in mods) + " |")
    lines.append(facade_row)
    lines += ["", "Every module with the first sentence of its docstring: [docs/map.md](docs/map.md).", "", END]
    return "\n".join(lines)


def map_doc() -> str:
    """docs/map.md: every module of every package, one line each, bottom floor first."""
    lines = ["# Map of the house", "",
             "Every module of perfcheck, by floor (bottom first), with the first sentence of its own docstring.",
             "Written by `python3 scripts/house_map.py`; do not edit by hand.", ""]
    facade = None
    for rel, folder, mods in _packages():
        if folder == PACKAGE:
            base, facade = _top_level_split(mods)
            lines += ["## `perfcheck/` (base)", ""] + [f"- `{m.relative_to(ROOT).as_posix()}`: {first_sentence(m)}"
                                                      for m in base] + [""]
            continue
        lines += [f"## `{rel}/`", "", first_sentence(folder / "__init__.py"), ""]
        lines += [f"- `{m.relative_to(ROOT).as_posix()}`: {first_sentence(m)}" for m in mods] + [""]
    lines += ["## `perfcheck/` (facade)", ""] + [f"- `{m.relative_to(ROOT).as_posix()}`: {first_sentence(m)}"
                                                for m in facade]
    return "\n".join(lines) + "\n"


def readme_with_map(text: str) -> str:
    """``text`` (the README) with its map section replaced by ``readme_section()``."""
    if BEGIN not in text or END not in text:
        raise SystemExit(f"README.md: no map section (add the two lines {BEGIN!r} and {END!r})")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return head + readme_section() + tail


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write (or check) the README's map of the house and docs/map.md.")
    parser.add_argument("--check", action="store_true", help="exit 1 when either file differs from what it would write")
    args = parser.parse_args(argv)
    readme = README.read_text(encoding="utf-8")
    wanted = {README: readme_with_map(readme), MAP_DOC: map_doc()}
    stale = [p for p, text in wanted.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is out of date: run python3 scripts/house_map.py")
        return 1 if stale else 0
    for p in stale:
        p.write_text(wanted[p], encoding="utf-8")
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
