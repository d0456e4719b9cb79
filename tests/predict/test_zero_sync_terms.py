"""Issue 12: how ZeRO's ranks meet at collectives, priced by hand.

- async batches (``collectives.batch_time_s``): ZeRO-3's post-step gather of its persistent tensors is issued
  with async_op=True and waited together (DeepSpeed 0.19.8 ``Init._allgather_params_coalesced``);
- the wait for the latest rank at every blocking collective (``collectives.straggler_wait_s``);
- the DeepSpeed case at N ranks (``deepspeed_cases.apply`` divides the N-process slowdown out, the sweep
  re-measures one-rank terms), and the stage-3 answer naming the new terms.
"""
import dataclasses
import math
from pathlib import Path

import pytest

from perfcheck.errors import UserError
from perfcheck.calibrate import collectives as calib
from perfcheck.calibrate import deepspeed_cases
from perfcheck.hardware.systems import host_constants, load_system
from perfcheck.predict import collectives, zero

MS, US = 1e-3, 1e-6
#: LeNet's parameter tensors per module (conv1, conv2, fc1, fc2, fc3): 62,006 elements, all <= 1e5 (persistent)
LENET = zero.layout([[450, 6], [2400, 16], [48000, 120], [10080, 84], [840, 10]])
GATHER = zero.ZeroSettings(param_persistence_threshold=0, max_reuse_distance=0, prefetch_bucket_size=0)


def _spec(**host):
    """The cpu spec with a 1 GB/s link (efficiency 1) and the given host constants (others at 0)."""
    base = load_system("cpu")
    return dataclasses.replace(base, intra_node_bandwidth_bytes_per_s=1e9,
                               efficiency={**dict(base.efficiency), "intra_node": 1.0},
                               host={**{k: 0.0 for k in host_constants(base)}, "collective_straggler_ranks": 2.0,
                                     **host})


def test_batch_time_by_hand():
    spec = _spec(collective_latency_s=1 * MS, collective_async_call_s=0.5 * MS)
    # 10 all-gathers of S = 1e6 B at 2 ranks, waited together: 1 ms + 9 x 0.5 ms + 10 x 1e6 x 1/2 / 1e9 s
    # = 1 + 4.5 + 5 = 10.5 ms; one at a time: 10 x (1 + 0.5) = 15 ms
    assert collectives.batch_time_s("allgather", 1e6, 10, 2, spec) == pytest.approx(10.5 * MS)
    assert 10 * collectives.collective_time_s("allgather", 1e6, 2, spec) == pytest.approx(15 * MS)
    # a batch of one is the blocking call; no calls, no bytes or one rank cost nothing
    assert collectives.batch_time_s("allgather", 1e6, 1, 2, spec) == pytest.approx(1.5 * MS)
    assert collectives.batch_time_s("allgather", 1e6, 0, 2, spec) == 0.0
    assert collectives.batch_time_s("allgather", 0, 10, 2, spec) == 0.0
    assert collectives.batch_time_s("allgather", 1e6, 10, 1, spec) == 0.0
    with pytest.raises(UserError, match="calls"):
        collectives.batch_time_s("allgather", 1e6, -1, 2, spec)


