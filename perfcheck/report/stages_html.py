"""Presentation of ``perfcheck compare``: the terminal table, the CSV and a self-contained HTML page
(matplotlib figures embedded as base64 PNG). Computing lives in compare.py and compare_notes.py."""
from __future__ import annotations

import base64
import html
import io
import math

import pandas as pd

from perfcheck.analysis.answers import answers
from perfcheck.report.plots import literal_text, save_literal
from perfcheck.rundir import atomic_write_text
from perfcheck.units import fmt_bytes, fmt_time

#: Terminal columns: (header, predicted column, measured column, formatter).
_TERMINAL = (("allreduce", "pred_allreduce_bytes", "meas_allreduce_bytes", fmt_bytes),
             ("allgather", "pred_allgather_bytes", "meas_allgather_bytes", fmt_bytes),
             ("reducescatter", "pred_reducescatter_bytes", "meas_reducescatter_bytes", fmt_bytes),
             ("mem/rank", "pred_mem_bytes", "meas_mem_bytes", fmt_bytes),
             ("fwd", "pred_fwd_s", "meas_fwd_s", fmt_time),
           ("fwd, process CPU time at the run's speed", "pred_fwd_at_run_s", "meas_fwd_cpu_s", fmt_time),
           ("step at the run's speed", "pred_step_at_run_s", "meas_step_s", fmt_time), ("fwd comm", "pred_fwd_comm_s", "meas_fwd_comm_s", fmt_time),
             ("bwd", "pred_bwd_s", "meas_bwd_s", fmt_time), ("bwd comm", "pred_bwd_comm_s", "meas_bwd_comm_s", fmt_time),
             ("optim", "pred_optim_s", "meas_optim_s", fmt_time), ("step", "pred_step_s", "meas_step_s", fmt_time),
             ("step CPU", "pred_step_s", "meas_step_cpu_s", fmt_time),
             ("fwd CPU at run speed", "pred_fwd_at_run_s", "meas_fwd_cpu_s", fmt_time))


def _cell(v, f):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f(v)


def terminal_table(table: pd.DataFrame) -> str:
    """One line per (stage, rank): 'predicted / measured' per column, then the questions answered."""
    head = ["run", "stage", "rank", "status"] + [h for h, *_ in _TERMINAL]
    lines = []
    for _, r in table.iterrows():
        if r.get("status") != "ok" and pd.isna(r.get("pred_allreduce_bytes")):
            lines.append([str(r.get("run", "")), str(r["stage"]), "-", r.get("status", "failed")]
                         + ["-"] * len(_TERMINAL))
            continue
        lines.append([str(r.get("run", "")), str(int(r["stage"])), str(int(r["rank"])), str(r["status"])]
                     + [f"{_cell(r.get(p), f)} / {_cell(r.get(m), f)}" for _, p, m, f in _TERMINAL])
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [f"system: {label}" for label in systems(table)]
    out += ["predicted / measured, per optimizer step (bytes: full collective buffers, per rank)",
            fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*l) for l in lines]
    for _, r in table[table["status"] != "ok"].drop_duplicates("run").iterrows():
        out.append(f"\n{r.get('run', 'stage')} (ZeRO stage {r['stage']}) FAILED:\n{r.get('notes', '')}")
    out.append("")
    for q, a in answers(table):
        out.append(f"Q: {q}\nA: {a}\n")
    return "\n".join(out)


def write_csv(table: pd.DataFrame, path) -> None:
    atomic_write_text(path, table.to_csv(index=False))


