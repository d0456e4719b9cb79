"""What-if: a measured run's per-module and step time predicted on another system.

Each module's *own* time (its measured time minus its children's: a leaf's whole time, a
container's residual adds, functional ops and framework time) is multiplied by the ratio of its
modelled time on the target system B to its modelled time on the run's system A (``--from``).
The modelled time is the estimator's, term by term, from the prediction's own FLOPs, bytes,
kernels and collective bytes:

    compute   matrix FLOPs / (matrix_peak(dtype) * efficiency at the kernel's size) + other FLOPs / vector rate
    memory    bytes / (mem_bandwidth * efficiency.memory)
    overhead  kernels * launch_overhead_s
    comm      collective bytes at the link bandwidth of the run's group (intra- or inter-node)
    time      max(compute, memory) + overhead + comm

so each term scales by the ratio of its ceiling: a compute-bound module on a B with twice A's
achievable FLOP/s takes half the time, a memory-bound one on a B with 4x the bandwidth a quarter,
and a module whose bound changes (compute-bound on a CPU, launch-bound on a GPU) is timed by B's
bound (``target_bound_*``) instead of being scaled past B's launch floor. Kernels come from the
prediction's ``kernels_<phase>`` column when it has one, else from the part of A's predicted time
that compute, memory and communication do not explain, divided by A's launch overhead. Measured
time without predicted work ("host": hooks, Python) and modules the prediction lacks ("unknown")
are kept as measured. A container's predicted time is the sum of the scaled own times in its
subtree; the step is the root's forward + backward + recompute (scaled like the root's forward),
the optimizer (memory-bound: it streams parameters, gradients and states) and the rest of the
step (data, loss, Python: host time, kept as measured). The estimator's full model of a predicted
time (efficiency factors, host timeline): docs/model.md.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from perfcheck.errors import UserError
import perfcheck.rundir as runs
from perfcheck.predict import collectives, for_run as predict_run, roofline
from perfcheck.schema import ROOT, parent_path
from perfcheck.hardware.systems import load_system, normalize_dtype

BOUND_KINDS = ("compute", "memory", "overhead", "comm", "host", "unknown")

WHATIF_COLUMNS = {
    "module": "module path",
    "type": "module class name",
    "depth": "0 for the root",
    "bound_fwd": "what limits the module's own forward time on system A: compute | memory | overhead | comm | "
                 "host (measured time without predicted work, kept) | unknown (not in the prediction, kept)",
    "bound_bwd": "what limits the module's own backward time on system A",
    "target_bound_fwd": "what limits the module's own forward time on system B",
    "target_bound_bwd": "what limits the module's own backward time on system B",
    "meas_fwd_s": "measured forward time per step on A (median over measured steps), seconds",
    "meas_bwd_s": "measured backward time per step on A, seconds",
    "pred_fwd_s": "forward time per step predicted on B: own times in the subtree x modelled B/A time, seconds",
    "pred_bwd_s": "backward time per step predicted on B, seconds",
    "speedup_fwd": "meas_fwd_s / pred_fwd_s (> 1: faster on B)",
    "speedup_bwd": "meas_bwd_s / pred_bwd_s",
    "speedup": "(meas_fwd_s + meas_bwd_s) / (pred_fwd_s + pred_bwd_s)",
}

STEP_PARTS = ("fwd", "bwd", "recompute", "optim", "other")


def ceilings(system, dtype, *, flops_per_kernel=None, group_size: int = 1) -> dict:
    """Achievable rates of ``system`` per bound: FLOP/s, B/s, launches/s, link B/s (vectorised over kernel sizes)."""
    spec = load_system(system)
    eff = roofline.matrix_efficiency(spec, dtype, flops_per_kernel)
    link = (collectives.link_bandwidth_bytes_per_s(spec, group_size) if group_size > 1
            else spec.intra_node_bandwidth_bytes_per_s * spec.efficiency["intra_node"])
    return {"matrix": spec.matrix_peak(dtype) * np.asarray(eff, dtype=float),
            "vector": spec.vector_peak(dtype) * spec.efficiency["vector"],
            "memory": spec.mem_bandwidth_bytes_per_s * spec.efficiency["memory"],
            "overhead": 1.0 / spec.launch_overhead_s if spec.launch_overhead_s > 0 else math.inf,
            "comm": float(link)}


def speedups(source, target, bounds, *, matrix=None, flops_per_kernel=None, dtype="fp32", target_dtype=None,
             group_size: int = 1) -> np.ndarray:
    """Per row: B's ceiling / A's ceiling for the row's bound (1 for 'unknown').

    ``matrix`` (bool per row) picks the matrix rate for compute-bound rows, else the vector rate.
    """
    bounds = np.asarray(bounds, dtype=object)
    n = len(bounds)
    fpk = np.ones(n) if flops_per_kernel is None else np.asarray(flops_per_kernel, dtype=float)
    mat = np.ones(n, dtype=bool) if matrix is None else np.asarray(matrix, dtype=bool)
    a = ceilings(source, dtype, flops_per_kernel=fpk, group_size=group_size)
    b = ceilings(target, target_dtype or dtype, flops_per_kernel=fpk, group_size=group_size)
    ratio = {k: np.broadcast_to(np.asarray(b[k], dtype=float) / np.asarray(a[k], dtype=float), (n,))
             for k in ("matrix", "vector", "memory", "overhead", "comm")}
    out = np.ones(n)
    out = np.where(bounds == "compute", np.where(mat, ratio["matrix"], ratio["vector"]), out)
    for k in ("memory", "overhead", "comm"):
        out = np.where(bounds == k, ratio[k], out)
    unknown = ~np.isin(bounds, BOUND_KINDS)
    if unknown.any():
        raise UserError(f"bound: unknown value {bounds[unknown][0]!r} (known: {', '.join(BOUND_KINDS)})")
    return out


# -------------------------------------------------------------------------------- own parts
def _children(paths) -> dict:
    present = set(paths)
    kids = {p: [] for p in paths}
    for p in paths:
        parent = parent_path(p)
        while parent is not None and parent not in present:  # a skipped level (e.g. a ModuleList)
            parent = parent_path(parent)
        if parent is not None:
            kids[parent].append(p)
    return kids


def _own(frame: pd.DataFrame, col: str, kids: dict) -> pd.Series:
    values = frame.set_index("module")[col].astype(float)
    own = {p: values[p] - sum(values.get(c, 0.0) for c in kids[p]) for p in values.index}
    return pd.Series(own).clip(lower=0.0)


def own_parts(pred: pd.DataFrame, phase: str, kids: dict) -> pd.DataFrame:
    """Each module's own predicted work in ``phase`` (its row minus its children's): matrix/other FLOPs, bytes,
    collective bytes and kind, kernels (NaN without a ``kernels_<phase>`` column), predicted time on A, calls."""
    idx = pred.set_index("module")
    out = pd.DataFrame({"macs": _own(pred, f"macs_{phase}", kids), "flops": _own(pred, f"flops_{phase}", kids),
                        "bytes": _own(pred, f"bytes_{phase}", kids), "comm": _own(pred, f"comm_{phase}_bytes", kids),
                        "t_a": _own(pred, f"pred_{phase}_s", kids)})
    out["kernels"] = _own(pred, f"kernels_{phase}", kids) if f"kernels_{phase}" in pred else np.nan
    out["calls"] = idx["calls"].astype(float).clip(lower=1.0).reindex(out.index)
    out["comm_kind"] = idx["comm_kind"].fillna("").astype(str).reindex(out.index) if "comm_kind" in idx else ""
    out["leaf_bound"] = idx[f"bound_{phase}"].reindex(out.index)
    out["leaf"] = [not kids.get(p) for p in out.index]
    return out


def _terms(parts: pd.DataFrame, system, dtype, phase: str, world: int):
    """(compute, memory, comm) seconds of the own parts on ``system``."""
    macs = parts["macs"].to_numpy(float)
    other = np.maximum(parts["flops"].to_numpy(float) - 2 * macs, 0.0)
    per_kernel = np.maximum(2 * macs / parts["calls"].to_numpy(float) / (1 if phase == "fwd" else 2), 1.0)
    c = ceilings(system, dtype, flops_per_kernel=per_kernel, group_size=world)
    compute = 2 * macs / np.asarray(c["matrix"], dtype=float) + other / c["vector"]
    memory = parts["bytes"].to_numpy(float) / c["memory"]
    comm_bytes = parts["comm"].to_numpy(float)
    kinds = [(k.split("+")[0] or "allreduce") for k in parts["comm_kind"].astype(str)]
    comm = (np.where(comm_bytes > 0, collectives.collective_time_s(kinds, comm_bytes, world, system), 0.0)
            if world > 1 and (comm_bytes > 0).any() else np.zeros(len(parts)))
    return compute, memory, comm


def _bound(compute, memory, launch, comm) -> np.ndarray:
    """The estimator's rule: overhead when launches exceed the roofline, comm when it is over half, else the larger."""
    roof = np.maximum(compute, memory)
    total = roof + launch + comm
    b = np.where(launch > roof, "overhead", np.where(compute >= memory, "compute", "memory"))
    b = np.where(comm > 0.5 * total, "comm", b)
    return np.where(total > 0, b, "host").astype(object)


