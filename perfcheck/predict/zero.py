"""DeepSpeed ZeRO per step: collectives (kind, bytes, count, phase), memory per rank, step time.

Pure arithmetic over numbers (numpy arrays broadcast wherever a scalar is accepted), used by the
module estimator (``module_comm``), the transformer front-end (``step_comm_bytes``,
``memory_per_rank``) and ``perfcheck compare`` (``estimate_zero``). Notation:

    P  parameters (elements; ZeRO-3 aware: ``ds_numel``)   N  data-parallel ranks (dp)
    G  micro-steps per optimizer step (gradient accumulation)
    b_p bytes per parameter in the model dtype, b_g bytes per gradient element communicated
    K  optimizer bytes per parameter: fp32 master copy (4) + optimizer states (Adam m, v: 8)

Collective sizes are the FULL buffer S of nccl-tests (``collectives.py``): the tensor for
allreduce, the gathered output for allgather, the unreduced input for reducescatter. A rank
sends/receives ``S * bus_factor`` (allreduce 2(N-1)/N, allgather/reducescatter (N-1)/N).

What DeepSpeed 0.19.8 issues per optimizer step (read in deepspeed/runtime/engine.py
``allreduce_gradients``, zero/stage_1_and_2.py, zero/stage3.py, zero/partition_parameters.py,
zero/partitioned_param_coordinator.py; every line checked with the comms logger on 2 CPU ranks,
tests/e2e/test_deepspeed_sweep.py):

    stage 0  bwd   allreduce S = P*b_g, once per step (boundary micro-step), 5e8-element buckets
    stage 1  bwd   allreduce S = P*b_g, once per step (``reduce_gradients`` at the boundary)
             step  allgather S = pad(P, 2N)*b_p (updated 16-bit params; one call per param group)
    stage 2  bwd   allreduce S = P*b_g on EVERY micro-step (G per step), else as stage 1
    stage 3  fwd   allgather S = sum_i N*ceil(n_i/N)*b_p of non-persistent params, every micro-step
             bwd   allgather of the params released after forward (outside the reuse window)
             bwd   reducescatter S = sum_i N*ceil(n_i/N)*b_g, every micro-step
             step  allgather S = N*ceil(n_i/N)*b_p per persistent tensor (one call each)
    scalars  step  allreduce: grad norm 4 B (8 B under stage 3), fp16/bf16 overflow flag 1 B
                   (stages 1-2), ``clip_grad_norm_`` 4 B (stage 0, fp32, gradient_clipping > 0)

NB(perfcheck): DeepSpeed 0.19.8 reduces ZeRO-1/2 gradients with an ALLREDUCE of each bucket
(``use_multi_rank_bucket_allreduce=True`` by default; ``allreduce_and_scatter``), not the
reduce-scatter of the ZeRO paper, so stages 1-2 move 2(N-1)/N + (N-1)/N = 1.5x stage 0's bytes
per rank where the paper (Rajbhandari et al. 2020, sec. 7) has 2Psi for stages 0-2 and 3Psi for 3.
NB(perfcheck): ZeRO-3 keeps tensors of <= 1e5 elements (``stage3_param_persistence_threshold``)
resident on every rank and never gathers them in fwd/bwd; a model whose every tensor is that
small (the example LeNet, 62,006 params) has no fwd/bwd allgathers at all under default settings.
Where these terms enter the predicted times: docs/model.md (sections 5 and 6).
"""
from __future__ import annotations

import dataclasses
import math
import sys
from typing import Mapping, Optional, Sequence

import numpy as np

from perfcheck.errors import UserError
from perfcheck.hardware.systems import element_bytes, normalize_dtype, spec_of
from perfcheck.predict import deepspeed_step
from perfcheck.predict.collectives import batch_time_s, bus_factor, straggler_wait_s
from perfcheck.predict.roofline import memory_time_s

#: The ZeRO collective kinds: those this model emits (a subset of collectives.COLLECTIVE_KINDS, the one list of
#: kinds); the ZeRO comparison (analysis.stages, analysis.answers, analysis.layouts) reads them from here.
KINDS = ("allreduce", "allgather", "reducescatter", "reduce")
PHASES = ("fwd", "bwd", "step")
#: fp32 optimizer-state bytes per parameter (besides the master copy).
OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "lamb": 8, "sgd": 0, "sgd_momentum": 4, "adagrad": 4, "lion": 4}


