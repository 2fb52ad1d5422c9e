"""E-divisive means: change points in one statistic's nightly history.

The method of Matteson & James (2014, "A nonparametric approach for multiple
change point analysis of multivariate data", JASA), as MongoDB's CI performance
work (Daly et al., ICPE 2020) and Apache Otava (Hunter) use it, reimplemented
with numpy:

* For a segment ``x`` and a split ``tau`` (left ``x[:tau]``, right ``x[tau:]``,
  sizes ``m`` and ``k``) the energy statistic is
  ``Q = m k / (m + k) * (2/(m k) sum|L-R|^a - sum_{i<j}|L_i-L_j|^a / C(m,2)
  - sum_{i<j}|R_i-R_j|^a / C(k,2))``: large when the two sides differ in
  distribution (any change, not only in the mean), zero in expectation when they
  do not.  As in the original, the right side ``x[tau:kappa]`` need not run to the
  segment's end: the best ``kappa`` is searched too, so a regression that was
  fixed a few nights later (a bump in the middle) stands out as well.
* All ``(tau, kappa)`` of a segment at once: with ``P`` the 2-D prefix sum of the
  distance matrix ``D``, the left, right and cross sums are ``P[t,t]/2``,
  ``(P[k,k] - 2 P[t,k] + P[t,t])/2`` and ``P[t,k] - P[t,t]``, so one segment (or a
  batch of permutations of it) costs O(n^2) array operations, no Python loop.
* Bisection: the best split over every current segment is a candidate; it is
  accepted when a permutation test says it is significant: the observations are
  permuted within each segment (the null: no further change), the best statistic
  recomputed, ``p = (1 + #{perm >= observed}) / (1 + permutations)``.  Testing
  stops at the first candidate that is not significant.
* Reproducible: the permutations come from ``numpy.random.default_rng(seed)``.
  A test stops early once it can no longer reach ``significance`` (most tests on
  quiet histories), which changes nothing but its run time.

Settings and their measured false-alarm rates: docs/nightly.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

# Elements of one batch of permuted distance matrices (~32 MB of float64).
_BATCH_ELEMENTS = 4_000_000
_FIRST_BATCH = 64


@dataclass(frozen=True)
class Settings:
    """How change points are searched and tested.

    ``significance`` is per statistic: a nightly history tests ~25 statistics,
    many of them correlated (p50/p90/p99 of one metric), so 0.002 keeps the chance
    of a false alarm in a whole quiet history near 0.002 x 25 = 5% at most.
    ``min_size`` nights on each side of a change: a change at night N is
    confirmed on night N + min_size - 1 at the earliest.
    """

    significance: float = 0.002
    permutations: int = 1999
    min_size: int = 3
    exponent: float = 1.0  # the energy distance's alpha, 0 < alpha < 2 (1: the usual choice)
    max_change_points: int = 12
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.significance < 1:
            raise ValueError(f"significance must be in (0, 1), got {self.significance}")
        if self.permutations < 1 or self.min_size < 2:
            raise ValueError("permutations must be >= 1 and min_size >= 2")
        if not 0 < self.exponent < 2:
            raise ValueError(f"exponent must be in (0, 2), got {self.exponent}")


@dataclass(frozen=True)
class ChangePoint:
    """A change before ``index`` (the first observation of the new segment)."""

    index: int
    q: float
    p_value: float


@functools.lru_cache(maxsize=64)
def _weights(n: int, min_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Coefficients of ``Q`` over ``(t, k)`` in terms of the prefix sums (see :func:`split_statistics`)."""
    t = np.arange(n + 1, dtype=float)
    m, k = t[:, None], t[None, :] - t[:, None]  # left and right sizes
    ok = (m >= min_size) & (k >= min_size)
    m, k = np.where(ok, m, 2.0), np.where(ok, k, 2.0)  # placeholders where the split is not allowed
    w = m * k / (m + k)
    cross, left, right = 2 / (m * k), 1 / (m * (m - 1) / 2), 1 / (k * (k - 1) / 2)
    alpha = np.where(ok, w * (cross + right), 0.0)
    beta = np.where(ok, w * (cross + left / 2 + right / 2), 0.0)
    gamma = np.where(ok, w * right / 2, 0.0)
    return alpha, beta, gamma, np.where(ok, 0.0, -np.inf)


