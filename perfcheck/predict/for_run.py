"""The prediction for a measured run: re-run the estimator with what meta.json recorded, save it beside the run.

``predict_for_run(model, meta)`` rebuilds the example inputs as meta-device tensors from the input
spec PerfCheck recorded (``meta["inputs"]``: shapes and dtypes of the root's first call), takes
the dtype and the parallel setup (data-parallel degree, ZeRO stage) from the meta, and returns
``perfcheck.estimate``'s frame. ``save_predicted(run_dir, frame)`` writes ``predicted.csv`` (at the
top of the run, or in ``rank<R>/``) and ``predicted.json`` (schema version, system, dtype), so
``perfcheck report`` works on a run directory copied to a machine without the model.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import pandas as pd

from perfcheck.errors import UserError
from perfcheck.hardware import systems
from perfcheck.hardware.labels import datasheet_default, spec_label
from perfcheck.hardware.systems import SystemSpec, load_system, spec_of
import perfcheck.rundir as runs
from perfcheck.parallel import ParallelConfig
from perfcheck.predict import layout, layout_collectives
from perfcheck.predict.estimate import estimate
from perfcheck.predict.host import optimizer_kind
from perfcheck.predict.module_estimator import estimate_terms, finish
from perfcheck.schema import PREDICTED_COLUMNS, PREDICTED_EXTRA_COLUMNS, SCHEMA_VERSION, SchemaError, validate_frame

PREDICTED_CSV = "predicted.csv"
PREDICTED_JSON = "predicted.json"


# ------------------------------------------------------------------------------ inputs
def _from_spec(spec, where: str):
    import torch

    if isinstance(spec, list):
        return [_from_spec(s, f"{where}[{i}]") for i, s in enumerate(spec)]
    if not isinstance(spec, dict):
        raise UserError(f"meta.json: {where}: expected an input spec object, got {spec!r}")
    if "shape" in spec:
        try:
            dtype = getattr(torch, str(spec.get("dtype", "float32")))
            t = torch.empty([int(d) for d in spec["shape"]], dtype=dtype, device="meta")
        except (AttributeError, TypeError, ValueError, RuntimeError) as exc:
            raise UserError(f"meta.json: {where}: bad tensor spec {spec!r} ({exc})") from None
        return t.requires_grad_(True) if spec.get("requires_grad") and t.is_floating_point() else t
    if "value" in spec:
        return spec["value"]
    if set(spec) == {"type"}:
        raise UserError(f"meta.json: {where} is a {spec['type']} that the input spec cannot rebuild; "
                        "run perfcheck.estimate yourself and save it with perfcheck.predict.for_run.save_predicted")
    return {k: _from_spec(v, f"{where}.{k}") for k, v in spec.items()}


def inputs_from_meta(meta: dict) -> tuple:
    """``(args, kwargs)`` of meta-device tensors rebuilt from ``meta["inputs"]``."""
    spec = meta.get("inputs")
    if not isinstance(spec, dict) or "args" not in spec:
        raise UserError("meta.json: no input spec ('inputs' with 'args'); the run never called the model's forward")
    return tuple(_from_spec(spec["args"], "inputs.args")), _from_spec(spec.get("kwargs") or {}, "inputs.kwargs")


def parallel_from_meta(meta: dict):
    """A ParallelConfig for the data-parallel / ZeRO layout in ``meta["parallel"]``, or None (one process)."""
    par = meta.get("parallel") or {}
    world = int(par.get("world_size", meta.get("world_size", 1)) or 1)
    dp = int(par.get("dp", world if par.get("kind") in ("ddp", "deepspeed") else 1) or 1)
    tp = int(par.get("tp", par.get("mp", 1)) or 1)
    fields = {"dp": dp, "tp": tp, "pp": int(par.get("pp", 1) or 1), "zero_stage": int(par.get("zero_stage", 0) or 0),
              "grad_accum_steps": int(par.get("gradient_accumulation_steps", par.get("grad_accum_steps", 1)) or 1)}
    if fields["dp"] == 1 and fields["tp"] == 1 and fields["pp"] == 1:
        return None
    return ParallelConfig(**fields)


def system_from_meta(meta: dict, system=None):
    """``system`` if given, else the meta's ``system``, else the labelled datasheet default for a CPU run
    or the GPU's entry by name. Reads no calibration cache and runs nothing: the reader's machine never
    enters a run's prediction (the run's own spec is embedded in its predicted.json)."""
    if system is not None:
        return system
    if meta.get("system"):
        return meta["system"]
    device = meta.get("device") or {}
    if device.get("type", "cpu") == "cpu":
        return datasheet_default("cpu")

    match = getattr(systems, "match_device_name", None)
    if match is None or not device.get("name"):
        raise UserError(f"meta.json: device {device.get('name')!r}: give the system (--system NAME)")
    return match(device["name"])


def optimizer_for_run(meta: dict) -> tuple:
    """``(name for estimate(optimizer=...) or None, label for reports)`` from meta.json ``optimizer``
    (measure/optimizers.py): a modelled one by name; one ``optimizer_kind`` does not model gives None
    and "optimizer X: not modelled" (its step is left unpredicted, never costed as another); a run
    that recorded none (older runs, no step seen) keeps the former SGD assumption and says so."""
    name = meta.get("optimizer")
    if not name:
        return "sgd", "sgd (assumed: the run recorded no optimizer)"
    try:
        optimizer_kind(str(name))
    except (UserError, NotImplementedError):
        return None, f"optimizer {name}: not modelled"
    return str(name), str(name)


def predict_for_run(model, meta: dict, *, system=None, step_other_s: float = 0.0) -> pd.DataFrame:
    """The predicted frame (schema.PREDICTED_COLUMNS) for the run described by ``meta`` (meta.json);
    ``attrs["optimizer"]`` names the optimizer costed (``optimizer_for_run``). ``step_other_s``: the step's
    seconds outside the model (``perfcheck.estimate``'s; an engine's: ``with_step_other``)."""
    optimizer, label = optimizer_for_run(meta)
    frame = _estimate_for_run(model, meta, system, optimizer, step_other_s)  # None: not modelled, pred_optim_s NaN
    frame.attrs["optimizer"] = label
    return frame


def _estimate_for_run(model, meta: dict, system, optimizer, step_other_s: float = 0.0) -> pd.DataFrame:
    args, kwargs = inputs_from_meta(meta)
    kind = str((meta.get("parallel") or {}).get("kind", ""))
    if layout.is_sharded(model):
        # FSDP2 / DTensor: estimate() traces an unparallelised meta twin (the live model's state and
        # hooks are never touched) and adds the collectives the live layout issues per module.
        return estimate(model, args, system=system_from_meta(meta, system), dtype=meta.get("dtype") or None,
                        kwargs=kwargs or None, optimizer=optimizer, step_other_s=step_other_s)
    if kind == "ddp" and layout.has_buckets(model):
        spec = spec_of(system_from_meta(meta, system))  # resolved once, for the compute and the collectives
        terms = estimate_terms(model, args, system=spec, dtype=meta.get("dtype") or None, parallel=None,
                               kwargs=kwargs or None, optimizer=optimizer, step_other_s=step_other_s)
        return finish(layout_collectives.add_live_collectives(terms, model, spec), comm_bound=False)
    return estimate(model, args, system=system_from_meta(meta, system), dtype=meta.get("dtype") or None,
                    parallel=parallel_from_meta(meta), kwargs=kwargs or None, optimizer=optimizer,
                    step_other_s=step_other_s)


def with_step_other(estimate, outside, warn=None) -> pd.DataFrame:
    """``estimate(step_other_s)`` (a one-argument call of ``perfcheck.estimate`` or ``predict_for_run``) with the
    step's seconds outside the model in the host model's far rule: a first estimate gives what ``outside(frame)``
    needs (the module calls, the optimizer step it prices), a second the table; ``outside`` None: one estimate, 0.
    ``attrs["step_other_s"]`` says what went in. With ``warn``, an ``outside`` that fails is left out (0) and said
    through ``warn(message)``, so a run keeps its prediction. Why: between two forwards an engine runs milliseconds
    of its own code and collectives (``analysis.stage_prediction.outside_model_s``), which the model's ops and
    optimizer alone do not count."""
    frame = estimate(0.0)
    try:
        other = float(outside(frame)) if outside is not None else 0.0
    except Exception as exc:  # noqa: BLE001 - a missing engine fact must not cost a run its prediction
        if warn is None:
            raise
        warn(f"the engine's step outside the model left out of the prediction ({type(exc).__name__}: {exc})")
        other = 0.0
    out = estimate(other) if other > 0 else frame
    out.attrs["step_other_s"] = other
    return out


#: Where a run's model can be rebuilt from, for a run that records no ``meta["model"]["factory"]``:
#: the built-in examples by class name, as "module:callable" names of zero-argument factories. Data,
#: imported by name only when a report must re-estimate such a run, so predict/ holds no import of
#: the examples' floor above it (tests/test_architecture.py FLOORS).
EXAMPLE_FACTORIES = {"Net": "perfcheck.examples.models:Net", "JSC_Tiny": "perfcheck.examples.models:JSC_Tiny",
                     "GPT": "perfcheck.examples.models:gpt_small"}


def factory_of(model):
    """The "module:callable" a run records as its model's factory (``meta["model"]["factory"]``): the
    model's ``perfcheck_factory`` attribute (the built-in examples set it; a user may too), else None."""
    name = getattr(model, "perfcheck_factory", None)
    return name if isinstance(name, str) and ":" in name else None