def test_stage3_post_step_gathers_are_one_batch():
    """LeNet at stage 3, 2 ranks, fp32: its 10 persistent tensors are gathered after the step in one batch;
    padded to even sizes they sum to 62,006 elements (all even) = 248,024 B. With alpha 1 ms, 0.5 ms per
    queued call and 1 GB/s: 1 + 9 x 0.5 + 248024 x 1/2 / 1e9 s = 5.5 ms + 0.124012 ms = 5.624012 ms, where one
    alpha each would be 10 ms + 0.124 ms. The 8-byte grad-norm all-reduce adds 1 ms + 8 x 1 / 1e9 s."""
    spec = _spec(collective_latency_s=1 * MS, collective_async_call_s=0.5 * MS)
    e = zero.estimate_zero(layout=LENET, stage=3, dp=2, dtype="fp32", system=spec)
    step_gathers = [c for c in e.collectives if c.phase == "step" and c.kind == "allgather" and c.count > 0]
    assert len(step_gathers) == 1 and step_gathers[0].count == 10 and step_gathers[0].batch == 10
    assert e.times["optim_comm_s"] == pytest.approx(5.5 * MS + 248024 / 2 / 1e9 + 1 * MS + 8 / 1e9)
    # every tensor gathered, no prefetch (the 3-gather config): 5 module fetches in forward, each waited at once
    g = zero.estimate_zero(layout=LENET, stage=3, dp=2, dtype="fp32", system=spec, settings=GATHER)
    fwd = [c for c in g.collectives if c.phase == "fwd" and c.kind == "allgather" and c.count > 0][0]
    assert fwd.count == 5 and fwd.batch == 1
    assert g.times["fwd_comm_s"] == pytest.approx(5 * 1 * MS + 248024 / 2 / 1e9)
    # with prefetch (bucket 1e5 elements > 62,006): one fetch call in flight behind the forward, one batch
    pre = zero.estimate_zero(layout=LENET, stage=3, dp=2, dtype="fp32", system=spec, settings=dataclasses.replace(
        GATHER, prefetch_bucket_size=1e5))
    fwd = [c for c in pre.collectives if c.phase == "fwd" and c.kind == "allgather" and c.count > 0][0]
    assert fwd.count == 1 and fwd.batch == 1


def test_expected_max_normal_against_tippett():
    # Tippett (1925) / standard tables: E[max of n standard normals] for n = 2, 3, 4, 5, 10
    for n, value in ((1, 0.0), (2, 1 / math.sqrt(math.pi)), (3, 0.846284), (4, 1.029375), (5, 1.162964),
                     (10, 1.538753)):
        assert collectives.expected_max_normal(n) == pytest.approx(value, abs=1e-6)
    for bad in (0, 1.5, True):
        with pytest.raises(UserError, match="ranks"):
            collectives.expected_max_normal(bad)


def test_straggler_wait_by_hand():
    spec = _spec(collective_straggler_s=0.4 * MS)  # measured at 2 ranks
    # 3 blocking collectives at the measured 2 ranks: 3 x 0.4 = 1.2 ms
    assert collectives.straggler_wait_s(3, 2, spec) == pytest.approx(1.2 * MS)
    # at 4 ranks: x e_4 / e_2 = 1.029375 / 0.564190 = 1.824518 -> 2.189422 ms; one rank waits for nobody
    assert collectives.straggler_wait_s(3, 4, spec) == pytest.approx(1.2 * MS * 1.029375 / 0.5641896, rel=1e-6)
    assert collectives.straggler_wait_s(3, 1, spec) == 0.0
    assert collectives.straggler_wait_s(3, 2, _spec()) == 0.0  # nothing measured: no wait
    with pytest.raises(UserError, match="syncs"):
        collectives.straggler_wait_s(-1, 2, spec)
    with pytest.raises(UserError, match="collective_straggler_ranks"):
        collectives.straggler_wait_s(1, 2, _spec(collective_straggler_s=0.4 * MS, collective_straggler_ranks=1.0))


def test_sync_points_and_waits_per_phase():
    """Blocking waits per step, LeNet fp32 at 2 ranks (DeepSpeed 0.19.8, comms-logger checked): stage 0 one
    gradient all-reduce (bwd) + clip_grad_norm_'s scalar (step); stage 1 the all-reduce (bwd) + the parameter
    all-gather and the grad-norm scalar (step); stage 3 the reduce-scatter (bwd) + the post-step batch and the
    scalar (step); 3-gather 5 fetches (fwd), 5 re-fetches + the reduce-scatter (bwd), the scalar (step)."""
    spec = _spec(collective_straggler_s=0.4 * MS)
    cases = {(0, None): (0, 1, 1), (1, None): (0, 1, 2), (3, None): (0, 1, 2), (3, GATHER): (5, 6, 1)}
    for (stage, settings), (f, b, s) in cases.items():
        e = zero.estimate_zero(layout=LENET, stage=stage, dp=2, dtype="fp32", system=spec, settings=settings)
        assert (e.times["fwd_syncs"], e.times["bwd_syncs"], e.times["optim_syncs"]) == (f, b, s), (stage, settings)
        assert e.times["bwd_wait_s"] == pytest.approx(b * 0.4 * MS)
        assert e.times["step_s"] == pytest.approx(e.times["fwd_s"] + e.times["bwd_s"] + e.times["optim_s"])
    one = zero.estimate_zero(layout=LENET, stage=0, dp=1, dtype="fp32", system=spec)
    assert one.times["bwd_wait_s"] == 0.0 and one.times["bwd_syncs"] == 0.0


