"""Words from numbers for ``perfcheck compare``: per-row notes and answers to the questions a DeepSpeed
user asks of a ZeRO sweep (why is stage 3 slower, why is "model parallel size" 1, why does the
forward grow with the stage, where is GPU utilization).

Every sentence is built from the comparison table (or the run's facts), never from a canned
conclusion: change the run and the answer changes with it.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

import perfcheck.rundir.deepspeed_files as run_files
from perfcheck.predict import zero
from perfcheck.predict.zero import KINDS
from perfcheck.units import fmt_bytes, fmt_time


def _padding(facts: dict, est: zero.ZeroEstimate) -> dict:
    """Bytes of alignment padding inside the predicted collectives, per kind."""
    n, st, b = est.dp, est.stage, est.precision.param_bytes
    sizes = [t for _, m in facts.get("module_params", []) for t in m]
    out = {}
    if st in (1, 2) and n > 1:
        P = sum(sizes)
        out["allgather"] = (2 * n * math.ceil(P / (2 * n)) - P) * b
    if st == 3 and n > 1:
        pad = sum(n * math.ceil(t / n) - t for t in sizes)
        out["reducescatter"] = pad * est.precision.grad_bytes * est.micro_steps
        out["allgather"] = pad * b  # at most: the tensors gathered once per step
    return out


def notes(row: dict, facts: dict, est: zero.ZeroEstimate) -> list:
    out = []
    pad = _padding(facts, est)
    for k in KINDS:
        p, m = row[f"pred_{k}_bytes"], row[f"meas_{k}_bytes"]
        if p == 0 and m == 0:
            continue
        if isinstance(m, float) and math.isnan(m):
            out.append(f"{k}: no comms-logger record (no logged step)")
            continue
        rel = (m - p) / max(p, m)
        if abs(rel) > 0.05:
            out.append(f"MISMATCH {k}: predicted {fmt_bytes(p)}, measured {fmt_bytes(m)} ({rel:+.1%})")
        elif pad.get(k):
            match = "exact" if m == p else f"{m - p:+.0f} B vs predicted"
            out.append(f"{k}: {match}, including {pad[k]:.0f} B of alignment padding (ZeRO pads partitions to split "
                       f"evenly over dp={est.dp})")
        elif m != p:
            out.append(f"{k}: {m - p:+.0f} B ({rel:+.2%}) vs predicted")
    if est.stage in (1, 2) and est.dp > 1:
        out.append("gradients are ALLREDUCED (DeepSpeed 0.19.8 use_multi_rank_bucket_allreduce=true), not "
                   "reduce-scattered as in the ZeRO paper: per rank "
                   f"{fmt_bytes(row['pred_wire_bytes'])} on the wire, 1.5x stage 0")
    if est.stage == 3 and row.get("persistent_params", 0):
        thr = (facts.get("settings") or {}).get("param_persistence_threshold")
        out.append(f"ZeRO-3: {row['persistent_params']} of {row['params']} params are persistent (tensors <= "
                   f"stage3_param_persistence_threshold={thr:g} elements): whole on every rank, gathered once "
                   "after the optimizer step, never in fwd/bwd")
    for part, label in (("param", "params"), ("grad", "grads"), ("optim", "optimizer states")):
        p, m = row[f"pred_{part}_mem_bytes"], row[f"meas_{part}_mem_bytes"]
        if isinstance(m, float) and math.isnan(m):
            continue
        if abs(m - p) > 0.05 * max(p, m, 1):
            why = ("DeepSpeed keeps the gradients of the parameters that overlap this rank's partition "
                   "(averaged_gradients), not the paper's full or 1/N share" if part == "grad" and est.stage in (1, 2)
                   else "different from the ZeRO paper's accounting")
            out.append(f"memory {label}: measured {fmt_bytes(m)} vs predicted {fmt_bytes(p)}: {why}")
    if row.get("other_overlap_s", 0) > 0:
        out.append(f"time outside fwd/bwd/step shown as 0: the phases' per-step medians overlap by "
                   f"{fmt_time(row['other_overlap_s'])} (medians of separate distributions do not add up exactly)")
    factor = row.get("pred_process_slowdown", 1.0)
    if factor == factor and factor != 1.0:
        out.append(f"predicted host{' and CPU-compute' if facts.get('device', 'cpu') == 'cpu' else ''} terms x{factor:.3f}: "
                   f"{row.get('local_processes')} ranks share this host (host.process_slowdown_per_peer; one "
                   "process's CPU work runs slower beside its peers: shared caches, memory, gloo threads)")
    if not row.get("compute_predicted"):
        out.append("no predicted.csv in the run directory: compute times not predicted (see save_prediction)")
    return out


# ------------------------------------------------------------------- differences with a confidence
#: A difference is claimed only when the bootstrap interval of the ratio of medians excludes 1;
#: "clear" when it also stays beyond +-CLEAR (default chosen by perfcheck: 10%, the step-to-step noise
#: of a shared CPU machine is of that order).
CONFIDENCE, CLEAR, BOOTSTRAP = 0.95, 0.10, 2000


def stage_steps(run_dir) -> pd.DataFrame:
    """Per optimizer step and rank of one stage's run: fwd_s, bwd_s, step_s, total_s summed over the
    step's micro-steps, bare steps (no module hooks) when the run has them, else the measured ones;
    steps with DeepSpeed's comms logger on (it synchronizes after every collective) are left out when
    others remain."""
    parts = [run_files.read_engine_steps(d) for d in sorted(Path(run_dir).glob("rank*"))]
    rows = pd.concat([p for p in parts if p is not None and not p.empty] or [pd.DataFrame()], ignore_index=True)
    if rows.empty or "role" not in rows:
        return pd.DataFrame(columns=["rank", "step", "fwd_s", "bwd_s", "step_s", "total_s"])
    rows = rows[rows["role"] == ("bare" if (rows["role"] == "bare").any() else "measured")]  # as measured_times
    logged = rows["comms_logged"].astype(str).str.lower() == "true"
    if (~logged).any():
        rows = rows[~logged]
    return rows.groupby(["rank", "step"], as_index=False)[["fwd_s", "bwd_s", "step_s", "total_s"]].sum(min_count=1)


def spread(values) -> str:
    """'median (p25-p75, n=N)' of per-step seconds."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if not len(v):
        return "n/a"
    lo, med, hi = np.percentile(v, [25, 50, 75])
    return f"{fmt_time(med)} ({fmt_time(lo)}-{fmt_time(hi)}, n={len(v)})"


