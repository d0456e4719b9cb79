"""Collectives per module: the bytes each module *issued* and the time each module *waited*, per phase.

Input: ``collectives.csv`` rows (``perfcheck.measure.collectives``: one ``issued`` row per collective
op with the module and phase whose context issued it, one ``waited`` row per wait with the module
and phase whose time holds it; rows in start-time order per rank; values per profiled window).

FSDP2's prefetching and DDP's overlap make the issuer and the waiter different modules: FSDP2's
backward all-gather for ``layers.2`` is issued in ``layers.3``'s backward and waited on in
``layers.2``'s; DDP's bucket all-reduces are issued by the layers whose gradients fill the bucket
and waited on at the end of backward (``finalize_backward``, on the root). ``wait_pairs`` ties each
wait to the collectives it waited for, by the rule of the op that waits:

* a synchronous call's wait (op ``<name> (synchronous)``, right after its issued row: FSDP2's default
  unshard on gloo blocks in the issuing module): the collective just issued;
* ``FSDP::all_gather_copy_out`` (its ``target`` unit U): the last all-gather issued for U before it;
* the end-of-backward callbacks (``FINALIZE_OP``): every c10d all-reduce / reduce-scatter issued
  since the previous end of backward (DDP's buckets, FSDP2's gradient reduce-scatters);
* ``wait_tensor`` / ``c10d::wait``: the oldest functional collective not yet waited on (funcol
  ``AsyncCollectiveTensor``\\ s are waited on in issue order; a wait on a later one first is
  attributed to the older: an approximation, said here).

``module_comm`` sums the rows per (rank, module, phase) into the reconciled table's columns
(``schema.MODULE_COMM_COLUMNS``): own (this module's context) and subtree (the module and every
module inside it, like every other time and byte column, so the root holds the rank's total),
per profiled step. Phases other than fwd and bwd (the optimizer step's all-reduces, ops outside
every module) are not in a module's columns; ``outside_bytes`` gives them for a note.
"""
from __future__ import annotations

from collections import deque, namedtuple

import pandas as pd

from perfcheck.measure.collectives import COLLECTIVE_COLUMNS, FINALIZE_OP, SYNC_SUFFIX
from perfcheck.schema import MODULE_COMM_COLUMNS, ROOT, parent_path, strip_wrapper_prefix
from perfcheck.units import fmt_bytes, fmt_time

PHASES2 = ("fwd", "bwd")
_FUNCOL = ("_c10d_functional", "c10d_functional")
_COPY_OUT = "FSDP::all_gather_copy_out"
_NOT_MODULES = ("unattributed", "(optimizer)", "")
_KIND_WORDS = {"allgather": "all-gather", "reducescatter": "reduce-scatter", "allreduce": "all-reduce",
               "alltoall": "all-to-all", "broadcast": "broadcast"}
_PHASE_WORDS = {"fwd": "forward", "bwd": "backward", "optim": "optimizer step", "recompute": "recompute",
                "eval": "eval forward"}

#: Columns of ``wait_pairs``: one row per (rank, waiter, kind, target, issuers), values per profiled step.
PAIR_COLUMNS = {
    "rank": "distributed rank",
    "module": "the module whose time holds the wait (waited on)",
    "phase": "its phase: fwd | bwd (| optim | unattributed ...)",
    "wait_op": "the waiting op or range (collectives.csv op of the waited row)",
    "kind": "kind of the collectives waited for ('+'-joined when several), '' when none was found",
    "target": "the FSDP2 unit they serve ('' when not FSDP2)",
    "issuers": "module/phase pairs that issued them, ','-joined in issue order",
    "bytes": "bytes of the collectives waited for, per profiled step",
    "count": "collectives waited for, per profiled step",
    "wait_s": "time waited, per profiled step, seconds",
}


