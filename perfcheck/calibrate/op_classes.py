"""Calibration cases for the op classes real models spend their time in, beyond the LeNet/JSC-size cases of
``cases.py``: each a micro-benchmark of one op class at a mid size, written as a row the existing fits read.

Why: a CPU kernel's rate depends on its class, not only on its FLOPs and bytes. On the project's Xeon (1 thread)
a 3x3 depthwise convolution ran 7-13x below the dense convolution's efficiency; torch's CPU dropout draws its mask
with bernoulli_ at 11-18 ns per element (a copy moves an element in ~0.3 ns); an Embedding's backward writes the
whole dense (vocab x dim) gradient and then adds one row per index, at ~60-100 ns per index beyond its bytes.
The estimator looks each op's efficiency up by its class first (perfcheck.predict.aten_costs.op_class,
perfcheck.predict.efficiency.class_efficiency), so each case here sets one class's number:

  kind ``opeff``   label ``<class>`` or ``<class>:<phase>``: ``fit_host.per_op_costs`` sets
                   op_efficiency[label] = the estimator's roofline time for the call (flops = its matrix FLOPs,
                   n = its other FLOPs, bytes: perfcheck.predict.formulas through aten_costs.cost_of, the one
                   op-cost path) / (measured time - one tiny op's dispatch)
  kind ``oprows``  label ``<op> fwd|bwd``, m = rows (indices), k = row length: ``fit_host.row_costs`` sets the
                   per-row price op_row_s[op][phase] = the slope over the row counts less the roofline's slope;
                   ``<class>:gemm_call bwd`` (m = sgemm calls): fit_host.gemm_call_costs (predict.gemm_calls)
  kind ``classfixed`` label ``<class>`` or ``<class>:bwd`` (CPU): one tiny call of the class; ``fit._per_op_costs``
                   sets op_fixed_s[label] = its time less one tiny op's dispatch (the class's fixed cost per call,
                   host time in the estimator) and takes it out of the class's ``opeff`` case before the
                   efficiency, so a class's time is fixed + roofline / efficiency (two sizes, two unknowns)

Each call below is one aten kernel where torch has one (``aten.convolution_backward``: no autograd engine in the
timing), so a single case's time less one dispatch is that kernel. The same cases run on a GPU (fp32 tensors on
the device, without the per-row cases): ``op_class_cases(device)``.
"""
from __future__ import annotations

import torch

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate.cases import Case, l2_cache_bytes
from perfcheck.calibrate.conv_shapes import CONV_CASES
from perfcheck.calibrate.op_cases import ROW_CASE_LENGTH
from perfcheck.calibrate.layers import CallModule
from perfcheck.predict.aten_costs import NHWC_SUFFIX, cost_of
from perfcheck.predict.host import EVICTED_SUFFIX
from perfcheck.predict.gemm_calls import gemm_call_key
from perfcheck.predict.trace import trace_model

aten = torch.ops.aten

