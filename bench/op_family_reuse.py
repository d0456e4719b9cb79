"""Host cost of a tiny op against the number of distinct op families run between two calls of the same family.

Why: the host model charges ``op_cold_s`` to every op whose family differs from the op before it
(perfcheck.predict.host.op_switches), measured as a round-robin over the 14 calibration ops less their tight
loops. A recurrent layer without a oneDNN path (nn.GRU, nn.RNN, a hand-written cell loop) repeats the same ~12
families every time step; if their code stays hot in the instruction cache and branch predictors, each op
costs only its tight-loop price. This script measures the excess per op of a cycle over k distinct families
(the first k of ``families()``, GRU cell ops first) against each family's tight loop:

    excess(k) = cycle(k) time per op - mean over the k families of their tight-loop time per op

with one intra-op thread and process CPU time, all (k, repeat) blocks interleaved in a shuffled order, medians
over repeats; the calibration's 14-op round-robin with each family left out; and recurrent layers without a oneDNN
path (nn.GRU, nn.RNN, a GRUCell loop) measured alone, per aten call (TorchDispatchMode), and predicted on a saved
calibration table (``--calibration``; ``--measured F.csv`` keeps one measurement for two trees' predictions).

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/op_family_reuse.py [--repeats 15]
        [--measured rec.csv --calibration cal.csv]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

KS = (1, 2, 4, 8, 12, 16, 24, 32, 48)


def families() -> list:
    """(name, fn) of 48 tiny ops from the aten families real models run, a GRU cell's first."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(8, 24, generator=g), torch.rand(8, 24, generator=g)
    w, h = torch.rand(24, 24, generator=g), torch.rand(8, 24, generator=g)
    s, i = torch.rand(8, 24, generator=g), torch.randint(0, 8, (8,), generator=g)
    bias, m = torch.rand(24, generator=g), a > 0.5
    F = torch.nn.functional
    ops = [
        ("addmm", lambda: torch.addmm(bias, h, w)), ("unsafe_split", lambda: a.unsafe_split(8, 1)),
        ("sigmoid_", lambda: s.sigmoid_()), ("tanh_", lambda: s.tanh_()), ("add", lambda: a + b),
        ("mul", lambda: a * b), ("sub", lambda: a - b), ("mm", lambda: h @ w), ("add_", lambda: s.add_(b)),
        ("mul_", lambda: s.mul_(0.5)), ("sum", lambda: a.sum(0)), ("cat", lambda: torch.cat((a, b), 1)),
        ("relu", lambda: torch.relu(a)), ("div", lambda: a / (b + 1)), ("exp", lambda: a.exp()),
        ("neg", lambda: -a), ("abs", lambda: a.abs()), ("sigmoid", lambda: a.sigmoid()), ("tanh", lambda: a.tanh()),
        ("mean", lambda: a.mean(1)), ("clamp", lambda: a.clamp(0.1, 0.9)), ("sqrt", lambda: a.sqrt()),
        ("log", lambda: (a + 1).log()), ("pow", lambda: a.pow(2)), ("maximum", lambda: torch.maximum(a, b)),
        ("where", lambda: torch.where(m, a, b)), ("softmax", lambda: a.softmax(-1)),
        ("layer_norm", lambda: F.layer_norm(a, (24,))), ("gelu", lambda: F.gelu(a)), ("silu", lambda: F.silu(a)),
        ("clone", lambda: a.clone()), ("amax", lambda: a.amax(1)), ("rsqrt", lambda: (a + 1).rsqrt()),
        ("reciprocal", lambda: (a + 1).reciprocal()), ("sin", lambda: a.sin()), ("cos", lambda: a.cos()),
        ("erf", lambda: a.erf()), ("log_softmax", lambda: a.log_softmax(-1)),
        ("bmm", lambda: torch.bmm(a.view(1, 8, 24), w.view(1, 24, 24))), ("addcmul", lambda: torch.addcmul(a, a, b)),
        ("lerp", lambda: torch.lerp(a, b, 0.3)), ("minimum", lambda: torch.minimum(a, b)), ("sign", lambda: a.sign()),
        ("floor", lambda: a.floor()), ("gt", lambda: a > b), ("masked_fill", lambda: a.masked_fill(m, 0.0)),
        ("index_select", lambda: a.index_select(0, i)), ("cumsum", lambda: a.cumsum(1)),
    ]
    assert len(ops) >= max(KS)
    return ops


