"""`perfcheck estimate`: predicted cost of one training step, from a model description or a module.

Two front-ends, one set of formulas:

  perfcheck estimate [--model gpt3-175b|FILE] [--batch 1 --seq 2048 --tp 8 --sp --pp 8 --dp 16
                      --zero 1 --micro-batches 16 --dtype bf16 --system a100-80gb-sxm --causal]
      the transformer front-end: per-sublayer table of one layer and the whole-step totals.
      With no arguments: GPT-2 124M, batch 1, on h100-sxm.
  perfcheck estimate --module package.module:callable --input-shape 8,3,32,32 [--input-shape ...]
                      [--input-dtype float32] [--system h100-sxm] [--dtype fp32]
      the module front-end: perfcheck.estimate() on the nn.Module the callable returns (built
      on the meta device when it can be); a shape may end in ':int64' for its own dtype.

Output: a readable table (default), --format csv (the per-row table) or json (everything),
to standard output or --output FILE. Bad input exits 2 with one line naming the field.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math

from perfcheck.commands.checks import check_output_file, write_output
from perfcheck.errors import UserError
from perfcheck.parallel import DP_ENGINES, GRAD_ACCUMULATIONS, OPTIMIZER_IMPLS

FORMATS = ("table", "csv", "json")
DEFAULT_MODEL, DEFAULT_SYSTEM = "gpt2-124m", "h100-sxm"


def add_parser(subparsers):
    p = subparsers.add_parser("estimate", help="predict FLOPs, memory, communication and time of a training step",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_argument_group("what to estimate (one of)")
    src.add_argument("--model", metavar="NAME|FILE", help=f"built-in model or JSON file (default: {DEFAULT_MODEL})")
    src.add_argument("--module", metavar="PKG.MOD:CALLABLE", help="a callable returning an nn.Module")
    tr = p.add_argument_group("transformer layout (--model)")
    for flag, helptext in (("--batch", "micro-batch size per GPU (default 1)"), ("--seq", "sequence length"),
                           ("--tp", "tensor-parallel degree"), ("--pp", "pipeline stages"),
                           ("--dp", "data-parallel degree"), ("--zero", "ZeRO stage 0-3"),
                           ("--micro-batches", "micro-batches per pipeline flush / step"),
                           ("--grad-accum", "pipeline flushes (gradient-accumulation steps) per optimizer step")):
        tr.add_argument(flag, type=int, help=helptext)  # values checked by the transformer front-end, naming the field
    tr.add_argument("--sp", action="store_true", help="Megatron sequence parallelism (needs --tp > 1)")
    tr.add_argument("--tp-scheme", choices=("1d", "2d", "2.5d", "3d"), default="1d",
                    help="tensor-parallel scheme: Megatron 1d (default), 2d (Optimus, --tp q*q), 2.5d (Tesseract, "
                         "--tp q*q*--tp-depth) or 3d (--tp q^3); docs/transformer.md")
    tr.add_argument("--tp-depth", type=int, default=1, help="depth d of the 2.5d grid (default 1)")
    tr.add_argument("--causal", action="store_true", help="count causal attention at half its products")
    tr.add_argument("--flash", action="store_true", help="fused attention kernel instead of logits/softmax/attend")
    tr.add_argument("--recompute", choices=("none", "selective", "full", "selective_op"), default="none",
                    help="activation checkpointing (default none; selective_op: torchtitan's op-level policy)")
    tr.add_argument("--recompute-every", type=int, default=1,
                    help="with --recompute full, checkpoint every Nth layer only (torchtitan's selective layer AC)")
    tr.add_argument("--tp-overlap", type=float, default=0.0, help="hidden fraction of TP communication (0-1)")
    tr.add_argument("--dp-overlap", type=float, default=0.0, help="hidden fraction of DP/ZeRO communication (0-1)")
    tr.add_argument("--tp-async-backward", action="store_true",
                    help="Megatron-LM's asynchronous column-parallel backward (its default since Sept. 2021): the input "
                         "gradient's all-reduce/reduce-scatter beside the weight-gradient GEMM, SP's re-gather beside "
                         "the input-gradient GEMM")
    _add_schedule_args(tr)
    tr.add_argument("--eager", action="store_true",
                    help="the layer as Meta's reference Llama code runs it eagerly (torchtitan): fp32 complex rotary, "
                         "repeat_kv copies, the attention output's copy, separate q/k/v and w1/w3 GEMMs")
    tr.add_argument("--eager-norm", action="store_true",
                    help="RMSNorm as the reference code's Python (eight fp32 kernels) instead of one fused kernel")
    tr.add_argument("--no-scatter-gather", action="store_true",
                    help="send the whole activation from every TP rank between pipeline stages")
    tr.add_argument("--breakdown", action="store_true",
                    help="print the step time per term (compute, recompute, TP/SP/CP, PP p2p, bubble, DP, optimizer) "
                         "with MFU and HFU instead of the per-sublayer table")
    mod = p.add_argument_group("module inputs (--module)")
    mod.add_argument("--input-shape", action="append", metavar="D1,D2,...[:DTYPE]", help="one per forward argument")
    mod.add_argument("--input-dtype", default="float32", help="dtype of inputs without their own (default float32)")
    p.add_argument("--system", default=DEFAULT_SYSTEM, help=f"system name or JSON file (default {DEFAULT_SYSTEM})")
    p.add_argument("--dtype", help="compute dtype (default: bf16 for --model, the module's own for --module)")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    p.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of standard output")
    p.set_defaults(run=run)


def _add_schedule_args(tr):
    """The transformer group's pipeline, context-parallel and data-parallel engine options."""
    tr.add_argument("--virtual-stages", type=int, default=1,
                    help="model chunks per GPU of the interleaved 1F1B schedule (default 1: plain 1F1B)")
    tr.add_argument("--cp", type=int, default=1, help="context-parallel size (sequence split over GPUs; default 1)")
    tr.add_argument("--cp-kind", choices=("ring", "ulysses"), default="ring",
                    help="context parallelism: ring attention (default) or DeepSpeed-Ulysses all-to-all")
    tr.add_argument("--dp-engine", choices=DP_ENGINES, default="deepspeed",
                    help="who issues the DP collectives: DeepSpeed ZeRO (default), Megatron (DDP, dist. optimizer, "
                         "FSDP), PyTorch DDP (buckets beside the last backward; --zero 0, pp 1), FSDP2 (--zero 3)")
    tr.add_argument("--dp-reduce-dtype", choices=("fp32", "bf16", "fp16"),
                    help="dtype the gradients are reduced in (megatron, ddp, fsdp2; default: the gradients' own)")
    tr.add_argument("--no-reshard-after-forward", action="store_true",
                    help="fsdp2: keep each block's gathered parameters from forward to backward")
    tr.add_argument("--grad-accumulation", choices=GRAD_ACCUMULATIONS,
                    help="who adds each micro-batch's gradients: fused in the GEMM (none), AccumulateGrad (autograd), "
                         "Megatron's main-grad buffer (main_grad); default: the engine's")
    tr.add_argument("--optimizer", default="adam", help="optimizer kind (adam, adamw, sgd, sgd_momentum, ...; "
                                                         "default adam)")
    tr.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS,
                    help="who runs the optimizer step: DeepSpeed's optimizer around FusedAdam, one fused kernel "
                         "alone, Megatron-LM's mixed-precision optimizer, torch.optim foreach / for-loop / "
                         "torch-fused; default: the engine's")
    tr.add_argument("--overlap-grad-reduce", action="store_true",
                    help="megatron: Megatron-Core's gradient reduction in buckets beside the last backward")
    tr.add_argument("--overlap-param-gather", action="store_true",
                    help="megatron with the distributed optimizer (--zero 1/2): the parameters' all-gather beside "
                         "the next forward")
    tr.add_argument("--grad-clip", choices=("on", "off"),
                    help="clip gradients by their global norm (default: the engine's: on for DeepSpeed and "
                         "Megatron, whose defaults are 1.0)")


