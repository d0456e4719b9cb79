"""What a DeepSpeed engine is, per rank: ZeRO stage, parallel sizes, parameters, model-state bytes.

Read from the engine's public accessors and from the tensors it holds; nothing is changed.
Parameters are counted with ``ds_numel`` (ZeRO-3 partitions them: ``p.numel()`` is 0 on every
rank for a partitioned parameter, which is why DeepSpeed's flops profiler printed "params of model
... 0" for JSC_Tiny, perfcheck.examples.models). Model-state bytes are the distinct tensor storages reachable from the model
and the optimizer, each counted once and classed as params, grads or optimizer states.
"""
from __future__ import annotations

import dataclasses
import os
import resource
import socket
import sys

import torch

from perfcheck.predict.zero import ZeroSettings, dtype_from_deepspeed_config

#: ZeRO knobs recorded in zero.json (engine accessor -> zero.ZeroSettings field).
_KNOBS = {"zero_reduce_bucket_size": "reduce_bucket_size", "zero_allgather_bucket_size": "allgather_bucket_size",
          "zero_prefetch_bucket_size": "prefetch_bucket_size",
          "zero_param_persistence_threshold": "param_persistence_threshold",
          "zero_model_persistence_threshold": "model_persistence_threshold",
          "zero_max_reuse_distance": "max_reuse_distance", "gradient_clipping": "gradient_clipping"}


def _call(engine, name, default=None):
    fn = getattr(engine, name, None)
    try:
        return fn() if callable(fn) else default
    except Exception:  # an accessor that does not apply to this engine/stage
        return default


