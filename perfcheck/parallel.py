"""How a training step is split across devices: ``ParallelConfig`` (tp, sp, pp, dp, ZeRO stage).

A frozen dataclass validated on construction, raising ``perfcheck.errors.UserError`` with one line
that names the bad field (the torchtitan ``ParallelDims._validate`` style). Rank layout follows
Megatron-LM: tensor parallelism innermost (adjacent ranks), then data, then pipeline, so a TP group
stays inside a node whenever ``tp <= gpus_per_node``.
"""
from __future__ import annotations

import dataclasses
from enum import IntEnum
from typing import Any, Mapping, Optional

from perfcheck.errors import UserError, plain


#: Who issues the data-parallel collectives of a transformer step (``predict.step_config.Options.dp_engine``):
#: DeepSpeed ZeRO, Megatron-LM (DDP / distributed optimizer / FSDP), PyTorch DDP, FSDP2. Here, below every floor,
#: so that the CLI's parser offers them without importing the predictor (and torch).
DP_ENGINES = ("deepspeed", "megatron", "ddp", "fsdp2")
#: Who adds each micro-batch's gradients into the step's (``predict.grad_buffers``), here for the same reason.
GRAD_ACCUMULATIONS = ("none", "autograd", "main_grad")
#: Who runs the optimizer step (``predict.optimizer_passes``), here for the same reason.
OPTIMIZER_IMPLS = ("deepspeed", "fused", "megatron", "foreach", "for-loop", "torch-fused")
#: Canonical collective names (``predict.collectives``), here so that a system spec can name them
#: (``collective_busbw_curve``) without importing the predictor.
COLLECTIVE_KINDS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "sendrecv")


class ZeroStage(IntEnum):
    """DeepSpeed ZeRO stage (same values as ``deepspeed.runtime.zero.config.ZeroStageEnum``)."""

    def __new__(cls, value: int, doc: str):
        member = int.__new__(cls, value)
        member._value_ = value
        member.__doc__ = doc
        return member

    DISABLED = 0, "No partitioning: every data-parallel rank holds full parameters, gradients and optimizer states (plain DDP traffic: one gradient allreduce)."
    OPTIMIZER_STATES = 1, "Optimizer states partitioned across data-parallel ranks; gradients still allreduced, updated parameters allgathered."
    GRADIENTS = 2, "Optimizer states and gradients partitioned: gradients are reduce-scattered instead of allreduced, then parameters allgathered."
    WEIGHTS = 3, "Parameters partitioned too: each layer's parameters are allgathered before forward and again before backward, gradients reduce-scattered."

    @property
    def shards_optimizer_states(self) -> bool:
        return self >= ZeroStage.OPTIMIZER_STATES

    @property
    def shards_gradients(self) -> bool:
        return self >= ZeroStage.GRADIENTS

    @property
    def shards_parameters(self) -> bool:
        return self >= ZeroStage.WEIGHTS


def _positive_int(value, field: str) -> int:
    """``value`` as a Python int >= 1; numpy integers (a DataFrame's cells) are integers too, a bool is not."""
    value = plain(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"parallel config: {field} must be a positive integer, got {value!r}")
    if value < 1:
        raise UserError(f"parallel config: {field} must be >= 1, got {value}")
    return int(value)


