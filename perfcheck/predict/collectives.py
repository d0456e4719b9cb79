"""Collective communication time: ring (bandwidth-optimal) formulas as nccl-tests defines them.

From NVIDIA nccl-tests ``doc/PERFORMANCE.md``: ``algbw = S / t`` and ``busbw = algbw * factor``,
where busbw "should reflect the speed of the hardware bottleneck". Inverting it, a collective on a
link of achievable bandwidth B takes

    t = S * bus_factor(kind, n) / B  (+ host.collective_latency_s, one latency term per collective)

with S the FULL buffer size in nccl-tests' convention: the tensor for allreduce/broadcast/reduce,
the gathered OUTPUT for allgather (n x each rank's input), the unreduced INPUT for reducescatter
(n x each rank's output), each rank's send buffer for alltoall, the message for send/recv.

Bus factors (PERFORMANCE.md): allreduce 2(n-1)/n; allgather, reducescatter, alltoall (n-1)/n;
broadcast and reduce 1 (NCCL pipelines them along a ring, so every link carries the whole
buffer once: busbw = algbw); send/recv 1. A group of one rank moves nothing: factor 0.

NB (perfcheck): the latency term is one ``collective_latency_s`` per collective (measured by
``perfcheck calibrate`` at a small message), not the alpha-beta model's 2(n-1)*alpha; it matters only
for small messages, which nccl-tests shows are latency-bound.
Where these times enter a module's and a stage's prediction: docs/model.md (section 5).
"""
from __future__ import annotations

import functools
import re

import numpy as np

from perfcheck.errors import UserError
from perfcheck.hardware.systems import host_constants, spec_of
from perfcheck.parallel import COLLECTIVE_KINDS  # the canonical collective names, one list (re-exported here)

# Compact spellings (lower case, no separators) of DeepSpeed comms-logger / torch.distributed /
# NCCL kernel names -> canonical kind.
_ALIASES = {
    **{k: k for k in COLLECTIVE_KINDS},
    "allreducecoalesced": "allreduce", "inferenceallreduce": "allreduce", "allreducebase": "allreduce",
    "allgatherintotensor": "allgather", "allgatherbase": "allgather", "allgathercoalesced": "allgather",
    "allgatherfn": "allgather", "allgatherintotensorcoalesced": "allgather",
    "reducescattertensor": "reducescatter", "reducescatterbase": "reducescatter",
    "reducescattercoalesced": "reducescatter", "reducescatterfn": "reducescatter",
    "reducescattertensorcoalesced": "reducescatter",
    "broadcastcoalesced": "broadcast",
    "alltoallsingle": "alltoall", "alltoallbase": "alltoall",
    "send": "sendrecv", "recv": "sendrecv", "isend": "sendrecv", "irecv": "sendrecv",
    "batchisendirecv": "sendrecv", "p2p": "sendrecv",
}

# DeepSpeed's comms logger records each rank's shard for these ops (its calc_bw_log multiplies
# the size by n before computing bandwidth, deepspeed/utils/comms_logging.py).
#: Kinds whose DeepSpeed comms-logger size is one rank's input shard (all_gather*); the logger
#: records reduce_scatter_tensor's full unreduced input and all_reduce's whole tensor (measured
#: with deepspeed 0.19.8 on 2 gloo ranks; deepspeed/comm/utils.py get_msg_size_from_args).
_PER_RANK_LOGGED = {"allgather"}


def normalize_kind(name: str) -> str:
    """Canonical kind for a DeepSpeed/torch.distributed/NCCL op name ("all_gather_into_tensor" -> "allgather").

    Case, underscores, a leading ``nccl``/``ncclDevKernel_`` prefix and a trailing NCCL type/algorithm
    suffix ("AllReduce_Sum_bf16_RING_LL") are ignored. Unknown names raise UserError.
    """
    if not isinstance(name, str):
        raise UserError(f"collective kind must be a string, got {name!r}")
    text = re.sub(r"^(ncclDevKernel_|ncclKernel_|nccl)", "", name.strip(), flags=re.IGNORECASE)
    compact = re.sub(r"[^a-z0-9]", "", text.lower())
    if compact in _ALIASES:
        return _ALIASES[compact]
    head = re.sub(r"[^a-z0-9]", "", re.split(r"_", text, maxsplit=1)[0].lower())  # "AllReduce_Sum_..."
    if "_" in text and head in _ALIASES:
        return _ALIASES[head]
    raise UserError(f"unknown collective {name!r} (known: {', '.join(COLLECTIVE_KINDS)} and DeepSpeed/NCCL spellings)")


