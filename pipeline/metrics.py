"""The metric registry (each metric written down once) and the statistics of a run.

Every list of metrics elsewhere (summary sections, report tables and charts, audit
sources and SLO keys, compare, replay statistics, nightly, fleet, docs/metrics.md) is
derived from :data:`REGISTRY`. A metric's values are a column of a derived table
(``queries/*.sql``, whose header repeats the formula); the registry says which table,
which rows (``where``), its unit and formula, and what other tools call it.

Notation of the formulas: request arrival ``a``, scheduled ``s``, first token ``f``,
finish ``c`` (seconds on the run's clock), output token count ``N``, token times
``t_i``; a step's ``t_start``/``t_end``.

Throughput over time (``queries/summary/steady_state.sql``, rule :data:`STEADY`): the run's
span is cut into equal windows and each window's output-token rate measured; the steady
window is the stretch at the plateau's level (the mode of the smoothed window rates, with a
band as wide as the windows' counting noise asks), without ramp-up and drain, and the peak
is the best window. A run whose rate never holds, or too short to tell, gets no steady
figures, and says why.

Statistics (``queries/metric_stats.sql``): count, mean, sample std (ddof=1), min, max
and the percentiles p50, p90, p95, p99, p99.9 with linear interpolation (numpy's
default, DuckDB ``quantile_cont``); ``iteration_ms`` also has ``cv = std / mean``.

This module is the bottom analysis layer and imports nothing of tracelat's above it: the
summary with the fit's sections is :mod:`pipeline.summary`, SLOs and goodput
:mod:`pipeline.slo`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import duckdb

REQUEST_TABLE = "request_latency"
STEADY_TABLE = "steady_state"  # queries/summary/steady_state.sql: computed per summary, not stored


@dataclass(frozen=True)
class Metric:
    """One metric: the column ``name`` of ``table`` over the rows ``where`` selects."""

    name: str  # the column name; its suffix is the unit
    unit: str
    formula: str  # in the notation of the module docstring
    per: str  # one value per ...
    table: str
    kind: str  # "latency" (what a client sees), "phase" (parts of TTFT), "step" (engine), "throughput" (per run)
    label: str  # short name for tables and chart axes
    where: str = "true"  # SQL predicate over ``table`` (a constant from this file, never user input)
    stats: bool = True  # a distribution: a row per run in metric_stats and a section of summary.json
    compared: bool = True  # `tracelat compare` tests it (it leaves out prefill_ms = ttft_ms - queue_ms)
    long_label: str = ""  # chart axis title when the short label is too terse
    aliases: tuple[tuple[str, str], ...] = ()  # (tool, its name for this same quantity)

    @property
    def axis_title(self) -> str:
        return f"{self.long_label or self.label} ({self.unit})"


_OK = "status = 'ok'"
REGISTRY: tuple[Metric, ...] = (
    Metric(
        "ttft_ms",
        "ms",
        "(f - a) * 1000",
        "ok request",
        REQUEST_TABLE,
        "latency",
        "TTFT",
        _OK,
        aliases=(
            ("vLLM bench serve", "TTFT (*_ttft_ms)"),
            ("AIPerf", "time_to_first_token"),
            ("GenAI-Perf", "time_to_first_token"),
        ),
    ),
    Metric(
        "tpot_ms",
        "ms",
        "(c - f) * 1000 / (N - 1), only when N > 1",
        "ok request",
        REQUEST_TABLE,
        "latency",
        "TPOT",
        _OK,
        # AIPerf's and GenAI-Perf's "inter_token_latency" are one value per request,
        # (request_latency - ttft) / (output tokens - 1) (AIPerf inter_token_latency_metric.py,
        # GenAI-Perf llm_profile_data_parser.py): TPOT, not the token gaps of itl_ms
        aliases=(
            ("vLLM bench serve", "TPOT (*_tpot_ms)"),
            ("AIPerf", "inter_token_latency"),
            ("GenAI-Perf", "inter_token_latency"),
            ("guidellm", "ITL"),
            ("inference-perf", "TPOT"),
        ),
    ),
    Metric(
        "itl_ms",
        "ms",
        "(t_i - t_{i-1}) * 1000 for i >= 1",
        "token gap (token-weighted)",
        "token_gaps",
        "latency",
        "ITL",
        aliases=(
            ("vLLM bench serve", "ITL (*_itl_ms)"),
            ("AIPerf", "inter_chunk_latency"),
            ("inference-perf", "ITL"),
            ("Etalon", "TBT"),
        ),
    ),
    Metric(
        "e2e_ms",
        "ms",
        "(c - a) * 1000",
        "ok request",
        REQUEST_TABLE,
        "latency",
        "E2E",
        _OK,
        long_label="E2E latency",
        aliases=(
            ("vLLM bench serve", "E2EL (*_e2el_ms)"),
            ("AIPerf", "request_latency"),
            ("GenAI-Perf", "request_latency"),
        ),
    ),
    Metric("queue_ms", "ms", "(s - a) * 1000", "ok request", REQUEST_TABLE, "phase", "queueing", _OK),
    Metric("prefill_ms", "ms", "(f - s) * 1000", "ok request", REQUEST_TABLE, "phase", "prefill", _OK, compared=False),
    Metric(
        "iteration_ms",
        "ms",
        "(t_end - t_start) * 1000, or dur_ms",
        "engine step",
        "iteration_metrics",
        "step",
        "iteration",
        long_label="iteration time",
    ),
    Metric(
        "gap_ms",
        "ms",
        "(t_start - previous t_end) * 1000",
        "engine step (host time between steps)",
        "iteration_metrics",
        "step",
        "step gap",
        stats=False,
        compared=False,
    ),
    Metric(
        "output_tokens_per_s",
        "tokens/s",
        "sum(N of ok requests) / duration_s (no request N: sum(decode_tokens) / steps' span)",
        "run",
        "run_summary",
        "throughput",
        "output tokens/s",
        stats=False,
        compared=False,
    ),
    Metric(
        "requests_per_s",
        "requests/s",
        "ok requests / duration_s",
        "run",
        "run_summary",
        "throughput",
        "requests/s",
        stats=False,
        compared=False,
    ),
    # steady state and peak (rule: STEADY below); null when the run reaches no steady state
    Metric(
        "steady_output_tokens_per_s",
        "tokens/s",
        "output tokens in the steady window / its span_s",
        "run (null without a steady state)",
        STEADY_TABLE,
        "throughput",
        "steady output tokens/s",
        stats=False,
        compared=False,
    ),
    Metric(
        "steady_requests_per_s",
        "requests/s",
        "ok requests finishing in the steady window / its span_s",
        "run (null without a steady state)",
        STEADY_TABLE,
        "throughput",
        "steady requests/s",
        stats=False,
        compared=False,
    ),
    Metric(
        "peak_output_tokens_per_s",
        "tokens/s",
        "max over windows of output tokens in the window / window_s",
        "run (null when too short to tell)",
        STEADY_TABLE,
        "throughput",
        "peak output tokens/s",
        stats=False,
        compared=False,
    ),
    # the iteration-time identity: system throughput = effective batch size / iteration time
    Metric(
        "batch_per_iteration_tokens_per_s",
        "tokens/s",
        "mean decode_tokens per step * 1000 / mean iteration_ms, steps ending in the steady window",
        "run (null without a steady state)",
        STEADY_TABLE,
        "throughput",
        "batch / iteration time",
        stats=False,
        compared=False,
    ),
    Metric(
        "step_decode_tokens_per_s",
        "tokens/s",
        "sum(decode_tokens) of steps ending in the steady window / its span_s",
        "run (null without a steady state)",
        STEADY_TABLE,
        "throughput",
        "decode tokens/s from steps",
        stats=False,
        compared=False,
    ),
)


@dataclass(frozen=True)
class SteadyRule:
    """When a run is in steady state: the constants of ``queries/summary/steady_state.sql``.

    **Windows.** The span ``[t0, t1]`` (``run_summary``'s ``t_first``..``t_last``) is cut into
    ``n = min(max_windows, max(min_windows, ceil(d / max_window_s)))`` equal windows of
    ``w = d / n``, ``d = t1 - t0``. Tokens are where the run's throughput counts them
    (``run_summary.throughput_source``): ok requests' ``token_times`` (or, for a request without
    them, one token at its first token and the other N - 1 spread evenly to its finish), else
    the steps' decode tokens at their end; times outside the span are left out.
    ``rate_k = sum_i x_ik / w`` with ``x_ik`` the tokens of unit ``i`` (a request; a step) in
    window ``k``. When the windows from the one where the cumulative token share passes
    ``stretch_tail`` to the one where it reaches ``1 - stretch_tail`` cover less than
    ``empty_span_share`` of the span (a clock jump, a long idle tail), the run is windowed
    again over that busy stretch and says so.

    **Counting noise.** ``noise = sqrt(busy_windows * sum_ik x_ik^2) / tokens``: the relative
    standard error of a busy window's token count when units arrive at random (compound
    Poisson; ``1 / sqrt(u)`` for windows holding ``u`` equal units). Above ``max_noise``
    (fewer than 4 units' worth of tokens a window) the run is too short to tell and has
    no steady state and no peak.

    **Level and band.** ``s_k = median(rate_{k-1}, rate_k, rate_{k+1})`` smooths one-window
    bursts and dips out. ``beta = max(band, noise_z * noise)``, for a steps-only run also at least
    ``noise_z`` times the windows' own robust scatter of rates, taken up to ``max_scatter`` (steps
    are no independent units: queries/summary/steady_state.sql ``scatter``): a window is in band at level
    ``L`` when ``L / (1 + beta) <= s_k <= L * (1 + beta)``. The level is the plateau's, not the
    run's median: ``L`` = the median of the ``s_k`` in band of the mode, the busy window's
    ``s_j`` whose band holds the most tokens (ramps spread their windows over many levels, a
    hold piles them on one).

    **Steady window** = first..last window with ``s_k`` within a factor ``1 + band`` of ``L``
    (the edges at the strict band, so a ramp within the noise stays out). Reached when
    ``noise <= max_noise``, the window spans at least
    ``max(min_span_share, ramp_guard * beta / (1 + beta))`` of the busy span (first to last
    window with tokens) and at least ``min_in_band_share`` of its windows are in band. The
    top band of a pure linear ramp covers ``beta / (1 + beta)`` of it: the ramp guard asks a
    hold to be half as long again, so a noisier run needs a longer hold.

    **Uncertainty** (what `tracelat compare` and nightly read): batch means over the steady
    window's ``m`` windows, ``d_k = rate_k - steady rate``: ``se = sqrt(sum d_k^2 / (m - 1) / m
    * (1 + rho) / (1 - rho))`` with ``rho = max(0, sum d_k d_{k-1} / sum d_k^2)`` (windows share
    requests, so neighbours correlate); none below ``min_interval_windows`` windows or above
    ``max_lag1`` (a drifting rate). The window's edges were chosen from the same rates, so an
    interval adds ``edge``: the most the rate moves when the left edge moves one window, plus
    the same for the right: ``rate ± (t * se + edge)``.
    """

    max_window_s: float = 10.0
    min_windows: int = 20
    max_windows: int = 10_000
    band: float = 0.2
    edge_share: float = 0.5
    noise_z: float = 2.0
    max_noise: float = 0.5
    # a steps-only run's band takes its windows' scatter up to this (about 25 requests' worth of
    # tokens a window): beyond it the scatter is the load swinging, not counting noise
    max_scatter: float = 0.2
    min_span_share: float = 0.25
    ramp_guard: float = 1.5
    min_in_band_share: float = 0.8
    stretch_tail: float = 0.01
    min_interval_windows: int = 10
    max_lag1: float = 0.9
    empty_span_share: float = 0.5  # applied in pipeline/steady.py, not a query parameter

    def params(self) -> dict[str, float]:
        """The query's bound parameters (``$max_window_s`` ...)."""
        return {k: v for k, v in asdict(self).items() if k != "empty_span_share"}


