"""Confidence intervals of the robust fit against Monte Carlo truth, small and large runs.

The spread of the estimate is measured by refitting many simulated data sets (numpy only);
the intervals must match it (bootstrap up to BOOTSTRAP_MAX_N steps, sandwich above) and,
with the systematic allowance, cover the true parameters on large runs too.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.fit import fit_run, get_or_fit
from pipeline.fit import model as M
from pipeline.fit.run import FIT_VERSION

TRUTH = {"t0_ms": 5.0, "a_ms_per_ctx": 2e-4, "b_ms_per_prefill": 0.02, "c_ms_per_decode": 0.01}
NAMES = list(TRUTH)


def _data(n, seed, sigma=0.03, stalls=0.0):
    """Steps of a memory-bound model with mean-1 log-normal noise and exponential stalls."""
    rng = np.random.default_rng(seed)
    ctx = rng.integers(1_000, 200_000, n).astype(float)
    pf = np.where(rng.random(n) < 0.3, rng.integers(1, 2048, n), 0).astype(float)
    dec = rng.integers(1, 128, n).astype(float)
    y = TRUTH["t0_ms"] + TRUTH["a_ms_per_ctx"] * ctx + TRUTH["b_ms_per_prefill"] * pf + TRUTH["c_ms_per_decode"] * dec
    y = y * np.exp(rng.normal(0, sigma, n) - sigma**2 / 2)
    hit = rng.random(n) < stalls
    y[hit] += rng.exponential(50.0, hit.sum())
    return {"context_tokens": ctx, "prefill_tokens": pf, "decode_tokens": dec}, y


def _solve(cols, y):
    X = M._design(cols, ["a_ms_per_ctx", "b_ms_per_prefill", "c_ms_per_decode"], len(y))
    return M._robust_solve(X, y)


def test_sandwich_standard_errors_match_monte_carlo_spread():
    est, se = [], []
    for seed in range(40):
        sol = _solve(*_data(30_000, 100 + seed))
        est.append(sol.beta)
        se.append(np.sqrt(np.diag(M._sandwich(sol))))
    ratio = np.std(est, axis=0, ddof=1) / np.mean(se, axis=0)
    # 40 replicates estimate a standard deviation to about +-11%
    assert np.all((ratio > 0.75) & (ratio < 1.3)), ratio


@pytest.mark.slow  # 60 data sets of 200 refits each: half a minute; the sandwich's check stays in the default run
def test_one_step_bootstrap_matches_monte_carlo_spread():
    est, width = [], []
    for seed in range(60):
        cols, y = _data(1500, 200 + seed, stalls=0.02)
        f = M.fit_linear(cols, y, n_boot=200, seed=seed)
        assert f.ci_method.startswith("bootstrap")
        est.append([f.coef[k] for k in NAMES])
        width.append([f.ci[k][1] - f.ci[k][0] for k in NAMES])
    ratio = np.mean(width, axis=0) / (2 * 1.96 * np.std(est, axis=0, ddof=1))
    # the bootstrap with the robust weights held fixed was at 0.7-0.75 here
    assert np.all((ratio > 0.85) & (ratio < 1.3)), ratio


@pytest.mark.long
def test_bootstrap_and_sandwich_agree_at_the_switch():
    cols, y = _data(M.BOOTSTRAP_MAX_N + 1, 5, stalls=0.01)
    big = M.fit_linear(cols, y, n_boot=400)
    small = M.fit_linear({k: v[:-1] for k, v in cols.items()}, y[:-1], n_boot=400)
    assert big.ci_method.startswith("sandwich") and small.ci_method.startswith("bootstrap")
    for k in NAMES:
        w_big, w_small = np.diff(big.ci[k])[0], np.diff(small.ci[k])[0]
        assert w_big == pytest.approx(w_small, rel=0.15), k


@pytest.mark.slow  # 30 fits of 40k steps
def test_large_run_intervals_cover_the_truth_with_stalls():
    """Without the systematic allowance the context slope's interval missed the truth in 23 of these 30."""
    hits, bias, allowance = np.zeros(4), [], []
    reps = 30
    for seed in range(reps):
        cols, y = _data(40_000, 300 + seed, stalls=0.02)
        f = M.fit_linear(cols, y)
        assert f.ci_method.startswith("sandwich")
        hits += [f.ci[k][0] <= TRUTH[k] <= f.ci[k][1] for k in NAMES]
        bias.append([f.coef[k] / TRUTH[k] - 1 for k in NAMES])
        allowance.append(f.ci_systematic_rel)
    assert np.all(hits / reps >= 0.85), hits / reps
    # the allowance bounds the estimator's own offset (2% stalls of 50 ms, 3% noise: ~0.05-0.1%)
    mean_bias = np.mean(bias, axis=0)[:3]
    assert np.all(np.abs(mean_bias) <= np.mean(allowance)), (mean_bias, np.mean(allowance))
    assert 0.0005 < np.mean(allowance) < 0.003


