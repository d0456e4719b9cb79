"""A torchtitan Llama block's kernel table (``bench/layer_gpu.py`` on a GPU) against the transformer front-end's rows.

Per kernel class (the profiler's table of one forward + backward, each kernel classed by today's
``layer_gpu.kernel_class``, gemm / attention / elementwise, whatever class the table recorded) measured seconds over predicted: the front-end's layer rows of ``estimate_transformer(eager=True,
eager_norm=True, flash=True, causal=True)`` on ``--system``, linear rows as gemm, the fused attention row as
attention, every other layer row (norms, rotary, repeat_kv, activation, residual adds) as elementwise.

    python bench/layer_compare.py --kernels bench/gpu_results/2026-11-27-h200-check/layers_h200_kernels.csv --system h200
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from layer_gpu import SHAPES, kernel_class  # noqa: E402
from perfcheck.predict.transformer import estimate_transformer  # noqa: E402


def predicted_by_class(shape, system) -> dict:
    """Seconds per kernel class of one layer's forward + backward as the front-end prices it."""
    model = dict(name=shape.name, layers=1, hidden=shape.dim, heads=shape.heads, kv_heads=shape.kv_heads,
                 ffn_hidden=shape.ffn, vocab=1000, seq_len=shape.seq, norm="rmsnorm", activation="swiglu", bias=False,
                 tied_embeddings=False, position="rotary")
    tab = estimate_transformer(model, batch=shape.batch, system=system, dtype="bf16", flash=True, causal=True,
                               eager=True, eager_norm=True)
    tab = tab[tab["stage"] == "layer"]
    klass = tab["formula"].map({"linear": "gemm", "attention": "attention"}).fillna("elementwise")
    return (tab["pred_fwd_s"] + tab["pred_bwd_s"]).groupby(klass).sum().to_dict()


def compare(kernels: pd.DataFrame, system) -> pd.DataFrame:
    rows = []
    for shape in SHAPES:
        mine = kernels[kernels["shape"] == shape.name]
        measured = mine.groupby(mine["kernel"].map(kernel_class))["seconds"].sum()  # today's classes, any table
        if measured.empty:
            continue
        pred = predicted_by_class(shape, system)
        for klass, seconds in measured.items():
            rows.append(dict(shape=shape.name, klass=klass, measured_ms=seconds * 1e3,
                             predicted_ms=pred.get(klass, float("nan")) * 1e3))
    out = pd.DataFrame(rows)
    out["ratio"] = out["measured_ms"] / out["predicted_ms"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", required=True, help="a layer_gpu.py kernel table (<csv>.kernels.csv)")
    ap.add_argument("--system", default="h200")
    args = ap.parse_args(argv)
    print(compare(pd.read_csv(args.kernels), args.system).round(3).to_string(index=False))


if __name__ == "__main__":
    main()
