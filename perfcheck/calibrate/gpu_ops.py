"""GPU kernel classes the datasheet roofline misses by 2-6x, measured by size: ``op_efficiency_curve``.

Why: on an H100 (bench/RESULTS.md, "On a GPU, second visit", GPT-2 small bf16 at batch 32, device-bound) the
calibrated model predicted LayerNorm forward 35 us against 72.5 measured and backward 87 against 255, the
token embedding's backward 46 us against 614, the position embedding's 5 against 35, attention's backward 1.5x
short; the estimator prices these kernels at the HBM roofline (bytes / 3.0 TB/s) or the GEMM curve, which
they never reach. A flat op_efficiency measured at one size cannot cover them: an embedding backward over a
50257-row table and one over a 1024-row table differ in efficiency by 2x.

What: each *family* (layer norm, RMS norm, softmax, embedding, attention, convolution per dtype) is run at a
few sizes, forward and backward separately (the backward through ``torch.autograd.grad`` of the op's output
alone, so only that op's backward kernels run), with the device held by ``torch.cuda._sleep`` while the host
queues the calls (``DeviceTimer``), so the events time the kernels back to back and not the host's pace.
The estimator's own cost of the call (``trace_model`` + ``aten_costs.cost_of`` of the family's aten op: the one
op-cost path) gives the roofline seconds on the calibrated spec; ``fit_curves`` stores, per op key and phase
(``efficiency.op_efficiency_key``; the backward's key ends in ``:bwd``), the points (roofline seconds per
kernel, roofline / measured), which ``efficiency.op_efficiency`` reads at a kernel's roofline seconds.

The attention's math path (``SDPBackend.MATH``: bmm, softmax, bmm) is priced through its parts: the GEMM curve
and the softmax family here. Causal attention is counted in full, as the estimator's default
(``estimate(causal=False)``) and FlopCounterMode count it: the efficiency is relative to that count.

GPU only: ``perfcheck calibrate`` runs these cases when the device is CUDA; on a CPU the existing per-row and
op-efficiency cases price the same ops. The cases build and run on a CPU at ``sizes="tiny"`` (tests, dry runs).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import defaultdict

import torch

from perfcheck.calibrate.cases import Case, Timer, run_cases
from perfcheck.calibrate.layers import CallModule
from perfcheck.hardware.systems import SystemSpec, host_constants, normalize_dtype, torch_dtype
from perfcheck.predict import roofline
from perfcheck.predict import efficiency
from perfcheck.predict.aten_costs import cost_of
from perfcheck.predict.trace import trace_model

KIND = "gpuop"

#: Sizes per family: GPT-2 small's shapes at batch 8 and 32 x 1024 tokens (d 768, 12 heads of 64, vocabulary
#: 50257, 1024 positions) and a wider model's (d 4096); convolutions: LeNet's two layers at batch 256 and a
#: ResNet-50 3x3 layer. "tiny": the same families on small tensors (a CPU dry run, tests).
SIZES = {
    "gpu": {
        "layer_norm": ((8192, 768), (32768, 768), (8192, 4096)),
        "rms_norm": ((8192, 768), (32768, 768), (8192, 4096)),
        "softmax": ((96, 1024, 1024), (384, 1024, 1024)),  # (batch x heads, s_q, s_k): the math path's scores
        # (tokens, rows, dim): GPT-2's wte at batch 8 and 32, its wpe (1024 positions looked up once per step)
        "embedding": ((8192, 50257, 768), (32768, 50257, 768), (1024, 1024, 768), (8192, 1024, 768)),
        "attention": ((8, 12, 1024, 64), (32, 12, 1024, 64), (4, 32, 2048, 128)),
        "convolution": ((256, 3, 6, 32, 5), (256, 6, 16, 14, 5), (32, 64, 64, 56, 3)),  # (n, c_in, c_out, hw, k)
        # (edges, nodes, features per row): a graph layer's gather of node rows per edge (backward: index_add_, a
        # scatter-add with collisions) and its scatter-add of edge rows per node (backward: a gather); the graph
        # benchmark's TransformerConv (4096 nodes, 32768 edges, 32 heads x 256) and a narrow one (its 32 scores)
        "index_select": ((32768, 4096, 8192), (32768, 4096, 32)),
        "scatter_add": ((32768, 4096, 8192), (32768, 4096, 32)),
    },
    "tiny": {
        "layer_norm": ((64, 32),), "rms_norm": ((64, 32),), "softmax": ((4, 16, 16),),
        "embedding": ((64, 100, 16),), "attention": ((2, 2, 16, 8),), "convolution": ((2, 3, 4, 12, 3),),
        "index_select": ((64, 16, 8),), "scatter_add": ((64, 16, 8),),
    },
}
#: aten op names the estimator's trace records per family (the key the curve is stored under). A family whose
#: trace records none of these (e.g. an RMS norm decomposed into pointwise ops by this torch) is skipped: its
#: curve would otherwise land on a generic op (``mul``) and reprice every such op.
FAMILY_OPS = {
    "layer_norm": ("native_layer_norm",),
    "rms_norm": ("_fused_rms_norm", "rms_norm"),
    "softmax": ("_softmax", "_safe_softmax"),
    "embedding": ("embedding",),
    "attention": ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"),
    "convolution": ("convolution", "_convolution", "cudnn_convolution"),
    "index_select": ("index_select",),
    "scatter_add": ("scatter_add_", "scatter_add"),
}
#: Families run in every calibrated dtype (bf16/fp16/fp32); the others in the low-precision dtype a GPU trains in.
PER_DTYPE = ("convolution",)


# ------------------------------------------------------------------------------ the cases
def _builders(family: str, size: tuple, dtype: torch.dtype, dev):
    """(fn, inputs, grad_inputs) of one family at one size: ``fn(*inputs)`` is the op as a model calls it;
    ``grad_inputs`` the inputs its backward differentiates."""
    F = torch.nn.functional

    def r(*shape, grad=True):
        return torch.randn(*shape, device=dev, dtype=dtype, requires_grad=grad)

    if family in ("layer_norm", "rms_norm"):
        rows, cols = size
        x, w, b = r(rows, cols), r(cols), r(cols)
        if family == "layer_norm":
            return (lambda x, w, b: F.layer_norm(x, (cols,), w, b)), (x, w, b), (x, w, b)
        return (lambda x, w: F.rms_norm(x, (cols,), w)), (x, w), (x, w)
    if family == "softmax":
        x = r(*size)
        return (lambda x: F.softmax(x, -1)), (x,), (x,)
    if family == "embedding":
        tokens, vocab, dim = size
        idx = torch.randint(0, vocab, (tokens,), device=dev)
        w = r(vocab, dim)
        return (lambda i, w: F.embedding(i, w)), (idx, w), (w,)
    if family == "attention":
        b, h, s, d = size
        q, k, v = r(b, h, s, d), r(b, h, s, d), r(b, h, s, d)
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), (q, k, v), (q, k, v)
    if family == "index_select":
        edges, nodes, dim = size
        x, idx = r(nodes, dim), torch.randint(0, nodes, (edges,), device=dev)
        return (lambda x, i: x.index_select(0, i)), (x, idx), (x,)
    if family == "scatter_add":  # as PyTorch Geometric's sum aggregation: zeros, then scatter_add_ by an expanded index
        edges, nodes, dim = size
        src, idx = r(edges, dim), torch.randint(0, nodes, (edges, 1), device=dev).expand(edges, dim)
        return (lambda s, i: s.new_zeros(nodes, dim).scatter_add_(0, i, s)), (src, idx), (src,)
    if family == "convolution":
        n, c_in, c_out, hw, ks = size
        x, w, b = r(n, c_in, hw, hw), r(c_out, c_in, ks, ks), r(c_out)
        return (lambda x, w, b: F.conv2d(x, w, b)), (x, w, b), (x, w, b)
    raise ValueError(f"unknown family {family!r}")


def family_cost(family: str, fn, inputs):
    """(aten op name, formulas.OpCost) of the family's op in the estimator's trace of ``fn(*inputs)`` (a GPU
    target: fused attention), or None when the trace records none of ``FAMILY_OPS[family]``."""
    trace = trace_model(CallModule(fn), inputs, fused_dropout=True)
    for op in trace.ops:
        if op.call.name in FAMILY_OPS[family] and not op.backward_only:
            return op.call.name, cost_of(op.call).cost
    return None


def gpu_op_cases(device, dtypes=("bf16",), sizes: str = "gpu", families=None) -> list:
    """Cases of kind ``gpuop``, label ``"<aten op> fwd|bwd"``: per family, size and dtype the forward call and
    the backward of its output (``torch.autograd.grad``, graph kept). flops = the estimator's matrix FLOPs,
    bytes its bytes, ``n`` its other FLOPs and ``k`` its kernel count of that phase, ``m`` the elements of the
    op's first input. Families other than ``PER_DTYPE`` run in the first low-precision dtype of ``dtypes``
    (bf16, else fp16, else fp32)."""
    dev = torch.device(device)
    wanted = [normalize_dtype(d) for d in ((dtypes,) if isinstance(dtypes, str) else dtypes)]
    wanted = list(dict.fromkeys("fp32" if d == "tf32" else d for d in wanted)) or ["fp32"]
    low = next((d for d in ("bf16", "fp16") if d in wanted), wanted[0])
    cases = []
    for family, shapes in SIZES[sizes].items():
        if families is not None and family not in families:
            continue
        for dname in (wanted if family in PER_DTYPE else [low]):
            tdt = torch_dtype(dname)  # tf32 runs on fp32 tensors and is measured as fp32 here
            for size in shapes:
                fn, inputs, grads = _builders(family, size, tdt, dev)
                found = family_cost(family, fn, inputs)
                if found is None:
                    continue
                name, cost = found
                y = fn(*inputs)
                g = torch.randn_like(y)

                def fwd(fn=fn, inputs=inputs):
                    return fn(*inputs)

                def bwd(y=y, g=g, grads=grads):
                    return torch.autograd.grad(y, grads, g, retain_graph=True)

                for phase, call in (("fwd", fwd), ("bwd", bwd)):
                    c = getattr(cost, phase)
                    if c.kernels <= 0:
                        continue
                    cases.append(Case(KIND, f"{name} {phase}", call, dname, 2.0 * c.macs, float(c.bytes),
                                      (int(inputs[0].numel()), int(c.kernels), int(c.flops))))
    return cases


# ------------------------------------------------------------------------------ the device timer
class DeviceTimer:
    """Seconds per call of the calls' kernels alone: ``torch.cuda._sleep`` holds the stream while the host
    queues ``iters`` calls, then CUDA events around them time the kernels back to back (no host gaps), as
    ``cases.device_kernel_rows`` does for tiny kernels. The hold is sized from the host's issue time of the
    calls (measured on the first loop of each function, kept per function) with a 2x margin; when the host
    still outran it the loop is timed again with a longer hold. ``run_cases`` can use it as its timer."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = True
        self._issue = {}
        self._cycles_per_s = None

    def _rate(self) -> float:
        """GPU clock cycles per second of ``torch.cuda._sleep`` (timed once with events)."""
        if self._cycles_per_s is None:
            torch.cuda.synchronize(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(20_000_000)
            end.record()
            end.synchronize()
            self._cycles_per_s = 20_000_000 / max(start.elapsed_time(end) / 1e3, 1e-6)
        return self._cycles_per_s

    def loop(self, fn, iters: int, between=None, host: bool = False) -> float:
        issue = self._issue.get(id(fn), 1e-3)
        for _ in range(3):
            hold = 2.0 * issue * iters + 1e-3
            torch.cuda.synchronize(self.device)
            torch.cuda._sleep(int(hold * self._rate()))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            took = time.perf_counter() - t0
            end.synchronize()
            self._issue[id(fn)] = issue = max(took / iters, 1e-6)
            if took < hold:  # the device was still asleep when the last call was queued: kernels alone
                break
        return start.elapsed_time(end) / 1e3 / iters


def bench_gpu_ops(device, dtypes, repeats: int = 3, target_s: float = 0.005, sizes: str = "gpu"):
    """The measurement table of ``gpu_op_cases`` on ``device`` (CUDA: ``DeviceTimer``, at most 32 calls per
    timed loop: the launch queue holds ~1000 kernels; a CPU: the calibration's wall-clock ``Timer``)."""
    dev = torch.device(device)
    timer = DeviceTimer(dev) if dev.type == "cuda" else Timer(dev)
    return run_cases(gpu_op_cases(dev, dtypes, sizes), timer, repeats=repeats, target_s=target_s, max_iters=32)


# ------------------------------------------------------------------------------ the fit
def fit_curves(spec: SystemSpec, table) -> dict:
    """op key -> ((roofline seconds per kernel, efficiency), ...) from the ``gpuop`` rows of ``table`` on ``spec``.

    Per row: the estimator's time of that call on ``spec`` (``roofline.op_time_s`` of its matrix FLOPs, other
    FLOPs, bytes and kernels, with ``host.device_kernel_s`` per kernel, as ``roofline.op_device_times`` prices
    an op) gives the roofline part R = time - kernels x device_kernel_s; the measured kernels' part is
    M = seconds - kernels x device_kernel_s; efficiency = R / M, clipped to [1e-4, 1] (a kernel faster than
    the roofline is priced at it). The point's x is R / kernels. Rows of one key at the same x (repeated sizes)
    are merged by their median. The key is ``op_efficiency_key(op, dtype)``, ``op:bwd`` for the backward."""
    rows = table[table["kind"] == KIND]
    launch = host_constants(spec)["device_kernel_s"]
    points = defaultdict(lambda: defaultdict(list))
    for r in rows.itertuples(index=False):
        name, phase = str(r.label).rsplit(" ", 1)
        kernels = max(float(r.k), 1.0)
        t, _ = roofline.op_time_s(float(r.flops), float(r.n), float(r.bytes), kernels, spec, r.dtype or "fp32",
                                  launch_s=launch)
        roof = float(t) - kernels * launch
        measured = float(r.seconds) - kernels * launch
        if roof <= 0 or not math.isfinite(measured):
            continue
        eff = float(min(max(roof / max(measured, 1e-12), 1e-4), 1.0))
        key = efficiency.op_efficiency_key(name if phase == "fwd" else f"{name}:bwd", r.dtype or "fp32")
        points[key][roof / kernels].append(eff)
    return {key: tuple((x, statistics.median(v)) for x, v in sorted(by_x.items())) for key, by_x in points.items()}


def apply(spec: SystemSpec, table, stamp: str) -> SystemSpec:
    """``spec`` with the curves of ``fit_curves`` in ``op_efficiency_curve`` (existing keys replaced) and a
    source line; ``spec`` unchanged when the table has no ``gpuop`` rows. Where the attention family was measured,
    this GPU's own curve prices the fused attention kernel: the spec's public ``attention_kernel_curve`` (another
    machine's benchmark) is dropped, and every curve is fitted against the roofline without it."""
    plain = dataclasses.replace(spec, attention_kernel_curve={},
                                sources={k: v for k, v in spec.sources.items() if k != "attention_kernel_curve"})
    curves = fit_curves(plain, table)
    if not curves:
        return spec
    if any(k.split(":")[0].split("@")[0] in FAMILY_OPS["attention"] for k in curves):
        spec = plain
    merged = {**dict(getattr(spec, "op_efficiency_curve", {}) or {}), **curves}
    spread = "; ".join(f"{k} {min(e for _, e in p):.3f}-{max(e for _, e in p):.3f}" for k, p in sorted(curves.items()))
    sources = {**dict(spec.sources), "op_efficiency_curve": (
        f"{stamp}: per GPU kernel class and phase, the estimator's roofline time on this spec / the measured "
        f"kernel time (device held while the calls are queued), by roofline seconds per kernel "
        f"(perfcheck.calibrate.gpu_ops); efficiency ranges: {spread}")}
    return dataclasses.replace(spec, op_efficiency_curve=merged, sources=sources)


def summary(table) -> list:
    """One line per ``gpuop`` row: label, dtype, size, measured microseconds (for progress output and logs)."""
    rows = table[table["kind"] == KIND]
    return [f"{r.label:<48} {r.dtype:<5} m={int(r.m):>11} k={int(r.k)} {r.seconds * 1e6:10.1f} us"
            for r in rows.itertuples(index=False)]


__all__ = ["KIND", "SIZES", "FAMILY_OPS", "gpu_op_cases", "DeviceTimer", "bench_gpu_ops", "fit_curves", "apply",
           "family_cost", "summary"]
