"""`perfcheck run`: measure a built-in example model for some steps and write a run directory.

The examples need no download and no GPU (perfcheck.examples.models): LeNet of DeepSpeed's
CIFAR-10 example on CIFAR-shaped random images (lenet, the default), JSC_Tiny, MASE's 117-param
jet-substructure MLP with in-place ReLUs (jsc), a 6-layer GPT-2-style model (gpt).
"""
from __future__ import annotations

import argparse
import math

from perfcheck.commands.checks import (check_out_dir, check_system, nonneg_int, positive_float,
                                       positive_int)
from perfcheck.errors import UserError


#: Names of perfcheck.examples.models.EXAMPLES, repeated here so that building the CLI parser
#: does not import torch (a test checks the two agree).
MODELS = ("gpt", "jsc", "lenet")


def add_parser(subparsers):
    p = subparsers.add_parser("run", help="measure a built-in example model for N steps and write a run directory",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=MODELS, default="lenet", help="example model (default: lenet)")
    p.add_argument("--steps", type=positive_int, default=20, help="measured steps (default: 20)")
    p.add_argument("--warmup", type=nonneg_int, default=3, help="warm-up steps, not measured (default: 3)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="batch size (default: the example's, 8)")
    p.add_argument("--out", default=None, help="run directory (default: runs/<time>-<model>-<id>)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda if available, else cpu (default: auto)")
    p.add_argument("--no-profile", action="store_true", help="no torch.profiler window (no kernels.csv rows, no trace)")
    p.add_argument("--profile-window", default="0,1,1", metavar="WAIT,WARMUP,ACTIVE",
                   help="torch.profiler schedule after warm-up (default: 0,1,1)")
    p.add_argument("--no-flops", action="store_true", help="skip the FlopCounterMode step")
    p.add_argument("--sample-interval", type=positive_float, default=0.5, help="sampler interval in s, >= 0.1 (default: 0.5)")
    p.add_argument("--overhead-pairs", type=nonneg_int, default=5,
                   help="instrumented/bare step pairs for the in-run overhead estimate (default: 5; 0 = not measured)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the weights and the random batches (default: 0)")
    p.add_argument("--system", default=None,
                   help="spec for the saved predictions: a name (`perfcheck systems`) or a calibrated JSON file "
                        "(default: this device's entry)")
    p.set_defaults(run=run)


def _window(text: str) -> tuple:
    try:
        parts = tuple(int(x) for x in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or min(parts) < 0 or parts[2] < 1:
        raise UserError(f"--profile-window must be WAIT,WARMUP,ACTIVE (three integers >= 0, ACTIVE >= 1), got {text!r}")
    return parts


def run(args) -> int:
    window = _window(args.profile_window)  # every argument checked before torch is imported or a step runs
    check_out_dir(args.out, "--out")
    check_system(args.system, "--system")
    from perfcheck.measure.sampler import validate_interval

    try:
        validate_interval(args.sample_interval)
    except UserError as exc:
        raise UserError(f"--sample-interval: {exc}") from None
    import torch

    import perfcheck.rundir as runs
    from perfcheck.examples.models import EXAMPLES
    from perfcheck.session.api import PerfCheck

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is available")
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu")
    if args.steps < 1:
        raise UserError(f"--steps must be at least 1, got {args.steps}")
    example = EXAMPLES[args.model]
    batch = args.batch_size if args.batch_size is not None else example.default_batch
    if batch < 1:
        raise UserError(f"--batch-size must be at least 1, got {batch}")
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = example.build().to(device)
    inputs, target = example.batch(batch, gen)
    inputs, target = tuple(t.to(device) for t in inputs), target.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out = args.out or runs.new_run_dir("runs", args.model)
    pc = PerfCheck(model, warmup=args.warmup, steps=args.steps, profile=not args.no_profile,
                   profile_window=window, count_flops=not args.no_flops,
                   sample_interval=args.sample_interval, out_dir=out, overhead_pairs=args.overhead_pairs,
                   system=args.system)
    limit = args.warmup + args.steps + 2 * args.overhead_pairs + sum(window) + 2
    with pc:
        for _ in range(limit):
            if pc.done:
                break
            loss = example.loss(model(*inputs), target)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            pc.step()
    steps = pc.steps()
    measured = steps[steps["role"] == "measured"]
    ovh = pc.overhead
    ovh_text = f"{ovh['fraction'] * 100:+.1f}% ({ovh['pairs']} pairs)" if isinstance(ovh, dict) else ovh
    med = measured["step_s"].median() if len(measured) else math.nan
    print(f"perfcheck run: {example.description}, batch {batch}, {device}")
    print(f"  {len(measured)} measured steps, median step {med * 1e3:.3f} ms, hook overhead {ovh_text}")
    print(f"  wrote {out}/rank{pc.rank}/ (modules.csv, steps.csv, kernels.csv, samples.csv, meta.json"
          f"{', trace.json' if not args.no_profile else ''}, predicted.csv)")
    print(f"  next: perfcheck report {out}")
    return 0
