"""perfcheck: predict, measure and reconcile the performance of PyTorch models.

The facade. Names are imported on first use so ``import perfcheck`` stays cheap. Where things live:
``predict/`` (the analytical model), ``measure/`` (recording the steps), ``rundir/`` (the run
directory), ``analysis/`` (reconcile, findings, stage comparison), ``report/`` (rendering), ``session/``
(``PerfCheck``), ``hardware/`` (system specs), ``calibrate/`` (measuring this machine), ``integrations/`` (DeepSpeed),
``commands/`` (the CLI).
Where a module's predicted time comes from: docs/model.md.
The floors and what may import what: tests/house/test_architecture.py.
"""
from __future__ import annotations

import importlib

from perfcheck.schema import PACKAGE_VERSION as __version__

#: Public name -> "module:attribute" it lives in.
_EXPORTS = {
    "estimate_transformer": "perfcheck.predict.transformer:estimate_transformer",
    "transformer_step": "perfcheck.predict.transformer:transformer_step",
    "load_system": "perfcheck.hardware.systems:load_system",
    "list_systems": "perfcheck.hardware.systems:list_systems",
    "ParallelConfig": "perfcheck.parallel:ParallelConfig",
    "ZeroStage": "perfcheck.parallel:ZeroStage",
    "PerfCheck": "perfcheck.session.api:PerfCheck",
    "reconcile": "perfcheck.analysis.reconcile:reconcile",
    "UserError": "perfcheck.errors:UserError",
}

__all__ = sorted(_EXPORTS) + ["__version__", "estimate"]


def estimate(model, example_inputs, *, system=None, dtype=None, parallel=None, causal: bool = False, kwargs=None,
             optimizer="sgd", step_other_s: float = 0.0):
    """Predict FLOPs, bytes, activation memory, communication and time per module for one training step
    (``perfcheck.predict.estimate.estimate``: every argument and column is documented there).

    ``system=None`` is resolved here, at the edge, once: this machine's calibration from the per-user
    cache when it has one, else the datasheet entry labelled as a default (the header then says to run
    ``perfcheck calibrate``). A prediction never runs a benchmark (``perfcheck.hardware.cache.resolve_system``).
    """
    from perfcheck.hardware.cache import resolve_system
    from perfcheck.predict.estimate import estimate as predict

    return predict(model, example_inputs, system=resolve_system() if system is None else system, dtype=dtype,
                   parallel=parallel, causal=causal, kwargs=kwargs, optimizer=optimizer, step_other_s=step_other_s)


def __getattr__(name):
    try:
        target = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'perfcheck' has no attribute {name!r}") from None
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
