"""Device time of the transformer front-end's rows: the roofline ``perfcheck.estimate`` times its traced ops with.

A row (``sharding_shape.Sublayer``) is priced under the aten op behind its formula (``ATEN_OF_FORMULA``: a norm
row under ``native_layer_norm``'s efficiency, per-row price and curve). A row that also runs kernels of another
op lists them as ``parts`` ((aten name, cost) pairs, included in its ``cost``): each part is timed on its own
under its own op's efficiency and added to the row, as the module estimator times that op. Why: a norm whose
input is the residual stream also sums the stream's two gradients in backward (autograd's InputBuffer add,
``grad_accumulation``), an add; priced at the norm's efficiency, the front-ends disagreed wherever a spec gives a
norm and an add different efficiencies (every calibrated spec).

Every array is (rows, layouts); the phases are timed apart (each reads its own efficiencies) and stacked, fwd
rows then bwd rows, as ``step._time_rows`` consumes them.
"""
from __future__ import annotations

import numpy as np

from perfcheck.predict import attention_kernel, roofline
from perfcheck.hardware.systems import host_constants

#: The kernel the front-end's softmax row stands for: Megatron's fused scale-mask-softmax
#: (``sharding_shape.scaled_softmax``, one pass each way), priced under its own name, not torch's ``_softmax``, whose
#: CUDA backward is two passes (a separate ``grad * output`` kernel: the GPU specs' ``_softmax:bwd`` entries).
SCALED_SOFTMAX = "scaled_masked_softmax"
#: The aten op behind each sublayer formula (``perfcheck.estimate`` traces these): the spec's per-op
#: ``op_efficiency`` and per-row prices are keyed by aten names, so the rows look them up by these.
ATEN_OF_FORMULA = {"linear": "addmm", "matmul": "bmm", "softmax": SCALED_SOFTMAX, "layer_norm": "native_layer_norm",
                   "embedding": "embedding", "dropout": "native_dropout", "activation": "gelu",
                   "elementwise": "add", "attention": "_scaled_dot_product_flash_attention",
                   "cross_entropy": "_log_softmax"}
#: A cost's fields the timing reads, per phase.
FIELDS = ("macs", "flops", "bytes", "kernels", "rows", "strided_elems", "strided_bytes")


def part_columns(rows, stack, core) -> dict:
    """The parts of every row (module docstring): ``owner`` (row index per part), ``name`` (aten names) and
    ``<field>_<phase>`` arrays (parts, layouts); ``stack(values)`` makes one such array, ``core`` the (rows, 1)
    factor a row's work is scaled by (context parallelism's attention core)."""
    listed = [(i, name, cost) for i, r in enumerate(rows) for name, cost in r.parts]
    out = {"owner": np.array([i for i, _, _ in listed], dtype=int), "name": np.array([n for _, n, _ in listed], object)}
    out.update(cost_columns([c for _, _, c in listed], stack, core[out["owner"]] if listed else 1.0))
    return out


def cost_columns(costs, stack, scale) -> dict:
    """``<field>_<phase>`` arrays of ``costs`` (``formulas.OpCost`` per row), each field but the counts (kernels,
    rows) multiplied by ``scale`` (per row: context parallelism's attention core)."""
    out = {}
    for phase in ("fwd", "bwd"):
        for f in FIELDS:
            values = stack([getattr(getattr(c, phase), f) for c in costs])
            out[f"{f}_{phase}"] = values * (scale if f not in ("kernels", "rows") else 1)
    return out


def _phase(cols, phase, spec, dtype, names, **shape):
    """``roofline.device_times_read`` of one phase of ``cols`` (a dict of ``<field>_<phase>`` arrays)."""
    c = {f: cols[f"{f}_{phase}"] for f in FIELDS}
    rows_s = c["rows"] * roofline.row_prices(spec, names, phase)[:, None]  # CPU kernels' per-row prices
    return roofline.device_times_read(2 * c["macs"], c["flops"], c["bytes"], c["kernels"], spec, dtype, names=names,
                                      phase=phase, rows_s=rows_s, launch_s=host_constants(spec)["device_kernel_s"],
                                      strided=(c["strided_elems"], c["strided_bytes"]), **shape)


def _bound(d):
    """``device_times``' bound of summed terms: "overhead" where the launches outlast the larger of compute and memory."""
    top = np.maximum(d["compute"], d["memory"])
    return np.where(d["launch"] > top, "overhead", np.where(d["compute"] >= d["memory"], "compute", "memory"))


def device_rows(out, spec, dtype) -> dict:
    """compute, memory, launch, time (seconds) and bound of every row, fwd rows then bwd rows ((2 rows, layouts)),
    its parts included (module docstring). ``out``: ``step.evaluate``'s arrays (``<field>_<phase>``, ``formula``,
    ``min_dim``, ``unaligned``, ``attn_*``, ``parts``)."""
    parts = out["parts"]
    names = np.array([ATEN_OF_FORMULA.get(f, f) for f in out["formula"]], dtype=object)
    main = {k: np.array(out[k], dtype=float) for f in FIELDS for k in (f"{f}_fwd", f"{f}_bwd")}
    for k in main:  # a row's own op is its cost less its parts
        np.subtract.at(main[k], parts["owner"], parts[k])
    fraction = attention_kernel.attention_kernel_fraction(spec, out["attn_seq"], out["attn_head_dim"], out["attn_causal"])
    d, nan = {}, np.full(len(parts["owner"]), np.nan)
    for phase in ("fwd", "bwd"):
        row = _phase(main, phase, spec, dtype, names, min_dim=out["min_dim"], kernel_fraction=fraction,
                     align=roofline.alignment_factor(spec, out["unaligned"], phase))
        row = {key: np.array(np.broadcast_to(value, main["bytes_fwd"].shape)) for key, value in row.items()}
        if len(parts["owner"]):
            extra = _phase(parts, phase, spec, dtype, parts["name"], min_dim=nan[:, None], kernel_fraction=None,
                           align=None)
            for key in ("compute", "memory", "launch", "time"):
                np.add.at(row[key], parts["owner"], extra[key])
            owners = np.isin(np.arange(len(names)), parts["owner"])[:, None]  # their bound: the sum's
            row["bound"] = np.where(owners, _bound(row), row["bound"])
        for key, value in row.items():
            d.setdefault(key, []).append(value)
    return {key: np.concatenate(v) for key, v in d.items()}


__all__ = ["ATEN_OF_FORMULA", "FIELDS", "cost_columns", "part_columns", "device_rows"]
