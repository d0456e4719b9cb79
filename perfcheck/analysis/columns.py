"""The reconciled frame's columns (``RECONCILED_COLUMNS``), the per-rank totals' (``TOTALS_COLUMNS``) and the
per-module rank summary's (``RANK_SUMMARY_COLUMNS``), and the module key every frame is joined on."""
from __future__ import annotations

import pandas as pd

from perfcheck.schema import MODULE_COMM_COLUMNS, PREDICTED_COLUMNS, ROOT, strip_wrapper_prefix

PHASES2 = ("fwd", "bwd")

_PER_PHASE = {
    "pred_{p}_s": "predicted {ph} time per step (from the estimate), seconds",
    "meas_{p}_s": "measured {ph} time per step, median over measured steps, seconds",
    "meas_{p}_s_min": "measured {ph} time per step, fastest measured step, seconds",
    "meas_{p}_s_max": "measured {ph} time per step, slowest measured step, seconds",
    "gap_{p}": "meas_{p}_s / pred_{p}_s: >1 slower than predicted (inf when predicted 0 but measured > 0)",
    "efficiency_{p}": "pred_{p}_s / meas_{p}_s: the fraction of the modelled roofline time reached",
    "achieved_flops_{p}_per_s": "flops_{p} (predicted) / meas_{p}_s; NaN when flagged above the datasheet peak",
    "achieved_bytes_{p}_per_s": "bytes_{p} (predicted) / meas_{p}_s: achieved device-memory bandwidth, B/s",
    "intensity_{p}": "arithmetic intensity flops_{p} / bytes_{p}, FLOP/byte (the roofline's x axis)",
    "kernels_{p}": "kernel launches (GPU) or aten ops incl. nested (CPU) per step in the module's subtree (kernel table); NaN without one",
    "kernel_{p}_s": "summed kernel time (GPU) or aten-op self time (CPU) per step in the subtree, seconds; NaN without a kernel table",
    "comm_kernel_{p}_s": "of kernel_{p}_s: communication kernels (nccl, gloo, c10d, all_reduce ...), seconds",
    "irregular_kernel_{p}_s": "of kernel_{p}_s: scatter/gather/index/sort kernels (irregular access), seconds",
    "irregular_kernels_{p}": "names of the largest irregular kernels, ','-joined",
    "reason_{p}": "why the {ph} gap is large (perfcheck.analysis.findings.REASONS); '' when the gap is within thresholds",
    "evidence_{p}": "the numbers behind reason_{p}, one sentence",
}

#: Column glossary of the reconciled frame (move to schema.py).
RECONCILED_COLUMNS = {
    "module": "module path (schema.ROOT for the root)",
    "type": "module class name",
    "depth": "0 for the root",
    "rank": "distributed rank of the measured side (the prediction is shared by all ranks unless it has a rank column)",
    "side": "both | predicted_only | measured_only: which frames have the module",
    "calls": "forward calls per step (predicted; measured where only measured)",
    "calls_measured": "forward calls per step, median over measured steps",
    "steps": "number of measured steps behind the medians",
    **{c: PREDICTED_COLUMNS[c] for c in ("params", "macs_fwd", "macs_bwd", "flops_fwd", "flops_bwd", "bytes_fwd",
                                         "bytes_bwd", "act_mem", "comm_fwd_bytes", "comm_bwd_bytes", "comm_kind",
                                         "bound_fwd", "bound_bwd", "source")},
    "unmodeled_ops": "aten ops the estimate costed by bytes only (no formula), ','-joined",
    "bound": "predicted bound of the phase with the larger predicted time",
    "meas_recompute_s": "measured activation-checkpoint recompute time per step, median, seconds",
    "pred_recompute_s": "predicted recompute time per step (the estimate's checkpointed forwards re-run in "
                        "backward), seconds; NaN for a prediction without the column",
    "flops_recompute": "predicted FLOPs of that recompute",
    "gap_recompute": "meas_recompute_s / pred_recompute_s (inf when none predicted but some measured)",
    "reason_recompute": "'recompute' or 'overestimated' when the recompute gap is large "
                        "(perfcheck.analysis.findings.diagnose_recompute); '' otherwise",
    "evidence_recompute": "the numbers behind reason_recompute, one sentence",
    "meas_eval_s": "measured eval forward time per step (module calls made with grad disabled outside a training "
                   "forward: a validation batch, an EMA/teacher call; schema.PHASES), median, seconds: kept out of "
                   "meas_fwd_s and never compared with a prediction; NaN for runs recorded before it was measured",
    "eval_calls": "eval forward calls per step, median over measured steps",
    "meas_act_mem_bytes": "measured activation memory of the forward (CUDA), bytes; NaN on CPU",
    "meas_peak_mem_bytes": "measured peak memory during the forward (CUDA), bytes; NaN on CPU",
    **{k.format(p=p): v.format(p=p, ph="forward" if p == "fwd" else "backward") for p in PHASES2 for k, v in _PER_PHASE.items()},
    **{k.format(p=p): v.format(p=p) for p in PHASES2 for k, v in MODULE_COMM_COLUMNS.items()},
    "efficiency": "(pred_fwd_s + pred_bwd_s) / (meas_fwd_s + meas_bwd_s)",
    "reason": "reason of the phase (fwd, bwd, recompute) with the largest gap (in log scale); not_measured / not_predicted for one-sided rows",
    "flags": "'+'-joined: fwd_rate_above_peak / bwd_rate_above_peak (FLOP/s above the datasheet matrix peak: a "
             "measurement artifact, achieved_flops blanked), fwd_bandwidth_above_peak / bwd_bandwidth_above_peak "
             "(bytes/s above the datasheet bandwidth: cache hits or a timer that missed work), bwd_not_measured "
             "(predicted backward but none measured), straggler (this rank is the slowest for the module, beyond "
             "the tolerance)",
}

