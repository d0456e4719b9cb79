"""The kernel-table evidence of the reconciled frame: per (rank, module) subtree and profiled step, the
kernels (GPU) or aten ops (CPU) run, their time, and the shares spent in communication and irregular
memory access, with the largest irregular kernels by name."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from perfcheck.analysis.columns import PHASES2, module_paths
from perfcheck.analysis.comm import ancestors, subtree_sums
from perfcheck.errors import UserError

#: Kernel/op names of collectives and of irregular memory access (the roofline costs the latter
#: as streaming bytes; the TransformerConv graph model of perfcheck.examples.graph spends 47% of
#: its CUDA time on an Ampere (sm_80) GPU in index_select and scatter_add_, per torch.profiler).
COMM_KERNELS = re.compile(r"nccl|rccl|c10d::|gloo|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast", re.I)
IRREGULAR_KERNELS = re.compile(r"scatter|gather|index|nonzero|unique|sort|topk|cumsum|embedding_dense_backward"
                               r"|segment_reduce", re.I)
_NOT_MODULES = ("unattributed", "(optimizer)")


def profile_steps_of(profile_steps, kernels, rank) -> float:
    value = profile_steps if profile_steps is not None else kernels.attrs.get("profile_steps", 1)
    if isinstance(value, dict):
        value = value.get(rank, value.get(str(rank), 1))
    value = float(value)
    if not value > 0:
        raise UserError(f"reconcile: profile_steps must be positive, got {value!r}")
    return value


def kernel_summary(kernels: pd.DataFrame, profile_steps=None) -> pd.DataFrame:
    """Kernel-table evidence per (rank, module) summed over the module's subtree, per profiled step.

    Columns kernels_<p>, kernel_<p>_s, comm_kernel_<p>_s, irregular_kernel_<p>_s and
    irregular_kernels_<p> for p in fwd, bwd (see RECONCILED_COLUMNS).
    """
    k = kernels[kernels["phase"].isin(PHASES2) & ~kernels["module"].isin(_NOT_MODULES)]
    k = k[k["name"] != "(outside ops)"]  # Python/hook time inside a module range: not kernel time
    cols = [f"{c}_{p}" if not c.endswith("_s") else f"{c[:-2]}_{p}_s" for p in PHASES2
            for c in ("kernels", "kernel_s", "comm_kernel_s", "irregular_kernel_s")]
    if k.empty:
        return pd.DataFrame(columns=["rank", "module"] + cols + [f"irregular_kernels_{p}" for p in PHASES2])
    k = k.assign(module=module_paths(k["module"]), rank=k["rank"].fillna(0).astype(int) if "rank" in k else 0)
    names = k["name"].astype(str)
    cpu = k["device"].astype(str).eq("cpu").to_numpy() if "device" in k else np.zeros(len(k), bool)
    t = k["self_s"].to_numpy(float)
    counted = ~cpu | names.str.startswith("aten::").to_numpy()
    base = pd.DataFrame({"rank": k["rank"].to_numpy(), "module": k["module"].to_numpy(), "phase": k["phase"].to_numpy(),
                         "kernels": np.where(counted, k["count"].to_numpy(float), 0.0), "kernel_s": t,
                         "comm_kernel_s": np.where(names.str.contains(COMM_KERNELS).to_numpy(), t, 0.0),
                         # a collective (all_gather, reduce_scatter) is communication, never irregular access
                         "irregular_kernel_s": np.where((names.str.contains(IRREGULAR_KERNELS)
                                                         & ~names.str.contains(COMM_KERNELS)).to_numpy(), t, 0.0),
                         "name": names.to_numpy()})
    own = base.groupby(["rank", "module", "phase"], sort=False)[["kernels", "kernel_s", "comm_kernel_s",
                                                                 "irregular_kernel_s"]].sum().reset_index()
    anc = {m: ancestors(m) for m in own["module"].unique()}
    agg = subtree_sums(own, ["kernels", "kernel_s", "comm_kernel_s", "irregular_kernel_s"])
    wide = agg.set_index(["rank", "module", "phase"])[["kernels", "kernel_s", "comm_kernel_s",
                                                       "irregular_kernel_s"]].unstack("phase")
    wide.columns = [f"{c}_{p}" if not c.endswith("_s") else f"{c[:-2]}_{p}_s" for c, p in wide.columns]
    wide = wide.reset_index()
    for c in cols:
        if c not in wide:
            wide[c] = 0.0
    wide[cols] = wide[cols].fillna(0.0)
    steps = wide["rank"].map(lambda r: profile_steps_of(profile_steps, kernels, r)).to_numpy(float)
    for c in cols:
        wide[c] = wide[c].to_numpy(float) / steps
    wide = wide.merge(_irregular_names(base, anc), on=["rank", "module"], how="left")
    for p in PHASES2:
        col = f"irregular_kernels_{p}"
        wide[col] = wide[col].fillna("") if col in wide else ""
    return wide


def _irregular_names(base: pd.DataFrame, anc: dict) -> pd.DataFrame:
    """The (up to 3) largest irregular kernel names per (rank, module subtree, phase), ','-joined."""
    irr = base[base["irregular_kernel_s"] > 0]
    if irr.empty:
        return pd.DataFrame(columns=["rank", "module"])
    own = irr.groupby(["rank", "module", "phase", "name"], sort=False)["irregular_kernel_s"].sum().reset_index()
    lens = own["module"].map(lambda m: len(anc[m])).to_numpy()
    rep = own.loc[own.index.repeat(lens)].reset_index(drop=True)
    rep["module"] = [a for m in own["module"] for a in anc[m]]
    df = rep.groupby(["rank", "module", "phase", "name"], sort=False)["irregular_kernel_s"].sum().reset_index()
    df = df.sort_values("irregular_kernel_s", ascending=False, kind="stable")
    df["_n"] = df.groupby(["rank", "module", "phase"], sort=False).cumcount()
    df = df[df["_n"] < 3]
    wide = df.pivot(index=["rank", "module", "phase"], columns="_n", values="name")
    joined = wide[0].astype(str)
    for j in range(1, wide.shape[1]):
        joined = joined + ("," + wide[j]).fillna("")
    names = joined.unstack("phase")
    names.columns = [f"irregular_kernels_{p}" for p in names.columns]
    return names.reset_index()
