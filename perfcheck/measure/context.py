"""What PerfCheck needs to know about the model and the process: module paths, wrappers,
torch.compile, device, dtype, rank, versions, and the example-input spec for meta.json."""
from __future__ import annotations

import importlib.metadata
import os
import platform
from dataclasses import dataclass, field

import torch

from perfcheck.errors import UserError
from perfcheck.model_paths import TRANSPARENT_WRAPPERS, clean_path, compiled_call, is_compiled, is_wrapper
from perfcheck.schema import PACKAGE_VERSION, ROOT

@dataclass
class ModelView:
    """The modules PerfCheck instruments, by path (wrapper prefixes removed)."""

    root: torch.nn.Module  # the module whose calls are the root's
    modules: list  # [(path, module)]
    types: dict  # path -> class name
    wrappers: list = field(default_factory=list)  # outer wrapper class names, outermost first
    compiled: list = field(default_factory=list)  # paths of torch.compile'd modules (children not hooked)
    outer: torch.nn.Module | None = None  # what the user passed


def model_view(model: torch.nn.Module) -> ModelView:
    """Unwrap DDP / DeepSpeed wrappers; a torch.compile'd module is hooked itself, its children not
    (hooks inside a compiled region would add graph breaks or recompiles)."""
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"PerfCheck needs a torch.nn.Module, got {type(model).__name__}")
    wrappers, m = [], model
    while is_wrapper(m):
        if type(m).__name__ == "DataParallel" and len(getattr(m, "device_ids", None) or []) > 1:
            raise NotImplementedError("PerfCheck does not support torch.nn.DataParallel over several devices: its "
                                      "replicas run the hooks concurrently in threads. Use DistributedDataParallel.")
        wrappers.append(type(m).__name__)
        m = m.module
    compiled: list[str] = []
    if is_compiled(m):
        inner = m._orig_mod
        while is_wrapper(inner) or is_compiled(inner):
            inner = inner.module if is_wrapper(inner) else inner._orig_mod
        return ModelView(m, [(ROOT, m)], {ROOT: type(inner).__name__}, wrappers, [ROOT], model)
    modules, types, skip = [], {}, []
    for name, mod in m.named_modules():
        if any(name.startswith(p) for p in skip):
            continue
        if type(mod).__name__ in TRANSPARENT_WRAPPERS:
            continue
        path = ROOT if name == "" else clean_path(name)
        if is_compiled(mod) or compiled_call(mod):
            skip.append(name + "." if name else "")  # (the root: every submodule)
            compiled.append(path)
            types[path] = type(getattr(mod, "_orig_mod", mod)).__name__
        else:
            types[path] = _class_name(mod)
        modules.append((path, mod))
    return ModelView(m, modules, types, wrappers, compiled, model)


def model_device(model: torch.nn.Module) -> torch.device:
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def model_dtype(model: torch.nn.Module) -> str | None:
    for t in model.parameters():
        if t.is_floating_point():
            return str(t.dtype).replace("torch.", "")
    return None


def rank_and_world() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def parallel_setup(view: ModelView, world_size: int) -> dict:
    """What is known about the parallel layout from the wrapper (merged with the user's dict)."""
    outer = view.outer
    if "DeepSpeedEngine" in view.wrappers:
        engine = outer
        while not any(c.__name__ == "DeepSpeedEngine" for c in type(engine).__mro__):
            engine = engine.module
        info = {"kind": "deepspeed", "world_size": world_size}
        for key, attr in (("zero_stage", "zero_optimization_stage"), ("gradient_accumulation_steps", "gradient_accumulation_steps"),
                          ("micro_batch_per_gpu", "train_micro_batch_size_per_gpu")):
            try:
                info[key] = getattr(engine, attr)()
            except Exception:  # engine API differences across versions: leave the key out
                continue
        for key, attr in (("dp", "dp_world_size"), ("mp", "mp_world_size")):
            if isinstance(getattr(engine, attr, None), int):
                info[key] = getattr(engine, attr)
        return info
    from perfcheck.predict.layout import detect_layout  # DDP, FSDP2, DTensor TP/SP, 2-D meshes

    info = detect_layout(outer if "DistributedDataParallel" in view.wrappers else view.root)
    info["world_size"] = world_size
    if info["kind"] in ("none", "unknown"):
        info["kind"] = "none" if world_size == 1 else "unknown"
    return info


def _class_name(mod) -> str:
    """The user's class name; FSDP2 swaps a module's class for a generated ``FSDP<Name>`` subclass."""
    cls = type(mod)
    if cls.__name__.startswith("FSDP") and any(b.__name__ == "FSDPModule" for b in cls.__mro__[1:]):
        return next((b.__name__ for b in cls.__mro__[1:] if b.__name__ != "FSDPModule"
                     and not b.__name__.startswith("FSDP")), cls.__name__)
    return cls.__name__


def describe(obj, depth: int = 0):
    """JSON-able spec of forward arguments: tensors as shape/dtype/device, containers recursively."""
    if isinstance(obj, torch.Tensor):
        return {"shape": list(obj.shape), "dtype": str(obj.dtype).replace("torch.", ""),
                "device": str(obj.device), "requires_grad": bool(obj.requires_grad)}
    if depth > 8:
        return {"type": type(obj).__name__}
    if isinstance(obj, (list, tuple)):
        return [describe(x, depth + 1) for x in obj]
    if isinstance(obj, dict):
        return {str(k): describe(v, depth + 1) for k, v in obj.items()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return {"value": obj}
    return {"type": type(obj).__name__}


def autocast_dtype() -> str | None:
    """The compute dtype of an enclosing ``torch.autocast`` region (CUDA first, then CPU), or None."""
    for device_type in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(device_type):
                return str(torch.get_autocast_dtype(device_type)).replace("torch.", "")
        except (TypeError, RuntimeError):  # torch < 2.4: no per-device-type query
            return None
    return None


def versions() -> dict:
    out = {"torch": torch.__version__, "perfcheck": PACKAGE_VERSION, "python": platform.python_version()}
    try:  # without importing deepspeed (slow, and it may initialize accelerators)
        out["deepspeed"] = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        out["deepspeed"] = None
    return out


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
    except OSError:  # not Linux
        names = []
    if names:
        return names[0]
    return platform.processor() or platform.machine() or "cpu"
