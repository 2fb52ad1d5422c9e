"""E-divisive means on synthetic nightly histories: the statistic against its definition,
and the detector's power and false-alarm rate on series with known truth."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from pipeline.nightly.changepoint import Settings, detect, split_statistics

NIGHTS, STEP_AT = 30, 19  # night 20 of 30 (index 19: its first night)
SIGMA = 0.04  # night-to-night noise of a latency percentile: log-normal, 4%


def _noise(i: int, sigma: float = SIGMA) -> np.ndarray:
    return 100 * np.exp(np.random.default_rng(7_000 + i).normal(0, sigma, NIGHTS))


def _q_by_definition(x: np.ndarray, t: int, exponent: float) -> float:
    left, right = x[:t], x[t:]
    m, k = len(left), len(right)
    cross = np.mean([abs(a - b) ** exponent for a in left for b in right])
    within_l = np.mean([abs(a - b) ** exponent for a, b in combinations(left, 2)])
    within_r = np.mean([abs(a - b) ** exponent for a, b in combinations(right, 2)])
    return m * k / (m + k) * (2 * cross - within_l - within_r)


@pytest.mark.parametrize("exponent", [1.0, 0.5, 1.7])
def test_statistic_matches_definition(exponent):
    x = np.random.default_rng(3).standard_t(3, size=14)
    q = split_statistics(x, min_size=2, exponent=exponent)
    for t in range(2, 13):  # the best right end kappa for each split, by brute force
        best = max(_q_by_definition(x[:k], t, exponent) for k in range(t + 2, 15))
        assert q[t] == pytest.approx(best, rel=1e-9)
    assert np.isneginf(q[[0, 1, 13, 14]]).all()  # fewer than min_size on one side


def test_batched_statistic_equals_one_by_one():
    xs = np.random.default_rng(4).normal(size=(5, 11))
    batched = split_statistics(xs, 3)
    for row, x in zip(batched, xs):
        np.testing.assert_allclose(row, split_statistics(x, 3))


def test_step_of_15_percent_at_night_20_is_located():
    found = 0
    for i in range(20):
        x = _noise(i) * np.where(np.arange(NIGHTS) >= STEP_AT, 1.15, 1.0)
        cps = detect(x, Settings(seed=i))
        found += any(abs(c.index - STEP_AT) <= 1 for c in cps)
    assert found >= 19  # at least 95% of 20 histories


def test_slow_drift_of_one_percent_per_night_is_found():
    found = sum(bool(detect(_noise(i) * 1.01 ** np.arange(NIGHTS), Settings(seed=i))) for i in range(20))
    assert found >= 19


def test_noise_only_histories_rarely_raise_a_change():
    false = sum(bool(detect(_noise(100 + i), Settings(seed=i))) for i in range(200))
    assert false <= 10  # at most 5% of 200 quiet histories (measured: docs/nightly.md)


def test_a_bump_that_recovered_is_found():
    # a regression fixed eight nights later: both ends found (the right end kappa is searched)
    x = _noise(3, 0.03) * np.where((np.arange(NIGHTS) >= 8) & (np.arange(NIGHTS) < 16), 1.3, 1.0)
    assert [c.index for c in detect(x)] == [8, 16]


def test_two_changes_are_both_found():
    x = _noise(1, 0.02) * np.r_[np.ones(10), 1.3 * np.ones(10), 0.9 * np.ones(10)]
    assert [c.index for c in detect(x)] == [10, 20]


def test_reproducible_and_valid_p_values():
    x = _noise(2) * np.where(np.arange(NIGHTS) >= 12, 1.2, 1.0)
    s = Settings(seed=11, permutations=499)
    a, b = detect(x, s), detect(x, s)
    assert a == b and a
    assert all(1 / 500 <= c.p_value <= s.significance for c in a)


def test_nothing_to_find():
    assert detect(np.full(30, 5.0)) == []  # constant: every statistic is 0
    assert detect([1.0, 2.0, 3.0, 10.0, 11.0]) == []  # shorter than two segments of min_size
    assert detect([1.0, np.nan] * 10) == []


def test_settings_are_checked():
    with pytest.raises(ValueError):
        Settings(significance=0)
    with pytest.raises(ValueError):
        Settings(exponent=2.0)