_FACTOR_CODE = {"allreduce": 0, "allgather": 1, "reducescatter": 1, "alltoall": 1, "broadcast": 2, "reduce": 2, "sendrecv": 2}


def _factor_code(name) -> int:
    # "" or None marks "no collective" in vectorised calls (rows of a frame without communication).
    return 3 if name in ("", None) else _FACTOR_CODE[normalize_kind(name)]


def _factor_codes(kind):
    """0 for 2(n-1)/n, 1 for (n-1)/n, 2 for 1, 3 for none; an int for a str, else an int array of kind's shape."""
    if isinstance(kind, str) or kind is None:
        return _factor_code(kind)
    arr = np.asarray(kind, dtype=object)
    arr = np.where(arr == None, "", arr)  # noqa: E711 - elementwise comparison
    uniq, inverse = np.unique(arr.astype(str), return_inverse=True)
    codes = np.array([_factor_code(u) for u in uniq], dtype=int)  # distinct names only
    return codes[inverse].reshape(arr.shape)


def _group(n) -> np.ndarray:
    arr = np.asarray(n)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number) or np.any(arr < 1) or np.any(arr != np.floor(arr)):
        raise UserError(f"group_size must be a positive integer, got {n!r}")
    return arr.astype(float)


def bus_factor(kind, n):
    """nccl-tests bus-bandwidth factor for ``kind`` over ``n`` ranks; vectorised.

    0 when n == 1, and for an empty kind ("" or None), which marks "no collective" in an array.
    """
    code = np.asarray(_factor_codes(kind))
    nn = _group(n)
    ring = (nn - 1.0) / nn
    factor = np.where(code == 0, 2.0 * ring, np.where(code == 1, ring, 1.0))
    factor = np.where((nn == 1) | (code == 3), 0.0, factor)
    return factor.item() if np.ndim(kind) == 0 and np.ndim(n) == 0 else factor


def _spans(system, group_size, spans_nodes):
    n = _group(group_size)
    fits = n <= system.gpus_per_node
    if spans_nodes is None:
        return ~fits
    return np.asarray(spans_nodes, dtype=bool) | ~fits


def link_bandwidth_bytes_per_s(system, group_size, spans_nodes=None):
    """Achievable per-GPU, one-direction bandwidth of the link a group's ring is bottlenecked by.

    Intra-node (NVLink / Infinity Fabric / PCIe) when the group fits in one node
    (``group_size <= gpus_per_node``) and ``spans_nodes`` is not True; else the inter-node NIC.
    ``spans_nodes=None`` infers it from the group size alone (ranks packed into nodes).
    """
    system = spec_of(system)
    inter = _spans(system, group_size, spans_nodes)
    bw = np.where(inter,
                  system.inter_node_bandwidth_bytes_per_s * system.efficiency["inter_node"],
                  system.intra_node_bandwidth_bytes_per_s * system.efficiency["intra_node"])
    scalar = np.ndim(group_size) == 0 and np.ndim(spans_nodes) == 0
    return bw.item() if scalar else bw


def collective_time_s(kind, bytes, group_size, system, spans_nodes=None):  # noqa: A002 - the contract's name
    """Seconds for one collective: ``bytes * bus_factor / link bandwidth + alpha``, alpha the spec's
    ``host.collective_latency_s`` (measured by ``perfcheck calibrate`` at a small message, else the
    default for its kind: perfcheck/hardware/host_defaults.json).

    ``bytes`` is the full buffer size S (see the module docstring). Zero bytes or a group of one
    costs nothing. All of kind, bytes, group_size and spans_nodes may be arrays of one shape.
    """
    system = spec_of(system)
    size = np.asarray(bytes, dtype=float)
    if np.any(size < 0):
        raise UserError("collective bytes must be >= 0 (got a negative value)")
    factor = np.asarray(bus_factor(kind, group_size))
    bw = np.asarray(link_bandwidth_bytes_per_s(system, group_size, spans_nodes))
    active = (factor > 0) & (size > 0)

    t = np.where(active, size * factor / bw + host_constants(system)["collective_latency_s"], 0.0)
    t = curve_time_s(kind, size, factor, system, ~np.asarray(_spans(system, group_size, spans_nodes)), t)
    scalar = all(np.ndim(x) == 0 for x in (kind, bytes, group_size, spans_nodes))
    return t.item() if scalar else t


