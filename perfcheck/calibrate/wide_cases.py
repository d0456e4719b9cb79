"""Calibration cases of GEMMs whose output's rows are far from the square shapes' (``fit_wide`` fits them,
``predict/gemm_shape.py`` applies them): a wide output (an LM head: tokens x hidden -> vocabulary), forward and
backward (``matrix_wide_curve``), and a narrow one (rows of a few elements: a late convolution's output pixels on
torch's per-sample GEMM path; ``matrix_narrow_curve``)."""
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


#: Output row lengths of the narrow-output cases (C = A (NARROW_ROWS x NARROW_INNER) @ B (NARROW_INNER x n)): a CPU
#: convolution torch runs as per-sample GEMMs writes rows of its output pixels (3 x 3 = 9 for a 96-pixel image after
#: five halvings), less than one AVX-512 vector of fp32.
NARROW_OUTPUTS = (4, 9, 16, 36, 64)
NARROW_ROWS, NARROW_INNER = 1024, 256


def matmul_narrow_cases(device) -> list:
    """``torch.mm`` of (``NARROW_ROWS`` x ``NARROW_INNER``) by (``NARROW_INNER`` x n) for n in ``NARROW_OUTPUTS``
    (a fresh output per call), label ``narrow <n>``, shape (m, k, n). CPU fp32 only. ``fit_wide.matrix_narrow``
    turns them into ``matrix_narrow_curve``: the rate over the one the FLOPs and shape curves give, by n.
    Why: on the project's AMD VM (1 thread, 2026-11-27) tv_shufflenet's last 1x1 convolution (192 -> 1024 channels on
    3 x 3 pixels, batch 4; torch's _slow_conv2d path: per-sample GEMMs writing rows of 9) took 1.24 ms forward and
    1.78 backward, 11 GFLOP/s, against 0.69 ms predicted for both; the shape curve, measured on GEMMs with few *rows*
    (24 or 96 tokens of a Linear), priced a few *columns* as if vectorised along them."""
    dev = torch.device(device)
    a = torch.randn(NARROW_ROWS, NARROW_INNER, device=dev)
    cases = []
    for n in NARROW_OUTPUTS:
        b = torch.randn(NARROW_INNER, n, device=dev)
        nbytes = 4.0 * (NARROW_ROWS * NARROW_INNER + NARROW_INNER * n + NARROW_ROWS * n)
        cases.append(Case(names.MATMUL_NARROW, f"narrow {n}", lambda b=b: torch.mm(a, b), "fp32",
                          2.0 * NARROW_ROWS * NARROW_INNER * n, nbytes, (NARROW_ROWS, NARROW_INNER, n)))
    return cases
