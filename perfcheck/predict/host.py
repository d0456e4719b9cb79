"""Host (CPU-side framework) cost of a training step, and the two-timeline rule that combines it
with the device (roofline) cost of every op.

Why: small models are host-bound. A LeNet step on a GPU spends its time in eager dispatch, autograd
bookkeeping and Python, not in kernels; a roofline alone under-predicts it by 10x. Every op the
trace records therefore also costs host time, from constants in the system spec's ``host`` block
(``perfcheck.hardware.systems.HOST_KEYS``: measured by ``perfcheck calibrate``, else the
datasheet-free defaults in ``perfcheck/hardware/host_defaults.json``, each with its source):

    forward, per traced aten op     op_dispatch_s (view_dispatch_s for a view/metadata op)
                                    + op_cold_s when its family differs from the op before (``op_switches``;
                                    a CPU convolution class: its measured evicted-call excess, ``_class_cold``;
                                    op_cold_near_s when its family ran a few light families ago, ``family_reuse``;
                                    op_cold_light_s when those and it are pointwise/copy/split/small-GEMM ops;
                                    at least op_cold_far_s when its family ran more than the L3 of data, or
                                    the L3's residency time, ago)
                                    + autograd_node_s when an input needs a gradient (grad_fn node)
    forward, per module call        module_call_s (nn.Module.__call__ and the forward frame)
                                    + module_fixed_s[class] for a standard nn layer (its Python
                                    beyond its aten ops: BatchNorm's bookkeeping, F.* wrappers;
                                    measured per class by calibration, 0 for other classes)
    backward, per autograd node     backward_node_s + op_dispatch_s per backward kernel
                                    + op_cold_s once when its family differs from the node before
                                    (view_dispatch_s for a view's node)
    backward, per parameter tensor  backward_node_s + view_dispatch_s (AccumulateGrad: a node and a detach)
    backward, per gradient add      op_dispatch_s (a tensor feeding k autograd edges: k - 1 adds by the engine,
                                    between nodes; perfcheck.predict.grad_accumulation)
    backward, once (root)           backward_call_s (engine start for loss.backward())
    optimizer step                  optim_<impl>_step_s (the implementation's fixed cost; optim_step_s is
                                    SGD for-loop's) + per tensor its implementation's calibrated line at the
                                    step's ops per tensor (host); per tensor and kernel, its streams x the
                                    tensor's bytes at the memory ceiling (device; optimizers.profile);
                                    + sqrt_zero_s per square root of a zero second moment (predict.zero_rows)
    DeepSpeed, ZeRO stage S         zero<S>_* per phase: fixed + per parameter tensor, ZeRO-3 per
                                    module call and per partitioned tensor (``deepspeed_host_s``)
    N processes on one host         each one's host time (and CPU compute) x (1 + (N - 1) x
                                    process_slowdown_per_peer) (``process_slowdown``; applied by
                                    the ZeRO comparison, perfcheck.analysis.stages)

``op_cold_s``: the per-op prices above and the kernels' efficiencies are measured by repeating one op in a
tight loop, which keeps its code, branch history and tensors in the core; a step runs each op once, after
other ops, and pays more (the 14 tiny ops of the op_fixed cases took 10.3 us more per op called one after
another than each in its own loop on the project's VM; a LeNet forward inside a step 7-9% more than in a
forward-only loop, JSC's 17%: bench/RESULTS.md, issue 12). Calibration measures it as that round-robin's
excess (``cases.op_cold_cases``); it is added once per computing op in the forward and once per backward
node, where the op's family differs from the one before it (a repeat finds its code hot), never to a view.

Two timelines (``timeline``): the host issues op i after its host cost h_i (issue time
H_i = h_0 + ... + h_i); the device starts op i once it is issued and op i-1 is done, and runs it
for d_i (its roofline time + ``device_kernel_s`` per kernel):

    E_i = max(H_i, E_{i-1}) + d_i  =  D_i + max_{j<=i} (H_j - D_j + d_j),   D_i = d_0 + ... + d_i

(the closed form is a cumulative max, so a 100k-op trace is a few numpy calls). A module's time
is what CUDA events at its hooks measure: from max(H_{a-1}, E_{a-1}) (the start event runs when
the host reaches it and the stream is free) to E_b, summed over its contiguous runs of ops
[a, b]. On a CPU the host and the "device" are the same thread, so they add:
E_i = (h_0 + d_0) + ... + (h_i + d_i). A region whose host total exceeds its device total is
``host``-bound.

NB (perfcheck): module-call costs are attached to the first op of each run of a module (a module
whose forward runs no aten op costs nothing here); backward is the forward's node sequence
reversed (autograd's order for a chain; branches interleave differently but add the same totals);
the loss function, data loading and instrumentation hooks are outside the model and not predicted.
These terms in the whole of a module's predicted time: docs/model.md (sections 2-4).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
import pandas as pd

from perfcheck.errors import UserError
from perfcheck.hardware.host_keys import op_cold_key, optim_line, optim_per_tensor_key, optim_step_key, zero_key
from perfcheck.hardware.systems import LOW_HOST_DTYPES, SystemSpec, host_constants, normalize_dtype, spec_of
from perfcheck.predict import optimizers, reuse
from perfcheck.predict.aten_costs import is_view_op, op_class
from perfcheck.predict.cold_curves import far_data, l3_loss
from perfcheck.predict.efficiency import CLASS_PARENTS, op_flop_prices
from perfcheck.predict.family_reuse import family_ages, far_reuse, light_reuse, near_reuse
from perfcheck.predict.grad_accumulation import ACCUMULATE_NAME
from perfcheck.predict.roofline import compute_time_s, far_seconds_per_byte, memory_time_s
from perfcheck.predict.write_allocate import is_inplace
from perfcheck.predict.zero_rows import zero_elements

IMPLEMENTATIONS = ("for-loop", "foreach", "fused")


@dataclasses.dataclass(frozen=True)
class OptimizerCost:
    """One optimizer.step() + zero_grad(): host and device seconds and the combined time."""

    kind: str  # a torch.optim class in lower case with its variant flags (optimizers.FLAGS): sgd_momentum, adamw
    implementation: str  # for-loop | foreach | fused
    tensors: int
    params: int
    host_s: float
    device_s: float
    time_s: float
    fixed_s: float = 0.0  # the step's fixed host cost (in host_s), paid once per step, not per module


# ------------------------------------------------------------------------------ timelines
def timeline(host_s, device_s, same_thread: bool):
    """``(issue_end, device_end)`` arrays for ops issued in order (see the module docstring).

    same_thread: True on a CPU (host and device work add), False for an accelerator.
    """
    h = np.asarray(host_s, dtype=float)
    d = np.asarray(device_s, dtype=float)
    if h.shape != d.shape or h.ndim != 1:
        raise UserError("timeline: host_s and device_s must be 1-D arrays of one length")
    if np.any(h < 0) or np.any(d < 0):
        raise UserError("timeline: host and device times must be >= 0")
    if same_thread:
        end = np.cumsum(h + d)
        return end, end
    issue = np.cumsum(h)
    dev = np.cumsum(d)
    end = dev + np.maximum.accumulate(issue - dev + d) if len(h) else dev
    return issue, end


def region_time(issue, end, runs) -> float:
    """Seconds the regions ``runs`` ([(a, b)] inclusive index ranges) take on the two timelines."""
    total = 0.0
    for a, b in runs:
        start = 0.0 if a == 0 else max(issue[a - 1], end[a - 1])
        total += end[b] - start
    return total


def _runs(stacks) -> dict:
    """path -> [(a, b)]: maximal runs of consecutive ops whose module stack contains the path."""
    runs, open_at, prev = {}, {}, set()
    for i, stack in enumerate(stacks):
        cur = set(stack)
        for p in prev - cur:
            runs.setdefault(p, []).append((open_at.pop(p), i - 1))
        for p in cur - prev:
            open_at[p] = i
        prev = cur
    for p, a in open_at.items():
        runs.setdefault(p, []).append((a, len(stacks) - 1))
    return runs


# ------------------------------------------------------------------------------ per-op host costs
def _is_recorded(op) -> bool:
    """Aten ops eager mode dispatches; fake-tensor bookkeeping (prim::device) is not one."""
    return getattr(op.call.func, "namespace", "aten") != "prim"


def op_sequence(trace, ops: pd.DataFrame) -> tuple:
    """``(frame, stacks)``: one row per op eager mode dispatches, in order, with its device times
    from ``ops``, and each row's module stack.

    ``ops``: the estimator's timed op table (columns ``op`` = index into ``trace.ops``, ``t_fwd``,
    ``t_bwd``, ``kernels_fwd``, ``kernels_bwd``); an op absent from it (a view, free on the device)
    costs only host time. Columns: op, view, node (an input needs a gradient), kernels_bwd,
    t_fwd, t_bwd, op_class, accumulate (a backward-only op: a gradient add, ``predict.grad_accumulation``, or a
    kernel's copy of a permuted gradient, ``predict.relayout``).
    """
    timed = {int(i): (float(kf), float(k), float(f), float(b)) for i, kf, k, f, b in
             zip(ops["op"], ops["kernels_fwd"], ops["kernels_bwd"], ops["t_fwd"], ops["t_bwd"])}
    rows, stacks = [], []
    for i, op in enumerate(trace.ops):
        if not _is_recorded(op):
            continue
        node = any(t.requires_grad for t in op.call.tensors())
        if op.backward_only:
            name = ACCUMULATE_NAME if op.grad_accumulate else op.call.name
            rows.append((i, name, False, False) + timed.get(i, (0.0,) * 4) + (op_class(op.call), True))
        elif i in timed:  # a view whose backward runs kernels (aten_costs.is_view_op) stays a view forward
            rows.append((i, op.call.name, is_view_op(op.call), node) + timed[i] + (op_class(op.call), False))
        else:
            rows.append((i, op.call.name, True, node, 0.0, 0.0, 0.0, 0.0, op.call.name, False))
        stacks.append(op.stack)
    seq = pd.DataFrame(rows, columns=["op", "name", "view", "node", "kernels_fwd", "kernels_bwd", "t_fwd", "t_bwd",
                                      "op_class", "accumulate"])
    return seq, stacks


#: ``op_sequence`` columns the far rule reads (``reuse.family_distances``), added only where it applies.
FAMILY_DISTANCES = ("family_distance_fwd", "family_distance_bwd")


def _with_family_distances(seq: pd.DataFrame, trace, ops: pd.DataFrame) -> pd.DataFrame:
    """``seq`` with ``FAMILY_DISTANCES``: per op, the distinct bytes since its family's last call in each pass
    (``reuse.family_distances``; NaN for an op outside the timed table, a view)."""
    dist_f, dist_b = reuse.family_distances(trace, ops)
    out = seq.copy()
    for col, dist in zip(FAMILY_DISTANCES, (dist_f, dist_b)):
        by_op = dict(zip(ops["op"].astype(int), dist))
        out[col] = [by_op.get(int(i), np.nan) for i in seq["op"]]
    return out


def op_switches(names, view) -> tuple:
    """``(forward, backward)`` 0/1 arrays: 1 where a computing (non-view) op's name differs from the computing
    op run before it (forward: the previous one in trace order; backward: the next one, as backward runs the
    nodes in reverse), 0 for views and for an op repeating its predecessor's family (its code is still hot).
    The first computing op of each pass counts as a switch (the step's other phases ran before it)."""
    names = np.asarray(names, dtype=object)
    view = np.asarray(view, dtype=bool)
    fwd, bwd = np.zeros(len(names)), np.zeros(len(names))
    idx = np.flatnonzero(~view)
    if len(idx):
        run = names[idx]
        fwd[idx] = np.r_[True, run[1:] != run[:-1]]
        bwd[idx] = np.r_[run[:-1] != run[1:], True]
    return fwd, bwd


def dtype_host_terms(spec, hc: dict, dtype) -> tuple:
    """``(op_fixed, op_cold_s)`` for a model run in ``dtype``: op_fixed_s with each ``<op>@<dtype>`` entry
    (calibration's cases in that dtype, with gradients) over the plain ``<op>`` one, and ``op_cold_<dtype>_s``
    where the spec's host block has it (measured), else op_cold_s. fp32/tf32 (or no dtype): the plain ones.
    Why: on the H100 VM a bf16 LeNet forward's host time was 2.2x its fp32 one (cases.HOST_DTYPES_CUDA)."""
    fixed = dict(getattr(spec, "op_fixed_s", {}) or {})
    cold = hc["op_cold_s"]
    try:
        key = None if dtype is None else normalize_dtype(dtype)
    except UserError:  # a dtype without host terms of its own (fp64): the plain ones
        key = None
    if key in LOW_HOST_DTYPES:
        suffix = f"@{key}"
        fixed.update({name[: -len(suffix)]: v for name, v in fixed.items() if name.endswith(suffix)})
        cold = dict(spec.host).get(op_cold_key(key), cold)
    return fixed, cold


def _with_cold(hc: dict, spec, dtype, cold: float) -> dict:
    """``hc`` with the step's ``op_cold_s`` (``cold``: the dtype's, ``dtype_host_terms``), ``op_cold_near_s``: the
    spec's host block's where calibration measured it (in fp32) and the model runs in fp32/tf32, else ``cold`` (no
    near discount without its measurement), and ``op_cold_light_s`` likewise (else the near price)."""
    try:
        key = None if dtype is None else normalize_dtype(dtype)
    except UserError:
        key = None
    near, light = dict(spec.host).get("op_cold_near_s"), dict(spec.host).get("op_cold_light_s")
    near = cold if near is None or key in LOW_HOST_DTYPES else float(near)
    light = near if light is None or key in LOW_HOST_DTYPES else float(light)
    # the far price only where calibration measured both it and the L3 it evicted (else no op is far)
    far, l3 = dict(spec.host).get("op_cold_far_s"), float((spec.calibration or {}).get("l3_bytes", 0) or 0)
    applies = far is not None and key not in LOW_HOST_DTYPES and spec.kind == "cpu"
    residency = float(dict(spec.host).get("l3_residency_s", 0.0) or 0.0) if applies and l3 > 0 else 0.0
    return {**hc, "op_cold_s": cold, "op_cold_near_s": near, "op_cold_light_s": light,
            "op_cold_far_s": cold if far is None else float(far), "far_cache_bytes": l3 if applies else 0.0,
            "far_lost": l3_loss(spec) if residency > 0 else None}


def _host_arrays(seq: pd.DataFrame, hc, op_fixed=None, by_class: bool = True, idle_s: float = 0.0) -> tuple:
    """Per-op forward and backward host seconds (before module-call and AccumulateGrad terms).

    ``op_fixed``: aten name -> fixed cost of that op family beyond a tiny add's dispatch (the
    spec's ``op_fixed_s``: cuDNN/cuBLAS set-up, a reduction's set-up); backward kernels of an op
    are costed like its forward kernel (fixed x backward kernels / forward kernels; NB, an approximation), except
    for a class whose backward call calibration timed (``<class>:bwd``, ``_fixed_bwd``).
    ``hc["op_cold_s"]``: the per-switch cost (``dtype_host_terms`` puts the dtype's there). ``idle_s``: the step's
    seconds outside its ops (``_far_shares``).
    """
    view = seq["view"].to_numpy(bool)
    node = seq["node"].to_numpy(bool)
    k_fwd = seq["kernels_fwd"].to_numpy(float)
    k_bwd = seq["kernels_bwd"].to_numpy(float)
    seq = seq.assign(op_class=[_measured_class(op_fixed or {}, c) for c in seq["op_class"]])
    fixed = np.array([_fixed_cost(op_fixed or {}, n, c if by_class else n) for n, c in zip(seq["name"], seq["op_class"])],
                     dtype=float)
    fixed_bwd = np.array([_fixed_bwd(op_fixed or {}, c, f, kb, kf) if by_class else f * kb / max(kf, 1.0)
                          for c, f, kb, kf in zip(seq["op_class"], fixed, k_bwd, k_fwd)], dtype=float)
    # a step runs each op after other ops, not in the tight loop its prices were measured in: a computing op
    # whose family differs from the computing op before it pays op_cold_s once, in the forward and again for its
    # backward node (whose kernels after the first run the same backward's code); views are metadata only
    cold = hc["op_cold_s"]
    # a CPU op class whose tiny call calibration also timed after an L2 eviction pays that excess instead (``_class_cold``)
    classes = seq["op_class"].to_numpy(object)
    cold_f = np.array([_class_cold(op_fixed or {}, c, "", cold) if by_class else cold for c in classes], dtype=float)
    cold_b = np.array([_class_cold(op_fixed or {}, c, ":bwd", cold) if by_class else cold for c in classes],
                      dtype=float)
    # a backward-only op (the engine's gradient add between two nodes; a norm kernel's copy of a permuted gradient)
    # is one backward kernel's dispatch and nothing in the forward; it is no node and takes no part in the family
    # switches around it
    acc = seq["accumulate"].to_numpy(bool) if "accumulate" in seq else np.zeros(len(seq), dtype=bool)
    fwd_switch, bwd_switch = op_switches(seq["name"].to_numpy(object), view | acc)
    # an op whose family ran a few light families ago finds its code warm: op_cold_near_s (family_reuse; a class
    # with its own evicted price is heavy: never near, and every op after it is far)
    heavy = np.array([by_class and f"{c}{EVICTED_SUFFIX}" in (op_fixed or {}) for c in classes], dtype=bool)
    near_f, near_b = near_reuse(seq["name"].to_numpy(object), view | acc, heavy)
    near = hc.get("op_cold_near_s", cold)
    cold_f = np.where(near_f, np.minimum(cold_f, near), cold_f)
    cold_b = np.where(near_b, np.minimum(cold_b, near), cold_b)
    # a near op in a cycle of light families only (pointwise, copies, splits, small GEMMs) pays op_cold_light_s
    light_f, light_b = light_reuse(seq["name"].to_numpy(object), view | acc, heavy)
    light = hc.get("op_cold_light_s", near)
    cold_f = np.where(light_f, np.minimum(cold_f, light), cold_f)
    cold_b = np.where(light_b, np.minimum(cold_b, light), cold_b)
    # an op whose family last ran more than the L3 of data ago: op_cold_far_s (at least); the L3's loss since its
    # family last ran, of it, where the L3 forgets with time
    far_f, far_b = _far_shares(seq, hc, view | acc, node, idle_s)
    far = hc.get("op_cold_far_s", cold)
    cold_f = np.maximum(cold_f, far_f * far)
    cold_b = np.maximum(cold_b, far_b * far)
    fwd = (np.where(view, hc["view_dispatch_s"], hc["op_dispatch_s"] + fixed) + fwd_switch * cold_f
           + node * hc["autograd_node_s"] + _step_start(view | acc, far_f, hc))
    # a view's backward node is a view of the gradient unless autograd's formula runs kernels (select_backward's
    # zeros and copy: formulas.view_scatter), which dispatch as any op's
    bwd_kernels = np.where(view & (k_bwd == 0), hc["view_dispatch_s"],
                           np.maximum(k_bwd, 1.0) * hc["op_dispatch_s"] + fixed_bwd)
    bwd = node * (hc["backward_node_s"] + bwd_kernels + bwd_switch * cold_b)
    return np.where(acc, 0.0, fwd), np.where(acc, hc["op_dispatch_s"], bwd)


def _far_shares(seq: pd.DataFrame, hc: dict, skip, node, idle_s: float = 0.0) -> tuple:
    """``(forward, backward)`` shares (0-1) of ``op_cold_far_s`` each op pays: 1 where its family last ran more than
    the L3 of distinct data ago (``far_reuse`` on ``FAMILY_DISTANCES``), else what the L3 lost in the time since
    (``hc["far_lost"]``: ``cold_curves.l3_loss``, where other tenants share it; ``family_ages`` on the ops' device
    time + dispatch, a family's first call a step ago: the ops' seconds + ``idle_s``)."""
    dist = [seq[c].to_numpy(float) if c in seq else np.full(len(seq), np.nan) for c in FAMILY_DISTANCES]
    far_f, far_b = far_reuse(*dist, skip, hc.get("far_cache_bytes", 0.0))
    lost = hc.get("far_lost")
    if lost is None:
        return far_f.astype(float), far_b.astype(float)
    ages = family_ages(seq["name"].to_numpy(object), skip, seq["t_fwd"].to_numpy(float) + hc["op_dispatch_s"],
                       seq["t_bwd"].to_numpy(float) + hc["op_dispatch_s"] * node, idle_s)
    shares = [np.array([0.0 if np.isnan(a) else float(lost(a)) for a in age]) for age in ages]
    return np.maximum(far_f, shares[0]), np.maximum(far_b, shares[1])


def _step_start(skip, far_f, hc: dict) -> np.ndarray:
    """Per op, the forward's ``step_start_s`` (calibration's step-start pair, 0 where it did not run): on the first
    computing op (``skip``: views, gradient accumulations), times its far share ``far_f``, 0 elsewhere. A training
    step's forward begins right after the step before's backward and optimizer, so its first op finds the module call
    and autograd-recording path, and its own code, colder than the far price says (op_cases.step_start_cases, timed
    after an L3 eviction) as far as the step evicted them: a step whose data stays in the L3 (a tiny MLP's) leaves
    them warmer. Once per step: the ops after it run among warm neighbours."""
    out = np.zeros(len(skip))
    first = np.flatnonzero(~np.asarray(skip, dtype=bool))
    if len(first):
        out[first[0]] = float(hc.get("step_start_s", 0.0) or 0.0) * float(far_f[first[0]])
    return out


def _measured_class(op_fixed: dict, op_class: str) -> str:
    """The class whose fixed costs price ``op_class``: itself where calibration timed its tiny call, else the class
    it was split out of (``efficiency.CLASS_PARENTS``: a table taken before the split prices it as before)."""
    parent = CLASS_PARENTS.get(op_class)
    return parent if parent is not None and op_class not in op_fixed and parent in op_fixed else op_class


def _fixed_bwd(op_fixed: dict, op_class: str, fixed: float, k_bwd: float, k_fwd: float) -> float:
    """An op's backward fixed cost: its class's measured ``<class>:bwd`` (a tiny aten.convolution_backward of the
    class computing both gradients: op_classes.conv_fixed_cases) x min(backward kernels, 2) / 2 (a first layer's
    input needs no gradient: the weight's alone, half; a bias's sum is priced by its bytes), else the forward's
    fixed cost per forward kernel x backward kernels."""
    if k_bwd > 0 and f"{op_class}:bwd" in op_fixed:
        return float(op_fixed[f"{op_class}:bwd"]) * min(k_bwd, 2.0) / 2.0
    return fixed * k_bwd / max(k_fwd, 1.0)


#: Suffix of an ``op_fixed_s`` key holding a class's tiny call timed right after evicting the core's L2
#: (perfcheck/calibrate/op_classes.conv_fixed_cases), beside the key of the same call in a tight loop.
EVICTED_SUFFIX = " after eviction"


def _class_cold(op_fixed: dict, op_class: str, phase: str, default: float) -> float:
    """What a call of ``op_class`` (``phase``: "" forward, ":bwd" backward) pays for running in a step rather than
    in the tight loop its prices were measured in: op_fixed_s["<class><phase> after eviction"] less
    op_fixed_s["<class><phase>"] (its tiny call right after streaming 4x the L2, less the same call repeated),
    floored at 0; ``default`` (op_cold_s) where calibration has not both.

    Why: op_cold_s is fitted on tiny elementwise ops (~11 us per op on the project's Xeon), while a convolution
    call runs much more code (oneDNN's JIT kernels and reorders, or the matmul path's GEMMs): its tiny call took
    35-120 us more after the eviction (1x1 matmul path +35 / +59 us forward / backward, depthwise +75 / +116,
    dense 3x3 +77 / +138; 1 thread, process time, 2026-11-26), and in a training step a MobileNet's convolutions
    ran 30-70 us per call above the same call repeated (bench/results/conv.md)."""
    key = f"{op_class}{phase}"
    after = op_fixed.get(key + EVICTED_SUFFIX)
    if after is None or key not in op_fixed:
        return default
    return max(float(after) - float(op_fixed[key]), 0.0)


def _fixed_cost(op_fixed: dict, name: str, op_class: str) -> float:
    """An op's fixed cost (``op_fixed_s``): its efficiency class's entry, else its name's when the op is of the
    class its name measured (the op_fixed case's tiny call: a 1-channel convolution); an op of another class
    (perfcheck.predict.aten_costs.op_class: a depthwise or a 64-channel convolution) has its per-call cost in
    its class's calibrated efficiency instead (perfcheck/calibrate/op_classes.py)."""
    if op_class in op_fixed:
        return float(op_fixed[op_class])
    return float(op_fixed.get(name, 0.0)) if op_class == name else 0.0


def _op_host_times(trace, ops: pd.DataFrame, spec, hc: dict, dtype, idle_s: float = 0.0) -> tuple:
    """``(seq, op_stacks, forward host s, backward host s)`` per op of ``op_sequence``, with the step's host terms
    (``dtype_host_terms``, ``_with_cold``) and, where the far rule applies, its family distances."""
    seq, op_stacks = op_sequence(trace, ops)
    op_fixed, cold = dtype_host_terms(spec, hc, dtype)
    hc_step = _with_cold(hc, spec, dtype, cold)
    if hc_step["far_cache_bytes"] > 0:  # the far rule's distances (family_reuse.far_reuse), where it applies
        seq = _with_family_distances(seq, trace, ops)
    # a CPU's per-op fixed cost is its kernel's, which differs by op class; a GPU's is the host's set-up (cuDNN
    # heuristics and descriptors), paid by every call of the family whatever its class
    h_op, hb_op = _host_arrays(seq, hc_step, op_fixed, by_class=spec.kind == "cpu", idle_s=idle_s)
    return seq, op_stacks, h_op, hb_op


def module_times(trace, ops: pd.DataFrame, spec, param_tensors: Optional[dict] = None, dtype=None,
                 idle_s: float = 0.0) -> pd.DataFrame:
    """Per module path: host_fwd_s, host_bwd_s, device_fwd_s, device_bwd_s, time_fwd_s, time_bwd_s.

    trace: perfcheck.predict.trace.Trace; ops: the timed op table (see ``op_sequence``; ``t_*``
    are device seconds on ``spec`` without launch terms beyond ``device_kernel_s``);
    param_tensors: path -> parameter tensors needing a gradient that the module owns directly
    (their AccumulateGrad nodes run in its backward). Containers include their children. ``dtype``: the
    model's floating dtype, for its host terms (``dtype_host_terms``).

    Each module call is an item of its own in the sequence, just before the call's first op, on
    the stack up to that module (so it counts in the module and its ancestors, not in the child
    whose first op follows); the module's AccumulateGrad nodes ride on its first call item.
    """
    spec = spec_of(spec)
    hc = host_constants(spec)
    seq, op_stacks, h_op, hb_op = _op_host_times(trace, ops, spec, hc, dtype, idle_s)
    mod_fixed = dict(getattr(spec, "module_fixed_s", {}) or {})  # class name -> s per call (a layer's Python)
    param_tensors = param_tensors or {}
    h_fwd, h_bwd, d_fwd, d_bwd, stacks, seen, prev = [], [], [], [], [], set(), ()
    op_runs = _runs(op_stacks)
    t_fwd, t_bwd = seq["t_fwd"].to_numpy(float), seq["t_bwd"].to_numpy(float)
    for i, stack in enumerate(op_stacks):
        for depth, path in enumerate(stack):
            if depth < len(prev) and prev[depth] == path:
                continue  # still inside this call
            first = path not in seen
            seen.add(path)
            calls = 1 + (max(trace.calls.get(path, 1) - len(op_runs[path]), 0) if first else 0)
            h_fwd.append((hc["module_call_s"] + mod_fixed.get(trace.types.get(path), 0.0)) * calls)
            h_bwd.append(param_tensors.get(path, 0) * (hc["backward_node_s"] + hc["view_dispatch_s"]) if first else 0.0)
            d_fwd.append(0.0)
            d_bwd.append(0.0)
            stacks.append(stack[:depth + 1])
        h_fwd.append(h_op[i])
        h_bwd.append(hb_op[i])
        d_fwd.append(t_fwd[i])
        d_bwd.append(t_bwd[i])
        stacks.append(stack)
        prev = stack
    h_fwd, h_bwd, d_fwd, d_bwd = (np.asarray(a, dtype=float) for a in (h_fwd, h_bwd, d_fwd, d_bwd))
    n = len(stacks)
    runs = _runs(stacks)
    same = spec.kind == "cpu"
    f_issue, f_end = timeline(h_fwd, d_fwd, same)
    b_issue, b_end = timeline(h_bwd[::-1], d_bwd[::-1], same)
    out = []
    for path, rs in runs.items():
        idx = np.concatenate([np.arange(a, b + 1) for a, b in rs])
        back = [(n - 1 - b, n - 1 - a) for a, b in reversed(rs)]
        out.append((path, h_fwd[idx].sum(), h_bwd[idx].sum(), d_fwd[idx].sum(), d_bwd[idx].sum(),
                    region_time(f_issue, f_end, rs), region_time(b_issue, b_end, back)))
    frame = pd.DataFrame(out, columns=["module", "host_fwd_s", "host_bwd_s", "device_fwd_s", "device_bwd_s",
                                       "time_fwd_s", "time_bwd_s"])
    root = frame["module"] == _root()
    frame.loc[root, ["host_bwd_s", "time_bwd_s"]] += hc["backward_call_s"]
    return frame


def _contains(container: str, path: str) -> bool:
    """True when module ``path`` is ``container`` or inside it (the root contains every module)."""
    return container == _root() or path == container or path.startswith(container + ".")


def tied_gradient_s(modules: dict, spec, elem_bytes: int = 4) -> dict:
    """Backward seconds of summing the gradients of parameters registered in several modules (tied weights: an
    LM's token embedding and its output projection), per module path: a parameter owned by k modules receives k
    gradients, which autograd adds (k - 1 adds of its size: read both, write one, 3 streams) before its
    AccumulateGrad; charged to its first owner in ``modules``' order (the embedding: its backward runs last).
    Measured on BERT-small's tied 30522 x 128 word embedding (15.6 MB): ~4 ms of its 5.3 ms backward here."""
    owners = {}
    for path, mod in modules.items():
        for q in mod.parameters(recurse=False):
            if q.requires_grad:
                owners.setdefault(id(q), (q, []))[1].append(path)
    out = {}
    for q, paths in owners.values():
        if len(paths) > 1:
            numel = int(getattr(q, "ds_numel", 0) or q.numel())
            out[paths[0]] = out.get(paths[0], 0.0) + float(memory_time_s(3.0 * numel * elem_bytes * (len(paths) - 1),
                                                                         spec))
    return out


def _root():
    from perfcheck.schema import ROOT

    return ROOT


def host_bound(host_s, device_s):
    """True where the host's total exceeds the device's (the region waits on Python/dispatch)."""
    return np.asarray(host_s, dtype=float) > np.asarray(device_s, dtype=float)


# ------------------------------------------------------------------------------ optimizer
def optimizer_kind(optimizer) -> tuple:
    """``(kind, implementation)`` for a torch.optim optimizer or a name.

    Names: a torch.optim class in lower case with its variant flags (``perfcheck.predict.optimizers``: sgd,
    sgd_momentum, sgd_momentum_nesterov, adam, adam_wd, adam_amsgrad, adamw, rmsprop_momentum_centered, adagrad,
    lbfgs, ...), optionally suffixed ``-foreach``, ``-fused`` or ``-for-loop`` (without one: None, resolved by
    the caller from the device: torch's choice, foreach on CUDA tensors and the for-loop on CPU ones). An
    instance is read from its class, its first param group's flags and its ``foreach``/``fused`` settings,
    torch's default resolved from its parameters' device (``torch.optim.optimizer._default_to_fused_or_foreach``:
    foreach on a device with foreach kernels, else the for-loop), so ``"-".join(optimizer_kind(instance))`` is a
    name that maps back to the same pair.
    """
    if isinstance(optimizer, str):
        text = optimizer.strip().lower().replace("_", "-")
        impl = None
        for suffix in IMPLEMENTATIONS:
            if text.endswith("-" + suffix):
                text, impl = text[: -len(suffix) - 1], suffix
        kind = text.replace("-", "_")
        optimizers.parse(kind)  # UserError naming an unknown class or variant
        return kind, impl
    kind = optimizers.kind_of(optimizer)
    group = optimizer.param_groups[0] if getattr(optimizer, "param_groups", None) else {}
    if group.get("fused"):
        return kind, "fused"
    if group.get("foreach") is not None or "foreach" not in group:
        return kind, "foreach" if group.get("foreach") else "for-loop"
    from torch.optim.optimizer import _get_foreach_kernels_supported_devices

    devices = {p.device.type for g in optimizer.param_groups for p in g["params"]}
    foreach = bool(devices) and devices <= set(_get_foreach_kernels_supported_devices())
    return kind, "foreach" if foreach and not group.get("differentiable") else "for-loop"


#: Calibrated per-tensor host costs the others are read from: (implementation line, kind) -> host key.
_HOST_POINTS = {impl: tuple((base, optim_per_tensor_key(optim_line(base, impl))) for base in ("sgd", "adam"))
                for impl in ("for-loop", "foreach")}


def optimizer_host_per_tensor(kind: str, impl: str, hc) -> float:
    """Host seconds per parameter tensor of a ``kind`` step in ``impl``, read off the calibrated line of its
    implementation: ``perfcheck calibrate`` times SGD and Adam per tensor (``optim_sgd[_foreach]_per_tensor_s``,
    ``optim_adam[_foreach]_per_tensor_s``); an optimizer running x element-ops per tensor
    (``optimizers.Profile.host_ops``: its ops per tensor for the for-loop, its foreach ops for foreach) costs

        c_sgd + (c_adam - c_sgd) * (x - x_sgd) / (x_adam - x_sgd)          (>= 0)

    on that line (x counted on this torch build: SGD 1, Adam 9 for-loop / 10 foreach in torch 2.13). Fused runs
    on the foreach line at its own count (one fused op per list, 1-2). NB: linear in the ops, as each costs an
    eager dispatch; the Python around them (state look-ups, the step counter) is in the slope's average."""
    line = _HOST_POINTS["foreach" if impl in ("foreach", "fused") else "for-loop"]
    points = [(optimizers.profile(k, "foreach" if impl == "fused" else impl).host_ops, hc[key]) for k, key in line]
    (x0, c0), (x1, c1) = points
    x = optimizers.profile(kind, impl).host_ops
    return float(max(c0 + (c1 - c0) * (x - x0) / (x1 - x0), 0.0)) if x1 != x0 else float(c0)


def optimizer_time(param_numels, optimizer="sgd", spec="cpu", *, elem_bytes: int = 4,
                   zero_numel: float = 0.0, step_s: float = 0.0, model_numel: float = 0.0) -> OptimizerCost:
    """Predicted optimizer.step() + zero_grad(set_to_none=True) for parameter tensors of ``param_numels``.

    Host: the implementation's fixed cost (``step_key``: optim_step_s for SGD's for-loop, optim_<base>[_foreach]_step_s
    for SGD foreach and Adam/AdamW, each its own calibration line's intercept; optim_step_s where the spec has no
    such line) + tensors x ``optimizer_host_per_tensor``.
    Device, per tensor of n elements and per kernel k of the step (``optimizers.profile``: what torch's code
    runs, s_k memory streams per element): max(n / vector rate, n x the op's measured price per element where the
    spec has one (``op_flop_s``: a square root, a division), s_k x n x elem_bytes at the bandwidth curve of a
    kernel that size), as any elementwise op (SGD's add_ on 10 x 262144 elements: 1.22 ms measured, 1.18
    predicted; the fused Adam 3.9 / 3.5; the for-loop Adam's 8 kernels 14.1 / 10.5, on the project's Xeon
    under load), + device_kernel_s per kernel (for-loop: per kernel and tensor; foreach/fused: per op for the
    whole list); Muon's Newton-Schulz matmuls: n^1.5 MACs each (a square parameter) at the matrix rate.
    Square roots of zeros: ``zero_numel`` elements whose gradient is 0 every step (embedding rows no index
    reaches, ``perfcheck.predict.zero_rows``) keep a second moment of exactly 0, and each of the step's sqrt
    kernels (``Profile.sqrts``: Adam/AdamW/RMSprop/Adagrad 1, SGD and fused 0) pays ``sqrt_zero_s`` per such
    element on top of its roofline time:  sqrts x zero_numel x sqrt_zero_s.
    Far (``optimizer_far_share``: the share of the optimizer's tensors that the step of ``step_s`` predicted seconds
    over a model of ``model_numel`` parameter elements has left out of a small L3, times): each tensor's persistent
    bytes (``Profile.persistent`` x n x elem_bytes: the parameter, its gradient and states, each fetched once; the
    step's later kernels on them hit) are fetched from memory, not the L3, for the L3's share of the optimizer's
    state (``_far_refetch_s``):
        + share x persistent x n x elem_bytes x min(1, L3 / state bytes) x (far - L3 seconds per byte)
    Why: on the project's AMD VM (L3 32 MiB, shared) an LSTM model's SGD step (15 MiB of parameters) took 0.89 ms in
    a tight loop, as predicted, and 1.72 ms after an L3 eviction, 1.67 after 20 ms asleep and 1.66 inside the step.
    CPU: host + device (same thread); GPU: max(host, device) (the step's kernels queue behind it).
    """
    spec = spec_of(spec)
    hc = host_constants(spec)
    kind, impl = optimizer_kind(optimizer)
    impl = impl or ("for-loop" if spec.kind == "cpu" else "foreach")
    prof = optimizers.profile(kind, impl)
    numels = np.asarray(list(param_numels), dtype=float)
    tensors, elems = len(numels), float(numels.sum())
    family = kind.split("_")[0]  # sgd_momentum_nesterov -> sgd, adamw_amsgrad -> adamw (optimizers.FLAGS)
    base = "adam" if family in ("adam", "adamw") else family
    # a spec calibrated before each implementation had its own line (no such key in its host block), or an
    # optimizer without one: optim_step_s, not an uncalibrated default
    fixed = dict(spec.host).get(step_key(base, impl), hc["optim_step_s"])
    host = fixed + tensors * optimizer_host_per_tensor(kind, impl, hc)
    device = _optimizer_device_s(prof, impl, numels, spec, hc, elem_bytes, zero_numel) if tensors else 0.0
    state_bytes = model_numel * elem_bytes * prof.persistent
    far = optimizer_far_share(spec, step_s, state_bytes) if tensors else 0.0
    if far > 0:
        device += far * _far_refetch_s(numels * elem_bytes * prof.persistent, spec, state_bytes)
    total = host + device if spec.kind == "cpu" else max(host, device)
    return OptimizerCost(kind, impl, tensors, int(elems), float(host), float(device), float(total), float(fixed))


def _optimizer_device_s(prof, impl, numels, spec, hc, elem_bytes, zero_numel) -> float:
    """The device seconds of ``optimizer_time`` with the tensors where a tight loop keeps them (its docstring)."""
    # each kernel is an elementwise op on one tensor, priced as the model prices one: the larger of its element
    # work at the vector rate (1 FLOP per element: the calibration's add) or at its own measured price, and its
    # streams' bytes at the bandwidth curve of a kernel that size (tensors x kernels)
    streams = np.asarray(prof.kernels, dtype=float)
    nbytes = np.outer(numels, streams) * elem_bytes
    named = len(prof.names) == len(streams)  # a profile with each kernel's op name (not a hand-made one)
    # in-place kernels stream beyond the L2 at write_allocate.write_allocate_gain x a copy's rate
    inplace = np.broadcast_to([is_inplace(n) for n in prof.names], nbytes.shape) if named else None
    memory = memory_time_s(nbytes, spec, kernels=np.ones_like(nbytes), inplace=inplace)
    compute = np.asarray(compute_time_s(0.0, np.outer(numels, np.ones_like(streams)), spec, "fp32"))
    if named:
        compute = np.maximum(compute, np.outer(numels, op_flop_prices(spec, prof.names)))
    device = float(np.sum(np.maximum(memory, compute)))
    if prof.matmuls:
        device += float(compute_time_s(2 * prof.matmuls * float(np.sum(numels ** 1.5)), 0.0, spec, "fp32"))
    launches = len(numels) * len(prof.kernels) if impl == "for-loop" else len(prof.kernels)
    device += launches * hc["device_kernel_s"]
    return device + prof.sqrts * float(zero_numel) * hc["sqrt_zero_s"]


def _optim_numel(q) -> int:
    """The elements of parameter ``q`` this rank's optimizer updates: a sharded layout's twin records its local shard
    (perfcheck_optim_numel: FSDP2 / DTensor, predict.twins), ZeRO-3 its ds_numel."""
    return int(getattr(q, "perfcheck_optim_numel", 0) or getattr(q, "ds_numel", 0) or q.numel())


def optimizer_far_share(spec, step_s: float, state_bytes: float) -> float:
    """The share (0-1) of an optimizer step's L3-held tensors that start it beyond the L3: where the far-data rule
    applies (``cold_curves.far_data``: a CPU whose calibration ran the far cases, an L3 of at most 64 MiB), all of
    them when the optimizer's ``state_bytes`` (parameters, gradients, states) exceed the L3 (they were last touched
    a step ago), else what the L3 loses in the ``step_s`` since the last step touched them (``cold_curves.l3_loss``:
    calibration's loss curve, or its residency threshold); 0 elsewhere."""
    spec = spec_of(spec)
    l3, _ = far_data(spec)
    if l3 <= 0:
        return 0.0
    return 1.0 if state_bytes > l3 else float(l3_loss(spec)(step_s))


def _far_refetch_s(tensor_bytes, spec, state_bytes: float) -> float:
    """Extra seconds to fetch ``tensor_bytes`` (per tensor) from beyond the L3 (``calibration.l3_bytes``, L): at
    memory's rate (``roofline.far_seconds_per_byte``) instead of the bandwidth curve's at L / 4 (a buffer the L3
    holds), for the share min(1, L / ``state_bytes``) of them: a tight loop over an optimizer whose tensors exceed the
    L3 (calibration's, the per-kernel prices) already streams the rest from memory; the L3's worth it kept is what a
    step evicts. Measured on the project's AMD VM (L3 32 MiB; optimizer alone, then after an L3 eviction): SGD over
    2 x 15 MiB +0.83 ms (this rule: +0.98), SGD with momentum over 3 x 43 MiB +0.8 (+1.0), over 3 x 6 MiB +0.66
    (+0.56); Adam over 4 x 4.2 MiB +0.65 (+0.55), over 4 x 7-17 MiB +0.4-0.45 (+0.9-1.0), over 4 x 6-9 MiB +0.03-0.05
    (+0.7-1.0: an Adam step's compute-bound kernels hide part of the fetch, which this rule does not model)."""
    l3, _ = far_data(spec)
    l3_per_byte = float(memory_time_s(l3 / 4.0, spec, kernels=1.0)) / (l3 / 4.0)
    share = min(1.0, l3 / max(float(state_bytes), 1.0))
    return float(np.sum(np.asarray(tensor_bytes, dtype=float))) * share * max(far_seconds_per_byte(spec) - l3_per_byte,
                                                                              0.0)


def step_key(base: str, impl: str) -> str:
    """The host constant of an optimizer implementation's fixed cost per step (base: sgd | adam;
    ``perfcheck.hardware.host_keys``)."""
    return optim_step_key(optim_line(base, impl))


# ------------------------------------------------------------------------------ processes sharing a host
def process_slowdown(spec, processes: int) -> float:
    """Factor by which one process's host (and, on a CPU, compute) time grows while ``processes``
    processes like it share the host (the ranks of a data-parallel job on one node):

        1 + (processes - 1) * process_slowdown_per_peer      (1 for one process)

    ``process_slowdown_per_peer`` is the spec's host constant, measured by
    perfcheck/calibrate/concurrency.py (one process alone vs N at once, CPU time), else
    host_defaults.json's. Linear in the peers: an assumption, exact at the N the case ran with."""
    if isinstance(processes, bool) or not isinstance(processes, (int, np.integer)) or processes < 1:
        raise UserError(f"processes: must be an integer >= 1, got {processes!r}")
    return 1.0 + (int(processes) - 1) * host_constants(spec_of(spec))["process_slowdown_per_peer"]


# ------------------------------------------------------------------------------ collectives, DeepSpeed
def collective_latency_s(calls, spec) -> float:
    """Alpha term: ``calls`` collectives x the fixed time of one (collective_latency_s)."""
    return float(calls) * host_constants(spec_of(spec))["collective_latency_s"]


def deepspeed_host_s(*, stage: int, module_calls: int, param_tensors: int, spec, partitioned_tensors: int = 0) -> dict:
    """DeepSpeed's own host seconds per phase at ZeRO ``stage``, beside the model's.

    From the spec's ``zero<S>_*`` host constants (``perfcheck calibrate``'s DeepSpeed engine case,
    perfcheck/calibrate/deepspeed_cases.py, else host_defaults.json), T parameter tensors,
    C module calls per forward and, at stage 3, G of the T tensors partitioned (not persistent:
    fetched and released around their module; ``partitioned_tensors``, default 0):

        fwd   = zero<S>_fwd_s  + (T - G) * zero<S>_fwd_tensor_s  [+ C * zero3_fwd_module_s + G * zero3_fwd_gather_s]
        bwd   = zero<S>_bwd_s  + (T - G) * zero<S>_bwd_tensor_s  [+ C * zero3_bwd_module_s + G * zero3_bwd_gather_s]
        optim = zero<S>_step_s + (T - G) * zero<S>_step_tensor_s [+ G * zero3_step_gather_s]

    fwd and bwd are per micro-step and come on top of the model's own forward and backward; optim is
    the whole engine.step() host time per optimizer step (the optimizer's loop included: ZeRO-1-3
    step one flat partition, stage 0 each tensor), so the optimizer's own host model is not added to it.
    Collectives are not in these terms (perfcheck.predict.zero times them). Returns {"fwd", "bwd", "optim"}.
    """
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise UserError(f"stage: ZeRO stage must be 0-3, got {stage!r}")
    for name, value in (("module_calls", module_calls), ("param_tensors", param_tensors),
                        ("partitioned_tensors", partitioned_tensors)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise UserError(f"{name}: must be an integer >= 0, got {value!r}")
    if partitioned_tensors > param_tensors:
        raise UserError(f"partitioned_tensors: {partitioned_tensors} is more than the {param_tensors} parameter tensors")
    hc = host_constants(spec_of(spec))
    part = partitioned_tensors if stage == 3 else 0
    out = {}
    for ph, key in (("fwd", "fwd"), ("bwd", "bwd"), ("step", "optim")):
        t = hc[zero_key(stage, ph)] + (param_tensors - part) * hc[zero_key(stage, ph, "tensor")]
        if stage == 3:
            t += (module_calls * hc[zero_key(3, ph, "module")] if ph != "step" else 0.0)
            t += part * hc[zero_key(3, ph, "gather")]
        out[key] = float(t)
    return out


# ------------------------------------------------------------------------------ estimator columns
def add_host_columns(frame: pd.DataFrame, trace, ops: pd.DataFrame, spec: SystemSpec, modules: dict,
                     optimizer="sgd", dtype=None, step_other_s: float = 0.0) -> pd.DataFrame:
    """The module estimator's host and timeline terms, per module and phase p: ``host_p_s`` and ``device_p_s``
    (totals), ``timeline_p_s`` (both on the two timelines: ``module_times``), ``tied_bwd_s`` (``tied_gradient_s``),
    and ``pred_optim_s`` (its only writer). ``perfcheck.predict.combine.predicted_times`` makes the module's
    time and bound of them. Where the L3 forgets with time (``_far_shares``), the module times are taken again
    with the rest of the step in the time since a family's first call last ran (``family_ages``' ``idle_s``): the
    optimizer's step and ``step_other_s`` (the step's time outside the model and its optimizer: an engine's own
    work and collectives).

    frame: the estimator's per-module frame; ops: its timed op table; modules: path -> nn.Module.
    ``optimizer``: name or torch.optim instance (``optimizer_kind``), or None for one that is not modelled
    (``pred_optim_s`` NaN: no number rather than another optimizer's).
    """
    own = {p: sum(1 for q in m.parameters(recurse=False) if q.requires_grad) for p, m in modules.items()}
    times = module_times(trace, ops, spec, own, dtype).set_index("module")
    optim = _optimizer_column(frame, trace, spec, modules, optimizer, times) if optimizer is not None else None
    root_optim = dict(zip(frame["module"], optim)).get(_root(), 0.0) if optim is not None else 0.0
    idle = float(np.nan_to_num(root_optim)) + _seconds(step_other_s, "step_other_s")
    if idle > 0 and _forgets_in_time(spec, dtype):
        times = module_times(trace, ops, spec, own, dtype, idle_s=idle).set_index("module")
    for phase in ("fwd", "bwd"):
        for term in ("host", "device", "time"):
            column = f"timeline_{phase}_s" if term == "time" else f"{term}_{phase}_s"
            frame[column] = frame["module"].map(times[f"{term}_{phase}_s"]).fillna(0.0).to_numpy(float)
    tied = tied_gradient_s(modules, spec)
    frame["tied_bwd_s"] = (frame["module"].map(lambda m: sum(t for p, t in tied.items() if _contains(m, p)))
                           .to_numpy(float) if tied else 0.0)
    # an optimizer the model does not know (predict.for_run): no number rather than another's
    frame["pred_optim_s"] = float("nan") if optim is None else optim
    return frame


def _seconds(value, name: str) -> float:
    """A finite number of seconds >= 0, else a UserError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(value)) or value < 0:
        raise UserError(f"{name}: seconds must be a finite number >= 0, got {value!r}")
    return float(value)


def _forgets_in_time(spec, dtype) -> bool:
    """Whether this spec's L3 forgets with time for the host's far rule (``_with_cold``'s ``far_lost``)."""
    hc = host_constants(spec)
    _, cold = dtype_host_terms(spec, hc, dtype)
    return _with_cold(hc, spec, dtype, cold)["far_lost"] is not None


def _optimizer_column(frame, trace, spec, modules: dict, optimizer, times) -> list:
    """``pred_optim_s`` per row of ``frame``: each module's parameters' step, less the implementation's fixed cost
    but at the root."""
    optim = []
    zeros = zero_elements(trace, modules)  # embedding rows the batch never reaches (predict.zero_rows)
    # the step before the optimizer (its far rule: optimizer_far_share) and the elements it updates in all
    step_s = float(times["time_fwd_s"].get(_root(), 0.0) + times["time_bwd_s"].get(_root(), 0.0))
    model_numel = float(sum(_optim_numel(q) for q in {id(q): q for m in modules.values() for q in m.parameters()}
                            .values() if q.requires_grad))
    for path in frame["module"]:
        mod = modules.get(path)
        params = ([q for q in {id(q): q for q in mod.parameters()}.values() if q.requires_grad]
                  if mod is not None else [])
        numels = [_optim_numel(q) for q in params]
        # a sharded weight's zero rows: this rank's share of them (its elements over the whole weight's)
        zero = sum(zeros.get(id(q), 0.0) * min(1.0, n / max(q.numel(), 1)) for q, n in zip(params, numels))
        cost = optimizer_time(numels, optimizer, spec, zero_numel=zero, step_s=step_s, model_numel=model_numel)
        optim.append(max(cost.time_s - (cost.fixed_s if path != _root() else 0.0), 0.0) if numels else 0.0)
    return optim
