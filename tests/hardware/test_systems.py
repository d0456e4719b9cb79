"""Systems as data: datasheet figures, sources, validation, JSON round trip, the `systems` CLI."""
import dataclasses
import json
import subprocess
import sys

import pandas as pd
import pytest
import torch

from perfcheck.commands.cli import main
from perfcheck.errors import UserError
from perfcheck.hardware.systems import EFFICIENCY_KEYS, list_systems, load_system, systems_table

REQUIRED_SYSTEMS = ["v100-sxm", "a100-40gb-sxm", "a100-80gb-sxm", "a100-80gb-pcie", "a100-40gb-pcie",
                    "h100-sxm", "h100-pcie", "h200", "l4", "mi300x", "cpu"]
NUMERIC_FIELDS = ["matrix_flops_per_s", "vector_flops_per_s", "mem_bandwidth_bytes_per_s", "mem_capacity_bytes",
                  "intra_node_bandwidth_bytes_per_s", "gpus_per_node", "inter_node_bandwidth_bytes_per_s",
                  "launch_overhead_s"]


def test_all_required_systems_are_built_in():
    assert set(REQUIRED_SYSTEMS) <= set(list_systems())


@pytest.mark.parametrize("name", REQUIRED_SYSTEMS)
def test_every_number_has_a_source(name):
    spec = load_system(name)
    assert spec.name == name and not spec.calibrated
    for field in NUMERIC_FIELDS:
        assert spec.sources.get(field, "").strip(), f"{name}: {field} has no source"
    for key in spec.efficiency:
        assert (spec.sources.get(f"efficiency.{key}") or spec.sources.get("efficiency")), f"{name}: efficiency.{key}"


# Dense datasheet peaks, written out by hand from the datasheets (sparse figures halved).
@pytest.mark.parametrize("name,dtype,flops", [
    ("h100-sxm", "bf16", 989.4e12), ("h100-sxm", "fp8", 3957.8e12 / 2), ("h100-sxm", "tf32", 989.4e12 / 2),
    ("h200", "bf16", 989.4e12), ("a100-80gb-sxm", "bf16", 312e12), ("a100-40gb-pcie", "tf32", 156e12),
    ("h100-pcie", "bf16", 1513e12 / 2), ("l4", "fp16", 242e12 / 2), ("l4", "fp8", 485e12 / 2),
    ("mi300x", "bf16", 1307.4e12), ("v100-sxm", "fp16", 125e12), ("v100-sxm", "fp32", 15.7e12),
])
def test_dense_matrix_peaks(name, dtype, flops):
    assert load_system(name).matrix_peak(dtype) == pytest.approx(flops, rel=1e-3)


@pytest.mark.parametrize("name", [n for n in REQUIRED_SYSTEMS if n not in ("v100-sxm", "cpu")])
def test_peaks_double_per_precision_step(name):
    # tf32 -> bf16 -> fp8 doubles on every tensor-core generation listed; a sparse figure slipped
    # into one dtype would show up here as a 4x or 1x step.
    m = load_system(name).matrix_flops_per_s
    assert m["bf16"] == m["fp16"]
    assert m["bf16"] / m["tf32"] == pytest.approx(2, rel=0.01)
    if "fp8" in m:
        assert m["fp8"] / m["bf16"] == pytest.approx(2, rel=0.01)


@pytest.mark.parametrize("name,intra_bidirectional,inter_bits", [
    ("h100-sxm", 900e9, 400e9), ("h200", 900e9, 400e9), ("a100-80gb-sxm", 600e9, 200e9), ("v100-sxm", 300e9, 50e9),
])
def test_links_are_one_direction_per_gpu(name, intra_bidirectional, inter_bits):
    spec = load_system(name)
    assert spec.intra_node_bandwidth_bytes_per_s == intra_bidirectional / 2
    assert spec.inter_node_bandwidth_bytes_per_s == inter_bits / 8


def test_memory_figures():
    assert load_system("h100-sxm").mem_bandwidth_bytes_per_s == 3.35e12
    assert load_system("h200").mem_capacity_bytes == 141e9
    assert load_system("a100-80gb-sxm").mem_bandwidth_bytes_per_s == 2039e9
    assert load_system("a100-80gb-pcie").mem_bandwidth_bytes_per_s == 1935e9


def test_efficiencies_follow_the_mamf_table():
    assert load_system("a100-80gb-sxm").efficiency["matrix"] == 0.87   # 271.2 / 312
    assert load_system("h100-sxm").efficiency["matrix"] == 0.8         # 794.5 / 989
    # times the sustained factor 0.904 (a 40-second GEMM loop on an H100: bench/results/h100_gemm_shapes.json)
    assert load_system("h100-sxm").matrix_efficiency("fp8") == pytest.approx(0.71 * 0.904)    # 1402.6 / 1979
    assert load_system("h100-sxm").matrix_efficiency(torch.bfloat16) == pytest.approx(0.8 * 0.904)
    assert load_system("mi300x").efficiency["matrix"] == 0.514          # 668.4 / 1300


