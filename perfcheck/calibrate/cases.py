"""The micro-benchmarks of ``perfcheck calibrate``: cases (a closure with the FLOPs and bytes of one
call), the timer, and the interleaved runner. What each case measures, and why, is described in
``perfcheck.calibrate``; the arithmetic that turns the timings into a spec is ``perfcheck.calibrate.fit``.
"""
from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from typing import Callable, Optional

import pandas as pd
import torch

from perfcheck.errors import UserError
from perfcheck.calibrate import case_names as names, repeats as repeats_mod
from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS
from perfcheck.calibrate.layers import cold_filler
from perfcheck.calibrate.phase import PHASE_HOST_KINDS, REFERENCE_LOOP_S
from perfcheck.hardware.systems import normalize_dtype, torch_dtype
from perfcheck.predict.pages import MMAP_ALWAYS_BYTES, PAGE_BYTES



@dataclasses.dataclass
class Case:
    """One micro-benchmark: ``fn()`` does ``flops`` FLOPs and moves ``bytes`` bytes per call."""

    kind: str
    label: str
    fn: Callable[[], object]
    dtype: str = ""
    flops: float = 0.0
    bytes: float = 0.0
    shape: tuple = (0, 0, 0)
    per_call: int = 1  # kernels (or ops) per fn() call; times are reported per kernel
    setup: Optional[Callable[[], None]] = None  # run before each timed loop (e.g. allow TF32)
    #: run untimed before each timed call (CPU): other code, so the call is timed with its code and data
    #: as cold as a training step leaves them, not as hot as a tight loop of it keeps them (``cold_filler``)
    between: Optional[Callable[[], None]] = None
    #: a host (framework) cost: on CUDA timed on the host clock (perf_counter, no sync inside the timed
    #: calls), not with CUDA events, whose loop reads the device's pace once the host runs ahead (``Timer.loop``)
    host: bool = False


# ------------------------------------------------------------------------------ timing
#: CPU clocks of the timer: ``wall`` (perf_counter, what a run's module timer uses) or ``process``
#: (this process's CPU time: on a shared host it leaves out the time other processes held the core,
#: so calibration and a measurement taken with the same clock agree under load; one intra-op thread only,
#: as it sums every thread's time).
CLOCKS = ("wall", "process")