def modelled_ratio(parts: pd.DataFrame, source, target, dtype, target_dtype, phase: str, world: int = 1):
    """``(ratio, bound_a, bound_b)`` per own part: modelled time on B / modelled time on A (1 without work)."""
    src, tgt = load_system(source), load_system(target)
    ca, ma, xa = _terms(parts, src, dtype, phase, world)
    cb, mb, xb = _terms(parts, tgt, target_dtype, phase, world)
    kernels = parts["kernels"].to_numpy(float)
    unexplained = np.maximum(parts["t_a"].to_numpy(float) - np.maximum(ca, ma) - xa, 0.0)
    derived = unexplained / max(src.launch_overhead_s, 1e-12)
    kernels = np.where(np.isfinite(kernels), kernels, derived)
    la, lb = kernels * src.launch_overhead_s, kernels * tgt.launch_overhead_s
    t_a = np.maximum(ca, ma) + la + xa
    t_b = np.maximum(cb, mb) + lb + xb
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(t_a > 0, t_b / t_a, 1.0)
    bound_a, bound_b = _bound(ca, ma, la, xa), _bound(cb, mb, lb, xb)
    leaf = parts["leaf"].to_numpy(bool) & parts["leaf_bound"].isin(BOUND_KINDS).to_numpy() & (bound_a != "host")
    return ratio, np.where(leaf, parts["leaf_bound"].to_numpy(object), bound_a), bound_b


