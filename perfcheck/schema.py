"""Column names, units and phases shared by every stage: the glossary of perfcheck's tables.

Every stage exchanges tidy pandas DataFrames keyed by module path (exactly as
``nn.Module.named_modules()`` names it, wrapper prefixes such as DDP's/DeepSpeed's ``module.``
removed; the root module is ``ROOT``). Units are SI: seconds, bytes, FLOPs, FLOP/s.
``validate_frame`` checks a frame against one of the column lists below so that a stage fails
loudly, naming the missing column, instead of producing a silently wrong join.
"""
from __future__ import annotations

from typing import Iterable, Mapping

SCHEMA_VERSION = 1
#: The perfcheck release that writes these files (meta.json ``versions.perfcheck``); also ``perfcheck.__version__``
#: and the package version (setup.cfg ``attr:``): one definition.
PACKAGE_VERSION = "0.1.0"

#: Path used for the root module (``named_modules()`` names it ``""``, which CSV cannot round-trip).
ROOT = "(root)"

#: Phases of a training step. ``eval``: a module call made with grad disabled (``torch.no_grad()``,
#: ``torch.inference_mode()``) outside any grad-enabled call, e.g. a validation batch or an EMA/teacher
#: forward inside the step. It is measured apart (``eval_s``) and never compared with the training
#: forward's prediction. A step with no grad-enabled forward at all (an inference loop) has no
#: training forward to keep apart: its grad-disabled calls are its forward. A grad-disabled call
#: nested inside a training forward (a frozen sub-module under no_grad) stays forward.
PHASES = ("fwd", "bwd", "optim", "recompute", "eval")

#: What limits a predicted time. ``host``: the framework's CPU-side work (dispatch, autograd,
#: module calls) exceeds the device work of the region (perfcheck.predict.host).
BOUNDS = ("compute", "memory", "comm", "overhead", "host")

#: Where a predicted row's numbers come from.
SOURCES = ("modeled", "counted")

# --------------------------------------------------------------------------------------------
# Predicted rows: perfcheck.estimate(...) -> one row per module that runs (containers included).
# Values of a container include everything run inside it (its children and its own functional
# ops), like DeepSpeed's profiler tree, so the root row is the whole model.
# --------------------------------------------------------------------------------------------
PREDICTED_COLUMNS: Mapping[str, str] = {
    "module": "qualified module path as named_modules() gives it; the root is '(root)'",
    "type": "module class name",
    "depth": "0 for the root, 1 for its children, ...",
    "calls": "times the module's forward ran in one step",
    "params": "parameters owned by the module and its children (counted once; ZeRO-3 ds_numel aware)",
    "macs_fwd": "matrix multiply-accumulates in forward (matmul, conv, attention products)",
    "macs_bwd": "matrix multiply-accumulates in backward (input and weight gradients that autograd computes)",
    "flops_fwd": "all floating-point operations in forward: 2*macs_fwd plus elementwise/reduction FLOPs",
    "flops_bwd": "all floating-point operations in backward",
    "bytes_fwd": "bytes read and written by forward kernels (activations, weights, masks)",
    "bytes_bwd": "bytes read and written by backward kernels (incl. weight gradients)",
    "act_mem": "bytes of activations saved for backward",
    "comm_fwd_bytes": "bytes moved by collectives in forward (per rank, payload size)",
    "comm_bwd_bytes": "bytes moved by collectives in backward (per rank, payload size)",
    "comm_kind": "collective kinds, '+'-joined (e.g. 'allreduce', 'allgather+reducescatter'), '' if none",
    "pred_fwd_s": "predicted forward time: device (roofline + per-kernel) and host (dispatch, autograd, module "
                  "calls) terms on two timelines (they add on a CPU), + communication, seconds; written only by "
                  "perfcheck.predict.combine.predicted_times",
    "pred_bwd_s": "predicted backward time, seconds (same model, + summing tied parameters' gradients); written only "
                  "by perfcheck.predict.combine.predicted_times",
    "bound_fwd": "what limits the forward time: compute | memory | comm | overhead | host (combine.predicted_times)",
    "bound_bwd": "what limits the backward time (combine.predicted_times)",
    "source": "modeled (perfcheck formulas) | counted (torch.utils.flop_counter fallback for an op without a formula)",
}

