"""A self-contained HTML report: one file, inline CSS, plots embedded as base64 PNG, no scripts.

Sections: summary (whole step predicted vs measured, unexplained share, hook overhead), per-rank
totals (multi-rank runs), findings, plots (measured vs predicted per module, top modules,
roofline, utilization and memory timeline, kernel breakdown), the module table, collectives per
module (bytes predicted and measured, issued by and waited on, the waits in words; runs with
collectives only) and the column glossary. Each plot sits in ``<figure class="plot" id="plot-...">``; a missing input gives a
figure with a one-line explanation instead of an image.
"""
from __future__ import annotations

import html

import pandas as pd

from perfcheck.analysis.columns import RECONCILED_COLUMNS
from perfcheck.analysis.findings import REASONS, findings_table
from perfcheck.analysis.kernel_steps import kernel_step_stats
from perfcheck.analysis.page_faults import summary_text as faults_text
from perfcheck.analysis.totals import rank_summary, totals_frame
from perfcheck.hardware.labels import spec_label
from perfcheck.hardware.systems import load_system
from perfcheck.report import plots
from perfcheck.report.text import comm_rows, hook_text
from perfcheck.schema import ROOT
from perfcheck.units import fmt_bytes, fmt_count, fmt_gap, fmt_pct, fmt_rate, fmt_time

_CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px;color:#222;background:#fff;max-width:1500px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555;font-size:13px}
table{border-collapse:collapse;font-size:12px;margin:6px 0}
th,td{border:1px solid #e3e3e3;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f4f6f8;position:sticky;top:0} td.l,th.l{text-align:left}
td.gap-high{background:#fde0dc} td.gap-low{background:#e0ecfd} td.flag{color:#b00;font-weight:bold}
.grid{display:flex;flex-wrap:wrap;gap:16px}
figure.plot{margin:0;border:1px solid #e3e3e3;padding:6px;background:#fff}
figure.plot img{display:block;max-width:100%}
figure.empty{width:560px;height:120px;color:#777;font-size:13px}
figcaption{font-size:12px;color:#555;max-width:640px;margin-top:4px}
.ev{white-space:normal;text-align:left;max-width:640px} details{font-size:12px}
"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _figure(fid: str, png: str | None, caption: str, why_empty: str) -> str:
    if png is None:
        return f'<figure class="plot empty" id="{fid}"><p>{_e(why_empty)}</p></figure>'
    return (f'<figure class="plot" id="{fid}"><img alt="{_e(caption)}" src="data:image/png;base64,{png}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def _table(head, rows, left=(0,)) -> str:
    th = "".join(f'<th class="{"l" if i in left else ""}">{_e(h)}</th>' for i, h in enumerate(head))
    body = []
    for r in rows:
        tds = []
        for i, c in enumerate(r):
            cls, text = (c if isinstance(c, tuple) else ("l" if i in left else "", c))
            tds.append(f'<td class="{cls}">{text}</td>')
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _gap_cell(g, th) -> tuple:
    cls = "gap-high" if g == g and g > th.get("gap_high", 2) else "gap-low" if g == g and g < th.get("gap_low", 0.5) else ""
    return (cls, _e(fmt_gap(g)))


def _summary(rec, t: dict) -> str:
    root = rec[(rec["module"] == ROOT) & (rec["rank"] == t.get("rank", 0))]
    params = root["params"].max() if len(root) else rec["params"].max()
    rows = [["params of model", _e(fmt_count(params))],
            ["forward: predicted | measured | gap", _e(f"{fmt_time(t.get('pred_fwd_s'))} | {fmt_time(t.get('meas_fwd_s'))} | "
                                                      f"{fmt_gap(t.get('gap_fwd'))}")],
            ["backward: predicted | measured | gap", _e(f"{fmt_time(t.get('pred_bwd_s'))} | {fmt_time(t.get('meas_bwd_s'))} | "
                                                       f"{fmt_gap(t.get('gap_bwd'))}")],
            ["step (measured median; predicted fwd+bwd)", _e(f"{fmt_time(t.get('meas_step_s'))}; {fmt_time(t.get('pred_step_s'))}")],
            ["time no module explains", _e(f"{fmt_time(t.get('unexplained_s'))} = {fmt_pct(t.get('unexplained_share'))} of the step "
                                          f"(after backward: {fmt_time(t.get('meas_optim_s'))}; loss/data/idle: "
                                          f"{fmt_time(t.get('other_s'))})")],
            ["optimizer (predicted | measured after backward)", _e(f"{rec.attrs.get('optimizer') or 'not recorded'}: "
                                                                   f"{fmt_time(t.get('pred_optim_s'))} | "
                                                                   f"{fmt_time(t.get('meas_optim_s'))}")],
            ["optimizer kernels / unattributed kernels per step", _e(f"{fmt_time(t.get('optimizer_kernel_s'))} / "
                                                                     f"{fmt_time(t.get('unattributed_kernel_s'))}")],
            ["hook overhead (instrumented vs bare steps)", _e(hook_text(t))]]
    if t.get("meas_eval_s"):  # grad-disabled forwards inside the step: measured only, never against a prediction
        rows.insert(-2, ["eval forwards (grad disabled; not compared with the prediction)",
                         _e(f"{fmt_time(t.get('meas_eval_s'))} per step")])
    if faults_text(t):
        rows.append(["page faults per step (minor, median)", _e(faults_text(t))])
    return _table(["", ""], rows, left=(0, 1))


def _ranks(rec, top: int) -> str:
    t = totals_frame(rec)
    rows = [[str(int(r.rank)), _e(fmt_time(r.meas_fwd_s)), _e(fmt_time(r.meas_bwd_s)), _e(fmt_time(r.meas_step_s)),
             _e(fmt_time(r.meas_comm_wait_s)), _e(fmt_time(r.meas_compute_s)),
             _e(fmt_pct(r.unexplained_share)), ("flag", "STRAGGLER") if r.straggler else ("", "slowest" if r.slowest else "")]
            for r in t.itertuples(index=False)]
    s = rank_summary(rec)
    s = s.assign(_t=s["meas_fwd_s_max"].fillna(0) + s["meas_bwd_s_max"].fillna(0)).nlargest(max(top, 10), "_t")
    mods = [[_e(r.module)] + [_e(fmt_time(getattr(r, f"meas_{p}_s_{x}"))) for p in ("fwd", "bwd") for x in ("min", "median", "max")]
            + [str(r.slowest_rank_fwd), str(r.slowest_rank_bwd), ("flag", "straggler") if r.straggler else ""]
            for r in s.itertuples(index=False)]
    return ("<h2>Ranks</h2><p class='meta'>waits: collective waits per step (end of backward + inside forward/backward); "
            "compute: step less waits, which DDP/FSDP do not equalise (the slowest rank by compute is marked).</p>"
            + _table(["rank", "fwd", "bwd", "step", "waits", "compute", "unexplained", ""], rows, left=())
            + _table(["module", "fwd min", "fwd median", "fwd max", "bwd min", "bwd median", "bwd max", "slowest fwd",
                      "slowest bwd", ""], mods))


def _findings(rec, n: int) -> str:
    f = findings_table(rec)
    if f.empty:
        return "<p>No large gaps: every module is within the thresholds.</p>"
    th = rec.attrs.get("thresholds", {})
    rows = [[_e(r.module), _e(r.phase), _e(r.reason), _gap_cell(r.gap, th), _e(fmt_time(r.pred_s)), _e(fmt_time(r.meas_s)),
             _e(fmt_time(r.lost_s)), ("ev", _e(r.evidence))] for r in f.head(n).itertuples(index=False)]
    used = dict.fromkeys(f["reason"].head(n))
    gloss = "".join(f"<li><b>{_e(k)}</b>: {_e(REASONS.get(k, ''))}</li>" for k in used)
    return (f"<p class='meta'>{min(n, len(f))} of {len(f)} findings, largest time lost first. A gap is large above "
            f"{th.get('gap_high', 2):g}x or below {th.get('gap_low', 0.5):g}x.</p>"
            + _table(["module", "phase", "reason", "gap", "predicted", "measured", "lost", "evidence"], rows, left=(0, 1, 2, 7)) + f"<ul class='meta'>{gloss}</ul>")


def _modules(rec, depth, max_rows: int = 2000) -> str:
    th = rec.attrs.get("thresholds", {})
    part = rec if depth is None else rec[rec["depth"] <= depth]
    rows = []
    for r in part.head(max_rows).to_dict("records"):
        name = "&nbsp;&nbsp;" * int(r["depth"]) + _e(r["module"] if r["module"] != ROOT else r["type"])
        row = [name, _e(r["type"]), _e(r["side"]), _e(fmt_count(r["params"])), _e(fmt_count(r["macs_fwd"]))]
        for p in ("fwd", "bwd"):
            rate = "artifact" if f"{p}_rate_above_peak" in r["flags"] else fmt_rate(r[f"achieved_flops_{p}_per_s"])
            row += [_e(fmt_time(r[f"pred_{p}_s"])), _e(fmt_time(r[f"meas_{p}_s"])), _gap_cell(r[f"gap_{p}"], th),
                    ("flag" if rate == "artifact" else "", _e(rate))]
        row += [_e(r["bound"]), _e(r["reason"]), ("flag", _e(r["flags"])) if r["flags"] else ""]
        rows.append(row)
    note = f"<p class='meta'>First {max_rows} of {len(part)} rows.</p>" if len(part) > max_rows else ""
    return note + _table(["module", "type", "side", "params", "MACs fwd", "fwd pred", "fwd meas", "fwd gap", "fwd FLOP/s",
                          "bwd pred", "bwd meas", "bwd gap", "bwd FLOP/s", "bound", "reason", "flags"],
                         rows, left=(0, 1, 2, 13, 14, 15))


def _comm(part, depth) -> str:
    """Collectives per module of one rank: predicted and measured subtree bytes, what the module itself
    issued and waited, and its waits in words ('' when the rank has none)."""
    rows = comm_rows(part, depth)
    if not rows:
        return ""
    rank = int(part["rank"].iloc[0]) if len(part) else 0
    body = [[_e(m), _e(p), _e(fmt_bytes(r[f"comm_{p}_bytes"])), _e(fmt_bytes(r[f"meas_comm_{p}_bytes"])),
             _e(fmt_bytes(r[f"meas_comm_own_{p}_bytes"])), _e(fmt_count(r[f"meas_comm_own_{p}_count"])),
             _e(fmt_time(r[f"meas_comm_wait_own_{p}_s"])), ("ev", _e(r.get(f"comm_waits_{p}") or ""))]
            for m, p, r in rows]
    return ("<h2 id='collectives'>Collectives per module</h2><p class='meta'>Rank " + str(rank) + ", per step. "
            "pred/meas bytes: the module and everything inside it; issued here: the collectives whose op ran in this "
            "module's forward/backward (issued by); waited here: the time this module itself waited on collectives "
            "(waited on). FSDP2's prefetch and DDP's overlap make them different modules.</p>"
            + _table(["module", "phase", "pred bytes", "meas bytes", "issued here", "count", "waited here",
                      "waits (who issued, who waited)"], body, left=(0, 1, 7)))


def _kernel_table(kernels, profile_steps: float, n: int = 40) -> str:
    if kernels is None or kernels.empty:
        return "<p>No kernel table in this run (profiler off).</p>"
    stats, steps, per_step = kernel_step_stats(kernels[kernels["name"] != "(outside ops)"], profile_steps)
    rows = [[_e(r.module), _e(r.phase), _e(r.name), _e(fmt_count(r.count)), _e(fmt_time(r.median_s)),
             _e(f"{fmt_time(r.min_s)} - {fmt_time(r.max_s)}" if r.min_s == r.min_s else "-")]
            for r in stats.head(n).itertuples(index=False)]
    return (f"<p class='meta'>{_e(_kernel_note(steps, per_step))}</p>"
            + _table(["module", "phase", "kernel / op", "count per step", "time per step", "min - max over steps"],
                     rows, left=(0, 1, 2)))


def _kernel_note(steps: int, per_step: bool) -> str:
    few = (f" Only {steps} profiled step{'s' if steps != 1 else ''}: a median needs 3 or more "
           "(profile_window=(0, 1, 3), perfcheck run --profile-window 0,1,3).") if steps < 3 else ""
    if per_step:
        return (f"Per kernel: median over {steps} profiled step{'s' if steps != 1 else ''}, with the smallest and "
                "largest step (a step without the kernel counts 0); '-': device work not tied to a step, spread "
                "evenly." + few)
    return (f"Mean over {steps} profiled steps: this kernels.csv has no per-step column (written by an older "
            "perfcheck); re-run the measurement for medians and spreads." + few)


def _kernel_figure(kernels, profile_steps: float) -> str:
    out = plots.kernel_breakdown_figure(kernels, profile_steps=profile_steps)
    if out is None:
        return _figure("plot-kernels", None, "", "No kernel table in this run (profiler off)."
                       if kernels is None or kernels.empty else "No kernel time in a module's forward, backward or optimizer.")
    fig, steps, per_step = out
    return _figure("plot-kernels", plots.to_png_base64(fig),
                   f"Kernels attributed to the innermost module whose range encloses them. {_kernel_note(steps, per_step)} "
                   "Whiskers: the smallest and largest per-step total of the module and phase.", "")


def render_html(rec: pd.DataFrame, *, kernels=None, samples=None, system=None, depth: int | None = None,
                top: int = 3, profile_steps: float = 1.0, title: str = "perfcheck report", notes=()) -> str:
    """The HTML report as one string (see the module docstring)."""
    spec = load_system(system) if system is not None else (load_system(rec.attrs["system"]) if rec.attrs.get("system")
                                                            else None)
    dtype = rec.attrs.get("dtype")
    totals = {r["rank"]: r for r in rec.attrs.get("totals", [])}
    ranks = sorted(rec["rank"].unique().tolist())
    slow = [r for r, t in totals.items() if t.get("slowest")]
    rank = slow[0] if slow else (ranks[0] if ranks else 0)
    part = rec[rec["rank"] == rank]
    part.attrs = rec.attrs
    k_rank = kernels[kernels["rank"] == rank] if kernels is not None and len(kernels) and "rank" in kernels else kernels
    figs = [
        _figure("plot-pred-vs-meas", plots.pred_vs_meas(part), "Each dot is a module and phase; above the solid line it "
                "ran slower than predicted, beyond the dashed lines the gap is large.", "No module was both predicted and measured."),
        _figure("plot-top-modules", plots.top_modules(part, k=12, depth=depth), "Light bars: predicted; dark bars: measured.",
                "No module below the root was both predicted and measured."),
        _figure("plot-roofline", plots.roofline(part, spec, dtype), "Achieved FLOP/s = predicted FLOPs / measured time. "
                "Rates above the datasheet peak are measurement artifacts and are left out.",
                "No achieved rates (no module has FLOPs, bytes and a measured time)."),
        _figure("plot-timeline", plots.timeline(samples), "GPU utilization is NVML's duty cycle (share of time any "
                "kernel ran), not efficiency; process CPU is % of one core. The time axis spans the whole run.", "No utilization samples in this run (sampler off)."),
        _kernel_figure(k_rank, profile_steps),
    ]
    meta = [f"system: {_e(spec_label(spec)) if spec is not None else '(none)'}", f"dtype: {_e(dtype or '-')}",
            f"ranks: {len(ranks)}" + (f" (details: slowest rank {rank})" if len(ranks) > 1 else ""),
            f"modules: {part['module'].nunique()}"]
    glossary = "".join(f"<li><b>{_e(k)}</b>: {_e(v)}</li>" for k, v in RECONCILED_COLUMNS.items())
    body = [f"<h1>{_e(title)}</h1><p class='meta'>{' &middot; '.join(meta)}</p>",
            "".join(f"<p class='meta'>{_e(n)}</p>" for n in list(notes) + list(rec.attrs.get("notes", []))),
            "<h2>Summary</h2>", _summary(part, totals.get(rank, {})),
            _ranks(rec, top) if len(ranks) > 1 else "",
            "<h2>Findings</h2>", _findings(part, max(top, 15)),
            "<h2>Plots</h2><div class='grid'>", *figs, "</div>",
            f"<h2>Modules{' (depth &le; ' + str(depth) + ')' if depth is not None else ''}</h2>", _modules(part, depth),
            _comm(part, depth),
            "<h2>Top kernels</h2>", _kernel_table(k_rank, profile_steps),
            f"<h2>Columns</h2><details><summary>column glossary (CSV/JSON)</summary><ul>{glossary}</ul></details>"]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>" + "".join(body) + "</body></html>\n")
