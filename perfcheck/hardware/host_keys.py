"""The names of the host constants built from parts (an optimizer implementation's line, a ZeRO stage and
phase, a dtype): one function per family, so that grep finds every place a key is written
(``perfcheck/calibrate``) or read (``perfcheck.predict.host``). ``perfcheck.hardware.systems.HOST_KEYS``
lists them all with their meaning.
"""
from __future__ import annotations

#: The optimizer lines calibration measures (``perfcheck calibrate``'s ``optim <line> x<n>`` cases): the
#: SGD and Adam steps, each in its for-loop and its foreach implementation.
OPTIM_LINES = ("sgd", "sgd_foreach", "adam", "adam_foreach")
#: Phases of DeepSpeed's engine a ZeRO host term belongs to (``step``: the whole engine.step()).
ZERO_PHASES = ("fwd", "bwd", "step")
#: ZeRO stages with host terms.
ZERO_STAGES = (0, 1, 2, 3)
#: Per-what a ZeRO term is ('' the fixed part; module: per module call and gather: per partitioned tensor, ZeRO-3).
ZERO_TERMS = ("", "tensor", "module", "gather")


def optim_line(base: str, impl: str) -> str:
    """The calibrated line (``OPTIM_LINES``) of an optimizer family ``base`` (sgd | adam) in implementation
    ``impl`` (for-loop | foreach | fused: fused runs on the foreach line)."""
    return base if impl == "for-loop" else f"{base}_foreach"


def optim_step_key(line: str) -> str:
    """The fixed cost per step of an optimizer line: ``optim_step_s`` for SGD's for-loop (the first one measured),
    ``optim_<line>_step_s`` for the others."""
    return "optim_step_s" if line == "sgd" else f"optim_{line}_step_s"


def optim_per_tensor_key(line: str) -> str:
    """The host seconds per parameter tensor of an optimizer line."""
    return f"optim_{line}_per_tensor_s"


def zero_key(stage: int, phase: str, term: str = "") -> str:
    """DeepSpeed's host term of ZeRO ``stage`` in ``phase`` (``ZERO_PHASES``): ``zero<S>_<phase>_s`` (fixed),
    ``zero<S>_<phase>_<term>_s`` for a term of ``ZERO_TERMS``."""
    return f"zero{stage}_{phase}_{term}_s" if term else f"zero{stage}_{phase}_s"


def op_cold_key(dtype: str | None = None) -> str:
    """``op_cold_s``, or ``op_cold_<dtype>_s`` for a low-precision dtype's own (``systems.LOW_HOST_DTYPES``)."""
    return f"op_cold_{dtype}_s" if dtype else "op_cold_s"
