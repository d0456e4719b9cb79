"""Collective bus bandwidth by message size across ranks, for ``perfcheck calibrate``.

Spawns ``world_size`` processes (``torch.multiprocessing``, start method ``spawn``) that join a
process group on 127.0.0.1: gloo on CPU, NCCL on GPU (one GPU per rank). For each collective and
size every rank warms up, the ranks agree on a loop length (the max over ranks of what reaches
``target_s``), and each repeat times the loop after a barrier; the time kept for a repeat is the
slowest rank's (a collective ends when its last rank does), and the row keeps the median over
repeats. On GPU the loop is bracketed by CUDA events; the device is synchronized only around it.

Sizes follow nccl-tests (``doc/PERFORMANCE.md``): ``bytes`` is the full buffer S (the tensor for
all-reduce, the gathered output for all-gather, the unreduced input for reduce-scatter), and
``busbw = S / t * bus_factor`` (``perfcheck.predict.collectives.bus_factor``), the number the
``intra_node_bandwidth_bytes_per_s`` ceiling is compared with.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import socket
import statistics
import tempfile
import time
import warnings

import pandas as pd
import torch

from perfcheck.calibrate.cases import Timer
from perfcheck.calibrate import fit
from perfcheck.calibrate.concurrency import chain_workload
from perfcheck.calibrate.fit import BENCHMARKED_KINDS, MEASUREMENT_COLUMNS
from perfcheck.errors import UserError
from perfcheck.predict.collectives import COLLECTIVE_KINDS, bus_factor


class CollectiveBenchError(RuntimeError):
    """The multi-process benchmark failed or timed out (the rest of a calibration can go on)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _op(kind: str, nbytes: int, world: int, device):
    """A closure running one collective on a buffer of S = ``nbytes`` (rounded to whole fp32 shards)."""
    import torch.distributed as dist

    shard = max(1, nbytes // 4 // world)
    full = shard * world
    if kind == "allreduce":
        x = torch.ones(full, device=device)
        return (lambda: dist.all_reduce(x)), full * 4
    if kind == "allgather":
        inp, out = torch.ones(shard, device=device), torch.empty(full, device=device)
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return (lambda: fn(out, inp)), full * 4
    if kind == "reducescatter":
        inp, out = torch.ones(full, device=device), torch.empty(shard, device=device)
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return (lambda: fn(out, inp)), full * 4
    raise UserError(f"kinds: unknown collective {kind!r} (known: {', '.join(BENCHMARKED_KINDS)})")


def _max_over_ranks(value: float, device) -> float:
    import torch.distributed as dist

    t = torch.tensor([float(value)], dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _worker(rank, world, port, backend, sizes, kinds, repeats, target_s, out_path):  # pragma: no cover - child process
    import torch.distributed as dist

    if backend == "gloo":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(1)
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    rows = []
    try:
        for kind in kinds:
            for size in sizes:
                fn, nbytes = _op(kind, int(size), world, device)
                fn()
                fn()
                wanted = _max_over_ranks(target_s / max(Timer(device).loop(fn, 1), 1e-9), device)  # same on every rank
                iters = int(min(1000, max(1, math.ceil(wanted))))
                samples = []
                for _ in range(repeats):
                    dist.barrier()
                    samples.append(_max_over_ranks(Timer(device).loop(fn, iters), device))
                rows.append({"kind": kind, "bytes": nbytes, "iters": iters, "samples": samples})
        if rank == 0:
            with open(out_path, "w") as fh:
                json.dump(rows, fh)
    finally:
        dist.destroy_process_group()


def _spawn_ranks(worker, args_for, world_size: int, timeout_s: float, what: str):
    """Run ``worker(rank, *args_for(out_path))`` in ``world_size`` spawned processes and return the JSON that
    rank 0 wrote to ``out_path``. Raises ``CollectiveBenchError`` (naming ``what``) when a rank fails or the
    ranks run past ``timeout_s``; the processes this call started are terminated either way."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    with tempfile.TemporaryDirectory(prefix="perfcheck-ranks-") as tmp:
        out = os.path.join(tmp, "result.json")
        ctx = mp.start_processes(worker, args=args_for(out), nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=0.5):
                if time.monotonic() > deadline:
                    raise CollectiveBenchError(f"{what} exceeded {timeout_s:.0f} s")
        except ProcessException as exc:
            raise CollectiveBenchError(f"{what} failed: {str(exc).strip().splitlines()[-1]}") from None
        finally:
            for p in ctx.processes:  # only the processes this call started
                if p.is_alive():
                    p.terminate()
                    p.join(5)
        with open(out) as fh:
            return json.load(fh)


def bench_collectives(sizes, *, kinds=BENCHMARKED_KINDS, world_size: int = 2, device: str = "cpu", repeats: int = 5,
                      target_s: float = 0.02, timeout_s: float = 180.0) -> pd.DataFrame:
    """Measure ``kinds`` at every size (bytes, full buffer S) across ``world_size`` spawned ranks.

    Returns rows in ``MEASUREMENT_COLUMNS`` (kind = the collective, ``bytes`` = S, ``seconds`` =
    median over repeats of the slowest rank's time per call, ``busbw_bytes_per_s``). Raises
    ``CollectiveBenchError`` when a rank fails or the whole run exceeds ``timeout_s``.
    """
    bad = [k for k in kinds if k not in BENCHMARKED_KINDS]
    if bad and bad[0] in COLLECTIVE_KINDS:
        raise NotImplementedError(f"perfcheck calibrate: {bad[0]} is not benchmarked yet (only "
                                  f"{', '.join(BENCHMARKED_KINDS)}); the link bandwidth comes from all-reduce")
    if bad:
        raise UserError(f"kinds: unknown collective {bad[0]!r} (known: {', '.join(BENCHMARKED_KINDS)})")
    if any((not isinstance(s, int)) or s <= 0 for s in sizes):
        raise UserError(f"sizes: message sizes must be positive integers (bytes), got {list(sizes)!r}")
    backend = "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise UserError(f"world_size: {world_size} ranks need {world_size} GPUs, {torch.cuda.device_count()} visible")
    raw = _spawn_ranks(_worker, lambda out: (world_size, _free_port(), backend, list(sizes), list(kinds), int(repeats),
                                             float(target_s), out), world_size, timeout_s, "collective benchmark")
    rows = []
    for r in raw:
        sec = statistics.median(r["samples"])
        busbw = r["bytes"] / sec * bus_factor(r["kind"], world_size)
        rows.append({"kind": r["kind"], "label": f"{r['kind']} {r['bytes']} B", "dtype": "fp32", "m": 0, "k": 0, "n": 0,
                     "flops": 0.0, "bytes": float(r["bytes"]), "world_size": world_size, "seconds": sec,
                     "seconds_min": min(r["samples"]), "seconds_max": max(r["samples"]), "repeats": len(r["samples"]),
                     "iters": r["iters"], "flops_per_s": math.nan, "bytes_per_s": r["bytes"] / sec,
                     "busbw_bytes_per_s": busbw})
    return pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS))


#: The spec source keys the collectives case measures: alpha and the intra-node link.
SOURCE_KEYS = ("host.collective_latency_s", "intra_node_bandwidth_bytes_per_s")


def measured_here(spec) -> bool:
    """Whether ``spec``'s collective constants were measured by a calibration of its own (both the link and
    alpha have a source that is not a base spec's or a default's)."""
    return fit.measured_here(spec, SOURCE_KEYS)


# ------------------------------------------------------------------ how ranks meet at a collective
#: Calls in the async batch; tensor size (bytes of the gathered output) of each call.
BATCH_CALLS, BATCH_BYTES = 10, 4096
#: mode -> (repeats of the batch and of the single call, work-then-all-reduce rounds)
SYNC_MODES = {"quick": (25, 150), "default": (40, 250), "full": (60, 400)}


def _sync_worker(rank, world, port, repeats, rounds, out_path):  # pragma: no cover - child process
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    # the call DeepSpeed 0.19.8 issues (all_gather_into_tensor), which torch 2.13 marks deprecated: the case times
    # that call, so its warning (printed once per rank into the user's sweep output) is silenced in this child only
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        shard = max(1, BATCH_BYTES // 4 // world)
        bufs = [(torch.ones(shard), torch.empty(shard * world)) for _ in range(BATCH_CALLS)]

        def single():
            dist.all_gather_into_tensor(bufs[0][1], bufs[0][0])

        def batch():  # as ZeRO-3's Init._allgather_params_coalesced: issue every call, then wait every handle
            handles = [dist.all_gather_into_tensor(o, i, async_op=True) for i, o in bufs]
            for h in handles:
                h.wait()

        for fn in (single, batch, single, batch):
            fn()
        times = {"single": [], "batch": []}
        for _ in range(repeats):
            for name, fn in (("single", single), ("batch", batch)):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                times[name].append(_max_over_ranks(time.perf_counter() - t0, torch.device("cpu")))
        # the wait for the latest rank: equal work on every rank (the concurrency case's training step, one or
        # two of them), then a blocking 4-byte all-reduce; a rank's wait = latest entry - its own entry
        step, x = chain_workload(rank), torch.ones(1)
        for _ in range(5):
            step()
        entries = []
        dist.barrier()
        for r in range(rounds):
            for _ in range(1 + r % 2):
                step()
            entries.append(time.monotonic())  # CLOCK_MONOTONIC: one clock for every process of the host
            dist.all_reduce(x)
        mine = torch.tensor(entries, dtype=torch.float64)
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        if rank == 0:
            a = torch.stack(every)[:, 3:]  # the first rounds carry the barrier's own skew
            waits = (a.max(0).values - a).mean(0)  # per round: the ranks' mean wait
            with open(out_path, "w") as fh:
                json.dump({"single": times["single"], "batch": times["batch"], "waits": waits.tolist()}, fh)
    finally:
        dist.destroy_process_group()


def bench_sync_terms(world_size: int = 2, mode: str = "quick", *, timeout_s: float = 120.0) -> dict:
    """How ``world_size`` gloo ranks on this host meet at collectives (CPU only; ~2-4 s quick).

    - ``async_call_s``: what one more call adds to a batch issued with ``async_op=True`` and waited together
      (ZeRO-3's post-step gather of its persistent tensors): (median batch of ``BATCH_CALLS`` all-gathers
      - median single all-gather) / (``BATCH_CALLS`` - 1), each the slowest rank's time, clipped at 0. On
      NCCL queued calls overlap (small); on gloo here they queue behind each other on the group's worker.
    - ``straggler_s``: the mean time a rank waits at a blocking collective for the latest rank when every
      rank did the same work before it (one or two steps of the concurrency case's chain, alternating): per
      round, latest entry - own entry, averaged over ranks, then over rounds (a mean: the waits are rare and
      long, a scheduler tick, so the median is near 0 while the expected cost is not).

    Returns ``{"async_call_s", "straggler_s", "single_s", "batch_s", "waits", "world_size", "calls"}``; raises
    ``CollectiveBenchError`` when a rank fails or ``timeout_s`` passes."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise UserError(f"world_size: must be an integer >= 2, got {world_size!r}")
    if mode not in SYNC_MODES:
        raise UserError(f"mode: unknown {mode!r} (known: {', '.join(SYNC_MODES)})")
    repeats, rounds = SYNC_MODES[mode]
    raw = _spawn_ranks(_sync_worker, lambda out: (world_size, _free_port(), repeats, rounds, out), world_size,
                       timeout_s, "collective sync case")
    return sync_terms(raw["single"], raw["batch"], raw["waits"], world_size)


def sync_terms(single, batch, waits, world_size: int, calls: int = BATCH_CALLS) -> dict:
    """The case's result from its raw timings (seconds): see ``bench_sync_terms``."""
    single_s, batch_s = statistics.median(single), statistics.median(batch)
    return {"async_call_s": max(batch_s - single_s, 0.0) / (calls - 1), "straggler_s": float(statistics.mean(waits)),
            "single_s": single_s, "batch_s": batch_s, "waits": len(waits), "world_size": world_size, "calls": calls}


def apply_sync_terms(spec, result: dict, stamp: str):
    """``spec`` with ``host.collective_async_call_s`` and ``host.collective_straggler_s`` and their sources."""
    import dataclasses

    where = f"{stamp}: perfcheck/calibrate/collectives.py bench_sync_terms, {result['world_size']} gloo ranks"
    how = {"collective_async_call_s":
           f"{where}: {result['calls']} async all-gathers of {BATCH_BYTES} B waited together "
           f"{result['batch_s'] * 1e3:.3f} ms vs one {result['single_s'] * 1e3:.3f} ms (medians of the slowest "
           f"rank), (batch - one) / {result['calls'] - 1}",
           "collective_straggler_s":
           f"{where}: mean wait for the latest rank at a blocking all-reduce after equal work (1-2 steps of the "
           f"concurrency case's chain), {result['waits']} rounds, at {result['world_size']} ranks"}
    host = {**dict(spec.host), "collective_async_call_s": result["async_call_s"],
            "collective_straggler_s": result["straggler_s"], "collective_straggler_ranks": float(result["world_size"])}
    sources = {**dict(spec.sources), **{f"host.{k}": v for k, v in how.items()},
               "host.collective_straggler_ranks": f"{where}: the rank count collective_straggler_s was measured at"}
    return dataclasses.replace(spec, host=host, sources=sources)
