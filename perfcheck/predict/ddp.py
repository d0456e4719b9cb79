"""PyTorch DDP (``torch.nn.parallel.DistributedDataParallel``) as a training loop with gradient accumulation
runs it: what its gradient all-reduces add to a step once the backward hides what it can. Per GPU, per optimizer
step; the transformer front-end's ``dp_engine="ddp"`` (``step._ddp_dp``).

The schedule (torch/nn/parallel/distributed.py and reducer.cpp; Megatron-LM's ``--DDP-impl torch``,
``forward_backward_no_pipelining`` at the SC21 scripts' commit 6985e589, 2021-08-18):

- Every micro-batch but the last runs under ``model.no_sync()``: gradients accumulate locally, no collective.
- In the last micro-batch's backward the reducer all-reduces the gradients in buckets of ``bucket_cap_mb``
  (25 MiB by default), filled in the reverse order of the parameters, i.e. the order backward produces them:
  output layer and final norm, then the blocks from the last to the first. A bucket is launched when its last
  gradient arrives; the all-reduces run one after another on NCCL's stream, beside the backward.
- The input embedding's gradient arrives last (with tied embeddings the output layer's use adds to it first,
  so it is ready only then): its bucket(s) have no backward left to hide behind.

Closed form (buckets over the stack arrive evenly during its backward, each all-reduce a ring at the DP
group's bandwidth; ``collectives.beside_compute_s`` for what a collective costs the compute it runs beside):

    exposed = beside(C_stack - c_last, g_stack) + beside(c_last, g_tail) + C_tail

C_stack: the stack's buckets (output layer, final norm, the blocks), each a ring all-reduce with its latency;
c_last: the stack's last bucket, ready only when the first block's backward ends, so it runs beside the
embedding's backward (g_tail) alone; g_stack: the blocks' backward (recompute included); C_tail: the input
embedding's bucket(s). Simplifications, said: the first bucket (1 MiB in DDP's default, it carries the output
layer's first gradients) is taken as ready when the stack's backward starts, and the bucket boundaries as
cutting the stack evenly; the HBM the all-reduces share with the compute is not modelled.
"""
from __future__ import annotations

import numpy as np

from perfcheck.predict import collectives, pipeline

#: torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB (25) x _MB_TO_BYTES (2**20)
BUCKET_BYTES = 25 * 2**20


def buckets(size_bytes, bucket_bytes=BUCKET_BYTES):
    """Buckets DDP fills with ``size_bytes`` of gradients: ceil(S / cap), at least one when S > 0."""
    s = np.asarray(size_bytes, dtype=float)
    return np.where(s > 0, np.maximum(np.ceil(s / bucket_bytes), 1.0), 0.0)[()]


def allreduce_buckets_s(size_bytes, group, bandwidth, system, bucket_bytes=BUCKET_BYTES, intra=False):
    """Seconds the buckets of ``size_bytes`` take on the ring one after another: the full buckets' and the last
    one's ring times (bytes x bus factor / bandwidth plus the spec's collective latency each; for a group inside
    one node, ``intra``, at the bus bandwidth measured for a bucket's size where the spec has it)."""
    full = np.maximum(buckets(size_bytes, bucket_bytes) - 1, 0)
    one_full = pipeline.ring_time_s("allreduce", bucket_bytes, group, bandwidth, system, intra)
    last = pipeline.ring_time_s("allreduce", last_bucket_bytes(size_bytes, bucket_bytes), group, bandwidth, system,
                                intra)
    return (full * one_full + last)[()]


def last_bucket_bytes(size_bytes, bucket_bytes=BUCKET_BYTES):
    """The stack's last bucket: what is left after the full ones (a full bucket when S divides evenly)."""
    s = np.asarray(size_bytes, dtype=float)
    return np.where(s > 0, s - (buckets(s, bucket_bytes) - 1) * bucket_bytes, 0.0)[()]


def exposed_s(stack_bytes, tail_bytes, stack_bwd_s, tail_bwd_s, group, bandwidth, system, rate_beside,
              bucket_bytes=BUCKET_BYTES, intra=False):
    """Seconds DDP's all-reduces add to an optimizer step (module docstring's closed form).

    stack_bytes: gradient bytes of the output layer, final norm and blocks on this GPU; tail_bytes: the input
    embedding's (ready last); stack_bwd_s: the blocks' backward of the last micro-batch (recompute included);
    tail_bwd_s: the embedding's backward; group, bandwidth: the DP ring (``intra``: inside one node); rate_beside:
    the compute rate kept beside a collective (``efficiency.matrix_beside_collective``).
    """
    stack = allreduce_buckets_s(stack_bytes, group, bandwidth, system, bucket_bytes, intra)
    last = pipeline.ring_time_s("allreduce", last_bucket_bytes(stack_bytes, bucket_bytes), group, bandwidth, system,
                                intra)
    tail = allreduce_buckets_s(tail_bytes, group, bandwidth, system, bucket_bytes, intra)
    hidden_part = collectives.beside_compute_s(stack - last, stack_bwd_s, rate_beside)
    return (hidden_part + collectives.beside_compute_s(last, tail_bwd_s, rate_beside) + tail)[()]
