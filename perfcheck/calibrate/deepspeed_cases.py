"""DeepSpeed's own host cost per ZeRO stage, for ``perfcheck calibrate``: a tiny in-process engine.

What it measures. A DeepSpeed engine adds work of its own around the model's forward, backward and
optimizer step: the engine's wrappers, ZeRO-1/2's gradient hooks, bucketing, flat fp32 partitions
and their copy-back, ZeRO-3's per-module fetch/release hooks and the autograd functions it wraps
around every module's inputs and outputs, the partitioning of gradients. None of it is on a
datasheet; it is Python, so it is measured here, on this machine.

How. A child process (``python -m perfcheck.calibrate.deepspeed_cases``: DeepSpeed patches
process-wide state, e.g. ZeRO-3 replaces ``F.linear``) joins a one-rank gloo (NCCL on a GPU) group and
builds, for each of three chain models (``MODELS``: 2 and 8 ``Linear(16, 16)``, and 8 without bias, so
module calls and parameter tensors vary independently), a plain torch run (torch.optim.Adam, the
sweep's optimizer) and one engine per ZeRO configuration (``CONFIGS``: stages 0-3, and stage 3 with
every parameter gathered, ``3g``). Rounds are interleaved (a round of steps of every run, then the
next) and each phase is timed in process CPU time (``time.process_time``: what the work costs with a
core to itself; a shared machine's waiting for a core is not in it), median over steps. Before each run's steps
of a round the calibration's host reference (a tiny add, ``perfcheck.calibrate.phase``) is read too, and
``apply`` puts the fitted constants at the calibration's level (``reference_level``: the calibration's reference
time over the same statistic of these readings): a shared core's speed moves by up to 2x for seconds at a time,
and the case runs after the quick calibration, so its raw level is another phase's.

The fit (``fit``), per stage S and phase (fwd, bwd, step), least squares over the three models:

    fwd, bwd:  engine phase - plain torch phase  =  a_S + c_S * parameter tensors
    step:      engine.step() (whole)              =  a_S + c_S * parameter tensors

and at stage 3 one fit over both of its runs (every tensor persistent / every tensor partitioned):
a + b * module calls (fwd, bwd: DeepSpeed hooks every module only at stage 3) + c * persistent
tensors + g * partitioned tensors. The
step is the whole engine.step() (torch Adam's per-tensor loop at stage 0, the flat partition's
update at stages 1-3) because ZeRO replaces the optimizer's loop; the optimizer's memory-bound
update of large partitions is the device side (``perfcheck.predict.zero.optimizer_time_s``).

At N >= 2 ranks (``bench_deepspeed(world_size=N)``: what ``perfcheck sweep`` runs, at its ranks per host) the
engines partition and communicate for real, so the case also sees the host work a one-rank engine skips
(ZeRO-3's gathered buffers and their copy-back, the reduce-scatter's per-rank chunks and padding, ZeRO-1/2's
1/N partitions); the time inside torch.distributed's collectives and their waits is left out (the ZeRO
model prices it with the collective model). Measured on this machine, 2 ranks against one (bench/RESULTS.md,
issue 12): ZeRO-3 per partitioned tensor 457 vs 211 us in forward and 583 vs 354 us in backward,
per persistent tensor in the step 270 vs 171 us.

Not measured here (NB, perfcheck): optimizers other than torch's Adam.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from perfcheck.calibrate import repeats
from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS
from perfcheck.calibrate.phase import per_call_s, reference_fn
from perfcheck.errors import UserError
from perfcheck.hardware.systems import host_constants
from perfcheck.predict.host import process_slowdown
from perfcheck.hardware.host_keys import ZERO_PHASES as PHASES, ZERO_STAGES as STAGES, zero_key

#: (label, Linear layers, bias) of the chain models: 16 -> 16 features, batch BATCH.
MODELS = (("chain2", 2, True), ("chain8", 8, True), ("chain8-nobias", 8, False))
WIDTH, BATCH = 16, 8
#: ZeRO configurations: label -> zero_optimization block. ``3g``: every tensor gathered in forward and
#: again in backward (no persistence, no reuse, no prefetch), as the sweep's stage3-gather config.
CONFIGS = {"0": {"stage": 0}, "1": {"stage": 1}, "2": {"stage": 2}, "3": {"stage": 3},
           "3g": {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
                  "stage3_prefetch_bucket_size": 0}}
#: Host-constant keys this case fits (``perfcheck.hardware.systems.HOST_KEYS``); ``apply`` also writes
#: ``zero_ranks``, the ranks per host they were measured at.
KEYS = tuple([zero_key(s, ph, part) for s in STAGES for ph in PHASES for part in ("", "tensor")]
             + [zero_key(3, ph, "module") for ph in ("fwd", "bwd")] + [zero_key(3, ph, "gather") for ph in PHASES])
#: Calls of the calibration's host reference per reading, beside every run's steps of a round (``reference_level``):
#: ~0.2-0.3 ms on the project's Xeon.
REFERENCE_ADDS = 100
#: Steps per mode: warm-up steps, rounds, steps per round.
MODES = {"quick": (3, 3, 4), "default": (4, 5, 6), "full": (5, 9, 8)}
COLUMNS = ("model", "config", "calls", "tensors", "fwd_s", "bwd_s", "step_s", "steps")


def available() -> bool:
    """True when DeepSpeed can be imported (the case is skipped with a note otherwise)."""
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


# ------------------------------------------------------------------------------ the child process
def _chain(n: int, bias: bool):
    import torch

    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=bias) for _ in range(n)])


#: torch.distributed calls whose time is the collective model's, not DeepSpeed's host work: ``_child``
#: subtracts the process CPU time spent inside them (and inside waits on their async handles).
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce_scatter",
               "broadcast", "reduce", "all_to_all_single", "barrier")


class _TimedWork:
    """An async collective's handle whose ``wait()`` adds its time (on ``clock``) to the collectives' total."""

    def __init__(self, work, spent: dict, clock):
        self._work, self._spent, self._clock = work, spent, clock

    def wait(self, *a, **k):
        c0 = self._clock()
        try:
            return self._work.wait(*a, **k)
        finally:
            self._spent["cpu"] += self._clock() - c0

    def __getattr__(self, name):
        return getattr(self._work, name)


def _time_collectives(dist, spent: dict, clock) -> None:  # pragma: no cover - runs in the child process
    """Wrap ``COLLECTIVES`` of torch.distributed (before DeepSpeed imports and binds them) so that ``spent["cpu"]``
    accumulates the time inside them on the phases' ``clock``: at world size >= 2 that is gloo's copying and
    sending, which the collective model prices; what remains of a phase is DeepSpeed's host work around them."""
    def timed(fn):
        def call(*a, **k):
            c0 = clock()
            try:
                out = fn(*a, **k)
            finally:
                spent["cpu"] += clock() - c0
            return _TimedWork(out, spent, clock) if k.get("async_op") and out is not None else out
        return call

    for name in COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, timed(getattr(dist, name)))


