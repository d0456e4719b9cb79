"""First-touch page faults of an Embedding's fresh dense gradient (perfcheck.predict.pages): which sizes fault (a
buffer of 32 MiB or more is a new mapping at every allocation: glibc's mmap threshold ceiling), how many 4 KiB
pages, the fit of ``page_fault_s`` from its two calibration cases, and the estimator's backward moving by exactly
pages x page_fault_s; all by hand arithmetic."""
import dataclasses

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.calibrate import case_names as names, fit
from perfcheck.calibrate.cases import page_fault_cases
from perfcheck.hardware.systems import host_constants, load_system
from perfcheck.predict import formulas as F
from perfcheck.predict.pages import fresh_pages
from perfcheck.schema import ROOT

US = 1e-6


def test_fresh_pages_by_hand():
    assert fresh_pages(100000 * 128 * 4) == 12500  # 51 200 000 B / 4096, over 32 MiB = 33 554 432 B
    assert fresh_pages(32 * 2 ** 20) == 8192  # the ceiling itself is mapped anew
    assert fresh_pages(32 * 2 ** 20 - 4) == 0  # below it: the allocation history decides, not priced
    assert fresh_pages(8000 * 128 * 4) == 0  # lstm-size table, 3.9 MiB
    assert list(fresh_pages([4096.0, 40 * 2 ** 20 + 1])) == [0.0, 10241.0]  # arrays too; a partial page counts


def test_embedding_backward_counts_the_gradient_pages():
    big = F.embedding(256, 128, 100000)
    assert big.bwd.pages == 12500 and big.fwd.pages == 0
    assert F.embedding(256, 128, 8000).bwd.pages == 0
    bag = F.embedding_bag(1024, 256, 16, 1000000)  # 64 000 000 B / 4096
    assert bag.bwd.pages == 15625 and bag.fwd.pages == 0
    assert F.embedding(256, 128, 100000, w_grad=False).bwd.pages == 0  # frozen table: no backward


def _row(kind, label, seconds):
    return {"kind": kind, "label": label, "dtype": "fp32", "m": 0, "k": 0, "n": 0, "flops": 0.0, "bytes": 0.0,
            "world_size": 1, "seconds": seconds}


def test_fit_of_page_fault_s_by_hand():
    rows = [_row("launch", "op", 4 * US), _row("host", names.HOST_FRESH_FILL, 2.1 * US),
            _row("host", names.HOST_REUSED_FILL, 0.3 * US)]
    spec = fit.build_spec("cpu", pd.DataFrame(rows), peaks="base", stamp="test", kind="cpu")
    assert spec.host["page_fault_s"] == pytest.approx(1.8 * US)  # 2.1 - 0.3 per page


def test_page_fault_cases_fill_32_mib_per_page_on_a_cpu_only():
    fresh, kept = page_fault_cases(torch.device("cpu"))
    assert (fresh.label, kept.label) == (names.HOST_FRESH_FILL, names.HOST_REUSED_FILL)
    assert fresh.per_call == kept.per_call == 8192  # 32 MiB / 4 KiB
    out = fresh.fn()
    assert out.numel() * out.element_size() == 32 * 2 ** 20 and not out.any()
    assert page_fault_cases(torch.device("meta")) == []


def _bwd(spec, vocab):
    m, idx = torch.nn.Embedding(vocab, 128), torch.randint(0, vocab, (256,))
    p = perfcheck.estimate(m, (idx,), system=spec)
    return float(p[p["module"] == ROOT].iloc[0].pred_bwd_s)


def test_estimator_adds_pages_times_page_fault_s_to_the_backward():
    base = load_system("cpu")
    with_faults = dataclasses.replace(base, host={**host_constants(base), "page_fault_s": 2 * US})
    without = dataclasses.replace(base, host={**host_constants(base), "page_fault_s": 0.0})
    assert _bwd(with_faults, 100000) - _bwd(without, 100000) == pytest.approx(12500 * 2 * US, rel=1e-9)
    assert _bwd(with_faults, 8000) == pytest.approx(_bwd(without, 8000), rel=1e-12)  # 3.9 MiB: no pages
    gpu = load_system("h100-sxm")
    assert host_constants(gpu)["page_fault_s"] == 0.0  # the caching allocator keeps its memory mapped
