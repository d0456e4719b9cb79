"""What an op pays for following an op of another family, in the loops recurrent layers run, against the
calibration's near round-robin (``op_cold_near_s``).

Why: the host model adds ``op_cold_near_s`` to every computing op whose family differs from the op before it and
ran a few light families ago (perfcheck.predict.family_reuse). A native GRU time step runs ~13 such ops
(unsafe_split, addmm, add_, sigmoid_, clone, mul_, add, tanh_, sub), an RNN step 3 (addmm, add_, tanh), and the
GRU forward came out over-predicted by ~2 ms of switches (bench/results/native_rnn.md). This measures, per cycle,

    excess per switch = (cycle time - sum of its ops' tight-loop times) / switches in the cycle

for: the GRU and RNN cell's forward op sequence on tiny tensors at several (batch, hidden), cycles of k light
elementwise families (k = 1..8, in-place and out-of-place), and the calibration's near round-robin itself
(``op_cases.op_cold_near_cases``' 13 ops) and its ops split into the light ones and the others. One intra-op
thread, process CPU time, all blocks shuffled per repeat, medians over repeats.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/host_switch.py [--repeats 15]

``--modules --measured M.csv --calibration C.csv``: instead, native recurrent layers (nn.GRU, nn.RNN, an nn.GRUCell
loop) at shapes of no scoring model (hidden 48/200, batch 2/16, 16/64 steps) measured forward and backward
(bench/native_rnn.py's ``measure``; M.csv written if absent, else read) and predicted on C.csv (a quick
calibration right after the measurement where C.csv is absent): run it from two trees on the same M.csv and C.csv.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this tree's perfcheck first
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/native_rnn.py, bench/op_family_reuse.py
from perfcheck.calibrate import case_names as names  # noqa: E402
from perfcheck.calibrate.op_cases import tiny_ops  # noqa: E402
from op_family_reuse import CellLoop  # noqa: E402


def gru_step(b: int, h: int) -> list:
    """(family, fn) of one native GRU time step's forward ops (RNN.cpp's GRU cell as the trace shows them, input
    projection precomputed), on batch ``b`` x hidden ``h``, no gradient."""
    g = torch.Generator().manual_seed(0)
    gi, hx = torch.rand(b, 3 * h, generator=g), torch.rand(b, h, generator=g)
    w, bias = torch.rand(3 * h, h, generator=g), torch.rand(3 * h, generator=g)
    r, z, n, t1, t2 = (torch.rand(b, h, generator=g) for _ in range(5))
    wt, one = w.t(), torch.ones(b, h)  # multiplies by 1: no drift to denormals over thousands of calls
    return [("unsafe_split", lambda: gi.unsafe_split(h, 1)), ("addmm", lambda: torch.addmm(bias, hx, wt)),
            ("unsafe_split", lambda: gi.unsafe_split(h, 1)), ("add_", lambda: r.add_(t1)),
            ("sigmoid_", lambda: r.sigmoid_()), ("add_", lambda: z.add_(t1)), ("sigmoid_", lambda: z.sigmoid_()),
            ("clone", lambda: t2.clone()), ("mul_", lambda: n.mul_(one)), ("add", lambda: t1 + n),
            ("tanh_", lambda: n.tanh_()), ("sub", lambda: hx - n), ("clone", lambda: z.clone()),
            ("mul_", lambda: t2.mul_(one)), ("add_", lambda: t2.add_(n))]


def rnn_step(b: int, h: int) -> list:
    """(family, fn) of one native tanh-RNN time step's forward ops: addmm, add_, tanh."""
    g = torch.Generator().manual_seed(0)
    hx, w, bias, x = (torch.rand(b, h, generator=g), torch.rand(h, h, generator=g), torch.rand(h, generator=g),
                      torch.rand(b, h, generator=g))
    wt = w.t()
    return [("addmm", lambda: torch.addmm(bias, hx, wt)), ("add_", lambda: x.add_(hx)), ("tanh", lambda: x.tanh())]


def light(b: int = 8, h: int = 24) -> list:
    """(family, fn) of 8 light elementwise families, in-place and out-of-place."""
    g = torch.Generator().manual_seed(0)
    a, c, s = (torch.rand(b, h, generator=g) for _ in range(3))
    return [("add", lambda: a + c), ("sigmoid_", lambda: s.sigmoid_()), ("mul", lambda: a * c),
            ("tanh_", lambda: s.tanh_()), ("sub", lambda: a - c), ("mul_", lambda: s.mul_(1.0)),
            ("clone", lambda: a.clone()), ("add_", lambda: s.add_(c))]


def switches(fams) -> int:
    """Ops of a cycle whose family differs from the op before (cyclically: the cycle repeats)."""
    return sum(1 for i, f in enumerate(fams) if f != fams[i - 1])


