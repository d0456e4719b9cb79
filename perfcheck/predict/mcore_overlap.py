"""Megatron-Core's overlapped data-parallel collectives (``--overlap-grad-reduce``, ``--overlap-param-gather``):
what they add to a step once the compute hides what it can. Per GPU, per optimizer step; the transformer
front-end's ``dp_engine="megatron"`` with ``overlap_grad_reduce`` / ``overlap_param_gather`` (``step._megatron_dp``).

The schedule (megatron/core/distributed/distributed_data_parallel.py and param_and_grad_buffer.py, Megatron-LM
main of 2025; the flags the README's H100 scaling runs name):

- Gradients live in a contiguous buffer cut into buckets of ``bucket_size`` parameters, by default
  max(40e6, 1e6 x DP size) (``DistributedDataParallel.__init__``), in the reverse order of the parameters.
- overlap_grad_reduce: every micro-batch but the last accumulates into the buffer; in the last one's backward a
  bucket's reduction (an all-reduce, or a reduce-scatter with the distributed optimizer) is launched when its
  last gradient arrives, and ``finish_grad_sync`` waits for all of them after the backward. The last bucket holds
  the first layers and the input embedding: it is ready only at the backward's end, with nothing left to hide it.
- overlap_param_gather (distributed optimizer only): the next step's first forward pre-hook launches the first
  bucket's all-gather of the updated parameters and waits for it; each wait launches the next bucket's, which runs
  beside the forward of the modules before it (``finish_param_sync``).

Closed forms (buckets cut the stage evenly, each collective a ring at the DP group's bandwidth with its latency;
``collectives.beside_compute_s`` for what a collective costs the compute it runs beside):

    exposed reduce  = beside(R - r_last, g_bwd) + r_last
    exposed gather  = a_first + beside(A - a_first, g_fwd)

R, A: all buckets' reductions and all-gathers one after another; r_last, a_first: one bucket's (the smaller last
one: what is left after the full ones); g_bwd, g_fwd: the last micro-batch's backward and the first one's forward
through the stage. With interleaving (v model chunks per GPU) the first stage's last backward and first forward
are its first chunk's: the closed forms apply to that chunk's parameters and times (1/v of the stage's); the
other chunks' collectives run while the stage's other chunks compute, and are taken as hidden. Not modelled,
said: the HBM the collectives share with the compute, and the buckets' uneven cut.
"""
from __future__ import annotations

import numpy as np

from perfcheck.predict import collectives, ddp, pipeline

#: megatron/core/distributed/distributed_data_parallel.py: bucket_size = max(40000000, 1000000 * dp_size) parameters
BUCKET_PARAMS_MIN, BUCKET_PARAMS_PER_RANK = 40_000_000, 1_000_000


def bucket_params(dp):
    """Parameters per bucket for a DP group of ``dp`` ranks (Megatron-Core's default ``bucket_size``)."""
    return np.maximum(BUCKET_PARAMS_MIN, BUCKET_PARAMS_PER_RANK * np.asarray(dp, dtype=float))[()]


def _buckets(kind, params, elem_bytes, group, bandwidth, system, intra):
    """(all buckets' ring time one after another, the last (smallest) bucket's) of ``params`` parameters."""
    p, size = np.asarray(params, dtype=float), bucket_params(group)
    count, last = ddp.buckets(p, size), ddp.last_bucket_bytes(p, size)  # in parameters here, not bytes
    full = pipeline.ring_time_s(kind, size * elem_bytes, group, bandwidth, system, intra)
    one = pipeline.ring_time_s(kind, last * elem_bytes, group, bandwidth, system, intra)
    return (np.maximum(count - 1, 0) * full + one)[()], one


def grad_reduce_exposed_s(kind, params, grad_bytes, bwd_s, group, bandwidth, system, rate_beside, intra=False):
    """Seconds the gradient reduction (``kind``: "allreduce" or "reducescatter") adds with overlap_grad_reduce:
    beside(R - r_last, g_bwd) + r_last (module docstring) for ``params`` parameters reduced in ``grad_bytes`` each
    beside ``bwd_s`` of backward."""
    total, last = _buckets(kind, params, grad_bytes, group, bandwidth, system, intra)
    return (collectives.beside_compute_s(total - last, bwd_s, rate_beside) + last)[()]


def param_gather_exposed_s(params, param_bytes, fwd_s, group, bandwidth, system, rate_beside, intra=False):
    """Seconds the parameters' all-gather adds with overlap_param_gather: a_first + beside(A - a_first, g_fwd)."""
    total, first = _buckets("allgather", params, param_bytes, group, bandwidth, system, intra)
    return (first + collectives.beside_compute_s(total - first, fwd_s, rate_beside))[()]
