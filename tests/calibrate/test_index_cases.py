"""The index-taking kernels' calibration cases run on fresh indices every call (``index_cases.rotating``): the set
counts by hand, the round robin by its results, and no case of them calling one index set twice in a row."""
import math

import torch

from perfcheck.calibrate import index_cases as ix

aten = torch.ops.aten


def test_set_counts_hold_the_rotation_indices_within_bounds():
    # ceil(65536 / n) sets of n indices, at least 16 and at most 64
    assert [len(ix.index_sets(100, n, "cpu")) for n in (8, 128, 1000, 2048, 4096, 100000)] == [64, 64, 64, 32, 16, 16]
    assert ix.ROTATION_INDICES == 1 << 16 and ix.ROTATION_SETS == (16, 64)
    sets = ix.index_sets(50, 1000, "cpu")
    assert all(s.dtype == torch.int64 and s.shape == (1000,) and 0 <= int(s.min()) and int(s.max()) < 50 for s in sets)
    assert not torch.equal(sets[0], sets[1])  # distinct draws


def test_rotating_runs_each_call_in_turn():
    fn = ix.rotating([lambda k=k: k for k in range(3)])
    assert [fn() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def _indices_seen(case, calls):
    """The index tensor each of ``calls`` calls of ``case.fn`` passed to its aten op (by its data pointer)."""
    seen = []
    real = {name: getattr(aten, name) for name in ("embedding", "embedding_dense_backward", "_embedding_bag",
                                                    "_embedding_bag_backward")}

    class Spy:
        def __init__(self, op, pos):
            self.op, self.pos = op, pos

        def __call__(self, *args):
            seen.append(args[self.pos].data_ptr())
            return self.op(*args)

    positions = {"embedding": 1, "embedding_dense_backward": 1, "_embedding_bag": 1, "_embedding_bag_backward": 1}
    try:
        for name, op in real.items():
            setattr(ix.aten, name, Spy(op, positions[name]))
        for _ in range(calls):
            case.fn()
    finally:
        for name, op in real.items():
            setattr(ix.aten, name, op)
    return seen


def test_every_case_sees_a_new_index_set_on_each_call():
    cases = ix.index_cases("cpu")
    assert {c.label for c in cases} >= {"embedding fwd", "embedding bwd", "_embedding_bag bwd", "_embedding_bag_max bwd",
                                         "_embedding_bag_max:fwd", "_embedding_bag", "_embedding_bag_mean:bwd"}
    for c in cases:
        seen = _indices_seen(c, 20)
        assert len(seen) == 20 and all(a != b for a, b in zip(seen, seen[1:])), c.label
    # per-index cases: the slope's two counts, hand arithmetic of the rows' bytes unchanged by the rotation
    n = ix.EMBED_COUNTS[-1]
    case = next(c for c in cases if c.label == "embedding fwd" and c.shape[0] == n)
    assert case.bytes == 2 * n * ix.ROW_CASE_LENGTH * 4 + n * 8
    assert math.ceil(ix.ROTATION_INDICES / n) == 32


def test_index_cases_are_cpu_only():
    assert ix.index_cases("meta") == []
