"""Normalizations and Linear on contiguous and permuted (channels-last view) inputs: measured against predicted.

Per case (a small module and its input, shapes chosen here, none a held-out model's exact shape): the forward and
the backward of one step timed with the process clock (one thread), the cases interleaved round by round, medians;
beside each the estimator's forward and backward for the same module (this tree's code, a saved calibration
table re-fitted as bench/heldout.py does). With ``--ops``: each case's aten ops under torch.profiler (median CPU time
per call over the rounds) beside the estimator's device time of the traced op (host fixed costs not included).

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/norm_permuted.py CAL.csv [--rounds 15] [--ops]
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402  (puts this tree's perfcheck first on the path)
import perfcheck  # noqa: E402
from perfcheck.predict import module_estimator as me  # noqa: E402
from perfcheck.predict import trace as tracing  # noqa: E402


class Permuted(nn.Module):
    """``inner`` applied to the (N, H, W, C) view of an (N, C, H, W) input, as torchvision's CNBlock does."""

    def __init__(self, inner, back=False):
        super().__init__()
        self.inner, self.back = inner, back

    def forward(self, x):
        y = self.inner(x.permute(0, 2, 3, 1))
        return y.permute(0, 3, 1, 2) if self.back else y


class PyRMS(nn.Module):
    """RMSNorm written in Python (``x * rsqrt(mean(x^2) + eps) * w``), as HF Llama's ``LlamaRMSNorm`` is."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def _cnblock(c):
    heldout._torchvision()
    from torchvision.models.convnext import CNBlock

    return CNBlock(c, layer_scale=1e-6, stochastic_depth_prob=0.0)


def cases():
    """(name, module factory, input shape): NCHW shapes (n, c, h, w), rows of the row-wise norms are n*h*w."""
    out = []
    for n, c, h in ((2, 48, 24), (2, 24, 40), (2, 96, 12)):
        s = (n, c, h, h)
        tag = f"{n}x{c}x{h}x{h}"
        out += [(f"LayerNorm contiguous {tag}", lambda c=c: _Last(nn.LayerNorm(c)), s),
                (f"LayerNorm permuted {tag}", lambda c=c: Permuted(nn.LayerNorm(c)), s),
                (f"RMSNorm contiguous {tag}", lambda c=c: _Last(nn.RMSNorm(c)), s),
                (f"RMSNorm permuted {tag}", lambda c=c: Permuted(nn.RMSNorm(c)), s),
                (f"PyRMS contiguous {tag}", lambda c=c: _Last(PyRMS(c)), s),
                (f"PyRMS permuted {tag}", lambda c=c: Permuted(PyRMS(c)), s),
                (f"GroupNorm(8) NCHW {tag}", lambda c=c: nn.GroupNorm(8, c), s),
                (f"Linear 4x contiguous {tag}", lambda c=c: _Last(nn.Linear(c, 4 * c)), s),
                (f"Linear 4x permuted {tag}", lambda c=c: Permuted(nn.Linear(c, 4 * c)), s),
                (f"CNBlock {tag}", lambda c=c: _cnblock(c), s),
                (f"CNBlock channels-last {tag}", lambda c=c: _cnblock(c), s + ("nhwc",))]
    return out


class _Last(nn.Module):
    """``inner`` on the contiguous (N, H, W, C) tensor (the input arrives as NCHW-shaped storage reshaped)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        n, c, h, w = x.shape
        return self.inner(x.reshape(n, h, w, c))


def _input(shape):
    """A leaf input of NCHW ``shape``; ``(..., "nhwc")``: in channels-last memory, as ConvNeXt's blocks get theirs."""
    if shape[-1] == "nhwc":
        return torch.randn(*shape[:-1]).contiguous(memory_format=torch.channels_last).requires_grad_(True)
    return torch.randn(*shape).requires_grad_(True)


