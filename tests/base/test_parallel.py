"""ParallelConfig / ZeroStage: degrees, validation messages, model divisibility, node spans."""
import dataclasses

import numpy as np
import pandas as pd
import pytest

from perfcheck.errors import UserError
from perfcheck.parallel import ParallelConfig, ZeroStage


def test_defaults_and_world_size():
    assert ParallelConfig().world_size == 1
    cfg = ParallelConfig(tp=4, pp=2, dp=8, zero_stage=1)
    assert cfg.world_size == 64 and cfg.zero_stage is ZeroStage.OPTIMIZER_STATES


def test_zero_stage_enum_matches_deepspeed():
    assert [int(s) for s in ZeroStage] == [0, 1, 2, 3]
    assert [s.name for s in ZeroStage] == ["DISABLED", "OPTIMIZER_STATES", "GRADIENTS", "WEIGHTS"]
    docs = [s.__doc__ for s in ZeroStage]
    assert all(d and d.strip() for d in docs) and len(set(docs)) == 4
    assert ZeroStage(3).shards_parameters and not ZeroStage(2).shards_parameters
    assert ZeroStage(2).shards_gradients and not ZeroStage(1).shards_gradients
    assert ZeroStage(1).shards_optimizer_states and not ZeroStage(0).shards_optimizer_states


@pytest.mark.parametrize("kwargs,field", [
    ({"tp": 0}, "tp"), ({"dp": -2}, "dp"), ({"pp": 1.5}, "pp"), ({"tp": True}, "tp"),
    ({"micro_batches": 0}, "micro_batches"), ({"grad_accum_steps": "4"}, "grad_accum_steps"),
    ({"zero_stage": 4}, "zero_stage"), ({"zero_stage": -1}, "zero_stage"), ({"zero_stage": True}, "zero_stage"),
    ({"sp": True}, "sp"), ({"tp": 2, "sp": 1}, "sp"),
    ({"pp": 2, "zero_stage": 2}, "zero_stage"), ({"pp": 4, "zero_stage": 3}, "zero_stage"),
    ({"dp": 16, "nodes": 3, "gpus_per_node": 8}, "nodes * gpus_per_node"),
    ({"dp": 16, "nodes": 3}, "nodes"), ({"dp": 12, "gpus_per_node": 8}, "gpus_per_node"),
    ({"nodes": 0}, "nodes"), ({"tp": np.bool_(True)}, "tp"), ({"dp": np.float64(2.0)}, "dp"), ({"pp": np.int64(0)}, "pp"), ({"tp": np.timedelta64(2, "ns")}, "tp"),
])
def test_validation_names_the_field(kwargs, field):
    with pytest.raises(UserError) as info:
        ParallelConfig(**kwargs)
    assert field in str(info.value) and "\n" not in str(info.value)


def test_a_dataframes_numpy_cells_are_accepted_as_python_values():
    """A layout read from a CSV carries numpy integers and bools; they are the same layout, stored as Python's."""
    row = pd.DataFrame({"tp": [2], "pp": [4], "dp": [8], "micro_batches": [16], "nodes": [8]}).iloc[0]
    cfg = ParallelConfig(tp=row.tp, pp=row.pp, dp=row.dp, sp=row.tp > 1, micro_batches=row.micro_batches,
                         nodes=row.nodes, gpus_per_node=np.int32(8))
    assert cfg == ParallelConfig(tp=2, pp=4, dp=8, sp=True, micro_batches=16, nodes=8, gpus_per_node=8)
    assert all(type(getattr(cfg, f)) is int for f in ("tp", "pp", "dp", "micro_batches", "nodes", "gpus_per_node"))
    assert type(cfg.sp) is bool


def test_valid_edge_cases():
    assert ParallelConfig(tp=2, sp=True).sp
    assert ParallelConfig(pp=4, zero_stage=1, micro_batches=8).world_size == 4   # ZeRO-1 works with PP
    assert ParallelConfig(dp=4, gpus_per_node=8).num_nodes() == 1              # a partial node is fine
    assert ParallelConfig(dp=16, nodes=2, gpus_per_node=8).num_nodes() == 2
    assert ParallelConfig(dp=32).num_nodes(gpus_per_node=8) == 4
    assert ParallelConfig(zero_stage="2").zero_stage is ZeroStage.GRADIENTS


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ParallelConfig().tp = 2


@pytest.mark.parametrize("cfg,kwargs,field", [
    (ParallelConfig(tp=8), {"num_heads": 12}, "num_heads"),
    (ParallelConfig(tp=8), {"num_heads": 16, "hidden": 1004}, "hidden"),
    (ParallelConfig(tp=8, sp=True), {"seq_len": 1020}, "seq_len"),
    (ParallelConfig(pp=3), {"layers": 32}, "layers"),
    (ParallelConfig(tp=2), {"num_heads": 0}, "num_heads"),
])
def test_validate_for_model_rejects(cfg, kwargs, field):
    with pytest.raises(UserError) as info:
        cfg.validate_for_model(**kwargs)
    assert field in str(info.value) and "\n" not in str(info.value)


def test_validate_for_model_accepts():
    cfg = ParallelConfig(tp=8, sp=True, pp=4, dp=2)
    assert cfg.validate_for_model(num_heads=32, hidden=4096, seq_len=2048, layers=32) is cfg
    # Without sp the sequence need not divide by tp.
    assert ParallelConfig(tp=8).validate_for_model(seq_len=1023)


def test_from_mapping_round_trip_and_unknown_keys():
    cfg = ParallelConfig.from_mapping({"tp": 2, "dp": 4, "zero_stage": 3, "grad_accum_steps": 8})
    assert cfg == ParallelConfig(tp=2, dp=4, zero_stage=ZeroStage.WEIGHTS, grad_accum_steps=8)
    assert ParallelConfig.from_mapping(cfg.to_dict()) == cfg
    assert cfg.to_dict()["zero_stage"] == 3 and type(cfg.to_dict()["zero_stage"]) is int
    with pytest.raises(UserError, match=r"'tensor_parallel'.*'zero'"):
        ParallelConfig.from_mapping({"tensor_parallel": 2, "zero": 1})
    with pytest.raises(UserError, match="mapping"):
        ParallelConfig.from_mapping([("tp", 2)])


@pytest.mark.parametrize("cfg,dim,expected", [
    (ParallelConfig(tp=8, dp=4), "tp", False),    # ranks 0-7: one node
    (ParallelConfig(tp=8, dp=4), "dp", True),     # ranks 0, 8, 16, 24: four nodes
    (ParallelConfig(tp=2, dp=4), "dp", False),    # ranks 0, 2, 4, 6: one node
    (ParallelConfig(tp=16), "tp", True),
    (ParallelConfig(tp=4, pp=4), "pp", True),
    (ParallelConfig(tp=1, dp=16), "tp", False),   # a group of one never communicates
])
def test_spans_nodes_megatron_layout(cfg, dim, expected):
    assert cfg.spans_nodes(dim, gpus_per_node=8) is expected


def test_spans_nodes_needs_gpus_per_node():
    with pytest.raises(UserError, match="gpus_per_node"):
        ParallelConfig(dp=2).spans_nodes("dp")
    with pytest.raises(UserError, match="'ep'"):
        ParallelConfig().spans_nodes("ep", 8)
    assert ParallelConfig(dp=16, gpus_per_node=4).spans_nodes("dp")
