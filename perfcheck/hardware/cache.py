"""Per-user calibration cache: ``perfcheck calibrate`` keeps this machine's result, and every
prediction made without an explicit system uses it when it matches the device, else the datasheet.

Where: ``$PERFCHECK_CACHE_DIR``, else ``$XDG_CACHE_HOME/perfcheck``, else ``~/.cache/perfcheck``.
One file per *fingerprint*: host name and machine id (``/etc/machine-id``: cloud VMs are often all
named alike, e.g. ``vm``, and a faster or slower host must not reuse another's host constants),
device (CPU model or GPU name), torch version, the calibration's format and, on a CPU, the intra-op thread count (a
1-thread calibration does not describe a 16-thread run). The file
name is a readable slug plus a hash of the fingerprint, so a match is an exact match; the
fingerprint is also stored in the spec's description for a reader.

``resolve_system(device, threads)`` is what the edges of a prediction or a report call once when no
system is given (``perfcheck.estimate``, the CLI): the cached calibration for this device and thread
count, else the labelled datasheet default (``perfcheck.hardware.labels``: "cpu (datasheet: default, no
calibration of this machine ...)"). ``spec_label(spec)`` is the header every report prints; for a
calibration it says when it was taken, with how many threads and under what load.

This module reads and writes files and runs nothing: the automatic quick calibration that a measuring
session may run when the cache has no entry is ``perfcheck.calibrate.auto`` (a floor above: it runs
the calibration cases, which use ``perfcheck.predict``). ``perfcheck calibrate --show`` lists the
cache, ``--clear`` deletes this machine's entry.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import socket
from pathlib import Path
from typing import Optional

from perfcheck.errors import UserError
from perfcheck.hardware.labels import AUTO_NAME, NO_CALIBRATION, datasheet_default, spec_label  # noqa: F401
from perfcheck.hardware.systems import SystemSpec, load_system


def cache_dir() -> Path:
    """The cache folder (not created here)."""
    if os.environ.get("PERFCHECK_CACHE_DIR"):
        return Path(os.environ["PERFCHECK_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "perfcheck"


#: The calibration's format: bumped when ``perfcheck calibrate`` gains or changes the cases a spec's fields come
#: from (3: the optimizer's sqrt of zeros, a GPU's strided element rate, the DeepSpeed case and the reference
#: record read against the references; 4: the depthwise 5x5 backward's per-call cases; 5: the BatchNorm cases).
#: Part of the fingerprint, so a file another format wrote is not read: the automatic calibration measures this
#: machine anew once, instead of predicting without the newer fields.
CALIBRATION_FORMAT = 5


def fingerprint(device=None, threads=None) -> dict:
    """What a calibration depends on: host, device name, torch version (and CPU threads: ``threads``,
    default torch's current setting), and the calibration's format (``CALIBRATION_FORMAT``)."""
    import torch

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        name, threads = torch.cuda.get_device_name(dev), None
    else:
        name, threads = cpu_name().rsplit(",", 1)[0], threads or torch.get_num_threads()
    return {"host": socket.gethostname(), "machine": machine_id(), "device_type": dev.type, "device": name,
            "torch": torch.__version__, "threads": threads, "format": CALIBRATION_FORMAT}


def cpu_name() -> str:
    """"<CPU model>, <N> threads" (torch's intra-op setting): what a CPU calibration describes."""
    try:
        with open("/proc/cpuinfo") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
    except OSError:
        names = []  # no /proc (not Linux): platform's name below
    name = names[0] if names else (platform.processor() or platform.machine())
    return f"{name}, {torch_threads()}"


def machine_id() -> str:
    """This machine's systemd/D-Bus machine id ("" where there is none: then the host name alone)."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value:
            return value
    return ""


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
    setting), or None (no file, or one that no longer loads). Reads only: measuring one when there is
    none is ``perfcheck.calibrate.auto.cached_spec``."""
    path = cache_path(device, threads=threads)
    if not path.is_file():
        return None
    try:
        spec = load_system(str(path))
    except UserError:
        return None  # a stale or broken cache never blocks a prediction: the datasheet is used
    object.__setattr__(spec, "origin", _origin(spec, path))
    return spec


def _origin(spec: SystemSpec, path) -> str:
    if spec.name == AUTO_NAME:
        return f"automatic quick calibration, per-user cache {path}; `perfcheck calibrate` measures more"
    return f"per-user cache {path}"


def torch_threads(threads=None) -> str:
    import torch

    n = threads or torch.get_num_threads()
    return f"{n} thread{'s' if n != 1 else ''}"


def clear(device=None, threads=None, *, every: bool = False) -> list:
    """Delete this machine's calibration for ``threads`` (default torch's setting), or with ``every``
    all calibrations in the cache folder; returns the deleted paths."""
    paths = sorted(cache_dir().glob("*.json")) if every else [cache_path(device, threads=threads)]
    gone = []
    for p in paths:
        try:
            p.unlink()
            gone.append(p)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise UserError(f"calibration cache: cannot delete {p} ({exc.strerror})") from None
    return gone


def cached_files() -> list:
    """Every calibration file in the cache folder, sorted."""
    return sorted(cache_dir().glob("*.json")) if cache_dir().is_dir() else []


def resolve_system(device=None, threads=None) -> SystemSpec:
    """The spec of this machine for a prediction or a report, resolved once at an edge (the facade,
    the CLI): the cached calibration for ``device`` and ``threads``, else ``datasheet_default``. Never
    calibrates (a measuring session's edge that may: ``perfcheck.calibrate.auto.resolve_system``)."""
    spec = cached_spec(device, threads)
    return spec if spec is not None else datasheet_default(device)


def default_system(device=None):
    """The spec a prediction without ``system`` uses: the cached calibration for this device, else
    the labelled datasheet default (``datasheet_default``). Never calibrates."""
    return resolve_system(device)