def time_block(fns, n_ops: int) -> float:
    """Process seconds per op of ``n_ops`` calls cycling through ``fns``."""
    seq = [fns[j % len(fns)] for j in range(n_ops)]
    t0 = time.process_time()
    for fn in seq:
        fn()
    return (time.process_time() - t0) / n_ops


def family_sweep(repeats: int, n_ops: int) -> list:
    """Rows (k, cycle us per op, tight mean us per op, excess us per op), medians over ``repeats``."""
    ops = families()
    fns = [fn for _, fn in ops]
    for fn in fns:  # warm every path once (first-call allocations, lazy init)
        for _ in range(20):
            fn()
    blocks = [("cycle", k) for k in KS] + [("tight", j) for j in range(max(KS))]
    cyc, tight = {k: [] for k in KS}, {j: [] for j in range(max(KS))}
    rnd = random.Random(0)
    for _ in range(repeats):
        rnd.shuffle(blocks)
        for kind, k in blocks:
            if kind == "cycle":
                cyc[k].append(time_block(fns[:k], n_ops))
            else:
                tight[k].append(time_block([fns[k]], n_ops // 4))
    t_med = [statistics.median(tight[j]) for j in range(max(KS))]
    rows = []
    for k in KS:
        c, t = statistics.median(cyc[k]), statistics.mean(t_med[:k])
        rows.append((k, c * 1e6, t * 1e6, (c - t) * 1e6))
    return rows, {name: t * 1e6 for (name, _), t in zip(ops, t_med)}


class CellLoop(torch.nn.Module):
    """A hand-written GRU cell loop (nn.GRUCell over the steps of a batch-first input)."""
    def __init__(self, dim, hidden):
        super().__init__()
        self.cell, self.hidden = torch.nn.GRUCell(dim, hidden), hidden

    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.hidden)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
        return h


def recurrent_modules() -> dict:
    """name -> (module, input): recurrent layers without a oneDNN path at a design-like size (batch 8 x 32 steps,
    128 -> 256; not a scoring model's shape), and a one-step control."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(8, 32, 128, generator=g, requires_grad=True)
    torch.manual_seed(0)
    return {"nn.GRU 128->256, 8x32": (torch.nn.GRU(128, 256, batch_first=True), x),
            "nn.RNN tanh 128->256, 8x32": (torch.nn.RNN(128, 256, batch_first=True), x),
            "GRUCell loop 128->256, 8x32": (CellLoop(128, 256), x)}


def _out(y):
    return y[0] if isinstance(y, tuple) else y


def module_times(m, x, repeats: int) -> tuple:
    """(forward s, backward s, forward aten calls, backward aten calls): process time medians of ``repeats``
    (after 3 warm-ups) and the calls a TorchDispatchMode sees."""
    fwd, bwd = [], []
    for r in range(repeats + 3):
        t0 = time.process_time()
        out = _out(m(x))
        t1 = time.process_time()
        out.backward(torch.ones_like(out))
        t2 = time.process_time()
        if r >= 3:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    n_fwd, _ = _top_aten(lambda: _out(m(x)))
    n_all, _ = _top_aten(lambda: _out(m(x)).backward(torch.ones_like(_out(m(x)))))
    return statistics.median(fwd), statistics.median(bwd), n_fwd, n_all - 2 * n_fwd - 1


def predicted(m, x, calibration: str) -> tuple:
    """(forward s, backward s) the estimator predicts for ``m(x)`` on the spec re-fitted from a saved table."""
    import pandas as pd

    import perfcheck
    from perfcheck.calibrate.fit import build_spec
    from perfcheck.schema import ROOT
    table = pd.read_csv(calibration, keep_default_na=True)
    table["dtype"] = table["dtype"].fillna("")
    spec = build_spec("cpu", table, peaks="measured", stamp="saved table", kind="cpu", threads=1)
    root = perfcheck.estimate(m, (x,), system=spec).set_index("module").loc[ROOT]
    return float(root["pred_fwd_s"]), float(root["pred_bwd_s"])


def _top_aten(fn) -> tuple:
    """(number of aten calls, name -> count) that ``fn()`` dispatches below autograd (a TorchDispatchMode sees
    what perfcheck's trace records: a composite such as aten::gru appears as the ops it decomposes into)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    counts = {}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            counts[name] = counts.get(name, 0) + 1
            return func(*args, **(kwargs or {}))
    with Count():
        fn()
    return sum(counts.values()), counts


def calibration_leave_one_out(repeats: int, n_ops: int) -> list:
    """The calibration's round-robin (perfcheck.calibrate.op_cases.tiny_ops, the 14 ops whose excess is op_cold_s)
    and the same round-robin with each family left out: rows (left-out family, excess us per op), medians."""
    from perfcheck.calibrate.op_cases import tiny_ops
    ops = tiny_ops(torch.device("cpu"))
    names = list(ops)
    for fn in ops.values():
        for _ in range(20):
            fn()
    sets = [("(none)", names)] + [(n, [m for m in names if m != n]) for n in names]
    cyc, tight = {s: [] for s, _ in sets}, {n: [] for n in names}
    blocks = [("c", s) for s, _ in sets] + [("t", n) for n in names]
    members, rnd = dict(sets), random.Random(1)
    for _ in range(repeats):
        rnd.shuffle(blocks)
        for kind, key in blocks:
            if kind == "c":
                cyc[key].append(time_block([ops[m] for m in members[key]], n_ops))
            else:
                tight[key].append(time_block([ops[key]], n_ops // 4))
    t_med = {n: statistics.median(v) for n, v in tight.items()}
    return [(key, (statistics.median(cyc[key]) - statistics.mean(t_med[m] for m in members[key])) * 1e6)
            for key, _ in sets], {n: v * 1e6 for n, v in t_med.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--ops", type=int, default=960, help="ops per timed cycle block (a multiple of 48)")
    ap.add_argument("--measured", default=None, help="recurrent modules' times: read this CSV if it exists, else "
                                                     "measure them and write it (so two trees predict one measurement)")
    ap.add_argument("--calibration", default=None, help="a saved calibration table (bench/heldout.py "
                                                        "--save-calibration): predict the recurrent modules on it; absent: a quick "
                                                        "calibration right after the measurement, saved there")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.measured is None or not os.path.exists(args.measured):
        sweep(args)
    recurrent(args)


def sweep(args):
    rows, tight = family_sweep(args.repeats, args.ops)
    print("| k families | cycle us/op | tight mean us/op | excess us/op |\n|---|---|---|---|")
    for k, c, t, e in rows:
        print(f"| {k} | {c:.2f} | {t:.2f} | {e:+.2f} |")
    print("tight us/op:", ", ".join(f"{n} {v:.2f}" for n, v in tight.items()))
    loo, t_cal = calibration_leave_one_out(args.repeats, args.ops // 4 * 14 // 12)
    print("calibration round-robin (tiny_ops), excess us/op with one family left out:")
    print(", ".join(f"{n} {e:+.2f}" for n, e in loo))
    print("tight us/op:", ", ".join(f"{n} {v:.2f}" for n, v in t_cal.items()))


def recurrent(args):
    """Per recurrent module: measured forward/backward (or read from ``--measured``), calls, time per call and,
    with ``--calibration``, the prediction and measured/predicted."""
    import pandas as pd
    mods = recurrent_modules()
    if args.measured and os.path.exists(args.measured):
        meas = pd.read_csv(args.measured).set_index("module")
    else:
        meas = pd.DataFrame([(n, *module_times(m, x, args.repeats)) for n, (m, x) in mods.items()],
                            columns=["module", "fwd_s", "bwd_s", "fwd_calls", "bwd_calls"]).set_index("module")
        if args.measured:
            meas.to_csv(args.measured)
    if args.calibration and not os.path.exists(args.calibration):  # a quick calibration right after: one machine state
        from perfcheck.calibrate.run import calibrate
        calibrate("cpu", mode="quick", device="cpu", comm=False, threads=1, name="auto",
                  clock="process").measurements.to_csv(args.calibration, index=False)
    print("| module | fwd ms | bwd ms | fwd calls | bwd calls | us/call fwd | us/call bwd | pred fwd ms | pred bwd ms "
          "| meas/pred fwd | meas/pred bwd |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for n, (m, x) in mods.items():
        r = meas.loc[n]
        p = predicted(m, x, args.calibration) if args.calibration else (float("nan"),) * 2
        print(f"| {n} | {r.fwd_s * 1e3:.2f} | {r.bwd_s * 1e3:.2f} | {int(r.fwd_calls)} | {int(r.bwd_calls)} | "
              f"{r.fwd_s * 1e6 / r.fwd_calls:.2f} | {r.bwd_s * 1e6 / r.bwd_calls:.2f} | {p[0] * 1e3:.2f} | "
              f"{p[1] * 1e3:.2f} | {r.fwd_s / p[0]:.2f} | {r.bwd_s / p[1]:.2f} |")


if __name__ == "__main__":
    main()