#: The same classes at the smallest shape of each (batch 2, 8 channels, 4x4 pixels; grouped: 2 groups of 8): the
#: time of such a call is its class's fixed cost. Why: on the project's Xeon (1 thread, process time, 2026-11-26)
#: every oneDNN convolution call took 57-104 us forward and ~130 us backward (both gradients) whatever its size,
#: a depthwise 3x3 on 8 channels 4x4 as long as one on 64 channels 16x16 (73-111 us); the 1x1 matrix-product
#: path 4.5 / 14.5 us. One efficiency per class at a mid size had spread that fixed cost over the FLOPs, so a
#: MobileNet 5x5 depthwise forward read 1.3-2.6x and ResNet's strided 1x1 downsample 1.9-4.2x under.
CONV_FIXED_CASES = {
    "convolution_depthwise": ((2, 8, 4, 4), (8, 1, 3, 3), 8, 1, 1),
    "convolution_depthwise_large": ((2, 8, 4, 4), (8, 1, 5, 5), 8, 1, 2),
    "convolution_grouped": ((2, 16, 4, 4), (16, 8, 3, 3), 2, 1, 1),
    "convolution_wide": ((2, 8, 4, 4), (8, 8, 3, 3), 1, 1, 1),
    "convolution_1x1": ((2, 8, 4, 4), (8, 8, 1, 1), 1, 1, 0),
    "convolution_1d": ((2, 8, 8), (8, 8, 3), 1, 1, 1),
    "convolution_transposed": ((2, 8, 4, 4), (8, 8, 4, 4), 1, 2, 1),
    "convolution_depthwise_nhwc": ((2, 8, 4, 4), (8, 1, 3, 3), 8, 1, 1),
    "convolution_depthwise_large_nhwc": ((2, 8, 4, 4), (8, 1, 5, 5), 8, 1, 2),
}
#: Elements of the elementwise cases (1 MiB of fp32: in L2, as a layer's activations of a small batch are).
ELEMENTWISE = 1 << 18
def formula_costs(fn, inputs, names) -> dict:
    """phase -> (matrix FLOPs, other FLOPs, bytes, kernels) of the ops named ``names`` that ``fn(*inputs)`` runs, by
    the estimator's formulas (traced once on fake tensors, costed through aten_costs.cost_of)."""
    trace = trace_model(CallModule(fn), inputs)
    out = {}
    for phase in ("fwd", "bwd"):
        mf = of = nb = k = 0.0
        for op in trace.ops:
            if op.call.name in names and not op.backward_only:
                c = getattr(cost_of(op.call).cost, phase)
                mf, of, nb, k = mf + 2 * c.macs, of + c.flops, nb + c.bytes, k + c.kernels
        out[phase] = (mf, of, nb, k)
    return out


def opeff_case(label, fn, cost, fwd_kernels=1.0, dtype="fp32") -> Case:
    """An ``opeff`` row: flops = matrix FLOPs, bytes, n = other FLOPs, m/k = the forward's and this phase's
    kernels (the fit takes the op's fixed cost per kernel out of the time, as the estimator adds it)."""
    mf, of, nb, k = cost
    return Case(names.OPEFF, label, fn, dtype, mf, nb, (int(max(fwd_kernels, 1)), int(max(k, 1)), int(of)))


def _conv_calls(label, shape, dev) -> tuple:
    """``(forward(x, w), forward(), backward(), x, w)`` of a ``CONV_CASES``-style shape: the functional call, it on
    fixed tensors, and aten.convolution_backward (input and weight gradients) on a gradient of its output. A class
    ending in ``aten_costs.NHWC_SUFFIX`` runs on a channels-last input and output gradient (as a model whose
    activations are channels-last hands them over; the weight stays as ``nn.Conv2d`` makes it)."""
    xs, ws, groups, stride, pad = shape
    layout = torch.channels_last if label.endswith(NHWC_SUFFIX) else torch.contiguous_format
    x = torch.randn(*xs, device=dev).contiguous(memory_format=layout).requires_grad_(True)
    w = torch.randn(*ws, device=dev, requires_grad=True)
    transposed = label == "convolution_transposed"
    nd = len(xs) - 2
    conv = (torch.nn.functional.conv_transpose2d if transposed else
            torch.nn.functional.conv1d if nd == 1 else torch.nn.functional.conv2d)

    def fwd_fn(x, w, conv=conv, stride=stride, pad=pad, groups=groups, transposed=transposed):
        return conv(x, w, None, stride, pad) if transposed else conv(x, w, None, stride, pad, groups=groups)
    with torch.no_grad():
        y = fwd_fn(x, w)
    g = torch.randn_like(y).contiguous(memory_format=layout if y.dim() == 4 else torch.contiguous_format)
    xd, wd = x.detach(), w.detach()
    args = dict(bias_sizes=None, stride=[stride] * nd, padding=[pad] * nd, dilation=[1] * nd,
                transposed=transposed, output_padding=[0] * nd, groups=groups, output_mask=[True, True, False])
    return (fwd_fn, lambda: fwd_fn(xd, wd), lambda: aten.convolution_backward(g, xd, wd, **args), x, w)


def conv_cases(dev) -> list:
    """Forward (label = class) and backward (``<class>:bwd``: aten.convolution_backward, input and weight
    gradients) of each ``CONV_CASES`` shape."""
    out = []
    for label, shape in CONV_CASES.items():
        fwd_fn, fwd, bwd, x, w = _conv_calls(label, shape, dev)
        cost = formula_costs(fwd_fn, (x, w), ("convolution",))
        out.append(opeff_case(label, fwd, cost["fwd"], cost["fwd"][3]))
        out.append(opeff_case(f"{label}:bwd", bwd, cost["bwd"], cost["fwd"][3]))
    return out