def compare_samples(a, b) -> dict:
    """Is ``a`` (per-step seconds) different from ``b``? Ratio of medians a/b with a bootstrap interval
    (resampling steps, fixed seed: the same data gives the same words) and a verdict:
    'higher' / 'lower' (interval excludes 1), 'within noise' (it does not), 'too few steps' (< 3 each).
    ``confidence``: 'clear' when the interval also stays beyond +-CLEAR, else 'weak'."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    out = {"n_a": len(a), "n_b": len(b), "ratio": math.nan, "lo": math.nan, "hi": math.nan}
    if len(a) < 3 or len(b) < 3 or np.median(b) <= 0:
        return {**out, "verdict": "too few steps", "confidence": "none"}
    rng = np.random.default_rng(0)
    ra = np.median(rng.choice(a, (BOOTSTRAP, len(a))), axis=1)
    rb = np.median(rng.choice(b, (BOOTSTRAP, len(b))), axis=1)
    ratios = ra / np.where(rb > 0, rb, np.nan)
    tail = (1 - CONFIDENCE) / 2 * 100
    lo, hi = np.nanpercentile(ratios, [tail, 100 - tail])
    out.update(ratio=float(np.median(a) / np.median(b)), lo=float(lo), hi=float(hi))
    if lo > 1:
        verdict, clear = "higher", lo > 1 + CLEAR
    elif hi < 1:
        verdict, clear = "lower", hi < 1 - CLEAR
    else:
        verdict, clear = "within noise", False
    return {**out, "verdict": verdict, "confidence": "clear" if clear else ("weak" if verdict != "within noise"
                                                                           else "none")}


def describe(name_a: str, name_b: str, c: dict) -> str:
    """One sentence for ``compare_samples``' result, with its numbers."""
    n = f"n={c['n_a']} and {c['n_b']} steps"
    if c["verdict"] == "too few steps":
        return f"{name_a} vs {name_b}: too few measured steps to tell ({n}; run more steps)"
    ci = f"{c['lo']:.2f}-{c['hi']:.2f}x at {CONFIDENCE:.0%}, {n}"
    if c["verdict"] == "within noise":
        return f"{name_a} vs {name_b}: {c['ratio']:.2f}x, within noise ({ci})"
    return f"{name_a} is {c['ratio']:.2f}x {name_b} ({c['confidence']}: {ci})"