#: Columns perfcheck.estimate adds beyond the contract (files written before them still load).
PREDICTED_EXTRA_COLUMNS: Mapping[str, str] = {
    "unmodeled_ops": "aten ops no formula knows, costed by their bytes alone, ','-joined ('' if none)",
    "kernels_fwd": "kernel launches predicted for the forward (the launch-overhead term counts these)",
    "kernels_bwd": "kernel launches predicted for the backward",
    "macs_recompute": "matrix MACs re-run in backward by activation checkpointing (torch.utils.checkpoint): the "
                      "forward MACs of the module's checkpointed ops; 0 without checkpointing",
    "flops_recompute": "all FLOPs re-run in backward by activation checkpointing (2*macs_recompute + other)",
    "pred_recompute_s": "predicted time of that recompute, seconds (measured as recompute_s; not in pred_bwd_s); "
                        "written only by perfcheck.predict.module_estimator.estimate_terms (the device time of the "
                        "checkpointed ops)",
    "host_fwd_s": "predicted host (CPU framework) seconds of the forward: aten dispatch, autograd nodes, module calls "
                  "(perfcheck.predict.host.add_host_columns)",
    "host_bwd_s": "predicted host seconds of the backward: autograd engine per node, backward kernels' dispatch, "
                  "AccumulateGrad per parameter tensor (the root adds loss.backward()'s fixed cost)",
    "pred_optim_s": "predicted optimizer.step() + zero_grad() for the parameters of the module and its children, "
                    "seconds (the root adds the step's fixed cost; estimate(optimizer=...) names the implementation); "
                    "written only by perfcheck.predict.host.add_host_columns",
}

# --------------------------------------------------------------------------------------------
# Measured rows: PerfCheck(model).measured() -> one row per module that ran in measured steps.
# Times are per step (sum over the module's calls in that step); statistics are over steps.
# --------------------------------------------------------------------------------------------
_STATS = ("median", "mean", "min", "max")
MEASURED_COLUMNS: Mapping[str, str] = {
    "module": "qualified module path (same keys as the predicted rows)",
    "type": "module class name",
    "depth": "0 for the root",
    "calls": "forward calls per step (median over measured steps); eval calls not included",
    **{f"fwd_s_{s}": f"forward time per step, {s} over measured steps, seconds" for s in _STATS},
    **{f"bwd_s_{s}": f"backward time per step, {s} over measured steps, seconds" for s in _STATS},
    **{f"recompute_s_{s}": f"activation-checkpoint recompute time per step, {s}, seconds" for s in _STATS},
    "eval_calls": "eval (grad-disabled, see PHASES) forward calls per step, median over measured steps",
    **{f"eval_s_{s}": f"eval (grad-disabled) forward time per step, {s} over measured steps, seconds; not in "
                      "fwd_s and never compared with a prediction" for s in _STATS},
    "act_mem_bytes": "device memory allocated across the module's forward (activations kept), bytes; NaN where not measurable",
    "peak_mem_bytes": "peak device memory seen during the module's forward, bytes; NaN where not measurable",
    "flops_fwd_counted": "FLOPs counted by FlopCounterMode for one forward, NaN if counting was off",
    "flops_bwd_counted": "FLOPs counted by FlopCounterMode for one backward, NaN if counting was off",
    "fwd_flops_per_s": "achieved forward FLOP/s: flops_fwd_counted / fwd_s_median (NaN if not counted)",
    "bwd_flops_per_s": "achieved backward FLOP/s: flops_bwd_counted / bwd_s_median (NaN if not counted)",
    "steps": "number of measured steps",
    "rank": "distributed rank (0 when not distributed)",
}

