"""How much slower one process's CPU work runs while N-1 others like it run on the same host.

Why. The model predicts one process on an otherwise idle host (that is how every other case is
measured). A data-parallel job puts N ranks on one host: they share the last-level cache, memory
bandwidth and (with gloo) each other's communication threads, so a rank's CPU time for the same work
grows. A LeNet rank measured 1.2-1.3x one process's CPU time on a loaded 2-core VM, 1.03x on a quiet
one (bench/RESULTS.md, issue 12). It is a property of the host, not of DeepSpeed,
so it is measured here and kept as data: ``host.process_slowdown_per_peer`` (HOST_KEYS), applied by
``perfcheck.predict.host.process_slowdown``:

    factor(N) = 1 + (N - 1) * process_slowdown_per_peer        (N processes on the host; 1: no change)

(linear in the number of peers: an assumption, exact at the N the case ran with).

How. ``world_size`` workers (this process and ``world_size - 1`` spawned ones), each with ``threads``
intra-op threads, train the same host-bound workload: a chain of ``LAYERS`` ``Linear(WIDTH, WIDTH)`` (forward, cross
entropy, backward, torch.optim.Adam step and zero_grad: dispatch, autograd, optimizer work, as a
small model's step is). Rounds interleave "worker 0 (this process) alone" (the others wait on a pipe)
and "all workers together"; each run times ``steps`` steps in process CPU time (``time.process_time``: the
work, not the waiting for a core), keeps the median step, and a round's ratio is worker 0's median
together over alone. The result is the median of the rounds' ratios. Checked to transfer: the same
ratio for this chain and for LeNet's step, 1.029 vs 1.034 at 2 processes (bench/RESULTS.md).
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS
from perfcheck.errors import UserError

LAYERS, WIDTH, BATCH = 8, 16, 8
#: mode -> (warm-up steps, rounds, steps per run)
MODES = {"quick": (20, 6, 60), "default": (30, 8, 80), "full": (40, 12, 120)}
KEY = "process_slowdown_per_peer"


def chain_workload(seed: int):
    """One training step of the case's chain (a fresh model, optimizer and batch seeded by ``seed``)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(BATCH, WIDTH, generator=gen), torch.randint(0, WIDTH, (BATCH,), generator=gen)

    def step():
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _run(step, n: int) -> float:
    """Median process CPU seconds of ``n`` steps."""
    times = []
    for _ in range(n):
        t0 = time.process_time()
        step()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def _worker(conn, seed: int, threads: int, warm: int) -> None:  # pragma: no cover - runs in a child process
    import torch

    torch.set_num_threads(threads)
    step = chain_workload(seed)
    for _ in range(warm):
        step()
    conn.send("ready")
    while True:
        n = conn.recv()
        if n is None:
            return
        conn.send(_run(step, n))


def bench_concurrency(world_size: int = 2, mode: str = "quick", *, threads: int = 1, timeout_s: float = 120.0) -> dict:
    """Run the case; returns ``{"factor", "per_peer", "world_size", "alone_s", "together_s", "rounds"}``
    (``rounds``: the per-round ratios). RuntimeError when a worker fails or ``timeout_s`` passes."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise UserError(f"world_size: must be an integer >= 2, got {world_size!r}")
    if mode not in MODES:
        raise UserError(f"mode: unknown {mode!r} (known: {', '.join(MODES)})")
    import multiprocessing as mp

    import torch

    warm, rounds, steps = MODES[mode]
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    deadline = time.monotonic() + timeout_s

    def recv(conn):
        if not conn.poll(max(deadline - time.monotonic(), 0.0)):
            raise RuntimeError(f"process-concurrency case passed its {timeout_s:.0f} s limit")
        return conn.recv()

    saved = torch.get_num_threads()
    try:
        # this process is worker 0 (one interpreter fewer to start); the others are spawned
        for rank in range(1, world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, rank, threads, warm), daemon=True)
            proc.start()
            pipes.append(parent)
            procs.append(proc)
        torch.set_num_threads(threads)
        with torch.random.fork_rng(devices=[]):  # the caller's random stream is left as it was
            step = chain_workload(0)
            for _ in range(warm):
                step()
            for conn in pipes:
                recv(conn)
            alone, together = [], []
            for r in range(rounds):
                for n in ((1, world_size) if r % 2 == 0 else (world_size, 1)):  # alternate the order
                    for conn in pipes[:n - 1]:
                        conn.send(steps)
                    mine = _run(step, steps)
                    for conn in pipes[:n - 1]:
                        recv(conn)
                    (alone if n == 1 else together).append(mine)
        for conn in pipes:
            conn.send(None)
    except (EOFError, OSError) as exc:
        raise RuntimeError(f"process-concurrency case: a worker failed ({exc})") from None
    finally:
        torch.set_num_threads(saved)
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
    ratios = [t / a for a, t in zip(alone, together)]
    return summarize(ratios, world_size, statistics.median(alone), statistics.median(together))


def summarize(ratios, world_size: int, alone_s: float, together_s: float) -> dict:
    """The case's result from its per-round ratios (together / alone): the median ratio is the factor at
    ``world_size`` processes; per peer = (factor - 1) / (world_size - 1), never below 0 (a ratio under 1
    is noise: N processes do not run one another's work faster)."""
    factor = float(np.median(ratios))
    return {"factor": factor, "per_peer": max(factor - 1.0, 0.0) / (world_size - 1), "world_size": world_size,
            "alone_s": float(alone_s), "together_s": float(together_s), "rounds": [float(x) for x in ratios]}


def apply(spec, result: dict, stamp: str):
    """``spec`` with ``host.process_slowdown_per_peer`` and its source."""
    import dataclasses

    how = (f"{stamp}: process-concurrency case (perfcheck/calibrate/concurrency.py), chain of {LAYERS} "
           f"Linear({WIDTH}, {WIDTH}) + Adam, process CPU time, {len(result['rounds'])} interleaved rounds: one "
           f"process {result['alone_s'] * 1e3:.3f} ms per step, {result['world_size']} at once "
           f"{result['together_s'] * 1e3:.3f} ms, median ratio {result['factor']:.3f}")
    return dataclasses.replace(spec, host={**dict(spec.host), KEY: result["per_peer"]},
                               sources={**dict(spec.sources), f"host.{KEY}": how})


def rows_for_table(result: dict):
    """The case in the calibration's measurement table (kind ``concurrency``; ``seconds``: the median
    step together, ``seconds_min``: alone; ``world_size``: processes at once)."""
    import pandas as pd

    row = {c: np.nan for c in MEASUREMENT_COLUMNS}
    row.update({"kind": "concurrency", "label": f"chain{LAYERS} x{result['world_size']} processes", "dtype": "fp32",
                "m": BATCH, "k": WIDTH, "n": WIDTH, "world_size": result["world_size"],
                "seconds": result["together_s"], "seconds_min": result["alone_s"], "repeats": len(result["rounds"]),
                "iters": 1})
    return pd.DataFrame([row], columns=list(MEASUREMENT_COLUMNS))
