"""Definitions written once: the collective kinds (one list, named subsets), the host-constant keys built from
parts (perfcheck.hardware.host_keys), dtype names (perfcheck.hardware.systems.torch_dtype), and the calibration
cases' kinds and labels (perfcheck.calibrate.case_names), checked against hand-written references."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

PACKAGE = Path(__file__).resolve().parents[2] / "perfcheck"


def test_every_list_of_collective_kinds_is_a_named_subset_of_the_one_list():
    from perfcheck.analysis import answers, layouts, stages
    from perfcheck.calibrate.fit import BENCHMARKED_KINDS
    from perfcheck.predict import sharding, zero
    from perfcheck.predict.collectives import COLLECTIVE_KINDS

    assert set(zero.KINDS) == {"allreduce", "allgather", "reducescatter", "reduce"}  # what ZeRO 0-3 issue
    assert set(sharding.SUBLAYER_KINDS) == set(COLLECTIVE_KINDS) - {"sendrecv"}
    assert set(BENCHMARKED_KINDS) == {"allreduce", "allgather", "reducescatter"}
    for subset in (zero.KINDS, sharding.SUBLAYER_KINDS, BENCHMARKED_KINDS):
        assert set(subset) <= set(COLLECTIVE_KINDS)
    # the ZeRO comparison reads the ZeRO kinds from predict/zero.py, not a copy
    assert stages.KINDS is zero.KINDS and answers.KINDS is zero.KINDS and layouts.KINDS is zero.KINDS


def test_no_module_but_the_one_defines_a_tuple_of_collective_kinds():
    """A tuple literal naming three or more collective kinds appears only where the list (perfcheck/parallel.py,
    below every floor so a system spec can name kinds) or a subset is defined
    (and in the transformer step's own dp_<kind>_bytes columns, predict/step.py: a column set, not a kind list)."""
    allowed = {"parallel.py", "predict/zero.py", "calibrate/fit.py", "predict/step.py"}
    kind = r'"(allreduce|allgather|reducescatter|reduce|broadcast|alltoall|sendrecv)"'
    literal = re.compile(rf"\(\s*{kind},\s*{kind},\s*{kind}")
    found = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if literal.search(p.read_text())}
    assert found <= allowed, found - allowed


def test_host_keys_built_from_parts_match_the_table():
    from perfcheck.hardware import host_keys as hk
    from perfcheck.hardware.systems import HOST_KEYS

    # hand-written references: the names a spec file carries
    assert hk.optim_step_key("sgd") == "optim_step_s"
    assert hk.optim_step_key(hk.optim_line("adam", "fused")) == "optim_adam_foreach_step_s"
    assert hk.optim_per_tensor_key(hk.optim_line("sgd", "for-loop")) == "optim_sgd_per_tensor_s"
    assert hk.zero_key(2, "step", "tensor") == "zero2_step_tensor_s"
    assert hk.zero_key(3, "bwd", "module") == "zero3_bwd_module_s"
    assert hk.op_cold_key("bf16") == "op_cold_bf16_s" and hk.op_cold_key() == "op_cold_s"
    built = ({hk.optim_step_key(x) for x in hk.OPTIM_LINES} | {hk.optim_per_tensor_key(x) for x in hk.OPTIM_LINES}
             | {hk.zero_key(s, p, t) for s in hk.ZERO_STAGES for p in hk.ZERO_PHASES for t in ("", "tensor")}
             | {hk.zero_key(3, p, "module") for p in ("fwd", "bwd")} | {hk.zero_key(3, p, "gather") for p in hk.ZERO_PHASES})
    assert built <= set(HOST_KEYS)
    family = {k for k in HOST_KEYS if re.fullmatch(r"optim_.*|zero\d_.*", k)}
    assert family == built  # every optimizer/ZeRO key of the table is one host_keys builds


def test_no_host_key_is_built_by_an_f_string_outside_host_keys():
    pattern = re.compile(r'f"(zero\{|optim_\{|op_cold_\{)')
    found = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if pattern.search(p.read_text())}
    assert found <= {"hardware/host_keys.py"}, found


@pytest.mark.parametrize("name,want", [("fp32", torch.float32), ("float32", torch.float32), ("half", torch.float16),
                                       ("bf16", torch.bfloat16), ("torch.bfloat16", torch.bfloat16),
                                       ("tf32", torch.float32), ("double", torch.float64), (torch.float16, torch.float16)])
def test_torch_dtype_is_the_one_parser(name, want):
    from perfcheck.hardware.systems import torch_dtype

    assert torch_dtype(name) is want


@pytest.mark.parametrize("bad", ["fp8", "int8", "fp31"])
def test_torch_dtype_refuses_a_name_without_a_storage_dtype(bad):
    from perfcheck.errors import UserError
    from perfcheck.hardware.systems import torch_dtype

    with pytest.raises(UserError, match="^dtype: unknown"):
        torch_dtype(bad)


def test_estimate_refuses_tf32_as_a_tensor_dtype():
    from perfcheck.errors import UserError
    from perfcheck.predict.estimate import estimate

    with pytest.raises(UserError, match="^dtype: 'tf32'"):
        estimate(torch.nn.Linear(2, 2), (torch.randn(1, 2),), system="h100-sxm", dtype="tf32")


def test_calibration_case_labels_are_the_ones_the_fit_reads():
    """The host cases cases.py builds carry the labels case_names defines (written here by hand) and fit.py reads."""
    from perfcheck.calibrate import case_names as names
    from perfcheck.calibrate.cases import OPTIM_CASES, host_cases, launch_cases

    labels = {(c.kind, c.label) for c in host_cases("cpu", chain=4) + launch_cases("cpu", chain=4)}
    for want in [("host", "view"), ("host", "module call"), ("host", "autograd forward x4"),
                 ("host", "plain forward x4"), ("launch", "op"), ("launch", "autograd")]:
        assert want in labels
    assert any(k == "host" and lab.startswith("forward+backward x") for k, lab in labels)
    for line, _, _ in OPTIM_CASES:
        assert any(k == "host" and re.fullmatch(rf"optim {line} x\d+", lab) for k, lab in labels)
    assert names.is_label("optim adam_foreach x16", names.optim_label, "adam_foreach")
    assert not names.is_label("optim adam x16", names.optim_label, "adam_foreach")
    assert names.is_label("autograd forward x32", names.chain_label, True)
    assert names.count_of("round-robin x14") == 14 and names.count_of("view") == 0
    assert names.aligned_twin(names.gemm_align_label(False, "bwd", 4, 8, 5)) == "aligned bwd 4x8x5"
