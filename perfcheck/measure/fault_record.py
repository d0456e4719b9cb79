"""The recording session's page faults: the per-step columns (steps.csv ``*_faults_*``), the one-off
measurement of a fault's cost, and meta.json ``page_faults``. A mixin of ``measure.session.Recorder``;
the counting itself is ``measure.page_faults``, the cost ``measure.fault_cost``."""
from __future__ import annotations

import math

from perfcheck.measure.fault_cost import measure_fault_cost
from perfcheck.measure.page_faults import FAULT_COLUMNS, fault_reader, page_bytes

#: Minor faults in one measured step from which the cost of a fault is measured (once per run, ~25 ms at a
#: step boundary): 64 pages = 256 KiB first-touched, about 0.1 ms at 1-2 us per fault. Fewer are never worth
#: explaining (analysis.thresholds asks for far more), so a run without them never pays for the benchmark.
FAULT_COST_TRIGGER = 64


class FaultRecord:
    """Page faults per step and phase in the step rows; the cost of one fault in meta.json."""

    def _init_faults(self):
        self._fault_read, self._fault_counter = fault_reader()
        self._fault_cost = None  # measure.fault_cost's dict once measured
        self._fault_cost_new = False  # measured since meta.json was last written
        self._faults = None
        self._step_faults = {}

    def _add_faults(self, row: dict, index: int, bare: bool):
        """The step's page faults (NaN without a counter; per phase NaN in bare steps, which have no
        phases); at the first measured step with ``FAULT_COST_TRIGGER`` faults, the cost of one is measured."""
        counts = self._step_faults.pop(index, None) or {}
        for c in FAULT_COLUMNS:
            v = counts.get(c)
            row[c] = math.nan if v is None or (bare and not c.endswith("_step")) else float(v)
        if (self._fault_cost is None and row["measured"] and not row["failed"]
                and counts.get("minor_faults_step", 0) >= FAULT_COST_TRIGGER):
            self._measure_fault_cost()

    def _measure_fault_cost(self):
        try:
            cost = measure_fault_cost(read=self._fault_read)
        except (OSError, ValueError, TypeError) as exc:  # an mmap refused: the counts stay, the cost is unknown
            cost = {"error": f"{type(exc).__name__}: {exc}"}
        self._fault_cost = cost if cost is not None else {"error": "no fault in the benchmark's fresh region"}
        self._fault_cost_new = True

    def _faults_meta(self) -> dict:
        """meta.json ``page_faults``: the counter, the page size, the cost of one fault (or why none)."""
        return {"counter": self._fault_counter if self._fault_read is not None else None,
                "why_none": None if self._fault_read is not None else self._fault_counter,
                "page_bytes": page_bytes(),
                "cost": self._fault_cost,
                "cost_trigger_faults": FAULT_COST_TRIGGER,
                "phases": "steps.csv minor_/major_faults_{fwd,bwd,optim,step}: fwd = root training forwards, bwd = "
                          "backward passes from their first instrumented node to their end, optim = after the last "
                          "forward/backward to the step's end, step = the whole step (perfcheck.measure.page_faults)",
                "cuda": "not recorded (the CUDA caching allocator's cudaMalloc/cudaFree churn is not measured)"}
