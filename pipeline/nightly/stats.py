"""The headline statistics of one night, each with a confidence interval where one exists.

Names are ``<group>.<stat>`` (``tpot_ms.p99``, ``throughput.output_tokens_per_s``,
``tail.tpot.decode_baseline``); :func:`direction` says which way is worse.

* Latency percentiles (TTFT, TPOT, ITL, E2E; p50, p90, p99): the block bootstrap over time of
  ``tracelat compare`` (:mod:`pipeline.blockboot`: requests of one run share its queue, so
  resampling them one by one gave intervals too narrow); a percentile with too few values
  beyond it (``BlockRule.min_tail``) gets the value only.
* Throughput: the normal approximations of ``tracelat compare``.
* Goodput attainment and request goodput (with an SLO file that has
  ``[goodput]``): binomial and Poisson normal approximations.
* Steady-state output tokens/s (when the run reaches one): value only.
* Iteration-time CV: no interval (the value only).
* Model fit: ``t0`` and the per-context-token slope with the fit's intervals;
  effective bandwidth ``= kv_bytes / slope`` (when the model and GPU are known),
  its interval the slope's inverted.
* Stall rate: unexplained spikes per iteration, binomial interval.
* Tail shares (what the p99 group's extra latency is made of): value only; they
  are descriptive (no direction), used to say which cause moved with a change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np

from ..metrics import BY_NAME, LATENCY

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0}
_LOWER_IS_WORSE = ("throughput.", "goodput.", "fit.effective_bandwidth_gbps")
_NAMES = {m: BY_NAME[m].label for m in LATENCY} | {
    "throughput.output_tokens_per_s": "output tokens/s",
    "throughput.requests_per_s": "requests/s",
    "throughput.steady_output_tokens_per_s": "steady output tokens/s",
    "goodput.attainment": "goodput attainment",
    "goodput.request_goodput_rps": "request goodput (req/s)",
    "iteration_ms.cv": "iteration-time CV",
    "fit.t0_ms": "fitted t0 (ms)",
    "fit.ms_per_1k_context_tokens": "ms per 1k context tokens",
    "fit.effective_bandwidth_gbps": "effective bandwidth (GB/s)",
    "stalls.rate": "stall rate",
}


@dataclass(frozen=True)
class Stat:
    """One statistic of one night."""

    metric: str
    value: float
    ci_low: float | None = None
    ci_high: float | None = None


def direction(metric: str) -> int:
    """+1: higher is worse; -1: lower is worse; 0: descriptive (tail shares)."""
    if metric.startswith("tail."):
        return 0
    return -1 if metric.startswith(_LOWER_IS_WORSE) else 1


def label(metric: str) -> str:
    """A reader's name: ``TPOT p99``, ``prefill interference share (TPOT tail)``."""
    if metric in _NAMES:
        return _NAMES[metric]
    head, _, stat = metric.rpartition(".")
    if head in _NAMES:
        return f"{_NAMES[head]} {stat}"
    if metric.startswith("tail."):
        _, fam, cause = metric.split(".", 2)
        return f"{cause.replace('_', ' ')} share ({fam.upper()} tail)"
    return metric


def _latency(
    con: duckdb.DuckDBPyConnection, run_id: str, confidence: float, resamples: int, rng: np.random.Generator
) -> list[Stat]:
    from ..blockboot import interval, weights
    from ..compare import blocked_values, replicates, run_blocks

    blocks = run_blocks(con, run_id)
    w = weights(blocks.blocks, resamples, rng)
    out = []
    for metric in LATENCY:
        v = blocked_values(con, run_id, metric, blocks)  # sorted
        if len(v.xs) < 2:
            continue
        reps = replicates(v, w, tuple(PERCENTILES))  # None where the tail is too thin
        for name, pct in PERCENTILES.items():
            r = reps[name]
            ci = None if r is None else interval(r, confidence, blocks.blocks)
            out.append(Stat(f"{metric}.{name}", float(np.percentile(v.xs, pct)), *(ci or (None, None))))
    return out


def _normal(metric: str, value: float | None, se: float | None, z: float) -> list[Stat]:
    if value is None:
        return []
    if se is None:
        return [Stat(metric, float(value))]
    return [Stat(metric, float(value), float(value - z * se), float(value + z * se))]