def curve_time_s(kind, size, factor, system, intra, flat_s):
    """The flat time ``flat_s`` of collectives inside one node (``intra``), raised where the spec's measured
    bus bandwidth at that message size is lower (``collective_busbw_curve``, nccl-tests' rows for the kind):

        t = max(flat_s, S * bus_factor(kind, n) / busbw(S))

    busbw(S) interpolated in log S between the measured sizes and held at the end points. Why: the flat figure
    is nccl-tests' large-message bus bandwidth; a ring reaches it only at gigabytes (8 A100 SXM, all_reduce:
    172 GB/s at 64 MiB, 194 at 256 MiB, 229 at 1 GiB, 235 at 16 GiB: ml-engineering network/README.md), and a
    measured time already holds its latency, so where the curve is slower it replaces the flat time, latency
    included. ``factor``: the calls' ``bus_factor`` (their callers have it). Kinds without a curve, groups across
    nodes and zero-byte calls keep ``flat_s``."""
    flat = np.asarray(flat_s, dtype=float)
    curves = getattr(system, "collective_busbw_curve", None) or {}
    if not curves:
        return flat
    kinds = np.broadcast_to(np.asarray(kind, dtype=object), flat.shape)
    size = np.broadcast_to(np.asarray(size, dtype=float), flat.shape)
    factor = np.broadcast_to(np.asarray(factor, dtype=float), flat.shape)
    inside = np.broadcast_to(np.asarray(intra, dtype=bool), flat.shape)
    out = flat.copy()
    for name, points in curves.items():
        xs, ys = np.log([p[0] for p in points]), np.array([p[1] for p in points])
        busbw = np.interp(np.log(np.maximum(size, 1.0)), xs, ys)
        use = inside & (kinds == name) & (flat > 0)
        out = np.where(use, np.maximum(out, size * factor / busbw), out)
    return out


def beside_compute_s(collective_s, compute_s, rate_beside):
    """Seconds a collective of time c adds to compute of time g it runs beside, on separate streams.

    While the collective's kernels run they hold SMs (NCCL: one per channel), so the compute keeps only
    r = ``rate_beside`` of its rate (``efficiency.matrix_beside_collective``; 1: perfect concurrency) and does
    r c of its work meanwhile. The pair ends at g + c - min(r c, g):
        exposed = c - min(r c, g)
    i.e. (1 - r) c while the compute outlasts the collective, c - g once the collective outlasts it (r = 1:
    max(c - g, 0)). Used for Megatron's asynchronous column-parallel backward (``step._time_rows``) and for
    FSDP2's prefetched all-gathers and reduce-scatters (``fsdp.exposed_per_micro_step_s``). HBM sharing is
    not modelled.
    """
    c = np.asarray(collective_s, dtype=float)
    return (c - np.minimum(rate_beside * c, np.asarray(compute_s, dtype=float)))[()]


def bytes_from_deepspeed_log(op_name: str, msg_size, group_size):
    """Full buffer size S (nccl-tests convention) for a DeepSpeed comms-logger record: the logged
    size times the group for all-gathers (the logger sees one rank's shard), as logged otherwise."""
    kind = normalize_kind(op_name)
    size = np.asarray(msg_size, dtype=float)
    out = size * _group(group_size) if kind in _PER_RANK_LOGGED else size
    return out.item() if np.ndim(out) == 0 else out


