"""The prediction side of the ZeRO stage comparison (``analysis.stages``): the ZeRO model for the
configuration a rank recorded, with the model's compute from predicted.csv and DeepSpeed's host terms,
both slowed by the ranks sharing the host. Never calibrates: a comparison runs no benchmark."""
from __future__ import annotations

import math

import pandas as pd

from perfcheck.hardware.labels import datasheet_default
from perfcheck.hardware.systems import host_constants, load_system
from perfcheck.predict import zero
from perfcheck.predict.run_speed import at_run_speed
from perfcheck.predict.host import deepspeed_host_s, process_slowdown


def optimizer_key(facts) -> str:
    name = str((facts.get("optimizer") or {}).get("basic_optimizer") or "adam").lower()
    for key in ("adamw", "adam", "lamb", "adagrad", "lion", "sgd"):
        if key in name:
            return key
    return "adam"


def compute_times(predicted: pd.DataFrame, factor: float = 1.0, kind: str = "cpu"):
    """The model's forward and backward seconds on one rank (predicted.csv's root row), with its host share
    ``factor`` times slower (``process_slowdown``: the other processes on this host). On a CPU the host and
    the compute are one thread, so the whole time scales; on a GPU only the host timeline does: a
    host-bound phase (root ``bound_*`` = host) grows by (factor - 1) x its host time, another phase is
    max(its time, factor x its host time) (NB, perfcheck: an approximation of re-running the two timelines
    with every host term scaled)."""
    if predicted.empty or "module" not in predicted:
        return math.nan, math.nan
    root = predicted[predicted["depth"] == 0] if "depth" in predicted else predicted.iloc[:1]
    out = []
    for ph in ("fwd", "bwd"):
        t = float(root[f"pred_{ph}_s"].iloc[0])
        if kind == "cpu":
            t *= factor
        else:
            host = float(root[f"host_{ph}_s"].iloc[0]) if f"host_{ph}_s" in root else 0.0
            host = 0.0 if math.isnan(host) else host
            bound = str(root[f"bound_{ph}"].iloc[0]) if f"bound_{ph}" in root else ""
            t = t + (factor - 1.0) * host if bound == "host" else max(t, factor * host)
        out.append(t)
    return out[0], out[1]


def local_processes(facts: dict) -> int:
    """Ranks on this rank's host: the run's ranks_per_node, else world size / nodes (1 when unknown)."""
    n = facts.get("ranks_per_node")
    if not n:
        n = int(facts.get("world_size", 1) or 1) // max(int(facts.get("nodes", 1) or 1), 1)
    return max(int(n), 1)


def stage_system(facts: dict, system, local=None):
    """The given system, else the run's block's, else ``local(threads)`` (the edge's spec for this machine at
    the rank's thread count: ``perfcheck compare`` passes the cached calibration, which a CPU sweep run here
    took before its ranks started; analysis itself reads no cache), else the labelled datasheet default.
    Never calibrates: a comparison runs no benchmark."""
    if system is not None:
        return system
    block = (facts.get("perfcheck_block") or {}).get("system")
    if block:
        return block
    # the sweep's ranks run with one intra-op thread (OMP_NUM_THREADS=1, integrations/deepspeed/sweep.py)
    found = local(int(facts.get("torch_threads") or 1)) if local is not None else None
    return found or datasheet_default("cpu")


def host_terms(facts: dict, predicted: pd.DataFrame, spec) -> dict:
    """DeepSpeed's host seconds per phase beside the model's (``perfcheck.predict.host.deepspeed_host_s``):
    the engine's fixed and per-parameter-tensor work at this stage, ZeRO-3's hooks per module call
    and, for tensors ZeRO-3 partitions (not persistent), the host side of fetching them. ``optim``
    is the whole engine.step() host time (the optimizer's loop included)."""
    mods = [sizes for _, sizes in facts.get("module_params", [])]
    tensors = sum(len(m) for m in mods)
    calls = int(predicted["calls"].sum()) if not predicted.empty and "calls" in predicted else len(mods)
    stage = int(facts["zero_stage"])
    gathered = 0
    if stage == 3:
        settings = zero.ZeroSettings(**facts.get("settings", {}))
        flags = zero.persistent_flags(zero.layout(mods), settings, max(int(facts.get("dp", 1)), 1))
        gathered = sum(not k for row in flags for k in row)
    return deepspeed_host_s(stage=stage, module_calls=calls, param_tensors=tensors, spec=spec,
                            partitioned_tensors=gathered)


def zero3_parts(facts: dict, predicted: pd.DataFrame, spec) -> dict:
    """The predicted ZeRO-3 hook and gather costs per optimizer step, for the comparison's answer:
    ``hooks_s`` (module calls x the fwd + bwd per-module hook constants, per micro-step x G),
    ``gather_host_s`` (the host side of fetching the partitioned tensors, fwd + bwd + step),
    ``module_calls`` and ``gathered_tensors``. Zeros below stage 3."""
    if int(facts["zero_stage"]) != 3:
        return {"hooks_s": 0.0, "gather_host_s": 0.0, "module_calls": 0, "gathered_tensors": 0}
    hc = host_constants(spec)
    mods = [sizes for _, sizes in facts.get("module_params", [])]
    calls = int(predicted["calls"].sum()) if not predicted.empty and "calls" in predicted else len(mods)
    flags = zero.persistent_flags(zero.layout(mods), zero.ZeroSettings(**facts.get("settings", {})),
                                  max(int(facts.get("dp", 1)), 1))
    gathered = sum(not k for row in flags for k in row)
    g = int(facts.get("gradient_accumulation_steps", 1))
    return {"hooks_s": g * calls * (hc["zero3_fwd_module_s"] + hc["zero3_bwd_module_s"]),
            "gather_host_s": gathered * (g * (hc["zero3_fwd_gather_s"] + hc["zero3_bwd_gather_s"])
                                         + hc["zero3_step_gather_s"]),
            "module_calls": calls, "gathered_tensors": gathered}


