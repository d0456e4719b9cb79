"""Depthwise convolutions on a channels-last input: a class of their own (``_nhwc``, aten_costs.op_class), read as
the NCHW class where a calibration has no entry of its own, and measured by calibration in that layout."""
import dataclasses

import torch

from perfcheck.hardware.systems import load_system
from perfcheck.predict import efficiency, host
from perfcheck.predict.aten_costs import op_class
from perfcheck.predict.gemm_calls import weight_gemm_calls
from perfcheck.predict.trace import trace_model
from perfcheck.predict.trace_records import meta_of

US = 1e-6


def _conv_call(x, k=7):
    c = x.shape[1]
    conv = torch.nn.Conv2d(c, c, k, padding=k // 2, groups=c)
    return next(o for o in trace_model(conv, (x,)).ops if o.call.name == "convolution").call


def test_channels_last_is_recorded_apart_from_other_non_contiguous_layouts():
    nhwc = torch.randn(2, 16, 6, 6).contiguous(memory_format=torch.channels_last)
    assert meta_of(nhwc, None).channels_last and not meta_of(nhwc, None).contiguous
    # ConvNeXt's way: a permute back of an (N, H, W, C) tensor
    assert meta_of(torch.randn(2, 6, 6, 16).permute(0, 3, 1, 2), None).channels_last
    # a sliced NCHW view and a transposed matrix are not contiguous, and not channels-last either
    assert not meta_of(torch.randn(2, 16, 6, 12)[..., ::2], None).channels_last
    assert not meta_of(torch.randn(8, 4).t(), None).channels_last
    # a plain NCHW tensor, and a (C, 1, k, k) depthwise weight (both layouts at once): contiguous, not channels-last
    assert not meta_of(torch.randn(2, 16, 6, 6), None).channels_last
    assert not meta_of(torch.randn(16, 1, 7, 7), None).channels_last


def test_depthwise_classes_by_layout():
    plain, nhwc = torch.randn(2, 16, 6, 6), torch.randn(2, 16, 6, 6).contiguous(memory_format=torch.channels_last)
    assert op_class(_conv_call(plain)) == "convolution_depthwise_large"
    assert op_class(_conv_call(nhwc)) == "convolution_depthwise_large_nhwc"
    assert op_class(_conv_call(plain, 3)) == "convolution_depthwise"
    assert op_class(_conv_call(nhwc, 3)) == "convolution_depthwise_nhwc"
    assert op_class(_conv_call(torch.randn(2, 16, 6, 12)[..., ::2])) == "convolution_depthwise_large"
    # oneDNN's NHWC weight gradient is not the per-(sample, channel) GEMM loop: no call term
    assert weight_gemm_calls(_conv_call(nhwc)) == 0.0 and weight_gemm_calls(_conv_call(plain)) == 2 * 16


def test_a_table_without_the_class_reads_the_nchw_class():
    spec = dataclasses.replace(load_system("cpu"), op_efficiency={
        "convolution": 0.5, "convolution_depthwise_large": 0.2, "convolution_depthwise_large:bwd": 0.02})
    cls = "convolution_depthwise_large_nhwc"
    assert efficiency.class_efficiency(spec, cls, "convolution", "fp32", "bwd") == 0.02
    assert efficiency.class_efficiency(spec, cls, "convolution", "fp32", "fwd") == 0.2
    own = dataclasses.replace(spec, op_efficiency={**spec.op_efficiency, cls: 0.4, f"{cls}:bwd": 0.06})
    assert efficiency.class_efficiency(own, cls, "convolution", "fp32", "bwd") == 0.06
    # the host's fixed costs likewise: the NCHW class's tiny call where the table has none of its own
    fixed = {"convolution_depthwise_large": 90 * US, "convolution_depthwise_large:bwd": 200 * US}
    assert host._measured_class(fixed, cls) == "convolution_depthwise_large"
    assert host._measured_class({**fixed, cls: 65 * US}, cls) == cls
    assert host._measured_class(fixed, "convolution_wide") == "convolution_wide"


def test_calibration_times_the_class_on_channels_last_tensors():
    from perfcheck.calibrate.op_classes import _conv_calls, conv_cases, conv_fixed_cases
    from perfcheck.calibrate.conv_shapes import CONV_CASES

    labels = {c.label for c in conv_cases("cpu") + conv_fixed_cases("cpu")}
    assert {"convolution_depthwise_large_nhwc", "convolution_depthwise_large_nhwc:bwd",
            "convolution_depthwise_nhwc", "convolution_depthwise_nhwc:bwd"} <= labels
    _, fwd, _, x, _ = _conv_calls("convolution_depthwise_large_nhwc", CONV_CASES["convolution_depthwise_large_nhwc"],
                                  "cpu")
    assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    assert fwd().is_contiguous(memory_format=torch.channels_last)
    _, _, _, x, _ = _conv_calls("convolution_depthwise_large", CONV_CASES["convolution_depthwise_large"], "cpu")
    assert x.is_contiguous()
