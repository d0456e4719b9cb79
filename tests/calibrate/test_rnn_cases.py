"""The oneDNN LSTM layer's calibration cases (perfcheck.calibrate.op_classes.rnn_cases): FLOPs by hand, the calls
the same aten ops torch runs for nn.LSTM."""
import torch

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate.op_classes import RNN_CASE, _lstm_calls, rnn_cases


def test_rnn_cases_flops_by_hand():
    t, b, i, h = RNN_CASE
    cases = {(c.kind, c.label): c for c in rnn_cases("cpu")}
    fwd, bwd = cases[(names.OPEFF, "mkldnn_rnn_layer")], cases[(names.OPEFF, "mkldnn_rnn_layer:bwd")]
    # forward: x_t W_ih^T and h_{t-1} W_hh^T for 4 gates per step: 2 * t*b*4h*(i+h) FLOPs
    assert fwd.flops == 2 * t * b * 4 * h * (i + h) == 67_108_864
    # backward: grads through h and x (the case's input needs one) plus the weight gradients: twice the forward
    assert bwd.flops == 2 * fwd.flops
    assert fwd.shape[0] == 1 + t  # the forward's kernels: the input projection + one recurrent GEMM per step
    assert {(names.CLASSFIXED, "mkldnn_rnn_layer"), (names.CLASSFIXED, "mkldnn_rnn_layer:bwd")} <= set(cases)


def test_case_calls_match_what_nn_lstm_computes():
    t, b, i, h = 3, 2, 4, 5
    layer, fwd, bwd, x = _lstm_calls(t, b, i, h, "cpu")
    out = fwd()
    with torch.no_grad():
        ref = layer(x.detach())
    assert torch.allclose(out[0], ref, atol=1e-6)  # the aten call is the module's forward
    grads = bwd()
    assert grads[0].shape == (t, b, i) and grads[1].shape == (4 * h, i) and grads[2].shape == (4 * h, h)
