"""Which bytes a collective op counts: the ONE rule, used by the prediction (``predict.distributed``:
ops seen by a TorchDispatchMode during a fake trace) and by the measurement (``measure.collectives``:
the same ops seen as profiler events with their recorded shapes).

S is the full buffer, the nccl-tests convention of ``predict/collectives.py`` (which turns S into
time): all-gather S = the gathered output, reduce-scatter S = the unreduced input, all-reduce /
broadcast / all-to-all S = the tensor(s) of the first argument. Per op family:

=============================================  ======================================================
op (both spellings: ``ns.op`` and ``ns::op``)  S
=============================================  ======================================================
``c10d._allgather_base_(out, in, pg)``         the larger argument (the output)
``c10d.allgather_([[outs]], [ins], pg)``       the larger argument (the output list)
``c10d._reduce_scatter_base_(out, in, pg)``    the larger argument (the input)
``c10d.reduce_scatter_([outs], [[ins]], pg)``  the larger argument (the input list)
``c10d.allreduce_([tensors], pg, ...)``        the first argument's tensors
``_c10d_functional.all_gather_into_tensor``    first argument x group size (``(x, n, name)``)
``_c10d_functional.reduce_scatter_tensor``     first argument (``(x, op, n, name)``: the input)
``_c10d_functional.all_reduce(x, op, name)``   first argument
=============================================  ======================================================

Arguments are given as byte sizes, grouped per argument (a tensor is one size, a tensor list one
size per tensor), so the rule reads the same whether it sees tensors or profiler shapes.
"""
from __future__ import annotations

import math
import re

from perfcheck.errors import UserError
from perfcheck.predict.collectives import normalize_kind

#: Namespaces whose ops are collectives: c10d (in-place, ProcessGroup objects) and functional ones.
NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
FUNCTIONAL_NAMESPACES = ("_c10d_functional", "c10d_functional")
#: Ops of those namespaces that are not collectives (waits, bookkeeping, barriers).
NOT_COLLECTIVES = ("wait", "wrap_tensor_autograd", "barrier", "monitored_barrier", "_register_process_group")


def namespace(name: str) -> str:
    """``c10d::allreduce_`` / ``c10d.allreduce_.default`` -> ``c10d``; '' when the name has none."""
    for sep in ("::", "."):
        if sep in name:
            return name.split(sep, 1)[0]
    return ""


def op_kind(name: str) -> str | None:
    """Canonical collective kind for a c10d / functional-collective op or profiler event name
    (``c10d::_allgather_base_`` -> ``allgather``), None for waits and non-collectives."""
    base = re.split(r"::|\.", name)[-1] if ("::" in name or "." in name) else name
    if name.count(".") >= 2:  # c10d._allgather_base_.default
        base = name.split(".")[-2]
    base = base.strip("_")
    if any(w in base for w in NOT_COLLECTIVES):
        return None
    try:
        return normalize_kind(base)
    except UserError:
        return None


def buffer_bytes(name: str, kind: str, arg_sizes, group_size) -> float:
    """S in bytes of one collective op ``name`` of ``kind`` (``op_kind(name)``).

    ``arg_sizes``: per tensor argument in call order, the byte sizes of its tensors (``[[x]]`` for
    one tensor, ``[[a, b]]`` for a list); ``group_size``: the process group's size, None when
    unknown. NaN when the sizes cannot give S (no tensor argument, or a functional all-gather
    whose group size is unknown)."""
    groups = [list(g) for g in arg_sizes if len(g)]
    if not groups:
        return math.nan
    if namespace(name) in FUNCTIONAL_NAMESPACES:
        first = float(sum(groups[0]))
        if kind == "allgather":
            return first * group_size if group_size else math.nan
        return first
    if kind in ("allgather", "reducescatter"):
        return float(max(sum(g) for g in groups))
    return float(sum(groups[0]))


def functional_group_size(args) -> int | None:
    """The group size of a functional collective from its arguments after the tensor: the integer
    one (``all_gather_into_tensor(x, n, name)``), else the size of the named group (the last
    string) when this process knows it; None otherwise."""
    rest = list(args)[1:]
    n = next((int(a) for a in rest if isinstance(a, int) and not isinstance(a, bool)), None)
    if n is not None:
        return n
    names = [a for a in rest if isinstance(a, str)]
    if not names:
        return None
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group

        return int(_resolve_process_group(names[-1]).size())
    except Exception:  # noqa: BLE001 - an unknown group name (another process's): size unknown
        return None