def run(args) -> int:
    from perfcheck.hardware.systems import load_system

    load_system(args.system)  # an unknown system fails first, whichever front-end
    check_output_file(args.output, "--output")
    if args.module and args.model:
        raise UserError("give --model or --module, not both")
    text = _module_output(args) if args.module else _model_output(args)
    write_output(text, args.output)
    return 0


# ---- transformer front-end ---------------------------------------------------------------------------

def _model_output(args) -> str:
    from perfcheck.predict.transformer import estimate_transformer, load_model, transformer_step

    if args.input_shape:
        raise UserError("--input-shape needs --module")
    model = load_model(args.model or DEFAULT_MODEL)
    parallel = {k: v for k, v in (("tp", args.tp), ("pp", args.pp), ("dp", args.dp), ("zero_stage", args.zero),
                                  ("micro_batches", args.micro_batches), ("grad_accum_steps", args.grad_accum))
                if v is not None}
    parallel["sp"] = bool(args.sp)
    kw = dict(batch=1 if args.batch is None else args.batch, seq=args.seq, parallel=parallel, system=args.system,
              dtype=args.dtype or "bf16", causal=args.causal, flash=args.flash, recompute=args.recompute,
              tp_overlap=args.tp_overlap, dp_overlap=args.dp_overlap, tp_async_backward=args.tp_async_backward,
              tp_scheme=args.tp_scheme,
              virtual_stages=args.virtual_stages, cp=args.cp, cp_kind=args.cp_kind, dp_engine=args.dp_engine,
              scatter_gather=not args.no_scatter_gather, recompute_every=args.recompute_every,
              dp_reduce_dtype=args.dp_reduce_dtype, reshard_after_forward=not args.no_reshard_after_forward,
              eager=args.eager, eager_norm=args.eager_norm, grad_accumulation=args.grad_accumulation,
              optimizer=args.optimizer, optimizer_impl=args.optimizer_impl,
              grad_clip=None if args.grad_clip is None else args.grad_clip == "on",
              overlap_grad_reduce=args.overlap_grad_reduce, overlap_param_gather=args.overlap_param_gather)
    if args.tp_depth != 1:
        kw["tp_depth"] = args.tp_depth
    table = estimate_transformer(model, **kw)
    step = transformer_step(model, **kw)
    if args.format == "csv":
        return table.to_csv(index=False)
    if args.format == "json":
        doc = {"model": model.to_json_dict(), "system": args.system, "dtype": kw["dtype"], "batch": kw["batch"],
               "seq": kw["seq"] or model.seq_len, "parallel": step.parallel, "tp_scheme": kw["tp_scheme"],
               "tp_depth": kw.get("tp_depth", 1),
               "sublayers": json.loads(table.to_json(orient="records")), "step": _jsonable(step.values)}
        return json.dumps(doc, indent=2) + "\n"
    if args.breakdown:
        return _head(model, kw, step) + "\nStep time per term:\n" + breakdown_text(step.values)
    return _model_text(model, kw, table, step)


