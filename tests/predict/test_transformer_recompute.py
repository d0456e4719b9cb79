"""Activation-checkpoint recompute: the transformer front-end and the module estimator agree on the
same layer (issue #13), and the reconciled table joins predicted against measured recompute with its
own gap and finding.

The torch half is ``MegatronBlock`` (tests/predict/test_transformer.py: a GPT pre-norm layer with explicit
attention) run under ``torch.utils.checkpoint``; the analytical half is a one-layer model file with
the same sizes. Full recompute re-runs the whole layer's forward, selective recompute re-runs the
attention core (Korthikanti et al. 2022, section 5): the FLOPs re-run must be equal, op for op.
"""
import functools
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from perfcheck.analysis.findings import REASONS, findings_table
from perfcheck.analysis.columns import RECONCILED_COLUMNS
from perfcheck.analysis.reconcile import reconcile
from perfcheck.predict.module_estimator import estimate
from perfcheck.predict.transformer import transformer_step
from perfcheck.schema import ROOT
from test_transformer import MegatronBlock

E, H, F_, B, S = 64, 4, 256, 2, 16
SPEC = dict(name="tiny", layers=1, hidden=E, heads=H, ffn_hidden=F_, vocab=100, seq_len=S, norm="layernorm",
            activation="gelu", bias=True, tied_embeddings=True, dropout=0.1)


class FullCheckpoint(nn.Module):
    """``reentrant``: Megatron's checkpoint (its CheckpointFunction, like torch's reentrant one) re-runs
    the whole region, which the transformer front-end models; torch's non-reentrant checkpoint stops
    once the last tensor the region saved is rebuilt (early stop, on by default)."""

    def __init__(self, reentrant=True):
        super().__init__()
        self.block, self.reentrant = MegatronBlock(E, H, F_), reentrant

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=self.reentrant)


