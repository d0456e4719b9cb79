"""Predict a torch-native parallel layout (DDP, FSDP2 ``fully_shard``, DTensor TP/SP, 2-D meshes)
from ONE process: the collectives every module issues, per rank, with FLOPs and memory per rank (see the NB on TP FLOPs).

How: the model is built and parallelised inside a *fake* process group (PyTorch's own, the
``"fake"`` backend of ``torch.testing._internal.distributed.fake_pg``: collectives complete at
once and move no data) under ``FakeTensorMode`` (no compute, no memory), then one forward and
backward run under

* a ``TorchDispatchMode`` that records every collective that reaches the dispatcher: c10d ops
  (``c10d._allgather_base_``, FSDP2's gathers and reduce-scatters) and functional collectives
  (``_c10d_functional.all_gather_into_tensor``, DTensor's redistributes), with kind, buffer bytes
  S (the nccl-tests convention of ``predict/collectives.py``: all-gather S = gathered output,
  reduce-scatter S = unreduced input, all-reduce S = the tensor) and group size;
* ``ModTracker`` for the module and phase that issued it (innermost module on the stack);
* ``FlopCounterMode`` for the FLOPs of each module. NB (helper-5, 2026-11-22): it counts a DTensor
  op at its logical (global) shapes, so under TP a column/row-parallel layer's count is tp times
  what one rank computes; FSDP2/DDP counts are per rank (plain tensors after the all-gather).

DDP's gradient all-reduce is issued by its C++ reducer straight to the process group, below the
dispatcher; it is predicted from the reducer's buckets instead (one all-reduce per bucket, S =
the bucket's bytes, issued in backward by the module that owns the bucket's first parameter in
forward order, which is the last gradient to arrive).

Never the live model's state: ``predict_parallel(build, ...)`` builds its own model inside the
fake group; ``trace_collectives(model, ...)`` on a model built there keeps every ``.grad`` as it
was. A model in a *real* process group is refused (its collectives would run for real on one rank
and hang the others).

Memory per rank: the local shards of parameters (DTensor ``to_local()``), their gradients, and
Adam's two fp32 states unless ``optimizer_states`` says otherwise; activations are not included
(``perfcheck.estimate`` reports them for the unsharded model).
"""
from __future__ import annotations

import contextlib
import re

import pandas as pd
import torch

from perfcheck.errors import UserError
from perfcheck.integrations.torch_distributed import Collective, ddp_bucket_collectives
from perfcheck.schema import ROOT

#: Columns of the per-collective table (one row per collective issued in one training step).
COLLECTIVE_COLUMNS = ("module", "phase", "kind", "op", "bytes", "group_size", "dtype")

_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
#: Ops of those namespaces that are not collectives (waits, bookkeeping, barriers).
_NOT_COLLECTIVES = ("wait", "wrap_tensor_autograd", "barrier", "monitored_barrier", "_register_process_group")

# S (the full buffer) per op family: which argument holds it and whether to multiply by the group.
#   c10d._allgather_base_(output, input, pg, ...)          S = output
#   c10d._reduce_scatter_base_(output, input, pg, ...)     S = input
#   c10d.allreduce_(tensors, pg, ...)                      S = sum(tensors)
#   _c10d_functional.all_gather_into_tensor(x, n, name)    S = x * n
#   _c10d_functional.reduce_scatter_tensor(x, op, n, name) S = x
#   _c10d_functional.all_reduce(x, op, name)               S = x


def op_kind(name: str) -> str | None:
    """Canonical collective kind for a c10d / functional-collective op or profiler event name
    (``c10d::_allgather_base_`` -> ``allgather``), None for waits and non-collectives."""
    from perfcheck.predict.collectives import normalize_kind

    base = re.split(r"::|\.", name)[-1] if ("::" in name or "." in name) else name
    if name.count(".") >= 2:  # c10d._allgather_base_.default
        base = name.split(".")[-2]
    base = base.strip("_")
    if any(w in base for w in _NOT_COLLECTIVES):
        return None
    try:
        return normalize_kind(base)
    except UserError:
        return None


def _group_size(arg) -> int | None:
    """Size of a c10d op's ProcessGroup argument (a ScriptObject), else None."""
    if type(arg).__name__ != "ScriptObject":
        return None
    try:
        return int(torch._C._distributed_c10d.ProcessGroup.unbox(arg).size())
    except Exception:  # noqa: BLE001 - not a ProcessGroup
        return None


def _named_group_size(name: str) -> int | None:
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group

        return int(_resolve_process_group(name).size())
    except Exception:  # noqa: BLE001 - an unknown group name: size unknown
        return None