# -------------------------------------------------------------------------------- the run
_PRED_NEEDED = ("module", "macs_fwd", "macs_bwd", "flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd",
                "pred_fwd_s", "pred_bwd_s", "bound_fwd", "bound_bwd")


def resolve_predicted(predicted, run, rank: int, source):
    """``(frame, how)``: the model's prediction on system A, and where it came from.

    In order: ``predicted`` (a DataFrame or a CSV path); the run's own ``predicted.csv``
    (``perfcheck.predict.for_run.load_predicted``); a built-in example the run's meta.json names,
    estimated on ``source`` (``predict_run.model_from_meta`` / ``predict_for_run``).
    """
    how = None
    if isinstance(predicted, pd.DataFrame):
        frame, how = predicted, "given"
    elif predicted is not None:
        if not Path(predicted).is_file():
            raise UserError(f"predicted: file {str(predicted)!r} does not exist")
        frame, how = predict_run.read_predicted_file(predicted), str(predicted)
    else:
        frame, info = predict_run.load_predicted(run.run_dir, ranks=(rank,))
        other = info.get("system") if frame is not None and info.get("system") not in (None, source.name) else None
        if frame is not None and other is None:
            how = f"{run.run_dir}/predicted.csv" + (f" (estimated on {info['system']})" if info.get("system") else "")
        else:  # none saved, or saved for another system: A's terms are what the scaling needs
            model = predict_run.model_from_meta(run.meta[rank])
            if model is None:
                why = (f"its predicted.csv was estimated on {other}, not {source.name} (pass --from {other})"
                       if other else "it has no predicted.csv")
                raise UserError(f"predicted: {run.run_dir}: {why}, and its model is not a built-in example to "
                                "re-estimate; or pass --predicted FILE (perfcheck estimate ... --format csv)")
            frame = predict_run.predict_for_run(model, run.meta[rank], system=source)
            how = f"estimated now on {source.name} (built-in example {type(model).__name__})"
    missing = [c for c in _PRED_NEEDED if c not in frame.columns]
    if missing:
        raise UserError(f"predicted: missing column {missing[0]!r}")
    frame = frame.copy()
    if "rank" in frame and frame["rank"].nunique() > 1:
        frame = frame[frame["rank"].astype(int) == rank]
    for c in ("comm_fwd_bytes", "comm_bwd_bytes", "calls"):
        if c not in frame:
            frame[c] = 0.0 if c != "calls" else 1.0
    for c in ("bound_fwd", "bound_bwd"):
        frame[c] = frame[c].fillna("").astype(str)
    frame["module"] = frame["module"].fillna(ROOT).astype(str)
    return frame, how