def read_collectives(frame: pd.DataFrame | None) -> pd.DataFrame:
    """``frame`` (collectives.csv rows, live or read back) with text columns as str ('' for empty) and
    module paths as the reconciled table names them; an empty frame with the columns for None."""
    if frame is None or len(frame) == 0:
        return pd.DataFrame(columns=list(COLLECTIVE_COLUMNS))
    if frame.attrs.get("perfcheck_comm_normalized"):
        return frame
    out = frame[list(COLLECTIVE_COLUMNS)].copy()
    for c in ("what", "module", "phase", "kind", "op", "dtype", "target"):
        out[c] = out[c].fillna("").astype(str)
    for c in ("bytes", "issue_s", "wait_s"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype(float)
    out["rank"] = pd.to_numeric(out["rank"], errors="coerce").fillna(0).astype(int)
    out["module"] = [m if m in _NOT_MODULES else (strip_wrapper_prefix(m) or ROOT) for m in out["module"]]
    out["target"] = [t if t in ("", ROOT) else strip_wrapper_prefix(t) for t in out["target"]]
    out = out.reset_index(drop=True)
    out.attrs["perfcheck_comm_normalized"] = True
    return out


def _per_step(profile_steps, rank) -> float:
    value = profile_steps.get(rank, profile_steps.get(str(rank), 1)) if isinstance(profile_steps, dict) else profile_steps
    value = float(value if value is not None else 1)
    return value if value > 0 else 1.0


def _issuers_for(wait, pending_funcol: deque, since_finalize: list, last_gather: dict, last) -> list:
    """The issued rows a waited row waited for (the rules in the module docstring); consumes them."""
    if wait.op.endswith(SYNC_SUFFIX):
        return [last] if last is not None else []
    if wait.op == FINALIZE_OP:
        out = list(since_finalize)
        since_finalize.clear()
        return out
    if wait.op.startswith(_COPY_OUT):
        row = last_gather.pop(wait.target, None)
        return [row] if row is not None else []
    return [pending_funcol.popleft()] if pending_funcol else []


def wait_pairs(collectives: pd.DataFrame, profile_steps=1) -> pd.DataFrame:
    """Each wait with the collectives it waited for (``PAIR_COLUMNS``), per profiled step.

    ``profile_steps``: active profiler steps behind the window (int, or {rank: int}).
    """
    coll = read_collectives(collectives)
    row_type = namedtuple("Row", COLLECTIVE_COLUMNS)
    by_rank: dict = {}
    for r in map(row_type._make, zip(*(coll[c].tolist() for c in COLLECTIVE_COLUMNS))):  # plain tuples: fast
        by_rank.setdefault(r.rank, []).append(r)
    rows = []
    for rank in sorted(by_rank):
        pending, since_finalize, last_gather, last = deque(), [], {}, None
        for r in by_rank[rank]:
            if r.what == "issued":
                last = r
                if r.op.startswith(_FUNCOL):
                    pending.append(r)
                elif r.kind in ("allreduce", "reducescatter"):
                    since_finalize.append(r)
                if r.kind == "allgather" and r.target:
                    last_gather[r.target] = r
                continue
            if r.what != "waited":
                continue
            issued = _issuers_for(r, pending, since_finalize, last_gather, last)
            kinds = "+".join(dict.fromkeys(i.kind for i in issued)) or r.kind
            rows.append({"rank": int(rank), "module": r.module, "phase": r.phase,
                         "wait_op": r.op, "kind": kinds, "target": r.target or next((i.target for i in issued if i.target), ""),
                         "issuers": ",".join(dict.fromkeys(f"{i.module}/{i.phase}" for i in issued)),
                         "bytes": float(sum(i.bytes for i in issued if i.bytes == i.bytes)), "count": float(len(issued)),
                         "wait_s": float(r.wait_s)})
    if not rows:
        return pd.DataFrame(columns=list(PAIR_COLUMNS))
    pairs = pd.DataFrame(rows)
    keys = ["rank", "module", "phase", "wait_op", "kind", "target", "issuers"]
    pairs = pairs.groupby(keys, sort=False, dropna=False)[["bytes", "count", "wait_s"]].sum().reset_index()
    n = pairs["rank"].map(lambda r: _per_step(profile_steps, r)).to_numpy(float)
    for c in ("bytes", "count", "wait_s"):
        pairs[c] = pairs[c].to_numpy(float) / n
    return pairs.sort_values(["rank", "wait_s"], ascending=[True, False], kind="stable",
                             ignore_index=True)[list(PAIR_COLUMNS)]


def _label(kind: str, target: str, wait_op: str, layout: str) -> str:
    words = "+".join(_KIND_WORDS.get(k, k) for k in kind.split("+")) if kind else "collective"
    if target:
        return f"FSDP2 {words}"
    if wait_op == FINALIZE_OP and "ddp" in layout:
        return f"DDP bucket {words}"
    if wait_op != FINALIZE_OP and "tp" in layout:
        return f"DTensor {words}"
    return words


def _where(module: str, phase: str) -> str:
    return f"{module}'s {_PHASE_WORDS.get(phase, phase)}"


def sentence(p, layout: str = "") -> str:
    """One wait in words: the kind, bytes, who issued and who waited, per step (``p``: a PAIR_COLUMNS row)."""
    label = _label(p.kind, p.target, p.wait_op, layout)
    size = fmt_bytes(p.bytes)
    issuers = [i.rsplit("/", 1) for i in p.issuers.split(",")] if p.issuers else []
    if not issuers and p.wait_op == FINALIZE_OP:
        return (f"end-of-backward callbacks in {_where(p.module, p.phase)}: {fmt_time(p.wait_s)}; no c10d all-reduce "
                "or reduce-scatter was pending (none issued since the previous end of backward)")
    if not issuers:
        return (f"{label} wait ({p.wait_op}) in {_where(p.module, p.phase)}: {fmt_time(p.wait_s)}; the collective it "
                "waited for was issued before the profiled window")
    if p.wait_op == FINALIZE_OP:
        names = list(dict.fromkeys(m for m, _ in issuers))
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return (f"{label} ({p.count:g} per step, {size}) issued in backward by {shown}, waited on at the end of "
                f"backward ({p.module}'s end-of-backward callbacks): {fmt_time(p.wait_s)}")
    for_unit = f" for {p.target}" if p.target else ""
    im, ip = issuers[0]
    if len(issuers) == 1 and (im, ip) == (p.module, p.phase):
        prefetch = " (prefetch)" if p.target and p.target != p.module else ""
        sync = " (a synchronous call: the issuer blocked until it ended)" if p.wait_op.endswith(SYNC_SUFFIX) else ""
        return (f"{label}{for_unit}{prefetch} ({size}) issued and waited on in {_where(p.module, p.phase)}{sync}: "
                f"{fmt_time(p.wait_s)}")
    prefetch = " (prefetch)" if p.target and im != p.target else ""
    by = " and ".join(_where(m, ph) for m, ph in issuers[:2]) + (" ..." if len(issuers) > 2 else "")
    return (f"{label}{for_unit} ({size}) issued in {by}{prefetch}, waited on in {_where(p.module, p.phase)}: "
            f"{fmt_time(p.wait_s)}")


def ancestors(path: str) -> list:
    """``path`` and every module above it, the root last."""
    out = [path]
    while (path := parent_path(path)) is not None:
        out.append(path)
    return out


def subtree_sums(own: pd.DataFrame, cols: list) -> pd.DataFrame:
    """``own`` (rank, module, phase, cols: each module's own values) -> the same rows per module holding
    the sums over the module and every module inside it (each value counted in its module's ancestors)."""
    if own.empty:
        return own
    anc = {m: ancestors(m) for m in own["module"].unique()}
    lens = own["module"].map(lambda m: len(anc[m])).to_numpy()
    rep = own.loc[own.index.repeat(lens)].reset_index(drop=True)
    rep["module"] = [a for m in own["module"] for a in anc[m]]
    return rep.groupby(["rank", "module", "phase"], sort=False)[cols].sum().reset_index()


def _wide(frame: pd.DataFrame, names: dict) -> pd.DataFrame:
    """(rank, module, phase, values) -> one row per (rank, module) with ``names[col].format(p=phase)`` columns."""
    if frame.empty:
        return pd.DataFrame(columns=["rank", "module"])
    wide = frame.set_index(["rank", "module", "phase"])[list(names)].unstack("phase")
    wide.columns = [names[c].format(p=p) for c, p in wide.columns]
    return wide.reset_index()


def module_comm(collectives: pd.DataFrame, profile_steps=1, layouts: dict | None = None, top: int = 3) -> pd.DataFrame:
    """Per (rank, module): ``schema.MODULE_COMM_COLUMNS`` from collectives.csv rows, per profiled step.

    Ranks in ``collectives`` get 0 for a module that issued or waited on nothing (the caller fills
    those modules in); ``layouts``: {rank: meta.json parallel kind} for the sentences' labels;
    ``top``: waits named per module and phase in ``comm_waits_<p>`` (the rest summed).
    """
    coll = read_collectives(collectives)
    columns = ["rank", "module"] + [c.format(p=p) for p in PHASES2 for c in MODULE_COMM_COLUMNS]
    issued = coll[(coll["what"] == "issued") & coll["phase"].isin(PHASES2) & ~coll["module"].isin(_NOT_MODULES)]
    own_i = issued.assign(count=1.0).groupby(["rank", "module", "phase"], sort=False)[["bytes", "count"]].sum().reset_index()
    pairs = wait_pairs(coll, profile_steps)
    waits = pairs[pairs["phase"].isin(PHASES2) & ~pairs["module"].isin(_NOT_MODULES)]
    own_w = waits.groupby(["rank", "module", "phase"], sort=False)[["wait_s"]].sum().reset_index()
    if not own_i.empty:  # pairs are per step already; issued rows are per window
        n = own_i["rank"].map(lambda r: _per_step(profile_steps, r)).to_numpy(float)
        own_i["bytes"], own_i["count"] = own_i["bytes"].to_numpy(float) / n, own_i["count"].to_numpy(float) / n
    parts = [
        _wide(own_i, {"bytes": "meas_comm_own_{p}_bytes", "count": "meas_comm_own_{p}_count"}),
        _wide(subtree_sums(own_i, ["bytes"]), {"bytes": "meas_comm_{p}_bytes"}),
        _wide(own_w, {"wait_s": "meas_comm_wait_own_{p}_s"}),
        _wide(subtree_sums(own_w, ["wait_s"]), {"wait_s": "meas_comm_wait_{p}_s"}),
        _wide(_sentences(waits, layouts or {}, top), {"text": "comm_waits_{p}"}),
    ]
    out = pd.DataFrame(columns=["rank", "module"])
    for part in parts:
        if not part.empty:
            out = part if out.empty else out.merge(part, on=["rank", "module"], how="outer")
    for c in columns:
        if c not in out:
            out[c] = "" if c.startswith("comm_waits_") else 0.0
        elif c.startswith("comm_waits_"):
            out[c] = out[c].fillna("").astype(object)
        elif c not in ("rank", "module"):
            out[c] = out[c].astype(float).fillna(0.0)
    if out.empty:
        return pd.DataFrame(columns=columns)
    out["rank"] = out["rank"].astype(int)
    return out[columns]


def _sentences(waits: pd.DataFrame, layouts: dict, top: int) -> pd.DataFrame:
    """(rank, module, phase, text): the module's own largest waits in words, '; '-joined."""
    groups: dict = {}
    for p in waits.itertuples(index=False):  # plain tuples: a pandas group per module costs ~5 ms each
        groups.setdefault((p.rank, p.module, p.phase), []).append(p)
    rows = []
    for (rank, module, phase), g in groups.items():
        g.sort(key=lambda p: -p.wait_s)
        layout = str(layouts.get(rank, layouts.get(str(rank), "")) or "")
        text = "; ".join(sentence(p, layout) for p in g[:top])
        if len(g) > top:
            text += f"; {len(g) - top} more waits ({fmt_time(sum(p.wait_s for p in g[top:]))})"
        rows.append({"rank": rank, "module": module, "phase": phase, "text": text})
    return pd.DataFrame(rows, columns=["rank", "module", "phase", "text"])


def outside_bytes(collectives: pd.DataFrame, profile_steps=1) -> dict:
    """{rank: bytes per profiled step} of collectives issued outside every module's forward/backward
    (optimizer step, unattributed): in the rank's totals, in no module's columns."""
    coll = read_collectives(collectives)
    out = coll[(coll["what"] == "issued") & (~coll["phase"].isin(PHASES2) | coll["module"].isin(_NOT_MODULES))]
    return {int(r): float(g["bytes"].sum()) / _per_step(profile_steps, r) for r, g in out.groupby("rank")}


def step_waits(collectives: pd.DataFrame, profile_steps=1) -> dict:
    """{rank: seconds per profiled step} waited on collectives inside the step, the end-of-backward
    callbacks left out (steps.csv ``bwd_finalize_s`` times those in every measured step): FSDP2's
    all-gather waits, synchronous calls, DTensor ``wait_tensor``\ s. With ``bwd_finalize_s`` it is
    the time a rank spent waiting for the others: step less both is its compute."""
    coll = read_collectives(collectives)
    w = coll[(coll["what"] == "waited") & (coll["op"] != FINALIZE_OP)]
    return {int(r): float(g["wait_s"].sum()) / _per_step(profile_steps, r) for r, g in w.groupby("rank")}


def in_step_waits(collectives: pd.DataFrame, steps: pd.DataFrame, profile_steps=1) -> dict:
    """{rank: seconds per measured step} waited inside forward/backward (``step_waits``), scaled to the
    measured steps: the profiler window's waits are a share of the profiled steps' time (the last
    ``profile_steps`` steps of role ``profile`` in steps.csv: the window's active steps follow its
    warm-up), and that share of the measured median step is the wait (the profiler slows the
    window's steps: on the 2-core VM a profiled FSDP2 step took 195 ms against 71 ms measured).
    Without profiled or measured step rows, the window's seconds per profiled step."""
    per = step_waits(collectives, profile_steps)
    out = {}
    for rank, wait in per.items():
        window, measured = _step_times(steps, rank, "profile", profile_steps), _step_times(steps, rank, "measured")
        if len(window) and window.mean() > 0 and len(measured):
            out[rank] = min(wait / float(window.mean()), 1.0) * float(measured.median())
        else:
            out[rank] = wait
    return out


def _step_times(steps, rank: int, role: str, profile_steps=None) -> pd.Series:
    """step_s of the rank's non-failed steps of ``role`` in step order; for "profile", the last
    ``profile_steps`` (the window's active steps, after its warm-up)."""
    if steps is None or len(steps) == 0 or "role" not in steps:
        return pd.Series(dtype=float)
    failed = steps["failed"].astype(str).str.lower().isin(("true", "1")) if "failed" in steps else False
    ok = steps[~failed]
    ok = ok.sort_values("step", kind="stable") if "step" in ok else ok
    mine = ok[ok["rank"].fillna(0).astype(int) == rank] if "rank" in ok else ok
    times = mine.loc[mine["role"] == role, "step_s"].astype(float)
    return times.tail(int(_per_step(profile_steps, rank))) if role == "profile" else times


def profiled_step_s(steps, rank: int, profile_steps=1) -> float:
    """Mean step time of the rank's profiled (active window) steps, seconds; NaN without them: the
    step the per-module wait columns (per profiled step) are a part of."""
    times = _step_times(steps, rank, "profile", profile_steps)
    return float(times.mean()) if len(times) else float("nan")
