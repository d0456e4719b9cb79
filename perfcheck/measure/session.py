"""The recording core of PerfCheck: measure training steps of a PyTorch model per module, phase and kernel.

``Recorder`` runs the steps and records them; the user-facing ``PerfCheck`` (``perfcheck.session``) adds the
predicted-vs-measured report on top. Its parts, one file each: ``arguments`` (checks at construction),
``signals`` (SIGINT/SIGTERM), ``run_files`` (frames and the run directory), ``run_meta`` (meta.json).
How a training loop uses it: ``perfcheck.session.api``'s docstring.

Steps, in order from ``start()``: ``warmup`` steps; one FlopCounterMode step if ``count_flops``;
the profiler window ``profile_window=(wait, warmup, active)`` (its wait steps are measured, its
warm-up and active steps are not: the profiler slows them); then measured steps, alternating with
``overhead_pairs`` steps run without hooks ("bare", for the in-run overhead A/B); once ``steps``
measured steps are done the hooks are removed and the model runs bare until ``stop()``.
``step()`` with nothing run since the last boundary is ignored, so calling it at the start or at
the end of each iteration both work; ``stop()`` keeps a step in flight if the root's forward ran.
"""
from __future__ import annotations

import math
import time
import uuid
import warnings
import weakref
from collections import deque

import numpy as np
import pandas as pd
import torch

import perfcheck.rundir as runs
from perfcheck.errors import UserError
from perfcheck.calibrate.auto import resolve_system
from perfcheck.hardware.systems import load_system
from perfcheck.measure import memory as memory_mod, selection
from perfcheck.measure.arguments import check_system, nonneg_int, refuse_meta_tensors
from perfcheck.measure.clocks import clock_for
from perfcheck.measure.context import model_device, model_view, rank_and_world
from perfcheck.measure.flops import FlopStep
from perfcheck.measure.grad_sync import GradSyncCounter
from perfcheck.measure.kernel_table import ProfilerWindow
from perfcheck.measure.timer import ModuleTimer
from perfcheck.measure.optimizers import OptimizerWatch, check_optimizer
from perfcheck.measure.fault_record import FaultRecord
from perfcheck.measure.page_faults import PhaseFaults
from perfcheck.measure.predicted_track import add_predicted_track
from perfcheck.measure.run_files import RunFiles
from perfcheck.measure.run_meta import RunMeta
from perfcheck.measure.sampler import DEFAULT_INTERVAL_S, Sampler, validate_interval
from perfcheck.measure.schedule import StepSchedule
from perfcheck.measure.signals import StopSignals
from perfcheck.predict.layout_collectives import (PREDICTED_COLLECTIVE_FIELDS, PREDICTED_COLLECTIVES_CSV,
                                                  per_step_collectives)
from perfcheck.predict.for_run import PREDICTED_CSV, PREDICTED_JSON, predict_for_run, save_predicted, with_step_other
from perfcheck.schema import ROOT

#: Per-step module rows kept in memory (about 120 bytes each); older steps are dropped from memory
#: (counted in meta.json ``module_steps_dropped``), module_steps.csv keeps them all.
MAX_MODULE_ROWS = 200_000
#: Finished steps whose CUDA events may still be in flight; past this the oldest is waited for.
MAX_PENDING_STEPS = 16


def outermost_paths(paths) -> list:
    """The paths in ``paths`` (``named_modules()`` names) that have no ancestor in ``paths``, in their order."""
    present = set(paths)
    out = []
    for p in paths:
        parts = p.split(".")
        if not any(".".join(parts[:i]) in present for i in range(1, len(parts))) and p not in out:
            out.append(p)
    return out