def _build(factory: str):
    """The model a "module:callable" zero-argument factory returns, or None where it cannot be imported
    or called (a report then says the model cannot be rebuilt)."""
    module, _, attr = factory.partition(":")
    try:
        build = importlib.import_module(module)
        for part in attr.split("."):
            build = getattr(build, part)
        return build()
    except (ImportError, AttributeError, TypeError, ValueError):
        return None


def model_from_meta(meta: dict):
    """The run's model rebuilt to re-estimate it: from the factory the run recorded
    (``meta["model"]["factory"]``, "module:callable"), else a built-in example of the recorded class
    name (``EXAMPLE_FACTORIES``); None unless the class name and the parameter count both match."""
    info = meta.get("model") or {}
    factory = info.get("factory") or EXAMPLE_FACTORIES.get(str(info.get("type")))
    model = _build(factory) if isinstance(factory, str) else None
    if model is None or type(model).__name__ != info.get("type"):
        return None
    return model if sum(p.numel() for p in model.parameters()) == info.get("params") else None


# ------------------------------------------------------------------------------ files
def save_predicted(run_dir, frame: pd.DataFrame, *, rank: int | None = None, system=None, dtype=None) -> Path:
    """Write ``predicted.csv`` + ``predicted.json`` at the top of ``run_dir`` (or in ``rank<R>/``); return the CSV path."""
    base = Path(run_dir) if rank is None else runs.rank_dir(run_dir, rank)
    cols = _columns(frame)
    try:
        validate_frame(frame, cols, "predicted frame")
    except SchemaError as exc:
        raise UserError(str(exc)) from None
    path = runs.atomic_write_text(base / PREDICTED_CSV, frame[cols].to_csv(index=False))  # floats round-trip exactly
    # the system's name, and how report headers say where its numbers came from (calibrated cache/file, datasheet)
    spec = load_system(system) if system is not None and not (isinstance(system, str) and system ==
                                                               frame.attrs.get("system")) else None
    name = spec.name if spec is not None else frame.attrs.get("system")
    label = frame.attrs.get("system_label") if spec is None else None
    if spec is not None:
        label = spec_label(spec)
    if spec is None and name is not None:
        try:  # the frame's own system: embed it too, so the run carries the spec it was predicted with
            spec = load_system(name)
        except UserError:
            spec = None
    runs.atomic_write_json(base / PREDICTED_JSON, {"schema_version": SCHEMA_VERSION, "system": name,
                                                   "system_label": label,
                                                   # where the spec came from (per-user cache, file, default),
                                                   # so a report read later says so, not "a SystemSpec object"
                                                   "system_origin": getattr(spec, "origin", None),
                                                   # the whole spec: a run predicted with a calibrated file
                                                   # reports anywhere without that file (or --system)
                                                   "system_spec": spec.to_json_dict() if spec is not None else None,
                                                   "dtype": None if dtype is None else str(dtype).replace("torch.", ""),
                                                   # the step's seconds outside the model in the far rule's
                                                   # ages (with_step_other), where an engine's were counted
                                                   "step_other_s": frame.attrs.get("step_other_s")})
    return path


