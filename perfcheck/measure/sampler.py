"""Background utilization sampler: NVML for the GPU this process uses, psutil for the process.

* Interval: default 0.5 s, minimum 0.1 s (NVML's utilization counter itself only updates every
  1/6 s to 1 s, so faster sampling repeats values). A smaller interval raises UserError.
* NVML ``utilization.gpu`` is a duty cycle: the share of the last sample period (1/6 s to 1 s,
  product dependent) during which *any* kernel was running on the GPU. One tiny kernel running
  all the time reads 100%. It is not SM occupancy, not achieved FLOP/s, not efficiency.
* The GPU is found by the UUID (then the PCI bus id) that torch reports for the device, so
  ``CUDA_VISIBLE_DEVICES`` renumbering is respected. Running processes are never queried per
  sample (``nvmlDeviceGetComputeRunningProcesses`` is slow, takes a driver lock, and PIDs differ
  inside containers).
* NVML missing, no driver, MIG (utilization NotSupported) or any unsupported metric: one warning
  naming what is missing, the metric reads NaN, sampling goes on with what can be read. Without
  a usable NVML the samples carry the process CPU% and RSS (psutil) only.
* ``stop()`` sets the stop event, joins the thread, and only then calls ``nvmlShutdown``.
"""
from __future__ import annotations

import math
import os
import threading
import time
import warnings
from typing import Callable

import psutil
import torch

from perfcheck.errors import UserError
from perfcheck.schema import MIN_INTERVAL_S, SAMPLE_COLUMNS

DEFAULT_INTERVAL_S = 0.5
NAN = float("nan")


def validate_interval(interval_s) -> float:
    try:
        value = float(interval_s)
    except (TypeError, ValueError):
        raise UserError(f"sample_interval must be a number of seconds, got {interval_s!r}") from None
    if not math.isfinite(value) or value < MIN_INTERVAL_S:
        raise UserError(f"sample_interval={interval_s!r} s is below the minimum of {MIN_INTERVAL_S} s "
                        "(NVML's utilization counter updates every 1/6 s to 1 s)")
    return value


