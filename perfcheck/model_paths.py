"""How perfcheck names a model's modules, in predictions and measurements alike.

A path is what ``named_modules()`` of the user's model gives, with engine wrappers unwrapped
(DDP, DataParallel, DeepSpeed's engine: their ``module.`` prefix removed), nested transparent
wrappers dropped (FSDP1 units, activation-checkpoint wrappers: their attribute names removed, the
wrapped module keeps the path) and torch.compile's ``_orig_mod`` removed; the root is
``schema.ROOT``. The estimator and PerfCheck both call these functions, so their rows join.
"""
from __future__ import annotations

import torch

from perfcheck.schema import ROOT, strip_wrapper_prefix

WRAPPERS = ("DistributedDataParallel", "DataParallel", "DeepSpeedEngine")
#: Wrappers nested inside a model (FSDP units, activation-checkpoint wrappers): not hooked themselves
#: (the wrapped module is, under the wrapper's path) and their attribute name is dropped from paths.
TRANSPARENT_WRAPPERS = {"FullyShardedDataParallel": "_fsdp_wrapped_module", "CheckpointWrapper": "_checkpoint_wrapped_module"}
_DROPPED_COMPONENTS = frozenset(TRANSPARENT_WRAPPERS.values()) | {"_orig_mod"}


def clean_path(name: str) -> str:
    """Module path without wrapper prefixes and wrapper components (``module.``, ``_fsdp_wrapped_module``)."""
    parts = [p for p in strip_wrapper_prefix(name).split(".") if p and p not in _DROPPED_COMPONENTS]
    return ".".join(parts) if parts else ROOT


def is_wrapper(m) -> bool:
    return hasattr(m, "module") and isinstance(getattr(m, "module"), torch.nn.Module) and any(
        c.__name__ in WRAPPERS for c in type(m).__mro__)


def is_compiled(m) -> bool:
    return type(m).__name__ == "OptimizedModule" and hasattr(m, "_orig_mod")


def compiled_call(m) -> bool:
    """A module compiled in place by ``nn.Module.compile()`` (an instance ``_compiled_call_impl``,
    which torch's ``Module.__call__`` runs instead of ``_call_impl``): its hooks and submodules run
    inside the compiled region, so it is timed as a whole, like an ``OptimizedModule``."""
    impl = m.__dict__.get("_compiled_call_impl")
    return (impl is not None and not getattr(impl, "perfcheck_timer", False)  # (PerfCheck's own timed call)
            and type(m).__name__ != "OptimizedModule" and type(m).__call__ is torch.nn.Module.__call__)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DDP / DataParallel / DeepSpeed engines and torch.compile (the estimator
    traces shapes; it never runs compiled code)."""
    while is_wrapper(model) or is_compiled(model):
        model = model.module if is_wrapper(model) else model._orig_mod
    return model


def module_paths(model: torch.nn.Module) -> dict:
    """id(module) -> qualified path, named as PerfCheck names measured rows (root: schema.ROOT;
    wrapper components such as ``_fsdp_wrapped_module`` or ``_orig_mod`` dropped; a shared module
    keeps its first path). Transparent wrappers themselves get no path: their inner module does."""
    paths = {}
    for name, mod in model.named_modules():
        if type(mod).__name__ in TRANSPARENT_WRAPPERS or is_compiled(mod):
            continue
        paths.setdefault(id(mod), clean_path(name) if name else ROOT)
    return paths