def _init_child(device: str):
    """Rank environment defaults, the collectives' timing wrapper (world size > 1), DeepSpeed imported
    with its logger quiet and no JIT build, the process group up; returns (deepspeed, rank, world,
    clock, spent)."""
    import logging

    import torch.distributed as dist

    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", "29511")):
        os.environ.setdefault(key, value)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    clock = time.process_time if device == "cpu" else time.perf_counter
    spent = {"cpu": 0.0}
    if world > 1:
        _time_collectives(dist, spent, clock)
    import deepspeed  # optional package, imported only in the child (after the collectives are wrapped)
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    deepspeed.utils.logger.setLevel(logging.ERROR)
    if get_accelerator().device_name() == "cpu":  # never JIT-build the shared-memory op (train_ds does the same)
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    return deepspeed, rank, world, clock, spent


class _ChildBench:
    """The child's timed runs: one batch, the phase clock less what the collectives took, and a
    (model, call, backward, step) per chain model and configuration."""

    def __init__(self, deepspeed, device: str, clock, spent):
        import torch

        self.deepspeed, self.clock, self.spent = deepspeed, clock, spent
        self.references = []  # host reference readings (``reference``), one per run and round
        self.dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if device == "cuda" else torch.device("cpu")
        self.sync = (lambda: torch.cuda.synchronize(self.dev)) if device == "cuda" else (lambda: None)
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(BATCH, WIDTH, generator=gen).to(self.dev)
        self.y = torch.randint(0, WIDTH, (BATCH,), generator=gen).to(self.dev)

    def build(self, n, bias, config):
        import torch

        torch.manual_seed(0)
        model = _chain(n, bias).to(self.dev)
        if config == "torch":
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)

            def step():
                opt.step()
                opt.zero_grad(set_to_none=True)
            return model, model, (lambda loss: loss.backward()), step
        cfg = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
               "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
               "zero_optimization": CONFIGS[config], "steps_per_print": 10 ** 9}
        engine, _, _, _ = self.deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        return model, engine, engine.backward, engine.step

    def now(self):  # the phase clock less what the collectives took (0 at world size 1: nothing to subtract)
        return self.clock() - self.spent["cpu"]

    def one(self, run, times):
        import torch.nn.functional as F

        _, call, backward, step = run
        self.sync()
        t0 = self.now()
        out = call(self.x)
        self.sync()
        t1 = self.now()
        backward(F.cross_entropy(out.float(), self.y))
        self.sync()
        t2 = self.now()
        step()
        self.sync()
        t3 = self.now()
        if times is not None:
            for ph, a, b in (("fwd", t0, t1), ("bwd", t1, t2), ("step", t2, t3)):
                times[ph].append(b - a)

    def reference(self) -> float:
        """The calibration's host reference (``phase.reference_fn``: a tiny add), seconds per call on the phases'
        clock, or NaN off the CPU (``REFERENCE_ADDS`` calls)."""
        if self.dev.type != "cpu":
            return float("nan")
        add = self._add = getattr(self, "_add", None) or reference_fn(self.dev)
        return per_call_s(add, REFERENCE_ADDS, self.clock)

    def group_rows(self, group, mode: str) -> list:
        """Median seconds per phase of every chain model under each configuration of ``group``,
        interleaved round by round; the host reference is read before each run's steps of a round
        (``self.references``)."""
        warm, rounds, per_round = MODES[mode]
        runs = {(m, c): self.build(n, b, c) for m, n, b in MODELS for c in group}
        times = {k: {ph: [] for ph in PHASES} for k in runs}
        for k, run in runs.items():
            for _ in range(warm):
                self.one(run, None)
        for _ in range(rounds):
            for k, run in runs.items():
                self.references.append(self.reference())
                for _ in range(per_round):
                    self.one(run, times[k])
        rows = []
        for (m, c), t in times.items():
            n, bias = next((n, b) for lab, n, b in MODELS if lab == m)
            rows.append({"model": m, "config": c, "calls": n + 1, "tensors": n * (2 if bias else 1),
                         **{f"{ph}_s": statistics.median(t[ph]) for ph in PHASES}, "steps": len(t["fwd"])})
        return rows


