"""PyTorch's own parallel engines as PerfCheck sees them: DDP, FSDP2 (``fully_shard``) and DTensor
tensor/sequence parallelism on a DeviceMesh, alone or combined.

* ``detect_layout(model)``: what meta.json records under ``parallel`` (kind, dp / fsdp / tp sizes,
  mesh shape and dimension names), read from the model itself (DDP wrapper, ``FSDPModule``
  instances, DTensor parameters' meshes and placements), never from guesses on class names.
* ``class_name(module)``: the user's class name (FSDP2 swaps ``Net`` for a generated ``FSDPNet``).
* ``meta_twin(model)``: an unparallelised copy on the meta device (global parameter shapes, no
  hooks, no DTensors), so the estimator can trace the structure of a live FSDP2/TP model without
  touching its state; the live model's next forward still works (``FSDP2 + out_dir`` used to
  raise "mixed torch.Tensor and DTensor").
* ``live_collectives(model)``: the collectives of one step predicted from the live model's layout:
  DDP one all-reduce per bucket; FSDP2 per ``fully_shard`` unit one all-gather in forward, one in
  backward (unless ``reshard_after_forward=False``), one reduce-scatter in backward, each of the
  unit's padded unsharded bytes.
* ``tp_twin(model, make_local)``: the model as one rank computes it: FSDP2 stripped (its
  all-gathered shapes), TP parameters DTensors on their TP mesh (under FSDP2+TP FSDP's mesh
  dimension dropped, from FSDP2's own record of the TP spec), the parallel styles' hooks kept.
  ``meta_tp_twin`` (meta local shards) is what the estimator traces for per-rank compute;
  ``dtensor_twin(model, fake)`` (fake local shards) is what
  ``perfcheck.predict.distributed.live_dtensor_collectives`` traces the TP/SP redistributes on under
  FakeTensorMode (funcol ops on fake tensors move nothing, so this runs on one rank of a real group).
* per optimizer step: ``issue_rate`` / ``per_step_collectives`` (predicted_collectives.csv's
  ``rate`` and ``calls_per_step``), ``GradSyncCounter`` (micro-batches whose backward reduces
  gradients: DDP ``no_sync()``, FSDP2 ``set_requires_gradient_sync``), ``per_step_comm`` (the
  report's per-module comm columns per optimizer step).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from perfcheck.schema import ROOT


PREDICTED_COLLECTIVES_CSV = "predicted_collectives.csv"
COLLECTIVE_FIELDS = ("module", "phase", "kind", "op", "bytes", "group_size", "dtype")


@dataclass(frozen=True)
class Collective:
    """One collective issued in a traced step."""

    module: str
    phase: str  # fwd / bwd
    kind: str
    op: str
    bytes: float
    group_size: int
    dtype: str


def ddp_bucket_collectives(ddp) -> list:
    """One all-reduce per DDP bucket: S = the bucket's bytes; issued in backward by the module that
    owns the bucket parameter used first in forward (its gradient is the bucket's last to arrive)."""
    from perfcheck.model_paths import module_paths

    inner = ddp.module
    paths = module_paths(inner)
    owner = {}
    for mod in inner.modules():
        for p in mod.parameters(recurse=False):
            owner.setdefault(id(p), paths.get(id(mod), ROOT))
    order = {id(p): i for i, p in enumerate(inner.parameters())}
    group = ddp.process_group.size() if getattr(ddp, "process_group", None) is not None else 1
    rows = []
    for bucket in ddp.reducer._get_zeros_like_grad_buckets():
        buf = bucket.buffer()
        params = bucket.parameters()
        first = min(params, key=lambda p: order.get(id(p), 0)) if params else None
        rows.append(Collective(owner.get(id(first), ROOT) if first is not None else ROOT, "bwd", "allreduce",
                               "ddp_bucket", float(buf.numel() * buf.element_size()), int(group),
                               str(buf.dtype).replace("torch.", "")))
    return rows


def _is_dtensor(t) -> bool:
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
        if not _is_dtensor(p):
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
            if _mentions(hook, "SequenceParallel", depth=0):
                return True
    return False


def _mentions(obj, name: str, depth: int) -> bool:
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
    return any(_mentions(o, name, depth + 1) for o in inner if o is not obj)


# ------------------------------------------------------------------------------------ twin
def meta_twin(model) -> torch.nn.Module:
    """An unparallelised copy of ``model`` on the meta device: the user's classes, global parameter
    shapes, no hooks, no DTensors, no FSDP state; ``model`` is left exactly as it was.

    Every module is shallow-copied into its original class (FSDP2's ``FSDPNet`` back to ``Net``)
    with fresh parameter/buffer/child dicts and empty hook dicts; attributes that are not tensors
    or modules (sizes, flags) are shared, which a forward only reads.
    """
    from perfcheck.model_paths import unwrap

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
    twin.perfcheck_optim_numel = int(_local(live).numel())
    return twin


def _meta_like(t):
    shape = tuple(t.shape)  # a DTensor's shape is the global one
    return torch.empty(shape, dtype=t.dtype, device="meta")


def _is_style_hook(hook) -> bool:
    """A forward (pre-)hook ``parallelize_module`` installed: a closure over its DeviceMesh
    (torch/distributed/tensor/_api.py distribute_module: ``lambda _, inputs: input_fn(module,
    inputs, device_mesh)``), not FSDP2's or perfcheck's."""
    return _mentions(hook, "DeviceMesh", depth=0)


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
    if _is_dtensor(p):
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

    from perfcheck.model_paths import unwrap

    model = unwrap(model)
    fsdp = _fsdp_params(model)

    def param(p):
        shape, mesh, placements = _unsharded_layout(p, fsdp)
        device = _local(p).device
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


def _local(t):
    return t._local_tensor if _is_dtensor(t) and hasattr(t, "_local_tensor") else t


def has_tensor_parallel(model) -> bool:
    """True when some parameter computes as a DTensor (tensor/sequence parallel, alone or under
    FSDP2): its compute per rank is its shard's, not the global shape's."""
    from perfcheck.model_paths import unwrap

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


# ----------------------------------------------------------------------- live collectives
def live_collectives(model) -> list:
    """Collectives of one training step read from a live model's layout (no forward run), a list
    of Collective: DDP buckets and FSDP2 units. DTensor TP/SP redistributes depend on the forward:
    ``perfcheck.predict.distributed.live_dtensor_collectives`` traces them on ``dtensor_twin``."""
    from perfcheck.model_paths import module_paths

    rows = []
    if type(model).__name__ == "DistributedDataParallel":
        rows += ddp_bucket_collectives(model)
        model = model.module
    paths = module_paths(model)
    for mod in fsdp_modules(model):
        group = mod._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        n = int(group.mesh_info.shard_mesh_size)
        elem = group.fsdp_params[0].sharded_param.element_size() if group.fsdp_params else 4
        # FSDP2 pads each parameter's dim-0 to a multiple of the shard size: S = sum of padded sizes
        total = sum(fp.padded_sharded_param_size.numel() * n for fp in group.fsdp_params) * elem
        dtype = str(group.fsdp_params[0].sharded_param.dtype).replace("torch.", "") if group.fsdp_params else ""
        path = paths.get(id(mod), ROOT)
        rows.append(Collective(path, "fwd", "allgather", "fsdp2_all_gather", float(total), n, dtype))
        is_root = mod is fsdp_modules(model)[0] and mod is model
        reshard = getattr(group, "post_forward_mesh_info", None) is not None and not is_root
        if reshard:
            rows.append(Collective(path, "bwd", "allgather", "fsdp2_all_gather", float(total), n, dtype))
        rows.append(Collective(path, "bwd", "reducescatter", "fsdp2_reduce_scatter", float(total), n, dtype))
    return rows


def is_sharded(model) -> bool:
    """True when ``model`` holds FSDP2 units or DTensor parameters (the estimator must trace a twin)."""
    from perfcheck.model_paths import unwrap

    inner = unwrap(model)
    return bool(fsdp_modules(inner)) or any(_is_dtensor(p) for p in inner.parameters())


def has_buckets(model) -> bool:
    return type(model).__name__ == "DistributedDataParallel" and getattr(model, "reducer", None) is not None


def add_live_collectives(frame, model, system, extra=()):
    """``add_collectives`` with ``live_collectives(model)`` and the ``extra`` Collectives (the traced
    TP/SP redistributes)."""
    return add_collectives(frame, live_collectives(model) + list(extra), system)


def _frame_phase(phase: str) -> str:
    """The predicted frame's column phase of a collective: optimizer-time reductions count with backward."""
    return "fwd" if phase == "fwd" else "bwd"


def _issuer_and_ancestors(module: str, index: dict):
    """The module that issued a collective and its ancestors that are rows of the frame (``index``:
    path -> row); the root for a module the frame lacks. A collective counts in each, like FLOPs."""
    from perfcheck.schema import parent_path

    path = module if module in index else ROOT
    while path is not None:
        if path in index:
            yield path
        path = parent_path(path)


def add_collectives(frame, rows, system):
    """Fill the communication columns of an estimate's terms (``predict.module_estimator.estimate_terms``)
    from the Collectives ``rows``: each counts in the module that issues it and in its ancestors (like
    FLOPs); its time on ``system``'s links is added to comm_<phase>_s, which
    ``predict.combine.predicted_times`` puts in pred_<phase>_s (optimizer-time reductions count with
    backward). A copy; ``attrs['collectives']`` lists the rows (predicted_collectives.csv)."""
    import numpy as np

    from perfcheck.predict import collectives as coll_model

    rows = list(rows)
    frame = frame.copy()
    frame["comm_fwd_bytes"], frame["comm_bwd_bytes"] = 0.0, 0.0
    frame["comm_fwd_s"], frame["comm_bwd_s"] = 0.0, 0.0
    kinds = {p: set() for p in frame["module"]}
    index = {p: i for i, p in enumerate(frame["module"])}
    for r in rows:
        t = float(np.asarray(coll_model.collective_time_s(r.kind, r.bytes, r.group_size, system)))
        phase = _frame_phase(r.phase)
        for path in _issuer_and_ancestors(str(r.module), index):
            frame.loc[frame.index[index[path]], f"comm_{phase}_bytes"] += r.bytes
            frame.loc[frame.index[index[path]], f"comm_{phase}_s"] += t
            kinds[path].add(r.kind)
    frame["comm_kind"] = [",".join(sorted(kinds.get(p, ()))) for p in frame["module"]]
    frame.attrs["collectives"] = [dict(r.__dict__) for r in rows]
    return frame


# ------------------------------------------------------------------- per optimizer step
#: How often a predicted collective is issued per optimizer step (``issue_rate``):
#: every micro-batch (forward/backward all-gathers, TP/SP redistributes), every micro-batch whose
#: backward reduces gradients (DDP's bucket all-reduces, FSDP2's reduce-scatters: not under DDP's
#: ``no_sync()`` or FSDP2's ``set_requires_gradient_sync(False)``), or once per step (DTensor
#: gradients left Partial, all-reduced when the optimizer first reads them).
RATES = ("micro_batch", "synced_micro_batch", "step")
#: predicted_collectives.csv: the Collective fields plus the rate and the calls per optimizer step.
PREDICTED_COLLECTIVE_FIELDS = COLLECTIVE_FIELDS + ("rate", "calls_per_step")


def issue_rate(c) -> str:
    """``RATES`` entry of a Collective (or a dict with its fields): gradient reductions are DDP's
    bucket all-reduces (op ``ddp_bucket``), FSDP2's reduce-scatters (``fsdp2_reduce_scatter`` from
    the live layout; a c10d reduce-scatter/all-reduce issued in backward in a fake-group trace:
    TP/SP redistributes are functional collectives, never c10d ones) and, under FSDP2+TP, the
    Partial TP gradients FSDP2 all-reduces before them (``fsdp2_partial_grad``; a fake-group trace
    sees these as functional all-reduces and counts them every micro-batch); ``optim``-phase rows
    once per step; everything else every micro-batch."""
    get = c.get if isinstance(c, dict) else (lambda k: getattr(c, k))
    op, phase, kind = str(get("op")), str(get("phase")), str(get("kind"))
    if phase == "optim":
        return "step"
    if op in ("ddp_bucket", "fsdp2_reduce_scatter", "fsdp2_partial_grad"):
        return "synced_micro_batch"
    if phase == "bwd" and op.startswith("c10d.") and kind in ("reducescatter", "allreduce"):
        return "synced_micro_batch"
    return "micro_batch"


def per_step_collectives(rows, micro_batches=None, synced=None):
    """predicted_collectives.csv rows (``PREDICTED_COLLECTIVE_FIELDS``): each predicted collective of
    one micro-batch with its ``rate`` and ``calls_per_step``: ``micro_batches`` (root forwards per
    optimizer step; None: 1) for per-micro-batch ones, ``synced`` (micro-batches whose backward
    reduced gradients; None: all of them) for gradient reductions, 1 for per-step ones. ``bytes``
    stays S per call; bytes per step = bytes x calls_per_step."""
    import pandas as pd

    n = 1.0 if micro_batches is None else float(micro_batches)
    s = n if synced is None else float(synced)
    out = []
    for r in rows:
        d = dict(r) if isinstance(r, dict) else dict(r.__dict__)
        d["rate"] = issue_rate(d)
        d["calls_per_step"] = {"micro_batch": n, "synced_micro_batch": s, "step": 1.0}[d["rate"]]
        out.append(d)
    return pd.DataFrame(out, columns=list(PREDICTED_COLLECTIVE_FIELDS))


def bytes_per_step(frame) -> dict:
    """{kind: S bytes per optimizer step} of a predicted_collectives frame (bytes x calls_per_step;
    a file written before calls_per_step existed counts each row once)."""
    if frame is None or frame.empty:
        return {}
    calls = frame["calls_per_step"].astype(float) if "calls_per_step" in frame else 1.0
    per = frame.assign(_b=frame["bytes"].astype(float) * calls)
    return {k: float(v) for k, v in per.groupby("kind")["_b"].sum().items()}


def grad_sync(model):
    """Whether the backward of the forward about to run reduces gradients: DDP's
    ``require_backward_grad_sync`` (False inside ``no_sync()``), FSDP2's ``reduce_grads`` of its
    parameter groups (False after ``set_requires_gradient_sync(False)``; any unit that reduces
    counts); None for a model with neither."""
    if type(model).__name__ == "DistributedDataParallel":
        return bool(getattr(model, "require_backward_grad_sync", True))
    from perfcheck.model_paths import unwrap

    units = fsdp_modules(unwrap(model))
    if not units:
        return None
    flags = []
    for mod in units:
        state = mod._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group]
        flags += [bool(g.reduce_grads) for g in groups if g is not None]
    return any(flags) if flags else None