def test_cpu_entry_is_labelled_rough():
    spec = load_system("cpu")
    assert spec.kind == "cpu" and "rough" in spec.description.lower() and "calibrate" in spec.description


@pytest.mark.parametrize("dtype", [torch.bfloat16, "bf16", "bfloat16", "torch.bfloat16", "BF16"])
def test_matrix_peak_accepts_torch_and_strings(dtype):
    assert load_system("a100-80gb-sxm").matrix_peak(dtype) == 312e12


def test_fp8_and_fp32_aliases():
    spec = load_system("h100-sxm")
    assert spec.matrix_peak(torch.float8_e4m3fn) == spec.matrix_peak("fp8") == 1978.9e12
    assert spec.matrix_peak(torch.float32) == spec.matrix_peak("float32") == 66.9e12


def test_missing_dtype_names_system_and_dtype():
    with pytest.raises(UserError, match=r"v100-sxm.*bf16"):
        load_system("v100-sxm").matrix_peak(torch.bfloat16)
    with pytest.raises(UserError, match=r"a100-80gb-sxm.*fp8"):
        load_system("a100-80gb-sxm").matrix_peak("fp8")
    with pytest.raises(UserError, match="int64"):
        load_system("h100-sxm").matrix_peak(torch.int64)


def test_vector_peak_fallbacks():
    spec = load_system("h100-sxm")
    assert spec.vector_peak("bf16") == 133.8e12
    assert spec.vector_peak("tf32") == spec.vector_peak("fp32") == 66.9e12  # TF32 exists only in tensor cores
    assert spec.vector_peak(torch.float8_e5m2) == spec.vector_peak("fp16")
    with pytest.raises(UserError, match=r"v100-sxm.*bf16"):
        load_system("v100-sxm").vector_peak("bf16")


@pytest.mark.parametrize("name", REQUIRED_SYSTEMS)
def test_json_round_trip(name, tmp_path):
    spec = load_system(name)
    path = spec.save(tmp_path / f"copy-{name}.json")
    again = load_system(str(path))
    assert again == spec and hash(again) == hash(spec)
    assert again.to_json_dict() == json.loads(path.read_text())


def test_round_trip_with_curve(tmp_path):
    spec = dataclasses.replace(load_system("h100-sxm"), name="mine", calibrated=True,
                               matrix_efficiency_curve=[[1e6, 0.1], [1e9, 0.5], [1e12, 0.85]])
    assert spec.matrix_efficiency_curve == ((1e6, 0.1), (1e9, 0.5), (1e12, 0.85))
    assert load_system(spec.save(tmp_path / "mine.json")) == spec


def test_load_system_accepts_a_spec():
    spec = load_system("l4")
    assert load_system(spec) is spec


def test_spec_is_frozen_and_read_only():
    spec = load_system("h100-sxm")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.gpus_per_node = 4
    with pytest.raises(TypeError):
        spec.matrix_flops_per_s["bf16"] = 1.0
    with pytest.raises(TypeError):
        spec.efficiency["matrix"] = 1.0


def _h100_dict():
    return load_system("h100-sxm").to_json_dict()


def _set(path, value):
    def mutate(d):
        *parents, last = path.split(".")
        for p in parents:
            d = d[p]
        d[last] = value
    return mutate


def _delete(key):
    def mutate(d):
        del d[key]
    return mutate


def _add(key, value):
    def mutate(d):
        d[key] = value
    return mutate


