"""The pipeline's closed form (``pipeline.flush_bubble_s``, v hand-offs per micro-batch and direction) against a replay
of Megatron-LM's own schedules: the order in which ``forward_backward_pipelining_with_interleaving`` (and, at v = 1,
``..._without_interleaving``) of megatron/schedules.py at 6985e589 (the SC21 scripts' commit, 2021-08) runs each
rank's forward and backward chunks and its blocking p2p calls (``batch_isend_irecv`` then wait: a call ends when
every peer has posted the matching op, plus one hand-off per message it sends or receives, whichever is more).

Independent of the formula: the replay knows only the code's loop (warm-up ``(p - rank - 1) * 2 + (v - 1) * p``
forward chunks, then one forward and one backward chunk per call, then the cool-down) and each chunk's time."""
from __future__ import annotations

import pytest

from perfcheck.predict import pipeline


def _chunk(k, p, v, forward):
    """get_model_chunk_id: the model chunk a rank runs at its k-th forward (backward) chunk step."""
    c = (k % (p * v)) // p
    return c if forward else v - c - 1


def _rank_program(r, p, v, m, time_of):
    """[('c', seconds, [tags it needs received]) or ('x', [tags it sends])] for rank r, in Megatron's order.
    A tag names one activation ('f', virtual stage, micro-batch) or gradient ('b', ...)."""
    total = m * v
    warm = total if m == p else min((p - r - 1) * 2 + (v - 1) * p, total)
    seen = {True: [0] * v, False: [0] * v}

    def step(k, forward):
        c = _chunk(k, p, v, forward)
        mb, g = seen[forward][c], c * p + r
        seen[forward][c] += 1
        if forward:
            need = [("f", g, mb)] if g > 0 else []
            send = [("f", g + 1, mb)] if g + 1 < p * v else []
        else:
            need = [("b", g, mb)] if g + 1 < p * v else []
            send = [("b", g - 1, mb)] if g > 0 else []
        return ("c", time_of(r, c, forward), need), send

    prog = []
    for k in range(warm):
        op, send = step(k, True)
        prog += [op, ("x", send)]
    for k in range(total - warm):
        (f, sf), (b, sb) = step(k + warm, True), step(k, False)
        prog += [f, b, ("x", sf + sb)]
    for k in range(total - warm, total):
        op, send = step(k, False)
        prog += [op, ("x", send)]
    return prog


def _calls(prog):
    """Each call's sends and receives: a chunk's input is received by the call before it (or a first receive)."""
    out, last, first = [], None, []
    for op in prog:
        if op[0] == "c":
            (last["recv"] if last is not None else first).extend(op[2])
            out.append(op)
        else:
            last = {"send": list(op[1]), "recv": []}
            out.append(("x", last))
    return ([("x", {"send": [], "recv": first})] if first else []) + out


def replay_flush_s(p, v, m, time_of, hand_off_s):
    """Seconds from the first chunk to the last rank's end of one flush of m micro-batches."""
    progs = [_calls(_rank_program(r, p, v, m, time_of)) for r in range(p)]
    now, at, posted = [0.0] * p, [0] * p, {}
    while any(at[r] < len(progs[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while at[r] < len(progs[r]):
                op = progs[r][at[r]]
                if op[0] == "c":
                    now[r] += op[1]
                    at[r] += 1
                    continue
                call = op[1]
                for tag in call["send"]:
                    posted.setdefault((tag, "send"), now[r])
                for tag in call["recv"]:
                    posted.setdefault((tag, "recv"), now[r])
                peers = [(t, "recv") for t in call["send"]] + [(t, "send") for t in call["recv"]]
                if not all(x in posted for x in peers):
                    break
                now[r] = max([now[r]] + [posted[x] for x in peers]) \
                    + hand_off_s * max(len(call["send"]), len(call["recv"]))
                at[r] += 1
                moved = True
        assert moved or all(at[r] >= len(progs[r]) for r in range(p)), "the replay deadlocked"
    return max(now)


@pytest.mark.parametrize("p, v, m", [(4, 1, 28), (4, 3, 28), (8, 2, 32), (16, 2, 144), (35, 3, 280), (8, 3, 8)])
@pytest.mark.parametrize("head", [0.0, 0.8])
def test_closed_form_equals_megatrons_schedule_replayed(p, v, m, head):
    """Every micro-batch's stage work is 4 s (forward 1, backward with recompute 3, split evenly over the v
    chunks); the last stage's last chunk adds the LM head and loss (``head`` s per micro-batch, a quarter in the
    forward). No hand-off time: the bubble alone."""
    def time_of(r, c, forward):
        extra = head * (0.25 if forward else 0.75) if (r == p - 1 and c == v - 1) else 0.0
        return (1.0 if forward else 3.0) / v + extra

    t_middle, t_last = 4.0, 4.0 + head
    closed = m * t_last + pipeline.flush_bubble_s(p, v, t_middle, t_middle)
    assert replay_flush_s(p, v, m, time_of, 0.0) == pytest.approx(closed, rel=1e-9)


@pytest.mark.parametrize("p, v, m", [(4, 3, 28), (8, 1, 32), (35, 3, 280)])
def test_hand_offs_cost_what_the_closed_form_charges_within_a_percent(p, v, m):
    """With blocking hand-offs of h s each, the closed form charges 2 v h per micro-batch in the stage time (so also
    in the bubble); the replay overlaps the first and last hand-offs of a flush with nothing, the closed form
    charges them as the steady state does: equal within 0.2% at these sizes (h = 5% of a chunk's forward)."""
    h = 0.05 / v

    def time_of(r, c, forward):
        return (1.0 if forward else 3.0) / v

    stage = 4.0 + 2 * pipeline.p2p_sends_per_micro_batch(p, v) * h
    closed = m * stage + pipeline.flush_bubble_s(p, v, stage, stage)
    assert replay_flush_s(p, v, m, time_of, h) == pytest.approx(closed, rel=2e-3)
