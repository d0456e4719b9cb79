"""The transformer front-end: a model described by a dozen numbers -> per-sublayer table, whole-step
totals, and vectorised layout sweeps. Same formulas as the module estimator (``formulas.py``);
sharding and TP collectives in ``sharding.py``; step totals (pipeline bubble, ZeRO, memory, MFU) in
``step.py``. Deliberate differences from the transformer-perf-estimates notebook it started from
(Subramanian et al. 2024, arXiv 2410.00273) are listed in docs/transformer.md.

    >>> import perfcheck
    >>> table = perfcheck.estimate_transformer("gpt3-175b", parallel=dict(tp=8, sp=True, dp=128, zero_stage=1))
    >>> step = transformer_step("gpt3-175b", parallel=dict(tp=8, sp=True, dp=128, zero_stage=1))
    >>> step.to_frame()

Model files (``perfcheck/predict/model_files/*.json``, ``configs/models`` links there) hold the keys of
``TransformerModel`` and a source per field; unknown keys are a ``UserError`` naming them.
"""
from __future__ import annotations

import dataclasses
import json
import os
import types
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from perfcheck.errors import UserError, check_keys, parse_json, plain
from perfcheck.predict import sharding, step as steps
from perfcheck.parallel import ParallelConfig
from perfcheck.hardware.systems import load_system

NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "swiglu")
POSITIONS = ("learned", "rotary")
_INT_FIELDS = ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len")
_BOOL_FIELDS = ("bias", "tied_embeddings")
_REQUIRED = ("name",) + _INT_FIELDS + ("norm", "activation") + _BOOL_FIELDS
_MOE_FIELDS = ("kv_heads", "experts", "top_k", "capacity_factor", "shared_experts")
_OPTIONAL = ("description", "position", "dropout", "sources") + _MOE_FIELDS
ARCH_FIELDS = _INT_FIELDS + ("norm", "activation") + _BOOL_FIELDS + ("position", "dropout")
#: Keys ``sources`` may cite: every architecture field, and the GQA/MoE ones where a file sets them.
SOURCED_FIELDS = ARCH_FIELDS + _MOE_FIELDS


