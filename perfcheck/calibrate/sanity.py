"""Whether a calibration can be trusted: the load it was taken under, physical bounds, the last one.

One bad calibration would poison every later prediction on the machine (a quick calibration taken
while two other processes kept both cores busy held copy bandwidth 35.8 MB/s at 256 KiB, a 12.7 ms
fixed cost per convolution and op_cold_s 686 us; LeNet was then predicted at 41.6 ms forward
against ~1 ms measured). So before a calibration is kept in the per-user cache it must pass three
checks, and each failure is a sentence saying why (``problems``):

1. **Contention** (``contention``): ``LoadWatch`` measures, over the calibration's own wall time, the
   CPU time the *other* processes used (system busy time from ``psutil.cpu_times`` less this
   process's and its children's). A calibration with ``threads`` intra-op threads on ``cores`` logical
   CPUs had a core per thread only while others used at most ``cores - threads``; beyond that (plus
   ``CONTENTION_SLACK_CORES`` for daemons and the kernel's own work) its threads waited for a core
   inside timed loops and every rate it measured is low by an unknown factor. Exempt: one thread timed
   with the process clock (its clock stops while it waits). An automatic calibration asks ``busy_now``
   (a 0.5 s watch) before it starts, and measures nothing on busy cores.
2. **Physics** (``physical_problems``): rates below and fixed costs above what any machine of the
   spec's kind does (``BOUNDS``: per kind, with the derivation beside each number).
3. **The machine's previous calibration** (``disagreements``): the cache file it would replace, when
   that one passed these checks itself (it has a load record that was not contended). A key figure
   (matrix peak, memory bandwidth, per-op dispatch, launch overhead, per-op cold cost) more than
   ``PREVIOUS_FACTOR`` off means one of the two was disturbed; the earlier one is kept.

``conditions`` stamps the spec with its ``calibration`` record (perfcheck.hardware.systems
CALIBRATION_KEYS): when, which clock, threads, cores, load average and the other processes' cores;
report headers print it and warn when a run used another thread count (perfcheck.hardware.labels).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import math
import os
import statistics
import time
from typing import Optional

from perfcheck.hardware.systems import SystemSpec
from perfcheck.predict.host import EVICTED_SUFFIX

#: Other processes' mean CPU use (cores) tolerated beyond ``cores - threads``: a quiet Linux host's
#: daemons, interrupts and this process's own helper threads use a few percent of a core; a quarter of
#: a core is 25% of one core's time, well above that and well below one busy process (a full core).
CONTENTION_SLACK_CORES = 0.25

#: Ratio of a key figure to the previous calibration's beyond which the two disagree. A choice, not a
#: fit: the fastest-half statistic removes most of what a neighbour adds, so one machine's calibrations
#: should agree well within it, and the poisoned one above (10x to 700x off) exceeds it by far.
PREVIOUS_FACTOR = 3.0

#: Physical bounds per system kind: ``floor`` rates (the lowest any machine of the kind reaches) and
#: ``ceiling`` fixed costs (the most one operation's fixed cost can be), with why.
BOUNDS = {
    "cpu": {
        # one DDR3-800 channel (the slowest JEDEC DRAM of any x86 server since 2008) peaks at 6.4 GB/s; one
        # core's streaming copy reaches a third of a channel or more; a cache-resident copy is faster still
        "mem_bandwidth_floor": 1e9,
        # a scalar FMA per cycle at 1 GHz is 2 GFLOP/s; every x86-64 core has at least 4-wide SSE2
        "matrix_fp32_floor": 1e9,
        # one scalar add per cycle at 1 GHz is 1 GFLOP/s; a quarter of it for memory stalls
        "vector_fp32_floor": 0.25e9,
        # eager dispatch of one aten op is 1-10 us on CPUs of the last decade (bench/RESULTS.md host
        # constants: 1.5-3 us on the project's VM); 100 us is 10-100x that: a scheduler stall, not a cost
        "per_op_ceiling_s": 100e-6,
        # one loss.backward() / optimizer.step() fixed cost: ~90 us measured; 20x that
        "per_call_ceiling_s": 2e-3,
        # a CPU kernel's own fixed cost beyond dispatch (op_fixed_s, module_fixed_s): 60 us for a
        # convolution's setup measured quiet on the VM; 1 ms is 16x that
        "per_kernel_fixed_ceiling_s": 1e-3,
    },
    "gpu": {
        # the slowest CUDA GPUs perfcheck specs (T4: 320 GB/s HBM-less GDDR6) copy at > 200 GB/s; 20 GB/s is a
        # PCIe-3 x16 link, which no on-device copy is slower than
        "mem_bandwidth_floor": 20e9,
        # a T4's fp32 is 8 TFLOP/s; a tenth of a TFLOP/s is below any GPU's matrix rate
        "matrix_fp32_floor": 0.1e12,
        "vector_fp32_floor": 0.1e12,
        # a kernel launch is 2-10 us (cudaLaunchKernel); 100 us is a stalled host
        "per_op_ceiling_s": 100e-6,
        "per_call_ceiling_s": 2e-3,
        "per_kernel_fixed_ceiling_s": 1e-3,
    },
}
#: host constants priced per op / node / module call (``per_op_ceiling_s``) and per whole call (``per_call_ceiling_s``)
PER_OP_HOST = ("op_dispatch_s", "view_dispatch_s", "op_cold_s", "autograd_node_s", "backward_node_s",
               "module_call_s", "device_kernel_s")
PER_CALL_HOST = ("backward_call_s", "optim_step_s")


# ------------------------------------------------------------------------------ the load while it runs
def _busy_s() -> float:
    """Seconds all CPUs spent busy since boot (user, nice, system, irq, softirq, steal, guest)."""
    import psutil

    t = psutil.cpu_times()
    idle = getattr(t, "idle", 0.0) + getattr(t, "iowait", 0.0)
    total = sum(getattr(t, f) for f in t._fields if f not in ("guest", "guest_nice"))  # guest is inside user
    return total - idle


def _own_s() -> float:
    """CPU seconds of this process and its waited-for children."""
    import psutil

    t = psutil.Process().cpu_times()
    return t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)


class LoadWatch:
    """``with LoadWatch() as w: <calibrate>``; then ``w.others_cores``: the mean number of cores other
    processes kept busy meanwhile (NaN where psutil cannot say), ``w.load_1m`` the load average at the start."""

    def __enter__(self):
        self.load_1m = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
        self._t0 = time.monotonic()
        try:
            self._busy0, self._own0 = _busy_s(), _own_s()
        except Exception:  # psutil missing or /proc unreadable: the load is then unknown (NaN), not zero
            self._busy0 = self._own0 = None
        return self

    def __exit__(self, *exc):
        self.wall_s = max(time.monotonic() - self._t0, 1e-9)
        self.others_cores = math.nan  # unknown unless both readings exist (psutil, /proc), never a guessed 0
        if self._busy0 is not None:
            with contextlib.suppress(Exception):  # /proc unreadable at the end: the load stays unknown (NaN)
                others = (_busy_s() - self._busy0) - (_own_s() - self._own0)
                self.others_cores = max(others / self.wall_s, 0.0)
        return False


def conditions(watch: LoadWatch, *, threads: Optional[int], mode: str, clock: str) -> dict:
    """The spec's ``calibration`` record from a finished ``LoadWatch``."""
    out = {"taken_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "mode": mode,
           "clock": clock, "cores": int(os.cpu_count() or 1), "wall_s": round(watch.wall_s, 2)}
    if threads is not None:
        out["threads"] = int(threads)
    if math.isfinite(watch.load_1m):
        out["load_1m"] = round(watch.load_1m, 2)
    if math.isfinite(watch.others_cores):
        out["others_cores"] = round(watch.others_cores, 2)
    return out


