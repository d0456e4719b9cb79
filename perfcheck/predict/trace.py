"""One forward pass under fake tensors that records every aten op, the modules it ran in and the
tensors autograd saved: shapes without compute and without memory for weights.

A model on the meta device (a 20B-parameter GPT built with ``torch.device('meta')``) traces the
same way as a real one: real parameters are wrapped as fake tensors on the fly
(``FakeTensorMode(allow_non_fake_inputs=True)``), meta parameters are used as they are.

Hooks are owned by the ``trace_model`` call and removed before it returns, whatever happens.
F.scaled_dot_product_attention is recorded as one fused op (a TorchFunctionMode sees it before
the dispatcher decomposes it), so attention is costed as the flash/efficient kernel that runs on
the target device, not as the math fallback the meta device would pick.

Backward follows autograd, not the forward: an op gets a backward only when its output's
``grad_fn`` is reachable from the model's outputs (``TracedOp.backward``), so work under
``torch.no_grad()``, behind ``.detach()`` or on frozen parameters costs no backward, and the
tensors such work saved are freed with its graph and are not activation memory. Ops inside an
activation-checkpointed region (``torch.utils.checkpoint``, either flavour) are marked
``recompute``: backward runs their forward again. Where a tensor feeds several autograd edges, backward
sums its gradients: one backward-only ``grad_accumulate`` op per add, before the consumer that pays it
(``perfcheck.predict.grad_accumulation``).
"""
from __future__ import annotations

import logging
import math
from contextlib import ExitStack, contextmanager

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode
from torch.utils._pytree import tree_map

from perfcheck.errors import UserError
from perfcheck.model_paths import module_paths, unwrap
from perfcheck.predict import grad_accumulation, relayout
from perfcheck.predict.trace_modes import FusedCatcher, GradRule, Recorder, Saved, early_stop, mark_backward
from perfcheck.predict.trace_records import ElemSize, Trace, local_of
from perfcheck.predict.zero3_twin import aten_linear, shape_twin


@contextmanager
def _quiet_torch_logs():
    """Silence torch's own loggers while tracing: a failing op makes fake-tensor mode log ~25
    lines before the exception that perfcheck turns into its one-line error."""
    loggers = [logging.getLogger(n) for n in ("torch._subclasses.fake_tensor", "torch._subclasses",
                                              "torch.fx.experimental.symbolic_shapes")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _twin(t: torch.Tensor, device) -> torch.Tensor:
    """An empty tensor like ``t`` (shape, strides, dtype, requires_grad) on ``device``; inside
    FakeTensorMode it is a fake tensor: no data is read or allocated. A DTensor (a tensor-parallel
    parameter) stays a DTensor on its mesh and placements, over a twin of its local shard, so the
    trace runs (and costs) what one rank computes."""
    local = local_of(t)
    if local is not t:
        from torch.distributed.tensor import DTensor

        shard = torch.empty_strided(local.shape, local.stride(), dtype=local.dtype,
                                    device=_trace_device(local.device))
        return DTensor.from_local(shard, t.device_mesh, t.placements, run_check=False, shape=t.shape,
                                  stride=t.stride()).requires_grad_(t.requires_grad)
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device).requires_grad_(t.requires_grad)


def _fake_inputs(example_inputs, fake_mode: FakeTensorMode, device):
    """Fake twins of the inputs on the model's device (call inside fake_mode). The same tensor
    passed twice gets the same twin (``mha(x, x, x)`` takes a self-attention fast path on it)."""
    memo: dict = {}

    def conv(x):
        if not isinstance(x, torch.Tensor):
            return x
        if x.is_nested:
            raise UserError(f"example_inputs: a nested (jagged) tensor ({x.layout}) cannot be traced by shapes alone; "
                            "pass the padded dense tensor (nested.to_padded_tensor) to estimate")
        if x.device.type != "meta":
            return fake_mode.from_tensor(x)
        if id(x) not in memo:
            memo[id(x)] = (x, _twin(x, device))
        return memo[id(x)][1]

    return tree_map(conv, example_inputs)


