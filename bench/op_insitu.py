"""Per (aten op, input shape): the CPU time of a training step's ops where the step runs them (torch.profiler, one
thread, 5 steps after 3 warm-up steps, median per call) beside the estimator's device time for that op and phase (this
tree's code, a saved calibration table re-fitted). Host fixed costs (op_fixed_s, dispatch) are not in the predicted
column; the profiler adds a few us per call. Design-set models only (bench/heldout.py's SPLIT).

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/op_insitu.py CAL.csv tv_resnet18 tv_mobilenet_v3
"""
import collections
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402  (puts this tree's perfcheck first on the path)
from perfcheck.predict import module_estimator as me  # noqa: E402
from perfcheck.predict import trace as tracing  # noqa: E402

BWD = {"aten::convolution_backward": ("convolution", 1), "aten::native_batch_norm_backward": ("native_batch_norm", 1),
       "aten::threshold_backward": ("relu_", 1), "aten::max_pool2d_with_indices_backward": ("max_pool2d_with_indices", 1),
       "aten::hardswish_backward": ("hardswish_", 1), "aten::hardsigmoid_backward": ("hardsigmoid", 1),
       "aten::native_layer_norm_backward": ("native_layer_norm", 1), "aten::gelu_backward": ("gelu", 1),
       "aten::_softmax_backward_data": ("_softmax", 1)}
FWD = {"aten::convolution": "convolution", "aten::native_batch_norm": "native_batch_norm", "aten::relu_": "relu_",
       "aten::max_pool2d_with_indices": "max_pool2d_with_indices", "aten::add_": "add_", "aten::mean": "mean",
       "aten::hardswish_": "hardswish_", "aten::addmm": "addmm", "aten::native_layer_norm": "native_layer_norm",
       "aten::gelu": "gelu", "aten::_softmax": "_softmax", "aten::add": "add"}


def main(cal, models):
    torch.set_num_threads(1)
    spec, _ = heldout.calibration(cal, None, print)
    for name in models:
        if name not in heldout.SPLIT["design"]:
            raise SystemExit(f"{name}: not a design-set model (bench/heldout.py SPLIT); the scoring set is only scored")
        w = heldout.build(name)
        tr = tracing.trace_model(w.model, w.inputs, fused_dropout=False)
        ops = me._time_ops(me._op_table(tr, False), spec, torch.float32, tr)
        pred = collections.defaultdict(list)
        for r in ops.itertuples():
            call = tr.ops[r.op].call
            a0 = call.args[0]
            if not hasattr(a0, "shape"):
                continue
            key = (r.name, tuple(a0.shape), tuple(call.args[1].shape) if r.name == "convolution" else ())
            pred[key].append((r.t_fwd, r.t_bwd, r.op_class))
        opt = w.optimizer(w.model.parameters())
        def step(w=w, opt=opt):
            w.loss(w.model(*w.inputs), w.target).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for _ in range(3):
            step()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(5):
                step()
        groups = collections.defaultdict(list)
        for ev in prof.events():
            groups[(ev.name, str(ev.input_shapes))].append(ev)
        rows = []
        for (key, _), evs in groups.items():
            e = evs[0]
            shapes = e.input_shapes
            if key in FWD and shapes and shapes[0]:
                fname, phase, sh = FWD[key], "fwd", tuple(shapes[0])
            elif key in BWD and len(shapes) > 1:
                (fname, idx), phase = BWD[key], "bwd"
                sh = tuple(shapes[idx])
            else:
                continue
            wsh = tuple(shapes[1]) if fname == "convolution" and phase == "fwd" else (tuple(shapes[2]) if fname == "convolution" else ())
            p = pred.get((fname, sh, wsh))
            if not p:
                continue
            t = p[0][0] if phase == "fwd" else p[0][1]
            rows.append((name, fname, phase, p[0][2], sh, wsh, len(evs) // 5, statistics.median(x.cpu_time_total for x in evs), t * 1e6))
        rows.sort(key=lambda r: (r[1], r[2], r[4]))
        print("| model | op | phase | class | input | weight | calls/step | measured us | predicted us | meas/pred |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5] or ''} | {r[6]} | {r[7]:.1f} | {r[8]:.1f} | {r[7] / max(r[8], 1e-9):.2f} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
