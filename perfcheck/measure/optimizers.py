"""Which optimizer a measured loop steps: given by the user, or seen through torch.optim's global step hooks.

The prediction costs one optimizer step (``predict.host.optimizer_time``), so it has to know the
optimizer: HF Trainer, accelerate and Lightning all default to AdamW, a hand-written loop may use
anything. ``OptimizerWatch`` registers ``torch.optim.optimizer.register_optimizer_step_post_hook``
while PerfCheck runs (one dict lookup per ``optimizer.step()``; removed at stop) and records each
optimizer the first time it steps. The one recorded in meta.json is, in order: the user's
``optimizer=``; the first seen whose parameter groups hold the model's parameters; the first seen
(frameworks that flatten or partition parameters, e.g. DeepSpeed ZeRO, step copies).

Names: ``"-".join(optimizer_kind(opt))`` without an unset implementation (``adamw``,
``adamw-foreach``, ``sgd_momentum-fused``); an optimizer ``optimizer_kind`` does not model is
recorded by class name (``Adagrad``) and the prediction says "optimizer Adagrad: not modelled"
(``predict.for_run.optimizer_for_run``).
"""
from __future__ import annotations

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from perfcheck.errors import UserError
from perfcheck.predict.host import optimizer_kind

#: Attributes under which frameworks keep the torch optimizer they wrap: accelerate's
#: AcceleratedOptimizer, DeepSpeed's ZeRO optimizers, Lightning's LightningOptimizer (``_optimizer``).
_WRAPPED = ("optimizer", "_optimizer")


def unwrap_optimizer(opt):
    """The innermost optimizer inside framework wrappers (some, like accelerate's, subclass
    torch.optim.Optimizer themselves): follow ``optimizer`` / ``_optimizer`` while it holds param_groups."""
    seen = set()
    while id(opt) not in seen:
        seen.add(id(opt))
        inner = next((getattr(opt, a) for a in _WRAPPED if hasattr(getattr(opt, a, None), "param_groups")), None)
        if inner is None:
            break
        opt = inner
    return opt


def optimizer_name(opt) -> str:
    """``"-".join(optimizer_kind(opt))`` (unset implementation left out), or the class name when not modelled."""
    if isinstance(opt, str):
        return "-".join(p for p in optimizer_kind(opt) if p)
    opt = unwrap_optimizer(opt)
    try:
        return "-".join(p for p in optimizer_kind(opt) if p)
    except (NotImplementedError, UserError):
        return type(opt).__name__


def check_optimizer(optimizer):
    """``optimizer=`` as given, once it names an optimizer: None, a name ``optimizer_kind`` knows, or an
    object with ``param_groups`` (a torch.optim optimizer or a wrapper around one)."""
    if optimizer is None:
        return None
    if isinstance(optimizer, str):
        try:
            optimizer_kind(optimizer)
        except UserError as exc:
            raise UserError(str(exc) if str(exc).startswith("optimizer") else f"optimizer: {exc}") from None
        return optimizer
    if not hasattr(unwrap_optimizer(optimizer), "param_groups"):
        raise UserError(f"optimizer: expected a torch.optim optimizer or a name such as 'adamw', got "
                        f"{type(optimizer).__name__}")
    return optimizer


class OptimizerWatch:
    """Records the optimizers that step while attached (global torch.optim post-step hook)."""

    def __init__(self, model: torch.nn.Module, given=None):
        self.given = given
        self._params = {id(p) for p in model.parameters()}
        self._seen: dict = {}  # id -> [weakref or None, name, holds the model's parameters]
        self._handle = None

    def attach(self) -> "OptimizerWatch":
        if self._handle is None:
            self._handle = register_optimizer_step_post_hook(self._on_step)
        return self

    def detach(self):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _on_step(self, opt, args, kwargs):
        if id(opt) in self._seen:
            return
        try:
            ref = weakref.ref(opt)
        except TypeError:
            ref = None
        ours = any(id(p) in self._params for g in opt.param_groups for p in g.get("params", ()))
        self._seen[id(opt)] = [ref, optimizer_name(opt), ours]

    def seen(self) -> list:
        """Names of every optimizer seen stepping, in the order they first stepped."""
        return [name for _, name, _ in self._seen.values()]

    def chosen(self) -> tuple:
        """``(name, source)`` for meta.json, or ``(None, why)``."""
        if self.given is not None:
            return optimizer_name(self.given), "optimizer= argument"
        ours = [name for _, name, mine in self._seen.values() if mine]
        if ours:
            return ours[0], "seen stepping the model's parameters (torch.optim step hook)"
        if self._seen:
            return self.seen()[0], ("seen stepping (torch.optim step hook); its parameters are not the model's own "
                                    "tensors (a framework's flattened or partitioned copies)")
        return None, "no optimizer step seen while PerfCheck ran (pass optimizer= to name it)"

    def meta(self) -> dict:
        name, source = self.chosen()
        return {"optimizer": name, "optimizer_source": source, "optimizers_seen": self.seen()}
