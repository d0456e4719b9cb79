"""A fused attention kernel's rate (what ``F.scaled_dot_product_attention`` runs on the GPUs the specs describe:
FlashAttention-2 on an A100, a faster kernel on an H100) from the spec's ``attention_kernel_curve``: measurements of
the kernel by sequence length, head dimension and mask, as a fraction of the matrix peak. ``roofline.matrix_efficiency`` applies it in place of
the GEMM curves, for ``perfcheck.estimate``'s traced SDPA ops and the transformer front-end's ``core_attention``
rows alike (one path: ``roofline.device_times``)."""
from __future__ import annotations

import numpy as np

from perfcheck.hardware.systems import spec_of


def attention_fractions_of(system, ops):
    """``attention_kernel_fraction`` of an op table's rows (columns ``attn_seq``, ``attn_head_dim``, ``attn_causal``;
    None without them)."""
    if "attn_seq" not in ops:
        return None
    return attention_kernel_fraction(system, *(ops[f"attn_{c}"].to_numpy(float) for c in ("seq", "head_dim", "causal")))


def attention_kernel_fraction(system, seq, head_dim, causal):
    """The fraction of the matrix peak a fused attention kernel sustains over its forward and backward, from the
    spec's ``attention_kernel_curve`` (the kernel measured on that GPU, sources in the spec), per op; NaN where the
    spec has no curve or the op is not a fused attention kernel (``seq`` NaN).

    Read at the kernel's key length ``seq``, linear in log(seq) between the measured lengths and the end value
    beyond them; between two measured head dimensions linear in log(head dim), the nearest one beyond them;
    ``causal`` (truthy) reads the "causal" curves where the spec has them, else the "full" ones. The rate of the
    benchmark's forward + backward is used for each phase (the public data gives the sum only); FlashAttention-2's
    forward runs faster than its backward (Dao 2023, arXiv 2307.08691, section 4.1), so the forward alone,
    re-run by full recompute, is priced a little slow and the backward a little fast.
    """
    curves = getattr(spec_of(system), "attention_kernel_curve", {}) or {}
    seq, hd, cz = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (seq, head_dim, causal)))
    out = np.full(seq.shape, np.nan)
    dims = {"causal": {}, "full": {}}
    for key, points in curves.items():
        d, kind = key[1:].split(":")
        dims[kind][int(d)] = points
    ok = np.isfinite(seq) & (seq > 0) & np.isfinite(hd) & (hd > 0)
    for kind, take in (("causal", ok & (cz != 0)), ("full", ok & (cz == 0))):
        by_dim = dims[kind] or dims["full" if kind == "causal" else "causal"]
        if by_dim and take.any():
            out[take] = _fraction_by_head_dim(by_dim, seq[take], hd[take])
    return out[()]


def _fraction_by_head_dim(by_dim, seq, head_dim):
    """``attention_kernel_fraction`` of ops of one kind (arrays): each measured head dimension's curve read at
    ``seq`` (linear in log(seq), clamped), then linear in log(head dim) between the measured dimensions (clamped)."""
    ds = sorted(by_dim)
    at = np.array([np.interp(np.log(seq), np.log([p[0] for p in by_dim[d]]), [p[1] for p in by_dim[d]]) for d in ds])
    x, xs = np.log(head_dim), np.log(ds)
    hi = np.clip(np.searchsorted(xs, x), 1, max(len(ds) - 1, 1))
    if len(ds) == 1:
        return at[0]
    lo = hi - 1
    w = np.clip((x - xs[lo]) / (xs[hi] - xs[lo]), 0.0, 1.0)
    cols = np.arange(len(x))
    return at[lo, cols] * (1 - w) + at[hi, cols] * w
