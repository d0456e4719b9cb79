"""Human units for reports: seconds, counts, bytes, rates and ratios, with SI prefixes.

The one formatter of these for every page perfcheck prints (the console report, the HTML pages, the
ZeRO comparison and its answers, the CLI tables), so one number reads the same everywhere.

Inputs are SI (seconds, bytes, FLOPs, FLOP/s). Times never get a prefix above the second
(DeepSpeed's profiler printed "1.8 Gs" for a CPU forward); NaN and None print as "-".
"""
from __future__ import annotations

import math

_BIG = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"))


def _bad(x) -> bool:
    try:
        return x is None or math.isnan(float(x))
    except (TypeError, ValueError):
        return True


def _trim(x: float) -> str:
    """3-4 significant digits without trailing zeros: 1.25, 62.01, 698.8, 117."""
    if x == 0:
        return "0"
    digits = max(0, 3 - int(math.floor(math.log10(abs(x)))))
    text = f"{x:.{min(digits, 2)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fmt_time(seconds) -> str:
    """'1.25 ms', '698.8 us', '2.31 s', '0', '-': at most seconds, at least nanoseconds."""
    if _bad(seconds):
        return "-"
    s = float(seconds)
    if math.isinf(s):
        return "inf"
    if s == 0:
        return "0"
    a = abs(s)
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if a >= scale:
            return f"{_trim(s / scale)} {unit}"
    return f"{_trim(s / 1e-9)} ns"


def fmt_count(x, unit: str = "") -> str:
    """'62.01 K', '5.21 M' (+ unit), '117', '-'."""
    if _bad(x):
        return "-"
    v = float(x)
    if math.isinf(v):
        return "inf"
    for scale, prefix in _BIG:
        if abs(v) >= scale:
            return f"{_trim(v / scale)} {prefix}{unit}".rstrip()
    return f"{_trim(v)} {unit}".rstrip() if unit else _trim(v)


def fmt_rate(x, unit: str = "FLOP/s") -> str:
    """'9.51 GFLOP/s', '15 GB/s'."""
    if _bad(x):
        return "-"
    text = fmt_count(x, unit)
    return text if text.endswith(unit) else f"{text} {unit}"


def fmt_bytes(x) -> str:
    """Decimal bytes: '12.3 MB', '640 B'."""
    if _bad(x):
        return "-"
    text = fmt_count(x, "B")
    return text if text.endswith("B") else f"{text} B"


def fmt_gap(x) -> str:
    """A measured/predicted ratio: '7.03x', '0.41x', 'inf', '-'."""
    if _bad(x):
        return "-"
    v = float(x)
    if math.isinf(v):
        return "inf"
    return f"{v:.2f}x" if v < 10 else f"{v:.1f}x" if v < 1000 else f"{v:.0f}x"


def fmt_pct(x) -> str:
    if _bad(x):
        return "-"
    v = 100 * float(x)
    if math.isinf(v):
        return "inf"
    return f"{v:.1f}%" if v == 0 or abs(v) >= 0.1 else f"{v:.2g}%"
