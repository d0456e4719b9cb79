"""Per-step statistics of the kernel table: what the report's kernel breakdown and top-kernel table
show. A profiler window of several steps is summed in kernels.csv per (module, phase, name, step);
a plain window total divided by the step count lets one noisy step (a page fault, a cache flush,
another process) move every number, so the report shows the median over the profiled steps with
the smallest and largest step beside it.
"""
from __future__ import annotations

import pandas as pd


def kernel_step_stats(kernels: pd.DataFrame, profile_steps: float = 1.0,
                      keys=("module", "phase", "name")) -> tuple[pd.DataFrame, int, bool]:
    """Per group of ``keys``: the median, min and max over the profiled steps of its time (self_s)
    and the median launch count, from a kernel table with a ``step`` column; a group absent from a
    step counts 0 there (it did not run). Returns (frame: ``keys`` + median_s, min_s, max_s, count,
    largest median first; n_steps; per_step). Rows not tied to a step (step -1: device work no op
    claims) and a kernels.csv written before the step column (step NaN) are spread evenly over the
    steps (``profile_steps`` when no row has a step): their mean, min/max NaN; ``per_step`` is
    False when no row has a step (the old behaviour: window total / profile_steps)."""
    keys = list(keys)
    cols = keys + ["median_s", "min_s", "max_s", "count"]
    if kernels is None or kernels.empty:
        return pd.DataFrame(columns=cols), 0, False
    step = (pd.to_numeric(kernels["step"], errors="coerce") if "step" in kernels
            else pd.Series(float("nan"), index=kernels.index))
    tied = (step >= 0).to_numpy()
    steps = sorted(int(v) for v in step[tied].unique())
    n = len(steps) if steps else max(int(round(profile_steps)), 1)
    rest = kernels[~tied]
    even = rest.assign(t=rest["self_s"].astype(float) / n, c=rest["count"].astype(float) / n)
    even = even.groupby(keys)[["t", "c"]].sum()  # per group: its share of each step
    if not steps:
        out = pd.DataFrame({"median_s": even["t"], "min_s": float("nan"), "max_s": float("nan"),
                            "count": even["c"]}).reset_index()
    else:
        k = kernels[tied].assign(step=step[tied].astype(int), t=kernels["self_s"].astype(float),
                                c=kernels["count"].astype(float))
        wide = {}
        for v in ("t", "c"):
            w = k.pivot_table(index=keys, columns="step", values=v, aggfunc="sum", fill_value=0.0)
            w = w.reindex(index=w.index.union(even.index), columns=steps, fill_value=0.0)
            wide[v] = w.add(even[v].reindex(w.index, fill_value=0.0), axis=0)
        t = wide["t"]
        spread = t.index.isin(k.set_index(keys).index)  # groups with per-step rows; others: no spread
        out = pd.DataFrame({"median_s": t.median(axis=1), "min_s": t.min(axis=1).where(spread),
                            "max_s": t.max(axis=1).where(spread), "count": wide["c"].median(axis=1)}).reset_index()
    return out.sort_values("median_s", ascending=False, ignore_index=True)[cols], n, bool(steps)
