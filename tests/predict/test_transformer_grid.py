"""2D (Optimus), 2.5D (Tesseract) and 3D tensor parallelism in the transformer front-end (issue #13).

References: Xu et al. 2021 (arXiv 2104.05343), Wang et al. 2021 (arXiv 2105.14500), Bian et al.
2021 (arXiv 2105.14450), and Colossal-AI's implementation and documentation of the three
(hpcaitech/ColossalAI, docs/source/en/features/{2D,2p5D,3D}_tensor_parallel.md), whose worked
example is a two-layer MLP 256 -> 1024 -> 256 on a (16, 256) input:
  2D,   q = 2 (4 GPUs):        weights [128, 512] and [512, 128]; input [8, 128]; outputs [8, 512], [8, 128]
  2.5D, q = 2, d = 2 (8 GPUs): weights [128, 512] and [512, 128]; input [4, 128]; outputs [4, 512], [4, 128]
  3D,   q = 2 (8 GPUs):        weights [128, 256] and [512, 64];  input [4, 128]; outputs [4, 512], [4, 128]
and whose efficiency tables give parameters per GPU O(1/q^2), O(1/q^2), O(1/q^3).
"""
import json

import pandas as pd
import pytest

from perfcheck.errors import UserError
from perfcheck.hardware.systems import load_system
from perfcheck.predict import collectives
from perfcheck.predict.transformer import estimate_transformer, load_model, sweep_transformer, transformer_step

# The docs' MLP inside a transformer layer: e = 256, f = 1024, no biases (so a weight block is
# exactly the printed shape), 16 tokens = 16 sequences of length 1 (the grid schemes split the batch).
MLP_DOC = dict(name="colossal-doc-mlp", layers=1, hidden=256, heads=8, ffn_hidden=1024, vocab=512, seq_len=1,
               norm="layernorm", activation="gelu", bias=False, tied_embeddings=True, dropout=0.1)
EB = 2  # bf16
LAYOUTS = {"2d": (dict(tp=4), {}), "2.5d": (dict(tp=8), dict(tp_depth=2)), "3d": (dict(tp=8), {})}


def _table(scheme, model=MLP_DOC, batch=16, seq=None, **kw):
    par, extra = LAYOUTS[scheme]
    return estimate_transformer(load_model(model), batch=batch, seq=seq, parallel=par, tp_scheme=scheme,
                                dtype="bf16", **extra, **kw).set_index("sublayer")


@pytest.mark.parametrize("scheme, w1, w2, x_in, y1", [
    ("2d", 128 * 512, 512 * 128, 8 * 128, 8 * 512),
    ("2.5d", 128 * 512, 512 * 128, 4 * 128, 4 * 512),
    ("3d", 128 * 256, 512 * 64, 4 * 128, 4 * 512),
])
def test_weight_and_activation_blocks_are_colossal_ai_worked_shapes(scheme, w1, w2, x_in, y1):
    tab = _table(scheme)
    assert tab.loc["fc1", "params"] == w1 and tab.loc["fc2", "params"] == w2
    assert tab.loc["act", "act_mem"] == y1 * EB  # GELU keeps its input: fc1's output block
    # the layer's output block (x_in elements, like its input): dropout_mlp keeps a 1-byte mask of it
    assert tab.loc["dropout_mlp", "act_mem"] == x_in * 1
    if scheme == "3d":  # 3D keeps the all-gathered input of fc1, (T/q, in/q) = (8, 128), for dW
        assert tab.loc["fc1", "act_mem"] == 8 * 128 * EB
    else:  # SUMMA keeps the local X block
        assert tab.loc["fc1", "act_mem"] == x_in * EB


def test_summa_and_3d_collective_bytes_by_hand():
    # fc1 (16 tokens, 256 -> 1024), bf16, q = 2.
    # 2D: X block 8 x 128 = 1,024 el, W block 128 x 512 = 65,536 el; forward = q broadcasts of each:
    #     2 * (1,024 + 65,536) * 2 B = 266,240 B; backward: dX (broadcast W, reduce dX) and
    #     dW (broadcast X, reduce dW), the same blocks again: 2 * 266,240 = 532,480 B.
    t2 = _table("2d").loc["fc1"]
    assert (t2.comm_fwd_bytes, t2.comm_fwd_kind) == (266_240, "broadcast")
    assert (t2.comm_bwd_bytes, t2.comm_bwd_kind) == (532_480, "broadcast+reduce")
    # 2.5D (d = 2): X block 4 x 128 = 512 el: forward 2 * (512 + 65,536) * 2 = 264,192 B; backward twice
    #     that plus the all-reduce of the W-gradient block over the depth: 65,536 * 2 = 131,072 B.
    t25 = _table("2.5d").loc["fc1"]
    assert t25.comm_fwd_bytes == 264_192 and t25.comm_bwd_bytes == 2 * 264_192 + 131_072 == 659_456
    assert t25.comm_bwd_kind == "allreduce+broadcast+reduce"
    # 3D: all-gather X -> 8 x 128 = 1,024 el, all-gather W -> 128 x 512 = 65,536 el, reduce-scatter
    #     Y from 8 x 512 = 4,096 el: (1,024 + 65,536 + 4,096) * 2 = 141,312 B; backward all-gathers dY
    #     (4,096) and reduce-scatters dX (1,024) and dW (65,536): the same 141,312 B.
    t3 = _table("3d").loc["fc1"]
    assert t3.comm_fwd_bytes == t3.comm_bwd_bytes == 141_312
    assert t3.comm_fwd_kind == t3.comm_bwd_kind == "allgather+reducescatter"


