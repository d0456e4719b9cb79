"""Row-wise ops priced by row length (full SIMD vectors, a partial vector, element by element under one vector)
and narrow-output GEMMs priced per output row: the arithmetic by hand, the SIMD width from the CPU's capability,
the spec fields' validation and round trip, and the two calibration fits on hand-made timings."""
import dataclasses
import math

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.errors import UserError
from perfcheck.calibrate.op_cases import row_lengths
from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS, build_spec
from perfcheck.calibrate.fit_host import row_terms_fit
from perfcheck.hardware.systems import SIMD_BYTES, SystemSpec, host_constants, load_system, local_simd_bytes, simd_bytes
from perfcheck.predict import roofline
from perfcheck.predict.aten_costs import OpCall, TensorMeta
from _host_only_specs import Fn, root_row
from _host_only_specs import host_only_spec as _host_only_spec

US, NS = 1e-6, 1e-9
TERMS = {"fwd": 15 * NS, "fwd_vector": 9 * NS, "fwd_tail": 20 * NS, "fwd_partial": 45 * NS}


def host_only_spec(op_row_s=None, simd=32, **host_values):
    """``_host_only_specs.host_only_spec`` at 32-byte (AVX2) vectors unless told: the hand arithmetic below assumes W = 8."""
    return _host_only_spec(op_row_s, simd=simd, **host_values)




def _log_softmax_fwd(spec, rows, cols):
    x = torch.randn(rows, cols, requires_grad=True)
    return root_row(perfcheck.estimate(Fn(lambda t: torch.nn.functional.log_softmax(t, 1)), (x,), system=spec))["pred_fwd_s"]


@pytest.mark.parametrize("cols, per_row_ns", [
    (5, 15 + 5 * 20),        # under one 8-float vector: element by element, 115 ns
    (8, 15 + 9),             # one full vector: 24 ns
    (12, 15 + 9 + 45),       # a vector and a partial one (4 floats): 69 ns
    (20, 15 + 2 * 9 + 45),   # two vectors and a partial one: 78 ns
    (32, 15 + 4 * 9),        # four vectors: 51 ns
])
def test_row_price_by_length_on_avx2(cols, per_row_ns):
    # 256 rows x the per-row price; the spec's other terms are 0 (host) or ~1e-14 s (roofline)
    spec = host_only_spec({"_log_softmax": TERMS})
    assert _log_softmax_fwd(spec, 256, cols) == pytest.approx(256 * per_row_ns * NS, rel=1e-6)


def test_the_vector_width_comes_from_the_spec_or_this_cpu():
    # AVX-512 (64 bytes = 16 floats): a 12-float row is under one vector: 15 + 12 x 20 = 255 ns per row
    assert _log_softmax_fwd(host_only_spec({"_log_softmax": TERMS}, simd=64), 256, 12) == pytest.approx(256 * 255 * NS, rel=1e-6)
    # a spec without its own width asks this machine's PyTorch (torch.backends.cpu.get_cpu_capability())
    cap = torch.backends.cpu.get_cpu_capability()
    assert local_simd_bytes() == (64 if cap == "AVX512" else 32) and SIMD_BYTES == {"AVX512": 64}
    assert simd_bytes(host_only_spec(simd=0)) == local_simd_bytes() and simd_bytes(host_only_spec(simd=64)) == 64
    assert row_lengths(32) == (4, 8, 10, 16) and row_lengths(64) == (8, 16, 20, 32)


def test_an_entry_without_length_terms_prices_every_row_alike():
    spec = host_only_spec({"_log_softmax": {"fwd": 70 * NS}})
    assert _log_softmax_fwd(spec, 256, 5) == pytest.approx(256 * 70 * NS, rel=1e-6)
    assert _log_softmax_fwd(spec, 256, 16) == pytest.approx(256 * 70 * NS, rel=1e-6)


def test_simd_bytes_and_row_terms_validate_and_round_trip():
    spec = host_only_spec({"_softmax": {"bwd": 1 * NS, "bwd_vector": 2 * NS, "bwd_tail": 3 * NS, "bwd_partial": 4 * NS}}, simd=64)
    again = SystemSpec.from_dict(spec.to_json_dict())
    assert again == spec and again.simd_bytes == 64 and dict(again.op_row_s["_softmax"])["bwd_partial"] == 4 * NS
    assert "simd_bytes" not in load_system("cpu").to_json_dict()  # absent when not given: older files unchanged
    for bad in (-32, 30, 32.0, True):
        with pytest.raises(UserError, match="simd_bytes must be a non-negative multiple of 4"):
            SystemSpec.from_dict({**spec.to_json_dict(), "simd_bytes": bad})
    with pytest.raises(UserError, match=r"op_row_s\._softmax has unknown phase 'fwd_tails'"):
        SystemSpec.from_dict({**spec.to_json_dict(), "op_row_s": {"_softmax": {"fwd_tails": 1.0}}})


