"""`perfcheck plan`: the fastest training layouts of a transformer that fit in memory.

  perfcheck plan --model llama3-70b --gpus 512 --system h100-sxm --global-batch 512
                 [--seq 8192 --dtype bf16 --top 5 --no-flash --dp-overlap 0.8 | --overlap
                  --format table|csv|json]

Searches tp, sp, pp, virtual stages, dp (ZeRO-1 distributed optimizer or FSDP), cp, micro-batch
size and recompute (perfcheck.predict.planner), keeps the layouts whose memory fits, and prints the
fastest with the best one's step time per term and why the runner-up is slower (the terms it loses and
what it gains against them). The DP collectives are exposed unless --dp-overlap hides a fixed fraction
of them or --overlap prices each engine's own overlap schedule. Bad input exits 2 with one line naming
the field.
"""
from __future__ import annotations

import argparse
import json

from perfcheck.commands.checks import check_output_file, write_output
from perfcheck.errors import UserError

FORMATS = ("table", "csv", "json")


def add_parser(subparsers):
    p = subparsers.add_parser("plan", help="search parallel layouts for the fastest training step that fits",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="NAME|FILE", help="built-in model or JSON model file")
    p.add_argument("--gpus", required=True, type=int, help="GPUs to use (every layout uses all of them)")
    p.add_argument("--global-batch", required=True, type=int, help="sequences per optimizer step")
    p.add_argument("--system", required=True, help="system name or JSON file")
    p.add_argument("--seq", type=int, help="sequence length (default: the model's seq_len)")
    p.add_argument("--dtype", default="bf16", help="compute dtype (default bf16)")
    p.add_argument("--top", type=int, default=5, help="layouts to list (default 5)")
    p.add_argument("--no-flash", action="store_true", help="unfused attention (logits/softmax/attend rows)")
    p.add_argument("--dp-overlap", type=float, default=0.0,
                   help="hidden fraction of the DP collectives, one number for every layout (default 0)")
    p.add_argument("--overlap", action="store_true",
                   help="each engine's own overlap schedule instead: Megatron-Core's overlap_grad_reduce and "
                        "overlap_param_gather (DDP, distributed optimizer), FSDP2's per-block prefetch (its whole "
                        "loop: torch's foreach AdamW, no clip)")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    p.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of standard output")
    p.set_defaults(run=run)


def run(args) -> int:
    from perfcheck.hardware.systems import load_system
    from perfcheck.predict import planner

    load_system(args.system)
    check_output_file(args.output, "--output")
    if args.top < 1:
        raise UserError(f"--top must be a positive integer, got {args.top}")
    if not 0 <= args.dp_overlap <= 1:
        raise UserError(f"--dp-overlap must be a fraction in [0, 1], got {args.dp_overlap}")
    for flag, value in (("--gpus", args.gpus), ("--global-batch", args.global_batch), ("--seq", args.seq)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be a positive integer, got {value}")
    try:
        result = planner.plan(args.model, args.gpus, args.system, args.global_batch, seq=args.seq, dtype=args.dtype,
                              flash=not args.no_flash, dp_overlap=args.dp_overlap, overlap=args.overlap)
    except UserError as exc:  # the planner names its arguments as the API spells them
        text = (str(exc).replace("global_batch", "--global-batch").replace("dp_overlap:", "--dp-overlap:")
                .replace("or overlap (", "or --overlap ("))
        for field in ("gpus:", "seq:"):
            text = "--" + text if text.startswith(field) else text
        raise UserError(text) from None
    top = result.ranked.head(args.top)
    if args.format == "csv":
        text = top.to_csv(index=False)
    elif args.format == "json":
        text = json.dumps({"searched": result.searched, "fitting": result.fitting,
                           "layouts": json.loads(top.to_json(orient="records"))}, indent=2) + "\n"
    else:
        text = _text(args, result, top)
    write_output(text, args.output)
    return 0


def _text(args, result, top) -> str:
    from perfcheck.commands.estimate import BREAKDOWN_LABELS, text_table, breakdown_text
    from perfcheck.predict.planner import ZERO_ENGINES, what_offsets, why_slower
    from perfcheck.units import fmt_bytes, fmt_pct, fmt_time

    head = (f"{args.model} on {args.gpus} GPUs of {args.system}, global batch {args.global_batch}: "
            f"{result.searched} layouts searched, {result.fitting} fit in memory.\n\n")
    header = ["#", "tp", "sp", "pp", "v", "dp", "cp", "ZeRO", "mb", "m", "recompute", "step", "MFU", "memory"]
    rows = [[i + 1, r.tp, "y" if r.sp else "-", r.pp, r.virtual_stages, r.dp, r.cp,
             str(int(r.zero_stage)) + (f" ({ZERO_ENGINES[int(r.zero_stage)]})" if r.zero_stage else ""), r.micro_batch,
             r.micro_batches, r.recompute, fmt_time(r.step_time_s), fmt_pct(r.mfu), fmt_bytes(r.mem_total_bytes)]
            for i, r in enumerate(top.itertuples(index=False))]
    text = (head + text_table(header, rows) + f"\nDP collectives: {'; '.join(dict.fromkeys(top.dp_schedule))}.\n"
            + "\nThe fastest, per term:\n" + breakdown_text(top.iloc[0]))
    if len(top) > 1:
        best, second = top.iloc[0], top.iloc[1]
        labels = dict(BREAKDOWN_LABELS)
        reasons = ", ".join(f"{labels[k]} +{fmt_time(d)}" for k, d in why_slower(best, second))
        offsets = ", ".join(f"{labels[k]} -{fmt_time(d)}" for k, d in what_offsets(best, second))
        text += (f"\nWhy #2 is slower ({fmt_time(second.step_time_s - best.step_time_s)} more per step): "
                 f"{reasons or 'no single term; the differences cancel'}"
                 + (f"; against {offsets}" if offsets else "") + ".\n")
    return text