def test_grid_collective_times_use_the_ring_formulas_over_the_right_groups():
    spec = load_system("h100-sxm")
    ct = collectives.collective_time_s
    t2 = _table("2d").loc["fc1"]  # forward: one row of broadcasts over the q = 2 ranks of a grid row/column
    assert t2.t_comm_fwd_s == pytest.approx(ct("broadcast", 266_240, 2, spec))
    assert t2.t_comm_bwd_s == pytest.approx(ct("broadcast", 266_240, 2, spec) + ct("reduce", 266_240, 2, spec))
    # 2.5D with d = 4 (tp = 16, q = 2): the depth all-reduce runs over 4 ranks, the SUMMA steps over 2
    tab = estimate_transformer(load_model(MLP_DOC), batch=16, parallel=dict(tp=16), tp_scheme="2.5d", tp_depth=4,
                               dtype="bf16").set_index("sublayer").loc["fc1"]
    x_blk, w_blk = 16 / 8 * 128, 128 * 512  # 8-way token split (d*q), q-way feature split
    summa = 2 * (x_blk + w_blk) * EB
    assert tab.t_comm_bwd_s == pytest.approx(ct("broadcast", summa, 2, spec) + ct("reduce", summa, 2, spec)
                                             + ct("allreduce", w_blk * EB, 4, spec))


@pytest.mark.parametrize("scheme, tp, depth, b", [("2d", 4, 1, 8), ("2d", 16, 1, 8), ("2.5d", 8, 2, 8),
                                                  ("2.5d", 16, 4, 8), ("3d", 8, 1, 8), ("3d", 64, 1, 16)])
@pytest.mark.parametrize("flash", [False, True])
def test_grid_gpus_together_do_the_unsharded_layers_work(scheme, tp, depth, b, flash):
    """tp GPUs of any grid do the unsharded layer's matrix work between them (linears and the
    attention core), and hold its residual stream once (every element-wise row is split tp ways)."""
    m = load_model("gpt3-175b")
    kw = dict(batch=b, seq=256, dtype="bf16", flash=flash)
    one = estimate_transformer(m, **kw)
    grid = estimate_transformer(m, parallel=dict(tp=tp), tp_scheme=scheme, tp_depth=depth, **kw)
    lay1, lay = one[one.stage == "layer"].set_index("sublayer"), grid[grid.stage == "layer"].set_index("sublayer")
    assert list(lay.index) == list(lay1.index)
    for phase in ("fwd", "bwd"):
        assert tp * lay[f"macs_{phase}"].sum() == pytest.approx(lay1[f"macs_{phase}"].sum(), rel=1e-12)
    for row in ("dropout_attn", "dropout_mlp"):  # 1-byte masks of (b, s, e)
        assert tp * lay.loc[row, "act_mem"] == lay1.loc[row, "act_mem"] == b * 256 * m.hidden


@pytest.mark.parametrize("scheme, tp, depth, per_gpu", [("2d", 16, 1, 1 / 16), ("2.5d", 16, 4, 1 / 4),
                                                        ("3d", 8, 1, 1 / 8), ("3d", 64, 1, 1 / 64)])
def test_linear_weights_per_gpu_follow_the_efficiency_tables(scheme, tp, depth, per_gpu):
    """Parameters per GPU: 1/q^2 (2D, q^2 = tp), 1/q^2 (2.5D: replicated over the depth, q^2 = tp/d),
    1/q^3 (3D, q^3 = tp) of the unsharded linears (no biases, so only the weight blocks count)."""
    m = dict(MLP_DOC, bias=False, layers=2, hidden=1024, heads=16, ffn_hidden=4096)
    one = estimate_transformer(load_model(m), batch=16, seq=1).set_index("sublayer")
    grid = estimate_transformer(load_model(m), batch=16, seq=1, parallel=dict(tp=tp), tp_scheme=scheme,
                                tp_depth=depth).set_index("sublayer")
    linears = ["qkv_proj", "out_proj", "fc1", "fc2"]
    assert grid.loc[linears, "params"].sum() == one.loc[linears, "params"].sum() * per_gpu


