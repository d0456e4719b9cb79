"""FSDP2 (``torch.distributed.fsdp.fully_shard``) as it runs a stack of blocks: which collectives hide behind
which block's compute, and the memory-bound copies it puts on the compute stream. Per GPU, per micro-step;
the transformer front-end's ``dp_engine="fsdp2"`` (``step._fsdp2_dp``).

The schedule (torch/distributed/_composable/fsdp: _fsdp_param_group.py, _fsdp_collectives.py, as torchtitan
runs it: one ``fully_shard`` per block, one on the root for the embeddings, final norm and output layer):

- Forward: the root's all-gather, then block 1's, are waited on before any compute (nothing earlier to hide
  behind). Block i+1's all-gather is issued while block i computes (the CPU runs ahead; the all-gather stream),
  so L - 1 all-gathers run beside a block's forward.
- Backward, ``reshard_after_forward=True``: block L's all-gather runs beside the root's backward (output layer,
  final norm); block i-1's all-gather is prefetched beside block i's backward; block i's reduce-scatter is
  issued after its backward and runs beside block i-1's (``foreach_reduce_scatter`` then makes the compute
  stream wait for the reduce-scatter stream, so it may not spill further). Block 1's and the root's
  reduce-scatters have nothing left to hide behind. Collectives of one process group share one NCCL stream:
  an all-gather and a reduce-scatter beside the same block run one after the other.
- Each collective beside compute adds ``collectives.beside_compute_s`` (the SMs NCCL holds slow the compute).
- Copies on the compute stream: ``foreach_all_gather_copy_out`` (in ``wait_for_unshard``) reads the gathered
  buffer and writes the parameters, 2 P b_p bytes per all-gather; ``foreach_reduce_scatter_copy_in`` reads the
  gradients and writes the reduce-scatter input in ``reduce_dtype``, P (b_g + b_r) bytes, and the compute
  stream waits for it. The all-gather copy-in (the fp32 shard cast to the parameter dtype, P / n of the
  bytes) runs on its own stream and is left out.

Simplifications, said: every block reshards after forward as the option says (torchtitan keeps the last
block unsharded: one all-gather fewer per micro-step); a block's collectives are timed alone on the ring
(``pipeline.ring_time_s``), the HBM they share with the compute is not modelled.
"""
from __future__ import annotations

import numpy as np

from perfcheck.predict import collectives


def all_gathers_per_micro_step(reshard_after_forward: bool) -> int:
    """All-gathers of one block per micro-step: before forward, and again before backward when the forward
    resharded it (``reshard_after_forward=True``, FSDP2's default for non-root modules)."""
    return 2 if reshard_after_forward else 1


def exposed_per_micro_step_s(ag_block, rs_block, ag_root, rs_root, fwd_block, bwd_block, bwd_root, layers,
                             rate_beside, reshard_after_forward: bool = True):
    """Collective seconds FSDP2 adds to one micro-step of a stack of ``layers`` blocks (module docstring).

    ag_block, rs_block: one block's all-gather and reduce-scatter times; ag_root, rs_root: the root's;
    fwd_block, bwd_block: one block's forward and backward (recompute included) compute; bwd_root: the root's
    backward compute before the blocks' (output layer, final norm). ``rate_beside``: the compute rate kept
    beside a collective (``collectives.beside_compute_s``).

        forward  = ag_root + ag + (L - 1) beside(ag, fwd)
        backward = beside(ag', bwd_root) + beside(ag', bwd) + (L - 2) beside(ag' + rs, bwd) + beside(rs, bwd)
                   + rs + rs_root                          (L >= 2; ag' = ag when resharded, else 0)
        backward = beside(ag', bwd_root) + rs + rs_root    (L = 1)
    """
    def beside(c, g):
        return collectives.beside_compute_s(c, g, rate_beside)

    ag, rs = np.asarray(ag_block, dtype=float), np.asarray(rs_block, dtype=float)
    n = np.asarray(layers, dtype=float)
    ag_b = ag if reshard_after_forward else np.zeros_like(ag)
    forward = ag_root + ag + np.maximum(n - 1, 0) * beside(ag, fwd_block)
    stack = beside(ag_b, bwd_block) + np.maximum(n - 2, 0) * beside(ag_b + rs, bwd_block) + beside(rs, bwd_block)
    backward = beside(ag_b, bwd_root) + np.where(n >= 2, stack, 0.0) + rs + rs_root
    return (forward + backward)[()]


def compute_stream_copy_bytes(params, param_bytes, grad_bytes, reduce_bytes, reshard_after_forward: bool = True):
    """Bytes FSDP2 copies on the compute stream per micro-step for ``params`` unsharded parameters (module
    docstring): all-gather copy-out 2 P b_p per all-gather, reduce-scatter copy-in P (b_g + b_r)."""
    p = np.asarray(params, dtype=float)
    return (all_gathers_per_micro_step(reshard_after_forward) * 2 * p * param_bytes
            + p * (grad_bytes + reduce_bytes))[()]