class GradSyncCounter:
    """Counts, per training step, the micro-batches (root forwards with grad enabled) whose backward
    reduces gradients (``grad_sync`` read when the forward starts, as DDP itself reads its flag
    there). ``attach(model)`` returns None for a model that neither DDP nor FSDP2 wraps."""

    def __init__(self, model):
        self.model, self.synced, self.total = model, 0, 0
        self.handle = model.register_forward_pre_hook(self._hook)

    @classmethod
    def attach(cls, model):
        return cls(model) if grad_sync(model) is not None else None

    def _hook(self, mod, args):
        if torch.is_grad_enabled():
            self.total += 1
            self.synced += int(bool(grad_sync(self.model)))

    def take(self) -> tuple:
        """(synced, total) micro-batches since the last take()."""
        out = (self.synced, self.total)
        self.synced, self.total = 0, 0
        return out

    def detach(self):
        self.handle.remove()


def read_predicted_collectives(rank_dir):
    """``rank<R>/predicted_collectives.csv`` as a frame (columns checked), None when absent."""
    from pathlib import Path

    from perfcheck.measure import rundir

    path = Path(rank_dir) / PREDICTED_COLLECTIVES_CSV
    if not path.is_file():
        return None
    frame = rundir.read_table(path, COLLECTIVE_FIELDS, "predicted collectives")
    return frame.assign(module=frame["module"].astype(str))  # a module path "0" is a name, not a number