#: seconds ``busy_now`` watches the machine before an automatic calibration
BUSY_PROBE_S = 0.5


def busy_now(threads: int, seconds: float = BUSY_PROBE_S) -> Optional[str]:
    """Why the machine is too busy to calibrate with ``threads`` threads right now (``contention`` over a
    ``seconds`` watch), else None. An automatic calibration asks first: taken on busy cores it would be
    refused anyway, after 10 s to 7 minutes (two threads on a 2-core VM beside 1.7 busy cores: 434 s)."""
    with LoadWatch() as w:
        time.sleep(seconds)
    record = {"cores": int(os.cpu_count() or 1), "threads": int(threads)}
    if math.isfinite(w.others_cores):
        record["others_cores"] = round(w.others_cores, 2)
    return contention(record)


def stamped(spec: SystemSpec, record: dict) -> SystemSpec:
    """``spec`` with its ``calibration`` record (origin kept; a key the fit measured, ``l2_bytes``, stays)."""
    out = dataclasses.replace(spec, calibration={**dict(spec.calibration or {}), **record})
    if getattr(spec, "origin", None):
        object.__setattr__(out, "origin", spec.origin)
    return out


# ------------------------------------------------------------------------------ the checks
def contention(record) -> Optional[str]:
    """Why the calibration was contended (other processes took the cores its threads needed), else None.

    A calibration timed with the process clock on one thread is exempt: its clock stops while the thread
    waits for a core, so a neighbour's load does not enter its timings (LeNet's step predicted from one
    taken beside two busy loops: 1.05x the one taken without them, bench/results/calibration_trust.md;
    the wall clock: 1.28x-4.7x). Its physics and the previous calibration still decide."""
    others, cores = record.get("others_cores"), record.get("cores")
    threads = record.get("threads") or 1
    if others is None or cores is None or (record.get("clock") == "process" and threads == 1):
        return None
    free = max(cores - threads, 0) + CONTENTION_SLACK_CORES
    if others <= free:
        return None
    return (f"taken under contention: other processes kept {others:.2f} of the {cores} cores busy while its "
            f"{threads} thread{'s' if threads != 1 else ''} needed {threads} (at most {free:.2f} to spare), so its "
            f"timed loops waited for a core and every rate it measured is low")


