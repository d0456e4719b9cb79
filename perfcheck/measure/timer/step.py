"""A finished step's records, resolved into seconds per module and phase once its clock readings are ready."""
from __future__ import annotations

from perfcheck.measure.timer.records import EVAL, FWD, EvalRow, ModuleRow, new_entry
from perfcheck.schema import ROOT


def _row():
    """A ``ModuleRow`` while it is summed (mutable, in ModuleRow's field order)."""
    return [0, 0.0, 0.0, 0.0, None, None]


class PendingStep:
    """A finished step whose tokens may still be in flight on the device.

    ``finals``: the end-of-backward callback intervals (``records.Final``, ``bwd_finalize_s``)."""

    def __init__(self, clock, start, end, calls, bwds, tokens, failed, peak_mem, finals=()):
        self.clock, self.start, self.end = clock, start, end
        self.calls, self.bwds, self.tokens = calls, bwds, tokens
        self.failed, self.peak_mem, self.finals = failed, peak_mem, finals

    def ready(self) -> bool:
        return self.clock.ready(self.end)

    def resolve(self) -> dict:
        """Seconds per module and phase. Returns {'modules': {path: ModuleRow}, 'eval_modules':
        {path: EvalRow}, 'micro_batches': root forward calls, 'fwd_s', 'bwd_s', ...}."""
        # Plain loops, no comprehensions or generators: this runs once per step with cold caches,
        # where each extra frame costs microseconds (bench/RESULTS.md).
        clock = self.clock
        if not clock.ready(self.end):
            self.end.synchronize()  # only reached at stop() or when the CPU runs far ahead
        sec = clock.seconds
        ns = getattr(clock, "NS", None)  # host clock: integer nanoseconds, an interval is (end - start) * NS
        mods, evals, top_evals, root_fwd_end, recompute = self._fold_calls(sec, ns)
        root_bwd_end = self._fold_bwds(mods, sec, ns)
        last = root_bwd_end if root_bwd_end is not None else root_fwd_end
        root = mods.get(ROOT) or _row()
        finalize = 0.0
        for f in self.finals:
            if f.t_b is not None:
                finalize += sec(f.t_a, f.t_b)
        # eval calls after the last backward (or forward) ran inside the optim_s interval: not optimizer time
        eval_s = eval_after = 0.0
        for c, dt in top_evals:
            eval_s += dt
            if last is not None and sec(last, c.t0) >= 0:
                eval_after += dt
        for path, row in mods.items():
            mods[path] = new_entry(ModuleRow, row)
        for path, e in evals.items():
            evals[path] = new_entry(EvalRow, e)
        out = {
            "modules": mods,
            "eval_modules": evals,
            "step_s": sec(self.start, self.end),
            "fwd_s": root[1],
            "bwd_s": root[2],
            "recompute_s": recompute,
            "eval_s": eval_s,
            "micro_batches": root[0],
            "optim_s": sec(last, self.end) - finalize - eval_after if last is not None else float("nan"),
            "bwd_finalize_s": finalize,
            "failed": self.failed,
            "peak_mem_bytes": self.peak_mem,
        }
        clock.release(self.tokens)
        self.calls = self.bwds = self.tokens = None
        return out

    def _fold_calls(self, sec, ns):
        """Forward/eval/recompute seconds per module (rows in ModuleRow's field order)."""
        mods: dict[str, list] = {}
        evals: dict[str, list] = {}  # path -> [eval calls, eval seconds]
        top_evals = []  # (call, seconds) of the outermost eval calls
        root_fwd_end = None
        recompute = 0.0
        # a step without any grad-enabled forward (inference, a loop under no_grad): its eval calls are the forward
        as_fwd = True
        for c in self.calls:
            if c.phase == FWD:
                as_fwd = False
                break
        for c in self.calls:
            t1 = c.t1
            if t1 is None:
                continue
            dt = (t1 - c.t0) * ns if ns else sec(c.t0, t1)
            phase, path = c.phase, c.path
            if phase == FWD or (phase == EVAL and as_fwd):  # (the common case first)
                row = mods.get(path)
                if row is None:
                    row = mods[path] = _row()
                row[0] += 1
                row[1] += dt
                if c.act is not None:
                    row[4] = (row[4] or 0) + c.act
                    row[5] = c.peak if row[5] is None else max(row[5], c.peak)
                if path == ROOT:
                    root_fwd_end = t1
            elif phase == EVAL:
                e = evals.get(path)
                if e is None:
                    e = evals[path] = [0, 0.0]
                e[0] += 1
                e[1] += dt
                if c.top:
                    top_evals.append((c, dt))
            else:
                row = mods.get(path)
                if row is None:
                    row = mods[path] = _row()
                row[3] += dt
                if c.top:
                    recompute += dt
        return mods, evals, top_evals, root_fwd_end, recompute

    def _fold_bwds(self, mods, sec, ns):
        """Backward seconds per module, less the recompute inside each interval; the root's last end."""
        root_bwd_end = None
        for b in self.bwds:
            b1 = b.b1
            if b1 is None:
                continue
            dt = (b1 - b.b0) * ns if ns else sec(b.b0, b1)
            if b.rc:
                dt -= sum(sec(r.t0, r.t1) for r in b.rc if r.t1 is not None)
            path = b.path
            row = mods.get(path)
            if row is None:
                row = mods[path] = _row()
            if dt > 0.0:
                row[2] += dt
            if path == ROOT:
                root_bwd_end = b1
        return root_bwd_end
