"""Recurrent layers torch runs natively on a CPU (nn.GRU, nn.RNN: no oneDNN path), measured against the estimator,
per layer and per aten op family, forward and backward.

Why: a native recurrent layer runs ~10 tiny ops per time step (forward: addmm h W_hh^T, unsafe_split, sigmoid_,
tanh_, add, mul, sub; backward: mm dX, mm dW, the gate backward ops and the engine's gradient accumulation add_s),
a class of ops no design model spends its time in. This finds which of them the estimator over-prices.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/native_rnn.py \
        --calibration CAL.csv [--measured M.csv] [--repeats 9] [--ops] [--layers a,b]

(a --calibration file that does not exist is written by a quick calibration run right after the measurement)

Layers (shapes chosen apart from any scoring model's: hidden 48/96/256, input 32/200, batch 4/32, seq 16/64).
Measured: process CPU time, one intra-op thread, the layers interleaved per repeat, medians (forward = the call,
backward = ``out.backward``). ``--ops``: one extra torch.profiler pass per layer, self CPU time per aten op name in
the forward and in the backward (the profiler adds ~1 us per op: read it as shares, not absolute times), beside
the estimator's per-op-name host and device seconds on the same spec (``per_op_prediction``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from perfcheck.calibrate.fit import build_spec  # noqa: E402
from perfcheck.hardware.systems import host_constants  # noqa: E402
from perfcheck.predict import host, module_estimator, trace as tracing  # noqa: E402
from perfcheck.schema import ROOT  # noqa: E402
import perfcheck  # noqa: E402


def layers() -> dict:
    """name -> (module, input): native recurrent layers at shapes of no scoring model (batch_first)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)

    def x(b, t, i):
        return torch.rand(b, t, i, generator=g, requires_grad=True)

    return {
        "GRU 32->96 b4 t64": (torch.nn.GRU(32, 96, batch_first=True), x(4, 64, 32)),
        "GRU 200->48 b32 t16 bi": (torch.nn.GRU(200, 48, batch_first=True, bidirectional=True), x(32, 16, 200)),
        "GRU 32->256 b32 t16": (torch.nn.GRU(32, 256, batch_first=True), x(32, 16, 32)),
        "RNN 32->96 b4 t64": (torch.nn.RNN(32, 96, batch_first=True), x(4, 64, 32)),
        "RNN 200->256 b32 t16 bi": (torch.nn.RNN(200, 256, batch_first=True, bidirectional=True), x(32, 16, 200)),
        "RNN 32->48 b32 t64": (torch.nn.RNN(32, 48, batch_first=True), x(32, 64, 32)),
    }


def _out(y):
    return y[0] if isinstance(y, tuple) else y


def measure(mods: dict, repeats: int) -> dict:
    """name -> (forward s, backward s): process-time medians, layers interleaved per repeat (3 warm-ups)."""
    times = {n: ([], []) for n in mods}
    for r in range(repeats + 3):
        for name, (m, x) in mods.items():
            t0 = time.process_time()
            out = _out(m(x))
            t1 = time.process_time()
            out.backward(torch.ones_like(out))
            t2 = time.process_time()
            m.zero_grad(set_to_none=True)
            x.grad = None
            if r >= 3:
                times[name][0].append(t1 - t0)
                times[name][1].append(t2 - t1)
    return {n: (statistics.median(f), statistics.median(b)) for n, (f, b) in times.items()}


def profile_ops(m, x) -> pd.DataFrame:
    """Self CPU seconds and calls per aten op name, forward and backward (torch.profiler, one pass after warm-up)."""
    from torch.profiler import ProfilerActivity, profile

    out = _out(m(x))
    out.backward(torch.ones_like(out))
    rows = []
    for phase in ("fwd", "bwd"):
        out = _out(m(x)) if phase == "bwd" else None
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            if phase == "fwd":
                out = _out(m(x))
            else:
                out.backward(torch.ones_like(out))
        for e in prof.key_averages():
            if e.key.startswith("aten::"):
                rows.append((phase, e.key[6:], e.count, e.self_cpu_time_total / 1e6))
        m.zero_grad(set_to_none=True)
        x.grad = None
    return pd.DataFrame(rows, columns=["phase", "name", "calls", "meas_self_s"])


def spec_from(calibration: str):
    table = pd.read_csv(calibration, keep_default_na=True)
    table["dtype"] = table["dtype"].fillna("")
    return build_spec("cpu", table, peaks="measured", stamp="saved table", kind="cpu", threads=1)