@pytest.mark.slow  # many simulated fits; CI runs it with -m slow (the default run stays near 5 minutes)
def test_flagged_stalls_do_not_pull_the_estimate():
    """5% of steps stalled: the stalls' one-sided pull put every coefficient ~0.25% high.

    That was over half the interval's half-width on runs of 14k steps, and the intervals
    covered the truth only 88-90% of the time (benchmarks/bench_coverage.py). The flagged
    stalls are now left out of the final fit: the offset is gone, pooled over seeds.
    """
    off, half = [], []
    for seed in range(12):
        cols, y = _data(8_000, 400 + seed, stalls=0.05)
        f = M.fit_linear(cols, y, n_boot=50, seed=seed)
        off.append([f.coef[k] / TRUTH[k] - 1 for k in NAMES[:3]])
        half.append([(f.ci[k][1] - f.ci[k][0]) / 2 / TRUTH[k] for k in NAMES[:3]])
    # in units of the intervals' half-width: was 0.5-0.8 for t0, a, b; the mean of 12 is good to ~0.15
    ratio = np.mean(off, axis=0) / np.mean(half, axis=0)
    assert np.all(np.abs(ratio) < 0.3), ratio
    # one big run, where the offset is many standard errors (~0.05%): t0, a, b within 0.1% (were
    # 0.33%, 0.23% and 0.18% high; now +0.04%, -0.05%, -0.07%: the noise's skew, sigma^2 / 2 = 0.045%)
    cols, y = _data(200_000, 9, stalls=0.05)
    f = M.fit_linear(cols, y)
    for k in NAMES[:3]:
        assert f.coef[k] == pytest.approx(TRUTH[k], rel=1e-3), k
        assert f.ci[k][0] <= TRUTH[k] <= f.ci[k][1], (k, f.coef[k], f.ci[k])
    # the stalls are still flagged: counted against the refitted line
    assert f.n_outliers == pytest.approx(0.05 * len(y), rel=0.1)


@pytest.mark.slow
def test_million_step_fit_covers_the_truth():
    cols, y = _data(1_000_000, 7, stalls=0.005)
    f = M.fit_linear(cols, y)
    for k in NAMES:
        assert f.ci[k][0] <= TRUTH[k] <= f.ci[k][1], (k, f.coef[k], f.ci[k])
        assert f.coef[k] == pytest.approx(TRUTH[k], rel=0.01)


def test_newton_solution_matches_scipy_least_squares():
    from scipy.optimize import least_squares

    cols, y = _data(3000, 11, stalls=0.03)
    X = M._design(cols, ["a_ms_per_ctx", "b_ms_per_prefill", "c_ms_per_decode"], len(y))
    colscale = np.abs(X).max(axis=0)
    A = X / colscale / (X @ np.array(list(TRUTH.values())))[:, None]
    t = y / (X @ np.array(list(TRUTH.values())))
    start = np.linalg.lstsq(A, t, rcond=None)[0]
    # a copy: older scipy scales the returned Jacobian in place
    ref = least_squares(
        lambda b: A @ b - t,
        start,
        jac=lambda b: A.copy(),
        loss="soft_l1",
        f_scale=0.03,
        ftol=1e-15,
        xtol=1e-15,
        gtol=1e-15,
    ).x
    np.testing.assert_allclose(M._soft_l1_newton(A, t, 0.03, start), ref, rtol=1e-8)


@pytest.mark.long
def test_stale_stored_fit_is_refitted(incident_run):
    con, run = incident_run.con, incident_run.run_id
    fresh = get_or_fit(con, run)
    # a fit stored by an older version (v1 had no log_center): never read, refitted
    con.execute(
        "update fits set fit_version = ?, numbers = ? where run_id = ?",
        [FIT_VERSION - 1, json.dumps({"coef": {"t0_ms": 1.0}}), run],
    )
    try:
        again = get_or_fit(con, run)
        assert again.t0_ms == fresh.t0_ms and again.ci == fresh.ci
        rows = con.execute("select fit_version from fits where run_id = ?", [run]).fetchall()
        assert rows == [(FIT_VERSION,)]
    finally:  # the run is the session's: leave it with the fit its fixture stored (50 draws, not 200)
        fit_run(con, run, n_boot=50)
