"""perfcheck: predict, measure and reconcile the performance of PyTorch models.

The facade. Names are imported on first use so ``import perfcheck`` stays cheap.
``perfcheck.estimate`` is the estimator's package, made callable (see perfcheck/estimate/__init__.py).
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: Public name -> "module:attribute" it lives in.
_EXPORTS = {
    "estimate_transformer": "perfcheck.estimate.transformer:estimate_transformer",
    "load_system": "perfcheck.systems:load_system",
    "list_systems": "perfcheck.systems:list_systems",
    "ParallelConfig": "perfcheck.parallel:ParallelConfig",
    "ZeroStage": "perfcheck.parallel:ZeroStage",
    "PerfCheck": "perfcheck.perfcheck:PerfCheck",
    "reconcile": "perfcheck.reconcile:reconcile",
    "UserError": "perfcheck.errors:UserError",
}

__all__ = sorted(_EXPORTS) + ["__version__", "estimate"]


def __getattr__(name):
    if name == "estimate":
        return importlib.import_module("perfcheck.estimate")
    try:
        target = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'perfcheck' has no attribute {name!r}") from None
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