def _run_dtype(run, rank) -> str:
    meta = run.meta.get(rank, {})
    return str(meta.get("dtype") or meta.get("model", {}).get("dtype") or "fp32")


def whatif(run, target, *, source=None, predicted=None, dtype=None, target_dtype=None, rank: int = 0) -> pd.DataFrame:
    """Predict a measured run on ``target``: WHATIF_COLUMNS per module; the step in ``attrs["step"]``.

    run: a run directory (``perfcheck.rundir.load_run``) or a loaded ``Run``.
    target: system B (name, JSON path or SystemSpec). source: system A the run was measured on
      (default: the run's device kind: ``cpu``, or the spec named in meta.json's ``system``).
    predicted: the model's prediction on A (DataFrame or CSV path); default: the run's
      predicted.csv, else a built-in example named by meta.json estimated on A (``resolve_predicted``).
    dtype: the run's dtype (default: meta.json's); target_dtype: what B would run (default: the same).
    """
    run = runs.load_run(run) if not isinstance(run, runs.Run) else run
    if rank not in run.ranks:
        raise UserError(f"rank: {rank} is not in the run (ranks: {run.ranks})")
    meta = run.meta[rank]
    src = load_system(source if source is not None else _default_source(meta))
    tgt = load_system(target)
    dt = normalize_dtype(dtype or _run_dtype(run, rank))
    tdt = normalize_dtype(target_dtype or dt)
    src.matrix_peak(dt)
    tgt.matrix_peak(tdt)
    pred, how = resolve_predicted(predicted, run, rank, src)
    meas = run.modules[run.modules["rank"].astype(int) == rank] if "rank" in run.modules else run.modules
    if meas.empty:
        raise UserError(f"{run.run_dir}: rank {rank} has no measured modules (modules.csv is empty)")
    frame = _scale(meas, pred, src, tgt, dt, tdt, run.world_size)
    frame.attrs.update(step=_step(run, rank, frame, src, tgt, dt, tdt), source=_label(src), target=_label(tgt),
                       dtype=dt, target_dtype=tdt, ratios=_ratios(src, tgt, dt, tdt, run.world_size),
                       run_dir=str(run.run_dir), rank=rank, predicted=how)
    return frame


def _default_source(meta) -> str:
    if meta.get("system"):
        return meta["system"]
    kind = (meta.get("device") or {}).get("type", "cpu")
    if kind != "cpu":
        raise UserError("source: the run was measured on a GPU; give the system it ran on (--from SYSTEM)")
    return "cpu"


def _label(spec) -> str:
    return f"{spec.name} ({'calibrated' if spec.calibrated else 'datasheet'})"


def _ratios(src, tgt, dt, tdt, world) -> dict:
    a, b = ceilings(src, dt, group_size=world), ceilings(tgt, tdt, group_size=world)
    return {k: float(np.asarray(b[k]).reshape(-1)[0] / np.asarray(a[k]).reshape(-1)[0]) for k in a}