def _dispatch_record(func, args) -> tuple | None:
    """(kind, S bytes, group size, dtype) for a dispatched collective op, or None."""
    name = str(func)
    if func.namespace not in _COLLECTIVE_NAMESPACES:
        return None
    kind = op_kind(name)
    if kind is None:
        return None
    flat = []
    for a in args:
        if isinstance(a, torch.Tensor):
            flat.append([a])
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            flat.append(list(a))
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], (list, tuple)):
            flat.append([t for sub in a for t in sub if isinstance(t, torch.Tensor)])
    tensors = [t for group in flat for t in group]
    if not tensors:
        return None
    functional = func.namespace != "c10d"
    if functional:  # (x, [op,] [group_size,] group_name)
        group = next((int(a) for a in args[1:] if isinstance(a, int) and not isinstance(a, bool)), None)
        if group is None and isinstance(args[-1], str):
            group = _named_group_size(args[-1])
    else:
        group = next((g for g in map(_group_size, args) if g), None)
    if functional and kind == "allgather":
        s = sum(t.numel() * t.element_size() for t in flat[0]) * (group or 1)
    elif functional:
        s = sum(t.numel() * t.element_size() for t in flat[0])
    elif kind in ("allgather", "reducescatter"):
        s = max(sum(t.numel() * t.element_size() for t in g) for g in flat)
    else:
        s = sum(t.numel() * t.element_size() for t in flat[0])
    return kind, float(s), int(group or 1), str(tensors[0].dtype).replace("torch.", "")


class _Recorder(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, where):
        super().__init__()
        self.where, self.rows = where, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        rec = _dispatch_record(func, args)
        if rec is not None:
            module, phase = self.where()
            self.rows.append(Collective(module, phase, rec[0], str(func.overloadpacket), rec[1], rec[2], rec[3]))
        return out


class _IssuerTracker:
    """The module that issues each op: in forward the innermost module on a stack kept by this
    object's own hooks (its pre-hook runs first and its post-hook last, so a parallel style's
    input/output redistributes count in the module that declares them); in backward the innermost
    module ModTracker has open (FSDP2's post-backward reduce-scatter runs after its module closes:
    it lands on the enclosing module, which is what ran it)."""

    def __init__(self, model, paths):
        from torch.distributed._tools.mod_tracker import ModTracker

        self.model, self.paths, self.stack, self.handles = model, paths, [], []
        self.mod_tracker = ModTracker()
        self.root_name = type(model).__name__

    def __enter__(self):
        for mod in {id(m): m for m in self.model.modules()}.values():
            path = self.paths.get(id(mod))
            if path is None:
                continue
            self.handles.append(mod.register_forward_pre_hook(self._push(path), prepend=True))
            self.handles.append(mod.register_forward_hook(self._pop(path), always_call=True))
        self.mod_tracker.__enter__()
        return self

    def __exit__(self, *exc):
        self.mod_tracker.__exit__(*exc)
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _push(self, path):
        def hook(mod, args):
            self.stack.append(path)
        return hook

    def _pop(self, path):
        def hook(mod, args, out):
            if self.stack and self.stack[-1] == path:
                self.stack.pop()
        return hook

    def where(self):
        from perfcheck.model_paths import clean_path

        if not self.mod_tracker.is_bw:
            return (self.stack[-1] if self.stack else ROOT), "fwd"
        parents = [p for p in self.mod_tracker.parents if p != "Global"]
        if not parents:
            return ROOT, "bwd"
        inner = max(parents, key=lambda p: p.count("."))
        return (ROOT if "." not in inner else clean_path(inner.split(".", 1)[1])), "bwd"


def fake_process_group(world_size: int, rank: int = 0):
    """Initialise the default process group with PyTorch's fake backend (no peers, no data moved).
    Refuses when a real group is already initialised; returns False when a fake one already is."""
    import torch.distributed as dist

    if world_size < 1 or rank < 0 or rank >= world_size:
        raise UserError(f"world_size/rank: need 0 <= rank < world_size, got rank={rank} world_size={world_size}")
    if dist.is_initialized():
        if dist.get_backend() != "fake":
            raise UserError("a real process group is initialised: predict the layout in a separate process "
                            "(perfcheck.predict.distributed.predict_parallel runs its own fake group)")
        if dist.get_world_size() != world_size:
            raise UserError(f"world_size: the fake process group has {dist.get_world_size()} ranks, not {world_size}")
        return False
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    return True


