"""The spec being built by ``calibrate.fit.build_spec`` (``Draft``) and the small functions every fitting
step shares: rows of one kind of the measurement table, a case's seconds, an efficiency capped at 1,
and the rate and size texts of the sources.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import pandas as pd

from perfcheck.hardware.systems import SystemSpec


def cap(x: float) -> float:
    return float(min(1.0, x))


def fp32_rows(rows: pd.DataFrame) -> pd.Series:
    """Rows of the fp32 (or untyped: older tables) host cases."""
    return rows["dtype"].fillna("").astype(str).isin(("fp32", "", "nan"))


def rows_of(table: pd.DataFrame, kind: str, **eq) -> pd.DataFrame:
    sel = table["kind"] == kind
    for col, value in eq.items():
        sel &= table[col] == value
    return table[sel]


def seconds_of(table, kind, label) -> Optional[float]:
    rows = rows_of(table, kind, label=label)
    return float(rows["seconds"].iloc[0]) if len(rows) else None


def fmt_rate(x, unit):
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def size_text(nbytes: float) -> str:
    for scale, unit in ((2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


@dataclasses.dataclass
class Draft:
    """The spec being built: fields to replace, sources, and the conventions every step needs."""

    base: SystemSpec
    peaks: str
    stamp: str
    kind: str
    matrix: dict
    vector: dict
    eff: dict
    sources: dict
    fields: dict = dataclasses.field(default_factory=dict)
    op_s: float = 0.0  # one plain tiny op, subtracted from matmul and vector times

    @property
    def relative(self) -> str:
        what = "the datasheet peak" if self.peaks == "base" else "the best measured rate"
        return f"as a fraction of {what}"
