"""Calibration cases of GEMMs with a wide output (an LM head: tokens x hidden -> vocabulary), forward and backward:
the rate ``fit._matrix_wide`` turns into ``matrix_wide_curve`` (``roofline.wide_factors`` applies it)."""
from __future__ import annotations

import torch

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate.cases import Case


#: Output widths (out_features) of the wide-output cases, on WIDE_ROWS tokens of WIDE_ROWS features: an LM head's
#: shape (a vocabulary of 8-50 Ki over a narrow model), where a CPU GEMM loses what its FLOPs curve does not say.
WIDE_OUTPUTS = (8192, 32768)
WIDE_ROWS = 128


def matmul_wide_cases(device) -> list:
    """``F.linear`` of (``WIDE_ROWS`` x ``WIDE_ROWS``) by a (n x ``WIDE_ROWS``) weight for n in ``WIDE_OUTPUTS``, label
    ``fwd <n>`` (a fresh output per call, as a model's forward allocates it), and its backward, label ``bwd <n>``
    (both gradients, as autograd runs them for that call); flops = the phase's, shape (m, k, n). CPU fp32 only.
    ``fit._matrix_wide`` turns each into ``matrix_wide_curve[phase]``: the rate over the one the FLOPs and shape
    curves give, by n. Why: on the project's AMD VM (1 thread, 2026-11-27) F.linear 128 x 128 -> n ran at 94 GFLOP/s
    for n = 2048, 84 at 8192, 53 at 32768 and 50 at 50257 (the output kept, so not page faults), where square GEMMs
    of the same FLOPs ran at 90-94: the held-out BERT's and GPT-2's LM heads (n = 30522, 50257) read 1.65-1.71x their
    prediction (bench/results/cache_levels.md, table 2)."""
    dev = torch.device(device)
    cases = []
    for n in WIDE_OUTPUTS:
        x = torch.randn(WIDE_ROWS, WIDE_ROWS, device=dev, requires_grad=True)
        w = torch.randn(n, WIDE_ROWS, device=dev, requires_grad=True)
        y = torch.nn.functional.linear(x, w)
        g = torch.randn_like(y)
        flops = 2.0 * WIDE_ROWS * WIDE_ROWS * n
        shape = (WIDE_ROWS, WIDE_ROWS, n)
        fwd = (lambda x=x, w=w: torch.nn.functional.linear(x.detach(), w.detach()))
        nbytes = 4.0 * (2 * WIDE_ROWS * WIDE_ROWS + 2 * n * WIDE_ROWS)  # x and its gradient's size, W, the output
        cases.append(Case(names.MATMUL_WIDE, f"fwd {n}", fwd, "fp32", flops, nbytes, shape))
        cases.append(Case(names.MATMUL_WIDE, f"bwd {n}",
                          lambda x=x, w=w, y=y, g=g: torch.autograd.grad(y, (x, w), g, retain_graph=True),
                          "fp32", 2 * flops, 4.0 * (3 * WIDE_ROWS * n + 2 * n * WIDE_ROWS), shape))
    return cases
