"""The robust fit on numpy arrays: exact recovery, robustness, intervals, and statements."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.fit.model import fit_linear, mad_scale


def _data(n=2000, seed=0, sigma=0.03, outliers=0.0):
    rng = np.random.default_rng(seed)
    ctx = rng.integers(1_000, 200_000, n).astype(float)
    pf = np.where(rng.random(n) < 0.3, rng.integers(1, 2048, n), 0).astype(float)
    dec = rng.integers(1, 128, n).astype(float)
    y = 5.0 + 2e-4 * ctx + 0.02 * pf + 0.01 * dec
    y = y * np.exp(rng.normal(0, sigma, n) - sigma**2 / 2)
    stall = rng.random(n) < outliers
    y[stall] += rng.exponential(50.0, stall.sum())
    return {"context_tokens": ctx, "prefill_tokens": pf, "decode_tokens": dec}, y, stall


def test_noise_free_data_is_recovered_exactly():
    cols, y, _ = _data(sigma=0.0)
    f = fit_linear(cols, y, n_boot=20)
    assert f.coef["t0_ms"] == pytest.approx(5.0, rel=1e-8)
    assert f.coef["a_ms_per_ctx"] == pytest.approx(2e-4, rel=1e-8)
    assert f.coef["b_ms_per_prefill"] == pytest.approx(0.02, rel=1e-8)
    assert f.coef["c_ms_per_decode"] == pytest.approx(0.01, rel=1e-6)
    assert f.r2 == pytest.approx(1.0) and f.n_outliers == 0


def test_robust_to_stalls_where_least_squares_is_not():
    cols, y, stall = _data(outliers=0.03, seed=1)
    f = fit_linear(cols, y, n_boot=50)
    X = np.column_stack([np.ones(len(y)), cols["context_tokens"], cols["prefill_tokens"], cols["decode_tokens"]])
    ols = np.linalg.lstsq(X, y, rcond=None)[0]
    assert abs(ols[0] / 5.0 - 1) > 0.05  # plain least squares is dragged by the stalls
    assert f.coef["t0_ms"] == pytest.approx(5.0, rel=0.02)
    assert f.coef["a_ms_per_ctx"] == pytest.approx(2e-4, rel=0.02)
    assert f.coef["b_ms_per_prefill"] == pytest.approx(0.02, rel=0.02)
    # the outlier rule flags the big stalls and barely anything else
    assert f.n_outliers <= stall.sum() + 3
    # spread of log(y / yhat) = the 3% multiplicative noise
    assert f.log_scale == pytest.approx(0.03, rel=0.1)


def test_bootstrap_interval_covers_truth_and_shrinks_with_data():
    small = fit_linear(*_data(n=300, seed=2)[:2], n_boot=200)
    big = fit_linear(*_data(n=5000, seed=2)[:2], n_boot=200)
    for f in (small, big):
        lo, hi = f.ci["a_ms_per_ctx"]
        assert lo < 2e-4 < hi
    width = lambda f: f.ci["a_ms_per_ctx"][1] - f.ci["a_ms_per_ctx"][0]  # noqa: E731
    assert width(big) < width(small) / 2  # about sqrt(5000 / 300) = 4x narrower


def test_bootstrap_is_reproducible():
    cols, y, _ = _data(n=500)
    assert fit_linear(cols, y, seed=7).ci == fit_linear(cols, y, seed=7).ci


def test_context_that_never_varies_is_said_not_fitted():
    cols, y, _ = _data(sigma=0.01)
    cols["context_tokens"] = np.full(len(y), 4096.0)
    f = fit_linear(cols, y, n_boot=20)
    assert "a_ms_per_ctx" not in f.coef
    assert any("context_tokens never varies (always 4096" in s for s in f.statements)


def test_missing_and_rare_columns():
    cols, y, _ = _data(sigma=0.01)
    del cols["decode_tokens"]
    cols["prefill_tokens"] = np.zeros(len(y))
    cols["prefill_tokens"][:3] = 100.0
    f = fit_linear(cols, y, n_boot=20)
    assert f.terms == ("a_ms_per_ctx",)
    assert any("decode_tokens is not recorded" in s for s in f.statements)
    assert any("prefill_tokens differs from 0 in only 3 steps" in s for s in f.statements)


def test_collinear_decode_term_is_dropped_with_a_statement():
    rng = np.random.default_rng(3)
    dec = rng.integers(1, 128, 1000).astype(float)
    ctx = dec * 1000 + rng.normal(0, 5, 1000)  # every sequence has ~1000 tokens of context
    y = 5 + 2e-4 * ctx + 0.01 * dec
    f = fit_linear({"context_tokens": ctx, "decode_tokens": dec}, y, n_boot=20)
    assert f.terms == ("a_ms_per_ctx",)
    assert any("decode_tokens moves with context_tokens" in s for s in f.statements)


def test_too_few_rows():
    cols, y, _ = _data(n=3)
    assert fit_linear(cols, y) is None
    # 5 steps: no term varies in enough steps; only t0 (their mean, by a robust fit) is left, and it says so
    cols, y, _ = _data(n=5)
    f = fit_linear(cols, y, n_boot=20)
    assert f.terms == () and any("too few to fit" in s for s in f.statements)
    assert any("only 5 steps" in s for s in f.statements)


def test_mad_scale_matches_scipy():
    from scipy.stats import median_abs_deviation

    x = np.random.default_rng(4).standard_t(3, 1001)
    med, s = mad_scale(x)
    assert med == np.median(x)
    assert s == pytest.approx(median_abs_deviation(x, scale="normal"), rel=1e-3)
