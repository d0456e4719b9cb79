"""The optimizer step as its code runs it (``predict.optimizer_passes``) and the front-end's ``optimizer_impl`` /
``grad_clip``: bytes per parameter by hand from Megatron-LM's, apex's and torch's code, times at memory bandwidth."""
from __future__ import annotations

import pytest

from perfcheck.errors import UserError
from perfcheck.hardware.systems import load_system
from perfcheck.predict import optimizer_passes as passes_
from perfcheck.predict import zero
from perfcheck.predict.transformer import transformer_step

GPT = dict(name="gpt-tiny", layers=4, hidden=1024, heads=16, ffn_hidden=4096, vocab=32000, seq_len=1024,
           norm="layernorm", activation="gelu", bias=True, tied_embeddings=True, dropout=0.0)
FP16, BF16, FP32 = (zero.precision(d, "adam", stage=0) for d in ("fp16", "bf16", "fp32"))


def _total(impl, kind, prec, **kw):
    return float(sum(passes_.passes(impl, kind, prec, **kw).values()))


def test_megatron_2021_fp16_step_by_hand():
    # Float16OptimizerWithFloat16Params.step, fp16 gradients in .grad (local DDP without contiguous buffers):
    # .float() 2 + 4, unscale 4 + 4, l2norm 4, apex Adam g 4 + (p, m, v) 2 x 12, copy to the fp16 model 4 + 2
    assert _total("megatron", "adam", FP16, main_grad_bytes=2, loss_scaling=True, clip=True) == 6 + 8 + 4 + 28 + 6


def test_megatron_2022_bf16_fused_accumulation_by_hand():
    # fp32 main_grad (.float() returns it), no loss scaler in bf16: norm, Adam, copy to the bf16 model
    assert _total("megatron", "adam", BF16, main_grad_bytes=4, loss_scaling=False, clip=True) == 4 + 28 + 6
    # without --clip-grad the norm goes too; SGD with momentum: g 4 + (p, momentum) 2 x 8
    sgd = zero.precision("bf16", "sgd_momentum", stage=0)
    assert _total("megatron", "sgd_momentum", sgd, main_grad_bytes=4, loss_scaling=False, clip=False) == 20 + 6
    # an fp32 model runs FP32Optimizer: no cast, no copy
    assert _total("megatron", "adam", FP32, main_grad_bytes=4, loss_scaling=False, clip=True) == 4 + 28


def test_torch_foreach_adamw_with_clip_by_hand():
    # torch's _multi_tensor_adamw: mul_ (decay) 2, lerp_ 3, mul_ 2, addcmul_ 4, sqrt 2, div_ 2, add_ 2, addcdiv_ 4
    # streams (a written argument read and written: 2); clip_grad_norm_: _foreach_norm 1, _foreach_mul_ 2;
    # over fp32 parameters (a master copy: FSDP2's sharded parameters)
    assert _total("foreach", "adamw", BF16, main_grad_bytes=4, loss_scaling=False, clip=False) == 21 * 4
    assert _total("foreach", "adamw", BF16, main_grad_bytes=4, loss_scaling=False, clip=True) == 24 * 4
    # fp16 adds GradScaler's unscale (read and write each gradient)
    assert _total("foreach", "adamw", FP16, main_grad_bytes=4, loss_scaling=True, clip=True) == 26 * 4


def test_fused_is_the_one_kernel_alone():
    # 2 (4 + 8) + b_g + b_p: FusedAdam over an fp32 partition reading 16-bit gradients, nothing around it
    assert _total("fused", "adam", FP16, main_grad_bytes=2, loss_scaling=True, clip=True) == 28