def measure(mods, xs, rounds):
    """Per case: medians of forward and backward process times (s) over ``rounds`` interleaved rounds; the backward
    from a dense output gradient, as a layer inside a model gets one."""
    fwd, bwd = collections.defaultdict(list), collections.defaultdict(list)
    grads = [torch.randn_like(m(x)) for m, x in zip(mods, xs)]  # dense: an expanded sum() gradient gets copied
    for r in range(rounds + 2):
        for i, (m, x) in enumerate(zip(mods, xs)):
            t0 = time.process_time_ns()
            y = m(x)
            t1 = time.process_time_ns()
            y.backward(grads[i])
            t2 = time.process_time_ns()
            for p in m.parameters():
                p.grad = None
            x.grad = None
            if r >= 2:
                fwd[i].append((t1 - t0) / 1e9)
                bwd[i].append((t2 - t1) / 1e9)
    return [(statistics.median(fwd[i]), statistics.median(bwd[i])) for i in range(len(mods))]


def profiled_ops(m, x, rounds):
    """aten op name -> median CPU total per call (us), outermost aten ops of the forward and of the backward."""
    g = torch.randn_like(m(x))
    for _ in range(2):
        m(x).backward(g)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(rounds):
            m(x).backward(g)
            for p in m.parameters():
                p.grad = None
            x.grad = None
    per = collections.defaultdict(list)
    for ev in prof.events():
        if ev.name.startswith("aten::") and (ev.cpu_parent is None or not ev.cpu_parent.name.startswith("aten::")):
            per[ev.name].append(ev.cpu_time_total)
    return {k: (statistics.median(v), len(v) / rounds) for k, v in per.items()}


def predicted_ops(m, x, spec):
    """(op, phase) -> summed device time (us) of the traced ops, per step."""
    tr = tracing.trace_model(m, (x,), fused_dropout=False)
    ops = me._time_ops(me._op_table(tr, False), spec, torch.float32, tr)
    out = collections.Counter()
    for r in ops.itertuples():
        out[(r.name, "fwd")] += r.t_fwd * 1e6
        out[(r.name, "bwd")] += r.t_bwd * 1e6
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("calibration")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--ops", action="store_true")
    ap.add_argument("--only", default="", help="substring of the case names to run")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec, _ = heldout.calibration(args.calibration, None, print)
    sel = [c for c in cases() if args.only in c[0]]
    mods = [f() for _, f, _ in sel]
    xs = [_input(s) for _, _, s in sel]
    meas = measure(mods, xs, args.rounds)
    print("| case | fwd meas us | fwd pred us | fwd m/p | bwd meas us | bwd pred us | bwd m/p |")
    print("|---|---|---|---|---|---|---|")
    for (name, _, _), m, x, (mf, mb) in zip(sel, mods, xs, meas):
        p = perfcheck.estimate(m, (x,), system=spec)
        root = p.iloc[0]
        pf, pb = float(root.pred_fwd_s), float(root.pred_bwd_s)
        print(f"| {name} | {mf * 1e6:.0f} | {pf * 1e6:.0f} | {mf / pf:.2f} | {mb * 1e6:.0f} | {pb * 1e6:.0f} | "
              f"{mb / pb:.2f} |")
    if not args.ops:
        return
    for (name, _, _), m, x in zip(sel, mods, xs):
        print(f"\n{name}: profiled aten ops (median us per call, calls per step) | predicted device time per step "
              "(op, phase: us)")
        for k, (t, calls) in sorted(profiled_ops(m, x, args.rounds).items(), key=lambda kv: -kv[1][0] * kv[1][1]):
            print(f"  {k:40s} {t:8.1f} x{calls:.0f}")
        for (op, ph), t in sorted(predicted_ops(m, x, spec).items(), key=lambda kv: -kv[1]):
            if t > 0.5:
                print(f"  pred {op:35s} {ph} {t:8.1f}")


if __name__ == "__main__":
    main()