#: (STEP_COLUMNS key, label) of the additive terms of the step time, in print order.
BREAKDOWN_LABELS = (("compute_time_s", "compute"), ("recompute_time_s", "recompute"),
                    ("tp_comm_time_s", "TP/SP communication (exposed)"), ("cp_comm_time_s", "CP communication (exposed)"),
                    ("pp_comm_time_s", "PP send/recv"), ("bubble_time_s", "pipeline bubble"),
                    ("dp_comm_time_s", "DP communication (exposed)"),
                    ("dp_copy_time_s", "DP copies (compute stream)"),
                    ("grad_accum_time_s", "gradient accumulation adds"), ("optimizer_time_s", "optimizer update"))


def breakdown_text(s) -> str:
    """The step's terms (seconds and share of the step), then MFU / HFU, memory and throughput."""
    from perfcheck.units import fmt_bytes, fmt_count, fmt_pct, fmt_time

    rows = [[label, fmt_time(s[key]), fmt_pct(s[key] / s["step_time_s"])] for key, label in BREAKDOWN_LABELS]
    rows.append(["step time", fmt_time(s["step_time_s"]), fmt_pct(1.0)])
    extra = [("MFU / HFU", f"{fmt_pct(s['mfu'])} / {fmt_pct(s['hfu'])}"),
             ("memory per GPU", f"{fmt_bytes(s['mem_total_bytes'])} ({'fits' if s['mem_fits'] else 'does NOT fit'})"),
             ("throughput", f"{fmt_count(s['tokens_per_s'])} tokens/s")]
    return text_table(["term", "time", "share"], rows) + text_table(["quantity", "value"], extra)


def _head(model, kw, step) -> str:
    p = step.parallel
    return (f"{model.name}: {model.layers} layers, hidden {model.hidden}; batch {kw['batch']} x seq "
            f"{kw['seq'] or model.seq_len}, {kw['dtype']} on {kw['system']}; tp {p['tp']}{' + sp' if p['sp'] else ''}, "
            f"pp {p['pp']} (v {kw['virtual_stages']}), dp {p['dp']}, cp {kw['cp']}, ZeRO-{p['zero_stage']}, "
            f"{p['micro_batches']} micro-batch(es)\n")


