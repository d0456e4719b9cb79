"""modules.csv (schema.MEASURED_COLUMNS) from the per-step module rows: at stop(), and when a reader
rebuilds the summary of a rank that was cut short."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from perfcheck.schema import MEASURED_COLUMNS, module_depth

def summarize_module_steps(module_steps: pd.DataFrame, steps: pd.DataFrame, rank: int = 0,
                           flops: dict | None = None) -> pd.DataFrame:
    """schema.MEASURED_COLUMNS from per-step module rows, over the measured, non-failed steps.

    A module absent from a measured step counts as 0 s in that step (it did not run).
    ``flops`` maps path -> (forward FLOPs, backward FLOPs) from FlopCounterMode.
    """
    cols = list(MEASURED_COLUMNS)
    ok = steps[(steps["role"] == "measured") & ~steps["failed"].astype(bool)]["step"]
    n = len(ok)
    ms = module_steps[module_steps["step"].isin(set(ok))]
    if n == 0 or ms.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for path, g in ms.groupby("module", sort=False):
        pad = n - len(g)  # steps where the module did not run
        row = {"module": path, "type": g["type"].iloc[0], "depth": module_depth(path),
               "calls": float(np.median(np.r_[g["calls"].to_numpy(float), np.zeros(pad)])), "steps": n, "rank": rank}
        for col in ("fwd", "bwd", "recompute", "eval"):
            v = np.r_[g[f"{col}_s"].to_numpy(float), np.zeros(pad)]
            row.update({f"{col}_s_median": float(np.median(v)), f"{col}_s_mean": float(v.mean()),
                        f"{col}_s_min": float(v.min()), f"{col}_s_max": float(v.max())})
        row["eval_calls"] = float(np.median(np.r_[g["eval_calls"].to_numpy(float), np.zeros(pad)]))
        act, peak = g["act_mem_bytes"].to_numpy(float), g["peak_mem_bytes"].to_numpy(float)
        row["act_mem_bytes"] = float(np.median(act)) if np.isfinite(act).any() else math.nan
        row["peak_mem_bytes"] = float(np.nanmax(peak)) if np.isfinite(peak).any() else math.nan
        f_fwd, f_bwd = (flops or {}).get(path, (math.nan, math.nan))
        row["flops_fwd_counted"], row["flops_bwd_counted"] = float(f_fwd), float(f_bwd)
        row["fwd_flops_per_s"] = row["flops_fwd_counted"] / row["fwd_s_median"] if row["fwd_s_median"] > 0 else math.nan
        row["bwd_flops_per_s"] = row["flops_bwd_counted"] / row["bwd_s_median"] if row["bwd_s_median"] > 0 else math.nan
        rows.append(row)
    frame = pd.DataFrame(rows, columns=cols)
    return frame.sort_values("depth", kind="stable", ignore_index=True)