def _ddp(model):
    return next((m for m in [model] if type(m).__name__ == "DistributedDataParallel"), None)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def memory_per_rank(model, optimizer_states: int = 2, state_bytes: int = 4) -> dict:
    """Bytes one rank holds for parameters (local shards), gradients and optimizer states."""
    seen, params = set(), 0
    trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        local = _local(p)
        n = local.numel() * local.element_size()
        params += n
        if p.requires_grad:
            trainable += local.numel()
    grads = sum(_local(p).numel() * _local(p).element_size() for p in model.parameters() if p.requires_grad)
    optim = trainable * state_bytes * optimizer_states
    return {"param_bytes": float(params), "grad_bytes": float(grads), "optim_bytes": float(optim),
            "total_bytes": float(params + grads + optim)}


def trace_collectives(model, example_inputs, *, kwargs=None, loss_fn=None) -> tuple:
    """One fake forward+backward of a model built in a fake process group: (collectives, flops).

    ``collectives``: DataFrame (COLLECTIVE_COLUMNS), one row per collective of the step.
    ``flops``: {module path: (fwd FLOPs, bwd FLOPs)} (FlopCounterMode: DTensor ops at global shapes).
    ``.grad`` of every parameter is restored afterwards; the forward runs under FakeTensorMode.
    """
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not dist.is_initialized() or dist.get_backend() != "fake":
        raise UserError("model: trace_collectives needs a model built in a fake process group "
                        "(use predict_parallel, or fake_process_group() before building it)")
    return trace_step(model, example_inputs, FakeTensorMode(allow_non_fake_inputs=True), kwargs=kwargs, loss_fn=loss_fn)


def trace_step(model, example_inputs, fake, *, kwargs=None, loss_fn=None) -> tuple:
    """``trace_collectives`` under the FakeTensorMode ``fake``, with no check of the process group:
    for a model whose collectives cannot reach a real group (built in a fake group, or a twin whose
    DTensor parameters hold fake local shards: funcol ops on fake tensors run their fake kernels
    and move nothing; ``live_dtensor_collectives``)."""
    from torch.utils.flop_counter import FlopCounterMode

    if isinstance(example_inputs, torch.Tensor) or not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    ddp = _ddp(model)
    # DDP's reducer all-reduces from C++ below the dispatcher (and its comm hook cannot run on
    # fake tensors): the inner module is traced, the buckets are added from the reducer.
    inner = ddp.module if ddp is not None else model
    from perfcheck.model_paths import clean_path, module_paths

    paths = module_paths(inner)
    saved_grads = [(p, p.grad) for p in inner.parameters()]
    tracker = _IssuerTracker(inner, paths)
    recorder = _Recorder(tracker.where)
    counter = FlopCounterMode(display=False)
    fwd_flops = {}
    try:
        with contextlib.ExitStack() as es:
            es.enter_context(fake)
            args = [fake.from_tensor(a) if isinstance(a, torch.Tensor) and not _is_fake(a) else a for a in example_inputs]
            kw = {k: fake.from_tensor(v) if isinstance(v, torch.Tensor) and not _is_fake(v) else v
                  for k, v in (kwargs or {}).items()}
            es.enter_context(tracker)
            es.enter_context(counter)
            es.enter_context(recorder)
            out = inner(*args, **kw)
            fwd_flops = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
            loss = loss_fn(out) if loss_fn is not None else _sum_outputs(out)
            loss.backward()
        pending = _partial_grad_reductions(inner, paths)
    except (RuntimeError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"example_inputs: the parallelised model rejected them under fake tensors: {first}") from exc
    finally:
        for p, g in saved_grads:
            p.grad = g
    rows = list(recorder.rows) + pending
    if ddp is not None:
        rows += ddp_bucket_collectives(ddp)
    frame = pd.DataFrame([r.__dict__ for r in rows], columns=list(COLLECTIVE_COLUMNS))
    totals = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    root_name = type(inner).__name__
    flops = {}
    for name, total in totals.items():
        if name == "Global":
            continue
        path = ROOT if name == root_name else clean_path(name.split(".", 1)[1])
        f = fwd_flops.get(name, 0)
        flops[path] = (float(f), float(total - f))
    return frame, flops