def _read_one(csv: Path) -> tuple:
    side = csv.with_name(PREDICTED_JSON)
    if not side.is_file():
        raise UserError(f"{side}: missing file ({csv.name} without its {PREDICTED_JSON} is from an older perfcheck or "
                        "another tool; re-run the prediction with perfcheck.predict.for_run.save_predicted)")
    info = runs.read_versioned_json(side, PREDICTED_JSON)
    if info.get("system_spec") is not None:
        info["spec"] = SystemSpec.from_dict(info["system_spec"], where=f"{side}: system_spec")
        # where it came from, as saved (a live and a saved report then print the same header); a file from
        # before the field: where it is now
        object.__setattr__(info["spec"], "origin", info.get("system_origin") or f"embedded in {side}")
    return _parse_predicted(csv, str(csv)), info


def _columns(frame: pd.DataFrame) -> list:
    return list(PREDICTED_COLUMNS) + [c for c in PREDICTED_EXTRA_COLUMNS if c in frame.columns]


def _parse_predicted(source, where: str) -> pd.DataFrame:
    """predicted.csv text (a path or a buffer) → the frame; the one parser of predicted rows."""
    data, _ = runs.csv_data(source, where)  # a link out: UserError; a cut last row dropped (load_run notes it)
    try:  # bytes that are not UTF-8, rows that do not split: UserError
        frame = runs.parse_csv(data, where, keep_default_na=False, na_values=["", "nan", "NaN"])
    except pd.errors.EmptyDataError:
        raise UserError(f"{where}: cannot read the predicted rows (the file is empty)") from None
    try:
        validate_frame(frame, PREDICTED_COLUMNS, where)
    except SchemaError as exc:
        raise UserError(str(exc)) from None
    runs.check_cells(frame, where)
    for c in ("comm_kind", "unmodeled_ops", "bound_fwd", "bound_bwd", "source"):
        if c in frame:
            frame[c] = frame[c].fillna("").astype(str)
    return frame


