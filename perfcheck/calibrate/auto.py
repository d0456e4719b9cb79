"""The automatic quick calibration of a CPU with no cache entry, and the edge that may run it.

Only where ``resolve_system(calibrate=True)`` is called, i.e. a measuring session (``PerfCheck``,
``perfcheck run``); a prediction (``perfcheck.estimate``) or a report resolves its system with
``perfcheck.hardware.cache.resolve_system``, which reads the cache and never runs a benchmark. When the
cache has no entry for this CPU and thread count, it measures one first (``perfcheck calibrate --quick``
without collectives: host constants, per-op fixed costs, copy, elementwise and fp32 GEMM curves, a bf16
peak; 3-8 s with one thread on the project's 2-core VM) and keeps it only when it passes
``perfcheck.calibrate.sanity`` (not taken under contention, within physical bounds, near the machine's
previous calibration); else it says why on stderr and the prediction uses the datasheet. It is
announced on stderr once and named in every report header ("cpu-auto-calibrated (calibrated: automatic
quick calibration, per-user cache ...; taken ... with N threads; load ...)"). Off with
``PERFCHECK_AUTO_CALIBRATE=0`` (the tests set it), in a rank of a multi-process job (``WORLD_SIZE`` > 1
or torch.distributed initialised: ranks would calibrate at once on shared cores; ``perfcheck sweep``
calibrates before it starts them), on a GPU (``perfcheck calibrate`` there: its cases need the device
to itself), and while another process is calibrating (never waited on: that prediction uses the
datasheet). The cache itself (where, fingerprint, read, write, clear) is ``perfcheck.hardware.cache``.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Optional

import torch

from perfcheck.calibrate import run as calrun
from perfcheck.calibrate import sanity
from perfcheck.errors import UserError
from perfcheck.hardware import cache
from perfcheck.hardware.labels import AUTO_NAME, datasheet_default
from perfcheck.hardware.systems import SystemSpec

#: Environment variable that turns the automatic quick calibration off: 0, false, no or off.
AUTO_ENV = "PERFCHECK_AUTO_CALIBRATE"
#: A lock older than this is a crashed calibration's, and is taken over.
_STALE_LOCK_S = 300.0


def auto_calibration_enabled() -> bool:
    """False when ``$PERFCHECK_AUTO_CALIBRATE`` is 0, false, no or off (anything else, or unset: on)."""
    return os.environ.get(AUTO_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def auto_calibration_allowed(device=None) -> bool:
    """Enabled, a CPU, and not a rank of a multi-process job (see the module docstring)."""
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


def cached_spec(device=None, threads=None, *, auto: bool = True) -> Optional[SystemSpec]:
    """This machine's cached calibration (``perfcheck.hardware.cache.cached_spec``), or None. ``auto``:
    when there is no file and ``auto_calibration_allowed`` says so, measure a quick one first
    (``auto_calibrate``)."""
    if not cache.cache_path(device, threads=threads).is_file():
        return auto_calibrate(device, threads) if auto and auto_calibration_allowed(device) else None
    return cache.cached_spec(device, threads)


def resolve_system(device=None, threads=None, *, calibrate: bool = False, say=None) -> SystemSpec:
    """The spec of this machine, resolved once at the edge of a measuring session (PerfCheck, ``perfcheck
    run``): the cached calibration for ``device`` and ``threads``; when there is none, a quick automatic
    one only where ``calibrate`` is True and it passes the sanity checks; else ``datasheet_default``.
    With ``calibrate`` False it is ``perfcheck.hardware.cache.resolve_system``."""
    spec = cache.cached_spec(device, threads)
    if spec is None and calibrate and auto_calibration_allowed(device):
        spec = auto_calibrate(device, threads, progress=say)
    return spec if spec is not None else datasheet_default(device)


def _take_lock(path, say):
    """The lock file's descriptor beside ``path`` (a stale one taken over), or None with one line said
    (another process calibrates, or the cache folder cannot be written)."""
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
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return lock


def _measure_and_keep(path, device, threads, say) -> bool:
    """Measure the quick calibration and write it to ``path`` when the sanity checks keep it; False
    (with one line said) when the cores are busy or the checks refuse it."""
    n = threads or torch.get_num_threads()
    # one thread: timed with this process's CPU time, which a neighbour's load does not enter (a busy
    # machine is then no reason to wait: sanity.contention); more threads: the wall clock, and only on free cores
    clock = "process" if n == 1 else "wall"
    busy = sanity.busy_now(n) if clock == "wall" else None
    if busy:
        now = busy.replace("taken under contention: ", "").split(", so")[0]
        say(f"perfcheck: no calibration of this CPU ({cache.torch_threads(threads)}) in the cache, and none is "
            f"measured now ({now}). This prediction uses the datasheet; run `perfcheck calibrate` when the machine "
            f"is quiet")
        return False
    say(f"perfcheck: no calibration of this CPU ({cache.torch_threads(threads)}) in the cache: measuring a quick one "
        f"(once; 3-5 s on an idle CPU, up to ~25 s on busy cores; {AUTO_ENV}=0 skips it, `perfcheck calibrate` "
        f"measures more)")
    t0 = time.perf_counter()
    # it runs inside the user's process (at a PerfCheck's stop, say): the random inputs of its cases
    # come from a forked CPU generator, so the user's random stream after it is what it would have been
    with torch.random.fork_rng(devices=[]):
        result = calrun.calibrate("cpu", mode="quick", device="cpu", comm=False, threads=threads, name=AUTO_NAME,
                                  clock=clock)
    why = refusals(result.spec, device, threads)
    if why:
        say(f"perfcheck: the automatic calibration ({time.perf_counter() - t0:.1f} s) was not kept: "
            f"{'; '.join(why)}. This prediction uses the datasheet; run `perfcheck calibrate` when the machine "
            f"is quiet")
        return False
    result.spec.save(path)  # atomic (temp file + rename): a reader sees no file or a whole one
    say(f"perfcheck: calibrated in {time.perf_counter() - t0:.1f} s, kept in {path}")
    return True


def auto_calibrate(device=None, threads=None, progress=None) -> Optional[SystemSpec]:
    """Measure a quick calibration of this CPU (no collectives) for ``threads`` threads, keep it in the
    cache and return it (origin set); None, with one line on stderr, when another process is
    calibrating (no waiting), when other processes keep the cores busy (``sanity.busy_now``, asked first),
    when the result fails the sanity checks (``refusals``) or the calibration fails (the prediction then
    uses the datasheet).
    ``progress``: called with one-line messages (default: the announcement goes to stderr)."""
    say = progress or (lambda m: print(m, file=sys.stderr, flush=True))
    path = cache.cache_path(device, threads=threads)
    lock = _take_lock(path, say)
    if lock is None:
        return None
    try:
        if not _measure_and_keep(path, device, threads, say):
            return None
    except (OSError, RuntimeError, UserError) as exc:
        say(f"perfcheck: automatic calibration failed ({exc}); this prediction uses the datasheet")
        return None
    finally:
        lock.unlink(missing_ok=True)
    return cache.cached_spec(device, threads)


def refusals(spec: SystemSpec, device=None, threads=None) -> list:
    """Why ``spec`` must not be kept as this machine's calibration (sanity.problems against the cache
    file it would replace); empty: keep it."""
    return sanity.problems(spec, cache.cached_spec(device, threads))