def conv_fixed_cases(dev) -> list:
    """``classfixed`` rows: each ``CONV_FIXED_CASES`` class's tiny call, forward (label = class) and backward
    (``<class>:bwd``, both gradients): its fixed cost per call (``op_fixed_s``; see ``CONV_FIXED_CASES``). On a
    CPU whose L2 size is known, each also timed call by call right after streaming ``EVICT_L2_MULTIPLE`` x the L2
    (label + ``host.EVICTED_SUFFIX``): the excess is what the class's call pays in a step, its code and data
    evicted by the other layers' work (``perfcheck.predict.host._class_cold``; bench/results/conv.md)."""
    out = []
    l2 = l2_cache_bytes() if torch.device(dev).type == "cpu" else 0
    flush = torch.empty(names.EVICT_L2_MULTIPLE * l2 // 4) if l2 > 0 else None
    for label, shape in CONV_FIXED_CASES.items():
        _, fwd, bwd, _, _ = _conv_calls(label, shape, dev)
        out += [Case(names.CLASSFIXED, label, fwd, "fp32", host=True),
                Case(names.CLASSFIXED, f"{label}:bwd", bwd, "fp32", host=True)]
        if flush is not None:
            out += [Case(names.CLASSFIXED, key + EVICTED_SUFFIX, fn, "fp32", host=True,
                         between=lambda f=flush: f.add_(1.0)) for key, fn in ((label, fwd), (f"{label}:bwd", bwd))]
    return out


#: Channels of the weight-reorder cases: C -> C 3x3 convolutions on a 4 x C x 2 x 2 input (ResNet's last stage's
#: pixels at a 64x64 image), whose time over the weight's elements is the per-weight-element price.
CONV_WEIGHT_CHANNELS = (128, 256)


def conv_weight_cases(dev) -> list:
    """``convolution fwd|bwd`` (kind ``oprows``, m = weight elements): a dense 3x3 convolution and its backward
    (aten.convolution_backward, both gradients) at two channel counts (``CONV_WEIGHT_CHANNELS``) on 2x2 pixels,
    where the FLOPs are small and the weight is large: the slope over the weight's elements less the roofline's is
    oneDNN's per-call weight reorder (formulas.conv's rows)."""
    out = []
    for c in CONV_WEIGHT_CHANNELS:
        x = torch.randn(4, c, 2, 2, device=dev, requires_grad=True)
        w = torch.randn(c, c, 3, 3, device=dev, requires_grad=True)
        g = torch.randn(4, c, 2, 2, device=dev)
        xd, wd = x.detach(), w.detach()

        def conv(x, w):
            return torch.nn.functional.conv2d(x, w, None, 1, 1)
        cost = formula_costs(conv, (x, w), ("convolution",))
        for phase, fn in (("fwd", lambda xd=xd, wd=wd: conv(xd, wd)),
                          ("bwd", lambda g=g, xd=xd, wd=wd: aten.convolution_backward(
                              g, xd, wd, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False]))):
            _, of, nb, k = cost[phase]
            out.append(Case(names.OPROWS, f"convolution {phase}", fn, "fp32", float(of), float(nb),
                            (c * c * 9, ROW_CASE_LENGTH, int(max(k, 1)))))
    return out


#: The per-call cases of the depthwise 5x5 backward (``depthwise_call_cases``): channels, output pixels per side,
#: and the two batch sizes whose difference is the slope over oneDNN's (sample, group) sgemm calls. A 2x2 output
#: keeps the MACs per call small (2 x 100 of both gradients against a call's ~0.6 us on the project's Xeon), so the
#: slope is mostly the call; the channels stay fixed so the weight reorder (per weight element) cancels out.
DEPTHWISE_CALL_CASE = (128, 2, (1, 8))