def test_grid_step_totals_and_sweep_agree():
    layouts = pd.DataFrame(dict(tp=[4, 16, 16], pp=[1, 2, 1], dp=[2, 1, 4], zero_stage=[1, 1, 3],
                                micro_batch=[8, 8, 16], micro_batches=[1, 4, 1]))
    out = sweep_transformer("gpt3-175b", layouts, tp_scheme="2d", recompute="full")
    for i, row in layouts.iterrows():
        one = transformer_step("gpt3-175b", batch=int(row.micro_batch), tp_scheme="2d", recompute="full",
                               parallel=dict(tp=int(row.tp), pp=int(row.pp), dp=int(row.dp),
                                             zero_stage=int(row.zero_stage), micro_batches=int(row.micro_batches)))
        for col in ("step_time_s", "tp_comm_bytes", "mem_total_bytes", "mfu"):
            assert out.loc[i, col] == pytest.approx(one.values[col], rel=1e-12), col
        # full recompute keeps each layer's input block: (b, s, e) split tp ways in every grid scheme
        assert one.act_per_layer_bytes == int(row.micro_batch) * 2048 * 12288 * 2 / int(row.tp)
        assert one.tp_comm_time_s > 0 and one.mfu > 0


@pytest.mark.parametrize("call, message", [
    (lambda: estimate_transformer("gpt2-124m", batch=8, parallel=dict(tp=8), tp_scheme="2d"), "tp must be a square"),
    (lambda: estimate_transformer("gpt2-124m", batch=8, parallel=dict(tp=8), tp_scheme="2.5d", tp_depth=3),
     "tp must be q\\*q\\*tp_depth with tp_depth = 3"),
    (lambda: estimate_transformer("gpt2-124m", batch=8, parallel=dict(tp=4), tp_scheme="3d"), "tp must be a cube"),
    (lambda: estimate_transformer("gpt2-124m", batch=1, parallel=dict(tp=4), tp_scheme="2d"), "batch"),
    (lambda: estimate_transformer("gpt2-124m", batch=8, parallel=dict(tp=4, sp=True), tp_scheme="2d"), "sp \\(sequence parallelism\\)"),
    (lambda: estimate_transformer("gpt2-124m", batch=8, parallel=dict(tp=4), tp_scheme="2d", tp_depth=2), "tp_depth"),
    (lambda: estimate_transformer("gpt2-124m", tp_depth=0), "tp_depth"),
    # 3D stores weights (in/q, out/q^2): q = 2 divides heads = 2, but q*q = 4 does not divide hidden = 6
    (lambda: estimate_transformer(dict(MLP_DOC, hidden=6, heads=2, ffn_hidden=8), batch=16, parallel=dict(tp=8),
                                  tp_scheme="3d"), "q\\*q \\(3D grid\\) does not divide hidden = 6"),
    (lambda: estimate_transformer("mixtral-8x7b", batch=8, parallel=dict(tp=4), tp_scheme="2d"), "mixture-of-experts"),
    (lambda: sweep_transformer("gpt2-124m", pd.DataFrame(dict(tp=[4, 6], pp=[1, 1], dp=[1, 1], zero_stage=[0, 0],
                                                              micro_batch=[8, 8])), tp_scheme="2d"),
     "row 1: tp must be a square"),
])
def test_bad_grid_layouts_are_one_line_errors_naming_the_field(call, message):
    with pytest.raises(UserError, match=message):
        call()


def test_cli_tp_scheme_flags(capsys):
    from perfcheck.commands.cli import main

    assert main(["estimate", "--model", "gpt3-175b", "--tp", "16", "--tp-scheme", "2.5d", "--tp-depth", "4",
                 "--batch", "8", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["tp_scheme"], doc["tp_depth"]) == ("2.5d", 4)
    api = estimate_transformer("gpt3-175b", batch=8, parallel=dict(tp=16), tp_scheme="2.5d", tp_depth=4)
    assert [r["comm_bwd_bytes"] for r in doc["sublayers"]] == api["comm_bwd_bytes"].tolist()
    assert main(["estimate", "--model", "gpt3-175b", "--tp", "8", "--tp-scheme", "3d", "--batch", "8"]) == 0
    assert "tp 8 (3d)" in capsys.readouterr().out
    assert main(["estimate", "--model", "gpt3-175b", "--tp", "6", "--tp-scheme", "2d", "--batch", "8"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "tp must be a square" in err
