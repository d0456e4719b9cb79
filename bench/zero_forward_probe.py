"""Where the LeNet ZeRO sweep's forward time goes: the same training loop as the sweep's ranks
(``perfcheck.examples.train_ds``: LeNet, micro batch 8, torch Adam, one intra-op thread) timed per
phase, plain torch beside a DeepSpeed engine at each ZeRO stage, at 1 rank and at N ranks at once.

    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu flock /tmp/perfcheck-bench.lock \\
        python3 bench/zero_forward_probe.py --ranks 1 --ranks 2 [--rounds 12 --per-round-steps 6]

Per rank and configuration (``torch``: the bare model and torch.optim.Adam; ``0``-``3``: an engine at that
stage, the sweep's config), rounds are interleaved (a few steps of every configuration, then the next
round), each phase timed on the wall clock and in process CPU time; the table gives medians over the
steps of every rank. What it separates:

* engine forward - torch forward (same process, same rounds): DeepSpeed's own host work per forward
  call at that stage (the prediction's ``zero<S>_fwd_s`` terms);
* N ranks against 1 (CPU time): the slowdown of processes sharing the host's cores and caches (the
  prediction's ``process_slowdown``);
* wall - CPU: waiting (for a core, for a peer rank);
* the calibration's two references (a tiny add, a 128^3 mm: ``perfcheck.calibrate.phase``) read before every
  step: the machine's speed beside each step (the same readings ``perfcheck.measure.speed`` takes in a sweep).

Stage 3 replaces ``F.linear`` for the whole process, so its engine runs in a second group after the
others (as ``perfcheck.calibrate.deepspeed_cases`` does).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("fwd", "bwd", "step")
GROUPS = (("torch", "0", "1", "2"), ("3",))


def _config(stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
            "zero_optimization": {"stage": stage}, "steps_per_print": 10 ** 9, "wall_clock_breakdown": False}


def _child(out: str, rounds: int, per_round: int, warm: int, groups) -> None:  # pragma: no cover - child
    import logging

    import deepspeed
    import deepspeed.ops
    import torch

    from perfcheck.examples.models import EXAMPLES

    deepspeed.utils.logger.setLevel(logging.ERROR)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    ex = EXAMPLES["lenet"]
    gen = torch.Generator().manual_seed(1000 + rank)
    data = [ex.batch(8, gen) for _ in range(4)]

    def build(cfg):
        torch.manual_seed(0)
        model = ex.build()
        if cfg == "torch":
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)

            def step():
                opt.step()
                opt.zero_grad(set_to_none=True)
            return model, (lambda loss: loss.backward()), step
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=_config(int(cfg)))
        return engine, engine.backward, engine.step

    a1, b1 = torch.ones(1), torch.ones(1)
    mm = torch.randn(128, 128)

    def refs():  # the calibration's two references (calibrate.phase): per tiny add, per 128^3 mm, CPU time
        c0 = time.process_time()
        for _ in range(100):
            torch.add(a1, b1)
        c1 = time.process_time()
        for _ in range(4):
            torch.mm(mm, mm)
        return (c1 - c0) / 100, (time.process_time() - c1) / 4

    rows = []
    for group in groups:
        runs = {c: build(c) for c in group}
        times = {c: {f"{ph}_{k}": [] for ph in PHASES for k in ("s", "cpu_s")} | {"ref_s": [], "cref_s": []}
                 for c in group}
        i = 0
        for r in range(warm + rounds):
            for c, (call, backward, step) in runs.items():
                for _ in range(per_round):
                    (x,), y = data[i % 4]
                    i += 1
                    ref, cref = refs()
                    stamps = []
                    stamps.append((time.perf_counter(), time.process_time()))
                    pred = call(x)
                    stamps.append((time.perf_counter(), time.process_time()))
                    backward(ex.loss(pred.float(), y))
                    stamps.append((time.perf_counter(), time.process_time()))
                    step()
                    stamps.append((time.perf_counter(), time.process_time()))
                    if r >= warm:
                        times[c]["ref_s"].append(ref)
                        times[c]["cref_s"].append(cref)
                        for ph, a, b in zip(PHASES, stamps, stamps[1:]):
                            times[c][f"{ph}_s"].append(b[0] - a[0])
                            times[c][f"{ph}_cpu_s"].append(b[1] - a[1])
        for c, t in times.items():
            rows.append({"rank": rank, "config": c, **{k: v for k, v in t.items()}})
    Path(f"{out}.rank{rank}").write_text(json.dumps(rows))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(ranks: int, rounds: int, per_round: int, warm: int, groups=GROUPS) -> list:
    """Every rank's rows (one per configuration: per-step phase times) from ``ranks`` child processes."""
    out = tempfile.mktemp(prefix="zero_forward_probe_")
    port = _free_port()
    procs = []
    for r in range(ranks):
        env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(ranks),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore"}
        code = (f"import bench.zero_forward_probe as p; p._child({out!r}, {rounds}, {per_round}, {warm}, "
                f"{[list(g) for g in groups]!r})")
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, cwd=Path(__file__).parent.parent,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate(timeout=900)
        if p.returncode != 0:
            raise SystemExit(f"probe rank failed:\n{err.decode()[-3000:]}")
    rows = []
    for r in range(ranks):
        path = Path(f"{out}.rank{r}")
        rows += json.loads(path.read_text())
        path.unlink()
    return rows


def table(rows: list, ranks: int) -> str:
    """Medians over every rank's steps, ms, per configuration."""
    lines = [f"ranks {ranks} (ms; the references in us per call)",
             "| config | fwd wall | fwd CPU | bwd wall | bwd CPU | step wall | step CPU | add ref | mm ref | steps |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in dict.fromkeys(r["config"] for r in rows):
        pooled = {k: [v for r in rows if r["config"] == c for v in r[k]]
                  for k in [f"{ph}_{w}" for ph in PHASES for w in ("s", "cpu_s")] + ["ref_s", "cref_s"]}
        med = {k: 1e3 * statistics.median(v) for k, v in pooled.items()}
        lines.append(f"| {c} | " + " | ".join(f"{med[f'{ph}_{w}']:.3f}" for ph in PHASES for w in ("s", "cpu_s"))
                     + f" | {1e3 * med['ref_s']:.2f} | {1e3 * med['cref_s']:.1f} | {len(pooled['fwd_s'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, action="append", default=None, help="ranks at once (repeatable)")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--per-round-steps", type=int, default=6)
    p.add_argument("--warm", type=int, default=2, help="rounds not timed")
    p.add_argument("--json", default=None, help="also write every step's times here")
    args = p.parse_args(argv)
    everything = {}
    for n in args.ranks or [1, 2]:
        rows = run(n, args.rounds, args.per_round_steps, args.warm)
        everything[n] = rows
        print(table(rows, n), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(everything))
    return 0


if __name__ == "__main__":
    sys.exit(main())
