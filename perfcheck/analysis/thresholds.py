"""What the diagnoses (``analysis.findings``, ``analysis.rules``) compare against: every threshold with the
reason for its default (``Thresholds``), the system's roofs and the hook floor (``Context``)."""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from perfcheck.errors import UserError
from perfcheck.calibrate.sanity import contention

#: Default hook cost per module call when the run gives no better figure: two clock reads and the
#: Python dispatch of a pre- and post-hook. Default chosen by perfcheck from public figures for one
#: timing-enabled CUDA event record: ~2.5 us (https://github.com/NVIDIA/NVTX/issues/3) to 5.2 us with
#: a query (https://github.com/ICLDisco/parsec/pull/576); a floor, not a measurement: bench/RESULTS.md
#: (issue #15 section) measured 46-54 us of host CPU time per module call for the whole forward +
#: backward timing on a loaded shared 2-core VM (109-120 us before #15).
DEFAULT_HOOK_OVERHEAD_S = 5e-6


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Every number the diagnoses compare against, with why it has its default."""

    #: gap = measured / predicted above this is "slower than the model" (2x: beyond the 1.7-2.75x
    #: optimism of roofline models in the wild: LLM-Viewer vs TensorRT-LLM on LLaMA-7B, 1.67x throughput
    #: and 2.3x first-token latency, https://github.com/hahnyuan/LLM-Viewer/issues/4; llm-analysis at
    #: ideal efficiency vs MT-NLG's published step time, 2.5-2.75x,
    #: https://github.com/cli99/llm-analysis/tree/main/examples/megatron-turing-nlg).
    gap_high: float = 2.0
    #: gap below this is "faster than the model" (the mirror image of gap_high).
    gap_low: float = 0.5
    #: measured time per kernel (per call without a kernel table) under which the work is tiny
    #: ("tens of us": every module of JSC_Tiny, perfcheck.examples.models).
    tiny_s: float = 100e-6
    #: predicted time per kernel under which the roofline work is negligible (a few launch latencies).
    tiny_pred_s: float = 25e-6
    #: launch_overhead needs the measured time per kernel within this many launch floors (the system's
    #: ``launch_overhead_s``): at 3x the fixed cost is a third or more of each kernel's time; at 10x it is a
    #: tenth, and the other nine tenths are something else (a transformer block at 29 us per kernel against
    #: a 2.9 us floor is not launch-bound).
    launch_floor_factor: float = 3.0
    #: measured per call at or under this many hook costs is the hook floor.
    hook_floor_factor: float = 2.0
    #: kernel (or op) time under this share of the wall time means the device waits for the host.
    host_share: float = 0.5
    #: irregular kernels (scatter/gather/index/sort) above this share of kernel time dominate.
    irregular_share: float = 0.25
    #: communication kernels above this share of the measured time are exposed communication.
    comm_share: float = 0.25
    #: achieved rate under this fraction of the datasheet roof is "below the roof".
    roof_fraction: float = 0.5
    #: a rank whose step time exceeds the median over ranks by more than this fraction is a straggler.
    straggler_tolerance: float = 0.05
    #: a module's own wait on collectives at or above this share of its rank's step is a finding (the
    #: straggler tolerance's 5%: a wait that moves the step by less is within step-to-step noise here).
    comm_wait_share: float = 0.05
    #: minor page faults per step (median) from which a phase's faults can explain its gap: 256 pages = 1 MiB
    #: first-touched per step. Below it the faults are small allocations of the interpreter, the profiler
    #: and the sampler (0 to a few dozen per step in the steady state of perfcheck's test models), not tensors.
    page_fault_min: float = 256
    #: the faults' estimated time (count x the run's measured cost per fault) must reach this share of the
    #: phase's measured time (the 5% of comm_wait_share: less moves the phase by step-to-step noise).
    page_fault_share: float = 0.05

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not np.isfinite(v) or v < 0:
                raise UserError(f"thresholds: {f.name} must be a non-negative number, got {v!r}")
        if not self.gap_low < 1 < self.gap_high:
            raise UserError(f"thresholds: need gap_low < 1 < gap_high, got {self.gap_low} and {self.gap_high}")


@dataclasses.dataclass(frozen=True)
class Context:
    """What the rules need besides the rows: thresholds, the system's roofs, the hook floor."""

    thresholds: Thresholds = Thresholds()
    system: object = None  # a SystemSpec, or None (rules that need a roof then do not match)
    dtype: Optional[str] = None
    hook_overhead_s: float = DEFAULT_HOOK_OVERHEAD_S
    #: where ``hook_overhead_s`` came from: the run's own measured overhead (meta.json, analysis.pipeline)
    #: or the assumed default; the hook_overhead evidence quotes it
    hook_overhead_source: str = "assumed default"
    #: a sentence when the run was measured on another device than ``system`` describes
    #: (analysis.system_notes.device_mismatch): every large gap is then ``other_device``
    other_device: str = ""
    #: a sentence when the run's process waited for a core most of the time (analysis.system_notes.run_contention)
    contention: str = ""

    def launch_floor(self) -> float:
        """The spec's fixed time per kernel (``launch_overhead_s``); NaN without a system."""
        return np.nan if self.system is None else float(self.system.launch_overhead_s)

    def peak_taken_under_load(self) -> bool:
        """True when the system is a calibration whose record says it was taken under contention: its
        measured peaks are low, so a real timing above them is no artifact."""
        record = getattr(self.system, "calibration", None) if self.system is not None else None
        return bool(record) and contention(record) is not None

    def matrix_peak(self) -> float:
        if self.system is None:
            return np.nan
        if self.dtype is not None:
            return self.system.matrix_peak(self.dtype)
        return max(self.system.matrix_flops_per_s.values())

    def mem_bandwidth(self) -> float:
        return np.nan if self.system is None else self.system.mem_bandwidth_bytes_per_s