def _child(out_path: str, mode: str, device: str) -> None:  # pragma: no cover - runs in the child process
    import torch

    deepspeed, rank, world, clock, spent = _init_child(device)
    bench = _ChildBench(deepspeed, device, clock, spent)
    rows = []
    # torch and stages 0-2 first: a stage-3 engine replaces F.linear for the whole process
    for group in (("torch", "0", "1", "2"), ("3", "3g")):
        rows += bench.group_rows(group, mode)
    Path(f"{out_path}.rank{rank}" if world > 1 else out_path).write_text(json.dumps(
        {"rows": rows, "deepspeed": deepspeed.__version__, "torch": torch.__version__, "clock": clock.__name__,
         "world_size": world, "references": [r for r in bench.references if r == r]}))


# ------------------------------------------------------------------------------ the parent side
def bench_deepspeed(mode: str = "quick", *, device: str = "cpu", threads: int = 1, timeout_s: float = 300.0,
                    world_size: int = 1) -> dict:
    """Run the child (``world_size`` of them, one rank each, on this host) and return
    ``{"table": DataFrame(COLUMNS), "deepspeed": version, "clock": name, "world_size": N}``.

    At world size N >= 2 the engines really partition and communicate, so the case sees the host work a
    one-rank engine skips (ZeRO-3's gathered buffers and their copy-back, reduce-scatter's per-rank chunks
    and padding, ZeRO-1/2's partitions of 1/N); each rank subtracts the time inside torch.distributed's
    collectives and their waits (``COLLECTIVES``: the collective model's part), and the table is the mean of
    the ranks' medians. Raises ``RuntimeError`` with a child's last lines when one fails or passes ``timeout_s``."""
    if mode not in MODES:
        raise UserError(f"mode: unknown {mode!r} (known: {', '.join(MODES)})")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise UserError(f"world_size: must be an integer >= 1, got {world_size!r}")
    if device == "cuda":
        import torch

        if torch.cuda.device_count() < world_size:
            raise UserError(f"world_size: {world_size} ranks need {world_size} GPUs, {torch.cuda.device_count()} visible")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = str(Path(__file__).resolve().parents[2])  # the child imports this perfcheck, installed or not
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MASTER_PORT": str(port), "PYTHONWARNINGS": "ignore",
           "MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
           "PYTHONPATH": os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    if device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ds.json"
        cmd = [sys.executable, "-m", "perfcheck.calibrate.deepspeed_cases", str(out), mode, device, str(threads)]
        procs = [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, cwd=tmp) for r in range(world_size)]
        deadline, logs = time.monotonic() + timeout_s, []
        try:
            for proc in procs:
                try:
                    logs.append(proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))[0] or "")
                except subprocess.TimeoutExpired:
                    raise RuntimeError(f"DeepSpeed engine case passed its {timeout_s:.0f} s limit") from None
        finally:
            for proc in procs:  # only the processes this call started
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(5)
        files = [out] if world_size == 1 else [Path(f"{out}.rank{r}") for r in range(world_size)]
        bad = next((i for i, (proc, f) in enumerate(zip(procs, files)) if proc.returncode != 0 or not f.is_file()), None)
        if bad is not None:
            tail = "\n".join(logs[bad].strip().splitlines()[-5:]) if bad < len(logs) else ""
            raise RuntimeError(f"DeepSpeed engine case failed (rank {bad}, exit {procs[bad].returncode}): {tail}")
        data = [json.loads(f.read_text()) for f in files]
    tables = [pd.DataFrame(d["rows"], columns=list(COLUMNS)) for d in data]
    table = tables[0].copy()
    for ph in PHASES:  # the mean of the ranks' medians (the ranks ran the same configurations in the same order)
        table[f"{ph}_s"] = np.mean([t[f"{ph}_s"].to_numpy(float) for t in tables], axis=0)
    readings = [r for d in data for r in d.get("references", [])]
    return {"table": table, "deepspeed": data[0]["deepspeed"], "clock": data[0]["clock"], "world_size": world_size,
            "reference_s": repeats.anchor_s(readings) if readings else None}


