"""perfcheck inside DeepSpeed: a ``"perfcheck"`` block in the DeepSpeed config, a drop-in
``initialize``, and ``attach_engine`` for code that calls ``deepspeed.initialize`` itself.

    engine, optimizer, _, _ = perfcheck.deepspeed.initialize(model=model, config="ds.json", ...)
    for batch in data:                      # unchanged training loop
        loss = loss_fn(engine(batch.x), batch.y); engine.backward(loss); engine.step()

The config's block (every key optional; unknown keys raise UserError naming the key)::

    "perfcheck": {"enabled": true, "warmup_steps": 2, "steps": 5, "output_dir": "runs/zero3",
                  "system": "cpu", "sampler_interval_s": 0.1, "modules": true, "comms_steps": 1,
                  "profiler": {"enabled": true, "wait": 0, "warmup": 1, "active": 1}}

The returned engine is a thin wrapper (``EngineSession``): ``forward``/``__call__``, ``backward``
and ``step`` are timed around the engine's own methods (CPU clock, or CUDA events resolved after
the run) and wrapped in ``torch.profiler.record_function("perfcheck::engine::<phase>")`` ranges;
every other attribute is the engine's. Optimizer steps are the engine's gradient-accumulation
boundaries. Steps: ``warmup_steps``, then the profiler window (its ``wait`` steps are measured,
``warmup`` and ``active`` are not), then ``steps`` measured steps; the first ``comms_steps``
measured steps run with DeepSpeed's comms logger on (it synchronizes each collective), the others
without. ``overhead_pairs`` (default 0; with ``modules``; at most ``steps``): the first that many measured steps are each
followed by a ``bare`` step with PerfCheck's module hooks off, which the ZeRO comparison's times
use (what DeepSpeed costs uninstrumented, as the model predicts it) and which give meta.json's
in-run hook overhead. After the last step the run directory is written and the engine runs bare:

    <output_dir>/rank<R>/zero.json          ZeRO stage, dp/tp/pp, ds_numel counts, settings, bytes
                        comms.csv           every collective: phase, kind, bytes, count, logger time
                        engine_steps.csv    per micro-step fwd/bwd/step seconds from the engine
                        modules.csv, steps.csv, kernels.csv, samples.csv, trace.json, meta.json
                                            (perfcheck.PerfCheck on engine.module, if "modules")
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Mapping, Optional

from perfcheck.hardware.systems import load_system
from perfcheck.integrations.deepspeed.config import BLOCK_KEY, PerfcheckBlock, load_config, parse_block  # noqa: F401
from perfcheck.integrations.deepspeed.engine_session import EngineSession
from perfcheck.predict.estimate import estimate
from perfcheck.predict.for_run import save_predicted
from perfcheck.analysis.stage_prediction import outside_model_s
from perfcheck.integrations.deepspeed.facts import config_facts
from perfcheck.predict import module_estimator
from perfcheck.predict.for_run import with_step_other

# ---------------------------------------------------------------------------- entry points
def initialize(args: Any = None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, distributed_port: int = 29500, mpu: Any = None, dist_init_required=None,
               collate_fn=None, config=None, mesh_param: Any = None, config_params=None):
    """``deepspeed.initialize`` with the same arguments and return value
    ``(engine, optimizer, training_dataloader, lr_scheduler)``; when the config has an enabled
    ``"perfcheck"`` block the engine comes back wrapped in an ``EngineSession`` that measures."""
    import deepspeed

    raw = config if config is not None else config_params
    if raw is None and args is not None:
        raw = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    block = parse_block(raw)
    out = deepspeed.initialize(args=args, model=model, optimizer=optimizer, model_parameters=model_parameters,
                               training_data=training_data, lr_scheduler=lr_scheduler,
                               distributed_port=distributed_port, mpu=mpu, dist_init_required=dist_init_required,
                               collate_fn=collate_fn, config=config, mesh_param=mesh_param, config_params=config_params)
    if block is None or not block.enabled:
        return out
    engine, *rest = out
    return (attach_engine(None, engine, block, ds_config=load_config(raw)), *rest)


def attach_engine(perfcheck, engine, block=None, *, ds_config=None) -> "EngineSession":
    """Measure an existing DeepSpeed engine; returns the wrapper to use in its place.

    perfcheck: a not-yet-started ``perfcheck.PerfCheck`` on ``engine.module`` to drive (None: one is
    built from the block when ``block.modules``). block: a ``PerfcheckBlock``, a block dict, or None
    (the engine config's block, else defaults).
    """
    if type(engine).__name__ == "PipelineEngine":
        raise NotImplementedError("perfcheck.deepspeed: pipeline-parallel engines (PipelineEngine.train_batch) are "
                                  "not measured yet; only DeepSpeedEngine forward/backward/step loops are")
    cfg = ds_config if ds_config is not None else _engine_config(engine)
    if block is None:
        block = parse_block(cfg) or PerfcheckBlock()
    elif isinstance(block, Mapping):
        block = parse_block({BLOCK_KEY: dict(block)})
    return EngineSession(engine, block, cfg or {}, perfcheck)


def attach(engine, perfcheck=None, block=None) -> EngineSession:
    """Measure a DeepSpeed engine built by ``deepspeed.initialize``; returns the wrapper to use in
    its place (forward/backward/step are timed at the engine's boundaries). ``perfcheck``: a
    not-yet-started ``PerfCheck`` on ``engine.module`` to drive (default: one from the block);
    ``block``: the config's ``"perfcheck"`` block as a dict (default: the engine's config)."""
    return attach_engine(perfcheck, engine, block)


def _engine_config(engine) -> dict:
    cfg = getattr(getattr(engine, "_config", None), "_param_dict", None)
    return dict(cfg) if isinstance(cfg, Mapping) else {}


def save_prediction(run_dir, model, example_inputs, *, system=None, dtype=None, config: Optional[Mapping] = None,
                    world_size: int = 1) -> Optional[Path]:
    """Write ``<run_dir>/predicted.csv`` + ``predicted.json``: ``perfcheck.estimate`` of one
    micro-batch on one rank (compute only; ``perfcheck compare`` adds the ZeRO collectives), through
    the run directory's one predicted-file writer (``perfcheck.predict.for_run.save_predicted``).
    With the run's DeepSpeed ``config`` and ``world_size``, the engine's own step (its host work and collectives)
    counts in how long each op family waits between steps (``analysis.stage_prediction.outside_model_s``).
    Call it with the model before DeepSpeed partitions it. Returns the path (None if the estimator
    failed, with a warning: a prediction never stops the training run)."""
    try:
        # the spec resolved once, here: predicted.json embeds it, so a stage whose ranks died still reports
        # (a calibrated spec's name, e.g. "cpu-calibrated", is no built-in another process could load)
        spec = load_system(system if system is not None else module_estimator.default_system_name())

        def run(step_other_s=0.0):
            return estimate(model, example_inputs, system=spec, dtype=dtype, step_other_s=step_other_s)
        facts = config_facts(model, config, world_size) if config is not None else None
        frame = run() if facts is None else with_step_other(run, lambda f: outside_model_s(facts, f, spec))
        return save_predicted(run_dir, frame, system=spec, dtype=frame.attrs.get("dtype", dtype))
    except Exception as exc:  # noqa: BLE001 - a prediction must never stop the training run
        warnings.warn(f"perfcheck: no prediction saved ({type(exc).__name__}: {exc})", RuntimeWarning, stacklevel=2)
        return None
