"""DeepSpeed's own host cost per ZeRO stage (issue 12): the host terms by hand, the calibration case's
fit on planted coefficients, the per-rank CPU-time columns, and the stage-3 answer naming the predicted
hook and gather costs. The real one-rank engine benchmark runs under the ``deepspeed`` marker."""
import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from perfcheck.errors import UserError
from perfcheck.calibrate import deepspeed_cases as dc
from perfcheck.hardware.systems import HOST_KEYS, host_constants, host_source, load_system
from perfcheck.predict import host

US = 1e-6


def _spec(**values):
    base = load_system("cpu")
    return dataclasses.replace(base, host={**{k: 0.0 for k in host_constants(base)}, **values})


def test_every_calibrated_key_is_a_host_key_with_a_default_and_a_source():
    assert set(dc.KEYS) <= set(HOST_KEYS)
    cpu, gpu = load_system("cpu"), load_system("h100-sxm")
    for key in dc.KEYS:
        assert host_constants(cpu)[key] >= 0 and host_constants(gpu)[key] >= 0
        assert "deepspeed_cases" in host_source(cpu, key)  # the family's source, not the generic host one
        assert "not measured on a GPU" in host_source(gpu, key)


def test_deepspeed_host_terms_by_hand():
    spec = _spec(zero3_fwd_s=100 * US, zero3_fwd_tensor_s=10 * US, zero3_fwd_module_s=500 * US,
                 zero3_fwd_gather_s=200 * US, zero3_bwd_s=1000 * US, zero3_bwd_tensor_s=20 * US,
                 zero3_bwd_module_s=300 * US, zero3_bwd_gather_s=100 * US, zero3_step_s=2000 * US,
                 zero3_step_tensor_s=50 * US, zero3_step_gather_s=7 * US,
                 zero0_fwd_s=150 * US, zero0_bwd_s=900 * US, zero0_bwd_tensor_s=30 * US, zero0_step_s=1200 * US,
                 zero0_step_tensor_s=140 * US, zero0_fwd_tensor_s=1 * US)
    # stage 3, 8 module calls, 10 tensors, 4 of them partitioned (6 persistent):
    #   fwd  100 + 6 x 10 + 8 x 500 + 4 x 200 = 4960 us
    #   bwd 1000 + 6 x 20 + 8 x 300 + 4 x 100 = 3920 us
    #   step 2000 + 6 x 50 + 4 x 7            = 2328 us
    t = host.deepspeed_host_s(stage=3, module_calls=8, param_tensors=10, spec=spec, partitioned_tensors=4)
    assert t == {"fwd": pytest.approx(4960 * US), "bwd": pytest.approx(3920 * US), "optim": pytest.approx(2328 * US)}
    # stage 0: no module hooks, nothing partitioned even when asked: fwd 150 + 10 x 1 = 160, bwd 900 + 300 = 1200,
    # step 1200 + 1400 = 2600 us
    t0 = host.deepspeed_host_s(stage=0, module_calls=8, param_tensors=10, spec=spec, partitioned_tensors=4)
    assert t0 == {"fwd": pytest.approx(160 * US), "bwd": pytest.approx(1200 * US), "optim": pytest.approx(2600 * US)}
    with pytest.raises(UserError, match="partitioned_tensors"):
        host.deepspeed_host_s(stage=3, module_calls=8, param_tensors=10, spec=spec, partitioned_tensors=11)
    for bad in ({"stage": 4}, {"stage": True}, {"module_calls": -1}, {"param_tensors": 1.5}):
        kw = {"stage": 1, "module_calls": 1, "param_tensors": 1, **bad}
        with pytest.raises(UserError, match=next(iter(bad))):
            host.deepspeed_host_s(spec=spec, **kw)


def _planted_table(coef, noise=0.0, seed=0):
    """The benchmark's table for planted per-stage coefficients: (fixed, per module call, per tensor) per
    (config, phase); the plain torch run costs 100 us + 10 us per call + 5 us per tensor in every phase."""
    rng = np.random.default_rng(seed)
    rows = []
    for label, n, bias in dc.MODELS:
        calls, tensors = n + 1, n * (2 if bias else 1)
        torch_t = {ph: 100 * US + 10 * US * calls + 5 * US * tensors for ph in dc.PHASES}
        rows.append({"model": label, "config": "torch", "calls": calls, "tensors": tensors,
                     **{f"{ph}_s": torch_t[ph] for ph in dc.PHASES}, "steps": 12})
        for cfg in dc.CONFIGS:
            vals = {}
            for ph in dc.PHASES:
                a, b, c = coef[(cfg, ph)]
                extra = a + b * calls + c * tensors
                vals[f"{ph}_s"] = (extra if ph == "step" else torch_t[ph] + extra) * (1 + noise * rng.standard_normal())
            rows.append({"model": label, "config": cfg, "calls": calls, "tensors": tensors, **vals, "steps": 12})
    return pd.DataFrame(rows, columns=list(dc.COLUMNS))


