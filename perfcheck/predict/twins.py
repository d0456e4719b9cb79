"""Twins of a live torch-native parallel model that the estimator traces, so it never touches the
live model's state.

* ``meta_twin(model)``: an unparallelised copy on the meta device (global parameter shapes, no
  hooks, no DTensors), so the estimator can trace the structure of a live FSDP2/TP model without
  touching its state; the live model's next forward still works (``FSDP2 + out_dir`` used to
  raise "mixed torch.Tensor and DTensor").
* ``tp_twin(model, make_local)``: the model as one rank computes it: FSDP2 stripped (its
  all-gathered shapes), TP parameters DTensors on their TP mesh (under FSDP2+TP FSDP's mesh
  dimension dropped, from FSDP2's own record of the TP spec), the parallel styles' hooks kept.
  ``meta_tp_twin`` (meta local shards) is what the estimator traces for per-rank compute;
  ``dtensor_twin(model, fake)`` (fake local shards) is what
  ``perfcheck.predict.distributed.live_dtensor_collectives`` traces the TP/SP redistributes on under
  FakeTensorMode (funcol ops on fake tensors move nothing, so this runs on one rank of a real group).
"""
from __future__ import annotations

import torch

from perfcheck.model_paths import unwrap
from perfcheck.predict.layout import fsdp_modules, fsdp_modules_class, is_dtensor, mentions

def meta_twin(model) -> torch.nn.Module:
    """An unparallelised copy of ``model`` on the meta device: the user's classes, global parameter
    shapes, no hooks, no DTensors, no FSDP state; ``model`` is left exactly as it was.

    Every module is shallow-copied into its original class (FSDP2's ``FSDPNet`` back to ``Net``)
    with fresh parameter/buffer/child dicts and empty hook dicts; attributes that are not tensors
    or modules (sizes, flags) are shared, which a forward only reads.
    """
    model = unwrap(model)

    def plain_class(mod):
        cls = type(mod)
        if fsdp_modules_class(cls):
            cls = next(b for b in cls.__mro__[1:] if b.__name__ != "FSDPModule" and not fsdp_modules_class(b))
        return cls

    def drop_hooks(state):
        for key in list(state):
            if key.endswith("hooks") and isinstance(state[key], dict):
                state[key] = type(state[key])()
            if key.startswith("_fsdp") or key in ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs",
                                                    "_forward_hooks_always_called"):
                state[key] = type(state[key])() if isinstance(state[key], (dict, set, list)) else None

    return _copy_module_tree(model, plain_class, drop_hooks,
                             lambda p: torch.nn.Parameter(_meta_like(p), requires_grad=p.requires_grad), _meta_like)


def _copy_module_tree(model, class_of, edit_state, new_param, new_buffer) -> torch.nn.Module:
    """A copy of ``model``'s module tree: each module shallow-copied into ``class_of(module)`` with its
    ``__dict__`` passed through ``edit_state`` (in place), parameters and buffers made by
    ``new_param`` / ``new_buffer``, fresh child dicts; a module reached twice is copied once."""
    memo: dict = {}

    def twin(mod):
        if id(mod) in memo:
            return memo[id(mod)]
        cls = class_of(mod)
        new = cls.__new__(cls)
        state = dict(mod.__dict__)
        edit_state(state)
        state["_parameters"] = {k: None if p is None else _with_optim_numel(new_param(p), p)
                                for k, p in mod._parameters.items()}
        state["_buffers"] = {k: None if b is None else new_buffer(b) for k, b in mod._buffers.items()}
        state["_modules"] = {}
        new.__dict__.update(state)
        memo[id(mod)] = new
        for k, child in mod._modules.items():
            new._modules[k] = None if child is None else twin(child)
        return new

    return twin(model)


def _with_optim_numel(twin, live):
    """``twin`` marked with the elements of ``live`` this rank's optimizer updates (its local shard:
    FSDP2's dim-0 shard, a DTensor's ``to_local()``), which ``predict.host`` reads for pred_optim_s
    (the twin's own shapes are the all-gathered ones the forward computes with)."""
    twin.perfcheck_optim_numel = int(local_tensor(live).numel())
    return twin


def _meta_like(t):
    shape = tuple(t.shape)  # a DTensor's shape is the global one
    return torch.empty(shape, dtype=t.dtype, device="meta")


def _is_style_hook(hook) -> bool:
    """A forward (pre-)hook ``parallelize_module`` installed: a closure over its DeviceMesh
    (torch/distributed/tensor/_api.py distribute_module: ``lambda _, inputs: input_fn(module,
    inputs, device_mesh)``), not FSDP2's or perfcheck's."""
    return mentions(hook, "DeviceMesh", depth=0)


def _plain_class(mod):
    """The user's class of ``mod`` (FSDP2's generated ``FSDP<Name>`` back to ``<Name>``)."""
    cls = type(mod)
    if fsdp_modules_class(cls):
        cls = next(b for b in cls.__mro__[1:] if b.__name__ != "FSDPModule" and not fsdp_modules_class(b))
    return cls


def _fsdp_params(model) -> dict:
    """{id(parameter tensor): FSDPParam} for every parameter FSDP2 manages in ``model``: its sharded
    DTensor and, while unsharded, the unsharded one."""
    out = {}
    for mod in fsdp_modules(model):
        group = mod._get_fsdp_state()._fsdp_param_group
        for fp in (group.fsdp_params if group is not None else ()):
            for attr in ("sharded_param", "_unsharded_param"):
                t = getattr(fp, attr, None)
                if t is not None:
                    out[id(t)] = fp
    return out


