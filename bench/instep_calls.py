"""In-step versus tight-loop time of one call per module family (nn.Linear, nn.LayerNorm, nn.GELU) in a design-set
model's training step: each module's functional call (``F.linear`` / ``F.layer_norm`` / ``F.gelu``: dispatch,
autograd node, kernel) timed with the process clock inside the step, then the same call on the same input repeated
in a tight loop (as calibration times it), with minor page faults per call; and, in the step, the same call
repeated at once after the first (its code, input and weights warm; its output a fresh allocation). Why: a small memory-bound kernel reads
1.3-2x its price in a step; this separates what the step adds per call from the kernel's own rate.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/instep_calls.py hf_bert timm_vit nn_encoder
"""
import collections
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402

CALLS = {torch.nn.Linear: lambda m, x: F.linear(x, m.weight, m.bias),
         torch.nn.LayerNorm: lambda m, x: F.layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps),
         torch.nn.GELU: lambda m, x: F.gelu(x, approximate=m.approximate)}


def _faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main(models):
    torch.set_num_threads(1)
    for name in models:
        if name not in heldout.SPLIT["design"]:
            raise SystemExit(f"{name}: not a design-set model (bench/heldout.py SPLIT)")
        w = heldout.build(name)
        opt = w.optimizer(w.model.parameters())
        on, rec, last = [False], collections.defaultdict(list), {}
        for m in w.model.modules():
            kind = next((k for k in CALLS if isinstance(m, k)), None)
            call = CALLS.get(kind)
            if call is None:
                continue

            def fwd(x, m=m, call=call):
                f0, t0 = _faults(), time.process_time_ns()
                y = call(m, x)
                t1 = time.process_time_ns()
                f1 = _faults()
                if on[0]:  # the same call again at once: its code, its input and the weights now warm
                    t2 = time.process_time_ns()
                    again = call(m, x)
                    t3 = time.process_time_ns()
                    del again
                    rec[m].append(((t1 - t0) / 1e3, f1 - f0, (t3 - t2) / 1e3))
                    last[m] = x
                return y
            m.forward = fwd

        def step():
            w.loss(w.model(*w.inputs), w.target).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for _ in range(3):
            step()
        on[0] = True
        for _ in range(8):
            step()
        on[0] = False
        fam = collections.defaultdict(lambda: ([], [], [], []))
        for m, calls in rec.items():
            x = last[m].detach().clone().requires_grad_(last[m].requires_grad)
            call = CALLS[next(k for k in CALLS if isinstance(m, k))]
            tight = []
            for i in range(60):
                t0 = time.process_time_ns()
                y = call(m, x)
                t1 = time.process_time_ns()
                del y
                if i >= 10:
                    tight.append((t1 - t0) / 1e3)
            s, t = statistics.median(c[0] for c in calls), statistics.median(tight)
            f = fam[next(k for k in CALLS if isinstance(m, k)).__name__]
            f[0].append(s), f[1].append(t), f[2].append(statistics.mean(c[1] for c in calls))
            f[3].append(statistics.median(c[2] for c in calls))
        for k, (s, t, f, a) in fam.items():
            print(f"| {name} | {k} | {len(s)} | {statistics.median(t):.1f} | {statistics.median(s):.1f} | "
                  f"{statistics.median(s) - statistics.median(t):+.1f} | "
                  f"{statistics.median(a / b for a, b in zip(s, t)):.2f} | {statistics.mean(f):.1f} | {statistics.median(a):.1f} |", flush=True)


if __name__ == "__main__":
    print("| model | family | modules | tight us | in step us | excess us | in step / tight (median) | faults/call | same call again in step us |")
    print("|---|---|---|---|---|---|---|---|---|")
    main(sys.argv[1:])
