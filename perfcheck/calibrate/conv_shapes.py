"""The shapes of the convolution class cases (op_classes.conv_cases), as data: read by the cases that time them and by
the fit that solves a class's terms from them (fit_host.gemm_call_costs needs the class case's sgemm calls)."""

#: Convolution classes (perfcheck.predict.aten_costs.op_class): input (N, C, *spatial), weight, groups, stride,
#: padding. Mid-size shapes of each family (a MobileNet-like depthwise 3x3 and 5x5 at 64 channels, a
#: grouped 3x3 with 8 channels per group, a ResNet-like dense 3x3 at 64 channels, a Conv1d, a 2x up-sampling
#: transposed conv), not any benchmark model's layer.
CONV_CASES = {
    "convolution_depthwise": ((4, 64, 16, 16), (64, 1, 3, 3), 64, 1, 1),
    "convolution_depthwise_large": ((4, 64, 16, 16), (64, 1, 5, 5), 64, 1, 2),
    "convolution_grouped": ((4, 64, 16, 16), (64, 8, 3, 3), 8, 1, 1),
    "convolution_wide": ((4, 64, 16, 16), (64, 64, 3, 3), 1, 1, 1),
    "convolution_1x1": ((4, 64, 16, 16), (64, 64, 1, 1), 1, 1, 0),
    "convolution_1d": ((4, 64, 128), (64, 64, 3), 1, 1, 1),
    "convolution_transposed": ((4, 64, 8, 8), (64, 32, 4, 4), 1, 2, 1),
    # the depthwise classes again on a channels-last input and output gradient (op_class's ``_nhwc``): oneDNN's
    # NHWC kernels (bench/results/norm_permuted.md)
    "convolution_depthwise_nhwc": ((4, 64, 16, 16), (64, 1, 3, 3), 64, 1, 1),
    "convolution_depthwise_large_nhwc": ((4, 64, 16, 16), (64, 1, 5, 5), 64, 1, 2),
}