def batch_time_s(kind, bytes_per_call, calls, group_size, system, spans_nodes=None):
    """Seconds for ``calls`` collectives of ``bytes_per_call`` (S each) issued together and waited together.

    DeepSpeed issues some collectives with ``async_op=True`` and waits for their handles only after the
    last one is issued (ZeRO-3's gather of the persistent parameters after the step,
    ``Init._allgather_params_coalesced``: one ``all_gather_into_tensor`` per tensor, then every
    ``handle.wait()``). The calls queue behind each other on the process group's worker, so the batch pays
    the latency once and then, per further call, only what it costs to issue and complete one more queued
    call (``host.collective_async_call_s``, measured by ``perfcheck calibrate``'s collectives case as a
    batch of async all-gathers less one), and every call's bytes on the link:

        t(batch of k) = alpha + (k - 1) * async_call_s + k * S * bus_factor / B

    k = 1 is ``collective_time_s``. ``calls`` may be fractional in vectorised use (a mean over steps); 0
    calls, 0 bytes or a group of one cost nothing. Arrays broadcast like ``collective_time_s``'s.
    """
    system = spec_of(system)
    k = np.asarray(calls, dtype=float)
    if np.any(k < 0) or np.any(~np.isfinite(k)):
        raise UserError(f"calls: the number of collectives in a batch must be a finite number >= 0, got {calls!r}")
    one = np.asarray(collective_time_s(kind, bytes_per_call, group_size, system, spans_nodes))
    hc = host_constants(system)
    active = (one > 0) & (k > 0)
    alpha = hc["collective_latency_s"]
    t = np.where(active, alpha + np.maximum(k - 1.0, 0.0) * hc["collective_async_call_s"] + k * (one - alpha), 0.0)
    return t.item() if np.ndim(t) == 0 else t


@functools.lru_cache(maxsize=64)
def expected_max_normal(n) -> float:
    """E[max of n independent standard normal variables] - the mean: 0 for n = 1, 1/sqrt(pi) = 0.5642 for
    n = 2, 0.8463 for 3, 1.0294 for 4, 1.4236 for 8 (Tippett 1925's table; computed here by integrating
    x * n * phi(x) * Phi(x)^(n-1) on a grid, exact to 1e-6 against those values)."""
    import math

    if isinstance(n, bool) or int(n) != n or n < 1:
        raise UserError(f"ranks must be a positive integer, got {n!r}")
    n = int(n)
    if n == 1:
        return 0.0
    x = np.linspace(-10.0, 10.0, 40001)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    f = x * n * phi * cdf ** (n - 1)
    return float(np.sum((f[1:] + f[:-1]) * 0.5 * np.diff(x)))


def straggler_wait_s(syncs, ranks, system):
    """Expected seconds one rank waits, per step, for the latest of ``ranks`` ranks at ``syncs`` blocking
    collectives (or waited batches of async ones).

    Derivation. A blocking collective completes for nobody before every rank has entered it. Each rank
    reaches it after the same code on same-sized data, but its elapsed time differs from the others':
    on a shared host a rank is descheduled for a tick, its gloo thread waits for a core, and the previous
    collective let the ranks go at different moments. Call A_i rank i's arrival; every rank leaves together
    (when the latest has arrived), so a rank's expected wait is E[max_j A_j] - E[A_i]. That is measured, as a
    mean over many rounds, by the collectives case (``host.collective_straggler_s`` at
    ``host.collective_straggler_ranks`` ranks: equal work, then a blocking all-reduce; bench/RESULTS.md:
    the mean wait did not grow with the work before the collective, 2.7 vs 8 ms of it, so it is a cost
    per collective, not per second of work). For another rank count N the arrivals are taken as normal
    with the measured spread, so the wait scales as E[max of N standard normals] (``expected_max_normal``):

        wait = syncs * collective_straggler_s * e_N / e_N0       (N0 the measured rank count; 0 for N = 1)
    """
    s = np.asarray(syncs, dtype=float)
    if np.any(s < 0) or np.any(~np.isfinite(s)):
        raise UserError(f"syncs: blocking collectives per step must be a finite number >= 0, got {syncs!r}")
    hc = host_constants(spec_of(system))
    n0 = hc["collective_straggler_ranks"]
    if hc["collective_straggler_s"] == 0:  # no wait measured (or a spec that sets every host term to 0)
        return 0.0 if np.ndim(s) == 0 else np.zeros_like(s)
    if int(n0) != n0 or n0 < 2:
        raise UserError(f"host.collective_straggler_ranks must be an integer >= 2, got {n0!r}")
    t = s * hc["collective_straggler_s"] * expected_max_normal(ranks) / expected_max_normal(int(n0))
    return t.item() if np.ndim(t) == 0 else t
