"""Data-parallel / ZeRO collectives per module in the module estimator (hand-derived bytes)."""
import pytest
import torch
import torch.nn as nn

import perfcheck
from perfcheck.parallel import ParallelConfig
from perfcheck.schema import ROOT


def _model():
    # 512*512+512 = 262,656 params: above ZeRO-3's default persistence threshold (1e5 elements);
    # 84*10+10 = 850: below it, so it stays resident and is never gathered.
    return nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 84), nn.ReLU(), nn.Linear(84, 10))


def _est(stage, dp=4):
    return perfcheck.estimate(_model(), (torch.randn(8, 512),), system="a100-80gb-sxm", dtype="bf16",
                              parallel=ParallelConfig(dp=dp, zero_stage=stage)).set_index("module")


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_stages_0_to_2_reduce_gradients_in_backward(stage):
    est = _est(stage)
    # bf16 gradients, 2 bytes each, every parameter once per step; nothing in forward.
    assert est.loc["0", "comm_bwd_bytes"] == 262_656 * 2
    assert est.loc[ROOT, "comm_bwd_bytes"] == (262_656 + 43_092 + 850) * 2
    assert (est["comm_fwd_bytes"] == 0).all()
    assert est.loc["1", "comm_kind"] == ""  # a ReLU owns no parameters


def test_stage3_gathers_large_modules_in_forward_and_keeps_small_ones_resident():
    est = _est(3)
    assert est.loc["0", "comm_fwd_bytes"] == 262_656 * 2  # all-gather of the full bf16 weights
    assert est.loc["4", "comm_fwd_bytes"] == 0  # 850 params < persistence threshold
    assert "allgather" in est.loc[ROOT, "comm_kind"]
    assert est.loc[ROOT, "pred_fwd_s"] > _est(0).loc[ROOT, "pred_fwd_s"]  # stage 3's forward waits for gathers


def test_single_rank_has_no_collectives_and_tp_needs_the_transformer_front_end():
    est = _est(3, dp=1)
    assert (est[["comm_fwd_bytes", "comm_bwd_bytes"]] == 0).all().all()
    with pytest.raises(NotImplementedError, match="estimate_transformer"):
        perfcheck.estimate(_model(), (torch.randn(8, 512),), system="cpu", parallel=ParallelConfig(tp=2))