#: Columns of ``totals_frame(rec)`` (one row per rank; also ``rec.attrs["totals"]``).
TOTALS_COLUMNS = {
    "rank": "distributed rank",
    "steps": "measured, non-failed steps behind the medians",
    "pred_fwd_s": "predicted forward time of the whole model (root row), seconds",
    "pred_bwd_s": "predicted backward time of the whole model, seconds",
    "pred_step_s": "pred_fwd_s + pred_bwd_s, seconds",
    "pred_optim_s": "the optimizer step predicted by the estimator (perfcheck.predict.host; its ``optimizer`` argument), seconds; NaN when the prediction has none",
    "meas_fwd_s": "measured forward time of the root, median per step, seconds",
    "meas_bwd_s": "measured backward time of the root, median per step, seconds",
    "meas_recompute_s": "measured recompute time, median per step, seconds",
    "meas_eval_s": "measured eval (grad-disabled) forward time of the step (steps.csv eval_s), median, seconds",
    "meas_optim_s": "measured time from the end of backward to the end of the step (optimizer, framework), median, seconds",
    "meas_step_s": "measured wall time of the step, median, seconds",
    "meas_bwd_finalize_s": "measured end-of-backward framework callbacks (DDP's gradient all-reduce wait, FSDP2's "
                           "reduce-scatter wait; steps.csv bwd_finalize_s), median, seconds: communication, not optimizer",
    "meas_comm_wait_s": "time waited on collectives per step: bwd_finalize_s (median over measured steps) + the waits "
                        "inside forward/backward (FSDP2 all-gathers, synchronous calls, DTensor waits; collectives.csv: "
                        "their share of the profiled steps' time applied to the measured median step, since the "
                        "profiler slows its steps; analysis.comm.in_step_waits), seconds",
    "profiled_step_s": "mean step time of the profiler window's active steps (steps.csv role 'profile'), seconds: the "
                       "step the per-module comm columns (per profiled step) belong to; NaN without them",
    "meas_compute_s": "measured step_s - bwd_finalize_s - the waits inside the step (meas_comm_wait_s: time outside "
                      "collective waits), median, seconds: DDP/FSDP make "
                      "step times equal over ranks, so the straggler is the rank with the most compute",
    "gap_fwd": "meas_fwd_s / pred_fwd_s",
    "gap_bwd": "meas_bwd_s / pred_bwd_s",
    "gap_fwd_bwd": "(meas_fwd_s + meas_bwd_s) / pred_step_s",
    "unexplained_s": "meas_step_s - meas_fwd_s - meas_bwd_s - meas_recompute_s - meas_eval_s (medians): time no module "
                     "explains, seconds",
    "unexplained_share": "unexplained_s / meas_step_s",
    "optim_share": "meas_optim_s / meas_step_s (part of the unexplained share)",
    "other_s": "unexplained_s - meas_optim_s - meas_bwd_finalize_s: loss, data loading, framework and idle time "
               "before/between phases, seconds",
    "optimizer_kernel_s": "kernel/op time attributed to the optimizer per profiled step (kernel table), seconds",
    "unattributed_kernel_s": "kernel/op time outside every module and the optimizer per profiled step, seconds",
    **{f"minor_faults_{p}": f"minor page faults per step {w} (steps.csv minor_faults_{p}), median over measured steps"
       for p, w in (("fwd", "in the forward"), ("bwd", "in the backward"), ("optim", "after the backward (optimizer)"),
                    ("step", "in the whole step"))},
    "major_faults_step": "major page faults (read from disk) per step, median over measured steps",
    "fault_cost_s": "seconds one minor fault cost on the run's machine (meta.json page_faults.cost, measured by "
                    "perfcheck.measure.fault_cost); NaN when not measured",
    "page_bytes": "bytes one fault maps (the page size, meta.json page_faults.page_bytes)",
    "hook_overhead_share": "instrumented / bare step time - 1 (medians; NaN without bare steps): what the hooks cost",
    "bare_steps": "steps run without hooks (the overhead A/B)",
    "slowest": "True for the rank with the largest meas_compute_s (meas_step_s where compute is unknown)",
    "straggler": "True when the slowest rank's compute time (step less collective waits) exceeds the median over ranks by "
                 "more than Thresholds.straggler_tolerance",
}

#: Columns of ``rank_summary(rec)``: one row per module over ranks.
RANK_SUMMARY_COLUMNS = {
    "module": "module path", "type": "module class name", "depth": "0 for the root", "ranks": "ranks measured",
    **{f"meas_{p}_s_{s}": f"measured {p} time per step, {s} over ranks, seconds" for p in PHASES2
       for s in ("min", "median", "max")},
    **{f"slowest_rank_{p}": f"rank with the largest measured {p} time" for p in PHASES2},
    "straggler": "the slowest rank's fwd+bwd exceeds the median over ranks by more than the tolerance",
}


def module_paths(series: pd.Series) -> pd.Series:
    s = series.fillna("").astype(str).map(strip_wrapper_prefix)
    return s.where(s != "", ROOT)
