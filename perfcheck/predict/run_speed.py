"""A prediction set at the machine speed a run met, from the calibration's references read during the run.

A CPU calibration puts every constant in seconds at one time per reference (``spec.calibration``'s
``reference_s``, a tiny ``torch.add``, and ``compute_reference_s``, a 128^3 fp32 ``torch.mm``:
``perfcheck.calibrate.repeats``). A run that reads the same two references between its steps
(``perfcheck.measure.speed``) gives the machine's speed then, per reference:

    host factor    s_h = median run reading of the add / reference_s
    compute factor s_c = median run reading of the mm  / compute_reference_s

A calibrated case is read against the references as host code (t / ref, anchored x reference_s) or as one
dispatch and a kernel's work ((t - ref) / cref, anchored x compute_reference_s + reference_s), so a predicted
time whose host share is ``host_s`` (dispatch, Python, autograd: the estimator's ``host_<phase>_s``) and whose
rest is kernel work is, at the run's speed,

    t_run = s_h * host_s + s_c * (t - host_s)                                    (``at_run_speed``)

Read by ranks whose peers run beside them, the factors also hold the peers' share of the host, so a prediction
that already carries a process slowdown for them has it taken out first (``analysis.stage_prediction.at_run_times``).
Communication and the wait for a peer are not scaled (the collective terms are not read against the
references). The factors are a measurement beside the prediction, not a fitted constant: with s_h = s_c = 1
(a run at the calibration's level) nothing changes.
"""
from __future__ import annotations

import math


def speed_factors(calibration, ref_s: float, cref_s: float) -> tuple:
    """(s_h, s_c): the run's median reference readings over the calibration's reference times; NaN for a
    reference the calibration or the run lacks (a spec without references, a GPU run, an older run)."""
    calibration = calibration or {}

    def ratio(run, key):
        cal = calibration.get(key)
        if not isinstance(cal, (int, float)) or isinstance(cal, bool) or not cal > 0:
            return math.nan
        run = float(run) if run is not None else math.nan
        return run / float(cal) if run > 0 else math.nan

    return ratio(ref_s, "reference_s"), ratio(cref_s, "compute_reference_s")


def at_run_speed(t: float, host_s: float, host_factor: float, compute_factor: float) -> float:
    """``t`` seconds (of which ``host_s`` host work, clipped to [0, t]) at the run's speed:
    host_factor x host + compute_factor x the rest. NaN when a factor is NaN."""
    t = float(t)
    h = min(max(float(host_s), 0.0), t) if t > 0 else 0.0
    return host_factor * h + compute_factor * (t - h)
