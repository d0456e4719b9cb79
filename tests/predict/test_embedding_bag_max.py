"""EmbeddingBag's max mode as its own class (``_embedding_bag_max``): its backward is bags x dim scattered adds
(one index_add_ per column, no sort, no per-index rows), its calibration cases carry the formula's bytes, and a
traced max call is looked up under its class; all by hand arithmetic."""
import torch

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate.op_classes import EMBEDDING_BAG_FIXED_CASES, embedding_bag_max_cases
from perfcheck.predict import formulas as F
from perfcheck.predict.aten_costs import embedding_bag_class, op_class
from perfcheck.predict.trace import trace_model


def test_max_backward_by_hand():
    c = F.embedding_bag(2048, 512, 32, 4096, mode=2)
    # 512 bags x 32 columns: read g, read + write the row's element (3 x 4 B), the int64 max index (8 B), the
    # 4096 x 32 fp32 gradient filled at two streams
    assert c.bwd.flops == 16384 and c.bwd.rows == 0 and c.bwd.kernels == 2
    assert c.bwd.bytes == 3 * 16384 * 4 + 16384 * 8 + 2 * 4096 * 32 * 4 == 1376256
    assert c.act_mem == (2048 + 512) * 8 + 16384 * 8  # indices + offsets, and max_indices
    fwd = F.embedding_bag(2048, 512, 32, 4096, mode=0).fwd
    assert c.fwd == fwd  # the forward's bytes are sum's; its rate is the class's
    s = F.embedding_bag(2048, 512, 32, 4096, mode=0).bwd
    assert s.rows == 2048 and s.bytes == (3 * 65536 + 16384) * 4 + 2 * 4096 * 32 * 4 + 2 * 2560 * 8


def test_each_mode_is_its_own_class_and_calibrated():
    assert [embedding_bag_class(m) for m in (0, 1, 2)] == ["_embedding_bag", "_embedding_bag_mean",
                                                          "_embedding_bag_max"]
    assert EMBEDDING_BAG_FIXED_CASES["_embedding_bag_max"] == 2
    fwd, bwd = embedding_bag_max_cases(torch.device("cpu"))
    assert (fwd.kind, fwd.label, bwd.label) == (names.OPEFF, "_embedding_bag_max", "_embedding_bag_max:bwd")
    assert fwd.bytes == (65536 + 16384) * 4 + 2560 * 8 and bwd.bytes == 1376256
    out, _, _, max_idx = fwd.fn()
    assert out.shape == (512, 32) and max_idx.shape == (512, 32)
    assert bwd.fn().shape == (4096, 32)


def test_a_traced_max_bag_is_looked_up_under_its_class():
    m = torch.nn.EmbeddingBag(100, 8, mode="max")
    trace = trace_model(m, (torch.arange(12), torch.tensor([0, 4, 8])))
    bags = [op.call for op in trace.ops if op.call.name == "_embedding_bag"]
    assert bags and op_class(bags[0]) == "_embedding_bag_max"
