"""The comparison answers are rules over the per-step data (issue 11): a difference is claimed only when
the bootstrap interval of the ratio of medians excludes 1, with its numbers; otherwise 'within noise'."""
import numpy as np
import pandas as pd

from perfcheck.analysis import answers as A


def test_rule_on_planted_distributions():
    rng = np.random.default_rng(1)
    base = 0.010 * (1 + 0.3 * rng.standard_normal(12)).clip(0.3)   # 10 ms +-30 %
    slower = base * 2.0                                               # planted 2x
    same = 0.010 * (1 + 0.3 * rng.standard_normal(12)).clip(0.3)
    c = A.compare_samples(slower, base)
    assert c["verdict"] == "higher" and c["confidence"] == "clear" and c["lo"] > 1.1 and 1.5 < c["ratio"] < 2.6
    assert A.compare_samples(same, same * 1.01)["verdict"] == "within noise"
    assert A.compare_samples(base[:2], base)["verdict"] == "too few steps"
    assert A.compare_samples(base, slower)["verdict"] == "lower"
    text = A.describe("stage 3's forward", "stage 0's", A.compare_samples(slower, base))
    assert "stage 3's forward is" in text and "95%" in text and "n=12" in text


def test_forward_answer_follows_the_data():
    """Issue 11: the answer said 'stage 3's forward is the one that grows' even where stage 1's beat it."""
    rng = np.random.default_rng(2)

    def steps(ms):
        return pd.DataFrame({"fwd_s": ms * 1e-3 * (1 + 0.05 * rng.standard_normal(10)), "total_s": 1.0})

    s = pd.DataFrame({"stage": [0, 1, 3], "meas_fwd_s": [5e-3, 8.4e-3, 7.2e-3], "meas_fwd_comm_s": 0.0,
                      "pred_fwd_s": 1e-3, "meas_fwd_comm_bytes": 0.0}, index=[0, 1, 3])
    text = A._why_fwd(s, {0: steps(5.0), 1: steps(8.4), 3: steps(7.2)})
    assert "stage 1's forward is 1.6" in text and "stage 3's forward is 1.4" in text
    text = A._why_fwd(s, {0: steps(5.0), 1: steps(5.0), 3: steps(5.0)})
    assert "No stage's forward is measurably longer" in text and "within noise" in text
    assert "is the one that grows" not in text


def test_false_claims_and_missed_differences_are_rare(monkeypatch):
    """Over many draws: two samples of one distribution (lognormal, 30% spread, 12 steps each) are called
    different at most ~5% of the time (the 95% interval; 10% allowed for the bootstrap's small-n bias),
    and a planted 2x is found in at least 95% of draws (a 1.5x only in ~3 of 4 at 12 steps: the rule's
    power, which is why the sweep measures 12 steps per stage)."""
    monkeypatch.setattr(A, "BOOTSTRAP", 400)
    rng = np.random.default_rng(7)
    draw = lambda: np.exp(0.3 * rng.standard_normal(12))
    false = np.mean([A.compare_samples(draw(), draw())["verdict"] != "within noise" for _ in range(200)])
    found = np.mean([A.compare_samples(2.0 * draw(), draw())["verdict"] == "higher" for _ in range(100)])
    assert false <= 0.10 and found >= 0.95, (false, found)
