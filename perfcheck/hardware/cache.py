"""Per-user calibration cache: ``perfcheck calibrate`` keeps this machine's result, and every
prediction made without an explicit system uses it when it matches the device, else the datasheet.

Where: ``$PERFCHECK_CACHE_DIR``, else ``$XDG_CACHE_HOME/perfcheck``, else ``~/.cache/perfcheck``.
One file per *fingerprint*: host name and machine id (``/etc/machine-id``: cloud VMs are often all
named alike, e.g. ``vm``, and a faster or slower host must not reuse another's host constants),
device (CPU model or GPU name), torch version and, on a CPU, the intra-op thread count (a 1-thread calibration does not describe a 16-thread run). The file
name is a readable slug plus a hash of the fingerprint, so a match is an exact match; the
fingerprint is also stored in the spec's description for a reader.

``resolve_system(device, threads, calibrate=...)`` is what the edges call once when no system is given
(``perfcheck.estimate``, ``PerfCheck``, the CLI): the cached calibration for this device and thread
count, else the labelled datasheet default (``perfcheck.hardware.labels``: "cpu (datasheet: default, no
calibration of this machine ...)"). ``spec_label(spec)`` is the header every report prints; for a
calibration it says when it was taken, with how many threads and under what load.

Automatic quick calibration (CPU): only where ``resolve_system(calibrate=True)`` is called, i.e. a
measuring session (``PerfCheck``, ``perfcheck run``); a prediction (``perfcheck.estimate``) or a report
never runs a benchmark. When the cache has no entry for this CPU and thread count, it measures one
first (``perfcheck calibrate --quick`` without collectives: host constants, per-op fixed costs, copy,
elementwise and fp32 GEMM curves, a bf16 peak; 3-8 s with one thread on the project's 2-core VM) and
keeps it only when it passes ``perfcheck.hardware.calibrate.sanity`` (not taken under contention,
within physical bounds, near the machine's previous calibration); else it says why on stderr and the
prediction uses the datasheet. It is announced on stderr once and named in every report header
("cpu-auto-calibrated (calibrated: automatic quick calibration, per-user cache ...; taken ... with N
threads; load ...)"). Off with ``PERFCHECK_AUTO_CALIBRATE=0`` (the tests set it), in a rank of a
multi-process job (``WORLD_SIZE`` > 1 or torch.distributed initialised: ranks would calibrate at once on
shared cores; ``perfcheck sweep`` calibrates before it starts them), on a GPU (``perfcheck calibrate``
there: its cases need the device to itself), and while another process is calibrating (never waited
on: that prediction uses the datasheet). ``perfcheck calibrate --show`` lists the cache, ``--clear``
deletes this machine's entry.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sys
import time
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
    return {"host": socket.gethostname(), "machine": machine_id(), "device_type": dev.type, "device": name,
            "torch": torch.__version__, "threads": threads}


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


def cached_spec(device=None, threads=None, *, auto: bool = True) -> Optional[SystemSpec]:
    """This machine's cached calibration (for ``threads`` CPU threads, default torch's current
    setting), or None (no file, or one that no longer loads). ``auto``: when there is no file and
    ``auto_calibration_allowed`` says so, measure a quick one first (``auto_calibrate``)."""
    path = cache_path(device, threads=threads)
    if not path.is_file():
        return auto_calibrate(device, threads) if auto and auto_calibration_allowed(device) else None
    try:
        spec = load_system(str(path))
    except UserError:
        return None  # a stale or broken cache never blocks a prediction: the datasheet is used
    object.__setattr__(spec, "origin", _origin(spec, path))
    return spec


# ------------------------------------------------------------------------------ automatic quick calibration
#: Environment variable that turns the automatic quick calibration off: 0, false, no or off.
AUTO_ENV = "PERFCHECK_AUTO_CALIBRATE"
#: A lock older than this is a crashed calibration's, and is taken over.
_STALE_LOCK_S = 300.0


def _origin(spec: SystemSpec, path) -> str:
    if spec.name == AUTO_NAME:
        return f"automatic quick calibration, per-user cache {path}; `perfcheck calibrate` measures more"
    return f"per-user cache {path}"


def torch_threads(threads=None) -> str:
    import torch

    n = threads or torch.get_num_threads()
    return f"{n} thread{'s' if n != 1 else ''}"


def auto_calibration_enabled() -> bool:
    """False when ``$PERFCHECK_AUTO_CALIBRATE`` is 0, false, no or off (anything else, or unset: on)."""
    return os.environ.get(AUTO_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def auto_calibration_allowed(device=None) -> bool:
    """Enabled, a CPU, and not a rank of a multi-process job (see the module docstring)."""
    import torch

    if not auto_calibration_enabled():
        return False
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type != "cpu":
        return False
    world = os.environ.get("WORLD_SIZE", "1").strip()
    if world.isdigit() and int(world) > 1:  # a malformed WORLD_SIZE is the launcher's problem: one process here
        return False
    dist = getattr(torch, "distributed", None)
    return not (dist is not None and dist.is_available() and dist.is_initialized())


def auto_calibrate(device=None, threads=None, progress=None) -> Optional[SystemSpec]:
    """Measure a quick calibration of this CPU (no collectives) for ``threads`` threads, keep it in the
    cache and return it (origin set); None, with one line on stderr, when another process is
    calibrating (no waiting), when other processes keep the cores busy (``sanity.busy_now``, asked first),
    when the result fails the sanity checks (``refusals``) or the calibration fails (the prediction then
    uses the datasheet).
    ``progress``: called with one-line messages (default: the announcement goes to stderr)."""
    import torch

    from perfcheck.hardware.calibrate.run import calibrate

    say = progress or (lambda m: print(m, file=sys.stderr, flush=True))
    path = cache_path(device, threads=threads)
    lock = path.with_name(path.name + ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if lock.exists() and time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            lock.unlink(missing_ok=True)
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        say(f"perfcheck: another process is calibrating this CPU ({lock}); this prediction uses the datasheet")
        return None
    except OSError as exc:
        say(f"perfcheck: cannot write the calibration cache {path.parent} ({exc.strerror}); this prediction uses "
            f"the datasheet (set PERFCHECK_CACHE_DIR, or {AUTO_ENV}=0 to skip)")
        return None
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        from perfcheck.hardware.calibrate import sanity

        n = threads or torch.get_num_threads()
        # one thread: timed with this process's CPU time, which a neighbour's load does not enter (a busy
        # machine is then no reason to wait: sanity.contention); more threads: the wall clock, and only on free cores
        clock = "process" if n == 1 else "wall"
        busy = sanity.busy_now(n) if clock == "wall" else None
        if busy:
            now = busy.replace("taken under contention: ", "").split(", so")[0]
            say(f"perfcheck: no calibration of this CPU ({torch_threads(threads)}) in the cache, and none is measured "
                f"now ({now}). This prediction uses the datasheet; run `perfcheck calibrate` when the machine is quiet")
            return None
        say(f"perfcheck: no calibration of this CPU ({torch_threads(threads)}) in the cache: measuring a quick one "
            f"(once; 3-5 s on an idle CPU, up to ~25 s on busy cores; {AUTO_ENV}=0 skips it, `perfcheck calibrate` "
            f"measures more)")
        t0 = time.perf_counter()
        # it runs inside the user's process (at a PerfCheck's stop, say): the random inputs of its cases
        # come from a forked CPU generator, so the user's random stream after it is what it would have been
        with torch.random.fork_rng(devices=[]):
            result = calibrate("cpu", mode="quick", device="cpu", comm=False, threads=threads, name=AUTO_NAME,
                               clock=clock)
        why = refusals(result.spec, device, threads)
        if why:
            say(f"perfcheck: the automatic calibration ({time.perf_counter() - t0:.1f} s) was not kept: "
                f"{'; '.join(why)}. This prediction uses the datasheet; run `perfcheck calibrate` when the machine "
                f"is quiet")
            return None
        result.spec.save(path)  # atomic (temp file + rename): a reader sees no file or a whole one
        say(f"perfcheck: calibrated in {time.perf_counter() - t0:.1f} s, kept in {path}")
    except (OSError, RuntimeError, UserError) as exc:
        say(f"perfcheck: automatic calibration failed ({exc}); this prediction uses the datasheet")
        return None
    finally:
        lock.unlink(missing_ok=True)
    return cached_spec(device, threads, auto=False)


def refusals(spec: SystemSpec, device=None, threads=None) -> list:
    """Why ``spec`` must not be kept as this machine's calibration (sanity.problems against the cache
    file it would replace); empty: keep it."""
    from perfcheck.hardware.calibrate import sanity

    return sanity.problems(spec, cached_spec(device, threads, auto=False))


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


def resolve_system(device=None, threads=None, *, calibrate: bool = False, say=None) -> SystemSpec:
    """The spec of this machine, resolved once at an edge (PerfCheck, the CLI, the facade): the cached
    calibration for ``device`` and ``threads``; when there is none, a quick automatic one only where
    ``calibrate`` is True (a measuring session; never a prediction or a report) and it passes the
    sanity checks; else ``datasheet_default``."""
    spec = cached_spec(device, threads, auto=False)
    if spec is None and calibrate and auto_calibration_allowed(device):
        spec = auto_calibrate(device, threads, progress=say)
    return spec if spec is not None else datasheet_default(device)


def default_system(device=None):
    """The spec a prediction without ``system`` uses: the cached calibration for this device, else
    the labelled datasheet default (``datasheet_default``). Never calibrates."""
    return resolve_system(device)
