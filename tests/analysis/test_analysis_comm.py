"""Collectives per module (analysis/comm.py, through reconcile): bytes on the module that issued a
collective, time on the module that waited for it, each wait tied to what it waited for, per
profiled step; hand-built collectives.csv rows with the numbers worked out in the comments. The
real 2-rank gloo runs (DDP buckets, FSDP2 prefetch with a planted delay) are in
test_torch_distributed_straggler.py."""
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from perfcheck.analysis.comm import module_comm, step_waits, wait_pairs
from perfcheck.analysis.findings import findings_table
from perfcheck.analysis.reconcile import reconcile
from perfcheck.analysis.totals import totals_frame
from perfcheck.measure.collectives import COLLECTIVE_COLUMNS, FINALIZE_OP, SYNC_SUFFIX, _blocked_after
from perfcheck.schema import ROOT, STEP_COLUMNS

from _reconcile_rows import meas_row, one, pred_row

COPY_OUT = "FSDP::all_gather_copy_out"


def issued(module, phase, kind, nbytes, op=None, target="", rank=0):
    op = op or {"allgather": "c10d::_allgather_base_", "reducescatter": "c10d::_reduce_scatter_base_",
                "allreduce": "c10d::allreduce_"}[kind]
    return {"rank": rank, "what": "issued", "module": module, "phase": phase, "kind": kind, "op": op,
            "bytes": float(nbytes), "dtype": "", "issue_s": 1e-5, "wait_s": 0.0, "target": target}


def waited(module, phase, op, wait_s, kind="", target="", rank=0):
    return {"rank": rank, "what": "waited", "module": module, "phase": phase, "kind": kind, "op": op,
            "bytes": 0.0, "dtype": "", "issue_s": 0.0, "wait_s": wait_s, "target": target}


def fsdp_backward_step():
    """One backward of a 2-unit FSDP2 model: head's backward prefetches layers.1's all-gather, which
    layers.1 waits for (4 ms) before computing; layers.1 then prefetches layers.0's (waited 1 ms in
    layers.0) and reduce-scatters its gradients; the root's end-of-backward waits 2 ms for both
    reduce-scatters."""
    return [issued("head", "bwd", "allgather", 4224, target="layers.1"),
            waited("layers.1", "bwd", COPY_OUT, 0.004, "allgather", "layers.1"),
            issued("layers.1", "bwd", "allgather", 4224, target="layers.0"),
            issued("layers.1", "bwd", "reducescatter", 4224, target="layers.1"),
            waited("layers.0", "bwd", COPY_OUT, 0.001, "allgather", "layers.0"),
            issued("layers.0", "bwd", "reducescatter", 4224, target="layers.0"),
            waited(ROOT, "bwd", FINALIZE_OP, 0.002)]


MODULES = [ROOT, "layers", "layers.0", "layers.1", "head"]


def rec_of(coll, profile_steps=2, ranks=(0,), steps=None, layouts=None):
    pred = pd.DataFrame([pred_row(m, 1e-3, 2e-3) for m in MODULES])
    meas = pd.DataFrame([meas_row(m, 1e-3, 2e-3, rank=r) for r in ranks for m in MODULES])
    return reconcile(pred, meas, collectives=pd.DataFrame(coll, columns=list(COLLECTIVE_COLUMNS)),
                     profile_steps=profile_steps, steps=steps, layouts=layouts)


