"""One forward pass under fake tensors that records every aten op, the modules it ran in and the
tensors autograd saved: shapes without compute and without memory for weights.

A model on the meta device (a 20B-parameter GPT built with ``torch.device('meta')``) traces the
same way as a real one: real parameters are wrapped as fake tensors on the fly
(``FakeTensorMode(allow_non_fake_inputs=True)``), meta parameters are used as they are.

Hooks are owned by the ``trace_model`` call and removed before it returns, whatever happens.
F.scaled_dot_product_attention is recorded as one fused op (a TorchFunctionMode sees it before
the dispatcher decomposes it), so attention is costed as the flash/efficient kernel that runs on
the target device, not as the math fallback the meta device would pick.
"""
from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass, field

import torch
import torch.nn.functional as TF
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from perfcheck.errors import UserError
from perfcheck.predict.aten_costs import OpCall, TensorMeta
from perfcheck.model_paths import module_paths, unwrap
from perfcheck.predict.zero3_twin import aten_linear, shape_twin
from perfcheck.schema import ROOT


@dataclass
class TracedOp:
    """One op: the call (tensors as TensorMeta) and the module paths on the stack when it ran."""

    call: OpCall
    stack: tuple  # module paths, outermost first
    sdpa: bool = False  # a fused F.scaled_dot_product_attention call
    causal: bool = False


@dataclass
class ModuleCall:
    path: str
    type: str


@dataclass
class Trace:
    """Everything one fake forward pass saw."""

    ops: list = field(default_factory=list)
    calls: dict = field(default_factory=dict)  # path -> number of forward calls
    types: dict = field(default_factory=dict)  # path -> class name
    order: list = field(default_factory=list)  # paths in first-call order
    saved: dict = field(default_factory=dict)  # path -> {storage key: bytes} saved while inside it
    dtype_override: object = None


def _meta_of(t: torch.Tensor, elem_bytes_override) -> TensorMeta:
    is_float = t.is_floating_point() or t.is_complex()
    eb = elem_bytes_override if (is_float and elem_bytes_override) else t.element_size()
    distinct = math.prod(n for n, st in zip(t.shape, t.stride()) if st != 0) if t.layout == torch.strided else -1
    return TensorMeta(tuple(t.shape), eb, bool(t.requires_grad), is_float, distinct)


def _to_meta(x, elem_bytes):
    return _meta_of(x, elem_bytes) if isinstance(x, torch.Tensor) else x


