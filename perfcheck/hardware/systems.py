"""Hardware systems as data: a name-or-path loader returning a frozen, validated ``SystemSpec``.

One JSON file per system lives in ``perfcheck/hardware/specs/`` (``configs/systems`` links to it),
with units in every key and a source for every number, so adding a GPU is a one-file change
(the llm-analysis ``gpu_configs/*.json`` / Calculon ``systems/*.json`` style). ``perfcheck
calibrate`` writes files in the same format (``SystemSpec.to_json_dict``), and a path to such a
file is accepted wherever a system name is.

Conventions (each a common source of 2x errors):

* FLOP/s are DENSE datasheet peaks; "with sparsity" figures are halved before they go in.
* Link bandwidths are per GPU and ONE direction (NVLink 900 GB/s bidirectional -> 450e9), the
  figure NCCL's bus bandwidth is compared with (nccl-tests ``doc/PERFORMANCE.md``).
* Decimal units: GB = 1e9 bytes, TB/s = 1e12 bytes/s; capacities are the datasheet's decimal GB.
* ``efficiency`` holds achievable fractions of peak, in (0, 1]; times are peak * efficiency.

Bad input raises ``perfcheck.errors.UserError`` with one line naming the file and field.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import types
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Tuple

from perfcheck.errors import UserError, check_keys, parse_json
from perfcheck.hardware.host_keys import ZERO_PHASES, ZERO_STAGES, op_cold_key, zero_key
from perfcheck.parallel import COLLECTIVE_KINDS

#: Canonical dtype names a system can list peaks for.
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")

#: Efficiency keys every system must give (achievable fraction of the matching peak).
EFFICIENCY_KEYS = ("matrix", "vector", "memory", "intra_node", "inter_node")
#: Optional per-dtype matrix efficiency overrides, e.g. ``"matrix_fp8": 0.71`` (FP8 GEMMs reach a
#: lower fraction of peak than BF16 ones on H100: 70.9% vs 80.3%, ml-engineering MAMF table).
#: ``matrix_unaligned``: the fraction of the aligned rate a GEMM keeps when a row stride of its operands
#: or output (k or n elements) is not a multiple of 16 bytes (perfcheck.predict.gemm_operands.gemm_unaligned):
#: cuBLAS then cannot use its fastest (16-byte vector load) tensor-core kernels. Measured by ``perfcheck
#: calibrate`` on a GPU (GPT-2's 50257-wide lm_head ran ~6x below the model on an H100, 2026-11-23).
#: ``matrix_unaligned_bwd``: the same for the backward's two GEMMs (default: ``matrix_unaligned``).
#: ``matrix_sustained``: the fraction of its first-second GEMM rate a GPU holds once it has run GEMMs back to
#: back for minutes, as training does (power and thermal limits lower the clock): it multiplies every matrix
#: efficiency of the spec (``SystemSpec.matrix_efficiency``). Measured, not fitted: a 40-second loop of
#: 8192^3 fp16 products (bench/gemm_shapes_gpu.py; 0.904 on one H100 80GB HBM3, bench/results/h100_gemm_shapes.json).
#: ``matrix_beside_collective``: the fraction of its rate a GEMM keeps while an NCCL collective runs beside it
#: (the collective's kernels hold SMs: (SMs - NCCL channels) / SMs; perfcheck.predict.step's asynchronous
#: backward). Absent: 1 (perfect concurrency).
OPTIONAL_EFFICIENCY_KEYS = tuple(f"matrix_{d}" for d in DTYPES) + ("matrix_unaligned", "matrix_unaligned_bwd",
                                                                   "matrix_sustained", "matrix_beside_collective")

SYSTEM_KINDS = ("gpu", "cpu")

_REQUIRED = (
    "name", "description", "kind", "matrix_flops_per_s", "vector_flops_per_s",
    "mem_bandwidth_bytes_per_s", "mem_capacity_bytes", "intra_node_bandwidth_bytes_per_s",
    "gpus_per_node", "inter_node_bandwidth_bytes_per_s", "launch_overhead_s", "efficiency",
)
_OPTIONAL = ("matrix_efficiency_curve", "matrix_efficiency_curve_dtype", "matrix_shape_curve", "matrix_cold_curve",
             "memory_cold_curve",
             "mem_bandwidth_curve", "host", "op_fixed_s",
             "op_efficiency", "op_efficiency_curve", "op_row_s", "op_flop_s", "module_fixed_s", "calibrated",
             "sources", "calibration", "matrix_wide_curve", "matrix_narrow_curve", "attention_kernel_curve", "strided_elements_per_s",
             "collective_busbw_curve")
#: Keys of a calibrated spec's ``calibration`` record: when and under what load ``perfcheck calibrate`` measured
#: it (perfcheck/calibrate/sanity.py writes and checks it; every report header prints it).
CALIBRATION_KEYS = {
    "taken_utc": "when the calibration finished (ISO 8601, UTC)",
    "mode": "quick, default or full",
    "clock": "wall or process (perfcheck/calibrate/cases.py CLOCKS)",
    "threads": "CPU intra-op threads the cases ran with (none on a GPU)",
    "cores": "logical CPUs of the machine (os.cpu_count)",
    "load_1m": "1-minute load average when it started (os.getloadavg)",
    "others_cores": "mean CPU cores other processes used while it ran (system busy time less this process's, "
                    "over the wall time)",
    "wall_s": "seconds it took",
    "forced": "true when it was kept in the cache against the sanity checks (perfcheck calibrate --force)",
    "l2_bytes": "a core's L2 cache in bytes (Linux sysfs; CPU): a step whose working set exceeds "
                "it runs its GEMMs and memory-bound ops on evicted operands (``matrix_cold_curve``, "
                "``memory_cold_curve``)",
    "l3_bytes": "the L3 cache in bytes as Linux's sysfs gives it for CPU 0 (CPU; the far round-robin evicted 4x "
                "it): an op whose family last ran more than this much data ago pays ``host.op_cold_far_s``",
    "l3_lost": "((seconds asleep, share of an eviction's refetch cost lost), ...): the residency cases' re-reads of a "
               "quarter of the L3 after each sleep (CPU; calibrate/op_cases.l3_residency_cases): the L3's loss "
               "curve the far-data rules read (predict/cold_curves.loss_curve)",
    "reference_s": "seconds of the reference tiny add every case was read against (CPU; "
                   "perfcheck/calibrate/repeats.py anchor_s)",
    "compute_reference_s": "seconds of the compute reference (a 128^3 fp32 mm) every kernel case was read against "
                           "(CPU; perfcheck/calibrate/repeats.py)",
    "reference_statistic": "which statistic of the reference readings reference_s and compute_reference_s are "
                           "(perfcheck/calibrate/repeats.py ANCHOR_STATISTICS)",
    "reference_spread": "90th over 10th percentile of the reference readings: how far the machine's phase moved "
                        "while it ran (1.0: steady)",
}
#: Phases an ``op_row_s`` entry prices: the op's forward kernel and its backward kernel (seconds per row).
ROW_PHASES = ("fwd", "bwd")
#: Retired by the held-out pruning (bench/results/pruning.md): the row-wise ops' per-row terms (softmax,
#: log_softmax, layer norm, nll_loss: a row, a full SIMD vector, a tail element, a partial vector) and the SIMD
#: width they were priced with moved no held-out model's step. An older spec file or calibration cache carrying
#: them loads without them.
RETIRED_ROW_OPS = frozenset({"_log_softmax", "_softmax", "native_layer_norm", "nll_loss_forward"})
RETIRED_ROW_TERMS = frozenset(f"{ph}_{t}" for ph in ROW_PHASES for t in ("vector", "tail", "partial"))
RETIRED_FIELDS = frozenset({"simd_bytes"})
#: ``module_fixed_s`` classes retired by the same pruning: removing each class's entry moved no held-out model's
#: step in three runs (Conv1d/Conv2d and BatchNorm1d/2d stay). An older file's entries for them are dropped.
RETIRED_MODULE_FIXED = frozenset({"Linear", "LayerNorm", "Embedding", "ReLU", "GELU", "Dropout", "MaxPool2d"})

#: Low-precision dtypes with host terms of their own (``op_cold_<dtype>_s``; ``op_fixed_s`` keys ``<op>@<dtype>``):
#: measured by perfcheck calibrate on CUDA (perfcheck/calibrate/cases.py HOST_DTYPES_CUDA); a spec
#: without them prices the dtype like fp32.
LOW_HOST_DTYPES = ("bf16", "fp16")

#: Host-side (framework) constants a spec may give in its ``host`` block, seconds; the estimator's
#: host model (perfcheck.predict.host) uses them. Missing keys come from ``host_defaults.json``.
HOST_KEYS = {
    "op_dispatch_s": "eager dispatch of one aten op that computes (dispatcher, allocation, kernel launch), per op",
    "view_dispatch_s": "eager dispatch of one view/metadata op (t, view, transpose, detach)",
    "op_cold_s": "extra host time of a computing op (a forward op or a backward node) whose op family differs from "
                 "the one run before it, as in a training step, over the same op repeated in a tight loop (its code "
                 "and data are no longer in the core's caches and predictors; perfcheck.predict.host.op_switches; "
                 "perfcheck/calibrate/cases.py op_cold_cases)",
    "op_cold_near_s": "op_cold_s for an op whose family ran at most a few light families ago (a recurrent layer's "
                      "time step; perfcheck.predict.family_reuse; perfcheck/calibrate/op_cases.py op_cold_near_cases); "
                      "read only where calibration measured it, else op_cold_s",
    "op_cold_light_s": "op_cold_near_s for a near op in a cycle of light families only (pointwise ops, copies, "
                       "splits, small GEMMs: a native GRU/RNN time step; perfcheck.predict.family_reuse.light_reuse; "
                       "perfcheck/calibrate/op_cases.py op_cold_light_cases); read only where calibration measured "
                       "it, else op_cold_near_s",
    "l3_residency_s": "how long data left in the L3 stays there while this process does other work (an L3 shared "
                      "with other tenants' cores decays; perfcheck/calibrate/op_cases.py l3_residency_cases): an op "
                      "whose family last ran longer ago pays op_cold_far_s (perfcheck.predict.host._far_shares; where "
                      "calibration kept the L3's loss curve, calibration.l3_lost, its share by age instead); "
                      "0: no decay measured",
    "op_cold_far_s": "op_cold_s for an op whose family last ran more than the L3 of data ago (calibration.l3_bytes): "
                     "its code and data come from memory (perfcheck.predict.family_reuse.far_reuse; "
                     "perfcheck/calibrate/op_cases.py op_cold_far_cases); read only where calibration measured it "
                     "and the L3",
    "step_start_s": "what a training step's first forward op pays beyond its far price (once per step): the module "
                    "call and autograd-recording path and the code the step before ran, cold (perfcheck/calibrate/"
                    "op_cases.py step_start_cases; perfcheck.predict.host); read only where calibration measured it, "
                    "else 0",
    **{op_cold_key(dt): f"op_cold_s for a model run in {dt} (measured on tensors needing a gradient; a spec that "
                          f"has no measured value uses op_cold_s)" for dt in ("bf16", "fp16")},
    "autograd_node_s": "extra forward host time of an op whose input needs a gradient (grad_fn node, saved tensors)",
    "backward_node_s": "autograd engine time per node evaluated in backward, beside its kernels' dispatch",
    "backward_call_s": "fixed cost of one loss.backward() (graph task, engine start)",
    "module_call_s": "Python cost of one nn.Module.__call__ (hook checks, forward frame)",
    "page_fault_s": "first touch of one 4 KiB page of a fresh mapping (a minor page fault: the kernel maps and "
                    "zeroes the page), per page; a CPU buffer of 32 MiB or more is mapped anew at every allocation "
                    "(perfcheck.predict.formulas.fresh_pages); perfcheck/calibrate/cases.py page_fault_cases",
    "sqrt_zero_s": "extra time of a square root per element whose value is exactly 0 (an adaptive optimizer's "
                   "second moment on embedding rows no batch reaches: the CPU's vectorized sqrt takes a slow path), "
                   "per element; perfcheck.predict.zero_rows; perfcheck/calibrate/cases.py sqrt_zero_cases",
    "optim_step_s": "fixed cost of one optimizer.step() + zero_grad(set_to_none=True) (torch.optim.SGD, for-loop)",
    "optim_sgd_foreach_step_s": "the same fixed cost for torch.optim.SGD's foreach implementation (its grouping of the "
                                "tensors by device and dtype and each _foreach_ op's launch: dearer than the for-loop's)",
    "optim_adam_step_s": "the same fixed cost for torch.optim.Adam/AdamW's for-loop implementation",
    "optim_adam_foreach_step_s": "the same fixed cost for torch.optim.Adam/AdamW's foreach implementation",
    "optim_sgd_per_tensor_s": "torch.optim.SGD for-loop implementation, host time per parameter tensor",
    "optim_sgd_foreach_per_tensor_s": "torch.optim.SGD foreach implementation, host time per parameter tensor",
    "optim_adam_per_tensor_s": "torch.optim.Adam/AdamW for-loop implementation, host time per parameter tensor",
    "optim_adam_foreach_per_tensor_s": "torch.optim.Adam/AdamW foreach implementation, host time per parameter tensor",
    "device_kernel_s": "device-side fixed time per kernel beyond the roofline (GPU launch gap; 0 on a CPU: "
                       "the same thread, counted in op_dispatch_s)",
    "collective_latency_s": "alpha: fixed time of one collective call (small-message all-reduce)",
    "collective_async_call_s": "time one more collective adds to a batch issued with async_op=True and waited "
                               "together (perfcheck/calibrate/collectives.py bench_sync_terms)",
    "collective_straggler_s": "mean wait of a rank for the latest rank at one blocking collective after equal work, "
                              "at collective_straggler_ranks ranks (perfcheck.predict.collectives.straggler_wait_s)",
    "collective_straggler_ranks": "the rank count collective_straggler_s was measured at (dimensionless, >= 2)",
    "zero_ranks": "the ranks per host DeepSpeed's zero<S>_* terms were measured at (dimensionless, >= 1; "
                  "perfcheck/calibrate/deepspeed_cases.py apply)",
    "process_slowdown_per_peer": "fraction by which one process's host/CPU work slows per other process like it "
                                 "on the same host (dimensionless; perfcheck/calibrate/concurrency.py)",
    # DeepSpeed's own host work per ZeRO stage S (0-3) and phase (fwd/bwd beyond the plain model's; step:
    # the whole engine.step(), optimizer included), measured by perfcheck/calibrate/deepspeed_cases.py
    **{zero_key(s, ph): f"ZeRO-{s} engine {ph}: fixed host seconds per {'step' if ph == 'step' else 'micro-step'}"
       for s in ZERO_STAGES for ph in ZERO_PHASES},
    **{zero_key(s, ph, "tensor"): f"ZeRO-{s} engine {ph}: host seconds per parameter tensor"
                                  f"{' (ZeRO-3: per persistent one)' if s == 3 else ''}"
       for s in ZERO_STAGES for ph in ZERO_PHASES},
    zero_key(3, "fwd", "module"): "ZeRO-3 pre/post-forward hooks (fetch, release, autograd wrappers) per module call",
    zero_key(3, "bwd", "module"): "ZeRO-3 pre/post-backward hooks per module call",
    **{zero_key(3, ph, "gather"): f"ZeRO-3 {ph}: host seconds per partitioned (non-persistent) parameter tensor, its "
                               f"fetch and release included (the all-gather itself is the collective model's)"
       for ph in ZERO_PHASES},
}
_FIELDS = _REQUIRED + _OPTIONAL

# Aliases -> canonical dtype. torch dtypes are matched by their str() ("torch.float32").
_DTYPE_ALIASES = {
    "fp64": "fp64", "float64": "fp64", "double": "fp64", "f64": "fp64",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "f32": "fp32",
    "tf32": "tf32", "tensorfloat32": "tf32",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16",
    "fp8": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8", "e4m3": "fp8", "e5m2": "fp8",
}

# A dtype without vector (non-matrix) units of its own runs its elementwise work in another one:
# TF32 only exists inside tensor cores (elementwise math is FP32); FP8 tensors are upcast.
_VECTOR_FALLBACK = {"tf32": ("fp32",), "fp8": ("fp16", "bf16", "fp32")}


def normalize_dtype(dtype) -> str:
    """Canonical dtype name ("fp32", "tf32", "bf16", "fp16", "fp8", "fp64") for a torch dtype or string.

    Raises UserError for anything else (integers, complex, unknown strings).
    """
    key = str(dtype).lower().strip()
    if key.startswith("torch."):
        key = key[len("torch."):]
    try:
        return _DTYPE_ALIASES[key]
    except KeyError:
        raise UserError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)} and torch float dtypes)") from None


#: Bytes per element of each canonical dtype (TF32 tensors are stored as FP32).
_ELEMENT_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def element_bytes(dtype) -> int:
    """Bytes per element of ``dtype`` (a torch dtype or a name ``normalize_dtype`` accepts)."""
    return _ELEMENT_BYTES[normalize_dtype(dtype)]


#: The torch dtype (its attribute name) tensors of each canonical dtype are made of: TF32 is FP32 storage
#: computed in tensor cores. FP8 has no one storage dtype (e4m3 and e5m2): a model cannot be built in it.
TORCH_DTYPE_NAMES = {"fp64": "float64", "fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def torch_dtype(dtype, field: str = "dtype"):
    """The torch dtype of ``dtype`` (a torch dtype, or a name ``normalize_dtype`` accepts: the one parser of
    dtype names); a UserError naming ``field`` for anything else."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        name = TORCH_DTYPE_NAMES[normalize_dtype(dtype)]
    except (UserError, KeyError):
        raise UserError(f"{field}: unknown {dtype!r}; use one of {', '.join(TORCH_DTYPE_NAMES)} "
                        "or a torch floating dtype") from None
    return getattr(torch, name)


