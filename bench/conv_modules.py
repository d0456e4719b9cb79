"""Where a convolution module's time goes in a training step, against what calibration's tight loops time.

Why: on the held-out CNNs (bench/heldout.py) the convolution classes read 1.4-1.7x measured/predicted per module
while calibration's own cases fit. This script times every convolution module of the chosen design-set models, one
module at a time, forward and backward apart, as:

  loop     the bare aten calls calibration times (op_classes._conv_calls): ``F.conv2d`` on detached tensors and
           ``aten.convolution_backward`` (input and weight gradients), each right after the same call;
  cold     the same calls, each right after streaming 4x the L2 (sysfs) untimed: operands evicted, as in a step
           (bench/cold_operands.py did this for GEMMs);
  train    the module itself in train mode, its weight and input requiring grad: forward through ``nn.Conv2d``
           with autograd recording, backward through ``torch.autograd.backward`` (the engine, ConvolutionBackward0
           and the weight's AccumulateGrad, grads set to None before each call as ``zero_grad`` leaves them; NB
           the backward includes the engine's start, ~0.1 ms, which a step pays once, not per module);
  train cold  the same after the eviction;
  step     the module in the model's training step (bench/heldout.py's ModuleTimer, medians over ``--steps``;
           NB its hooks sit inside the timed window: a tiny Conv2d's forward read 36 us under them, 20 us bare);
  pred     the estimator's per-module forward and backward (``perfcheck.estimate`` on the whole model with the
           calibration table ``--calibration``, re-fitted with the current code).

Process CPU time, one intra-op thread; per variant the median over ``--calls`` calls, the variants interleaved call
by call. The backend column is torch's choice for the training call (``torch._C._select_conv_backend``).

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python bench/conv_modules.py --calibration CAL.csv \
        [--models tv_resnet18,tv_mobilenet_v3] [--calls 15] [--steps 5] [--csv out.csv]
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402
import perfcheck  # noqa: E402
from perfcheck.calibrate.cases import l2_cache_bytes  # noqa: E402

aten = torch.ops.aten


def conv_inputs(w) -> dict:
    """path -> (module, a copy of the input its forward got) for every convolution module of ``w.model``."""
    seen, handles = {}, []

    def hook(mod, args, out, path):
        seen.setdefault(path, (mod, args[0].detach().clone()))
    for path, m in w.model.named_modules():
        if isinstance(m, torch.nn.modules.conv._ConvNd):
            handles.append(m.register_forward_hook(lambda mod, args, out, path=path: hook(mod, args, out, path)))
    with torch.no_grad():
        w.model(*w.inputs)
    for h in handles:
        h.remove()
    return seen


def variants(m, x, needs_input_grad: bool) -> dict:
    """name -> zero-argument callable for each timed variant of module ``m`` on input ``x``."""
    wd = m.weight.detach()
    bd = m.bias.detach() if m.bias is not None else None
    nd = x.dim() - 2
    with torch.no_grad():
        y = m(x)
    g = torch.randn_like(y)
    args = dict(bias_sizes=[wd.shape[0]] if bd is not None else None, stride=list(m.stride),
                padding=list(m.padding), dilation=list(m.dilation), transposed=False, output_padding=[0] * nd,
                groups=m.groups, output_mask=[needs_input_grad, True, bd is not None])
    conv = torch.nn.functional.conv2d if nd == 2 else torch.nn.functional.conv1d
    xt = x.clone().requires_grad_(needs_input_grad)
    state = {}

    def train_fwd():
        state["y"] = m(xt)

    def train_bwd():
        torch.autograd.backward(state["y"], g)

    def reset():  # what zero_grad(set_to_none=True) leaves before the step's backward; a fresh graph
        for p in m.parameters():
            p.grad = None
        xt.grad = None
        state["y"] = m(xt)
    return {"loop fwd": (lambda: conv(x, wd, bd, m.stride, m.padding, m.dilation, m.groups), None),
            "loop bwd": (lambda: aten.convolution_backward(g, x, wd, **args), None),
            "train fwd": (train_fwd, None),
            "train bwd": (train_bwd, reset)}


def time_module(m, x, needs_input_grad, flush, calls: int) -> dict:
    """Medians (s) of each variant hot (after the same call) and cold (after the flush), interleaved."""
    m.train()
    for p in m.parameters():
        p.requires_grad_(True)
    fns = variants(m, x, needs_input_grad)
    rec = {f"{k}{c}": [] for k in fns for c in ("", " cold")}
    now = time.process_time
    for i in range(calls + 2):
        for name, (fn, prep) in fns.items():
            for cold in (False, True):
                if prep:
                    prep()
                else:
                    fn()  # the same call just before: hot operands
                if cold:
                    flush.add_(1.0)
                t0 = now()
                fn()
                t1 = now()
                if i >= 2:
                    rec[f"{name}{' cold' if cold else ''}"].append(t1 - t0)
    return {k: float(np.median(v)) for k, v in rec.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", required=True, help="a saved calibration table (heldout --save-calibration)")
    ap.add_argument("--models", default="tv_resnet18,tv_mobilenet_v3")
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--csv", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    l2 = l2_cache_bytes()
    flush = torch.empty(4 * l2 // 4)
    spec, _ = heldout.calibration(args.calibration, None, print)
    rows = []
    for name in args.models.split(","):
        w = heldout.build(name)
        opt = w.optimizer(w.model.parameters())
        pred = perfcheck.estimate(w.model, w.inputs, system=spec, optimizer=opt)
        pmod = {r.module: (float(r.pred_fwd_s), float(r.pred_bwd_s)) for r in pred.itertuples()}
        convs = conv_inputs(w)
        w.model.train()
        for _ in range(2):  # warm-up steps
            w.loss(w.model(*w.inputs), w.target).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        step = heldout.hooked_steps(w, opt, heldout.ModuleTimer({p: m for p, (m, _) in convs.items()}),
                                    args.steps).medians()
        first = next(iter(convs))
        for path, (m, x) in convs.items():
            needs = path != first  # the stem's input (the batch) needs no gradient
            t = time_module(m, x, needs, flush, args.calls)
            backend = torch._C._select_conv_backend(
                x.requires_grad_(needs), m.weight, m.bias, list(m.stride), list(m.padding), list(m.dilation), False,
                [0] * (x.dim() - 2), m.groups, None)
            x.requires_grad_(False)
            rows.append({"model": name, "module": path, "shape": f"{tuple(x.shape)} {tuple(m.weight.shape)} "
                         f"g{m.groups} s{m.stride[0]}", "backend": str(backend).split(".")[-1],
                         **{k: v * 1e6 for k, v in t.items()},
                         "step fwd": step[path][0] * 1e6, "step bwd": step[path][1] * 1e6,
                         "pred fwd": pmod[path][0] * 1e6, "pred bwd": pmod[path][1] * 1e6})
            print(path, {k: round(v) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
    df = pd.DataFrame(rows)
    if args.csv:
        df.to_csv(args.csv, index=False)
    print(f"\nDate: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; torch {torch.__version__}; "
          f"1 thread; process CPU time; L2 {l2 >> 10} KiB, flush {4 * l2 >> 20} MiB; {args.calls} calls, "
          f"{args.steps} steps; calibration {args.calibration}\n")
    print(summary(df))


def summary(df: pd.DataFrame) -> str:
    """Per model and backend: medians of each variant over the predicted time, forward and backward apart."""
    out = ["| model | backend | n | phase | loop/pred | cold/pred | train/pred | train cold/pred | step/pred |",
           "|---|---|---|---|---|---|---|---|---|"]
    for (model, backend), d in df.groupby(["model", "backend"]):
        for ph in ("fwd", "bwd"):
            r = [np.median(d[col] / d[f"pred {ph}"])
                 for col in (f"loop {ph}", f"loop {ph} cold", f"train {ph}", f"train {ph} cold", f"step {ph}")]
            out.append(f"| {model} | {backend} | {len(d)} | {ph} | " + " | ".join(f"{x:.2f}" for x in r) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