def _scheme(kw) -> str:
    """' (2.5d, depth 2)' for a tensor-parallel scheme other than Megatron's 1D, else ''."""
    scheme = kw.get("tp_scheme", "1d")
    if scheme == "1d":
        return ""
    return f" ({scheme}" + (f", depth {kw['tp_depth']})" if "tp_depth" in kw else ")")


def _jsonable(values):
    return {k: (bool(v) if isinstance(v, bool) else v if not isinstance(v, float) or math.isfinite(v) else None)
            for k, v in values.items()}


def _model_text(model, kw, table, step) -> str:
    from perfcheck.units import fmt_bytes, fmt_count, fmt_pct, fmt_time

    p = step.parallel
    head = (f"{model.name}: {model.layers} layers, hidden {model.hidden}, {model.heads} heads, ffn {model.ffn_hidden}, "
            f"vocab {model.vocab}\nbatch {kw['batch']} x seq {kw['seq'] or model.seq_len}, {kw['dtype']} on "
            f"{kw['system']}; tp {p['tp']}{' + sp' if p['sp'] else ''}{_scheme(kw)}, pp {p['pp']}, dp {p['dp']}, "
            f"ZeRO-{p['zero_stage']}, {p['micro_batches']} micro-batch(es)\n\n"
            "Per GPU, one micro-batch; layer rows repeat 'count' times per stage:\n")
    header = ["sublayer", "count", "params", "FLOP fwd", "FLOP bwd", "act mem", "comm fwd", "comm bwd",
              "t fwd", "t bwd", "bound fwd"]
    rows = [[r.sublayer, r.count, fmt_count(r.params), fmt_count(r.flops_fwd), fmt_count(r.flops_bwd),
             fmt_bytes(r.act_mem), _comm(r.comm_fwd_bytes, r.comm_fwd_kind, fmt_bytes),
             _comm(r.comm_bwd_bytes, r.comm_bwd_kind, fmt_bytes), fmt_time(r.pred_fwd_s), fmt_time(r.pred_bwd_s),
             r.bound_fwd] for r in table.itertuples(index=False)]
    s = step.values
    summary = [("step time", fmt_time(s["step_time_s"])), ("  compute", fmt_time(s["compute_time_s"])),
               ("  recompute", fmt_time(s["recompute_time_s"])),
               ("  TP communication (exposed)", fmt_time(s["tp_comm_time_s"])),
               ("  CP communication (exposed)", fmt_time(s["cp_comm_time_s"])),
               ("  pipeline send/recv", fmt_time(s["pp_comm_time_s"])),
               ("  pipeline bubble",
                f"{fmt_time(s['bubble_time_s'])} ({fmt_pct(s['bubble_fraction'])} of the pipeline)"),
               ("  DP/ZeRO communication (exposed)", fmt_time(s["dp_comm_time_s"])),
               ("  DP copies (compute stream)", fmt_time(s["dp_copy_time_s"])),
               ("  gradient accumulation adds", fmt_time(s["grad_accum_time_s"])),
               ("  optimizer update", fmt_time(s["optimizer_time_s"])),
               ("memory per GPU", f"{fmt_bytes(s['mem_total_bytes'])} ({'fits' if s['mem_fits'] else 'does NOT fit'})"),
               ("  params / grads / optimizer",
                " / ".join(fmt_bytes(s[f"mem_{k}_bytes"]) for k in ("params", "grads", "optimizer"))),
               ("  activations", fmt_bytes(s["mem_activations_bytes"])),
               ("MFU / HFU", f"{fmt_pct(s['mfu'])} / {fmt_pct(s['hfu'])}"),
               ("throughput", f"{fmt_count(s['tokens_per_s'])} tokens/s, {fmt_count(s['global_batch'])} sequences per step")]
    return (head + text_table(header, rows) + "\nStep totals:\n" + text_table(["quantity", "value"], summary)
            + "\nSI units; `--format csv|json` gives every column (docs/transformer.md explains them).\n")


def _comm(nbytes, kind, fmt):
    return f"{fmt(nbytes)} {kind}" if nbytes else "-"


def text_table(header, rows) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


