"""Row builders for reconcile's tests (tests/analysis, report, commands, integrations): a predicted row, a
measured row, a kernel row, a step table, with the schema's columns and the given values."""
import math

import pandas as pd

from perfcheck.schema import MEASURED_COLUMNS, PREDICTED_COLUMNS, STEP_COLUMNS, module_depth


def pred_row(module, pred_fwd, pred_bwd=0.0, **kw):
    row = {c: 0.0 for c in PREDICTED_COLUMNS}
    row.update(module=module, type=kw.pop("type", "Linear"), depth=module_depth(module), calls=1, params=10,
               comm_kind="", bound_fwd="overhead", bound_bwd="overhead", source="modeled",
               pred_fwd_s=pred_fwd, pred_bwd_s=pred_bwd)
    row.update(kw)
    return row


def meas_row(module, fwd, bwd=0.0, rank=0, **kw):
    row = {c: math.nan for c in MEASURED_COLUMNS}
    row.update(module=module, type=kw.pop("type", "Linear"), depth=module_depth(module), calls=1.0, steps=5, rank=rank,
               fwd_s_median=fwd, bwd_s_median=bwd, fwd_s_min=fwd, fwd_s_max=fwd, bwd_s_min=bwd, bwd_s_max=bwd,
               recompute_s_median=0.0)
    row.update(kw)
    return row


def kernel_row(module, phase, name, total_s, count=1, rank=0, device="cuda"):
    return {"module": module, "phase": phase, "name": name, "device": device, "count": count, "total_s": total_s,
            "self_s": total_s, "rank": rank}


def frames(preds, meas):
    return pd.DataFrame(preds), pd.DataFrame(meas)


def one(rec, module, rank=0):
    r = rec[(rec["module"] == module) & (rec["rank"] == rank)]
    assert len(r) == 1, (module, rank, len(r))
    return r.iloc[0]


def steps_frame(rows, rank=0):
    out = []
    for i, (role, fwd, bwd, optim, step, failed) in enumerate(rows):
        out.append({"step": i, "measured": role == "measured", "fwd_s": fwd, "bwd_s": bwd, "optim_s": optim,
                    "step_s": step, "recompute_s": 0.0, "peak_mem_bytes": math.nan, "role": role, "failed": failed,
                    "rank": rank})
    return pd.DataFrame(out, columns=list(STEP_COLUMNS))