def test_fit_recovers_planted_coefficients():
    """Planted: stages 0-2 a + c * tensors per phase; stage 3 a + b * calls + c * persistent tensors, and
    its partitioned run the same a, b with g per partitioned tensor instead of c."""
    coef = {}
    for i, cfg in enumerate(("0", "1", "2", "3")):
        for j, ph in enumerate(dc.PHASES):
            module = (400 + 100 * j) * US if cfg == "3" and ph != "step" else 0.0
            coef[(cfg, ph)] = ((200 + 300 * i + 50 * j) * US, module, (20 + 10 * i + j) * US)
    gather = dict(zip(dc.PHASES, (150 * US, 120 * US, 70 * US)))
    for ph in dc.PHASES:
        a, b, _ = coef[("3", ph)]
        coef[("3g", ph)] = (a, b, gather[ph])
    fitted = dc.fit(_planted_table(coef))
    assert set(fitted) == set(dc.KEYS)
    for s in dc.STAGES:
        for ph in dc.PHASES:
            a, b, c = coef[(str(s), ph)]
            assert fitted[f"zero{s}_{ph}_s"][0] == pytest.approx(a, rel=1e-6)
            assert fitted[f"zero{s}_{ph}_tensor_s"][0] == pytest.approx(c, rel=1e-6)
    assert fitted["zero3_fwd_module_s"][0] == pytest.approx(400 * US, rel=1e-6)
    assert fitted["zero3_bwd_module_s"][0] == pytest.approx(500 * US, rel=1e-6)
    for ph in dc.PHASES:
        assert fitted[f"zero3_{ph}_gather_s"][0] == pytest.approx(gather[ph], rel=1e-6)
    assert "per module call" in fitted["zero3_fwd_module_s"][1]
    assert "per partitioned parameter tensor" in fitted["zero3_fwd_gather_s"][1]


def test_fit_clips_a_negative_slope_to_zero_and_apply_makes_a_valid_spec():
    coef = {(cfg, ph): (300 * US, 0.0, 10 * US) for cfg in dc.CONFIGS for ph in dc.PHASES}
    coef[("1", "fwd")] = (300 * US, 0.0, -2 * US)  # noise can give a slightly negative slope: a cost is >= 0
    table = _planted_table(coef)
    fitted = dc.fit(table)
    assert fitted["zero1_fwd_tensor_s"][0] == 0.0
    spec = dc.apply(load_system("cpu"), {"table": table, "deepspeed": "0.19.8", "clock": "process_time"}, "stamp")
    again = load_system(spec.to_dict() if hasattr(spec, "to_dict") else spec)
    assert host_constants(again)["zero2_bwd_tensor_s"] == pytest.approx(10 * US)
    assert "DeepSpeed 0.19.8, one rank, process_time" in spec.sources["host.zero3_fwd_module_s"]
    rows = dc.rows_for_table({"table": table})
    assert len(rows) == 3 * len(table) and set(rows["kind"]) == {"deepspeed"}


def test_old_engine_steps_files_read_with_nan_cpu_columns(tmp_path):
    import perfcheck.rundir.deepspeed_files as run_files

    old = pd.DataFrame([{"rank": 0, "step": 0, "micro_step": 0, "role": "measured", "comms_logged": False,
                         "boundary": True, "fwd_s": 0.002, "bwd_s": 0.004, "step_s": 0.003, "total_s": 0.009}])
    old.to_csv(tmp_path / run_files.ENGINE_STEPS_CSV, index=False)
    frame = run_files.read_engine_steps(tmp_path)
    assert math.isnan(frame["fwd_cpu_s"].iloc[0]) and frame["total_s"].iloc[0] == 0.009
    (tmp_path / run_files.ENGINE_STEPS_CSV).write_text("rank,step\n0,0\n")
    with pytest.raises(UserError, match="missing column"):
        run_files.read_engine_steps(tmp_path)


