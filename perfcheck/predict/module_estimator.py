"""perfcheck.estimate(model, example_inputs, ...): the predicted table, one row per module.

Pipeline: trace one fake forward (trace.py) -> cost every aten op with the registry
(aten_costs.py -> formulas.py) -> time each op on the system's roofline (roofline.py) -> add each
op into every module on the stack when it ran, so a container's row includes its children *and*
the functional ops its own forward calls (a residual add, F.relu, a matmul) -> put each op's host
cost (dispatch, autograd, module calls) beside its device time on two timelines (host.py:
``timeline_*_s``) -> add communication (``comm_*_s``) -> ``combine.predicted_times``, the one writer
of ``pred_fwd_s``/``pred_bwd_s``. Columns are documented in perfcheck.schema.PREDICTED_COLUMNS.
Where each term of a module's time comes from: docs/model.md.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import torch

from perfcheck.errors import UserError
from perfcheck.hardware.labels import datasheet_default, spec_label
from perfcheck.model_paths import module_paths, unwrap
from perfcheck.predict import collectives, reuse, roofline, trace as tracing, zero
from perfcheck.predict.aten_costs import cost_of, matmul_path_min_dim, op_class, sdpa_cost
from perfcheck.predict.cold_curves import l3_loss
from perfcheck.predict.combine import predicted_times
from perfcheck.predict.formulas import ZERO
from perfcheck.predict.gemm_calls import weight_gemm_calls
from perfcheck.predict.grad_accumulation import ACCUMULATE_NAME
from perfcheck.hardware.systems import SystemSpec, host_constants, normalize_dtype, spec_of, torch_dtype
from perfcheck.predict.host import add_host_columns
from perfcheck.predict.gemm_operands import gemm_dims, gemm_min_dim, gemm_unaligned
from perfcheck.schema import module_depth, parent_path, PREDICTED_COLUMNS, PREDICTED_EXTRA_COLUMNS


def _dtype_of(model, dtype):
    if dtype is not None:
        dt = torch_dtype(dtype)
        if not isinstance(dtype, torch.dtype) and normalize_dtype(dtype) == "tf32":
            # its peaks would be read as fp32's (the dtype is taken from the tensors): refused, as before
            raise UserError(f"dtype: {dtype!r} is fp32 tensors with TF32 matmuls, not a tensor dtype; give fp32")
        return dt
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def default_system_name():
    """The spec a prediction given no system uses: the datasheet entry of the device this process would
    run on (a GPU's by name, else ``cpu``), labelled as a default. A prediction reads no cache and never
    calibrates: the edges (``perfcheck.estimate``, PerfCheck, the CLI) resolve this machine's calibration
    and pass it in (``perfcheck.hardware.cache.resolve_system``)."""
    return datasheet_default()


def _param_count(module) -> int:
    seen, total = set(), 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += int(getattr(p, "ds_numel", 0) or p.numel())
    return total


def _op_table(trace, causal: bool) -> pd.DataFrame:
    """One row per traced op with its forward and backward cost and how it was resolved."""
    rows = []
    for i, op in enumerate(trace.ops):
        attn = (float("nan"),) * 3  # key length, head dim, causal of a fused attention kernel (roofline curves)
        if op.sdpa or op.call.name in _FLASH_SDPA:
            q, k, v = op.call.args[:3]
            counted_causal = causal and (op.causal or _is_causal(op.call))
            cost, source = sdpa_cost(q, k, v, causal=counted_causal), "modeled"
            attn = (float(k.shape[-2]), float(q.shape[-1]), float(counted_causal))
        else:
            resolved = cost_of(op.call)
            cost, source = resolved.cost, resolved.source
        if source == "free":
            continue
        if op.backward_only:  # the engine's add of two gradients (predict.grad_accumulation), a kernel's copy of a
            cost = replace(cost, fwd=ZERO, bwd=cost.fwd)  # permuted gradient (predict.relayout): backward only
        elif not op.backward:  # autograd never differentiates it (no_grad, .detach()'d, frozen)
            cost = replace(cost, bwd=ZERO)
        rows.append((i, ACCUMULATE_NAME if op.grad_accumulate else op.call.name, source, cost.fwd.macs, cost.fwd.flops, cost.fwd.bytes, cost.fwd.kernels,
                     cost.bwd.macs, cost.bwd.flops, cost.bwd.bytes, cost.bwd.kernels, _min_dim(op.call),
                     op.recompute, cost.fwd.rows, cost.bwd.rows, gemm_unaligned(op.call),
                     gemm_dims(op.call), op_class(op.call), cost.fwd.gemms, cost.bwd.gemms, *attn,
                     cost.fwd.pages, cost.bwd.pages, cost.fwd.strided_elems, cost.bwd.strided_elems,
                     cost.fwd.strided_bytes, cost.bwd.strided_bytes,
                     weight_gemm_calls(op.call) if op.backward and not op.backward_only else 0.0,
                     gemm_rows_n(op.call)))
    return pd.DataFrame(rows, columns=["op", "name", "source", "macs_fwd", "other_fwd", "bytes_fwd", "kernels_fwd",
                                       "macs_bwd", "other_bwd", "bytes_bwd", "kernels_bwd", "min_dim", "recompute",
                                       "rows_fwd", "rows_bwd", "unaligned", "gemm",
                                       "op_class", "gemms_fwd", "gemms_bwd", "attn_seq", "attn_head_dim",
                                       "attn_causal", "pages_fwd", "pages_bwd", "strided_elems_fwd",
                                       "strided_elems_bwd", "strided_bytes_fwd", "strided_bytes_bwd",
                                       "weight_gemm_calls_bwd", "gemm_n"])


def _min_dim(call) -> float:
    """The GEMMs' smallest dimension of a matmul-family op, or of a convolution torch runs as per-sample GEMMs on a
    CPU (``aten_costs.matmul_path_min_dim``; the roofline applies it there on a CPU spec only); NaN otherwise."""
    d = gemm_min_dim(call)
    return d if d == d else matmul_path_min_dim(call)


#: Fused attention ops the CPU dispatcher picks itself (args q, k, v, dropout_p, is_causal, ...).
_FLASH_SDPA = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention")


def gemm_rows_n(call) -> float:
    """The length of the output rows a GEMM op writes (``gemm_shape.narrow_factors``): a matmul-family call's n, a
    matmul-path convolution's output pixels per sample (torch's per-sample GEMMs on a CPU: ``aten_costs.
    matmul_path_min_dim``); NaN for any other op."""
    dims = gemm_dims(call)
    if dims is not None:
        return float(dims[3])
    if matmul_path_min_dim(call) == matmul_path_min_dim(call):  # a matmul-path convolution
        return float(math.prod(call.outputs[0].shape[2:]))
    return float("nan")


def _is_causal(call) -> bool:
    if call.name not in _FLASH_SDPA:
        return False
    return bool(call.arg(4, "is_causal", False))


def _time_ops(ops: pd.DataFrame, spec: SystemSpec, dtype, trace=None) -> pd.DataFrame:
    """Device time per op: roofline + the device-side per-kernel time (host work is perfcheck.predict.host's);
    with ``trace``, each op's share of operands evicted from L2 first (``reuse.cold_shares``: columns
    ``cold_fwd``/``cold_bwd``, read by the roofline: a matrix product's rate, a memory-bound op's memory term), and
    on a CPU whose calibration measured a small L3 the share from beyond it (``reuse.far_shares``: ``far_fwd``,
    ``far_bwd``, a memory-bound op's refetch at memory's rate)."""
    cache = roofline.cold_cache_bytes(spec)
    if trace is not None and cache > 0:
        # the memory terms' forward share also counts the op's fresh outputs (write-allocate of a new allocation)
        ops["cold_fwd"], ops["cold_bwd"], ops["cold_memory_fwd"] = reuse.all_cold_shares(trace, ops, cache)
    launch = host_constants(spec)["device_kernel_s"]
    l3, _ = roofline.far_data(spec)
    if trace is not None and l3 > 0:
        # data from beyond the L3 (reuse.far_shares): by distance, or by the time since its last touch (the L3's loss
        # curve at that age, cold_curves.l3_loss), which needs the ops' times: a first timing without it, then the
        # shares
        ops = roofline.op_device_times(ops, spec, dtype, launch_s=launch)
        ops["far_fwd"], ops["far_bwd"] = reuse.far_shares(trace, ops, l3, l3_loss(spec))
    return roofline.op_device_times(ops, spec, dtype, launch_s=launch)


def _membership(trace, ops: pd.DataFrame) -> pd.DataFrame:
    """(module, op row) pairs: every op counts in every module on its stack, once."""
    pairs = [(path, row) for row, op_index in enumerate(ops["op"].to_numpy())
             for path in dict.fromkeys(trace.ops[op_index].stack)]
    return pd.DataFrame(pairs, columns=["module", "row"])


def _dominant_bound(members: pd.DataFrame, ops: pd.DataFrame, phase: str) -> pd.Series:
    rows = members["row"].to_numpy(dtype="int64")  # int even when empty (a model that runs no aten op)
    t = ops[f"t_{phase}"].to_numpy()[rows]
    b = ops[f"bound_{phase}"].to_numpy()[rows]
    by = pd.DataFrame({"module": members["module"].to_numpy(), "bound": b, "t": t})
    by = by[by["t"] > 0].groupby(["module", "bound"])["t"].sum().reset_index()
    return by.sort_values("t", ascending=False).drop_duplicates("module").set_index("module")["bound"]


def check_model(model) -> torch.nn.Module:
    """``model`` if it is an nn.Module instance; anything else (a class name, a class) is a UserError."""
    if not isinstance(model, torch.nn.Module):
        hint = " (build it first, e.g. perfcheck.examples.models.Net())" if isinstance(model, (str, type)) else ""
        raise UserError(f"model: expected a torch.nn.Module instance, got {type(model).__name__} {model!r:.60}{hint}")
    return model


def estimate(model: torch.nn.Module, example_inputs, *, system=None, dtype=None, parallel=None,
             causal: bool = False, kwargs=None, optimizer="sgd", step_other_s: float = 0.0) -> pd.DataFrame:
    """Predict FLOPs, bytes, activation memory and time per module for one training step.

    model: any nn.Module (real, or built on the meta device: nothing is computed or allocated).
    example_inputs: what ``model(*example_inputs)`` takes (tensors on any device, or meta).
    system: a name from ``perfcheck systems``, a JSON path or a SystemSpec (default: this device).
    dtype: element type to assume for floating tensors and peak FLOP/s (default: the model's).
    parallel: a ParallelConfig; data parallel / ZeRO communication is added per module.
    causal: count causal SDPA calls at half their products (FlopCounterMode counts them in full).
    optimizer: the optimizer whose step ``pred_optim_s`` predicts: a name (any torch.optim class in lower case
      with its variants, e.g. sgd, sgd_momentum, adamw, rmsprop_momentum; suffix -foreach/-fused/-for-loop:
      perfcheck.predict.optimizers) or a torch.optim instance (perfcheck.predict.host.optimizer_kind); None
      for one that is not modelled (``pred_optim_s`` NaN).
    step_other_s: seconds per step outside the model's ops and its optimizer step (a training engine's own host
      work and collectives, e.g. DeepSpeed's: ``analysis.stage_prediction.outside_model_s``; data loading).
      Only the host model's far rule reads it: how long ago each op family last ran when the step comes round
      again (``host.add_host_columns``), on a CPU whose L3 forgets with time; elsewhere it changes nothing.
    Returns a DataFrame with the columns of ``perfcheck.schema.PREDICTED_COLUMNS`` plus
    ``PREDICTED_EXTRA_COLUMNS`` (``unmodeled_ops``, ``kernels_fwd``, ``kernels_bwd``); ``attrs``
    names the system, whether it was calibrated, and the dtype.
    """
    return finish(estimate_terms(model, example_inputs, system=system, dtype=dtype, parallel=parallel,
                                 causal=causal, kwargs=kwargs, optimizer=optimizer, step_other_s=step_other_s))


def estimate_terms(model: torch.nn.Module, example_inputs, *, system=None, dtype=None, parallel=None,
                   causal: bool = False, kwargs=None, optimizer="sgd", step_other_s: float = 0.0) -> pd.DataFrame:
    """``estimate``'s per-module frame before its time is combined: every column but ``pred_fwd_s``,
    ``pred_bwd_s``, ``bound_fwd`` and ``bound_bwd``, plus the terms ``combine.predicted_times`` makes them of
    (``combine.TERM_COLUMNS``). ``finish`` turns it into ``estimate``'s table; a torch-native layout adds its
    collectives to the comm columns in between (``distributed.estimate_sharded``)."""
    check_model(model)
    spec = spec_of(system if system is not None else default_system_name())  # resolved once, passed down typed
    dt = _dtype_of(model, dtype)
    elem_bytes = torch.tensor([], dtype=dt).element_size() if dtype is not None else None
    model = unwrap(model)
    trace = tracing.trace_model(model, example_inputs, elem_bytes=elem_bytes, kwargs=kwargs,
                                fused_dropout=spec.kind != "cpu")
    ops = _time_ops(_op_table(trace, causal), spec, dt, trace)
    members = _membership(trace, ops)
    joined = ops.iloc[members["row"].to_numpy()].reset_index(drop=True)
    joined["module"] = members["module"].to_numpy()
    joined["counted"] = joined["source"] == "counted"
    # Activation checkpointing re-runs these forwards during backward (measured as `recompute`).
    rec = joined["recompute"].to_numpy(bool)
    joined["macs_rec"] = np.where(rec, joined["macs_fwd"], 0.0)
    joined["other_rec"] = np.where(rec, joined["other_fwd"], 0.0)
    joined["t_rec"] = np.where(rec, joined["t_fwd"], 0.0)
    sums = joined.groupby("module").agg(
        macs_fwd=("macs_fwd", "sum"), macs_bwd=("macs_bwd", "sum"), other_fwd=("other_fwd", "sum"),
        other_bwd=("other_bwd", "sum"), bytes_fwd=("bytes_fwd", "sum"), bytes_bwd=("bytes_bwd", "sum"),
        counted=("counted", "any"),
        kernels_fwd=("kernels_fwd", "sum"), kernels_bwd=("kernels_bwd", "sum"),
        macs_recompute=("macs_rec", "sum"), other_rec=("other_rec", "sum"), pred_recompute_s=("t_rec", "sum"))
    # Names of the ops costed by bytes alone, per module: grouped over those rows only (a Python
    # aggregate over every module took ~0.3 s of a 1,000-module estimate; bench/RESULTS.md).
    unmodeled = joined.loc[joined["source"] == "unmodeled", ["module", "name"]].drop_duplicates()
    names = unmodeled.sort_values("name").groupby("module", sort=False)["name"].agg(",".join)
    sums["unmodeled_ops"] = pd.Series(sums.index.map(names), index=sums.index, dtype="str")
    modules = {path: mod for path, mod in _named(model)}
    frame = pd.DataFrame({"module": trace.order})
    frame["type"] = [trace.types[p] for p in trace.order]
    frame["depth"] = [module_depth(p) for p in trace.order]
    frame["calls"] = [trace.calls[p] for p in trace.order]
    frame["params"] = [_param_count(modules[p]) if p in modules else 0 for p in trace.order]
    frame = frame.join(sums, on="module")
    for col in ("macs_fwd", "macs_bwd", "other_fwd", "other_bwd", "bytes_fwd", "bytes_bwd", "kernels_fwd", "kernels_bwd", "macs_recompute", "other_rec", "pred_recompute_s"):
        frame[col] = frame[col].fillna(0.0)
    frame["flops_recompute"] = 2 * frame["macs_recompute"] + frame["other_rec"]
    frame["flops_fwd"] = 2 * frame["macs_fwd"] + frame["other_fwd"]
    frame["flops_bwd"] = 2 * frame["macs_bwd"] + frame["other_bwd"]
    frame["act_mem"] = [float(sum(trace.saved.get(p, {}).values())) for p in trace.order]
    frame["roofline_bound_fwd"] = frame["module"].map(_dominant_bound(members, ops, "fwd")).fillna("overhead")
    frame["roofline_bound_bwd"] = frame["module"].map(_dominant_bound(members, ops, "bwd")).fillna("overhead")
    frame["source"] = np.where(frame["counted"].fillna(False).astype(bool), "counted", "modeled")
    frame["unmodeled_ops"] = frame["unmodeled_ops"].fillna("")
    frame = add_host_columns(frame, trace, ops, spec, modules, optimizer, dt, step_other_s)  # host terms, timelines
    frame = _add_communication(frame, model, modules, parallel, spec, dt)
    # Which ceilings produced the times: every report prints "NAME (calibrated|datasheet)".

    frame.attrs.update(system=spec.name, calibrated=bool(spec.calibrated), dtype=str(dt).replace("torch.", ""),
                       system_label=spec_label(spec))
    return frame


def finish(terms: pd.DataFrame, comm_bound: bool = True) -> pd.DataFrame:
    """The predicted table from ``estimate_terms``' frame (after any collectives a layout adds to its
    ``comm_*`` columns): each module's time and bound written by ``combine.predicted_times`` (``comm_bound``:
    False for a torch-native layout's collectives, see there), then the columns of ``PREDICTED_COLUMNS`` and
    ``PREDICTED_EXTRA_COLUMNS``."""
    frame = predicted_times(terms, comm_bound)
    out = frame[list(PREDICTED_COLUMNS) + list(PREDICTED_EXTRA_COLUMNS)].reset_index(drop=True)
    out.attrs.update(terms.attrs)
    return out


def _named(model):

    paths = module_paths(model)
    return [(paths[id(m)], m) for m in {id(m): m for m in model.modules()}.values()]


def _add_communication(frame, model, modules, parallel, spec, dtype) -> pd.DataFrame:
    """Data-parallel / ZeRO collectives per module (by the parameters it owns directly): ``comm_p_bytes``,
    ``comm_kind`` and their seconds ``comm_p_s`` (a term of ``combine.predicted_times``)."""
    frame["comm_fwd_bytes"] = 0.0
    frame["comm_bwd_bytes"] = 0.0
    frame["comm_kind"] = ""
    frame["comm_fwd_s"] = 0.0
    frame["comm_bwd_s"] = 0.0
    if parallel is None:
        return frame
    if parallel.tp > 1 or parallel.pp > 1:
        raise NotImplementedError(
            "estimate(): tensor/pipeline parallelism needs the model's sharding plan, which an arbitrary "
            "nn.Module does not declare; use perfcheck.estimate_transformer for TP/SP/PP layouts, or parallelise "
            "the model with DTensor (parallelize_module; a fake process group will do: perfcheck.predict."
            "distributed.fake_process_group) and estimate that model with parallel=None: it is costed per rank")
    if parallel.dp == 1:
        return frame

    param_bytes = torch.tensor([], dtype=dtype).element_size()
    own = frame["module"].map(lambda p: sum(int(getattr(q, "ds_numel", 0) or q.numel())
                                            for q in modules[p].parameters(recurse=False)) if p in modules else 0)
    comm = zero.module_comm(own.to_numpy(float), stage=parallel.zero_stage, dp=parallel.dp,
                            param_bytes=param_bytes, grad_bytes=param_bytes)
    # A container's collectives include its children's, like its FLOPs.
    frame["comm_fwd_bytes"] = _inclusive(frame, comm["fwd_bytes"])
    frame["comm_bwd_bytes"] = _inclusive(frame, comm["bwd_bytes"])
    frame["comm_kind"] = np.where(frame["comm_fwd_bytes"] + frame["comm_bwd_bytes"] > 0, comm["kind"], "")

    for phase in ("fwd", "bwd"):
        t_comm = collectives.collective_time_s(comm[f"{phase}_kind"], frame[f"comm_{phase}_bytes"].to_numpy(float),
                                               parallel.dp, spec)
        frame[f"comm_{phase}_s"] = np.where(frame[f"comm_{phase}_bytes"].to_numpy() > 0, t_comm, 0.0)
    return frame


def _inclusive(frame: pd.DataFrame, own: np.ndarray) -> np.ndarray:
    """Sum a per-module quantity over each module's subtree: add every row into its ancestors."""
    index = {p: i for i, p in enumerate(frame["module"])}
    total = np.array(own, dtype=float)
    for i, path in enumerate(frame["module"]):
        parent = parent_path(path)
        while parent is not None:
            if parent in index:
                total[index[parent]] += own[i]
            parent = parent_path(parent)
    return total
