"""First-touch page faults per phase on the DLRM-style workload of bench/heldout.py, with optimizer.zero_grad's
``set_to_none`` True (torch's default) and False, as perfcheck records and explains them.

CPU, one intra-op thread. Each variant: PerfCheck(warmup=2, steps=--steps, profile=False) around the workload's
training loop (forward + loss, backward, optimizer.step(), zero_grad); printed: the medians over measured steps of
the phases' wall times and minor faults (steps.csv), the measured cost of one fault (meta.json page_faults.cost)
and the report's page_faults finding. The workload is only an illustration here: no threshold was set from it.

    OMP_NUM_THREADS=1 PERFCHECK_CACHE_DIR=... flock /tmp/perfcheck-bench.lock python3 bench/page_faults.py
    ... --model hf_bert --steps 10          # another bench/heldout.py workload
    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296 ... # glibc keeps freed blocks: no faults
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import heldout  # noqa: E402
import perfcheck  # noqa: E402
from perfcheck.analysis.findings import findings_table  # noqa: E402
from perfcheck.analysis.pipeline import reconcile_run  # noqa: E402
from perfcheck.units import fmt_time  # noqa: E402


def run(model: str, set_to_none: bool, steps: int) -> dict:
    w = heldout.build(model)
    opt = w.optimizer(w.model.parameters())
    out = Path(tempfile.mkdtemp()) / "run"
    pc = perfcheck.PerfCheck(w.model, warmup=2, steps=steps, profile=False, sample_interval=None, out_dir=out,
                             optimizer=opt).start()
    for _ in range(steps + 2):
        loss = w.loss(w.model(*w.inputs), w.target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        pc.step()
    pc.stop()
    st = pc.steps()
    st = st[(st["role"] == "measured") & ~st["failed"]]
    med = st.median(numeric_only=True)
    cost = (pc.meta()["page_faults"].get("cost") or {}).get("seconds_per_fault")
    rec = reconcile_run(out).table
    f = findings_table(rec)
    f = f[f["reason"] == "page_faults"]
    return {"med": med, "cost": cost, "finding": "; ".join(f"{r.phase}: {r.evidence}" for r in f.itertuples())}


def backward_only(model: str, steps: int) -> str:
    """Without perfcheck: the median process CPU time and minor faults of loss.backward() over ``steps`` steps
    (zero_grad(set_to_none=True)); run once with the default glibc environment and once with both thresholds
    set, the same work with and without the faults (the cleaner A/B: set_to_none=False also changes the work,
    an in-place add of every gradient)."""
    import resource
    import statistics
    import time

    w = heldout.build(model)
    opt = w.optimizer(w.model.parameters())
    cpu, faults = [], []
    for i in range(steps + 3):
        loss = w.loss(w.model(*w.inputs), w.target)
        f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
        loss.backward()
        t1, f1 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        if i >= 3:
            cpu.append(t1 - t0)
            faults.append(f1 - f0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return f"backward CPU {fmt_time(statistics.median(cpu))}, minor faults {statistics.median(faults):.0f} (median of {steps})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dlrm_bag")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--backward-only", action="store_true", help="backward_only(): no perfcheck, set_to_none=True")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.backward_only:
        import os
        print(f"{os.environ.get('MALLOC_MMAP_THRESHOLD_', 'default')}: {backward_only(args.model, args.steps)}")
        return
    import os
    env = " ".join(f"{k}={os.environ[k]}" for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_") if k in os.environ)
    print(f"{args.model}, torch {torch.__version__}, {torch.get_num_threads()} thread, {args.steps} measured steps, "
          f"glibc environment: {env or 'default'}")
    print("| zero_grad | fwd | bwd | optim | step | minor faults fwd / bwd / optim / step | cost per fault |")
    print("|---|---|---|---|---|---|---|")
    findings = []
    for none in (True, False):
        r = run(args.model, none, args.steps)
        m = r["med"]
        print(f"| set_to_none={none} | {fmt_time(m['fwd_s'])} | {fmt_time(m['bwd_s'])} | {fmt_time(m['optim_s'])} | "
              f"{fmt_time(m['step_s'])} | {m['minor_faults_fwd']:.0f} / {m['minor_faults_bwd']:.0f} / "
              f"{m['minor_faults_optim']:.0f} / {m['minor_faults_step']:.0f} | "
              f"{fmt_time(r['cost']) if r['cost'] is not None else 'not measured'} |")
        findings.append((none, r["finding"] or "(no page_faults finding)"))
    for none, text in findings:
        print(f"\nset_to_none={none}: {text}")


if __name__ == "__main__":
    main()
