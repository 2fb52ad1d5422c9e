"""Scoring stall detection against a simulated truth: the oracle bound and the plain counts."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, stats

from pipeline.sim.model import NoiseModel
from pipeline.sim.scoring import best_recall_at_fdr, oracle_recall, score_stalls, stall_log_odds


def test_log_odds_match_direct_integration():
    # independent: scipy's log-normal and exponential densities, convolved with quad
    noise = NoiseModel(sigma=0.05, stall_rate=0.03, stall_ms_mean=20.0)
    base = np.array([10.0, 10.0, 40.0, 40.0, 80.0])
    y = np.array([10.2, 13.0, 41.0, 55.0, 120.0])
    lognorm = stats.lognorm(s=noise.sigma, scale=np.exp(-0.5 * noise.sigma**2))
    expon = stats.expon(scale=noise.stall_ms_mean)
    want = []
    for b, t in zip(base, y):
        p0 = lognorm.pdf(t / b) / b
        p1 = integrate.quad(lambda s: expon.pdf(s) * lognorm.pdf((t - s) / b) / b, 0, t, points=[t - b], limit=200)[0]
        want.append(np.log(noise.stall_rate * p1) - np.log((1 - noise.stall_rate) * p0))
    np.testing.assert_allclose(stall_log_odds(y, base, noise), want, rtol=1e-4, atol=1e-4)


def test_best_recall_at_fdr_by_hand():
    score = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    stalled = np.array([True, False, True, True, False])
    # prefixes: 1 (0 false of 1), 2 (1 of 2), 3 (1 of 3), 4 (1 of 4), 5 (2 of 5)
    assert best_recall_at_fdr(score, stalled, 0.25) == 1.0
    assert best_recall_at_fdr(score, stalled, 0.2) == pytest.approx(1 / 3)
    assert best_recall_at_fdr(-score, stalled, 0.0) == 0.0  # the top step is not a stall: nothing qualifies


@pytest.mark.long
def test_oracle_finds_stalls_far_above_noise_and_misses_those_inside_it():
    rng = np.random.default_rng(0)
    n = 20_000
    base = rng.uniform(10, 60, n)
    factor = np.exp(rng.normal(-0.5 * 0.03**2, 0.03, n))
    stalled = rng.random(n) < 0.02
    # stalls of ~200 ms on 10-60 ms steps: all visible
    big = NoiseModel(sigma=0.03, stall_rate=0.02, stall_ms_mean=200.0)
    s_big = np.where(stalled, 50 + rng.exponential(150, n), 0.0)
    assert oracle_recall(base * factor + s_big, base, stalled, big) > 0.999
    # 0.05 ms stalls inside 0.3-1.8 ms of noise: hardly any visible
    tiny = NoiseModel(sigma=0.03, stall_rate=0.02, stall_ms_mean=0.05)
    s_tiny = np.where(stalled, rng.exponential(0.05, n), 0.0)
    assert oracle_recall(base * factor + s_tiny, base, stalled, tiny) < 0.05
    assert (
        oracle_recall(base * factor + s_big, base, stalled, NoiseModel(sigma=0.0, stall_rate=0.02, stall_ms_mean=200.0))
        == 1.0
    )


def test_score_stalls_by_hand():
    stall_ms = np.array([0.0, 5.0, 0.0, 0.5, 40.0, 0.0])
    flagged = np.array([False, True, True, False, True, False])
    s = score_stalls(flagged, stall_ms, limit_ms=1.0)
    assert s["stalls"] == 3 and s["flagged"] == 3
    assert s["recall"] == pytest.approx(2 / 3)
    assert s["fdr"] == pytest.approx(1 / 3)
    assert s["ms_recall"] == pytest.approx(45 / 45.5)
    assert s["recall_above_limit"] == 1.0  # the 0.5 ms stall is below the 1 ms limit
    assert score_stalls(np.zeros(6, bool), stall_ms)["fdr"] == 0.0


def test_log_odds_stay_finite_for_stalls_far_beyond_their_law():
    base = np.array([20.0, 20.0])
    y = np.array([20.0, 60.0])  # a normal step, and one 40 ms too long
    tiny = stall_log_odds(y, base, NoiseModel(sigma=0.03, stall_rate=0.02, stall_ms_mean=0.05))
    assert np.all(np.isfinite(tiny))  # 800 mean stall lengths: exp(-800) underflows outside log space
    usual = stall_log_odds(y, base, NoiseModel(sigma=0.03, stall_rate=0.02, stall_ms_mean=50.0))
    assert usual[1] > 10 > 0 > usual[0]