class _Nvml:
    """NVML handle of one torch CUDA device; every metric read returns NaN when unsupported."""

    METRICS = ("gpu_util", "mem", "power_w", "sm_clock_hz", "temperature_c")

    def __init__(self, device_index: int, warn: Callable[[str], None]):
        import pynvml  # nvidia-ml-py; imported only here

        self.nv, self.warn = pynvml, warn
        self.dead: set[str] = set()
        pynvml.nvmlInit()
        try:
            self.handle = self._find_handle(device_index)
        except Exception:
            pynvml.nvmlShutdown()
            raise

    def _find_handle(self, index: int):
        nv = self.nv
        props = torch.cuda.get_device_properties(index)
        uuid = str(getattr(props, "uuid", "") or "")
        if uuid:
            for candidate in (uuid, f"GPU-{uuid}", f"MIG-{uuid}"):
                try:
                    return nv.nvmlDeviceGetHandleByUUID(candidate)
                except nv.NVMLError:
                    continue
        bus = getattr(props, "pci_bus_id", None)
        if bus is not None:
            pci = f"{getattr(props, 'pci_domain_id', 0):08x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
            return nv.nvmlDeviceGetHandleByPciBusId(pci)
        raise RuntimeError(f"no NVML device matches torch device cuda:{index} (uuid {uuid or 'unknown'})")

    def _read(self, metric: str, fn):
        if metric in self.dead:
            return None
        try:
            return fn()
        except self.nv.NVMLError as exc:  # NotSupported (MIG), FunctionNotFound, ...
            self.dead.add(metric)
            self.warn(f"NVML cannot read {metric} ({exc}); it will read NaN")
            return None

    def read(self) -> dict:
        nv, h = self.nv, self.handle
        util = self._read("gpu_util", lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu)
        mem = self._read("mem", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        power = self._read("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h))
        clock = self._read("sm_clock_hz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        temp = self._read("temperature_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        return {
            "gpu_util": util / 100.0 if util is not None else NAN,
            "mem_used_bytes": float(mem.used) if mem is not None else NAN,
            "mem_total_bytes": float(mem.total) if mem is not None else NAN,
            "power_w": power / 1000.0 if power is not None else NAN,
            "sm_clock_hz": clock * 1e6 if clock is not None else NAN,
            "temperature_c": float(temp) if temp is not None else NAN,
        }

    def shutdown(self):
        try:
            self.nv.nvmlShutdown()
        except Exception as exc:  # shutting down must never raise into the user's program
            self.warn(f"nvmlShutdown failed ({exc})")


#: Samples taken at MIN_INTERVAL_S from the start before the requested interval applies, and one more at
#: stop(): a run of a second or two still gets a curve of ~DENSE_SAMPLES points rather than two (default
#: chosen by perfcheck; 20 x 0.1 s = the first 2 s).
DENSE_SAMPLES = 20


class Sampler:
    """Samples on a daemon thread from ``start()``; rows follow schema.SAMPLE_COLUMNS. The first
    DENSE_SAMPLES samples come every MIN_INTERVAL_S (short runs get enough points), then every
    ``interval_s``; ``stop()`` takes a last sample, so the curve reaches the end of the run.

    ``step_fn`` returns the training step in flight; ``on_row`` (optional) receives each row as it
    is taken (the run writer appends it to samples.csv and flushes).
    """

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, *, device=None, step_fn=lambda: -1,
                 rank: int = 0, on_row: Callable[[dict], None] | None = None, use_nvml: bool = True):
        self.interval_s = validate_interval(interval_s)
        self.device, self.step_fn, self.rank, self.on_row = device, step_fn, rank, on_row
        self.use_nvml = use_nvml
        self.rows: list[dict] = []
        self.warnings: list[str] = []
        self.backend = "psutil"
        self._nvml = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process(os.getpid())
        self._mem_total = float(psutil.virtual_memory().total)

    def _warn(self, message: str):
        if message not in self.warnings:
            self.warnings.append(message)
            warnings.warn(f"perfcheck sampler: {message}", RuntimeWarning, stacklevel=3)

    def start(self):
        if self._thread is not None:
            return self
        if self.use_nvml and self.device is not None and getattr(self.device, "type", "cpu") == "cuda":
            try:
                self._nvml = _Nvml(self.device.index if self.device.index is not None else 0, self._warn)
                self.backend = "nvml+psutil"
            except Exception as exc:  # no library, no driver, no matching device
                self._warn(f"NVML unavailable ({type(exc).__name__}: {exc}); sampling process CPU and RSS only")
        self._proc.cpu_percent(None)  # prime: the first call has no interval to compare with
        self._t0 = time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="perfcheck-sampler", daemon=True)
        self._thread.start()
        return self

    def sample(self) -> dict:
        row = {c: NAN for c in SAMPLE_COLUMNS}
        row["time_s"] = time.perf_counter() - self._t0
        row["step"] = self.step_fn()
        row["rank"] = self.rank
        try:
            rss = float(self._proc.memory_info().rss)
            row["cpu_util"] = self._proc.cpu_percent(None) / 100.0
        except psutil.Error as exc:
            self._warn(f"psutil cannot read the process ({exc})")
            rss = NAN
        row["rss_bytes"] = rss
        if self._nvml is not None:
            row.update(self._nvml.read())
        else:
            row["mem_used_bytes"], row["mem_total_bytes"] = rss, self._mem_total
        return row

    def next_wait(self) -> float:
        """Seconds to the next sample: MIN_INTERVAL_S for the first DENSE_SAMPLES, then ``interval_s``."""
        return min(self.interval_s, MIN_INTERVAL_S) if len(self.rows) < DENSE_SAMPLES else self.interval_s

    def _take(self) -> bool:
        try:
            row = self.sample()
            self.rows.append(row)
            if self.on_row is not None:
                self.on_row(row)
            return True
        except Exception as exc:  # a sampler must never take the training run down
            self._warn(f"sampling failed ({type(exc).__name__}: {exc}); stopping the sampler")
            return False

    def _run(self):
        while not self._stop.wait(self.next_wait()):
            if not self._take():
                return
        self._take()  # stop() asked: one last sample at the end of the run, on this thread like every read

    def stop(self):
        """Stop and join the thread, then shut NVML down (in that order)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout=self.interval_s + 5.0)
        if self._nvml is not None:
            self._nvml.shutdown()
            self._nvml = None
