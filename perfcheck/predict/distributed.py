"""Predict a torch-native parallel layout (DDP, FSDP2 ``fully_shard``, DTensor TP/SP, 2-D meshes)
from ONE process: the collectives every module issues, per rank, with FLOPs and memory per rank.

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
* FlopCounterMode's formulas for the FLOPs of each module, per rank: a DTensor op is counted at its
  local shards' shapes (FlopCounterMode itself sees DTensor ops at their global shapes, tp times
  one rank's work); FSDP2/DDP compute on plain tensors (after the all-gather), counted as they are.

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
(``perfcheck.estimate`` reports them per rank: ``estimate_sharded``).

Bytes S of every collective follow one rule, ``predict.collective_bytes`` (the measurement reads
profiler shapes with it too). One row per collective of one micro-batch;
``predict.layout_collectives.per_step_collectives`` says how often each is issued per
optimizer step (gradient reductions only on synced micro-batches, Partial gradients once).
The terms of the per-rank time: docs/model.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings

import pandas as pd
import torch

from perfcheck.errors import UserError
from perfcheck.hardware.systems import spec_of
from perfcheck.model_paths import clean_path, module_paths, unwrap
from perfcheck.predict import collective_bytes, layout_collectives, twins
from perfcheck.predict.layout import detect_layout, fsdp_modules
from perfcheck.predict.layout_collectives import Collective, ddp_bucket_collectives
from perfcheck.predict.module_estimator import default_system_name, estimate_terms, finish
from perfcheck.predict.twins import dtensor_twin
from perfcheck.schema import ROOT

#: Columns of the per-collective table (one row per collective issued in one training step).
COLLECTIVE_COLUMNS = ("module", "phase", "kind", "op", "bytes", "group_size", "dtype")

def op_kind(name: str) -> str | None:
    """Canonical collective kind of an op or profiler event name (``collective_bytes.op_kind``)."""
    return collective_bytes.op_kind(name)


def _group_size(arg) -> int | None:
    """Size of a c10d op's ProcessGroup argument (a ScriptObject), else None."""
    if type(arg).__name__ != "ScriptObject":
        return None
    try:
        return int(torch._C._distributed_c10d.ProcessGroup.unbox(arg).size())
    except Exception:  # noqa: BLE001 - not a ProcessGroup
        return None


def _dispatch_record(func, args) -> tuple | None:
    """(kind, S bytes, group size, dtype) for a dispatched collective op, or None; S by the one
    rule of ``predict.collective_bytes`` (the measurement reads profiler shapes with it too)."""
    if func.namespace not in collective_bytes.NAMESPACES:
        return None
    name = str(func)
    kind = op_kind(name)
    if kind is None:
        return None
    groups = []  # per tensor argument: its tensors (a list argument: several; nested lists flattened)
    for a in args:
        if isinstance(a, torch.Tensor):
            groups.append([a])
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            groups.append(list(a))
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], (list, tuple)):
            groups.append([t for sub in a for t in sub if isinstance(t, torch.Tensor)])
    tensors = [t for g in groups for t in g]
    if not tensors:
        return None
    if func.namespace in collective_bytes.FUNCTIONAL_NAMESPACES:
        group = collective_bytes.functional_group_size(args)
    else:
        group = next((g for g in map(_group_size, args) if g), None)
    sizes = [[t.numel() * t.element_size() for t in g] for g in groups]
    s = collective_bytes.buffer_bytes(name, kind, sizes, group)
    return kind, float(s), int(group or 1), str(tensors[0].dtype).replace("torch.", "")


