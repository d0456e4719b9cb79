"""Square roots of zero second moments (perfcheck.predict.zero_rows): an adaptive optimizer's state stays exactly 0
on the embedding rows no index reaches, and a CPU's sqrt of 0 is slow (bench/results/optimizer_step.md). Checked
by hand: the untouched share, the zero elements of an embedding (tied and sparse ones left out), the square roots
per tensor counted from torch's code, the price in the optimizer's time, the estimator's column and the fit of
``sqrt_zero_s`` from its two cases."""
import math

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.calibrate import cases, fit
from perfcheck.calibrate import case_names as names
from perfcheck.predict import host, optimizers
from perfcheck.predict.trace import trace_model
from perfcheck.predict.zero_rows import untouched_share, zero_elements
from _host_only_specs import cpu_spec_with_host as _spec  # the cpu spec, every host constant 0 but the ones given

NS = 1e-9


class _Lookup(torch.nn.Module):
    def __init__(self, tied=False, sparse=False):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 3, sparse=sparse)
        self.head = torch.nn.Linear(3, 10, bias=False)
        if tied:
            self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids))


def test_untouched_share_by_hand():
    assert untouched_share(2, 4) == pytest.approx(0.5625)  # (1 - 1/4)^2: each row missed by both draws
    assert untouched_share(0, 7) == 1.0
    assert untouched_share(5, 1) == 0.0  # the one row is always reached
    assert untouched_share(512, 4000) == pytest.approx(math.exp(512 * math.log(1 - 1 / 4000)))  # ~0.880


def test_zero_elements_of_an_embedding_and_none_for_tied_or_sparse():
    ids = torch.tensor([[1, 2], [3, 1]])  # 4 indices per step into 10 rows
    m = _Lookup()
    modules = dict(m.named_modules())
    z = zero_elements(trace_model(m, (ids,)), modules)
    assert z == {id(m.emb.weight): pytest.approx(30 * 0.9 ** 4)}  # 10 x 3 elements x (1 - 1/10)^4 = 19.683
    tied = _Lookup(tied=True)  # the head's gradient is dense: no row stays at zero
    assert zero_elements(trace_model(tied, (ids,)), dict(tied.named_modules())) == {}
    sparse = _Lookup(sparse=True)
    assert zero_elements(trace_model(sparse, (ids,)), dict(sparse.named_modules())) == {}


def test_square_roots_per_tensor_as_torch_runs_them():
    # torch 2.13's _single_tensor_adam: denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps): one sqrt
    assert optimizers.profile("adam", "for-loop").sqrts == 1
    assert optimizers.profile("adamw", "foreach").sqrts == 1  # _foreach_sqrt over the list: one per tensor
    assert optimizers.profile("rmsprop", "for-loop").sqrts == 1  # avg = square_avg.sqrt().add_(eps)
    assert optimizers.profile("sgd_momentum", "for-loop").sqrts == 0
    assert optimizers.profile("adam", "fused").sqrts == 0  # its root is inside the one fused kernel


def test_optimizer_time_prices_each_zero_root():
    spec = _spec(sqrt_zero_s=5 * NS)
    base = host.optimizer_time([1000, 10], "adam", spec)
    more = host.optimizer_time([1000, 10], "adam", spec, zero_numel=800)
    assert more.time_s - base.time_s == pytest.approx(1 * 800 * 5 * NS)  # 1 sqrt x 800 zeros x 5 ns = 4 us
    sgd = host.optimizer_time([1000, 10], "sgd", spec)
    assert host.optimizer_time([1000, 10], "sgd", spec, zero_numel=800).time_s == pytest.approx(sgd.time_s)


def test_estimator_adds_the_zero_roots_to_the_embedding_and_the_root():
    ids = torch.tensor([[1, 2], [3, 1]])
    m = _Lookup()
    with_zero = perfcheck.estimate(m, (ids,), system=_spec(sqrt_zero_s=5 * NS), optimizer="adam").set_index("module")
    without = perfcheck.estimate(m, (ids,), system=_spec(), optimizer="adam").set_index("module")
    extra = 30 * 0.9 ** 4 * 5 * NS  # 19.683 zero elements x 1 sqrt x 5 ns
    for path in ("emb", "(root)"):
        assert with_zero.loc[path, "pred_optim_s"] - without.loc[path, "pred_optim_s"] == pytest.approx(extra)
    assert with_zero.loc["head", "pred_optim_s"] == pytest.approx(without.loc["head", "pred_optim_s"])


def test_fit_of_sqrt_zero_s_by_hand():
    rows = [{"kind": names.HOST, "label": names.HOST_SQRT_ZERO, "dtype": "fp32", "m": 0, "k": 0, "n": 0,
             "flops": 0.0, "bytes": 0.0, "world_size": 1, "seconds": 5.2 * NS},
            {"kind": names.HOST, "label": names.HOST_SQRT_NORMAL, "dtype": "fp32", "m": 0, "k": 0, "n": 0,
             "flops": 0.0, "bytes": 0.0, "world_size": 1, "seconds": 0.3 * NS}]
    spec = fit.build_spec("cpu", pd.DataFrame(rows), peaks="base", stamp="test", kind="cpu")
    assert spec.host["sqrt_zero_s"] == pytest.approx(4.9 * NS)  # 5.2 - 0.3 ns per element


def test_the_cases_time_sqrt_of_zeros_and_of_normal_values():
    zero, normal = cases.sqrt_zero_cases("cpu")
    assert (zero.label, normal.label) == (names.HOST_SQRT_ZERO, names.HOST_SQRT_NORMAL)
    assert zero.per_call == normal.per_call == cases.SQRT_ELEMENTS
    assert float(zero.fn().abs().sum()) == 0.0 and float(normal.fn().sum()) == cases.SQRT_ELEMENTS
