"""The recording machinery of ``predict.trace.trace_model``: the dispatch mode that records every aten
op with the module stack (``Recorder``), the function mode that records fused kernels as one op
(``FusedCatcher``: SDPA, CUDA dropout, grouped GEMMs), the saved-tensor hooks that measure activation
memory per module (``Saved``), which ops autograd differentiates (``GradRule``, ``mark_backward``) and
which an activation checkpoint re-runs (``checkpoint_frame``, ``early_stop``). The module docstring
of ``predict.trace`` says what the trace sees and why.
"""
from __future__ import annotations

import math
import sys
import weakref
from dataclasses import fields, is_dataclass

import torch
import torch.nn.functional as TF
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from perfcheck.predict.aten_costs import OpCall
from perfcheck.predict.trace_records import Trace, TracedOp, element_size, local_of, meta_of, to_meta


_REENTRANT_FORWARD = None


def _checkpoint_region() -> str:
    """'non-reentrant' | 'reentrant' | '' : whether the op now running is inside a region of
    torch.utils.checkpoint (its forward is re-run during backward).

    Non-reentrant checkpointing packs saved tensors with its own ``_checkpoint_hook`` (the top
    of autograd's saved-tensor hook stack); the reentrant flavour runs the region under
    ``torch.no_grad()`` inside ``CheckpointFunction.forward`` (looked for on the Python stack,
    only when grad mode is off)."""
    global _REENTRANT_FORWARD
    top = torch._C._autograd._top_saved_tensors_default_hooks(False)
    if top is not None and "_checkpoint_hook" in getattr(top[0], "__qualname__", ""):
        return "non-reentrant"
    if torch.is_grad_enabled():
        return ""
    if _REENTRANT_FORWARD is None:
        from torch.utils.checkpoint import CheckpointFunction

        _REENTRANT_FORWARD = CheckpointFunction.forward.__code__
    frame = sys._getframe(2)
    for _ in range(256):
        if frame is None:
            break
        if frame.f_code is _REENTRANT_FORWARD:
            return "reentrant"
        frame = frame.f_back
    return ""


