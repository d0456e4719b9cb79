"""``perfcheck calibrate``: measure this machine's ceilings and write a system file.

Micro-benchmarks (each a *case*: a closure, the FLOPs and bytes of one call):

* matmul    ``torch.mm`` on square shapes and ``F.linear`` on Linear-like shapes, per dtype, small
            to large, so the estimator learns where efficiency falls off
            (``matrix_efficiency_curve``, FLOPs per kernel -> fraction of peak);
* copy      ``dst.copy_(src)``, bytes = read + write (2 x size); the largest size is the ceiling
            (a DRAM/HBM-sized buffer, past the last-level cache), the smaller ones the
            ``mem_bandwidth_curve`` (a cache-resident working set moves faster: bytes per kernel ->
            factor over the ceiling);
* vector    ``torch.add(a, b, out=c)`` on a cache-resident buffer, 1 FLOP per element (the
            estimator's count for a pointwise op); CPU only (GPU elementwise work is memory-bound);
* launch    ``op``: one tiny ``torch.add``; ``autograd``: a chain of tiny multiplies run forward
            and backward, per kernel the estimator counts (1 forward + 1 backward each): what one
            more small op costs in a training step. ``launch_overhead_s`` is the latter;
* gpu ops   (GPU) LayerNorm, RMSNorm, softmax, embedding, attention and convolution (per dtype) kernels,
            forward and backward, at a few model-like sizes: their efficiency against the roofline by size
            (``op_efficiency_curve``; ``perfcheck.calibrate.gpu_ops``); four kernels off the vectorised loop
            (``strided_elements_per_s``; ``perfcheck.calibrate.strided_cases``);
* collectives  all-reduce / all-gather / reduce-scatter bus bandwidth by message size across
            ranks (``perfcheck.calibrate.collectives``: gloo on CPU, NCCL on GPU);
* deepspeed  DeepSpeed's own host cost per ZeRO stage and phase, per module call and per parameter
            tensor (``perfcheck.calibrate.deepspeed_cases``: a one-rank engine in a child process).
* concurrency  the CPU-time slowdown of one process while N like it run on the host (N: the collectives'
            ranks; ``perfcheck.calibrate.concurrency``), with the collectives.
* collective sync  (CPU, with the collectives) what one more async collective adds to a batch waited together,
            and the mean wait for the latest rank at a blocking collective (``collectives.bench_sync_terms``).

Timing: cases of one group are *interleaved* (repeat r of every case, then repeat r+1, ...), so
a burst of noise on a shared machine hits every case alike; each repeat is a timed loop long
enough to dwarf the clock (``target_s``); the number kept is the median of the FASTEST HALF of the
repeats (``perfcheck.calibrate.repeats``: interference only adds time), and a case whose fastest
half disagrees is timed again (min and max are kept in the table). On a CPU every repeat is read against a
tiny add timed right before it and the whole calibration is anchored at one reference time
(``repeats.anchor_s``): a shared machine runs for seconds at one speed and then at another, ~2x apart, and
groups timed in different phases made every constant fitted as a difference between groups (op_cold_s, the
small GEMMs less one tiny op, op_fixed_s) move with the phase (``perfcheck.calibrate.repeats``).

Trust (``perfcheck.calibrate.sanity``): the calibration watches the load while it runs
(``LoadWatch``: the cores other processes kept busy) and stamps the spec with a ``calibration`` record
(when, clock, threads, cores, load); ``sanity.problems`` then says whether it may be kept in the
per-user cache (contention, physical bounds, the machine's previous calibration). On GPU the loop is bracketed by CUDA events and the
device is synchronized only around it.

Ceilings (``build_spec``; two conventions, named by ``peaks``):

* ``peaks="base"`` (default on GPU): peaks stay the base spec's datasheet numbers and every
  efficiency is measured / datasheet peak (capped at 1: a boost clock can beat the datasheet).
* ``peaks="measured"`` (default on CPU, whose datasheet is unknown): each peak is the best
  measured rate and efficiencies are relative to it (memory, vector, intra-node 1.0; the matrix
  curve and ``efficiency.matrix`` at large sizes relative to the best matmul).

The curve is for one reference dtype (bf16 on GPU, fp32 on CPU); other dtypes get
``efficiency.matrix_<dtype>``, which the roofline uses to scale the curve. Matmul times have the
tiny-op time subtracted before they enter the curve, because the estimator adds launch overhead
per kernel on top of the roofline time. Not measured, and kept from the base spec (its source
says so): the inter-node link (one node), ranks per node, GPU vector rates, fp8 GEMMs.

Layout: the cases, timer and runner are in ``perfcheck.calibrate.cases``, the collectives in
``perfcheck.calibrate.collectives``, the timings-to-spec arithmetic in ``perfcheck.calibrate.fit``.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import socket
import time
from typing import Callable, Optional

import pandas as pd
import torch

from perfcheck.calibrate.cold_cases import memory_cold_cases
from perfcheck.calibrate.cases import (Case, Timer, alignment_cases, copy_cases, device_kernel_rows,  # noqa: F401
                                      host_cases, launch_cases, matmul_cases, matmul_cold_cases, run_cases,
                                      sqrt_zero_cases, vector_cases)
from perfcheck.calibrate.wide_cases import matmul_narrow_cases, matmul_wide_cases
from perfcheck.calibrate.phase import compute_reference_fn, reanchor, reference_fn
from perfcheck.calibrate import collectives as coll
from perfcheck.calibrate import concurrency, deepspeed_cases, gpu_ops, sanity, strided_cases
from perfcheck.calibrate import repeats as repeats_mod
from perfcheck.calibrate.fit import (BENCHMARKED_KINDS, MEASUREMENT_COLUMNS, build_spec,  # noqa: F401
                                     reference_dtype)
from perfcheck.calibrate.op_cases import (HOST_DTYPES_CUDA, l3_residency_cases, module_fixed_cases, op_cold_cases,
                                         op_cold_far_cases, op_efficiency_cases, op_fixed_cases,
                                         step_start_cases)
from perfcheck.calibrate.index_cases import index_cases
from perfcheck.calibrate.op_classes import op_class_cases
from perfcheck.errors import UserError
from perfcheck.hardware.cache import cpu_name
from perfcheck.hardware.systems import SystemSpec, load_system, match_device_name, normalize_dtype

#: Run-length presets. ``target_s``: minimum duration of one timed loop; shapes as (m, k, n).
MODES = {
    "quick": dict(repeats=3, target_s=0.01, squares=(32, 64, 128, 256, 512, 1024),
                  linear=((1024, 512, 2048), (96, 1024, 1024), (24, 1024, 1024)), other_squares=(128, 512),
                  copy_mb=(0.25, 1, 2, 4, 16, 64), comm_kib=(4, 64, 4096),
                  comm_kinds=("allreduce",)),
    "default": dict(repeats=5, target_s=0.02, squares=(32, 64, 128, 256, 512, 1024, 2048),
                    linear=((2048, 512, 512), (2048, 512, 2048), (2048, 2048, 512), (256, 512, 1536),
                            (96, 1024, 1024), (24, 1024, 1024), (8, 1024, 1024)), other_squares=(128, 512, 1024),
                    copy_mb=(0.25, 1, 2, 4, 8, 16, 256), comm_kib=(4, 64, 1024, 16384),
                    comm_kinds=BENCHMARKED_KINDS),
    "full": dict(repeats=9, target_s=0.05, squares=(16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096),
                 linear=((2048, 512, 512), (2048, 512, 2048), (2048, 2048, 512), (256, 512, 1536),
                         (8192, 768, 3072), (8192, 3072, 768), (512, 4096, 4096)), other_squares=None,
                 copy_mb=(0.25, 0.5, 1, 2, 4, 8, 16, 64, 256, 1024), comm_kib=(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536),
                 comm_kinds=BENCHMARKED_KINDS),
}
#: ``other_squares``: on a CPU, the matmul shapes of the dtypes other than the reference (fp32): they
#: set only that dtype's peak (the curve and shape factors are the reference dtype's), and a CPU
#: without bf16 units runs bf16 GEMMs ~10x slower than fp32 (2.4 vs 30 GFLOP/s on the project's AVX2
#: VM: the quick mode's 1024^3 bf16 squares took 52 of its 62 s). None: the reference's shapes.
#: Larger shapes and buffers for GPUs (a CPU-sized GEMM is launch-bound on an H100).
GPU_MODES = {
    "quick": dict(squares=(256, 1024, 4096), linear=((8192, 4096, 4096), (512, 4096, 4096), (64, 4096, 4096)),
                  copy_mb=(64, 1024)),
    "default": dict(squares=(128, 256, 512, 1024, 2048, 4096, 8192),
                    linear=((8192, 768, 3072), (8192, 3072, 768), (16384, 4096, 4096), (2048, 1024, 1024),
                            (512, 4096, 4096), (64, 4096, 4096), (16, 4096, 4096)),
                    copy_mb=(8, 256, 2048)),
    "full": dict(squares=(64, 128, 256, 512, 1024, 2048, 4096, 6144, 8192, 12288, 16384),
                 linear=((8192, 768, 3072), (8192, 3072, 768), (16384, 4096, 4096), (2048, 1024, 1024),
                         (16384, 8192, 28672), (4096, 12288, 12288)),
                 copy_mb=(8, 256, 2048, 8192)),
}
PEAK_CONVENTIONS = ("base", "measured")


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What ``calibrate`` returns: the spec to save, the raw measurements, and notes for the report."""

    spec: SystemSpec
    measurements: pd.DataFrame  # MEASUREMENT_COLUMNS, one row per case
    notes: tuple = ()
    elapsed_s: float = 0.0