STEADY = SteadyRule()

# Names other tools use for something that is NOT the metric of ours it sounds like
# (docs/metrics.md, "Other tools' names"): (tool, their name, their formula, what it is to us).
FALSE_FRIENDS: tuple[tuple[str, str, str, str], ...] = (
    ("guidellm", "TPOT", "(c - a) * 1000 / N", "includes the first token: not tpot_ms"),
    ("inference-perf", "NTPOT", "e2e_ms / N", "normalised latency: not reported"),
    ("LLMPerf", "inter_token_latency", "(TTFT + sum of gaps) / N", "includes TTFT: not itl_ms"),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in REGISTRY}
# distributions with statistics, in summary.json order
METRICS: tuple[str, ...] = tuple(m.name for m in REGISTRY if m.stats)
# per-request distributions: columns of request_latency, the keys of an SLO file's [goodput]
REQUEST_METRICS: tuple[str, ...] = tuple(m.name for m in REGISTRY if m.stats and m.table == REQUEST_TABLE)
# what a client sees: TTFT, TPOT, ITL, E2E
LATENCY: tuple[str, ...] = tuple(m.name for m in REGISTRY if m.stats and m.kind == "latency")
# the distributions `tracelat compare` tests
COMPARED: tuple[str, ...] = tuple(m.name for m in REGISTRY if m.stats and m.compared)
# the report's headline cards: client latencies and the engine step
HEADLINE: tuple[str, ...] = tuple(m.name for m in REGISTRY if m.stats and m.kind in ("latency", "step"))
# metric -> (table, filter) holding its values in column <metric>; from this file only, so safe to format into SQL
SOURCES: dict[str, tuple[str, str]] = {m.name: (m.table, m.where) for m in REGISTRY if m.stats}
# table -> (when its row happened, in seconds on the run's clock; its order when times are missing):
# the block bootstrap of `tracelat compare` groups values by it (pipeline/blockboot.py): a request
# by its arrival, a token gap by its token, a step by its start (a step with only a duration, by its number)
TIME_OF: dict[str, tuple[str, str]] = {
    REQUEST_TABLE: ("t_arrival", "t_arrival, req_id"),
    "token_gaps": ("t_token", "t_token, req_id, idx"),
    "iteration_metrics": ("coalesce(t_start, t_end)", "coalesce(t_start, t_end), iter"),
}
STATS = ("p50", "p90", "p95", "p99", "p999", "mean", "std", "max", "count")


