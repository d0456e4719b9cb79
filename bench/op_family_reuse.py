"""Host cost of a tiny op against the number of distinct op families run between two calls of the same family.

Why: the host model charges ``op_cold_s`` to every op whose family differs from the op before it
(perfcheck.predict.host.op_switches), measured as a round-robin over the 14 calibration ops less their tight
loops. A recurrent layer without a oneDNN path (nn.GRU, nn.RNN, a hand-written cell loop) repeats the same ~12
families every time step; if their code stays hot in the instruction cache and branch predictors, each op
costs only its tight-loop price. This script measures the excess per op of a cycle over k distinct families
(the first k of ``FAMILIES``, GRU cell ops first) against each family's tight loop:

    excess(k) = cycle(k) time per op - mean over the k families of their tight-loop time per op

with one intra-op thread and process CPU time, all (k, repeat) blocks interleaved in a shuffled order, medians
over repeats. Also a plain nn.GRU's forward and backward time per aten op (aten op count under a TorchDispatchMode) beside the
tight-loop mean of the ops it runs.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/op_family_reuse.py [--repeats 15]
"""
from __future__ import annotations

import argparse
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


def gru_per_op(repeats: int) -> dict:
    """A bidirectional nn.GRU(64, 128) on batch 16 x 40 (no oneDNN path: per-step native ops): forward and
    backward process time, aten op counts and time per op; medians over ``repeats``."""
    g = torch.Generator().manual_seed(0)
    rnn = torch.nn.GRU(64, 128, batch_first=True, bidirectional=True)
    x = torch.rand(16, 40, 64, generator=g, requires_grad=True)
    fwd, bwd = [], []
    for r in range(repeats + 3):
        t0 = time.process_time()
        out, _ = rnn(x)
        loss = out.sum()
        t1 = time.process_time()
        loss.backward()
        t2 = time.process_time()
        if r >= 3:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    n_fwd, counts_f = _top_aten(lambda: rnn(x))
    n_all, counts = _top_aten(lambda: rnn(x)[0].sum().backward())
    return {"fwd_ms": statistics.median(fwd) * 1e3, "bwd_ms": statistics.median(bwd) * 1e3,
            "fwd_ops": n_fwd, "bwd_ops": n_all - n_fwd - 2, "counts_fwd": counts_f, "counts": counts}


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
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows, tight = family_sweep(args.repeats, args.ops)
    print("| k families | cycle us/op | tight mean us/op | excess us/op |\n|---|---|---|---|")
    for k, c, t, e in rows:
        print(f"| {k} | {c:.2f} | {t:.2f} | {e:+.2f} |")
    print("tight us/op:", ", ".join(f"{n} {v:.2f}" for n, v in tight.items()))
    loo, t_cal = calibration_leave_one_out(args.repeats, args.ops // 4 * 14 // 12)
    print("calibration round-robin (tiny_ops), excess us/op with one family left out:")
    print(", ".join(f"{n} {e:+.2f}" for n, e in loo))
    print("tight us/op:", ", ".join(f"{n} {v:.2f}" for n, v in t_cal.items()))
    gru = gru_per_op(args.repeats)
    print(f"GRU(64,128,bi) 16x40: fwd {gru['fwd_ms']:.2f} ms, bwd {gru['bwd_ms']:.2f} ms, "
          f"top-level aten calls: fwd {gru['fwd_ops']}, bwd {gru['bwd_ops']} (dispatch mode; bwd less the loss's sum and ones_like); "
          f"per op fwd {gru['fwd_ms'] * 1e3 / gru['fwd_ops']:.2f} us, bwd {gru['bwd_ms'] * 1e3 / gru['bwd_ops']:.2f} us")
    print("fwd counts:", sorted(gru["counts_fwd"].items(), key=lambda kv: -kv[1]))
    print("counts:", sorted(gru["counts"].items(), key=lambda kv: -kv[1])[:20])


if __name__ == "__main__":
    main()