def read_predicted_file(path) -> pd.DataFrame:
    """A predicted.csv the user names (``perfcheck whatif --predicted``): the same checked parser (a link
    the user names is followed: it is no file found inside an untrusted run directory)."""
    return _parse_predicted(Path(path).resolve(), str(path))


def normalize_predicted(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame exactly as saving it to predicted.csv and reading it back gives it, so a live
    prediction and a saved one reconcile identically."""
    import io

    return _parse_predicted(io.StringIO(frame[_columns(frame)].to_csv(index=False)), "predicted frame")


def load_predicted(run_dir, ranks=(0,)):
    """``(frame, info)`` from ``rank<R>/predicted.csv`` (per rank, a ``rank`` column added) or the top-level
    ``predicted.csv``; ``(None, {})`` when the run has neither. ``info``: predicted.json (system, dtype)."""
    run_dir = Path(run_dir)
    per_rank = {r: run_dir / f"rank{r}" / PREDICTED_CSV for r in ranks}
    found = {r: p for r, p in per_rank.items() if p.is_file()}
    if found:
        frames, info = [], {}
        for r, p in sorted(found.items()):
            f, i = _read_one(p)
            frames.append(f.assign(rank=r))
            info = info or i
        return pd.concat(frames, ignore_index=True), info
    top = run_dir / PREDICTED_CSV
    if top.is_file():
        return _read_one(top)
    return None, {}
