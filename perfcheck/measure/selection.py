"""Which modules PerfCheck times: all of them, the top ``depth`` levels, or the ones ``modules`` names.

A cheaper always-on mode: every timed module call costs host time (bench/RESULTS.md), so a user who
only wants the blocks of a transformer times ``depth=2`` (root, its children, their children) or
``modules=["Block"]`` and pays for a handful of calls per step instead of hundreds.

Rules
-----
* The root is always timed: step-level forward/backward and the optimizer split need it.
* ``depth=N``: modules at most N levels below the root (the root is level 0, ``h`` level 1,
  ``h.0`` level 2, ...). ``depth=0`` times the root alone.
* ``modules=[...]``: each entry is one of
  - a module path as PerfCheck reports it (``"h.0.attn"``), that module;
  - a class (``nn.Linear``): every module that is an instance of it;
  - a class name (``"Linear"``): every module of exactly that type name;
  - a glob over paths (``"h.*.attn"``, ``fnmatch`` rules).
  A string is tried in that order (path, type name, glob); one that matches nothing is a
  ``UserError`` naming it. Ancestors of a selected module are not added: they are simply not timed.
* ``depth`` and ``modules`` together: a ``UserError`` (say which one you mean).

What the reports say: a module outside the selection has no measured row by design; its time is
inside its nearest timed ancestor's (the root at least). meta.json ``selection`` records the rule and
the timed paths, and the reconciler gives those modules reason ``not_instrumented`` instead of
``not_measured``.
"""
from __future__ import annotations

import fnmatch

from perfcheck.errors import UserError
from perfcheck.schema import ROOT, module_depth

NOTE = ("modules outside PerfCheck's selection (depth=/modules=) are not timed: their time is inside their "
        "nearest timed ancestor's")


def validate(depth, modules):
    """``(depth, modules as a tuple or None)``, or a UserError naming the bad argument."""
    if depth is not None and modules is not None:
        raise UserError("give PerfCheck depth= or modules=, not both")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise UserError(f"depth must be a non-negative integer (0: the root alone), got {depth!r}")
    if modules is None:
        return depth, None
    if isinstance(modules, (str, type)):
        modules = [modules]
    try:
        entries = tuple(modules)
    except TypeError:
        raise UserError(f"modules must be a list of module paths, class names or classes, got {modules!r}") from None
    if not entries:
        raise UserError("modules is empty: name at least one module path, class name or class")
    for e in entries:
        if not isinstance(e, (str, type)) or (isinstance(e, str) and not e):
            raise UserError(f"modules entries must be module paths, class names, globs or classes, got {e!r}")
    return depth, entries


def _entry_name(e) -> str:
    return e if isinstance(e, str) else f"{e.__module__}.{e.__qualname__}"


def select(modules: list, types: dict, *, depth=None, entries=None) -> tuple[list, dict | None]:
    """The ``(path, module)`` pairs to time, and the record for meta.json ``selection`` (None: all).

    ``modules``: every ``(path, module)`` of the model (``context.model_view``); ``types``: path ->
    class name; ``depth``/``entries``: as returned by ``validate``.
    """
    if depth is None and entries is None:
        return list(modules), None
    if depth is not None:
        keep = {p for p, _ in modules if module_depth(p) <= depth}
    else:
        paths = [p for p, _ in modules]
        keep = {ROOT}
        for e in entries:
            if isinstance(e, type):
                hit = {p for p, m in modules if isinstance(m, e)}
            elif e in types:
                hit = {e}
            else:
                hit = {p for p, t in types.items() if t == e} or set(fnmatch.filter(paths, e))
            if not hit:
                raise UserError(f"modules entry {_entry_name(e)!r} matches no module of the model (not a module path, "
                                "class name, glob or class of it); perfcheck's paths are named_modules() names "
                                "without DDP/DeepSpeed prefixes, the root is '(root)'")
            keep |= hit
    chosen = [(p, m) for p, m in modules if p in keep]
    info = {"depth": depth, "modules": None if entries is None else [_entry_name(e) for e in entries],
            "timed": [p for p, _ in chosen], "timed_count": len(chosen), "module_count": len(modules),
            "note": NOTE}
    return chosen, info
