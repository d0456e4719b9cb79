"""Whole-step arithmetic for the transformer front-end, vectorised over configurations.

One evaluation (``evaluate``) costs every sublayer of ``sharding.py`` for n layouts at once
(arrays of shape (rows, n)) and times it with ``roofline.device_times`` (the device-time path of
``perfcheck.estimate`` too); ``sublayer_table`` renders one layout as the per-sublayer table and
``step_arrays`` reduces it to step totals (schedule and collective formulas in ``pipeline.py``):

    per micro-batch  t_mb = layers/pp * (fwd + bwd of one layer) + the slower end stage's rows
                            + recompute + exposed TP/SP + exposed CP + v pipeline hand-offs each way
    step time        = gas * m * t_mb + gas * bubble                (interleaved 1F1B, m micro-batches)
                       + exposed DP collectives + optimizer update
    bubble           = ((pp - 2) * t_middle + t_other_end) / v: each other stage fills and drains in its
                       own time (``pipeline.flush_bubble_s``); (pp - 1)/(v * m) of the ideal when the
                       stages are equal (Narayanan et al. 2021, arXiv 2104.04473, sec. 2.2)
    MFU              = model FLOPs per step / (step time * world size * dense matrix peak)

Model FLOPs are the unsharded model's forward + backward (no recompute, no TP-replicated work);
HFU counts what the GPU executes (recompute and replicated norms/dropouts included).
Options and layouts (validated) live in ``step_config.py``.
The shared device-time path and the other terms: docs/model.md.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from perfcheck.errors import UserError
from perfcheck.predict import (collectives, ddp, fsdp, grad_buffers, mcore_overlap, optimizer_passes, pipeline,
                               roofline, row_times, sharding)
from perfcheck.predict.gemm_operands import GEMM_ALIGN_BYTES
from perfcheck.predict.step_config import (CP_KINDS, DP_ENGINES, RECOMPUTE, Layouts, Options, check_ep,  # noqa: F401
                                           full_recompute_share, grad_accumulation, grad_clip, make_options,
                                           optimizer_impl, single_layout, validate_layouts)
from perfcheck.hardware.systems import element_bytes as elem_bytes, spec_of


# ---- evaluation ------------------------------------------------------------------------------------
def _stack(values, n):
    """(rows, n) float array from per-row scalars or length-n arrays (assignment broadcasts)."""
    out = np.empty((len(values), n))
    for i, v in enumerate(values):
        out[i] = v
    return out


def evaluate(model, cfg: Layouts, system, dtype, opts: Options, *, tp1=False) -> dict:
    """Every sublayer for every layout: a dict of (rows, n) arrays plus row metadata.

    ``tp1``: cost the unsharded model (t = 1, no SP) for model FLOPs.
    """
    n = len(cfg.tp)
    t = np.ones(n) if tp1 else cfg.tp.astype(float)
    sp = np.zeros(n, bool) if tp1 else cfg.sp
    # context parallelism: each GPU holds seq/cp tokens; its attention core sees all seq keys (scaled below)
    b, s, tied_copy = cfg.micro_batch.astype(float), cfg.seq / cfg.cp, (not model.tied_embeddings) | (cfg.pp > 1)
    if n == 1:  # one layout: Python scalars are ~20x faster than 1-element arrays in the formulas
        b, s, t, sp, tied_copy = float(b[0]), float(s[0]), float(t[0]), bool(sp[0]), bool(tied_copy[0])
    x = sharding.Shape(b, s, t, sp, elem_bytes(dtype), 1 if tp1 else opts.ep,
                       "1d" if tp1 else opts.tp_scheme, opts.tp_depth)
    rows = (sharding.layer_sublayers(model, x, causal=opts.causal, flash=opts.flash, eager=opts.eager,
                                     eager_norm=opts.eager_norm)
            + sharding.model_sublayers(model, x, tied_copy=tied_copy, eager_norm=opts.eager_norm,
                                       eager=opts.eager))
    out = {"name": [r.name for r in rows], "formula": [r.formula for r in rows],
           "stage": np.array([r.stage for r in rows])}
    # The attention core of s/cp queries runs against all s keys: cp x the work of a local (s/cp)^2 core
    # (ring attention: cp blocks of (s/cp) keys; Ulysses: s tokens of heads/cp heads: the same products).
    core = np.isin(out["name"], sharding.CORE_ATTENTION)[:, None] * (cfg.cp.astype(float) - 1) + 1
    stack = lambda values: _stack(values, n)  # noqa: E731
    out.update(row_times.cost_columns([r.cost for r in rows], stack, core))
    out["parts"] = row_times.part_columns(rows, stack, core)
    out["act_mem"] = _stack([r.cost.act_mem for r in rows], n) * core
    out["params"] = _stack([r.cost.params for r in rows], n)
    out["recomputed_act"] = _stack([r.recomputed_act for r in rows], n) * core
    nan = float("nan")
    out["min_dim"] = _stack([nan if r.gemm is None else np.minimum(np.minimum(r.gemm[0], r.gemm[1]), r.gemm[2])
                             for r in rows], n)
    out["unaligned"] = _stack([nan if r.gemm is None else _unaligned(r.gemm, x.elem_bytes) for r in rows], n)
    for i, f in enumerate(("attn_seq", "attn_head_dim", "attn_causal")):  # a fused attention kernel's row
        out[f] = _stack([nan if r.attention is None else float(r.attention[i]) if np.ndim(r.attention[i]) == 0
                         else np.asarray(r.attention[i], dtype=float) for r in rows], n)
    # bytes per (kind, group) for timing (each group has its own size), summed over groups per kind
    acc = {}  # (kind, group, beside) -> ([fwd bytes per row], [bwd bytes per row]), one pass over the collectives
    for i, r in enumerate(rows):
        for c in r.comms:
            key = (c.kind, c.group, c.beside)
            per_row = acc.setdefault(key, ([0.0] * len(rows), [0.0] * len(rows)))[c.phase == "bwd"]
            per_row[i] = per_row[i] + c.bytes
    out["comm_groups"] = {key: (_stack(f, n), _stack(b, n)) for key, (f, b) in sorted(acc.items())}
    zero = np.zeros((len(rows), n))
    for i, phase in enumerate(("fwd", "bwd")):
        for kind in sharding.SUBLAYER_KINDS:
            out[f"comm_{phase}_{kind}"] = sum((v[i] for (k, _, _), v in out["comm_groups"].items() if k == kind), zero)
    if not tp1:
        sizes = {g: np.broadcast_to(np.asarray(v, dtype=float), (n,)) for g, v in x.group_sizes().items()}
        _time_rows(out, sizes, system, dtype, opts)
    return out


def _unaligned(gemm, elem_bytes):
    """1.0 where the GEMM's k or n rows are not 16-byte multiples (``gemm_operands.gemm_unaligned``'s rule)."""
    k, n = np.asarray(gemm[1], dtype=float), np.asarray(gemm[2], dtype=float)
    step = GEMM_ALIGN_BYTES
    return ((np.mod(k * elem_bytes, step) != 0) | (np.mod(n * elem_bytes, step) != 0)).astype(float)


def _time_rows(out, group_sizes, system, dtype, opts):
    """Device time and TP collective time of every row, fwd and bwd stacked so each model runs once.

    The device time is ``row_times.device_rows``: ``roofline.device_times_read``, the function
    ``perfcheck.estimate`` times its traced ops with (efficiency curves, matrix_shape_curve by the GEMM's smallest
    dimension, alignment, mem_bandwidth_curve by bytes per kernel, op_efficiency read at each kernel's roofline
    seconds, per-row prices, the device-side ``device_kernel_s`` per kernel; a row's parts under their own ops):
    one path, so the two front-ends agree on every layer under any spec.
    ``group_sizes``: ranks per group name (``Shape.group_sizes``), one entry per layout.
    """
    spec = spec_of(system)
    rows = len(out["name"])
    d = row_times.device_rows(out, spec, dtype)
    compute, memory, launch = d["compute"], d["memory"], d["launch"]
    by_beside = {"": np.zeros_like(compute), "dw": np.zeros_like(compute), "dx": np.zeros_like(compute)}
    for (kind, group, beside), (fwd, bwd) in out["comm_groups"].items():
        by_beside[beside] = by_beside[beside] + np.asarray(
            collectives.collective_time_s(kind, np.concatenate([fwd, bwd]), group_sizes[group], spec))
    comm = by_beside[""] + by_beside["dw"] + by_beside["dx"]
    device = d["time"]
    if opts.tp_async_backward:
        # A linear's backward is two GEMMs of equal FLOPs (dX = dY W, dW = dY^T X): half its device time each;
        # each collective runs beside one of them (``collectives.beside_compute_s``)
        r = spec.efficiency.get("matrix_beside_collective", 1.0)
        half = 0.5 * np.concatenate([np.zeros_like(device[:rows]), device[rows:]])
        on_path = (by_beside[""] + collectives.beside_compute_s(by_beside["dw"], half, r)
                   + collectives.beside_compute_s(by_beside["dx"], half, r))
    else:
        on_path = comm
    exposed = (1 - opts.tp_overlap) * on_path
    bound = np.where(exposed > device, "comm", d["bound"])
    for phase, part in (("fwd", slice(0, rows)), ("bwd", slice(rows, 2 * rows))):
        out[f"t_compute_{phase}_s"], out[f"t_memory_{phase}_s"] = compute[part], memory[part]
        out[f"t_overhead_{phase}_s"], out[f"t_comm_{phase}_s"] = launch[part], comm[part]
        out[f"t_roof_{phase}_s"] = device[part]
        out[f"pred_{phase}_s"] = device[part] + exposed[part]
        out[f"bound_{phase}"] = bound[part]


# ---- step totals -----------------------------------------------------------------------------------
STEP_COLUMNS: Mapping[str, str] = {
    "world_size": "GPUs: tp * pp * dp * cp",
    "global_batch": "sequences per optimizer step: micro_batch * micro_batches * grad_accum_steps * dp",
    "tokens_per_step": "tokens per optimizer step",
    "step_time_s": "predicted time of one optimizer step, seconds (the sum of the *_time_s parts below)",
    "compute_time_s": "device time (roofline.device_times, launches included) of the critical pipeline stage's "
                      "micro-batches, recompute excluded, seconds",
    "recompute_time_s": "device time re-running forward for activation checkpointing, seconds",
    "tp_comm_time_s": "exposed tensor/sequence-parallel collective time (recompute's included), seconds",
    "cp_comm_time_s": "exposed context-parallel communication (ring K/V passes beyond the attention core's time, "
                      "or Ulysses all-to-alls), seconds",
    "pp_comm_time_s": "pipeline hand-offs of activations and their gradients (v per micro-batch interleaved; "
                      "scatter/gather without SP), seconds",
    "bubble_time_s": "pipeline bubble: grad_accum * ((pp - 2) * middle stage + the faster end stage) / virtual_stages, "
                     "per micro-batch times (pipeline.flush_bubble_s), seconds",
    "dp_comm_time_s": "exposed DP / ZeRO collectives: (1 - dp_overlap) * (fwd + bwd ones) + post-step ones; "
                      "fsdp2: what FSDP2's per-block prefetch leaves exposed (fsdp.exposed_per_micro_step_s); ddp: "
                      "its buckets beside the last backward (ddp.exposed_s); megatron with overlap_grad_reduce / "
                      "overlap_param_gather: Megatron-Core's buckets (mcore_overlap), seconds",
    "dp_copy_time_s": "the DP engine's copies on the compute stream at memory bandwidth: fsdp2's all-gather copy-out "
                      "and reduce-scatter copy-in (fsdp.compute_stream_copy_bytes); megatron's and ddp's passes over "
                      "the gradients around their all-reduce (grad_buffers.reduce_pass_bytes); 0 for deepspeed, seconds",
    "grad_accum_time_s": "adding each micro-batch's gradients into the step's (grad_buffers.time_s: 'autograd' "
                         "m - 1 in-place adds, 'main_grad' m adds into Megatron's buffer, 'none' fused), seconds",
    "optimizer_time_s": "optimizer step of this GPU's partition as its code runs it, memory passes at bandwidth "
                        "(optimizer_passes), seconds",
    "bubble_fraction": "share of a flush in the bubble: (pp - 1)/v / (micro_batches + (pp - 1)/v)",
    "tp_comm_bytes": "full-buffer bytes of TP collectives per step on one GPU",
    "dp_allreduce_bytes": "full-buffer bytes all-reduced over the DP group per step (ZeRO model)",
    "dp_reducescatter_bytes": "full-buffer bytes reduce-scattered over the DP group per step",
    "dp_allgather_bytes": "full-buffer bytes all-gathered over the DP group per step",
    "dp_comm_total_s": "DP / ZeRO collective time per step before overlap, seconds",
    "params_per_gpu": "parameters held by the GPU of the largest stage (TP/PP-sharded, before ZeRO)",
    "mem_params_bytes": "parameter bytes per GPU after ZeRO", "mem_grads_bytes": "gradient bytes per GPU after ZeRO",
    "mem_optimizer_bytes": "optimizer-state bytes per GPU after ZeRO (fp32 master copy included)",
    "mem_activations_bytes": "activation bytes kept per GPU at the 1F1B peak (recompute applied)",
    "act_per_layer_bytes": "activation bytes one layer keeps per micro-batch, recompute applied (Korthikanti Table 2)",
    "mem_total_bytes": "params + grads + optimizer + activations on the GPU that needs the most",
    "mem_fits": "mem_total_bytes <= the system's memory capacity",
    "model_flops_per_step": "FLOPs of the unsharded model's forward + backward over the global batch",
    "hardware_flops_per_gpu": "FLOPs one GPU of the critical stage executes per step (recompute included)",
    "recompute_flops_per_gpu": "of hardware_flops_per_gpu: the forward FLOPs re-run for activation checkpointing "
                               "(the module estimator's flops_recompute on the same layers)",
    "mfu": "model FLOPs utilisation: model_flops_per_step / (step_time_s * world_size * matrix peak)",
    "hfu": "hardware FLOPs utilisation: hardware_flops_per_gpu / (step_time_s * matrix peak)",
    "tokens_per_s": "tokens_per_step / step_time_s",
}


def _unit(name: str) -> str:
    if name == "tokens_per_s":
        return "token/s"
    if name.endswith("_s"):
        return "s"
    if name.endswith("_bytes"):
        return "B"
    return "FLOP" if "flops" in name else ""


class StepSummary:
    """Step totals of one layout: attributes named as ``STEP_COLUMNS``; ``to_frame()`` for a table."""

    def __init__(self, values: Mapping[str, float], model: str, parallel: Mapping):
        self.values, self.model, self.parallel = dict(values), model, dict(parallel)

    def __getattr__(self, name):
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self):
        return f"StepSummary({self.model!r}, step_time_s={self.step_time_s:.4g}, mfu={self.mfu:.3f})"

    def to_frame(self) -> pd.DataFrame:
        """One row per quantity: quantity, value, unit, description."""
        return pd.DataFrame({"quantity": list(STEP_COLUMNS), "value": [self.values[k] for k in STEP_COLUMNS],
                             "unit": [_unit(k) for k in STEP_COLUMNS], "description": list(STEP_COLUMNS.values())})


def act_split(cfg: Layouts, opts: Options):
    """Ways one GPU's share of the (b, s, e) residual stream is split: t with SP, 1 without (1D);
    t for the grid schemes (tokens over the rows, features over the columns: q*q, d*q*q, q*q*q)."""
    return cfg.tp if opts.tp_scheme != "1d" else np.where(cfg.sp, cfg.tp, 1)


def _select(rows_arr, mask):
    """Sum a (rows, n) array over the rows in ``mask``."""
    return rows_arr[mask].sum(axis=0)


def step_arrays(model, cfg: Layouts, system, dtype, opts: Options) -> dict:
    """Step totals (``STEP_COLUMNS``) for every layout in ``cfg``, as arrays of length n.

    Per micro-batch on the critical stage (its layers, plus the slower end stage's rows):
        compute (without recompute) + recompute + exposed TP/SP + exposed CP + p2p hand-offs
    and per optimizer step (gas pipeline flushes of m micro-batches; ``pipeline.bubble_fraction``):
        step = gas * m * t_mb + gas * flush_bubble_s(p, v, t_middle, t_other_end) + exposed DP
               + embedding sync + optimizer
    """
    spec = spec_of(system)
    out = evaluate(model, cfg, system, dtype, opts)
    stage = out["stage"]
    lay, first, last = stage == "layer", stage == "first", stage == "last"
    core = np.isin(out["name"], sharding.CORE_ATTENTION)
    pp, m, gas = cfg.pp.astype(float), cfg.micro_batches.astype(float), cfg.grad_accum_steps.astype(float)
    v = cfg.virtual_stages.astype(float)
    per_stage = model.layers / pp
    one = pp == 1

    def stage_sum(a):  # per micro-batch on the critical stage: layers + the slower end-stage rows
        layer, f, l_ = _select(a, lay), _select(a, first), _select(a, last)
        return per_stage * layer + np.where(one, f + l_, np.where(f_time >= l_time, f, l_))

    def other_end(a):  # the faster end stage's own rows (no such stage without pipelining)
        f, l_ = _select(a, first), _select(a, last)
        return np.where(one, 0.0, np.where(f_time >= l_time, l_, f))

    f_time = _select(out["pred_fwd_s"] + out["pred_bwd_s"], first)
    l_time = _select(out["pred_fwd_s"] + out["pred_bwd_s"], last)
    roof = out["t_roof_fwd_s"] + out["t_roof_bwd_s"]
    exposed_tp = out["pred_fwd_s"] + out["pred_bwd_s"] - roof
    eb, share = elem_bytes(dtype), full_recompute_share(model.layers, opts)  # share: layers re-running forward
    rec_roof, rec_comm, rec_flops = _recompute_terms(out, opts, lay, core, share, model)
    cp_mb = per_stage * _cp_exposed(model, cfg, out, spec, eb, opts, core, lay, full_recompute=share)
    p2p = _p2p_per_micro_batch(model, cfg, spec, eb, opts)
    compute_mb = stage_sum(roof)
    tp_mb = stage_sum(exposed_tp) + per_stage * rec_comm
    rec_mb = per_stage * rec_roof
    stage_t = compute_mb + rec_mb + tp_mb + cp_mb + p2p
    micro = gas * m
    res = {"world_size": cfg.world, "global_batch": cfg.micro_batch * micro * cfg.dp}
    res["tokens_per_step"] = res["global_batch"] * cfg.seq
    res["compute_time_s"] = micro * compute_mb
    res["recompute_time_s"] = micro * rec_mb
    res["tp_comm_time_s"] = micro * tp_mb
    res["cp_comm_time_s"] = micro * cp_mb
    res["pp_comm_time_s"] = micro * p2p
    # the critical stage's time less its end rows is a middle stage's; the other end adds its own rows
    critical_end = stage_sum(roof + exposed_tp) - per_stage * _select(roof + exposed_tp, lay)
    middle_t = stage_t - critical_end
    res["bubble_time_s"] = gas * pipeline.flush_bubble_s(pp, v, middle_t, middle_t + other_end(roof + exposed_tp))
    res["bubble_fraction"] = pipeline.bubble_share(pp, v, m)
    res["tp_comm_bytes"] = micro * _tp_comm_bytes(out, opts, stage_sum, per_stage * share, lay)
    _dp_and_memory(res, model, cfg, out, spec, dtype, opts, lay, first, last, rec_roof + rec_comm)
    res["step_time_s"] = sum(res[k] for k in BREAKDOWN)
    flops = 2 * (out["macs_fwd"] + out["macs_bwd"]) + out["flops_fwd"] + out["flops_bwd"]
    res["hardware_flops_per_gpu"] = micro * (stage_sum(flops) + per_stage * rec_flops)
    res["recompute_flops_per_gpu"] = micro * per_stage * rec_flops * np.ones(len(pp))
    _flops_and_rates(res, model, cfg, system, spec, dtype, opts, micro)
    return res


def _tp_comm_bytes(out: dict, opts: Options, stage_sum, recomputed_layers, lay):
    """TP/SP collective bytes per micro-batch on the critical stage; with full recompute the re-run forward of
    each of the stage's ``recomputed_layers`` issues its collectives again."""
    total = stage_sum(sum(out[f"comm_{p}_{k}"] for p in ("fwd", "bwd") for k in sharding.SUBLAYER_KINDS))
    if opts.recompute == "full":
        total = total + recomputed_layers * _select(sum(out[f"comm_fwd_{k}"] for k in sharding.SUBLAYER_KINDS), lay)
    return total


def op_policy_rerun_share(names, model) -> np.ndarray:
    """Per sublayer row, the share of its forward that torchtitan's op-level selective AC re-runs in backward.

    The policy (torchtitan parallelize_llama.py at 1ea476e9f, ``_custom_policy``) keeps the outputs of
    aten.mm calls 1, 3, 5, 7 of a block and of the SDPA call, and re-runs every other op. A Llama block's
    matmuls in forward order are wq, wk, wv, wo (attention), w1, w3, w2 (``w2(silu(w1 x) * w3 x)``), so
    wk, wo and w3 re-run: of the fused qkv_proj row the k projection, kv_dim / (hidden + 2 kv_dim) of its
    work; all of out_proj; half of fc1 (w3 of w1/w3); none of fc2 and of the attention core; all of every
    other row (norms, rotary, activation, residual adds), none of which is a matmul."""
    kv = model.kv_heads * model.head_dim
    fixed = {"qkv_proj": kv / (model.hidden + 2 * kv), "out_proj": 1.0, "fc1": 0.5, "fc2": 0.0,
             "q_proj": 0.0, "k_proj": 1.0, "v_proj": 0.0, "fc1_gate": 0.0, "fc1_up": 1.0}  # eager: the GEMMs apart
    return np.array([0.0 if n in sharding.CORE_ATTENTION else fixed.get(n, 1.0) for n in names])


def _recompute_terms(out: dict, opts: Options, lay, core, share, model) -> tuple:
    """(device seconds, exposed TP seconds, FLOPs) that activation recompute adds per layer and micro-batch: the
    forward (with its TP collectives) of the whole layer again ("full"; on ``share`` of the layers, see
    ``full_recompute_share``), or of the attention core ("selective", not with flash attention, which recomputes
    inside its own backward), or a share of each row's forward ("selective_op", ``op_policy_rerun_share``;
    tp = 1, so no collectives), else nothing."""
    if opts.recompute == "selective_op":
        op_share = op_policy_rerun_share(out["name"], model)[:, None]
        return (_select(op_share * out["t_roof_fwd_s"], lay), 0.0,
                _select(op_share * (2 * out["macs_fwd"] + out["flops_fwd"]), lay))
    if opts.recompute == "full":
        return (share * _select(out["t_roof_fwd_s"], lay),
                share * _select(out["pred_fwd_s"] - out["t_roof_fwd_s"], lay),
                share * _select(2 * out["macs_fwd"] + out["flops_fwd"], lay))
    if opts.recompute == "selective" and not opts.flash:
        return _select(out["t_roof_fwd_s"], core), 0.0, _select(2 * out["macs_fwd"] + out["flops_fwd"], core)
    return 0.0, 0.0, 0.0


def _p2p_per_micro_batch(model, cfg: Layouts, spec, eb, opts: Options):
    """Pipeline hand-off seconds per micro-batch: v sends per micro-batch and direction (interleaved; activations
    forward, gradients backward), scatter/gather without SP (``pipeline.p2p_bytes``, ``p2p_time_s``)."""
    pp, v, c = cfg.pp.astype(float), cfg.virtual_stages.astype(float), cfg.cp.astype(float)
    sent, gathered = pipeline.p2p_bytes(cfg.micro_batch, cfg.seq / c, model.hidden, eb, cfg.tp,
                                        cfg.sp | (opts.tp_scheme != "1d"), opts.scatter_gather)
    pp_spans = cfg.tp * cfg.dp * cfg.cp >= spec.gpus_per_node  # pp outermost (Megatron's rank order)
    hand_off = np.asarray(pipeline.p2p_time_s(sent, gathered, cfg.tp, spec, pp_spans))
    return 2 * pipeline.p2p_sends_per_micro_batch(pp, v) * hand_off


def _flops_and_rates(res: dict, model, cfg: Layouts, system, spec, dtype, opts: Options, micro) -> None:
    """Model FLOPs per step (the unsharded model's, Megatron's MFU numerator), MFU, HFU and tokens per second,
    into ``res`` (which holds the step time and the hardware FLOPs per GPU)."""
    unsharded = evaluate(model, cfg, system, dtype, opts, tp1=True)
    flops1 = 2 * (unsharded["macs_fwd"] + unsharded["macs_bwd"]) + unsharded["flops_fwd"] + unsharded["flops_bwd"]
    ul = unsharded["stage"] == "layer"
    res["model_flops_per_step"] = micro * cfg.dp * cfg.cp.astype(float) * (
        model.layers * flops1[ul].sum(axis=0) + flops1[~ul].sum(axis=0))
    peak = spec.matrix_peak(dtype)
    res["mfu"] = res["model_flops_per_step"] / (res["step_time_s"] * cfg.world * peak)
    res["hfu"] = res["hardware_flops_per_gpu"] / (res["step_time_s"] * peak)
    res["tokens_per_s"] = res["tokens_per_step"] / res["step_time_s"]


#: The additive terms of the step time, in the order the breakdown prints them.
BREAKDOWN = ("compute_time_s", "recompute_time_s", "tp_comm_time_s", "cp_comm_time_s", "pp_comm_time_s",
             "bubble_time_s", "dp_comm_time_s", "dp_copy_time_s", "grad_accum_time_s", "optimizer_time_s")


def _cp_exposed(model, cfg, out, spec, eb, opts, core, lay, full_recompute):
    """Exposed context-parallel communication of one layer per micro-batch (fwd + bwd, + the re-run forward
    under full recompute on ``full_recompute`` of the layers, a share in [0, 1]). Ring attention passes K/V
    blocks while it computes on the current one (Liu et al. 2023, sec. 3), so only what the ring's time exceeds
    the attention core's is exposed; Ulysses' all-to-alls stand between the projections and the core: fully exposed."""
    c = cfg.cp.astype(float)
    if not np.any(c > 1):
        return np.zeros(len(c))
    local = pipeline.ranks_per_node(cfg.tp, c, spec.gpus_per_node)  # cp inside tp in the rank order
    bw, intra = pipeline.rail_bandwidth_bytes_per_s(spec, c, local), pipeline.inside_node(c, local)
    t = cfg.tp.astype(float)
    if opts.cp_kind == "ulysses":
        fwd_b, bwd_b = pipeline.ulysses_bytes(cfg.micro_batch, cfg.seq, model.heads, model.kv_heads, model.head_dim,
                                              eb, t, c)
        fwd = 4 * pipeline.ring_time_s("alltoall", np.asarray(fwd_b) / 4, c, bw, spec, intra)  # q, k, v, out
        bwd = 4 * pipeline.ring_time_s("alltoall", np.asarray(bwd_b) / 4, c, bw, spec, intra)
        exposed = fwd + bwd + full_recompute * fwd
    else:
        fwd_b, bwd_b = pipeline.cp_ring_bytes(cfg.micro_batch, cfg.seq, model.kv_heads, model.head_dim, eb, t, c)
        # each of the c - 1 steps is a send to the next rank: the time of the whole ring at the rail bandwidth
        step_f = pipeline.ring_time_s("sendrecv", np.asarray(fwd_b) / np.maximum(c - 1, 1), 2, bw, spec, intra)
        step_b = pipeline.ring_time_s("sendrecv", np.asarray(bwd_b) / np.maximum(c - 1, 1), 2, bw, spec, intra)
        core_f, core_b = _select(out["t_roof_fwd_s"], core), _select(out["t_roof_bwd_s"], core)
        per_step_f, per_step_b = core_f / c, core_b / c  # the core's work is split over the c blocks
        fwd = (c - 1) * np.maximum(step_f - per_step_f, 0.0)
        bwd = (c - 1) * np.maximum(step_b - per_step_b, 0.0)
        exposed = fwd + bwd + full_recompute * fwd
    return np.where(c > 1, exposed, 0.0)


def _kept_per_layer(model, cfg, out, dtype, opts, lay) -> tuple:
    """(bytes one layer keeps per micro-batch, bytes of one layer rebuilt during its backward) by recompute mode
    (Korthikanti et al. 2022, Table 2; ``recompute_every`` and "selective_op" as ``Options`` says)."""
    full_layer = _select(out["act_mem"], lay)
    if opts.recompute == "full":
        layer_input = cfg.micro_batch * cfg.seq / cfg.cp * model.hidden * elem_bytes(dtype) / act_split(cfg, opts)
        share = full_recompute_share(model.layers, opts)  # the other layers keep everything (recompute_every)
        kept = share * layer_input + (1 - share) * full_layer  # per layer, on average over the stage
        rebuilt = full_layer if share > 0 else 0.0  # one layer's activations rebuilt during its backward
    elif opts.recompute == "selective":
        kept, rebuilt = full_layer - _select(out["recomputed_act"], lay), _select(out["recomputed_act"], lay)
    elif opts.recompute == "selective_op":
        # kept per token: the block's input and the outputs the policy keeps (op_policy_rerun_share): wq, wo's
        # input (the attention output), w2 (h each), wv (kv_dim), w1 (ffn_hidden) in the model dtype, and the
        # flash attention's fp32 log-sum-exp per head; one layer is rebuilt during its backward (tp = 1)
        tokens = cfg.micro_batch * cfg.seq / cfg.cp
        kv = model.kv_heads * model.head_dim
        kept = tokens * (elem_bytes(dtype) * (4 * model.hidden + kv + model.ffn_hidden) + 4 * model.heads)
        rebuilt = full_layer
    else:
        kept, rebuilt = full_layer, 0.0
    return kept, rebuilt


def _dp_and_memory(res, model, cfg, out, spec, dtype, opts, lay, first, last, recompute_s):
    """ZeRO collectives and model-state memory (zero.py), activation memory, optimizer time. ``recompute_s``:
    one layer's recompute seconds per micro-batch (with its backward, what FSDP2's collectives run beside)."""
    from perfcheck.predict import zero

    pp, m = cfg.pp.astype(float), cfg.micro_batches.astype(float)
    per_stage, one = model.layers / pp, pp == 1
    params = out["params"]
    p_layer, p_first, p_last = _select(params, lay), _select(params, first), _select(params, last)
    p_stage_first = per_stage * p_layer + p_first + np.where(one, p_last, 0.0)
    p_stage_last = per_stage * p_layer + p_last + np.where(one, p_first, 0.0)
    act = out["act_mem"]
    kept, rebuilt = _kept_per_layer(model, cfg, out, dtype, opts, lay)
    res["act_per_layer_bytes"] = kept * np.ones(len(pp))
    # 1F1B: the first stage holds pp micro-batches; interleaved, (1 + (p-1)/(p*v)) times that (Korthikanti
    # et al. 2022, sec. 4.2.3: the first stage's activations grow by that factor with v model chunks)
    v = cfg.virtual_stages.astype(float)
    in_flight = np.where(one, 1.0, np.minimum(pp, m) * np.where(v > 1, 1 + (pp - 1) / (pp * v), 1.0))
    act_first = in_flight * (per_stage * kept + _select(act, first)) + np.where(one, _select(act, last), 0.0) + rebuilt
    act_last = per_stage * kept + _select(act, last) + np.where(one, _select(act, first), 0.0) + rebuilt
    micro_steps = np.where(one, cfg.micro_batches * cfg.grad_accum_steps, cfg.grad_accum_steps)
    prec = zero.precision(dtype, opts.optimizer, opts.master_weights, stage=cfg.zero_stage)
    states = {}
    for name, p_stage, act_stage in (("first", p_stage_first, act_first), ("last", p_stage_last, act_last)):
        mem = zero.memory_per_rank(p_stage, cfg.zero_stage, cfg.dp * cfg.cp, precision_=prec)
        states[name] = (p_stage, mem, act_stage, mem["total"] + act_stage)
    pick_first = states["first"][3] >= states["last"][3]
    for i, key in ((0, "params_per_gpu"), (2, "mem_activations_bytes"), (3, "mem_total_bytes")):
        res[key] = np.where(pick_first, states["first"][i], states["last"][i])
    for k in ("params", "grads", "optimizer"):
        res[f"mem_{k}_bytes"] = np.where(pick_first, states["first"][1][k], states["last"][1][k])
    res["mem_fits"] = res["mem_total_bytes"] <= spec.mem_capacity_bytes
    # DP / ZeRO collectives of the stage with the most parameters (stages communicate concurrently)
    p_comm = np.maximum(p_stage_first, p_stage_last)
    dp = cfg.dp * cfg.cp  # context-parallel ranks reduce their gradients with the data-parallel ones
    res["dp_copy_time_s"] = np.zeros(len(pp))
    # the stage's layers, one micro-batch: (forward, backward with its recompute) seconds
    stack = (per_stage * _select(out["pred_fwd_s"], lay), per_stage * (_select(out["pred_bwd_s"], lay) + recompute_s))
    if opts.dp_engine == "megatron":
        _megatron_dp(res, model, cfg, spec, prec, opts, p_comm, dp, stack)
    elif opts.dp_engine == "ddp":
        _ddp_dp(res, cfg, spec, prec, opts, dp, (p_layer * per_stage + p_last, p_first),
                (stack[1], _select(out["pred_bwd_s"], first)))
    elif opts.dp_engine == "fsdp2":
        block = (_select(out["pred_fwd_s"], lay), _select(out["pred_bwd_s"], lay) + recompute_s)
        _fsdp2_dp(res, cfg, spec, dtype, opts, dp, micro_steps, per_stage, (p_layer, p_first + p_last),
                  block, _select(out["pred_bwd_s"], last))
    else:
        colls = zero.step_comm(p_comm, cfg.zero_stage, dp, micro_steps=micro_steps, dtype=dtype, precision_=prec)
        for kind in ("allreduce", "allgather", "reducescatter"):
            res[f"dp_{kind}_bytes"] = sum((np.asarray(c.bytes, dtype=float) for c in colls if c.kind == kind),
                                          np.zeros(len(pp)))
        dp_spans = (dp > 1) & (cfg.tp * dp > spec.gpus_per_node)
        t = zero.comm_time_s(colls, dp, spec, spans_nodes=dp_spans)
        res["dp_comm_total_s"] = t["fwd"] + t["bwd"] + t["step"]
        # fwd/bwd collectives can hide behind compute; the post-step parameter all-gather cannot
        res["dp_comm_time_s"] = (1 - opts.dp_overlap) * (t["fwd"] + t["bwd"]) + t["step"]
    _step_passes(res, cfg, spec, dtype, opts, prec, p_comm, dp)


def _step_passes(res, cfg, spec, dtype, opts, prec, params, dp):
    """Memory passes over the stage's parameters (the one with the most): the gradients' accumulation between
    micro-batches and the engine's passes around their reduction (``grad_buffers``), and the optimizer step as the
    engine runs it (``optimizer_passes``)."""
    mode, reduce_bytes = grad_accumulation(opts), _reduce_bytes(opts, prec.grad_bytes)
    # the main gradient the optimizer reads: fp32 where the accumulation is fused into the weight-gradient GEMM
    # (Megatron-LM's fp32 main_grad) unless the gradients are reduced in another dtype, else as reduced
    main_grad = 4.0 if mode == "none" and opts.dp_reduce_dtype is None else reduce_bytes
    if opts.dp_engine in ("megatron", "ddp"):
        passes = grad_buffers.reduce_pass_bytes(opts.dp_engine, mode, prec.grad_bytes, main_grad)
        res["dp_copy_time_s"] = roofline.memory_time_s(params * passes, spec) * np.ones(len(cfg.pp))
    res["optimizer_time_s"] = optimizer_passes.time_s(optimizer_impl(opts), opts.optimizer, params, cfg.zero_stage,
                                                      dp, spec, prec, main_grad_bytes=main_grad,
                                                      loss_scaling=dtype == "fp16", clip=grad_clip(opts), pp=cfg.pp)
    micro = (cfg.micro_batches * cfg.grad_accum_steps).astype(float)
    res["grad_accum_time_s"] = grad_buffers.time_s(mode, params, micro, prec.grad_bytes, reduce_bytes,
                                                   spec) * np.ones(len(cfg.pp))


def _megatron_dp(res, model, cfg, spec, prec, opts, params, dp, stack):
    """Data-parallel collectives as Megatron-LM issues them, once per optimizer step (gradients accumulate
    over the micro-batches in a buffer), and the tied-embedding gradient sync between the end stages.

    zero_stage 0, DDP: all-reduce of the gradients, S = P * b_g.
    zero_stage 1/2, distributed optimizer (Megatron-LM docs/distrib_optimizer.md): reduce-scatter of the
      gradients (S = P * b_g), then all-gather of the updated parameters (S = P * b_p).
    zero_stage 3, FSDP (Zhao et al. 2023, arXiv 2304.11277, sec. 3.2): per micro-step an all-gather of the
      parameters before forward and again before backward (S = P * b_p each) and a reduce-scatter of the
      gradients (S = P * b_g).
    Ring times at ``pipeline.rail_bandwidth_bytes_per_s`` of the DP group (tp and cp inside it in the rank
    order). ``dp_overlap`` hides that fraction of all of them; ``overlap_grad_reduce`` / ``overlap_param_gather``
    instead follow Megatron-Core's bucketed schedule beside the last backward and the first forward
    (``predict.mcore_overlap``; ``stack`` = the stage's layers' (forward, backward) seconds of one micro-batch).
    Tied embeddings with pp > 1: the first and last stages all-reduce the word embedding's gradient (V/t * h * b_g;
    Shoeybi et al. 2019's weight tying across stages), exposed.
    """
    z = cfg.zero_stage
    n = dp.astype(float)
    micro = (cfg.micro_batches * cfg.grad_accum_steps).astype(float)
    bw, intra = _dp_bandwidth(cfg, spec, dp)
    grads, weights = params * _reduce_bytes(opts, prec.grad_bytes), params * prec.param_bytes
    allreduce = np.where(z == 0, grads, 0.0)
    reducescatter = np.where(z == 3, micro * grads, np.where(z >= 1, grads, 0.0))
    allgather = np.where(z == 3, 2 * micro * weights, np.where(z >= 1, weights, 0.0))
    calls = np.where(z == 3, micro, 1.0)  # FSDP: per layer in practice; the latency term counts micro-steps
    total = (pipeline.ring_time_s("allreduce", allreduce, n, bw, spec, intra)
             + calls * pipeline.ring_time_s("reducescatter", reducescatter / calls, n, bw, spec, intra)
             + calls * pipeline.ring_time_s("allgather", allgather / calls, n, bw, spec, intra))
    res["dp_allreduce_bytes"], res["dp_reducescatter_bytes"], res["dp_allgather_bytes"] = allreduce, reducescatter, allgather
    tied = model.tied_embeddings & (cfg.pp > 1)
    emb = np.where(tied, sharding.padded_vocab(model, cfg.tp) * model.hidden * prec.grad_bytes, 0.0)
    sync = np.asarray(collectives.collective_time_s("allreduce", emb, 2 * np.ones(len(n)), spec,
                                                    spans_nodes=np.ones(len(n), bool)))
    res["dp_comm_total_s"] = total + sync
    res["dp_comm_time_s"] = (1 - opts.dp_overlap) * total + sync
    if opts.overlap_grad_reduce or opts.overlap_param_gather:
        res["dp_comm_time_s"] = _mcore_overlap_s(cfg, spec, prec, opts, params, dp, stack, (bw, intra)) + sync


def _mcore_overlap_s(cfg, spec, prec, opts, params, dp, stack, ring):
    """Megatron-Core's DP collectives with overlap_grad_reduce / overlap_param_gather (``predict.mcore_overlap``):
    the first stage's first model chunk (1/v of its parameters and layers) beside its last backward and first
    forward; a collective whose flag is off runs after the backward (or before the forward), exposed."""
    z, n, (bw, intra) = cfg.zero_stage, dp.astype(float), ring
    if np.any(z == 3):
        raise UserError("overlap_grad_reduce / overlap_param_gather are Megatron-Core's DDP and distributed optimizer "
                        "(zero_stage 0-2), got zero_stage 3")
    if opts.overlap_param_gather and np.any(z == 0):
        raise UserError("overlap_param_gather needs the distributed optimizer (zero_stage 1 or 2), got zero_stage 0")
    r = spec.efficiency.get("matrix_beside_collective", 1.0)
    v = cfg.virtual_stages.astype(float)
    chunk, (fwd, bwd) = params / v, (stack[0] / v, stack[1] / v)
    b_g = _reduce_bytes(opts, prec.grad_bytes)
    # DDP (zero_stage 0) all-reduces, the distributed optimizer reduce-scatters; the other chunks' collectives
    # (v > 1) run beside the stage's other chunks: hidden
    allreduce, reducescatter = (mcore_overlap.grad_reduce_exposed_s(k, chunk, b_g, bwd if opts.overlap_grad_reduce
                                                                    else 0.0, n, bw, spec, r, intra)
                                for k in ("allreduce", "reducescatter"))
    exposed = np.where(z == 0, allreduce, reducescatter)
    gather = mcore_overlap.param_gather_exposed_s(chunk, prec.param_bytes, fwd if opts.overlap_param_gather else 0.0,
                                                  n, bw, spec, r, intra)
    return exposed + np.where(z >= 1, gather, 0.0)


def _ddp_dp(res, cfg, spec, prec, opts, dp, params, bwd):
    """PyTorch DDP's bucketed all-reduce beside the last micro-batch's backward (``predict.ddp``): ``params`` =
    (stack, input embedding) parameters of the stage, ``bwd`` = (the blocks', the embedding's) backward seconds."""
    if np.any(cfg.zero_stage != 0) or np.any(cfg.pp != 1):
        raise UserError("dp_engine='ddp' is PyTorch DDP without pipelining (no_sync on all but the last "
                        "micro-batch): zero_stage must be 0 and pp 1, got zero_stage "
                        f"{sorted(set(cfg.zero_stage.tolist()))}, pp {sorted(set(cfg.pp.tolist()))}")
    n, (bw, intra) = dp.astype(float), _dp_bandwidth(cfg, spec, dp)
    stack, tail = (p * _reduce_bytes(opts, prec.grad_bytes) for p in params)
    r = spec.efficiency.get("matrix_beside_collective", 1.0)
    res["dp_allreduce_bytes"] = stack + tail
    res["dp_reducescatter_bytes"], res["dp_allgather_bytes"] = np.zeros(len(n)), np.zeros(len(n))
    res["dp_comm_total_s"] = sum(ddp.allreduce_buckets_s(b, n, bw, spec, intra=intra) for b in (stack, tail))
    res["dp_comm_time_s"] = ddp.exposed_s(stack, tail, bwd[0], bwd[1], n, bw, spec, r, intra=intra) * np.ones(len(n))


def _dp_bandwidth(cfg, spec, dp):
    """``(bandwidth, inside one node)``: the ring bus bandwidth of the data-parallel group (tp, and cp with context
    parallelism, laid out inside it) and whether the whole group shares a node."""
    local = pipeline.ranks_per_node(cfg.tp * cfg.cp, cfg.dp, spec.gpus_per_node)
    local = np.where(cfg.cp > 1, pipeline.ranks_per_node(cfg.tp, dp, spec.gpus_per_node), local)
    return pipeline.rail_bandwidth_bytes_per_s(spec, dp.astype(float), local), pipeline.inside_node(dp, local)


def _reduce_bytes(opts, grad_bytes):
    """Bytes per gradient element on the wire: ``dp_reduce_dtype``'s, else the gradients' own."""
    return grad_bytes if opts.dp_reduce_dtype is None else elem_bytes(opts.dp_reduce_dtype)


def _fsdp2_dp(res, cfg, spec, dtype, opts, dp, micro_steps, layers, params, block, bwd_root):
    """FSDP2's collectives and compute-stream copies per step (``predict.fsdp``): per micro-step each block's
    all-gather(s) of P_block b_p bytes and reduce-scatter of P_block b_r (``dp_reduce_dtype``; the gradients
    are computed in the model dtype, b_g), the root's (embeddings, final norm, output layer) likewise; what
    hides follows FSDP2's prefetch schedule beside ``block`` = (forward, backward) seconds of one layer."""
    if np.any(cfg.zero_stage != 3):
        raise UserError("dp_engine='fsdp2' shards parameters, gradients and optimizer states (fully_shard): "
                        f"zero_stage must be 3, got {sorted(set(cfg.zero_stage.tolist()))}")
    p_block, p_root = params
    n, (bw, intra) = dp.astype(float), _dp_bandwidth(cfg, spec, dp)
    b_p, b_g = elem_bytes(dtype), elem_bytes(dtype)
    b_r = _reduce_bytes(opts, b_g)
    ag_block, ag_root = (pipeline.ring_time_s("allgather", p * b_p, n, bw, spec, intra) for p in (p_block, p_root))
    rs_block, rs_root = (pipeline.ring_time_s("reducescatter", p * b_r, n, bw, spec, intra) for p in (p_block, p_root))
    r = spec.efficiency.get("matrix_beside_collective", 1.0)
    exposed = fsdp.exposed_per_micro_step_s(ag_block, rs_block, ag_root, rs_root, block[0], block[1], bwd_root,
                                            layers, r, opts.reshard_after_forward)
    gathers = fsdp.all_gathers_per_micro_step(opts.reshard_after_forward)
    total_params = layers * p_block + p_root
    res["dp_allreduce_bytes"] = np.zeros(len(n))
    res["dp_allgather_bytes"] = micro_steps * gathers * total_params * b_p
    res["dp_reducescatter_bytes"] = micro_steps * total_params * b_r
    res["dp_comm_total_s"] = micro_steps * (gathers * (layers * ag_block + ag_root) + layers * rs_block + rs_root)
    res["dp_comm_time_s"] = micro_steps * exposed
    copies = fsdp.compute_stream_copy_bytes(total_params, b_p, b_g, b_r, opts.reshard_after_forward)
    kernels = (layers + 1) * (gathers + 1)  # one copy per all-gather and one copy-in per reduce-scatter, per group
    res["dp_copy_time_s"] = micro_steps * roofline.memory_time_s(copies, spec, kernels=kernels)


def step_summary(model, batch, seq, parallel, system, dtype, opts) -> StepSummary:
    """Step totals of one layout (see ``transformer_step``)."""
    totals = step_arrays(model, single_layout(model, parallel, batch, seq, opts), system, dtype, opts)
    return StepSummary({k: np.asarray(totals[k])[0].item() for k in STEP_COLUMNS}, model.name, parallel.to_dict())
