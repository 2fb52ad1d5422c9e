"""Spikes and stalls: iterations that break the memory-bound model (docs/model-and-attribution.md, section 4).

Rule (applied in ``queries/fit/iteration_fit.sql`` as ``r > m + k*s``): with
``r = ln(measured / predicted)``, its robust centre ``m`` (median) and scale ``s``
(1.4826 x MAD) over the run,

- a **stall** is a step whose ``r`` passes the Benjamini-Hochberg cut at false-discovery
  rate Q (default 0.05, ``--fdr``): each step's one-sided p-value comes from the noise law
  of ordinary steps, a Student-t fitted to the run's residuals below their 90% quantile
  (:func:`fit_null`; stalls only lengthen steps, so the left tail and centre are clean).
  BH's rejections are the steps above one residual, stored as the equivalent ``k``.
  It is labelled ``preemption`` when the step preempted requests, else ``unexplained``;
- a **prefill spike** is a step that is not a stall but exceeds its *decode
  baseline* (t0 + a*context + c*decode) by the same margin (in log ratio), with prefill
  in it: the prefill cost explains the spike.

Why not a fixed k (the rule before, still behind ``--k``): it flags a fixed fraction of
ordinary steps, so false stalls grow with the run (3.5 sigmas: 2.3e-4 of steps under
Gaussian noise, 51 false among 133 flagged on 165k steps with 82 stalls), and under
heavy-tailed host noise it flags the noise's own tail by the thousand. BH's cut rises
with the run's length and the tail's weight, keeping false stalls near Q x flagged
(``benchmarks/bench_stalls.py``, ``tests/fit/test_stall_fdr.py``).

Log ratios, because step-time noise scales with the step. A stall smaller than the
cut's margin on its step cannot be told from noise by any rule; the stall statistics
describe the stalls that are found, and ``detection_limit_ms`` says how small a stall
can be and still be found (at the median and the p90 step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
from scipy import optimize, special

from .. import store

# re-exported (noqa): defined where `tracelat fit --help` can read them cheaply
from ..defaults import STALL_FDR as DEFAULT_FDR  # noqa: F401
from ..defaults import STALL_K as DEFAULT_K  # noqa: F401


def limit_factor(log_center: float, k: float, log_scale: float | None) -> float:
    """Smallest stall found, per ms of a step's predicted time: ``exp(m) * (exp(k*s) - 1)``.

    A step is a stall when ``measured > predicted * exp(m + k*s)``; a step at the noise
    centre (``predicted * exp(m)``) crosses that only with this much extra time per ms
    predicted. Smaller stalls hide in the step's own noise. Infinite without a spread, or
    when the cut lies beyond what a float holds (a Cauchy-like noise law fitted to a short
    run puts the FDR cut at a log ratio of hundreds: no stall can be found there).
    """
    if log_scale is None or not math.isfinite(log_scale) or not math.isfinite(k):
        return math.inf
    if k * log_scale + log_center > 700:  # no step this noisy can show a stall (and exp would overflow)
        return math.inf
    return math.exp(log_center) * math.expm1(k * log_scale)


def stats(con: duckdb.DuckDBPyConnection, run_id: str, factor: float) -> dict[str, Any]:
    """Spike counts by cause, the size distribution of stalls (residual ms) and the detection limit.

    ``factor`` is :func:`limit_factor` of the fit: the smallest stall found on a step
    is that times the step's predicted time.
    """
    row = store.rows(con, "fit/stall_stats", {"run_id": run_id})[0]
    n, spikes, prefill, preempt, unexpl, stalls, *sizes, step_ms = row
    limit = [v * factor if v is not None and math.isfinite(factor) else None for v in (step_ms or [None, None])]
    return {
        "detection_limit_ms": {"median_step": limit[0], "p90_step": limit[1]},
        "spikes": {"count": spikes, "prefill": prefill, "preemption": preempt, "unexplained": unexpl},
        "stall_rate": stalls / n if n else None,
        "stall_ms": dict(zip(("mean", "p50", "p90", "p99", "max", "total"), sizes)) | {"count": stalls},
    }


def top_spikes(con: duckdb.DuckDBPyConnection, run_id: str, limit: int = 10) -> list[dict[str, Any]]:
    """The largest spikes (time above the decode baseline), with timestamps."""
    df = store.select(con, "fit/top_spikes", {"run_id": run_id, "limit": limit})
    return df.drop("is_spike").to_dicts()


def stall_iters(con: duckdb.DuckDBPyConnection, run_id: str) -> set[int]:
    """Iteration indices flagged as stalls (for checks against a simulator's truth)."""
    rows = con.execute("select iter from iteration_fit where run_id = ? and is_stall", [run_id]).fetchall()
    return {int(r[0]) for r in rows}


# --- false-discovery-rate control -------------------------------------------------------------
#
# A fixed threshold flags a fixed fraction of ordinary steps, so on a long run the false stalls
# grow with the run while the real ones do not. Instead each step gets a one-sided p-value under a
# noise law fitted to the run's own residuals, and Benjamini-Hochberg keeps the expected share of
# false stalls among the flagged ones at most Q, whatever the run's length.

NULL_UPPER_QUANTILE = 0.9  # the null is fitted to residuals below this quantile: stalls only lengthen steps
NULL_MIN_STEPS = 500  # fewer steps cannot pin a tail exponent: a Gaussian from the median and MAD instead
NULL_BINS = 4000
MAX_NU = 1.0  # 1/df: df >= 1 (Cauchy); df above 1e4 is a Gaussian for every p-value we use
MIN_NU = 1e-4


@dataclass(frozen=True)
class NullModel:
    """Law of ``ln(measured / predicted)`` on ordinary steps: Student-t with location, scale, df.

    ``df = inf`` is the Gaussian. ``method`` says how it was obtained (for the report).
    """

    loc: float
    scale: float
    df: float
    method: str

    def sf(self, r: np.ndarray) -> np.ndarray:
        """P(an ordinary step's log residual > r): the one-sided p-value of a step with residual r."""
        z = (np.asarray(r, dtype=float) - self.loc) / self.scale
        return special.ndtr(-z) if math.isinf(self.df) else special.stdtr(self.df, -z)

    def isf(self, p: float) -> float:
        """The log residual an ordinary step exceeds with probability p."""
        z = -special.ndtri(p) if math.isinf(self.df) else -special.stdtrit(self.df, p)
        return self.loc + self.scale * float(z)

    def to_dict(self) -> dict[str, Any]:
        return {
            "loc": self.loc,
            "scale": self.scale,
            "df": None if math.isinf(self.df) else self.df,
            "method": self.method,
        }


def fit_null(lr: np.ndarray, floor: float = 0.0) -> NullModel:
    """Fit the noise law of ordinary steps to a run's log residuals, robustly to stalls.

    Stalls only lengthen steps, so they sit in the right tail; the left tail and the centre are
    ordinary steps. The Student-t's location, scale and df are found by maximum likelihood on
    the residuals below the 90% quantile, the likelihood truncated there (so how many steps lie
    above the cut, stalls included, does not matter). The left tail, untouched by stalls, fixes
    the tail exponent that p-values of 1e-5 depend on; mirrored, it is the right tail of the
    ordinary steps (symmetry in log space, as multiplicative noise is).

    Residuals are binned (4000 bins, uniform in asinh of the robust z so the centre is fine and a
    wild outlier does not coarsen it): each likelihood evaluation costs 4000 CDFs, not one per step.
    """
    r = lr[np.isfinite(lr)]
    if len(r) == 0:
        return NullModel(0.0, max(floor, 1e-9), math.inf, "no residuals")
    m = float(np.median(r))
    s = 1.4826 * float(np.median(np.abs(r - m)))
    if len(r) < NULL_MIN_STEPS or s <= floor:
        return NullModel(
            m,
            max(s, floor, 1e-9),
            math.inf,
            f"Gaussian from median and MAD (fewer than {NULL_MIN_STEPS} steps)"
            if s > floor
            else "Gaussian at the timer-resolution floor (no measurable noise)",
        )
    u = float(np.quantile(r, NULL_UPPER_QUANTILE))
    zu = (u - m) / s
    w = np.arcsinh((r[r <= u] - m) / s / 2)
    edges_w = np.linspace(float(w.min()), float(np.arcsinh(zu / 2)), NULL_BINS + 1)
    counts = np.histogram(w, edges_w)[0].astype(float)
    edges = 2 * np.sinh(edges_w)
    edges[0], edges[-1] = -np.inf, zu
    used = counts > 0
    n = counts.sum()

    def nll(theta: np.ndarray) -> float:
        loc, log_sc, nu = theta
        x = (edges - loc) / math.exp(log_sc)
        # each edge's smaller tail, once (the CDF costs most of the search); the other is 1 minus it
        tail = special.stdtr(1 / nu, -np.abs(x))
        left = x <= 0
        cdf, sf = np.where(left, tail, 1 - tail), np.where(left, 1 - tail, tail)
        # differences of whichever tail is small: 1 - F loses the digits of the right bins' masses
        p = np.where(x[1:] <= 0, cdf[1:] - cdf[:-1], sf[:-1] - sf[1:])
        return float(-(counts[used] @ np.log(np.maximum(p[used], 1e-300))) + n * math.log(max(float(cdf[-1]), 1e-300)))

    best = None
    for nu0 in (0.02, 0.2, 0.5):  # the likelihood in df can be flat; take the best of three starts
        res = optimize.minimize(
            nll,
            np.array([0.0, 0.0, nu0]),
            method="L-BFGS-B",
            # location and scale within a factor of the median and MAD: the cut then stays
            # above the location, so the truncated mass never underflows (where bins and
            # mass vanish together the likelihood is flat and the search wanders off)
            bounds=[(-0.5, 0.5), (-1.5, 1.5), (MIN_NU, MAX_NU)],
        )
        if best is None or res.fun < best.fun:
            best = res
    loc, log_sc, nu = best.x
    df = math.inf if nu <= 2 * MIN_NU else 1 / nu
    return NullModel(
        m + loc * s,
        max(math.exp(log_sc) * s, floor),
        df,
        "Student-t, maximum likelihood on the residuals below their 90% quantile",
    )


@dataclass(frozen=True)
class FdrThreshold:
    """Benjamini-Hochberg cut on the log residual at level ``q``.

    ``threshold``: a step is a stall when its log residual exceeds it; ``flagged``: how many do;
    ``expected_false``: the null model's count of ordinary steps above the threshold
    (n x p-value at the cut), next to the procedure's bound ``q x flagged``.
    """

    q: float
    threshold: float
    flagged: int
    expected_false: float
    null: NullModel


def fdr_threshold(lr: np.ndarray, q: float, null: NullModel) -> FdrThreshold:
    """Benjamini-Hochberg at level q over the one-sided p-values of every step.

    The p-value falls as the residual grows, so BH's rejections are the steps above one
    residual: with i* the largest i whose i-th smallest p-value is <= i q / n, exactly the
    steps with p <= i* q / n are flagged, i.e. those above ``null.isf(i* q / n)``. With no
    rejection the cut is the one a single stall would have to pass (p <= q / n): it sets the
    detection limit.
    """
    r = lr[np.isfinite(lr)]
    n = len(r)
    if n == 0:
        return FdrThreshold(q, math.inf, 0, 0.0, null)
    # only the top of the ranking can pass: q i / n >= p_(i) needs p_(i) <= q, so rank those alone
    cand = np.sort(null.sf(r[r > null.isf(min(q, 0.999999))]))
    i = np.arange(1, len(cand) + 1)
    ok = np.flatnonzero(cand <= i * q / n)
    k = int(ok[-1]) + 1 if len(ok) else 0
    p_cut = max(k, 1) * q / n
    thr = null.isf(p_cut)
    flagged = int((r > thr).sum())
    return FdrThreshold(q, thr, flagged, float(n * null.sf(np.array([thr]))[0]), null)
