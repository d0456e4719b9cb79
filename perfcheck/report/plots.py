"""Matplotlib figures for the HTML report, returned as base64 PNG strings (no pyplot, no global state).

Each function takes frames and returns ``None`` when there is nothing to draw (the HTML then says
why). Figures are built with ``matplotlib.figure.Figure`` and the Agg canvas directly, so a user's
interactive backend and pyplot state are never touched.
"""
from __future__ import annotations

import base64
import io

import numpy as np
import pandas as pd

from perfcheck.analysis.kernel_steps import kernel_step_stats
from perfcheck.schema import ROOT
from perfcheck.units import fmt_rate, fmt_time

DPI = 90
_C = {"fwd": "#1f77b4", "bwd": "#d62728", "pred": "#9ecae1", "meas": "#08519c"}


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=DPI)
    return fig


def _log_axis(axis, fmt):
    """Log axis with one labelled tick per decade, labels in SI units (no mathtext: it is slow)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    axis.set_major_locator(LogLocator(base=10, numticks=8))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt(v)))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def _plain(v) -> str:
    return f"{v:g}"


def literal_text(fig):
    """``fig`` with every text made so far drawn literally (``set_parse_math(False)``): call before
    anything lays the figure out (``tight_layout``), which measures, and so parses, every label."""
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        text.set_parse_math(False)
    return fig


def save_literal(fig, buf, **kwargs) -> None:
    """``fig.savefig(buf, **kwargs)`` with every label drawn as the literal text it is: module paths and run
    folder names come from the user, and matplotlib would parse ``$...$`` in them as mathtext (a
    ``$\\frac$`` in a name is a ParseFatalException). Texts already made are switched off; the ones
    drawing makes (tick labels) read the rc setting."""
    import matplotlib

    literal_text(fig)
    with matplotlib.rc_context({"text.parse_math": False}):
        fig.savefig(buf, **kwargs)


def to_png_base64(fig) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    save_literal(fig, buf, format="png", dpi=DPI, pil_kwargs={"compress_level": 3})
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _short(path: str, n: int = 28) -> str:
    return path if len(path) <= n else "..." + path[-(n - 3):]


def pred_vs_meas(rec: pd.DataFrame):
    """Log-log scatter of measured vs predicted time per module and phase, with the 1x, 2x and 0.5x lines."""
    both = rec[rec["side"] == "both"]
    pts = {p: both[[f"pred_{p}_s", f"meas_{p}_s", "module"]].dropna() for p in ("fwd", "bwd")}
    pts = {p: d[(d[f"pred_{p}_s"] > 0) & (d[f"meas_{p}_s"] > 0)] for p, d in pts.items()}
    if all(d.empty for d in pts.values()):
        return None
    fig = _figure(6.4, 4.6)
    ax = fig.add_subplot()
    lo = min(min(d[f"pred_{p}_s"].min(), d[f"meas_{p}_s"].min()) for p, d in pts.items() if len(d)) / 2
    hi = max(max(d[f"pred_{p}_s"].max(), d[f"meas_{p}_s"].max()) for p, d in pts.items() if len(d)) * 2
    x = np.array([lo, hi])
    ax.plot(x, x, color="black", lw=1, label="measured = predicted")
    ax.plot(x, 2 * x, color="gray", lw=1, ls="--", label="2x / 0.5x (large gap)")
    ax.plot(x, 0.5 * x, color="gray", lw=1, ls="--")
    for p, d in pts.items():
        if len(d):
            ax.scatter(d[f"pred_{p}_s"], d[f"meas_{p}_s"], s=14, alpha=0.7, color=_C[p], label=p, edgecolors="none")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="predicted time per step",
           ylabel="measured time per step", title="Measured vs predicted, per module")
    _log_axis(ax.xaxis, fmt_time)
    _log_axis(ax.yaxis, fmt_time)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="major", alpha=0.3)
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.11, top=0.92)
    return to_png_base64(fig)


def top_modules(rec: pd.DataFrame, k: int = 12, depth: int | None = None):
    """Predicted vs measured bars (fwd and bwd) for the k modules with the largest measured time."""
    d = rec[(rec["module"] != ROOT) & (rec["side"] == "both")]
    if depth is not None:
        d = d[d["depth"] <= depth]
    if d.empty:
        return None
    d = d.assign(_t=d["meas_fwd_s"].fillna(0) + d["meas_bwd_s"].fillna(0)).nlargest(k, "_t").iloc[::-1]
    fig = _figure(7.2, 0.9 + 0.42 * len(d))
    y = np.arange(len(d))
    ax = fig.add_subplot()
    h = 0.2
    cols = ["pred_fwd_s", "meas_fwd_s", "pred_bwd_s", "meas_bwd_s"]
    vals = d[cols].to_numpy(float)
    base = np.nanmin(np.where(vals > 0, vals, np.nan)) / 3 if np.any(vals > 0) else 1e-9
    for i, col in enumerate(cols):
        p, kind = col.split("_")[1], col.split("_")[0]
        v = np.nan_to_num(d[col].to_numpy(float))
        ax.barh(y + (1.5 - i) * h, np.maximum(v - base, 0), left=base, height=h, color=_C[p],
                alpha=0.35 if kind == "pred" else 0.95, label=f"{p} {'predicted' if kind == 'pred' else 'measured'}")
    ax.set_yticks(y, [_short(m) for m in d["module"]], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(left=base)
    _log_axis(ax.xaxis, fmt_time)
    ax.set(xlabel="time per step", title=f"Top {len(d)} modules by measured time: predicted vs measured")
    ax.legend(fontsize=7, loc="lower right")
    fig.subplots_adjust(left=0.3, right=0.97, bottom=0.9 / (0.9 + 0.42 * len(d)) + 0.02, top=0.93)
    return to_png_base64(fig)


def roofline(rec: pd.DataFrame, system=None, dtype=None):
    """Arithmetic intensity vs achieved FLOP/s under the system's roofs; artifacts are left out."""
    pts = {}
    for p in ("fwd", "bwd"):
        d = rec[[f"intensity_{p}", f"achieved_flops_{p}_per_s"]].astype(float).dropna()
        pts[p] = d[(d.iloc[:, 0] > 0) & (d.iloc[:, 1] > 0) & np.isfinite(d.iloc[:, 0])]
    if all(d.empty for d in pts.values()):
        return None
    fig = _figure(6.4, 4.6)
    ax = fig.add_subplot()
    xs = np.concatenate([d.iloc[:, 0].to_numpy() for d in pts.values()])
    ys = np.concatenate([d.iloc[:, 1].to_numpy() for d in pts.values()])
    x = np.logspace(np.log10(xs.min() / 4), np.log10(xs.max() * 4), 200)
    if system is not None:
        peak = system.matrix_peak(dtype) if dtype else max(system.matrix_flops_per_s.values())
        vec = system.vector_peak(dtype) if dtype else max(system.vector_flops_per_s.values())
        bw = system.mem_bandwidth_bytes_per_s
        ax.plot(x, np.minimum(peak, bw * x), color="black", lw=1.5, label=f"roof: matrix peak / {bw / 1e9:.0f} GB/s")
        ax.plot(x, np.minimum(vec, bw * x), color="black", lw=1, ls=":", label="roof: vector peak")
        ax.plot(x, np.minimum(peak * system.matrix_efficiency(dtype or "fp32"), bw * system.efficiency["memory"] * x),
                color="gray", lw=1, ls="--", label="achievable (efficiency)")
        ys = np.concatenate([ys, [peak * 1.5]])
    for p, d in pts.items():
        if len(d):
            ax.scatter(d.iloc[:, 0], d.iloc[:, 1], s=14, alpha=0.7, color=_C[p], label=f"{p} (achieved)", edgecolors="none")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte, predicted)",
           ylabel="achieved (predicted FLOPs / measured time)", ylim=(ys.min() / 4, ys.max() * 2),
           title=f"Roofline{': ' + system.name if system is not None else ' (no system: no roofs)'}")
    _log_axis(ax.xaxis, _plain)
    _log_axis(ax.yaxis, fmt_rate)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="major", alpha=0.3)
    fig.subplots_adjust(left=0.2, right=0.97, bottom=0.11, top=0.92)
    return to_png_base64(fig)


