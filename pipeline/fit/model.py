"""Robust fit of the memory-bound iteration-time model (SPEC §6), on numpy arrays.

    iteration_ms ~ t0 + a * context_tokens + b * prefill_tokens + c * decode_tokens

Why this estimator:

- Noise in step times is roughly proportional to the step (a 40 ms prefill step
  jitters more than a 5 ms decode step), so residuals are taken relative to the
  prediction, ``(y - yhat) / yhat`` (iteratively re-weighted: the scale comes from
  the previous pass). Outliers are judged on ``log(y / yhat)``, which is symmetric
  for multiplicative noise (relative residuals have a heavier right tail).
- The stalls we hunt are huge positive outliers; ``scipy.optimize.least_squares``
  with the ``soft_l1`` loss (scale = 1.4826 x MAD of the relative residuals) keeps
  them from dragging the line.
- Confidence intervals: a pairs bootstrap (Poisson resampling weights) of the
  weighted least-squares problem at the robust solution, with the robust weights
  held fixed. That re-solves a p x p system per replicate, so 200 replicates on a
  million steps take about a second. Steps are treated as independent; slow drifts
  would make the intervals too narrow.

A term is fitted only when the data can separate it; otherwise it is left out and
a sentence in ``statements`` says why (not recorded, never varies, too few steps
with prefill, or moves in lockstep with another term).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# coefficient name -> iteration column; t0_ms is the intercept
TERMS = (("a_ms_per_ctx", "context_tokens"), ("b_ms_per_prefill", "prefill_tokens"), ("c_ms_per_decode", "decode_tokens"))
MAX_VIF = 30.0  # beyond this a term's column is (nearly) a combination of the others
MIN_NONZERO = 5  # steps where a term's column differs from its most common value
MAD_TO_SIGMA = 1.4826
REL_SCALE_FLOOR = 1e-3  # noise-free data: a 0.1% (timer resolution) floor keeps rounding from flagging stalls


@dataclass(frozen=True)
class LinearFit:
    """Coefficients (ms), 95% bootstrap intervals and residual diagnostics of one fit."""

    coef: dict[str, float]
    ci: dict[str, tuple[float, float]]
    terms: tuple[str, ...]
    n: int
    r2: float
    r2_inliers: float
    mape_pct: float
    log_center: float
    log_scale: float
    n_outliers: int
    statements: list[str] = field(default_factory=list)

    def predict(self, cols: dict[str, np.ndarray]) -> np.ndarray:
        """Model time for the given columns (missing terms count as 0)."""
        first = next(iter(cols.values()))
        out = np.full(len(first), self.coef["t0_ms"], dtype=float)
        for name, col in TERMS:
            if name in self.coef and col in cols:
                out += self.coef[name] * cols[col]
        return out

    def to_dict(self) -> dict:
        """Plain-dict form for JSON."""
        return {
            "coef": dict(self.coef), "ci": {k: list(v) for k, v in self.ci.items()}, "terms": list(self.terms),
            "n": self.n, "r2": self.r2, "r2_inliers": self.r2_inliers, "mape_pct": self.mape_pct,
            "log_center": self.log_center, "log_scale": self.log_scale,
            "n_outliers": self.n_outliers, "statements": list(self.statements),
        }


def mad_scale(x: np.ndarray) -> tuple[float, float]:
    """Robust centre (median) and scale (1.4826 x median absolute deviation)."""
    if len(x) == 0:
        return float("nan"), float("nan")
    med = float(np.median(x))
    return med, MAD_TO_SIGMA * float(np.median(np.abs(x - med)))


def log_ratio(y: np.ndarray, yhat: np.ndarray) -> np.ndarray:
    """log(measured / predicted), NaN where either is not positive."""
    ok = (y > 0) & (yhat > 0)
    out = np.full(len(y), np.nan)
    out[ok] = np.log(y[ok] / yhat[ok])
    return out


def select_terms(cols: dict[str, np.ndarray], allow: tuple[str, ...] | None = None) -> tuple[list[str], list[str]]:
    """The terms these data can separate, and one sentence for each term left out."""
    chosen, notes = [], []
    for name, col in TERMS:
        if allow is not None and name not in allow:
            continue
        x = cols.get(col)
        if x is None:
            notes.append(f"{col} is not recorded: {name} cannot be fitted")
            continue
        vals, counts = np.unique(x, return_counts=True)
        if len(vals) < 2:
            notes.append(f"{col} never varies (always {vals[0]:g} when recorded): its cost cannot be told apart "
                         f"from t0, so {name} is not fitted")
        elif len(x) - counts.max() < MIN_NONZERO:
            notes.append(f"{col} differs from {vals[counts.argmax()]:g} in only {len(x) - counts.max()} steps: "
                         f"too few to fit {name}")
        else:
            chosen.append(name)
    # a term the others predict (decode_tokens tracks context when all sequences are alike) cannot be separated
    while len(chosen) >= 2:
        vif = _vif(np.column_stack([cols[dict(TERMS)[t]] for t in chosen]))
        worst = int(np.argmax(vif))
        if vif[worst] <= MAX_VIF:
            break
        drop = "c_ms_per_decode" if "c_ms_per_decode" in chosen else chosen[worst]
        others = ", ".join(dict(TERMS)[t] for t in chosen if t != drop)
        notes.append(f"{dict(TERMS)[drop]} moves with {others} (variance inflation {vif[chosen.index(drop)]:.0f}): "
                     f"{drop} cannot be separated and is folded into the other terms")
        chosen.remove(drop)
    return chosen, notes


def _vif(X: np.ndarray) -> np.ndarray:
    """Variance inflation factor of each column (1 = independent of the others)."""
    if X.shape[1] < 2:
        return np.ones(X.shape[1])
    corr = np.corrcoef(X, rowvar=False)
    try:
        return np.abs(np.diag(np.linalg.inv(corr)))
    except np.linalg.LinAlgError:
        return np.full(X.shape[1], np.inf)


def _design(cols: dict[str, np.ndarray], terms: list[str], n: int) -> np.ndarray:
    return np.column_stack([np.ones(n)] + [cols[dict(TERMS)[t]].astype(float) for t in terms])


def _robust_solve(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Robust relative-error fit: coefficients, per-row scale s and IRLS weights."""
    from scipy.optimize import least_squares

    colscale = np.maximum(np.abs(X).max(axis=0), 1e-12)  # condition the problem: columns of order 1
    Xs = X / colscale
    beta = np.linalg.lstsq(Xs, y, rcond=None)[0]
    floor = 0.05 * max(float(np.median(y)), 1e-9)
    w = np.ones(len(y))
    s = np.ones(len(y))
    for _ in range(3):
        s = np.maximum(Xs @ beta, floor)
        _, f = mad_scale((y - Xs @ beta) / s)
        f = max(f, 1e-9)
        A = Xs / s[:, None]
        res = least_squares(lambda b: A @ b - y / s, beta, jac=lambda b: A, loss="soft_l1", f_scale=f,
                            method="trf", x_scale="jac")
        beta = res.x
        z = ((A @ beta - y / s) / f) ** 2
        w = 1.0 / np.sqrt(1.0 + z)  # soft_l1: rho'(z) = (1 + z)^-1/2
    return beta / colscale, s, w / s**2