class Timer:
    """Seconds per call of a loop: perf_counter (``clock="wall"``) or process CPU time (``"process"``) on
    CPU; CUDA events on GPU, synchronized only around the loop."""

    def __init__(self, device: torch.device, clock: str = "wall"):
        if clock not in CLOCKS:
            raise UserError(f"clock: unknown {clock!r} (known: {', '.join(CLOCKS)})")
        self.cuda = device.type == "cuda"
        if self.cuda and clock != "wall":
            raise UserError("clock: a GPU is timed with CUDA events; 'process' is for CPU runs")
        self.device = device
        self._now = time.process_time if clock == "process" else time.perf_counter

    def loop(self, fn, iters: int, between=None, host: bool = False) -> float:
        """Seconds per call of ``fn`` over ``iters`` calls.

        ``between`` (untimed, before each call): each call is timed alone on the host clock, after the filler,
        as a training step pays a once-per-step cost (the optimizer step, ``backward()``'s start). On CUDA too,
        with the device synchronized once before the loop and never between the filler and the call: in a step
        the optimizer follows the backward's queued kernels with no sync, and a sync right before a call made
        it dearer on an H100 VM (SGD step + zero_grad on LeNet: 29 us in a tight loop, 53 after a filler, 82
        after a synchronize; bench/gpu_results/2026-11-23-h100/host_contexts.csv). The filler's few tiny
        kernels take the device less time than the host needs to issue them, so the queue never fills.
        ``host``: a host cost timed in a loop; on CUDA on the host clock with the device synchronized before
        the loop only (the host's issue time of the calls). Otherwise on CUDA: events around the loop (the
        device's time per call, for kernels that keep the device busy: GEMMs, copies)."""
        if between is not None:  # each call timed alone, ``between`` untimed
            if self.cuda:
                torch.cuda.synchronize(self.device)
            total = 0.0
            for _ in range(iters):
                between()
                t0 = self._now()
                fn()
                total += self._now() - t0
            return max(total / iters - self._read_s(), 0.0)
        if self.cuda and not host:
            torch.cuda.synchronize(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / iters
        if self.cuda:
            torch.cuda.synchronize(self.device)
        t0 = self._now()
        for _ in range(iters):
            fn()
        return (self._now() - t0) / iters

    def _read_s(self) -> float:
        """Seconds one reading of the clock adds to a call timed alone (median of 200 back-to-back reads)."""
        if not hasattr(self, "_read"):
            now = self._now
            self._read = statistics.median(-(now() - now()) for _ in range(200))
        return self._read


#: Most calls per timed loop of a case run after a filler (``Case.between``).
_COLD_MAX_ITERS = 50
def _sized(timer: Timer, fn, target_s: float, cap: int, between=None, host: bool = False) -> int:
    """Calls per timed loop: ``target_s`` over the fastest of up to three single calls (one call can hit a
    scheduler stall), within [1, cap]."""
    t = timer.loop(fn, 1, between, host)
    if t < target_s:
        t = min(t, timer.loop(fn, 1, between, host), timer.loop(fn, 1, between, host))
    return int(min(cap, max(1, math.ceil(target_s / max(t, 1e-9)))))


def _row(c: Case, sec: float, lo: float, hi: float, repeats: int, iters: int) -> dict:
    """One row of the measurement table (``MEASUREMENT_COLUMNS``)."""
    return {"kind": c.kind, "label": c.label, "dtype": c.dtype, "m": c.shape[0], "k": c.shape[1], "n": c.shape[2],
            "flops": c.flops, "bytes": c.bytes, "world_size": 1, "seconds": sec, "seconds_min": lo, "seconds_max": hi,
            "repeats": repeats, "iters": iters, "flops_per_s": c.flops / sec if c.flops and sec > 0 else math.nan,
            "bytes_per_s": c.bytes / sec if c.bytes and sec > 0 else math.nan, "busbw_bytes_per_s": math.nan}


def run_cases(cases, timer: Timer, *, repeats: int, target_s: float, max_iters: int = 20000,
              reference=None, compute_reference=None) -> pd.DataFrame:
    """Time every case ``repeats`` times, interleaved, and the unsteady ones up to ``repeats`` times more;
    one row per case with the median of the fastest half of its per-call times (``repeats.fastest_half``:
    interference only adds time).

    ``reference``, ``compute_reference`` (CPU; ``perfcheck.calibrate.phase``): timed right before every repeat,
    each repeat kept against them (``repeats.against_reference``), so cases timed seconds apart are read at one
    phase of a shared machine; seconds at this table's reference times (``phase.reanchor``: a calibration's).
    ``table.attrs``: "samples" (every repeat); with a reference also "references", "compute_references",
    "reference_s", "compute_reference_s", "relative" (per case: host?, kept, min, max against them)."""
    iters = []
    for c in cases:  # warm-up (allocator, kernel selection, caches), then size the loop
        if c.setup:
            c.setup()
        c.fn()
        # a case with a filler is timed call by call, the filler's time outside: fewer calls bound its cost
        iters.append(_sized(timer, c.fn, target_s, max_iters if c.between is None else _COLD_MAX_ITERS,
                            c.between, c.host))
    refd = reference is not None
    ref_iters = _sized(timer, reference, REFERENCE_LOOP_S, max_iters) if refd else 0
    cref_iters = _sized(timer, compute_reference, REFERENCE_LOOP_S, max_iters) if compute_reference else 0
    samples, refs, crefs = [[] for _ in cases], [[] for _ in cases], [[] for _ in cases]
    host = [c.kind in PHASE_HOST_KINDS for c in cases]

    def kept(i):  # what the statistic sees: the raw times, or the times against the references
        if not refd:
            return samples[i]
        return repeats_mod.against_reference(samples[i], refs[i], host[i], crefs[i] if compute_reference else None)

    for r in range(2 * repeats):  # repeats rounds, then up to as many again of the unsteady cases only
        todo = range(len(cases)) if r < repeats else [i for i in range(len(cases)) if repeats_mod.unsteady(kept(i))]
        for i in todo:
            c = cases[i]
            if c.setup:
                c.setup()
            if refd:
                refs[i].append(max(timer.loop(reference, ref_iters), 1e-12))
                if compute_reference:
                    crefs[i].append(max(timer.loop(compute_reference, cref_iters), 1e-12))
            samples[i].append(timer.loop(c.fn, iters[i], c.between, c.host) / c.per_call)
    rows, relative = [], []
    ref_s = repeats_mod.anchor_s([x for r in refs for x in r]) if refd else None
    cref_s = repeats_mod.anchor_s([x for r in crefs for x in r]) if refd and compute_reference else None
    for i, (c, s, it) in enumerate(zip(cases, samples, iters)):
        if refd:
            k = kept(i)
            relative.append((host[i], repeats_mod.fastest_half(k), min(k), max(k)))
            sec, lo, hi = (repeats_mod.anchored(v, ref_s, host[i], cref_s) for v in relative[-1][1:])
        else:
            sec, lo, hi = repeats_mod.fastest_half(s), min(s), max(s)
        rows.append(_row(c, sec, lo, hi, len(s), it))
    table = pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS))
    table.attrs["samples"] = [list(s) for s in samples]  # every repeat, per case (bench/calibration_steadiness.py)
    if refd:
        table.attrs.update(references=[list(r) for r in refs], reference_s=ref_s, relative=relative,
                           compute_references=[list(r) for r in crefs] if compute_reference else None,
                           compute_reference_s=cref_s)
    return table