@dataclasses.dataclass(frozen=True)
class TransformerModel:
    """A GPT/Llama-style decoder: pre-norm layers of self-attention and an MLP.

    ``ffn_hidden``: the MLP's inner size f (SwiGLU: each of gate and up is f wide).
    ``position``: "learned" absolute embeddings (GPT) or "rotary" (Llama).
    ``dropout``: probability of the attention/hidden/embedding dropouts; 0 drops their rows.
    ``kv_heads``: key/value heads (grouped-query attention, Ainslie et al. 2023; default ``heads``,
    i.e. multi-head attention; 1 is multi-query attention).
    ``experts``: 0 for a dense MLP, else a mixture-of-experts MLP of ``experts`` experts of width
    ``ffn_hidden``, each token routed to ``top_k`` of them by a linear router (Shazeer et al. 2017;
    Mixtral: 8 experts, top 2). ``capacity_factor``: tokens an expert processes relative to a
    perfectly balanced share (1.0: balanced, the expected work of dropless routing; 1.25: GShard's
    padded capacity). ``shared_experts``: experts every token goes through (DeepSeekMoE).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    norm: str = "layernorm"
    activation: str = "gelu"
    bias: bool = True
    tied_embeddings: bool = True
    position: str = "learned"
    dropout: float = 0.0
    kv_heads: int = None
    experts: int = 0
    top_k: int = 1
    capacity_factor: float = 1.0
    shared_experts: int = 0
    description: str = ""
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        where = f"model {self.name!r}"
        for f in _INT_FIELDS + _BOOL_FIELDS + _MOE_FIELDS + ("dropout",):
            object.__setattr__(self, f, plain(getattr(self, f)))
        for f in _INT_FIELDS:
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{where}: {f} must be a positive integer, got {v!r}")
        for f, allowed in (("norm", NORMS), ("activation", ACTIVATIONS), ("position", POSITIONS)):
            if getattr(self, f) not in allowed:
                raise UserError(f"{where}: {f} must be one of {', '.join(allowed)}, got {getattr(self, f)!r}")
        for f in _BOOL_FIELDS:
            if not isinstance(getattr(self, f), bool):
                raise UserError(f"{where}: {f} must be true or false, got {getattr(self, f)!r}")
        d = self.dropout
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d < 1:
            raise UserError(f"{where}: dropout must be a probability in [0, 1), got {d!r}")
        if self.hidden % self.heads:
            raise UserError(f"{where}: heads = {self.heads} does not divide hidden = {self.hidden}")
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for f in ("kv_heads", "top_k"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{where}: {f} must be a positive integer, got {v!r}")
        for f in ("experts", "shared_experts"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise UserError(f"{where}: {f} must be a non-negative integer, got {v!r}")
        if self.heads % self.kv_heads:
            raise UserError(f"{where}: kv_heads = {self.kv_heads} does not divide heads = {self.heads}")
        if self.experts and self.top_k > self.experts:
            raise UserError(f"{where}: top_k = {self.top_k} exceeds experts = {self.experts}")
        cf = self.capacity_factor
        if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not cf > 0:
            raise UserError(f"{where}: capacity_factor must be a positive number, got {cf!r}")
        if not isinstance(self.sources, Mapping) or any(k not in SOURCED_FIELDS for k in self.sources):
            bad = [k for k in self.sources if k not in SOURCED_FIELDS] if isinstance(self.sources, Mapping) else [self.sources]
            raise UserError(f"{where}: sources has key(s) naming no field: "
                            f"{', '.join(map(repr, bad))}")
        object.__setattr__(self, "sources", types.MappingProxyType(dict(self.sources)))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_dict(cls, data, where="model") -> "TransformerModel":
        if not isinstance(data, dict):
            raise UserError(f"{where}: expected a JSON object, got {type(data).__name__}")
        check_keys(data, _REQUIRED + _OPTIONAL, _REQUIRED, where, "the model")
        return cls(**data)

    def __hash__(self):
        return hash(json.dumps(self.to_json_dict(), sort_keys=True))

    def to_json_dict(self) -> dict:
        """Plain JSON-ready dict in the file format; ``TransformerModel.from_dict`` of it gives an equal model."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["sources"] = dict(self.sources)
        return out


def _models_dir():
    return resources.files("perfcheck.predict") / "model_files"


@lru_cache(maxsize=1)
def _builtin_names() -> tuple:
    return tuple(sorted(p.name[:-5] for p in _models_dir().iterdir() if p.name.endswith(".json")))


def list_models() -> list:
    """Names of the built-in model files, sorted."""
    return list(_builtin_names())




@lru_cache(maxsize=None)
def _builtin(name: str) -> TransformerModel:
    return TransformerModel.from_dict(parse_json((_models_dir() / f"{name}.json").read_text(), f"{name}.json"),
                                      f"{name}.json")


def load_model(model) -> TransformerModel:
    """A ``TransformerModel`` from a built-in name ("gpt3-175b"), a JSON path, a dict, or a model."""
    if isinstance(model, TransformerModel):
        return model
    if isinstance(model, Mapping):
        return TransformerModel.from_dict(dict(model))
    if not isinstance(model, (str, os.PathLike)):
        raise UserError(f"model must be a name, a JSON path, a dict or a TransformerModel, got {type(model).__name__}")
    text = os.fspath(model)
    if text.strip().lower() in _builtin_names():
        return _builtin(text.strip().lower())
    path = Path(text).expanduser()
    if not path.is_file():
        raise UserError(f"unknown model {text!r} (known: {', '.join(list_models())}; or give a path to a JSON file)")
    try:
        content = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read model file {text!r}: {exc}") from None
    return TransformerModel.from_dict(parse_json(content, str(path)), str(path))


# ---- parallel layouts --------------------------------------------------------------------------
TP_SCHEMES = {"1d": "Megatron 1D tensor parallelism (Shoeybi et al. 2019)",
              "2d": "2D tensor parallelism (Optimus, Xu et al. 2021)",
              "2.5d": "2.5D tensor parallelism (Tesseract, Wang et al. 2021)",
              "3d": "3D tensor parallelism (Bian et al. 2021)"}


def _parallel(parallel) -> ParallelConfig:
    if parallel is None:
        return ParallelConfig()
    if isinstance(parallel, ParallelConfig):
        return parallel
    return ParallelConfig.from_mapping(parallel)