@pytest.mark.parametrize("dtype, stage, clip, expected", [
    # ZeRO-1/2 (stage_1_and_2.py step): amax + amin 2 + 2, g.to(float64) 2 + 8 and its norm 8, cat 2 + 2,
    # .to(float32) 2 + 4, the clip's mul_ 4 + 4, FusedAdam 4 + 2 x 12, the fp32 -> bf16 copy 4 + 2
    ("bf16", 1, True, 4 + 18 + 4 + 6 + 8 + 28 + 6),
    ("bf16", 2, False, 4 + 18 + 4 + 6 + 28 + 6),  # no clip and no loss scale: mul_ returns early
    ("fp16", 2, False, 4 + 18 + 4 + 6 + 8 + 28 + 6),  # the loss scale's unscale runs anyway
    ("fp32", 1, True, 4 + 16 + 8 + 8 + 28 + 8),  # no overflow check, .to(float32) a no-op, copy 4 + 4
    # ZeRO-3 (stage3.py): no overflow check in bf16, mul_ always (no early return)
    ("bf16", 3, False, 18 + 4 + 6 + 8 + 28 + 6),
    ("fp16", 3, True, (2 + 1 + 1) * 2 + 18 + 4 + 6 + 8 + 28 + 6),  # isinf / isnan: read 2, bool 1, any 1
    # stage 0, 16-bit: FP16_Optimizer: amax + amin, .to(float32) 2 + 4, cat of the fp32 copies 4 + 4, their norm 4,
    # mul_ 8 (always), FusedAdam, copy 4 + 2
    ("bf16", 0, False, 4 + 6 + 8 + 4 + 8 + 28 + 6),
    # stage 0, fp32: FusedAdam on the parameters, the engine's clip_fp32_gradients (norm 4, mul_ 8)
    ("fp32", 0, True, 4 + 8 + 28),
    ("fp32", 0, False, 28),
])
def test_deepspeed_step_by_hand(dtype, stage, clip, expected):
    prec = zero.precision(dtype, "adam", stage=stage)
    assert _total("deepspeed", "adam", prec, main_grad_bytes=prec.grad_bytes, loss_scaling=dtype == "fp16",
                  clip=clip, stage=stage) == expected


def _step(zero_stage=0, **kw):
    par = dict(tp=2, pp=1, dp=4, micro_batches=8, zero_stage=zero_stage)
    return transformer_step(GPT, batch=1, parallel=par, system="a100-80gb-sxm", **kw).values


def test_front_end_times_the_engine_step_at_memory_bandwidth():
    spec = load_system("a100-80gb-sxm")
    bw = spec.mem_bandwidth_bytes_per_s * spec.efficiency["memory"]  # no bandwidth curve in this spec
    # Megatron (its default clip), fp16, AccumulateGrad's fp16 .grad: 52 bytes per parameter of this GPU (stage 0)
    mega = _step(dtype="fp16", dp_engine="megatron", grad_accumulation="autograd")
    assert mega["optimizer_time_s"] == pytest.approx(mega["params_per_gpu"] * 52 / bw, rel=1e-9)
    # the distributed optimizer (stage 1) updates a quarter of them
    dist = _step(dtype="fp16", dp_engine="megatron", grad_accumulation="autograd", zero_stage=1)
    assert dist["optimizer_time_s"] == pytest.approx(mega["optimizer_time_s"] / 4, rel=1e-9)
    # FSDP2 + torch AdamW(foreach) + clip_grad_norm_: 24 fp32 streams over a quarter of the parameters
    fsdp = _step(dtype="bf16", dp_engine="fsdp2", zero_stage=3, optimizer="adamw", grad_clip=True)
    assert fsdp["optimizer_time_s"] == pytest.approx(fsdp["params_per_gpu"] / 4 * 96 / bw, rel=1e-9)
    # DeepSpeed, stage 0 fp16: FP16_Optimizer around FusedAdam, 64 bytes per parameter (its default clip on)
    ds = _step(dtype="fp16", dp_engine="deepspeed")
    assert ds["optimizer_time_s"] == pytest.approx(ds["params_per_gpu"] * 64 / bw, rel=1e-9)
    # ZeRO-2 bf16: 74 bytes per parameter of its quarter; the one fused kernel alone on request: 28
    ds2 = _step(dtype="bf16", dp_engine="deepspeed", zero_stage=2)
    assert ds2["optimizer_time_s"] == pytest.approx(ds2["params_per_gpu"] / 4 * 74 / bw, rel=1e-9)
    kernel = _step(dtype="bf16", dp_engine="deepspeed", zero_stage=2, optimizer_impl="fused")
    assert kernel["optimizer_time_s"] == pytest.approx(ds2["optimizer_time_s"] * 28 / 74, rel=1e-9)


@pytest.mark.parametrize("kw, field", [(dict(optimizer_impl="apex"), "optimizer_impl"),
                                       (dict(grad_clip="yes"), "grad_clip"),
                                       (dict(grad_clip=True, optimizer_impl="fused"), "grad_clip"),  # no clip
                                       (dict(dp_engine="megatron", optimizer="adagrad"), "optimizer"),
                                       (dict(dp_engine="ddp", optimizer="lamb"), "optimizer")])