def node_layout(world_size: int) -> dict:
    """Node rank and count from the launcher's environment (deepspeed: CROSS_RANK/CROSS_SIZE/LOCAL_SIZE,
    torchrun: GROUP_RANK/LOCAL_WORLD_SIZE); one node when nothing says otherwise."""
    env = os.environ
    local = int(env.get("LOCAL_SIZE") or env.get("LOCAL_WORLD_SIZE") or world_size)
    nodes = int(env.get("CROSS_SIZE") or max(1, world_size // max(local, 1)))
    node_rank = int(env.get("CROSS_RANK") or env.get("GROUP_RANK") or env.get("NODE_RANK") or 0)
    return {"node_rank": node_rank, "nodes": nodes, "ranks_per_node": local, "hostname": socket.gethostname(),
            "local_rank": int(env.get("LOCAL_RANK", 0))}


def zero_settings(engine) -> dict:
    """The ZeRO knobs of this engine, as ``zero.ZeroSettings`` fields."""
    out = {field: _call(engine, acc) for acc, field in _KNOBS.items()}
    zc = getattr(getattr(engine, "_config", None), "zero_config", None)
    for name in ("use_multi_rank_bucket_allreduce", "reduce_scatter"):
        out[name] = getattr(zc, name, None)
    out = {k: v for k, v in out.items() if v is not None}
    extra = {"overlap_comm": _call(engine, "zero_overlap_comm"),
             "contiguous_gradients": _call(engine, "zero_contiguous_gradients")}
    return {"settings": out, "other": extra}


def parameter_facts(module) -> dict:
    """Counts under ZeRO partitioning, per-module tensor sizes (registration order) and persistence."""
    seen, modules, persistent = set(), [], []
    total = visible = local = 0
    for path, m in module.named_modules():
        own = []
        for p in m.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            n = int(getattr(p, "ds_numel", 0) or p.numel())
            own.append(n)
            total += n
            visible += int(p.numel())
            ds_tensor = getattr(p, "ds_tensor", None)
            local += int(ds_tensor.numel()) if ds_tensor is not None else int(p.numel())
            if getattr(p, "ds_persist", False):
                persistent.append(n)
        if own:
            modules.append([path or "(root)", own])
    return {"params": total, "params_numel_visible": visible, "params_local_partition": local,
            "module_params": modules, "persistent_tensors": len(persistent), "persistent_params": sum(persistent)}


class _Storages:
    """Distinct storages (by data pointer) and their bytes per class."""

    def __init__(self):
        self.seen, self.bytes = set(), {"params": 0, "grads": 0, "optimizer": 0, "other": 0}

    def add(self, t, cls: str):
        if not isinstance(t, torch.Tensor) or t.is_meta:
            return
        try:
            st = t.untyped_storage()
            key, size = st.data_ptr(), st.nbytes()
        except (RuntimeError, NotImplementedError):
            return
        if size == 0 or key in self.seen:
            return
        self.seen.add(key)
        self.bytes[cls] += int(size)


def _walk(obj, fn, depth=0, name=""):
    if depth > 3 or isinstance(obj, torch.nn.Module):
        return
    if isinstance(obj, torch.Tensor):
        fn(obj, name)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, fn, depth + 1, name or str(k))
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _walk(v, fn, depth + 1, name)
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("deepspeed") and depth < 2:
        for k, v in vars(obj).items():
            _walk(v, fn, depth + 1, name or k)


def _classify(attribute: str) -> str:
    """Class of a tensor the ZeRO optimizer holds, by the attribute it hangs from."""
    name = attribute.lower()
    if "grad" in name:
        return "grads"
    if "fp32" in name or "single_partition" in name or "master" in name:
        return "optimizer"  # fp32 master partitions (fp32_partitioned_groups_flat, single_partition_of_fp32_groups)
    if "bit16" in name and "flat" in name or "fp16_partitioned" in name:
        return "params"
    return "other"


def model_state_bytes(engine) -> dict:
    """Bytes of distinct storages held for params, grads and optimizer states on this rank.

    params: the module's parameters (ZeRO-3: each rank's ``ds_tensor`` partition, plus any
    parameter currently gathered or persistent). optimizer: the inner optimizer's states and its
    parameters, and the ZeRO optimizer's fp32 master partitions. grads: ``.grad`` of either, and
    the ZeRO optimizer's gradient buffers (attributes named ``*grad*``). other: remaining buffers
    the ZeRO optimizer holds (communication buckets, ...). Scalars (norms, flags) are left out.
    """
    s = _Storages()
    params = list(engine.module.parameters())
    for p in params:
        s.add(p.data, "params")
        s.add(getattr(p, "ds_tensor", None), "params")
    opt = getattr(engine, "optimizer", None)
    inner = getattr(opt, "optimizer", opt)
    if isinstance(inner, torch.optim.Optimizer):
        for group in inner.param_groups:
            for p in group["params"]:
                s.add(p, "optimizer")
        for state in inner.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor) and v.numel() > 1:
                    s.add(v, "optimizer")
    for p in params:
        s.add(p.grad, "grads")
    if isinstance(inner, torch.optim.Optimizer):
        for group in inner.param_groups:
            for p in group["params"]:
                s.add(p.grad, "grads")
    if opt is not None and opt is not inner:
        _walk(vars(opt), lambda t, name: s.add(t, _classify(name)) if t.numel() > 1 else None)
    out = dict(s.bytes)
    out["model_states"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def peak_memory(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"peak_mem_bytes": int(torch.cuda.max_memory_allocated(device)),
                "peak_mem_kind": "torch.cuda.max_memory_allocated (since the measured window began)"}
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024
    return {"peak_mem_bytes": int(kb * scale),
            "peak_mem_kind": "process peak RSS (getrusage ru_maxrss): includes Python, torch and DeepSpeed themselves"}


def engine_facts(engine, ds_config: dict | None) -> dict:
    """Everything about the engine that does not change from step to step."""
    import deepspeed

    world = int(torch.distributed.get_world_size()) if torch.distributed.is_initialized() else 1
    rank = int(torch.distributed.get_rank()) if torch.distributed.is_initialized() else 0
    dp = int(getattr(engine, "dp_world_size", world) or world)
    mp = int(getattr(engine, "mp_world_size", 1) or 1)
    pp = int(_call(engine, "num_stages", 1) or 1) if hasattr(engine, "num_stages") else 1
    opt = getattr(engine, "optimizer", None)
    inner = getattr(opt, "optimizer", opt)
    cfg = dict(ds_config or {})
    if not cfg.get("bf16") and _call(engine, "bfloat16_enabled"):
        cfg["bf16"] = {"enabled": True}
    if not cfg.get("fp16") and _call(engine, "fp16_enabled"):
        cfg["fp16"] = {"enabled": True}
    facts = {
        "rank": rank, "world_size": world, "zero_stage": int(_call(engine, "zero_optimization_stage", 0) or 0),
        "dp": dp, "tp": max(1, mp // pp) if pp > 1 else mp, "pp": pp, "mp_size": mp,
        "gradient_accumulation_steps": int(_call(engine, "gradient_accumulation_steps", 1) or 1),
        "micro_batch_per_gpu": _call(engine, "train_micro_batch_size_per_gpu"),
        "train_batch_size": _call(engine, "train_batch_size"),
        "dtype": dtype_from_deepspeed_config(cfg),
        "optimizer": {"engine_optimizer": type(opt).__name__ if opt is not None else None,
                      "basic_optimizer": type(inner).__name__ if inner is not None else None},
        "comm_backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "deepspeed_version": deepspeed.__version__, "torch_version": torch.__version__,
        **node_layout(world), **zero_settings(engine), **parameter_facts(engine.module),
    }
    return facts


def config_facts(model, ds_config: dict, world_size: int) -> dict:
    """``engine_facts``' keys that the ZeRO prediction reads (``analysis.stage_prediction.predict``), from the
    DeepSpeed config and the model before ``deepspeed.initialize`` builds an engine: what a run's prediction saved
    at its start (``api.save_prediction``) knows. The optimizer by the config's type (DeepSpeed builds it)."""
    cfg = dict(ds_config or {})
    zero = dict(cfg.get("zero_optimization") or {})
    world = max(int(world_size), 1)
    return {"world_size": world, "zero_stage": int(zero.get("stage", 0)), "dp": world,
            "gradient_accumulation_steps": int(cfg.get("gradient_accumulation_steps", 1) or 1),
            "dtype": dtype_from_deepspeed_config(cfg),
            "optimizer": {"basic_optimizer": str((cfg.get("optimizer") or {}).get("type") or "adam")},
            "settings": dataclasses.asdict(ZeroSettings.from_deepspeed_config(cfg)),
            **node_layout(world), **parameter_facts(model)}
