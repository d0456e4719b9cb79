"""The collectives a torch-native parallel layout issues in one step, on the predicted frame and per
optimizer step.

* ``live_collectives(model)``: the collectives of one step predicted from the live model's layout:
  DDP one all-reduce per bucket (``ddp_bucket_collectives``); FSDP2 per ``fully_shard`` unit one
  all-gather in forward, one in backward (unless ``reshard_after_forward=False``), one
  reduce-scatter in backward, each of the unit's padded unsharded bytes.
* ``add_collectives(frame, rows, system)``: the predicted frame's communication columns (each
  collective counts in the module that issues it and its ancestors, like FLOPs).
* per optimizer step: ``issue_rate`` / ``per_step_collectives`` (predicted_collectives.csv's ``rate``
  and ``calls_per_step``), ``bytes_per_step``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfcheck.model_paths import module_paths
from perfcheck.predict import collectives as coll_model
from perfcheck.predict.layout import fsdp_modules
from perfcheck.schema import ROOT, parent_path

PREDICTED_COLLECTIVES_CSV = "predicted_collectives.csv"


COLLECTIVE_FIELDS = ("module", "phase", "kind", "op", "bytes", "group_size", "dtype")


@dataclass(frozen=True)
class Collective:
    """One collective issued in a traced step."""

    module: str
    phase: str  # fwd / bwd
    kind: str
    op: str
    bytes: float
    group_size: int
    dtype: str


def ddp_bucket_collectives(ddp) -> list:
    """One all-reduce per DDP bucket: S = the bucket's bytes; issued in backward by the module that
    owns the bucket parameter used first in forward (its gradient is the bucket's last to arrive)."""
    inner = ddp.module
    paths = module_paths(inner)
    owner = {}
    for mod in inner.modules():
        for p in mod.parameters(recurse=False):
            owner.setdefault(id(p), paths.get(id(mod), ROOT))
    order = {id(p): i for i, p in enumerate(inner.parameters())}
    group = ddp.process_group.size() if getattr(ddp, "process_group", None) is not None else 1
    rows = []
    for bucket in ddp.reducer._get_zeros_like_grad_buckets():
        buf = bucket.buffer()
        params = bucket.parameters()
        first = min(params, key=lambda p: order.get(id(p), 0)) if params else None
        rows.append(Collective(owner.get(id(first), ROOT) if first is not None else ROOT, "bwd", "allreduce",
                               "ddp_bucket", float(buf.numel() * buf.element_size()), int(group),
                               str(buf.dtype).replace("torch.", "")))
    return rows


def live_collectives(model) -> list:
    """Collectives of one training step read from a live model's layout (no forward run), a list
    of Collective: DDP buckets and FSDP2 units. DTensor TP/SP redistributes depend on the forward:
    ``perfcheck.predict.distributed.live_dtensor_collectives`` traces them on ``dtensor_twin``."""
    rows = []
    if type(model).__name__ == "DistributedDataParallel":
        rows += ddp_bucket_collectives(model)
        model = model.module
    paths = module_paths(model)
    for mod in fsdp_modules(model):
        group = mod._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        n = int(group.mesh_info.shard_mesh_size)
        elem = group.fsdp_params[0].sharded_param.element_size() if group.fsdp_params else 4
        # FSDP2 pads each parameter's dim-0 to a multiple of the shard size: S = sum of padded sizes
        total = sum(fp.padded_sharded_param_size.numel() * n for fp in group.fsdp_params) * elem
        dtype = str(group.fsdp_params[0].sharded_param.dtype).replace("torch.", "") if group.fsdp_params else ""
        path = paths.get(id(mod), ROOT)
        rows.append(Collective(path, "fwd", "allgather", "fsdp2_all_gather", float(total), n, dtype))
        is_root = mod is fsdp_modules(model)[0] and mod is model
        reshard = getattr(group, "post_forward_mesh_info", None) is not None and not is_root
        if reshard:
            rows.append(Collective(path, "bwd", "allgather", "fsdp2_all_gather", float(total), n, dtype))
        rows.append(Collective(path, "bwd", "reducescatter", "fsdp2_reduce_scatter", float(total), n, dtype))
    return rows


def add_live_collectives(frame, model, system, extra=()):
    """``add_collectives`` with ``live_collectives(model)`` and the ``extra`` Collectives (the traced
    TP/SP redistributes)."""
    return add_collectives(frame, live_collectives(model) + list(extra), system)


def frame_phase(phase: str) -> str:
    """The predicted frame's column phase of a collective: optimizer-time reductions count with backward."""
    return "fwd" if phase == "fwd" else "bwd"


def issuer_and_ancestors(module: str, index: dict):
    """The module that issued a collective and its ancestors that are rows of the frame (``index``:
    path -> row); the root for a module the frame lacks. A collective counts in each, like FLOPs."""
    path = module if module in index else ROOT
    while path is not None:
        if path in index:
            yield path
        path = parent_path(path)


def add_collectives(frame, rows, system):
    """Fill the communication columns of an estimate's terms (``predict.module_estimator.estimate_terms``)
    from the Collectives ``rows``: each counts in the module that issues it and in its ancestors (like
    FLOPs); its time on ``system``'s links is added to comm_<phase>_s, which
    ``predict.combine.predicted_times`` puts in pred_<phase>_s (optimizer-time reductions count with
    backward). A copy; ``attrs['collectives']`` lists the rows (predicted_collectives.csv)."""
    rows = list(rows)
    frame = frame.copy()
    frame["comm_fwd_bytes"], frame["comm_bwd_bytes"] = 0.0, 0.0
    frame["comm_fwd_s"], frame["comm_bwd_s"] = 0.0, 0.0
    kinds = {p: set() for p in frame["module"]}
    index = {p: i for i, p in enumerate(frame["module"])}
    for r in rows:
        t = float(np.asarray(coll_model.collective_time_s(r.kind, r.bytes, r.group_size, system)))
        phase = frame_phase(r.phase)
        for path in issuer_and_ancestors(str(r.module), index):
            frame.loc[frame.index[index[path]], f"comm_{phase}_bytes"] += r.bytes
            frame.loc[frame.index[index[path]], f"comm_{phase}_s"] += t
            kinds[path].add(r.kind)
    frame["comm_kind"] = [",".join(sorted(kinds.get(p, ()))) for p in frame["module"]]
    frame.attrs["collectives"] = [dict(r.__dict__) for r in rows]
    return frame


#: How often a predicted collective is issued per optimizer step (``issue_rate``):
#: every micro-batch (forward/backward all-gathers, TP/SP redistributes), every micro-batch whose
#: backward reduces gradients (DDP's bucket all-reduces, FSDP2's reduce-scatters: not under DDP's
#: ``no_sync()`` or FSDP2's ``set_requires_gradient_sync(False)``), or once per step (DTensor
#: gradients left Partial, all-reduced when the optimizer first reads them).
RATES = ("micro_batch", "synced_micro_batch", "step")


#: predicted_collectives.csv: the Collective fields plus the rate and the calls per optimizer step.
PREDICTED_COLLECTIVE_FIELDS = COLLECTIVE_FIELDS + ("rate", "calls_per_step")


def issue_rate(c) -> str:
    """``RATES`` entry of a Collective (or a dict with its fields): gradient reductions are DDP's
    bucket all-reduces (op ``ddp_bucket``), FSDP2's reduce-scatters (``fsdp2_reduce_scatter`` from
    the live layout; a c10d reduce-scatter/all-reduce issued in backward in a fake-group trace:
    TP/SP redistributes are functional collectives, never c10d ones) and, under FSDP2+TP, the
    Partial TP gradients FSDP2 all-reduces before them (``fsdp2_partial_grad``; a fake-group trace
    sees these as functional all-reduces and counts them every micro-batch); ``optim``-phase rows
    once per step; everything else every micro-batch."""
    get = c.get if isinstance(c, dict) else (lambda k: getattr(c, k))
    op, phase, kind = str(get("op")), str(get("phase")), str(get("kind"))
    if phase == "optim":
        return "step"
    if op in ("ddp_bucket", "fsdp2_reduce_scatter", "fsdp2_partial_grad"):
        return "synced_micro_batch"
    if phase == "bwd" and op.startswith("c10d.") and kind in ("reducescatter", "allreduce"):
        return "synced_micro_batch"
    return "micro_batch"


def per_step_collectives(rows, micro_batches=None, synced=None):
    """predicted_collectives.csv rows (``PREDICTED_COLLECTIVE_FIELDS``): each predicted collective of
    one micro-batch with its ``rate`` and ``calls_per_step``: ``micro_batches`` (root forwards per
    optimizer step; None: 1) for per-micro-batch ones, ``synced`` (micro-batches whose backward
    reduced gradients; None: all of them) for gradient reductions, 1 for per-step ones. ``bytes``
    stays S per call; bytes per step = bytes x calls_per_step."""
    n = 1.0 if micro_batches is None else float(micro_batches)
    s = n if synced is None else float(synced)
    out = []
    for r in rows:
        d = dict(r) if isinstance(r, dict) else dict(r.__dict__)
        d["rate"] = issue_rate(d)
        d["calls_per_step"] = {"micro_batch": n, "synced_micro_batch": s, "step": 1.0}[d["rate"]]
        out.append(d)
    return pd.DataFrame(out, columns=list(PREDICTED_COLLECTIVE_FIELDS))


def bytes_per_step(frame) -> dict:
    """{kind: S bytes per optimizer step} of a predicted_collectives frame (bytes x calls_per_step;
    a file written before calls_per_step existed counts each row once)."""
    if frame is None or frame.empty:
        return {}
    calls = frame["calls_per_step"].astype(float) if "calls_per_step" in frame else 1.0
    per = frame.assign(_b=frame["bytes"].astype(float) * calls)
    return {k: float(v) for k, v in per.groupby("kind")["_b"].sum().items()}
