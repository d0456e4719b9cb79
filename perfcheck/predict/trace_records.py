"""What one fake forward pass records (``Trace``: the ops, the modules they ran in, the tensors
autograd saved) and how a tensor becomes its shape record (``meta_of``: a DTensor costed at its local
shard). ``predict.trace.trace_model`` fills a Trace; ``predict.trace_modes`` holds the dispatch and
function modes that record into it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from perfcheck.predict.aten_costs import OpCall, TensorMeta


@dataclass
class TracedOp:
    """One op: the call (tensors as TensorMeta) and the module paths on the stack when it ran."""

    call: OpCall
    stack: tuple  # module paths, outermost first
    sdpa: bool = False  # a fused F.scaled_dot_product_attention call
    causal: bool = False
    backward: bool = True  # autograd differentiates this op (its grad_fn reaches the outputs)
    recompute: bool = False  # inside an activation-checkpointed region: forward re-runs in backward
    grad_accumulate: bool = False  # backward only: autograd summing two gradients (predict.grad_accumulation)
    grad_relayout: bool = False  # backward only: a kernel's copy of a gradient that arrives permuted (predict.relayout)
    #: its output's gradient arrives out of row-major order, which its backward kernel copies (predict.relayout)
    grad_permuted: bool = False
    #: ((storage key, bytes), ...) of the tensors it reads and of those it writes: which data an op touches,
    #: for the reuse distance of its operands (predict.reuse); keys stay unique for the trace (kept alive)
    reads: tuple = ()
    writes: tuple = ()

    @property
    def backward_only(self) -> bool:
        """Work only autograd's backward runs, no forward op: its cost's forward moves to the backward."""
        return self.grad_accumulate or self.grad_relayout


@dataclass
class Trace:
    """Everything one fake forward pass saw."""

    ops: list = field(default_factory=list)
    calls: dict = field(default_factory=dict)  # path -> number of forward calls
    types: dict = field(default_factory=dict)  # path -> class name
    order: list = field(default_factory=list)  # paths in first-call order
    saved: dict = field(default_factory=dict)  # path -> {storage key: bytes} saved while inside it
    dtype_override: object = None
    opaque: list = field(default_factory=list)  # (path, reason) of work the trace could not see into


def local_of(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank computes on and holds), any other tensor itself."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) and hasattr(t, "placements") else t


@dataclass(frozen=True)
class ElemSize:
    """The bytes per element an estimate costs a traced tensor at, when the caller asks for another dtype
    (``estimate(dtype=...)``): the model's own floating dtype ``native`` (its parameters', else its inputs') runs as
    one of ``nbytes`` per element, and every other dtype keeps its real size. So an fp32 model is costed as a bf16
    run, while the casts a mixed-precision model makes on purpose stay as they run: a bf16 model's ``x.float()``
    (Llama's RMSNorm, an fp32 loss) still writes 4 bytes per element, a rotary table stays complex64.
    (Overriding every floating tensor instead erased those casts: a bf16 block asked for in bf16 lost its eight
    backward casts and half its cast bytes.)"""

    native: torch.dtype
    nbytes: int

    def of(self, dtype: torch.dtype, real: int) -> int:
        """Bytes per element of a tensor of ``dtype`` whose real element size is ``real``."""
        return self.nbytes if dtype == self.native else real


def element_size(dtype: torch.dtype, real: int, size: "ElemSize | None") -> int:
    """The costed element size of a tensor of ``dtype`` (``real`` bytes) under ``size`` (None: no override)."""
    return real if size is None else size.of(dtype, real)


def meta_of(t: torch.Tensor, elem_bytes_override, grad=None) -> TensorMeta:
    """``grad``: a function tensor -> bool for ``requires_grad`` (default: the tensor's own flag).
    A DTensor (tensor parallel) is costed at its local shard's shape: one rank's work. ``elem_bytes_override``:
    an ``ElemSize`` or None."""
    rg = bool(t.requires_grad) if grad is None else grad(t)
    t = local_of(t)
    is_float = t.is_floating_point() or t.is_complex()
    eb = element_size(t.dtype, t.element_size(), elem_bytes_override)
    distinct = math.prod(n for n, st in zip(t.shape, t.stride()) if st != 0) if t.layout == torch.strided else -1
    contiguous = bool(t.is_contiguous()) if t.layout == torch.strided else True
    nhwc = (not contiguous and t.layout == torch.strided and t.dim() == 4
            and bool(t.is_contiguous(memory_format=torch.channels_last)))
    return TensorMeta(tuple(t.shape), eb, rg, is_float, distinct, contiguous, nhwc)


def to_meta(x, elem_bytes, grad=None):
    return meta_of(x, elem_bytes, grad) if isinstance(x, torch.Tensor) else x
