"""`perfcheck estimate` through perfcheck.commands.cli.main: both front-ends, formats, and every bad input
(exit code 2, one line naming the field)."""
import io
import json

import pandas as pd
import pytest

from perfcheck.commands.cli import main


def run(capsys, *argv):
    code = main(["estimate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_estimates_gpt2_on_h100(capsys):
    code, out, err = run(capsys)
    assert code == 0 and err == ""
    assert out.startswith("gpt2-124m: 12 layers") and "h100-sxm" in out
    for text in ("qkv_proj", "lm_head", "step time", "MFU / HFU", "memory per GPU"):
        assert text in out


def test_model_layout_flags_reach_the_estimate(capsys):
    code, out, _ = run(capsys, "--model", "gpt3-175b", "--tp", "8", "--sp", "--pp", "8", "--dp", "16", "--zero", "1",
                       "--micro-batches", "16", "--system", "a100-80gb-sxm", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["parallel"]["tp"] == 8 and doc["parallel"]["sp"] is True and doc["parallel"]["zero_stage"] == 1
    rows = {r["sublayer"]: r for r in doc["sublayers"]}
    assert rows["qkv_proj"]["count"] == 12 and rows["qkv_proj"]["comm_fwd_kind"] == "allgather"
    assert doc["step"]["world_size"] == 1024 and 0 < doc["step"]["bubble_fraction"] < 1


def test_csv_and_output_file(capsys, tmp_path):
    code, out, _ = run(capsys, "--model", "llama-7b", "--batch", "2", "--seq", "512", "--causal", "--format", "csv")
    assert code == 0
    frame = pd.read_csv(io.StringIO(out))
    assert "rotary" in set(frame.sublayer) and frame.loc[frame.sublayer == "fc1", "macs_fwd"].item() == 2 * 512 * 4096 * 2 * 11008
    target = tmp_path / "est.csv"
    code, out, err = run(capsys, "--model", "llama-7b", "--format", "csv", "--output", str(target))
    assert code == 0 and out == "" and "wrote" in err
    assert pd.read_csv(target).shape[0] == frame.shape[0]


def test_module_front_end(capsys):
    code, out, _ = run(capsys, "--module", "perfcheck.examples.models:Net", "--input-shape", "8,3,32,32")
    assert code == 0 and "conv1" in out and "fc3" in out
    code, out, _ = run(capsys, "--module", "perfcheck.examples.models:Net", "--input-shape", "8,3,32,32", "--format", "csv")
    frame = pd.read_csv(io.StringIO(out)).set_index("module")
    assert frame.loc["(root)", "macs_fwd"] == 5_213_760  # DeepSpeed's Flops Profiler count for LeNet, 5.21 MMACs
    code, out, _ = run(capsys, "--module", "perfcheck.examples.models:GPT", "--input-shape", "2,64:int64",
                       "--format", "json", "--system", "a100-40gb-sxm")
    assert code == 0 and json.loads(out)["modules"][0]["module"] == "(root)"


@pytest.mark.parametrize("argv, field", [
    (["--system", "no-such-gpu"], "system"),
    (["--model", "no-such-model"], "model"),
    (["--batch", "-1"], "batch"),
    (["--seq", "0"], "seq"),
    (["--tp", "5"], "tp"),
    (["--tp", "0"], "tp"),
    (["--zero", "5"], "zero_stage"),
    (["--sp"], "sp"),
    (["--pp", "2", "--zero", "3"], "zero_stage"),
    (["--dtype", "int8"], "dtype"),
    (["--tp-overlap", "2"], "tp_overlap"),
    (["--input-shape", "1,2"], "--module"),
    (["--model", "gpt2-124m", "--module", "perfcheck.examples.models:Net"], "--model or --module"),
    (["--module", "perfcheck.examples.models:Net"], "--input-shape"),
    (["--module", "perfcheck.examples.models:Net", "--input-shape", "8,3,16,16"], "--input-shape: the model rejected them"),
    (["--module", "perfcheck.examples.models:Net", "--input-shape", "8,3,x,32"], "--input-shape"),
    (["--module", "perfcheck.examples.models:Net", "--input-shape", "8,-3,32,32"], "--input-shape"),
    (["--module", "perfcheck.examples.models:Net", "--input-shape", "8,3,32,32", "--tp", "2"], "--tp"),
    (["--module", "perfcheck.examples.models:Net", "--input-shape", "8,3,32,32", "--input-dtype", "float99"], "--input-dtype"),
    (["--module", "no_such_package.models:Net", "--input-shape", "1"], "cannot import"),
    (["--module", "perfcheck.examples.models:Nope", "--input-shape", "1"], "no attribute"),
    (["--module", "perfcheck.examples.models", "--input-shape", "1"], "package.module:callable"),
    (["--module", "perfcheck.examples.models:EXAMPLES", "--input-shape", "1"], "not callable"),
    (["--module", "perfcheck.examples.models:_lm_loss", "--input-shape", "1"], "failed"),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, field):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("perfcheck estimate: error:") and field in err, err


def test_bad_model_files_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = run(capsys, "--model", str(bad))
    assert code == 2 and "malformed JSON" in err and str(bad) in err
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({"name": "x", "layers": 1, "hidden": 8, "heads": 2, "ffn_hidden": 32, "vocab": 10,
                                 "seq_len": 4, "norm": "layernorm", "activation": "gelu", "bias": True,
                                 "tied_embeddings": True, "n_experts": 8}))
    code, _, err = run(capsys, "--model", str(extra))
    assert code == 2 and "'n_experts'" in err


def test_unwritable_output_exits_2(capsys, tmp_path):
    code, _, err = run(capsys, "--output", str(tmp_path / "no" / "such" / "dir.txt"))
    assert code == 2 and "--output" in err
