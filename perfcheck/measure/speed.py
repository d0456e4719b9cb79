"""The machine's speed during a run, read with the calibration's own two references.

Why. A CPU calibration reads every case against two references timed beside it, a tiny ``torch.add`` (host
code: dispatch, Python) and a 128^3 fp32 ``torch.mm`` (the vector units' work), and puts the whole table back
in seconds at one time per reference (``calibration.reference_s``, ``calibration.compute_reference_s``:
``perfcheck.calibrate.repeats``). On a shared machine the speed of a core moves under the VM: on the project's
2-core Xeon the same loop runs ~2x slower for seconds at a time (bench/results/calibration_steadiness.md), in
process CPU time too, so a prediction priced at the calibration's level meets a run at another level and
measured/predicted moves with the machine, not with the model (the LeNet ZeRO sweep's forward read 0.87-1.76
on one cached calibration: bench/results/zero_sweep_ratios.md). A run that times the same two references
between its steps knows the level it ran at; the comparison then sets the prediction at that level
(``perfcheck.predict.run_speed``) beside the plain one.

What. ``SpeedProbe.read()`` times ``ADDS`` calls of the calibration's host reference and ``MMS`` of its compute
reference (``perfcheck.calibrate.phase``: the same two calls) in process CPU time (the automatic calibration's
clock) and returns seconds per call of each: ~0.3 ms and ~0.2 ms on the project's Xeon (a warm-up call of each
before its loop: ``read``), once per optimizer step, outside every timed phase. CPU only: a GPU run's host is not
the kernels' clock, and no GPU calibration has these references (``read`` returns NaNs there).
"""
from __future__ import annotations

import math
import time

import torch

from perfcheck.calibrate.phase import compute_reference_fn, per_call_s, reference_fn

#: Calls of each reference per reading: ~100 tiny adds (1.6-3.2 us each on the project's Xeon: 0.16-0.32 ms,
#: far above the clock's resolution) and 4 128^3 mms (~45 us each); about 5% of a LeNet ZeRO step.
ADDS = 100
MMS = 4


class SpeedProbe:
    """Reads the calibration's two references (seconds per call) on ``device``; NaNs off the CPU."""

    def __init__(self, device=None):
        device = torch.device("cpu") if device is None else torch.device(device)
        self.enabled = device.type == "cpu"
        if self.enabled:
            self._add = reference_fn(device)
            self._mm = compute_reference_fn(device)
            self._add()
            self._mm()

    def read(self) -> tuple:
        """(host reference s per call, compute reference s per call), process CPU time; (nan, nan) off the CPU.

        Each reference is called once untimed first: the step before a reading evicts the reference's operands
        from the caches (the mm's three 64 KiB matrices), and the first mm after a training step ran 2.2x a warm
        one (128 vs 53 us after a tv_resnet18 step on the project's Xeon), so a 4-mm reading read ~1.4x and the
        100 adds ~1.1x what they read warm, where the calibration's reference loop (~25 mms, ~500 adds,
        ``phase.REFERENCE_LOOP_S``) spreads one such call over the loop (bench/results/heldout_speed.md)."""
        if not self.enabled:
            return math.nan, math.nan
        self._add()
        ref = per_call_s(self._add, ADDS, time.process_time)
        self._mm()
        return ref, per_call_s(self._mm, MMS, time.process_time)