# ------------------------------------------------------------------------------------ HTML
def figure_png(fig) -> str:
    buf = io.BytesIO()
    save_literal(fig, buf, format="png", dpi=110, bbox_inches="tight")  # '$' in a folder name stays text
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def time_figure(table: pd.DataFrame) -> str:
    """Two panels per stage (median over ranks). Left: predicted and measured step time side by side on a
    log axis, each bar labelled with its value, so a prediction 100x below the measurement still shows.
    Right: the measured step split into compute, exposed communication and other (linear axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = table[table["status"] == "ok"]
    per = ok.groupby("run", sort=False).median(numeric_only=True)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.9))
    x = list(range(len(per)))
    for j, (who, color, label) in enumerate((("pred", "#4C72B0", "predicted"), ("meas", "#DD8452", "measured"))):
        vals = per[f"{who}_step_s"].to_numpy(float) * 1e3
        xs = [i + (j - 0.5) * 0.38 for i in x]
        ax.bar(xs, vals, 0.36, color=color, label=label)
        for xi, v in zip(xs, vals):
            if v == v and v > 0:
                ax.annotate(fmt_time(v / 1e3), (xi, v), ha="center", va="bottom", fontsize=7, xytext=(0, 2),
                            textcoords="offset points")
    pos = per[["pred_step_s", "meas_step_s"]].to_numpy(float).ravel()
    pos = pos[(pos > 0) & (pos == pos)] * 1e3
    if len(pos):
        ax.set_yscale("log")
        ax.set_ylim(pos.min() / 3, pos.max() * 4)  # room for the labels: no bar is clipped
    ax.set_xticks(x, list(per.index))
    ax.set_ylabel("ms per optimizer step (log scale)")
    ax.set_title("Step time: predicted vs measured")
    ax.legend(frameon=False, fontsize=8)
    parts = (("compute", "#4C72B0"), ("exposed comm", "#DD8452"), ("other", "#8C8C8C"))
    compute = sum(per[f"meas_{p}_compute_s"].fillna(0) for p in ("fwd", "bwd", "optim"))
    comm = sum(per[f"meas_{p}_comm_s"].fillna(0) for p in ("fwd", "bwd", "optim"))
    other = per["meas_other_s"].fillna(0).clip(lower=0)
    bottom = 0 * compute
    for (label, color), vals in zip(parts, (compute, comm, other)):
        bx.bar(x, vals * 1e3, 0.6, bottom=bottom * 1e3, color=color, label=label)
        bottom = bottom + vals
    top = float(bottom.max()) * 1e3 if len(bottom) else 0.0
    if top > 0:
        bx.set_ylim(0, top * 1.15)
    bx.set_xticks(x, list(per.index))
    bx.set_ylabel("ms per optimizer step")
    bx.set_title("Measured step: compute, exposed communication, other")
    bx.legend(frameon=False, fontsize=8)
    literal_text(fig).tight_layout()  # run folder names are labels: a '$' in one is text, not mathtext
    return figure_png(fig)


def memory_figure(table: pd.DataFrame) -> str:
    """Model-state bytes per rank per stage: predicted vs measured, split into params/grads/optimizer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = table[table["status"] == "ok"].sort_values(["stage", "run", "rank"])
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    colors = {"param": "#4C72B0", "grad": "#55A868", "optim": "#C44E52"}
    labels = []
    for i, (_, r) in enumerate(ok.iterrows()):
        for j, who in enumerate(("pred", "meas")):
            bottom = 0.0
            for part, color in colors.items():
                v = r[f"{who}_{part}_mem_bytes"]
                v = 0.0 if pd.isna(v) else v
                ax.bar(i + (j - 0.5) * 0.38, v / 1e6, 0.36, bottom=bottom / 1e6, color=color,
                       hatch="//" if who == "meas" else "", edgecolor="white",
                       label=f"{part}" if i == 0 and j == 0 else None)
                bottom += v
        labels.append(f"{r['run']}\nrank {int(r['rank'])}")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("MB per rank (model states)")
    ax.set_title("Memory per rank: predicted (plain) | measured (hatched)")
    ax.legend(frameon=False)
    return figure_png(fig)


def write_html(table: pd.DataFrame, path, title: str = "perfcheck compare: ZeRO stages") -> None:
    figs = []
    if (table["status"] == "ok").any():
        figs = [("step time per stage", time_figure(table)), ("memory per rank", memory_figure(table))]
    bad = table[table["status"] != "ok"].drop_duplicates("run")
    failed = [(f"{r.get('run', r['stage'])} failed", str(r.get("notes", ""))) for _, r in bad.iterrows()]
    system = "".join(f"; system: {label}" for label in systems(table))
    atomic_write_text(path, html_page(title, figs, answers(table), failed, table,
                                      f"Summary (per optimizer step; bytes are full collective buffers per rank{system})"))


def systems(table: pd.DataFrame) -> list:
    """The distinct system labels of the stages' predictions (analysis.stages: ``system_label``)."""
    if "system_label" not in table:
        return []
    return [str(s) for s in table["system_label"].dropna().unique() if str(s)]