# -------------------------------------------------------------------------------- answers
def _per_stage(table: pd.DataFrame) -> pd.DataFrame:
    """Median over ranks of one run per stage: the run named ``stage<N>`` when there is one."""
    ok = table[table["status"] == "ok"]
    if ok.empty:
        return ok
    if "run" in ok:
        pick = {st: (f"stage{int(st)}" if f"stage{int(st)}" in set(g["run"]) else g["run"].iloc[0])
                for st, g in ok.groupby("stage")}
        ok = ok[[pick[st] == run for st, run in zip(ok["stage"], ok["run"])]]
    num = ok.select_dtypes(include=[np.number]).groupby(ok["stage"]).median(numeric_only=True)
    num["stage"] = num.index
    return num


def answers(table: pd.DataFrame) -> list:
    """The ZeRO-sweep questions (module docstring), answered from the comparison table.
    Returns (question, answer) pairs."""
    s = _per_stage(table)
    out = []
    if s.empty:
        return [("Results", "No stage completed; see the notes column for each stage's log tail.")]
    steps = _stage_samples(table)
    out.append(("Why is stage 3 slower than the others? Is the config wrong?",
                _why_stage3(s, steps) + _gathering_runs(table)))
    out.append(("Why is 'model parallel size' 1 with ZeRO-3?", _why_mp(table)))
    out.append(("Why does the forward latency grow with the stage?", _why_fwd(s, steps)))
    out.append(("Where is GPU utilization?", _where_util(s)))
    waiting = _waiting(s)
    if waiting:
        out.append(("How much of each measured step is waiting rather than work?", waiting))
    speed = _run_speed(s)
    if speed:
        out.append(("Did the machine run at the calibration's speed?", speed))
    bad = table[table["status"] != "ok"].drop_duplicates("run" if "run" in table else "stage")
    if not bad.empty:
        names = [f"{r.get('run', 'stage' + str(r['stage']))} (ZeRO stage {r['stage']})" for _, r in bad.iterrows()]
        out.append(("Which runs failed?", f"{', '.join(names)}: see their notes (the log's errors and tail)."))
    return out


def _stage_samples(table) -> dict:
    """stage -> per-step frame (``stage_steps``) of the run ``_per_stage`` picked for it."""
    ok = table[table["status"] == "ok"]
    out = {}
    if "run_dir" not in ok:
        return out
    for st, g in ok.groupby("stage"):
        runs_ = list(dict.fromkeys(g["run"])) if "run" in g else []
        pick = f"stage{int(st)}" if f"stage{int(st)}" in runs_ else (runs_[0] if runs_ else None)
        d = g[g["run"] == pick]["run_dir"].iloc[0] if pick is not None else g["run_dir"].iloc[0]
        try:
            out[int(st)] = stage_steps(d)
        except Exception:  # noqa: BLE001 - an unreadable stage has no per-step samples; its medians still show
            continue
    return out