def test_bytes_on_the_issuer_wait_on_the_waiter_per_profiled_step():
    rec = rec_of(fsdp_backward_step() * 2)  # a window of 2 profiled steps: every number halves back to one step
    head, l1, l0, root = (one(rec, m) for m in ("head", "layers.1", "layers.0", ROOT))
    # head issued layers.1's all-gather: 4224 B per step, on head; layers.1 issued 4224 + 4224
    assert head["meas_comm_own_bwd_bytes"] == 4224 and head["meas_comm_own_bwd_count"] == 1
    assert l1["meas_comm_own_bwd_bytes"] == 8448 and l1["meas_comm_own_bwd_count"] == 2
    assert head["meas_comm_wait_own_bwd_s"] == 0  # the issuer did not wait
    assert l1["meas_comm_wait_own_bwd_s"] == pytest.approx(0.004)
    # subtree: layers holds layers.0 + layers.1 (3 collectives, 12672 B; waits 5 ms); the root everything,
    # 4 x 4224 B = 16896 B, waits 4 + 1 + 2 = 7 ms; its own wait is the end-of-backward 2 ms
    lay = one(rec, "layers")
    assert lay["meas_comm_bwd_bytes"] == 12672 and lay["meas_comm_wait_bwd_s"] == pytest.approx(0.005)
    assert root["meas_comm_bwd_bytes"] == 16896 and root["meas_comm_wait_bwd_s"] == pytest.approx(0.007)
    assert root["meas_comm_wait_own_bwd_s"] == pytest.approx(0.002)
    assert root["meas_comm_fwd_bytes"] == 0  # collectives recorded, none in forward: 0, not NaN
    assert ("FSDP2 all-gather for layers.1 (4.22 KB) issued in head's backward (prefetch), waited on in "
            "layers.1's backward: 4 ms") == l1["comm_waits_bwd"]
    assert ("FSDP2 reduce-scatter (2 per step, 8.45 KB) issued in backward by layers.1, layers.0, waited on at the "
            "end of backward ((root)'s end-of-backward callbacks): 2 ms") == root["comm_waits_bwd"]
    assert l0["comm_waits_fwd"] == "" and head["comm_waits_bwd"] == ""


def test_ddp_bucket_all_reduces_are_waited_on_by_the_root():
    coll = [issued("layers.1", "bwd", "allreduce", 300), issued("layers.0", "bwd", "allreduce", 200),
            waited(ROOT, "bwd", FINALIZE_OP, 0.04)]
    pairs = wait_pairs(pd.DataFrame(coll), profile_steps=1)
    assert len(pairs) == 1
    p = pairs.iloc[0]
    assert (p["module"], p["kind"], p["bytes"], p["count"], p["issuers"]) == (ROOT, "allreduce", 500, 2,
                                                                             "layers.1/bwd,layers.0/bwd")
    rec = rec_of(coll, profile_steps=1, layouts={0: "ddp"})
    assert one(rec, ROOT)["comm_waits_bwd"] == ("DDP bucket all-reduce (2 per step, 500 B) issued in backward by "
                                                "layers.1, layers.0, waited on at the end of backward ((root)'s "
                                                "end-of-backward callbacks): 40 ms")


def test_functional_waits_pair_with_the_oldest_unwaited_collective():
    f_ag, f_rs = "_c10d_functional::all_gather_into_tensor", "_c10d_functional::reduce_scatter_tensor"
    coll = [issued("layers.0", "fwd", "allgather", 64, op=f_ag), issued("layers.0", "fwd", "reducescatter", 32, op=f_rs),
            waited("layers.1", "fwd", "_c10d_functional::wait_tensor", 0.01),
            waited("layers.1", "fwd", "_c10d_functional::wait_tensor", 0.02)]
    pairs = wait_pairs(pd.DataFrame(coll)).set_index("kind")
    assert pairs.loc["allgather", "wait_s"] == 0.01 and pairs.loc["allgather", "bytes"] == 64
    assert pairs.loc["reducescatter", "wait_s"] == 0.02 and pairs.loc["reducescatter", "bytes"] == 32
    text = one(rec_of(coll, profile_steps=1, layouts={0: "tp"}), "layers.1")["comm_waits_fwd"]
    # largest wait first
    assert text == ("DTensor reduce-scatter (32 B) issued in layers.0's forward, waited on in layers.1's forward: "
                    "20 ms; DTensor all-gather (64 B) issued in layers.0's forward, waited on in layers.1's forward: 10 ms")


def test_a_synchronous_call_waits_in_the_issuer():
    coll = [issued("layers.0", "fwd", "allgather", 4224, target="layers.1"),
            waited("layers.0", "fwd", "c10d::_allgather_base_" + SYNC_SUFFIX, 0.03, "allgather", "layers.1"),
            waited("layers.1", "fwd", COPY_OUT, 0.0002, "allgather", "layers.1")]
    rec = rec_of(coll, profile_steps=1)
    l0, l1 = one(rec, "layers.0"), one(rec, "layers.1")
    assert l0["meas_comm_wait_own_fwd_s"] == 0.03 and l1["meas_comm_wait_own_fwd_s"] == 0.0002
    assert l0["comm_waits_fwd"].startswith("FSDP2 all-gather for layers.1 (prefetch) (4.22 KB) issued and waited on "
                                           "in layers.0's forward (a synchronous call")
    # the copy-out still names the all-gather it copies out of
    assert "issued in layers.0's forward (prefetch), waited on in layers.1's forward" in l1["comm_waits_fwd"]


