"""EmbeddingBag's max mode as its own class (``_embedding_bag_max``): its backward is bags x dim scattered adds
(one index_add_ per column, no sort: one row per scattered element, priced at the class's op_row_s), its
calibration cases carry the formula's bytes and rows, and a traced max call is looked up under its class; all by
hand arithmetic."""
import dataclasses

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.calibrate import case_names as names, fit
from perfcheck.calibrate.index_cases import EMBEDDING_BAG_FIXED_CASES, embedding_bag_max_cases
from perfcheck.hardware.systems import load_system
from perfcheck.predict import formulas as F
from perfcheck.predict.aten_costs import embedding_bag_class, op_class
from perfcheck.predict.roofline import row_prices
from perfcheck.predict.trace import trace_model
from perfcheck.schema import ROOT

NS = 1e-9


def test_max_backward_by_hand():
    c = F.embedding_bag(2048, 512, 32, 4096, mode=2)
    # 512 bags x 32 columns: read g, read + write the row's element (3 x 4 B), the int64 max index (8 B), the
    # 4096 x 32 fp32 gradient filled at two streams
    assert c.bwd.flops == 16384 and c.bwd.rows == 16384 and c.bwd.kernels == 2  # one row per scattered element
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
    small, large, fwd = embedding_bag_max_cases(torch.device("cpu"))
    assert (small.kind, small.label, fwd.kind, fwd.label) == (names.OPROWS, "_embedding_bag_max bwd", names.OPEFF,
                                                              "_embedding_bag_max:fwd")
    assert small.shape[:2] == (128 * 32, 1) and large.shape[:2] == (1024 * 32, 1)  # m = bags x columns
    assert large.bytes == 3 * 32768 * 4 + 32768 * 8 + 2 * 4096 * 32 * 4  # the formula's, 1024 bags
    assert fwd.bytes == (4096 * 32 + 32768) * 4 + (4096 + 1024) * 8
    out, _, _, max_idx = fwd.fn()
    assert out.shape == (1024, 32) and max_idx.shape == (1024, 32)
    assert large.fn().shape == (4096, 32)


def test_row_price_of_the_class_first_then_the_op():
    spec = dataclasses.replace(load_system("cpu"), op_row_s={"_embedding_bag": {"bwd": 100 * NS},
                                                             "_embedding_bag_max": {"bwd": 6 * NS}})
    got = row_prices(spec, ["_embedding_bag", "_embedding_bag", "convolution"], "bwd",
                     ["_embedding_bag_max", "_embedding_bag_mean", "convolution_wide"])
    assert list(got) == pytest.approx([6 * NS, 100 * NS, 0.0])  # mean has no price of its own: the op's


def test_estimator_prices_each_scattered_element_at_the_class_row_price():
    m, ins = torch.nn.EmbeddingBag(1000, 16, mode="max"), (torch.arange(40) % 1000, torch.arange(0, 40, 4))
    base = load_system("cpu")

    def bwd(price):
        spec = dataclasses.replace(base, op_row_s={"_embedding_bag_max": {"bwd": price}})
        p = perfcheck.estimate(m, ins, system=spec)
        return float(p[p["module"] == ROOT].iloc[0].pred_bwd_s)
    assert bwd(10 * NS) - bwd(0.0) == pytest.approx(10 * 16 * 10 * NS, rel=1e-9)  # 10 bags x 16 columns


def test_a_traced_max_bag_is_looked_up_under_its_class():
    m = torch.nn.EmbeddingBag(100, 8, mode="max")
    trace = trace_model(m, (torch.arange(12), torch.tensor([0, 4, 8])))
    bags = [op.call for op in trace.ops if op.call.name == "_embedding_bag"]
    assert bags and op_class(bags[0]) == "_embedding_bag_max"


def test_fit_takes_the_class_fixed_cost_out_of_its_forward_case():
    def eff(rows):
        t = pd.DataFrame(rows, columns=["kind", "label", "dtype", "flops", "bytes", "n", "k", "seconds"])
        return fit.build_spec(load_system("cpu"), t, peaks="base", stamp="test").op_efficiency["_embedding_bag_max:fwd"]
    case = ("opeff", "_embedding_bag_max:fwd", "fp32", 0.0, 348160.0, 65536.0, 1.0, 400e-6)
    with_fixed = eff([case, ("classfixed", "_embedding_bag_max", "fp32", 0.0, 0.0, 0.0, 0.0, 100e-6)])
    # no dispatch row: the kernel's time is 400 us, less the class's 100 us fixed cost when it is measured
    assert with_fixed / eff([case]) == pytest.approx(400 / 300)
