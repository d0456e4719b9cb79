"""DeepSpeed's optimizer step as its code runs it: memory passes over the rank's partition, per ZeRO stage.

DeepSpeed 0.19.8's optimizer wrapper around FusedAdam (multi_tensor_adam reads g, p, m, v and writes p, m, v; no
half copy), with its defaults (gradient_clipping 1.0, runtime/constants.py; zero_optimization.compute_grad_norm and
bf16.check_grad_overflow on; gradients accumulated in the model dtype). Bytes per element of the partition; b_g,
b_p the gradient's and the model weight's bytes, S the optimizer states' (Adam 8):

    pass      what runs                                         bytes          when
    overflow  amax + amin of each gradient (stages 0-2)         2 b_g          16-bit (fp32: the engine passes
              isinf(buf).any() + isnan(buf).any() (stage 3)     2 b_g + 4      fp16 only      check off)
    norm      g.to(float64), linalg.vector_norm (stages 1-3)    b_g + 16       always (get_norm_dtype: fp64)
              the flat fp32 gradient's norm (stage 0)           4              16-bit, or fp32 with a clip
    flatten   torch.cat of the partition's gradients            2 b_g          stages 1-3 (stage 0: of the fp32
                                                                8              copies, 16-bit)
    cast      .to(float32) (a no-op on fp32)                    b_g + 4        16-bit
    unscale   grad.mul_(1 / combined_scale) in fp32             8              stages 1-2: clip or fp16; stage 3
                                                                               and 16-bit stage 0: always; fp32
                                                                               stage 0: the engine's clip
    update    FusedAdam over the fp32 partition                 4 + 2 (4 + S)  always
    copy      fp32 partition -> the 16-bit (or model) buffer    4 + b_p        a master copy

bf16 at stage 0 with pipeline parallelism runs BF16_Optimizer instead (engine.py ``_do_optimizer_sanity_check``:
model dtype bf16 and a PipelineModule), whose step, per element of the model (P) or of the rank's fp32 partition
(P / dp; bf16_optimizer.py ``step``, gradients accumulated in bf16):

    norm      tensor.float().norm() of the bf16 gradients (utils.get_global_norm_of_tensors)   2 + 4 + 4   per P
    cast      the partition's gradient .to(float32)                                            2 + 4       per P / dp
    update    FusedAdam                                                                        4 + 2 (4 + S)  per P / dp
    copy      update_lp_params: fp32 partition -> bf16                                         4 + 2       per P / dp
    clear     clear_hp_grads: zero_ of the bf16 gradient buffer                                2           per P

(its clip's mul_ runs only when the norm exceeds gradient_clipping, a branch on the data: not priced). Read from the
code, not traced (a PipelineModule's engine on CPU was not run).

Sources: stage_1_and_2.py ``step``, stage3.py ``step``, fp16/fused_optimizer.py ``FP16_Optimizer.step`` (what the
engine builds for 16-bit stage 0 around FusedAdam); an fp32 stage 0 runs FusedAdam on the parameters and the
engine's ``clip_fp32_gradients``. Stages 1-3 and fp32 stage 0 are checked op by op against DeepSpeed's own step on
CPU (tests/predict/test_deepspeed_step_passes.py: the same Python code around torch's Adam there); 16-bit stage 0
is read from the code (its CPU build runs the unfused wrapper). Both the transformer front-end
(``optimizer_passes``, impl "deepspeed") and a DeepSpeed run's stage prediction (``zero.optimizer_time_s``) price
the step with these passes.
"""
from __future__ import annotations

import numpy as np


def passes(stage, prec, *, loss_scaling: bool, clip: bool, pp=1, dp=1) -> dict:
    """{pass: bytes per element of the rank's partition} of DeepSpeed's step around FusedAdam (module docstring),
    vectorised over ``stage``, ``pp`` and ``dp``; ``prec`` a ``zero.Precision``. At stage 0 the partition is the
    whole model, so BF16_Optimizer's per-(P / dp) passes enter divided by dp."""
    bf16_pipe = (np.asarray(stage) == 0) & (np.asarray(pp) > 1) & (prec.grad_bytes == 2) & (not loss_scaling)
    if np.any(bf16_pipe):
        zero_opt = _zero_passes(stage, prec, loss_scaling=loss_scaling, clip=clip)
        n = np.asarray(dp, dtype=float)
        bf16 = {"overflow": 0.0, "norm": 10.0, "flatten": 0.0, "cast": 6.0 / n, "unscale": 0.0,
                "update": (4.0 + 2 * (4.0 + prec.state_bytes)) / n, "copy": (4.0 + prec.param_bytes) / n, "clear": 2.0}
        return {k: np.where(bf16_pipe, bf16[k], zero_opt.get(k, 0.0)) for k in bf16}
    return _zero_passes(stage, prec, loss_scaling=loss_scaling, clip=clip)


def _zero_passes(stage, prec, *, loss_scaling: bool, clip: bool) -> dict:
    """The ZeRO optimizers' and FP16_Optimizer's passes (the module docstring's first table)."""
    z, b_g, b_p, S = np.asarray(stage), prec.grad_bytes, prec.param_bytes, prec.state_bytes
    low, master = b_g < 4, np.asarray(prec.master_bytes) > 0
    zero_opt = z >= 1  # stage_1_and_2.py / stage3.py; stage 0: FP16_Optimizer (16-bit) or FusedAdam alone (fp32)
    overflow = np.where(z == 3, (2 * b_g + 4.0) if loss_scaling else 0.0, 2.0 * b_g if low else 0.0)
    norm = np.where(zero_opt, b_g + 16.0, 4.0 if (low or clip) else 0.0)
    flatten = np.where(zero_opt, 2.0 * b_g, 8.0 if low else 0.0)
    unscale = np.where(z == 3, 8.0, np.where(zero_opt, 8.0 if (clip or loss_scaling) else 0.0,
                                             8.0 if (low or clip) else 0.0))
    return {"overflow": overflow, "norm": norm, "flatten": flatten, "cast": (b_g + 4.0) if low else 0.0,
            "unscale": unscale, "update": 4.0 + 2 * (4.0 + S), "copy": np.where(master, 4.0 + b_p, 0.0)}
