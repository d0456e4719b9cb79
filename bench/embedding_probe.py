"""Embedding modules of the held-out DESIGN models: predicted vs measured, in a training step and alone.

Per Embedding / EmbeddingBag module of a design model (bench/heldout.py SPLIT["design"]):
  step_hooked  -- fwd+bwd in a training step, timed by heldout's ModuleTimer (the benchmark's own number),
  alone        -- the same module on the same inputs in a loop (fwd, then y.backward(fixed gradient): the
                  engine's start included; grads set to None as the benchmark's optimizer does), no hooks,
  alone_hooked -- the same loop with ModuleTimer on the module (backward: first node start to last node end),
  predicted    -- the module's row of perfcheck.estimate on the whole model (as heldout.py predicts it), with the
                  spec re-fitted from a saved calibration table (``--calibration``: heldout.py --save-calibration),
plus the minor page faults inside the module's backward window (getrusage), in the step and alone.
Also the ModuleTimer's own cost per hook call (``hook_cost``). Process CPU time, one thread throughout.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/embedding_probe.py --calibration cal.csv
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import heldout  # noqa: E402
import perfcheck  # noqa: E402

DESIGN_EMBEDDING_MODELS = ("wide_deep", "lstm_lm", "nn_encoder", "hf_bert")


def _inputs_of(model, inputs, modules):
    """(args, kwargs) each module in ``modules`` got in one forward of ``model``."""
    got, hs = {}, []
    for path, m in modules.items():
        hs.append(m.register_forward_pre_hook(
            lambda mod, a, k, p=path: got.setdefault(p, (a, k)), with_kwargs=True))
    with torch.no_grad():
        model(*inputs)
    for h in hs:
        h.remove()
    return got


def _loop(m, args, kwargs, reps, timer=None):
    """Median fwd and bwd process seconds of ``m(*args, **kwargs)`` and its backward of a fixed gradient."""
    now, fw, bw = time.process_time, [], []
    g = torch.randn_like(m(*args, **kwargs))
    for i in range(reps + 3):
        if timer:
            timer.new_step()
        t0 = now()
        y = m(*args, **kwargs)
        t1 = now()
        y.backward(g)
        t2 = now()
        del y  # the graph (and its AccumulateGrad nodes, which carry the timer's hooks) dies, as in a step
        for p in m.parameters():
            p.grad = None
        if i >= 3:
            fw.append(t1 - t0)
            bw.append(t2 - t1)
            if timer:
                timer.end_step()
    return float(np.median(fw)), float(np.median(bw))


class FaultTimer(heldout.ModuleTimer):
    """heldout's ModuleTimer that also counts the minor page faults between a module's first backward node start
    and its last node end (getrusage ru_minflt)."""

    def __init__(self, modules):
        super().__init__(modules)
        self.faults = {p: [] for p in modules}

    def _bwd_pre(self, r):
        timed = super()._bwd_pre(r)

        def hook(grad_out):
            timed(grad_out)
            r["cur"].setdefault("f_0", resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
        return hook

    def _bwd_post(self, r):
        timed = super()._bwd_post(r)

        def hook(grad_in, grad_out):
            timed(grad_in, grad_out)
            r["cur"]["f_1"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        return hook

    def end_step(self):
        super().end_step()
        for p, r in self.rec.items():
            if "f_0" in r["cur"] and "f_1" in r["cur"]:
                self.faults[p].append(r["cur"]["f_1"] - r["cur"]["f_0"])


def _step_hooked(w, modules, steps):
    opt = w.optimizer(w.model.parameters())
    for _ in range(2):
        w.loss(w.model(*w.inputs), w.target).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    timer = heldout.hooked_steps(w, opt, FaultTimer(modules), steps)
    faults = {p: float(np.median(f)) if f else np.nan for p, f in timer.faults.items()}
    return timer.medians(), faults


class _Chain(torch.nn.Module):
    """``k`` tiny multiplies in one module: ``k`` autograd nodes whose own work is ~1 us each."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        for _ in range(self.k):
            x = x * 1.0
        return x


def hook_cost(k=64, reps=200):
    """Seconds per hook call the ModuleTimer adds to a backward: the whole ``y.backward()`` of a ``k``-node chain
    with the timer on the module (a pre and a post hook on each of its k + 1 nodes, AccumulateGrad included) less
    the same without, over 2 (k + 1) hook calls; medians over ``reps`` calls, both in the same process."""
    m, x = _Chain(k), torch.randn(16, requires_grad=True)
    bare = _loop(m, (x,), {}, reps)[1]
    timer = heldout.ModuleTimer({"c": m})
    with timer:
        hooked = _loop(m, (x,), {}, reps, timer)[1]
    return (hooked - bare) / (2 * (k + 1)), bare, hooked


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--models", default=",".join(DESIGN_EMBEDDING_MODELS))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--steps", type=int, default=7)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    keep = args.models.split(",")
    if any(m not in heldout.SPLIT["design"] for m in keep):
        raise SystemExit("design models only")
    spec, _ = heldout.calibration(args.calibration, None, print)
    per, bare, hooked = hook_cost()
    print(f"ModuleTimer hook cost: a 64-node chain's backward {bare * 1e6:.1f} us bare, {hooked * 1e6:.1f} us hooked:"
          f" {per * 1e6:.2f} us per hook call; inside an Embedding module's window (2 nodes: the first node's"
          f" post hook, AccumulateGrad's pre hook, ~1 more in parts) ~{3 * per * 1e6:.1f} us of its backward")
    print("fwd / bwd in us; ratios are fwd+bwd measured / predicted")
    print("| model | module | shape | step_hooked | alone | alone_hooked | predicted | step/pred | alone/pred |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in keep:
        w = heldout.build(name)
        mods = {p: m for p, m in w.model.named_modules()
                if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))}
        step, faults = _step_hooked(w, mods, args.steps)
        ins = _inputs_of(w.model, w.inputs, mods)
        model_pred = perfcheck.estimate(w.model, w.inputs, system=spec).set_index("module")
        for path, m in mods.items():
            a, k = ins[path]
            alone = _loop(m, a, k, args.reps)
            timer = FaultTimer({path: m})
            with timer:
                _loop(m, a, k, args.reps, timer)
            alone_h = timer.medians()[path]
            alone_faults = float(np.median(timer.faults[path]))
            row = model_pred.loc[path]
            pred = (float(row.pred_fwd_s), float(row.pred_bwd_s))
            fb = lambda t: f"{t[0] * 1e6:.0f} / {t[1] * 1e6:.0f}"  # noqa: E731
            shape = "x".join(map(str, m.weight.shape))
            print(f"| {name} | {path} | {shape} | {fb(step[path])} | {fb(alone)} | {fb(alone_h)} | {fb(pred)} | "
                  f"{sum(step[path]) / sum(pred):.2f} | {sum(alone) / sum(pred):.2f} | "
                  f"{faults[path]:.0f} / {alone_faults:.0f} |", flush=True)

if __name__ == "__main__":
    main()
