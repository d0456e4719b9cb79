"""``estimate(dtype=...)`` runs the model's own floating dtype at the asked size and leaves the casts the model makes
on purpose as they run (``trace_records.ElemSize``). Reference: hand arithmetic of bytes per element."""
import pytest
import torch

import perfcheck

ROWS, COLS = 64, 256
N = ROWS * COLS


class UpcastScale(torch.nn.Module):
    """Llama's RMSNorm pattern, cut to its casts: x.float() * w, then back to x's dtype."""

    def __init__(self, dtype):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(COLS, dtype=dtype))

    def forward(self, x):
        return (x.float() * 2.0).type_as(x) * self.w


def _casts(table_kwargs, dtype):
    model = UpcastScale(dtype)
    x = torch.randn(ROWS, COLS, dtype=dtype, requires_grad=True)
    return perfcheck.estimate(model, (x,), system="h100-sxm", **table_kwargs)


def test_a_bf16_model_asked_in_bf16_keeps_its_fp32_casts():
    """bf16 -> fp32 -> bf16: each cast moves 2 + 4 = 6 bytes per element forward, and its gradient's cast 6 backward;
    asking for the model's own dtype must cost exactly what the real dtypes cost."""
    plain = _casts({}, torch.bfloat16)
    asked = _casts({"dtype": "bf16"}, torch.bfloat16)
    for col in ("bytes_fwd", "bytes_bwd", "kernels_fwd", "kernels_bwd", "pred_fwd_s", "pred_bwd_s"):
        assert asked[col].sum() == pytest.approx(plain[col].sum(), rel=1e-12), col
    # forward: two casts (6 N each), x.float() * 2.0 (4 + 4 per element), * w (2 + 2 per element, + the weight)
    assert plain["bytes_fwd"].sum() == pytest.approx(2 * 6 * N + 8 * N + 4 * N + 2 * COLS)


def test_an_fp32_model_asked_in_bf16_is_costed_as_a_bf16_run():
    """No casts in fp32 (x.float() returns x); asked in bf16, every fp32 tensor counts 2 bytes: the same ops at half
    the bytes."""
    fp32 = _casts({}, torch.float32)
    as_bf16 = _casts({"dtype": "bf16"}, torch.float32)
    assert as_bf16["kernels_fwd"].sum() == fp32["kernels_fwd"].sum()
    assert as_bf16["bytes_fwd"].sum() == pytest.approx(fp32["bytes_fwd"].sum() / 2)
