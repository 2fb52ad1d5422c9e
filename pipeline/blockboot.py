"""Block bootstrap over time: replicates of a run's statistics that keep its requests' dependence.

Requests of one run share its queue and its batches: a stall, a burst or a long prompt moves
the latencies of every request around it. Resampling single requests treats them as
independent and gives intervals far too narrow for tails (``benchmarks/compare_reruns.py``).
Here the run's time span is cut into ``m`` equal blocks; a replicate draws ``m`` blocks with
replacement (multinomial weights ``w_j``, ``sum_j w_j = m``) and takes every value of block ``j``
``w_j`` times. Values are grouped by the time they happened at (a request's arrival, a token
gap's token, a step's start), so every metric of a run is resampled with the same blocks.

Statistics of a weighted replicate, for the sorted values ``x_1 <= ... <= x_n`` with block
``b_i`` and block counts ``n_j`` and sums ``S_j``:

* ``mean* = sum_j w_j S_j / sum_j w_j n_j`` (exact);
* a percentile ``p`` is numpy's linear one over the replicate's ``N* = sum_j w_j n_j`` values:
  ``h = (N* - 1) p / 100``, the ``floor(h)+1``-th and next smallest values interpolated. The
  ``k``-th smallest is ``x_i`` for the least ``i`` whose weighted count ``C*(i) = sum_{i' <= i}
  w_{b_i'}`` reaches ``k``. ``C*`` is evaluated on a grid of ranks (``cnt[j, g]`` = values of block
  ``j`` at or below grid rank ``g``, ``C* = w @ cnt``): first a coarse grid over all ``n`` ranks
  brackets every replicate, then a grid over that bracket; when the bracket holds at most
  ``GRID`` ranks it holds all of them and the replicate is exact, else ``k`` is placed linearly
  between the two grid ranks around it (an error of at most one grid step, a small fraction of
  the replicates' spread).

How many blocks: :class:`BlockRule`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BlockRule:
    """How a run is cut into blocks, and which percentiles get an interval at all.

    **Blocks.** A request shares the server with the requests in flight while it is: its
    residence time ``r`` (the ok requests' mean ``e2e_ms / 1000``) is how long the server's
    state (queue, batch, KV) takes to turn over. Blocks last ``residence_multiple * r``:
    ``m = clamp(ceil(span / (residence_multiple * r)), min_blocks, max_blocks)`` equal blocks of
    ``span / m`` over ``[t_first, t_last]``. A run without request records (steps only) has no
    residence time and gets ``steps_only_blocks``. Calibrated on re-runs of one simulated load
    (``benchmarks/compare_reruns.py``, 40 pairs at 12 req/s, latency statistics at 99%): blocks
    of 2 and 4 residence times flagged 3.0% and 1.8%, blocks close to single requests 6.8% of
    all statistics; at 4 residence times the rms of ``delta / sd`` was 1.00 (8 req/s: 0.97).
    Tables in docs/reports-and-audit.md.

    **Thin tails.** A percentile ``p`` with fewer than ``min_tail`` values beyond it
    (``n * (1 - p/100) < min_tail``) in either run has no interval: a bootstrap cannot resample
    values beyond a sample's largest, and p99.9 of 600 requests is its top two values. Such a
    statistic is reported without a verdict.
    """

    residence_multiple: float = 4.0
    min_blocks: int = 10
    max_blocks: int = 100
    steps_only_blocks: int = 20
    min_tail: int = 10

    def blocks(self, span_s: float | None, residence_s: float | None) -> tuple[int, str]:
        """How many blocks a run of ``span_s`` gets, and why (for the output)."""
        if residence_s is None or not residence_s > 0:
            return self.steps_only_blocks, "no request records: a fixed count"
        if span_s is None or not span_s > 0:
            return self.min_blocks, "no time span: the fewest blocks"
        want = int(np.ceil(span_s / (self.residence_multiple * residence_s)))
        m = min(self.max_blocks, max(self.min_blocks, want))
        why = f"{self.residence_multiple:g} x the mean residence time {residence_s:.3g} s"
        if m != want:
            why += f" ({want} blocks, held to {self.min_blocks}..{self.max_blocks})"
        return m, why

    def tail_too_thin(self, n: int, pct: float) -> bool:
        """Whether a percentile of ``n`` values has too few beyond it for an interval. Rounded:
        ``100 * (1 - 0.9)`` is 9.999999999999998 in floating point, which left p90 of exactly 100
        values (10 beyond it) without a verdict."""
        return round(n * (100 - pct) / 100, 9) < self.min_tail


BLOCKS = BlockRule()


@functools.lru_cache(maxsize=256)
def tail_level(m: int, confidence: float) -> float:
    """The quantile level of each end of an interval from ``m``-block replicates: Hesterberg's
    expanded percentile interval, ``Phi(-sqrt(m / (m - 1)) * t_{m-1}(q))``, ``q = (1 + confidence)
    / 2``, instead of ``1 - q``. Resampling m blocks gives a variance ``(m - 1) / m`` of the
    unbiased one, and with m blocks the spread is known only to m - 1 degrees of freedom
    (Student t, as in batch means). At 99% the ends move from the 0.5% quantiles to the 0.14%
    ones for 18 blocks (an interval about 16% wider), hardly at all for 10 000. Moving the
    levels, not the distances, keeps an interval's skew and gives the difference and the ratio
    of two replicates the same sign. On re-runs of one simulated load (12 req/s, 40 pairs, 18
    blocks a run) widening took the false flags from 3.3% to 1.8% of latency statistics and the
    rms of ``delta / sd`` from 1.17 to 1.00."""
    from scipy.stats import norm
    from scipy.stats import t as student_t

    q = (1 + confidence) / 2
    if m < 2:
        return 1 - q
    return float(norm.cdf(-np.sqrt(m / (m - 1)) * student_t.ppf(q, m - 1)))


def interval(reps: np.ndarray, confidence: float, m: int) -> tuple[float, float] | None:
    """The expanded percentile interval of ``reps`` (NaN left out; :func:`tail_level`); None
    when no replicate is finite."""
    r = reps[np.isfinite(reps)]
    if not len(r):
        return None
    a = tail_level(m, confidence)
    lo, hi = np.quantile(r, [a, 1 - a])
    return float(lo), float(hi)


GRID = 1024  # ranks per grid pass: exact below this many ranks in the replicates' bracket
CHUNK = 4096  # replicates per matrix product (bounds memory at CHUNK x GRID doubles: 32 MiB)


@dataclass(frozen=True)
class Blocked:
    """One metric's values of a run, sorted, each with the time block it fell in
    (``pipeline.compare.blocked_values`` cuts them)."""

    xs: np.ndarray  # sorted values
    block: np.ndarray  # int16 block index (0..m-1) of each sorted value
    m: int  # blocks in the run (some may hold none of this metric's values)

    @property
    def counts(self) -> np.ndarray:
        return np.bincount(self.block, minlength=self.m).astype(float)


def weights(m: int, b: int, rng: np.random.Generator) -> np.ndarray:
    """``b`` replicates' block multiplicities: ``m`` blocks drawn with replacement (b x m)."""
    return rng.multinomial(m, np.full(m, 1.0 / m), size=b).astype(float)


def mean_replicates(v: Blocked, w: np.ndarray) -> np.ndarray:
    """``sum_j w_j S_j / sum_j w_j n_j`` per replicate; NaN where a replicate drew no value."""
    sums = np.bincount(v.block, weights=v.xs, minlength=v.m)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (w @ sums) / (w @ v.counts)


class _Ranks:
    """Per-block counts of values at or below a global rank, for any set of ranks."""

    def __init__(self, v: Blocked):
        n = len(v.xs)
        self.n, self.m = n, v.m
        # composite key block * n + rank, sorted: a block's ranks are one ascending run (a stable
        # sort of small integers is a radix sort: linear in n)
        order = np.argsort(v.block, kind="stable")
        self.keys = v.block[order].astype(np.int64) * n + order
        self.starts = np.searchsorted(self.keys, np.arange(v.m, dtype=np.int64) * n)

    def cnt(self, ranks: np.ndarray) -> np.ndarray:
        """m x len(ranks): values of block j with rank <= ranks[g]."""
        q = np.arange(self.m, dtype=np.int64)[:, None] * self.n + ranks[None, :]
        return (np.searchsorted(self.keys, q, side="right") - self.starts[:, None]).astype(float)


def _kths(r: _Ranks, w: np.ndarray, coarse: np.ndarray, c_coarse: np.ndarray, ks: list[np.ndarray]) -> list[np.ndarray]:
    """0-based rank of each replicate's k-th smallest value, for each array ``ks`` (k >= 1, rising
    from one array to the next), from the coarse grid's weighted counts ``c_coarse`` (b x G) and
    one finer grid over the ranks that bracket them all."""
    n = r.n

    def bracket(k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        hi_idx = np.minimum((c_coarse < k[:, None]).sum(axis=1), len(coarse) - 1)  # first grid rank reaching k
        return np.where(hi_idx > 0, coarse[np.maximum(hi_idx - 1, 0)] + 1, 0), coarse[hi_idx]

    a, z = int(bracket(ks[0])[0].min()), int(bracket(ks[-1])[1].max())
    fine = np.unique(np.linspace(a, z, min(z - a + 1, GRID)).round().astype(np.int64))
    c = w @ r.cnt(fine)
    out = []
    for k in ks:
        j = np.minimum((c < k[:, None]).sum(axis=1), len(fine) - 1)
        rank = fine[j].astype(float)
        if len(fine) < z - a + 1:  # not every rank on the grid: place k between the grid ranks around it
            jp = np.maximum(j - 1, 0)
            rows = np.arange(len(k))
            c_lo = np.where(j > 0, c[rows, jp], 0.0)
            rank_lo = np.where(j > 0, fine[jp], a - 1).astype(float)
            c_hi = c[rows, j]
            with np.errstate(divide="ignore", invalid="ignore"):
                frac = np.where(c_hi > c_lo, (k - c_lo) / (c_hi - c_lo), 1.0)
            rank = np.ceil(rank_lo + np.clip(frac, 0, 1) * (fine[j] - rank_lo))
        out.append(np.clip(rank, 0, n - 1).astype(np.int64))
    return out


def percentile_replicates(v: Blocked, w: np.ndarray, pcts: list[float]) -> list[np.ndarray]:
    """numpy's linear percentile of each weighted replicate, for each of ``pcts`` (0..100);
    NaN where a replicate drew no value."""
    outs = [np.full(len(w), np.nan) for _ in pcts]
    if len(v.xs) == 0:
        return outs
    r = _Ranks(v)
    n = len(v.xs)
    coarse = np.unique(np.linspace(0, n - 1, min(n, GRID)).round().astype(np.int64))
    cnt_coarse = r.cnt(coarse)  # the same for every replicate
    counts = v.counts
    for s in range(0, len(w), CHUNK):
        wc = w[s : s + CHUNK]
        big_n = wc @ counts
        ok = big_n > 0
        if not ok.any():
            continue
        wc, big_n = wc[ok], big_n[ok]
        c_coarse = wc @ cnt_coarse
        for pct, out in zip(pcts, outs, strict=True):
            h = (big_n - 1) * pct / 100
            lo = np.floor(h)
            k, k_next = _kths(r, wc, coarse, c_coarse, [lo + 1, np.minimum(lo + 2, big_n)])
            x_k, x_next = v.xs[k], v.xs[k_next]
            out[s : s + CHUNK][ok] = x_k + (h - lo) * (x_next - x_k)
    return outs