def _stage_list(s, col, f=fmt_time):
    return ", ".join(f"stage {int(st)} {f(v)}" for st, v in zip(s["stage"], s[col]))


def _why_stage3(s, steps=None) -> str:
    steps = steps or {}
    per = [f"stage {st} {spread(f['total_s'])}" for st, f in sorted(steps.items()) if len(f)]
    text = [f"Measured step time, median (p25-p75, steps x ranks): {', '.join(per)}." if per else
            f"Measured step time (median): {_stage_list(s, 'meas_step_s')}."]
    if 3 not in s.index:
        return text[0] + " Stage 3 did not run."
    r = s.loc[3]
    if 0 in steps and 3 in steps:
        text.append(describe("Stage 3's step", "stage 0's", compare_samples(steps[3]["total_s"], steps[0]["total_s"]))
                    + ".")
    elif 0 in s.index and s.loc[0, "meas_step_s"] > 0:
        text.append(f"Stage 3 takes {r['meas_step_s'] / s.loc[0, 'meas_step_s']:.2f}x stage 0.")
    text.append(f"Per step stage 3 issues {r['meas_allgather_count']:.0f} allgathers and "
                f"{r['meas_reducescatter_count']:.0f} reduce-scatter; its collectives move "
                f"{fmt_bytes(r['meas_fwd_comm_bytes'])} in forward, {fmt_bytes(r['meas_bwd_comm_bytes'])} in backward "
                f"and {fmt_bytes(r['meas_step_comm_bytes'])} in the optimizer step, and expose "
                f"{fmt_time(r['meas_fwd_comm_s'])}, {fmt_time(r['meas_bwd_comm_s'])} and "
                f"{fmt_time(r['meas_optim_comm_s'])} there.")
    if r["meas_fwd_comm_bytes"] == 0 and r.get("persistent_params", 0) == r.get("params", -1):
        text.append("With DeepSpeed's default stage3_param_persistence_threshold (1e5 elements) every tensor of "
                    "this model is persistent, so no parameter is gathered in forward or backward; instead each "
                    "tensor is allgathered separately after every optimizer step.")
    elif r["meas_fwd_comm_bytes"] > 0:
        text.append("These are the extra allgathers of ZeRO-3: parameters are fetched before each module's forward "
                    "(and again in backward when released in between).")
    if 0 in s.index:
        d = r["meas_fwd_compute_s"] - s.loc[0, "meas_fwd_compute_s"]
        text.append(f"Forward time outside communication is {fmt_time(d)} longer than at stage 0: ZeRO-3's per-module "
                    "fetch/release hooks run on every module call.")
    text.append(_hooks_and_gathers(r, s.loc[0] if 0 in s.index else None))
    if 0 in s.index:
        text.append(f"Model states per rank fall from {fmt_bytes(s.loc[0, 'meas_mem_bytes'])} (stage 0) to "
                    f"{fmt_bytes(r['meas_mem_bytes'])} (stage 3): nothing in the config is wrong; ZeRO-3 buys memory "
                    "with communication and hook overhead, which only pays off when the model does not fit.")
    return " ".join(text)