def check_tp_scheme(tp_scheme: str) -> str:
    """The scheme's canonical name ("1d", "2d", "2.5d", "3d"); anything else is a UserError."""
    scheme = str(tp_scheme).lower()
    if scheme not in TP_SCHEMES:
        raise UserError(f"tp_scheme must be one of {', '.join(TP_SCHEMES)}, got {tp_scheme!r}")
    return scheme


def check_layout(model: TransformerModel, parallel: ParallelConfig, seq: int, tp_scheme: str = "1d",
                 tp_depth: int = 1, batch: int = 1):
    """Raise UserError (naming the field) when ``model`` cannot be split as ``parallel`` says.

    Megatron 1D TP splits heads, hidden, ffn_hidden and kv_heads over tp (whole key/value heads
    per rank); SP splits the sequence; pipeline stages hold layers/pp layers each. The grid schemes
    need tp = q*q (2D), q*q*tp_depth (2.5D) or q**3 (3D) and split heads, features and the batch
    over the grid (``sharding.grid_problems``).
    """
    scheme = check_tp_scheme(tp_scheme)
    if scheme != "1d":
        parallel.validate_for_model(seq_len=seq, layers=model.layers)
        for bad, message in sharding.grid_problems(model, parallel.tp, scheme, tp_depth, batch, parallel.sp):
            if np.any(bad):
                depth = f", tp_depth = {tp_depth}" if scheme == "2.5d" else ""
                raise UserError(f"parallel config: {message} (got tp = {parallel.tp}{depth}, batch = {batch})")
        return
    parallel.validate_for_model(num_heads=model.heads, hidden=model.hidden, seq_len=seq, layers=model.layers)
    if model.ffn_hidden % parallel.tp:
        raise UserError(f"parallel config: tp = {parallel.tp} does not divide ffn_hidden = {model.ffn_hidden}")
    if model.kv_heads % parallel.tp:
        raise UserError(f"parallel config: tp = {parallel.tp} does not divide kv_heads = {model.kv_heads}")


def _positive_int(value, field):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise UserError(f"{field} must be a positive integer, got {value!r}")
    return int(value)


def _setup(model, batch, seq, parallel, tp_scheme, options):
    """Validated (model, batch, seq, parallel, Options); ``tp_scheme`` travels inside the Options."""
    scheme = check_tp_scheme(tp_scheme)
    model = load_model(model)
    batch = _positive_int(batch, "batch")
    seq = model.seq_len if seq is None else _positive_int(seq, "seq")
    if model.position == "learned" and seq > model.seq_len:
        raise UserError(f"seq = {seq} exceeds the model's seq_len = {model.seq_len} (learned position embeddings)")
    parallel = _parallel(parallel)
    opts = steps.make_options(tp_scheme=scheme, **options)
    check_layout(model, parallel, seq, scheme, opts.tp_depth, batch)
    steps.check_ep(model, opts)
    return model, batch, seq, parallel, opts


# ---- public API --------------------------------------------------------------------------------
def estimate_transformer(model="gpt2-124m", *, batch: int = 1, seq: int = None, parallel=None,
                         system="h100-sxm", dtype="bf16", tp_scheme: str = "1d", **options) -> pd.DataFrame:
    """Per-sublayer table of one training micro-step on one GPU (SI units), one row per sublayer.

    model: a built-in name (``list_models()``), a JSON path, a dict or a ``TransformerModel``.
    batch: micro-batch size per GPU; seq: sequence length (default the model's seq_len).
    parallel: a ``ParallelConfig`` or a mapping of its fields (tp, sp, pp, dp, zero_stage,
    micro_batches, grad_accum_steps); validated against the model (UserError naming the field).
    system: a name from ``perfcheck systems``, a path or a SystemSpec; dtype: activations/weights.
    tp_scheme: "1d" (Megatron), "2d" (Optimus: tp = q*q), "2.5d" (Tesseract: tp = q*q*tp_depth) or
    "3d" (tp = q**3); ``sharding.grid_linear`` and docs/transformer.md give the per-GPU split.
    options (``step.Options``): tp_depth (2.5D's d), causal (halve the score matmuls), flash (one fused attention row),
    recompute ("none" | "selective" | "full"), recompute_every (with "full": every Nth layer only), tp_overlap and dp_overlap (hidden fraction of
    communication, default 0), tp_async_backward (Megatron-LM's column-parallel backward collectives beside
    a GEMM, exposed only beyond it; default False), optimizer ("adam" | "sgd"), master_weights (fp32 copy, default True).

    Rows: the sublayers of ONE transformer layer (``stage`` = "layer", ``count`` = layers/pp), then
    the embedding rows (``stage`` = "first") and the head rows (``stage`` = "last"). Columns are
    documented in ``TABLE_COLUMNS`` (SI units: FLOPs, bytes, seconds).
    """
    model, batch, seq, parallel, opts = _setup(model, batch, seq, parallel, tp_scheme, options)
    return sublayer_table(model, batch, seq, parallel, load_system(system), dtype, opts)


