"""Schedules and collectives of Megatron-style 3D/4D-parallel training, one formula each, vectorised.

Every function takes scalars or numpy arrays (one entry per layout of a sweep) and is plain arithmetic;
``step.py`` combines them into the step time. Sources are beside each formula. Names:

    b micro-batch, s sequence, h hidden, t tensor-parallel size, p pipeline stages, v virtual stages
    (model chunks) per GPU, m micro-batches per pipeline flush, c context-parallel size, eb element bytes.
How the step time is put together from these: docs/model.md (section 6).
"""
from __future__ import annotations

import numpy as np

from perfcheck.hardware.systems import host_constants
from perfcheck.predict import collectives


# ---- pipeline schedules --------------------------------------------------------------------------
def bubble_fraction(p, v, m):
    """Pipeline bubble relative to the ideal (bubble-free) time of a flush, 1F1B and interleaved 1F1B:

        bubble / ideal = (p - 1) / (v * m)

    Narayanan et al. 2021 (arXiv 2104.04473), sec. 2.2.1 (1F1B: (p-1)/m) and 2.2.2 (interleaved
    schedule, v model chunks per device: "the pipeline bubble ... reduced by a factor of v"). v = 1 is
    plain 1F1B."""
    p, v, m = (np.asarray(a, dtype=float) for a in (p, v, m))
    return ((p - 1) / (v * m))[()]


def bubble_share(p, v, m):
    """Share of the flush that is bubble: (p-1)/v / (m + (p-1)/v)."""
    f = np.asarray(bubble_fraction(p, v, m), dtype=float)
    return (f / (1 + f))[()]


def flush_bubble_s(p, v, t_middle, t_other_end):
    """Bubble seconds of one pipeline flush when the stages are not equally fast, 1F1B and interleaved.

    A flush of m identical micro-batches through p stages that take t_1 .. t_p each (forward + backward
    of one micro-batch) lasts, in 1F1B,

        T = m * t_max + sum over the other p - 1 stages of t_i

    the flow-shop makespan of identical jobs: the first micro-batch's forward crosses the stages before
    the slowest, the slowest then runs all m back to back (the faster stages keep it fed), and the last
    backward crosses the stages before it again; each other stage's fill and drain is ITS time, not the
    slowest's. Equal stages give Narayanan et al. 2021's bubble (p - 1) * t (sec. 2.2.1). In a Megatron
    GPT the middle stages hold only layers (``t_middle``); the first adds the embedding, the last the LM
    head and loss: the slower end is the critical stage (``step.stage_sum``) and the other end adds its
    own rows (``t_other_end`` = t_middle + those rows). Interleaved (v model chunks per GPU, sec. 2.2.2)
    divides the fill and drain by v:

        bubble = ((p - 2) * t_middle + t_other_end) / v      (p >= 2; 0 for p = 1)
    """
    p, v = np.asarray(p, dtype=float), np.asarray(v, dtype=float)
    t_mid, t_end = np.asarray(t_middle, dtype=float), np.asarray(t_other_end, dtype=float)
    return np.where(p > 1, (np.maximum(p - 2, 0.0) * t_mid + t_end) / v, 0.0)[()]


def p2p_sends_per_micro_batch(p, v):
    """Activation sends per micro-batch per GPU in one direction: v with the interleaved schedule (each
    of the v chunks hands its output on), 1 with 1F1B, 0 without pipelining (Narayanan et al. 2021,
    sec. 2.2.2: "the amount of communication also increases by v")."""
    p, v = np.asarray(p, dtype=float), np.asarray(v, dtype=float)
    return np.where(p > 1, v, 0.0)[()]


def p2p_bytes(b, s, h, eb, t, sp, scatter_gather):
    """``(sent, gathered)``: bytes one GPU sends to the next stage per micro-batch and direction, and the
    full-buffer bytes of the all-gather that rebuilds the activation on the receiving side.

    Without sequence parallelism every TP rank holds the whole (b, s, h) output. Megatron's scatter/gather
    optimisation (Narayanan et al. 2021, sec. 4.1; on by default without SP) splits it into t chunks,
    each GPU sends its b*s*h/t over its own InfiniBand card, and the receivers all-gather the chunks
    over NVLink: sent = b*s*h*eb/t, gathered = b*s*h*eb (nccl-tests' full buffer). Without it every
    rank sends b*s*h*eb. With SP the activation is already split over the sequence: b*s*h*eb/t, no gather.
    """
    full = np.asarray(b, dtype=float) * s * h * eb
    t = np.asarray(t, dtype=float)
    sp, sg = np.asarray(sp, dtype=bool), np.asarray(scatter_gather, dtype=bool)
    split = sp | (sg & (t > 1))
    sent = np.where(split, full / t, full)
    gathered = np.where(~sp & sg & (t > 1), full, 0.0)
    return sent[()], gathered[()]