def _proportion(metric: str, k: float, n: float, z: float) -> list[Stat]:
    """A share with its Wilson interval: the normal one has zero width at 0 and 1 (every request
    good), which a change-point search would take as exact."""
    from ..compare import wilson

    if not n:
        return []
    lo, hi = wilson(int(k), int(n), z)
    return [Stat(metric, k / n, max(lo, 0.0), min(hi, 1.0))]


def _fit(s: dict[str, Any]) -> list[Stat]:
    fit = s.get("fit")
    if not isinstance(fit, dict):
        return []
    ci = fit.get("ci") or {}
    out = []
    t0 = fit.get("t0_ms")
    if t0 is not None:
        lo, hi = ci.get("t0_ms") or (None, None)
        out.append(Stat("fit.t0_ms", float(t0), lo, hi))
    per_k = fit.get("ms_per_1k_context_tokens")
    a_ci = ci.get("a_ms_per_ctx") or (None, None)
    if per_k is not None:
        out.append(Stat("fit.ms_per_1k_context_tokens", float(per_k), *(None if v is None else 1000 * v for v in a_ci)))
    bw = fit.get("effective_bandwidth_gbps")
    if bw is not None and per_k:
        # bandwidth = kv_bytes / a: the slope's interval, inverted (an upper end of a <= 0 has none)
        a = per_k / 1000
        lo = bw * a / a_ci[1] if a_ci[1] and a_ci[1] > 0 else None
        hi = bw * a / a_ci[0] if a_ci[0] and a_ci[0] > 0 else None
        out.append(Stat("fit.effective_bandwidth_gbps", float(bw), lo, hi))
    return out


def _tail(s: dict[str, Any]) -> list[Stat]:
    tail = s.get("tail")
    if not isinstance(tail, dict):
        return []
    return [
        Stat(f"tail.{fam}.{cause}", float(v))
        for fam, parts in sorted(tail.items())
        if isinstance(parts, dict)
        for cause, v in sorted(parts.items())
        if isinstance(v, (int, float))
    ]


def night_statistics(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    summary: dict[str, Any],
    goodput: dict[str, Any] | None = None,
    confidence: float = 0.95,
    resamples: int = 1000,
    seed: int = 0,
) -> list[Stat]:
    """Every headline statistic of ``run_id`` (``summary``: its ``pipeline.summary.summary``;
    ``goodput``: the audit's goodput section, when an SLO file has one)."""
    from scipy.stats import norm

    from ..compare import _throughput

    z = float(norm.ppf(0.5 + confidence / 2))
    rng = np.random.default_rng(seed)
    out = _latency(con, run_id, confidence, resamples, rng)
    for name, pair in _throughput(con, run_id).items():
        if pair is not None:
            out += _normal(f"throughput.{name}", pair[0], pair[1], z)
    if goodput and goodput.get("requests") and goodput.get("attainment") is not None:  # None: not measurable
        out += _proportion("goodput.attainment", goodput["good_requests"], goodput["requests"], z)
        rps, good = goodput.get("request_goodput_rps"), goodput["good_requests"]
        if rps is not None and good:
            # good requests counted over the run's duration: Poisson, SE = rate / sqrt(count)
            out += _normal("goodput.request_goodput_rps", rps, rps / np.sqrt(good), z)
    steady = summary.get("steady_state") or {}
    if steady.get("reached") and steady.get("steady_output_tokens_per_s") is not None:
        # batch means over the steady window's windows, widened by the edge allowance: the
        # hold's edges were chosen from the same windows (pipeline/metrics.py STEADY)
        from ..steady import half_widths

        v, half = float(steady["steady_output_tokens_per_s"]), half_widths(steady, confidence)["output_tokens_per_s"]
        out.append(
            Stat("throughput.steady_output_tokens_per_s", v, *((v - half, v + half) if half is not None else ()))
        )
    cv = (summary.get("iteration_ms") or {}).get("cv")
    if cv is not None:
        out.append(Stat("iteration_ms.cv", float(cv)))
    out += _fit(summary)
    spikes, n_it = summary.get("spikes"), summary.get("iterations") or 0
    if isinstance(spikes, dict) and n_it:
        out += _proportion("stalls.rate", spikes.get("unexplained", 0), n_it, z)
    out += _tail(summary)
    return [st for st in out if np.isfinite(st.value)]