def _lstsq(cols, y) -> np.ndarray:
    a = np.column_stack(cols)
    return np.linalg.lstsq(a, np.asarray(y, float), rcond=None)[0]


def fit(table: pd.DataFrame) -> dict:
    """``{host key: (seconds, how)}`` from ``bench_deepspeed``'s table (see the module docstring).

    Stages 0-2, per phase, least squares over the three models: y = a + c * tensors. Stage 3, one least
    squares over its two runs (every tensor persistent, every tensor partitioned; 6 observations):
    y = a + b * module calls + c * persistent tensors + g * partitioned tensors (no b for the step).
    Coefficients are clipped at 0 (a cost cannot be negative; a slightly negative slope is noise)."""
    meta = table.drop_duplicates("model").set_index("model")
    t = table.set_index(["config", "model"])
    models = [m for m, _, _ in MODELS]
    calls = meta.loc[models, "calls"].to_numpy(float)
    tensors = meta.loc[models, "tensors"].to_numpy(float)
    ones, zeros = np.ones(len(models)), np.zeros(len(models))
    out = {}
    shape = "chains of " + ", ".join(f"{n} Linear({WIDTH}, {WIDTH}{'' if b else ', bias=False'})" for _, n, b in MODELS)

    def put(key, value, how):
        out[key] = (float(max(value, 0.0)), how)

    def phase_y(cfg, ph):
        y = np.array([t.loc[(cfg, m), f"{ph}_s"] for m in models], float)
        if ph != "step":
            y = y - np.array([t.loc[("torch", m), f"{ph}_s"] for m in models], float)
        return y

    for ph in PHASES:
        what = ("engine.step() (optimizer included)" if ph == "step" else
                f"engine {'forward' if ph == 'fwd' else 'backward'} less the plain model's")
        for stage in (0, 1, 2):
            a, c = _lstsq([ones, tensors], phase_y(str(stage), ph))
            put(zero_key(stage, ph), a, f"ZeRO-{stage} {what}: fixed part, least squares over {shape}")
            put(zero_key(stage, ph, "tensor"), c, f"ZeRO-{stage} {what}: per parameter tensor, same fit")
        y = np.concatenate([phase_y("3", ph), phase_y("3g", ph)])
        cols = [np.concatenate([ones, ones]), np.concatenate([tensors, zeros]), np.concatenate([zeros, tensors])]
        if ph != "step":
            cols.insert(1, np.concatenate([calls, calls]))
        coef = _lstsq(cols, y)
        a, (c, g) = coef[0], coef[-2:]
        both = (f"least squares over {shape}, with every tensor persistent and with every tensor partitioned "
                f"(persistence threshold 0, reuse 0, prefetch 0)")
        put(zero_key(3, ph), a, f"ZeRO-3 {what}: fixed part, {both}")
        put(zero_key(3, ph, "tensor"), c, f"ZeRO-3 {what}: per persistent parameter tensor, same fit")
        put(zero_key(3, ph, "gather"), g, f"ZeRO-3 {what}: per partitioned parameter tensor (the host side of its "
                                       f"fetch and release, not the all-gather itself), same fit")
        if ph != "step":
            put(zero_key(3, ph, "module"), coef[1], f"ZeRO-3 {what}: per module call, same fit")
    return out