@dataclasses.dataclass(frozen=True)
class SystemSpec:
    """One accelerator (or CPU) and its node: peaks, bandwidths, achievable efficiencies, sources.

    Mappings are stored read-only (``types.MappingProxyType``) and the curve as a tuple of pairs,
    so a loaded spec cannot drift. Construction validates every field; use ``dataclasses.replace``
    (it re-validates) to derive what-if variants.
    """

    name: str
    description: str
    kind: str
    matrix_flops_per_s: Mapping[str, float]
    vector_flops_per_s: Mapping[str, float]
    mem_bandwidth_bytes_per_s: float
    mem_capacity_bytes: float
    intra_node_bandwidth_bytes_per_s: float
    gpus_per_node: int
    inter_node_bandwidth_bytes_per_s: float
    launch_overhead_s: float
    efficiency: Mapping[str, float]
    matrix_efficiency_curve: Tuple[Tuple[float, float], ...] = ()
    #: the dtype whose matmuls ``matrix_efficiency_curve`` was measured on ("": unnamed, older files);
    #: ``perfcheck.predict.matrix_curve`` carries the curve to the other dtypes
    matrix_efficiency_curve_dtype: str = ""
    matrix_shape_curve: Tuple[Tuple[float, float], ...] = ()
    #: ((FLOPs per kernel, factor), ...): a GEMM's rate with its operands evicted from the core's L2 (as in a
    #: training step whose working set exceeds it: weights and saved activations come back from the last-level
    #: cache) over its rate in a tight loop; CPU calibration measures it (``perfcheck.calibrate.cases``'s
    #: ``matmul_cold_cases``), applied by ``perfcheck.predict.roofline.matrix_efficiency(cold=True)``
    matrix_cold_curve: Tuple[Tuple[float, float], ...] = ()
    #: ((bytes moved per kernel, f), ...): a memory-bound op's roofline memory term with its operands evicted from
    #: the core's L2 runs f of its tight-loop rate (the memory term is divided by f for the far share of its
    #: operands); CPU calibration measures it (``perfcheck.calibrate.cold_cases``), applied by
    #: ``perfcheck.predict.roofline.memory_time_s(cold=...)``; absent: no effect (an older spec, a GPU)
    memory_cold_curve: Tuple[Tuple[float, float], ...] = ()
    #: ((bytes moved per kernel, bandwidth factor), ...): a working set that fits a cache moves faster
    #: than the DRAM/HBM-sized copy ``mem_bandwidth_bytes_per_s`` is measured on (perfcheck.predict.roofline)
    mem_bandwidth_curve: Tuple[Tuple[float, float], ...] = ()
    host: Mapping[str, float] = dataclasses.field(default_factory=dict)
    op_fixed_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    op_efficiency: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: op_efficiency key (``efficiency.op_efficiency_key``, with ``:bwd`` for the backward) -> ((roofline seconds
    #: per kernel, efficiency), ...): a GPU kernel class's measured efficiency by size (LayerNorm, softmax,
    #: embedding and its backward, attention, convolution; perfcheck.calibrate.gpu_ops). Wins over
    #: ``op_efficiency`` for that key.
    op_efficiency_curve: Mapping[str, Tuple[Tuple[float, float], ...]] = dataclasses.field(default_factory=dict)
    #: torch.nn class name -> host seconds per call beyond its aten ops' predicted host terms (a
    #: standard module's Python: BatchNorm's running-stat bookkeeping, a convolution's checks;
    #: perfcheck.predict.host; the classes of RETIRED_MODULE_FIXED are dropped)
    module_fixed_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: aten op name -> {"fwd": s, "bwd": s} per row its forward / backward CPU kernel walks beyond its elements'
    #: roofline (an embedding's index, a convolution weight's reorder; perfcheck.predict.roofline.row_prices)
    op_row_s: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    #: aten op name (``efficiency.op_flop_key``: no in-place ``_``, no ``_foreach_``) -> seconds per formula FLOP
    #: of its forward kernel as calibration timed it with its operands hot (CPU ``oprate`` cases): the floor
    #: of that kernel's compute term, for ops whose per-element work outruns an add's (a square root, a division:
    #: perfcheck.predict.roofline.device_times, host.optimizer_time)
    op_flop_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: "fwd" | "bwd" -> ((output width n, factor), ...): a GEMM whose output is wide (n at least
    #: ``roofline.WIDE_RATIO`` x its other dimensions: an LM head) runs at this factor of the rate its FLOPs and shape
    #: curves give, in the phase (calibration's ``matmul_wide`` cases, CPU; roofline.wide_factors)
    matrix_wide_curve: Mapping[str, Tuple[Tuple[float, float], ...]] = dataclasses.field(default_factory=dict)
    #: ((output row length n, factor), ...): a GEMM writing rows of n < ``gemm_shape.NARROW_END`` elements (a CPU
    #: convolution's per-sample GEMMs over few pixels, a Linear to few outputs) runs at this factor of the rate its
    #: FLOPs and shape curves give (calibration's ``matmul_narrow`` cases, CPU; gemm_shape.narrow_factors)
    matrix_narrow_curve: Tuple[Tuple[float, float], ...] = ()
    calibrated: bool = False
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: when and under what load a calibrated spec was measured (``CALIBRATION_KEYS``); empty for a datasheet
    calibration: Mapping[str, object] = dataclasses.field(default_factory=dict)
    #: "d<head dim>:<causal|full>" -> ((sequence length, fraction), ...): the rate the fused attention kernel
    #: F.scaled_dot_product_attention runs on this GPU (FlashAttention-2 on an A100) sustains over its forward and
    #: backward, as a fraction of the dtype's dense matrix peak, FLOPs counted as its benchmark counts them
    #: (4 b h s^2 d forward, halved when causal; backward 2.5x). Measurements per GPU (sources); applied by
    #: ``perfcheck.predict.attention_kernel``. Absent: the kernel is priced as a GEMM.
    attention_kernel_curve: Mapping[str, Tuple[Tuple[float, float], ...]] = dataclasses.field(default_factory=dict)
    #: elements per second a GPU's elementwise kernels write off the vectorised loop (a broadcast, strided or
    #: widening operand: perfcheck.predict.strided; measured by bench/elementwise_gpu.py); 0: not modelled
    strided_elements_per_s: float = 0.0
    #: collective kind -> ((full buffer bytes S, bus bandwidth in B/s), ...): nccl-tests' measured busbw by message
    #: size for a group inside one node (sources), where the flat ``intra_node_bandwidth_bytes_per_s`` x
    #: ``efficiency.intra_node`` is the large-message figure; applied by ``perfcheck.predict.collectives.
    #: curve_time_s``. Absent (or a kind absent): the flat figure at every size.
    collective_busbw_curve: Mapping[str, Tuple[Tuple[float, float], ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        where = f"system {self.name!r}" if isinstance(self.name, str) else "system"
        for field, value in _validated_fields(self, where).items():
            object.__setattr__(self, field, value)

    def __hash__(self):
        return hash(json.dumps(self.to_json_dict(), sort_keys=True))

    # ---- peaks ---------------------------------------------------------------------------
    def matrix_peak(self, dtype) -> float:
        """Dense datasheet matrix (tensor-core) peak in FLOP/s for ``dtype``.

        ``fp32`` is the plain FP32 rate; ask for ``tf32`` when TF32 matmuls are enabled.
        Raises UserError naming the system and dtype when the system has no such unit.
        """
        d = normalize_dtype(dtype)
        try:
            return self.matrix_flops_per_s[d]
        except KeyError:
            raise UserError(
                f"system {self.name!r} has no matrix peak for dtype {d!r} "
                f"(it lists: {', '.join(self.matrix_flops_per_s)})") from None

    def vector_peak(self, dtype) -> float:
        """Non-matrix (elementwise/reduction) peak in FLOP/s for ``dtype``.

        TF32 falls back to FP32 and FP8 to FP16/BF16/FP32 (those dtypes have no vector units of
        their own); any other missing dtype raises UserError naming the system and dtype.
        """
        d = normalize_dtype(dtype)
        for candidate in (d,) + _VECTOR_FALLBACK.get(d, ()):
            if candidate in self.vector_flops_per_s:
                return self.vector_flops_per_s[candidate]
        raise UserError(
            f"system {self.name!r} has no vector peak for dtype {d!r} "
            f"(it lists: {', '.join(self.vector_flops_per_s)})")

    def matrix_efficiency(self, dtype) -> float:
        """Flat achievable fraction of the matrix peak for ``dtype``: the ``matrix_<dtype>`` override, else
        ``matrix``, times ``matrix_sustained`` (1 when absent: the rate a GPU holds in minutes of training)."""
        d = normalize_dtype(dtype)
        return self.efficiency.get(f"matrix_{d}", self.efficiency["matrix"]) * self.efficiency.get("matrix_sustained", 1.0)

    # ---- serialisation ---------------------------------------------------------------------
    def to_json_dict(self) -> dict:
        """Plain JSON-ready dict in the file format; ``load_system`` of it gives an equal spec."""
        out = {}
        for f in _FIELDS:
            value = getattr(self, f)
            if f in ("matrix_shape_curve", "matrix_cold_curve", "memory_cold_curve", "mem_bandwidth_curve", "host",
                     "op_fixed_s",
                     "op_efficiency", "op_efficiency_curve", "module_fixed_s", "op_row_s", "op_flop_s", "calibration",
                     "matrix_wide_curve", "matrix_narrow_curve",
                     "attention_kernel_curve", "matrix_efficiency_curve_dtype", "strided_elements_per_s",
                     "collective_busbw_curve") and not value:
                continue  # newer optional fields: absent when empty, so older files round-trip unchanged
            if f in ("op_efficiency_curve", "attention_kernel_curve", "matrix_wide_curve", "collective_busbw_curve"):
                value = {k: [list(p) for p in v] for k, v in value.items()}
            elif isinstance(value, types.MappingProxyType):
                value = {k: dict(v) if isinstance(v, types.MappingProxyType) else v for k, v in value.items()}
            elif f in ("matrix_efficiency_curve", "matrix_shape_curve", "matrix_cold_curve", "memory_cold_curve",
                       "mem_bandwidth_curve", "matrix_narrow_curve"):
                value = [list(p) for p in value]
            out[f] = value
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict(), indent=2) + "\n"

    def save(self, path) -> Path:
        """Write the spec as JSON (atomically: temp file + rename) and return the path."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)
        return path

    @classmethod
    def from_dict(cls, data: Any, where: str = "system") -> "SystemSpec":
        """Validate a parsed JSON object (unknown/missing keys, types, ranges) and build a spec."""
        if not isinstance(data, dict):
            raise UserError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if isinstance(data.get("sources"), Mapping):  # a retired field's source text goes with it
            data = {**data, "sources": {k: v for k, v in data["sources"].items()
                                        if not isinstance(k, str) or k.split(".", 1)[0] not in RETIRED_FIELDS}}
        data = {k: v for k, v in data.items() if k not in RETIRED_FIELDS}
        check_keys(data, _FIELDS, _REQUIRED, where, "the system")
        defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        _validated_fields(types.SimpleNamespace(**{**defaults, "sources": {}, "host": {}, "op_fixed_s": {},
                                                   "op_efficiency": {}, "op_efficiency_curve": {},
                                                   "module_fixed_s": {}, "op_row_s": {}, "op_flop_s": {},
                                                   "matrix_wide_curve": {},
                                                   "calibration": {},
                                                   "attention_kernel_curve": {},
                                                   "collective_busbw_curve": {},
                                                   **data}), where)
        return cls(**data)


# ---- validation ---------------------------------------------------------------------------------
def _number(value, field, where, *, allow_zero=False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{where}: {field} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise UserError(f"{where}: {field} must be {'>= 0' if allow_zero else 'positive'} and finite, got {value!r}")
    return value


def _fraction(value, field, where) -> float:
    value = _number(value, field, where)
    if value > 1:
        raise UserError(f"{where}: {field} = {value!r} is outside (0, 1]")
    return value


def _dtype_map(value, field, where) -> types.MappingProxyType:
    if not isinstance(value, Mapping) or not value:
        raise UserError(f"{where}: {field} must be a non-empty object of dtype -> FLOP/s")
    out = {}
    for key, v in value.items():
        if key not in DTYPES:
            raise UserError(f"{where}: {field} has unknown dtype {key!r} (known: {', '.join(DTYPES)})")
        out[key] = _number(v, f"{field}.{key}", where)
    return types.MappingProxyType(out)


def _efficiency(value, where) -> types.MappingProxyType:
    if not isinstance(value, Mapping):
        raise UserError(f"{where}: efficiency must be an object")
    check_keys(value, EFFICIENCY_KEYS + OPTIONAL_EFFICIENCY_KEYS, EFFICIENCY_KEYS, where, "efficiency")
    return types.MappingProxyType({k: _fraction(v, f"efficiency.{k}", where) for k, v in value.items()})


def _points(value, where, field: str, x_name: str, y_name: str, y_check) -> tuple:
    """A list of [x, y] pairs with strictly increasing x (``y_check(y, name, where)`` validates y)."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise UserError(f"{where}: {field} must be a list of [{x_name}, {y_name}] pairs")
    points = []
    for i, pair in enumerate(value):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise UserError(f"{where}: {field}[{i}] must be a [{x_name}, {y_name}] pair, got {pair!r}")
        points.append((_number(pair[0], f"{field}[{i}][0]", where), y_check(pair[1], f"{field}[{i}][1]", where)))
    for i in range(1, len(points)):
        if points[i][0] <= points[i - 1][0]:
            raise UserError(f"{where}: {field} is not sorted by strictly increasing {x_name} at index {i}")
    return tuple(points)


def _curve(value, where) -> tuple:
    """[[flops per kernel, efficiency], ...]: the matrix efficiency curve."""
    return _points(value, where, "matrix_efficiency_curve", "flops_per_kernel", "efficiency", _fraction)


def _factor_at_most(limit: float):
    """A validator for a curve's multiplier: a positive number at most ``limit``."""
    def check(value, name, where) -> float:
        factor = _number(value, name, where)
        if factor > limit:
            raise UserError(f"{where}: {name} = {factor!r} is outside (0, {limit:g}]")
        return factor
    return check


def _curve_dtype(spec, where) -> str:
    """``matrix_efficiency_curve_dtype``: "" or one of the spec's matrix dtypes (normalised)."""
    value = getattr(spec, "matrix_efficiency_curve_dtype", "") or ""
    if not isinstance(value, str):
        raise UserError(f"{where}: matrix_efficiency_curve_dtype must be a dtype name, got {value!r}")
    if not value:
        return ""
    d = normalize_dtype(value)
    if d not in spec.matrix_flops_per_s:
        raise UserError(f"{where}: matrix_efficiency_curve_dtype {value!r} is not one of matrix_flops_per_s's "
                        f"dtypes ({', '.join(spec.matrix_flops_per_s)})")
    return d


def _shape_curve(value, where) -> tuple:
    """[[smallest GEMM dimension, factor], ...]: efficiency multiplier for skinny GEMMs, strictly increasing dims."""
    return _points(value, where, "matrix_shape_curve", "smallest_dim", "factor", _factor_at_most(4))


def _bandwidth_curve(value, where) -> tuple:
    """[[bytes moved per kernel, factor], ...]: memory bandwidth multiplier by working set, strictly increasing bytes."""
    return _points(value, where, "mem_bandwidth_curve", "bytes_per_kernel", "factor", _factor_at_most(64))


#: Host constants perfcheck no longer uses, dropped when an older spec file or calibration cache carries them:
#: gemm_narrow_row_s (a CPU GEMM's price per narrow output row) moved no held-out model's step in four runs
#: (bench/results/heldout.md, pruning).
RETIRED_HOST_KEYS = frozenset({"gemm_narrow_row_s"})


def _host(value, where) -> types.MappingProxyType:
    if not isinstance(value, Mapping):
        raise UserError(f"{where}: host must be an object of constant -> seconds")
    value = {k: v for k, v in value.items() if k not in RETIRED_HOST_KEYS}
    for key in value:
        if key not in HOST_KEYS:
            raise UserError(f"{where}: host has unknown key {key!r} (allowed: {', '.join(HOST_KEYS)})")
    return types.MappingProxyType({k: _number(v, f"host.{k}", where, allow_zero=True) for k, v in value.items()})


#: Largest ``op_efficiency`` of a CPU spec. A GPU's roofline is its datasheet ceiling, so an op's measured / roofline
#: rate is in (0, 1]. A CPU's vector rate is calibration's elementwise add (one FLOP per element at the add's
#: streaming rate), not a ceiling: kernels doing several FLOPs per element in registers (LayerNorm's 7, GELU's erf
#: polynomial) run above it (LayerNorm 3-5 on the project's Xeon). 20 guards against a case timed at almost nothing.
CPU_OP_EFFICIENCY_MAX = 20.0


def op_efficiency_max(kind: str) -> float:
    """The largest op efficiency a spec of ``kind`` may hold (``CPU_OP_EFFICIENCY_MAX`` on a CPU, else 1)."""
    return CPU_OP_EFFICIENCY_MAX if kind == "cpu" else 1.0


def _per_op(value, field, where, *, fraction: bool, most: float = 1.0) -> types.MappingProxyType:
    """aten op name -> seconds (op_fixed_s: a CPU kernel's fixed cost beyond dispatch) or an efficiency
    in (0, most] (op_efficiency: measured / roofline rate of that op's kernel; ``op_efficiency_max``)."""
    if not isinstance(value, Mapping):
        raise UserError(f"{where}: {field} must be an object of aten op name -> number")

    def at_most(v, f, w):
        v = _number(v, f, w)
        if v > most:
            raise UserError(f"{w}: {f} = {v!r} is outside (0, {most:g}]")
        return v
    check = at_most if fraction else (lambda v, f, w: _number(v, f, w, allow_zero=True))
    return types.MappingProxyType({str(k): check(v, f"{field}.{k}", where) for k, v in value.items()})


def _wide_curves(value, where) -> types.MappingProxyType:
    """matrix_wide_curve: "fwd" | "bwd" -> [[output width, factor in (0, 1]], ...] (increasing widths)."""
    if not isinstance(value, Mapping) or any(k not in ("fwd", "bwd") for k in value):
        raise UserError(f"{where}: matrix_wide_curve must be an object with keys fwd, bwd -> [[n, factor], ...]")
    return types.MappingProxyType({str(k): _points(v, where, f"matrix_wide_curve.{k}", "n", "factor", _fraction)
                                   for k, v in value.items()})


def _op_curves(value, where) -> types.MappingProxyType:
    """op_efficiency_curve: op key -> [[roofline seconds per kernel, efficiency], ...] (increasing seconds)."""
    if not isinstance(value, Mapping):
        raise UserError(f"{where}: op_efficiency_curve must be an object of op key -> [[seconds, efficiency], ...]")
    return types.MappingProxyType({str(k): _points(v, where, f"op_efficiency_curve.{k}", "roofline_s", "efficiency",
                                                   _fraction) for k, v in value.items()})


#: ``attention_kernel_curve`` keys: the head dimension and whether the kernel skips the masked half.
ATTENTION_CURVE_KEY = re.compile(r"^d([1-9][0-9]*):(causal|full)$")


def _attention_curves(value, where) -> types.MappingProxyType:
    """attention_kernel_curve: "d<head dim>:<causal|full>" -> [[sequence length, fraction of peak], ...]."""
    if not isinstance(value, Mapping):
        raise UserError(f"{where}: attention_kernel_curve must be an object of \"d<head dim>:<causal|full>\" -> "
                        "[[sequence length, fraction], ...]")
    for k in value:
        if not isinstance(k, str) or not ATTENTION_CURVE_KEY.match(k):
            raise UserError(f"{where}: attention_kernel_curve key {k!r} is not \"d<head dim>:causal\" or "
                            "\"d<head dim>:full\"")
    return types.MappingProxyType({k: _points(v, where, f"attention_kernel_curve.{k}", "seq_len", "fraction",
                                              _fraction) for k, v in value.items()})


def _busbw_curves(value, where) -> types.MappingProxyType:
    """collective_busbw_curve: collective kind -> [[full buffer bytes, bus bandwidth B/s], ...] (nccl-tests' rows)."""
    if not isinstance(value, Mapping):
        raise UserError(f"{where}: collective_busbw_curve must be an object of collective kind -> "
                        "[[bytes, bus bandwidth B/s], ...]")
    for k in value:
        if k not in COLLECTIVE_KINDS:
            raise UserError(f"{where}: collective_busbw_curve key {k!r} is not one of {', '.join(COLLECTIVE_KINDS)}")
    return types.MappingProxyType({k: _points(v, where, f"collective_busbw_curve.{k}", "bytes", "busbw",
                                              lambda y, name, w: _number(y, name, w)) for k, v in value.items()})


def _unretired_modules(value):
    """``module_fixed_s`` less the retired classes (``RETIRED_MODULE_FIXED``); anything not a mapping as it is,
    for ``_per_op`` to reject."""
    return {k: v for k, v in value.items() if k not in RETIRED_MODULE_FIXED} if isinstance(value, Mapping) else value


def _per_row(value, where) -> types.MappingProxyType:
    """op_row_s: aten op name -> {"fwd": seconds, "bwd": seconds} per row (each >= 0; a phase may be left out).
    Retired entries (``RETIRED_ROW_OPS``, ``RETIRED_ROW_TERMS``) of an older file are dropped."""
    if not isinstance(value, Mapping):
        raise UserError(f"{where}: op_row_s must be an object of aten op name -> {{fwd, bwd}} seconds per row")
    out = {}
    for name, phases in value.items():
        if not isinstance(phases, Mapping):
            raise UserError(f"{where}: op_row_s.{name} must be an object with keys {', '.join(ROW_PHASES)}")
        if name in RETIRED_ROW_OPS:
            continue
        phases = {ph: v for ph, v in phases.items() if ph not in RETIRED_ROW_TERMS}
        for ph in phases:
            if ph not in ROW_PHASES:
                raise UserError(f"{where}: op_row_s.{name} has unknown phase {ph!r} (allowed: {', '.join(ROW_PHASES)})")
        out[str(name)] = types.MappingProxyType({ph: _number(v, f"op_row_s.{name}.{ph}", where, allow_zero=True)
                                                 for ph, v in phases.items()})
    return types.MappingProxyType(out)


@lru_cache(maxsize=None)
def _host_defaults() -> dict:
    where = "host_defaults.json"
    data = parse_json((resources.files("perfcheck.hardware") / where).read_text(), where)
    out = {}
    for kind in SYSTEM_KINDS:
        block = data.get(kind)
        if not isinstance(block, Mapping) or set(block) != set(HOST_KEYS):
            raise UserError(f"{where}: {kind} must give exactly the keys {', '.join(HOST_KEYS)}")
        out[kind] = dict(_host(block, where))
    rows = data.get("op_row_s", {})
    out["op_row_s"] = {kind: dict(_per_row(rows.get(kind, {}), f"{where} op_row_s.{kind}")) for kind in SYSTEM_KINDS}
    out["sources"] = dict(data.get("sources", {}))
    return out


def row_costs(spec: "SystemSpec") -> dict:
    """op name -> {"fwd", "bwd"} seconds per row for ``spec``: its own ``op_row_s`` over the defaults for its
    kind (host_defaults.json's ``op_row_s``, each op's entry replaced whole)."""
    return {**_host_defaults()["op_row_s"][spec.kind], **dict(spec.op_row_s)}


def host_constants(spec: "SystemSpec") -> dict:
    """Every HOST_KEYS constant for ``spec``: its own ``host`` block over the defaults for its kind."""
    return {**_host_defaults()[spec.kind], **dict(spec.host)}


def host_source(spec: "SystemSpec", key: str) -> str:
    """Where ``spec``'s value of host constant ``key`` comes from (its source, or the default's)."""
    if key in spec.host:
        return spec.sources.get(f"host.{key}", spec.sources.get("host", "given in the spec's host block"))
    sources, name = _host_defaults()["sources"], f"{spec.kind}.{key}"
    if name not in sources:  # a family's source ("cpu.zero*": the DeepSpeed constants)
        import fnmatch

        name = next((k for k in sources if "*" in k and fnmatch.fnmatchcase(f"{spec.kind}.{key}", k)), spec.kind)
    return sources.get(name, "")


def _calibration(value, where) -> types.MappingProxyType:
    """The ``calibration`` record: known keys, each a string, a finite number or a boolean, or (``CALIBRATION_CURVES``)
    [seconds, share] pairs (``_loss_points``)."""
    if not isinstance(value, Mapping):
        raise UserError(f"{where}: calibration must be an object (keys: {', '.join(CALIBRATION_KEYS)})")
    out = dict(value)
    for key, v in value.items():
        if key not in CALIBRATION_KEYS:
            raise UserError(f"{where}: calibration has unknown key {key!r} (allowed: {', '.join(CALIBRATION_KEYS)})")
        if key in CALIBRATION_CURVES:
            out[key] = _loss_points(v, f"{where}: calibration.{key}")
            continue
        ok = isinstance(v, (str, bool)) or (isinstance(v, (int, float)) and math.isfinite(v))
        if not ok:
            raise UserError(f"{where}: calibration.{key} must be a string, a finite number or a boolean, got {v!r}")
    return types.MappingProxyType(out)


#: Calibration keys that hold ((seconds, share), ...) points, not a scalar (``_loss_points``).
CALIBRATION_CURVES = ("l3_lost",)


def _loss_points(v, where) -> tuple:
    """((seconds > 0, share in [0, 1]), ...) as a tuple of float pairs, or a one-line error naming the field."""
    try:
        pts = tuple((float(a), float(b)) for a, b in v)
    except (TypeError, ValueError):
        raise UserError(f"{where} must be a list of [seconds, share] pairs, got {v!r}") from None
    if not all(math.isfinite(a) and a > 0 and 0.0 <= b <= 1.0 for a, b in pts):
        raise UserError(f"{where}: each pair needs seconds > 0 and a share in [0, 1], got {v!r}")
    return pts


def _sources(value, where) -> types.MappingProxyType:
    if not isinstance(value, Mapping):
        raise UserError(f"{where}: sources must be an object of field -> source text")
    for key, text in value.items():
        if not isinstance(key, str) or key.split(".", 1)[0] not in _FIELDS:
            raise UserError(f"{where}: sources has key {key!r} that names no field")
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"{where}: sources.{key} must be a non-empty string")
    return types.MappingProxyType(dict(value))


def _validated_fields(spec, where: str) -> dict:
    """Every field of ``spec`` checked and normalised; raises UserError naming the first bad one."""
    if not isinstance(spec.name, str) or not spec.name.strip():
        raise UserError(f"{where}: name must be a non-empty string")
    if not isinstance(spec.description, str):
        raise UserError(f"{where}: description must be a string")
    if spec.kind not in SYSTEM_KINDS:
        raise UserError(f"{where}: kind must be one of {', '.join(SYSTEM_KINDS)}, got {spec.kind!r}")
    gpn = spec.gpus_per_node
    if isinstance(gpn, bool) or not isinstance(gpn, int) or gpn < 1:
        raise UserError(f"{where}: gpus_per_node must be a positive integer, got {gpn!r}")
    if not isinstance(spec.calibrated, bool):
        raise UserError(f"{where}: calibrated must be true or false, got {spec.calibrated!r}")
    out = {
        "matrix_flops_per_s": _dtype_map(spec.matrix_flops_per_s, "matrix_flops_per_s", where),
        "vector_flops_per_s": _dtype_map(spec.vector_flops_per_s, "vector_flops_per_s", where),
        "launch_overhead_s": _number(spec.launch_overhead_s, "launch_overhead_s", where, allow_zero=True),
        "strided_elements_per_s": _number(getattr(spec, "strided_elements_per_s", 0.0), "strided_elements_per_s",
                                          where, allow_zero=True),
        "efficiency": _efficiency(spec.efficiency, where),
        "matrix_efficiency_curve": _curve(spec.matrix_efficiency_curve, where),
        "matrix_efficiency_curve_dtype": _curve_dtype(spec, where),
        "matrix_shape_curve": _shape_curve(getattr(spec, "matrix_shape_curve", ()), where),
        "matrix_cold_curve": _points(getattr(spec, "matrix_cold_curve", ()), where, "matrix_cold_curve",
                                     "flops_per_kernel", "factor", _fraction),
        "memory_cold_curve": _points(getattr(spec, "memory_cold_curve", ()), where, "memory_cold_curve",
                                     "bytes_per_kernel", "factor", _fraction),
        "mem_bandwidth_curve": _bandwidth_curve(getattr(spec, "mem_bandwidth_curve", ()), where),
        "host": _host(getattr(spec, "host", {}) or {}, where),
        "op_fixed_s": _per_op(getattr(spec, "op_fixed_s", {}) or {}, "op_fixed_s", where, fraction=False),
        "op_efficiency": _per_op(getattr(spec, "op_efficiency", {}) or {}, "op_efficiency", where, fraction=True,
                                 most=op_efficiency_max(spec.kind)),
        "op_efficiency_curve": _op_curves(getattr(spec, "op_efficiency_curve", {}) or {}, where),
        "attention_kernel_curve": _attention_curves(getattr(spec, "attention_kernel_curve", {}) or {}, where),
        "collective_busbw_curve": _busbw_curves(getattr(spec, "collective_busbw_curve", {}) or {}, where),
        "module_fixed_s": _per_op(_unretired_modules(getattr(spec, "module_fixed_s", {}) or {}), "module_fixed_s",
                                  where, fraction=False),
        "op_row_s": _per_row(getattr(spec, "op_row_s", {}) or {}, where),
        "op_flop_s": _per_op(getattr(spec, "op_flop_s", {}) or {}, "op_flop_s", where, fraction=False),
        "matrix_wide_curve": _wide_curves(getattr(spec, "matrix_wide_curve", {}) or {}, where),
        "matrix_narrow_curve": _points(getattr(spec, "matrix_narrow_curve", ()), where, "matrix_narrow_curve", "n",
                                       "factor", _fraction),
        "sources": _sources(spec.sources, where),
        "calibration": _calibration(getattr(spec, "calibration", {}) or {}, where),
    }
    for f in ("mem_bandwidth_bytes_per_s", "mem_capacity_bytes", "intra_node_bandwidth_bytes_per_s",
              "inter_node_bandwidth_bytes_per_s"):
        out[f] = _number(getattr(spec, f), f, where)
    return out


# ---- loading ------------------------------------------------------------------------------------
def _data_dir():
    return resources.files("perfcheck.hardware") / "specs"


def list_systems() -> list:
    """Names of the built-in systems, sorted."""
    return sorted(p.name[:-5] for p in _data_dir().iterdir() if p.name.endswith(".json"))




@lru_cache(maxsize=None)
def _load_builtin(name: str) -> SystemSpec:
    resource = _data_dir() / f"{name}.json"
    spec = SystemSpec.from_dict(parse_json(resource.read_text(), f"{name}.json"), f"{name}.json")
    object.__setattr__(spec, "origin", f"built-in {name}")
    return spec


def load_system(name_or_path) -> SystemSpec:
    """A ``SystemSpec`` from a built-in name (``"h100-sxm"``), a path to a JSON file, or a spec.

    A spec is returned unchanged. Raises UserError (one line) for an unknown name (listing the
    known ones), an unreadable or malformed file (file and line), or an invalid field.
    """
    if isinstance(name_or_path, SystemSpec):
        return name_or_path
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise UserError(f"system must be a name, a path or a SystemSpec, got {type(name_or_path).__name__}")
    text = os.fspath(name_or_path)
    known = list_systems()
    if text.strip().lower() in known:
        return _load_builtin(text.strip().lower())
    path = Path(text).expanduser()
    looks_like_path = path.suffix.lower() == ".json" or os.sep in text or (os.altsep and os.altsep in text)
    if not path.is_file():
        if looks_like_path:
            raise UserError(f"system file {text!r} does not exist")
        raise UserError(f"unknown system {text!r} (known: {', '.join(known)}; or give a path to a JSON file)")
    try:
        content = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read system file {text!r}: {exc}") from None
    spec = SystemSpec.from_dict(parse_json(content, str(path)), str(path))
    object.__setattr__(spec, "origin", f"file {path}")  # for report headers (perfcheck.hardware.cache.spec_label)
    return spec


def spec_of(system) -> SystemSpec:
    """``system`` itself when it is a ``SystemSpec``, else ``load_system(system)``.

    Why: a prediction resolves its spec once, at its edge (``perfcheck.estimate``, PerfCheck, the CLI), and
    passes the typed spec down; the formulas below it take that spec as it is. Their public forms also take
    a name or a path (a direct call, a test), which this resolves; on the prediction path it is never one
    (tests/test_pred_writers.py counts the resolutions of one estimate)."""
    return system if isinstance(system, SystemSpec) else load_system(system)


# ---- tables -------------------------------------------------------------------------------------
def system_row(spec: SystemSpec) -> dict:
    """One flat row (SI units, NaN where a dtype is absent) describing ``spec``."""
    row = {"name": spec.name, "kind": spec.kind}
    for d in ("fp32", "tf32", "bf16", "fp16", "fp8"):
        row[f"matrix_{d}_flops_per_s"] = spec.matrix_flops_per_s.get(d, math.nan)
    for d in ("fp32", "bf16", "fp16"):
        row[f"vector_{d}_flops_per_s"] = spec.vector_flops_per_s.get(d, math.nan)
    for f in ("mem_bandwidth_bytes_per_s", "mem_capacity_bytes", "intra_node_bandwidth_bytes_per_s",
              "gpus_per_node", "inter_node_bandwidth_bytes_per_s", "launch_overhead_s"):
        row[f] = getattr(spec, f)
    for k in EFFICIENCY_KEYS:
        row[f"efficiency_{k}"] = spec.efficiency[k]
    row["calibrated"] = spec.calibrated
    row["description"] = spec.description
    return row


def systems_table(names=None):
    """pandas DataFrame with one row per system (all built-ins by default; names or paths allowed)."""
    import pandas as pd

    specs = [load_system(n) for n in (list_systems() if names is None else names)]
    return pd.DataFrame([system_row(s) for s in specs])


def match_device_name(device_name: str) -> str:
    """The built-in spec for a CUDA/ROCm device name ("NVIDIA H100 80GB HBM3" -> "h100-sxm").

    The chip ("h100") must appear in the name; among its specs the one sharing the most other
    tokens ("80gb", "sxm") wins; a PCIe spec only when the name says PCIe. No match: UserError
    naming the device, so the caller passes --system explicitly.
    """
    text = device_name.lower().replace("-", " ").replace("_", " ")
    best, best_score = None, -1
    for system in list_systems():
        chip, *rest = system.split("-")
        if chip == "cpu" or chip not in text.split():
            continue
        if ("pcie" in rest) != ("pcie" in text):
            continue
        score = sum(tok in text for tok in rest)
        if score > best_score:
            best, best_score = system, score
    if best is None:
        raise UserError(f"device {device_name!r}: no built-in system matches it; pass --system NAME or a "
                        f"file from `perfcheck calibrate` (built-ins: {', '.join(list_systems())})")
    return best