class Recorder(StopSignals, RunFiles, RunMeta, FaultRecord):
    """Per-module forward/backward/recompute times, kernel tables, samples and a run directory: the
    recording half of ``perfcheck.PerfCheck`` (its arguments are documented there)."""

    #: Every module some running PerfCheck has hooks on (weak: no attribute on user modules).
    _attached: "weakref.WeakSet" = weakref.WeakSet()

    def __init__(self, model, *, warmup: int = 1, steps: int | None = None, profile: bool = True,
                 profile_window: tuple = (0, 1, 1), count_flops: bool = False,
                 sample_interval: float | None = DEFAULT_INTERVAL_S, out_dir=None, memory: bool | None = None,
                 overhead_pairs: int = 0, parallel: dict | None = None, system=None, depth: int | None = None,
                 modules=None, optimizer=None):
        self.warmup = nonneg_int("warmup", warmup)
        self.n_steps = nonneg_int("steps", steps, allow_none=True)
        if self.n_steps == 0:
            raise UserError("steps must be at least 1 (or None to measure until stop())")
        try:
            window = tuple(nonneg_int(f"profile_window[{i}]", int(v) if not isinstance(v, bool) else v)
                           for i, v in enumerate(profile_window))
        except (TypeError, ValueError):
            raise UserError(f"profile_window must be (wait, warmup, active), got {profile_window!r}") from None
        if len(window) != 3 or window[2] < 1:
            raise UserError(f"profile_window must be (wait, warmup, active) with active >= 1, got {profile_window!r}")
        self.profile, self.profile_window = bool(profile), window
        self.count_flops = bool(count_flops)
        self.sample_interval = None if sample_interval is None else validate_interval(sample_interval)
        self.overhead_pairs = nonneg_int("overhead_pairs", overhead_pairs)
        self.out_dir = runs.check_run_dir(out_dir, "out_dir") if out_dir is not None else None
        self.user_parallel = dict(parallel or {})
        self.system = check_system(system)
        self._optimizer_arg = check_optimizer(optimizer)
        self._schedule = StepSchedule(warmup=self.warmup, steps=self.n_steps, count_flops=self.count_flops,
                                      profile_window=self.profile_window if self.profile else None,
                                      overhead_pairs=self.overhead_pairs)
        self._view = model_view(model)
        self.depth, self.modules_selected = selection.validate(depth, modules)
        self._timed, self._selection = selection.select(self._view.modules, self._view.types, depth=self.depth,
                                                        entries=self.modules_selected)
        self.device = model_device(self._view.root)
        refuse_meta_tensors(self._view.root)
        self.track_memory = False if memory is None else bool(memory)
        if self.track_memory and self.device.type != "cuda":
            self.track_memory = False  # nothing to read on CPU; meta.json says so
        self._state = "new"
        self._signalled, self._stopping, self._saved_handlers, self._lock = None, False, {}, None
        self._delivered = False
        self._warnings: list[str] = []
        self._init_faults()
        if self._view.compiled:
            self._warn(f"torch.compile'd module(s) {self._view.compiled} are timed as a whole (forward, backward, "
                       "step); their submodules get no rows, because hooks inside a compiled region would add "
                       "graph breaks. The profiler's kernel table still covers them.")
        self._reset_results()

    # ------------------------------------------------------------------------------ results
    def _reset_results(self):
        self._step_rows: list[dict] = []
        self._module_rows: deque = deque()  # (step, [row tuples in MODULE_STEP_COLUMNS order]) per step
        self._module_row_count = 0
        self._dropped_steps = 0
        self._flops: dict = {}
        self._window: ProfilerWindow | None = None
        self._overhead: dict | str = "not measured"
        self._boundary_s: dict = {}  # step index -> host seconds PerfCheck spent in step() after it

    def _warn(self, message: str):
        if message not in self._warnings:
            self._warnings.append(message)
            warnings.warn(f"perfcheck: {message}", RuntimeWarning, stacklevel=3)

    # ---------------------------------------------------------------------------- lifecycle
    def start(self) -> "Recorder":
        if self._state == "running":
            raise UserError("PerfCheck.start() called twice; call stop() first")
        if self._state == "stopped":
            raise UserError("this PerfCheck has been stopped; create a new one for another run")
        for path, mod in self._view.modules:
            if mod in Recorder._attached:
                raise UserError(f"module {path!r} ({type(mod).__name__}) is already measured by another running "
                                "PerfCheck; stop() that one first (one PerfCheck per model)")
        self.rank, self.world_size = rank_and_world()
        self.run_id = uuid.uuid4().hex[:12]
        self._t_start = time.time()
        clock = clock_for(self.device)
        mem = memory_mod.CudaMemoryTracker(self.device) if self.track_memory else None
        self._timer = ModuleTimer(self._timed, clock, ranges=self.profile, memory=mem)
        self._faults = PhaseFaults(self._fault_read) if self._fault_read is not None else None
        self._timer.phase_probe = self._faults  # (before the first attach: the root's calls report to it)
        self._step_faults: dict = {}  # step index -> {FAULT_COLUMNS: count}
        self._paths = {id(m): p for p, m in self._view.modules}
        self._pending: deque = deque()
        self._index, self._measured_n, self._bare_n, self._last_plain = 0, 0, 0, None
        self._flop_step, self._done, self._sampler = None, False, None
        self._writers: dict = {}
        # DDP / FSDP2: micro-batches per step whose backward reduces gradients (no_sync() ones don't)
        self._grad_sync, self._synced = GradSyncCounter.attach(self._view.outer), {}
        if self.out_dir is not None:
            self._open_writers()
        self._optimizers = OptimizerWatch(self._view.root, self._optimizer_arg).attach()  # removed in _teardown
        for _, mod in self._view.modules:
            Recorder._attached.add(mod)
        self._state = "running"
        try:
            if self.profile:
                self._window = ProfilerWindow(
                    "cuda" if self.device.type == "cuda" else "cpu", self.warmup + (1 if self.count_flops else 0),
                    self.profile_window, self.rank, self._rank_dir if self.out_dir is not None else None,
                    self._warn).start()
            if self.sample_interval is not None:
                on_row = self._writers["samples"].append if "samples" in self._writers else None
                self._sampler = Sampler(self.sample_interval, device=self.device, step_fn=lambda: self._index,
                                        rank=self.rank, on_row=on_row).start()
            if self.out_dir is not None:
                runs.atomic_write_json(self._rank_dir / runs.META, self.meta(complete=False))
            self._begin_step()
        except BaseException:
            self._teardown()
            self._release_run_dir()
            raise
        self._catch_signals()
        return self

    def step(self):
        """Mark the end of a training step (and the start of the next)."""
        if self._state != "running":
            raise UserError("PerfCheck.step() called outside start()/stop()")
        if self._done:
            self._index += 1
            return
        if self._role != "bare" and not self._timer.step_has_calls:
            self._note_empty_step()
            return  # nothing ran since the last boundary
        t0 = time.perf_counter()
        self._end_step()
        # PerfCheck's own work at the boundary (replaying the backward log, resolving, rows): outside
        # step_s, so the in-run overhead estimate adds it back (meta.json overhead)
        self._boundary_s[self._index] = time.perf_counter() - t0
        self._index += 1
        self._begin_step()
        if self._signalled is not None:
            self._stop_interrupted()

    def stop(self, *, deliver_signal: bool = True):
        """End measuring: keep the step in flight if its root forward ran, remove every hook,
        stop the profiler and the sampler, write the run directory if ``out_dir`` was given.

        A SIGINT/SIGTERM caught since the last ``step()`` is sent again at the end (it is never
        swallowed); ``deliver_signal=False`` for a framework's cleanup that ends the process itself."""
        if self._state != "running":
            return
        self._stopping = True  # a signal from here on is recorded, never raised inside the writing
        try:
            if not self._done:
                in_flight = self._timer.root_forward_finished
                if in_flight and self._role != "bare":
                    self._end_step()
                    self._index += 1
                else:
                    self._timer.clock.release(self._timer.end_step().tokens)
                    if self._flop_step is not None:
                        self._flop_step.end()
                        self._flop_step = None
            while self._pending:
                self._finalize(*self._pending.popleft())
            self._compute_overhead()
            if not any(r["role"] == "measured" and not r["failed"] for r in self._step_rows):
                self._warn(f"no measured step: {len(self._step_rows)} step(s) recorded with warmup={self.warmup}"
                           f"{', count_flops' if self.count_flops else ''}{', a profiler window' if self.profile else ''}"
                           " before them; measured() is empty (call step() after each training step and run more steps)")
        finally:
            self._teardown()
        try:
            if self.out_dir is not None:
                self.save(self.out_dir)
        finally:
            self._release_run_dir()
            self._restore_signals()
        if deliver_signal:
            self._deliver_signal()

    def _teardown(self):
        self._timer.detach()
        if self._timer.compiled_while_attached:
            self._warn(f"module(s) {self._timer.compiled_while_attached} were compiled (Module.compile()) while "
                       "PerfCheck was attached: their calls after that ran untimed (fewer calls in their rows); "
                       "compile before PerfCheck starts to have them timed as a whole")
        if getattr(self, "_grad_sync", None) is not None:
            self._grad_sync.detach()
        if getattr(self, "_optimizers", None) is not None:
            self._optimizers.detach()
        if self._flop_step is not None:
            self._flop_step.end()
            self._flop_step = None
        for _, mod in self._view.modules:
            Recorder._attached.discard(mod)
        if self._window is not None:
            self._window.stop()
        if self._sampler is not None:
            self._sampler.stop()
            for w in self._sampler.warnings:
                if w not in self._warnings:
                    self._warnings.append(w)
        for w in self._writers.values():
            w.close()
        self._state = "stopped"
        if self._timer.internal_errors:
            self._warn(f"hook errors (steps marked failed): {self._timer.internal_errors}")
        if self._timer.saw_capture:
            self._warn("module calls inside a CUDA graph capture were not timed (an event recorded into a graph "
                       "is no timestamp); graph replays are timed only as part of the module that calls them")

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self._state == "running":
            self._timer.mark_failed()
        if exc_type is None and self._signalled is not None:  # the loop ended before a step() saw the signal
            self._stop_interrupted()
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self._delivered = True  # the run is already ending on it
        self.stop()
        return False


    # ------------------------------------------------------------------------------- steps
    def _role_for(self, i: int) -> str:
        return self._schedule.role(i, self._measured_n, self._bare_n, self._last_plain)

    def _begin_step(self):
        role = self._role = self._role_for(self._index)
        if role == "done":
            self._done = True
            self._timer.detach()
            if self._window is not None:
                self._window.stop()
            return
        if role == "bare":
            self._timer.detach()
        else:
            self._timer.attach()
        if role == "flops":
            self._flop_step = FlopStep(self._view.root, self._paths)
            self._flop_step.begin()
        if self._faults is not None:
            self._faults.begin_step()
        self._timer.begin_step()

    def _end_step(self):
        pending = self._timer.end_step()
        if self._faults is not None:
            self._step_faults[self._index] = self._faults.end_step()
        if self._grad_sync is not None:
            self._synced[self._index] = self._grad_sync.take()[0]
        if self._flop_step is not None:
            self._flops = self._flop_step.end()
            self._flop_step = None
        if self._window is not None:
            self._window.step()
        role = self._role
        if role == "measured" and not pending.failed:
            self._measured_n += 1
        elif role == "bare":
            self._bare_n += 1
        if role in ("measured", "bare"):
            self._last_plain = role
        self._pending.append((self._index, role, pending))
        # Resolve finished steps only; wait for the device only when the host is MAX_PENDING_STEPS
        # steps ahead of it (the device then has that much work queued, so the wait costs no
        # device time). Resolving the previous step unconditionally would block the host on every
        # step of a device-bound loop: a hidden synchronize that set_sync_debug_mode does not flag.
        while self._pending and (len(self._pending) > MAX_PENDING_STEPS or self._pending[0][2].ready()):
            self._finalize(*self._pending.popleft())

    def _finalize(self, index: int, role: str, pending):
        res = pending.resolve()
        bare = role == "bare"
        if not bare and not getattr(self, "_root_checked", False):
            self._root_checked = True
            self._check_root_called(res)
        nan = math.nan
        row = {"step": index, "measured": role == "measured", "fwd_s": nan if bare else res["fwd_s"],
               "bwd_s": nan if bare else res["bwd_s"], "optim_s": nan if bare else res["optim_s"],
               "bwd_finalize_s": nan if bare else res["bwd_finalize_s"],
               "step_s": res["step_s"], "recompute_s": nan if bare else res["recompute_s"],
               "eval_s": nan if bare else res["eval_s"], "micro_batches": nan if bare else res["micro_batches"],
               "peak_mem_bytes": nan if res["peak_mem_bytes"] is None else float(res["peak_mem_bytes"]),
               "role": role, "failed": bool(res["failed"]), "rank": self.rank}
        self._add_faults(row, index, bare)
        self._step_rows.append(row)
        if "steps" in self._writers:
            self._writers["steps"].append(row)
            if len(self._step_rows) == 1 or self._fault_cost_new:  # inputs and dtype known now (and the
                # fault cost once measured): a run killed later stays reportable
                self._fault_cost_new = False
                runs.atomic_write_json(self._rank_dir / runs.META, self.meta(complete=False))
        type_of, rank = self._view.types.get, self.rank
        evals, no_eval = res["eval_modules"], (0, 0.0)
        eval_of = evals.get
        rows = []  # runs.MODULE_STEP_COLUMNS order
        for path, (calls, fwd, bwd, rc, act, peak) in res["modules"].items():
            n_eval, t_eval = eval_of(path, no_eval)
            rows.append((index, path, type_of(path, ""), calls, fwd, bwd, rc, n_eval, t_eval,
                         nan if act is None else float(act), nan if peak is None else float(peak), rank))
        for path, (n, t) in evals.items():
            if path not in res["modules"]:  # ran only in eval
                rows.append((index, path, type_of(path, ""), 0, 0.0, 0.0, 0.0, n, t, nan, nan, rank))
        if "module_steps" in self._writers:
            self._writers["module_steps"].append_rows(rows)  # one flush per step: a killed run keeps every ended step
        self._module_rows.append((index, rows))
        self._module_row_count += len(rows)
        while self._module_row_count > MAX_MODULE_ROWS and len(self._module_rows) > 1:
            _, old = self._module_rows.popleft()  # bounded memory on long runs (the CSV keeps them all)
            self._module_row_count -= len(old)
            self._dropped_steps += 1

    def _note_empty_step(self):
        """step() with no module of the model run since the last boundary: fine once (a step() at the
        top of the loop), but a second one before any step was recorded means the loop never calls it."""
        self._empty_steps = getattr(self, "_empty_steps", 0) + 1
        if self._empty_steps == 2 and not self._step_rows and not self._pending:
            self._warn(f"step() called {self._empty_steps} times but no module of the measured model "
                       f"({self._view.types.get(ROOT)}) ran: is it the module the training loop calls?")

    def _check_root_called(self, res: dict):
        """At the first instrumented step: a root whose forward never ran (a LightningModule, whose
        ``training_step`` calls submodules; a wrapper whose forward the loop bypasses) leaves every
        step's fwd_s/bwd_s at 0 and no prediction: say so now, naming the outermost modules that ran."""
        ran = [p for p, row in res["modules"].items() if row[0] > 0] + list(res["eval_modules"])
        if ROOT in ran or not ran:
            return
        outer = outermost_paths(ran)
        shown = ", ".join(f"{p} ({self._view.types.get(p, '?')})" for p in outer[:5])
        more = f" and {len(outer) - 5} more" if len(outer) > 5 else ""
        self._warn(f"the root module ({self._view.types.get(ROOT)}) was never called in the first step, so no step "
                   f"gets forward/backward time and no prediction can be made; the outermost modules that ran: "
                   f"{shown}{more}. Measure the module whose forward the loop calls, e.g. "
                   f"PerfCheck(model.get_submodule({outer[0]!r}))")

    def _compute_overhead(self):
        rows, bnd = self._step_rows, self._boundary_s
        pairs = [(a["step_s"] + bnd.get(a["step"], 0.0), b["step_s"] + bnd.get(b["step"], 0.0))
                 for a, b in zip(rows, rows[1:])
                 if b["role"] == "bare" and a["role"] == "measured" and not a["failed"] and b["step"] == a["step"] + 1]
        if not pairs:
            return
        inst, bare = np.array(pairs).T
        fraction = float(np.median(inst) / np.median(bare) - 1.0)
        # 95% bootstrap interval over the pairs (resampled together: a pair shares the machine's state)
        rng = np.random.default_rng(0)
        idx = rng.integers(0, len(pairs), size=(2000, len(pairs)))
        boot = np.median(inst[idx], axis=1) / np.median(bare[idx], axis=1) - 1.0
        self._overhead = {"fraction": fraction, "ci95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))],
                          "instrumented_step_s_median": float(np.median(inst)), "bare_step_s_median": float(np.median(bare)),
                          "bookkeeping_s_median": float(np.median([bnd.get(a["step"], 0.0) for a in rows
                                                                   if a["role"] == "measured"] or [0.0])),
                          "pairs": len(pairs),
                          "method": "adjacent instrumented/bare steps of this run (hooks removed in bare steps), each "
                                    "step's time plus PerfCheck's host time at the step boundary after it; ratio of "
                                    "medians, 95% bootstrap interval over the pairs"}


    # ------------------------------------------------------------------- predicted vs measured
    def system_spec(self, system=None):
        """The SystemSpec predictions for this run use: ``system``, else the one given to PerfCheck, else
        this machine's, resolved once here at the edge (``calibrate.auto.resolve_system``: the cached
        calibration for the run's device and thread count; a quick automatic one where the cache has none
        and it passes the sanity checks; else the labelled datasheet default)."""
        chosen = self.system if system is None else system
        if chosen is not None:
            return load_system(chosen)
        if getattr(self, "_resolved_system", None) is None:
            threads = torch.get_num_threads() if self.device.type == "cpu" else None
            self._resolved_system = resolve_system(self.device, threads, calibrate=True)
        return self._resolved_system

    def predicted(self, system=None) -> pd.DataFrame:
        """The estimator's rows for this run: the root's recorded input shapes and dtype, the
        parallel layout seen, on ``system`` (default: the one given to PerfCheck, else this device's
        entry) (schema.PREDICTED_COLUMNS)."""
        if self._state == "new" or not self._timer.first_root_inputs:
            raise UserError("no prediction yet: run at least one step so the input shapes are known")
        spec = self.system_spec(system)
        cached = getattr(self, "_predicted", None)
        if cached is None or cached.attrs.get("system") != spec.name:
            ddp = "DistributedDataParallel" in self._view.wrappers  # its buckets give the all-reduces
            model, meta = self._view.outer if ddp else self._view.root, self.meta()
            outside = getattr(self, "step_outside", None)  # an engine around the loop: its step outside the model
            self._predicted = with_step_other(lambda o: predict_for_run(model, meta, system=spec, step_other_s=o),
                                              outside and (lambda f: outside(f, spec)), warn=self._warn)
        return self._predicted

    def _add_predicted_track(self, trace_path):
        """The prediction as its own track in trace.json (measure/predicted_track.py); a failure leaves
        the measured trace as it was and a warning, never a lost run."""
        frame = getattr(self, "_predicted", None)
        if frame is None:
            return
        try:
            if not add_predicted_track(trace_path, frame):
                self._warn("trace.json: no predicted track (no measured root forward in the profiled step)")
        except Exception as exc:  # noqa: BLE001 - the trace is an extra; the run must be saved
            self._warn(f"trace.json: predicted track not added: {type(exc).__name__}: {exc}")

    def _save_prediction(self, run_dir) -> list:
        """Write predicted.csv beside this rank's files; a model the estimator cannot trace leaves a
        warning in meta.json, never a lost run."""
        try:
            frame = self.predicted()
            save_predicted(run_dir, frame, rank=self.rank, system=self.system_spec(), dtype=frame.attrs.get("dtype"))
        except Exception as exc:  # noqa: BLE001 - any estimator failure (an AttributeError from another
            # torch version lost the DeepSpeed runs' files on the GPU run of 2026-11-22) must not lose the run
            self._warn(f"predicted.csv not written: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            return []
        extra = []
        if frame.attrs.get("collectives"):  # torch-native layouts: the collectives predicted per module
            meta = self.meta()  # per optimizer step: x micro-batches, gradient reductions x synced ones
            rows = per_step_collectives(frame.attrs["collectives"], meta.get("micro_batches"),
                                        meta.get("grad_sync_micro_batches"))
            runs.atomic_write_csv(runs.rank_dir(run_dir, self.rank) / PREDICTED_COLLECTIVES_CSV, rows,
                                  PREDICTED_COLLECTIVE_FIELDS)
            extra.append(PREDICTED_COLLECTIVES_CSV)
        return [PREDICTED_CSV, PREDICTED_JSON] + extra
