"""Scoring stall detection against a simulated run's truth (tests and benchmarks).

The simulator knows which steps carry an injected stall and each step's
noise-free time; a fit only sees step times. :func:`score_stalls` compares the
steps a detector flags with the injected stalls; :func:`oracle_recall` bounds
what *any* rule judging one step at a time can reach, so a recall figure can be
read against what the noise allows.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from .model import NoiseModel


def stall_log_odds(y_ms: np.ndarray, base_ms: np.ndarray, noise: NoiseModel) -> np.ndarray:
    """Exact log posterior odds that each step holds an injected stall, given its time and true base.

    A step lasts ``base * f + s`` (see :mod:`pipeline.sim.engine`) with ``ln f ~
    N(-sigma^2/2, sigma^2)`` and, with probability ``stall_rate``, ``s ~ Exp(stall_ms_mean)``
    (else 0). The stalled density convolves the two, integrated over the noise factor.
    """
    sigma, rate, mean = noise.sigma, noise.stall_rate, noise.stall_ms_mean
    mu = -0.5 * sigma * sigma
    log_p0 = -0.5 * ((np.log(y_ms / base_ms) - mu) / sigma) ** 2 - np.log(sigma * y_ms)  # x sqrt(2 pi)
    # the stall s = y - base f must be >= 0: integrate z (f = exp(mu + sigma z)) from -7 to that bound
    z_max = np.clip((np.log(y_ms / base_ms) - mu) / sigma, -7.0, 7.0)
    t = np.linspace(0.0, 1.0, 401)
    z = -7.0 + (z_max + 7.0)[:, None] * t[None, :]
    s = np.maximum(y_ms[:, None] - base_ms[:, None] * np.exp(mu + sigma * z), 0.0)
    # trapezoid rule in log space (a long stall's exp(-s/mean) underflows otherwise)
    w = np.full(len(t), t[1] - t[0])
    w[[0, -1]] /= 2
    with np.errstate(divide="ignore"):
        log_w = np.log((z_max + 7.0)[:, None] * w[None, :])
        log_p1 = logsumexp(-0.5 * z * z - s / mean + log_w, axis=1) - np.log(mean)  # same sqrt(2 pi) as log_p0
        return np.log(rate) + log_p1 - np.log1p(-rate) - log_p0


def best_recall_at_fdr(score: np.ndarray, stalled: np.ndarray, max_fdr: float = 0.05) -> float:
    """Recall of the longest top-``score`` prefix whose false-discovery rate is <= ``max_fdr``."""
    order = np.argsort(-score, kind="stable")
    tp = np.cumsum(stalled[order])
    flagged = np.arange(1, len(order) + 1)
    ok = (flagged - tp) <= max_fdr * flagged
    return float(tp[ok].max() / stalled.sum()) if ok.any() else 0.0


def oracle_recall(
    y_ms: np.ndarray, base_ms: np.ndarray, stalled: np.ndarray, noise: NoiseModel, max_fdr: float = 0.05
) -> float:
    """What the best rule judging one step at a time reaches at <= ``max_fdr`` false discoveries.

    Steps are ranked by :func:`stall_log_odds` (the Bayes ranking), and the cut is
    placed with the truth known (:func:`best_recall_at_fdr`). Told what a fit has to
    estimate, and free to choose its cut after seeing the answers, no per-step rule
    does better in expectation: stalls it misses hide in their step's noise.
    """
    if not stalled.any():
        return float("nan")
    if noise.sigma <= 0:
        return 1.0  # without noise every stall shows
    return best_recall_at_fdr(stall_log_odds(y_ms, base_ms, noise), stalled, max_fdr)


def score_stalls(
    flagged: np.ndarray, stall_ms: np.ndarray, limit_ms: np.ndarray | float | None = None
) -> dict[str, float]:
    """Recall and false-discovery rate of flagged steps against injected stall lengths.

    ``recall``: injected stalls flagged / injected stalls (all of them, however small);
    ``fdr``: flagged steps without a stall / flagged steps (0 when none is flagged);
    ``ms_recall``: stall time in flagged steps / all injected stall time;
    ``recall_above_limit``: recall over stalls longer than ``limit_ms`` (per step or one
    number), when given.
    """
    flagged = np.asarray(flagged, dtype=bool)
    stalled = stall_ms > 0
    out = {
        "stalls": int(stalled.sum()),
        "flagged": int(flagged.sum()),
        "recall": float((flagged & stalled).sum() / stalled.sum()) if stalled.any() else float("nan"),
        "fdr": float((flagged & ~stalled).sum() / flagged.sum()) if flagged.any() else 0.0,
        "ms_recall": float(stall_ms[flagged].sum() / stall_ms.sum()) if stalled.any() else float("nan"),
    }
    if limit_ms is not None:
        big = stalled & (stall_ms > limit_ms)
        out["recall_above_limit"] = float((flagged & big).sum() / big.sum()) if big.any() else float("nan")
    return out


def resampled_steps(
    template: dict[str, np.ndarray], n: int, model, noise: NoiseModel, seed: int
) -> dict[str, np.ndarray]:
    """``n`` steps whose batch compositions are drawn (with replacement) from a simulated run's steps.

    Stall detection judges each step against the fitted model; what it needs from a long run
    is many steps of realistic compositions with known noise and stalls, not the scheduler's
    dynamics. Resampling the compositions of a short scheduled run and drawing fresh noise
    gives a million steps in a second instead of minutes of scheduling. Returns the
    composition columns, ``base_ms``, ``stall_ms`` and the measured ``iteration_ms``.
    """
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, len(template["context_tokens"]), n)
    out = {c: template[c][rows] for c in ("context_tokens", "prefill_tokens", "decode_tokens")}
    base = model.base_ms(out["context_tokens"], out["prefill_tokens"], out["decode_tokens"])
    factor, stall = noise.draw(rng, n)
    return out | {"base_ms": base, "stall_ms": stall, "iteration_ms": base * factor + stall}