def _zero_stage(value) -> ZeroStage:
    if isinstance(value, ZeroStage):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 3:
        raise UserError(f"parallel config: zero_stage must be 0, 1, 2 or 3, got {value!r}")
    return ZeroStage(value)


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """Parallel degrees of one training job; ``world_size = tp * pp * dp``.

    tp: tensor (Megatron) parallel degree. sp: Megatron sequence parallelism, which shards the
    sequence of norm/dropout activations over the TP group (so it needs tp > 1). pp: pipeline
    stages. dp: data-parallel replicas (ZeRO partitions over these). micro_batches: micro-batches
    per pipeline flush. grad_accum_steps: micro-steps per optimizer step. nodes/gpus_per_node:
    optional placement; left None, callers use the system's gpus_per_node.
    """

    tp: int = 1
    sp: bool = False
    pp: int = 1
    dp: int = 1
    zero_stage: ZeroStage = ZeroStage.DISABLED
    micro_batches: int = 1
    grad_accum_steps: int = 1
    nodes: Optional[int] = None
    gpus_per_node: Optional[int] = None

    def __post_init__(self):
        for field in ("tp", "pp", "dp", "micro_batches", "grad_accum_steps"):
            object.__setattr__(self, field, _positive_int(getattr(self, field), field))
        object.__setattr__(self, "sp", plain(self.sp))
        if not isinstance(self.sp, bool):
            raise UserError(f"parallel config: sp must be true or false, got {self.sp!r}")
        if self.sp and self.tp == 1:
            raise UserError("parallel config: sp (sequence parallelism) needs tp > 1; it shards over the tensor-parallel group")
        object.__setattr__(self, "zero_stage", _zero_stage(self.zero_stage))
        if self.pp > 1 and self.zero_stage.shards_gradients:
            # DeepSpeed's PipelineEngine asserts zero stage < 2: "ZeRO-2 and ZeRO-3 are incompatible
            # with pipeline parallelism" (deepspeed/runtime/pipe/engine.py).
            raise UserError(f"parallel config: zero_stage {int(self.zero_stage)} is incompatible with pp = {self.pp} "
                            "(DeepSpeed pipeline parallelism supports ZeRO stage 0 or 1 only)")
        for field in ("nodes", "gpus_per_node"):
            if getattr(self, field) is not None:
                object.__setattr__(self, field, _positive_int(getattr(self, field), field))
        self._check_placement()

    def _check_placement(self):
        world, nodes, gpn = self.world_size, self.nodes, self.gpus_per_node
        if nodes is not None and gpn is not None and nodes * gpn != world:
            raise UserError(f"parallel config: nodes * gpus_per_node = {nodes} * {gpn} = {nodes * gpn} "
                            f"but tp * pp * dp = {world}")
        if nodes is not None and world % nodes:
            raise UserError(f"parallel config: nodes = {nodes} does not divide world size {world}")
        if gpn is not None and world > gpn and world % gpn:
            raise UserError(f"parallel config: gpus_per_node = {gpn} does not divide world size {world}")

    # ---- derived ---------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def num_nodes(self, gpus_per_node: Optional[int] = None) -> int:
        """Nodes the job spans: ``nodes`` if set, else ceil(world / gpus_per_node) (this config's or the argument)."""
        if self.nodes is not None:
            return self.nodes
        gpn = self.gpus_per_node or gpus_per_node
        if gpn is None:
            raise UserError("parallel config: gpus_per_node is unknown; pass the system's gpus_per_node")
        return -(-self.world_size // gpn)

    def group_size(self, dim: str) -> int:
        """Size of one communication group along ``dim`` ("tp", "pp" or "dp")."""
        if dim not in ("tp", "pp", "dp"):
            raise UserError(f"parallel config: unknown dimension {dim!r} (known: tp, dp, pp)")
        return getattr(self, dim)

    def spans_nodes(self, dim: str, gpus_per_node: Optional[int] = None) -> bool:
        """Whether a ``dim`` group crosses a node boundary under the Megatron layout (tp, then dp, then pp).

        A group's ranks are strided by the product of the inner degrees, so it covers
        ``inner * degree`` consecutive ranks: tp -> tp, dp -> tp*dp, pp -> world size.
        """
        degree = self.group_size(dim)
        gpn = self.gpus_per_node or gpus_per_node
        if gpn is None:
            raise UserError("parallel config: gpus_per_node is unknown; pass the system's gpus_per_node")
        span = {"tp": self.tp, "dp": self.tp * self.dp, "pp": self.world_size}[dim]
        return degree > 1 and span > gpn

    # ---- checks against a model ---------------------------------------------------------------------
    def validate_for_model(self, num_heads: Optional[int] = None, hidden: Optional[int] = None,
                           seq_len: Optional[int] = None, layers: Optional[int] = None) -> "ParallelConfig":
        """Raise UserError when the model cannot be split this way; return self.

        tp must divide the attention heads and the hidden size (Megatron splits both), sp needs tp
        to divide the sequence length, pp must divide the layers (equal stages).
        """
        checks = (("num_heads", num_heads, self.tp, "tp"), ("hidden", hidden, self.tp, "tp"),
                  ("seq_len", seq_len, self.tp if self.sp else 1, "tp (sequence parallel)"),
                  ("layers", layers, self.pp, "pp"))
        for field, value, degree, name in checks:
            if value is None:
                continue
            _positive_int(value, field)
            if value % degree:
                raise UserError(f"parallel config: {name} = {degree} does not divide {field} = {value}")
        return self

    # ---- mapping round trip ---------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> "ParallelConfig":
        """Build from a dict (e.g. the ``"perfcheck"`` section of a DeepSpeed config); unknown keys raise."""
        if not isinstance(mapping, Mapping):
            raise UserError(f"parallel config: expected a mapping, got {type(mapping).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in mapping if k not in known]
        if unknown:
            raise UserError(f"parallel config: unknown key(s) {', '.join(map(repr, unknown))} (known: {', '.join(known)})")
        return cls(**mapping)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["zero_stage"] = int(self.zero_stage)
        return out
