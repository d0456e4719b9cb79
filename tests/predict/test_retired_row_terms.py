"""Terms retired by the held-out pruning (bench/results/pruning.md, bench/results/heldout.md): the row-wise ops'
per-row terms (softmax, log_softmax, layer norm, nll_loss, by row length against the SIMD width), the spec's
``simd_bytes`` and the narrow-GEMM row price. An older spec file carrying any of them loads without them, and
the estimator prices those ops by their FLOPs and bytes alone: checked against hand arithmetic on a spec whose
every other term is 0 or ~1e-14 s."""
import pytest
import torch

import perfcheck
from perfcheck.hardware.systems import SystemSpec, host_constants, load_system
from perfcheck.predict import gemm_operands, roofline
from perfcheck.predict.aten_costs import OpCall, TensorMeta
from _host_only_specs import Fn, host_only_spec, root_row

US, NS = 1e-6, 1e-9
#: an op_row_s entry as a spec file written before the retirement carried it
OLD_TERMS = {"fwd": 15 * NS, "fwd_vector": 9 * NS, "fwd_tail": 20 * NS, "fwd_partial": 45 * NS, "bwd": 4 * NS}


def _old_file(spec):
    """``spec``'s file as perfcheck wrote it before the retirement: simd_bytes, its source, row-wise ops' entries
    with length terms, an op-class entry with a length term, and the narrow-GEMM host constant."""
    d = spec.to_json_dict()
    return {**d, "simd_bytes": 64, "sources": {**d.get("sources", {}), "simd_bytes": "the row cases' SIMD width"},
            "op_row_s": {"_log_softmax": OLD_TERMS, "native_layer_norm": {"fwd": 40 * NS},
                         "nll_loss_forward": {"fwd": 3 * NS}, "embedding": {"fwd": 5 * NS, "fwd_tail": 1 * NS}},
            "host": {**d["host"], "gemm_narrow_row_s": 3e-8}}


def test_an_older_spec_file_loads_without_the_retired_terms():
    spec = SystemSpec.from_dict(_old_file(host_only_spec()))
    assert dict(spec.op_row_s) == {"embedding": {"fwd": 5 * NS}}  # the op-class entry stays, less its length term
    assert not hasattr(spec, "simd_bytes") and "simd_bytes" not in spec.sources
    assert "simd_bytes" not in spec.to_json_dict() and "gemm_narrow_row_s" not in spec.host
    assert "gemm_narrow_row_s" not in host_constants(load_system("cpu"))
    assert SystemSpec.from_dict(spec.to_json_dict()) == spec  # and writes back without them


@pytest.mark.parametrize("cols", [5, 8, 12, 20, 32])
def test_row_wise_ops_cost_their_fixed_costs_alone_whatever_their_row_length(cols):
    # cross_entropy = _log_softmax + nll_loss_forward on 256 rows: dispatch 2 us per op, nothing per row, so the
    # forward is 2 x 2 = 4 us on this spec (its roofline terms ~1e-14 s) whatever the row length, with or without
    # an older file's row-wise entries
    x, y = torch.randn(256, cols, requires_grad=True), torch.randint(0, cols, (256,))
    model = Fn(lambda a, b: torch.nn.functional.cross_entropy(a, b))
    for spec in (host_only_spec(op_dispatch_s=2 * US), SystemSpec.from_dict(_old_file(host_only_spec(op_dispatch_s=2 * US)))):
        root = root_row(perfcheck.estimate(model, (x, y), system=spec))
        assert root["pred_fwd_s"] == pytest.approx(4 * US, rel=1e-6)
    assert list(roofline.row_prices(host_only_spec({"_softmax": {"fwd": 7 * NS}}), ["_safe_softmax", "relu"], "fwd")) \
        == [0.0, 0.0]  # no alias prices a fused softmax with the plain one's entry any more


def test_a_narrow_gemm_is_priced_by_its_flops_and_bytes_alone():
    # gemm_narrow_row_s (a price per output row narrower than two SIMD vectors) is retired: nn.Linear(16, 5) on
    # 256 rows predicts the same whatever an older file said about narrow rows
    model = torch.nn.Linear(16, 5)
    x = torch.randn(256, 16, requires_grad=True)
    spec = host_only_spec(op_dispatch_s=2 * US)
    a, b = (root_row(perfcheck.estimate(model, (x,), system=s))
            for s in (spec, SystemSpec.from_dict(_old_file(spec))))
    assert a["pred_fwd_s"] == b["pred_fwd_s"] and a["pred_bwd_s"] == b["pred_bwd_s"]
    # bmm: batch x rows; no gradients -> no backward rows; not a GEMM -> None
    t = TensorMeta
    bmm = OpCall(torch.ops.aten.bmm.default, (t((4, 32, 8), 4, False, True), t((4, 8, 3), 4, False, True)), {}, ())
    assert gemm_operands.gemm_dims(bmm) == (4, 32, 8, 3, False, False, 4)
    relu = OpCall(torch.ops.aten.relu.default, (t((4, 4), 4, False, True),), {}, ())
    assert gemm_operands.gemm_dims(relu) is None
