"""What the HF Trainer and Lightning callbacks share: one PerfCheck per training run, built from the
callback's arguments, the framework's optimizer and layout, and a DeepSpeed config's ``"perfcheck"`` block.

The framework hands over the module whose forward really runs, its optimizer and, when DeepSpeed
runs, its config; ``CallbackRun`` turns these into a started ``PerfCheck`` (one run directory for
all ranks, ``rank<R>/`` inside, named on rank 0 and broadcast), steps it at each optimizer step and
stops it (which writes the run directory) when training ends. The callbacks stay thin adapters.
"""
from __future__ import annotations

import inspect
import logging
from pathlib import Path

from perfcheck.errors import UserError
from perfcheck.integrations.deepspeed.block import settings_for, shared_run_dir, zero_parallel
from perfcheck.session.api import PerfCheck

LOG = logging.getLogger("perfcheck")
#: PerfCheck's keyword arguments a callback accepts (everything but the model, which the framework gives).
PERFCHECK_ARGS = tuple(p for p in inspect.signature(PerfCheck.__init__).parameters if p not in ("self", "model"))


def check_kwargs(kwargs: dict, owner: str) -> dict:
    """The callback's PerfCheck arguments; an unknown one raises UserError naming it."""
    for key in kwargs:
        if key not in PERFCHECK_ARGS:
            raise UserError(f"{owner}: unknown argument {key!r} (PerfCheck's: {', '.join(PERFCHECK_ARGS)})")
    return dict(kwargs)


def world() -> tuple:
    """``(rank, world size)`` of torch.distributed, else ``(0, 1)``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class RunAccess:
    """What a framework callback shows of its ``CallbackRun`` (held as ``self._run``): ``run_dir``, the run
    directory once training started, and ``perfcheck``, the PerfCheck itself (``.report()`` after training)."""

    @property
    def run_dir(self):
        return self._run.run_dir

    @property
    def perfcheck(self):
        return self._run.pc


class CallbackRun:
    """One PerfCheck for one ``fit``/``train`` call of a framework."""

    def __init__(self, owner: str, kwargs: dict):
        self.owner = owner
        self.kwargs = check_kwargs(kwargs, owner)
        self.pc: PerfCheck | None = None
        self.run_dir: Path | None = None

    def start(self, model, *, optimizer=None, default_parent=".", ds_config=None, data_parallel: bool = False):
        """Build and start PerfCheck on ``model``. ``optimizer``: the framework's (wrappers are
        unwrapped); ``ds_config``: DeepSpeed's config when DeepSpeed runs (its block, its ZeRO
        layout); ``data_parallel``: the framework runs DDP (the prediction adds its all-reduces)."""
        if self.pc is not None and self.pc.state == "running":
            raise UserError(f"{self.owner}: training started again while the previous run is still measured")
        explicit = dict(self.kwargs)
        if optimizer is not None:
            explicit.setdefault("optimizer", optimizer)
        kwargs, _ = settings_for(ds_config, explicit, where=self.owner) if ds_config is not None else (explicit, None)
        _, n = world()
        if "parallel" not in kwargs:
            if ds_config is not None:
                kwargs["parallel"] = zero_parallel(ds_config, n)
            elif data_parallel and n > 1:
                kwargs["parallel"] = {"kind": "ddp", "dp": n, "world_size": n}
        if kwargs.get("out_dir") is None:
            kwargs["out_dir"] = shared_run_dir(Path(default_parent), "perfcheck")
        self.pc = PerfCheck(model, **kwargs)
        self.run_dir = Path(self.pc.out_dir)
        self.pc.start()
        LOG.info("perfcheck: measuring %s into %s", type(model).__name__, self.run_dir)
        return self.pc

    def step(self):
        if self.pc is not None and self.pc.state == "running":
            self.pc.step()

    def stop(self):
        """Stop measuring and write the run directory (``perfcheck report <run_dir>``)."""
        if self.pc is not None and self.pc.state == "running":
            self.pc.stop()
            LOG.info("perfcheck: run directory %s (perfcheck report %s)", self.run_dir, self.run_dir)