def split_statistics(x: np.ndarray, min_size: int, exponent: float = 1.0) -> np.ndarray:
    """Best ``Q`` of every split point of the last axis of ``x`` (shape ``(..., n)``).

    Entry ``t`` of the result (shape ``(..., n + 1)``) is the largest ``Q`` of
    ``x[..., :t]`` against ``x[..., t:k]`` over the right side's end ``k``; splits
    leaving fewer than ``min_size`` on a side are ``-inf``.

    With ``P[a, b]`` the sum of distances ``d[i, j]`` over ``i < a, j < b`` and
    ``S[t] = P[t, t]``, the cross, left and right sums are ``P[t,k] - S[t]``,
    ``S[t]/2`` and ``(S[k] - 2 P[t,k] + S[t])/2``, so ``Q = alpha P[t,k] - beta S[t]
    - gamma S[k]`` with coefficients that depend on the sizes only (cached).
    """
    x = np.asarray(x, dtype=float)
    n = x.shape[-1]
    d = np.abs(x[..., :, None] - x[..., None, :])
    if exponent != 1.0:
        d = d**exponent
    p = np.zeros(x.shape[:-1] + (n + 1, n + 1))
    np.cumsum(d, axis=-1, out=p[..., 1:, 1:])
    np.cumsum(p[..., 1:, 1:], axis=-2, out=p[..., 1:, 1:])
    t = np.arange(n + 1)
    diag = p[..., t, t]
    alpha, beta, gamma, off = _weights(n, min_size)
    q = p * alpha
    q -= beta * diag[..., :, None]
    q -= gamma * diag[..., None, :]
    q += off
    return q.max(axis=-1)


def _best(x: np.ndarray, s: Settings) -> tuple[float, int]:
    q = split_statistics(x, s.min_size, s.exponent)
    t = int(np.argmax(q))
    return float(q[t]), t


def _permutation_p(x: np.ndarray, bounds: list[int], observed: float, s: Settings, rng: np.random.Generator) -> float:
    """p-value of ``observed`` (the best split over all segments) under no further change."""
    segs = [x[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b - a >= 2 * s.min_size]
    longest = max(len(g) for g in segs)
    most = max(1, _BATCH_ELEMENTS // (longest * longest))
    # a p-value above significance is certain once this many permutations reached the observed value
    give_up = int(np.floor(s.significance * (s.permutations + 1)))
    hits = done = 0
    batch = min(_FIRST_BATCH, most)  # small first: a quiet statistic is settled after a few dozen
    while done < s.permutations:
        b = min(batch, s.permutations - done)
        batch = min(2 * batch, most)
        best = np.full(b, -np.inf)
        for g in segs:
            perm = rng.permuted(np.broadcast_to(g, (b, len(g))), axis=1)
            best = np.maximum(best, split_statistics(perm, s.min_size, s.exponent).max(axis=1))
        hits += int(np.sum(best >= observed * (1 - 1e-12)))
        done += b
        if hits >= give_up:
            return (hits + 1) / (done + 1)  # not significant; the rest would not change that
    return (hits + 1) / (s.permutations + 1)


def detect(values, settings: Settings = Settings()) -> list[ChangePoint]:
    """Change points of a series (in time order, no missing values), sorted by index."""
    x = np.asarray(values, dtype=float)
    s = settings
    rng = np.random.default_rng(s.seed)
    found: list[ChangePoint] = []
    if len(x) < 2 * s.min_size or not np.all(np.isfinite(x)):
        return found
    while len(found) < s.max_change_points:
        bounds = [0, *sorted(c.index for c in found), len(x)]
        best_q, best_t = -np.inf, -1
        for a, b in zip(bounds[:-1], bounds[1:]):
            if b - a >= 2 * s.min_size:
                q, t = _best(x[a:b], s)
                if q > best_q:
                    best_q, best_t = q, a + t
        if best_t < 0 or not best_q > 0:
            break
        p = _permutation_p(x, bounds, best_q, s, rng)
        if p > s.significance:
            break
        found.append(ChangePoint(best_t, best_q, p))
    return sorted(found, key=lambda c: c.index)