def test_a_narrow_gemm_is_priced_by_its_flops_and_bytes_alone():
    # gemm_narrow_row_s (a price per output row narrower than two SIMD vectors) is retired: it moved no held-out
    # model (bench/results/heldout.md). nn.Linear(16, 5) predicts the same on AVX2 and AVX-512 widths, and an
    # older spec file carrying the key still loads, without it
    model = torch.nn.Linear(16, 5)
    x = torch.randn(256, 16, requires_grad=True)
    spec = host_only_spec()
    a, b = (root_row(perfcheck.estimate(model, (x,), system=s))
            for s in (spec, dataclasses.replace(spec, simd_bytes=64)))
    assert a["pred_fwd_s"] == b["pred_fwd_s"] and a["pred_bwd_s"] == b["pred_bwd_s"]
    assert "gemm_narrow_row_s" not in host_constants(load_system("cpu"))
    old = {**spec.to_json_dict(), "host": {**dict(spec.host), "gemm_narrow_row_s": 3e-8}}
    assert "gemm_narrow_row_s" not in SystemSpec.from_dict(old).host
    # bmm: batch x rows; no gradients -> no backward rows; not a GEMM -> None
    t = TensorMeta
    bmm = OpCall(torch.ops.aten.bmm.default, (t((4, 32, 8), 4, False, True), t((4, 8, 3), 4, False, True)), {}, ())
    assert roofline.gemm_dims(bmm) == (4, 32, 8, 3, False, False, 4)
    relu = OpCall(torch.ops.aten.relu.default, (t((4, 4), 4, False, True),), {}, ())
    assert roofline.gemm_dims(relu) is None


def _row(kind, label, seconds, m=0, k=0, n=0, flops=0.0, nbytes=0.0):
    return {"kind": kind, "label": label, "dtype": "fp32", "m": m, "k": k, "n": n, "flops": flops, "bytes": nbytes,
            "world_size": 1, "seconds": seconds, "seconds_min": seconds, "seconds_max": seconds, "repeats": 3,
            "iters": 1, "flops_per_s": math.nan, "bytes_per_s": math.nan, "busbw_bytes_per_s": math.nan}


def test_row_fit_recovers_the_four_terms_from_hand_made_timings():
    # _softmax fwd, no FLOPs or bytes (roofline 0), per row by length with row 15, vector 9, tail 20, partial 45 ns:
    # L=4: 15 + 4 x 20 = 95; L=8: 15 + 9 = 24; L=10: 15 + 9 + 45 = 69; L=16: 15 + 2 x 9 = 33 ns
    per = {4: 95, 8: 24, 10: 69, 16: 33}
    rows = [_row("launch", "op", 4 * US)]
    for cols, ns in per.items():
        rows += [_row("oprows", "_softmax fwd", 5 * US + r * ns * NS, r, cols, 1) for r in (64, 512)]
    spec = build_spec("cpu", pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS)), peaks="measured", stamp="test")
    got = spec.op_row_s["_softmax"]
    for key, value in TERMS.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-15)
    assert spec.simd_bytes == 32 and "simd_bytes" in spec.sources  # 8 floats: half the longest length (16)


def test_row_fit_keeps_every_term_non_negative():
    # slopes falling with the length (a noisy table): unconstrained least squares gives a negative vector term;
    # the fit keeps the best solution with every term >= 0
    row, vec, tail, part = row_terms_fit({4: 100 * NS, 8: 60 * NS, 10: 90 * NS, 16: 40 * NS}, 8)
    assert min(row, vec, tail, part) >= 0
    # exact data: exact terms (30 + 5 x L under a vector, + 7 per vector, + 11 per partial)
    exact = row_terms_fit({4: 50 * NS, 8: 37 * NS, 10: 48 * NS, 16: 44 * NS}, 8)
    assert exact == pytest.approx((30 * NS, 7 * NS, 5 * NS, 11 * NS), rel=1e-9)