# ------------------------------------------------------------------------------ cases
def _tf32(enabled: bool):
    def setup():
        torch.backends.cuda.matmul.allow_tf32 = enabled
    return setup


def matmul_cases(dtype: str, squares, linear, device) -> list:
    """``torch.mm`` on n x n x n and ``F.linear`` on (m tokens, k in, n out); bytes = A + B + C once. Each call
    allocates its output, as a model's matmul does and as the tiny ``op_fixed`` "mm" case the fit subtracts
    (perfcheck.calibrate.fit): with ``out=`` a 32^3 mm took 6.2 us, without 7.3 us, the tiny 8x16x5 mm
    4.9 us on the project's VM, so a preallocated small square read as faster than the peak."""
    d = normalize_dtype(dtype)
    tdt = torch_dtype(d)
    setup = _tf32(d == "tf32") if device.type == "cuda" else None
    cases = []
    for m, k, n in [(s, s, s) for s in squares] + [tuple(s) for s in linear]:
        a = torch.randn(m, k, device=device, dtype=tdt)
        is_square = (m, k, n) in [(s, s, s) for s in squares]
        w = torch.randn(k, n, device=device, dtype=tdt) if is_square else torch.randn(n, k, device=device, dtype=tdt)
        if is_square:
            fn, label = (lambda a=a, w=w: torch.mm(a, w)), f"mm {m}x{k}x{n}"
        else:
            fn, label = (lambda a=a, w=w: torch.nn.functional.linear(a, w)), f"linear {m}x{k}x{n}"
        nbytes = (m * k + k * n + m * n) * a.element_size()
        cases.append(Case(names.MATMUL, label, fn, d, 2.0 * m * k * n, nbytes, (m, k, n), setup=setup))
    return cases


#: Linux's description of CPU 0's caches (one folder per cache: level, type, size such as "2048K").
CPU_CACHES = "/sys/devices/system/cpu/cpu0/cache"


def l2_cache_bytes(root: str = CPU_CACHES) -> int:
    """A core's L2 cache in bytes, from Linux's sysfs (``<root>/index*/level`` 2, ``size``); 0 where the
    platform does not say (the cold matmul cases are then skipped)."""
    return cache_bytes(2, root)


