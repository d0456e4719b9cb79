"""What a report must say about the system its predictions used, beside the numbers.

* ``device_mismatch``: the run was measured on another kind of device than the spec describes (a CPU
  run reconciled against ``h100-sxm``, the README's examples copied onto a laptop): every gap then
  compares two machines, so ``reconcile`` gives each large gap the reason ``other_device`` instead of a
  diagnosis of the model (a CPU's 998x gap is not ``launch_overhead``).
* ``system_notes``: the notes every report header prints: the mismatch as a WARNING; a calibration
  taken with N threads applied to a run with M; a calibration taken under contention (kept with
  ``--force``, or from before the check); a datasheet default used because the machine has no
  calibration (run ``perfcheck calibrate``).
"""
from __future__ import annotations

from typing import Optional

from perfcheck.errors import UserError
from perfcheck.hardware.calibrate.sanity import contention
from perfcheck.hardware.labels import thread_mismatch
from perfcheck.hardware.systems import SystemSpec, match_device_name

_KIND = {"cpu": "cpu", "cuda": "gpu"}


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