def p2p_time_s(sent, gathered, t, system, spans_nodes):
    """Seconds for one stage-to-stage hand-off: the send (one peer: ``sendrecv``) plus the receivers'
    NVLink all-gather over the t ranks of the tensor-parallel group."""
    send = np.asarray(collectives.collective_time_s("sendrecv", sent, 2 * np.ones(np.shape(sent)), system,
                                                    spans_nodes=spans_nodes))
    gather = np.asarray(collectives.collective_time_s("allgather", gathered, np.maximum(t, 1), system))
    return (send + gather)[()]


# ---- context parallelism -------------------------------------------------------------------------
def cp_ring_bytes(b, s, kv_heads, head_dim, eb, t, c):
    """Bytes one GPU sends per layer for ring attention with context parallelism c, forward and backward.

    Each GPU holds s/c tokens; the ring runs c - 1 steps, each passing the current K and V block of
    b * (s/c) * (kv_heads/t) * head_dim elements each on to the next rank (Liu et al. 2023, "Ring
    Attention with Blockwise Transformers", arXiv 2310.01889, sec. 3; Megatron-Core context
    parallelism). Backward sends K, V again and their gradients dK, dV: twice the forward.

        fwd = (c - 1) * 2 * b * (s/c) * (kv_heads/t) * head_dim * eb,     bwd = 2 * fwd
    """
    c = np.asarray(c, dtype=float)
    block = np.asarray(b, dtype=float) * (s / c) * (kv_heads / np.asarray(t, dtype=float)) * head_dim * eb
    fwd = (c - 1) * 2 * block
    return fwd[()], (2 * fwd)[()]


def ulysses_bytes(b, s, heads, kv_heads, head_dim, eb, t, c):
    """Send-buffer bytes (nccl-tests' all-to-all S) per layer for DeepSpeed-Ulysses sequence parallelism c.

    Before attention an all-to-all turns q, k, v from (s/c tokens, all heads) into (all tokens, heads/c);
    after it one all-to-all turns the output back (Jacobs et al. 2023, "DeepSpeed Ulysses", arXiv
    2309.14509, sec. 3.1). Per GPU the send buffers are its local blocks:
        fwd = b * (s/c) * (heads + 2 * kv_heads + heads) / t * head_dim * eb,   bwd = fwd (the gradients)
    """
    c = np.asarray(c, dtype=float)
    fwd = np.where(c > 1, np.asarray(b, dtype=float) * (s / c) * (2 * heads + 2 * kv_heads) / np.asarray(t, dtype=float)
                   * head_dim * eb, 0.0)
    return fwd[()], fwd[()]


# ---- data parallelism ----------------------------------------------------------------------------
def ranks_per_node(inner, group, gpus_per_node):
    """Members of a group that share one node, when the ranks ``inner`` (the product of the parallel
    sizes laid out inside this group: tp for DP in Megatron's tp-dp-pp order) are packed first:
    min(group, max(1, gpus_per_node / inner))."""
    inner, group = np.asarray(inner, dtype=float), np.asarray(group, dtype=float)
    return np.minimum(group, np.maximum(1.0, np.floor(gpus_per_node / inner)))[()]


def rail_bandwidth_bytes_per_s(system, group, local):
    """Achievable bus bandwidth of a ring over ``group`` ranks of which ``local`` share each node.

    Inside one node: the NVLink figure. Across nodes NCCL runs one ring per channel and sends each
    ring's inter-node hop through a different GPU's NIC (DGX A100 / H100: one NIC per GPU, "rail"
    networks), so the ``local`` NICs of a node carry the group's traffic together: bus bandwidth =
    min(local * NIC bandwidth, NVLink bandwidth), times the efficiencies. NVIDIA nccl-tests
    doc/PERFORMANCE.md (busbw "should reflect the speed of the hardware bottleneck"); a group with one
    rank per node (DP at t = 8) is bound by its one NIC.
    """
    group, local = np.asarray(group, dtype=float), np.asarray(local, dtype=float)
    nvlink = system.intra_node_bandwidth_bytes_per_s * system.efficiency["intra_node"]
    nic = system.inter_node_bandwidth_bytes_per_s * system.efficiency["inter_node"]
    return np.where(inside_node(group, local), nvlink, np.minimum(local * nic, nvlink))[()]


def ring_time_s(kind, size, group, bandwidth, system, intra=False):
    """nccl-tests' ring time: S * bus_factor(kind, n) / bus bandwidth + the spec's collective latency; for a
    group inside one node (``intra``), no faster than the spec's measured bus bandwidth at that size allows
    (``collectives.curve_time_s``)."""
    size = np.asarray(size, dtype=float)
    group = np.maximum(np.asarray(group, dtype=float), 1)
    factor = np.asarray(collectives.bus_factor(kind, group))
    active = (factor > 0) & (size > 0)
    t = np.where(active, size * factor / bandwidth + host_constants(system)["collective_latency_s"], 0.0)
    return collectives.curve_time_s(kind, size, factor, system, intra, t)[()]


def inside_node(group, local):
    """True where every member of a group shares one node (``ranks_per_node`` of them do)."""
    return (np.asarray(group, dtype=float) <= np.asarray(local, dtype=float))[()]
