"""The package's shape: every module imports on its own, no import cycles (top-level or inside
functions), no import up the floors (``FLOORS``, ``FLOOR_OF``, ``UPWARD``), imports at the top of the
file, small functions and files, no module made callable, no private name reached across modules, a
small top level."""
import ast
import functools
import pathlib
import subprocess
import sys

import pytest

PKG = pathlib.Path(__file__).resolve().parents[2] / "perfcheck"


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


@functools.lru_cache(maxsize=None)
def _imports(name, path):
    """perfcheck modules that ``name`` imports anywhere in its source (functions included); found once per file
    (a frozenset: the cycle test and its planted twin build the graph from the same scan)."""
    tree = _parsed(path)[1]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("perfcheck")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if not base.startswith("perfcheck"):
                continue
            found.add(base)
            for a in node.names:  # "from perfcheck.x import y" may import the module perfcheck.x.y
                found.add(f"{base}.{a.name}")
    return frozenset(found)


MODULES = dict(_modules())


def _graph():
    graph = {}
    for name, path in MODULES.items():
        deps = {d for d in _imports(name, path) if d in MODULES and d != name}
        # importing a.b.c runs a/__init__ and a/b/__init__ too, but those are docstring-only here
        graph[name] = deps
    return graph


def test_no_import_cycles():
    graph = _graph()
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_cycle_detector_finds_a_planted_cycle(monkeypatch):
    """The detector above is not vacuous: a planted a -> b -> a cycle is reported."""
    global _graph
    real = _graph
    monkeypatch.setattr(sys.modules[__name__], "_graph", lambda: {**real(), "x.a": {"x.b"}, "x.b": {"x.a"}})
    with pytest.raises(AssertionError, match="x.a -> x.b -> x.a"):
        test_no_import_cycles()


@pytest.mark.slow  # > 5 s on the 2-core VM: full suite only, not the fast lane
def test_every_module_imports_in_a_fresh_interpreter():
    names = [n for n in MODULES if not n.endswith("__main__")]
    code = ("import importlib, sys\nbad = []\nfor n in %r:\n    try:\n        importlib.import_module(n)\n"
            "    except ImportError as e:  # optional packages: absent, or broken in this environment\n"
            "        if any(k in str(e) for k in ('deepspeed', 'torch_geometric', 'lightning', 'transformers')): continue\n"
            "        bad.append((n, repr(e)))\n    except Exception as e:\n        bad.append((n, repr(e)))\nprint(bad)\n"
            "sys.exit(1 if bad else 0)" % names)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=PKG.parent)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def test_no_callable_module_tricks():
    offenders = [n for n, p in MODULES.items() if "__class__ =" in p.read_text() and "sys.modules" in p.read_text()]
    assert not offenders


def test_public_api_is_plain_functions():
    import perfcheck

    # the facade's estimate resolves system=None at the edge (hardware.cache.resolve_system), then calls
    # perfcheck.predict.estimate.estimate
    assert callable(perfcheck.estimate) and perfcheck.estimate.__module__ == "perfcheck"
    assert callable(perfcheck.reconcile) and perfcheck.reconcile.__module__ == "perfcheck.analysis.reconcile"
    import perfcheck.analysis.reconcile  # noqa: F401 - importing the module must not shadow the function
    import perfcheck.predict.estimate  # noqa: F401

    assert perfcheck.reconcile.__name__ == "reconcile" and perfcheck.estimate.__name__ == "estimate"
    import perfcheck.deepspeed as pds

    assert callable(pds.initialize) and callable(pds.attach)


def test_small_top_level():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 8, top


def test_no_private_names_reached_across_modules():
    """``from perfcheck.x import _name`` or ``module._name`` of another perfcheck module is a hidden coupling."""
    offenders = []
    for name, path in MODULES.items():
        tree = _parsed(path)[1]
        module_aliases = set()  # local names bound to another perfcheck module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("perfcheck"):
                offenders += [f"{name}: from {node.module} import {a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
                module_aliases |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in MODULES}
            elif isinstance(node, ast.Import):
                module_aliases |= {a.asname for a in node.names if a.name.startswith("perfcheck") and a.asname}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in module_aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                offenders.append(f"{name}: {node.value.id}.{node.attr}")
    assert not offenders, offenders


# ------------------------------------------------------------------------------------------- floors
#: The floors, bottom to top: a module may import its own floor and those below it, never one above
#: (docs: /work/shared/DESIGN.md "A layout that shows the architecture"). Data and storage at the
#: bottom; the edges that resolve a system once (PerfCheck, the commands, the facade) at the top.
FLOORS = ("base", "hardware", "predict", "calibrate", "measure", "analysis", "report", "session",
          "integrations", "examples", "commands", "facade")

