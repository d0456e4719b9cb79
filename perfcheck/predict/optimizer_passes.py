"""The optimizer step of a GPU training loop as its code runs it: memory passes over this rank's parameters.

``step_config.Options.optimizer_impl`` names who runs the step (None: the data-parallel engine's, ``ENGINE_IMPL``).
Bytes per parameter element of the rank's partition (``zero.optimizer_partition``); b_p, b_g the model's weight and
gradient bytes, b_m the main gradient's (the buffer the optimizer reads), S the optimizer states' bytes (Adam 8):

- ``"fused"``: one kernel reads each gradient in its dtype, reads and writes the fp32 master weight and the states
  and writes the model's copy: 2 (4 + S) + b_g + b_p (the kernel alone, without the passes of the code around it).
- ``"deepspeed"``: DeepSpeed 0.19.8's optimizer wrapper around FusedAdam, per ZeRO stage (``predict.deepspeed_step``:
  64-78 bytes per element in 16-bit, 28-72 in fp32; ``zero.optimizer_time_s``, a DeepSpeed run's stage prediction,
  prices the same passes).
- ``"megatron"``: Megatron-LM's mixed-precision optimizer around apex's multi-tensor kernels
  (megatron/optimizer/optimizer.py ``Float16OptimizerWithFloat16Params.step``, clip_grads.py
  ``clip_grad_norm_fp32``, at 2021-08 f597f02e and 2022-05 cfd2e216 alike):

      cast     main_param.grad = model_param.main_grad.float()        b_m + 4   (0 when b_m = 4: .float() of an
                                                                                  fp32 tensor returns it)
      unscale  torch._amp_foreach_non_finite_check_and_unscale_        8         (fp16: the loss scaler; bf16 runs
                                                                                  without one, grad_scaler None)
      norm     amp_C.multi_tensor_l2norm over the fp32 gradients       4         (grad_clip: --clip-grad 1.0)
      update   apex multi_tensor_adam (sgd: multi_tensor_sgd): read g, read and write p and each state
                                                                       4 + 2 (4 + S)   (Adam: 28)
      copy     main params -> model params (multi_tensor_scale by 1, or copy_ in bf16)   4 + b_p

  The clip's scale (multi_tensor_scale over the gradients, 8) runs only when the norm exceeds --clip-grad, a
  branch on the data: not priced (at most 8 bytes more). An fp32 model runs FP32Optimizer: norm and update only.
- ``"foreach"``, ``"for-loop"``, ``"torch-fused"``: ``torch.optim`` in that implementation, its kernels counted from
  torch's code (``optimizers.profile``: streams per element) over the parameters as the loop keeps them (fp32 with
  a master copy: FSDP2's sharded parameters under MixedPrecisionPolicy, DDP under autocast; else the model dtype),
  with GradScaler's ``_amp_foreach_non_finite_check_and_unscale_`` (2 streams) in fp16, and with ``grad_clip``
  ``torch.nn.utils.clip_grad_norm_`` (``optimizers.clip_profile``: the norm, then the scale torch always applies).

Time: the bytes at the spec's memory bandwidth (``roofline.memory_time_s``). Kernel launches are left out (tens of
microseconds per step against the passes' milliseconds at these sizes).
"""
from __future__ import annotations

import numpy as np

from perfcheck.errors import UserError
from perfcheck.parallel import OPTIMIZER_IMPLS as IMPLS
from perfcheck.predict import deepspeed_step, optimizers, roofline, zero

#: Who runs the step unless ``optimizer_impl`` says: DeepSpeed's optimizer wrapper, Megatron-LM's optimizer, and
#: torch.optim's default on CUDA tensors (foreach) under PyTorch DDP and FSDP2.
ENGINE_IMPL = {"deepspeed": "deepspeed", "megatron": "megatron", "ddp": "foreach", "fsdp2": "foreach"}
#: Whether the loop clips gradients by their global norm unless ``grad_clip`` says: Megatron-LM's --clip-grad and
#: DeepSpeed 0.19.8's gradient_clipping (runtime/constants.py GRADIENT_CLIPPING_DEFAULT) default to 1.0; torch's
#: loops and FSDP2's to none.
ENGINE_CLIP = {"deepspeed": True, "megatron": True, "ddp": False, "fsdp2": False}
#: The optimizers Megatron-LM's --optimizer runs (apex FusedAdam in AdamW mode, FusedSGD with --sgd-momentum).
MEGATRON_KINDS = ("adam", "adamw", "sgd", "sgd_momentum")
_TORCH_IMPL = {"foreach": "foreach", "for-loop": "for-loop", "torch-fused": "fused"}
#: torch._amp_foreach_non_finite_check_and_unscale_: reads and writes each gradient
UNSCALE_STREAMS = 2


def passes(impl: str, kind: str, prec, *, main_grad_bytes: float, loss_scaling: bool, clip: bool,
           stage=1, pp=1, dp=1) -> dict:
    """{pass: bytes per parameter element} of one step (module docstring); ``prec`` a ``zero.Precision``,
    ``stage``, ``pp``, ``dp`` the layout(s) (the "deepspeed" passes depend on them)."""
    if impl not in IMPLS:
        raise UserError(f"optimizer_impl must be one of {', '.join(IMPLS)} or None, got {impl!r}")
    S, b_p, mixed = prec.state_bytes, prec.param_bytes, np.asarray(prec.master_bytes) > 0
    kind = str(kind).lower().replace("-", "_")
    if impl == "fused":
        return {"update": 2 * prec.optimizer_bytes + prec.grad_bytes + b_p}
    if impl == "deepspeed":
        return deepspeed_step.passes(stage, prec, loss_scaling=loss_scaling, clip=clip, pp=pp, dp=dp)
    if impl == "megatron":
        if kind not in MEGATRON_KINDS:
            raise UserError(f"optimizer: Megatron-LM's optimizer runs {', '.join(MEGATRON_KINDS)}, got {kind!r}")
        return {"cast": np.where(mixed & (main_grad_bytes < 4), main_grad_bytes + 4.0, 0.0),
                "unscale": 8.0 if loss_scaling else 0.0, "norm": 4.0 if clip else 0.0,
                "update": 4.0 + 2 * (4.0 + S), "copy": np.where(mixed, 4.0 + b_p, 0.0)}
    elem = np.where(mixed, 4.0, b_p)
    clip_streams = optimizers.clip_profile("for-loop" if impl == "for-loop" else "foreach").streams if clip else 0.0
    return {"unscale": UNSCALE_STREAMS * elem if loss_scaling else 0.0, "clip": clip_streams * elem,
            "update": optimizers.profile(kind, _TORCH_IMPL[impl]).streams * elem}


def time_s(impl: str, kind: str, params, stage, dp, system, prec, *, main_grad_bytes: float, loss_scaling: bool,
           clip: bool, pp=1):
    """Seconds of one optimizer step on a rank: its partition's parameters x the passes' bytes, at memory
    bandwidth (vectorised over ``params``, ``stage``, ``dp``)."""
    per_param = passes(impl, kind, prec, main_grad_bytes=main_grad_bytes, loss_scaling=loss_scaling, clip=clip,
                       stage=stage, pp=pp, dp=dp)
    local = zero.optimizer_partition(params, stage, dp)
    return np.asarray(roofline.memory_time_s(local * sum(per_param.values()), system))