def test_sync_terms_and_apply_by_hand():
    # batch of 10 in 8 ms vs one in 0.5 ms (medians of 8, 7, 9 and 0.4, 0.5, 0.6): (8 - 0.5) / 9 = 0.8333 ms;
    # waits 0.1, 0.2, 0.9 ms: mean 0.4 ms (the mean, not the median 0.2: a rare long wait is a real cost)
    r = calib.sync_terms([0.4 * MS, 0.5 * MS, 0.6 * MS], [8 * MS, 7 * MS, 9 * MS], [0.1 * MS, 0.2 * MS, 0.9 * MS], 2)
    assert r["async_call_s"] == pytest.approx(7.5 * MS / 9) and r["straggler_s"] == pytest.approx(0.4 * MS)
    assert calib.sync_terms([MS], [0.5 * MS], [0.0], 2)["async_call_s"] == 0.0  # a faster batch is noise: 0
    out = calib.apply_sync_terms(load_system("cpu"), r, "stamp")
    hc = host_constants(out)
    assert hc["collective_async_call_s"] == pytest.approx(7.5 * MS / 9) and hc["collective_straggler_ranks"] == 2
    assert "2 gloo ranks" in out.sources["host.collective_straggler_s"]
    from perfcheck.calibrate import sweep_terms as sweep

    assert "collective sync" not in sweep.missing_terms(out)
    assert "collective sync" in sweep.missing_terms(load_system("cpu"))
    with pytest.raises(UserError, match="world_size"):
        calib.bench_sync_terms(1)


def test_deepspeed_terms_at_n_ranks_count_the_slowdown_once(monkeypatch):
    """A DeepSpeed case run at 2 ranks on one host measures each constant 1 + 0.25 = 1.25x slower than one
    process would (process_slowdown_per_peer 0.25): apply divides it out (1 ms -> 0.8 ms), the stage model
    multiplies it back, and the source names the rank count that the sweep checks."""
    from perfcheck.calibrate import sweep_terms as sweep

    monkeypatch.setattr(deepspeed_cases, "fit", lambda table: {"zero0_fwd_s": (1 * MS, "fixed part")})
    base = dataclasses.replace(load_system("cpu"), host={**dict(load_system("cpu").host),
                                                         "process_slowdown_per_peer": 0.25})
    two = deepspeed_cases.apply(base, {"table": None, "deepspeed": "0.19.8", "clock": "process_time",
                                       "world_size": 2}, "stamp")
    assert host_constants(two)["zero0_fwd_s"] == pytest.approx(0.8 * MS)
    assert deepspeed_cases.ranks_measured(two) == 2
    one = deepspeed_cases.apply(base, {"table": None, "deepspeed": "0.19.8", "clock": "process_time"}, "stamp")
    assert host_constants(one)["zero0_fwd_s"] == pytest.approx(1 * MS) and deepspeed_cases.ranks_measured(one) == 1
    # a sweep of 2 ranks per host re-measures one-rank DeepSpeed terms; one of 1 rank keeps them
    assert "deepspeed" in sweep.missing_terms(one, 2) and "deepspeed" not in sweep.missing_terms(two, 2)
    assert "deepspeed" not in sweep.missing_terms(one, 1)
    with pytest.raises(UserError, match="world_size"):
        deepspeed_cases.bench_deepspeed("quick", world_size=0)