def test_ranks_without_collectives_are_not_measured_and_modules_without_any_are_zero():
    rec = rec_of(fsdp_backward_step(), profile_steps=1, ranks=(0, 1))
    assert one(rec, "layers.0", 0)["meas_comm_fwd_bytes"] == 0  # rank 0 recorded collectives, none in forward
    r1 = one(rec, "layers.1", 1)
    assert math.isnan(r1["meas_comm_bwd_bytes"]) and math.isnan(r1["meas_comm_wait_own_bwd_s"])
    assert r1["comm_waits_bwd"] == ""
    # no collectives at all: the columns exist, NaN
    pred = pd.DataFrame([pred_row(ROOT, 1e-3)])
    plain = reconcile(pred, pd.DataFrame([meas_row(ROOT, 1e-3)]))
    assert math.isnan(one(plain, ROOT)["meas_comm_fwd_bytes"]) and one(plain, ROOT)["comm_waits_fwd"] == ""


def _steps(rank, step_s, finalize_s=0.0, n=3):
    return pd.DataFrame([{"step": i, "measured": True, "fwd_s": 1e-3, "bwd_s": 2e-3, "optim_s": 1e-3,
                          "bwd_finalize_s": finalize_s, "step_s": step_s, "recompute_s": 0.0, "eval_s": 0.0,
                          "micro_batches": 1, "peak_mem_bytes": math.nan, "role": "measured", "failed": False,
                          "rank": rank} for i in range(n)], columns=list(STEP_COLUMNS))


def test_a_large_own_wait_is_a_finding_naming_issuer_and_waiter():
    # step 100 ms: layers.1 waited 4 ms (< 5%: no finding), the root 2 ms; with 8 ms (>= 5 ms): a finding
    rows = fsdp_backward_step()
    rec = rec_of(rows, profile_steps=1, steps=_steps(0, 0.1, 0.002))
    assert (findings_table(rec)["reason"] != "comm_wait").all()
    rows[1] = waited("layers.1", "bwd", COPY_OUT, 0.008, "allgather", "layers.1")
    f = findings_table(rec_of(rows, profile_steps=1, steps=_steps(0, 0.1, 0.002)))
    f = f[f["reason"] == "comm_wait"]
    assert list(f["module"]) == ["layers.1"] and list(f["phase"]) == ["bwd"] and f["lost_s"].iloc[0] == 0.008
    assert "issued in head's backward (prefetch), waited on in layers.1's backward: 8 ms" in f["evidence"].iloc[0]
    # the wait columns are per profiled step: against a 200 ms profiled step the 8 ms is 4%, no finding
    slow = pd.concat([_steps(0, 0.1, 0.002), _steps(0, 0.2, n=1).assign(step=9, role="profile")], ignore_index=True)
    rec = rec_of(rows, profile_steps=1, steps=slow)
    assert totals_frame(rec).iloc[0]["profiled_step_s"] == 0.2
    assert (findings_table(rec)["reason"] != "comm_wait").all()


def test_the_straggler_is_found_by_compute_after_every_wait():
    """Both ranks' steps take 100 ms (FSDP2 equalises them); rank 0 waited 40 ms inside forward for
    rank 1's all-gather (copy-out), 1 ms at the end of backward: compute 100 - 1 - 40 = 59 ms against
    rank 1's 100 - 1 - 0.5 = 98.5 ms: rank 1 is the straggler. Without the forward wait, rank 0's
    compute (99 ms) would be the larger."""
    coll = [issued("layers.1", "fwd", "allgather", 4224, target="layers.1"),
            waited("layers.1", "fwd", COPY_OUT, 0.04, "allgather", "layers.1"),
            issued("layers.1", "fwd", "allgather", 4224, target="layers.1", rank=1),
            waited("layers.1", "fwd", COPY_OUT, 0.0005, "allgather", "layers.1", rank=1)]
    steps = pd.concat([_steps(0, 0.1, 0.001), _steps(1, 0.1, 0.001)], ignore_index=True)
    t = totals_frame(rec_of(coll, profile_steps=1, ranks=(0, 1), steps=steps)).set_index("rank")
    assert t.loc[0, "meas_comm_wait_s"] == pytest.approx(0.041) and t.loc[0, "meas_compute_s"] == pytest.approx(0.059)
    assert t.loc[1, "meas_compute_s"] == pytest.approx(0.0985)
    assert bool(t.loc[1, "straggler"]) and not bool(t.loc[0, "slowest"])
    assert step_waits(pd.DataFrame(coll)) == pytest.approx({0: 0.04, 1: 0.0005})