def _scale(meas, pred, src, tgt, dt, tdt, world) -> pd.DataFrame:
    m = meas.drop_duplicates("module").set_index("module")
    paths = _tree_order(m.index)
    kids = _children(paths)
    known = pd.Series(paths, index=paths).isin(set(pred["module"]))
    pk = pred[pred["module"].isin(paths)].drop_duplicates("module")
    out = pd.DataFrame({"module": paths, "type": m["type"].reindex(paths).to_numpy(),
                        "depth": m["depth"].reindex(paths).to_numpy()})
    for phase in ("fwd", "bwd"):
        times = m[f"{phase}_s_median"].astype(float).reindex(paths).fillna(0.0)
        own_meas = _own(pd.DataFrame({"module": paths, "t": times.to_numpy()}), "t", kids).reindex(paths)
        parts = own_parts(pk, phase, _children(list(pk["module"])))
        ratio, bound_a, bound_b = modelled_ratio(parts, src, tgt, dt, tdt, phase, world)
        r = pd.Series(ratio, index=parts.index).reindex(paths).where(known, 1.0).fillna(1.0)
        scaled = pd.Series(own_meas.to_numpy() * r.to_numpy(), index=paths)
        out[f"bound_{phase}"] = pd.Series(bound_a, index=parts.index).reindex(paths).where(known, "unknown").to_numpy()
        out[f"target_bound_{phase}"] = (pd.Series(bound_b, index=parts.index).reindex(paths)
                                        .where(known, "unknown").to_numpy())
        out[f"meas_{phase}_s"] = times.to_numpy()
        out[f"pred_{phase}_s"] = _subtree_sums(scaled, kids).reindex(paths).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        out["speedup_fwd"] = out["meas_fwd_s"] / out["pred_fwd_s"]
        out["speedup_bwd"] = out["meas_bwd_s"] / out["pred_bwd_s"]
        out["speedup"] = (out["meas_fwd_s"] + out["meas_bwd_s"]) / (out["pred_fwd_s"] + out["pred_bwd_s"])
    return out[list(WHATIF_COLUMNS)]


def _tree_order(paths) -> list:
    """Paths depth-first (parents before children, siblings in their first-seen order)."""
    paths = list(dict.fromkeys(paths))
    kids = _children(paths)
    children = {c for cs in kids.values() for c in cs}
    roots = [p for p in paths if p not in children]
    order, stack = [], list(reversed(roots))
    while stack:
        p = stack.pop()
        order.append(p)
        stack.extend(reversed(kids[p]))
    return order


def _subtree_sums(values: pd.Series, kids: dict) -> pd.Series:
    """Each module's value plus its descendants', children first (one pass)."""
    total = values.astype(float).to_dict()
    parent = {c: p for p, cs in kids.items() for c in cs}
    for q in sorted(total, key=lambda x: -x.count(".") - (x != ROOT)):
        if q in parent:
            total[parent[q]] += total[q]
    return pd.Series(total)


def _step(run, rank, frame, src, tgt, dt, tdt) -> dict:
    """Measured and predicted step parts (medians over measured, non-failed steps)."""
    st = run.steps
    st = st[(st["rank"].astype(int) == rank) & (st["role"] == "measured") & ~st["failed"].astype(bool)]
    if st.empty:
        raise UserError(f"{run.run_dir}: rank {rank} has no measured steps in steps.csv")
    med = {c: float(np.nanmedian(st[c].astype(float))) if c in st else 0.0
           for c in ("fwd_s", "bwd_s", "optim_s", "step_s", "recompute_s")}
    root = frame[frame["depth"] == frame["depth"].min()]
    f_fwd = float(root["speedup_fwd"].iloc[0]) if len(root) and root["pred_fwd_s"].iloc[0] > 0 else 1.0
    f_bwd = float(root["speedup_bwd"].iloc[0]) if len(root) and root["pred_bwd_s"].iloc[0] > 0 else 1.0
    mem = _ratios(src, tgt, dt, tdt, 1)["memory"]
    other = max(med["step_s"] - med["fwd_s"] - med["bwd_s"] - med["optim_s"] - med["recompute_s"], 0.0)
    measured = {"fwd": med["fwd_s"], "bwd": med["bwd_s"], "recompute": med["recompute_s"], "optim": med["optim_s"],
                "other": other}
    factor = {"fwd": f_fwd, "bwd": f_bwd, "recompute": f_fwd, "optim": mem, "other": 1.0}
    predicted = {k: measured[k] / factor[k] for k in STEP_PARTS}
    total_m, total_p = sum(measured.values()), sum(predicted.values())
    return {"measured_s": measured, "predicted_s": predicted, "speedup_by_part": factor,
            "measured_step_s": total_m, "predicted_step_s": total_p,
            "speedup": total_m / total_p if total_p > 0 else math.nan,
            "steps": int(len(st)),
            "note": "optimizer scaled as memory-bound; 'other' (data, loss, Python) kept as measured"}


__all__ = ["WHATIF_COLUMNS", "BOUND_KINDS", "ceilings", "speedups", "own_parts", "modelled_ratio", "whatif"]