#: Module or folder -> its floor; the longest matching prefix wins; a module with no entry fails
#: ``test_every_module_has_a_floor``.
FLOOR_OF = {
    "perfcheck.schema": "base", "perfcheck.errors": "base", "perfcheck.units": "base",
    "perfcheck.model_paths": "base", "perfcheck.parallel": "base", "perfcheck.rundir": "base",
    "perfcheck.hardware": "hardware",
    "perfcheck.predict": "predict",
    "perfcheck.calibrate": "calibrate",
    "perfcheck.measure": "measure",
    "perfcheck.analysis": "analysis",
    "perfcheck.report": "report",
    "perfcheck.session": "session",
    "perfcheck.integrations": "integrations",
    "perfcheck.examples": "examples",
    "perfcheck.commands": "commands",
    "perfcheck": "facade", "perfcheck.__main__": "facade", "perfcheck.deepspeed": "facade",
}

#: The imports allowed to go up a floor, (importer prefix, imported prefix) -> why. Entries that say
#: "pending" are arrows another change of the same step removes (a move of the imported module to a
#: lower floor); they go when it lands. The target is at most 2 upward folder pairs.
UPWARD = {
    ("perfcheck.examples.train_ds", "perfcheck.deepspeed"):
        "the example is the user's training script: it shows the public entry point "
        "(perfcheck.deepspeed.initialize) exactly as a user writes it",
}


def _floor(module):
    name = module
    while name:
        if name in FLOOR_OF:
            return FLOOR_OF[name]
        name = name.rpartition(".")[0]
    return None


@functools.lru_cache(maxsize=None)
def _parsed(path):
    """(source text, AST) of a file, parsed once for all the scans below."""
    text = path.read_text(encoding="utf-8")
    return text, ast.parse(text)


@functools.lru_cache(maxsize=None)
def _import_nodes(name, path):
    """(node, perfcheck modules it imports, inside a function?) for every import statement of
    ``name`` (relative imports resolved; ``from a import b`` names the module a.b where there is one);
    found once per file for all the scans below."""
    return tuple(_scan_imports(name, path))


def _scan_imports(name, path):
    tree = _parsed(path)[1]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        targets = sorted({t for t in targets if t == "perfcheck" or t.startswith("perfcheck.")})
        if targets:
            yield node, targets, id(node) in in_function


def _under(module, prefix):
    """``module`` is ``prefix`` or inside it (the facade ``perfcheck`` names itself only)."""
    return module == prefix or (prefix != "perfcheck" and module.startswith(prefix + "."))


def _allowed_upward(importer, imported):
    for (a, b), why in UPWARD.items():
        if _under(importer, a) and _under(imported, b):
            return why
    return None


def upward_imports(modules=None):
    """Every (importer, imported, importer's floor, imported's floor) whose import goes up the floors."""
    found = set()
    for name, path in (modules or MODULES).items():
        for _node, targets, _inner in _import_nodes(name, path):
            for target in targets:
                low, high = _floor(name), _floor(target)
                if low and high and FLOORS.index(high) > FLOORS.index(low):
                    found.add((name, target, low, high))
    return sorted(found)


def test_every_module_has_a_floor():
    assert not [n for n in MODULES if _floor(n) is None]


def test_no_import_goes_up_a_floor():
    """Every import (inside functions too) goes to its own floor or one below, except ``UPWARD``."""
    bad = [f"{a} ({fa}) -> {b} ({fb})" for a, b, fa, fb in upward_imports() if not _allowed_upward(a, b)]
    assert not bad, "imports up the floors (move the code, or list the arrow in UPWARD with its reason):\n" + "\n".join(bad)


def test_every_listed_exception_is_used():
    """An entry of ``UPWARD`` that no import needs any more is removed (the table stays the truth)."""
    used = {(a, b) for a, b, _, _ in upward_imports()}
    stale = [k for k in UPWARD if not any(_under(a, k[0]) and _under(b, k[1]) for a, b in used)]
    assert not stale, stale


def _upward_pairs():
    return sorted({(fa, fb) for _, _, fa, fb in upward_imports()})


def test_at_most_two_upward_floor_pairs():
    assert len(_upward_pairs()) <= 2, _upward_pairs()


