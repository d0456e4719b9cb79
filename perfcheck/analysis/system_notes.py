"""What a report must say about the system its predictions used, beside the numbers.

* ``device_mismatch``: the run was measured on another kind of device than the spec describes (a CPU
  run reconciled against ``h100-sxm``, the README's examples copied onto a laptop): every gap then
  compares two machines, so ``reconcile`` gives each large gap the reason ``other_device`` instead of a
  diagnosis of the model (a CPU's 998x gap is not ``launch_overhead``).
* ``run_contention``: a CPU run whose process got less than ``MIN_CORE_SHARE`` of a core while it ran
  (the sampler's median ``cpu_util``) waited for a core (other processes) or slept: its measured times
  include that wait, so ``reconcile`` gives each slow module the reason ``contention`` (an encoder
  stack beside a busy process ran 3.2x longer at 0.19 of a core, and was called compute_below_roof).
* ``system_notes``: the notes every report header prints: the mismatch as a WARNING; a calibration
  taken with N threads applied to a run with M; a calibration taken under contention (kept with
  ``--force``, or from before the check); a datasheet default used because the machine has no
  calibration (run ``perfcheck calibrate``).
"""
from __future__ import annotations

from typing import Optional

import pandas as pd

from perfcheck.errors import UserError
from perfcheck.calibrate.sanity import contention
from perfcheck.hardware.labels import thread_mismatch
from perfcheck.hardware.systems import SystemSpec, match_device_name

_KIND = {"cpu": "cpu", "cuda": "gpu"}
#: A CPU training loop keeps its main thread on a core all the time (the ops run on it): a median below
#: half a core means it spent more time waiting for one (or sleeping) than computing.
MIN_CORE_SHARE = 0.5


def run_contention(meta: dict, samples) -> Optional[str]:
    """A sentence when a CPU run's process had less than ``MIN_CORE_SHARE`` of a core (median of the
    sampler's ``cpu_util`` for the meta's rank), else None (a GPU run, no samples)."""
    if not isinstance(meta, dict) or (meta.get("device") or {}).get("type", "cpu") != "cpu" or samples is None:
        return None
    if "cpu_util" not in getattr(samples, "columns", ()) or not len(samples):
        return None
    mine = samples[samples["rank"] == meta.get("rank", 0)] if "rank" in samples else samples
    util = pd.to_numeric(mine["cpu_util"], errors="coerce").dropna()
    if len(util) < 3 or util.median() >= MIN_CORE_SHARE:
        return None
    return (f"the process ran on a median {util.median():.2f} of a CPU core while it was sampled ({len(util)} "
            f"samples): it waited for a core (other processes) or slept most of the time, so its measured times "
            f"include that wait")


def device_mismatch(spec: Optional[SystemSpec], meta: dict) -> Optional[str]:
    """A sentence when the measured device (meta.json ``device``) is not what ``spec`` describes, else None."""
    device = meta.get("device") if isinstance(meta, dict) else None
    if spec is None or not isinstance(device, dict):
        return None
    kind = _KIND.get(str(device.get("type", "")))
    name = device.get("name") or device.get("type")
    if kind is None:
        return None
    if kind != spec.kind:
        return (f"measured on {'a CPU' if kind == 'cpu' else 'a GPU'} ({name}) but predicted for {spec.name!r}, "
                f"a {spec.kind.upper()} spec: every gap compares two different machines, not the model with its "
                f"run (give the run's own system, or none for this machine's calibration)")
    if kind == "gpu" and not spec.calibrated and device.get("name"):
        try:
            own = match_device_name(str(device["name"]))
        except UserError:
            return None
        if own != spec.name:
            return (f"measured on {device['name']} ({own}) but predicted for {spec.name!r}: the gaps compare two "
                    f"GPUs (give --system {own})")
    return None


def system_notes(spec: Optional[SystemSpec], meta: dict) -> list:
    """The notes a report prints about ``spec`` for the run described by ``meta`` (see the module docstring)."""
    if spec is None:
        return []
    out = []
    other = device_mismatch(spec, meta)
    if other:
        out.append(f"WARNING: {other}")
    threads = meta.get("torch_threads") if isinstance(meta, dict) else None
    if (meta.get("device") or {}).get("type", "cpu") == "cpu":
        mismatch = thread_mismatch(spec, threads)
        if mismatch:
            out.append(f"WARNING: {mismatch}")
    busy = contention(spec.calibration) if spec.calibrated and spec.calibration else None
    if busy:
        out.append(f"WARNING: the calibration {spec.name!r} was {busy}; gaps may be the calibration's, not the "
                   f"run's (`perfcheck calibrate --clear`, then `perfcheck calibrate` on a quiet machine)")
    if not spec.calibrated and str(getattr(spec, "origin", "")).startswith("default"):
        out.append(f"the predictions use the {spec.name!r} datasheet default: this machine has no calibration "
                   f"(`perfcheck calibrate` measures one; then re-run the prediction)")
    return out
