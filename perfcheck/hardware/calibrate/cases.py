"""The micro-benchmarks of ``perfcheck calibrate``: cases (a closure with the FLOPs and bytes of one
call), the timer, and the interleaved runner. What each case measures, and why, is described in
``perfcheck.calibrate``; the arithmetic that turns the timings into a spec is ``perfcheck.hardware.calibrate.fit``.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Callable, Optional

import pandas as pd
import torch

from perfcheck.errors import UserError
from perfcheck.hardware.calibrate import repeats as repeats_mod
from perfcheck.hardware.calibrate.fit import MEASUREMENT_COLUMNS
from perfcheck.hardware.calibrate.layers import CallModule, cold_filler, tiny_modules
from perfcheck.hardware.systems import normalize_dtype

_TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                 "fp64": torch.float64}


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


def run_cases(cases, timer: Timer, *, repeats: int, target_s: float, max_iters: int = 20000) -> pd.DataFrame:
    """Time every case ``repeats`` times, interleaved, and the unsteady ones up to ``repeats`` times more;
    one row per case with the median of the fastest half of its per-call times (``repeats.fastest_half``:
    interference only adds time)."""
    iters = []
    for c in cases:  # warm-up (allocator, kernel selection, caches), then size the loop on the
        if c.setup:  # fastest of three single calls (one call can hit a scheduler stall)
            c.setup()
        c.fn()
        t = timer.loop(c.fn, 1, c.between, c.host)
        if t < target_s:
            t = min(t, timer.loop(c.fn, 1, c.between, c.host), timer.loop(c.fn, 1, c.between, c.host))
        # a case with a filler is timed call by call, the filler's time outside: fewer calls bound its cost
        cap = max_iters if c.between is None else _COLD_MAX_ITERS
        iters.append(int(min(cap, max(1, math.ceil(target_s / max(t, 1e-9))))))
    samples = [[] for _ in cases]
    for r in range(2 * repeats):  # repeats rounds, then up to as many again of the unsteady cases only
        todo = range(len(cases)) if r < repeats else [i for i, s in enumerate(samples) if repeats_mod.unsteady(s)]
        for i in todo:
            c = cases[i]
            if c.setup:
                c.setup()
            samples[i].append(timer.loop(c.fn, iters[i], c.between, c.host) / c.per_call)
    rows = []
    for c, s, it in zip(cases, samples, iters):
        sec = repeats_mod.fastest_half(s)
        rows.append({"kind": c.kind, "label": c.label, "dtype": c.dtype, "m": c.shape[0], "k": c.shape[1],
                     "n": c.shape[2], "flops": c.flops, "bytes": c.bytes, "world_size": 1, "seconds": sec,
                     "seconds_min": min(s), "seconds_max": max(s), "repeats": len(s), "iters": it,
                     "flops_per_s": c.flops / sec if c.flops else math.nan,
                     "bytes_per_s": c.bytes / sec if c.bytes else math.nan, "busbw_bytes_per_s": math.nan})
    return pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS))


# ------------------------------------------------------------------------------ cases
def _tf32(enabled: bool):
    def setup():
        torch.backends.cuda.matmul.allow_tf32 = enabled
    return setup


def matmul_cases(dtype: str, squares, linear, device) -> list:
    """``torch.mm`` on n x n x n and ``F.linear`` on (m tokens, k in, n out); bytes = A + B + C once. Each call
    allocates its output, as a model's matmul does and as the tiny ``op_fixed`` "mm" case the fit subtracts
    (perfcheck.hardware.calibrate.fit): with ``out=`` a 32^3 mm took 6.2 us, without 7.3 us, the tiny 8x16x5 mm
    4.9 us on the project's VM, so a preallocated small square read as faster than the peak."""
    d = normalize_dtype(dtype)
    tdt = _TORCH_DTYPES[d]
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
        cases.append(Case("matmul", label, fn, d, 2.0 * m * k * n, nbytes, (m, k, n), setup=setup))
    return cases


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
    tdt = _TORCH_DTYPES[d]
    setup = _tf32(d == "tf32") if device.type == "cuda" else None
    cases = []
    for m, k, n in ALIGN_SHAPES:
        for label, width in (("unaligned", n), ("aligned", -(-n // 8) * 8)):
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

            cases += [Case("gemm_align", f"{label} fwd {m}x{k}x{n}", fwd, d, 2.0 * m * k * width, nbytes,
                           (m, k, width), setup=setup),
                      Case("gemm_align", f"{label} bwd {m}x{k}x{n}", bwd, d, 4.0 * m * k * width, 2 * nbytes,
                           (m, k, width), setup=setup)]
    return cases


def copy_cases(sizes_mb, device) -> list:
    cases = []
    for mb in sizes_mb:
        n = int(mb * 2 ** 20) // 4
        src, dst = torch.randn(n, device=device), torch.empty(n, device=device)
        cases.append(Case("copy", f"copy {mb} MiB", lambda s=src, d=dst: d.copy_(s), "fp32", 0.0, 2.0 * n * 4,
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
        tdt = _TORCH_DTYPES[normalize_dtype(d)]
        a, b, c = (torch.randn(numel, device=device).to(tdt) for _ in range(3))
        cases.append(Case("vector", f"add {numel}", lambda a=a, b=b, c=c: torch.add(a, b, out=c), normalize_dtype(d),
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

    return [Case("launch", "op", lambda: torch.add(a, b), "fp32"),
            Case("launch", "autograd", fwd_bwd, "fp32", per_call=2 * chain)]


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

    cases = [Case("host", "view", lambda: m2.t(), "fp32", host=True),
             Case("host", f"autograd forward x{chain}", fwd_grad, "fp32", per_call=chain, host=True),
             Case("host", f"plain forward x{chain}", fwd_plain, "fp32", per_call=chain, host=True),
             Case("host", "module call", calls, "fp32", per_call=16, host=True)]
    # once-per-step costs (loss.backward()'s start: the chains' intercept; the optimizer step) are timed
    # once per filler call, after other code, as a step runs them (``cold_filler``), on the host clock on a
    # GPU too (Timer.loop); per-op costs stay tight loops: a step's ops follow one another. Before, a GPU
    # timed these in a tight loop with events: the optimizer inside a step then ran 176-215 us against 41
    # predicted on an H100 VM (bench/RESULTS.md, "On a GPU, second visit", section 4)
    cold = cold_filler(dev)
    cases += [Case("host", f"forward+backward x{n}", fwd_bwd(n), "fp32", shape=(n, 0, 0), between=cold, host=True)
              for n in BACKWARD_CHAINS]
    for label, cls, foreach in OPTIM_CASES:
        for n in OPTIM_TENSORS:
            params = [torch.nn.Parameter(torch.ones(1, device=dev)) for _ in range(n)]
            # the for-loop as a CPU user gets it: torch's default (foreach=None resolves to the for-loop on
            # CPU tensors, through ~20 us of checks that foreach=False skips; the host model's default)
            impl = None if (foreach is False and dev.type == "cpu") else foreach
            opt = getattr(torch.optim, cls)(params, lr=1e-9, foreach=impl)
            cases.append(Case("host", f"optim {label} x{n}", _step_and_zero_grad(opt, params, dev), "fp32",
                              shape=(n, 0, 0), between=cold, host=True))
    return cases


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
    return pd.DataFrame([{"kind": "host", "label": "device kernel", "dtype": "fp32", "m": kernels, "k": 0, "n": 0,
                          "flops": 0.0, "bytes": 0.0, "world_size": 1, "seconds": sec, "seconds_min": min(s),
                          "seconds_max": max(s), "repeats": len(s), "iters": kernels, "flops_per_s": math.nan,
                          "bytes_per_s": math.nan, "busbw_bytes_per_s": math.nan}], columns=list(MEASUREMENT_COLUMNS))


# ------------------------------------------------------------------------------ per-op kernel costs (CPU)
def _tiny_ops(dev, dtype=torch.float32, grad: bool = False):
    """aten op name -> a call of it on tiny tensors (nothing to compute: dispatch + the kernel's fixed cost).
    ``dtype``/``grad``: the floating tensors' dtype and whether they need a gradient (each call then builds its
    autograd node, as a training step's forward does; the graph is freed with the call's output)."""
    F = torch.nn.functional

    def t(*shape, fill=None):
        x = torch.randn(*shape, device=dev) if fill is None else torch.full(shape, float(fill), device=dev)
        return x.to(dtype).requires_grad_(grad)
    y, w, b = t(8, 16), t(16, 5), t(5)
    img, k = t(1, 1, 6, 6), t(1, 1, 3, 3)
    img2 = t(2, 1, 6, 6)
    # running statistics are buffers (never need a gradient), in the model's dtype
    rm, rv = torch.zeros(16, device=dev, dtype=dtype), torch.ones(16, device=dev, dtype=dtype)
    g, beta = t(16, fill=1), t(16, fill=0)
    bat = t(2, 4, 4)
    idx, table = torch.arange(8, device=dev), t(16, 4)
    return {
        "addmm": lambda: torch.addmm(b, y, w), "mm": lambda: torch.mm(y, w), "bmm": lambda: torch.bmm(bat, bat),
        # a batch of 2, the path a training batch takes: on a CPU a batch-1 convolution runs another kernel
        # (10 us for this 1->1 channel 3x3 on 6x6 on the project's VM) than batch >= 2 (119 us, the same at
        # batch 8): the fixed cost a LeNet-size convolution pays, which the op_efficiency fit subtracts
        "convolution": lambda: F.conv2d(img2, k),
        "native_batch_norm": lambda: F.batch_norm(y, rm, rv, g, beta, training=True),
        "native_layer_norm": lambda: F.layer_norm(y, (16,)), "sum": lambda: y.sum(0), "mean": lambda: y.mean(0),
        "_log_softmax": lambda: F.log_softmax(y, 1), "_softmax": lambda: F.softmax(y, 1),
        "max_pool2d_with_indices": lambda: F.max_pool2d(img, 2), "relu": lambda: F.relu(y),
        "gelu": lambda: F.gelu(y), "embedding": lambda: F.embedding(idx, table),
    }


#: Low-precision dtypes whose per-op host costs calibration measures apart on CUDA (``op_fixed_cases``'
#: ``dtypes``): on the H100 VM of 2026-11-26 a LeNet forward with gradients cost 467 us of host time per call in
#: bf16 against 209 us in fp32 (cuBLAS/cuDNN bf16 paths: Linear 30 vs 17 us, LeNet's conv2 73 vs 25 us; even
#: relu/max-pool with autograd +4 us), while the fp32 cases priced it at ~200 us
#: (bench/gpu_results/2026-11-26-h100/diag_ops.log).
HOST_DTYPES_CUDA = ("bf16",)


def op_fixed_cases(device, dtypes=()) -> list:
    """One tiny call per aten op family (label = the op's name): its time less one plain tiny op's
    is that family's fixed cost (``op_fixed_s``): on a CPU the kernel's set-up, on a GPU the host's
    (cuDNN/cuBLAS heuristics and descriptors: a loop of tiny calls is host-bound there).
    fp32 cases run without gradients (the autograd node is priced apart, autograd_node_s); each dtype of
    ``dtypes`` (bf16, fp16) adds the same calls in that dtype on tensors that need a gradient, as a training
    step's forward runs them (dtype column = that dtype; fit.py keys them ``<op>@<dtype>``)."""
    dev = torch.device(device)
    out = [Case("opfixed", name, fn, "fp32", host=True) for name, fn in _tiny_ops(dev).items()]
    for dt in dtypes:
        out += [Case("opfixed", name, fn, dt, host=True)
                for name, fn in _tiny_ops(dev, _TORCH_DTYPES[dt], grad=True).items()]
    return out


def op_cold_cases(device, dtypes=()) -> list:
    """The op_fixed cases' tiny ops called one after another (label ``round-robin xN``, time per op): each
    call follows a different op, as a training step runs its ops, where the op_fixed cases repeat one op in
    a tight loop that keeps its code, its branch history and its tensors in the core. Per op, this case less
    the mean of the same ops' tight loops is the host time an op costs beyond its tight-loop price inside a
    step (``op_cold_s``, fit.py). Why: on the project's VM the 14 ops took 268.6 us in a round-robin against
    124.1 us summed over their tight loops (+10.3 us per op; 11.1-13.5 us once the convolution ran a batch of
    2), and the same excess is what a LeNet or JSC
    forward inside a training step costs beyond a warm per-op model (bench/RESULTS.md, issue 12, helper-A)."""
    def case(dt, ops):
        def round_robin():
            for fn in ops:
                fn()
        return Case("opcold", f"round-robin x{len(ops)}", round_robin, dt, per_call=len(ops), host=True)
    dev = torch.device(device)
    # per dtype of ``dtypes``: the same ops in that dtype with gradients, as op_fixed_cases' cases of that dtype
    return [case("fp32", list(_tiny_ops(dev).values()))] + [
        case(dt, list(_tiny_ops(dev, _TORCH_DTYPES[dt], grad=True).values())) for dt in dtypes]


def module_fixed_cases(device) -> list:
    """One call per standard nn module class (label = the class name, see perfcheck.hardware.calibrate.layers)."""
    return [Case("modfixed", name, (lambda m=m, x=x: m(*x)), "fp32", host=True)
            for name, (m, x) in tiny_modules(device).items()]


def _formula_cost(fn, inputs, name: str) -> tuple:
    """(matrix FLOPs, other FLOPs, bytes) of the forward ``name`` ops ``fn(*inputs)`` runs, by the estimator's formulas."""
    from perfcheck.predict.aten_costs import cost_of
    from perfcheck.predict.trace import trace_model

    trace = trace_model(CallModule(fn), inputs)
    mf = of = nb = 0.0
    for op in trace.ops:
        if op.call.name == name:
            c = cost_of(op.call).cost.fwd
            mf, of, nb = mf + 2 * c.macs, of + c.flops, nb + c.bytes
    return mf, of, nb


def op_efficiency_cases(device, dtypes=("fp32",)) -> list:
    """Kernels that run far below the roofline at small channel counts, at a LeNet-like size (label =
    the op's name): a 3->6 channel 5x5 convolution on CIFAR images (8 on a CPU, 256 on a GPU, so
    the GPU's kernel, not its host, is timed) and a 2x2 max-pool of its output, in each of ``dtypes``
    (a str or several; tf32 runs on fp32 tensors and is left to fp32: a kernel's efficiency depends on its
    dtype, and the fit keeps one per dtype). ``flops`` holds the matrix FLOPs, ``bytes`` the bytes and ``n``
    the other FLOPs of the formulas."""
    F = torch.nn.functional
    dev = torch.device(device)
    batch = 256 if dev.type == "cuda" else 8
    wanted = [normalize_dtype(d) for d in ((dtypes,) if isinstance(dtypes, str) else dtypes)]
    out = []
    for dtype in dict.fromkeys("fp32" if d == "tf32" else d for d in wanted):
        tdt = _TORCH_DTYPES[dtype]
        x, w, b = (torch.randn(batch, 3, 32, 32, device=dev, dtype=tdt),
                   torch.randn(6, 3, 5, 5, device=dev, dtype=tdt), torch.randn(6, device=dev, dtype=tdt))
        y = torch.randn(batch, 6, 28, 28, device=dev, dtype=tdt)
        for name, fn, inputs in (("convolution", F.conv2d, (x, w, b)),
                                 ("max_pool2d_with_indices", lambda t: F.max_pool2d(t, 2, 2), (y,))):
            mf, of, nb = _formula_cost(fn, inputs, name)
            out.append(Case("opeff", name, (lambda fn=fn, inputs=inputs: fn(*inputs)), dtype, mf, nb, (0, 0, int(of))))
    return out


# ------------------------------------------------------------------------------ per-row costs of row-wise ops (CPU)
#: Row counts of the row-wise cases: the per-row cost is the slope between them.
ROW_COUNTS = (64, 512)
#: Row lengths of the row-wise cases on an AVX2 machine (8 floats per SIMD vector; ``row_lengths`` scales them
#: to the machine's width): half a vector (tail only), one vector, one vector and a quarter (a vector and a
#: tail), two vectors. A CPU kernel walks a row's full vectors, then its tail element by element; the fit
#: (perfcheck.hardware.calibrate.fit) solves per op and phase for a row's cost, a vector's and a tail element's.
#: nll_loss reads one element per row: one length.
ROW_LENGTHS = (4, 8, 10, 16)


def row_lengths(simd: int = None) -> tuple:
    """``ROW_LENGTHS`` for a SIMD width of ``simd`` bytes (default: this machine's, ``systems.local_simd_bytes``):
    W/2, W, W + W/4 and 2W fp32 elements, W = simd / 4."""
    from perfcheck.hardware.systems import local_simd_bytes

    w = (simd or local_simd_bytes()) // 4
    return (w // 2, w, w + max(w // 4, 1), 2 * w)


def _row_ops(dev):
    """Forward aten op name -> (forward kernel, backward kernel) builders: ``make(rows, cols)`` returns a call of
    that kernel on fresh tensors, with the kernel's arguments as autograd passes them."""
    aten = torch.ops.aten
    f32 = torch.float32

    def softmax_family(kernel, backward_kernel, output):
        """(forward, backward) builders of softmax or log-softmax over the last dimension."""
        def fwd(r, c):
            x = torch.randn(r, c, device=dev)
            return lambda: kernel(x, 1, False)

        def bwd(r, c):
            g, y = torch.randn(r, c, device=dev), output(torch.randn(r, c, device=dev), 1)
            return lambda: backward_kernel(g, y, 1, f32)
        return fwd, bwd

    def ln(r, c):
        x, w, b = torch.randn(r, c, device=dev), torch.ones(c, device=dev), torch.zeros(c, device=dev)
        return lambda: torch.native_layer_norm(x, (c,), w, b, 1e-5)

    def ln_b(r, c):
        x, g, w, b = (torch.randn(r, c, device=dev), torch.randn(r, c, device=dev), torch.ones(c, device=dev),
                      torch.zeros(c, device=dev))
        _, mean, rstd = torch.native_layer_norm(x, (c,), w, b, 1e-5)
        return lambda: aten.native_layer_norm_backward(g, x, (c,), mean, rstd, w, b, [True, True, True])

    def nll(r, c):
        y, t = torch.log_softmax(torch.randn(r, c, device=dev), 1), torch.randint(0, c, (r,), device=dev)
        return lambda: aten.nll_loss_forward(y, t, None, 1, -100)

    def nll_b(r, c):
        y, t = torch.log_softmax(torch.randn(r, c, device=dev), 1), torch.randint(0, c, (r,), device=dev)
        g, total = torch.ones((), device=dev), torch.tensor(float(r), device=dev)
        return lambda: aten.nll_loss_backward(g, y, t, None, 1, -100, total)

    return {"_log_softmax": softmax_family(torch._log_softmax, torch._log_softmax_backward_data, torch.log_softmax),
            "_softmax": softmax_family(torch._softmax, torch._softmax_backward_data, torch.softmax),
            "native_layer_norm": (ln, ln_b),
            "nll_loss_forward": (nll, nll_b)}


def row_op_cost(name: str, rows: int, cols: int, elem_bytes: int = 4):
    """The estimator's cost (formulas.OpCost, through aten_costs.cost_of: the one op-cost path) of the row-wise
    op ``name`` on a (rows, cols) input that needs a gradient."""
    from perfcheck.predict.aten_costs import OpCall, TensorMeta, cost_of

    aten = torch.ops.aten
    x = TensorMeta((rows, cols), elem_bytes, True, True)
    stat = TensorMeta((rows, 1), 4, False, True)
    vec = TensorMeta((cols,), elem_bytes, True, True)
    target = TensorMeta((rows,), 8, False, False)
    scalar = TensorMeta((), elem_bytes, True, True)
    calls = {"_log_softmax": (aten._log_softmax.default, (x, 1, False), (x,)),
             "_softmax": (aten._softmax.default, (x, 1, False), (x,)),
             "native_layer_norm": (aten.native_layer_norm.default, (x, [cols], vec, vec, 1e-5), (x, stat, stat)),
             "nll_loss_forward": (aten.nll_loss_forward.default, (x, target, None, 1, -100), (scalar, scalar))}
    func, args, outs = calls[name]
    return cost_of(OpCall(func, args, {}, outs)).cost


def row_cases(device) -> list:
    """Row-wise kernels (label ``"<forward op> fwd|bwd"``) on ``ROW_COUNTS`` rows of ``row_lengths()`` elements
    (nll_loss: one length), fp32; ``m`` = rows, ``k`` = row length, ``flops``/``bytes`` = the estimator's
    other FLOPs and bytes of that phase (``row_op_cost``), so the fit can take the roofline's share out of the
    slope over rows (perfcheck.hardware.calibrate.fit: ``op_row_s``)."""
    dev = torch.device(device)
    cases = []
    every = row_lengths()
    for name, builders in _row_ops(dev).items():
        lengths = every[2:3] if name.startswith("nll") else every
        for phase, make in zip(("fwd", "bwd"), builders):
            for cols in lengths:
                for rows in ROW_COUNTS:
                    cost = getattr(row_op_cost(name, rows, cols), phase)
                    cases.append(Case("oprows", f"{name} {phase}", make(rows, cols), "fp32", float(cost.flops),
                                      float(cost.bytes), (rows, cols, int(cost.kernels))))
    return cases