def predicted(m, x, spec) -> tuple:
    root = perfcheck.estimate(m, (x,), system=spec).set_index("module").loc[ROOT]
    return float(root["pred_fwd_s"]), float(root["pred_bwd_s"])


def per_op_prediction(m, x, spec) -> pd.DataFrame:
    """Per aten op name and phase: the estimator's calls, host seconds and device seconds (the terms
    ``host.module_times`` adds; module-call and AccumulateGrad terms are not per op and left out)."""
    trace = tracing.trace_model(m, (x,))
    ops = module_estimator._time_ops(module_estimator._op_table(trace, False), spec, torch.float32, trace)
    seq, _ = host.op_sequence(trace, ops)
    hc = host_constants(spec)
    op_fixed, cold = host.dtype_host_terms(spec, hc, torch.float32)
    h_f, h_b = host._host_arrays(seq, host._with_cold(hc, spec, torch.float32, cold), op_fixed, by_class=True)
    seq = seq.assign(h_fwd=h_f, h_bwd=h_b)
    rows = []
    for name, g in seq.groupby("name"):
        fwd = g[~g["accumulate"]]
        if len(fwd):
            rows.append(("fwd", name, len(fwd), fwd["h_fwd"].sum(), fwd["t_fwd"].sum()))
        b = g[(g["node"] | g["accumulate"])]
        if len(b):
            rows.append(("bwd", name, len(b), b["h_bwd"].sum(), b["t_bwd"].sum()))
    return pd.DataFrame(rows, columns=["phase", "name", "pred_calls", "pred_host_s", "pred_device_s"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", required=True,
                    help="a saved calibration table (heldout --save-calibration); absent: a quick calibration "
                         "right after the measurement, saved there")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--measured", default=None, help="a CSV of the layers' measured times: read where it exists, "
                                                     "else written after measuring")
    ap.add_argument("--layers", default=None, help="comma-separated subset of the layer names")
    ap.add_argument("--ops", action="store_true", help="also the per-op-name profile beside the prediction")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    mods = layers()
    if args.layers:
        keep = args.layers.split(",")
        mods = {n: v for n, v in mods.items() if n in keep}
    if args.measured and Path(args.measured).exists():  # one measurement, predicted by two trees
        saved = pd.read_csv(args.measured).set_index("layer")
        meas = {n: (float(saved.loc[n, "fwd_s"]), float(saved.loc[n, "bwd_s"])) for n in mods}
    else:
        meas = measure(mods, args.repeats)
        if args.measured:
            pd.DataFrame([(n, f, b) for n, (f, b) in meas.items()], columns=["layer", "fwd_s", "bwd_s"]).to_csv(
                args.measured, index=False)
    if not Path(args.calibration).exists():  # a quick calibration right after the measurement: one machine state
        from perfcheck.calibrate.run import calibrate
        calibrate("cpu", mode="quick", device="cpu", comm=False, threads=1, name="auto",
                  clock="process").measurements.to_csv(args.calibration, index=False)
    spec = spec_from(args.calibration)
    print("| layer | measured fwd / bwd ms | predicted fwd / bwd ms | meas/pred fwd / bwd |\n|---|---|---|---|")
    for name, (m, x) in mods.items():
        pf, pb = predicted(m, x, spec)
        mf, mb = meas[name]
        print(f"| {name} | {mf * 1e3:.2f} / {mb * 1e3:.2f} | {pf * 1e3:.2f} / {pb * 1e3:.2f} | "
              f"{mf / pf:.2f} / {mb / pb:.2f} |")
    if args.ops:
        pd.set_option("display.width", 200)
        for name, (m, x) in mods.items():
            prof = profile_ops(m, x)
            pred = per_op_prediction(m, x, spec)
            both = prof.merge(pred, on=["phase", "name"], how="outer").fillna(0.0)
            both["pred_s"] = both["pred_host_s"] + both["pred_device_s"]
            both = both.sort_values(["phase", "pred_s"], ascending=[False, False])
            for c in ("meas_self_s", "pred_host_s", "pred_device_s", "pred_s"):
                both[c] = (both[c] * 1e6).round(0)
            print(f"\n{name} (us; measured: profiler self time)")
            print(both[both[["meas_self_s", "pred_s"]].max(axis=1) > 20].to_string(index=False))


if __name__ == "__main__":
    main()
