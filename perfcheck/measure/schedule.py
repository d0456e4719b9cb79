"""Which role each training step plays in a measured run: one rule for PerfCheck and the DeepSpeed
engine wrapper.

From the first step: ``warmup`` steps (hooks on, left out of the statistics); one ``flops`` step
if FLOPs are counted; the profiler window ``(wait, warmup, active)``, whose ``wait`` steps are
``measured`` and whose warm-up and active steps are ``profile`` (the profiler slows them); then
``measured`` steps, each followed by one ``bare`` step (hooks removed, for the in-run overhead
A/B) while ``overhead_pairs`` are still owed; ``done`` once ``steps`` measured steps (and the
bare ones) have run. ``steps=None`` measures until the run stops.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

ROLES = ("warmup", "flops", "profile", "measured", "bare", "done")


@dataclasses.dataclass(frozen=True)
class StepSchedule:
    warmup: int = 1
    steps: Optional[int] = None
    count_flops: bool = False
    profile_window: Optional[tuple] = (0, 1, 1)  # (wait, warmup, active); None: no profiler
    overhead_pairs: int = 0

    def role(self, index: int, measured_done: int = 0, bare_done: int = 0, last_plain: Optional[str] = None) -> str:
        """The role of step ``index`` (0-based) given how many measured and bare steps have run so
        far and the role of the last measured-or-bare step."""
        if index < self.warmup:
            return "warmup"
        j = index - self.warmup
        if self.count_flops:
            if j == 0:
                return "flops"
            j -= 1
        if self.profile_window is not None:
            wait, pwarm, active = self.profile_window
            if wait <= j < wait + pwarm + active:
                return "profile"
            if j < wait:
                return "measured"
        if bare_done < self.overhead_pairs and last_plain == "measured":
            return "bare"
        if self.steps is not None and measured_done >= self.steps and bare_done >= self.overhead_pairs:
            return "done"
        return "measured"

    @property
    def profiled_steps(self) -> int:
        """Steps the profiler slows (its warm-up and active steps)."""
        return 0 if self.profile_window is None else self.profile_window[1] + self.profile_window[2]

    def total_steps(self) -> Optional[int]:
        """Steps until ``done`` when no measured step fails; None when ``steps`` is None."""
        if self.steps is None:
            return None
        return self.warmup + int(self.count_flops) + self.profiled_steps + self.steps + self.overhead_pairs
