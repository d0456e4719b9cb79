"""A design-set model's convolutions, each in a tight loop (aten forward; aten.convolution_backward, both gradients),
beside the estimator's price of that call: its device time (roofline at the class's efficiency) plus the class's
fixed cost per call (op_fixed_s[<class>], <class>:bwd), from a saved calibration table re-fitted (a CAL path that
does not exist yet: a quick calibration now, saved there). The backward also priced from the same table without its
``<class>:gemm_call`` rows (predict.gemm_calls: the per-call term left out, the class efficiency from its case alone).
One thread,
process CPU time, second fastest of 5 loops of ~20 ms each. Also the CPU backend torch selects for the call
(torch._C._select_conv_backend). Design-set models only (bench/heldout.py's SPLIT); extra shapes may be given
as N,Cin,H,Cout,k,stride,groups.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/conv_class_probe.py CAL.csv tv_mobilenet_v3 \
        tv_resnet18 [4,64,16,128,1,2,1 ...]
"""
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402  (puts this tree's perfcheck first on the path)
from perfcheck.calibrate.layers import CallModule  # noqa: E402
from perfcheck.predict import module_estimator as me  # noqa: E402
from perfcheck.predict import trace as tracing  # noqa: E402
from perfcheck.predict.gemm_calls import GEMM_CALL_SUFFIX  # noqa: E402
from perfcheck.predict.host import _fixed_bwd, _fixed_cost  # noqa: E402
from conv_grad_split import cpu_time  # noqa: E402  (one timing loop for both scripts)

aten = torch.ops.aten


def model_convs(name):
    """(x shape, conv module) of each distinct nn.Conv2d call a design-set model's forward makes."""
    if name not in heldout.SPLIT["design"]:
        raise SystemExit(f"{name}: not a design-set model (bench/heldout.py SPLIT); the scoring set is only scored")
    w = heldout.build(name)
    seen, out = set(), []

    def hook(m, inp, _out):
        key = (tuple(inp[0].shape), tuple(m.weight.shape), m.stride, m.groups)
        if key not in seen:
            seen.add(key)
            out.append((tuple(inp[0].shape), m))
    hs = [m.register_forward_hook(hook) for m in w.model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        w.model(*w.inputs)
    for h in hs:
        h.remove()
    return [(xs, tuple(m.weight.shape), int(m.stride[0]), int(m.padding[0]), int(m.groups)) for xs, m in out]


def predicted(spec, xs, ws, stride, pad, groups):
    """(class, device fwd, device bwd, fixed fwd, fixed bwd) seconds of one conv2d call (input and weight need grads)."""
    x = torch.randn(*xs, requires_grad=True)
    w = torch.randn(*ws, requires_grad=True)
    fn = CallModule(lambda x, w: torch.nn.functional.conv2d(x, w, None, stride, pad, 1, groups))
    tr = tracing.trace_model(fn, (x, w), fused_dropout=False)
    ops = me._time_ops(me._op_table(tr, False), spec, torch.float32)
    r = ops[ops["name"] == "convolution"].iloc[0]
    fixed = dict(spec.op_fixed_s or {})
    f = _fixed_cost(fixed, "convolution", r.op_class)
    fb = _fixed_bwd(fixed, r.op_class, f, r.kernels_bwd, r.kernels_fwd)
    return r.op_class, r.t_fwd, r.t_bwd, f, fb


def main(cal, args):
    torch.set_num_threads(1)
    if not Path(cal).is_file():
        heldout.calibration(None, cal, print)
    spec, _ = heldout.calibration(cal, None, print)
    table = pd.read_csv(cal, keep_default_na=True)
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        table[~table["label"].astype(str).str.contains(GEMM_CALL_SUFFIX, regex=False)].to_csv(f.name, index=False)
    spec_without, _ = heldout.calibration(f.name, None, print)
    Path(f.name).unlink()
    shapes = []
    for a in args:
        if "," in a:
            n, ci, h, co, k, s, g = (int(v) for v in a.split(","))
            shapes.append(("shape", (n, ci, h, h), (co, ci // g, k, k), s, k // 2, g))
        else:
            shapes += [(a, *c) for c in model_convs(a)]
    print("| source | input | weight | stride | groups | backend | class | fwd us | pred fwd us (fixed) | fwd meas/pred "
          "| bwd us | pred bwd us (fixed) | bwd meas/pred | without the call term: pred bwd us | meas/pred |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for src, xs, ws, s, p, g in shapes:
        x, w = torch.randn(*xs), torch.randn(*ws)
        y = torch.nn.functional.conv2d(x, w, None, s, p, 1, g)
        gy = torch.randn_like(y)
        backend = str(torch._C._select_conv_backend(x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], g, None))
        tf = cpu_time(lambda: torch.nn.functional.conv2d(x, w, None, s, p, 1, g))
        tb = cpu_time(lambda: aten.convolution_backward(gy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], g,
                                                        [True, True, False]))
        cls, df, db, ff, fb = predicted(spec, xs, ws, s, p, g)
        _, _, db0, _, fb0 = predicted(spec_without, xs, ws, s, p, g)
        print(f"| {src} | {xs} | {ws} | {s} | {g} | {backend.split('.')[-1]} | {cls} | {tf * 1e6:.1f} | "
              f"{(df + ff) * 1e6:.1f} ({ff * 1e6:.0f}) | {tf / (df + ff):.2f} | {tb * 1e6:.1f} | "
              f"{(db + fb) * 1e6:.1f} ({fb * 1e6:.0f}) | {tb / (db + fb):.2f} | {(db0 + fb0) * 1e6:.1f} | "
              f"{tb / (db0 + fb0):.2f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
