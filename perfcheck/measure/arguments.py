"""PerfCheck's arguments checked when it is built, so a bad one fails before the run, in one line."""
from __future__ import annotations

import os

from perfcheck.errors import UserError
from perfcheck.hardware.systems import SystemSpec, load_system


def nonneg_int(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def refuse_meta_tensors(root) -> None:
    """A model with parameters or buffers on the meta device (shapes, no data: ``torch.device("meta")``,
    ``init_empty_weights``) computes nothing, so there is nothing to time: one line naming the first."""
    for kind, named in (("parameter", root.named_parameters()), ("buffer", root.named_buffers())):
        for name, t in named:
            if t.is_meta:
                raise UserError(f"model: {kind} {name!r} is on the meta device (shapes without data, nothing to "
                                "measure); materialize the model first (model.to_empty(device=...) and load its "
                                "weights)")



def check_system(system):
    """``system`` as given, once it loads (a name from ``perfcheck systems``, a JSON file, a SystemSpec):
    a bad one fails when PerfCheck is built, not after the run."""
    if system is None:
        return None
    if not isinstance(system, (str, os.PathLike, SystemSpec)) or isinstance(system, bool):
        raise UserError(f"system: expected a system name, a JSON path or a SystemSpec, got {system!r}")
    try:
        load_system(system)
    except UserError as exc:
        raise UserError(f"system: {exc}") from None
    return system
