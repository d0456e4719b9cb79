"""``PerfCheck``: measure training steps of a PyTorch model per module, phase and kernel, and report
them against the prediction.

    pc = PerfCheck(model, warmup=2, steps=20, out_dir="runs/exp1")
    with pc:                                  # or pc.start() ... pc.stop()
        for x, y in loader:
            loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()
            pc.step()                         # marks the end of a training step
    pc.measured(); pc.steps(); pc.kernels(); pc.samples(); pc.save("runs/exp1")
    print(pc.report())                        # predicted vs measured per module

The recording (steps, hooks, profiler window, run directory) is ``measure.session.Recorder``; this class
adds what reads the recording back through ``analysis/`` and ``report/``.
"""
from __future__ import annotations

import pandas as pd

from perfcheck.analysis.pipeline import reconcile_run
from perfcheck.measure.session import Recorder
from perfcheck.report.text import render_text


class PerfCheck(Recorder):
    """Per-module forward/backward/recompute times, kernel tables, samples and a run directory.

    Args:
        model: the ``nn.Module`` (DDP / DeepSpeed engine wrappers are unwrapped; paths as the inner
            model's ``named_modules()``; a torch.compile'd module is timed as a whole).
        warmup: steps run with hooks but left out of the statistics.
        steps: measured steps; ``None`` measures until ``stop()``.
        profile: run one torch.profiler window (kernel table + Chrome trace).
        profile_window: ``(wait, warmup, active)`` steps of ``torch.profiler.schedule`` after the
            warm-up (and FLOP) steps.
        count_flops: one step under ``FlopCounterMode`` (per module, forward and backward).
        sample_interval: sampler period in seconds (>= 0.1); ``None`` turns the sampler off.
        out_dir: run directory; rows are appended as steps end and the rest is written at ``stop()``.
        memory: per-module and per-step peak CUDA memory (default off: reading the allocator's stats at
            every module boundary costs ~23 us of host time per call on an H100, +5% on GPT-2 small at
            batch 32, bench/RESULTS.md; NaN on CPU).
        overhead_pairs: instrumented/bare step pairs for the in-run overhead estimate (meta.json).
        parallel: what is known about the parallel layout, merged into meta.json's ``parallel``.
        system: the spec predictions use (a name from ``perfcheck systems``, a JSON file from
            ``perfcheck calibrate`` or a SystemSpec); default: this device's built-in entry.
        depth: time only the modules at most ``depth`` levels below the root (0: the root alone),
            a cheaper always-on mode; the others' time is inside their nearest timed ancestor's.
        modules: time only these (and the root): module paths, class names, path globs or classes
            (measure/selection.py). meta.json ``selection`` records either choice.
        optimizer: the optimizer the loop steps (a torch.optim instance, framework wrappers such as
            accelerate's or DeepSpeed's unwrapped, or a name such as "adamw-foreach"); default: the
            one seen stepping the model's parameters (torch.optim's global step hooks, while
            running). meta.json ``optimizer`` names it; the prediction costs its step.

    ``save()`` also writes the estimator's rows for the shapes, dtype and parallel layout the run
    saw (``predicted.csv``), so ``perfcheck report RUN_DIR`` needs nothing but the directory.
    """

    def reconciled(self, system=None) -> pd.DataFrame:
        """Predicted vs measured per module for this run (analysis.columns.RECONCILED_COLUMNS), through
        the same assembly as ``perfcheck report RUN_DIR`` (``analysis.pipeline.reconcile_run``)."""
        return reconcile_run(self, system=system).table

    def report(self, *, depth: int | None = None, top: int = 3, system=None) -> str:
        """The terminal report (module tree, predicted vs measured, gaps and reasons) as a string."""
        return render_text(self.reconciled(system=system), depth=depth, top=top)
