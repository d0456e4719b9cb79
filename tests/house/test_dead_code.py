"""No dead code: every function, class, method and module-level name defined in perfcheck/ or tests/ is
referenced somewhere in the repository (the package, the tests, scripts/, bench/, the docs or the data).

An AST scan, not an import: a name counts as referenced when it appears as a name, an attribute, an
imported name, or a word inside a string (``_EXPORTS``' "module:attribute" strings, ``getattr`` by name)
anywhere but its own definition. Decorated definitions are left out (a decorator registers them: the aten
registry's ``@register``, ``@atexit.register``, ``@pytest.fixture``, ``@property``), and so are methods a
framework calls by name (``on_*`` callbacks, dunders). Lenient by design (two names alike count as one), so
what it reports is dead for sure.
"""
import ast
import re
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("perfcheck", "tests")
REFERENCING = ("perfcheck", "tests", "scripts", "bench")
_WORD = re.compile(r"[A-Za-z_]\w*")


def _python_files(tops):
    for top in tops:
        for f in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" not in f.parts:
                yield f


def walk(tree) -> list:
    """Every node of ``tree`` in ``ast.walk``'s order (breadth first, fields in order), as a list: the same
    nodes without ``ast.walk``'s two generators per node, which were a third of this scan's time."""
    out, todo, node_type = [], deque([tree]), ast.AST
    while todo:
        node = todo.popleft()
        out.append(node)
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, node_type):
                todo.append(value)
            elif isinstance(value, list):
                todo.extend(v for v in value if isinstance(v, node_type))
    return out


def definitions(tree, nodes=None) -> list:
    """(line, name) of every undecorated function, class and method, and every module-level assignment
    (``nodes``: the tree's nodes when already listed)."""
    out = []
    for node in nodes or walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.decorator_list:
            out.append((node.lineno, node.name))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        out += [(node.lineno, t.id) for t in targets if isinstance(t, ast.Name)]
    return out


def references(tree, nodes=None) -> list:
    """Every name a tree uses: names, attributes, imported names and the words of its string constants
    (``nodes``: the tree's nodes when already listed)."""
    out = []
    for node in nodes or walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store):
            out.append(node.id)
        elif isinstance(node, ast.Attribute):
            out.append(node.attr)
        elif isinstance(node, ast.ImportFrom):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out += _WORD.findall(node.value)
    return out


def _exempt(name: str) -> bool:
    return name.startswith(("test_", "__", "on_")) or name in ("setUp", "tearDown", "pytestmark")


def dead_names() -> list:
    trees = {f: ast.parse(f.read_text(encoding="utf-8")) for f in _python_files(REFERENCING)}  # each file once
    nodes = {f: walk(tree) for f, tree in trees.items()}  # ...and walked once for both scans
    counts = {}
    for f in trees:
        for name in references(trees[f], nodes[f]):
            counts[name] = counts.get(name, 0) + 1
    prose = [ROOT / "README.md", ROOT / "setup.cfg", *(ROOT / "docs").glob("*.md"), *(ROOT / "scripts").glob("*.sh"),
             *(ROOT / "perfcheck").rglob("*.json")]
    for f in prose:
        for name in _WORD.findall(f.read_text(encoding="utf-8")):
            counts[name] = counts.get(name, 0) + 1
    out = []
    for f in _python_files(SCANNED):
        for line, name in definitions(trees[f], nodes[f]):  # SCANNED is inside REFERENCING
            if not _exempt(name) and counts.get(name, 0) == 0:
                out.append(f"{f.relative_to(ROOT).as_posix()}:{line}: {name}")
    return out


def test_no_name_is_defined_and_never_used():
    dead = dead_names()
    assert not dead, "defined, never referenced anywhere (remove them):\n" + "\n".join(dead)


def test_the_scan_finds_a_planted_dead_function():
    tree = ast.parse("import os\n\ndef used():\n    return os.sep\n\n\ndef unused_xyz():\n    return used()\n\n"
                     "@register('mm')\ndef _mm(c):\n    return 1\n\nX = 1\n")
    names = dict((n, line) for line, n in definitions(tree))
    refs = set(references(tree))
    assert {"used", "unused_xyz", "X"} <= set(names) and "_mm" not in names  # decorated: registered, not dead
    assert [n for n in names if n not in refs] == ["unused_xyz", "X"]


def test_walk_visits_what_ast_walk_visits():
    """The scan's walk is ``ast.walk`` made faster, not another traversal: the same nodes in the same order, on
    this file and on the package's largest module."""
    for f in (Path(__file__), ROOT / "perfcheck" / "predict" / "aten_costs.py"):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        assert walk(tree) == list(ast.walk(tree)), f
