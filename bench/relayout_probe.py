"""Where a norm's or softmax's backward copies its gradient, per pattern and device: the profiler's ops inside the
backward op (their names, the copies counted) beside the trace's predicted copies (predict.relayout).

Why: tests/predict/test_relayout_grad.py held the walk to the CPU's copies; on CUDA five of its 54 patterns
disagreed (an H200, 2026-11-27: CUDA's softmax backward multiplies first, CUDA's dropout writes its input's gradient
row-major). This prints what each backward ran and the incoming gradient's strides, so the walk's device rules come
from the kernels' own behaviour; its CUDA output is the reference of the test's GPU-target case
(bench/gpu_results/2026-11-27-h200-late/relayout_cuda.txt). A GPU target's trace (``fused_dropout``) on CUDA.

    python bench/relayout_probe.py --device cuda          # on the GPU machine
    python bench/relayout_probe.py --device cpu           # here
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "predict"))
import test_relayout_grad as patterns  # noqa: E402


def backward_children(model, x, backward_op: str) -> list[str]:
    """Names of every op under ``backward_op`` in one profiled backward (after a warm one)."""
    out = model(x)
    out.backward(torch.ones_like(out))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = model(x)
        out.backward(torch.ones_like(out))
    names = []
    for event in prof.events():
        if event.name == backward_op:
            todo = list(event.cpu_children)
            while todo:
                child = todo.pop()
                names.append(child.name)
                todo.extend(child.cpu_children)
            names.append("|")
    return names


def with_grad_strides(fn, seen: list):
    """``fn`` whose output records the strides of the gradient that reaches it (appended to ``seen``)."""
    def wrapped(x):
        y = fn(x)
        if y.requires_grad:
            y.register_hook(lambda g: seen.append(tuple(g.stride())))
        return y
    return wrapped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    for op, (fn, backward_op) in patterns._OPS.items():
        for after_name, after in patterns._AFTERS.items():
            model = patterns._Pattern(fn, after)
            x = torch.randn(2, 16, 16, requires_grad=True)
            strides: list = []
            with patterns._constants_on(args.device):
                names = backward_children(patterns._Pattern(with_grad_strides(fn, strides), after),
                                          x.detach().to(args.device).requires_grad_(), backward_op)
            predicted = patterns._predicted_copies(model, x, backward_op, gpu=args.device != "cpu")
            measured = names.count("aten::copy_")
            flag = "ok" if measured == predicted else "DIFFERS"
            ran = " ".join(n.replace("aten::", "") for n in names)
            print(f"RELAYOUT {args.device} {op:10} {after_name:48} measured {measured} predicted {predicted} "
                  f"{flag} grad strides {strides[-1] if strides else None} | {ran}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
