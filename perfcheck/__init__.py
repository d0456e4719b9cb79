"""perfcheck: predict, measure and reconcile the performance of PyTorch models.

The facade. Names are imported on first use so ``import perfcheck`` stays cheap. Where things live:
``predict/`` (the analytical model), ``measure/`` (PerfCheck and the run directory), ``analysis/``
(reconcile, findings, stage comparison), ``report/`` (rendering), ``hardware/`` (system specs,
calibration), ``integrations/`` (DeepSpeed), ``commands/`` (the CLI).
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: Public name -> "module:attribute" it lives in.
_EXPORTS = {
    "estimate": "perfcheck.predict.estimate:estimate",
    "estimate_transformer": "perfcheck.predict.transformer:estimate_transformer",
    "transformer_step": "perfcheck.predict.transformer:transformer_step",
    "load_system": "perfcheck.hardware.systems:load_system",
    "list_systems": "perfcheck.hardware.systems:list_systems",
    "ParallelConfig": "perfcheck.parallel:ParallelConfig",
    "ZeroStage": "perfcheck.parallel:ZeroStage",
    "PerfCheck": "perfcheck.measure.session:PerfCheck",
    "reconcile": "perfcheck.analysis.reconcile:reconcile",
    "UserError": "perfcheck.errors:UserError",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    try:
        target = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'perfcheck' has no attribute {name!r}") from None
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