def _ev(start, end, thread=1, parent=None):
    return SimpleNamespace(time_range=SimpleNamespace(start=start, end=end), thread=thread, cpu_parent=parent)


def test_blocked_after_a_synchronous_call_and_not_after_an_asynchronous_one():
    parent = _ev(0, 50_000)  # us: the FSDP::all_gather range, open until the collective ended
    op = _ev(100, 400, parent=parent)
    backend = _ev(450, 40_450, thread=2)  # the gloo thread ran it for 40 ms
    # nothing started on the issuing thread between 400 us and 40.45 ms: it sat in work.wait()
    assert _blocked_after(op, backend, {1: [0, 100, 40_500]}) == pytest.approx(0.04005)
    # an op started at 1 ms on the issuing thread: it went on working (asynchronous)
    assert _blocked_after(op, backend, {1: [0, 100, 1_000, 40_500]}) == 0.0
    # the enclosing range ended before the collective: not blocked in it
    assert _blocked_after(_ev(100, 400, parent=_ev(0, 500)), backend, {1: [0, 100]}) == 0.0
    assert _blocked_after(op, None, {}) == 0.0  # no backend event matched


def test_module_comm_frame_has_the_documented_columns():
    from perfcheck.schema import MODULE_COMM_COLUMNS

    frame = module_comm(pd.DataFrame(fsdp_backward_step()), 1)
    assert list(frame.columns) == ["rank", "module"] + [c.format(p=p) for p in ("fwd", "bwd") for c in MODULE_COMM_COLUMNS]
    assert set(frame["module"]) == {ROOT, "layers", "layers.0", "layers.1", "head"}


def test_window_waits_are_scaled_to_the_measured_steps():
    """The profiled step took 200 ms (the profiler slows it) and rank 0 waited 80 ms in it: 40% of the
    step. The measured steps take 100 ms, so 40 ms of each is waiting, not 80 ms (which would leave
    100 - 80 - 1 = 19 ms of compute instead of 59 ms)."""
    from perfcheck.analysis.comm import in_step_waits

    coll = pd.DataFrame([issued("layers.1", "fwd", "allgather", 4224, target="layers.1"),
                         waited("layers.1", "fwd", COPY_OUT, 0.08, "allgather", "layers.1")])
    steps = _steps(0, 0.1, 0.001)
    steps = pd.concat([steps.assign(step=steps["step"] + 2),
                       _steps(0, 0.5, n=1).assign(role="profile"),  # profiler warm-up step: not in the window
                       _steps(0, 0.2, n=1).assign(step=1, role="profile")], ignore_index=True)
    assert in_step_waits(coll, steps, 1) == pytest.approx({0: 0.04})
    t = totals_frame(rec_of(coll, profile_steps=1, steps=steps)).iloc[0]
    assert t["meas_comm_wait_s"] == pytest.approx(0.041) and t["meas_compute_s"] == pytest.approx(0.059)


def test_an_end_of_backward_with_nothing_pending_says_so():
    coll = [issued("layers.0", "fwd", "allgather", 64, op="_c10d_functional::all_gather_into_tensor"),
            waited("layers.0", "fwd", "_c10d_functional::wait_tensor", 1e-4), waited(ROOT, "bwd", FINALIZE_OP, 4e-5)]
    text = one(rec_of(coll, profile_steps=1), ROOT)["comm_waits_bwd"]
    assert text == ("end-of-backward callbacks in (root)'s backward: 40 us; no c10d all-reduce or reduce-scatter was "
                    "pending (none issued since the previous end of backward)")