class _Recorder(TorchDispatchMode):
    """Records every aten op below the autograd layer with the current module stack."""

    def __init__(self, trace: Trace, stack: list, elem_bytes, hidden: list):
        super().__init__()
        self.trace, self.stack, self.elem_bytes, self.hidden = trace, stack, elem_bytes, hidden

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.hidden[0] == 0 and torch._C._current_graph_task_id() == -1:
            # requires_grad of the inputs is visible here; outputs get it after autograd returns.
            meta_args = tree_map(lambda x: _to_meta(x, self.elem_bytes), args)
            meta_kwargs = tree_map(lambda x: _to_meta(x, self.elem_bytes), kwargs)
            outs = tuple(_meta_of(t, self.elem_bytes) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
            self.trace.ops.append(TracedOp(OpCall(func, meta_args, meta_kwargs, outs), tuple(self.stack)))
        return out


class _Saved:
    """Bytes autograd keeps for backward, per module on the stack, deduplicated by storage;
    parameters and buffers are state, not activations."""

    def __init__(self, trace: Trace, stack: list, elem_bytes, hidden: list):
        self.trace, self.stack, self.elem_bytes, self.hidden = trace, stack, elem_bytes, hidden
        self.state_storages: set = set()

    def add(self, key, nbytes):
        for path in set(self.stack):
            self.trace.saved.setdefault(path, {})[key] = nbytes

    def add_tensor(self, t: torch.Tensor):
        key = _storage_key(t)
        if key in self.state_storages or not self.stack:
            return
        nbytes = t.untyped_storage().nbytes() if hasattr(t, "untyped_storage") else t.numel() * t.element_size()
        if self.elem_bytes and t.is_floating_point():
            nbytes = nbytes * self.elem_bytes // t.element_size()
        self.add(key, nbytes)

    def pack(self, t):
        if not self.hidden[0]:  # inside a fused op its own saved set is added instead
            self.add_tensor(t)
        return t


class _FusedCatcher(TorchFunctionMode):
    """Records fused kernels as one op each and hides their decomposition (ops and saved tensors):
    F.scaled_dot_product_attention always (the flash/efficient kernel: saves q, k, v, out and the
    fp32 row log-sum-exp, never the s x s matrix), and F.dropout when ``fused_dropout`` (CUDA's
    native_dropout: one kernel keeping a 1-byte mask; CPU runs bernoulli_/div_/mul and keeps a
    mask of the input's dtype, which is what the trace sees when the target is a CPU)."""

    def __init__(self, trace: Trace, stack: list, elem_bytes, hidden: list, saved: _Saved, fused_dropout: bool):
        super().__init__()
        self.trace, self.stack, self.elem_bytes, self.hidden = trace, stack, elem_bytes, hidden
        self.saved, self.fused_dropout = saved, fused_dropout

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.hidden[0] or not (func is TF.scaled_dot_product_attention or
                                  (func is TF.dropout and self.fused_dropout and _dropout_active(args, kwargs))):
            return func(*args, **kwargs)
        self.hidden[0] += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self.hidden[0] -= 1
        if func is TF.dropout:
            self._dropout(args[0], out, kwargs.get("p", args[1] if len(args) > 1 else 0.5))
        else:
            self._sdpa(args, kwargs, out)
        return out

    def _sdpa(self, args, kwargs, out):
        q, k, v = args[:3]
        causal = bool(kwargs.get("is_causal", args[5] if len(args) > 5 else False))
        metas = tuple(_meta_of(t, self.elem_bytes) for t in (q, k, v))
        call = OpCall(_SDPA_OP, metas, {}, (_meta_of(out, self.elem_bytes),))
        self.trace.ops.append(TracedOp(call, tuple(self.stack), sdpa=True, causal=causal))
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            for t in (q, k, v, out):
                self.saved.add_tensor(t)
            self.saved.add(("lse", len(self.trace.ops)), math.prod(q.shape[:-1]) * 4)

    def _dropout(self, x, out, p):
        call = OpCall(torch.ops.aten.native_dropout.default, (_meta_of(x, self.elem_bytes), p, True), {},
                      (_meta_of(out, self.elem_bytes),))
        self.trace.ops.append(TracedOp(call, tuple(self.stack)))
        if torch.is_grad_enabled() and x.requires_grad:
            self.saved.add(("dropout-mask", len(self.trace.ops)), x.numel())  # bool mask, 1 byte per element


_SDPA_OP = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu",
                   torch.ops.aten._scaled_dot_product_flash_attention).default


def _dropout_active(args, kwargs) -> bool:
    p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
    training = kwargs.get("training", args[2] if len(args) > 2 else True)
    return bool(training) and p > 0


def _storage_key(t: torch.Tensor):
    try:
        return t.untyped_storage()._cdata
    except Exception:  # noqa: BLE001 - tensor subclasses without storage: fall back to identity
        return id(t)


def _twin(t: torch.Tensor, device) -> torch.Tensor:
    """An empty tensor like ``t`` (shape, strides, dtype, requires_grad) on ``device``; inside
    FakeTensorMode it is a fake tensor: no data is read or allocated."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device).requires_grad_(t.requires_grad)


def _fake_inputs(example_inputs, fake_mode: FakeTensorMode, device):
    """Fake twins of the inputs on the model's device (call inside fake_mode)."""
    def conv(x):
        if not isinstance(x, torch.Tensor):
            return x
        if x.device.type == "meta" and device.type != "meta":
            return _twin(x, device)
        return fake_mode.from_tensor(x)

    return tree_map(conv, example_inputs)


def _param_device(model) -> torch.device:
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")


