"""The calibration a ZeRO sweep needs before its ranks start: the host terms of this CPU that a sweep's
prediction takes from the per-user cache (DeepSpeed's own work per ZeRO stage, the gloo collectives'
alpha and bandwidth, the ranks' meeting at collectives, the slowdown of processes sharing the host),
each family measured once (quick mode) where the cached calibration lacks it, and kept in the cache.
``perfcheck sweep`` calls ``calibrate_sweep_terms`` before it launches the stages (ranks never
calibrate themselves).
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from perfcheck.calibrate import collectives, concurrency, deepspeed_cases, fit
from perfcheck.calibrate.deepspeed_cases import ranks_measured
from perfcheck.calibrate.fit import measured_here
from perfcheck.calibrate.run import MODES, provenance
from perfcheck.errors import UserError
from perfcheck.hardware.cache import cache_path

#: Host constants a sweep's prediction takes from this machine's cache, each family with the source key(s)
#: that say it was measured here (``apply`` of each case writes them): DeepSpeed's own work per ZeRO stage,
#: the collectives' alpha and link bandwidth (gloo between the ranks), and the slowdown of processes
#: sharing the host. Measured in this order.
SWEEP_TERMS = {"concurrency": ("host.process_slowdown_per_peer",),  # first: the DeepSpeed case divides it out
               "deepspeed": ("host.zero0_fwd_s",),
               "collectives": ("host.collective_latency_s", "intra_node_bandwidth_bytes_per_s"),
               "collective sync": ("host.collective_async_call_s", "host.collective_straggler_s")}
#: Families measured between the ranks of this host: nothing to measure with one rank here.
MULTI_PROCESS = ("collectives", "collective sync", "concurrency")


def missing_terms(spec, ranks: int = None) -> list:
    """The ``SWEEP_TERMS`` families ``spec`` (a cached calibration) has not measured: a key without a source,
    or with one a base spec handed down ("from base spec ...": the built-in cpu spec's link is "a rough
    default"), is host_defaults.json's or the base's, from another machine or another load. Given ``ranks``
    (the sweep's ranks per host, >= 2), DeepSpeed's terms measured at another rank count are missing too (a
    one-rank engine moves nothing, so it does not see the host work of a real gather or reduce-scatter)."""
    out = [name for name, keys in SWEEP_TERMS.items() if not measured_here(spec, keys)]
    if ranks and ranks > 1 and "deepspeed" not in out and ranks_measured(spec) != ranks:
        out.insert(list(SWEEP_TERMS).index("deepspeed"), "deepspeed")
    return out


def _measure(name: str, spec, *, ranks: int, threads: int, stamp: str):
    """``spec`` with one family measured (quick mode); raises RuntimeError/UserError when its case fails."""
    if name == "deepspeed":
        return deepspeed_cases.apply(spec, deepspeed_cases.bench_deepspeed("quick", threads=threads, world_size=ranks),
                                     stamp)
    if name == "collectives":
        quick = MODES["quick"]  # what `perfcheck calibrate --quick` measures: all-reduce at 4 KiB, 64 KiB, 4 MiB
        table = collectives.bench_collectives([k * 1024 for k in quick["comm_kib"]], kinds=quick["comm_kinds"],
                                              world_size=ranks, device="cpu", repeats=quick["repeats"],
                                              target_s=quick["target_s"], timeout_s=120.0)
        out = fit.apply_collectives(spec, table, stamp)
        if "collectives" in missing_terms(out):
            raise RuntimeError("the all-reduce timings gave no alpha (fewer than two sizes measured)")
        return out
    if name == "collective sync":  # async batches and the wait for the latest rank (collectives.bench_sync_terms)
        return collectives.apply_sync_terms(spec, collectives.bench_sync_terms(ranks, "quick"), stamp)
    return concurrency.apply(spec, concurrency.bench_concurrency(ranks, "quick", threads=threads), stamp)


def calibrate_sweep_terms(spec, *, ranks: int, threads: int = 1, say: Callable[[str], None] = print):
    """``spec`` (this CPU's cached calibration) with the families ``missing_terms`` names measured and kept in
    the cache beside the rest: the DeepSpeed engine case (quick mode, at ``ranks`` ranks, ~20 s here), the gloo
    all-reduce case at ``ranks`` processes (``perfcheck calibrate --quick``'s: 3 sizes, ~5 s), the ranks'
    meeting at collectives (an async all-gather batch and the wait for the latest rank, ~4 s) and the
    process-concurrency case at ``ranks`` processes (~5-10 s). Once per machine; each failure is one
    line and leaves that family at its defaults (the next sweep tries again). Returns the spec to predict
    with (None passes through)."""
    todo = missing_terms(spec, ranks) if spec is not None else []
    if ranks < 2:
        todo = [t for t in todo if t not in MULTI_PROCESS]
    if "deepspeed" in todo and not deepspeed_cases.available():
        todo.remove("deepspeed")
    if not todo:
        return spec
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)  # the stamp names the ranks' thread count (cpu_name reads torch's setting)
    try:
        stamp = provenance(torch.device("cpu"))
    finally:
        torch.set_num_threads(saved)
    for name in todo:
        t0 = time.perf_counter()
        say(f"perfcheck sweep: measuring this CPU's {name} host terms once (kept in the calibration cache; "
            f"PERFCHECK_AUTO_CALIBRATE=0 skips it)")
        try:
            spec = _measure(name, spec, ranks=ranks, threads=threads, stamp=stamp)
        except (RuntimeError, UserError) as exc:
            say(f"perfcheck sweep: {name} case not measured ({exc}); its host terms stay the defaults")
            continue
        say(f"perfcheck sweep: {name} case measured in {time.perf_counter() - t0:.1f} s")
    origin = getattr(spec, "origin", None)
    try:
        spec.save(cache_path("cpu", threads=threads))
    except OSError as exc:
        say(f"perfcheck sweep: cannot keep the measured terms in the cache ({exc.strerror}); this sweep uses them")
    object.__setattr__(spec, "origin", origin)
    return spec