# ------------------------------------------------------------------------------------ inputs
def validate_stage(stage) -> np.ndarray:
    """ZeRO stage(s) as an int array; anything but 0-3 raises UserError."""
    arr = np.asarray(stage.value if hasattr(stage, "value") and not isinstance(stage, np.ndarray) else stage)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number) or np.any(arr != np.floor(arr)) \
            or np.any((arr < 0) | (arr > 3)):
        raise UserError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    return arr.astype(int)


def _positive(value, name: str, integer: bool = True) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number) or np.any(arr < 1) \
            or (integer and np.any(arr != np.floor(arr))):
        raise UserError(f"{name} must be {'an integer ' if integer else ''}>= 1, got {value!r}")
    return arr.astype(float)


def _nonneg(value, name: str) -> np.ndarray:
    arr = np.asarray(value, dtype=float) if not isinstance(value, bool) else None
    if arr is None or np.any(~np.isfinite(arr)) or np.any(arr < 0):
        raise UserError(f"{name} must be a finite number >= 0, got {value!r}")
    return arr


@dataclasses.dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each model state (the ZeRO paper's 2 + 2 + K with K = 12 for Adam)."""

    param_bytes: float = 2.0  # b_p: the model's (16-bit) weights
    grad_bytes: float = 2.0  # b_g: gradients as stored and communicated
    master_bytes: float = 4.0  # fp32 master weights kept by the optimizer (0: none)
    state_bytes: float = 8.0  # optimizer states (Adam: fp32 momentum + variance)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            _nonneg(getattr(self, f.name), f.name)

    @property
    def optimizer_bytes(self) -> float:
        """K of the ZeRO paper."""
        return self.master_bytes + self.state_bytes


def precision(dtype="bf16", optimizer: str = "adam", master_weights: Optional[bool] = None, stage=1) -> Precision:
    """Precision for a model dtype and optimizer as DeepSpeed runs them.

    master_weights None = DeepSpeed's choice: an fp32 master copy with 16-bit weights, and with
    fp32 weights under ZeRO >= 1 (the optimizer updates its own fp32 partition,
    ``single_partition_of_fp32_groups``); none for fp32 under stage 0 (FusedAdam updates in place).
    """
    b = element_bytes(dtype)
    key = str(optimizer).lower().replace("-", "_")
    if key not in OPTIMIZER_STATE_BYTES:
        raise UserError(f"optimizer: unknown {optimizer!r} (known: {', '.join(OPTIMIZER_STATE_BYTES)})")
    if master_weights is None:
        master = np.where((b < 4) | (validate_stage(stage) >= 1), 4.0, 0.0)
    else:
        master = 4.0 if master_weights else 0.0
    master = float(master) if np.ndim(master) == 0 else master
    return Precision(float(b), float(b), master, float(OPTIMIZER_STATE_BYTES[key]))


@dataclasses.dataclass(frozen=True)
class ZeroSettings:
    """The DeepSpeed knobs that change what is communicated; defaults are DeepSpeed 0.19.8's."""

    reduce_bucket_size: float = 5e8
    allgather_bucket_size: float = 5e8
    prefetch_bucket_size: float = 5e7  # stage3_prefetch_bucket_size
    param_persistence_threshold: float = 1e5  # stage3_param_persistence_threshold
    model_persistence_threshold: float = float(sys.maxsize)  # stage3_model_persistence_threshold
    max_reuse_distance: float = 1e9  # stage3_max_reuse_distance
    use_multi_rank_bucket_allreduce: bool = True
    reduce_scatter: bool = True
    gradient_clipping: float = 1.0

    _ALIASES = {"stage3_prefetch_bucket_size": "prefetch_bucket_size",
                "stage3_param_persistence_threshold": "param_persistence_threshold",
                "stage3_model_persistence_threshold": "model_persistence_threshold",
                "stage3_max_reuse_distance": "max_reuse_distance"}

    @classmethod
    def from_deepspeed_config(cls, config: Mapping) -> "ZeroSettings":
        """Read the knobs from a DeepSpeed config dict (other keys are DeepSpeed's to validate)."""
        zero = dict(config.get("zero_optimization") or {})
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {}
        for key, value in zero.items():
            name = cls._ALIASES.get(key, key)
            if name in names:
                kw[name] = value
        if "gradient_clipping" in config:
            kw["gradient_clipping"] = config["gradient_clipping"]
        return cls(**kw)


def dtype_from_deepspeed_config(config: Mapping) -> str:
    for key, name in (("bf16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16")):
        if (config.get(key) or {}).get("enabled"):
            return name
    return "fp32"


# ----------------------------------------------------------------------------------- layout
@dataclasses.dataclass(frozen=True)
class Layout:
    """Parameter tensors (elements, ``ds_numel``) grouped by the module that owns them directly,
    modules in forward execution order; what ZeRO-3's fetch/release and persistence depend on."""

    modules: tuple  # tuple of tuples of tensor numels

    @property
    def params(self) -> int:
        return int(sum(sum(m) for m in self.modules))


def layout(modules: Sequence[Sequence[int]]) -> Layout:
    mods = tuple(tuple(int(n) for n in m) for m in modules)
    if any(n < 0 for m in mods for n in m):
        raise UserError("layout: tensor sizes must be >= 0")
    return Layout(mods)


def layout_from_module(module) -> Layout:
    """Layout of an nn.Module (registration order; ``ds_numel`` under ZeRO-3; shared tensors once)."""
    seen, mods = set(), []
    for m in module.modules():
        own = []
        for p in m.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                own.append(int(getattr(p, "ds_numel", 0) or p.numel()))
        if own:
            mods.append(own)
    return Layout(tuple(tuple(m) for m in mods))


def _shard_padded(n, dp):
    """N * ceil(n / N): a tensor's size once ZeRO-3 pads it to split evenly (partition_parameters.py)."""
    return dp * np.ceil(np.asarray(n, dtype=float) / dp)


def persistent_flags(lay: Layout, settings: ZeroSettings, dp: float) -> list:
    """Per tensor: kept whole on every rank (``ds_persist``), in creation order, as Init decides:
    ``ds_numel <= param_persistence_threshold`` while the persisted total stays within
    ``model_persistence_threshold // N``."""
    flags, total = [], 0
    budget = settings.model_persistence_threshold // dp
    for mod in lay.modules:
        row = []
        for n in mod:
            keep = n <= settings.param_persistence_threshold and total + n <= budget
            total += n if keep else 0
            row.append(keep)
        flags.append(row)
    return flags


# ------------------------------------------------------------------------------ collectives
@dataclasses.dataclass(frozen=True)
class Collective:
    """One line of a step's communication: ``count`` calls of ``kind`` totalling ``bytes`` (S)."""

    phase: str  # fwd | bwd | step
    kind: str
    bytes: object  # float or array: full buffer S summed over calls, per optimizer step
    count: object  # calls per optimizer step
    what: str  # what the collective moves (for notes)
    #: calls issued together (``async_op=True``) and waited together: 1 = each call issued and waited
    #: before the next (a blocking collective); ``count / batch`` batches per step, each one wait.
    batch: object = 1.0

    @property
    def batches(self):
        """Waits per optimizer step: ``count / batch`` (0 where there are no calls)."""
        count, batch = np.asarray(self.count, dtype=float), np.asarray(self.batch, dtype=float)
        out = np.divide(count, np.maximum(batch, 1.0), out=np.zeros(np.broadcast(count, batch).shape),
                        where=count > 0)
        return out.item() if np.ndim(out) == 0 else out


def _stage3_module_bytes(lay: Layout, dp: float, settings: ZeroSettings, b_p: float):
    """Per module: (fwd allgather S, bwd allgather S) and the persistent tensors' step allgathers.

    A module's params gathered in forward stay resident until its backward when that backward
    comes within the reuse window: 2*tail < max_reuse_distance (tail = params of the modules after
    it; the trace walks the rest of forward then backward back to it,
    ``__params_to_release``) or tail_np < prefetch_bucket_size (the prefetcher reaches its backward
    use while the params are still available and marks them, ``fetch_sub_module``).
    NB(perfcheck): the prefetch lookahead is between 1 and 2 buckets; we take 1.
    """
    persist = persistent_flags(lay, settings, dp)
    full = np.array([float(sum(m)) for m in lay.modules])
    nonp = np.array([float(sum(n for n, k in zip(m, f) if not k)) for m, f in zip(lay.modules, persist)])
    gathered = np.array([float(sum(_shard_padded(n, dp) for n, k in zip(m, f) if not k))
                         for m, f in zip(lay.modules, persist)]) * b_p
    tail_all = full[::-1].cumsum()[::-1] - full
    tail_np = nonp[::-1].cumsum()[::-1] - nonp
    kept = (2 * tail_all < settings.max_reuse_distance) | (tail_np < settings.prefetch_bucket_size)
    bwd = np.where(kept, 0.0, gathered)
    step = [float(_shard_padded(n, dp)) * b_p for m, f in zip(lay.modules, persist) for n, k in zip(m, f) if k]
    return gathered, bwd, np.array(step), nonp


def step_comm(params=None, stage=0, dp=1, *, micro_steps=1, dtype="bf16", settings: ZeroSettings = None,
              layout: Layout = None, precision_: Precision = None) -> list:
    """Collectives of one optimizer step per rank (list of ``Collective``), as DeepSpeed 0.19.8 issues them.

    Give ``params`` (a count or an array of counts: no ZeRO-3 persistence, the reuse window taken
    as a continuum) or ``layout`` (exact: persistence and reuse per module, padding per tensor).
    """
    settings = settings or ZeroSettings()
    st = validate_stage(stage)
    n = _positive(dp, "dp")
    g = _positive(micro_steps, "micro_steps (gradient accumulation steps)")
    if layout is None and params is None:
        raise UserError("step_comm: give params (a count) or layout")
    if layout is not None and np.ndim(st) > 0:
        raise UserError("step_comm: a layout needs one ZeRO stage, not an array")
    P = float(layout.params) if layout is not None else _nonneg(params, "params")
    prec = precision_ or precision(dtype, stage=np.max(st))
    b_p, b_g = prec.param_bytes, prec.grad_bytes
    multi = n > 1  # allgathers are skipped on a group of one rank
    out = []
    # gradients, stages 0-2: allreduce (or reduces to each owner) of P*b_g
    grad_calls = np.maximum(1.0, np.ceil(P / settings.reduce_bucket_size))
    grad_times = np.where(st == 2, g, 1.0)  # stage 2 reduces on every micro-step
    to_owner = (st >= 1) & (not settings.use_multi_rank_bucket_allreduce) & settings.reduce_scatter
    dp_grads = (st <= 2) & (P > 0)  # issued even on a group of one rank (dp = 1), moving nothing
    out.append(Collective("bwd", "allreduce", np.where(dp_grads & ~to_owner, grad_times * P * b_g, 0.0),
                          np.where(dp_grads & ~to_owner, grad_times * grad_calls, 0.0), "gradients (allreduce_bucket)"))
    out.append(Collective("bwd", "reduce", np.where(dp_grads & to_owner, grad_times * P * b_g, 0.0),
                          np.where(dp_grads & to_owner, grad_times * grad_calls * n, 0.0),
                          "gradients to their owner rank"))
    # stages 1-2: updated 16-bit params allgathered after the step, padded to a multiple of 2N
    pad = 2 * n * np.ceil(P / (2 * n))
    z12 = (st == 1) | (st == 2)
    out.append(Collective("step", "allgather", np.where(z12 & multi, pad * b_p, 0.0), np.where(z12 & multi, 1.0, 0.0),
                          "updated parameters (all_gather_into_tensor_dp_groups)"))
    out.extend(_stage3_comm(P, st, n, g, b_p, b_g, settings, layout))
    # scalar allreduces of the optimizer step (grad norm, overflow flag, clip_grad_norm_)
    low = b_p < 4
    scal_b = np.where(st == 3, 8.0, np.where(st >= 1, 4.0 + np.where(low, 1.0, 0.0),
                                             np.where(~low & (settings.gradient_clipping > 0), 4.0, 0.0)))
    scal_n = np.where(st == 3, 1.0, np.where(st >= 1, 1.0 + np.where(low, 1.0, 0.0), np.where(scal_b > 0, 1.0, 0.0)))
    out.append(Collective("step", "allreduce", scal_b, scal_n, "grad norm / overflow scalars"))
    return out


def _stage3_comm(P, st, n, g, b_p, b_g, settings, lay):
    is3 = st == 3
    if lay is not None and bool(np.all(is3)):
        gathers = float(n > 1)  # a group of one rank gathers nothing (_no_gather_coalesced)
        fwd, bwd, step, nonp = _stage3_module_bytes(lay, float(n), settings, b_p)
        fwd, bwd, step = fwd * gathers, bwd * gathers, step * gathers
        rs = float(sum(_shard_padded(t, float(n)) for m in lay.modules for t in m)) * b_g
        fwd_calls = (float(np.count_nonzero(fwd)) if settings.prefetch_bucket_size <= 0
                     else max(1.0, math.ceil(nonp.sum() / settings.prefetch_bucket_size)) if nonp.sum() > 0 else 0.0)
        bwd_calls = float(np.count_nonzero(bwd))
        prefetch = settings.prefetch_bucket_size > 0
        step_calls = float(np.count_nonzero(step))
        return [Collective("fwd", "allgather", g * fwd.sum(), g * fwd_calls, "ZeRO-3 parameters before forward",
                           batch=fwd_calls if prefetch and fwd_calls > 0 else 1.0),
                Collective("bwd", "allgather", g * bwd.sum(), g * bwd_calls,
                           "ZeRO-3 parameters re-gathered for backward",
                           batch=bwd_calls if prefetch and bwd_calls > 0 else 1.0),
                Collective("bwd", "reducescatter", g * rs,
                           g * max(1.0, math.ceil(rs / b_g / settings.reduce_bucket_size)),
                           "ZeRO-3 gradients (reduce_scatter_fn)"),
                Collective("step", "allgather", float(step.sum()), step_calls,
                           "ZeRO-3 persistent parameters after the step (async, waited together)",
                           batch=max(step_calls, 1.0))]
    # Continuum: params spread evenly in forward order; those within the last W elements of
    # forward stay resident for backward, W = max(max_reuse_distance / 2, prefetch_bucket_size).
    window = max(settings.max_reuse_distance / 2, settings.prefetch_bucket_size)
    S = P * b_p * (n > 1)
    bwd_ag = np.maximum(0.0, P - window) * b_p * (n > 1)
    zero = np.zeros_like(np.asarray(P * st, dtype=float))
    fwd_calls = np.maximum(1.0, np.ceil(P / max(settings.prefetch_bucket_size, 1)))
    return [Collective("fwd", "allgather", np.where(is3, g * S, zero), np.where(is3 & (S > 0), g * fwd_calls, zero),
                       "ZeRO-3 parameters before forward",
                       batch=fwd_calls if settings.prefetch_bucket_size > 0 else 1.0),
            Collective("bwd", "allgather", np.where(is3, g * bwd_ag, zero), np.where(is3 & (bwd_ag > 0), g, zero),
                       "ZeRO-3 parameters re-gathered for backward"),
            Collective("bwd", "reducescatter", np.where(is3, g * P * b_g, zero),
                       np.where(is3, g * np.maximum(1.0, np.ceil(P / settings.reduce_bucket_size)), zero),
                       "ZeRO-3 gradients (reduce_scatter_fn)"),
            Collective("step", "allgather", zero, zero, "ZeRO-3 persistent parameters after the step")]


def step_comm_bytes(params, stage, dp, *, micro_steps=1, dtype="bf16", settings: ZeroSettings = None) -> dict:
    """Bytes (S) per kind per optimizer step: {"allreduce", "allgather", "reducescatter", "reduce"}."""
    out = {k: 0.0 for k in KINDS}
    for c in step_comm(params, stage, dp, micro_steps=micro_steps, dtype=dtype, settings=settings):
        out[c.kind] = out[c.kind] + np.asarray(c.bytes, dtype=float)
    return {k: (v.item() if np.ndim(v) == 0 else v) for k, v in ((k, np.asarray(v)) for k, v in out.items())}


def wire_bytes(kind, S, dp):
    """Bytes a rank sends (= receives) for S: S * bus_factor (allreduce 2(N-1)/N, ...)."""
    return np.asarray(S, dtype=float) * bus_factor(kind, dp)


def module_comm(own_params, *, stage, dp, param_bytes=2, grad_bytes=2, settings: ZeroSettings = None) -> dict:
    """Per module (own parameters, forward order): collective bytes S in fwd and bwd of one micro-step.

    Returns arrays ``fwd_bytes``, ``bwd_bytes`` and labels ``kind`` ("allreduce" for stages 0-2,
    "allgather+reducescatter" for 3), ``fwd_kind``, ``bwd_kind`` (one kind each, for timing: the
    stage-3 backward's allgather and reducescatter share the bus factor (N-1)/N). Each module is
    one tensor here; ZeRO-3 persistence applies to it as a whole. Step-phase collectives
    (stage 1-2 parameter allgather) belong to no module: see ``step_comm``.
    """
    settings = settings or ZeroSettings()
    st = int(validate_stage(stage))
    n = float(_positive(dp, "dp"))
    own = _nonneg(own_params, "own_params").reshape(-1)
    if n == 1:
        z = np.zeros_like(own)
        return {"fwd_bytes": z, "bwd_bytes": z, "kind": "", "fwd_kind": "allgather", "bwd_kind": "allreduce"}
    if st < 3:
        return {"fwd_bytes": np.zeros_like(own), "bwd_bytes": own * grad_bytes, "kind": "allreduce",
                "fwd_kind": "allgather", "bwd_kind": "allreduce"}
    lay = Layout(tuple((int(x),) if x > 0 else () for x in own))
    fwd, bwd, _, _ = _stage3_module_bytes(lay, n, settings, param_bytes)
    rs = _shard_padded(own, n) * grad_bytes
    return {"fwd_bytes": fwd, "bwd_bytes": bwd + rs, "kind": "allgather+reducescatter",
            "fwd_kind": "allgather", "bwd_kind": "reducescatter"}


# ----------------------------------------------------------------------------------- memory
def memory_per_rank(params, stage, dp, *, dtype="bf16", optimizer: str = "adam", master_weights=None,
                    precision_: Precision = None, persistent_params=0) -> dict:
    """Model-state bytes per rank (Rajbhandari et al. 2020, Fig. 1), vectorised.

        params    b_p * P        (stage 3: b_p * P / N, plus b_p * P_persistent: a persistent tensor
                                  keeps its partition AND a whole copy on every rank)
        grads     b_g * P        (stages 2-3: b_g * P / N)
        optimizer K * P          (stages 1-3: K * P / N)
    Mixed-precision Adam (2 + 2 + 12): 16P, 4P + 12P/N, 2P + 14P/N, 16P/N for stages 0-3.
    """
    st = validate_stage(stage)
    n = _positive(dp, "dp")
    P = _nonneg(params, "params")
    prec = precision_ or precision(dtype, optimizer, master_weights, stage=st)
    k = prec.master_bytes + prec.state_bytes
    persist = _nonneg(persistent_params, "persistent_params")
    whole = np.where(n > 1, persist, 0.0)  # with dp = 1 the partition is the whole tensor
    out = {"params": np.where(st >= 3, prec.param_bytes * (P / n + whole), prec.param_bytes * P),
           "grads": np.where(st >= 2, prec.grad_bytes * P / n, prec.grad_bytes * P),
           "optimizer": np.where(st >= 1, k * P / n, k * P)}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return {key: (v.item() if np.ndim(v) == 0 else v) for key, v in out.items()}


# ------------------------------------------------------------------------------------- time
def comm_time_s(collectives, dp, system, spans_nodes=None) -> dict:
    """Seconds per phase: per line, ``count / batch`` batches of ``batch`` calls of S / count each,
    every batch timed by ``collectives.batch_time_s`` (alpha once per batch, ``collective_async_call_s`` per
    further call issued with it, every call's bytes; a batch of 1 is ``collective_time_s``: alpha + bytes)."""
    spec = spec_of(system)
    out = {ph: 0.0 for ph in PHASES}
    for c in collectives:
        count = np.asarray(c.count, dtype=float)
        per_call = np.divide(np.asarray(c.bytes, dtype=float), count, out=np.zeros(np.broadcast(count, c.bytes).shape),
                             where=count > 0)
        batch = np.minimum(np.maximum(np.asarray(c.batch, dtype=float), 1.0), np.maximum(count, 1.0))
        t = np.asarray(c.batches) * np.asarray(batch_time_s(c.kind, per_call, batch, dp, spec, spans_nodes=spans_nodes))
        out[c.phase] = out[c.phase] + np.where(count > 0, t, 0.0)
    return out


def sync_points(collectives, dp) -> dict:
    """Blocking waits per phase and optimizer step: each line's ``count / batch`` batches (a rank leaves a
    blocking collective, or the wait for a batch, only when every rank has entered it). 0 for one rank."""
    out = {ph: 0.0 for ph in PHASES}
    if float(np.max(np.asarray(dp, dtype=float))) <= 1:
        return out
    for c in collectives:
        b = np.asarray(c.batches, dtype=float)
        out[c.phase] = out[c.phase] + np.where(np.asarray(c.bytes, dtype=float) > 0, b, 0.0)
    return out


def optimizer_time_s(params, stage, dp, system, *, precision_: Precision, clip: bool = True,
                     loss_scaling: bool = False) -> object:
    """DeepSpeed's optimizer step on this rank's partition, memory-bound: FusedAdam's update and the passes of
    DeepSpeed's wrapper around it (overflow check, fp64 norm, flatten, cast, unscale/clip, copy back:
    ``deepspeed_step.passes``, checked op by op against DeepSpeed's own step), ``clip`` the config's
    gradient_clipping > 0 (DeepSpeed 0.19.8's default 1.0), ``loss_scaling`` fp16's dynamic scale:
    t = P_local * (sum of the passes' bytes) / (memory bandwidth * efficiency).
    A CPU's calibration times the engine's ``step()`` on chains of 16 x 16 layers (``calibrate.deepspeed_cases``):
    its per-tensor host costs, not these per-element passes (a few microseconds there)."""
    per_param = sum(deepspeed_step.passes(stage, precision_, loss_scaling=loss_scaling, clip=clip).values())
    return np.asarray(memory_time_s(optimizer_partition(params, stage, dp) * per_param, system))


def optimizer_partition(params, stage, dp) -> np.ndarray:
    """Parameters whose update this rank runs: params / dp from ZeRO stage 1 (the optimizer states are
    partitioned), all of them at stage 0."""
    return np.where(validate_stage(stage) >= 1, _nonneg(params, "params") / _positive(dp, "dp"),
                    _nonneg(params, "params"))


@dataclasses.dataclass(frozen=True)
class ZeroEstimate:
    """One ZeRO configuration predicted: collectives, model-state memory per rank, times per step."""

    stage: int
    dp: int
    micro_steps: int
    params: int
    precision: Precision
    collectives: tuple
    memory: dict
    times: dict

    def _sum_by_kind(self, field: str, phase: Optional[str]) -> dict:
        out = {k: 0.0 for k in KINDS}
        for c in self.collectives:
            if phase is None or c.phase == phase:
                out[c.kind] += float(getattr(c, field))
        return out

    def bytes_by_kind(self, phase: Optional[str] = None) -> dict:
        return self._sum_by_kind("bytes", phase)

    def count_by_kind(self, phase: Optional[str] = None) -> dict:
        return self._sum_by_kind("count", phase)


def estimate_zero(params=None, *, stage, dp, micro_steps=1, dtype="bf16", optimizer="adam", master_weights=None,
                  settings: ZeroSettings = None, layout: Layout = None, system="cpu", spans_nodes=None,
                  compute_fwd_s=0.0, compute_bwd_s=0.0, comm_overlap=0.0, host_s=None) -> ZeroEstimate:
    """Predict one optimizer step of ZeRO ``stage`` over ``dp`` ranks for a model of ``params`` elements
    (or a ``layout`` / nn.Module).

    compute_fwd_s, compute_bwd_s: one micro-batch's forward/backward compute on one rank (e.g. the
    root row of ``perfcheck.estimate`` without ``parallel``); the batch enters only through them.
    comm_overlap: fraction of fwd/bwd collective time hidden behind compute (0 on CPU/gloo).
    host_s: DeepSpeed's and the optimizer's host seconds per phase ({"fwd", "bwd", "optim"}, per
      micro-step for fwd/bwd: perfcheck.analysis.stages builds it with perfcheck.predict.host).
    Times per optimizer step:
        fwd  = G * (compute_fwd + host_fwd) + (1 - overlap) * t(fwd collectives) + wait(fwd syncs)
        bwd  = G * (compute_bwd + host_bwd) + (1 - overlap) * t(bwd collectives) + wait(bwd syncs)
        optim = optimizer_time_s + host_optim + t(step collectives) + wait(step syncs)
        step = fwd + bwd + optim
    t(collectives) prices each line's batches (``comm_time_s``: a blocking call alpha + bytes, an async batch
    one alpha + ``collective_async_call_s`` per further call + bytes); wait(syncs) is the expected wait for
    the latest rank at each blocking collective or waited batch (``sync_points``,
    ``collectives.straggler_wait_s``); ``times`` also holds ``<phase>_syncs`` and ``<phase>_wait_s``.
    """
    if layout is None and hasattr(params, "parameters"):
        layout = layout_from_module(params)
    st = int(validate_stage(stage))
    n = int(_positive(dp, "dp"))
    g = int(_positive(micro_steps, "micro_steps"))
    _nonneg(comm_overlap, "comm_overlap")
    if comm_overlap > 1:
        raise UserError(f"comm_overlap must be a fraction in [0, 1], got {comm_overlap!r}")
    settings = settings or ZeroSettings()
    P = layout.params if layout is not None else float(_nonneg(params, "params"))
    prec = precision(dtype, optimizer, master_weights, stage=st)
    colls = tuple(step_comm(P, st, n, micro_steps=g, dtype=dtype, settings=settings, layout=layout, precision_=prec))
    persist = 0
    if layout is not None and st == 3:
        flags = persistent_flags(layout, settings, n)
        persist = sum(t for m, f in zip(layout.modules, flags) for t, k in zip(m, f) if k)
    memory = memory_per_rank(P, st, n, precision_=prec, persistent_params=persist)

    spec = spec_of(system)
    comm = comm_time_s(colls, n, spec, spans_nodes=spans_nodes)
    hide = 1.0 - float(comm_overlap)
    times = {"fwd_compute_s": g * float(compute_fwd_s), "fwd_comm_s": hide * float(comm["fwd"]),
             "bwd_compute_s": g * float(compute_bwd_s), "bwd_comm_s": hide * float(comm["bwd"]),
             "optim_compute_s": float(optimizer_time_s(P, st, n, spec, precision_=prec,
                                                       clip=settings.gradient_clipping > 0,
                                                       loss_scaling=normalize_dtype(dtype) == "fp16")),
             "optim_comm_s": float(comm["step"])}
    host_s = host_s or {}

    syncs = sync_points(colls, n)
    for ph, key in (("fwd", "fwd"), ("bwd", "bwd"), ("optim", "step")):
        times[f"{ph}_host_s"] = float(host_s.get(ph, 0.0)) * (g if ph != "optim" else 1)
        times[f"{ph}_syncs"] = float(syncs[key])
        times[f"{ph}_wait_s"] = float(straggler_wait_s(syncs[key], n, spec))
        times[f"{ph}_s"] = (times[f"{ph}_compute_s"] + times[f"{ph}_comm_s"] + times[f"{ph}_host_s"]
                            + times[f"{ph}_wait_s"])
    times["step_s"] = times["fwd_s"] + times["bwd_s"] + times["optim_s"]
    return ZeroEstimate(st, n, g, int(P), prec, colls, memory, times)