def _param_device(model) -> torch.device:
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")


def _native_dtype(model, example_inputs) -> torch.dtype:
    """The model's own floating dtype: its first floating parameter's, else buffer's, else input's; else fp32."""
    tensors = (list(model.parameters()) + list(model.buffers())
               + [t for t in example_inputs if isinstance(t, torch.Tensor)])
    return next((t.dtype for t in tensors if t.is_floating_point()), torch.float32)


def trace_model(model: torch.nn.Module, example_inputs, *, elem_bytes=None, kwargs=None,
                fused_dropout: bool = False) -> Trace:
    """Run ``model(*example_inputs, **kwargs)`` once under fake tensors and record what ran.

    ``example_inputs``: a tensor or tuple of tensors/values (real, fake or meta), as the model's
    forward takes them. ``elem_bytes`` (bytes per element) runs the model's own floating dtype at that size (to
    estimate bf16 on an fp32 model without converting it); tensors of other dtypes keep theirs (``ElemSize``).
    ``fused_dropout``: the target is a GPU: attention is the fused kernel and dropout CUDA's single kernel with a
    1-byte mask (the estimator sets it for GPU targets; see ``FusedCatcher``).

    Parameters, buffers and inputs on the meta device are traced as fake *CPU* tensors, so that a
    model built on the meta device and the same model built on the CPU dispatch to the same
    kernels and give identical numbers.
    """
    if isinstance(example_inputs, torch.Tensor) or not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    model = shape_twin(unwrap(model))  # ZeRO-3: full shapes, without DeepSpeed's gather hooks
    elem_bytes = ElemSize(_native_dtype(model, example_inputs), int(elem_bytes)) if elem_bytes else None
    trace = Trace()
    paths = module_paths(model)
    modules = _ModuleStack(trace, paths)
    stack = modules.stack
    hidden = [0]  # > 0 inside a fused op: its decomposition is neither recorded nor saved
    _refuse_script_modules(model, paths)
    saved = Saved(trace, stack, elem_bytes, hidden)
    grad_rule = GradRule(saved.state_storages)
    outs: dict = {}  # op index -> its output tensors, until the forward is over
    ckpt: dict = {}  # op index -> (its checkpoint frame, tensors saved in the region before it ran)

    device = _trace_device(_param_device(model))
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with ExitStack() as es:
        modules.attach(model, es)
        es.enter_context(_quiet_torch_logs())
        es.enter_context(aten_linear())  # ZeRO-3 replaces F.linear by a Function the trace cannot see into
        es.enter_context(fake_mode)
        # Parameters and buffers run as fake twins through torch.func.functional_call: the user's
        # tensors are never touched (a BatchNorm's running stats update the twin), and fake mode's
        # dispatch cache answers repeated shapes (twice as fast as running meta kernels).
        state = {name: _twin(t, _trace_device(t.device)) for name, t in
                 list(model.named_parameters()) + list(model.named_buffers())}
        saved.state_storages.update(saved.key(t) for t in state.values())
        inputs = _fake_inputs(example_inputs, fake_mode, device)
        es.enter_context(torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack))
        es.enter_context(FusedCatcher(trace, stack, elem_bytes, hidden, saved, fused_dropout, grad_rule, outs,
                                      ckpt))
        es.enter_context(Recorder(trace, stack, elem_bytes, hidden, grad_rule, outs, ckpt))
        # keyword tensors (model(x, labels=y)) are faked and moved like positional ones
        result = _forward(model, state, tuple(inputs), _fake_inputs(dict(kwargs or {}), fake_mode, device))
    seen = _read_graph(trace, outs, result, gpu=fused_dropout)
    early_stop(trace, ckpt)
    ckpt.clear()
    adds = grad_accumulation.accumulations(seen, grad_accumulation.node_ops(outs), _owners(model, state),
                                           elem_bytes)
    del seen
    outs.clear()  # frees the graphs backward never reaches, and with them their saved tensors
    saved.finish()
    del result
    _insert_unrecorded(trace, adds)  # after saved.finish(): the liveness checks read ops by index
    return trace


