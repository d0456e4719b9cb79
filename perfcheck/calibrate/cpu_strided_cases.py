"""A CPU's element rate off its vectorised loop: cases for the spec's ``strided_elements_per_s`` on a CPU.

Why: on a CPU an elementwise kernel leaves SIMD when, after TensorIterator's reorder and coalesce, an operand's
innermost stride is neither 1 nor a lone 0 (``perfcheck.predict.cpu_vector_loop``): a permuted copy
(``x.permute(0, 2, 3, 1).contiguous()``, ConvNeXt's NCHW -> NHWC), a residual add of a contiguous and a permuted
tensor, a layer norm of a permuted view (its kernel's own row-major copy). Measured on the project's Xeon
(1 thread, process time, bench/results/cpu_strided.md): a permuted copy 0.8-1.8 ns per element against a
clone's 0.2-0.4.

What: four such kernels at a mid size (``SHAPE``: 230 400 fp32 elements, about the op-class cases' 1 MiB, no
benchmark model's layer), each beside its contiguous twin (the same op on row-major operands of the same size):

  permuted copy           ``xp.contiguous()``                twin ``x.clone()``
  add, permuted operand   ``a + xp``                         twin ``a + xc``
  layer norm, permuted    ``native_layer_norm(xp, [C])``     twin on ``xc``
  relu, strided view      ``relu(y[..., ::2])``              twin ``relu(yc)``

with ``xp = x.permute(0, 2, 3, 1)`` (inner stride H * W), ``xc`` its row-major copy. Each row: ``m`` = elements
of the strided pass, ``bytes`` = the bytes of that pass the estimator already charges the op (the copy's, the
add's and the relu's own; 0 for the layer norm's inner copy, which its bytes leave out: aten_costs
``cpu_vector_loop_cost``). The fit (``cpu_strided_fit``) reads the rate off the difference from the twin.
"""
from __future__ import annotations

import torch

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate.cases import Case

aten = torch.ops.aten

#: (batch, channels, height, width) of the permuted tensors: 230 400 fp32 elements (0.9 MiB). Not a power of two
#: in H * W: a permuted tensor's inner stride of 32 x 32 floats (4 KiB) maps every element it reads to one L1 set
#: (4 KiB aliasing): a layer norm of such a view ran 6.0 ns per element against 1.0 for its twin on the project's
#: Xeon, where models' strides (56 x 56, 28 x 28, 7 x 7 pixels) are not powers of two.
SHAPE = (4, 64, 30, 30)


def cpu_strided_cases(dev) -> list:
    """The ``cpustrided`` cases (fp32), each strided kernel followed by its twin (label + ``names.TWIN``)."""
    dev = torch.device(dev)
    n, c, h, w = SHAPE
    x = torch.randn(n, c, h, w, device=dev)
    xp = x.permute(0, 2, 3, 1)
    xc = xp.contiguous()
    a = torch.randn_like(xc)
    g, b = torch.randn(c, device=dev), torch.randn(c, device=dev)
    y = torch.randn(n, c, h, 2 * w, device=dev)
    ys, yc = y[..., ::2], y[..., ::2].contiguous()
    e = x.numel() * 4
    built = [
        ("permuted copy", lambda: xp.contiguous(), lambda: x.clone(), 2 * e),
        ("add, permuted operand", lambda: a + xp, lambda: a + xc, 3 * e),
        ("layer norm, permuted input", lambda: aten.native_layer_norm(xp, [c], g, b, 1e-5),
         lambda: aten.native_layer_norm(xc, [c], g, b, 1e-5), 0),
        ("relu, strided view", lambda: torch.relu(ys), lambda: torch.relu(yc), 2 * e),
    ]
    out = []
    for label, strided, twin, charged in built:
        out.append(Case(names.CPU_STRIDED, label, strided, "fp32", 0.0, float(charged), (x.numel(), 0, 0)))
        out.append(Case(names.CPU_STRIDED, label + names.TWIN, twin, "fp32", 0.0, float(charged), (x.numel(), 0, 0)))
    return out


__all__ = ["SHAPE", "cpu_strided_cases"]
