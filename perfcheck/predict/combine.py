"""The one writer of a module's predicted forward and backward time (``pred_fwd_s``, ``pred_bwd_s``) and of
what bounds it (``bound_fwd``, ``bound_bwd``), from the terms the estimator computes apart.

Terms (columns of the estimator's frame before it is trimmed to ``schema.PREDICTED_COLUMNS``), per phase p:

    timeline_p_s    device (roofline + per-kernel) and host (dispatch, autograd, module calls) work of the
                    module's ops on the two timelines (``perfcheck.predict.host.module_times``; they add on a CPU);
                    the backward's includes autograd's gradient accumulation, the ``grad_accumulate`` ops (k - 1 adds
                    where an activation feeds k autograd edges, in the backward of every consumer but the last:
                    ``perfcheck.predict.grad_accumulation``)
    tied_bwd_s      summing the gradients of tied parameters (``perfcheck.predict.host.tied_gradient_s``)
    comm_p_s        the module's collectives on the system's links: ZeRO/data-parallel ones from the parallel
                    config (``module_estimator``), or those a torch-native layout issues (``integrations.
                    torch_distributed.add_collectives``)
    host_p_s, device_p_s, roofline_bound_p   the host and device totals and the roofline's dominant bound

Rule (written here only):

    pred_fwd_s = timeline_fwd_s + comm_fwd_s
    pred_bwd_s = timeline_bwd_s + tied_bwd_s + comm_bwd_s
    bound_p    = comm  where comm_p_s > pred_p_s / 2, else host where host_p_s > device_p_s, else roofline_bound_p

NB: the ``comm`` label is given to the estimator's ZeRO/data-parallel communication only; a torch-native
layout's collectives (FSDP2, DTensor, DDP buckets) add their time but leave the bound as the host/roofline rule
says (``comm_bound=False``), as the estimate has always labelled them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from perfcheck.predict.host import host_bound

#: Columns ``predicted_times`` reads (``comm_fwd_s``/``comm_bwd_s`` and ``tied_bwd_s`` default to 0).
TERM_COLUMNS = ("timeline_fwd_s", "timeline_bwd_s", "tied_bwd_s", "comm_fwd_s", "comm_bwd_s", "host_fwd_s",
                "host_bwd_s", "device_fwd_s", "device_bwd_s", "roofline_bound_fwd", "roofline_bound_bwd")


def _term(frame: pd.DataFrame, col: str) -> np.ndarray:
    return frame[col].to_numpy(float) if col in frame else np.zeros(len(frame))


def predicted_times(frame: pd.DataFrame, comm_bound: bool = True) -> pd.DataFrame:
    """``frame`` with ``pred_fwd_s``, ``pred_bwd_s``, ``bound_fwd`` and ``bound_bwd`` written from its terms
    (the module docstring's rule; ``comm_bound``: whether communication can be the bound). The only place these
    four columns are written."""
    extra = {"fwd": np.zeros(len(frame)), "bwd": _term(frame, "tied_bwd_s")}
    for phase in ("fwd", "bwd"):
        comm = _term(frame, f"comm_{phase}_s")
        pred = frame[f"timeline_{phase}_s"].to_numpy(float) + extra[phase] + comm
        bound = np.where(host_bound(frame[f"host_{phase}_s"], frame[f"device_{phase}_s"]), "host",
                         frame[f"roofline_bound_{phase}"].to_numpy(object))
        frame[f"pred_{phase}_s"] = pred
        frame[f"bound_{phase}"] = np.where(comm_bound & (comm > 0.5 * pred), "comm", bound)
    return frame