def physical_problems(spec: SystemSpec) -> list:
    """Figures of ``spec`` outside ``BOUNDS[spec.kind]``, as sentences (empty: all within)."""
    b, out = BOUNDS[spec.kind], []
    curve = [f for _, f in spec.mem_bandwidth_curve] or [1.0]
    slowest = spec.mem_bandwidth_bytes_per_s * min(min(curve), 1.0)
    if slowest < b["mem_bandwidth_floor"]:
        out.append(f"copy bandwidth {slowest / 1e9:.3g} GB/s is below the {b['mem_bandwidth_floor'] / 1e9:g} GB/s "
                   f"any {spec.kind} copies at")
    for what, rates, floor in (("matrix", spec.matrix_flops_per_s, b["matrix_fp32_floor"]),
                               ("vector", spec.vector_flops_per_s, b["vector_fp32_floor"])):
        rate = rates.get("fp32")
        if rate is not None and rate < floor:
            out.append(f"fp32 {what} rate {rate / 1e9:.3g} GFLOP/s is below the {floor / 1e9:g} GFLOP/s floor of "
                       f"any {spec.kind}")
    fixed = [("launch_overhead_s", spec.launch_overhead_s, b["per_op_ceiling_s"])]
    fixed += [(f"host.{k}", spec.host[k], b["per_op_ceiling_s"]) for k in PER_OP_HOST if k in spec.host]
    fixed += [(f"host.{k}", spec.host[k], b["per_call_ceiling_s"]) for k in PER_CALL_HOST if k in spec.host]
    fixed += [(f"op_fixed_s.{k}", v, b["per_kernel_fixed_ceiling_s"]) for k, v in spec.op_fixed_s.items()]
    fixed += [(f"module_fixed_s.{k}", v, b["per_kernel_fixed_ceiling_s"]) for k, v in spec.module_fixed_s.items()]
    for name, value, ceiling in fixed:
        if value > ceiling:
            out.append(f"{name} {value * 1e6:.4g} us is above the {ceiling * 1e6:g} us ceiling of one "
                       f"{spec.kind} operation's fixed cost")
    return out


def key_figures(spec: SystemSpec) -> dict:
    """The figures ``disagreements`` compares: name -> value (> 0 only)."""
    ref = "fp32" if spec.kind == "cpu" else ("bf16" if "bf16" in spec.matrix_flops_per_s else "fp32")
    out = {f"matrix {ref} peak": spec.matrix_flops_per_s.get(ref), "memory bandwidth": spec.mem_bandwidth_bytes_per_s,
           "launch overhead": spec.launch_overhead_s, "op dispatch": spec.host.get("op_dispatch_s"),
           "op cold cost": spec.host.get("op_cold_s")}
    # the fixed costs of calls in a tight loop (a class's evicted call, host._class_cold's, is not one)
    fixed = [v for k, v in spec.op_fixed_s.items() if not str(k).endswith(EVICTED_SUFFIX)]
    if fixed:
        out["median per-op fixed cost"] = statistics.median(fixed)
    return {k: float(v) for k, v in out.items() if v is not None and v > 0}


def trustworthy(spec: Optional[SystemSpec]) -> bool:
    """A calibrated spec with a load record that passed ``contention`` and ``physical_problems``."""
    return (spec is not None and spec.calibrated and bool(spec.calibration) and not spec.calibration.get("forced")
            and contention(spec.calibration) is None and not physical_problems(spec))


def disagreements(spec: SystemSpec, previous: Optional[SystemSpec], factor: float = PREVIOUS_FACTOR) -> list:
    """Key figures more than ``factor`` off the previous calibration of this machine (only a
    ``trustworthy`` previous one counts), as sentences."""
    if not trustworthy(previous):
        return []
    new, old = key_figures(spec), key_figures(previous)
    out = []
    for name in sorted(set(new) & set(old)):
        ratio = new[name] / old[name]
        if ratio > factor or ratio < 1 / factor:
            out.append(f"{name} {ratio:.3g}x the previous calibration's (taken "
                       f"{previous.calibration.get('taken_utc', '?')})")
    return out


def problems(spec: SystemSpec, previous: Optional[SystemSpec] = None) -> list:
    """Every reason not to keep ``spec`` as this machine's calibration (empty: keep it)."""
    out = []
    busy = contention(spec.calibration or {})
    if busy:
        out.append(busy)
    out += physical_problems(spec)
    out += disagreements(spec, previous)
    return out