def depthwise_call_cases(dev) -> list:
    """``convolution_depthwise_large:gemm_call bwd`` (kind ``oprows``; m = the weight gradient's sgemm calls, batch x
    groups; flops = both gradients' matrix FLOPs; bytes by the formula; n = kernels): aten.convolution_backward of a
    5x5 depthwise convolution at ``DEPTHWISE_CALL_CASE``'s two batch sizes. ``fit_host.gemm_call_costs`` solves
    this slope with the class's ``opeff`` backward case for the price per call and the class's backward efficiency
    (two unknowns, two equations; formulas.conv ``weight_gemm_calls``, bench/results/depthwise_law.md)."""
    label = "convolution_depthwise_large"
    ch, pixels, batches = DEPTHWISE_CALL_CASE
    out = []
    for n in batches:
        fwd_fn, _, bwd, x, w = _conv_calls(label, ((n, ch, pixels, pixels), (ch, 1, 5, 5), ch, 1, 2), dev)
        mf, _, nb, k = formula_costs(fwd_fn, (x, w), ("convolution",))["bwd"]
        out.append(Case(names.OPROWS, f"{gemm_call_key(label)} bwd", bwd, "fp32", float(mf), float(nb),
                        (n * ch, ROW_CASE_LENGTH, int(max(k, 1)))))
    return out


def elementwise_cases(dev) -> list:
    """Dropout's mask (``bernoulli_``: the RNG, priced as generator work by formulas.rng) and the activations whose
    kernels differ most from a plain pointwise op, forward and backward (``<op>:bwd``): erf-GELU, tanh-GELU
    (class ``gelu_tanh``), SiLU, on ``ELEMENTWISE`` fp32 elements; and the attention path's ``_safe_softmax``."""
    x = torch.randn(ELEMENTWISE, device=dev)
    g = torch.randn(ELEMENTWISE, device=dev)
    xg = x.clone().requires_grad_(True)
    out = [opeff_case("bernoulli_", lambda x=x: x.bernoulli_(0.9),
                  formula_costs(lambda t: torch.empty_like(t).bernoulli_(0.9), (x,), ("bernoulli_",))["fwd"])]
    acts = {"gelu": (lambda t: torch.nn.functional.gelu(t), lambda: aten.gelu_backward(g, x)),
            "gelu_tanh": (lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
                          lambda: aten.gelu_backward(g, x, approximate="tanh")),
            "silu": (torch.nn.functional.silu, lambda: aten.silu_backward(g, x))}
    for label, (fwd, bwd) in acts.items():
        name = ("gelu",) if label.startswith("gelu") else (label,)
        cost = formula_costs(fwd, (xg,), name)
        out.append(opeff_case(label, lambda f=fwd: f(x), cost["fwd"]))
        out.append(opeff_case(f"{label}:bwd", bwd, cost["bwd"]))  # 1 kernel each way
    return out + [safe_softmax_case(dev)]


#: The elementwise ops whose kernels may do more per element than an add (a root, a division, a transcendental), as
#: models and the optimizers run them (Adam's and RMSprop's sqrt, addcdiv, lerp; RMSNorm's rsqrt; an LSTM cell's
#: sigmoid and tanh): op name -> the call on (x > 0, y > 0). Not ``pow``: its price depends on the exponent (ATen
#: squares, cubes and inverts on a fast path: x ** 2 0.12 ns per element, x ** 1.5 2.8 ns on the project's AMD VM).
ELEMENT_RATE_OPS = {
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "div": torch.div,
    "exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf,
    "addcdiv": lambda x, y: torch.addcdiv(x, x, y, value=0.5),
    "addcmul": lambda x, y: torch.addcmul(x, x, y, value=0.5), "lerp": lambda x, y: torch.lerp(x, y, 0.1),
}