def _bootstrap(X: np.ndarray, y: np.ndarray, weights: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """Coefficient replicates of the weighted problem under Poisson(1) resampling of rows."""
    rng = np.random.default_rng(seed)
    colscale = np.maximum(np.abs(X).max(axis=0), 1e-12)
    Xs = X / colscale
    out = np.empty((n_boot, X.shape[1]))
    for i in range(n_boot):  # one small p x p solve per replicate, vectorised over rows
        wi = weights * rng.poisson(1.0, len(y))
        Xw = Xs * wi[:, None]
        try:
            out[i] = np.linalg.solve(Xw.T @ Xs, Xw.T @ y)
        except np.linalg.LinAlgError:
            out[i] = np.nan
    return out / colscale


def fit_linear(
    cols: dict[str, np.ndarray],
    y: np.ndarray,
    allow: tuple[str, ...] | None = None,
    n_boot: int = 200,
    seed: int = 0,
    k: float = 4.0,
) -> LinearFit | None:
    """Fit the model to complete rows; None (with no exception) when too few rows.

    Args:
        cols: iteration columns (``context_tokens``, ``prefill_tokens``, ``decode_tokens``),
            no NaN; absent keys are terms not recorded.
        y: measured ``iteration_ms``.
        allow: restrict to these coefficient names (per-phase fits).
        n_boot: bootstrap replicates for the 95% intervals.
        seed: bootstrap seed (results are reproducible).
        k: outlier threshold in robust standard deviations of the relative residual,
            used for the inlier R² (the stall detector uses the same rule).
    """
    y = np.asarray(y, dtype=float)
    terms, notes = select_terms(cols, allow)
    n, p = len(y), len(terms) + 1
    if n < p + 3:
        return None
    X = _design(cols, terms, n)
    beta, s, weights = _robust_solve(X, y)
    reps = _bootstrap(X, y, weights, n_boot, seed) if n_boot else np.tile(beta, (2, 1))
    names = ["t0_ms"] + terms
    lo, hi = np.nanpercentile(reps, [2.5, 97.5], axis=0)
    coef = {nm: float(b) for nm, b in zip(names, beta)}
    ci = {nm: (float(a), float(b)) for nm, a, b in zip(names, lo, hi)}
    yhat = X @ beta
    lr = log_ratio(y, yhat)
    center, scale = mad_scale(lr[np.isfinite(lr)])
    scale = max(scale, REL_SCALE_FLOOR)
    outlier = np.nan_to_num(lr, nan=-np.inf) > center + k * scale
    for nm in terms:
        a, b = ci[nm]
        if a <= 0 <= b:
            notes.append(f"{nm} is not distinguishable from 0 in these data (95% CI {a:.3g} .. {b:.3g})")
    if n < 10 * p:
        notes.append(f"only {n} steps for {p} coefficients: estimates are rough")
    return LinearFit(coef, ci, tuple(terms), n, _r2(y, yhat), _r2(y[~outlier], yhat[~outlier]),
                     float(np.mean(np.abs(y[y > 0] - yhat[y > 0]) / y[y > 0]) * 100), center, scale,
                     int(outlier.sum()), notes)


def _r2(y: np.ndarray, yhat: np.ndarray) -> float:
    if len(y) < 2:
        return float("nan")
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - float(np.sum((y - yhat) ** 2)) / ss_tot if ss_tot > 0 else float("nan")