# ---- module front-end ----------------------------------------------------------------------------------
def _load_callable(spec: str):
    if ":" not in spec:
        raise UserError(f"--module: expected package.module:callable, got {spec!r}")
    mod_name, attr = spec.split(":", 1)
    try:
        module = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's input
        raise UserError(f"--module: cannot import {mod_name!r}: {type(exc).__name__}: {exc}") from None
    target = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise UserError(f"--module: {mod_name!r} has no attribute {attr!r}")
    if not callable(target):
        raise UserError(f"--module: {spec!r} is not callable")
    return target


def _build_module(spec: str):
    import torch

    factory = _load_callable(spec)
    try:
        with torch.device("meta"):
            model = factory()
    except Exception:  # noqa: BLE001 - some constructors need real tensors: build on CPU instead
        try:
            model = factory()
        except Exception as exc:  # noqa: BLE001
            raise UserError(f"--module: {spec!r} failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"--module: {spec!r} returned {type(model).__name__}, not an nn.Module")
    return model


def _parse_shape(text: str, default_dtype):
    import torch

    shape_text, _, dtype_text = text.partition(":")
    try:
        shape = tuple(int(s) for s in shape_text.split(",") if s.strip())
    except ValueError:
        raise UserError(f"--input-shape: {text!r} is not a comma-separated list of integers") from None
    if not shape or any(s <= 0 for s in shape):
        raise UserError(f"--input-shape: {text!r}: every size must be a positive integer")
    dtype = _torch_dtype(dtype_text) if dtype_text else default_dtype
    return (shape, dtype) if dtype is not torch.float32 else shape


def _torch_dtype(name: str):
    import torch

    dt = getattr(torch, name.strip().lower(), None)
    if not isinstance(dt, torch.dtype):
        raise UserError(f"--input-dtype: unknown torch dtype {name!r} (e.g. float32, bfloat16, int64)")
    return dt


def _module_output(args) -> str:
    from perfcheck.predict.estimate import estimate
    from perfcheck.predict.trace import inputs_from_shapes

    if not args.input_shape:
        raise UserError("--module needs at least one --input-shape")
    given = [f for f, v in (("--tp", args.tp), ("--pp", args.pp), ("--dp", args.dp), ("--zero", args.zero),
                            ("--batch", args.batch), ("--seq", args.seq), ("--micro-batches", args.micro_batches))
             if v is not None] + (["--sp"] if args.sp else []) + (["--breakdown"] if args.breakdown else []) + [
        f for f, v in (("--virtual-stages", args.virtual_stages != 1), ("--cp", args.cp != 1)) if v]
    if given:
        raise UserError(f"{given[0]} applies to --model only (the module front-end estimates one device)")
    default_dtype = _torch_dtype(args.input_dtype)
    shapes = [_parse_shape(s, default_dtype) for s in args.input_shape]
    model = _build_module(args.module)
    inputs = inputs_from_shapes(shapes, dtype=default_dtype)
    try:
        frame = estimate(model, inputs, system=args.system, dtype=args.dtype, causal=args.causal)
    except UserError as exc:  # the estimator names its argument; the user typed --input-shape
        text = str(exc)
        if text.startswith("example_inputs:"):
            raise UserError("--input-shape" + text[len("example_inputs"):]) from None
        raise
    if args.format == "csv":
        return frame.to_csv(index=False)
    if args.format == "json":
        return json.dumps({"module": args.module, "system": args.system, "input_shapes": args.input_shape,
                           "modules": json.loads(frame.to_json(orient="records"))}, indent=2) + "\n"
    from perfcheck.units import fmt_bytes, fmt_count, fmt_time

    header = ["module", "type", "params", "FLOP fwd", "FLOP bwd", "act mem", "t fwd", "t bwd", "bound fwd"]
    rows = [["  " * r.depth + r.module, r.type, fmt_count(r.params), fmt_count(r.flops_fwd), fmt_count(r.flops_bwd),
             fmt_bytes(r.act_mem), fmt_time(r.pred_fwd_s), fmt_time(r.pred_bwd_s), r.bound_fwd]
            for r in frame.itertuples(index=False)]
    from perfcheck.analysis.findings import predicted_host_bound

    notes = "".join(f"\n{line}" for line in predicted_host_bound(frame))
    return (f"{args.module} on {frame.attrs.get('system_label', args.system)}, inputs {' '.join(args.input_shape)}"
            f"\n\n" + text_table(header, rows) + notes + ("\n" if notes else ""))
