"""PyTorch's own parallel engines as the estimator sees them: DDP, FSDP2 (``fully_shard``) and DTensor
tensor/sequence parallelism on a DeviceMesh, alone or combined, read from the model itself.

* ``detect_layout(model)``: what meta.json records under ``parallel`` (kind, dp / fsdp / tp sizes,
  mesh shape and dimension names), read from the model itself (DDP wrapper, ``FSDPModule``
  instances, DTensor parameters' meshes and placements), never from guesses on class names.
* ``class_name(module)``: the user's class name (FSDP2 swaps ``Net`` for a generated ``FSDPNet``).
* ``is_sharded`` / ``has_buckets``: whether the estimator must trace a twin (``predict.twins``), and
  whether a DDP wrapper has its buckets.

Reads the live model and changes nothing. The collectives a layout issues are
``predict.layout_collectives``; the meta twins the estimator traces are ``predict.twins``; the live
count of micro-batches that reduce gradients is ``measure.grad_sync``.
"""
from __future__ import annotations

import torch

from perfcheck.model_paths import unwrap

def is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor" or hasattr(t, "device_mesh") and hasattr(t, "placements")



def fsdp_modules(model) -> list:
    """Modules ``fully_shard`` was applied to (FSDP2), outermost first."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]



def class_name(module) -> str:
    """The user's class name: FSDP2's generated ``FSDP<Name>`` class maps back to ``<Name>``."""
    cls = type(module)
    if fsdp_modules_class(cls):
        for base in cls.__mro__[1:]:
            if base.__name__ != "FSDPModule" and issubclass(base, torch.nn.Module) and not fsdp_modules_class(base):
                return base.__name__
    return cls.__name__



def fsdp_modules_class(cls) -> bool:
    return any(b.__name__ == "FSDPModule" for b in cls.__mro__) and cls.__name__ != "FSDPModule"



def _mesh_info(mesh) -> dict:
    names = list(mesh.mesh_dim_names or [])
    return {"mesh_shape": list(mesh.mesh.shape), "mesh_dim_names": names}



def detect_layout(model) -> dict:
    """The parallel layout of ``model`` (possibly DDP-wrapped): a dict for meta.json ``parallel``.

    kind: "ddp", "fsdp2", "tp", "fsdp2+tp", "ddp+tp" or "none"; dp (replicas of the batch:
    DDP and FSDP both split the batch), fsdp (ranks a parameter is sharded over by FSDP2), tp
    (ranks a DTensor TP/SP parameter is sharded over), sp (True when some module keeps activations
    sharded on the sequence: a SequenceParallel style), mesh_shape / mesh_dim_names.
    """
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    info = {"world_size": world}
    ddp = type(model).__name__ == "DistributedDataParallel"
    inner = model.module if ddp else model
    fsdp = fsdp_modules(inner)
    fsdp_size, tp_size, mesh = 1, 1, None
    groups = [m._get_fsdp_state()._fsdp_param_group for m in fsdp]
    group = next((g for g in groups if g is not None), None)
    if group is not None:
        mesh_info = getattr(group, "mesh_info", None)
        if mesh_info is not None:
            fsdp_size = int(mesh_info.shard_mesh_size)
            mesh = mesh_info.mesh
    fsdp_dim_name = None
    if mesh is not None:
        names = list(mesh.mesh_dim_names or [])
        fsdp_dim_name = names[0] if names else None
    for p in inner.parameters():
        if not is_dtensor(p):
            continue
        m = p.device_mesh
        names = list(m.mesh_dim_names or [])
        for i, placement in enumerate(p.placements):
            if type(placement).__name__ not in ("Shard", "_StridedShard"):
                continue
            name = names[i] if i < len(names) else None
            # FSDP2 shards dim 0 over its mesh: the dim FSDP named, or the only dim of a 1-D mesh
            if fsdp and (name is not None and name == fsdp_dim_name or name is None and m.ndim == 1 and i == 0):
                continue
            tp_size = max(tp_size, int(m.size(i)))
        if mesh is None or m.ndim > mesh.ndim:
            mesh = m
    parts = (["ddp"] if ddp else []) + (["fsdp2"] if fsdp else []) + (["tp"] if tp_size > 1 else [])
    info["kind"] = "+".join(parts) if parts else ("none" if world == 1 else "unknown")
    info["tp"] = tp_size
    info["fsdp"] = fsdp_size
    info["dp"] = max(1, world // tp_size) if (ddp or fsdp) else 1
    info["sp"] = _sequence_parallel(inner)
    if mesh is not None:
        info.update(_mesh_info(mesh))
    if fsdp:
        info["fsdp_units"] = len(fsdp)
    return info



def _sequence_parallel(model) -> bool:
    """True when parallelize_module gave some module a SequenceParallel style: its hooks are
    closures over SequenceParallel's own methods (torch/distributed/tensor/parallel/style.py)."""
    for m in model.modules():
        for hook in list(m._forward_pre_hooks.values()) + list(m._forward_hooks.values()):
            if mentions(hook, "SequenceParallel", depth=0):
                return True
    return False



def mentions(obj, name: str, depth: int) -> bool:
    if depth > 4 or obj is None:
        return False
    if name in (getattr(obj, "__qualname__", "") or "") or type(obj).__name__ == name:
        return True
    inner = [getattr(obj, "func", None), getattr(obj, "__self__", None)] + list(getattr(obj, "args", ()) or ())
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            inner.append(cell.cell_contents)
        except ValueError:
            continue
    return any(mentions(o, name, depth + 1) for o in inner if o is not obj)



def is_sharded(model) -> bool:
    """True when ``model`` holds FSDP2 units or DTensor parameters (the estimator must trace a twin)."""
    inner = unwrap(model)
    return bool(fsdp_modules(inner)) or any(is_dtensor(p) for p in inner.parameters())



def has_buckets(model) -> bool:
    return type(model).__name__ == "DistributedDataParallel" and getattr(model, "reducer", None) is not None