# ------------------------------------------------------------------------------ the run
def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_base(device: torch.device) -> str:
    """The built-in spec to start from: ``cpu`` on CPU; on GPU the spec matching the device name."""
    if device.type != "cuda":
        return "cpu"
    return match_device_name(torch.cuda.get_device_name(device))



def _dtypes_to_measure(base: SystemSpec, device: torch.device, dtypes) -> list:
    if dtypes is not None:
        out = [normalize_dtype(d) for d in dtypes]
        for d in out:
            base.matrix_peak(d)  # UserError naming the dtype if the base spec has no such peak
            if d == "fp8":
                raise NotImplementedError("perfcheck calibrate: fp8 GEMMs (torch._scaled_mm with scales) are not "
                                          "benchmarked yet; leave fp8 out (its efficiency stays the base spec's)")
        return out
    usable = ("fp32", "tf32", "bf16", "fp16") if device.type == "cuda" else ("fp32", "bf16")
    return [d for d in base.matrix_flops_per_s if d in usable]


def _progress(progress, message):
    if progress is not None:
        progress(message)


def calibrate(base=None, *, mode: str = "default", device=None, dtypes=None, peaks: Optional[str] = None,
              comm: bool = True, world_size: int = 2, name: Optional[str] = None, threads: Optional[int] = None,
              progress: Optional[Callable[[str], None]] = None, deepspeed: Optional[bool] = None,
              clock: str = "wall") -> Calibration:
    """Run the micro-benchmarks on this machine and return a calibrated ``SystemSpec`` with its measurements.

    base: system to start from (name, path or spec; default: ``cpu``, or the GPU's spec).
    mode: ``quick`` | ``default`` (under a minute on CPU) | ``full``.
    dtypes: matrix dtypes to benchmark (default: those the base lists that this device runs).
    peaks: ``base`` (keep datasheet peaks, efficiencies = measured / peak) or ``measured``
      (peaks = best measured); default ``base`` on GPU and ``measured`` on CPU.
    comm: benchmark collectives across ``world_size`` ranks (gloo on CPU; on GPU NCCL across the
      visible GPUs, skipped with a note when there is only one).
    threads: CPU intra-op threads for the benchmarks (default: torch's current setting, which
      the measured runs use too; restored afterwards).
    progress: called with one-line messages while it runs (the CLI prints them to stderr).
    clock: ``wall`` or ``process`` (CPU time of this process, one thread; cases.CLOCKS): bench/accuracy.py
      calibrates and measures with process time on a shared host.
    deepspeed: run the DeepSpeed engine case (``deepspeed_cases``: ZeRO stages' own host cost, one rank,
      a child process); default: when ``comm`` is on and DeepSpeed is installed.
    """
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise UserError(f"threads: must be a positive integer, got {threads!r}")
    saved = torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with sanity.LoadWatch() as watch:
            result = _calibrate(base, mode, device, dtypes, peaks, comm, world_size, name, progress, deepspeed, clock)
        record = sanity.conditions(watch, threads=torch.get_num_threads() if result.spec.kind == "cpu" else None,
                                   mode=mode, clock=clock)
        return dataclasses.replace(result, spec=sanity.stamped(result.spec, record))
    finally:
        torch.set_num_threads(saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]


