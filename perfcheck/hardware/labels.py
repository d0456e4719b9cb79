"""How a report names the system its predictions used: where the spec came from, and, for a
calibration, when and under what load it was measured (``spec_label``); the labelled datasheet
default a prediction uses when no calibration of the machine is known (``datasheet_default``); and the
warning when a calibration taken with N threads is applied to a run with M (``thread_mismatch``).
Reads no cache and runs nothing (the cache is ``perfcheck.hardware.cache``; the checks that decide
whether a calibration is kept are ``perfcheck.calibrate.sanity``).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from perfcheck.errors import UserError
from perfcheck.hardware.systems import SystemSpec, load_system, match_device_name

#: Name of an automatically calibrated spec (report headers say so).
AUTO_NAME = "cpu-auto-calibrated"
#: What a datasheet default says when the cache has no calibration of this machine.
NO_CALIBRATION = "no calibration of this machine in the per-user cache; `perfcheck calibrate` measures one"


def datasheet_default(device=None) -> SystemSpec:
    """The built-in datasheet entry for ``device`` (``cpu``, or the GPU's by name), labelled as a default
    (its origin says that no calibration was found). Reads no cache, runs nothing."""
    import torch

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    base = load_system("cpu" if dev.type != "cuda" else match_device_name(torch.cuda.get_device_name(dev)))
    spec = dataclasses.replace(base)  # a copy: the built-in entry is shared (lru_cache) and keeps its origin
    object.__setattr__(spec, "origin", f"default, {NO_CALIBRATION}")
    return spec


def spec_label(spec) -> str:
    """"NAME (calibrated: per-user cache PATH)", "NAME (calibrated: file PATH)" or "NAME (datasheet)"."""
    if spec is None:
        return "(none)"
    if not isinstance(spec, SystemSpec):
        try:
            spec = load_system(spec)
        except UserError:
            return str(spec)
    origin = getattr(spec, "origin", None)
    if spec.calibrated:
        # a spec built in memory (no file, no cache) says so; one read back from a run says where it was from
        where = origin or ("automatic quick calibration" if spec.name == AUTO_NAME else "a SystemSpec object")
        when = describe(spec.calibration)
        return f"{spec.name} (calibrated: {where}{'; ' + when if when else '; when and under what load: not recorded'})"
    return f"{spec.name} (datasheet{': ' + origin if origin and not origin.startswith('built-in') else ''})"


def describe(record) -> str:
    """"taken 2026-11-26 11:40 UTC with 1 thread; load 0.4 on 2 cores, other processes used 0.1 core(s)"
    from a spec's ``calibration`` record; '' without one."""
    if not record:
        return ""
    when = str(record.get("taken_utc", "?")).replace("T", " ").replace("Z", " UTC")
    head = f"taken {when}"
    if record.get("threads"):
        n = record["threads"]
        head += f" with {n} thread{'s' if n != 1 else ''}"
    load = []
    if "load_1m" in record:
        load.append(f"load {record['load_1m']:g} on {record.get('cores', '?')} cores")
    if "others_cores" in record:
        load.append(f"other processes used {record['others_cores']:g} core(s)")
    if record.get("forced"):
        load.append("kept against the sanity checks (--force)")
    return head + ("; " + ", ".join(load) if load else "")


def thread_mismatch(spec, run_threads) -> Optional[str]:
    """A warning when ``spec`` was calibrated with N CPU threads and the run used ``run_threads`` != N."""
    n = (getattr(spec, "calibration", None) or {}).get("threads")
    if (not n or isinstance(run_threads, bool) or not isinstance(run_threads, int) or run_threads < 1
            or n == run_threads):
        return None
    return (f"the calibration was measured with {n} CPU thread{'s' if n != 1 else ''} and this run used "
            f"{run_threads}: its rates and per-op costs describe {n}-thread execution (`perfcheck calibrate "
            f"--threads {run_threads}` measures the run's setting)")