def trace_model(model: torch.nn.Module, example_inputs, *, elem_bytes=None, kwargs=None,
                fused_dropout: bool = False) -> Trace:
    """Run ``model(*example_inputs, **kwargs)`` once under fake tensors and record what ran.

    ``example_inputs``: a tensor or tuple of tensors/values (real, fake or meta), as the model's
    forward takes them. ``elem_bytes`` overrides the element size of floating tensors (to
    estimate bf16 on an fp32 model without converting it). ``fused_dropout``: record dropout as
    CUDA's single fused kernel with a 1-byte mask (the estimator sets it for GPU targets).
    """
    if isinstance(example_inputs, torch.Tensor) or not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    model = shape_twin(unwrap(model))  # ZeRO-3: full shapes, without DeepSpeed's gather hooks
    trace = Trace()
    stack: list = []
    paths = module_paths(model)
    hidden = [0]  # > 0 inside a fused op: its decomposition is neither recorded nor saved

    def pre_hook(mod, args):
        path = paths.get(id(mod))
        if path is None:
            return
        stack.append(path)
        if path not in trace.calls:
            trace.order.append(path)
            trace.types[path] = type(mod).__name__
        trace.calls[path] = trace.calls.get(path, 0) + 1

    def post_hook(mod, args, output):
        if paths.get(id(mod)) is not None and stack and stack[-1] == paths[id(mod)]:
            stack.pop()

    saved = _Saved(trace, stack, elem_bytes, hidden)

    device = _param_device(model)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with ExitStack() as es:
        for mod in {id(m): m for m in model.modules()}.values():
            es.callback(mod.register_forward_pre_hook(pre_hook).remove)
            es.callback(mod.register_forward_hook(post_hook, always_call=True).remove)
        es.enter_context(aten_linear())  # ZeRO-3 replaces F.linear by a Function the trace cannot see into
        es.enter_context(fake_mode)
        # Parameters and buffers run as fake twins through torch.func.functional_call: the user's
        # tensors are never touched (a BatchNorm's running stats update the twin), and fake mode's
        # dispatch cache answers repeated shapes (twice as fast as running meta kernels).
        state = {name: _twin(t, t.device) for name, t in
                 list(model.named_parameters()) + list(model.named_buffers())}
        saved.state_storages.update(_storage_key(t) for t in state.values())
        inputs = _fake_inputs(example_inputs, fake_mode, device)
        es.enter_context(torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t))
        es.enter_context(_FusedCatcher(trace, stack, elem_bytes, hidden, saved, fused_dropout))
        es.enter_context(_Recorder(trace, stack, elem_bytes, hidden))
        try:
            torch.func.functional_call(model, state, tuple(inputs), kwargs or {})
        except (DataDependentOutputException, DynamicOutputShapeException) as exc:
            raise UserError(f"model: its forward needs tensor values ({exc.func}: .item(), a Python `if` on a tensor, "
                            "boolean-mask indexing or nonzero), which a shape-only trace cannot supply; estimate a "
                            "forward without data-dependent control flow") from exc
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"example_inputs: the model rejected them: {first}") from exc
    return trace


def inputs_from_shapes(shapes, dtype=torch.float32, device="meta"):
    """Build example inputs from shapes: [(8, 3, 32, 32)] or [((8, 128), 'int64')]."""
    out = []
    for spec in shapes:
        if isinstance(spec, (list, tuple)) and len(spec) == 2 and isinstance(spec[1], (str, torch.dtype)) \
                and isinstance(spec[0], (list, tuple)):
            shape, dt = spec
            dt = getattr(torch, dt) if isinstance(dt, str) else dt
        else:
            shape, dt = spec, dtype
        if any((not isinstance(s, int)) or s <= 0 for s in shape):
            raise UserError(f"input shape {tuple(shape)}: every size must be a positive integer")
        if dt.is_floating_point:
            out.append(torch.empty(tuple(shape), dtype=dt, device=device))
        else:
            out.append(torch.zeros(tuple(shape), dtype=dt, device=device))
    return tuple(out)


def numel(shape) -> int:
    return math.prod(shape)