#: Collectives per module and phase in the reconciled table (``{p}`` = fwd | bwd), measured from
#: collectives.csv (perfcheck.measure.collectives) by perfcheck.analysis.comm, per profiled step.
#: "Issued" is the module whose forward/backward context ran the collective op; "waited" the module
#: whose time holds the wait (FSDP2's prefetch and DDP's overlap make them different modules). Own:
#: the module's own context; the others also sum every module inside it (like the time columns), so
#: the root holds the rank's total. NaN where the rank recorded no collectives.csv (no collective in
#: its profiled window, or no window).
MODULE_COMM_COLUMNS: Mapping[str, str] = {
    "meas_comm_{p}_bytes": "bytes of the collectives issued in the {p} phase by the module or a module inside it, per "
                           "profiled step (the predicted comm_{p}_bytes' measured twin: all-gather output, "
                           "reduce-scatter input, all-reduce tensor), bytes",
    "meas_comm_own_{p}_bytes": "bytes of the collectives the module itself issued in {p} (issued by), per profiled step, bytes",
    "meas_comm_own_{p}_count": "collectives the module itself issued in {p}, per profiled step",
    "meas_comm_wait_{p}_s": "time waited on collectives in {p} inside the module or a module inside it (part of meas_{p}_s; "
                            "the root's end-of-backward wait is outside meas_bwd_s, in bwd_finalize_s), per profiled "
                            "step, seconds",
    "meas_comm_wait_own_{p}_s": "time the module itself waited on collectives in {p} (waited on), per profiled step, seconds",
    "comm_waits_{p}": "the module's own largest waits in {p} in words: collective kind, bytes, the module and phase that "
                      "issued it and the one that waited, seconds per step; '; '-joined, '' when none",
}

#: Per-step rows: PerfCheck.steps().
STEP_COLUMNS: Mapping[str, str] = {
    "step": "step index (0-based, counted from start(), warm-up steps included)",
    "measured": "True for steps inside the measured window",
    "fwd_s": "forward time of the root module, seconds",
    "bwd_s": "backward time of the root module, seconds",
    "optim_s": "time from the end of backward to the end of the step (optimizer, framework), less bwd_finalize_s and "
               "the eval_s that ran in it, seconds",
    "bwd_finalize_s": "time in end-of-backward callbacks frameworks queue after the backward pass: DDP's finalize_backward "
                      "waiting for its gradient all-reduces, FSDP2's post-backward waiting for its reduce-scatters "
                      "(communication waits, not optimizer); ~0 without them, seconds",
    "step_s": "wall time of the whole step, seconds",
    "recompute_s": "activation-checkpoint recompute time in the step (outermost recompute calls), seconds",
    "eval_s": "eval forward time in the step: outermost module calls made with grad disabled (see PHASES), not in "
              "fwd_s; when after the backward, also not in optim_s; seconds",
    "micro_batches": "training forward calls of the root module in the step: the gradient-accumulation micro-batches "
                     "between two step() calls (meta.json micro_batches: their median; reports scale the "
                     "one-micro-batch prediction by it)",
    "peak_mem_bytes": "peak device memory allocated in the step, bytes; NaN where not measurable (CPU)",
    **{f"{kind}_faults_{p}": f"{kind} page faults of the whole process {where} ({why}); NaN without a counter, and per "
                             "phase in bare steps" for kind, why in (
        ("minor", "getrusage ru_minflt: a page mapped on first touch, no disk read; memory freed and allocated again "
                  "every step is first-touched again"), ("major", "getrusage ru_majflt: a page read from disk"))
       for p, where in (("fwd", "in the root's training forwards"),
                        ("bwd", "in the backward passes (from their first instrumented node to their end)"),
                        ("optim", "from the end of the last forward/backward to the step's end (optimizer, zero_grad)"),
                        ("step", "in the whole step"))},
    "role": "warmup | flops (FlopCounterMode on) | profile (torch.profiler warm-up/active) | measured | bare (no hooks, for the overhead A/B)",
    "failed": "True if the user's forward or a backward pass raised (or a hook failed) in this step; such steps are left out of the statistics",
    "rank": "distributed rank",
}

#: Kernel (GPU) or aten-op (CPU) rows attributed to a module and phase: PerfCheck.kernels().
KERNEL_COLUMNS: Mapping[str, str] = {
    "module": "innermost module whose range encloses the kernel; 'unattributed' if none",
    "phase": "fwd | bwd | optim | recompute | eval | unattributed",
    "name": "kernel name (GPU) or aten op name (CPU)",
    "step": "profiled step (the N of torch.profiler's ProfilerStep#N, = steps.csv step) the op ran in, or the "
            "kernel's launching op ran in; -1: device work no op claims (not tied to a step); NaN: a kernels.csv "
            "written before this column (rows summed over the window)",
    "device": "cuda | cpu",
    "count": "number of launches in the profiled window's step",
    "total_s": "summed kernel duration in the step, seconds",
    "self_s": "summed self time (device kernels: equal to total_s), seconds",
    "rank": "distributed rank",
}

