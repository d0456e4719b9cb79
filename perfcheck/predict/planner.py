"""Layout search for ``perfcheck plan``: the fastest Megatron-style layouts of a transformer on n GPUs.

Given a model, a GPU count, a system and a global batch (sequences per optimizer step), enumerate the
layouts (tp, sp, pp, virtual stages v, dp with ZeRO-1 or FSDP, cp, micro-batch, recompute), cost every
one at once with ``sweep_transformer`` (vectorised over layouts), keep those whose memory fits and
rank them by step time. The grid is pruned the way practitioners prune it (Narayanan et al. 2021,
sec. 3.3's takeaways: tensor parallelism inside a node, pipeline across nodes; micro-batches that
divide the batch): tp divides the node and the heads, micro-batch sizes and v are powers of two
(v <= 8), cp is a power of two used only for sequences of at least 4096 tokens. ``exhaustive=True``
lifts those prunings (every divisor) for checking the pruned search on small cases.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from perfcheck.errors import UserError
from perfcheck.hardware.systems import load_system
from perfcheck.predict import step as steps
from perfcheck.predict.transformer import load_model, sweep_transformer


def _divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pow2_upto(n: int) -> list:
    out, d = [], 1
    while d <= n:
        out.append(d)
        d *= 2
    return out


def _positive(value, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise UserError(f"{field} must be a positive integer, got {value!r}")
    return int(value)


def candidate_layouts(model, gpus: int, global_batch: int, seq: int, gpus_per_node: int,
                      exhaustive: bool = False) -> pd.DataFrame:
    """Every layout the model can be split by (``step.validate_layouts``'s rules) on exactly ``gpus`` GPUs
    with ``global_batch`` sequences per step (grad_accum_steps 1: one pipeline flush per step)."""
    tps = [t for t in (_divisors(gpus_per_node) if not exhaustive else _divisors(gpus))
           if model.heads % t == 0 and model.hidden % t == 0 and model.ffn_hidden % t == 0 and model.kv_heads % t == 0]
    cps = ([c for c in _divisors(gpus) if seq % c == 0] if exhaustive else
           [c for c in _pow2_upto(16) if seq % c == 0 and (c == 1 or seq >= 4096)])
    rows = []
    for t in tps:
        for c in cps:
            if gpus % (t * c):
                continue
            for p in _divisors(gpus // (t * c)):
                if model.layers % p:
                    continue
                dp = gpus // (t * c * p)
                if global_batch % dp:
                    continue
                per_replica = global_batch // dp
                mbs = _divisors(per_replica) if exhaustive else [b for b in _pow2_upto(8) if per_replica % b == 0]
                vs = ([v for v in _divisors(model.layers // p)] if exhaustive else
                      [v for v in _pow2_upto(8) if (model.layers // p) % v == 0]) if p > 1 else [1]
                zeros = (0, 1) if p > 1 else (0, 1, 3)
                for b in mbs:
                    m = per_replica // b
                    for v in vs:
                        if v > 1 and m % p:
                            continue
                        for sp in ((False, True) if t > 1 and seq % t == 0 else (False,)):
                            for z in zeros:
                                rows.append((t, sp, p, v, dp, c, z, b, m))
    cols = ("tp", "sp", "pp", "virtual_stages", "dp", "cp", "zero_stage", "micro_batch", "micro_batches")
    return pd.DataFrame(rows, columns=cols)


@dataclasses.dataclass
class Plan:
    """Ranked layouts that fit (fastest first, with every ``step.STEP_COLUMNS`` column) and what was searched."""

    ranked: pd.DataFrame
    searched: int
    fitting: int


#: What each ZeRO stage of the search is, in Megatron's terms: DDP, the distributed optimizer, FSDP.
ZERO_ENGINES = {0: "DDP", 1: "dist-opt", 3: "FSDP"}
#: ``overlap=True``: each ZeRO stage's DP engine with its own overlap schedule ({zero_stage: (name, options)}):
#: Megatron-Core's bucketed overlap beside the last backward / first forward (``predict.mcore_overlap``) for DDP
#: and the distributed optimizer, FSDP2's per-block prefetch (``predict.fsdp``) for the fully sharded layouts.
OVERLAP_SCHEDULES = {
    0: ("DDP, overlap_grad_reduce", dict(dp_engine="megatron", overlap_grad_reduce=True)),
    1: ("dist-opt, overlap_grad_reduce + overlap_param_gather",
        dict(dp_engine="megatron", overlap_grad_reduce=True, overlap_param_gather=True)),
    3: ("FSDP2, per-block prefetch", dict(dp_engine="fsdp2")),
}


def plan(model, gpus, system, global_batch, *, seq=None, dtype="bf16", flash=True, causal=True, dp_overlap=0.0,
         overlap=False, recompute=("none", "selective", "full"), exhaustive=False) -> Plan:
    """Search the layouts of ``model`` on ``gpus`` GPUs of ``system`` for ``global_batch`` sequences per step.

    Costing: ``sweep_transformer`` with Megatron's DP (``dp_engine="megatron"``: DDP all-reduce at
    ZeRO-0, the distributed optimizer at 1, FSDP at 3; ``dp_overlap`` of their time hidden), pipeline
    scatter/gather, ring context parallelism, ``flash`` attention (selective recompute is then a no-op and
    skipped) and causal masking by default. ``overlap=True`` prices each stage's engine with its own overlap
    schedule instead of a fixed fraction (``OVERLAP_SCHEDULES``); the ``dp_schedule`` column names what each row
    assumed. NB: the fully sharded rows are then FSDP2's whole loop (torch's foreach AdamW without a clip, its
    all-gather copy-outs), not Megatron's optimizer with another schedule. Raises UserError naming the argument
    when nothing fits.
    """
    if overlap and dp_overlap:
        raise UserError(f"dp_overlap: give a fixed hidden fraction ({dp_overlap}) or overlap (each engine's own "
                        "schedule), not both")
    model = load_model(model)
    gpus = _positive(gpus, "gpus")
    global_batch = _positive(global_batch, "global_batch")
    seq = model.seq_len if seq is None else _positive(seq, "seq")
    if model.position == "learned" and seq > model.seq_len:
        raise UserError(f"seq: {seq} exceeds the model's seq_len = {model.seq_len} (learned position embeddings)")
    spec = load_system(system)
    modes = [r for r in recompute if not (flash and r == "selective")]
    for r in modes:
        if r not in steps.RECOMPUTE:
            raise UserError(f"recompute must be among {', '.join(steps.RECOMPUTE)}, got {r!r}")
    layouts = candidate_layouts(model, gpus, global_batch, seq, spec.gpus_per_node, exhaustive)
    if layouts.empty:
        raise UserError(f"gpus: no layout of {model.name} uses exactly {gpus} GPUs with global_batch = "
                        f"{global_batch} (the data-parallel size must divide the global batch)")
    layouts["seq"] = seq
    frames = []
    for r in modes:
        out = _sweep(model, layouts, dict(system=spec, dtype=dtype, flash=flash, causal=causal, recompute=r),
                     dp_overlap, overlap)
        out["recompute"] = r
        frames.append(out)
    allr = pd.concat(frames, ignore_index=True)
    fit = allr[allr["mem_fits"].astype(bool)].sort_values("step_time_s", kind="stable").reset_index(drop=True)
    if fit.empty:
        least = allr["mem_total_bytes"].min()
        raise UserError(f"gpus: no layout of {model.name} on {gpus} GPUs fits in {spec.name}'s "
                        f"{spec.mem_capacity_bytes / 1e9:.0f} GB (the smallest needs {least / 1e9:.0f} GB per GPU)")
    return Plan(fit, len(allr), len(fit))


def _sweep(model, layouts, common, dp_overlap, overlap) -> pd.DataFrame:
    """``sweep_transformer`` of ``layouts`` under Megatron's DP with ``dp_overlap`` hidden, or (``overlap``) each
    ZeRO stage's rows under its engine's own schedule; ``dp_schedule`` names the one each row got."""
    if not overlap:
        out = sweep_transformer(model, layouts, dp_engine="megatron", dp_overlap=dp_overlap, **common)
        suffix = f", {dp_overlap:g} hidden" if dp_overlap else ", exposed"
        out["dp_schedule"] = [ZERO_ENGINES[int(z)] + suffix for z in out["zero_stage"]]
        return out
    unpriced = sorted(set(layouts["zero_stage"].astype(int)) - set(OVERLAP_SCHEDULES))
    if unpriced:  # a row the schedules do not cover is an error, never a row silently dropped
        raise NotImplementedError(f"plan(overlap=True): no overlap schedule for zero_stage {unpriced}")
    parts = []
    for z, (name, options) in OVERLAP_SCHEDULES.items():
        rows = layouts[layouts["zero_stage"] == z]
        if len(rows):
            out = sweep_transformer(model, rows, **options, **common)
            out["dp_schedule"] = name
            parts.append(out)
    return pd.concat(parts, ignore_index=True)


def why_slower(best: pd.Series, other: pd.Series, top: int = 2) -> list:
    """The step-time terms that make ``other`` slower than ``best``: [(term, seconds more)], largest first."""
    deltas = [(k, float(other[k] - best[k])) for k in steps.BREAKDOWN]
    return sorted([d for d in deltas if d[1] > 0], key=lambda d: -d[1])[:top]


def what_offsets(best: pd.Series, other: pd.Series, top: int = 2) -> list:
    """The terms where ``other`` is faster than ``best`` (what it buys with what ``why_slower`` lists):
    [(term, seconds less)], largest first."""
    return why_slower(other, best, top)
