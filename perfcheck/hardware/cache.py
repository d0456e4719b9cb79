"""Per-user calibration cache: ``perfcheck calibrate`` keeps this machine's result, and every
prediction made without an explicit system uses it when it matches the device, else the datasheet.

Where: ``$PERFCHECK_CACHE_DIR``, else ``$XDG_CACHE_HOME/perfcheck``, else ``~/.cache/perfcheck``.
One file per *fingerprint*: host name, device (CPU model or GPU name), torch version and, on a CPU,
the intra-op thread count (a 1-thread calibration does not describe a 16-thread run). The file
name is a readable slug plus a hash of the fingerprint, so a match is an exact match; the
fingerprint is also stored in the spec's description for a reader.

``default_system(device)`` is what ``perfcheck.estimate``, ``PerfCheck`` and the ZeRO sweep call
when no system is given; ``spec_label(spec)`` is the header every report prints ("cpu-calibrated
(calibrated: per-user cache ~/.cache/perfcheck/...json)" or "h100-sxm (datasheet)").
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from pathlib import Path
from typing import Optional

from perfcheck.errors import UserError
from perfcheck.hardware.systems import SystemSpec, load_system, match_device_name


def cache_dir() -> Path:
    """The cache folder (not created here)."""
    if os.environ.get("PERFCHECK_CACHE_DIR"):
        return Path(os.environ["PERFCHECK_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "perfcheck"


def fingerprint(device=None, threads=None) -> dict:
    """What a calibration depends on: host, device name, torch version (and CPU threads: ``threads``,
    default torch's current setting)."""
    import torch

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        name, threads = torch.cuda.get_device_name(dev), None
    else:
        from perfcheck.hardware.calibrate.run import cpu_name

        name, threads = cpu_name().rsplit(",", 1)[0], threads or torch.get_num_threads()
    return {"host": socket.gethostname(), "device_type": dev.type, "device": name, "torch": torch.__version__,
            "threads": threads}


def cache_path(device=None, fp: Optional[dict] = None, threads=None) -> Path:
    fp = fp or fingerprint(device, threads)
    digest = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:12]
    slug = re.sub(r"[^a-z0-9]+", "-", f"{fp['host']}-{fp['device']}".lower()).strip("-")[:60]
    threads = f"-{fp['threads']}t" if fp.get("threads") else ""
    return cache_dir() / f"{slug}{threads}-{digest}.json"


def save_to_cache(spec: SystemSpec, device=None, threads=None) -> Path:
    """Write ``spec`` as this machine's calibration (measured with ``threads`` CPU threads, default
    torch's current setting); returns the path. UserError if it cannot be written."""
    path = cache_path(device, threads=threads)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return spec.save(path)
    except OSError as exc:
        raise UserError(f"calibration cache: cannot write {path} ({exc.strerror}); set PERFCHECK_CACHE_DIR") from None


def cached_spec(device=None, threads=None) -> Optional[SystemSpec]:
    """This machine's cached calibration (for ``threads`` CPU threads, default torch's current
    setting), or None (no file, or one that no longer loads)."""
    path = cache_path(device, threads=threads)
    if not path.is_file():
        return None
    try:
        spec = load_system(str(path))
    except UserError:
        return None  # a stale or broken cache never blocks a prediction: the datasheet is used
    object.__setattr__(spec, "origin", f"per-user cache {path}")
    return spec


def default_system(device=None):
    """The spec a prediction without ``system`` uses: the cached calibration for this device, else
    the built-in datasheet entry (``cpu``, or the GPU's by name)."""
    import torch

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cached = cached_spec(dev)
    if cached is not None:
        return cached
    return load_system("cpu" if dev.type != "cuda" else match_device_name(torch.cuda.get_device_name(dev)))


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
        return f"{spec.name} (calibrated: {origin or 'given as a spec'})"
    return f"{spec.name} (datasheet{': ' + origin if origin and not origin.startswith('built-in') else ''})"