def checkpoint_frame():
    """The ``_CheckpointFrame`` of the non-reentrant checkpoint region running now (None outside one):
    the closure of its pack hook, the top of autograd's saved-tensor hook stack. Its ``weak_holders``
    count the tensors the region has saved for backward so far."""
    top = torch._C._autograd._top_saved_tensors_default_hooks(False)
    if top is None or "_checkpoint_hook" not in getattr(top[0], "__qualname__", ""):
        return None
    for cell in getattr(top[0], "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if hasattr(value, "weak_holders") and hasattr(value, "early_stop"):
            return value
    return None


def early_stop(trace: "Trace", ckpt: dict) -> None:
    """Ops of a non-reentrant checkpoint region that torch does not re-run in backward: with early stop
    (``torch.utils.checkpoint.set_checkpoint_early_stop``, on by default) the recompute ends as soon as
    it has saved as many tensors as the forward did (``_StopRecomputationError`` in its pack hook).
    Autograd saves an op's inputs before the op runs and its outputs after, so op k runs again iff fewer
    than all N tensors had been saved when it was dispatched (``ckpt[k]``: the frame and that count).
    Example: ``b(relu(a(x)))`` saves x (a), relu's output (relu) and b's input (relu's output again) and
    weight before b runs: b's matmul is not re-run (FlopCounterMode on the backward agrees)."""
    for index, (frame, before) in ckpt.items():
        if frame.early_stop and before >= len(frame.weak_holders):
            trace.ops[index].recompute = False


class GradRule:
    """``requires_grad`` as backward will see it, for the op running now: nothing under
    ``torch.no_grad()``; inside a reentrant checkpoint (which runs under no_grad but re-runs with
    grad in backward) every floating tensor except frozen parameters/buffers."""

    def __init__(self, state_storages: set):
        self.state_storages = state_storages

    def __call__(self):
        region = _checkpoint_region()
        if region == "reentrant":
            return region, self._reentrant
        if not torch.is_grad_enabled():
            return region, _no_grad
        return region, None

    def _reentrant(self, t):
        if t.requires_grad:
            return True
        return (t.is_floating_point() or t.is_complex()) and _storage_key(t) not in self.state_storages


def _no_grad(t):
    return False


#: Collective ops (a tensor-parallel model's redistributes): not compute; predict.distributed records them.
_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")


class Recorder(TorchDispatchMode):
    """Records every aten op below the autograd layer with the current module stack."""

    def __init__(self, trace: Trace, stack: list, elem_bytes, hidden: list, grad_rule: "GradRule", outs: dict,
                 ckpt: dict):
        super().__init__()
        self.trace, self.stack, self.elem_bytes, self.hidden = trace, stack, elem_bytes, hidden
        self.grad_rule, self.outs, self.ckpt = grad_rule, outs, ckpt
        self.alive: list = []  # every storage an op touched, so its key is never reused within the trace

    def _touched(self, tree) -> tuple:
        """((storage key, bytes), ...) of the tensors in ``tree`` (a DTensor: its local shard's storage)."""
        out = []
        for t in tree_flatten(tree)[0]:
            if isinstance(t, torch.Tensor):
                t = local_of(t)
                try:
                    st = t.untyped_storage()
                    self.alive.append(st)
                    out.append((st._cdata, int(st.nbytes())))
                except Exception:  # noqa: BLE001 - tensor subclasses without storage: identity and logical size
                    self.alive.append(t)
                    out.append((id(t), int(t.numel() * t.element_size())))
        return tuple(out)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace in _COLLECTIVE_NAMESPACES:
            return out  # a DTensor redistribute's collective: communication, costed by the comm model
        if self.hidden[0] == 0 and torch._C._current_graph_task_id() == -1:
            # requires_grad of the inputs is visible here; outputs get it after autograd returns.
            region, grad = self.grad_rule()
            meta_args = tree_map(lambda x: to_meta(x, self.elem_bytes, grad), args)
            meta_kwargs = tree_map(lambda x: to_meta(x, self.elem_bytes, grad), kwargs)
            tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            outs = tuple(meta_of(t, self.elem_bytes) for t in tensors)
            self.trace.ops.append(TracedOp(OpCall(func, meta_args, meta_kwargs, outs), tuple(self.stack),
                                           recompute=bool(region), reads=self._touched((args, kwargs)),
                                           writes=self._touched(tensors)))
            if region == "non-reentrant" and (frame := checkpoint_frame()) is not None:
                # autograd saved this op's inputs before dispatching it, its outputs come after
                self.ckpt[len(self.trace.ops) - 1] = (frame, len(frame.weak_holders))
            # Kept until the forward ends: their grad_fn (set after this returns) says whether
            # backward ever reaches the op. Reentrant-checkpoint ops have none: always differentiated.
            self.outs[len(self.trace.ops) - 1] = None if region == "reentrant" else tensors
        return out


class _Packed:
    """What our saved-tensor hook hands autograd: a weak reference to the saved tensor. It lives
    exactly as long as the autograd node that saved it, so a node freed with its graph (a
    ``.detach()``'d branch) tells us its tensors were never activation memory. Holding the tensor
    weakly avoids the node -> packed -> tensor -> grad_fn cycle a strong reference would make."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, t):
        self.tensor = weakref.ref(t)


class Saved:
    """Bytes autograd keeps for backward, per module on the stack, deduplicated by storage;
    parameters and buffers are state, not activations.

    Storage keys are only unique while the storage lives, so every keyed storage is kept alive
    for the whole trace (fake storages cost nothing): a freed address can never be reused by a
    later tensor and merge two different activations."""

    def __init__(self, trace: Trace, stack: list, elem_bytes, hidden: list):
        self.trace, self.stack, self.elem_bytes, self.hidden = trace, stack, elem_bytes, hidden
        self.state_storages: set = set()
        self.entries: list = []  # (key, bytes, module paths, alive: () -> truthy while saved)
        self.alive_storages: dict = {}  # key -> storage (or tensor), held until the trace ends

    def key(self, t: torch.Tensor):
        t = local_of(t)
        try:
            st = t.untyped_storage()
            key = st._cdata
        except Exception:  # noqa: BLE001 - tensor subclasses without storage: identity of the tensor
            st, key = t, id(t)
        self.alive_storages.setdefault(key, st)
        return key

    def add(self, key, nbytes, alive):
        if self.stack:
            self.entries.append((key, nbytes, tuple(dict.fromkeys(self.stack)), alive))

    def add_tensor(self, t: torch.Tensor, alive):
        t = local_of(t)  # a DTensor saved for backward holds its local shard on this rank
        key = self.key(t)
        if key in self.state_storages or not self.stack:
            return
        nbytes = t.untyped_storage().nbytes() if hasattr(t, "untyped_storage") else t.numel() * t.element_size()
        if t.is_floating_point():
            nbytes = nbytes * element_size(t.dtype, t.element_size(), self.elem_bytes) // t.element_size()
        self.add(key, nbytes, alive)

    def pack(self, t):
        if self.hidden[0]:  # inside a fused op its own saved set is added instead
            return t
        packed = _Packed(t)
        self.add_tensor(t, weakref.ref(packed))
        return packed

    @staticmethod
    def unpack(p):
        return p.tensor() if isinstance(p, _Packed) else p

    def finish(self):
        """Fill ``trace.saved`` with what is still saved once the forward is over."""
        for key, nbytes, paths, alive in self.entries:
            if alive():
                for path in paths:
                    self.trace.saved.setdefault(path, {})[key] = nbytes


class FusedCatcher(TorchFunctionMode):
    """Records fused kernels as one op each and hides their decomposition (ops and saved tensors).

    GPU targets (``gpu``): F.scaled_dot_product_attention is the flash/efficient kernel (saves
    q, k, v, out and the fp32 row log-sum-exp, never the s x s matrix), also when reached through
    F.multi_head_attention_forward (nn.MultiheadAttention, nn.Transformer*), and F.dropout is
    CUDA's native_dropout (one kernel keeping a 1-byte mask). On the ``cpu`` target nothing is
    caught: the trace runs on fake CPU tensors, whose dispatcher picks what the CPU runs
    (_scaled_dot_product_flash_attention_for_cpu, or the math path with dropout or a mask that
    needs a gradient; bernoulli_/div_/mul dropout with a mask of the input's dtype).

    Always: torch._grouped_mm (MoE experts) is recorded as one grouped GEMM. Its meta kernel
    (which fake tensors use) refuses anything but bf16 although the CPU runs fp32, so for other
    dtypes the output is made by a shape-only stand-in that keeps the autograd graph."""

    def __init__(self, trace: Trace, stack: list, elem_bytes, hidden: list, saved: Saved, gpu: bool,
                 grad_rule: GradRule, outs: dict, ckpt: dict):
        super().__init__()
        self.trace, self.stack, self.elem_bytes, self.hidden = trace, stack, elem_bytes, hidden
        self.saved, self.gpu, self.grad_rule, self.outs, self.ckpt = saved, gpu, grad_rule, outs, ckpt
        self._before = None  # (checkpoint frame, tensors it saved) when the op being caught started

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.hidden[0]:
            return func(*args, **kwargs)
        if func in _GROUPED_MM:
            self._mark_start()
            return self._grouped_mm(args, kwargs)
        if self.gpu and func is TF.multi_head_attention_forward:
            # The mode is off while this handler runs, so the SDPA call inside would go unseen:
            # run the function's body under this mode instead (see _reentered).
            with self:
                return _reentered(func)(*args, **kwargs)
        if not self.gpu or not (func is TF.scaled_dot_product_attention or
                                (func is TF.dropout and _dropout_active(args, kwargs))):
            return func(*args, **kwargs)
        self._mark_start()
        region, grad = self.grad_rule()
        self.hidden[0] += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self.hidden[0] -= 1
        if func is TF.dropout:
            self._dropout(args[0], out, kwargs.get("p", args[1] if len(args) > 1 else 0.5), region, grad)
        else:
            self._sdpa(args, kwargs, out, region, grad)
        return out

    def _mark_start(self):
        frame = checkpoint_frame()
        self._before = (frame, len(frame.weak_holders)) if frame is not None else None

    def _record(self, call, out, region, **flags):
        self.trace.ops.append(TracedOp(call, tuple(self.stack), recompute=bool(region), **flags))
        index = len(self.trace.ops) - 1
        if region == "non-reentrant" and self._before is not None:
            self.ckpt[index] = self._before
        self.outs[index] = None if region == "reentrant" else [out]
        return lambda: self.trace.ops[index].backward

    def _sdpa(self, args, kwargs, out, region, grad):
        q, k, v = args[:3]
        causal = bool(kwargs.get("is_causal", args[5] if len(args) > 5 else False))
        metas = tuple(meta_of(t, self.elem_bytes, grad) for t in (q, k, v))
        call = OpCall(_SDPA_OP, metas, {}, (meta_of(out, self.elem_bytes),))
        alive = self._record(call, out, region, sdpa=True, causal=causal)
        if any(m.requires_grad for m in metas) and region != "non-reentrant":
            for t in (q, k, v, out):
                self.saved.add_tensor(t, alive)
            self.saved.add(("lse", len(self.trace.ops)), math.prod(q.shape[:-1]) * 4, alive)

    def _dropout(self, x, out, p, region, grad):
        xm = meta_of(x, self.elem_bytes, grad)
        call = OpCall(torch.ops.aten.native_dropout.default, (xm, p, True), {}, (meta_of(out, self.elem_bytes),))
        alive = self._record(call, out, region)
        if xm.requires_grad and region != "non-reentrant":
            self.saved.add(("dropout-mask", len(self.trace.ops)), x.numel(), alive)  # bool mask, 1 byte per element

    def _grouped_mm(self, args, kwargs):
        a, b = args[0], args[1]
        offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
        bias = kwargs.get("bias", args[3] if len(args) > 3 else None)
        out_dtype = kwargs.get("out_dtype", args[4] if len(args) > 4 else None)
        region, grad = self.grad_rule()
        self.hidden[0] += 1
        try:
            if a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16:
                out = torch._grouped_mm(a, b, offs=offs, bias=bias, out_dtype=out_dtype)
            else:
                out = _GroupedMmShape.apply(a, b, offs, out_dtype or a.dtype)
        finally:
            self.hidden[0] -= 1
        metas = (meta_of(a, self.elem_bytes, grad), meta_of(b, self.elem_bytes, grad),
                 None if offs is None else meta_of(offs, None))
        call = OpCall(torch.ops.aten._grouped_mm.default, metas, {}, (meta_of(out, self.elem_bytes),))
        alive = self._record(call, out, region)
        if region != "non-reentrant":  # each operand is saved for the other's gradient
            if metas[1].requires_grad:
                self.saved.add_tensor(a, alive)
            if metas[0].requires_grad:
                self.saved.add_tensor(b, alive)
        return out


_GROUPED_MM = tuple(f for f in (getattr(torch, "_grouped_mm", None), getattr(TF, "grouped_mm", None)) if f)


class _GroupedMmShape(torch.autograd.Function):
    """A shape-only stand-in for torch._grouped_mm (the output shapes of torch's meta kernel,
    torch/_meta_registrations.py ``_create_grouped_mm_output_tensor``); never run backward."""

    @staticmethod
    def forward(ctx, a, b, offs, dtype):
        if a.dim() == 2:
            shape = (offs.shape[0], a.shape[0], b.shape[1]) if b.dim() == 2 else (a.shape[0], b.shape[-1])
        else:
            shape = (a.shape[1], b.shape[1]) if b.dim() == 2 else (a.shape[0], a.shape[1], b.shape[-1])
        return a.new_empty(shape, dtype=dtype)

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - the trace never runs backward
        raise NotImplementedError("perfcheck's grouped-GEMM stand-in is for shape tracing only")


_REENTERED: dict = {}


def _reentered(func):
    """``func`` (a Python function that starts with ``if has_torch_function(...): return
    handle_torch_function(...)``) with that first check answering False, so that its body runs
    under the active mode and the torch functions it calls are seen by it."""
    import types

    cached = _REENTERED.get(func)
    if cached is None:
        glb = dict(func.__globals__)
        glb.update(has_torch_function=lambda *a: False, has_torch_function_unary=lambda *a: False,
                   has_torch_function_variadic=lambda *a: False)
        cached = types.FunctionType(func.__code__, glb, func.__name__, func.__defaults__, func.__closure__)
        cached.__kwdefaults__ = func.__kwdefaults__
        _REENTERED[func] = cached
    return cached


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


def output_tensors(result, _depth: int = 0) -> list:
    """Every tensor in a forward's output: inside pytree containers (tuple, list, dict, namedtuple, and
    registered classes such as HF's ModelOutput) and inside plain dataclasses, which pytree leaves whole
    (a ``@dataclass`` output's tensors would otherwise look absent and its backward 0)."""
    out = []
    for leaf in tree_flatten(result)[0]:
        if isinstance(leaf, torch.Tensor):
            out.append(leaf)
        elif is_dataclass(leaf) and not isinstance(leaf, type) and _depth < 32:
            for f in fields(leaf):
                out += output_tensors(getattr(leaf, f.name, None), _depth + 1)
    return out


def mark_backward(trace: Trace, outs: dict, result) -> dict:
    """``TracedOp.backward``: whether autograd's backward from the model's outputs reaches the op.

    Walks ``grad_fn.next_functions`` from every output tensor that requires grad; an op is
    differentiated when the node that made its output is on that walk (an in-place op later
    applied to the same tensor stands for it: backward reaches the first through the second).
    Returns the walk: id -> node for every node backward reaches."""
    seen: dict = {}
    todo = [t.grad_fn for t in output_tensors(result) if t.grad_fn is not None]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node  # holds the node: ids stay unique during the walk
        todo.extend(n for n, _ in node.next_functions if n is not None)
    for index, tensors in outs.items():
        if tensors is None:
            continue  # reentrant checkpoint: no graph in forward, always re-run and differentiated
        node = None
        for t in tensors:
            base = t._base if t._is_view() and t._base is not None else t
            node = base.grad_fn if base.grad_fn is not None else t.grad_fn
            if node is not None:
                break
        trace.ops[index].backward = node is not None and id(node) in seen
    return seen
