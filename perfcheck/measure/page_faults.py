"""Page faults per step and per phase (forward, backward, optimizer): the process's fault counters read at
the phase boundaries the module timer already sees.

Why: memory that a training step frees and allocates again is first-touched again every step. A block the C
allocator handed back to the OS (glibc returns a chunk above its mmap threshold with ``munmap``, and trims
the heap top above ``M_TRIM_THRESHOLD``) comes back as fresh pages, and the first write to each page is a
minor fault: the kernel maps and zeroes a 4 KiB page. ``optimizer.zero_grad(set_to_none=True)`` (torch's
default) frees every gradient, so the next backward allocates and first-touches them again; on a CPU that is
time inside ``bwd_s`` that no FLOP or byte count predicts. Whether it happens depends on the allocator's
state (glibc's dynamic mmap threshold grows after a freed mmapped chunk, up to 32 MiB on 64-bit), so it is
measured, not predicted.

Counters: ``resource.getrusage(RUSAGE_SELF)`` ``ru_minflt`` / ``ru_majflt`` (the whole process: faults
taken by torch's intra-op threads count too; about 1 us per read); where ``resource`` is absent (Windows)
psutil's ``memory_info()`` (``num_page_faults``: every fault, counted as minor; ``pfaults``/``pageins`` on
macOS). Neither: nothing is recorded (NaN columns, meta.json says so).

Phases, as the timer cuts the step (``PhaseFaults.enter`` is called from ``measure.timer``):

* fwd: from the start of a root training forward to its return;
* bwd: from the first instrumented autograd node of a backward pass to the pass's end (autograd's final
  callback, ``queue_callback``): the loss's own backward nodes before that are not in it;
* optim: from the end of the step's last root forward or backward to the step's end (``step()``): the
  optimizer, zero_grad and whatever else the loop runs there, as ``optim_s``. An eval (grad-disabled)
  forward after the backward counts here (``optim_s`` subtracts its time; its faults are not split off);
* step: from the step's start to its end (all of the above, plus the loss, data loading and anything
  before the forward or between phases).

CUDA: not covered. The GPU analogue (the caching allocator's cudaMalloc/cudaFree churn,
``torch.cuda.memory_stats()`` ``num_alloc_retries`` / ``num_device_alloc``) is not recorded here.
"""
from __future__ import annotations

try:
    import resource
except ImportError:  # Windows
    resource = None

#: steps.csv columns this module fills (schema.STEP_COLUMNS documents them).
FAULT_PHASES = ("fwd", "bwd", "optim", "step")
FAULT_COLUMNS = tuple(f"{kind}_faults_{p}" for kind in ("minor", "major") for p in FAULT_PHASES)

#: Timer states: before the first forward or between phases (OTHER), inside a phase, and TAIL: after a root
#: forward or backward ended; a TAIL followed by another forward or backward was "other", one that lasts to
#: the step's end is the optimizer part (``optim_s`` starts at the same point).
OTHER, FWD, BWD, TAIL = "other", "fwd", "bwd", "tail"


def page_bytes() -> int | None:
    """The size of one page (the memory a minor fault maps), bytes; None where unknown."""
    if resource is not None:
        return int(resource.getpagesize())
    try:
        import mmap
        return int(mmap.PAGESIZE)
    except (ImportError, AttributeError):
        return None


def rusage_reader():
    """``read() -> (minor, major)`` faults of this process so far from ``getrusage``, else None."""
    if resource is None:
        return None
    get, who = resource.getrusage, resource.RUSAGE_SELF

    def read():
        r = get(who)
        return r.ru_minflt, r.ru_majflt
    try:
        read()
    except (OSError, ValueError):
        return None
    return read


def psutil_reader(process=None):
    """``read() -> (minor, major)`` from psutil's ``memory_info()`` (Windows ``num_page_faults``: every fault,
    as minor, major 0; macOS ``pfaults``/``pageins``), else None (no psutil, or no such fields)."""
    if process is None:
        try:
            import psutil  # optional: the sampler's dependency
        except ImportError:
            return None
        try:
            process = psutil.Process()
        except Exception:  # noqa: BLE001 - any psutil failure: no counter
            return None
    info = process.memory_info()
    if hasattr(info, "num_page_faults"):
        return lambda: (process.memory_info().num_page_faults, 0)
    if hasattr(info, "pfaults"):
        def read():
            m = process.memory_info()
            return m.pfaults - getattr(m, "pageins", 0), getattr(m, "pageins", 0)
        return read
    return None


def fault_reader():
    """``(read, name)``: the best counter of this platform (getrusage, else psutil), or ``(None, why)``."""
    read = rusage_reader()
    if read is not None:
        return read, "resource.getrusage(RUSAGE_SELF) ru_minflt/ru_majflt (whole process)"
    read = psutil_reader()
    if read is not None:
        return read, "psutil memory_info() page faults (whole process)"
    return None, "no page-fault counter on this platform (no resource module, no psutil fault fields)"


class PhaseFaults:
    """Fault counts of one step, cut at the timer's phase boundaries (see the module docstring).

    ``begin_step()``; ``enter(phase)`` at each boundary (``FWD``, ``BWD``, ``TAIL``); ``end_step()`` returns
    ``{column: count}`` over ``FAULT_COLUMNS``."""

    __slots__ = ("_read", "_last", "_start", "_state", "_acc")

    def __init__(self, read):
        self._read = read
        self._state = None

    def begin_step(self):
        self._start = self._last = self._read()
        self._state = OTHER
        self._acc = {OTHER: [0, 0], FWD: [0, 0], BWD: [0, 0], TAIL: [0, 0]}

    def enter(self, phase: str):
        """A boundary: the faults since the last one go to the state that ends here."""
        if self._state is None:
            return
        now = self._read()
        self._charge(now)
        if phase in (FWD, BWD) and self._state == TAIL:  # the tail was not the step's last part: "other"
            tail, other = self._acc[TAIL], self._acc[OTHER]
            other[0] += tail[0]
            other[1] += tail[1]
            tail[0] = tail[1] = 0
        self._state = phase

    def _charge(self, now):
        acc, last = self._acc[self._state], self._last
        acc[0] += now[0] - last[0]
        acc[1] += now[1] - last[1]
        self._last = now

    def end_step(self) -> dict:
        """``{FAULT_COLUMNS: count}`` of the step (minor and major; the optimizer part is the tail)."""
        if self._state is None:
            return {}
        now = self._read()
        self._charge(now)
        acc = self._acc
        out = {}
        for i, kind in enumerate(("minor", "major")):
            out[f"{kind}_faults_fwd"] = acc[FWD][i]
            out[f"{kind}_faults_bwd"] = acc[BWD][i]
            out[f"{kind}_faults_optim"] = acc[TAIL][i]
            out[f"{kind}_faults_step"] = now[i] - self._start[i]
        self._state = None
        return out
