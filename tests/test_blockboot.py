"""The block bootstrap (pipeline/blockboot.py) against brute force: replicates built by repeating
each block's values as often as it was drawn, and numpy's percentile and mean over them."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from pipeline import blockboot as bb


def _blocked(xs: np.ndarray, block: np.ndarray, m: int) -> bb.Blocked:
    """Values with their blocks, sorted as ``pipeline.compare.blocked_values`` returns them."""
    order = np.argsort(xs, kind="stable")
    return bb.Blocked(np.asarray(xs, dtype=float)[order], np.asarray(block, dtype=np.int16)[order], m)


def _by_time(t: np.ndarray, width_s: float, m: int) -> np.ndarray:
    return np.clip(np.floor(t / width_s), 0, m - 1)


def _brute(v: bb.Blocked, w: np.ndarray, pct: float | None) -> np.ndarray:
    out = []
    for wr in w:
        sample = np.repeat(v.xs, wr[v.block].astype(int))
        out.append(np.nan if not len(sample) else sample.mean() if pct is None else np.percentile(sample, pct))
    return np.array(out)


@pytest.mark.parametrize(
    "n, m, decimals",
    [(1, 3, 2), (9, 4, 2), (50, 7, 1), (600, 20, 3), (3000, 40, None), (20_000, 100, 2)],
)
def test_replicates_equal_brute_force(n, m, decimals):
    """Exact whenever the replicates' bracket of ranks fits the grid (ties and empty blocks too)."""
    rng = np.random.default_rng(n)
    xs = rng.lognormal(size=n)
    xs = xs if decimals is None else xs.round(decimals)  # rounding makes ties
    t = rng.uniform(0, 100, n)
    v = _blocked(xs, _by_time(t, 100 / m, m), m)
    assert np.array_equal(np.sort(xs), v.xs) and v.counts.sum() == n
    w = bb.weights(m, 200, rng)
    pcts = [0, 37, 50, 90, 99, 99.9, 100]
    for pct, got in zip(pcts, bb.percentile_replicates(v, w, pcts), strict=True):
        np.testing.assert_allclose(got, _brute(v, w, pct), rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(bb.mean_replicates(v, w), _brute(v, w, None), rtol=1e-12, equal_nan=True)


def test_wide_brackets_are_placed_within_a_grid_step():
    """Few blocks of many distinct values: the replicates' ranks span more than the grid, and each
    replicate is placed between two grid ranks; the error is a small part of the replicates' spread."""
    rng = np.random.default_rng(3)
    n, m = 200_000, 8
    t = np.sort(rng.uniform(0, 80, n))
    xs = rng.lognormal(size=n) * (1 + np.floor(t / 10) / 4)  # each block its own level: wide spread
    v = _blocked(xs, _by_time(t, 10.0, m), m)
    w = bb.weights(m, 60, rng)
    for pct, got in zip((50, 99), bb.percentile_replicates(v, w, [50, 99]), strict=True):
        want = _brute(v, w, pct)
        assert np.max(np.abs(got - want)) < 0.01 * (want.max() - want.min())


def test_one_value_per_block_is_the_classic_bootstrap():
    """With a block per value the block bootstrap is the bootstrap of independent values: its
    replicates follow the distribution of percentiles of samples drawn with replacement."""
    rng = np.random.default_rng(7)
    n = 300
    xs = rng.gamma(2.0, 10.0, n)
    v = _blocked(xs, np.arange(n), n)
    assert sorted(v.block.tolist()) == list(range(n))
    got = bb.percentile_replicates(v, bb.weights(n, 20_000, rng), [90])[0]
    brute = np.percentile(np.sort(xs)[rng.integers(0, n, (20_000, n))], 90, axis=1)
    spread = np.percentile(brute, 97.5) - np.percentile(brute, 2.5)
    for q in (2.5, 25, 50, 75, 97.5):
        assert np.percentile(got, q) == pytest.approx(np.percentile(brute, q), abs=0.03 * spread)
    assert stats.ks_2samp(got.round(9), brute.round(9)).statistic < 0.03


def test_weights_draw_m_blocks():
    w = bb.weights(7, 5000, np.random.default_rng(1))
    assert w.shape == (5000, 7) and (w.sum(axis=1) == 7).all()
    assert w.mean(axis=0) == pytest.approx(np.ones(7), abs=0.06)


def test_block_rule():
    r = bb.BlockRule()
    assert r.blocks(1000.0, 2.0)[0] == 100  # 125 wanted
    assert r.blocks(200.0, 2.0)[0] == 25
    assert r.blocks(30.0, 2.0)[0] == 10  # 4 wanted: held to the fewest
    assert r.blocks(30.0, None) == (20, "no request records: a fixed count")
    assert r.blocks(0.0, 2.0)[0] == 10
    assert "4 x the mean residence time 2 s" in r.blocks(200.0, 2.0)[1]
    # p99 of 1000 values has 10 beyond it; of 999, 9.99
    assert not r.tail_too_thin(1000, 99) and r.tail_too_thin(999, 99) and r.tail_too_thin(9999, 99.9)
    # exactly min_tail beyond: judged, whatever floating point makes of 1 - p/100 (100 * 0.1 was 9.99...)
    assert not r.tail_too_thin(100, 90) and not r.tail_too_thin(10_000, 99.9) and not r.tail_too_thin(1000, 99)
    assert r.tail_too_thin(99, 90) and r.tail_too_thin(1999, 99.5)


def test_intervals_widen_for_few_blocks():
    """Hesterberg's expanded percentile interval: Student t on m - 1 degrees of freedom and the
    (m - 1) / m variance of resampled blocks move the ends' quantile levels outwards (at 99%, from
    0.5% to about 0.14% for 18 blocks; hardly at all for 10 000)."""
    assert bb.tail_level(18, 0.99) == pytest.approx(stats.norm.cdf(-np.sqrt(18 / 17) * 2.8982305), rel=1e-6)
    assert 0.0013 < bb.tail_level(18, 0.99) < 0.0015
    assert bb.tail_level(10_000, 0.99) == pytest.approx(0.005, rel=0.01) and bb.tail_level(1, 0.99) == pytest.approx(
        0.005
    )
    reps = np.concatenate([np.random.default_rng(0).gamma(2.0, 1.0, 4000), [np.nan]])
    a = bb.tail_level(18, 0.9)
    assert bb.interval(reps, 0.9, 18) == pytest.approx(tuple(np.quantile(reps[:-1], [a, 1 - a])))
    assert bb.interval(reps, 0.9, 18)[1] > np.quantile(reps[:-1], 0.95)
    # the difference and the ratio of the same replicates agree on the sign of each end
    rb, rc = np.random.default_rng(1).gamma(2.0, 1.0, (2, 2000))
    for (dl, dh), (ql, qh) in [
        (bb.interval(rc - rb, 0.99, m), bb.interval(rc / rb - 1, 0.99, m)) for m in (10, 18, 60)
    ]:
        assert np.sign(dl) == np.sign(ql) and np.sign(dh) == np.sign(qh)
    assert bb.interval(np.array([np.nan]), 0.9, 18) is None