def live_dtensor_collectives(model, example_inputs, kwargs=None) -> list:
    """The DTensor TP/SP collectives of one step of a live model in a *real* process group, traced
    on ``integrations.torch_distributed.dtensor_twin`` under FakeTensorMode with ``trace_step`` (the
    same recorder and issuer rule as the fake-group trace): every redistribute the layout's
    forward and backward issue, and the Partial gradients reduced at the optimizer step. A list
    of Collective; the live model is not touched. ``example_inputs``: the rank's own (its batch,
    or its sequence shard under SP); meta tensors are fine (only shapes and dtypes are used).

    FSDP2+TP is refused (NotImplementedError): the FSDP mesh dimension would have to be stripped
    from the twin's placements; its FSDP collectives are still read from the live layout."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from perfcheck.integrations.torch_distributed import dtensor_twin, fsdp_modules
    from perfcheck.model_paths import unwrap

    inner = unwrap(model)
    if fsdp_modules(inner):
        raise NotImplementedError("live prediction of FSDP2+TP redistributes: trace the layout on a fake "
                                  "process group (perfcheck.predict.distributed.predict_parallel)")
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    twin = dtensor_twin(inner, fake)
    device = next((_local(p).device for p in inner.parameters() if hasattr(p, "placements")), torch.device("cpu"))

    def like(t):  # the input's shape and dtype, fake, on the shards' device
        if not isinstance(t, torch.Tensor):
            return t
        with fake:
            return torch.empty(tuple(t.shape), dtype=t.dtype, device=device).requires_grad_(t.requires_grad)

    if isinstance(example_inputs, torch.Tensor) or not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    frame, _ = trace_step(twin, [like(a) for a in example_inputs], fake,
                          kwargs={k: like(v) for k, v in (kwargs or {}).items()})
    return [Collective(**r) for r in frame.to_dict("records")]


def _partial_grad_reductions(model, paths) -> list:
    """DTensor gradients left ``Partial`` by backward (a sequence-parallel norm's weight: each rank
    holds its tokens' share) are all-reduced when first used, in the optimizer step; one row each."""
    rows = []
    for mod in model.modules():
        for p in mod.parameters(recurse=False):
            g = p.grad
            if g is None or not hasattr(g, "placements"):
                continue
            mesh = g.device_mesh
            for i, placement in enumerate(g.placements):
                if type(placement).__name__ == "Partial":
                    local = g.to_local()
                    rows.append(Collective(paths.get(id(mod), ROOT), "optim", "allreduce", "dtensor_partial_grad",
                                           float(local.numel() * local.element_size()), int(mesh.size(i)),
                                           str(local.dtype).replace("torch.", "")))
    return rows


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(_local(t), FakeTensor)


def _sum_outputs(out):
    from torch.utils._pytree import tree_flatten

    leaves = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    if not leaves:
        raise UserError("model: its output has no tensor that requires grad; give loss_fn= to build the loss")
    total = None
    for t in leaves:
        s = t.sum()
        s = s.full_tensor() if hasattr(s, "full_tensor") else s
        total = s if total is None else total + s
    return total


def predict_parallel(build, example_inputs, *, world_size: int, rank: int = 0, kwargs=None, loss_fn=None,
                     optimizer_states: int = 2) -> dict:
    """Build ``build()`` (which creates the model and applies DDP / fully_shard / parallelize_module
    on ``init_device_mesh``) in a fake process group of ``world_size`` ranks and predict one step.

    Returns ``{"collectives": DataFrame (COLLECTIVE_COLUMNS), "by_kind": DataFrame (kind, phase,
    bytes, count), "modules": DataFrame (module, flops_fwd, flops_bwd, comm_fwd_bytes,
    comm_bwd_bytes, comm_kind), "memory": {param/grad/optim/total bytes per rank}, "layout": dict}``.
    The fake group is destroyed afterwards if this call created it.
    """
    import torch.distributed as dist

    created = fake_process_group(world_size, rank)
    try:
        # build() runs as written (a DeviceMesh cannot be created under FakeTensorMode: it reads
        # its rank tensor); the step itself runs under FakeTensorMode, so only the parameters
        # (sharded: 1/fsdp or 1/tp of them) are allocated.
        model = build()
        if not isinstance(model, torch.nn.Module):
            raise UserError(f"build: must return the parallelised nn.Module, got {type(model).__name__}")
        return predict_model(model, example_inputs, kwargs=kwargs, loss_fn=loss_fn, optimizer_states=optimizer_states)
    finally:
        if created:
            dist.destroy_process_group()


def predict_model(model, example_inputs, *, kwargs=None, loss_fn=None, optimizer_states: int = 2) -> dict:
    """``predict_parallel`` for a model already built in the (fake) default process group."""
    from perfcheck.integrations.torch_distributed import detect_layout


    coll, flops = trace_collectives(model, example_inputs, kwargs=kwargs, loss_fn=loss_fn)
    by_kind = (coll.groupby(["kind", "phase"]).agg(bytes=("bytes", "sum"), count=("bytes", "size")).reset_index()
               if not coll.empty else pd.DataFrame(columns=["kind", "phase", "bytes", "count"]))
    return {"collectives": coll, "by_kind": by_kind, "modules": module_table(coll, flops),
            "memory": memory_per_rank(model, optimizer_states), "layout": detect_layout(model)}


def module_table(coll: pd.DataFrame, flops: dict) -> pd.DataFrame:
    """Per module: FLOPs on one rank and the collectives it issued (its own, not its children's)."""
    paths = list(dict.fromkeys(list(flops) + list(coll["module"]) if not coll.empty else list(flops)))
    rows = []
    for p in paths:
        own = coll[coll["module"] == p] if not coll.empty else coll
        f = flops.get(p, (0.0, 0.0))
        rows.append({"module": p, "flops_fwd": f[0], "flops_bwd": f[1],
                     "comm_fwd_bytes": float(own.loc[own["phase"] == "fwd", "bytes"].sum()),
                     "comm_bwd_bytes": float(own.loc[own["phase"] == "bwd", "bytes"].sum()),
                     "comm_kind": ",".join(sorted(set(own["kind"])))})
    return pd.DataFrame(rows, columns=["module", "flops_fwd", "flops_bwd", "comm_fwd_bytes", "comm_bwd_bytes",
                                       "comm_kind"])


def bytes_by_kind(coll: pd.DataFrame) -> dict:
    """{kind: S bytes per step} summed over phases and modules."""
    if coll is None or coll.empty:
        return {}
    return {k: float(v) for k, v in coll.groupby("kind")["bytes"].sum().items()}


def estimate_sharded(model, example_inputs, *, system=None, dtype=None, causal=False, kwargs=None,
                     optimizer="sgd") -> pd.DataFrame:
    """``perfcheck.estimate`` for an FSDP2 / DTensor model: the compute columns come from an
    unparallelised meta twin (integrations.torch_distributed.meta_twin; the live model is not
    touched) run on ``example_inputs`` as given (the rank's batch, or its sequence shard under SP);
    the communication columns from the collectives the layout issues: traced on a fake process
    group when one is the default group (every funcol/c10d op, per module), otherwise read from the
    live layout (FSDP2 units, DDP buckets).

    NB (helper-5, 2026-11-22): under tensor parallelism the twin's compute is the whole layer's,
    tp times one rank's; ``predict_parallel(...)["modules"]`` has FlopCounterMode's counts (also
    at DTensor ops' global shapes, see the module docstring). ``attrs['flops_traced']`` carries them.
    """
    import numpy as np
    import torch.distributed as dist

    from perfcheck.hardware.systems import load_system
    from perfcheck.integrations import torch_distributed as native
    from perfcheck.predict import collectives as coll_model
    from perfcheck.model_paths import unwrap
    from perfcheck.predict.module_estimator import default_system_name, estimate
    from perfcheck.schema import parent_path

    spec = load_system(system if system is not None else default_system_name())
    frame = estimate(native.meta_twin(model), example_inputs, system=spec, dtype=dtype, causal=causal,
                     kwargs=kwargs, optimizer=optimizer)
    if not (dist.is_available() and dist.is_initialized() and dist.get_backend() == "fake"):
        inner = unwrap(model)
        tp = not native.fsdp_modules(inner) and any(hasattr(p, "placements") for p in inner.parameters())
        extra = live_dtensor_collectives(inner, example_inputs, kwargs) if tp else []
        out = native.add_live_collectives(frame, model, spec, extra)
        out.attrs["collectives_source"] = ("live layout (FSDP2 units, DDP buckets) and TP/SP redistributes traced on "
                                           "a twin with fake shards")
        return out
    coll, flops = trace_collectives(model, example_inputs, kwargs=kwargs)
    frame = frame.copy()
    frame["comm_fwd_bytes"], frame["comm_bwd_bytes"] = 0.0, 0.0
    index = {p: i for i, p in enumerate(frame["module"])}
    kinds = {p: set() for p in frame["module"]}
    for r in coll.itertuples(index=False):
        phase = "fwd" if r.phase == "fwd" else "bwd"  # optimizer-time reductions count with backward
        t = float(np.asarray(coll_model.collective_time_s(r.kind, r.bytes, r.group_size, spec)))
        path = r.module if r.module in index else ROOT
        while path is not None:
            if path in index:
                i = frame.index[index[path]]
                frame.loc[i, f"comm_{phase}_bytes"] += r.bytes
                frame.loc[i, f"pred_{phase}_s"] += t
                kinds[path].add(r.kind)
            path = parent_path(path)
    frame["comm_kind"] = [",".join(sorted(kinds.get(p, ()))) for p in frame["module"]]
    frame.attrs["flops_traced"] = flops
    frame.attrs["collectives_source"] = "traced on the fake process group"
    return frame
