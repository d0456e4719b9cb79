"""Models beyond the examples (perfcheck.examples): every op is costed by a formula (no `unmodeled_ops`), and the counts
equal hand derivations where FlopCounterMode cannot serve as the reference."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import perfcheck
from perfcheck.predict import formulas
from perfcheck.schema import ROOT
from reference import flop_counter_by_module


def _root(model, inputs, **kw):
    return perfcheck.estimate(model, inputs, system="h100-sxm", **kw).set_index("module").loc[ROOT]


def test_lstm_counts_its_gate_products():
    # FlopCounterMode counts 0: on CPU nn.LSTM runs aten.mkldnn_rnn_layer, which it does not know.
    # Per layer: T*B * 4H * (I + H) MACs; layer 2 reads layer 1's H outputs.
    t, b, i, h = 10, 4, 16, 32
    root = _root(nn.LSTM(i, h, num_layers=2, batch_first=True), (torch.randn(b, t, i),))
    assert root.macs_fwd == t * b * 4 * h * (i + h) + t * b * 4 * h * (h + h) == 573_440
    assert root.unmodeled_ops == "" and root.act_mem > 0
    # backward: input-side grads (no grad for x in layer 1, always for h) + weight grads.
    assert root.macs_bwd == t * b * 4 * h * h + t * b * 4 * h * (h + h) + root.macs_fwd


def test_gru_decomposed_matches_the_rnn_formula():
    # On CPU nn.GRU decomposes into matmuls that FlopCounterMode sees: both references agree.
    t, b, i, h = 7, 3, 12, 20
    gru, x = nn.GRU(i, h, batch_first=True), torch.randn(b, t, i)
    root = _root(gru, (x,))
    assert root.macs_fwd == formulas.rnn(t, b, i, h, 3).fwd.macs
    assert 2 * root.macs_fwd == flop_counter_by_module(gru, (x,))[ROOT][0]


@pytest.mark.parametrize("model, shape", [
    (nn.Sequential(nn.Conv2d(4, 8, 3, padding=1, padding_mode="reflect"), nn.PixelShuffle(2),
                   nn.Upsample(scale_factor=2, mode="bilinear")), (1, 4, 8, 8)),
    (nn.Sequential(nn.ReplicationPad1d(2), nn.Conv1d(3, 6, 3), nn.Upsample(scale_factor=2)), (2, 3, 10)),
    (nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2), (2, 12, 32)),
    (nn.EmbeddingBag(100, 16, mode="mean"), None),
])
def test_common_layers_have_formulas_and_match_flop_counter(model, shape):
    inputs = (torch.randint(0, 100, (4, 6)),) if shape is None else (torch.randn(*shape),)
    root = _root(model, inputs)
    assert root.unmodeled_ops == ""
    assert 2 * root.macs_fwd == flop_counter_by_module(model, inputs).get(ROOT, (0, 0))[0]
    assert root.bytes_fwd > 0 and root.pred_fwd_s > 0


def test_activation_checkpointing_and_kwargs_and_dict_outputs():
    class Checkpointed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(32, 32), nn.Linear(32, 32)

        def forward(self, x, scale=1.0):
            y = torch.utils.checkpoint.checkpoint(lambda t: self.b(F.gelu(self.a(t))), x, use_reentrant=False)
            return {"y": y * scale, "aux": x.mean()}

    est = perfcheck.estimate(Checkpointed(), (torch.randn(4, 32),), system="cpu", kwargs={"scale": 2.0})
    assert est.set_index("module").loc[ROOT, "macs_fwd"] == 2 * 4 * 32 * 32


def test_data_dependent_forward_is_a_one_line_error_naming_the_cause():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            return y * 2 if y.sum() > 0 else y

    with pytest.raises(perfcheck.UserError, match="needs tensor values") as err:
        perfcheck.estimate(DataDependent(), (torch.randn(3, 4),), system="cpu")
    assert "\n" not in str(err.value)


def test_compiled_and_wrapped_models_estimate_as_their_inner_module():
    inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(5, 8)
    plain = perfcheck.estimate(inner, (x,), system="cpu")
    compiled = perfcheck.estimate(torch.compile(inner), (x,), system="cpu")
    assert compiled["module"].tolist() == plain["module"].tolist() == ["(root)", "0", "1", "2"]
    assert compiled["macs_fwd"].tolist() == plain["macs_fwd"].tolist()


@pytest.mark.parametrize("model", [nn.Identity(), nn.Sequential(nn.Identity(), nn.Dropout(0.0))],
                         ids=["identity", "sequential-of-no-ops"])
def test_a_model_that_runs_no_aten_op_estimates_as_zero_work(model):
    """A model whose forward runs no aten op (it returns its input) has nothing to predict on the device:
    every row is zero FLOPs, bytes and device time, not an exception from an empty op table."""
    pred = perfcheck.estimate(model, (torch.randn(2, 3),), system="cpu")
    assert pred.loc[pred["module"] == ROOT, "calls"].item() == 1
    for col in ("flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd", "act_mem", "pred_fwd_s", "pred_bwd_s"):
        assert (pred[col] == 0).all(), col