def transformer_step(model="gpt2-124m", *, batch: int = 1, seq: int = None, parallel=None,
                     system="h100-sxm", dtype="bf16", tp_scheme: str = "1d", **options) -> "steps.StepSummary":
    """Whole-step totals on one GPU (step time, exposed communication, bubble, memory, MFU).

    Same arguments as ``estimate_transformer``; returns a ``step.StepSummary`` (``.to_frame()``).
    """
    model, batch, seq, parallel, opts = _setup(model, batch, seq, parallel, tp_scheme, options)
    return steps.step_summary(model, batch, seq, parallel, load_system(system), dtype, opts)


LAYOUT_REQUIRED = ("tp", "pp", "dp", "zero_stage", "micro_batch")
LAYOUT_OPTIONAL = {"sp": False, "micro_batches": 1, "grad_accum_steps": 1, "seq": None, "virtual_stages": None,
                   "cp": None}


def sweep_transformer(model, layouts: pd.DataFrame, *, system="h100-sxm", dtype="bf16", tp_scheme: str = "1d",
                      **options) -> pd.DataFrame:
    """Whole-step totals for every row of ``layouts`` at once (numpy over the configs).

    layouts: columns tp, pp, dp, zero_stage, micro_batch (required) and sp, micro_batches,
    grad_accum_steps, seq (optional; defaults False, 1, 1, the model's seq_len). Returns the
    layouts with the ``step.STEP_COLUMNS`` appended. A row the model cannot be split by raises
    UserError naming the row and the field.
    """
    model = load_model(model)
    if not isinstance(layouts, pd.DataFrame):
        raise UserError(f"layouts must be a pandas DataFrame, got {type(layouts).__name__}")
    unknown = [c for c in layouts.columns if c not in LAYOUT_REQUIRED and c not in LAYOUT_OPTIONAL]
    missing = [c for c in LAYOUT_REQUIRED if c not in layouts.columns]
    if unknown or missing:
        raise UserError("layouts: " + (f"unknown column(s) {', '.join(map(repr, unknown))}" if unknown else
                                        f"missing column(s) {', '.join(map(repr, missing))}") +
                        f" (required: {', '.join(LAYOUT_REQUIRED)}; optional: {', '.join(LAYOUT_OPTIONAL)})")
    opts = steps.make_options(tp_scheme=check_tp_scheme(tp_scheme), **options)
    cols = {c: layouts[c].to_numpy() for c in LAYOUT_REQUIRED}
    for c, default in LAYOUT_OPTIONAL.items():
        value = model.seq_len if c == "seq" else getattr(opts, c) if default is None else default
        cols[c] = layouts[c].to_numpy() if c in layouts.columns else np.full(len(layouts), value)
    cfg = steps.validate_layouts(model, cols, opts)
    steps.check_ep(model, opts)
    totals = steps.step_arrays(model, cfg, load_system(system), dtype, opts)
    out = layouts.reset_index(drop=True).copy()
    for name in steps.STEP_COLUMNS:
        out[name] = totals[name]
    return out