def _hooks_and_gathers(r, r0=None) -> str:
    """The predicted ZeRO-3 hook and gather costs beside the measured ones (one stage-3 row ``r``,
    stage 0's ``r0`` for the like-for-like difference), per optimizer step."""
    if "pred_zero3_hooks_s" not in r or not r["pred_zero3_hooks_s"] == r["pred_zero3_hooks_s"]:
        return ""
    calls, n = r.get("zero3_module_calls", math.nan), r.get("zero3_gathered_tensors", math.nan)
    text = (f"Predicted ZeRO-3 hooks {fmt_time(r['pred_zero3_hooks_s'])} per step ({calls:.0f} module calls, forward "
            f"and backward)" + (f" and {fmt_time(r['pred_zero3_gather_host_s'])} of host work fetching and releasing "
                                f"{n:.0f} partitioned tensors" if n > 0 else ", no partitioned tensor to fetch"))
    if r0 is not None:
        meas = (r["meas_fwd_compute_s"] + r["meas_bwd_compute_s"]) - (r0["meas_fwd_compute_s"] + r0["meas_bwd_compute_s"])
        def outside(x):  # predicted fwd + bwd less their collectives and the waits for the later rank
            return sum(x[f"pred_{p}_s"] - x[f"pred_{p}_comm_s"] - _num(x.get(f"pred_{p}_wait_s")) for p in ("fwd", "bwd"))
        pred = outside(r) - outside(r0)
        text += (f"; forward + backward outside communication, stage 3 less stage 0: measured {fmt_time(meas)}, "
                 f"predicted {fmt_time(pred)}")
        cpu = [x.get(f"meas_{p}_cpu_s", math.nan) for x in (r, r0) for p in ("fwd", "bwd")]
        if all(c == c for c in cpu):  # runs with the CPU-time columns: the same difference without waiting
            text += f" (in process CPU time {fmt_time(cpu[0] + cpu[1] - cpu[2] - cpu[3])})"
    exposed = [r.get(f"meas_{p}_comm_s", math.nan) for p in ("fwd", "bwd", "optim")]
    meas_comm = sum(exposed) if all(e == e for e in exposed) else math.nan
    text += (f". Its all-gathers ({r['meas_allgather_count']:.0f} per step measured, "
             f"{r['pred_allgather_count']:.0f} predicted): predicted {fmt_time(r.get('pred_allgather_s', math.nan))}"
             + (f" ({_num(r.get('pred_batched_calls')):.0f} of them issued with async_op=True and waited together: "
                "one latency per batch, then the measured cost of each further queued call)"
                if _num(r.get("pred_batched_calls")) > 0 else "")
             + f"; measured exposed communication in forward, backward and step {fmt_time(meas_comm)} (all collectives).")
    waits = [_num(r.get(f"pred_{p}_wait_s")) for p in ("fwd", "bwd", "optim")]
    syncs = sum(_num(r.get(f"pred_{p}_syncs")) for p in ("fwd", "bwd", "optim"))
    if sum(waits) > 0:
        idle = r.get("meas_step_s", math.nan) - r.get("meas_step_cpu_s", math.nan)
        text += (f" Predicted wait for the later rank at its {syncs:.0f} blocking collectives per step "
                 f"{fmt_time(sum(waits))}" + (f"; measured elapsed less process CPU time per step {fmt_time(idle)} (that wait "
                                           f"and the collectives' own time off the CPU)." if idle == idle else "."))
    return text


def _num(x) -> float:
    """A predicted-only column's value, 0 where a row from before the column has none (NaN or missing)."""
    return 0.0 if x is None or x != x else float(x)


def _gathering_runs(table) -> str:
    """Other stage-3 runs of the sweep (e.g. stage3-gather) whose parameters are gathered in fwd/bwd."""
    ok = table[(table["status"] == "ok") & (table["stage"] == 3)]
    if "run" not in ok or ok.empty:
        return ""
    text = []
    for run, g in ok.groupby("run"):
        r = g.median(numeric_only=True)
        if run == "stage3" or not r["meas_fwd_comm_bytes"] > 0:
            continue
        text.append(f" In run {run}, where parameters are gathered, ZeRO-3 moves {fmt_bytes(r['meas_fwd_comm_bytes'])} "
                    f"in forward and {fmt_bytes(r['meas_bwd_comm_bytes'])} in backward per step (predicted "
                    f"{fmt_bytes(r['pred_fwd_comm_bytes'])} and {fmt_bytes(r['pred_bwd_comm_bytes'])}): the extra "
                    f"allgathers before each module's forward and again in backward, exposing "
                    f"{fmt_time(r['meas_fwd_comm_s'])} and {fmt_time(r['meas_bwd_comm_s'])}; its step takes "
                    f"{fmt_time(r['meas_step_s'])} (predicted {fmt_time(r['pred_step_s'])}). {_hooks_and_gathers(r)}")
    return "".join(text)


