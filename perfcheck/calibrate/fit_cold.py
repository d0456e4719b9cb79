"""The round-robin fits of ``perfcheck calibrate``'s per-op cold costs: what an op pays for running among other ops
rather than in a tight loop (``op_cold_s``, near, light), after the L3 was evicted (``op_cold_far_s``), and how long
data stays in a shared L3 (``l3_residency_s``). Each reads its ``opcold`` rows against the ``opfixed`` tight loops;
``fit_host.host_terms`` puts them in the host block.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate.fit_draft import fp32_rows, rows_of


#: Spec kinds whose op_cold_s is fitted from the round-robin after the cold filler (else from the tight one, the
#: after-filler row recorded beside it). GPU only: on the H100 VM the tight round-robin's 2.5-3.3 us per op was a
#: fifth of what LeNet's ops cost inside a step; on the project's CPU VM the after-filler fit (14.4 vs 6.7 us)
#: moved LeNet's step toward its measurement but JSC's and the held-out design set's away from theirs
#: (bench/results/gpu_host.md), so a CPU keeps the tight fit.
AFTER_FILLER_KINDS = ("gpu",)


def op_cold_excess(table, dtype: str = "fp32", after_filler: bool = True) -> Optional[tuple]:
    """``(op_cold_s, ops, round-robin s per op, tight-loop s per op)`` from the ``opcold`` case (the tiny
    ops called one after another, seconds per op) and the ``opfixed`` cases of the same ops (each in its own
    tight loop): the round-robin's time per op less the tight loops' mean, floored at 0 (a negative excess
    is noise: an op cannot run faster for following another). None without both. ``dtype``: the cases of
    that dtype (fp32: also untyped rows of older tables).

    Which round-robin: with ``after_filler`` the one timed after the cold filler (``case_names.AFTER_FILLER``) where the
    table has it, else the tight one (tables before it; ``AFTER_FILLER_KINDS``: which specs use which).
    Derivation: a step's op i costs its tight-loop price p_i plus what it pays for running among other code, c; the host model adds c once per op whose family differs from
    the op before (``perfcheck.predict.host.op_switches``: in a step nearly every op). A step's forward runs
    right after the previous step's backward and optimizer step, so its ops find the host's caches and
    predictors holding that code: the round-robin after the filler (a forward and backward of other layers)
    is per op (1/N) sum (p_i + c) = mean(p) + c, hence c = round-robin-after-filler per op - mean(p). The tight
    round-robin (the N ops again a moment after their last call) measures only the ops evicting each other,
    a lower bound of c (on the H100 VM: 2.5-3.3 us per op where a LeNet forward inside a step cost ~14 us per
    op more than in a forward-only loop). NB: averaged over the N ops, the first ones after the filler pay
    more than the last: c is a per-op mean."""
    rr, fixed = rows_of(table, names.OPCOLD), rows_of(table, names.OPFIXED)
    if dtype == "fp32":
        rr, fixed = rr[fp32_rows(rr)], fixed[fp32_rows(fixed)]
    else:
        rr, fixed = rr[rr["dtype"] == dtype], fixed[fixed["dtype"] == dtype]
    if not len(rr) or not len(fixed):
        return None
    rr = rr[~rr["label"].astype(str).str.startswith(names.NEAR)]  # the light round-robin: op_cold_near_excess
    rr = rr[~rr["label"].astype(str).str.startswith((names.LIGHT, names.LIGHT_TIGHT))]  # op_cold_light_excess
    rr = rr[~rr["label"].astype(str).str.startswith((names.FAR, names.RESIDENCY))]  # op_cold_far_excess, l3_residency
    after = rr[rr["label"].astype(str).str.startswith(names.AFTER_FILLER)]
    tight_rr = rr[~rr["label"].astype(str).str.startswith(names.AFTER_FILLER)]
    if not len(tight_rr) and not len(after):
        return None
    r = (after if (after_filler and len(after)) or not len(tight_rr) else tight_rr).iloc[0]
    n = names.count_of(r["label"])
    if n != len(fixed):  # not the same set of ops (a table from another version): no matched subtraction
        return None
    tight = float(fixed["seconds"].mean())
    return max(float(r["seconds"]) - tight, 0.0), n, float(r["seconds"]), tight


def op_cold_near_excess(table) -> Optional[tuple]:
    """``(op_cold_near_s, ops, round-robin s per op, tight-loop s per op)`` from the fp32 ``round-robin near`` case
    (op_cases.op_cold_near_cases: the op_fixed tiny ops less ``case_names.NEAR_LEFT_OUT``, one after another) and the same
    ops' op_fixed tight loops: the round-robin's time per op less their mean, floored at 0, as op_cold_excess.
    None without both or when the row's op count is not the light ops' (a table from another version)."""
    rr, fixed = rows_of(table, names.OPCOLD), rows_of(table, names.OPFIXED)
    rr, fixed = rr[fp32_rows(rr)], fixed[fp32_rows(fixed)]
    rr = rr[rr["label"].astype(str).str.startswith(names.NEAR)]
    fixed = fixed[~fixed["label"].astype(str).isin(names.NEAR_LEFT_OUT)]
    if not len(rr) or not len(fixed) or names.count_of(rr.iloc[0]["label"]) != len(fixed):
        return None
    per_op, tight = float(rr.iloc[0]["seconds"]), float(fixed["seconds"].mean())
    return max(per_op - tight, 0.0), len(fixed), per_op, tight


def op_cold_far_excess(table) -> Optional[tuple]:
    """``(op_cold_far_s, ops, round-robin s per op, tight-loop s per op, L3 bytes)`` from the fp32 ``round-robin far``
    case (op_cases.op_cold_far_cases: the op_fixed tiny ops one after another, each round after an L3 eviction and a
    re-warm of the shared path) and the same ops' op_fixed tight loops: the round-robin's time per op less their
    mean, floored at 0, as op_cold_excess. None without both or when the op counts differ."""
    rr, fixed = rows_of(table, names.OPCOLD), rows_of(table, names.OPFIXED)
    rr, fixed = rr[fp32_rows(rr)], fixed[fp32_rows(fixed)]
    rr = rr[rr["label"].astype(str).str.startswith(names.FAR)]
    if not len(rr) or not len(fixed) or names.count_of(rr.iloc[0]["label"]) != len(fixed):
        return None
    per_op, tight = float(rr.iloc[0]["seconds"]), float(fixed["seconds"].mean())
    return max(per_op - tight, 0.0), len(fixed), per_op, tight, int(rr.iloc[0]["m"])


def step_start_excess(table) -> Optional[tuple]:
    """``(step_start_s, module call s, bare op s)`` from the step-start pair (op_cases.step_start_cases): the tiny
    module's call after a step of other code and an L3 eviction less its bare op after the eviction alone, floored at
    0. None without both rows."""
    rr = rows_of(table, names.OPCOLD)
    labels = rr["label"].astype(str)
    module, op = rr[labels == names.STEP_START], rr[labels == names.STEP_START_OP]
    if not len(module) or not len(op):
        return None
    m, o = float(module["seconds"].iloc[0]), float(op["seconds"].iloc[0])
    return max(m - o, 0.0), m, o


def l3_residency(table) -> Optional[tuple]:
    """``(l3_residency_s, hot s, evicted s, ((sleep s, read s), ...))`` from the ``l3 residency`` cases
    (op_cases.l3_residency_cases): the sleep after which a re-read has lost half of what an eviction costs,
    interpolated in log(sleep) between the measured sleeps (the fraction lost f = (read - hot) / (evicted - hot),
    clipped to [0, 1]; before the first sleep f is taken as 0 at a tenth of it). The first sleep where f is already
    >= 0.5 at it and nothing is measured before: that sleep (the conservative side: longer). None without the rows,
    where an eviction costs nothing measurable (evicted <= hot), or where no sleep lost half (data stays: no decay)."""
    rr = rows_of(table, names.OPCOLD)
    rr = rr[rr["label"].astype(str).str.startswith(names.RESIDENCY)]
    labels = rr["label"].astype(str)
    hot, evicted = rr[labels == names.residency_label(0)], rr[labels == names.residency_label(-1)]
    waits = rr[~labels.isin([names.residency_label(0), names.residency_label(-1)])].sort_values("n")
    if not len(hot) or not len(evicted) or not len(waits):
        return None
    h, e = float(hot["seconds"].iloc[0]), float(evicted["seconds"].iloc[0])
    if e <= h:
        return None
    w = waits["n"].to_numpy(float) * 1e-6
    f = np.clip((waits["seconds"].to_numpy(float) - h) / (e - h), 0.0, 1.0)
    points = tuple(zip(w.tolist(), waits["seconds"].to_numpy(float).tolist()))
    if f.max() < 0.5:
        return None
    xs, ys = np.log(np.r_[w[0] / 10, w]), np.r_[0.0, f]
    i = int(np.argmax(ys >= 0.5))
    tau = float(np.exp(xs[i - 1] + (0.5 - ys[i - 1]) * (xs[i] - xs[i - 1]) / max(ys[i] - ys[i - 1], 1e-12)))
    return tau, h, e, points


def op_cold_light_excess(table) -> Optional[tuple]:
    """``(op_cold_light_s, ops, round-robin s per op, tight s per op)`` from the fp32 ``round-robin light`` and
    ``light tight`` cases of one op count (op_cases.op_cold_light_cases): the first less the second, floored at 0.

    Derivation: the round-robin's op i costs p_i + c (c: what a switch within a light cycle costs), the tight
    runs' p_i + c / R (one switch per R = LIGHT_TIGHT_RUN calls); per op over the N families, round-robin - tight =
    c (1 - 1/R), and c = (round-robin - tight) / (1 - 1/R). None without both rows."""
    rr = rows_of(table, names.OPCOLD)
    rr = rr[fp32_rows(rr)]
    labels = rr["label"].astype(str)
    cyc, tight = rr[labels.str.startswith(names.LIGHT)], rr[labels.str.startswith(names.LIGHT_TIGHT)]
    if not len(cyc) or not len(tight):
        return None
    n = names.count_of(cyc.iloc[0]["label"])
    if n != names.count_of(tight.iloc[0]["label"]):
        return None
    per_op, t = float(cyc.iloc[0]["seconds"]), float(tight.iloc[0]["seconds"])
    return max(per_op - t, 0.0) / (1.0 - 1.0 / names.LIGHT_TIGHT_RUN), n, per_op, t
