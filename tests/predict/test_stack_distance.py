"""The reuse distance as a stack distance (perfcheck.predict.reuse): distinct bytes since an operand's last touch,
the backward's untraced gradients as buffers recycled by size. Hand counts, no timing."""
from __future__ import annotations

import math

import pytest
import torch

from perfcheck.predict import reuse
from perfcheck.predict.aten_costs import OpCall, TensorMeta
from perfcheck.predict.grad_accumulation import ACCUMULATE_OP
from perfcheck.predict.module_estimator import _op_table
from perfcheck.predict.trace import trace_model
from perfcheck.predict.trace_records import TracedOp


def test_stack_distance_counts_each_storage_once_at_its_latest_touch():
    """Events: 0 touches a (10 B); 1 touches b (5 B); 2 touches a and c (3 B); 3 touches a again. Before event 4:
    b was last touched at 1, and since then a (10, once, though touched twice) and c (3): 13 B. a: nothing after
    its touch at 3: 0. c: a at 3: 10. A key never touched: the ``unseen`` value."""
    s = reuse._StackDistance(5)
    for e, keys in enumerate(({"a": 10.0}, {"b": 5.0}, {"a": 10.0, "c": 3.0}, {"a": 10.0})):
        s.touch(keys, e)
    assert s.distance("b", 4, math.inf) == 13.0
    assert s.distance("a", 4, math.inf) == 0.0
    assert s.distance("c", 4, math.inf) == 10.0
    assert s.distance("d", 4, math.inf) == math.inf and s.distance("d", 4, 0.0) == 0.0
    # (as traffic, the events after b's touch moved 10 + 3 + 10 = 23 B: a counted twice)


def _op(reads, writes, grad_accumulate=False, out=None):
    call = OpCall(ACCUMULATE_OP, (out, out), {}, (out,)) if grad_accumulate else OpCall(ACCUMULATE_OP, (), {}, ())
    return TracedOp(call, (), grad_accumulate=grad_accumulate, reads=tuple(reads), writes=tuple(writes))


def test_touched_storages_by_phase():
    """Forward: the recorded storages (100 + 50 read, 20 written), scaled to the formula's bytes where it moves fewer
    (85 of 170: half each); none recorded: a storage of its own. Backward: the recorded ones plus the gradients it
    writes beyond them, one buffer keyed by its size (300 - 170 = 130 B), so two ops writing 130 B of gradients
    share one buffer's lines. The engine's accumulation of a 768 x 256 fp32 gradient: 2 x 786,432 B, keyed by size."""
    op = _op([("k1", 100), ("k2", 50)], [("k3", 20)])
    assert reuse._touched(op, 170.0, "fwd", 7) == {"k1": 100, "k2": 50, "k3": 20}
    assert reuse._touched(op, 85.0, "fwd", 7) == {"k1": 50, "k2": 25, "k3": 10}
    assert reuse._touched(_op([], []), 64.0, "fwd", 7) == {("op", 7): 64.0}
    assert reuse._touched(op, 300.0, "bwd", 7) == {"k1": 100, "k2": 50, "k3": 20, ("grad", 130.0): 130.0}
    assert reuse._touched(_op([], []), 64.0, "bwd", 7) == {("grad", 64.0): 64.0}
    g = TensorMeta((768, 256), 4, False, True, 768 * 256)
    acc = _op([], [], grad_accumulate=True, out=g)
    assert reuse._touched(acc, 3 * 786_432.0, "bwd", 7) == {("accumulate", 1_572_864.0): 1_572_864.0}


def test_a_native_rnn_loop_stays_in_l2():
    """nn.RNN(32 -> 96, tanh), batch 4 x 64 steps, fp32. Its distinct data, by hand: the input 4*64*32*4 = 32 KiB,
    W_ih 12 KiB, W_hh 36 KiB, the biases 0.75 KiB, the input projection 4*64*96*4 = 96 KiB, per step the recurrent
    product's and the tanh's outputs (1.5 KiB each: 192 KiB over 64 steps), the stacked output 96 KiB: ~0.5 MiB,
    and the backward's gradients are recycled buffers, one per size (<= 96 KiB each; ~0.9 MiB in all). So in a 2 MiB
    L2 nothing the step touched is evicted before its next touch (the first touches of the batch and the weights,
    a step ago, stay far by the step-ago rule),
    though its kernels move more than 2 MiB (each step's backward re-reads W_hh and writes a 36 KiB weight
    gradient: 64 x ~150 KiB): counted as traffic, every backward product read its saved state as evicted and was
    priced at the cold curve's small end. A 32 KiB cache does evict (the shares are not all 0)."""
    torch.manual_seed(0)
    model, x = torch.nn.RNN(32, 96, batch_first=True), torch.rand(4, 64, 32, requires_grad=True)
    trace = trace_model(model, (x,))
    ops = _op_table(trace, False)
    assert ops["bytes_fwd"].sum() + ops["bytes_bwd"].sum() > 2 * 2 ** 20
    fwd, bwd, fresh = reuse.all_cold_shares(trace, ops, 2 * 2 ** 20)
    assert bwd.sum() == 0
    # the forward's first touches (the batch, the weights: last touched a step ago, with the untraced loss and
    # optimizer between) stay far, as the step's traffic exceeds the L2; the first recurrent product reads W_hh and
    # b_hh first, every later one finds them hot
    addmm = (ops["name"] == "addmm").to_numpy()
    assert addmm.sum() == 64
    assert fwd[addmm][0] > 0 and list(fwd[addmm][1:]) == [0.0] * 63
    _, small, _ = reuse.all_cold_shares(trace, ops, 32 * 1024)
    assert small[addmm].max() > 0


def test_recurrent_products_keep_their_weight_hot_in_a_small_cache():
    """The same layer with a 64 KiB cache: each step's recurrent product re-reads W_hh (36 KiB) one step after the
    previous one, with only that step's ops in between, which touch 1.5 KiB states and a 1.5 KiB row of the input
    projection (a view: its recorded bytes): a few KiB of distinct data, so every product after the first finds
    W_hh and its input hot (as traffic the step's product alone moved ~40 KiB, the backward's ~80 KiB)."""
    torch.manual_seed(0)
    model, x = torch.nn.RNN(32, 96, batch_first=True), torch.rand(4, 64, 32, requires_grad=True)
    trace = trace_model(model, (x,))
    ops = _op_table(trace, False)
    fwd, _, _ = reuse.all_cold_shares(trace, ops, 64 * 1024)
    addmm = (ops["name"] == "addmm").to_numpy()
    assert list(fwd[addmm][1:]) == pytest.approx([0.0] * 63)
