"""The recording session's tables and its run directory: the frames (steps, module rows, the summary,
kernels, collectives, samples), the lock and the appended tables opened at ``start()``, the files
written at ``save()``, and the run as ``rundir.Run``. A mixin of ``measure.session.Recorder``."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

import perfcheck.rundir as runs
from perfcheck.errors import UserError
from perfcheck.measure.collectives import COLLECTIVE_COLUMNS, COLLECTIVES_CSV
from perfcheck.measure.kernel_table import empty_kernel_frame
from perfcheck.schema import SAMPLE_COLUMNS, STEP_COLUMNS


class RunFiles:
    """What the recording session hands back (frames) and writes (the run directory)."""

    def steps(self) -> pd.DataFrame:
        """One row per recorded step (schema.STEP_COLUMNS)."""
        return pd.DataFrame(self._step_rows, columns=list(STEP_COLUMNS))

    def module_steps(self) -> pd.DataFrame:
        """Per-step, per-module rows (runs.MODULE_STEP_COLUMNS): the numbers behind measured()."""
        rows = [r for _, step_rows in self._module_rows for r in step_rows]
        return pd.DataFrame(rows, columns=list(runs.MODULE_STEP_COLUMNS))

    def measured(self) -> pd.DataFrame:
        """One row per module that ran in the measured steps (schema.MEASURED_COLUMNS)."""
        return runs.summarize_module_steps(self.module_steps(), self.steps(), self.rank if self._state != "new" else 0,
                                           self._flops)

    def kernels(self) -> pd.DataFrame:
        """Kernels (GPU) or aten ops (CPU) per module and phase in the profiler window (schema.KERNEL_COLUMNS)."""
        return self._window.kernels.copy() if self._window is not None else empty_kernel_frame()

    def collectives(self) -> pd.DataFrame:
        """Collectives of the profiler window: issued (kind, bytes, module and phase that issued
        them) and waited (module and phase that waited, seconds); measure/collectives.py."""
        frame = getattr(self._window, "collectives", None) if self._window is not None else None
        return frame.copy() if frame is not None else pd.DataFrame(columns=list(COLLECTIVE_COLUMNS))

    def samples(self) -> pd.DataFrame:
        """Utilization/memory samples (schema.SAMPLE_COLUMNS)."""
        rows = list(self._sampler.rows) if self._sampler is not None else []
        return pd.DataFrame(rows, columns=list(SAMPLE_COLUMNS))

    @property
    def state(self) -> str:
        """'new' (not started), 'running' or 'stopped'."""
        return self._state

    @property
    def done(self) -> bool:
        """True once every requested step (warm-up, FLOPs, profiler window, measured, bare) has run."""
        return self._state == "stopped" or (self._state == "running" and self._done)

    @property
    def overhead(self):
        """The in-run A/B overhead (dict) or the string 'not measured'."""
        return self._overhead

    # -------------------------------------------------------------------------- run files
    @property
    def _rank_dir(self) -> Path:
        return runs.rank_dir(self.out_dir, self.rank)

    def _open_writers(self):
        """Lock this rank's directory (``rundir.RunLock``: a second run into it is refused, not mixed), then
        check that it holds no run and open the appended tables; an unwritable directory is one line."""
        d = self._rank_dir
        try:
            d.mkdir(parents=True, exist_ok=True)
            self._lock = runs.RunLock(d).acquire()
        except OSError as exc:
            raise UserError(f"out_dir: cannot write into {d} ({exc.strerror or exc})") from None
        try:
            for name in (runs.META, runs.TABLES["steps"][0]):
                if (d / name).exists():
                    raise UserError(f"{d} already holds a run ({name} exists); choose a new out_dir")
            runs.clean_stale_temps(d)
            for key in ("steps", "module_steps", "samples"):
                fname, cols = runs.TABLES[key]
                if key == "samples" and self.sample_interval is None:
                    continue
                self._writers[key] = runs.CsvAppender(d / fname, cols)
        except OSError as exc:
            for w in self._writers.values():
                w.close()
            self._release_run_dir()
            raise UserError(f"out_dir: cannot write into {d} ({exc.strerror or exc})") from None
        except BaseException:
            self._release_run_dir()
            raise

    def _release_run_dir(self):
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.release()
            self._lock = None

    def save(self, run_dir) -> Path:
        """Write this rank's files under ``run_dir/rank<R>/`` (each atomically); return that directory."""
        if self._state == "new":
            raise UserError("nothing to save: PerfCheck was never started")
        d = runs.rank_dir(run_dir, self.rank)
        try:
            return self._save_files(run_dir, d)
        except OSError as exc:  # read-only or full: one line (atomic writes leave no partial file)
            raise UserError(f"cannot write the run directory {d} ({exc.strerror or exc}"
                            f"{': ' + Path(exc.filename).name if getattr(exc, 'filename', None) else ''})") from None

    def _save_files(self, run_dir, d: Path) -> Path:
        files, rows = [], {}
        frames = {"modules": self.measured, "steps": self.steps, "module_steps": self.module_steps,
                  "kernels": self.kernels, "samples": self.samples}
        for key, frame in frames.items():
            fname, cols = runs.TABLES[key]
            files.append(fname)
            writer = self._writers.get(key)
            if writer is not None and writer.path.resolve() == (d / fname).resolve():
                rows[fname] = writer.rows
                continue  # appended row by row as the run went: already complete (memory may hold less)
            table = frame()
            runs.atomic_write_csv(d / fname, table, cols)
            rows[fname] = len(table)
        trace = self._window.trace_path if self._window is not None else None
        if trace is not None and trace.exists():
            if trace.resolve() != (d / runs.TRACE).resolve():
                runs.atomic_copy(trace, d / runs.TRACE)
            files.append(runs.TRACE)
        coll = self.collectives()
        if not coll.empty:
            runs.atomic_write_csv(d / COLLECTIVES_CSV, coll, list(COLLECTIVE_COLUMNS))
            files.append(COLLECTIVES_CSV)
        predicted = self._save_prediction(run_dir)
        if predicted:
            rows[predicted[0]] = len(self._predicted)
        files += predicted
        if runs.TRACE in files:
            self._add_predicted_track(d / runs.TRACE)
        runs.atomic_write_json(d / runs.META, self.meta(complete=self._state == "stopped", files=files, row_counts=rows))
        return d


    def as_run(self):
        """This rank's run as ``rundir.Run``: exactly the frames ``save()`` writes, as reading
        the run directory back gives them (so the live and the saved report are the same)."""
        if self._state == "new":
            raise UserError("nothing measured yet: PerfCheck was never started")
        frames = {"modules": self.measured(), "steps": self.steps(), "module_steps": self.module_steps(),
                  "kernels": self.kernels(), "samples": self.samples()}
        return runs.Run(run_dir=self.out_dir if self.out_dir is not None else Path("."), ranks=[self.rank],
                   meta={self.rank: self.meta(complete=self._state == "stopped")},
                   complete=self._state == "stopped", **{k: runs.as_saved(f, k) for k, f in frames.items()})