def element_rate_cases(dev) -> list:
    """Each of ``ELEMENT_RATE_OPS`` on ``ELEMENTWISE`` fp32 elements (1 MiB per operand: beside the core in L2 or
    L3, as a tight loop keeps them), label the op's name, m = elements, n = its formula FLOPs (aten_costs); the fit
    (``fit_host.element_rates``) sets ``op_flop_s[op]`` = (time - one tiny op's dispatch) / FLOPs: the price per
    FLOP below which that op's kernel does not run. Why: the vector rate is an add's, and an add is bound by its
    bytes; a square root's element took 0.44 ns against an add's 0.11 on the project's AMD VM (1 thread, 256 Ki
    elements), so Adam's step, whose sqrt is one of its eight kernels, was priced at 0.75 of its tight-loop time."""
    x = torch.rand(ELEMENTWISE, device=dev) + 0.5
    y = torch.rand(ELEMENTWISE, device=dev) + 0.5
    out = []
    for name, fn in ELEMENT_RATE_OPS.items():
        two = fn.__code__.co_argcount == 2 if hasattr(fn, "__code__") else name == "div"
        args = (x, y) if two else (x,)
        cost = formula_costs(lambda t, f=fn, a=args[1:]: f(t, *a), (x.clone().requires_grad_(True),), (name,))["fwd"]
        out.append(Case(names.OPRATE, name, lambda f=fn, a=args: f(*a), "fp32", 0.0, cost[2],
                        (ELEMENTWISE, int(max(cost[3], 1)), int(cost[1]))))
    return out


#: Attention scores of the ``_safe_softmax`` case: (batch, heads, queries, keys), ``ELEMENTWISE`` / 4 elements.
SCORES = (4, 4, 64, 64)


def safe_softmax_case(dev) -> Case:
    """``_safe_softmax`` (label of its own: the math attention path's softmax, which SDPA runs with dropout or a
    mask): its four kernels (formulas.safe_softmax) include a boolean ``all`` over each row, whose CPU kernel is
    far from the vector roofline (0.7-9 ns per element on the project's Xeon, against 0.13 for a copy), so the
    class's measured rate, not the plain softmax's, prices it. Its backward is softmax's (``_softmax:bwd``)."""
    x = torch.randn(*SCORES, device=dev)
    xg = x.clone().requires_grad_(True)
    cost = formula_costs(lambda t: aten._safe_softmax(t, -1), (xg,), ("_safe_softmax",))
    return opeff_case("_safe_softmax", lambda: aten._safe_softmax(x, -1), cost["fwd"], cost["fwd"][3])


