"""PerfCheck in a Lightning ``Trainer``: one line, a reportable run directory.

    from perfcheck.integrations.lightning import PerfCheckCallback
    trainer = L.Trainer(max_steps=100, callbacks=[PerfCheckCallback()])
    trainer.fit(lit_module, data)      # -> <default_root_dir>/<date>-perfcheck-<id>/rank<R>/...

Lightning calls ``training_step``, not ``forward``, so a PerfCheck on the LightningModule would see
its root never run (PerfCheck says so at the first step). The callback finds the module to time at
the first training batch: forward hooks on the LightningModule and every submodule (scoped to that
batch, then removed) record the outermost modules that ``training_step`` calls with grad enabled.
The LightningModule itself when ``training_step`` calls ``self(...)``; else that one submodule;
else the one with the most parameters, with a warning naming the others (PerfCheck times one root).
PerfCheck starts at the first optimizer step after that batch and steps at each optimizer step
(``trainer.global_step`` moved: gradient accumulation shows as ``micro_batches``), with the
optimizer Lightning steps; it stops (writing the run directory) when fitting ends or raises. DDP
strategies: one ``rank<R>/`` per rank in one directory; DeepSpeedStrategy: its config's
``"perfcheck"`` block sets PerfCheck's arguments (``integrations.deepspeed.block``).
"""
from __future__ import annotations

import warnings

import torch

try:  # the unified package first; the standalone one keeps its own Callback class
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - depends on what is installed
    try:
        from pytorch_lightning import Callback
    except ImportError as exc:
        raise ImportError("perfcheck.integrations.lightning needs lightning (pip install lightning)") from exc
except Exception as exc:  # noqa: BLE001 - a broken dependency of lightning (a torchvision built for another torch)
    raise ImportError(f"perfcheck.integrations.lightning: importing lightning failed: {exc!r}") from exc

from perfcheck.integrations.callbacks import CallbackRun, RunAccess
from perfcheck.measure.session import outermost_paths
from perfcheck.schema import ROOT


class OutermostCalls:
    """Forward hooks on ``root`` and its submodules that record which modules are called while no other
    of them is running (with grad enabled: a training forward), in call order. A context manager."""

    def __init__(self, root: torch.nn.Module):
        self.root = root
        self.called: list = []  # paths, outermost calls only
        self._depth = 0
        self._handles: list = []

    def __enter__(self):
        for name, mod in self.root.named_modules():
            path = name or ROOT
            self._handles.append(mod.register_forward_pre_hook(self._pre(path)))
            self._handles.append(mod.register_forward_hook(self._post, always_call=True))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return False

    def _pre(self, path):
        def hook(mod, args):
            if self._depth == 0 and torch.is_grad_enabled() and path not in self.called:
                self.called.append(path)
            self._depth += 1
        return hook

    def _post(self, mod, args, output):
        self._depth = max(self._depth - 1, 0)


def choose_root(root: torch.nn.Module, called: list) -> tuple:
    """``(path, module, untimed paths)``: the module to measure among the outermost ones called."""
    modules = dict(root.named_modules())
    paths = outermost_paths([p for p in called if p != ROOT]) if ROOT not in called else [ROOT]
    if not paths:
        return None, None, []
    if paths == [ROOT]:
        return ROOT, root, []
    size = {p: sum(t.numel() for t in modules[p].parameters()) for p in paths}
    best = max(paths, key=lambda p: size[p])  # first of the largest, in call order
    return best, modules[best], [p for p in paths if p != best]


class PerfCheckCallback(RunAccess, Callback):
    """A Lightning ``Callback`` that measures ``fit`` with ``perfcheck.PerfCheck`` on the module
    ``training_step`` calls. ``**perfcheck_kwargs``: PerfCheck's arguments (``out_dir`` default: a
    fresh folder under the Trainer's ``default_root_dir``). After fitting: ``run_dir``, ``perfcheck``,
    ``measured_path`` (the module's path inside the LightningModule; '(root)' for itself)."""

    def __init__(self, **perfcheck_kwargs):
        self._run = CallbackRun("PerfCheckCallback (lightning)", perfcheck_kwargs)
        self._probe = None
        self._target = None
        self._last_step = None
        self.measured_path = None

    def on_train_start(self, trainer, pl_module):
        self._probe, self._target, self._last_step = None, None, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._target is None and self._probe is None:
            self._probe = OutermostCalls(pl_module).__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._probe is not None:
            self._probe.__exit__(None, None, None)
            path, module, others = choose_root(pl_module, self._probe.called)
            self._probe = None
            if module is None:
                warnings.warn("perfcheck: training_step called no module of the LightningModule with grad enabled "
                              "in the first batch; nothing is measured", RuntimeWarning, stacklevel=2)
                self._target = False
                return
            if others:
                warnings.warn(f"perfcheck: training_step calls several modules ({', '.join([path] + others)}); "
                              f"measuring {path!r}, the largest (PerfCheck times one root module); pass a module "
                              "that calls them all, or measure the others separately", RuntimeWarning, stacklevel=2)
            self._target, self.measured_path = module, path
            self._last_step = trainer.global_step
            if trainer.global_step > 0:  # the batch ended an optimizer step: start at this boundary
                self._start(trainer)
            return
        if not self._target:
            return
        if trainer.global_step != self._last_step:
            self._last_step = trainer.global_step
            if self._run.pc is None:
                self._start(trainer)
            else:
                self._run.step()

    def _start(self, trainer):
        strategy = trainer.strategy
        name = type(strategy).__name__
        ds = getattr(strategy, "config", None) if "DeepSpeed" in name else None
        opts = list(getattr(trainer, "optimizers", []) or [])
        self._run.start(self._target, optimizer=opts[0] if len(opts) == 1 else None,
                        default_parent=trainer.default_root_dir, ds_config=ds if isinstance(ds, dict) else None,
                        data_parallel="DDP" in name)

    def on_train_end(self, trainer, pl_module):
        self._run.stop()

    def on_exception(self, trainer, pl_module, exception):
        if self._probe is not None:
            self._probe.__exit__(None, None, None)
            self._probe = None
        self._run.stop()
