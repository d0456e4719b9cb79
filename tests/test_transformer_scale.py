"""The transformer front-end at scale: one time path with ``perfcheck.estimate``, the pipeline
schedules and collectives of Megatron-style runs (each formula repeated by hand from its paper),
the step breakdown, and the layout planner."""
import json

import pytest
import torch
import torch.nn as nn

from perfcheck.hardware.systems import SystemSpec, load_system
from perfcheck.predict.module_estimator import estimate
from perfcheck.predict.transformer import estimate_transformer
from perfcheck.schema import ROOT

from test_transformer import MegatronBlock


def _curve_spec():
    """a100-80gb-sxm with a flat 0.5 matrix_shape_curve (the issue's reproduction) and a bandwidth curve."""
    d = json.loads((ROOT_SPECS / "a100-80gb-sxm.json").read_text())
    d.update(name="a100-curve", matrix_shape_curve=[[1, 0.5], [100000, 0.5]],
             mem_bandwidth_curve=[[1e5, 2.0], [1e8, 1.0]])
    return SystemSpec.from_dict(d)


from importlib import resources  # noqa: E402

ROOT_SPECS = resources.files("perfcheck.hardware") / "specs"


@pytest.mark.parametrize("system", ["a100-80gb-sxm", "curve"])
def test_two_front_ends_time_every_layer_alike(system):
    """Issue 23's defect: estimate_transformer ignored matrix_shape_curve (3.17 ms where estimate() gave
    6.35 ms for a tp-8 fc1). Now both time through roofline.device_times: every sublayer within 1%."""
    spec = _curve_spec() if system == "curve" else load_system(system)
    e, h, f, b, s = 4096, 32, 16384, 2, 2048
    with torch.device("meta"):
        model = nn.Sequential(MegatronBlock(e, h, f), MegatronBlock(e, h, f))
    x = torch.empty(b, s, e, device="meta", requires_grad=True)
    mod = estimate(model, (x,), system=spec, dtype="fp16").set_index("module")
    m = dict(name="t", layers=2, hidden=e, heads=h, ffn_hidden=f, vocab=1000, seq_len=s, norm="layernorm",
             activation="gelu", bias=True, tied_embeddings=True, dropout=0.1)
    tab = estimate_transformer(m, batch=b, system=spec, dtype="fp16").set_index("sublayer")
    pairs = (("layer_norm_1", "ln_1"), ("qkv_proj", "qkv_proj"), ("out_proj", "out_proj"), ("layer_norm_2", "ln_2"),
             ("fc1", "fc1"), ("act", "act"), ("fc2", "fc2"), ("dropout_softmax", "dropout_softmax"),
             ("dropout_attn", "dropout_attn"), ("dropout_mlp", "dropout_mlp"))
    for ours, theirs in pairs:  # the second block: the first op of a model waits on the host timeline
        for ph in ("fwd", "bwd"):
            assert tab.loc[ours, f"pred_{ph}_s"] == pytest.approx(mod.loc[f"1.{theirs}", f"pred_{ph}_s"], rel=0.01), \
                (ours, ph)
    if system == "curve":  # the shape curve halves the GEMM rate: fc1 takes 2x its datasheet-spec time
        plain = estimate_transformer(m, batch=b, system="a100-80gb-sxm", dtype="fp16").set_index("sublayer")
        assert tab.loc["fc1", "t_compute_fwd_s"] == pytest.approx(2 * plain.loc["fc1", "t_compute_fwd_s"], rel=1e-3)  # bias adds: vector rate


def test_issue_reproduction_tp8_fc1():
    """The issue's numbers: one tp-8 fc1 (2048 x 20480 @ 20480 x 10240, fp16) on the curve spec ~6.35 ms."""
    spec = _curve_spec()
    with torch.device("meta"):
        fc1 = nn.Linear(20480, 10240)
    x = torch.empty(2048, 20480, device="meta", requires_grad=True)
    theirs = estimate(fc1, (x,), system=spec, dtype="fp16").set_index("module").loc[ROOT, "pred_fwd_s"]
    m = dict(name="t", layers=1, hidden=20480, heads=128, ffn_hidden=81920, vocab=1000, seq_len=2048,
             norm="layernorm", activation="gelu", bias=True, tied_embeddings=True)
    ours = estimate_transformer(m, parallel=dict(tp=8), system=spec, dtype="fp16").set_index("sublayer")
    assert ours.loc["fc1", "pred_fwd_s"] == pytest.approx(theirs, rel=0.01)
    assert ours.loc["fc1", "pred_fwd_s"] == pytest.approx(2 * 2048 * 20480 * 10240 / (312e12 * 0.87 * 0.5), rel=0.01)