@pytest.mark.parametrize("mutate,field", [
    (_add("peak_tflops", 1), "peak_tflops"),
    (_delete("mem_bandwidth_bytes_per_s"), "mem_bandwidth_bytes_per_s"),
    (_set("mem_bandwidth_bytes_per_s", -3.35e12), "mem_bandwidth_bytes_per_s"),
    (_set("mem_capacity_bytes", 0), "mem_capacity_bytes"),
    (_set("inter_node_bandwidth_bytes_per_s", "fast"), "inter_node_bandwidth_bytes_per_s"),
    (_set("intra_node_bandwidth_bytes_per_s", True), "intra_node_bandwidth_bytes_per_s"),
    (_set("launch_overhead_s", -1e-6), "launch_overhead_s"),
    (_set("gpus_per_node", 2.5), "gpus_per_node"),
    (_set("gpus_per_node", 0), "gpus_per_node"),
    (_set("matrix_flops_per_s.bf16", 0), "matrix_flops_per_s.bf16"),
    (_set("matrix_flops_per_s.int8", 1e15), "int8"),
    (_set("efficiency.matrix", 1.2), "efficiency.matrix"),
    (_set("efficiency.memory", 0), "efficiency.memory"),
    (_set("efficiency.matrix_fp8", 1.5), "efficiency.matrix_fp8"),
    (_set("efficiency.speed", 0.5), "speed"),
    (lambda d: d["efficiency"].pop("inter_node"), "inter_node"),
    (_set("matrix_efficiency_curve", [[1e9, 0.5], [1e6, 0.2]]), "matrix_efficiency_curve"),
    (_set("matrix_efficiency_curve", [[1e9, 0.5], [1e9, 0.6]]), "matrix_efficiency_curve"),
    (_set("matrix_efficiency_curve", [[1e9, 1.5]]), "matrix_efficiency_curve[0][1]"),
    (_set("matrix_efficiency_curve", [[1e9]]), "matrix_efficiency_curve[0]"),
    (_set("kind", "tpu"), "kind"),
    (_set("calibrated", "yes"), "calibrated"),
    (_set("sources.peak", "somewhere"), "peak"),
])
def test_validation_names_the_bad_field_in_one_line(mutate, field, tmp_path):
    data = _h100_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError) as info:
        load_system(str(path))
    message = str(info.value)
    assert "\n" not in message
    assert field in message and "bad.json" in message


def test_malformed_json_names_file_and_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "name": "x",\n  "kind": gpu\n}\n')
    with pytest.raises(UserError, match=r"broken\.json.*line 3"):
        load_system(str(path))


def test_unknown_name_lists_known_systems():
    with pytest.raises(UserError) as info:
        load_system("h100-sxmm")
    assert "h100-sxmm" in str(info.value) and "h100-sxm," in str(info.value) and "\n" not in str(info.value)


def test_missing_file_and_non_object(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_system(str(tmp_path / "nope.json"))
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(UserError, match="JSON object"):
        load_system(str(path))


def test_replace_revalidates():
    with pytest.raises(UserError, match="efficiency.vector"):
        dataclasses.replace(load_system("h100-sxm"), efficiency={**load_system("h100-sxm").efficiency, "vector": 2})


def test_systems_table():
    frame = systems_table()
    assert list(frame["name"]) == list_systems()
    row = frame.set_index("name").loc["h100-sxm"]
    assert row["matrix_bf16_flops_per_s"] == 989.4e12 and row["gpus_per_node"] == 8
    assert pd.isna(frame.set_index("name").loc["v100-sxm", "matrix_bf16_flops_per_s"])
    assert {f"efficiency_{k}" for k in EFFICIENCY_KEYS} <= set(frame.columns)


# ---- CLI --------------------------------------------------------------------------------------------
def test_cli_lists_systems(capsys):
    assert main(["systems"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in REQUIRED_SYSTEMS) and "989.4" in out


def test_cli_formats(capsys, tmp_path):
    assert main(["systems", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in data] == list_systems()
    out = tmp_path / "systems.csv"
    assert main(["systems", "--format", "csv", "--output", str(out)]) == 0
    assert len(pd.read_csv(out)) == len(list_systems())


def test_cli_shows_one_system_with_sources(capsys, tmp_path):
    assert main(["systems", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    assert "efficiency.matrix_fp8" in out and "MAMF" in out and "989.4 TFLOP/s" in out
    assert main(["systems", "a100-80gb-sxm", "--format", "json"]) == 0
    path = tmp_path / "a100.json"
    path.write_text(capsys.readouterr().out)
    assert load_system(str(path)) == load_system("a100-80gb-sxm")
    assert main(["systems", "l4", "--format", "csv"]) == 0
    assert "matrix_flops_per_s.fp8" in capsys.readouterr().out


def test_cli_unknown_system_exits_2_with_one_line(capsys):
    assert main(["systems", "h1000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown system 'h1000'" in err


def test_cli_subprocess_exit_code():
    proc = subprocess.run([sys.executable, "-m", "perfcheck", "systems", "nope"], capture_output=True, text=True)
    assert proc.returncode == 2 and "nope" in proc.stderr and proc.stdout == ""


def test_match_device_name_maps_driver_names_to_specs():
    from perfcheck.hardware.systems import match_device_name

    assert match_device_name("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert match_device_name("NVIDIA H100 PCIe") == "h100-pcie"
    assert match_device_name("NVIDIA A100-SXM4-80GB") == "a100-80gb-sxm"
    assert match_device_name("Tesla V100-SXM2-16GB") == "v100-sxm"
    assert match_device_name("AMD Instinct MI300X") == "mi300x"
    with pytest.raises(UserError, match="no built-in system matches"):
        match_device_name("Some Future Accelerator")