def _why_mp(table) -> str:
    rows = table[(table["status"] == "ok")]
    if rows.empty:
        return "n/a"
    r = rows.sort_values("stage").iloc[-1]
    text = [f"ZeRO partitions over the data-parallel group: world size {int(r['world_size'])} = dp "
            f"{int(r['dp'])} x model parallel {int(r['mp_size'])}. DeepSpeed's 'model parallel size' (mp_size) "
            "counts tensor/pipeline parallel ranks, which ZeRO never adds, so it is 1 at every stage."]
    if int(r["stage"]) == 3:
        text.append(f"Under ZeRO-3 p.numel() sums to {int(r['params_numel_visible'])} on a rank while "
                    f"p.ds_numel sums to {int(r['params'])}; each rank stores a {int(r['params_local_partition'])}-"
                    "element partition. A params count from p.numel() (DeepSpeed's flops profiler) is wrong there.")
    return " ".join(text)


def _why_fwd(s, steps=None) -> str:
    """Which stage's forward differs from stage 0's, by the comparison rule (medians, bootstrap interval),
    and what each moves in forward; no stage is said to grow unless its interval says so."""
    steps = steps or {}
    per = [f"stage {st} {spread(f['fwd_s'])}" for st, f in sorted(steps.items()) if len(f)]
    text = [("Measured forward per step, median (p25-p75): " + ", ".join(per) if per else
             f"Measured forward per step: {_stage_list(s, 'meas_fwd_s')}")
            + f"; exposed communication in forward: {_stage_list(s, 'meas_fwd_comm_s')}; predicted forward: "
            f"{_stage_list(s, 'pred_fwd_s')}."]
    if 0 not in steps:
        return text[0] + " Stage 0 did not run, so no stage can be compared with it."
    grows, same, unsure = [], [], []
    for st in sorted(k for k in steps if k != 0):
        c = compare_samples(steps[st]["fwd_s"], steps[0]["fwd_s"])
        sentence = describe(f"stage {st}'s forward", "stage 0's", c)
        moved = s.loc[st, "meas_fwd_comm_bytes"] if st in s.index else math.nan
        if c["verdict"] == "higher":
            grows.append(f"{sentence}; it moves {fmt_bytes(moved)} in forward"
                         + (" and runs ZeRO-3's fetch/release hooks on every module call" if st == 3 else ""))
        elif c["verdict"] == "too few steps":
            unsure.append(sentence)
        else:
            same.append(sentence)
    if grows:
        text.append("Grows: " + "; ".join(grows) + ".")
    else:
        text.append("No stage's forward is measurably longer than stage 0's in this run.")
    if same:
        text.append("Not different (or shorter): " + "; ".join(same) + ".")
    if unsure:
        text.append("; ".join(unsure) + ".")
    return " ".join(text)


def _waiting(s) -> str:
    """Elapsed vs process CPU time per stage: what the ranks waited (for a core, for their peers'
    collectives) beside the prediction, which counts work and each collective's time but no waiting
    for a core. Empty when the run has no CPU-time columns (files from before them)."""
    if "meas_step_cpu_s" not in s or not s["meas_step_cpu_s"].notna().any():
        return ""
    parts = []
    for st, r in s.iterrows():
        wall, cpu = r["meas_step_s"], r["meas_step_cpu_s"]
        if not (wall == wall and cpu == cpu and wall > 0):
            continue
        parts.append(f"stage {int(st)} {fmt_time(wall)} elapsed, {fmt_time(cpu)} CPU ({1 - cpu / wall:.0%} waiting; "
                     f"predicted {fmt_time(r['pred_step_s'])}, of it collectives "
                     f"{fmt_time(r['pred_fwd_comm_s'] + r['pred_bwd_comm_s'] + r['pred_optim_comm_s'])})")
    if not parts:
        return ""
    worst = (1 - s["meas_step_cpu_s"] / s["meas_step_s"]).max()
    text = "Per optimizer step, median over ranks: " + "; ".join(parts) + "."
    if worst > 0.5:
        text += (" More than half of a step is waiting: on a machine whose cores are shared with other jobs the "
                 "ranks wait for a core and for each other at every collective, which no per-op model predicts; "
                 "compare the prediction with the CPU time, or measure on a quiet machine.")
    return text


