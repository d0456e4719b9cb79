"""The transposed-copy op class: which copies it takes (by the source's innermost stride), its calibration case,
and that its fitted efficiency reaches a traced model's copy and nothing else."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn

from perfcheck.calibrate.op_classes import ELEMENTWISE, TRANSPOSED, transposed_copy_case
from perfcheck.hardware.systems import load_system
from perfcheck.predict import trace as tracing
from perfcheck.predict.module_estimator import _op_table, estimate


class TokenMix(nn.Module):
    """An MLP-Mixer-style token mixing: a Linear over the sequence axis of a transposed view, and a permute that keeps
    the last axis (a head split) made contiguous."""

    def __init__(self, tokens, channels):
        super().__init__()
        self.mix, self.channel = nn.Linear(tokens, tokens), nn.Linear(channels, channels)

    def forward(self, x):
        b, t, c = x.shape
        heads = x.reshape(b, t, 4, c // 4).permute(0, 2, 1, 3).contiguous()
        return self.mix(x.transpose(1, 2)).sum() + self.channel(x).sum() + heads.sum()


def test_the_class_follows_the_source_innermost_stride():
    ops = _op_table(tracing.trace_model(TokenMix(16, 32), (torch.randn(2, 16, 32),)), False)
    copies = ops[ops["name"] == "clone"]
    # the head permute keeps the last axis in place; the Linear's reshape of x.transpose(1, 2) copies with a stride
    assert list(copies["op_class"]) == ["clone", "copy_transposed"]
    assert copies["bytes_fwd"].tolist() == [2 * 2 * 16 * 32 * 4] * 2  # read + write, fp32, by hand


def test_case_is_one_contiguous_copy_of_a_transposed_matrix():
    case = transposed_copy_case(torch.device("cpu"))
    assert case.label == "copy_transposed" and case.bytes == 2 * ELEMENTWISE * 4
    rows, cols = TRANSPOSED
    x = case.fn()
    assert x.shape == (cols, rows) and x.is_contiguous()


def test_its_efficiency_prices_the_strided_copy_only():
    base = load_system("cpu")
    spec = dataclasses.replace(base, op_efficiency={**dict(base.op_efficiency), "copy_transposed": 0.25})
    m, x = TokenMix(64, 256), torch.randn(4, 64, 256)
    plain = estimate(m, (x,), system=base).set_index("module")
    slow = estimate(m, (x,), system=spec).set_index("module")
    # the strided copy is F.linear's reshape of the transposed input, inside ``mix``; ``channel`` has none
    assert slow.loc["mix", "pred_fwd_s"] > plain.loc["mix", "pred_fwd_s"]
    assert slow.loc["channel", "pred_fwd_s"] == pytest.approx(plain.loc["channel", "pred_fwd_s"])
