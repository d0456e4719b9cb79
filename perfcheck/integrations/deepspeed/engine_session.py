"""``EngineSession``: the thin wrapper around a DeepSpeed engine that measures it (see deepspeed.py).

Nothing in torch or DeepSpeed is patched: the wrapper calls the engine's own ``forward``,
``backward`` and ``step`` between two clock readings, inside ``record_function`` ranges, and
cuts the comms logger's records at those boundaries. Beside each phase's elapsed time it records
the process CPU time spent in it (``<phase>_cpu_s``): on a machine shared with other jobs the
elapsed time also holds waiting for a core, and waiting for the peer ranks' collectives, which
the CPU time does not. After each optimizer step, outside every timed phase, it times the calibration's two
references (``perfcheck.measure.speed``: the machine's speed during the run, ``ref_s`` and ``cref_s``), so a
comparison can set the prediction at the level the run met. Attribute access falls through to the
engine, so ``session.module``, ``session.save_checkpoint(...)`` and friends behave as before.
"""
from __future__ import annotations

import atexit
import time
import warnings
from pathlib import Path

import torch

from perfcheck.analysis.stage_prediction import outside_model_s
from perfcheck.measure.clocks import clock_for
from perfcheck.measure.schedule import StepSchedule
from perfcheck.measure.speed import SpeedProbe
import perfcheck.rundir as runs
import perfcheck.rundir.deepspeed_files as run_files
from perfcheck.integrations.deepspeed import comms as ds_comms, facts as ds_facts
from perfcheck.session.api import PerfCheck


#: Sessions not yet finished; at interpreter exit each is written, marked incomplete.
_open_sessions: list = []


@atexit.register
def _finish_open_sessions():  # a script that stops early still leaves a (marked incomplete) run
    for s in list(_open_sessions):
        try:
            s.finish(complete=False)
        except Exception:  # noqa: BLE001 - never raise at interpreter exit; try the other sessions
            continue


def _default_run_dir(stage: int) -> Path:
    """One name for all ranks: rank 0 draws it and broadcasts it."""
    name = [str(runs.new_run_dir("runs", f"deepspeed-zero{stage}"))]
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.broadcast_object_list(name, src=0)
    return Path(name[0])