def cycles() -> dict:
    """name -> list of (family, fn)."""
    out = {f"GRU step b{b} h{h}": gru_step(b, h) for b, h in ((2, 48), (16, 48), (2, 200), (16, 200))}
    out.update({f"RNN step b{b} h{h}": rnn_step(b, h) for b, h in ((2, 48), (16, 200))})
    lt = light()
    out.update({f"light k={k}": lt[:k] for k in (1, 2, 3, 4, 6, 8)})
    near = [(n, fn) for n, fn in tiny_ops(torch.device("cpu")).items() if n not in names.NEAR_LEFT_OUT]
    out[f"calibration near x{len(near)}"] = near
    light_names = ("addmm", "mm", "bmm", "sum", "relu", "_softmax", "_log_softmax")
    out["near case: light ops"] = [x for x in near if x[0] in light_names]
    out["near case: other ops"] = [x for x in near if x[0] not in light_names]
    return out


def layers() -> dict:
    """name -> (module, input): native recurrent layers at shapes of no scoring model (batch_first)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)

    def x(b, t, i):
        return torch.rand(b, t, i, generator=g, requires_grad=True)

    return {"GRU 48->48 b2 t64": (torch.nn.GRU(48, 48, batch_first=True), x(2, 64, 48)),
            "GRU 32->200 b16 t16": (torch.nn.GRU(32, 200, batch_first=True), x(16, 16, 32)),
            "GRU 100->48 b16 t64 bi": (torch.nn.GRU(100, 48, batch_first=True, bidirectional=True), x(16, 64, 100)),
            "RNN 48->48 b2 t64": (torch.nn.RNN(48, 48, batch_first=True), x(2, 64, 48)),
            "RNN 32->200 b16 t16": (torch.nn.RNN(32, 200, batch_first=True), x(16, 16, 32)),
            "GRUCell loop 32->48 b2 t32": (CellLoop(32, 48), x(2, 32, 32)),
            "GRUCell loop 32->200 b16 t16": (CellLoop(32, 200), x(16, 16, 32))}


def modules(args):
    """The recurrent layers measured (or read from --measured) and predicted on --calibration."""
    import pandas as pd
    import native_rnn
    mods = layers()
    if args.measured and Path(args.measured).exists():
        saved = pd.read_csv(args.measured).set_index("layer")
        meas = {n: (float(saved.loc[n, "fwd_s"]), float(saved.loc[n, "bwd_s"])) for n in mods}
    else:
        meas = native_rnn.measure(mods, args.repeats)
        pd.DataFrame([(n, f, b) for n, (f, b) in meas.items()], columns=["layer", "fwd_s", "bwd_s"]).to_csv(
            args.measured, index=False)
    if not Path(args.calibration).exists():
        from perfcheck.calibrate.run import calibrate
        calibrate("cpu", mode="quick", device="cpu", comm=False, threads=1, name="auto",
                  clock="process").measurements.to_csv(args.calibration, index=False)
    spec = native_rnn.spec_from(args.calibration)
    print({k: f"{v * 1e6:.2f} us" for k, v in spec.host.items() if k.startswith(("op_cold", "op_dispatch"))})
    print("| layer | measured fwd / bwd ms | predicted fwd / bwd ms | meas/pred fwd / bwd |\n|---|---|---|---|")
    for name, (m, x) in mods.items():
        pf, pb = native_rnn.predicted(m, x, spec)
        mf, mb = meas[name]
        print(f"| {name} | {mf * 1e3:.2f} / {mb * 1e3:.2f} | {pf * 1e3:.2f} / {pb * 1e3:.2f} | "
              f"{mf / pf:.2f} / {mb / pb:.2f} |")


def time_seq(seq, reps: int) -> float:
    """Process seconds per pass of ``seq`` (fns) repeated ``reps`` times."""
    t0 = time.process_time()
    for _ in range(reps):
        for fn in seq:
            fn()
    return (time.process_time() - t0) / reps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--ops", type=int, default=600, help="op calls per timed block")
    ap.add_argument("--modules", action="store_true", help="the recurrent layers instead of the cycles")
    ap.add_argument("--measured", default=None)
    ap.add_argument("--calibration", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.modules:
        return modules(args)
    cyc = cycles()
    # tight loops: each distinct (cycle, op index); blocks of one op repeated, or of the cycle in order
    blocks = [("cycle", name, None) for name in cyc] + [("tight", name, j) for name, ops in cyc.items()
                                                         for j in range(len(ops))]
    with torch.no_grad():
        for _, ops in cyc.items():
            for _, fn in ops:
                for _ in range(20):
                    fn()
        res = {b[1:]: [] for b in blocks}
        rnd = random.Random(0)
        for _ in range(args.repeats):
            rnd.shuffle(blocks)
            for kind, name, j in blocks:
                ops = cyc[name]
                if kind == "cycle":
                    res[(name, None)].append(time_seq([fn for _, fn in ops], max(args.ops // len(ops), 1)))
                else:
                    res[(name, j)].append(time_seq([ops[j][1]], args.ops // 4))
    print("| cycle | ops | switches | cycle us | sum of tight loops us | excess us per switch |\n|---|---|---|---|---|---|")
    for name, ops in cyc.items():
        c = statistics.median(res[(name, None)])
        t = sum(statistics.median(res[(name, j)]) for j in range(len(ops)))
        s = switches([f for f, _ in ops]) if len(ops) > 1 else 0
        per = (c - t) / s * 1e6 if s else float("nan")
        print(f"| {name} | {len(ops)} | {s} | {c * 1e6:.2f} | {t * 1e6:.2f} | {per:+.2f} |")


if __name__ == "__main__":
    main()
