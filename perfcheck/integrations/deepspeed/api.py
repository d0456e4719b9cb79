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

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional

from perfcheck.errors import UserError
from perfcheck.integrations.deepspeed.engine_session import EngineSession

BLOCK_KEY = "perfcheck"


@dataclasses.dataclass(frozen=True)
class ProfilerWindow:
    enabled: bool = True
    wait: int = 0
    warmup: int = 1
    active: int = 1


@dataclasses.dataclass(frozen=True)
class PerfcheckBlock:
    """The validated ``"perfcheck"`` block of a DeepSpeed config."""

    enabled: bool = True
    warmup_steps: int = 2
    steps: int = 5
    output_dir: Optional[str] = None
    system: Optional[str] = None
    sampler_interval_s: Optional[float] = 0.1
    profiler: ProfilerWindow = ProfilerWindow()
    modules: bool = True
    comms_steps: int = 1
    overhead_pairs: int = 0
    label: Optional[str] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def total_steps(self) -> int:
        """Optimizer steps until the run directory is complete."""
        window = self.profiler.warmup + self.profiler.active if self.profiler.enabled else 0
        return self.warmup_steps + window + self.steps + self.bare_steps

    @property
    def bare_steps(self) -> int:
        """Bare steps the run makes: one after each of the first ``overhead_pairs`` measured steps, so
        at most ``steps`` (and none without module hooks to take off)."""
        return min(self.overhead_pairs, self.steps) if self.modules else 0


def _int(value, key, minimum=0):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f'"perfcheck" block: {key} must be an integer >= {minimum}, got {value!r}')
    return value


def _bool(value, key):
    if not isinstance(value, bool):
        raise UserError(f'"perfcheck" block: {key} must be true or false, got {value!r}')
    return value


def _profiler(value) -> ProfilerWindow:
    if isinstance(value, bool):
        return ProfilerWindow(enabled=value)
    if not isinstance(value, Mapping):
        raise UserError(f'"perfcheck" block: profiler must be true, false or {{"enabled", "wait", "warmup", '
                        f'"active"}}, got {value!r}')
    known = [f.name for f in dataclasses.fields(ProfilerWindow)]
    for key in value:
        if key not in known:
            raise UserError(f'"perfcheck" block: unknown key profiler.{key!r} (known: {", ".join(known)})')
    kw = {k: (_bool(v, f"profiler.{k}") if k == "enabled" else _int(v, f"profiler.{k}", 1 if k == "active" else 0))
          for k, v in value.items()}
    return ProfilerWindow(**kw)


def parse_block(config) -> Optional[PerfcheckBlock]:
    """The ``"perfcheck"`` block of a DeepSpeed config (dict, JSON path, or the block itself when it
    has no DeepSpeed keys); None when the config has no block. Raises UserError naming a bad key."""
    cfg = load_config(config)
    if cfg is None:
        return None
    block = cfg.get(BLOCK_KEY, None) if BLOCK_KEY in cfg else None
    if block is None:
        return None
    if not isinstance(block, Mapping):
        raise UserError(f'"perfcheck" block must be an object, got {type(block).__name__}')
    known = [f.name for f in dataclasses.fields(PerfcheckBlock)]
    for key in block:
        if key not in known:
            raise UserError(f'"perfcheck" block: unknown key {key!r} (known: {", ".join(known)})')
    kw = {}
    for key, value in block.items():
        if key in ("enabled", "modules"):
            kw[key] = _bool(value, key)
        elif key in ("warmup_steps", "comms_steps", "overhead_pairs"):
            kw[key] = _int(value, key)
        elif key == "steps":
            kw[key] = _int(value, key, 1)
        elif key in ("output_dir", "system", "label"):
            if value is not None and not isinstance(value, str):
                raise UserError(f'"perfcheck" block: {key} must be a string, got {value!r}')
            kw[key] = value
        elif key == "sampler_interval_s":
            if value is not None:
                from perfcheck.measure.sampler import MIN_INTERVAL_S

                if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= MIN_INTERVAL_S:
                    raise UserError(f'"perfcheck" block: sampler_interval_s must be seconds >= {MIN_INTERVAL_S}, or '
                                    f'null to turn the sampler off, got {value!r}')
            kw[key] = None if value is None else float(value)
        elif key == "profiler":
            kw[key] = _profiler(value)
    parsed = PerfcheckBlock(**kw)
    if parsed.system is not None:
        from perfcheck.hardware.systems import load_system

        load_system(parsed.system)  # a bad name or file fails here, before training starts
    return parsed


def load_config(config) -> Optional[dict]:
    if config is None:
        return None
    if isinstance(config, (str, Path)):
        try:
            return json.loads(Path(config).read_text())
        except OSError as exc:
            raise UserError(f"{config}: cannot read DeepSpeed config ({exc})") from None
        except json.JSONDecodeError as exc:
            raise UserError(f"{config}: not valid JSON ({exc})") from None
    if isinstance(config, Mapping):
        return dict(config)
    raise UserError(f"DeepSpeed config must be a dict or a JSON path, got {type(config).__name__}")


def merge_configs(base: Mapping, overlay: Optional[Mapping]) -> dict:
    """``base`` with ``overlay`` merged in: objects merge key by key (recursively), anything else
    in the overlay replaces the base's value. Neither input is modified."""
    out = json.loads(json.dumps(dict(base)))
    for key, value in (overlay or {}).items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_configs(out[key], value)
        else:
            out[key] = json.loads(json.dumps(value))
    return out


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


def save_prediction(run_dir, model, example_inputs, *, system=None, dtype=None) -> Optional[Path]:
    """Write ``<run_dir>/predicted.csv`` + ``predicted.json``: ``perfcheck.estimate`` of one
    micro-batch on one rank (compute only; ``perfcheck compare`` adds the ZeRO collectives), through
    the run directory's one predicted-file writer (``perfcheck.predict.for_run.save_predicted``).
    Call it with the model before DeepSpeed partitions it. Returns the path (None if the estimator
    failed, with a warning: a prediction never stops the training run)."""
    from perfcheck.hardware.systems import load_system
    from perfcheck.predict.estimate import estimate
    from perfcheck.predict.for_run import save_predicted
    from perfcheck.predict.module_estimator import default_system_name

    try:
        # the spec resolved once, here: predicted.json embeds it, so a stage whose ranks died still reports
        # (a calibrated spec's name, e.g. "cpu-calibrated", is no built-in another process could load)
        spec = load_system(system if system is not None else default_system_name())
        frame = estimate(model, example_inputs, system=spec, dtype=dtype)
        return save_predicted(run_dir, frame, system=spec, dtype=frame.attrs.get("dtype", dtype))
    except Exception as exc:  # noqa: BLE001 - a prediction must never stop the training run
        warnings.warn(f"perfcheck: no prediction saved ({type(exc).__name__}: {exc})", RuntimeWarning, stacklevel=2)
        return None