def percentile_of(stat: str) -> float | None:
    """The percentile (0..100) a stat name like ``p99``, ``p999`` or ``p01`` stands for.

    The digits after the first two are decimals, as in the summary's ``p999`` (99.9):
    ``p5``/``p05`` = 5, ``p50`` = 50, ``p001`` = 0.1, ``p9999`` = 99.99.  Returns None
    for names that are not percentiles.
    """
    m = re.fullmatch(r"p(\d+)", stat)
    if not m:
        return None
    digits = m.group(1)
    if len(digits) >= 3 and digits.startswith("10"):
        return None  # p100 would read as 10.0: ask for "max" instead
    return float(digits) if len(digits) <= 2 else float(f"{digits[:2]}.{digits[2:]}")


def percentile_name(p: float) -> str:
    """1.0 -> "p01", 50.0 -> "p50", 0.1 -> "p001", 99.9 -> "p999" (inverse of :func:`percentile_of`)."""
    whole, frac = f"{p:.4f}".rstrip("0").rstrip(".").partition(".")[::2]
    return "p" + whole.zfill(2) + frac


def _clean(v: Any) -> Any:
    if isinstance(v, float) and v != v:
        return None
    return v


def metric_stats(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, dict[str, Any]]:
    """Statistics of every metric of a run, ``{metric: {stat: value}}``; empty metrics have count 0."""
    cols = STATS + ("min", "cv")
    rows = con.execute(f"select metric, {', '.join(cols)} from metric_stats where run_id = ?", [run_id]).fetchall()
    out: dict[str, dict[str, Any]] = {m: {s: None for s in STATS} | {"count": 0} for m in METRICS}
    for row in rows:
        out[row[0]] = {c: _clean(v) for c, v in zip(cols, row[1:])}
    for m in METRICS:
        if m != "iteration_ms":
            out[m].pop("cv", None)
        else:
            out[m].setdefault("cv", None)
    return out


def _one_row(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> dict[str, Any]:
    """The first row of a query as ``{column: value}``, or ``{}``."""
    cur = con.execute(sql, params)
    rows = cur.fetchall()
    return {d[0]: _clean(v) for d, v in zip(cur.description, rows[0])} if rows else {}


def run_info(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    return _one_row(
        con,
        "select run_id, requests, requests_ok, requests_failed, iterations, duration_s, busy_s, "
        "output_tokens_per_s, requests_per_s, throughput_source from run_summary where run_id = ?",
        [run_id],
    )


def run_metadata(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    import json

    out = _one_row(
        con,
        "select engine, engine_version, model, gpu, num_gpus, dtype, kv_dtype, clock, meta from runs where run_id = ?",
        [run_id],
    )
    if out:
        out["meta"] = json.loads(out["meta"]) if out["meta"] else {}
    return out
