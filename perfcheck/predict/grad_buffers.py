"""What adding each micro-batch's gradients into the optimizer step's costs, by who adds them
(``step_config.Options.grad_accumulation``): memory-bound passes over the stage's parameters, per step.

- ``"autograd"``: PyTorch's AccumulateGrad. The first micro-batch's gradient is stolen into ``.grad`` (the
  optimizer set it to None), each later one added in place: read the new gradient, read and write ``.grad``,
  3 b_g bytes per parameter, micro-batches - 1 times per step. PyTorch DDP under ``no_sync`` does this
  (torch/nn/parallel/distributed.py), and so did Megatron-LM's local DDP without contiguous buffers, its fp16
  default in 2021 (megatron/arguments.py at 6985e589: ``--use-contiguous-buffers-in-ddp`` is off unless gradients
  accumulate in fp32; megatron/model/distributed.py).
- ``"main_grad"``: Megatron-LM's contiguous main-grad buffer. A hook on each parameter's AccumulateGrad adds every
  micro-batch's gradient into ``param.main_grad`` (megatron/model/distributed.py ``param_hook``: ``main_grad.add_``):
  b_g + 2 b_m bytes per parameter (b_m = 4 with ``--accumulate-allreduce-grads-in-fp32``, else b_g), micro-batches
  times per step. Megatron-LM's fp16 default through 2022 (contiguous buffers on; the fused accumulation below
  needed fp32 main gradients until 2022-09-27, commit 07916bf2).
- ``"none"``: no separate pass: the accumulation fused into the weight-gradient GEMM (Megatron-LM's
  ``--gradient-accumulation-fusion``, ``wgrad_gemm_accum_fp32`` with beta = 1: on by default since 2022-02-13,
  commit 83b1e42f), or an engine whose accumulation this model does not price (DeepSpeed, FSDP2).

Time: the bytes at the spec's memory bandwidth (``roofline.memory_time_s``). Left out, said: each parameter tensor's
add is its own kernel (launch terms), and the adds lengthen each pipeline stage's backward, so the bubble too.

Once per step the engine also passes over the gradients around their reduction (``reduce_pass_bytes``):

- Megatron-LM's local DDP (megatron/model/distributed.py ``allreduce_gradients`` and ``zero_grad_buffer``, at 2021-08
  f597f02e and 2022-05 cfd2e216 alike): with the contiguous buffer ("main_grad", "none") the buffer is zeroed at
  the step's start and divided by the DP size before its all-reduce: b_m + 2 b_m; without it ("autograd") the
  gradients are flattened into one tensor, divided, and copied back after the all-reduce: 3 x 2 b_g. Both run
  whatever the DP size. (Megatron-Core's DDP zeroes its buffer and scales it before the reduction too: 3 b_m.)
- PyTorch DDP (torch/csrc/distributed/c10d/reducer.cpp, ``gradient_as_bucket_view=False``, its default): each
  gradient is copied into its bucket divided by the world size in one pass (``at::mul_out``), and copied back into
  ``.grad`` after the all-reduce: 2 x 2 b_g, on the last micro-batch only (the others run under ``no_sync``).
"""
from __future__ import annotations

import numpy as np

from perfcheck.parallel import GRAD_ACCUMULATIONS as MODES
from perfcheck.predict import roofline


def bytes_per_param(mode: str, grad_bytes: float, main_bytes: float) -> float:
    """Bytes one add moves per parameter: autograd 3 b_g (read both gradients, write one), main_grad b_g + 2 b_m."""
    return {"none": 0.0, "autograd": 3.0 * grad_bytes, "main_grad": grad_bytes + 2.0 * main_bytes}[mode]


def adds_per_step(mode: str, micro_batches):
    """Adds per optimizer step over ``micro_batches`` micro-batches: autograd m - 1 (the first gradient is stolen),
    main_grad m (every gradient goes into the buffer), none 0."""
    m = np.asarray(micro_batches, dtype=float)
    return {"none": 0.0 * m, "autograd": np.maximum(m - 1.0, 0.0), "main_grad": m}[mode][()]


def time_s(mode: str, params, micro_batches, grad_bytes: float, main_bytes: float, system):
    """Seconds per optimizer step the adds take on a GPU holding ``params`` parameters:
    adds_per_step x params x bytes_per_param / memory bandwidth."""
    moved = np.asarray(params, dtype=float) * bytes_per_param(mode, grad_bytes, main_bytes)
    return (adds_per_step(mode, micro_batches) * np.asarray(roofline.memory_time_s(moved, system)))[()]


def reduce_pass_bytes(engine: str, mode: str, grad_bytes: float, main_bytes: float) -> float:
    """Bytes per parameter the ``engine``'s own passes over the gradients around their reduction move per step
    (module docstring): megatron 3 b_m with a contiguous buffer, 6 b_g without; ddp 4 b_g; 0 for the others
    (FSDP2's copies are ``fsdp.compute_stream_copy_bytes``; DeepSpeed's are not priced)."""
    if engine == "megatron":
        return 6.0 * grad_bytes if mode == "autograd" else 3.0 * main_bytes
    return 4.0 * grad_bytes if engine == "ddp" else 0.0
