"""Per-op cost formulas, forward and backward, written once.

Each formula takes sizes (Python numbers or numpy arrays: every term is plain arithmetic, so the transformer
front-end evaluates thousands of configurations in one call) and returns an ``OpCost``: matrix MACs, other FLOPs,
bytes read+written and kernel launches for forward and backward, the activation bytes autograd keeps, the parameters.

Conventions (shared with torch.utils.flop_counter and DeepSpeed's profiler):
- One MAC = 2 FLOPs; a k-term dot product is 2k FLOPs (not 2k-1). Bias adds are "other" FLOPs.
- Backward follows autograd: an input gradient only when that input requires grad, a weight gradient only when
  the weight requires grad. ``x_grad``/``w_grad`` flags say which.
- Bytes are what the kernels read and write at the op's element size: every input once, every output once.
  Caches and fusion are the roofline's business, not the formula's.
- ``act_mem`` counts tensors the op itself saves; when several ops save the same tensor the module estimator
  deduplicates by storage (it reads autograd's saved tensors directly).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from perfcheck.predict.pages import fresh_pages


@dataclass(frozen=True)
class Cost:
    """The work of one phase of one op. ``flops`` excludes the 2*macs of matrix products."""

    macs: float = 0
    flops: float = 0
    bytes: float = 0
    kernels: float = 0
    #: rows a row-wise kernel walks (softmax, log-softmax, layer norm, nll_loss): a CPU kernel pays a fixed
    #: cost per row beyond its elements (short rows: ~50-200 ns each), priced per op by the spec's op_row_s
    rows: float = 0
    #: elements in those rows (rows x row length): the price of a row depends on its length modulo the CPU's
    #: SIMD width (full vectors, then a scalar tail: a 5-float row costs ~3x an 8-float one on AVX2), so
    #: perfcheck.predict.roofline.row_time_s reads the length as row_elems / rows
    row_elems: float = 0
    #: separate GEMM calls the phase's matrix FLOPs run as, where one kernel loops over several (0: one per kernel).
    #: torch's CPU matmul path of a 1x1 convolution (ConvolutionMM2d.cpp, slow_conv2d_forward_out_cpu:
    #: ``slow_conv2d_update_output_frame`` per sample) runs one GEMM per sample: roofline.op_device_times prices it
    gemms: float = 0
    #: 4 KiB pages of a fresh allocation the phase first-touches where the C library maps it anew on every call
    #: (``fresh_pages``): each a minor page fault, priced by the spec's host ``page_fault_s`` (calibrated, CPU)
    pages: float = 0
    #: elements written by kernels off a GPU's vectorised loop and their bytes (in ``bytes``): see predict.strided
    strided_elems: float = 0
    strided_bytes: float = 0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def scale(self, k) -> "Cost":
        return Cost(*(getattr(self, f.name) * k for f in fields(self)))

    @property
    def total_flops(self):
        """All FLOPs: 2 per MAC plus the non-matrix FLOPs."""
        return 2 * self.macs + self.flops


ZERO = Cost()


@dataclass(frozen=True)
class OpCost:
    """Forward and backward cost of one op call, activation bytes kept, parameters owned."""

    fwd: Cost = ZERO
    bwd: Cost = ZERO
    act_mem: float = 0
    params: float = 0

    def __add__(self, other: "OpCost") -> "OpCost":
        return OpCost(self.fwd + other.fwd, self.bwd + other.bwd,
                      self.act_mem + other.act_mem, self.params + other.params)

    def scale(self, k) -> "OpCost":
        return OpCost(self.fwd.scale(k), self.bwd.scale(k), self.act_mem * k, self.params * k)


# ------------------------------------------------------------------------------------------
# Matrix products
# ------------------------------------------------------------------------------------------

def matmul(m, k, n, *, batch=1, a_grad=True, b_grad=True, bias=False, bias_grad=None,
           elem_bytes=4, b_is_weight=False) -> OpCost:
    """(batch, m, k) @ (batch, k, n) [+ bias(n)] -> (batch, m, n).

    fwd:  batch*m*k*n MACs; bias adds batch*m*n FLOPs.
    bwd:  grad_a = g @ b^T: batch*m*n*k MACs, if a requires grad
          grad_b = a^T @ g: batch*k*m*n MACs, if b requires grad
          grad_bias = sum over rows of g: batch*m*n FLOPs, if the bias requires grad.
    Saved for backward: a when b needs a gradient, b when a does (weights are not activations,
    so a saved ``b`` counts only when ``b_is_weight`` is False).
    """
    bias_grad = bias if bias_grad is None else bias_grad
    a, b, out = batch * m * k, (1 if b_is_weight else batch) * k * n, batch * m * n
    fwd = Cost(macs=batch * m * k * n, flops=out * bias,
               bytes=(a + b + out + n * bias) * elem_bytes, kernels=1)
    grad_a = Cost(macs=batch * m * n * k, bytes=(out + b + a) * elem_bytes, kernels=1)
    grad_b = Cost(macs=batch * k * m * n, bytes=(a + out + b) * elem_bytes, kernels=1)
    grad_bias = Cost(flops=out, bytes=(out + n) * elem_bytes, kernels=1)
    bwd = grad_a.scale(a_grad) + grad_b.scale(b_grad) + grad_bias.scale(bias * bias_grad)
    saved = a * b_grad + b * a_grad * (not b_is_weight)
    params = (k * n + n * bias) * b_is_weight
    return OpCost(fwd, bwd, saved * elem_bytes, params)


def grouped_matmul(macs, a_numel, b_numel, out_numel, *, a_grad=True, b_grad=True, elem_bytes=4,
                   b_is_weight=True) -> OpCost:
    """A grouped GEMM (torch._grouped_mm: one kernel, G independent products; MoE experts).

    The caller derives ``macs`` from the shapes (2D x 3D with offsets: M*K*N for (M, K) tokens
    sorted by expert and (G, K, N) expert weights; 3D x 3D: G*M*K*N; 2D x 2D: M*K_total*N).
    Like ``matmul``: bwd grad_a = g @ b^T and grad_b = a^T @ g, ``macs`` each, when that operand
    requires grad; saved: a for grad_b, b for grad_a (unless b is a weight, which is state).
    """
    fwd = Cost(macs=macs, bytes=(a_numel + b_numel + out_numel) * elem_bytes, kernels=1)
    grad_a = Cost(macs=macs, bytes=(out_numel + b_numel + a_numel) * elem_bytes, kernels=1)
    grad_b = Cost(macs=macs, bytes=(a_numel + out_numel + b_numel) * elem_bytes, kernels=1)
    saved = a_numel * b_grad + b_numel * a_grad * (not b_is_weight)
    return OpCost(fwd, grad_a.scale(a_grad) + grad_b.scale(b_grad), saved * elem_bytes, b_numel * b_is_weight)


def linear(tokens, in_features, out_features, *, bias=True, x_grad=True, w_grad=True,
           elem_bytes=4) -> OpCost:
    """nn.Linear on (tokens, in) -> (tokens, out): a matmul against a weight (in, out)."""
    return matmul(tokens, in_features, out_features, a_grad=x_grad, b_grad=w_grad, bias=bias,
                  bias_grad=bias and w_grad, elem_bytes=elem_bytes, b_is_weight=True)


def conv(batch, c_in, c_out, kernel_numel, out_spatial, in_spatial, *, groups=1, bias=False,
         transposed=False, x_grad=True, w_grad=True, elem_bytes=4, reorder=True, per_sample=False) -> OpCost:
    """Convolution (1d/2d/3d, any stride/padding/dilation) of (N, C_in, *in) -> (N, C_out, *out).

    Every output element of a regular conv is a dot product over (C_in/groups)*prod(kernel):
      fwd MACs = N * C_out * prod(out) * (C_in/groups) * prod(kernel).
    A transposed conv scatters every *input* element: N * C_in * prod(in) * (C_out/groups) * prod(kernel),
    which is the same product with in and out swapped.
    bwd: grad_input is the adjoint conv (same MACs), grad_weight correlates input with grad_out
    (same MACs again, NOT multiplied by groups: torch 2.13's FlopCounterMode counts it `groups`
    times too high); grad_bias sums grad_out.
    ``rows`` (each phase) = the weight's elements: a CPU convolution (oneDNN) reorders its weight into a blocked
    layout on every call, and its backward reorders both ways (data gradient with the weight transposed, weight
    gradient back to OIHW), at a cost per weight element beyond its bytes (op_row_s["convolution"], calibrated by
    op_classes.conv_weight_cases: a 512->512 3x3 backward on 2x2 pixels took 15 ms on the project's Xeon where its
    FLOPs take 2 ms, ~12 ms of it independent of the pixels). ``reorder=False``: no rows, for a convolution torch
    runs as a plain matrix product (aten_costs: a 1x1 kernel at stride 1 on one CPU thread), which reorders nothing.
    ``per_sample``: that matrix product is one GEMM per sample (torch's slow_conv2d: forward (HW x C_in) @
    (C_in x C_out) per sample; backward per sample grad_input (HW x C_out) @ (C_out x C_in) and grad_weight
    (C_out x HW) @ (HW x C_in) accumulated into one gradient): each GEMM kernel is ``batch`` calls (``Cost.gemms``)
    and reads the weight once per call (forward and grad_input: N x weight; grad_weight: written by the first call,
    read and written by the other N - 1: (2N - 1) x weight).
    """
    spatial = in_spatial if transposed else out_spatial
    c_other = c_in if transposed else c_out
    c_red = (c_out if transposed else c_in) / groups
    macs = batch * c_other * spatial * c_red * kernel_numel
    x, w, y = batch * c_in * in_spatial, c_out * (c_in / groups) * kernel_numel, batch * c_out * out_spatial
    rows = w if reorder else 0
    calls = batch if per_sample else 1
    gemms = calls if per_sample else 0
    fwd = Cost(macs=macs, flops=y * bias, bytes=(x + w * calls + y + c_out * bias) * elem_bytes, kernels=1, rows=rows,
               row_elems=rows, gemms=gemms)
    grad_x = Cost(macs=macs, bytes=(y + w * calls + x) * elem_bytes, kernels=1, gemms=gemms)
    grad_w = Cost(macs=macs, bytes=(y + x + w * (2 * calls - 1)) * elem_bytes, kernels=1, gemms=gemms)
    grad_b = Cost(flops=y, bytes=(y + c_out) * elem_bytes, kernels=1)
    bwd = (grad_x.scale(x_grad) + grad_w.scale(w_grad) + grad_b.scale(bias * w_grad)
           + Cost(rows=rows, row_elems=rows).scale(bool(x_grad or w_grad)))
    return OpCost(fwd, bwd, x * w_grad * elem_bytes, w + c_out * bias)


def attention(batch, heads, s_q, s_k, d_qk, d_v, *, kv_heads=None, causal=False,
              fused=True, grad=True, elem_bytes=4, dropout=0.0) -> OpCost:
    """Scaled dot-product attention softmax(Q K^T / sqrt(d)) V.

    logits Q K^T: b*h*s_q*s_k*d_qk MACs; attend P V: b*h*s_q*s_k*d_v MACs; softmax ~5 FLOPs/logit.
    ``fused`` (flash/memory-efficient kernels, F.scaled_dot_product_attention on GPU and CPU):
      the s_q x s_k matrix never reaches memory; backward recomputes Q K^T and does four more
      products: 2.5x the forward MACs (torch.utils.flop_counter.sdpa_backward_flop_count).
      Saved: q, k, v, out and the row log-sum-exp.
    Unfused (explicit bmm/softmax/bmm) is modelled by composing matmul/softmax/dropout instead.
    ``causal`` halves the products (what the kernel skips); FlopCounterMode ignores it, so the
    module estimator leaves it False unless asked.
    """
    if not fused:
        raise NotImplementedError("attention(fused=False): compose matmul, softmax and dropout instead")
    kv_heads = heads if kv_heads is None else kv_heads
    frac = 0.5 if causal else 1.0
    logits = batch * heads * s_q * s_k
    macs = logits * (d_qk + d_v) * frac
    q, k, v, o = (batch * heads * s_q * d_qk, batch * kv_heads * s_k * d_qk,
                  batch * kv_heads * s_k * d_v, batch * heads * s_q * d_v)
    lse = batch * heads * s_q * 4 / elem_bytes  # fp32 log-sum-exp, in elements of elem_bytes
    fwd = Cost(macs=macs, flops=5 * logits * frac, bytes=(q + k + v + o + lse) * elem_bytes, kernels=1)
    # bwd reads q, k, v, o, dO, lse and writes dQ, dK, dV (plus a dO*O row-sum pre-pass).
    bwd = Cost(macs=2.5 * macs, flops=8 * logits * frac,
               bytes=(2 * (q + k + v) + 2 * o + 2 * lse) * elem_bytes, kernels=2)
    return OpCost(fwd, bwd.scale(grad), (q + k + v + o + lse) * elem_bytes * grad, 0)


# ------------------------------------------------------------------------------------------
# Element-wise, normalisation, reductions
# ------------------------------------------------------------------------------------------

def elementwise(numel, *, inputs=1, flops_per_elem=1, bwd_flops_per_elem=1, grad_inputs=None,
                saves=1, elem_bytes=4, out_numel=None) -> OpCost:
    """An element-wise op reading ``inputs`` tensors of ``numel`` elements, writing one.

    bwd: reads grad_out plus the ``saves`` saved tensors, writes one grad per input needing it.
    ``grad_inputs`` (default: all inputs) is how many inputs need a gradient; 0 -> no backward.
    """
    out_numel = numel if out_numel is None else out_numel
    grad_inputs = inputs if grad_inputs is None else grad_inputs
    fwd = Cost(flops=out_numel * flops_per_elem, bytes=(inputs * numel + out_numel) * elem_bytes, kernels=1)
    bwd = Cost(flops=numel * bwd_flops_per_elem * grad_inputs,
               bytes=(out_numel + saves * numel + grad_inputs * numel) * elem_bytes,
               kernels=1 * (grad_inputs > 0))
    return OpCost(fwd, bwd.scale(grad_inputs > 0), saves * numel * elem_bytes * (grad_inputs > 0), 0)


#: FLOPs per element of common activations (forward, backward). Counted as a compiler would:
#: tanh/exp/erf ~ a handful of FLOPs each; the exact constant matters little to a memory-bound op.
ACTIVATION_FLOPS = {
    "relu": (1, 1), "leaky_relu": (2, 2), "hardtanh": (2, 2), "threshold": (1, 1), "elu": (4, 3),
    "gelu": (8, 12), "silu": (5, 6), "sigmoid": (4, 3), "tanh": (4, 2), "hardswish": (4, 3),
    "hardsigmoid": (3, 2), "mish": (10, 14), "softplus": (4, 4), "selu": (5, 3), "celu": (4, 3),
}


def activation(numel, kind="relu", *, x_grad=True, elem_bytes=4) -> OpCost:
    """A pointwise nonlinearity; backward needs its input (or output, same size) saved."""
    try:
        f, b = ACTIVATION_FLOPS[kind]
    except KeyError:
        raise KeyError(f"activation kind {kind!r} has no FLOP count; known: {sorted(ACTIVATION_FLOPS)}") from None
    return elementwise(numel, flops_per_elem=f, bwd_flops_per_elem=b, grad_inputs=int(bool(x_grad)),
                       elem_bytes=elem_bytes)


#: Nominal FLOPs per random number a CPU generator draws: mt19937's state update and tempering (~12 integer
#: ops per 32-bit word, M. Matsumoto & T. Nishimura, ACM TOMACS 8(1), 1998), the int-to-float conversion and, for
#: a Bernoulli draw, the compare: ~16 per element. A nominal count: ``perfcheck calibrate``'s RNG case measures
#: the rate (op_efficiency of ``bernoulli_``: torch's CPU bernoulli_(p) drew 11-18 ns per element on the
#: project's Xeon, 30-90x a copy's time per element, where a write-only model priced it as a copy).
RNG_FLOPS_PER_ELEM = 16


def rng(numel, *, elem_bytes=4) -> OpCost:
    """Fill ``numel`` elements with random numbers (bernoulli_, uniform_, normal_, rand, randn, randint, ...):
    RNG_FLOPS_PER_ELEM FLOPs of generator work and one write per element; no backward (not differentiable)."""
    return OpCost(Cost(flops=RNG_FLOPS_PER_ELEM * numel, bytes=numel * elem_bytes, kernels=1))


def dropout(numel, *, training=True, x_grad=True, elem_bytes=4, mask_bytes=1) -> OpCost:
    """Dropout: y = x * mask / (1-p). Keeps a 1-byte bool mask (not the input) for backward.
    NB: the fused kernel (native_dropout, a GPU's) draws its mask inside, priced as its bytes (a GPU's Philox
    generator is cheap beside them); on a CPU the trace sees bernoulli_, div_ and mul instead, and ``rng`` prices
    the generator there. Its FLOPs stay the two of the scaling, which FLOP counts (recompute, MFU) read."""
    if not training:
        return OpCost()
    fwd = Cost(flops=2 * numel, bytes=(2 * numel) * elem_bytes + numel * mask_bytes, kernels=1)
    bwd = Cost(flops=2 * numel, bytes=(2 * numel) * elem_bytes + numel * mask_bytes, kernels=1)
    return OpCost(fwd, bwd.scale(x_grad), numel * mask_bytes * bool(x_grad), 0)


def softmax(rows, cols, *, x_grad=True, elem_bytes=4, log=False) -> OpCost:
    """(log-)softmax over the last dim: max, subtract, exp, sum, divide ~ 5 FLOPs/elem.

    bwd: dx = y * (g - sum(g*y)) ~ 4 FLOPs/elem, reading y and g; saves the output y.
    """
    n = rows * cols
    fwd = Cost(flops=5 * n, bytes=2 * n * elem_bytes, kernels=1, rows=rows, row_elems=n)
    bwd = Cost(flops=4 * n, bytes=3 * n * elem_bytes, kernels=1, rows=rows, row_elems=n)
    return OpCost(fwd, bwd.scale(x_grad), n * elem_bytes * bool(x_grad), 0)


def safe_softmax(rows, cols, *, x_grad=True, elem_bytes=4, mask_bytes=1) -> OpCost:
    """aten ``_safe_softmax`` (the attention math path's softmax, SDPA with dropout or a mask): a softmax whose rows
    that are all -inf give 0, not NaN. torch runs it as four kernels (aten/src/ATen/native/transformers/attention.cpp):
    ``softmax``; ``eq(x, -inf)`` (read x, write a bool mask); ``all(mask, dim, keepdim)`` (read the mask, write one
    bool per row); ``where(rows, 0, out)`` (read the softmax and the row flags, write the result).

    fwd: the softmax's (5 FLOPs, 2 streams per element) + 1 FLOP per element for each of the three others, which
    move 3n elements of ``elem_bytes`` (eq reads x; where reads the softmax and writes the result) and 2n + 2 rows
    mask bytes (eq writes the mask and all reads it; all writes a flag per row and where reads it); ``rows`` = the
    softmax's. bwd (derivatives.yaml: ``_softmax_backward_data`` of the result): ``softmax``'s.
    Saves the output, as softmax does."""
    n = rows * cols
    plain = softmax(rows, cols, x_grad=x_grad, elem_bytes=elem_bytes)
    mask = Cost(flops=3 * n, bytes=(3 * n) * elem_bytes + (2 * n + 2 * rows) * mask_bytes, kernels=3)
    return OpCost(plain.fwd + mask, plain.bwd, plain.act_mem, 0)


def layer_norm(rows, cols, *, affine=True, bias=True, x_grad=True, w_grad=True, elem_bytes=4,
               rms=False) -> OpCost:
    """LayerNorm (or RMSNorm with ``rms``) over the last ``cols`` of ``rows`` rows.

    fwd: mean, var (or mean-square), normalise, scale[, shift] ~ 7 FLOPs/elem (5 for RMS).
    bwd: grad_x ~ 9 FLOPs/elem reading x, g and the saved row statistics; grad_gamma/beta are
    column sums of g*xhat and g. Saves x and per-row mean/rstd (fp32).
    """
    n = rows * cols
    stats = rows * (1 if rms else 2) * 4 / elem_bytes  # fp32 statistics, in elements
    w = cols * affine + cols * affine * bias * (not rms)
    fwd = Cost(flops=(5 if rms else 7) * n, bytes=(2 * n + w + stats) * elem_bytes, kernels=1, rows=rows, row_elems=n)
    gx = Cost(flops=9 * n, bytes=(3 * n + w + stats) * elem_bytes, kernels=1, rows=rows,
              row_elems=n)  # gw: column sums
    gw = Cost(flops=3 * n, bytes=(2 * n + w) * elem_bytes, kernels=1)
    bwd = gx.scale(x_grad) + gw.scale(affine * w_grad)
    saved = (n + stats) * elem_bytes * (x_grad or affine * w_grad)
    return OpCost(fwd, bwd, saved, w)


def batch_norm(n, channels, spatial, *, training=True, affine=True, x_grad=True, w_grad=True,
               elem_bytes=4) -> OpCost:
    """BatchNorm over (N, C, *spatial). Training: per-channel mean/var from the batch (two passes)
    and running-stat updates; eval: a per-channel scale and shift (2 FLOPs/elem).
    Saves x and per-channel mean/invstd for backward."""
    numel = n * channels * spatial
    w = 2 * channels * affine
    if training:
        fwd = Cost(flops=7 * numel, bytes=(3 * numel + w + 4 * channels) * elem_bytes, kernels=2)
        gx = Cost(flops=9 * numel, bytes=(3 * numel + w) * elem_bytes, kernels=2)
    else:
        fwd = Cost(flops=2 * numel, bytes=(2 * numel + w + 2 * channels) * elem_bytes, kernels=1)
        gx = Cost(flops=2 * numel, bytes=(2 * numel + w) * elem_bytes, kernels=1)
    gw = Cost(flops=3 * numel, bytes=(2 * numel + w) * elem_bytes, kernels=1)
    # In training the input-gradient kernel already reduces sum(g) and sum(g*xhat), which are the
    # weight and bias gradients; a separate weight-gradient pass runs only without an input grad.
    bwd = gx.scale(x_grad) + gw.scale(affine * w_grad * (not (training and x_grad)))
    saved = (numel + 2 * channels) * elem_bytes * (x_grad or affine * w_grad)
    return OpCost(fwd, bwd, saved, w)


def group_norm(n, channels, spatial, groups, *, affine=True, x_grad=True, w_grad=True,
               elem_bytes=4) -> OpCost:
    """GroupNorm: LayerNorm over (C/groups * spatial) per (sample, group), per-channel affine."""
    cost = layer_norm(n * groups, channels / groups * spatial, affine=False, x_grad=x_grad,
                      elem_bytes=elem_bytes)
    numel = n * channels * spatial
    w = 2 * channels * affine
    aff_f = Cost(flops=2 * numel * affine, bytes=w * elem_bytes)
    aff_b = Cost(flops=3 * numel, bytes=(2 * numel + w) * elem_bytes, kernels=1).scale(affine * w_grad)
    return OpCost(cost.fwd + aff_f, cost.bwd + aff_b, cost.act_mem, w)


def reduction(numel_in, numel_out, *, x_grad=True, elem_bytes=4, flops_per_elem=1) -> OpCost:
    """sum/mean/amax/var-style reduction; backward broadcasts grad_out back (no saved input for sum)."""
    fwd = Cost(flops=numel_in * flops_per_elem, bytes=(numel_in + numel_out) * elem_bytes, kernels=1)
    bwd = Cost(flops=numel_in * (flops_per_elem > 1), bytes=(numel_out + numel_in) * elem_bytes, kernels=1)
    return OpCost(fwd, bwd.scale(x_grad), 0, 0)


def pool(n, channels, out_spatial, in_spatial, kernel_numel, *, kind="max", x_grad=True,
         elem_bytes=4, index_bytes=8) -> OpCost:
    """Max/avg pooling: one compare or add per window element per output.

    Max pooling keeps int64 argmax indices for backward; avg keeps nothing but the shape.
    """
    out = n * channels * out_spatial
    x = n * channels * in_spatial
    idx = out * index_bytes * (kind == "max")
    fwd = Cost(flops=out * kernel_numel, bytes=(x + out) * elem_bytes + idx, kernels=1)
    bwd = Cost(flops=out * (kind != "max") * kernel_numel, bytes=(out + x) * elem_bytes + idx, kernels=2)
    return OpCost(fwd, bwd.scale(x_grad), idx * bool(x_grad), 0)


#: Memory streams of a fill of a fresh buffer per element written: a store that misses the cache reads its line
#: first (read-for-ownership, Intel 64 and IA-32 Optimization Reference Manual, "write-allocate"), so zeroing B
#: bytes moves ~2B (a 16 MiB zero_() took 0.75x a 16 MiB copy_ on the project's Xeon, not 0.5x).
FILL_STREAMS = 2
def embedding(tokens, dim, vocab, *, w_grad=True, elem_bytes=4, index_bytes=8) -> OpCost:
    """Embedding lookup (aten ``embedding``: index_select of one row per token).

    fwd: reads a row and writes it per token; ``rows`` = tokens (a random row's fetch is latency-bound: the
    spec's op_row_s["embedding"] prices it per index, calibrated by index_cases.embedding_row_cases).
    bwd (aten.embedding_dense_backward on a CPU): the dense (vocab, dim) gradient is zeroed (FILL_STREAMS per
    element), then each token's gradient row is added into its row (read g, read + write the row: 3 streams)
    after the indices are sorted; ``rows`` = tokens; ``pages``: the gradient's first-touch faults where it is a
    fresh mapping every call (``fresh_pages``). Saves the int64 indices."""
    out = tokens * dim
    fwd = Cost(bytes=2 * out * elem_bytes + tokens * index_bytes, kernels=1, rows=tokens, row_elems=out)
    bwd = Cost(flops=out, bytes=(3 * out + FILL_STREAMS * vocab * dim) * elem_bytes + tokens * index_bytes,
               kernels=2, rows=tokens, row_elems=out, pages=fresh_pages(vocab * dim * elem_bytes))
    return OpCost(fwd, bwd.scale(w_grad), tokens * index_bytes * bool(w_grad), vocab * dim)


def embedding_bag(indices, bags, dim, vocab, *, w_grad=True, elem_bytes=4, index_bytes=8, mode=0) -> OpCost:
    """EmbeddingBag (aten ``_embedding_bag``; ``mode`` 0 sum, 1 mean, 2 max): per index a row gathered into its bag.

    fwd: indices x dim elements read, bags x dim written, 1 add (max: compare) each; ``rows`` = indices. bwd, sum
    and mean (CPU ``_embedding_bag_dense_backward_cpu_sum_mean``): the (vocab, dim) gradient zeroed (FILL_STREAMS),
    indices sorted and counted, each index's bag gradient added into its row (3 streams); ``rows`` = indices
    (op_row_s["_embedding_bag"]). bwd, max (``_embedding_bag_dense_backward_cpu_max``: an ``index_add_`` per column
    into the rows that held the maxima): no sort; bags x dim scattered one-element adds (``rows``, each a strided
    access: op_row_s["_embedding_bag_max"]) and the int64 max_indices, after the same fill. ``pages``: the
    gradient's faults (``fresh_pages``). Saves indices, offsets (max: max_indices)."""
    moved, out = indices * dim, bags * dim
    idx, fill = (indices + bags) * index_bytes, FILL_STREAMS * vocab * dim * elem_bytes
    fwd = Cost(flops=moved, bytes=(moved + out) * elem_bytes + idx, kernels=1, rows=indices, row_elems=moved)
    bwd = (Cost(flops=out, bytes=3 * out * elem_bytes + fill + out * index_bytes, kernels=2, rows=out,
                row_elems=out) if mode == 2 else
           Cost(flops=moved, bytes=(3 * moved + out) * elem_bytes + fill + 2 * idx, kernels=3, rows=indices,
                row_elems=moved)) + Cost(pages=fresh_pages(vocab * dim * elem_bytes))
    saved = idx + out * index_bytes * (mode == 2)
    return OpCost(fwd, bwd.scale(w_grad), saved * bool(w_grad), vocab * dim)


def gather(moved, index_elems, *, x_grad=True, elem_bytes=4, index_bytes=8, accumulate=False) -> OpCost:
    """index_select/gather (``accumulate`` False) or scatter_add/index_add (True) of ``moved``
    elements addressed by ``index_elems`` indices.

    Memory-bound message passing (torch_geometric gathers x_j per edge and scatter-adds messages
    per node): reads the index and the moved elements and writes them; a scatter-add also reads
    the destination and adds (1 FLOP per element). Backward is the opposite gather/scatter of the
    same size. Saves the index.
    """
    index = index_elems * index_bytes
    fwd = Cost(flops=moved * accumulate, bytes=(2 + accumulate) * moved * elem_bytes + index, kernels=1)
    bwd = Cost(flops=moved * (not accumulate), bytes=(3 - accumulate) * moved * elem_bytes + index, kernels=1)
    return OpCost(fwd, bwd.scale(x_grad), index * bool(x_grad), 0)


def rnn(steps, batch, input_size, hidden, gates, *, x_grad=True, w_grad=True, bias=True, elem_bytes=4,
        directions=1) -> OpCost:
    """One recurrent layer (LSTM gates=4, GRU 3, Elman RNN 1) over ``steps`` time steps.

    fwd per step and direction: x_t W_ih^T (B*gH*I MACs) + h_{t-1} W_hh^T (B*gH*H MACs), gate
    nonlinearities and the cell update ~ 8 FLOPs per hidden unit (+2 per gate unit for biases).
    bwd: grad through h (always, the recurrence needs it) and through x (if it requires grad):
    B*gH*H + B*gH*I*x_grad MACs per step; weight gradients B*gH*(I+H) if the weights need them.
    Bytes: the input projection is one GEMM over all steps; the recurrent GEMM runs per step and
    re-reads W_hh each time (one kernel per step: cuDNN's non-persistent algorithm, mkldnn on CPU).
    Saved: the gate activations and h, c per step, and x.
    """
    gh = gates * hidden
    tb = steps * batch * directions
    macs = tb * gh * (input_size + hidden)
    other = tb * (8 * hidden + 2 * gh * bias)
    w_ih, w_hh = gh * input_size * directions, gh * hidden * directions
    io = (tb * input_size / directions * directions + tb * gh + 2 * tb * hidden) * elem_bytes
    fwd = Cost(macs=macs, flops=other, bytes=io + (w_ih + steps * w_hh) * elem_bytes, kernels=1 + steps * directions)
    grad_act = Cost(macs=tb * gh * (hidden + input_size * x_grad), flops=other,
                    bytes=io + (w_ih * x_grad + steps * w_hh) * elem_bytes, kernels=1 + steps * directions)
    grad_w = Cost(macs=macs, flops=tb * gh * bias, bytes=io + (w_ih + w_hh) * elem_bytes, kernels=2)
    saved = (tb * (gh + 2 * hidden) + tb * input_size / directions) * elem_bytes
    params = (w_ih + w_hh + 2 * gh * directions * bias)
    return OpCost(fwd, grad_act + grad_w.scale(w_grad), saved, params)


def view_scatter(in_numel, out_numel, *, x_grad=True, elem_bytes=4) -> OpCost:
    """A view whose backward builds its input's whole gradient: ``select``, ``slice`` (``narrow``, ``x[..., :k]``),
    ``diagonal``, ``as_strided``, ``unfold``.

    fwd: no kernel (the output aliases the input). bwd (torch/csrc/autograd/FunctionsManual.cpp:
    ``select_backward``, ``slice_backward``, ``diagonal_backward``: ``zeros(input_sizes)`` then
    ``grad_input.<view>(...).copy_(grad)``): the input-sized zeros (FILL_STREAMS per element) and the output gradient
    copied into its window (read + write the output's elements); 2 kernels. Three selects of one packed q/k/v
    projection (``nn.MultiheadAttention``) so make three input-sized gradients, which autograd then adds
    (``perfcheck.predict.grad_accumulation``)."""
    bwd = Cost(bytes=(FILL_STREAMS * in_numel + 2 * out_numel) * elem_bytes, kernels=2)
    return OpCost(ZERO, bwd.scale(x_grad), 0, 0)


def view_gather(in_numel, *, x_grad=True, elem_bytes=4) -> OpCost:
    """A view that splits its input into pieces: ``split``, ``split_with_sizes``, ``chunk``, ``unbind``.

    fwd: no kernel. bwd (FunctionsManual.cpp ``split_backward`` / ``unbind_backward``: ``cat`` / ``stack`` of the
    pieces' gradients): read and write the input's elements, one kernel (a piece without a gradient is a zeros
    first: not counted)."""
    bwd = Cost(bytes=2 * in_numel * elem_bytes, kernels=1)
    return OpCost(ZERO, bwd.scale(x_grad), 0, 0)


def view_reduce(in_numel, out_numel, *, x_grad=True, elem_bytes=4) -> OpCost:
    """``expand`` (a broadcast view): fwd no kernel; bwd ``grad.sum_to_size(input)`` (derivatives.yaml), a reduction
    reading the output's elements and writing the input's, 1 FLOP per element read; nothing when the view broadcasts
    nothing (same element count: torch returns the gradient as it is)."""
    if out_numel == in_numel:
        return OpCost()
    bwd = Cost(flops=out_numel, bytes=(out_numel + in_numel) * elem_bytes, kernels=1)
    return OpCost(ZERO, bwd.scale(x_grad), 0, 0)


def copy(numel_in, numel_out=None, *, x_grad=True, elem_bytes=4, out_elem_bytes=None) -> OpCost:
    """clone/contiguous/cat/cast: a memory-to-memory copy, no FLOPs; backward copies the grad back."""
    numel_out = numel_in if numel_out is None else numel_out
    out_elem_bytes = elem_bytes if out_elem_bytes is None else out_elem_bytes
    fwd = Cost(bytes=numel_in * elem_bytes + numel_out * out_elem_bytes, kernels=1)
    bwd = Cost(bytes=numel_out * out_elem_bytes + numel_in * elem_bytes, kernels=1)
    return OpCost(fwd, bwd.scale(x_grad), 0, 0)


def cross_entropy(rows, classes, *, x_grad=True, elem_bytes=4) -> OpCost:
    """log_softmax + nll_loss over (rows, classes): one pass for the softmax, one gather."""
    ls = softmax(rows, classes, x_grad=x_grad, elem_bytes=elem_bytes, log=True)
    nll = Cost(flops=rows, bytes=(rows * 2) * elem_bytes + rows * 8, kernels=1)
    nll_b = Cost(bytes=rows * classes * elem_bytes + rows * 8, kernels=1)
    return OpCost(ls.fwd + nll, ls.bwd + nll_b.scale(x_grad), ls.act_mem, 0)