#: (rows, columns) of the row-wise cases (LayerNorm, softmax), (batch, channels, height, width, groups) of the
#: GroupNorm case and (batch, channels, height, width) of the BatchNorm case: ``ELEMENTWISE`` fp32 elements each,
#: rows of 128 (a small transformer's width), 8 groups, 64 channels of 32 x 32 pixels (a small CNN's early layer).
NORM_ROWS = (ELEMENTWISE // 128, 128)
GROUP_NORM = (4, 64, 32, 32, 8)
BATCH_NORM = (4, 64, 32, 32)


def norm_cases(dev) -> list:
    """Forward and backward (``<op>:bwd``: the one aten backward call, no autograd engine) of LayerNorm
    (``native_layer_norm``, affine), GroupNorm (``native_group_norm``) and softmax (``_softmax``). Why: these
    kernels keep a row in registers and do 5-9 FLOPs per element (formulas.layer_norm, softmax), where the CPU's
    vector rate is calibration's elementwise add (one FLOP per element, ``vector_cases``); priced at that rate a
    LayerNorm of 260 x 192 read 205 us forward against 49 measured on the project's Xeon (1 thread, process time,
    2026-11-26), and the Norm class of the held-out design set 0.40 measured/predicted."""
    rows, cols = NORM_ROWS
    x = torch.randn(rows, cols, device=dev)
    w, b = torch.randn(cols, device=dev), torch.randn(cols, device=dev)
    g = torch.randn(rows, cols, device=dev)
    xg, wg, bg = (t.clone().requires_grad_(True) for t in (x, w, b))
    _, mean, rstd = aten.native_layer_norm(x, [cols], w, b, 1e-5)
    ln = lambda t, w_, b_: torch.nn.functional.layer_norm(t, (cols,), w_, b_)  # noqa: E731
    cost = formula_costs(ln, (xg, wg, bg), ("native_layer_norm",))
    out = [opeff_case("native_layer_norm", lambda: aten.native_layer_norm(x, [cols], w, b, 1e-5), cost["fwd"]),
           opeff_case("native_layer_norm:bwd", lambda: aten.native_layer_norm_backward(
               g, x, [cols], mean, rstd, w, b, [True, True, True]), cost["bwd"], cost["fwd"][3])]
    n, c, h, wd, groups = GROUP_NORM
    y = torch.randn(n, c, h, wd, device=dev)
    gy = torch.randn_like(y)
    gw, gb = torch.randn(c, device=dev), torch.randn(c, device=dev)
    yg, gwg, gbg = (t.clone().requires_grad_(True) for t in (y, gw, gb))
    _, gmean, grstd = aten.native_group_norm(y, gw, gb, n, c, h * wd, groups, 1e-5)
    gn = lambda t, w_, b_: torch.nn.functional.group_norm(t, groups, w_, b_)  # noqa: E731
    cost = formula_costs(gn, (yg, gwg, gbg), ("native_group_norm",))
    out += [opeff_case("native_group_norm", lambda: aten.native_group_norm(y, gw, gb, n, c, h * wd, groups, 1e-5),
                   cost["fwd"]),
            opeff_case("native_group_norm:bwd", lambda: aten.native_group_norm_backward(
                gy, y, gmean, grstd, gw, n, c, h * wd, groups, [True, True, True]), cost["bwd"], cost["fwd"][3])]
    out += batch_norm_cases(dev)
    sm = aten._softmax(x, -1, False)
    cost = formula_costs(lambda t: torch.softmax(t, -1), (xg,), ("_softmax",))
    out += [opeff_case("_softmax", lambda: aten._softmax(x, -1, False), cost["fwd"]),
            opeff_case("_softmax:bwd", lambda: aten._softmax_backward_data(g, sm, -1, torch.float32), cost["bwd"],
                   cost["fwd"][3])]
    return out


def batch_norm_cases(dev) -> list:
    """Training BatchNorm forward (``native_batch_norm``: the batch statistics, the normalisation and the running
    statistics in one call) and backward (``native_batch_norm_backward``, the input's and the affine parameters'
    gradients) at ``BATCH_NORM``. Why: priced at the calibrated vector rate and bandwidth (formulas.batch_norm: two
    passes forward, the backward's reductions fused into its input-gradient pass), a 4 x 64 x 32 x 32 BatchNorm read
    419 us forward against 491 measured and 382 us backward against 248 on the project's AMD EPYC (1 thread, process
    time, 2026-11-27): the kernels' own rates, as LayerNorm's and GroupNorm's cases measure theirs."""
    n, c, h, wd = BATCH_NORM
    x = torch.randn(n, c, h, wd, device=dev)
    g = torch.randn_like(x)
    w, b = torch.randn(c, device=dev), torch.randn(c, device=dev)
    rm, rv = torch.zeros(c, device=dev), torch.ones(c, device=dev)
    xg, wg, bg = (t.clone().requires_grad_(True) for t in (x, w, b))
    _, mean, invstd = aten.native_batch_norm(x, w, b, rm.clone(), rv.clone(), True, 0.1, 1e-5)
    bn = lambda t, w_, b_: torch.nn.functional.batch_norm(t, rm.clone(), rv.clone(), w_, b_, training=True)  # noqa: E731
    cost = formula_costs(bn, (xg, wg, bg), ("native_batch_norm",))
    return [opeff_case("native_batch_norm", lambda: aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5),
                       cost["fwd"]),
            opeff_case("native_batch_norm:bwd", lambda: aten.native_batch_norm_backward(
                g, x, w, rm, rv, mean, invstd, True, 1e-5, [True, True, True]), cost["bwd"], cost["fwd"][3])]


#: oneDNN LSTM layer cases (``aten.mkldnn_rnn_layer``, what nn.LSTM runs on a CPU: aten_costs._mkldnn_rnn):
#: (steps, batch, input, hidden), a mid size (not any benchmark model's layer) and the smallest. Why a class of its
#: own: the op is one call that runs a whole layer (the weights reordered to oneDNN's layout, the input projection,
#: one recurrent GEMM and the gate kernel per step, the workspace kept for the backward), at a rate and a fixed
#: cost of its own: on the project's Xeon (1 thread, process time, 2026-11-26) a layer of 32 steps, batch 8,
#: 128 -> 256 ran 2.6 ms forward and 5.1 ms backward (76-78 GFLOP/s) where the spec's matrix rate priced it at
#: ~120 GFLOP/s; a 1-step, batch-1, 8 -> 8 call took 93 us forward and 208 us backward (~1.4 us for a tiny add).
RNN_CASE = (16, 16, 128, 128)
RNN_TINY = (1, 1, 8, 8)
_LSTM_MODE = 2  # mkldnn/RNN.cpp's mode of an LSTM (aten_costs._RNN_GATES)


