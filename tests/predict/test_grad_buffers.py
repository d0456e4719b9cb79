"""Gradient accumulation between micro-batches (``predict.grad_buffers``) and the front-end's ``grad_accumulation``,
by hand."""
from __future__ import annotations

import pytest

from perfcheck.errors import UserError
from perfcheck.hardware.systems import load_system
from perfcheck.predict import grad_buffers
from perfcheck.predict.transformer import transformer_step

GPT = dict(name="gpt-tiny", layers=4, hidden=1024, heads=16, ffn_hidden=4096, vocab=32000, seq_len=1024,
           norm="layernorm", activation="gelu", bias=True, tied_embeddings=True, dropout=0.0)


def test_bytes_and_adds_by_hand():
    # AccumulateGrad in place: read the new gradient and .grad, write .grad (fp16: 6 B); the first one is stolen
    assert grad_buffers.bytes_per_param("autograd", 2, 2) == 6
    assert grad_buffers.adds_per_step("autograd", 8) == 7 and grad_buffers.adds_per_step("autograd", 1) == 0
    # Megatron's main-grad hook: read the gradient, read and write the buffer (fp32 buffer: 2 + 8 B), every one
    assert grad_buffers.bytes_per_param("main_grad", 2, 4) == 10
    assert grad_buffers.adds_per_step("main_grad", 8) == 8
    assert grad_buffers.bytes_per_param("none", 2, 4) == 0 and grad_buffers.adds_per_step("none", 8) == 0


def test_time_is_the_bytes_at_memory_bandwidth():
    spec = load_system("a100-80gb-sxm")
    bw = spec.mem_bandwidth_bytes_per_s * spec.efficiency["memory"]  # no bandwidth curve in this spec
    # 1e9 parameters, 8 micro-batches, fp16 gradients: 7 adds of 6 GB
    assert grad_buffers.time_s("autograd", 1e9, 8, 2, 2, spec) == pytest.approx(7 * 6e9 / bw, rel=1e-9)


def _step(**kw):
    par = dict(tp=2, pp=1, dp=4, micro_batches=8)
    return transformer_step(GPT, batch=1, parallel=par, system="a100-80gb-sxm", dtype="fp16", **kw).values


def test_front_end_adds_the_term_by_engine():
    spec = load_system("a100-80gb-sxm")
    bw = spec.mem_bandwidth_bytes_per_s * spec.efficiency["memory"]
    ddp, mega = _step(dp_engine="ddp"), _step(dp_engine="megatron")
    # PyTorch DDP: AccumulateGrad adds for micro-batches 2..8 over this GPU's parameters (tp = 2), fp16
    assert ddp["grad_accum_time_s"] == pytest.approx(7 * ddp["params_per_gpu"] * 6 / bw, rel=1e-9)
    # Megatron-Core fuses the accumulation into the weight-gradient GEMM: nothing apart
    assert mega["grad_accum_time_s"] == 0.0
    # Megatron's fp32 main-grad buffer without the fusion: every micro-batch adds 2 + 2 x 4 bytes per parameter
    forced = _step(dp_engine="megatron", grad_accumulation="main_grad", dp_reduce_dtype="fp32")
    fused = _step(dp_engine="megatron", dp_reduce_dtype="fp32")
    assert forced["grad_accum_time_s"] == pytest.approx(8 * forced["params_per_gpu"] * 10 / bw, rel=1e-9)
    assert forced["step_time_s"] - fused["step_time_s"] == pytest.approx(forced["grad_accum_time_s"], rel=1e-9)


def test_bad_grad_accumulation_names_the_field():
    with pytest.raises(UserError, match="grad_accumulation"):
        _step(dp_engine="megatron", grad_accumulation="fp32")


def test_every_engine_has_a_default_mode():
    from perfcheck.parallel import DP_ENGINES, GRAD_ACCUMULATIONS
    from perfcheck.predict.step_config import ENGINE_GRAD_ACCUMULATION

    assert set(ENGINE_GRAD_ACCUMULATION) == set(DP_ENGINES)
    assert set(ENGINE_GRAD_ACCUMULATION.values()) <= set(GRAD_ACCUMULATIONS)


def test_passes_around_the_reduction_by_hand():
    # Megatron-LM's local DDP with its contiguous fp32 buffer: zero it (4), divide it before the all-reduce (4 + 4)
    assert grad_buffers.reduce_pass_bytes("megatron", "none", 2, 4) == 12
    assert grad_buffers.reduce_pass_bytes("megatron", "main_grad", 2, 2) == 6
    # without it (fp16 .grad): flatten, divide, copy back, each a read and a write of 2 bytes
    assert grad_buffers.reduce_pass_bytes("megatron", "autograd", 2, 2) == 12
    # PyTorch DDP: the copy into the bucket divides on the way (one pass), the copy back to .grad
    assert grad_buffers.reduce_pass_bytes("ddp", "autograd", 2, 2) == 8
    assert grad_buffers.reduce_pass_bytes("fsdp2", "none", 2, 4) == 0
    assert grad_buffers.reduce_pass_bytes("deepspeed", "none", 2, 4) == 0


def test_front_end_prices_the_passes_once_per_step():
    spec = load_system("a100-80gb-sxm")
    bw = spec.mem_bandwidth_bytes_per_s * spec.efficiency["memory"]
    ddp, mega = _step(dp_engine="ddp"), _step(dp_engine="megatron", dp_reduce_dtype="fp32")
    # whatever the micro-batches (8 here): DDP's 2 x 2 x 2 bytes, Megatron's fp32 buffer 3 x 4
    assert ddp["dp_copy_time_s"] == pytest.approx(ddp["params_per_gpu"] * 8 / bw, rel=1e-9)
    assert mega["dp_copy_time_s"] == pytest.approx(mega["params_per_gpu"] * 12 / bw, rel=1e-9)
