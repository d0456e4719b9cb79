"""A ZeRO-3-partitioned model as the estimator can trace it: full shapes, no DeepSpeed hooks.

Under ZeRO stage 3 DeepSpeed replaces every parameter's data by an empty tensor (the rank's shard
lives in ``p.ds_tensor``; the full shape is ``p.ds_shape``, the full count ``p.ds_numel``) and
registers forward/backward hooks on every submodule that gather the shards before the module runs
(``deepspeed/runtime/zero/parameter_offload.py``). Tracing such a model with fake parameter twins
runs those hooks on tensors that are not DeepSpeed parameters (``AttributeError: 'FakeTensor'
object has no attribute 'ds_status'``) and would see 0-element weights.

``shape_twin(model)`` returns a copy of the module tree (same classes, same attribute values, so
the same ``forward`` code and the same qualified paths) whose parameters are meta tensors of their
full ``ds_shape`` and which carries no hooks; the user's modules and parameters are not touched.
A model with no partitioned parameter is returned as it is.
"""
from __future__ import annotations

import contextlib
import copy
import sys
from collections import OrderedDict

import torch

#: Hook dictionaries of torch.nn.Module (torch 2.x); the twin gets empty ones.
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_backward_pre_hooks",
               "_backward_hooks")


def is_partitioned(model: torch.nn.Module) -> bool:
    """True when some parameter is a ZeRO-3 partitioned one (it carries ``ds_shape``)."""
    return any(hasattr(p, "ds_shape") for p in model.parameters())


def _param_twin(p: torch.nn.Parameter) -> torch.nn.Parameter:
    shape = tuple(int(d) for d in getattr(p, "ds_shape", p.shape))
    return torch.nn.Parameter(torch.empty(shape, dtype=p.dtype, device="meta"), requires_grad=p.requires_grad)


def shape_twin(model: torch.nn.Module) -> torch.nn.Module:
    """The hook-free, full-shape meta copy of a ZeRO-3 model (``model`` itself when nothing is partitioned).
    Shared modules and shared (tied) parameters stay shared in the copy."""
    if not is_partitioned(model):
        return model
    modules, params = {}, {}

    def twin_param(p):
        if p is None:
            return None
        if id(p) not in params:
            params[id(p)] = _param_twin(p)
        return params[id(p)]

    def twin(m):
        if m is None:
            return None
        if id(m) in modules:
            return modules[id(m)]
        t = copy.copy(m)  # same class and attribute values; the dicts below are replaced, not shared
        modules[id(m)] = t
        d = t.__dict__
        d["_parameters"] = {n: twin_param(p) for n, p in m._parameters.items()}
        d["_buffers"] = dict(m._buffers)
        d["_modules"] = {n: twin(c) for n, c in m._modules.items()}
        for name in _HOOK_DICTS:
            if name in d:
                d[name] = OrderedDict()
        return t

    return twin(model)


@contextlib.contextmanager
def aten_linear():
    """Inside: ``torch.nn.functional.linear`` is torch's own again while DeepSpeed's ZeRO-3 has it replaced.

    ZeRO-3 swaps ``F.linear`` for ``zero3_linear_wrap`` for the whole process
    (``deepspeed/runtime/zero/partition_parameters.py: _enable_mem_efficient_linear``), an
    ``autograd.Function`` whose hand-written backward the trace cannot see (it would count no
    backward work for every Linear). Its backward is aten linear's (``grad_input = grad_out @ W``,
    ``grad_weight = grad_out^T @ x``, ``grad_bias = sum(grad_out)``; ``deepspeed/runtime/zero/linear.py``),
    so the trace runs torch's and puts DeepSpeed's back on exit. Nothing changes when ZeRO-3 is not in use.
    """
    import torch.nn.functional as F

    original = _torch_linear()
    current = F.linear
    if original is None or current is original:
        yield
        return
    F.linear = original
    try:
        yield
    finally:
        F.linear = current


def _torch_linear():
    """torch's own ``F.linear`` as DeepSpeed saved it before replacing it (None: DeepSpeed never did)."""
    mod = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
    holder = getattr(mod, "InsertPostInitMethodToModuleSubClasses", None) if mod is not None else None
    return getattr(holder, "linear_bk", None)