def _lstm_calls(steps, batch, inputs, hidden, dev) -> tuple:
    """``(layer(x), forward(), backward(), x)`` of one oneDNN LSTM layer in training mode: ``nn.LSTM``'s forward
    (which calls aten.mkldnn_rnn_layer on a time-major input), the aten op on fixed tensors with the arguments torch
    passes it (RNN.cpp ``mkldnn_impl``: time-major, contiguous; has_biases, batch_first False, train True), and
    aten.mkldnn_rnn_layer_backward on a gradient of its output (what autograd's MkldnnRnnLayerBackward0 calls:
    input, hidden, weight and bias gradients), each one aten call."""
    g = torch.Generator(device="cpu").manual_seed(0)
    layer = torch.nn.LSTM(inputs, hidden).to(dev)
    x = torch.randn(steps, batch, inputs, generator=g).to(dev)
    w_ih, w_hh, b_ih, b_hh = (p.detach() for p in layer.parameters())
    h0 = torch.zeros(batch, hidden, device=dev)
    args = (False, [], _LSTM_MODE, hidden, 1, True, False, False, True)
    fwd = lambda: aten.mkldnn_rnn_layer(x, w_ih, w_hh, b_ih, b_hh, h0, h0, *args)  # noqa: E731
    out, hy, cy, workspace = fwd()
    go = torch.randn(out.shape, generator=g).to(dev)
    bwd = lambda: aten.mkldnn_rnn_layer_backward(  # noqa: E731
        x, w_ih, w_hh, b_ih, b_hh, h0, h0, out, hy, cy, go, None, None, False, _LSTM_MODE, hidden, 1, True, True,
        False, [], False, workspace)
    return (lambda t, m=layer: m(t)[0]), fwd, bwd, x.clone().requires_grad_(True)


def rnn_cases(dev) -> list:
    """The oneDNN LSTM layer class ``mkldnn_rnn_layer`` (CPU): ``opeff`` forward and backward (``:bwd``) at
    ``RNN_CASE``, FLOPs and bytes by the estimator's formula (formulas.rnn through aten_costs.cost_of), and
    ``classfixed`` tiny calls at ``RNN_TINY`` (the fit takes them out of the ``opeff`` times first: a class's time
    is fixed + roofline / efficiency)."""
    layer, fwd, bwd, xg = _lstm_calls(*RNN_CASE, dev)
    cost = formula_costs(layer, (xg,), ("mkldnn_rnn_layer",))
    _, tiny_fwd, tiny_bwd, _ = _lstm_calls(*RNN_TINY, dev)
    return [opeff_case("mkldnn_rnn_layer", fwd, cost["fwd"], cost["fwd"][3]),
            opeff_case("mkldnn_rnn_layer:bwd", bwd, cost["bwd"], cost["fwd"][3]),
            Case(names.CLASSFIXED, "mkldnn_rnn_layer", tiny_fwd, "fp32", host=True),
            Case(names.CLASSFIXED, "mkldnn_rnn_layer:bwd", tiny_bwd, "fp32", host=True)]


def op_class_cases(device) -> list:
    """Every op-class case on ``device`` (fp32)."""
    dev = torch.device(device)
    # per-row prices are a CPU term (a GPU kernel spreads rows over its threads: roofline.row_prices)
    # a CPU convolution class's fixed cost per call is its kernel's (a GPU's is the host's, per op family)
    # a oneDNN LSTM layer is a CPU kernel (a GPU's nn.LSTM runs cuDNN: aten_costs._cudnn_rnn)
    # the index-taking kernels' cases (embedding rows, EmbeddingBag's fixed costs and max mode): index_cases.py
    cpu_only = (conv_weight_cases(dev) + conv_fixed_cases(dev) + depthwise_call_cases(dev) + rnn_cases(dev)
                + element_rate_cases(dev)) if dev.type == "cpu" else []
    return conv_cases(dev) + elementwise_cases(dev) + norm_cases(dev) + cpu_only
