"""The DeepSpeed config's ``"perfcheck"`` block where perfcheck does not build the engine itself.

HF Trainer, accelerate and Lightning's DeepSpeedStrategy call ``deepspeed.initialize`` on their own,
and DeepSpeed 0.19.8 offers no hook at engine creation (no plugin entry point; ``initialize`` builds
the engine and returns it), so nothing of perfcheck runs there unless the user opts in. The
opt-ins, each one line, all reading the same block through ``perfcheck_settings``:

* HF Trainer: ``callbacks=[perfcheck.integrations.transformers.PerfCheckCallback()]`` reads the
  block from ``TrainingArguments.deepspeed``;
* Lightning: ``callbacks=[perfcheck.integrations.lightning.PerfCheckCallback()]`` reads it from
  ``DeepSpeedStrategy.config``;
* accelerate or a bare ``deepspeed.initialize``: ``pc = perfcheck.deepspeed.perfcheck_for_engine(engine)``
  (then ``pc.step()`` after each optimizer step and ``pc.stop()``), or the drop-in
  ``perfcheck.deepspeed.initialize`` that wraps the engine.

Through these the block's settings become PerfCheck's (per-module and per-step times, kernel
table, trace, prediction: one run directory per rank). The engine-level files that only the
wrapper records (``zero.json``, ``comms.csv``, ``engine_steps.csv``: ``comms_steps``) are not
written; a warning says so when the block asks for them, rather than ignoring it silently.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional

from perfcheck.analysis.stage_prediction import outside_model_s
from perfcheck.errors import UserError
import perfcheck.rundir as runs
from perfcheck.integrations.deepspeed.config import PerfcheckBlock, load_config, parse_block
from perfcheck.integrations.deepspeed.facts import engine_facts
from perfcheck.session.api import PerfCheck

#: What a callback-driven run does not write, said once when a block is honoured that way.
NOT_WRITTEN = ("zero.json, comms.csv and engine_steps.csv (DeepSpeed's comms logger, comms_steps) are written only "
               "when perfcheck wraps the engine (perfcheck.deepspeed.initialize / attach)")


def perfcheck_settings(block: PerfcheckBlock) -> dict:
    """PerfCheck keyword arguments for an enabled block: warmup_steps -> warmup, steps, output_dir ->
    out_dir, system, sampler_interval_s -> sample_interval, profiler -> profile / profile_window,
    overhead_pairs, and modules=false -> depth=0 (the root alone)."""
    out = {"warmup": block.warmup_steps, "steps": block.steps, "out_dir": block.output_dir, "system": block.system,
           "sample_interval": block.sampler_interval_s, "profile": block.profiler.enabled,
           "overhead_pairs": block.overhead_pairs if block.modules else 0}
    if block.profiler.enabled:
        out["profile_window"] = (block.profiler.wait, block.profiler.warmup, block.profiler.active)
    if not block.modules:
        out["depth"] = 0
    return out


def zero_parallel(config: dict, world_size: int) -> dict:
    """meta.json ``parallel`` for a DeepSpeed config (after the framework resolved its "auto" values):
    kind deepspeed, the ZeRO stage, the data-parallel degree and the accumulation count when numbers."""
    out = {"kind": "deepspeed", "world_size": world_size, "dp": world_size}
    stage = (config.get("zero_optimization") or {}).get("stage", 0)
    if isinstance(stage, int) and not isinstance(stage, bool):
        out["zero_stage"] = stage
    accum = config.get("gradient_accumulation_steps")
    if isinstance(accum, int) and not isinstance(accum, bool):
        out["gradient_accumulation_steps"] = accum
    return out


def settings_for(config, explicit: dict, *, where: str) -> tuple:
    """``(PerfCheck kwargs, block or None)``: the block's settings for ``config`` (a DeepSpeed config
    dict or path), overridden by the user's ``explicit`` arguments; a warning names what the block
    asked for that this route does not record. ``where``: who honours it, for the warning."""
    cfg = load_config(config) if config is not None else None
    block = parse_block(cfg) if cfg is not None else None
    if block is None or not block.enabled:
        return dict(explicit), block
    kwargs = perfcheck_settings(block)
    overridden = sorted(k for k in explicit if k in kwargs and kwargs[k] is not None and explicit[k] != kwargs[k])
    kwargs.update(explicit)
    extra = f"; the callback's own arguments win for {', '.join(overridden)}" if overridden else ""
    warnings.warn(f"perfcheck: the DeepSpeed config's \"perfcheck\" block is honoured by {where}{extra}; "
                  f"{NOT_WRITTEN}", RuntimeWarning, stacklevel=3)
    return kwargs, block


def perfcheck_for_engine(engine, *, config=None, **explicit):
    """A started ``PerfCheck`` on ``engine.module`` configured by the engine's ``"perfcheck"`` block
    (or ``config``), for loops that keep the engine as it is (accelerate's ``accelerator.backward``,
    a bare ``deepspeed.initialize``): call ``pc.step()`` after each optimizer step, ``pc.stop()`` at
    the end. ``explicit`` PerfCheck arguments override the block's. Raises UserError when there is
    no enabled block and no ``out_dir``: nothing would say where the run went."""
    import torch.distributed as dist

    cfg = config if config is not None else _engine_config(engine)
    kwargs, block = settings_for(cfg, explicit, where="perfcheck.deepspeed.perfcheck_for_engine")
    if (block is None or not block.enabled) and "out_dir" not in explicit:
        raise UserError("perfcheck_for_engine: the engine's DeepSpeed config has no enabled \"perfcheck\" block; "
                        "pass out_dir= (and PerfCheck's other arguments) to measure anyway")
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    parallel = zero_parallel(load_config(cfg) or {}, world)
    kwargs.setdefault("parallel", parallel)
    if kwargs.get("out_dir") is None:
        kwargs["out_dir"] = shared_run_dir("runs", f"deepspeed-zero{parallel.get('zero_stage', 0)}")
    pc = PerfCheck(engine, **kwargs)
    # the engine's step outside the model counts in the far rule's ages (stage_prediction.outside_model_s); its
    # facts read when the prediction is made, after DeepSpeed partitioned the parameters (ds_numel)
    pc.step_outside = lambda frame, spec: outside_model_s(engine_facts(engine, load_config(cfg) or {}), frame, spec)
    return pc.start()


def shared_run_dir(parent, label: str) -> Path:
    """A fresh run directory name under ``parent``, the same on every rank (rank 0 draws it and
    broadcasts it when torch.distributed is initialized): one run, one directory, ``rank<R>/`` inside."""
    import torch.distributed as dist

    name = [str(runs.new_run_dir(parent, label))]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(name, src=0)
    return Path(name[0])


def _engine_config(engine) -> Optional[dict]:
    cfg = getattr(getattr(engine, "_config", None), "_param_dict", None)
    return dict(cfg) if isinstance(cfg, dict) else None
