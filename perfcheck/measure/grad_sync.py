"""Live counting of the micro-batches whose backward reduces gradients under DDP or FSDP2.

``GradSyncCounter`` (DDP ``no_sync()``, FSDP2 ``set_requires_gradient_sync``) counts, per training
step, the root forwards whose backward reduces gradients; meta.json records it as
``grad_sync_micro_batches``, which ``analysis.step_comm.per_step_comm`` reads to scale the
gradient reductions per optimizer step.
"""
from __future__ import annotations

import torch

from perfcheck.model_paths import unwrap
from perfcheck.predict.layout import fsdp_modules

def grad_sync(model):
    """Whether the backward of the forward about to run reduces gradients: DDP's
    ``require_backward_grad_sync`` (False inside ``no_sync()``), FSDP2's ``reduce_grads`` of its
    parameter groups (False after ``set_requires_gradient_sync(False)``; any unit that reduces
    counts); None for a model with neither."""
    if type(model).__name__ == "DistributedDataParallel":
        return bool(getattr(model, "require_backward_grad_sync", True))
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