def _unsharded_layout(p, fsdp: dict):
    """(global shape, mesh, placements) of parameter ``p`` as the forward computes with it: FSDP2's
    all-gathered tensor (its tensor-parallel DTensor spec, FSDP's dimension gone; no mesh for a
    plain parameter) or ``p``'s own DTensor layout; mesh None for a plain tensor."""
    fp = fsdp.get(id(p))
    if fp is not None:
        # FSDP2's record of the parameter's own DTensor layout (torch 2.13: _unsharded_dtensor_spec; older: _tp_spec)
        spec = getattr(fp, "_unsharded_dtensor_spec", None) or getattr(fp, "_tp_spec", None)
        if spec is None and getattr(fp, "is_dtensor", False):
            raise NotImplementedError(f"FSDP2+TP: this torch's FSDPParam keeps the tensor-parallel layout of "
                                      f"{fp._module_info.param_name!r} under neither _unsharded_dtensor_spec nor "
                                      "_tp_spec; perfcheck cannot strip FSDP's mesh dimension to cost one rank")
        if spec is None:
            return tuple(fp._orig_size), None, None
        return tuple(spec.shape), spec.mesh, tuple(spec.placements)
    if is_dtensor(p):
        return tuple(p.shape), p.device_mesh, tuple(p.placements)
    return tuple(p.shape), None, None


def local_shape(shape, mesh, placements) -> tuple:
    """This rank's shard shape of a tensor of global ``shape`` laid out by ``placements`` on ``mesh``
    (DTensor's own rule, torch.distributed.tensor._utils: uneven shards included)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    return tuple(compute_local_shape_and_global_offset(torch.Size(shape), mesh, placements)[0])


def tp_twin(model, make_local) -> torch.nn.Module:
    """A copy of ``model`` as one rank computes its forward: FSDP2 stripped (its parameters at their
    all-gathered shapes: FSDP2 all-gathers before computing), tensor-parallel parameters kept as
    DTensors on their TP mesh with their TP placements (under FSDP2+TP the FSDP dimension is
    dropped from the 2-D layout: FSDP2's own record of the TP spec), the parallel styles'
    input/output hooks kept, every other hook dropped; the user's classes.

    ``make_local(shape, dtype, device)`` makes each local tensor (meta tensors for the estimator's
    trace; fake ones for ``predict.distributed.live_dtensor_collectives``). ``model`` (parameters,
    gradients, hooks, FSDP state) is not touched.
    """
    from torch.distributed.tensor import DTensor

    model = unwrap(model)
    fsdp = _fsdp_params(model)

    def param(p):
        shape, mesh, placements = _unsharded_layout(p, fsdp)
        device = local_tensor(p).device
        if mesh is None:
            return torch.nn.Parameter(make_local(shape, p.dtype, device), requires_grad=p.requires_grad)
        local = make_local(local_shape(shape, mesh, placements), p.dtype, device)
        stride = torch.empty(shape, device="meta").stride()
        d = DTensor.from_local(local, mesh, placements, run_check=False, shape=torch.Size(shape), stride=stride)
        return torch.nn.Parameter(d, requires_grad=p.requires_grad)

    def keep_style_hooks(state):
        for key in ("_forward_pre_hooks", "_forward_hooks"):
            kept = type(state[key])()
            for k, h in state[key].items():
                if _is_style_hook(h):
                    kept[k] = h
            state[key] = kept
        for key in ("_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks", "_load_state_dict_pre_hooks"):
            if isinstance(state.get(key), dict):
                state[key] = type(state[key])()
        for key in list(state):
            if key.startswith("_fsdp"):
                state[key] = type(state[key])() if isinstance(state[key], (dict, set, list)) else None

    def buffer(b):
        return make_local(tuple(b.shape), b.dtype, b.device)

    return _copy_module_tree(model, _plain_class, keep_style_hooks, param, buffer)


def local_tensor(t):
    return t._local_tensor if is_dtensor(t) and hasattr(t, "_local_tensor") else t


def has_tensor_parallel(model) -> bool:
    """True when some parameter computes as a DTensor (tensor/sequence parallel, alone or under
    FSDP2): its compute per rank is its shard's, not the global shape's."""
    inner = unwrap(model)
    fsdp = _fsdp_params(inner)
    return any(_unsharded_layout(p, fsdp)[1] is not None for p in inner.parameters())


def dtensor_twin(model, fake) -> torch.nn.Module:
    """``tp_twin`` with *fake* local shards made under the FakeTensorMode ``fake``: its forward
    issues the layout's tensor-parallel redistributes as funcol ops on fake tensors, which run
    their fake kernels and move nothing. The live model is not touched."""

    def make_local(shape, dtype, device):
        with fake:
            return torch.empty(shape, dtype=dtype, device=device)

    return tp_twin(model, make_local)


def meta_tp_twin(model) -> torch.nn.Module:
    """``tp_twin`` with meta local shards: what the estimator traces for a TP/SP or FSDP2+TP model
    (its per-rank compute: every DTensor op costed at its local shapes)."""
    return tp_twin(model, lambda shape, dtype, device: torch.empty(shape, dtype=dtype, device="meta"))
