"""The ZeRO sweep: one DeepSpeed training job per stage, then ``perfcheck compare`` over them.

``run_sweep(SweepOptions(...))`` is what ``perfcheck sweep`` (and ``scripts/zero_sweep.sh``, a thin
wrapper) runs. Per stage S it launches DeepSpeed's launcher on ``perfcheck.examples.train_ds`` (or
``--script``) with the package's ``configs/base.json`` merged with ``configs/stage<S>.json`` (S may
name any overlay there, e.g. ``3-gather``) and the user's extra overlays, into ``<out>/stage<S>/``,
with its whole launcher output in ``<out>/stage<S>/launcher.log``. Each stage:

* prints one progress line when it starts and one when it ends (status and seconds);
* has a wall-clock limit (``timeout_s``): past it the launcher's whole process group is killed and
  the stage is marked failed with the reason, so a hung stage (a lock left in a shared build cache,
  a rank waiting on a dead peer) cannot stall the sweep;
* is skipped when its run directory is already complete (resume, the default) unless ``force``.

Nothing is compiled: the stage configs ask for torch's Adam (``"torch_adam": true``), and
``train_ds`` keeps DeepSpeed's CPU shared-memory collective op (a C++ JIT build used only by
inference all-reduce) off unless asked for. A failing stage does not stop the others; the
comparison marks it failed with the tail of its log.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from perfcheck.analysis.stages import log_tail, stage_complete
from perfcheck.integrations.deepspeed.sweep_options import BASE_CONFIG, LOG_NAME, SweepOptions, stage_overlay

@dataclasses.dataclass
class StageResult:
    stage: str
    run_dir: Path
    status: str        # ok | failed | timeout | skipped | interrupted
    seconds: float
    reason: str = ""


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch CUDA: CPU ranks
        return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _optimizer_overlay(opts: SweepOptions, out: Path) -> Optional[Path]:
    """The fused optimizer is an overlay written beside the runs (the package configs ask for torch's)."""
    if opts.optimizer == "torch":
        return None
    import json

    path = out / "optimizer-fused.json"
    path.write_text(json.dumps({"optimizer": {"params": {"torch_adam": False}}}))
    return path


def launch_command(opts: SweepOptions, stage: str, run_dir: Path, port: int, gpus: int,
                   extra_overlays: Sequence[Path] = ()) -> list:
    """The DeepSpeed launcher command line for one stage: with a hostfile DeepSpeed's runner (it starts
    every node), on this machine alone its per-node launcher directly, with the world the runner
    would give it (one interpreter less per stage: a few seconds of imports on a small machine)."""
    if opts.hostfile:
        cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--master_port", str(port),
               "--hostfile", str(opts.hostfile)]
    else:
        import base64
        import json

        world = base64.urlsafe_b64encode(json.dumps({"localhost": list(range(local_ranks(opts, gpus)))}).encode())
        cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world.decode()}",
               "--master_addr=127.0.0.1", f"--master_port={port}"]
    cmd += [str(opts.script)] if opts.script else ["--module", "perfcheck.examples.train_ds"]
    cmd += ["--config", str(BASE_CONFIG), "--overlay", str(stage_overlay(stage))]
    for extra in list(extra_overlays) + list(opts.extra_configs):
        cmd += ["--overlay", str(extra)]
    cmd += ["--model", opts.model, "--out", str(run_dir)]
    if opts.steps is not None:
        cmd += ["--steps", str(opts.steps)]
    if opts.micro_batch is not None:
        cmd += ["--micro-batch", str(opts.micro_batch)]
    return cmd + list(opts.script_args)


def local_ranks(opts: SweepOptions, gpus: int) -> int:
    """Processes on this machine: --ranks, else every visible GPU, else 2 CPU ranks."""
    return opts.ranks or (gpus if gpus > 0 else 2)


def stage_env(gpus: int, verbose: bool) -> dict:
    """The environment of a stage's launcher: CPU ranks on a machine without CUDA, one intra-op thread
    each (ranks share the cores), third-party warnings kept in the log rather than the terminal."""
    env = dict(os.environ)
    if gpus == 0:
        env["DS_ACCELERATOR"] = "cpu"
        env.setdefault("OMP_NUM_THREADS", "1")
    if not verbose:
        env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    return env