def test_stage3_answer_names_the_new_terms():
    """The recorded sweep's stage-3 answer: predicted hooks and gathers beside the measured difference, the
    post-step gathers as one async batch, and the predicted wait for the later rank beside elapsed less CPU."""
    from perfcheck.analysis import stages
    from perfcheck.analysis.answers import answers

    table = stages.reconcile_stages([Path(__file__).resolve().parents[1] / "data" / "deepspeed_sweep"])
    s3 = table[(table["run"] == "stage3") & (table["status"] == "ok")].iloc[0]
    assert s3["pred_optim_syncs"] == 2 and s3["pred_bwd_syncs"] == 1
    assert s3["pred_optim_wait_s"] > 0 and s3["pred_optim_s"] > s3["pred_optim_wait_s"]
    text = " ".join(a for _, a in answers(table))
    assert "Predicted ZeRO-3 hooks" in text and "stage 3 less stage 0: measured" in text
    assert "(10 of them issued with async_op=True and waited together" in text
    assert "Predicted wait for the later rank at its 3 blocking collectives" in text
    gather = table[(table["run"] == "stage3-gather") & (table["status"] == "ok")].iloc[0]
    assert gather["pred_batched_calls"] == 0  # no persistent tensor, no prefetch: every gather waited at once
    assert text.count("waited together") == 1  # said of stage 3 only, not of the 3-gather run


def test_the_case_leaves_the_collectives_time_out():
    """The N-rank DeepSpeed case subtracts the time inside torch.distributed's collectives and inside waits on
    their async handles (``_time_collectives``), checked with a fake module whose calls take planted times on
    a fake clock: a blocking all-reduce of 3 s, an async all-gather issued in 1 s whose wait takes 5 s."""
    import types

    now = {"t": 0.0}

    def clock():
        return now["t"]

    class Work:
        def wait(self):
            now["t"] += 5.0
            return True

        def is_completed(self):
            return "delegated"

    def all_reduce(tensor, async_op=False):
        now["t"] += 3.0

    def all_gather_into_tensor(out, inp, async_op=False):
        now["t"] += 1.0
        return Work() if async_op else None

    fake = types.SimpleNamespace(all_reduce=all_reduce, all_gather_into_tensor=all_gather_into_tensor)
    spent = {"cpu": 0.0}
    deepspeed_cases._time_collectives(fake, spent, clock)
    fake.all_reduce(None)
    handle = fake.all_gather_into_tensor(None, None, async_op=True)
    now["t"] += 2.0  # DeepSpeed's own host work between issuing and waiting: not the collectives'
    assert handle.wait() is True and handle.is_completed() == "delegated"
    assert fake.all_gather_into_tensor(None, None) is None
    # 3 (all-reduce) + 1 (issue) + 5 (wait) + 1 (blocking all-gather) = 10 s of the 12 s elapsed
    assert spent["cpu"] == pytest.approx(10.0) and now["t"] == pytest.approx(12.0)


def test_deepspeed_terms_are_put_at_the_calibrations_reference_level(monkeypatch):
    """The DeepSpeed case reads the calibration's host reference (a tiny add) beside its rounds. Run while the
    shared core was 1.5x slower than during the calibration (the case's reference 3 us, the calibration's 2 us),
    its 1.2 ms is 0.8 ms at the calibration's level: x 2/3 (hand), like every other case of the calibration.
    Without a reference on either side nothing changes."""
    monkeypatch.setattr(deepspeed_cases, "fit", lambda table: {"zero1_fwd_s": (1.2 * MS, "fixed part")})
    base = dataclasses.replace(load_system("cpu"), calibration={"reference_s": 2e-6})
    result = {"table": None, "deepspeed": "0.19.8", "clock": "process_time", "reference_s": 3e-6}
    assert deepspeed_cases.reference_level(base, result) == pytest.approx(2 / 3)
    out = deepspeed_cases.apply(base, result, "stamp")
    assert host_constants(out)["zero1_fwd_s"] == pytest.approx(0.8 * MS)
    assert "x 0.667" in out.sources["host.zero1_fwd_s"]
    for spec, res in ((load_system("cpu"), result), (base, {**result, "reference_s": None})):
        assert deepspeed_cases.reference_level(spec, res) == 1.0
        assert host_constants(deepspeed_cases.apply(spec, res, "stamp"))["zero1_fwd_s"] == pytest.approx(1.2 * MS)
