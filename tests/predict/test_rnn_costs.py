"""nn.LSTM on a CPU runs one aten.mkldnn_rnn_layer per layer and direction (RNN.cpp ``lstm`` -> ``lstm_mkldnn_stub``),
on a time-major input whatever ``batch_first`` says; its cost against hand arithmetic."""
import dataclasses

import pandas as pd
import torch
from torch import nn

from perfcheck.hardware.systems import load_system
from perfcheck.predict import roofline
from perfcheck.predict.aten_costs import cost_of, op_class
from perfcheck.predict.trace import trace_model


class _Out(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)[0]


def _rnn_calls(rnn, x):
    trace = trace_model(_Out(rnn), (x,))
    return [op.call for op in trace.ops if op.call.name == "mkldnn_rnn_layer"]


def test_lstm_layer_reads_steps_and_batch_from_its_time_major_input():
    t, b, i, h = 10, 4, 16, 32
    torch.manual_seed(0)
    first = _rnn_calls(nn.LSTM(i, h, batch_first=True), torch.randn(b, t, i, requires_grad=True))
    second = _rnn_calls(nn.LSTM(i, h, batch_first=False), torch.randn(t, b, i, requires_grad=True))
    assert len(first) == len(second) == 1
    c = cost_of(first[0]).cost
    # fwd: the input projection (1 kernel) and one recurrent GEMM per time step: 1 + t kernels, not 1 + b
    assert c.fwd.kernels == 1 + t == 11
    assert c.fwd.macs == t * b * 4 * h * (i + h)
    # bytes: x (t*b*i), the gates (t*b*4h), h and c (2*t*b*h) read/written once, W_ih once, W_hh once per step
    io = t * b * i + t * b * 4 * h + 2 * t * b * h
    assert c.fwd.bytes == 4 * (io + 4 * h * i + t * 4 * h * h) == 4 * (640 + 5120 + 2560 + 2048 + 40960)
    assert cost_of(second[0]).cost == c  # the same layer either way round


def test_bidirectional_two_layer_lstm_runs_four_layer_calls():
    t, b, i, h = 6, 3, 8, 12
    calls = _rnn_calls(nn.LSTM(i, h, num_layers=2, bidirectional=True, batch_first=True),
                       torch.randn(b, t, i, requires_grad=True))
    assert len(calls) == 4
    macs = [cost_of(c).cost.fwd.macs for c in calls]
    assert macs == [t * b * 4 * h * (i + h)] * 2 + [t * b * 4 * h * (2 * h + h)] * 2  # layer 2 reads 2h
    assert {op_class(c) for c in calls} == {"mkldnn_rnn_layer"}


def test_layer_is_priced_at_its_calibrated_class_efficiency():
    t, b, i, h = 10, 4, 16, 32
    call = _rnn_calls(nn.LSTM(i, h), torch.randn(t, b, i, requires_grad=True))[0]
    c = cost_of(call).cost
    row = dict(name="mkldnn_rnn_layer", op_class=op_class(call), macs_fwd=c.fwd.macs, other_fwd=c.fwd.flops,
               bytes_fwd=c.fwd.bytes, kernels_fwd=c.fwd.kernels, macs_bwd=c.bwd.macs, other_bwd=c.bwd.flops,
               bytes_bwd=c.bwd.bytes, kernels_bwd=c.bwd.kernels)
    cpu = load_system("cpu")
    half = dataclasses.replace(cpu, op_efficiency={"mkldnn_rnn_layer": 0.5, "mkldnn_rnn_layer:bwd": 0.25})
    plain = roofline.op_device_times(pd.DataFrame([row]), cpu, "fp32", launch_s=0.0)
    slow = roofline.op_device_times(pd.DataFrame([row]), half, "fp32", launch_s=0.0)
    assert abs(slow.t_fwd[0] / plain.t_fwd[0] - 2.0) < 1e-9
    assert abs(slow.t_bwd[0] / plain.t_bwd[0] - 4.0) < 1e-9