def _read_graph(trace, outs: dict, result, gpu: bool = False) -> dict:
    """What autograd's graph says about the traced ops: which ones backward differentiates (``mark_backward``)
    and which get a permuted gradient (``relayout.mark_permuted_grads``, by the target's kernels: ``gpu``). Returns
    the nodes backward reaches."""
    seen = mark_backward(trace, outs, result)
    relayout.mark_permuted_grads(trace, seen, outs, gpu=gpu)
    return seen


def _insert_unrecorded(trace, adds) -> None:
    """Put in ``trace.ops`` the work no dispatch recorded: autograd's gradient accumulations (``adds``,
    predict.grad_accumulation), then the copies a kernel makes of a permuted input (predict.relayout: a LayerNorm's),
    last because it shifts the ops' indices."""
    grad_accumulation.insert(trace, adds)
    relayout.insert(trace)


def _owners(model, state: dict) -> dict:
    """id(parameter twin) -> number of modules registering that parameter (tied weights: more than one)."""
    count: dict = {}
    for mod in model.modules():
        for q in mod.parameters(recurse=False):
            count[id(q)] = count.get(id(q), 0) + 1
    return {id(state[name]): count.get(id(q), 1) for name, q in model.named_parameters() if name in state}


class _ModuleStack:
    """Forward pre/post hooks on every module that keep the stack of module paths running now and
    record each module's first-call order, class name and number of calls in ``trace``."""

    def __init__(self, trace: Trace, paths: dict):
        self.trace, self.paths, self.stack = trace, paths, []

    def pre_hook(self, mod, args):
        path = self.paths.get(id(mod))
        if path is None:
            return
        self.stack.append(path)
        if path not in self.trace.calls:
            self.trace.order.append(path)
            self.trace.types[path] = type(mod).__name__
        self.trace.calls[path] = self.trace.calls.get(path, 0) + 1

    def post_hook(self, mod, args, output):
        if self.paths.get(id(mod)) is not None and self.stack and self.stack[-1] == self.paths[id(mod)]:
            self.stack.pop()

    def attach(self, model, es: ExitStack):
        """Register both hooks on every module (each once); ``es`` removes them, whatever happens."""
        for mod in {id(m): m for m in model.modules()}.values():
            es.callback(mod.register_forward_pre_hook(self.pre_hook).remove)
            es.callback(mod.register_forward_hook(self.post_hook, always_call=True).remove)


def _forward(model, state, inputs, kwargs):
    """``model``'s forward on the fake ``state`` and inputs; a forward that needs tensor values or
    rejects the inputs is a one-line UserError."""
    try:
        return torch.func.functional_call(model, state, inputs, kwargs)
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        raise UserError(f"model: its forward needs tensor values ({exc.func}: .item(), a Python `if` on a tensor, "
                        "boolean-mask indexing or nonzero), which a shape-only trace cannot supply; estimate a "
                        "forward without data-dependent control flow") from exc
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"example_inputs: the model rejected them: {first}") from exc


def _trace_device(device: torch.device) -> torch.device:
    """Meta tensors are traced as fake CPU tensors (see ``trace_model``)."""
    return torch.device("cpu") if device.type == "meta" else device


def _refuse_script_modules(model, paths):
    """A TorchScript submodule runs compiled code that neither module hooks nor fake tensors can
    enter; say which one, in one line, instead of torch's RuntimeError from inside the trace."""
    for mod in model.modules():
        if isinstance(mod, torch.jit.ScriptModule):
            path = paths.get(id(mod), "?")
            raise UserError(f"model: submodule {path!r} is TorchScript ({type(mod).__name__}); perfcheck traces eager "
                            "PyTorch only: estimate the nn.Module it was scripted from (or torch.compile it instead)")


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