class CoreCheckpoint(MegatronBlock):
    """Selective recompute: only softmax(q k^T / sqrt(d)) -> dropout -> @ v is checkpointed."""

    def __init__(self, reentrant=True):
        super().__init__(E, H, F_)
        self.reentrant = reentrant

    def forward(self, x):
        b, s, e = x.shape
        q, k, v = self.qkv_proj(self.ln_1(x)).split(e, dim=2)
        q, k, v = (z.view(b, s, self.h, e // self.h).transpose(1, 2) for z in (q, k, v))

        def core(q, k, v):
            probs = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(e // self.h), dim=-1)
            return self.dropout_softmax(probs) @ v

        y = checkpoint(core, q, k, v, use_reentrant=self.reentrant).transpose(1, 2).reshape(b, s, e)
        x = x + self.dropout_attn(self.out_proj(y))
        return x + self.dropout_mlp(self.fc2(self.act(self.fc1(self.ln_2(x)))))


def _module_side(model):
    with torch.device("meta"):
        m = model()
    x = torch.empty(B, S, E, device="meta", requires_grad=True)
    return estimate(m, (x,), system="h100-sxm", dtype="fp32").set_index("module").loc[ROOT]


def _recomputed_macs(model):
    """MACs torch re-runs in the backward of ``model`` (real tensors): FlopCounterMode's matrix FLOPs of the
    backward minus those of the same backward with every forward op's result kept (the independent
    reference: what torch does, early stop included)."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    x = torch.randn(B, S, E, requires_grad=True)
    counts = []
    for plain in (False, True):
        m = model()
        if plain:
            m.forward = MegatronBlock.forward.__get__(m.block if hasattr(m, "block") else m)
        torch.manual_seed(1)
        y = m(x)
        with FlopCounterMode(display=False) as fc:
            y.sum().backward()
        counts.append(fc.get_total_flops())
    return (counts[0] - counts[1]) // 2


def test_full_recompute_flops_agree_between_the_two_front_ends():
    root = _module_side(FullCheckpoint)
    step = transformer_step(SPEC, batch=B, dtype="fp32", recompute="full")
    # MACs: qkv 2*16*64*192 + out 2*16*64*64 + fc1/fc2 2*(2*16*64*256) + q k^T and p v 2*(2*4*16*16*16)
    #       = 393,216 + 131,072 + 1,048,576 + 65,536 = 1,638,400; every forward op re-run once.
    assert root.macs_recompute == root.macs_fwd == 1_638_400 == _recomputed_macs(FullCheckpoint)
    assert step.recompute_flops_per_gpu == root.flops_recompute == root.flops_fwd
    # and it is what makes the step's hardware FLOPs exceed the no-recompute step's
    plain = transformer_step(SPEC, batch=B, dtype="fp32")
    assert step.hardware_flops_per_gpu - plain.hardware_flops_per_gpu == pytest.approx(root.flops_recompute)


def test_non_reentrant_full_recompute_stops_after_the_last_saved_tensor():
    """torch's non-reentrant checkpoint: the layer's last saving op is dropout_mlp (its mask), so every GEMM
    is re-run but not the final residual add (it saves nothing): b*s*e = 2,048 FLOPs less."""
    model = functools.partial(FullCheckpoint, reentrant=False)
    root = _module_side(model)
    assert root.macs_recompute == 1_638_400 == _recomputed_macs(model)
    assert root.flops_recompute == root.flops_fwd - B * S * E


def test_selective_recompute_is_the_attention_core_in_both_front_ends():
    root = _module_side(CoreCheckpoint)
    step = transformer_step(SPEC, batch=B, dtype="fp32", recompute="selective")
    # q k^T and p v: 2 * (b*h*s*s*d) = 2 * 2*4*16*16*16 = 65,536 MACs; scale 1 + softmax 5 FLOPs per
    # score, dropout 2: b*h*s*s = 2,048 scores -> 2*65,536 + 8*2,048 = 147,456 FLOPs.
    assert root.macs_recompute == 65_536 == _recomputed_macs(CoreCheckpoint)
    assert step.recompute_flops_per_gpu == root.flops_recompute == 2 * 65_536 + 8 * 2_048
    # torch's non-reentrant checkpoint does not re-run p v: its operands are the last tensors the region
    # saves, saved before it runs, and early stop ends the re-run there (q k^T: 32,768 MACs)
    model = functools.partial(CoreCheckpoint, reentrant=False)
    early = _module_side(model)
    assert early.macs_recompute == 32_768 == _recomputed_macs(model)
    assert early.flops_recompute == 2 * 32_768 + 8 * 2_048


# ------------------------------------------------------------------------ reconciled recompute
def _frames(pred_rec, meas_rec):
    """A two-module prediction/measurement pair with the given recompute seconds for ``block``."""
    from perfcheck.schema import PREDICTED_COLUMNS

    pred = pd.DataFrame([{c: 0.0 for c in PREDICTED_COLUMNS} for _ in range(2)])
    pred["module"], pred["type"], pred["depth"], pred["calls"] = [ROOT, "block"], ["Net", "Block"], [0, 1], 1
    pred["pred_fwd_s"], pred["pred_bwd_s"] = 1e-3, 2e-3
    pred["comm_kind"], pred["bound_fwd"], pred["bound_bwd"], pred["source"] = "", "compute", "compute", "modeled"
    pred["pred_recompute_s"], pred["flops_recompute"] = [pred_rec, pred_rec], [1e9 * pred_rec, 1e9 * pred_rec]
    meas = pd.DataFrame({"module": [ROOT, "block"], "calls": 1, "steps": 5, "fwd_s_median": 1e-3,
                         "bwd_s_median": 2e-3, "recompute_s_median": [meas_rec, meas_rec]})
    return pred, meas


@pytest.mark.parametrize("pred_rec, meas_rec, reason, words", [
    (1e-3, 5e-3, "recompute", "slower than modelled"),            # 5x the predicted re-run
    (0.0, 5e-3, "recompute", "none predicted"),                   # the run checkpoints, the estimate did not
    (1e-3, 0.0, "recompute", "none measured"),                    # the estimate checkpoints, the run does not
    (1e-3, 1e-4, "overestimated", "pessimistic"),
    (1e-3, 1.2e-3, "", ""),                                       # within the 2x thresholds
])
def test_reconcile_joins_recompute_with_its_gap_and_finding(pred_rec, meas_rec, reason, words):
    pred, meas = _frames(pred_rec, meas_rec)
    rec = reconcile(pred, meas).set_index("module")
    assert {"pred_recompute_s", "gap_recompute", "reason_recompute", "evidence_recompute"} <= set(RECONCILED_COLUMNS)
    row = rec.loc["block"]
    assert row.pred_recompute_s == pred_rec and row.meas_recompute_s == meas_rec
    expected_gap = np.inf if pred_rec == 0 else meas_rec / pred_rec
    assert row.gap_recompute == pytest.approx(expected_gap)
    assert row.reason_recompute == reason and words in row.evidence_recompute
    # fwd and bwd are on prediction: the module's summary reason is the recompute one
    assert row.reason == reason and row.reason_fwd == row.reason_bwd == ""
    table = findings_table(rec.reset_index())
    hits = table[(table.module == "block") & (table.phase == "recompute")]
    assert len(hits) == (1 if reason else 0)
    assert "recompute" in REASONS


def test_recompute_under_the_hook_floor_with_none_predicted_is_not_a_finding():
    pred, meas = _frames(0.0, 2e-6)  # 2 us: below 2 x the 5 us default hook cost per call
    assert reconcile(pred, meas).set_index("module").loc["block", "reason_recompute"] == ""


def test_a_prediction_without_recompute_columns_still_reconciles():
    pred, meas = _frames(1e-3, 5e-3)
    rec = reconcile(pred.drop(columns=["pred_recompute_s", "flops_recompute"]), meas).set_index("module")
    assert np.isnan(rec.loc["block", "pred_recompute_s"]) and rec.loc["block", "reason_recompute"] == ""