def per_step_comm(pred, run, n, system, live=None):
    """``(pred, note)``: a prediction already scaled by ``n`` micro-batches (``analysis.pipeline``)
    with the collectives issued fewer than ``n`` times per optimizer step taken back out: gradient
    reductions skipped under DDP's ``no_sync()`` / FSDP2's ``set_requires_gradient_sync(False)``
    (meta.json ``grad_sync_micro_batches``) and Partial-gradient all-reduces (once per step): their
    bytes from comm_<phase>_bytes and their time from pred_<phase>_s, on the issuing module and its
    ancestors. The collectives are each rank's predicted_collectives.csv, or ``live``'s
    ``attrs['collectives']`` (a live PerfCheck's prediction). ``note``: what was done, None when
    the run has no predicted collectives (nothing changed)."""
    import numpy as np

    from perfcheck.hardware.systems import load_system
    from perfcheck.measure import rundir
    from perfcheck.predict import collectives as coll_model

    spec = None
    out = pred.copy()
    out.attrs = dict(pred.attrs)
    changed, removed = False, 0.0
    for rank in run.ranks:
        if live is not None and live.attrs.get("collectives"):
            rows = live.attrs["collectives"]
        else:
            frame = read_predicted_collectives(rundir.rank_dir(run.run_dir, rank))
            rows = frame.to_dict("records") if frame is not None else None
        if not rows:
            continue
        meta = run.meta.get(rank, {})
        table = per_step_collectives(rows, n, meta.get("grad_sync_micro_batches"))
        mask = (out["rank"] == rank) if "rank" in out else np.ones(len(out), bool)
        index = {p: i for i, p in zip(out.index[mask], out.loc[mask, "module"])}
        changed = True
        for r in table.itertuples(index=False):
            extra = float(n) - float(r.calls_per_step)
            if extra <= 0:
                continue
            spec = spec or load_system(system)
            t = float(np.asarray(coll_model.collective_time_s(r.kind, float(r.bytes), int(r.group_size), spec)))
            phase = _frame_phase(r.phase)
            removed += extra * float(r.bytes)
            for path in _issuer_and_ancestors(str(r.module), index):
                out.loc[index[path], f"comm_{phase}_bytes"] -= extra * float(r.bytes)
                out.loc[index[path], f"pred_{phase}_s"] -= extra * t
    if not changed:
        return pred, None
    return out, (f"collectives per optimizer step: all-gathers and TP/SP redistributes x{n:g} micro-batches, gradient "
                 f"reductions only on the micro-batches that synced them (DDP no_sync(), FSDP2 "
                 f"set_requires_gradient_sync; meta.json grad_sync_micro_batches), Partial-gradient all-reduces once "
                 f"({removed:.0f} B per step taken back out of the x{n:g} scaling over the ranks)")