def ranks_measured(spec) -> int:
    """The rank count ``spec``'s DeepSpeed constants were measured at (``host.zero_ranks``, written by ``apply``;
    1 for a default's or a base spec's)."""
    return max(int(round(host_constants(spec)["zero_ranks"])), 1)


def apply(spec, result: dict, stamp: str):
    """``spec`` with the fitted constants in its host block and their sources. Measured at N >= 2 ranks on one
    host, each constant carries the N processes' slowdown, which the stage model applies itself
    (``perfcheck.predict.host.process_slowdown``, from ``spec`` as it stands): divided out here, so it is
    counted once."""
    import dataclasses

    fitted = fit(result["table"])
    slow = process_slowdown(spec, int(result.get("world_size", 1)))
    fitted = {k: (v / slow, how + (f"; / {slow:.3f}, the process slowdown of {result['world_size']} ranks on one "
                                   "host that the stage model applies" if slow != 1 else ""))
              for k, (v, how) in fitted.items()}
    level = reference_level(spec, result)
    if level != 1.0:
        fitted = {k: (v * level, how + f"; x {level:.3f}, from the case's host reference to the calibration's "
                                       "(its reference_s over the case's)")
                  for k, (v, how) in fitted.items()}
    ranks = int(result.get("world_size", 1))
    where = (f"{stamp}, DeepSpeed {result['deepspeed']}, "
             + ("one rank" if ranks == 1 else f"{ranks} ranks on this host, the time inside collectives left out")
             + f", {result['clock']}")
    fitted["zero_ranks"] = (float(ranks), "the ranks per host the case ran at")
    host = {**dict(spec.host), **{k: v for k, (v, _) in fitted.items()}}
    sources = {**dict(spec.sources), **{f"host.{k}": f"{where}: {how}" for k, (_, how) in fitted.items()}}
    return dataclasses.replace(spec, host=host, sources=sources)


def reference_level(spec, result: dict) -> float:
    """The factor that puts the case's constants at the calibration's level: the calibration's host reference
    (``spec.calibration["reference_s"]``, a tiny add, ``repeats.ANCHOR`` of its readings) over the same statistic of
    the readings taken beside the case's rounds (``result["reference_s"]``). Every constant the case fits is host
    work (Python, dispatch), which moves with that reference (perfcheck/calibrate/repeats.py), so a case run while
    the shared core was at another speed than during the calibration is read at the calibration's speed like every
    other case. 1 when either side has no reference (a GPU, a spec without a CPU calibration, an older result)."""
    cal = (getattr(spec, "calibration", None) or {}).get("reference_s")
    case = result.get("reference_s")
    ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and x > 0 for x in (cal, case))
    return float(cal) / float(case) if ok else 1.0


def rows_for_table(result: dict) -> pd.DataFrame:
    """The case's measurements in the calibration's measurement table (kind ``deepspeed``)."""
    rows = []
    for r in result["table"].itertuples(index=False):
        for ph in PHASES:
            s = float(getattr(r, f"{ph}_s"))
            rows.append({"kind": "deepspeed", "label": f"{r.config} {r.model} {ph}", "dtype": "fp32", "m": r.calls,
                         "k": r.tensors, "n": BATCH, "flops": np.nan, "bytes": np.nan, "world_size": 1,
                         "seconds": s, "seconds_min": np.nan, "seconds_max": np.nan, "repeats": r.steps,
                         "iters": 1, "flops_per_s": np.nan, "bytes_per_s": np.nan, "busbw_bytes_per_s": np.nan})
    return pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS))


if __name__ == "__main__":  # pragma: no cover - the child process
    import torch

    torch.set_num_threads(int(sys.argv[4]))
    _child(sys.argv[1], sys.argv[2], sys.argv[3])