def cache_bytes(level: int, root: str = CPU_CACHES) -> int:
    """CPU 0's unified or data cache of ``level`` in bytes, from Linux's sysfs (``<root>/index*/level``, ``size``;
    the L3 as the machine reports it, shared with the cores listed beside it); 0 where the platform does not say."""
    try:
        for entry in sorted(os.listdir(root)):
            folder = os.path.join(root, entry)
            with open(os.path.join(folder, "level")) as f:
                if f.read().strip() != str(level):
                    continue
            with open(os.path.join(folder, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
            return int(text.rstrip("KMG")) * scale
    except (OSError, ValueError):
        return 0
    return 0


#: Largest GEMM the cold cases time: from ~2.7e8 FLOPs on the refetch hides behind the compute (0.99 at 2.1e9 on
#: the project's Xeon), and a call timed alone after an eviction costs the calibration its whole duration.
COLD_MAX_FLOPS = 3e8


def matmul_cold_cases(dtype: str, squares, linear, device) -> list:
    """``matmul_cases``' shapes timed call by call two ways: after the same call (label ``hot <label>``) and after
    streaming ``case_names.EVICT_L2_MULTIPLE`` x the core's L2 (label as ``matmul_cases``'), each filler untimed
    (``Case.between``); and a row ``l2`` whose ``m`` is that L2 size: ``fit`` makes the pairs' ratio the
    ``matrix_cold_curve``. Why: in a training step a GEMM's weight and (backward) its saved
    activation were last touched before the rest of the step's work; on the project's Xeon GEMMs of 17-67 MFLOP
    then ran 1.2-1.8x their tight-loop time, a 2.4 GFLOP one unchanged (bench/results/cold_operands.md). CPU only:
    none where the L2 size is unknown."""
    l2 = l2_cache_bytes()
    if device.type != "cpu" or l2 <= 0:
        return []
    flush = torch.empty(names.EVICT_L2_MULTIPLE * l2 // 4, device=device)
    cases = []
    for c in matmul_cases(dtype, squares, linear, device):  # both timed call by call, adjacent in every round
        if c.flops > COLD_MAX_FLOPS:
            continue
        cases += [dataclasses.replace(c, kind=names.MATMUL_COLD, label=f"hot {c.label}", between=c.fn),
                  dataclasses.replace(c, kind=names.MATMUL_COLD, between=lambda f=flush: f.add_(1.0))]
    return cases + [Case(names.MATMUL_COLD, "l2", lambda: None, normalize_dtype(dtype), 0.0, 0.0, (l2, 0, 0))]


#: GEMMs timed with n not a multiple of 16 bytes and with their aligned twin (n rounded up to 8
#: elements): (m, k, n). The first is GPT-2's lm_head at 8 x 1024 tokens (vocabulary 50257).
ALIGN_SHAPES = ((8192, 768, 50257), (8192, 4096, 4097))


def alignment_cases(dtype: str, device) -> list:
    """``F.linear`` (m, k) -> n without bias with n not a multiple of 16 bytes: its forward (label
    ``unaligned fwd MxKxN``) and its backward's two GEMMs (``unaligned bwd MxKxN``: ``y.backward``
    on a kept graph, both inputs needing gradients), and the same for the aligned twin (n rounded up
    to 8 elements; ``aligned fwd MxKxN``, named by the unaligned shape). ``fit`` compares the
    unaligned times with the estimator's time for the twin (``efficiency.matrix_unaligned``, ``_bwd``)."""
    d = normalize_dtype(dtype)
    tdt = torch_dtype(d)
    setup = _tf32(d == "tf32") if device.type == "cuda" else None
    cases = []
    for m, k, n in ALIGN_SHAPES:
        for aligned, width in ((False, n), (True, -(-n // 8) * 8)):
            a = torch.randn(m, k, device=device, dtype=tdt, requires_grad=True)
            w = torch.randn(width, k, device=device, dtype=tdt, requires_grad=True)
            y = torch.nn.functional.linear(a, w)
            g = torch.randn_like(y)
            nbytes = (m * k + width * k + m * width) * a.element_size()

            def fwd(a=a, w=w):
                with torch.no_grad():
                    return torch.nn.functional.linear(a, w)

            def bwd(y=y, g=g, a=a, w=w):
                y.backward(g, retain_graph=True)
                a.grad = w.grad = None  # no accumulation kernels: the two GEMMs alone

            cases += [Case(names.GEMM_ALIGN, names.gemm_align_label(aligned, "fwd", m, k, n), fwd, d,
                           2.0 * m * k * width, nbytes, (m, k, width), setup=setup),
                      Case(names.GEMM_ALIGN, names.gemm_align_label(aligned, "bwd", m, k, n), bwd, d,
                           4.0 * m * k * width, 2 * nbytes, (m, k, width), setup=setup)]
    return cases


def copy_cases(sizes_mb, device) -> list:
    cases = []
    for mb in sizes_mb:
        n = int(mb * 2 ** 20) // 4
        src, dst = torch.randn(n, device=device), torch.empty(n, device=device)
        cases.append(Case(names.COPY, f"copy {mb} MiB", lambda s=src, d=dst: d.copy_(s), "fp32", 0.0, 2.0 * n * 4,
                          (n, 0, 0)))
    return cases


def vector_cases(dtypes, device, numel: int = 1 << 18) -> list:
    """Elementwise add on a cache-resident buffer (3 x 1 MiB in fp32): 1 FLOP per element.
    NB (bench/results/heldout.md): on the project's Xeon these buffers spill its 2 MiB L2 (2.1 G adds/s against
    5.0 at 3 x 256 KiB). The L2-resident rate was tried and predicted the design set's steps worse (median |step
    error| 22.7% against 10.0% at this rate, same measurements): ops inside a step do not run at a tight loop's
    in-L2 rate. It leaves LayerNorm (7 FLOPs per element) ~2x over-predicted."""
    cases = []
    for d in dtypes:
        tdt = torch_dtype(d)
        a, b, c = (torch.randn(numel, device=device).to(tdt) for _ in range(3))
        cases.append(Case(names.VECTOR, f"add {numel}", lambda a=a, b=b, c=c: torch.add(a, b, out=c),
                          normalize_dtype(d),
                          float(numel), 3.0 * numel * a.element_size(), (numel, 0, 0)))
    return cases


def launch_cases(device, chain: int = 32) -> list:
    """Tiny-op cost: one plain op, and per kernel of a forward+backward chain under autograd."""
    a, b = torch.ones(1, device=device), torch.ones(1, device=device)
    x = torch.ones(1, device=device, requires_grad=True)

    def fwd_bwd():
        y = x
        for _ in range(chain):
            y = y * b  # estimator: 1 forward kernel + 1 backward kernel (only y needs a gradient)
        y.backward()

    return [Case(names.LAUNCH, names.LAUNCH_OP, lambda: torch.add(a, b), "fp32"),
            Case(names.LAUNCH, names.LAUNCH_AUTOGRAD, fwd_bwd, "fp32", per_call=2 * chain)]


# ------------------------------------------------------------------------------ host (framework) costs
class _Noop(torch.nn.Module):
    def forward(self, x):
        return x


#: Chain lengths of the forward+backward cases: backward per node is the slope, the fixed cost of
#: loss.backward() the intercept.
BACKWARD_CHAINS = (8, 32)
#: Parameter-tensor counts of the optimizer cases: per-tensor cost is the slope, the step's fixed cost the intercept.
OPTIM_TENSORS = (2, 16)
#: (label, optimizer class name, foreach) of the optimizer cases.
OPTIM_CASES = (("sgd", "SGD", False), ("sgd_foreach", "SGD", True), ("adam", "Adam", False),
               ("adam_foreach", "Adam", True))


def host_cases(device, chain: int = 32) -> list:
    """Framework costs the host model needs (perfcheck.predict.host), on 1-element tensors so the
    kernels themselves cost nothing: a view op, an op under autograd (forward only), forward +
    backward chains of two lengths, a module call, and optimizer steps per implementation.
    Each row's time is per ``per_call`` (op, module call or whole call, as labelled)."""
    dev = torch.device(device)
    b = torch.ones(1, device=dev)
    m2 = torch.ones(1, 1, device=dev)
    x = torch.ones(1, device=dev, requires_grad=True)
    noop = _Noop()

    def fwd_grad():
        y = x
        for _ in range(chain):
            y = y * b  # one op + one grad_fn node each; the graph is freed when y goes
        return y

    def fwd_plain():
        y = b
        for _ in range(chain):
            y = y * b  # the same ops without autograd: fwd_grad less this is the grad_fn nodes alone
        return y

    def fwd_bwd(n):
        def fn():
            y = x
            for _ in range(n):
                y = y * b
            y.backward()
        return fn

    def calls():
        y = b
        for _ in range(16):
            y = noop(y)
        return y

    cases = [Case(names.HOST, names.HOST_VIEW, lambda: m2.t(), "fp32", host=True),
             Case(names.HOST, names.chain_label(True, chain), fwd_grad, "fp32", per_call=chain, host=True),
             Case(names.HOST, names.chain_label(False, chain), fwd_plain, "fp32", per_call=chain, host=True),
             Case(names.HOST, names.HOST_MODULE_CALL, calls, "fp32", per_call=16, host=True)] + page_fault_cases(dev)
    # once-per-step costs (loss.backward()'s start: the chains' intercept; the optimizer step) are timed
    # once per filler call, after other code, as a step runs them (``cold_filler``), on the host clock on a
    # GPU too (Timer.loop); per-op costs stay tight loops: a step's ops follow one another. Before, a GPU
    # timed these in a tight loop with events: the optimizer inside a step then ran 176-215 us against 41
    # predicted on an H100 VM (bench/RESULTS.md, "On a GPU, second visit", section 4)
    cold = cold_filler(dev)
    cases += [Case(names.HOST, names.forward_backward_label(n), fwd_bwd(n), "fp32", shape=(n, 0, 0), between=cold,
                   host=True)
              for n in BACKWARD_CHAINS]
    for label, cls, foreach in OPTIM_CASES:
        for n in OPTIM_TENSORS:
            params = [torch.nn.Parameter(torch.ones(1, device=dev)) for _ in range(n)]
            # the for-loop as a CPU user gets it: torch's default (foreach=None resolves to the for-loop on
            # CPU tensors, through ~20 us of checks that foreach=False skips; the host model's default)
            impl = None if (foreach is False and dev.type == "cpu") else foreach
            opt = getattr(torch.optim, cls)(params, lr=1e-9, foreach=impl)
            cases.append(Case(names.HOST, names.optim_label(label, n), _step_and_zero_grad(opt, params, dev), "fp32",
                              shape=(n, 0, 0), between=cold, host=True))
    return cases


def page_fault_cases(dev) -> list:
    """CPU only: ``torch.zeros`` of a fresh ``MMAP_ALWAYS_BYTES`` buffer (mapped anew at each allocation: every
    page faults on its first touch) and ``zero_()`` of a kept one, each per 4 KiB page; their difference is
    ``page_fault_s`` (perfcheck.predict.pages). Two 32 MiB fills per call: ~20 ms and ~3 ms."""
    if dev.type != "cpu":
        return []
    pages, kept = MMAP_ALWAYS_BYTES // PAGE_BYTES, torch.zeros(MMAP_ALWAYS_BYTES // 4)
    return [Case(names.HOST, names.HOST_FRESH_FILL, lambda: torch.zeros(MMAP_ALWAYS_BYTES // 4), "fp32",
                 per_call=pages, host=True),
            Case(names.HOST, names.HOST_REUSED_FILL, kept.zero_, "fp32", per_call=pages, host=True)]


#: Elements of the sqrt cases: 1 MiB of fp32, past the size where the per-element price settles (16 Ki elements on
#: the project's Xeon: 5.2 ns per zero at 16 Ki, 5.4 at 256 Ki, 5.0 at 4 Mi) and quick (~1.3 ms per call of zeros).
SQRT_ELEMENTS = 256 * 1024


def sqrt_zero_cases(dev) -> list:
    """``torch.sqrt`` of a buffer of zeros and of the same buffer of normal values (1.0), per element; their
    difference is ``sqrt_zero_s`` (perfcheck.predict.zero_rows: an adaptive optimizer's root of a second moment
    that stays 0 on embedding rows no batch reaches; a CPU's vectorized sqrt of 0 takes a slow path)."""
    zeros = torch.zeros(SQRT_ELEMENTS, device=dev)
    ones = torch.ones(SQRT_ELEMENTS, device=dev)
    return [Case(names.HOST, names.HOST_SQRT_ZERO, lambda: torch.sqrt(zeros), "fp32", per_call=SQRT_ELEMENTS),
            Case(names.HOST, names.HOST_SQRT_NORMAL, lambda: torch.sqrt(ones), "fp32", per_call=SQRT_ELEMENTS)]


def _step_and_zero_grad(opt, params, dev):
    """What a training loop runs per step and the host model predicts (perfcheck.predict.host.optimizer_time):
    ``opt.step()`` then ``opt.zero_grad(set_to_none=True)``; the gradients are put back first (the same
    tensors: ~0.4 us per tensor of Python, kept in the per-tensor slope). zero_grad alone added 40-60 us per
    step and 1-4 us per tensor on the project's VM (SGD x2: step 75 us, step + zero_grad 118 us)."""
    grads = [torch.ones(1, device=dev) for _ in params]

    def fn():
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
        opt.zero_grad(set_to_none=True)
    return fn


def device_kernel_rows(device, repeats: int, kernels: int = 256) -> pd.DataFrame:
    """GPU-side seconds per tiny kernel (one row, kind "host", label "device kernel"):
    ``torch.cuda._sleep`` holds the stream while the host queues ``kernels`` tiny adds, so the
    events around them time the device alone, without host gaps. Median over ``repeats``."""
    a = torch.ones(1, device=device)
    samples = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize(device)
        torch.cuda._sleep(5_000_000)  # a few ms of spinning: longer than queuing the adds takes
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(kernels):
            torch.add(a, a)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / kernels)
    s = samples[1:]  # the first is a warm-up
    sec = repeats_mod.fastest_half(s)
    return pd.DataFrame([{"kind": names.HOST, "label": names.HOST_DEVICE_KERNEL, "dtype": "fp32", "m": kernels, "k": 0,
                          "n": 0,
                          "flops": 0.0, "bytes": 0.0, "world_size": 1, "seconds": sec, "seconds_min": min(s),
                          "seconds_max": max(s), "repeats": len(s), "iters": kernels, "flops_per_s": math.nan,
                          "bytes_per_s": math.nan, "busbw_bytes_per_s": math.nan}], columns=list(MEASUREMENT_COLUMNS))