# ---- per-sublayer table ----------------------------------------------------------------------------
TABLE_COLUMNS: Mapping[str, str] = {
    "sublayer": "sublayer name (docs/transformer.md lists them)",
    "stage": "layer (once per transformer layer) | first (first pipeline stage) | last (last stage)",
    "count": "instances on this GPU per micro-batch: layers/pp for layer rows, 1 otherwise",
    "formula": "the perfcheck.predict.formulas function that costs the row",
    "params": "parameters this GPU holds for the row (TP-sharded; before ZeRO partitioning)",
    "macs_fwd": "matrix multiply-accumulates, forward", "macs_bwd": "matrix multiply-accumulates, backward",
    "flops_fwd": "all FLOPs, forward: 2*macs + other FLOPs (a k-term dot product is 2k)",
    "flops_bwd": "all FLOPs, backward",
    "bytes_fwd": "device-memory bytes read + written, forward", "bytes_bwd": "same, backward",
    "kernels_fwd": "kernel launches, forward", "kernels_bwd": "kernel launches, backward",
    "act_mem": "bytes of activations kept for backward (recompute not applied; see the step summary)",
    "weight_mem": "bytes of this GPU's weights for the row after ZeRO-3 partitioning",
    "grad_mem": "bytes of this GPU's gradients for the row after ZeRO-2/3 partitioning",
    "comm_fwd_bytes": "full-buffer bytes of the row's TP collectives, forward (nccl-tests size convention)",
    "comm_bwd_bytes": "same, backward",
    "comm_fwd_kind": "'+'-joined collective kinds in forward ('' if none)", "comm_bwd_kind": "same, backward",
    **{f"t_{k}_{p}_s": d.format(p=p) for p in ("fwd", "bwd") for k, d in (
        ("compute", "{p} FLOPs at achievable matrix/vector rates, seconds"),
        ("memory", "{p} bytes at achievable memory bandwidth, seconds"),
        ("overhead", "{p} kernel launches x launch overhead, seconds"),
        ("comm", "{p} TP collective time (before overlap), seconds"))},
    "pred_fwd_s": "device time (roofline.device_times) + (1 - tp_overlap) * comm, forward, seconds (with "
                  "tp_async_backward a backward collective beside a GEMM counts only beyond what the GEMM hides)",
    "pred_bwd_s": "same, backward",
    "bound_fwd": "compute | memory | overhead | comm: what limits pred_fwd_s", "bound_bwd": "same, backward",
}


def _kinds(out, phase, i):
    return "+".join(k for k in sharding.SUBLAYER_KINDS if out[f"comm_{phase}_{k}"][i, 0] > 0)


def sublayer_table(model, batch, seq, parallel, system, dtype, opts) -> pd.DataFrame:
    """The per-sublayer table of one layout (see ``estimate_transformer``)."""
    from perfcheck.predict import zero

    out = steps.evaluate(model, steps.single_layout(model, parallel, batch, seq, opts), system, dtype, opts)
    stage = out["stage"]
    col = {"count": np.where(stage == "layer", model.layers // parallel.pp, 1), "params": out["params"][:, 0],
           "act_mem": out["act_mem"][:, 0]}
    for p in ("fwd", "bwd"):
        col[f"flops_{p}"] = 2 * out[f"macs_{p}"][:, 0] + out[f"flops_{p}"][:, 0]
        col[f"comm_{p}_bytes"] = sum(out[f"comm_{p}_{k}"][:, 0] for k in sharding.SUBLAYER_KINDS)
        for f in ("macs", "bytes", "kernels"):
            col[f"{f}_{p}"] = out[f"{f}_{p}"][:, 0]
        for k in ("compute", "memory", "overhead", "comm"):
            col[f"t_{k}_{p}_s"] = out[f"t_{k}_{p}_s"][:, 0]
        col[f"pred_{p}_s"] = out[f"pred_{p}_s"][:, 0]
    mem = zero.memory_per_rank(col["params"], int(parallel.zero_stage), parallel.dp, dtype=dtype,
                               optimizer=opts.optimizer, master_weights=opts.master_weights)
    col["weight_mem"], col["grad_mem"] = mem["params"], mem["grads"]
    col["sublayer"], col["stage"], col["formula"] = out["name"], stage, out["formula"]
    rows = range(len(stage))
    for p in ("fwd", "bwd"):
        col[f"comm_{p}_kind"] = [_kinds(out, p, i) for i in rows]
        col[f"bound_{p}"] = out[f"bound_{p}"][:, 0]
    return pd.DataFrame({c: col[c] for c in TABLE_COLUMNS})  # one dict: the fastest constructor here