def _run_speed(s) -> str:
    """The machine's speed during each stage against the calibration's (the references the ranks read between
    steps, ``perfcheck.measure.speed``) and measured / predicted forward and step, plain and with the prediction
    set at that speed (``pred_<phase>_at_run_s``). Empty for runs without references (older files, GPUs)."""
    if "meas_host_speed" not in s or not s["meas_host_speed"].notna().any():
        return ""
    parts = []
    for st, r in s.iterrows():
        sh, sc = r["meas_host_speed"], r.get("meas_compute_speed", math.nan)
        if sh != sh:
            continue

        def ratio(meas, pred):
            m, p = r.get(meas, math.nan), r.get(pred, math.nan)
            return f"{m / p:.2f}" if m == m and p == p and p > 0 else "-"
        waits = sum(r.get(f"pred_{n}_{w}_s", 0.0) for n in ("fwd", "bwd", "optim") for w in ("comm", "wait"))
        work = r.get("pred_step_at_run_s", math.nan) - waits  # the step's predicted work at the run's speed
        cpu_work = r.get("meas_step_cpu_s", math.nan) / work if work == work and work > 0 else math.nan
        parts.append(f"stage {int(st)}: host x{sh:.2f}, compute x{sc:.2f}; forward {ratio('meas_fwd_s', 'pred_fwd_s')}"
                     f" -> {ratio('meas_fwd_s', 'pred_fwd_at_run_s')} (CPU time {ratio('meas_fwd_cpu_s', 'pred_fwd_at_run_s')}),"
                     f" step {ratio('meas_step_s', 'pred_step_s')} -> {ratio('meas_step_s', 'pred_step_at_run_s')} "
                     f"(CPU time / predicted work {cpu_work:.2f})")
    if not parts:
        return ""
    return ("The ranks timed the calibration's two references (a tiny add: host code; a 128^3 mm: kernel work) after "
            "every optimizer step; their median over the calibration's reference times is the machine's speed then "
            "(> 1: slower than when it was calibrated; a shared core's speed moves by up to 2x for seconds at a time). "
            "Measured / predicted, plain -> with the prediction set at that speed (host terms x host factor, kernel "
            "work x compute factor, collectives and waits as predicted, the ranks' process slowdown taken out: the "
            "references were read with the peers running); in brackets the process CPU time, which "
            "leaves out waiting for a core and for the peers, against the same prediction (the forward: no "
            "collective below stage 3) or its work alone (the step: compute and host terms): " + "; ".join(parts) + ".")


def _where_util(s) -> str:
    gpu = s["meas_gpu_util"] if "meas_gpu_util" in s else pd.Series(dtype=float)
    if gpu.notna().any():
        return ("perfcheck's sampler records NVML utilization in rank<R>/samples.csv: "
                + _stage_list(s, "meas_gpu_util", lambda v: f"{v:.0%}")
                + ". It is a duty cycle (share of time any kernel ran), not SM efficiency; no need for nvidia-smi.")
    cpu = _stage_list(s, "meas_cpu_util", lambda v: "n/a" if math.isnan(v) else f"{v:.2f} cores")
    return ("No GPU in this run: the sampler (rank<R>/samples.csv) recorded process CPU utilization: "
            f"{cpu}. On a GPU the same file holds NVML utilization.gpu (a duty cycle: the share of time any "
            "kernel ran, not SM efficiency), sampled during training; no need for nvidia-smi.")