def test_measured_cpu_time_is_the_median_over_quiet_steps():
    from perfcheck.analysis.stages import measured_times

    rows = [{"rank": 0, "step": i, "micro_step": 0, "role": "measured", "comms_logged": i == 0, "boundary": True,
             "fwd_s": 0.01, "bwd_s": 0.02, "step_s": 0.01, "total_s": 0.04, "fwd_cpu_s": 0.001 * (i + 1),
             "bwd_cpu_s": 0.002, "step_cpu_s": 0.003, "total_cpu_s": 0.005 + 0.001 * (i + 1)} for i in range(4)]
    t = measured_times(pd.DataFrame(rows), {})
    # the comms-logged step 0 is left out: fwd CPU of steps 1-3 = 2, 3, 4 ms -> median 3 ms
    assert t["meas_fwd_cpu_s"] == pytest.approx(0.003) and t["meas_step_cpu_s"] == pytest.approx(0.008)


def test_host_terms_count_gathered_tensors_from_the_recorded_configs():
    """The recorded sweep's LeNet (10 tensors <= 1e5 elements): all persistent at stage 3, none with the
    gather config (persistence threshold 0); hooks = G x calls x (fwd + bwd per-module constants)."""
    from pathlib import Path

    from perfcheck.analysis import stage_prediction, stages

    data = Path(__file__).resolve().parents[1] / "data" / "deepspeed_sweep"
    spec = _spec(zero3_fwd_module_s=600 * US, zero3_bwd_module_s=300 * US, zero3_fwd_gather_s=200 * US,
                 zero3_bwd_gather_s=100 * US, zero3_step_gather_s=0.0)
    for run, gathered in (("stage3", 0), ("stage3-gather", 10)):
        st = stages.load_stage(data / run)
        facts = next(iter(st["ranks"].values()))["facts"]
        parts = stage_prediction.zero3_parts(facts, st["predicted"], spec)
        assert parts["gathered_tensors"] == gathered and parts["module_calls"] == 8
        # 8 calls x (600 + 300) us = 7.2 ms; gathers 10 x (200 + 100) us = 3 ms
        assert parts["hooks_s"] == pytest.approx(8 * 900 * US)
        assert parts["gather_host_s"] == pytest.approx(gathered * 300 * US)
        terms = stage_prediction.host_terms(facts, st["predicted"], spec)
        assert terms["fwd"] == pytest.approx(8 * 600 * US + gathered * 200 * US)


def test_stage3_answer_names_predicted_hooks_and_gathers():
    from perfcheck.analysis import answers as A

    r0 = pd.Series({"meas_fwd_compute_s": 2e-3, "meas_bwd_compute_s": 4e-3, "pred_fwd_s": 2e-3, "pred_fwd_comm_s": 0.0,
                    "pred_bwd_s": 5e-3, "pred_bwd_comm_s": 1e-3})
    r = pd.Series({"pred_zero3_hooks_s": 7.2e-3, "pred_zero3_gather_host_s": 3e-3, "zero3_module_calls": 8,
                   "zero3_gathered_tensors": 10, "meas_fwd_compute_s": 8e-3, "meas_bwd_compute_s": 9e-3,
                   "pred_fwd_s": 9e-3, "pred_fwd_comm_s": 1e-3, "pred_bwd_s": 12e-3, "pred_bwd_comm_s": 2e-3,
                   "meas_allgather_count": 10.0, "pred_allgather_count": 10.0, "pred_allgather_s": 6e-3,
                   "meas_fwd_comm_s": 1e-3, "meas_bwd_comm_s": 2e-3, "meas_optim_comm_s": 0.5e-3})
    text = A._hooks_and_gathers(r, r0)
    assert "Predicted ZeRO-3 hooks 7.2 ms per step (8 module calls" in text
    assert "3 ms of host work fetching and releasing 10 partitioned tensors" in text
    # measured (8 + 9) - (2 + 4) = 11 ms; predicted (9 - 1 + 12 - 2) - (2 - 0 + 5 - 1) = 12 ms
    assert "measured 11 ms, predicted 12 ms" in text and "CPU time" not in text  # no CPU columns: not said
    r0 = pd.concat([r0, pd.Series({"meas_fwd_cpu_s": 2e-3, "meas_bwd_cpu_s": 3e-3})])
    r = pd.concat([r, pd.Series({"meas_fwd_cpu_s": 6e-3, "meas_bwd_cpu_s": 8.5e-3})])
    assert "(in process CPU time 9.5 ms)" in A._hooks_and_gathers(r, r0)  # (6 + 8.5) - (2 + 3)
    assert "predicted 6 ms; measured exposed communication in forward, backward and step 3.5 ms" in text