#: The summary table's columns: (header, predicted column, measured column, formatter); a pair shows when
#: the table has it. Every other column stays in the CSV the page links to.
SUMMARY = (("step", "pred_step_s", "meas_step_s", fmt_time),
           ("step, process CPU time", "pred_step_s", "meas_step_cpu_s", fmt_time),
           ("fwd", "pred_fwd_s", "meas_fwd_s", fmt_time),
           ("fwd, process CPU time at the run's speed", "pred_fwd_at_run_s", "meas_fwd_cpu_s", fmt_time),
           ("step at the run's speed", "pred_step_at_run_s", "meas_step_s", fmt_time),
           ("bwd", "pred_bwd_s", "meas_bwd_s", fmt_time), ("optimizer", "pred_optim_s", "meas_optim_s", fmt_time),
           ("memory / rank", "pred_mem_bytes", "meas_mem_bytes", fmt_bytes),
           ("allreduce", "pred_allreduce_bytes", "meas_allreduce_bytes", fmt_bytes),
           ("allgather", "pred_allgather_bytes", "meas_allgather_bytes", fmt_bytes),
           ("reduce-scatter", "pred_reducescatter_bytes", "meas_reducescatter_bytes", fmt_bytes))
_KEYS = ("run", "stage", "layout", "rank", "status")


def summary_html(table: pd.DataFrame) -> str:
    """The designed table: one row per run and rank, predicted | measured | measured/predicted per
    quantity (a pair only when some row has it), the bytes check; no notes, no raw columns."""
    pairs = [t for t in SUMMARY if t[1] in table and t[2] in table and
             (table[t[1]].fillna(0).ne(0).any() or table[t[2]].fillna(0).ne(0).any())]
    keys = [k for k in _KEYS if k in table]
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    head += "".join(f"<th colspan=3>{html.escape(h)}</th>" for h, *_ in pairs)
    sub = "<th></th>" * len(keys) + "<th>pred</th><th>meas</th><th>ratio</th>" * len(pairs)
    rows = []
    for _, r in table.iterrows():
        cells = [f"<td class=k>{html.escape(str(r[k]))}</td>" for k in keys]
        for _, pc, mc, f in pairs:
            p, m = r.get(pc), r.get(mc)
            ratio = m / p if isinstance(p, (int, float)) and isinstance(m, (int, float)) and p and p == p and m == m \
                else math.nan
            cells.append(f"<td>{_cell(p, f)}</td><td>{_cell(m, f)}</td>"
                         f"<td class=r>{'-' if ratio != ratio else f'{ratio:.3g}x'}</td>")
        bad = r.get("status") not in (None, "ok") or r.get("bytes_ok") is False
        rows.append(f"<tr{' class=bad' if bad else ''}>{''.join(cells)}</tr>")
    return f"<table><tr>{head}</tr><tr>{sub}</tr>{''.join(rows)}</table>"


def html_page(title: str, figures, qa, failed, table: pd.DataFrame, caption: str,
              csv_name: str = "comparison.csv") -> str:
    """A self-contained comparison page: ``figures`` [(alt, base64 PNG from figure_png)], ``qa``
    [(question, answer)], ``failed`` [(heading, text)], then the summary of ``table`` under ``caption``
    and a link to the full CSV (``csv_name``, written beside the page) instead of every column."""
    figs = "".join(f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{png}">' for alt, png in figures)
    answers_html = "".join(f"<h3>{html.escape(q)}</h3><p>{html.escape(a)}</p>" for q, a in qa)
    failed_html = "".join(f"<h3>{html.escape(h)}</h3><pre>{html.escape(t)}</pre>" for h, t in failed)
    return f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}} table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}} td.k{{text-align:left}} td.r{{color:#555}}
tr.bad td{{background:#fde8e8}} th{{background:#f0f0f0}} img{{max-width:100%}}
pre{{background:#f4f4f4;padding:1em}}</style>
</head><body><h1>{html.escape(title)}</h1>{figs}<h2>Answers</h2>{answers_html}{failed_html}
<h2>{html.escape(caption)}</h2>{summary_html(table)}
<p>Every column ({len(table.columns)}, with the notes): <a href="{html.escape(csv_name)}">{html.escape(csv_name)}</a>
(beside this page).</p>
</body></html>"""