@dataclasses.dataclass
class _Run:
    """One calibration in progress: the device, the mode's settings, the timer, the frames and notes
    gathered so far (the steps below append to them)."""

    dev: torch.device
    cfg: dict
    timer: Timer
    progress: Optional[Callable[[str], None]]
    start: float = dataclasses.field(default_factory=time.perf_counter)
    frames: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)

    def say(self, message):
        _progress(self.progress, f"[{time.perf_counter() - self.start:5.1f} s] {message}")

    def note(self, message):
        self.notes.append(message)
        _progress(self.progress, f"note: {message}")

    def group(self, title, cases):
        self.say(f"{title}: {len(cases)} cases x {self.cfg['repeats']} repeats")
        # on a CPU every repeat is read against a tiny add and a 128^3 mm timed right before it (cases.run_cases,
        # repeats.py: the machine's phase); a GPU's kernels are timed with events, its host cases alone
        cpu = self.dev.type == "cpu"
        self.frames.append(run_cases(cases, self.timer, repeats=self.cfg["repeats"], target_s=self.cfg["target_s"],
                                     reference=reference_fn(self.dev) if cpu else None,
                                     compute_reference=compute_reference_fn(self.dev) if cpu else None))


def _checked_setup(base, mode, device, peaks, world_size):
    """(device, base spec, peak convention, mode settings) after checking every argument."""
    if mode not in MODES:
        raise UserError(f"mode: unknown {mode!r} (known: {', '.join(MODES)})")
    dev = torch.device(device or default_device())
    if dev.type not in ("cpu", "cuda"):
        raise UserError(f"device: only cpu and cuda can be calibrated, got {dev.type!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError("device: cuda was asked for but torch.cuda.is_available() is False")
    base_spec = load_system(base if base is not None else default_base(dev))
    peaks = peaks or ("base" if dev.type == "cuda" else "measured")
    if peaks not in PEAK_CONVENTIONS:
        raise UserError(f"peaks: unknown {peaks!r} (known: {', '.join(PEAK_CONVENTIONS)})")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise UserError(f"world_size: must be an integer >= 2, got {world_size!r}")
    cfg = {**MODES[mode], **(GPU_MODES[mode] if dev.type == "cuda" else {})}
    return dev, base_spec, peaks, cfg


def _host_groups(run: _Run, measured):
    """Host constants, per-op and per-module fixed costs, per-row terms, op efficiencies and classes."""
    dev = run.dev
    run.group("launch overhead", launch_cases(dev))
    run.group("host (dispatch, autograd, module call, optimizer)", host_cases(dev))
    run.group("square root of zeros (an adaptive optimizer's untouched embedding rows)", sqrt_zero_cases(dev))
    # on CUDA also in bf16 with gradients (op_cases.HOST_DTYPES_CUDA: cuBLAS/cuDNN's bf16 host paths cost more)
    host_dtypes = [d for d in HOST_DTYPES_CUDA if d in measured] if dev.type == "cuda" else []
    run.group("per-op fixed costs", op_fixed_cases(dev, host_dtypes))
    run.group("per-op cost among other ops (round-robin)", op_cold_cases(dev, host_dtypes))
    far = op_cold_far_cases(dev)  # none without a known L3 small enough to evict (CPU)
    if far:
        run.group("per-op cost after an L3 eviction (round-robin)", far)
        run.group("how long data stays in the L3", l3_residency_cases(dev))
        run.group("a step's first module call (after other code and an L3 eviction)", step_start_cases(dev))
    run.group("per-module fixed costs", module_fixed_cases(dev))
    # per dtype: a GPU's conv efficiency in bf16 is not its fp32 one (a CPU runs fp32 models: fp32 alone)
    run.group("per-op kernel efficiency", op_efficiency_cases(dev, ["fp32"] if dev.type == "cpu" else
                                                              ["fp32", *[d for d in measured if d in ("bf16", "fp16")]]))
    run.group("op classes (convolutions by groups/shape, RNG, activations, embedding rows)",
              op_class_cases(dev) + index_cases(dev))
    if dev.type == "cuda":
        run.frames.append(device_kernel_rows(dev, run.cfg["repeats"]))


def _device_groups(run: _Run, measured, base_spec):
    """Memory copy, elementwise, matmul curves per dtype, and on a GPU alignment and kernel classes."""
    dev, cfg = run.dev, run.cfg
    run.group("memory copy", copy_cases(cfg["copy_mb"], dev))
    if dev.type == "cpu":  # memory-bound ops hot and with their operands evicted from L2 (memory_cold_curve)
        run.group("memory-bound ops, operands evicted from L2", memory_cold_cases(dev))
        vec = [d for d in ("fp32", "bf16") if d in base_spec.vector_flops_per_s]
        run.group("vector (elementwise add)", vector_cases(vec, dev))
    for d in measured:
        other = dev.type == "cpu" and d != reference_dtype("cpu", measured) and cfg.get("other_squares")
        run.group(f"matmul {d}", matmul_cases(d, cfg["other_squares"], (), dev) if other
                  else matmul_cases(d, cfg["squares"], cfg["linear"], dev))
        if dev.type == "cpu" and not other:  # the reference dtype's shapes again, operands evicted from L2
            run.group(f"matmul {d}, operands evicted from L2", matmul_cold_cases(d, cfg["squares"], cfg["linear"], dev))
            if d == "fp32":
                run.group("matmul fp32, wide and narrow outputs (LM heads, small convolutions)",
                          matmul_wide_cases(dev) + matmul_narrow_cases(dev))
    if dev.type == "cuda" and measured:  # row strides that are not 16-byte multiples (GPT-2's lm_head)
        run.group("matmul alignment", alignment_cases("bf16" if "bf16" in measured else measured[0], dev))
    if dev.type == "cuda":  # kernel classes the datasheet roofline misses: norms, softmax, embeddings, attention, conv
        run.say("GPU kernel classes by size (gpu_ops)")
        try:  # the newest cases: a failure here leaves the rest of the calibration (and the flat op_efficiency)
            run.frames.append(gpu_ops.bench_gpu_ops(dev, ["fp32", *[d for d in measured if d in ("bf16", "fp16")]]))
        except (RuntimeError, ValueError, TypeError, torch.cuda.OutOfMemoryError) as exc:
            run.note(f"GPU kernel-class cases not measured ({type(exc).__name__}: {exc}); "
                     f"op_efficiency_curve stays empty")
        run.say("elementwise kernels off the vectorised loop (strided_cases)")
        try:
            run.frames.append(strided_cases.bench_strided(dev))
        except (RuntimeError, ValueError, torch.cuda.OutOfMemoryError) as exc:
            run.note(f"strided kernels not measured ({type(exc).__name__}: {exc}); the base spec's rate stays")


def _multi_process_groups(run: _Run, mode, world_size, deepspeed, comm):
    """Collectives, process concurrency, gloo sync terms and the DeepSpeed engine case; returns their
    results for ``_spec`` (concurrency, sync terms, DeepSpeed; None where not measured)."""
    dev, cfg, conc, sync, ds, n = run.dev, run.cfg, None, None, None, 0
    if comm:
        n = world_size if dev.type == "cpu" else torch.cuda.device_count()
        if n < 2:
            run.notes.append("collectives not measured: one GPU visible (needs >= 2 for NCCL)")
        else:
            run.say(f"collectives: {', '.join(cfg['comm_kinds'])} on {n} ranks ({'gloo' if dev.type == 'cpu' else 'nccl'}),"
                    f" {len(cfg['comm_kib'])} sizes")
            run.frames.append(coll.bench_collectives([k * 1024 for k in cfg["comm_kib"]], kinds=cfg["comm_kinds"],
                                                     world_size=n, device=dev.type, repeats=cfg["repeats"],
                                                     target_s=cfg["target_s"]))
    if comm and n >= 2:
        run.say(f"process concurrency: {n} processes at once vs one (CPU time)")
        try:
            conc = concurrency.bench_concurrency(n, mode, threads=torch.get_num_threads())
            run.frames.append(concurrency.rows_for_table(conc))
        except RuntimeError as exc:
            run.notes.append(f"process-concurrency case not measured ({exc}); process_slowdown_per_peer stays the default")
    if comm and n >= 2 and dev.type == "cpu":  # gloo only: how the ranks meet at collectives (ZeRO's model)
        run.say(f"collective sync: an async all-gather batch and the wait for the latest of {n} ranks")
        try:
            sync = coll.bench_sync_terms(n, mode if mode in coll.SYNC_MODES else "quick")
        except RuntimeError as exc:
            run.notes.append(f"collective sync case not measured ({exc}); collective_async_call_s and "
                             "collective_straggler_s stay the defaults")
    if deepspeed or (deepspeed is None and comm and deepspeed_cases.available()):
        run.say(f"DeepSpeed engine per ZeRO stage (one rank, {len(deepspeed_cases.MODELS)} chain models x "
                f"{len(deepspeed_cases.CONFIGS) + 1} runs)")
        try:
            ds = deepspeed_cases.bench_deepspeed(mode, device=dev.type, threads=torch.get_num_threads())
            run.frames.append(deepspeed_cases.rows_for_table(ds))
        except RuntimeError as exc:
            run.notes.append(f"DeepSpeed engine case not measured ({exc}); the ZeRO host constants stay the defaults")
    return conc, sync, ds


def _spec(run: _Run, base_spec, peaks, name, conc, sync, ds, phase=None):
    """The measurements' table and the spec fitted to it (each optional part applied where measured). ``phase``
    (``reference_record``) is stamped before the DeepSpeed case is applied, which puts its constants at the
    calibration's reference level (``deepspeed_cases.reference_level``)."""
    dev = run.dev
    table = pd.concat(_at_one_reference(run.frames), ignore_index=True)
    stamp = provenance(dev)
    spec = build_spec(base_spec, table, peaks=peaks, stamp=stamp, name=name, kind=_device_kind(dev),
                      mem_capacity_bytes=_capacity(dev), threads=torch.get_num_threads() if dev.type == "cpu" else None)
    if dev.type == "cuda":
        spec = strided_cases.apply(gpu_ops.apply(spec, table, stamp), table, stamp)
    if phase:
        spec = sanity.stamped(spec, phase)
    if ds is not None:
        spec = deepspeed_cases.apply(spec, ds, stamp)
    if conc is not None:
        spec = concurrency.apply(spec, conc, stamp)
    if sync is not None:
        spec = coll.apply_sync_terms(spec, sync, stamp)
    return table, spec


def _at_one_reference(frames) -> list:
    """``frames`` with every group read against the references re-anchored at the whole calibration's reference
    times (``repeats.anchor_s`` of all their readings: one phase for every group), attrs dropped (the pooled
    reference times and spread go to the calibration record, ``reference_record``)."""
    readings = [x for f in frames for r in f.attrs.get("references") or () for x in r]
    computes = [x for f in frames for r in f.attrs.get("compute_references") or () for x in r]
    compute_s = repeats_mod.anchor_s(computes) if computes else None
    out = [reanchor(f, repeats_mod.anchor_s(readings), compute_s) if readings else f for f in frames]
    for f in out:
        f.attrs = {}
    return out


def reference_record(frames) -> dict:
    """The calibration record's ``reference_s``, ``reference_statistic`` (``repeats.ANCHOR``), ``reference_spread``
    (p90 / p10 of the readings) and ``compute_reference_s`` from ``frames`` (empty without reference readings: a
    GPU's)."""
    readings = sorted(x for f in frames for r in f.attrs.get("references") or () for x in r)
    if not readings:
        return {}
    p10, p90 = readings[int(0.1 * (len(readings) - 1))], readings[int(0.9 * (len(readings) - 1))]
    out = {"reference_s": repeats_mod.anchor_s(readings), "reference_statistic": repeats_mod.ANCHOR,
           "reference_spread": round(p90 / p10, 3)}
    computes = [x for f in frames for r in f.attrs.get("compute_references") or () for x in r]
    if computes:
        out["compute_reference_s"] = repeats_mod.anchor_s(computes)
    return out


def unsteady_note(frames, shown: int = 6) -> Optional[str]:
    """A note naming the cases whose repeats still disagree after the re-timing (kept value more than
    ``repeats.UNSTEADY_SPREAD`` x the fastest repeat), or None: the constants fitted from them are the least
    steady of this calibration (0-4 of 125 quick cases per calibration on the project's VM; which constants still
    move between calibrations: bench/results/calibration_steadiness.md)."""
    rows = [r for f in frames if {"seconds", "seconds_min"} <= set(f.columns) for r in f.itertuples(index=False)]
    bad = [f"{r.kind} {r.label}" for r in rows
           if r.seconds_min > 0 and r.seconds > repeats_mod.UNSTEADY_SPREAD * r.seconds_min]
    if not bad:
        return None
    more = f" and {len(bad) - shown} more" if len(bad) > shown else ""
    return (f"{len(bad)} of {len(rows)} cases' repeats still disagree after re-timing (kept value more than "
            f"{repeats_mod.UNSTEADY_SPREAD:g}x the fastest): {', '.join(bad[:shown])}{more}; the constants fitted "
            f"from them are the least steady (`perfcheck calibrate` times more repeats)")


def _calibrate(base, mode, device, dtypes, peaks, comm, world_size, name, progress, deepspeed=None,
               clock="wall") -> Calibration:
    """The steps of ``calibrate`` in order: check, host groups, device groups, multi-process groups, fit."""
    dev, base_spec, peaks, cfg = _checked_setup(base, mode, device, peaks, world_size)
    run = _Run(dev, cfg, Timer(dev, clock), progress)
    measured = _dtypes_to_measure(base_spec, dev, dtypes)
    busy = _busy_note(dev)
    if busy:
        run.note(busy)
    _host_groups(run, measured)
    _device_groups(run, measured, base_spec)
    conc, sync, ds = _multi_process_groups(run, mode, world_size, deepspeed, comm)
    phase = reference_record(run.frames)
    unsteady = unsteady_note(run.frames)
    if unsteady:
        run.note(unsteady)
    table, spec = _spec(run, base_spec, peaks, name, conc, sync, ds, phase)
    elapsed = time.perf_counter() - run.start
    _progress(progress, f"[{elapsed:5.1f} s] done")
    return Calibration(spec, table, tuple(run.notes), elapsed)


def _busy_note(device) -> Optional[str]:
    """A warning when other processes compete for this CPU's cores (timings then drift and stall)."""
    if device.type != "cpu" or not hasattr(os, "getloadavg"):
        return None
    load, cores, threads = os.getloadavg()[0], os.cpu_count() or 1, torch.get_num_threads()
    if load + threads <= cores + 1:
        return None
    stall = (f"; with {threads} threads a parallel op can wait a scheduler tick for a busy core (--threads 1 is "
             f"steadier)" if threads > 1 else "")
    return f"load average {load:.1f} on {cores} cores: other processes compete for the CPU, so rates drift{stall}"


def provenance(device) -> str:
    """"measured by perfcheck calibrate on <host> (<device>), <date>, torch <version>"."""
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"measured by perfcheck calibrate on {socket.gethostname()} ({what}), {date}, torch {torch.__version__}"


def _device_kind(device) -> str:
    return "gpu" if device.type == "cuda" else "cpu"


def _capacity(device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    import psutil  # optional at import time: only a CPU calibration needs it

    return float(psutil.virtual_memory().total)