@pytest.mark.deepspeed
@pytest.mark.slow
def test_real_engine_case_measures_zero3_hooks_per_module_call():
    """The child process on this machine (quick mode, one rank): every run measured, and the fit sees what
    DeepSpeed's source says must be there: ZeRO-3 hooks every module (stage 3's forward costs more per
    module call than nothing, and more than stage 0's whole forward extra on the 9-call chain), ZeRO-1/2
    add gradient bookkeeping to backward that stage 0 has not."""
    pytest.importorskip("deepspeed")
    result = dc.bench_deepspeed("quick", threads=1, timeout_s=280)
    table = result["table"]
    assert len(table) == len(dc.MODELS) * (len(dc.CONFIGS) + 1)
    assert (table[["fwd_s", "bwd_s", "step_s"]] > 0).all().all()
    fit = {k: v for k, (v, _) in dc.fit(table).items()}
    chain = table.set_index(["config", "model"])
    stage0_fwd_extra = chain.loc[("0", "chain8"), "fwd_s"] - chain.loc[("torch", "chain8"), "fwd_s"]
    assert fit["zero3_fwd_module_s"] > 0 and 9 * fit["zero3_fwd_module_s"] > stage0_fwd_extra
    assert chain.loc[("2", "chain8"), "bwd_s"] > chain.loc[("0", "chain8"), "bwd_s"]


def test_overhead_pairs_in_the_block_and_bare_steps_preferred():
    from perfcheck.analysis.stages import measured_times
    from perfcheck.integrations.deepspeed.config import parse_block

    b = parse_block({"perfcheck": {"warmup_steps": 1, "steps": 4, "overhead_pairs": 3, "profiler": False}})
    assert b.overhead_pairs == 3 and b.total_steps == 1 + 4 + 3
    assert parse_block({"perfcheck": {"warmup_steps": 1, "steps": 2, "overhead_pairs": 12,
                                      "profiler": False}}).total_steps == 1 + 2 + 2  # a bare step per measured one
    assert parse_block({"perfcheck": {"steps": 4, "overhead_pairs": 3, "modules": False,
                                      "profiler": False}}).total_steps == 2 + 4  # no hooks, no bare steps
    with pytest.raises(UserError, match="overhead_pairs"):
        parse_block({"perfcheck": {"overhead_pairs": -1}})
    rows = [{"rank": 0, "step": i, "micro_step": 0, "role": role, "comms_logged": False, "boundary": True,
             "fwd_s": f, "bwd_s": 0.01, "step_s": 0.01, "total_s": f + 0.02}
            for i, (role, f) in enumerate([("measured", 0.009), ("bare", 0.004), ("measured", 0.009), ("bare", 0.006),
                                           ("measured", 0.009), ("bare", 0.005)])]
    t = measured_times(pd.DataFrame(rows), {})
    # bare steps' forwards 4, 6, 5 ms -> 5 ms (the instrumented 9 ms ones are left out)
    assert t["meas_fwd_s"] == pytest.approx(0.005) and t["meas_steps_role"] == "bare"
    t = measured_times(pd.DataFrame([r for r in rows if r["role"] == "measured"]), {})
    assert t["meas_fwd_s"] == pytest.approx(0.009) and t["meas_steps_role"] == "measured"


def test_waiting_answer_from_elapsed_and_cpu_time():
    from perfcheck.analysis import answers as A

    s = pd.DataFrame({"meas_step_s": [0.024, 0.18], "meas_step_cpu_s": [0.012, 0.036], "pred_step_s": [0.012, 0.033],
                      "pred_fwd_comm_s": 0.0, "pred_bwd_comm_s": [0.001, 0.002], "pred_optim_comm_s": [0.001, 0.01]},
                     index=[0, 3])
    text = A._waiting(s)
    # 1 - 12/24 = 50 %, 1 - 36/180 = 80 %: more than half waiting -> the shared-machine sentence
    assert "stage 0 24 ms elapsed, 12 ms CPU (50% waiting; predicted 12 ms, of it collectives 2 ms)" in text
    assert "stage 3 180 ms elapsed, 36 ms CPU (80% waiting" in text and "shared with other jobs" in text
    assert A._waiting(s.drop(columns="meas_step_cpu_s")) == ""
