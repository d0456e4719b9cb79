"""Whole-step arithmetic for the transformer front-end, vectorised over configurations.

One evaluation (``evaluate``) costs every sublayer of ``sharding.py`` for n layouts at once
(arrays of shape (rows, n)) and times it on the system's roofline; ``sublayer_table`` renders
one layout as the per-sublayer table and ``step_arrays`` reduces it to step totals:

    stage time t_stage = layers/pp * (fwd + bwd + recompute of one layer)
                         + embedding/head rows of the slower end stage + pipeline send/recv
    step time          = grad_accum * (m + pp - 1) * t_stage        (1F1B, m micro-batches)
                         + (1 - dp_overlap) * ZeRO/DP collectives + optimizer update
    bubble fraction    = (pp - 1) / (m + pp - 1)   (Narayanan et al. 2021, arXiv 2104.04473, sec. 2.2)
    MFU                = model FLOPs per step / (step time * world size * dense matrix peak)

Model FLOPs are the unsharded model's forward + backward (no recompute, no TP-replicated work);
HFU counts what the GPU executes (recompute and replicated norms/dropouts included).
Row times: max(compute, memory) + kernels * launch + (1 - tp_overlap) * TP collectives.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np
import pandas as pd

from perfcheck.errors import UserError
from perfcheck.predict import collectives, roofline, sharding
from perfcheck.hardware.systems import element_bytes as elem_bytes, load_system

RECOMPUTE = ("none", "selective", "full")


@dataclasses.dataclass(frozen=True)
class Options:
    """Modelling choices shared by the table, the step totals and the sweep.

    causal: count half of the attention score products (FlopCounterMode counts them in full).
    flash: fused attention (one ``core_attention`` row, ``formulas.attention``) instead of the
      transformer-perf-estimates notebook's logits/softmax/dropout/attend rows (docs/transformer.md).
    recompute: activation checkpointing per layer: "none", "selective" (the attention core,
      Korthikanti et al. 2022) or "full" (keep each layer's input, redo its forward in backward).
    tp_overlap, dp_overlap: fraction of TP / DP collective time hidden behind compute.
    optimizer, master_weights: model states per parameter (``zero.precision``: "adam" keeps fp32
      momentum and variance; master_weights None = DeepSpeed's choice of an fp32 master copy).
    ep: expert-parallel degree (MoE).
    tp_scheme: "1d" (Megatron), "2d" (Optimus, tp = q*q), "2.5d" (Tesseract, tp = q*q*tp_depth),
      "3d" (tp = q**3); ``sharding.grid_linear`` and docs/transformer.md. tp_depth: 2.5D's d.
    """

    causal: bool = False
    flash: bool = False
    recompute: str = "none"
    tp_overlap: float = 0.0
    dp_overlap: float = 0.0
    optimizer: str = "adam"
    master_weights: object = None
    ep: int = 1
    tp_scheme: str = "1d"
    tp_depth: int = 1

    def __post_init__(self):
        scheme = str(self.tp_scheme).lower()
        if scheme not in sharding.TP_SCHEMES:
            raise UserError(f"tp_scheme must be one of {', '.join(sharding.TP_SCHEMES)}, got {self.tp_scheme!r}")
        object.__setattr__(self, "tp_scheme", scheme)
        d = self.tp_depth
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise UserError(f"tp_depth must be a positive integer (the 2.5D grid's depth d), got {d!r}")
        if d > 1 and scheme != "2.5d":
            raise UserError(f"tp_depth = {d} needs tp_scheme='2.5d' (got tp_scheme={scheme!r})")
        for f in ("causal", "flash", "master_weights"):
            value = getattr(self, f)
            if not isinstance(value, (bool, np.bool_)) and not (f == "master_weights" and value is None):
                raise UserError(f"{f} must be true or false, got {getattr(self, f)!r}")
        if isinstance(self.ep, bool) or not isinstance(self.ep, (int, np.integer)) or self.ep < 1:
            raise UserError(f"ep must be a positive integer (expert-parallel degree), got {self.ep!r}")
        if self.recompute not in RECOMPUTE:
            raise UserError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        for f in ("tp_overlap", "dp_overlap"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise UserError(f"{f} must be a fraction in [0, 1], got {v!r}")


def check_ep(model, opts: Options):
    """Expert parallelism splits whole experts over ``ep`` GPUs (each holds experts/ep of them)."""
    if opts.ep > 1 and not model.experts:
        raise UserError(f"ep = {opts.ep} needs a mixture-of-experts model (model {model.name!r} has experts = 0)")
    if model.experts and model.experts % opts.ep:
        raise UserError(f"ep = {opts.ep} does not divide experts = {model.experts}")


def make_options(**kw) -> Options:
    known = [f.name for f in dataclasses.fields(Options)]
    unknown = [k for k in kw if k not in known]
    if unknown:
        raise UserError(f"unknown option(s) {', '.join(map(repr, unknown))} (known: {', '.join(known)})")
    return Options(**kw)


# ---- configurations as arrays ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Layouts:
    """n validated layouts, one numpy array per field."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    zero_stage: np.ndarray
    micro_batch: np.ndarray
    sp: np.ndarray
    micro_batches: np.ndarray
    grad_accum_steps: np.ndarray
    seq: np.ndarray

    @classmethod
    def single(cls, parallel, batch, seq) -> "Layouts":
        p = parallel
        return cls(*(np.array([v]) for v in (p.tp, p.pp, p.dp, int(p.zero_stage), batch, p.sp, p.micro_batches,
                                              p.grad_accum_steps, seq)))

    @property
    def world(self):
        return self.tp * self.pp * self.dp


def validate_layouts(model, cols: Mapping[str, np.ndarray], opts: "Options" = None) -> Layouts:
    """Arrays of layouts checked like ``ParallelConfig`` + ``validate_for_model`` (and, for a grid
    ``opts.tp_scheme``, ``sharding.grid_problems``); UserError names row and field."""
    out = {}
    for f in ("tp", "pp", "dp", "zero_stage", "micro_batch", "micro_batches", "grad_accum_steps", "seq"):
        a = np.asarray(cols[f])
        if a.dtype == bool or not np.issubdtype(a.dtype, np.number) or np.any(a != np.floor(a)):
            raise UserError(f"layouts: {f} must hold integers")
        out[f] = a.astype(np.int64)
    sp = np.asarray(cols["sp"])
    if sp.dtype != bool:
        if not np.all(np.isin(sp, (0, 1))):
            raise UserError("layouts: sp must hold true/false")
        sp = sp.astype(bool)
    out["sp"] = sp
    o = out
    scheme = "1d" if opts is None else opts.tp_scheme
    checks = [
        (o["tp"] < 1, "tp must be >= 1"), (o["pp"] < 1, "pp must be >= 1"), (o["dp"] < 1, "dp must be >= 1"),
        (o["micro_batch"] < 1, "micro_batch must be >= 1"), (o["micro_batches"] < 1, "micro_batches must be >= 1"),
        (o["grad_accum_steps"] < 1, "grad_accum_steps must be >= 1"), (o["seq"] < 1, "seq must be >= 1"),
        ((o["zero_stage"] < 0) | (o["zero_stage"] > 3), "zero_stage must be 0, 1, 2 or 3"),
        (sp & (o["tp"] == 1), "sp needs tp > 1"),
    ]
    if scheme != "1d":
        checks += sharding.grid_problems(model, np.maximum(o["tp"], 1), scheme, opts.tp_depth,
                                         np.maximum(o["micro_batch"], 1), sp)
    else:
        t = np.maximum(o["tp"], 1)
        checks += [(model.heads % t != 0, f"tp does not divide heads = {model.heads}"),
                   (model.hidden % t != 0, f"tp does not divide hidden = {model.hidden}"),
                   (model.ffn_hidden % t != 0, f"tp does not divide ffn_hidden = {model.ffn_hidden}"),
                   (model.kv_heads % t != 0, f"tp does not divide kv_heads = {model.kv_heads}"),
                   (sp & (o["seq"] % t != 0), "tp (sequence parallel) does not divide seq")]
    checks += [
        (model.layers % np.maximum(o["pp"], 1) != 0, f"pp does not divide layers = {model.layers}"),
        ((o["pp"] > 1) & (o["zero_stage"] >= 2), "zero_stage 2/3 is incompatible with pp > 1 (DeepSpeed)"),
    ]
    if model.position == "learned":
        checks.append((o["seq"] > model.seq_len, f"seq exceeds the model's seq_len = {model.seq_len}"))
    for bad, message in checks:
        if np.any(bad):
            i = int(np.argmax(bad))
            raise UserError(f"layouts row {i}: {message} (got {_row_text(o, i)})")
    return Layouts(**out)


def _row_text(o, i):
    return ", ".join(f"{k}={o[k][i]}" for k in ("tp", "sp", "pp", "dp", "zero_stage", "micro_batch", "seq"))


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
    b, s, tied_copy = cfg.micro_batch.astype(float), cfg.seq.astype(float), (not model.tied_embeddings) | (cfg.pp > 1)
    if n == 1:  # one layout: Python scalars are ~20x faster than 1-element arrays in the formulas
        b, s, t, sp, tied_copy = float(b[0]), float(s[0]), float(t[0]), bool(sp[0]), bool(tied_copy[0])
    x = sharding.Shape(b, s, t, sp, elem_bytes(dtype), 1 if tp1 else opts.ep,
                       "1d" if tp1 else opts.tp_scheme, opts.tp_depth)
    rows = (sharding.layer_sublayers(model, x, causal=opts.causal, flash=opts.flash)
            + sharding.model_sublayers(model, x, tied_copy=tied_copy))
    out = {"name": [r.name for r in rows], "formula": [r.formula for r in rows],
           "stage": np.array([r.stage for r in rows])}
    for phase in ("fwd", "bwd"):
        costs = [getattr(r.cost, phase) for r in rows]
        for f in ("macs", "flops", "bytes", "kernels"):
            out[f"{f}_{phase}"] = _stack([getattr(c, f) for c in costs], n)
    out["act_mem"] = _stack([r.cost.act_mem for r in rows], n)
    out["params"] = _stack([r.cost.params for r in rows], n)
    out["recomputed_act"] = _stack([r.recomputed_act for r in rows], n)
    # bytes per (kind, group) for timing (each group has its own size), summed over groups per kind
    acc = {}  # (kind, group) -> ([fwd bytes per row], [bwd bytes per row]), one pass over the collectives
    for i, r in enumerate(rows):
        for c in r.comms:
            per_row = acc.setdefault((c.kind, c.group), ([0.0] * len(rows), [0.0] * len(rows)))[c.phase == "bwd"]
            per_row[i] = per_row[i] + c.bytes
    out["comm_groups"] = {key: (_stack(f, n), _stack(b, n)) for key, (f, b) in sorted(acc.items())}
    zero = np.zeros((len(rows), n))
    for i, phase in enumerate(("fwd", "bwd")):
        for kind in sharding.COLLECTIVE_KINDS:
            out[f"comm_{phase}_{kind}"] = sum((v[i] for (k, _), v in out["comm_groups"].items() if k == kind), zero)
    if not tp1:
        sizes = {g: np.broadcast_to(np.asarray(v, dtype=float), (n,)) for g, v in x.group_sizes().items()}
        _time_rows(out, sizes, system, dtype, opts)
    return out


def _time_rows(out, group_sizes, system, dtype, opts):
    """Roofline and TP collective times of every row; fwd and bwd stacked so each model runs once.

    ``group_sizes``: ranks per group name (``Shape.group_sizes``), one entry per layout.
    """
    spec = load_system(system)
    both = {f: np.concatenate([out[f"{f}_fwd"], out[f"{f}_bwd"]]) for f in ("macs", "flops", "bytes", "kernels")}
    compute = np.asarray(roofline.compute_time_s(2 * both["macs"], both["flops"], spec, dtype, kernels=both["kernels"]))
    memory = np.asarray(roofline.memory_time_s(both["bytes"], spec))
    launch = both["kernels"] * spec.launch_overhead_s
    comm = sum((np.asarray(collectives.collective_time_s(kind, np.concatenate([fwd, bwd]), group_sizes[group], spec))
                for (kind, group), (fwd, bwd) in out["comm_groups"].items()), np.zeros_like(compute))
    roof = np.maximum(compute, memory)
    exposed = (1 - opts.tp_overlap) * comm
    bound = np.where(exposed > roof + launch, "comm",
                     np.where(launch > roof, "overhead", np.where(compute >= memory, "compute", "memory")))
    rows = len(out["name"])
    for phase, part in (("fwd", slice(0, rows)), ("bwd", slice(rows, 2 * rows))):
        out[f"t_compute_{phase}_s"], out[f"t_memory_{phase}_s"] = compute[part], memory[part]
        out[f"t_overhead_{phase}_s"], out[f"t_comm_{phase}_s"] = launch[part], comm[part]
        out[f"t_roof_{phase}_s"] = roof[part] + launch[part]
        out[f"pred_{phase}_s"] = roof[part] + launch[part] + exposed[part]
        out[f"bound_{phase}"] = bound[part]


# ---- step totals -----------------------------------------------------------------------------------
STEP_COLUMNS: Mapping[str, str] = {
    "world_size": "GPUs: tp * pp * dp",
    "global_batch": "sequences per optimizer step: micro_batch * micro_batches * grad_accum_steps * dp",
    "tokens_per_step": "tokens per optimizer step",
    "step_time_s": "predicted time of one optimizer step, seconds (the sum of the *_time_s parts below)",
    "compute_time_s": "roofline time (incl. launches) of the critical pipeline stage's micro-batches, seconds",
    "recompute_time_s": "part of compute_time_s spent re-running forward for activation checkpointing, seconds",
    "tp_comm_time_s": "exposed tensor-parallel collective time, seconds",
    "pp_comm_time_s": "pipeline send/recv time of activations and their gradients, seconds",
    "bubble_time_s": "1F1B pipeline bubble: grad_accum * (pp - 1) * stage time per micro-batch, seconds",
    "dp_comm_time_s": "exposed DP / ZeRO collectives: (1 - dp_overlap) * (fwd + bwd ones) + post-step ones, seconds",
    "optimizer_time_s": "optimizer update of this GPU's partition at memory bandwidth (zero.optimizer_time_s), seconds",
    "bubble_fraction": "(pp - 1) / (micro_batches + pp - 1)",
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
    """Step totals (``STEP_COLUMNS``) for every layout in ``cfg``, as arrays of length n."""
    spec = load_system(system)
    out = evaluate(model, cfg, system, dtype, opts)
    stage = out["stage"]
    lay, first, last = stage == "layer", stage == "first", stage == "last"
    core = np.isin(out["name"], sharding.CORE_ATTENTION)
    pp, m, gas = cfg.pp.astype(float), cfg.micro_batches.astype(float), cfg.grad_accum_steps.astype(float)
    per_stage = model.layers / pp
    one = pp == 1

    def stage_sum(a):  # per micro-batch on the critical stage: layers + the slower end-stage rows
        layer, f, l_ = _select(a, lay), _select(a, first), _select(a, last)
        return per_stage * layer + np.where(one, f + l_, np.where(f_time >= l_time, f, l_))

    f_time = _select(out["pred_fwd_s"] + out["pred_bwd_s"], first)
    l_time = _select(out["pred_fwd_s"] + out["pred_bwd_s"], last)
    roof = out["t_roof_fwd_s"] + out["t_roof_bwd_s"]
    exposed_tp = out["pred_fwd_s"] + out["pred_bwd_s"] - roof
    # recompute: re-run forward (with its TP collectives) of the whole layer, or of the attention core
    if opts.recompute == "full":
        rec_roof = _select(out["t_roof_fwd_s"], lay)
        rec_comm = _select(out["pred_fwd_s"] - out["t_roof_fwd_s"], lay)
        rec_flops = _select(2 * out["macs_fwd"] + out["flops_fwd"], lay)
    elif opts.recompute == "selective" and not opts.flash:
        rec_roof, rec_comm = _select(out["t_roof_fwd_s"], core), 0.0
        rec_flops = _select(2 * out["macs_fwd"] + out["flops_fwd"], core)
    else:
        rec_roof = rec_comm = rec_flops = 0.0
    eb = elem_bytes(dtype)
    x_bytes = cfg.micro_batch * cfg.seq * model.hidden * eb / act_split(cfg, opts)
    pp_spans = cfg.world > spec.gpus_per_node
    send = collectives.collective_time_s("sendrecv", x_bytes, np.full(len(pp), 2), spec, spans_nodes=pp_spans)
    p2p = np.where(one, 0.0, 2 * np.asarray(send))  # activations forward, their gradients backward
    compute_mb = stage_sum(roof) + per_stage * rec_roof
    tp_mb = stage_sum(exposed_tp) + per_stage * rec_comm
    stage_t = compute_mb + tp_mb + p2p
    micro = gas * m
    res = {"world_size": cfg.world, "global_batch": cfg.micro_batch * micro * cfg.dp}
    res["tokens_per_step"] = res["global_batch"] * cfg.seq
    res["compute_time_s"] = micro * compute_mb
    res["recompute_time_s"] = micro * per_stage * rec_roof
    res["tp_comm_time_s"] = micro * tp_mb
    res["pp_comm_time_s"] = micro * p2p
    res["bubble_time_s"] = gas * (pp - 1) * stage_t
    res["bubble_fraction"] = (pp - 1) / (m + pp - 1)
    comm_bytes = sum(out[f"comm_{p}_{k}"] for p in ("fwd", "bwd") for k in sharding.COLLECTIVE_KINDS)
    res["tp_comm_bytes"] = micro * stage_sum(comm_bytes)
    if opts.recompute == "full":  # the re-run forward issues its TP collectives again
        res["tp_comm_bytes"] = res["tp_comm_bytes"] + micro * per_stage * _select(
            sum(out[f"comm_fwd_{k}"] for k in sharding.COLLECTIVE_KINDS), lay)
    _dp_and_memory(res, model, cfg, out, spec, dtype, opts, lay, first, last)
    res["step_time_s"] = (res["compute_time_s"] + res["tp_comm_time_s"] + res["pp_comm_time_s"] + res["bubble_time_s"]
                          + res["dp_comm_time_s"] + res["optimizer_time_s"])
    unsharded = evaluate(model, cfg, system, dtype, opts, tp1=True)
    flops1 = 2 * (unsharded["macs_fwd"] + unsharded["macs_bwd"]) + unsharded["flops_fwd"] + unsharded["flops_bwd"]
    ul = unsharded["stage"] == "layer"
    res["model_flops_per_step"] = micro * cfg.dp * (model.layers * flops1[ul].sum(axis=0) + flops1[~ul].sum(axis=0))
    flops = 2 * (out["macs_fwd"] + out["macs_bwd"]) + out["flops_fwd"] + out["flops_bwd"]
    res["hardware_flops_per_gpu"] = micro * (stage_sum(flops) + per_stage * rec_flops)
    res["recompute_flops_per_gpu"] = micro * per_stage * rec_flops * np.ones(len(pp))
    peak = spec.matrix_peak(dtype)
    res["mfu"] = res["model_flops_per_step"] / (res["step_time_s"] * cfg.world * peak)
    res["hfu"] = res["hardware_flops_per_gpu"] / (res["step_time_s"] * peak)
    res["tokens_per_s"] = res["tokens_per_step"] / res["step_time_s"]
    return res


def _dp_and_memory(res, model, cfg, out, spec, dtype, opts, lay, first, last):
    """ZeRO collectives and model-state memory (zero.py), activation memory, optimizer time."""
    from perfcheck.predict import zero

    pp, m = cfg.pp.astype(float), cfg.micro_batches.astype(float)
    per_stage, one = model.layers / pp, pp == 1
    params = out["params"]
    p_layer, p_first, p_last = _select(params, lay), _select(params, first), _select(params, last)
    p_stage_first = per_stage * p_layer + p_first + np.where(one, p_last, 0.0)
    p_stage_last = per_stage * p_layer + p_last + np.where(one, p_first, 0.0)
    # activations kept per micro-batch per layer, by recompute mode (Korthikanti et al. 2022, Table 2)
    act = out["act_mem"]
    full_layer = _select(act, lay)
    if opts.recompute == "full":
        layer_input = cfg.micro_batch * cfg.seq * model.hidden * elem_bytes(dtype) / act_split(cfg, opts)
        kept, rebuilt = layer_input, full_layer  # one layer's activations rebuilt during its backward
    elif opts.recompute == "selective":
        kept, rebuilt = full_layer - _select(out["recomputed_act"], lay), _select(out["recomputed_act"], lay)
    else:
        kept, rebuilt = full_layer, 0.0
    res["act_per_layer_bytes"] = kept * np.ones(len(pp))
    in_flight = np.where(one, 1.0, np.minimum(pp, m))  # 1F1B: the first stage holds pp micro-batches
    act_first = in_flight * (per_stage * kept + _select(act, first)) + np.where(one, _select(act, last), 0.0) + rebuilt
    act_last = per_stage * kept + _select(act, last) + np.where(one, _select(act, first), 0.0) + rebuilt
    micro_steps = np.where(one, cfg.micro_batches * cfg.grad_accum_steps, cfg.grad_accum_steps)
    prec = zero.precision(dtype, opts.optimizer, opts.master_weights, stage=cfg.zero_stage)
    states = {}
    for name, p_stage, act_stage in (("first", p_stage_first, act_first), ("last", p_stage_last, act_last)):
        mem = zero.memory_per_rank(p_stage, cfg.zero_stage, cfg.dp, precision_=prec)
        states[name] = (p_stage, mem, act_stage, mem["total"] + act_stage)
    pick_first = states["first"][3] >= states["last"][3]
    for i, key in ((0, "params_per_gpu"), (2, "mem_activations_bytes"), (3, "mem_total_bytes")):
        res[key] = np.where(pick_first, states["first"][i], states["last"][i])
    for k in ("params", "grads", "optimizer"):
        res[f"mem_{k}_bytes"] = np.where(pick_first, states["first"][1][k], states["last"][1][k])
    res["mem_fits"] = res["mem_total_bytes"] <= spec.mem_capacity_bytes
    # DP / ZeRO collectives of the stage with the most parameters (stages communicate concurrently)
    p_comm = np.maximum(p_stage_first, p_stage_last)
    colls = zero.step_comm(p_comm, cfg.zero_stage, cfg.dp, micro_steps=micro_steps, dtype=dtype, precision_=prec)
    for kind in ("allreduce", "allgather", "reducescatter"):
        res[f"dp_{kind}_bytes"] = sum((np.asarray(c.bytes, dtype=float) for c in colls if c.kind == kind),
                                      np.zeros(len(pp)))
    dp_spans = (cfg.dp > 1) & (cfg.tp * cfg.dp > spec.gpus_per_node)
    t = zero.comm_time_s(colls, cfg.dp, spec, spans_nodes=dp_spans)
    res["dp_comm_total_s"] = t["fwd"] + t["bwd"] + t["step"]
    # fwd/bwd collectives can hide behind compute; the post-step parameter all-gather cannot
    res["dp_comm_time_s"] = (1 - opts.dp_overlap) * (t["fwd"] + t["bwd"]) + t["step"]
    res["optimizer_time_s"] = zero.optimizer_time_s(p_comm, cfg.zero_stage, cfg.dp, spec, precision_=prec)


def step_summary(model, batch, seq, parallel, system, dtype, opts) -> StepSummary:
    """Step totals of one layout (see ``transformer_step``)."""
    totals = step_arrays(model, Layouts.single(parallel, batch, seq), system, dtype, opts)
    return StepSummary({k: np.asarray(totals[k])[0].item() for k in STEP_COLUMNS}, model.name, parallel.to_dict())
