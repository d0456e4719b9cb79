"""A CPU kernel's vectorised loop (perfcheck/predict/cpu_vector_loop.py): the predicate on stride patterns reasoned
by hand from Loops.h and TensorIterator's reorder / coalesce, the traced ops' CPU tags, and the excess by hand."""
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from perfcheck.hardware.systems import load_system
from perfcheck.predict import roofline
from perfcheck.predict import trace as tracing
from perfcheck.predict.cpu_vector_loop import contiguous_strides, inner_strides, is_blocked_transpose, off_vector_loop
from perfcheck.predict.module_estimator import _op_table


def _t(t):
    return (tuple(t.shape), tuple(t.stride()))


def test_contiguous_strides():
    assert contiguous_strides((2, 3, 4)) == (12, 4, 1)
    assert contiguous_strides(()) == ()


def test_row_major_operands_coalesce_to_one_dimension():
    """(2, 3, 4) row-major everywhere: every adjacent pair merges (4 x 1 == 4, 3 x 4 == 12): one dim of 24."""
    s = (2, 3, 4)
    assert inner_strides(s, [(s, (12, 4, 1)), (s, (12, 4, 1))]) == (24, (1, 1))


def test_permuted_copy_to_row_major_is_off():
    """out (N, H, W, C) row-major, source x.permute(0, 2, 3, 1) of an NCHW tensor: strides (CHW, W, 1, HW). The
    output decides the order (C fastest); the source's inner stride is H * W: off."""
    n, c, h, w = 2, 8, 5, 7
    out = (n, h, w, c)
    size, inner = inner_strides(out, [(out, contiguous_strides(out)), (out, (c * h * w, w, 1, h * w))])
    assert size == c and inner == (1, h * w)
    assert off_vector_loop(out, [(out, contiguous_strides(out)), (out, (c * h * w, w, 1, h * w))])


def test_channel_shuffle_copy_stays_vectorised():
    """x.view(b, g, c/g, h, w).transpose(1, 2).contiguous(): h and w stay innermost, stride 1 in both: on."""
    b, g, cg, h, w = 2, 4, 3, 5, 6
    v = torch.empty(b, g, cg, h, w).transpose(1, 2)
    out = torch.empty(v.shape)
    assert inner_strides(v.shape, [_t(out), _t(v)])[1] == (1, 1)
    assert not off_vector_loop(v.shape, [_t(out), _t(v)])


def test_an_allocated_output_follows_its_input():
    """relu of a dense permuted view: TensorIterator allocates the output in the input's order (None here), so the
    inner stride is 1 for both: on."""
    xp = torch.empty(2, 8, 5, 7).permute(0, 2, 3, 1)
    assert not off_vector_loop(xp.shape, [(xp.shape, None), _t(xp)])


def test_a_permuted_operand_beside_a_row_major_one_is_off():
    """a + b.permute(...): the row-major operand (the first asked) puts its own inner dim first; b's stride there
    is H * W: off. The same two in the other order: a's inner stride there is C: off too."""
    a = torch.empty(2, 5, 7, 8)
    bp = torch.empty(2, 8, 5, 7).permute(0, 2, 3, 1)
    assert off_vector_loop(a.shape, [(a.shape, None), _t(a), _t(bp)])
    assert off_vector_loop(a.shape, [(a.shape, None), _t(bp), _t(a)])


def test_broadcasts():
    """A lone input of inner stride 0 is the loop's scalar (is_contiguous_scalar): on. A weight (W,) broadcast
    over outer dims keeps stride 1 inside: on. Two inputs of inner stride 0: basic_loop: off. A bias (C, 1, 1)
    over (N, C, H, W): H and W coalesce (both 0 for it), one zero inside: on."""
    x = torch.empty(2, 8, 4, 5)
    col = torch.empty(2, 8, 4, 1)
    row = torch.empty(5)
    assert not off_vector_loop(x.shape, [(x.shape, None), _t(x), _t(col)])
    assert not off_vector_loop(x.shape, [(x.shape, None), _t(x), _t(row)])
    assert off_vector_loop(x.shape, [(x.shape, None), _t(col), _t(col), _t(x)])
    bias = torch.empty(8, 1, 1)
    assert inner_strides(x.shape, [(x.shape, None), _t(x), _t(bias)]) == (20, (1, 1, 0))
    assert not off_vector_loop(x.shape, [(x.shape, None), _t(x), _t(bias)])


def test_a_step_two_view_is_off():
    """x[..., ::2]: inner stride 2, nothing to coalesce it to 1: off, even with the output allocated."""
    xs = torch.empty(4, 10)[:, ::2]
    assert off_vector_loop(xs.shape, [(xs.shape, None), _t(xs)])


def test_blocked_transpose_exception():
    """Copy.cpp's copy_transpose_valid: a 2-D (1, size(0))-strided source, contiguous destination, >= 3600
    elements, same dtype; below 3600 elements it is TensorIterator's copy."""
    t = torch.empty(100, 70).t()
    assert is_blocked_transpose((70, 100), (100, 1), t.shape, t.stride())
    small = torch.empty(50, 70).t()
    assert not is_blocked_transpose((70, 50), (50, 1), small.shape, small.stride())
    assert not is_blocked_transpose((70, 100), (100, 1), t.shape, t.stride(), same_dtype=False)