#: Utilization/memory samples: PerfCheck.samples().
#: The sampler's shortest period, seconds (samples.csv rows; measure.sampler): NVML's utilization counter is a
#: duty cycle over its own 1/6-1 s window, so faster polling only repeats it. Here, not in the sampler, so the
#: torch-free DeepSpeed block parser can check the "perfcheck" block's sampler_interval_s.
MIN_INTERVAL_S = 0.1

SAMPLE_COLUMNS: Mapping[str, str] = {
    "time_s": "seconds since the sampler started",
    "step": "training step in flight when sampled",
    "gpu_util": "NVML utilization.gpu in [0, 1]: share of the last 1/6-1 s in which ANY kernel ran (a duty cycle, not SM occupancy)",
    "mem_used_bytes": "device memory used (NVML) or process RSS (psutil), bytes",
    "mem_total_bytes": "device memory total (NVML) or machine RAM (psutil), bytes",
    "power_w": "board power draw, watts (NaN without NVML)",
    "sm_clock_hz": "SM clock, hertz (NaN without NVML)",
    "temperature_c": "GPU temperature, degrees Celsius (NaN without NVML)",
    "cpu_util": "process CPU utilization in [0, ncores] (psutil)",
    "rss_bytes": "process resident set size (psutil), bytes",
    "rank": "distributed rank",
}


#: Columns added to the run-directory tables after files of this schema version were written:
#: a file (or a hand-built frame) without them reads, and writes, with them filled by the value
#: here (NaN: not measured by the perfcheck that wrote it). ``rundir`` applies it.
ADDED_COLUMNS: Mapping[str, float] = {c: float("nan") for c in (
    "eval_calls", *(f"eval_s_{s}" for s in _STATS), "eval_s", "micro_batches",
    *(f"{k}_faults_{p}" for k in ("minor", "major") for p in ("fwd", "bwd", "optim", "step")))}

#: Columns added to ONE table after files of this schema version were written (a name such as
#: ``step`` that other tables require must not be filled in for them): table columns -> {column: fill}.
ADDED_TABLE_COLUMNS: Mapping[tuple, Mapping[str, float]] = {
    tuple(KERNEL_COLUMNS): {"step": float("nan")},
}


def added_columns(columns: Iterable[str]) -> dict:
    """The columns among ``columns`` a file may lack, with their fill values (ADDED_COLUMNS, plus
    ADDED_TABLE_COLUMNS when ``columns`` are exactly that table's)."""
    columns = tuple(columns)
    out = {c: ADDED_COLUMNS[c] for c in columns if c in ADDED_COLUMNS}
    out.update(ADDED_TABLE_COLUMNS.get(columns, {}))
    return out


class SchemaError(ValueError):
    """A frame or file does not match the documented columns."""


def validate_frame(frame, columns: Iterable[str], what: str):
    """Raise SchemaError naming the first missing column; return the frame unchanged."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise SchemaError(f"{what}: missing column {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return frame


def module_depth(path: str) -> int:
    """Depth of a module path: 0 for the root, else the number of dotted components."""
    return 0 if path == ROOT else path.count(".") + 1


def parent_path(path: str) -> str | None:
    """Parent module path (None for the root)."""
    if path == ROOT:
        return None
    return path.rsplit(".", 1)[0] if "." in path else ROOT


def strip_wrapper_prefix(path: str, prefixes: Iterable[str] = ("module.", "_orig_mod.")) -> str:
    """Drop wrapper prefixes added by DDP/DeepSpeed ('module.') or torch.compile ('_orig_mod.')."""
    changed = True
    while changed:
        changed = False
        for prefix in prefixes:
            if path.startswith(prefix):
                path = path[len(prefix):]
                changed = True
    return path
