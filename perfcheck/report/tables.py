"""CSV and JSON output of a reconciled frame, with the documented columns.

CSV: one row per (module, rank), columns ``perfcheck.analysis.columns.RECONCILED_COLUMNS`` in that
order, SI units, empty cells for NaN, ``inf`` for an infinite gap. ``render_totals_csv`` gives the
per-rank totals (``TOTALS_COLUMNS``) as a second CSV.

JSON: one object::

    {"schema_version": 1, "system": ..., "dtype": ..., "thresholds": {...},
     "optimizer": "adamw-fused",                        # the optimizer the prediction costed (meta.json)
     "columns": {name: description, ...},            # RECONCILED_COLUMNS
     "totals_columns": {...}, "totals": [{...}, ...],  # one record per rank
     "rank_summary": [{...}, ...],                      # RANK_SUMMARY_COLUMNS, multi-rank runs only
     "findings": [{...}, ...],                          # perfcheck.analysis.findings.findings_table
     "reasons": {name: description},
     "modules": [{...}, ...]}                           # one record per (module, rank)

Non-finite numbers (NaN, an infinite gap) are ``null`` in JSON (JSON has no NaN or Infinity).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from perfcheck.analysis.columns import RANK_SUMMARY_COLUMNS, RECONCILED_COLUMNS, TOTALS_COLUMNS
from perfcheck.analysis.findings import REASONS, findings_table
from perfcheck.analysis.totals import rank_summary, totals_frame
from perfcheck.schema import SCHEMA_VERSION


def render_csv(rec: pd.DataFrame) -> str:
    """The module rows as CSV text (RECONCILED_COLUMNS)."""
    return rec[list(RECONCILED_COLUMNS)].to_csv(index=False, float_format="%.9g")


def render_totals_csv(rec: pd.DataFrame) -> str:
    return totals_frame(rec).to_csv(index=False, float_format="%.9g")


def _records(frame: pd.DataFrame) -> str:
    """JSON array of records; pandas writes NaN and +-inf as null."""
    return frame.to_json(orient="records", double_precision=10)


def _clean(obj):
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.generic,)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def render_json(rec: pd.DataFrame) -> str:
    """The whole report as one JSON document (see the module docstring)."""
    multi = rec["rank"].nunique() > 1
    head = _clean({"schema_version": SCHEMA_VERSION, "system": rec.attrs.get("system"), "dtype": rec.attrs.get("dtype"),
                   # where the spec came from and, for a calibration, when, with how many threads, under what load
                   "system_label": rec.attrs.get("system_label"),
                   "system_calibration": rec.attrs.get("system_calibration") or {},
                   "thresholds": rec.attrs.get("thresholds", {}), "hook_overhead_s": rec.attrs.get("hook_overhead_s"),
                   "hook_overhead_source": rec.attrs.get("hook_overhead_source"),
                   "columns": RECONCILED_COLUMNS, "totals_columns": TOTALS_COLUMNS,
                   "rank_summary_columns": RANK_SUMMARY_COLUMNS, "reasons": REASONS,
                   "micro_batches": rec.attrs.get("micro_batches", 1), "optimizer": rec.attrs.get("optimizer"),
                   "notes": rec.attrs.get("notes", [])})
    parts = [json.dumps(head)[:-1]]
    parts.append(f', "totals": {_records(totals_frame(rec))}')
    parts.append(f', "rank_summary": {_records(rank_summary(rec)) if multi else "[]"}')
    parts.append(f', "findings": {_records(findings_table(rec))}')
    parts.append(f', "modules": {_records(rec[list(RECONCILED_COLUMNS)])}}}')
    return "".join(parts) + "\n"