def test_floor_scanner_finds_a_planted_upward_import(tmp_path):
    """The scanner is not vacuous: a planted predict -> integrations import (inside a function, relative)
    is reported, and an allowed downward one is not."""
    pkg = tmp_path / "perfcheck" / "predict"
    pkg.mkdir(parents=True)
    planted = pkg / "planted.py"
    planted.write_text("from perfcheck.hardware import systems\n\ndef f():\n    from ..integrations import lightning\n")
    modules = {"perfcheck.predict.planted": planted, "perfcheck.integrations.lightning": PKG / "integrations" / "lightning.py"}
    found = upward_imports(modules)
    assert [(a, b) for a, b, _, _ in found] == [("perfcheck.predict.planted", "perfcheck.integrations.lightning")]
    assert found[0][2:] == ("predict", "integrations")
    assert _allowed_upward(*found[0][:2]) is None


# --------------------------------------------------------------------------------- sizes of things
#: Targets: perfcheck's own imports inside functions (outside commands/, whose lazy imports keep
#: ``--help`` fast), functions over 60 lines, files over 500 lines.
MAX_INNER_IMPORTS, MAX_FUNCTION_LINES, MAX_BIG_FILES, BIG_FILE_LINES = 25, 60, 5, 500


def inner_imports():
    """perfcheck-internal import statements inside functions, outside perfcheck/commands/ ("module:line")."""
    return [f"{name}:{node.lineno}" for name, path in MODULES.items() if not name.startswith("perfcheck.commands")
            for node, _targets, inner in _import_nodes(name, path) if inner]


def long_functions():
    out = []
    for name, path in MODULES.items():
        for node in ast.walk(_parsed(path)[1]):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                out.append(f"{name}.{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    return out


def big_files():
    return [f"{n} ({len(_parsed(p)[0].splitlines())} lines)" for n, p in MODULES.items()
            if len(_parsed(p)[0].splitlines()) > BIG_FILE_LINES]


def test_few_imports_inside_functions():
    found = inner_imports()
    assert len(found) <= MAX_INNER_IMPORTS, f"{len(found)} imports inside functions: {found}"


def test_no_long_functions():
    assert not long_functions(), long_functions()


def test_few_big_files():
    assert len(big_files()) <= MAX_BIG_FILES, big_files()


def test_size_scanners_find_planted_cases(tmp_path, monkeypatch):
    """The three counters are not vacuous: a planted long function with an inner import in a big file."""
    planted = tmp_path / "planted.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(70))
    planted.write_text("def f():\n    from perfcheck import errors\n" + body + "\n" + "\n" * 450)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", {"perfcheck.predict.planted": planted})
    assert inner_imports() == ["perfcheck.predict.planted:2"]
    assert long_functions() == ["perfcheck.predict.planted.f (72 lines)"]
    assert big_files() == ["perfcheck.predict.planted (522 lines)"]  # 72 lines of code + 450 blank


# ------------------------------------------------------------------------ prediction without side effects
#: What prediction and analysis never import: the calibration cache (the edges resolve the system once
#: and pass it in) and the calibration runs. ``calibrate.sanity.contention`` (a text about a recorded
#: load) is allowed to analysis; a run directory is read only through the one reader.
NO_SIDE_EFFECTS = {"perfcheck.predict": ("perfcheck.hardware.cache", "perfcheck.calibrate"),
                   "perfcheck.analysis": ("perfcheck.hardware.cache", "perfcheck.calibrate.auto",
                                          "perfcheck.calibrate.run")}
#: (importer, imported) -> why it is still there.
SIDE_EFFECT_PENDING: dict = {}


def side_effect_imports(modules=None):
    found = []
    for name, path in (modules or MODULES).items():
        for folder, banned in NO_SIDE_EFFECTS.items():
            if not _under(name, folder):
                continue
            for _node, targets, _inner in _import_nodes(name, path):
                found += [(name, t) for t in targets if any(_under(t, b) for b in banned)]
    return sorted(set(found))


def test_prediction_and_analysis_import_no_cache_and_no_calibration():
    bad = [f"{a} -> {b}" for a, b in side_effect_imports()
           if not any(_under(a, x) and _under(b, y) for x, y in SIDE_EFFECT_PENDING)]
    assert not bad, bad


def test_side_effect_scanner_finds_a_planted_cache_read(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from perfcheck.hardware.cache import cached_spec\n    return cached_spec()\n")
    assert side_effect_imports({"perfcheck.predict.planted": planted}) == [
        ("perfcheck.predict.planted", "perfcheck.hardware.cache")]
