"""The example GraphTransformer (PyG TransformerConv, heads=32; perfcheck.examples.graph) estimates,
and its message passing (per-edge gathers, scatter-adds, attention softmax over edges) is modelled as
memory-bound work with bytes, not dropped as DeepSpeed's profiler drops it."""
import pytest
import torch

import perfcheck
from perfcheck.schema import ROOT
from reference import flop_counter_by_module

pytest.importorskip("torch_geometric")
from perfcheck.examples.graph import GraphTransformer  # noqa: E402


def _graph(nodes, edges, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(nodes, 9, generator=g), torch.randint(0, nodes, (2, edges), generator=g)


def test_graph_transformer_parameter_count():
    # DeepSpeed's Flops Profiler printed 64.07 M params for this model:
    # 11 TransformerConv(heads=32, concat=False), 10 LayerNorm, Linear(256, 1). Built on the meta device: the
    # same parameters, shapes only (on the CPU, initializing 256 MB of weights took 0.8 s of a count).
    with torch.device("meta"):
        model = GraphTransformer()
    assert sum(p.numel() for p in model.parameters()) == 64_071_937


def test_graph_transformer_matches_flop_counter_and_models_message_passing():
    model = GraphTransformer(hidden=32, heads=4, layers=3)
    nodes, edges = 50, 400
    x, edge_index = _graph(nodes, edges)
    est = perfcheck.estimate(model, (x, edge_index), system="a100-80gb-sxm").set_index("module")
    ref = flop_counter_by_module(model, (x, edge_index))
    for path, (fwd, bwd) in ref.items():
        assert 2 * est.loc[path].macs_fwd == fwd, path
        if path == ROOT or (path.startswith(("convs.", "post_mp")) and path.count(".") == 1):
            assert 2 * est.loc[path].macs_bwd == bwd, path
    # Pass-through modules (Dropout(p=0), ReLU) get siblings' backward the same way. Inside a TransformerConv, lin_query/key/value/skip read the same tensor. FlopCounterMode's
    # module tracker opens a module's backward when its output's gradient arrives and closes it
    # when its input's gradient is ready; siblings sharing an input (and convs.0's Linears, whose
    # input needs no gradient, so the closing hook never fires) stay open together and are each
    # credited with the others' products. Per Linear, the hand count is the reference:
    # convs.0 computes weight gradients only (= forward MACs), later layers input + weight.
    for name in ("lin_query", "lin_key", "lin_value", "lin_skip"):
        row = est.loc[f"convs.0.{name}"]
        assert row.macs_bwd == row.macs_fwd == nodes * 9 * 32 * (4 if name != "lin_skip" else 1)
        row = est.loc[f"convs.1.{name}"]
        assert row.macs_bwd == 2 * row.macs_fwd == 2 * nodes * 32 * 32 * (4 if name != "lin_skip" else 1)
    assert (est["unmodeled_ops"] == "").all()
    conv = est.loc["convs.1"]
    linears = est.loc[[f"convs.1.{n}" for n in ("lin_query", "lin_key", "lin_value", "lin_skip")]]
    # The conv's own work beyond its Linear children: per-edge gathers of q_i, k_j, v_j
    # (edges * heads * hidden floats each), the edge softmax and the scatter-add into nodes.
    own_bytes = conv.bytes_fwd - linears.bytes_fwd.sum()
    per_edge_floats = edges * 4 * 32
    assert own_bytes >= 3 * 2 * per_edge_floats * 4  # three gathers, each read+write of fp32
    assert conv.flops_fwd > 2 * conv.macs_fwd  # the edge attention's elementwise FLOPs are counted
    assert est.loc[ROOT].params == sum(p.numel() for p in model.parameters())