def timeline_figure(samples: pd.DataFrame | None):
    """The sampler panel as a Figure (None: nothing to draw). Utilization on a fixed 0-100% axis (GPU
    duty cycle x 100; process CPU as % of one core, like top, so the axis grows past 100% only for a
    multi-threaded process); memory from 0 to the device's total (NVML: GPU memory; psutil: machine
    RAM) with the total marked, or to 1.15 x the largest value seen when that is under 10% of the
    total (the total then named in the axis label, so a small run's curve is not a flat line); the
    time axis from the sampler's start (0) to its last sample."""
    if samples is None or samples.empty or "time_s" not in samples:
        return None
    fig = _figure(7.2, 4.4)
    ax1, ax2 = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)
    drew, util_max, mem_max, t_max = False, 100.0, 0.0, 0.0
    ranks = samples["rank"] if "rank" in samples else pd.Series(np.zeros(len(samples)), index=samples.index)
    for rank, s in samples.groupby(ranks, sort=True):
        s = s.sort_values("time_s")
        t = s["time_s"].to_numpy(float)
        tag = f" r{rank}" if ranks.nunique() > 1 else ""
        for col, label, ax, scale in (("gpu_util", "GPU util (duty cycle)", ax1, 100.0),
                                      ("cpu_util", "process CPU (% of one core)", ax1, 100.0),
                                      ("mem_used_bytes", "memory used", ax2, 1e-9), ("rss_bytes", "process RSS", ax2, 1e-9)):
            if col in s and s[col].notna().any():
                v = s[col].to_numpy(float) * scale
                ax.plot(t, v, lw=1.2, label=label + tag, drawstyle="steps-post", marker="." if len(t) < 50 else None)
                drew = True
                t_max = max(t_max, float(np.nanmax(t)))
                if ax is ax2:
                    mem_max = max(mem_max, float(np.nanmax(v)))
                elif float(np.nanmax(v)) > 100:  # a process busy on more than one core
                    util_max = max(util_max, float(np.nanmax(v)) * 1.05)
    if not drew:
        return None
    total = samples["mem_total_bytes"].astype(float).max() * 1e-9 if "mem_total_bytes" in samples else float("nan")
    kind = "device memory" if "gpu_util" in samples and samples["gpu_util"].notna().any() else "machine RAM"
    if total == total and total > 0 and mem_max >= 0.1 * total:
        ax2.axhline(total, color="black", lw=1, ls="--", label=f"{kind} total {total:.3g} GB")
        mem_top = max(total, mem_max) * 1.05
    else:
        mem_top = max(mem_max * 1.15, 1e-6)
        if total == total and total > 0:
            ax2.text(0.01, 0.06, f"{kind} total {total:.3g} GB (off scale)", transform=ax2.transAxes, fontsize=7,
                     color="#555", gid="mem-total")
    ax1.set(ylabel="utilization (%)", ylim=(0, util_max), xlim=(0, max(t_max, 1e-3)),
            title="Utilization and memory (sampler)")
    ax2.set(ylabel="memory (GB)", ylim=(0, mem_top), xlim=(0, max(t_max, 1e-3)), xlabel="time since the sampler started (s)")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")  # the fixed axes leave room somewhere; do not cover the curve
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.11, top=0.93, hspace=0.3)
    return fig