def test_bad_input_names_the_field(kw, field):
    with pytest.raises(UserError, match=field):
        _step(dtype="bf16", **kw)


def test_every_engine_has_a_default():
    from perfcheck.parallel import DP_ENGINES

    assert set(passes_.ENGINE_IMPL) == set(passes_.ENGINE_CLIP) == set(DP_ENGINES)
    assert set(passes_.ENGINE_IMPL.values()) <= set(passes_.IMPLS)


@pytest.mark.parametrize("kind, impl", [("adamw", "foreach"), ("sgd_momentum", "foreach"), ("adam", "torch-fused")])
def test_front_end_agrees_with_perfcheck_estimates_optimizer(kind, impl):
    # the module path's optimizer (host.optimizer_time: the same torch profile, per kernel and tensor, with launches)
    # and the front-end's passes on 100 tensors of 4 M fp32 elements: within 1% (the launches, left out here)
    from perfcheck.predict import host

    spec, numels = load_system("a100-80gb-sxm"), [4_000_000] * 100
    module_path = host.optimizer_time(numels, f"{kind}-{impl.replace('torch-', '')}", spec, elem_bytes=4).device_s
    prec = zero.precision("fp32", kind, master_weights=False, stage=0)
    front_end = passes_.time_s(impl, kind, sum(numels), 0, 1, spec, prec, main_grad_bytes=4, loss_scaling=False,
                               clip=False)
    assert float(front_end) == pytest.approx(module_path, rel=0.01)


def test_the_deepspeed_run_path_prices_the_same_step():
    # zero.estimate_zero (a DeepSpeed run's stage prediction) and the front-end: one formula. ZeRO-1 fp32 over 4
    # ranks: a quarter of 1e6 parameters x (fp64 norm 4 + 16, cat 8, clip mul_ 8, Adam 28, copy 4 + 4)
    spec = load_system("a100-80gb-sxm")
    bw = spec.mem_bandwidth_bytes_per_s * spec.efficiency["memory"]
    clipped = zero.estimate_zero(1_000_000, stage=1, dp=4, dtype="fp32", system=spec)
    assert clipped.times["optim_compute_s"] == pytest.approx(250_000 * (20 + 8 + 8 + 28 + 8) / bw, rel=1e-9)
    unclipped = zero.estimate_zero(1_000_000, stage=1, dp=4, dtype="fp32", system=spec,
                                   settings=zero.ZeroSettings(gradient_clipping=0.0))
    assert unclipped.times["optim_compute_s"] == pytest.approx(250_000 * 64 / bw, rel=1e-9)
    # fp16's loss scale unscales whatever the clip: ZeRO-2 fp16, 74 bytes either way
    fp16 = zero.estimate_zero(1_000_000, stage=2, dp=4, dtype="fp16", system=spec,
                              settings=zero.ZeroSettings(gradient_clipping=0.0))
    assert fp16.times["optim_compute_s"] == pytest.approx(250_000 * 74 / bw, rel=1e-9)


def test_deepspeed_bf16_stage0_with_a_pipeline_runs_bf16_optimizer():
    # engine.py picks BF16_Optimizer for bf16 + PipelineModule at stage 0: per model element the bf16 gradients'
    # .float().norm() (2 + 4 + 4) and clear_hp_grads' zero_ (2); per element of the fp32 partition (1 / dp of them)
    # the cast 2 + 4, FusedAdam 4 + 2 x 12 and the copy back 4 + 2
    prec = zero.precision("bf16", "adam", stage=0)
    total = _total("deepspeed", "adam", prec, main_grad_bytes=2, loss_scaling=False, clip=True, stage=0, pp=2, dp=4)
    assert total == pytest.approx(10 + 2 + (6 + 28 + 6) / 4)
    # without the pipeline it is FP16_Optimizer's 64
    assert _total("deepspeed", "adam", prec, main_grad_bytes=2, loss_scaling=False, clip=True, stage=0, pp=1,
                  dp=4) == 64
    spec = load_system("a100-80gb-sxm")
    bw = spec.mem_bandwidth_bytes_per_s * spec.efficiency["memory"]
    par = dict(tp=1, pp=2, dp=4, micro_batches=8, zero_stage=0)
    st = transformer_step(GPT, batch=1, parallel=par, system=spec, dtype="bf16", dp_engine="deepspeed").values
    assert st["optimizer_time_s"] == pytest.approx(st["params_per_gpu"] * (12 + 40 / 4) / bw, rel=1e-9)
