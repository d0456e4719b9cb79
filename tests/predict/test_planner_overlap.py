"""`perfcheck plan --overlap`: each ZeRO stage's engine priced with its own overlap schedule (Megatron-Core's
overlap_grad_reduce / overlap_param_gather, FSDP2's prefetch), every row equal to ``transformer_step`` of its
layout under that schedule; and the runner-up's explanation naming what it gains as well as what it loses."""
import pandas as pd
import pytest

from perfcheck.errors import UserError
from perfcheck.predict import planner
from perfcheck.predict.transformer import transformer_step

SYSTEM = "a100-80gb-sxm"


@pytest.fixture(scope="module")
def overlapped():
    return planner.plan("gpt2-124m", 8, SYSTEM, 16, dtype="fp16", overlap=True)


def _step(row, **options):
    par = dict(tp=int(row.tp), sp=bool(row.sp), pp=int(row.pp), dp=int(row.dp), zero_stage=int(row.zero_stage),
               micro_batches=int(row.micro_batches))
    return transformer_step("gpt2-124m", batch=int(row.micro_batch), parallel=par, system=SYSTEM, dtype="fp16",
                            flash=True, causal=True, recompute=row.recompute, virtual_stages=int(row.virtual_stages),
                            cp=int(row.cp), **options)


@pytest.mark.parametrize("zero_stage, options", [
    (0, dict(dp_engine="megatron", overlap_grad_reduce=True)),
    (1, dict(dp_engine="megatron", overlap_grad_reduce=True, overlap_param_gather=True)),
    (3, dict(dp_engine="fsdp2")),
])
def test_every_stage_is_priced_by_its_own_engines_schedule(overlapped, zero_stage, options):
    rows = overlapped.ranked[(overlapped.ranked.zero_stage == zero_stage) & (overlapped.ranked.dp > 1)]
    assert len(rows), zero_stage
    for _, row in rows.head(3).iterrows():
        one = _step(row, **options)
        assert one.step_time_s == pytest.approx(row.step_time_s, rel=1e-12)
        assert one.values["dp_comm_time_s"] == pytest.approx(row.dp_comm_time_s, rel=1e-12)
        assert row.dp_schedule == planner.OVERLAP_SCHEDULES[zero_stage][0]


def test_fsdp_rows_gather_the_parameters_and_reduce_nothing_whole(overlapped):
    """FSDP2 all-gathers the weights before forward and backward and reduce-scatters the gradients:
    no all-reduce (what the fixed-fraction rows' FSDP formula also says, by another engine's code)."""
    fsdp = overlapped.ranked[(overlapped.ranked.zero_stage == 3) & (overlapped.ranked.dp > 1)]
    assert (fsdp.dp_allreduce_bytes == 0).all() and (fsdp.dp_allgather_bytes > 0).all()


def test_without_overlap_the_search_is_the_exposed_one_and_says_so():
    p = planner.plan("gpt2-124m", 8, SYSTEM, 16, dtype="fp16")
    row = p.ranked.iloc[0]
    assert row.dp_schedule.endswith(", exposed")
    assert _step(row, dp_engine="megatron").step_time_s == pytest.approx(row.step_time_s, rel=1e-12)


def test_a_fixed_fraction_and_the_schedules_together_are_refused():
    with pytest.raises(UserError, match="^dp_overlap: ") as info:
        planner.plan("gpt2-124m", 8, SYSTEM, 16, dp_overlap=0.5, overlap=True)
    assert "\n" not in str(info.value)


def test_what_offsets_lists_the_terms_that_shrank():
    best = pd.Series({k: 1.0 for k in planner.steps.BREAKDOWN})
    other = best.copy()
    other["bubble_time_s"], other["compute_time_s"], other["tp_comm_time_s"] = 1.5, 0.7, 0.9
    assert planner.what_offsets(best, other) == [("compute_time_s", pytest.approx(0.3)),
                                                 ("tp_comm_time_s", pytest.approx(0.1))]


def test_plan_cli_overlap(capsys):
    from perfcheck.commands.cli import main

    argv = ["plan", "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "16", "--system", SYSTEM]
    assert main(argv + ["--overlap"]) == 0
    out, _ = capsys.readouterr()
    assert "DP collectives: " in out and "overlap_grad_reduce" in out
    assert main(argv + ["--overlap", "--dp-overlap", "0.5"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "--dp-overlap" in err


def test_a_zero_stage_without_a_schedule_is_an_error_not_a_dropped_row():
    layouts = pd.DataFrame({"tp": [1], "sp": [False], "pp": [1], "virtual_stages": [1], "dp": [8], "cp": [1],
                            "zero_stage": [2], "micro_batch": [1], "micro_batches": [2]})
    with pytest.raises(NotImplementedError, match="zero_stage"):
        planner._sweep("gpt2-124m", layouts, dict(system=SYSTEM, dtype="fp16"), 0.0, True)