#: Seconds the ranks get, after Ctrl-C/SIGTERM, to finish their step and write their files (DeepSpeed's
#: launcher waits 30 s for its children before killing them); past it the whole group is killed.
STOP_GRACE_S = 40.0


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM during ``perfcheck sweep``: the stage running was stopped (its launcher
    and ranks, ``stop_stage``) and marked interrupted; ``signum`` names the signal."""

    def __init__(self, signum: int, message: str = ""):
        self.signum = int(signum)
        super().__init__(message or f"interrupted by {signal.Signals(signum).name}")


def _raise_interrupted(signum, frame):
    raise SweepInterrupted(signum)


def catch_stop_signals():
    """While a sweep runs, SIGTERM (Slurm and Kubernetes pre-emption, ``timeout``) ends it like Ctrl-C:
    as an exception, so the stage running is stopped and nothing is left behind. Returns a function that
    restores the previous handlers; main thread only (Python's rule), default handlers only."""
    saved = {}
    if threading.current_thread() is threading.main_thread():
        defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
        for sig, default in defaults.items():
            if signal.getsignal(sig) is default:
                saved[sig] = signal.signal(sig, _raise_interrupted)

    def restore():
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return restore


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_stage(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """End a stage's launcher and ranks, letting the ranks finish their step and write their files: one
    SIGTERM to the launcher (DeepSpeed's forwards one to each rank; PerfCheck in a rank then stops at the
    step boundary, measure.session), up to ``grace_s`` for the group to exit, then SIGKILL to whatever is
    left of its process group (the launcher runs in a session of its own). A second Ctrl-C kills at once."""
    try:
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C ends the grace period: SIGKILL now
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and _group_alive(proc.pid):
                if proc.poll() is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):  # poll again until the deadline
                        proc.wait(timeout=0.5)
                else:
                    time.sleep(0.2)  # ranks the launcher left behind: same group, still finishing
    finally:
        with contextlib.suppress(ProcessLookupError):  # the whole group already exited
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _kill_group(proc: subprocess.Popen):
    """End the launcher and every rank it started (they share the session started for it)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def _progress_text(run_dir: Path, total: Optional[int]) -> str:
    """'step k/N' from rank 0's engine_steps.csv (rows are appended as steps end)."""
    path = run_dir / "rank0" / "engine_steps.csv"
    try:
        with open(path, "rb") as f:
            rows = max(sum(1 for _ in f) - 1, 0)
    except OSError:
        return "starting"
    return f"micro-step {rows}" + (f" of {total}" if total else "")


def _stopped(proc, run_dir: Path, stage: str, tag: str, t0: float, exc, live: bool, say):
    """Ctrl-C or SIGTERM while the stage runs: stop the launcher and its ranks (they write their files),
    note it in the log and raise SweepInterrupted."""
    signum = getattr(exc, "signum", signal.SIGINT)
    if live:
        sys.stdout.write("\n")
    say(f"{tag}: interrupted by {signal.Signals(signum).name}; stopping the launcher and its ranks "
        f"(up to {STOP_GRACE_S:.0f} s for them to write their files; Ctrl-C again kills them now)")
    stop_stage(proc)
    reason = (f"interrupted by {signal.Signals(signum).name} after {time.monotonic() - t0:.0f} s; the "
              "launcher and its ranks were stopped (each rank wrote the steps it finished)")
    with open(run_dir / LOG_NAME, "a") as tail:
        tail.write(f"perfcheck sweep: stage {stage} {reason}\n")
    raise SweepInterrupted(signum, f"stage {stage} {reason}") from None


def _wait(proc, opts: SweepOptions, run_dir: Path, stage: str, tag: str, t0: float, say):
    """The launcher's exit status, waited on with a progress line on a terminal; a ``StageResult`` when
    the stage ran past ``opts.timeout_s`` (its process group killed)."""
    live = sys.stdout.isatty()
    rc = None
    while rc is None:
        try:
            rc = proc.wait(timeout=1.0)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (catch_stop_signals)
            _stopped(proc, run_dir, stage, tag, t0, exc, live, say)
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - t0
            if elapsed > opts.timeout_s:
                _kill_group(proc)
                if live:
                    sys.stdout.write("\n")
                reason = (f"timed out after {opts.timeout_s:.0f} s (--timeout); the launcher and its ranks were "
                          "killed")
                with open(run_dir / LOG_NAME, "a") as tail:
                    tail.write(f"perfcheck sweep: stage {stage} {reason}\n")
                say(f"{tag} FAILED: {reason}")
                return StageResult(stage, run_dir, "timeout", elapsed, reason)
            if live:
                sys.stdout.write(f"\r{tag}: {elapsed:5.0f} s, {_progress_text(run_dir, None)}   ")
                sys.stdout.flush()
    if live:
        sys.stdout.write("\r")
    return rc


def _outcome(rc: int, run_dir: Path, stage: str, tag: str, elapsed: float, say) -> StageResult:
    """What a finished launcher left: ok only with exit 0 and every rank's run directory complete."""
    if rc != 0:
        tail = log_tail(run_dir, lines=5)
        say(f"{tag} FAILED (exit {rc}) in {elapsed:.1f} s; log {run_dir / LOG_NAME}:\n"
            + "\n".join("    " + t for t in tail.splitlines()))
        return StageResult(stage, run_dir, "failed", elapsed, f"launcher exit {rc}")
    if not stage_complete(run_dir):
        say(f"{tag} FAILED in {elapsed:.1f} s: the launcher exited 0 but not every rank wrote a complete run "
            f"directory (see {run_dir / LOG_NAME})")
        return StageResult(stage, run_dir, "failed", elapsed, "incomplete run directory")
    say(f"{tag}: ok in {elapsed:.1f} s")
    return StageResult(stage, run_dir, "ok", elapsed)


def run_stage(opts: SweepOptions, stage: str, index: int, count: int, *, gpus: int,
              extra_overlays: Sequence[Path] = (), say: Callable[[str], None] = print) -> StageResult:
    """Launch one stage (or skip it when complete), wait at most ``opts.timeout_s``; never raises for
    a failing run: the result says what happened."""
    run_dir = Path(opts.out) / f"stage{stage}"
    tag = f"[{index}/{count}] stage {stage}"
    if not opts.force and stage_complete(run_dir):
        say(f"{tag}: complete in {run_dir}, skipped (--force reruns it)")
        return StageResult(stage, run_dir, "skipped", 0.0)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    cmd = launch_command(opts, stage, run_dir, _free_port(), gpus, extra_overlays)
    say(f"{tag}: running (log {run_dir / LOG_NAME})")
    t0 = time.monotonic()
    with open(run_dir / LOG_NAME, "wb") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=stage_env(gpus, opts.verbose),
                                start_new_session=True)
        rc = _wait(proc, opts, run_dir, stage, tag, t0, say)
    if isinstance(rc, StageResult):
        return rc
    return _outcome(rc, run_dir, stage, tag, time.monotonic() - t0, say)


def run_sweep(opts: SweepOptions, say: Callable[[str], None] = print) -> list:
    """Every stage of ``opts`` in order; returns their ``StageResult``s (the comparison is the caller's)."""
    opts.validate()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = _cuda_devices()
    fused = _optimizer_overlay(opts, out)
    where = (f"hostfile {opts.hostfile}" if opts.hostfile else
             f"{local_ranks(opts, gpus)} {'GPU' if gpus else 'CPU'} rank(s)")
    say(f"perfcheck sweep: ZeRO stages {' '.join(opts.stages)}, model {opts.model}, {where}, into {out}/ "
        f"(per-stage limit {opts.timeout_s:.0f} s)")
    results = []
    restore = catch_stop_signals()
    try:
        for i, s in enumerate(opts.stages, 1):
            try:
                results.append(run_stage(opts, s, i, len(opts.stages), gpus=gpus,
                                         extra_overlays=[fused] if fused else [], say=say))
            except SweepInterrupted as exc:
                results.append(StageResult(s, out / f"stage{s}", "interrupted", 0.0, str(exc)))
                exc.results = results
                raise
    finally:
        restore()
    return results