class _Call(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _ops(fn, *args):
    return _op_table(tracing.trace_model(_Call(fn), args), False)


def _tagged(ops, name, phase="fwd"):
    return float(ops.loc[ops["name"] == name, f"cpu_strided_elems_{phase}"].sum())


def test_traced_copies_are_tagged_by_the_cpu_rule():
    x = torch.randn(2, 8, 5, 7, requires_grad=True)
    n = x.numel()
    assert _tagged(_ops(lambda a: a.permute(0, 2, 3, 1).contiguous(), x), "clone") == n
    assert _tagged(_ops(lambda a: a.permute(0, 2, 3, 1).reshape(-1, 8), x), "clone") == n  # reshape's copy
    shuffle = _ops(lambda a: a.view(2, 2, 4, 5, 7).transpose(1, 2).contiguous(), x)
    assert _tagged(shuffle, "clone") == 0
    heads = _ops(lambda a: a.transpose(1, 2).contiguous(), torch.randn(2, 6, 4, 16))  # inner dim 16 stays: on
    assert _tagged(heads, "clone") == 0
    assert _ops(lambda a: a.clone(), x)["cpu_strided_elems_fwd"].sum() == 0


def test_traced_pointwise_ops_and_norms():
    """relu of a dense permuted view: on (output in its order); a + permuted: off forward, its gradients pass
    through; x * permuted: off forward, and backward each product reads the permuted operand; layer norm of a
    permuted view: its kernel's row-major copy, forward and backward, elements only (no bytes charged)."""
    x = torch.randn(2, 8, 5, 7, requires_grad=True)
    n = x.numel()
    xp = x.permute(0, 2, 3, 1)
    a = torch.randn(2, 5, 7, 8, requires_grad=True)
    assert _ops(lambda t: torch.relu(t.permute(0, 2, 3, 1)), x)["cpu_strided_elems_fwd"].sum() == 0
    add = _ops(lambda u, t: u + t.permute(0, 2, 3, 1), a, x)
    assert _tagged(add, "add") == n and _tagged(add, "add", "bwd") == 0
    mul = _ops(lambda u, t: u * t.permute(0, 2, 3, 1), a, x)
    kernels = float(mul.loc[mul["name"] == "mul", "kernels_bwd"].sum())
    assert _tagged(mul, "mul") == n and _tagged(mul, "mul", "bwd") == n * kernels == 2 * n
    scaled = _ops(lambda t: t.permute(0, 2, 3, 1) * 0.5, x)  # the gradient alone (g * 0.5)
    assert _tagged(scaled, "mul", "bwd") == 0
    ln = _ops(lambda t: F.layer_norm(t.permute(0, 2, 3, 1), (8,)), x)
    assert _tagged(ln, "native_layer_norm") == n and _tagged(ln, "native_layer_norm", "bwd") == n
    assert float(ln["cpu_strided_bytes_fwd"].sum()) == 0
    ln_rows = _ops(lambda t: F.layer_norm(t, (7,)), x)  # row-major: nothing
    assert ln_rows["cpu_strided_elems_fwd"].sum() == 0 and ln_rows["cpu_strided_elems_bwd"].sum() == 0
    gelu = _ops(lambda t: F.gelu(t[..., ::2]), torch.randn(2, 8, 5, 8, requires_grad=True))
    assert _tagged(gelu, "gelu") == 2 * 8 * 5 * 4 and _tagged(gelu, "gelu", "bwd") == 2 * 8 * 5 * 4


def test_batch_norm_takes_channels_last_without_a_pass():
    x = torch.randn(2, 8, 5, 7, requires_grad=True)
    cl = _ops(lambda t: F.batch_norm(t.contiguous(memory_format=torch.channels_last), None, None, training=True), x)
    assert _tagged(cl, "native_batch_norm") + _tagged(cl, "_native_batch_norm_legit") + \
        _tagged(cl, "_native_batch_norm_legit_functional") == 0
    tr = _ops(lambda t: F.batch_norm(t.transpose(2, 3), None, None, training=True), x)
    assert float(tr["cpu_strided_elems_fwd"].sum()) == x.numel()


def test_cpu_excess_is_added_after_the_roofline_by_hand():
    """A CPU spec with a rate of 1e9 elements/s, memory 50 GB/s x 0.7: 1e6 elements of which 8e6 bytes are charged:
    excess = 1e6 / 1e9 - 8e6 / 3.5e10 = 1 ms - 0.2286 ms; added after the op's efficiency (0.5 here), not inside the
    memory term. Without a rate (every shipped CPU spec): nothing."""
    cpu = load_system("cpu")
    rated = dataclasses.replace(cpu, strided_elements_per_s=1e9)
    args = (np.zeros(1), np.zeros(1), np.array([8e6]), np.ones(1), rated, "fp32")
    kw = dict(launch_s=0.0, op_eff=0.5)
    plain = roofline.device_times(*args, **kw)
    with_term = roofline.device_times(*args, **kw, strided=(np.array([1e6]), np.array([8e6])))
    assert with_term["time"][0] - plain["time"][0] == pytest.approx(1e6 / 1e9 - 8e6 / (50e9 * 0.7))
    assert with_term["memory"][0] == pytest.approx(plain["memory"][0])
    zero = roofline.device_times(*args[:4], cpu, "fp32", **kw, strided=(np.array([1e6]), np.array([8e6])))
    assert zero["time"][0] == pytest.approx(plain["time"][0])