class _Recorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every collective with its issuer (``where()``: module, phase) and counts FLOPs with
    FlopCounterMode's own formulas (``torch.utils.flop_counter.flop_registry``) at each op's
    *local* shapes: a DTensor op is seen here before DTensor splits it, so its arguments and output
    are read through ``to_local()``; one rank's FLOPs, not the global op's (FlopCounterMode itself
    counts DTensor ops at their global shapes, tp times a rank's work). ``flops``:
    {(ModTracker name, phase): FLOPs}, each op added to every module open around it (inclusive,
    like FlopCounterMode)."""

    def __init__(self, where, tracker=None):
        super().__init__()
        self.where, self.rows, self.tracker, self.flops = where, [], tracker, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        rec = _dispatch_record(func, args)
        if rec is not None:
            module, phase = self.where()
            self.rows.append(Collective(module, phase, rec[0], str(func.overloadpacket), rec[1], rec[2], rec[3]))
        elif self.tracker is not None:
            self._count(func, args, kwargs or {}, out)
        return out

    def _count(self, func, args, kwargs, out):
        from torch.utils._pytree import tree_map
        from torch.utils.flop_counter import flop_registry

        formula = flop_registry.get(func.overloadpacket)
        if formula is None:
            return
        args, kwargs, out = tree_map(_local, (args, kwargs, out))
        n = float(formula(*args, **kwargs, out_val=out))
        phase = "bwd" if self.tracker.is_bw else "fwd"
        for name in set(self.tracker.parents):
            self.flops[(name, phase)] = self.flops.get((name, phase), 0.0) + n


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
    """A DTensor's local shard (read directly: no op dispatched), anything else itself."""
    local = getattr(t, "_local_tensor", None) if isinstance(t, torch.Tensor) and hasattr(t, "placements") else None
    return local if isinstance(local, torch.Tensor) else t


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
    ``flops``: {module path: (fwd FLOPs, bwd FLOPs)} per rank (FlopCounterMode's formulas at local shapes).
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
    if isinstance(example_inputs, torch.Tensor) or not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    ddp = _ddp(model)
    # DDP's reducer all-reduces from C++ below the dispatcher (and its comm hook cannot run on
    # fake tensors): the inner module is traced, the buckets are added from the reducer.
    inner = ddp.module if ddp is not None else model

    paths = module_paths(inner)
    saved_grads = [(p, p.grad) for p in inner.parameters()]
    tracker = _IssuerTracker(inner, paths)
    recorder = _Recorder(tracker.where, tracker.mod_tracker)
    try:
        with contextlib.ExitStack() as es:
            es.enter_context(warnings.catch_warnings())
            # FSDP2 warns that a unit "returned a view tensor" for the fake trace's outputs of a 2-D
            # FSDP2+TP layout (a warning about in-place use the trace never makes); the user's own
            # training warns for itself if their model has the problem
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module", category=UserWarning)
            es.enter_context(fake)
            args = [fake.from_tensor(a) if isinstance(a, torch.Tensor) and not _is_fake(a) else a for a in example_inputs]
            kw = {k: fake.from_tensor(v) if isinstance(v, torch.Tensor) and not _is_fake(v) else v
                  for k, v in (kwargs or {}).items()}
            es.enter_context(tracker)
            es.enter_context(recorder)
            out = inner(*args, **kw)
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
    root_name = type(inner).__name__
    flops = {}
    for (name, phase), n in recorder.flops.items():
        if name == "Global":
            continue
        path = ROOT if name == root_name else clean_path(name.split(".", 1)[1])
        f = flops.setdefault(path, [0.0, 0.0])
        f[0 if phase == "fwd" else 1] += n
    return frame, {p: (f[0], f[1]) for p, f in flops.items()}


def live_dtensor_collectives(model, example_inputs, kwargs=None) -> list:
    """The DTensor TP/SP collectives of one step of a live model in a *real* process group, traced
    on ``predict.twins.dtensor_twin`` under FakeTensorMode with ``trace_step`` (the
    same recorder and issuer rule as the fake-group trace): every redistribute the layout's
    forward and backward issue, and the Partial gradients reduced at the optimizer step. A list
    of Collective; the live model is not touched. ``example_inputs``: the rank's own (its batch,
    or its sequence shard under SP); meta tensors are fine (only shapes and dtypes are used).

    Under FSDP2+TP the twin drops FSDP's mesh dimension (``tp_twin``: FSDP2's record of each
    parameter's TP layout), so only the TP/SP redistributes are traced; FSDP2's own all-gathers and
    reduce-scatters are read from the live units (``live_collectives``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    inner = unwrap(model)
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
    rows = [Collective(**r) for r in frame.to_dict("records")]
    if fsdp_modules(inner):
        # under FSDP2 a Partial TP gradient is all-reduced by FSDP2's post-backward (before its
        # reduce-scatter, on the micro-batches that reduce gradients), not at the optimizer step
        rows = [dataclasses.replace(r, phase="bwd", op="fsdp2_partial_grad") if r.op == "dtensor_partial_grad" else r
                for r in rows]
    return rows


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
                     optimizer="sgd", step_other_s: float = 0.0) -> pd.DataFrame:
    """``perfcheck.estimate`` for an FSDP2 / DTensor model, per rank.

    Compute columns (FLOPs, bytes, activation memory, time): the estimator traces a twin of the
    model as one rank computes it; the live model is never touched. FSDP2 alone: an unparallelised
    meta twin (``predict.twins.meta_twin``: FSDP2 all-gathers before computing,
    so a rank computes the full layer on its batch). Tensor/sequence parallel, alone or under
    FSDP2: ``meta_tp_twin`` (TP parameters stay DTensors with meta local shards, FSDP's dimension
    dropped, the styles' hooks kept), whose every DTensor op is costed at its local shapes.
    ``example_inputs`` as this rank feeds them (its batch, or its sequence shard under SP).

    Communication columns: the collectives the layout issues, each on the module that issues it
    and its ancestors: traced on the fake process group when that is the default group (every
    funcol/c10d op), otherwise the live layout's FSDP2 units and DDP buckets plus the TP/SP
    redistributes traced on a twin with fake shards (``live_dtensor_collectives``).
    ``attrs['collectives']`` lists them (PerfCheck writes predicted_collectives.csv from it).
    """
    import torch.distributed as dist

    spec = spec_of(system if system is not None else default_system_name())
    tp = twins.has_tensor_parallel(model)
    twin = twins.meta_tp_twin(model) if tp else twins.meta_twin(model)
    terms = estimate_terms(twin, example_inputs, system=spec, dtype=dtype, causal=causal, kwargs=kwargs,
                           optimizer=optimizer, step_other_s=step_other_s)
    if not (dist.is_available() and dist.is_initialized() and dist.get_backend() == "fake"):
        extra = live_dtensor_collectives(unwrap(model), example_inputs, kwargs) if tp else []
        out = finish(layout_collectives.add_live_collectives(terms, model, spec, extra), comm_bound=False)
        out.attrs["collectives_source"] = ("live layout (FSDP2 units, DDP buckets) and TP/SP redistributes traced on "
                                           "a twin with fake shards")
        return out
    coll, flops = trace_collectives(model, example_inputs, kwargs=kwargs)
    out = finish(layout_collectives.add_collectives(terms, [Collective(**r) for r in coll.to_dict("records")], spec),
                 comm_bound=False)
    out.attrs["flops_traced"] = flops
    out.attrs["collectives_source"] = "traced on the fake process group"
    return out
