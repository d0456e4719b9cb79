"""The HTML page of ``perfcheck compare`` over torch-native layout runs (DDP / FSDP2 / TP+SP):
predicted vs measured bytes per collective kind, step time split into compute and collective
waits per rank, the answers of ``analysis.layouts.answers`` and the table. The page frame and PNG
embedding are stages_html's (``html_page``, ``figure_png``)."""
from __future__ import annotations

import pandas as pd

from perfcheck.analysis.layouts import answers
from perfcheck.predict.zero import KINDS
from perfcheck.report.stages_html import figure_png, html_page
from perfcheck.rundir import atomic_write_text


def bytes_figure(table: pd.DataFrame) -> str:
    """Bytes per step per collective kind, per run: predicted (plain) and measured (hatched), rank median."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = table.groupby("run", sort=False).median(numeric_only=True)
    kinds = [k for k in KINDS if per[[f"pred_{k}_bytes", f"meas_{k}_bytes"]].fillna(0).to_numpy().any()]
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    width = 0.8 / max(1, 2 * len(kinds))
    colors = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2")
    for j, k in enumerate(kinds):
        for w, who in enumerate(("pred", "meas")):
            x = [i - 0.4 + (2 * j + w + 0.5) * width for i in range(len(per))]
            ax.bar(x, per[f"{who}_{k}_bytes"].fillna(0) / 1e3, width, color=colors[j % len(colors)],
                   hatch="//" if who == "meas" else "", edgecolor="white", label=k if w == 0 else None)
    ax.set_xticks(range(len(per)), [f"{run}\n({table.loc[table['run'] == run, 'layout'].iloc[0]})" for run in per.index])
    ax.set_ylabel("kB per step per rank")
    ax.set_title("Collective bytes per kind: predicted (plain) | measured (hatched)")
    ax.legend(frameon=False)
    return figure_png(fig)


def time_figure(table: pd.DataFrame) -> str:
    """Measured step per (run, rank): compute and collective waits stacked, the prediction as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = table.sort_values(["run", "rank"])
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    x = range(len(ok))
    compute = ok["meas_compute_s"].fillna(0).clip(lower=0) * 1e3
    wait = ok["meas_wait_s"].fillna(0).clip(lower=0) * 1e3
    ax.bar(x, compute, 0.6, color="#4C72B0", label="compute (step less waits)")
    ax.bar(x, wait, 0.6, bottom=compute, color="#DD8452", label="collective waits")
    ax.plot(list(x), ok["pred_step_s"] * 1e3, "k.", markersize=10, label="predicted fwd+bwd")
    ax.set_xticks(list(x), [f"{r.run}\nrank {int(r.rank)}" for r in ok.itertuples(index=False)])
    ax.set_ylabel("ms per step")
    ax.set_title("Step time per rank (median over measured steps)")
    ax.legend(frameon=False)
    return figure_png(fig)


def write_html(table: pd.DataFrame, path, title: str = "perfcheck compare: torch-native layouts") -> None:
    figs = [] if table.empty else [("collective bytes per kind", bytes_figure(table)),
                                   ("step time per rank", time_figure(table))]
    failed = [(f"{r.run} rank {r.rank} incomplete", "meta.json says the run did not complete")
              for r in table.itertuples(index=False) if r.status != "ok"] if not table.empty else []
    atomic_write_text(path, html_page(title, figs, answers(table), failed, table,
                                      "Table (pred_* / meas_* pairs; bytes per step per rank, seconds)"))
