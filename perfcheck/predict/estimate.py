"""``perfcheck.estimate``: the per-module prediction of one training step, for any model.

A model whose layout declares its sharding (FSDP2 ``fully_shard``, DTensor tensor/sequence
parallel, both) goes to ``distributed.estimate_sharded`` (per rank: compute on a twin as one rank
computes it, DTensor ops at their local shards; the collectives its layout issues); every other model, DDP/DeepSpeed/compiled wrappers included, to
``module_estimator.estimate``. Arguments and columns are ``module_estimator.estimate``'s.
How each term of a module's predicted time is computed: docs/model.md.
"""
from __future__ import annotations

import pandas as pd

from perfcheck.errors import UserError
from perfcheck.predict.layout import is_sharded
from perfcheck.predict import distributed, module_estimator


def estimate(model, example_inputs, *, system=None, dtype=None, parallel=None, causal: bool = False, kwargs=None,
             optimizer="sgd", step_other_s: float = 0.0) -> pd.DataFrame:
    """Predict FLOPs, bytes, activation memory, communication and time per module for one training
    step (see ``perfcheck.predict.module_estimator.estimate`` for every argument and column)."""
    module_estimator.check_model(model)  # a class name or a class: one line naming `model`
    if is_sharded(model):
        if parallel is not None:
            raise UserError("parallel: an FSDP2/DTensor model declares its own layout; leave parallel=None")
        return distributed.estimate_sharded(model, example_inputs, system=system, dtype=dtype, causal=causal,
                                            kwargs=kwargs, optimizer=optimizer, step_other_s=step_other_s)
    return module_estimator.estimate(model, example_inputs, system=system, dtype=dtype, parallel=parallel,
                                     causal=causal, kwargs=kwargs, optimizer=optimizer, step_other_s=step_other_s)