def timeline(samples: pd.DataFrame | None):
    """The sampler panel (timeline_figure) as a base64 PNG, or None."""
    fig = timeline_figure(samples)
    return None if fig is None else to_png_base64(fig)


def kernel_breakdown_figure(kernels: pd.DataFrame | None, k: int = 10, names: int = 8, profile_steps: float = 1.0):
    """Stacked bars: the k (module, phase) pairs with the largest median kernel time per profiled step,
    each split by kernel name (per-name medians over the steps, analysis.kernel_steps.kernel_step_stats),
    with a whisker from the pair's smallest to its largest per-step total: one noisy step shows as a
    long whisker instead of moving the bar. Returns (Figure, n_steps, per_step) or None."""
    if kernels is None or kernels.empty:
        return None
    d = kernels[(kernels["name"] != "(outside ops)") & kernels["phase"].isin(("fwd", "bwd", "optim"))]
    if d.empty:
        return None
    per_name, n, per_step = kernel_step_stats(d, profile_steps)
    per_key, _, _ = kernel_step_stats(d, profile_steps, keys=("module", "phase"))
    key = lambda f: f["module"].astype(str) + " " + f["phase"].astype(str)  # noqa: E731
    per_key = per_key.assign(key=key(per_key)).set_index("key").head(k)
    per_name = per_name.assign(key=key(per_name))
    per_name = per_name[per_name["key"].isin(per_key.index)]
    top_names = per_name.groupby("name")["median_s"].sum().nlargest(names).index
    per_name = per_name.assign(name=per_name["name"].where(per_name["name"].isin(top_names), "other"))
    table = per_name.pivot_table(index="key", columns="name", values="median_s", aggfunc="sum", fill_value=0.0)
    order = per_key.index[::-1]
    table = table.reindex(index=order, fill_value=0.0)
    table = table[[c for c in table.sum().sort_values(ascending=False).index if c != "other"]
                  + (["other"] if "other" in table.columns else [])]
    fig = _figure(8.4, 1.6 + 0.38 * len(table))
    ax = fig.add_subplot()
    left = np.zeros(len(table))
    y = np.arange(len(table))
    cmap = __import__("matplotlib").colormaps["tab10"]
    for i, name in enumerate(table.columns):
        ax.barh(y, table[name], left=left, height=0.7, color=cmap(i % 10), label=_short(str(name), 40))
        left += table[name].to_numpy()
    lo, hi = per_key.loc[order, "min_s"].to_numpy(float), per_key.loc[order, "max_s"].to_numpy(float)
    if per_step and np.isfinite(lo).any():
        ax.hlines(y, lo, hi, color="black", lw=1.2, label="min-max of the per-step total")
    ax.set_yticks(y, [_short(str(x), 34) for x in table.index], fontsize=8)
    what = (f"median over {n} profiled step{'s' if n != 1 else ''}" if per_step
            else f"mean over {n} profiled step{'s' if n != 1 else ''} (no per-step column)")
    ax.set(xlabel="kernel (GPU) / op self (CPU) time per step",
           title=f"Kernel breakdown per module and phase ({what})")
    ax.set_xlim(left=0)
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_time(v)))
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.subplots_adjust(left=0.25, right=0.68, bottom=0.9 / (1.6 + 0.38 * len(table)) + 0.03, top=0.93)
    return fig, n, per_step


