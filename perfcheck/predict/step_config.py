"""Configuration of the transformer front-end's step model: the modelling ``Options`` and the layouts
(``Layouts``: one numpy array per field, n layouts at once), validated with errors naming the field."""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from perfcheck.errors import UserError
from perfcheck.parallel import DP_ENGINES
from perfcheck.predict import grad_buffers, optimizer_passes, sharding

RECOMPUTE = ("none", "selective", "full", "selective_op")
CP_KINDS = ("ring", "ulysses")
REDUCE_DTYPES = ("fp32", "bf16", "fp16")
#: How each engine adds a micro-batch's gradients into the step's unless ``grad_accumulation`` says (``grad_buffers``):
#: Megatron-Core's fused accumulation, PyTorch DDP's AccumulateGrad; DeepSpeed's and FSDP2's are not priced.
ENGINE_GRAD_ACCUMULATION = {"deepspeed": "none", "megatron": "none", "ddp": "autograd", "fsdp2": "none"}


@dataclasses.dataclass(frozen=True)
class Options:
    """Modelling choices shared by the table, the step totals and the sweep.

    causal: count half of the attention score products (FlopCounterMode counts them in full).
    flash: fused attention (one ``core_attention`` row, ``formulas.attention``) instead of the
      transformer-perf-estimates notebook's logits/softmax/dropout/attend rows (docs/transformer.md).
    recompute: activation checkpointing per layer: "none", "selective" (the attention core,
      Korthikanti et al. 2022) or "full" (keep each layer's input, redo its forward in backward).
      "selective_op": torchtitan's op-level selective AC (parallelize_llama.py, April 2024): per layer the
      outputs of the attention call and of every second matmul (wq, wv, w1, w2) are kept, everything else
      (wk, wo, w3, norms, rotary, activation, residual adds) re-runs in backward; Llama-style layers
      (SwiGLU, no MoE), flash attention, tp = 1 (``step.op_policy_rerun_share``).
    recompute_every: with recompute="full", checkpoint only every Nth layer and keep all activations
      of the others (torchtitan's "selective layer" AC, parallelize_llama.py: the k-th wrapped block,
      k = 1..L, is checkpointed when k % N == 0, i.e. floor(L/N) of L; ``full_recompute_share``). 1: all.
    tp_overlap, dp_overlap: fraction of TP / DP collective time hidden behind compute.
    tp_async_backward: Megatron-LM's asynchronous column-parallel backward (default there since Sept. 2021;
      Narayanan et al. 2021's runs predate it): the input gradient's all-reduce / reduce-scatter runs
      beside the weight-gradient GEMM and SP's re-gather beside the input-gradient GEMM, so only what
      each collective takes beyond that GEMM is exposed (``sharding._col_parallel_comms``, ``step._time_rows``).
    optimizer, master_weights: model states per parameter (``zero.precision``: "adam" keeps fp32
      momentum and variance; master_weights None = DeepSpeed's choice of an fp32 master copy).
    ep: expert-parallel degree (MoE).
    tp_scheme: "1d" (Megatron), "2d" (Optimus, tp = q*q), "2.5d" (Tesseract, tp = q*q*tp_depth),
      "3d" (tp = q**3); ``sharding.grid_linear`` and docs/transformer.md. tp_depth: 2.5D's d.
    virtual_stages: model chunks per GPU of the interleaved 1F1B schedule (v; 1 = plain 1F1B;
      ``pipeline.bubble_fraction``). A sweep's ``virtual_stages`` column overrides it per layout.
    cp: context-parallel size (the sequence split over cp GPUs); cp_kind "ring" (ring attention,
      Megatron-Core CP) or "ulysses" (DeepSpeed-Ulysses all-to-all); ``pipeline.cp_ring_bytes``,
      ``pipeline.ulysses_bytes``. A sweep's ``cp`` column overrides it.
    scatter_gather: Megatron's pipeline scatter/gather (``pipeline.p2p_bytes``; used without SP).
    dp_engine: "deepspeed" (ZeRO as DeepSpeed issues it, ``zero.step_comm``) or "megatron" (DDP
      all-reduce at zero_stage 0, the distributed optimizer's reduce-scatter + all-gather at 1,
      FSDP's per-step gathers at 3: ``_megatron_dp``) or "ddp" (PyTorch DDP, zero_stage 0, pp 1: the
      gradients all-reduced in 25 MiB buckets beside the last micro-batch's backward, the others under
      ``no_sync``, as Megatron-LM's ``--DDP-impl torch`` runs it: ``predict.ddp``; ``dp_overlap`` does not apply)
      or "fsdp2" (``fully_shard`` per block, zero_stage 3:
      its per-block prefetch schedule decides what is exposed, and its copies on the compute stream are
      priced: ``predict.fsdp``, ``_fsdp2_dp``; ``dp_overlap`` does not apply).
    dp_reduce_dtype: the dtype gradients are reduced in ("fp32", "bf16", "fp16"; None: the gradients' own):
      FSDP2's ``MixedPrecisionPolicy(reduce_dtype=...)`` (torchtitan: float32), Megatron's
      ``--accumulate-allreduce-grads-in-fp32`` / ``grad_reduce_in_fp32``; DDP's gradients under autocast
      are fp32. For dp_engine "megatron", "ddp" and "fsdp2".
    eager: the layer as Meta's reference Llama code runs it op by op (torchtitan's model.py, eager mode): rotary
      through fp32 complex numbers, repeat_kv's copies of k and v (grouped-query attention), the attention
      output's transpose copy (``predict.eager_ops``), wq/wk/wv and w1/w3 as separate GEMMs; False: fused kernels
      and the fused qkv / fc1 GEMMs, as Megatron-LM runs them.
    eager_norm: RMSNorm as the reference code's Python (eight kernels, fp32; ``eager_ops.eager_rms_norm``);
      False: one fused kernel (apex, Triton, torch's fused rms_norm).
    reshard_after_forward: FSDP2's option (default True): free each block's gathered parameters after its
      forward and gather them again for backward.
    grad_accumulation: who adds each micro-batch's gradients into the step's (``grad_buffers.MODES``): "none"
      (fused into the weight-gradient GEMM, Megatron-Core's default), "autograd" (AccumulateGrad in place: PyTorch
      DDP under no_sync, Megatron-LM's 2021 local DDP), "main_grad" (Megatron-LM's contiguous buffer, fp16 through
      2022); None: the engine's (``ENGINE_GRAD_ACCUMULATION``). Priced as ``grad_accum_time_s``.
    optimizer_impl: who runs the optimizer step (``optimizer_passes.IMPLS``): "deepspeed" (DeepSpeed's ZeRO / FP16
      optimizer wrapper around FusedAdam), "fused" (the one fused kernel alone), "megatron" (Megatron-LM's
      mixed-precision optimizer around apex's kernels), "foreach" / "for-loop" / "torch-fused" (torch.optim's
      implementations, their kernels counted from torch's code); None: the engine's
      (``optimizer_passes.ENGINE_IMPL``). Priced as ``optimizer_time_s``.
    grad_clip: whether the loop clips gradients by their global norm (DeepSpeed's gradient_clipping, Megatron's
      --clip-grad, torch's clip_grad_norm_); None: the engine's default (``optimizer_passes.ENGINE_CLIP``: on for
      DeepSpeed and Megatron-LM, whose defaults are 1.0).
    overlap_grad_reduce, overlap_param_gather: Megatron-Core's flags (dp_engine "megatron", zero_stage 0-2; the
      gather with the distributed optimizer): the gradients' reduction in buckets beside the last micro-batch's
      backward, the updated parameters' all-gather beside the next forward (``predict.mcore_overlap``), instead of
      a ``dp_overlap`` fraction.
    """

    causal: bool = False
    flash: bool = False
    recompute: str = "none"
    recompute_every: int = 1
    tp_overlap: float = 0.0
    dp_overlap: float = 0.0
    tp_async_backward: bool = False
    optimizer: str = "adam"
    master_weights: object = None
    ep: int = 1
    tp_scheme: str = "1d"
    tp_depth: int = 1
    virtual_stages: int = 1
    cp: int = 1
    cp_kind: str = "ring"
    scatter_gather: bool = True
    dp_engine: str = "deepspeed"
    dp_reduce_dtype: object = None
    reshard_after_forward: bool = True
    grad_accumulation: object = None
    eager: bool = False
    eager_norm: bool = False
    optimizer_impl: object = None
    grad_clip: object = None
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False

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
        if (self.eager or self.eager_norm) and scheme != "1d":
            raise UserError(f"eager / eager_norm describe a 1D (Megatron) layer; tp_scheme={scheme!r} has no such rows")
        for f in ("causal", "flash", "master_weights", "tp_async_backward", "eager", "eager_norm"):
            value = getattr(self, f)
            if not isinstance(value, (bool, np.bool_)) and not (f == "master_weights" and value is None):
                raise UserError(f"{f} must be true or false, got {getattr(self, f)!r}")
        if isinstance(self.ep, bool) or not isinstance(self.ep, (int, np.integer)) or self.ep < 1:
            raise UserError(f"ep must be a positive integer (expert-parallel degree), got {self.ep!r}")
        for f in ("virtual_stages", "cp"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise UserError(f"{f} must be a positive integer, got {v!r}")
        if self.cp_kind not in CP_KINDS:
            raise UserError(f"cp_kind must be one of {', '.join(CP_KINDS)}, got {self.cp_kind!r}")
        if self.dp_engine not in DP_ENGINES:
            raise UserError(f"dp_engine must be one of {', '.join(DP_ENGINES)}, got {self.dp_engine!r}")
        if self.dp_reduce_dtype is not None and self.dp_reduce_dtype not in REDUCE_DTYPES:
            raise UserError(f"dp_reduce_dtype must be one of {', '.join(REDUCE_DTYPES)} or None, "
                            f"got {self.dp_reduce_dtype!r}")
        if self.dp_reduce_dtype is not None and self.dp_engine == "deepspeed":
            raise UserError("dp_reduce_dtype is modelled for dp_engine 'megatron' and 'fsdp2' "
                            "(DeepSpeed's communication_data_type is not), got dp_engine='deepspeed'")
        if not isinstance(self.reshard_after_forward, (bool, np.bool_)):
            raise UserError(f"reshard_after_forward must be true or false, got {self.reshard_after_forward!r}")
        if self.dp_engine in ("fsdp2", "ddp") and self.dp_overlap:
            raise UserError(f"dp_overlap does not apply to dp_engine={self.dp_engine!r}: what hides follows its "
                            f"schedule (predict.fsdp, predict.ddp); got dp_overlap={self.dp_overlap!r}")
        if not isinstance(self.scatter_gather, (bool, np.bool_)):
            raise UserError(f"scatter_gather must be true or false, got {self.scatter_gather!r}")
        if self.grad_accumulation is not None and self.grad_accumulation not in grad_buffers.MODES:
            raise UserError(f"grad_accumulation must be one of {', '.join(grad_buffers.MODES)} or None, "
                            f"got {self.grad_accumulation!r}")
        _check_step_engine(self)
        if self.recompute not in RECOMPUTE:
            raise UserError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.recompute == "selective_op" and not self.flash:
            raise UserError("recompute='selective_op' needs flash=True (the policy keeps the fused attention's output)")
        n = self.recompute_every
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise UserError(f"recompute_every must be a positive integer (checkpoint every Nth layer), got {n!r}")
        if n > 1 and self.recompute != "full":
            raise UserError(f"recompute_every = {n} needs recompute='full' (got recompute={self.recompute!r})")
        for f in ("tp_overlap", "dp_overlap"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise UserError(f"{f} must be a fraction in [0, 1], got {v!r}")


def grad_accumulation(opts: Options) -> str:
    """The ``grad_buffers`` mode a step runs: ``opts.grad_accumulation``, else its engine's."""
    return opts.grad_accumulation or ENGINE_GRAD_ACCUMULATION[opts.dp_engine]


def _check_step_engine(opts: Options):
    """UserError naming the field: the optimizer's implementation and clip, Megatron-Core's overlap flags."""
    if opts.optimizer_impl is not None and opts.optimizer_impl not in optimizer_passes.IMPLS:
        raise UserError(f"optimizer_impl must be one of {', '.join(optimizer_passes.IMPLS)} or None, "
                        f"got {opts.optimizer_impl!r}")
    if opts.grad_clip is not None and not isinstance(opts.grad_clip, (bool, np.bool_)):
        raise UserError(f"grad_clip must be true, false or None (the engine's default), got {opts.grad_clip!r}")
    if opts.grad_clip and optimizer_impl(opts) == "fused":
        raise UserError("grad_clip is priced for optimizer_impl deepspeed, megatron, foreach, for-loop and "
                        "torch-fused; the one fused kernel alone has no clip: give another optimizer_impl or no "
                        "grad_clip")
    for f in ("overlap_grad_reduce", "overlap_param_gather"):
        if not isinstance(getattr(opts, f), (bool, np.bool_)):
            raise UserError(f"{f} must be true or false, got {getattr(opts, f)!r}")
        if getattr(opts, f) and opts.dp_engine != "megatron":
            raise UserError(f"{f} is Megatron-Core's flag: it needs dp_engine='megatron', got {opts.dp_engine!r}")
        if getattr(opts, f) and opts.dp_overlap:
            raise UserError(f"{f} follows Megatron-Core's schedule; give it or dp_overlap, not both "
                            f"(got dp_overlap={opts.dp_overlap!r})")


def optimizer_impl(opts: Options) -> str:
    """Who runs the optimizer step (``optimizer_passes``): ``opts.optimizer_impl``, else its engine's."""
    return opts.optimizer_impl or optimizer_passes.ENGINE_IMPL[opts.dp_engine]


def grad_clip(opts: Options) -> bool:
    """Whether the step clips gradients by their norm: ``opts.grad_clip``, else its engine's default."""
    return bool(optimizer_passes.ENGINE_CLIP[opts.dp_engine] if opts.grad_clip is None else opts.grad_clip)


def full_recompute_share(layers, opts: Options) -> float:
    """Share of the layers whose forward is re-run in backward under full recompute: 1 for recompute="full"
    (every layer), floor(layers / N) / layers with recompute_every = N (the k-th of layers 1..L is checkpointed
    when k % N == 0: torchtitan's selective layer AC), 0 otherwise. Applied to each pipeline stage's layers."""
    if opts.recompute != "full":
        return 0.0
    return (layers // opts.recompute_every) / layers


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
    virtual_stages: np.ndarray = None  # interleaved 1F1B chunks per GPU (default 1)
    cp: np.ndarray = None  # context-parallel size (default 1)

    def __post_init__(self):
        for f in ("virtual_stages", "cp"):
            if getattr(self, f) is None:
                object.__setattr__(self, f, np.ones(len(self.tp), dtype=np.int64))

    @classmethod
    def single(cls, parallel, batch, seq, opts=None) -> "Layouts":
        p = parallel
        v, c = (1, 1) if opts is None else (opts.virtual_stages, opts.cp)
        return cls(*(np.array([v_]) for v_ in (p.tp, p.pp, p.dp, int(p.zero_stage), batch, p.sp, p.micro_batches,
                                                p.grad_accum_steps, seq, v, c)))

    @property
    def world(self):
        return self.tp * self.pp * self.dp * self.cp


def single_layout(model, parallel, batch, seq, opts) -> Layouts:
    """One layout (a ParallelConfig, the micro-batch, seq and the Options' virtual_stages/cp) validated:
    the schedule's constraints (interleaving, context parallelism) as a UserError naming the field."""
    one = Layouts.single(parallel, batch, seq, opts)
    cols = {f.name: getattr(one, f.name) for f in dataclasses.fields(Layouts)}
    return validate_layouts(model, cols, opts, where="parallel config")


def validate_layouts(model, cols: Mapping[str, np.ndarray], opts: "Options" = None, where=None) -> Layouts:
    """Arrays of layouts checked like ``ParallelConfig`` + ``validate_for_model`` (and, for a grid
    ``opts.tp_scheme``, ``sharding.grid_problems``); UserError names row and field."""
    out = {}
    for f in ("tp", "pp", "dp", "zero_stage", "micro_batch", "micro_batches", "grad_accum_steps", "seq"):
        a = np.asarray(cols[f])
        if a.dtype == bool or not np.issubdtype(a.dtype, np.number) or np.any(a != np.floor(a)):
            raise UserError(f"layouts: {f} must hold integers")
        out[f] = a.astype(np.int64)
    for f in ("virtual_stages", "cp"):
        a = np.asarray(cols.get(f, np.full(len(out["tp"]), getattr(opts, f, 1) if opts is not None else 1)))
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
        (o["virtual_stages"] < 1, "virtual_stages must be >= 1"), (o["cp"] < 1, "cp must be >= 1"),
        ((o["virtual_stages"] > 1) & (o["pp"] == 1), "virtual_stages > 1 needs pp > 1 (interleaved 1F1B)"),
        ((o["virtual_stages"] > 1) & (o["micro_batches"] % np.maximum(o["pp"], 1) != 0),
         "virtual_stages > 1 needs micro_batches divisible by pp (Megatron's interleaved schedule)"),
        (o["seq"] % np.maximum(o["cp"], 1) != 0, "cp does not divide seq"),
        (sp & (o["tp"] == 1), "sp needs tp > 1"),
    ]
    if opts is not None and opts.cp_kind == "ulysses":
        checks.append(((model.heads // np.maximum(o["tp"], 1)) % np.maximum(o["cp"], 1) != 0,
                       f"Ulysses: cp does not divide the heads per TP rank (heads = {model.heads})"))
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
    checks += _op_policy_checks(model, o, opts, where) + [
        (model.layers % np.maximum(o["pp"], 1) != 0, f"pp does not divide layers = {model.layers}"),
        (model.layers % np.maximum(o["pp"] * o["virtual_stages"], 1) != 0,
         f"pp * virtual_stages does not divide layers = {model.layers}"),
        ((o["pp"] > 1) & (o["zero_stage"] >= 2), "zero_stage 2/3 is incompatible with pp > 1 (DeepSpeed)"),
    ]
    if model.position == "learned":
        checks.append((o["seq"] > model.seq_len, f"seq exceeds the model's seq_len = {model.seq_len}"))
    for bad, message in checks:
        if np.any(bad):
            i = int(np.argmax(bad))
            raise UserError(f"{where or f'layouts row {i}'}: {message} (got {_row_text(o, i)})")
    return Layouts(**out)


def _op_policy_checks(model, o, opts, where) -> list:
    """recompute="selective_op" is modelled for a dense SwiGLU model (its matmul order wq wk wv wo w1 w3 w2) at tp 1."""
    if opts is None or opts.recompute != "selective_op":
        return []
    if model.activation != "swiglu" or model.experts:
        raise UserError(f"{where or 'layouts'}: recompute='selective_op' needs a dense SwiGLU model (its matmul "
                        f"order wq wk wv wo w1 w3 w2), got activation={model.activation!r}, experts={model.experts}")
    return [(o["tp"] > 1, "recompute='selective_op' is modelled for tp = 1 only")]


def _row_text(o, i):
    return ", ".join(f"{k}={o[k][i]}" for k in ("tp", "sp", "pp", "dp", "zero_stage", "micro_batch", "seq",
                                                 "virtual_stages", "cp"))