def predict(facts: dict, predicted: pd.DataFrame, system=None, local=None) -> zero.ZeroEstimate:
    """The ZeRO model for the configuration a rank recorded (stage, dp, settings, tensor sizes),
    with the model's compute (host terms included) from predicted.csv and DeepSpeed's host terms, both
    times the host's process slowdown for the ranks sharing it (``perfcheck.predict.host.process_slowdown``;
    on a GPU host only their host parts)."""
    settings = zero.ZeroSettings(**facts.get("settings", {}))
    lay = zero.layout([sizes for _, sizes in facts.get("module_params", [])])
    spec = load_system(stage_system(facts, system, local))
    # one process's prediction, slowed by the rank's peers on its host (host.process_slowdown_per_peer)
    factor = process_slowdown(spec, local_processes(facts))
    fwd, bwd = compute_times(predicted, factor, spec.kind)
    host_s = {ph: factor * t for ph, t in host_terms(facts, predicted, spec).items()}
    return zero.estimate_zero(layout=lay, stage=facts["zero_stage"], dp=facts["dp"],
                              micro_steps=facts["gradient_accumulation_steps"], dtype=facts["dtype"],
                              optimizer=optimizer_key(facts), settings=settings, system=spec,
                              spans_nodes=facts.get("nodes", 1) > 1,
                              compute_fwd_s=0.0 if math.isnan(fwd) else fwd,
                              compute_bwd_s=0.0 if math.isnan(bwd) else bwd,
                              host_s=host_s)


def outside_model_s(facts: dict, predicted: pd.DataFrame, system=None, local=None) -> float:
    """Seconds per optimizer step the engine spends outside the model's forward and backward and the optimizer
    step ``predicted`` prices itself (its root ``pred_optim_s``): this module's ZeRO estimate of the step (the
    engine's host work, its collectives and their waits, the optimizer's update) less its compute, never below 0.
    It is what the host model's far rule counts in the time since an op family last ran (``perfcheck.estimate``'s
    ``step_other_s``, through ``for_run.with_step_other``). Measured why (2-vCPU AMD EPYC VM, one thread, 2 gloo
    ranks, ZeRO-0; the first forward after a step less a second forward of the same batch at once, root thread
    time, median of 35 steps, two runs): LeNet 196-246 us under the engine against 80-113 us in a plain AdamW loop,
    JSC_Tiny 66-113 against 28-31."""
    t = predict(facts, predicted, system, local).times
    root = predicted[predicted["depth"] == 0] if "depth" in predicted else predicted.iloc[:1]
    own = float(root["pred_optim_s"].iloc[0]) if len(root) and "pred_optim_s" in root else 0.0
    rest = t["step_s"] - t["fwd_compute_s"] - t["bwd_compute_s"] - (0.0 if math.isnan(own) else own)
    return max(float(rest), 0.0)


def host_shares(predicted: pd.DataFrame) -> dict:
    """The host share of the model's predicted forward and backward (predicted.csv's root ``host_<phase>_s`` over
    ``pred_<phase>_s``, in [0, 1]): the part of the compute terms that moves with the host reference. NaN where
    the file has no host column."""
    out = {"fwd": math.nan, "bwd": math.nan}
    if predicted.empty or "module" not in predicted:
        return out
    root = predicted[predicted["depth"] == 0] if "depth" in predicted else predicted.iloc[:1]
    for ph in out:
        if f"host_{ph}_s" in root and f"pred_{ph}_s" in root:
            t, h = float(root[f"pred_{ph}_s"].iloc[0]), float(root[f"host_{ph}_s"].iloc[0])
            out[ph] = min(max(h / t, 0.0), 1.0) if t > 0 and h == h else math.nan
    return out


def at_run_times(times: dict, shares: dict, host_factor: float, compute_factor: float, slowdown: float = 1.0) -> dict:
    """The ZeRO estimate's phase times (``ZeroEstimate.times``) at the speed a run met (``predict.run_speed``):
    per phase, the model's compute split by its host share (``host_shares``; all compute without one), DeepSpeed's
    host terms x the host factor, the optimizer's update x the compute factor, collectives and waits unscaled:

        fwd, bwd  = at_run_speed(compute / k, share x compute / k) + s_h x host / k + comm + wait
        optim     = s_c x optimizer update + s_h x host / k + comm + wait
        step      = fwd + bwd + optim

    k = ``slowdown``, the process slowdown the estimate applied to its compute and host terms for the ranks
    sharing the host (``predict.host.process_slowdown``): the ranks read the references while their peers ran
    (all of them leave the step together), so the factors already hold the peers' share, and k is taken out to
    count it once. The optimizer's update carries no k (``zero.estimate_zero`` applies none to it).
    """
    k = slowdown if slowdown == slowdown and slowdown > 0 else 1.0
    out = {}
    for ph in ("fwd", "bwd", "optim"):
        compute = times[f"{ph}_compute_s"] / (k if ph != "optim" else 1.0)
        share = shares.get(ph, math.nan) if ph != "optim" else 0.0
        share = 0.0 if share != share else share
        out[f"{ph}_s"] = (at_run_speed(compute, share * compute, host_factor, compute_factor)
                          + host_factor * times[f"{ph}_host_s"] / k + times[f"{ph}_comm_s"] + times[f"{ph}_wait_s"])
    out["step_s"] = out["fwd_s"] + out["bwd_s"] + out["optim_s"]
    return out