class EngineSession:
    """A DeepSpeed engine that records its steps; use it wherever the engine was used."""

    def __init__(self, engine, block, ds_config: dict, perfcheck=None):
        d = self.__dict__
        d["_engine"], d["_block"], d["_done"] = engine, block, False
        facts = ds_facts.engine_facts(engine, ds_config)
        d["_facts"] = facts
        d["_run_dir"] = Path(block.output_dir) if block.output_dir else _default_run_dir(facts["zero_stage"])
        d["_rank_dir"] = runs.rank_dir(self._run_dir, facts["rank"])
        d["_device"] = next((p.device for p in engine.module.parameters()), torch.device("cpu"))
        d["_clock"] = clock_for(self._device)
        d["_comms"] = ds_comms.CommsCapture(facts["rank"], facts["dp"])
        d["_speed"] = SpeedProbe(self._device)
        p = block.profiler
        d["_schedule"] = StepSchedule(warmup=block.warmup_steps, steps=block.steps,
                                      profile_window=(p.wait, p.warmup, p.active) if p.enabled else None,
                                      overhead_pairs=block.bare_steps)
        d["_step"], d["_micro"], d["_comm_steps_done"], d["_measured_done"] = 0, 0, 0, 0
        d["_bare_done"], d["_last_plain"] = 0, None
        d["_rows"], d["_pending"], d["_marks"], d["_cpu"] = [], [], {}, {}
        d["_memory"], d["_warnings"] = None, []
        d["_pc"] = self._start_perfcheck(perfcheck)
        if self._device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self._device)
        self._rank_dir.mkdir(parents=True, exist_ok=True)
        d["_appender"] = run_files.engine_steps_appender(self._rank_dir)
        self._write_zero_json(complete=False)
        self._begin_step()
        _open_sessions.append(self)

    # --------------------------------------------------------------------------- plumbing
    def __getattr__(self, name):
        return getattr(self.__dict__["_engine"], name)

    def __setattr__(self, name, value):
        setattr(self._engine, name, value)

    def __repr__(self):
        return f"EngineSession({self._engine!r}, run_dir={str(self._run_dir)!r})"

    @property
    def run_dir(self) -> Path:
        return self._run_dir

    @property
    def engine(self):
        return self._engine

    def _warn(self, msg: str):
        self._warnings.append(msg)
        warnings.warn(f"perfcheck: {msg}", RuntimeWarning, stacklevel=3)

    def _start_perfcheck(self, pc):
        b = self._block
        if pc is None and not b.modules:
            return None
        try:
            if pc is None:
                p = b.profiler
                pc = PerfCheck(self._engine.module, warmup=b.warmup_steps, steps=b.steps, profile=p.enabled,
                               profile_window=(p.wait, p.warmup, p.active), sample_interval=b.sampler_interval_s,
                               out_dir=self._run_dir, system=b.system,  # the block's system, as zero.json's
                               overhead_pairs=b.bare_steps)  # its bare steps are the engine's (one schedule)
            # the engine's step outside the model counts in the far rule's ages (stage_prediction.outside_model_s)
            pc.step_outside = lambda frame, spec: outside_model_s(self._facts, frame, spec)
            if pc.state == "new":
                pc.start()
            return pc
        except Exception as exc:  # module tables are optional; the ZeRO files still get written
            self._warn(f"per-module measurement off ({type(exc).__name__}: {exc})")
            return None

    # ----------------------------------------------------------------------------- roles
    def _role(self, index: int) -> str:
        return self._schedule.role(index, self._measured_done, self._bare_done, self._last_plain)

    def _begin_step(self):
        role = self._role(self._step)
        self.__dict__["_role_now"] = role
        log = role == "measured" and self._comm_steps_done < self._block.comms_steps
        if log and not self._comms.active:
            self._comms.enable()
        elif not log and self._comms.active:
            self._comms.disable()

    # ------------------------------------------------------------------------ the engine
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def _timed(self, phase, fn, *args, **kwargs):
        if self._done:
            return fn(*args, **kwargs)
        self._comms.cut(self._step, self._micro, "other")
        c0 = time.process_time()
        t0 = self._clock.now()
        with torch.profiler.record_function(f"perfcheck::engine::{phase}"):
            out = fn(*args, **kwargs)
        t1 = self._clock.now()
        self._cpu[phase] = time.process_time() - c0
        self._comms.cut(self._step, self._micro, phase)
        self._marks[phase] = (t0, t1)
        return out

    def forward(self, *args, **kwargs):
        return self._timed("fwd", self._engine, *args, **kwargs)

    def backward(self, loss, *args, **kwargs):
        out = self._timed("bwd", self._engine.backward, loss, *args, **kwargs)
        if (not self._done and self._memory is None and self._step >= 1 and self._role_now == "measured"
                and self._engine.is_gradient_accumulation_boundary()):
            self.__dict__["_memory"] = ds_facts.model_state_bytes(self._engine)
        return out

    def step(self, *args, **kwargs):
        if self._done:
            return self._engine.step(*args, **kwargs)
        boundary = bool(self._engine.is_gradient_accumulation_boundary())
        out = self._timed("step", self._engine.step, *args, **kwargs)
        # the machine's speed, once per optimizer step, after its windows (the next forward's are not open yet)
        refs = self._speed.read() if boundary else (float("nan"), float("nan"))
        self._record(boundary, refs)
        self.__dict__["_micro"] += 1
        if boundary:
            self._end_step()
        return out

    # ----------------------------------------------------------------------------- steps
    def _record(self, boundary: bool, refs=(float("nan"), float("nan"))):
        cpu = {f"{ph}_cpu_s": self._cpu.get(ph, float("nan")) for ph in ("fwd", "bwd", "step")}
        cpu["total_cpu_s"] = sum(self._cpu.values()) if self._cpu else float("nan")
        cpu["ref_s"], cpu["cref_s"] = refs
        self._pending.append(({"rank": self._facts["rank"], "step": self._step, "micro_step": self._micro,
                               "role": self._role_now, "comms_logged": self._comms.active, "boundary": boundary,
                               **cpu}, dict(self._marks)))
        self._marks.clear()
        self._cpu.clear()
        self._clock.take_step_tokens()  # the marks above keep the tokens until they are resolved
        self._flush(wait=False)

    def _flush(self, wait: bool):
        if wait and self._clock.kind == "cuda":
            torch.cuda.synchronize(self._device)
        while self._pending:
            row, marks = self._pending[0]
            if not all(self._clock.ready(m[1]) for m in marks.values()):
                break
            self._pending.pop(0)
            for ph in ("fwd", "bwd", "step"):
                row[f"{ph}_s"] = self._clock.seconds(*marks[ph]) if ph in marks else float("nan")
            starts = [marks[p][0] for p in ("fwd", "bwd", "step") if p in marks]
            ends = [marks[p][1] for p in ("fwd", "bwd", "step") if p in marks]
            row["total_s"] = self._clock.seconds(starts[0], ends[-1]) if starts else float("nan")
            self._clock.release([t for m in marks.values() for t in m])
            self._rows.append(row)
            self._appender.append(row)

    def _end_step(self):
        if self._role_now == "measured":
            self.__dict__["_measured_done"] += 1
            if self._comms.active:
                self.__dict__["_comm_steps_done"] += 1
        elif self._role_now == "bare":
            self.__dict__["_bare_done"] += 1
        if self._role_now in ("measured", "bare"):
            self.__dict__["_last_plain"] = self._role_now
        if self._pc is not None:
            try:
                self._pc.step()
            except KeyboardInterrupt:  # SIGINT/SIGTERM: PerfCheck stopped at this boundary and wrote its files;
                self._warn("interrupted (SIGINT/SIGTERM) at the end of this step; every file written")
                self.finish(complete=False)  # the ZeRO files too, then the run ends as the signal asked
                raise
            except Exception as exc:  # noqa: BLE001 - keep training; report it
                self._warn(f"PerfCheck.step failed ({type(exc).__name__}: {exc}); per-module tables stop here")
                self.__dict__["_pc"] = None
        self.__dict__["_step"] += 1
        self.__dict__["_micro"] = 0
        if self._role(self._step) == "done":
            self.finish()
        else:
            self._begin_step()

    def finish(self, complete: bool = True):
        """Write the run directory's ZeRO files and stop measuring (called after the last step)."""
        if self._done:
            return self._run_dir
        self.__dict__["_done"] = True
        self._comms.disable()
        if self._pc is not None:
            try:
                self._pc.stop(deliver_signal=False)  # a signal ends the process after the ZeRO files below
                if getattr(self._pc, "out_dir", None) is None:
                    self._pc.save(self._run_dir)
            except Exception as exc:  # noqa: BLE001
                self._warn(f"PerfCheck.stop failed ({type(exc).__name__}: {exc})")
        self._flush(wait=True)
        self._appender.close()
        run_files.write_comms(self._rank_dir, self._comms.frame())
        self._write_zero_json(complete=complete)
        if self in _open_sessions:
            _open_sessions.remove(self)
        return self._run_dir

    def _write_zero_json(self, complete: bool):
        b = self._block
        out = {"complete": bool(complete), **self._facts,
               "perfcheck_block": b.to_dict(), "steps_recorded": self._step,
               "model_state_bytes": self._memory, **ds_facts.peak_memory(self._device),
               "device": self._device.type,
               "profiled_comm": ds_comms.exposed_comm_from_trace(self._rank_dir / runs.TRACE),
               "comms_logger": "DeepSpeed comms logger on for the first comms_steps measured steps (it "
                               "synchronizes after each collective); off in the profiler window",
               "warnings": list(self._warnings)}
        run_files.write_zero_json(self._rank_dir, out)
