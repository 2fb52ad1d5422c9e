"""What an audit measures, in DuckDB SQL over the derived tables.

* :func:`run_stats`: any percentile (and mean/std/min/max) of a run-level metric.
* :func:`goodput`: DistServe / vLLM goodput over the run's ``duration_s``, as defined
  (once, for audits, replay sweeps and the fleet) in :func:`pipeline.slo.goodput`.
* :func:`fluidity`: the Etalon fluidity index.  A request's token ``i`` has the
  "gap" ``s_0 = TTFT`` and ``s_i = ITL_i`` and the deadline ``D_0 = ttft_deadline``,
  ``D_i = tbt_deadline``.  A token is on time when ``s_i <= D_i + slack_{i-1}``; on
  time, ``slack_i = slack_{i-1} + D_i - s_i``; late, the slack resets to 0 and the
  token misses ``floor((s_i - slack_{i-1}) / D_tbt)`` deadlines (the first token
  ``1 + floor((s_0 - D_0) / D_tbt)``): one per TBT deadline that elapsed during the
  stall.  Index = 1 - missed / (on-time tokens + missed).  Because
  ``slack_i = max(0, slack_{i-1} + D_i - s_i)`` (a Lindley recursion), it has the closed
  form ``slack_i = S_i - min(0, min_{k<=i} S_k)`` with ``S_i = sum_{k<=i} (D_k - s_k)``,
  which window functions compute without a loop over tokens.
"""

from __future__ import annotations

from typing import Any

import duckdb

from .. import store
from ..errors import InputError
from ..metrics import SOURCES, percentile_name, percentile_of
from ..slo import FluiditySpec, GoodputSpec
from ..slo import goodput as judge_goodput


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: dict) -> list[tuple]:
    return con.execute(sql, params).fetchall()


def run_stats(con: duckdb.DuckDBPyConnection, run_id: str, metric: str, stats: list[str]) -> dict[str, Any]:
    """``{stat: value}`` for one metric of a run, plus ``count``; values are None when empty.

    Count, mean, std, min and max are the run's ``metric_stats`` row (one definition for the
    summary, reports and audits); percentiles are computed here, any of them.
    """
    table, where = SOURCES[metric]
    qs = sorted({percentile_of(s) / 100 for s in stats if percentile_of(s) is not None}) or [0.5]
    row = _rows(
        con,
        "select count, mean, std, min, max from metric_stats where run_id = $run_id and metric = $metric",
        {"run_id": run_id, "metric": metric},
    )
    count, mean, std, lo, hi = row[0] if row else (0, None, None, None, None)
    quants = _rows(
        con,
        f"select quantile_cont({metric}, $qs) from {table} where run_id = $run_id and {where} and {metric} is not null",
        {"run_id": run_id, "qs": qs},
    )[0][0]
    out: dict[str, Any] = {"count": count, "mean": mean, "std": std, "min": lo, "max": hi}
    by_q = dict(zip(qs, quants or [None] * len(qs)))
    for s in stats:
        p = percentile_of(s)
        if p is not None:
            out[s] = by_q[p / 100]
    return out


def _duration_s(con: duckdb.DuckDBPyConnection, run_id: str) -> float | None:
    rows = _rows(con, "select duration_s from run_summary where run_id = $run_id", {"run_id": run_id})
    return rows[0][0] if rows else None


def goodput(con: duckdb.DuckDBPyConnection, run_id: str, spec: GoodputSpec) -> dict[str, Any]:
    """Goodput of a run under per-request limits (:func:`pipeline.slo.goodput`, over the run's span)."""
    return judge_goodput(con, run_id, spec, _duration_s(con, run_id))


def fluidity_table(con: duckdb.DuckDBPyConnection, run_id: str, spec: FluiditySpec):
    """Polars frame, one row per evaluated request: ``req_id, deadlines, missed, fluidity_index``."""
    params = {"run_id": run_id, "ttft_d": spec.ttft_deadline_ms, "tbt_d": spec.tbt_deadline_ms}
    return store.select(con, "audit/fluidity", params)


def fluidity(con: duckdb.DuckDBPyConnection, run_id: str, spec: FluiditySpec) -> dict[str, Any]:
    """Distribution of the per-request fluidity index and the service-level index."""
    import polars as pl

    per_req = fluidity_table(con, run_id, spec)
    ok = _rows(
        con, "select count(*) from request_latency where run_id = $run_id and status = 'ok'", {"run_id": run_id}
    )[0][0]
    out: dict[str, Any] = {
        "ttft_deadline_ms": spec.ttft_deadline_ms,
        "tbt_deadline_ms": spec.tbt_deadline_ms,
        "requests_evaluated": per_req.height,
        "requests_without_token_times": ok - per_req.height,
    }
    if per_req.height == 0:
        return out
    idx = pl.col("fluidity_index")
    pcts = sorted({1.0, 5.0, 10.0, 50.0} | {p for s in spec.minima if (p := percentile_of(s)) is not None})
    agg = per_req.select(
        idx.mean().alias("mean"),
        idx.min().alias("min"),
        ((idx >= 0.9).mean()).alias("fraction_at_least_0_9"),
        (1 - pl.col("missed").sum() / pl.col("deadlines").sum()).alias("service"),
        *[idx.quantile(p / 100, interpolation="linear").alias(f"q{p}") for p in pcts],
    ).row(0, named=True)
    out.update({k: agg[k] for k in ("mean", "min", "service", "fraction_at_least_0_9")})
    out["percentiles"] = {percentile_name(p): agg[f"q{p}"] for p in pcts}
    return out


def require_data(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """A run must have requests or iterations for an audit to mean anything."""
    n = _rows(
        con, "select coalesce(requests, 0) + coalesce(iterations, 0) from run_summary where run_id = $r", {"r": run_id}
    )
    if not n or not n[0][0]:
        raise InputError(f"run {run_id!r} has no requests and no iterations; nothing to audit")
