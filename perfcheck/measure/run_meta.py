"""meta.json of a rank directory: what the run was (versions, device, model, inputs, layout, options)
and what it recorded (steps by role, micro-batches, overhead, warnings). A mixin of the recording
session (``measure.session.Recorder``)."""
from __future__ import annotations

import os
import socket
import statistics

import torch

import perfcheck.rundir as runs
from perfcheck.hardware.systems import SystemSpec, list_systems, load_system
from perfcheck.measure import memory as memory_mod
from perfcheck.measure.context import device_name, model_dtype, parallel_setup, versions
from perfcheck.measure.optimizers import OptimizerWatch
from perfcheck.predict.for_run import factory_of
from perfcheck.schema import ROOT, SCHEMA_VERSION

BACKWARD_RULE = ("backward of a module = from the first gradient of its outputs to the earliest of: all "
                 "needed input gradients ready; the backward of a module outside its subtree starting; "
                 "an enclosing module's backward ending; the end of the backward pass (queue_callback). "
                 "Recompute inside the interval is subtracted.")



def micro_batches(step_rows) -> float | int | None:
    """Root forward calls per step (gradient-accumulation micro-batches between ``step()`` calls), the
    median over measured, non-failed steps (else over every instrumented step); None before any step.
    Reports scale the one-micro-batch prediction by it (analysis.pipeline)."""
    counts = [r["micro_batches"] for r in step_rows if r["role"] == "measured" and not r["failed"]]
    if not counts:
        counts = [r["micro_batches"] for r in step_rows if r["role"] != "bare" and r["micro_batches"] > 0]
    if not counts:
        return None
    value = statistics.median(counts)
    return int(value) if float(value).is_integer() else float(value)


def synced_micro_batches(step_rows, synced: dict):
    """Median over measured steps of the micro-batches whose backward reduced gradients (DDP/FSDP2;
    ``measure.grad_sync.GradSyncCounter``), None for other models or before a step."""
    counts = [synced[r["step"]] for r in step_rows if r["role"] == "measured" and not r["failed"] and r["step"] in synced]
    return statistics.median(counts) if counts else None



class RunMeta:
    """The recording session's metadata (``meta()``, what meta.json holds)."""

    def _system_name(self):
        if self.system is None or isinstance(self.system, SystemSpec):
            return None if self.system is None else self.system.name
        return str(load_system(self.system).name if str(self.system) in list_systems() else self.system)

    def _compute_dtype(self, started: bool):
        """The dtype the model computes in: autocast's when its first call ran under autocast, else the parameters'."""
        inputs = self._timer.first_root_inputs if started else None
        return (inputs or {}).get("autocast") or model_dtype(self._view.root)

    def _optimizer_meta(self) -> dict:
        """meta.json ``optimizer`` (measure/optimizers.py), ``optimizer_source``, ``optimizers_seen``."""
        watch = getattr(self, "_optimizers", None)
        return (watch if watch is not None else OptimizerWatch(self._view.root, self._optimizer_arg)).meta()

    def meta(self, complete: bool = True, files=None, row_counts=None) -> dict:
        """The run's metadata (what meta.json holds)."""
        view, started = self._view, self._state != "new"
        rows = self._step_rows
        roles = {}
        for r in rows:
            roles[r["role"]] = roles.get(r["role"], 0) + 1
        parallel = parallel_setup(view, self.world_size if started else 1)
        parallel.update(self.user_parallel)
        notes = [memory_mod.CUDA_NOTE if self.track_memory else (memory_mod.OFF_NOTE if self.device.type == "cuda" else memory_mod.CPU_NOTE),
                 "gpu_util (NVML) is a duty cycle: the share of a 1/6 s to 1 s window in which any kernel ran; "
                 "it is not SM occupancy or efficiency."]
        return {
            "schema_version": SCHEMA_VERSION, "complete": bool(complete), "files": list(files or []) or [
                f for k, (f, _) in runs.TABLES.items() if k in getattr(self, "_writers", {})],
            "rows": dict(row_counts or {}),  # data rows per file as written: a reader tells a truncated file
            "interrupted": self.interrupted,
            "run_id": getattr(self, "run_id", None), "hostname": socket.gethostname(), "pid": os.getpid(),
            "started_unix": getattr(self, "_t_start", None), "rank": getattr(self, "rank", 0),
            "world_size": getattr(self, "world_size", 1), "versions": versions(),
            "torch_threads": torch.get_num_threads(),  # CPU intra-op threads (a calibration is per thread count)
            "device": {"type": self.device.type, "index": self.device.index, "name": device_name(self.device)},
            "model": {"type": view.types.get(ROOT), "dtype": model_dtype(view.root),
                      "params": int(sum(getattr(p, "ds_numel", p.numel()) for p in view.root.parameters())),
                      "wrappers": view.wrappers, "compiled": view.compiled,
                      "factory": factory_of(view.root)},  # "module:callable" a report rebuilds the model from
            "dtype": self._compute_dtype(started),
            "inputs": self._timer.first_root_inputs if started else None,
            "parallel": parallel,
            "system": self._system_name(),
            "options": {"warmup": self.warmup, "steps": self.n_steps, "profile": self.profile,
                        "profile_window": list(self.profile_window), "count_flops": self.count_flops,
                        "sample_interval_s": self.sample_interval, "memory": self.track_memory,
                        "overhead_pairs": self.overhead_pairs, "depth": self.depth,
                        "modules": None if self._selection is None else self._selection["modules"]},
            "selection": self._selection or "all modules",
            "step_count": len(rows), "steps_by_role": roles,
            "measured_steps": sum(1 for r in rows if r["role"] == "measured" and not r["failed"]),
            "failed_steps": sum(1 for r in rows if r["failed"]),
            "module_steps_dropped": self._dropped_steps,
            **self._optimizer_meta(),
            "micro_batches": micro_batches(rows),
            "grad_sync_micro_batches": synced_micro_batches(rows, getattr(self, "_synced", {})),
            "timing": {"clock": "cuda events (pooled, resolved after the step)" if self.device.type == "cuda"
                       else "time.perf_counter_ns", "backward": BACKWARD_RULE},
            "overhead": self._overhead,
            "page_faults": self._faults_meta(),  # measure/fault_record.py
            "profile": (self._window.info if self._window is not None else {}) if self.profile else "off",
            "sampler": ({"interval_s": self.sample_interval, "backend": self._sampler.backend if getattr(self, "_sampler", None) else None}
                        if self.sample_interval is not None else "off"),
            "flops": "counted (FlopCounterMode, one step)" if self._flops else ("off" if not self.count_flops else "not reached"),
            "notes": notes, "warnings": list(self._warnings),
        }
