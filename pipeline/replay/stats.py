"""Latency statistics of a replay, from the simulator's arrays (no store round trip).

Per-request metrics are the registry's (:mod:`pipeline.metrics`): the replay's requests
go through ``queries/request_latency.sql`` in a scratch DuckDB, so the formulas are
written once. The population is the observed statistics': requests whose recorded
status is ``ok`` (and that finished in the replay). Percentiles are linear (numpy's default,
DuckDB's ``quantile_cont``). ``tests/replay`` checks these numbers against the
SQL pipeline on an ingested replay trace.

ITL without materialising every token: a request emits one token at the end of
each step of an uninterrupted segment ``first..last``, so its gaps inside the
segment are the step spans ``t_end[k] - t_end[k-1]`` for ``k`` in
``first+1..last``. The ITL distribution is therefore the step spans, each
weighted by the number of ok segments covering both ``k-1`` and ``k`` (a
difference array), plus one gap per resumption after a preemption. Percentiles
of that weighted set equal numpy's on the expanded list (:func:`weighted_quantiles`).
"""

from __future__ import annotations

from typing import Any

from functools import cache

import duckdb
import numpy as np

from .. import store
from ..metrics import METRICS, REQUEST_METRICS, REQUEST_TABLE, SOURCES
from ..sim import SimResult

__all__ = ["METRICS", "REQUEST_METRICS", "replay_stats", "request_latency", "request_values", "weighted_quantiles"]


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs) -> np.ndarray:
    """Linear-interpolation quantiles of ``values`` repeated ``weights`` times (integer weights).

    Equals ``np.quantile(np.repeat(values, weights), qs)`` without building the
    repeated array. NaN for an empty set.
    """
    qs = np.atleast_1d(np.asarray(qs, dtype=float))
    w = np.asarray(weights, dtype=np.int64)
    keep = w > 0
    v, w = np.asarray(values, dtype=float)[keep], w[keep]
    n = int(w.sum())
    if n == 0:
        return np.full(len(qs), np.nan)
    order = np.argsort(v, kind="stable")
    v, cum = v[order], np.cumsum(w[order])
    h = (n - 1) * qs  # numpy's position in the sorted expanded array
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    # the element at expanded position p is v[first index with cum > p]
    v_lo = v[np.searchsorted(cum, lo, side="right")]
    v_hi = v[np.searchsorted(cum, hi, side="right")]
    return v_lo + (h - lo) * (v_hi - v_lo)


def _weighted_moments(values: np.ndarray, weights: np.ndarray) -> tuple[float, float, float, float]:
    """Mean, sample std (ddof=1), min and max of the weighted set."""
    keep = weights > 0
    v, w = values[keep], weights[keep].astype(float)
    n = w.sum()
    if n == 0:
        return (np.nan,) * 4
    mean = float((v * w).sum() / n)
    std = float(np.sqrt(((v - mean) ** 2 * w).sum() / (n - 1))) if n > 1 else np.nan
    return mean, std, float(v.min()), float(v.max())


def itl_weights(result: SimResult, ok_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ITL values (ms) and their integer weights for the requests in ``ok_rows`` (bool per request)."""
    t_end = result.iterations["t_end"]
    n_it = len(t_end)
    seg = result.token_segments
    sel = ok_rows[seg["req"]] if len(seg["req"]) else np.zeros(0, bool)
    req, first, last = seg["req"][sel], seg["first"][sel], seg["last"][sel]
    diff = np.zeros(n_it + 1, dtype=np.int64)
    np.add.at(diff, first + 1, 1)  # steps first+1..last each carry one gap of this segment
    np.add.at(diff, last + 1, -1)
    span_w = np.cumsum(diff[:n_it])
    spans = np.diff(t_end, prepend=t_end[0] if n_it else 0.0) * 1000.0
    # a preempted request resumes in a later segment: one gap from its last token before to the first after
    order = np.lexsort((first, req))
    req_s, first_s, last_s = req[order], first[order], last[order]
    cont = np.flatnonzero(req_s[1:] == req_s[:-1])
    resume = (t_end[first_s[cont + 1]] - t_end[last_s[cont]]) * 1000.0
    return np.concatenate([spans, resume]), np.concatenate([span_w, np.ones(len(resume), np.int64)])


@cache
def _request_latency_sql() -> str:
    return next(q.sql for q in store.query_files() if q.table == REQUEST_TABLE)


def request_latency(result: SimResult, rows: np.ndarray, run_id: str = "replay") -> duckdb.DuckDBPyConnection:
    """A scratch connection whose ``request_latency`` is ``queries/request_latency.sql`` over the
    replay's requests in ``rows`` (bool per request): the formulas of the store, not a copy."""
    import polars as pl

    rq = result.requests
    cols = (
        "req_id",
        "status",
        "prompt_tokens",
        "output_tokens",
        "preemptions",
        "t_arrival",
        "t_scheduled",
        "t_first_token",
        "t_finish",
    )
    df = pl.DataFrame({k: rq[k][rows] for k in cols}).with_columns(
        pl.col("t_arrival", "t_scheduled", "t_first_token", "t_finish").fill_nan(None),  # not reached: null
        pl.col("req_id").cast(pl.String),
        run_id=pl.lit(run_id),
        cached_tokens=pl.lit(None, pl.Int64),
    )
    con = store.scratch()
    con.register("requests", df)
    con.execute(f"create temp view {REQUEST_TABLE} as {_request_latency_sql()}")
    return con


def request_values(result: SimResult, ok_rows: np.ndarray) -> dict[str, np.ndarray]:
    """Per-request metric values (ms) of the requests in ``ok_rows`` that finished (nulls dropped)."""
    rows = np.asarray(ok_rows, bool)[: result.n_requests]
    con = request_latency(result, rows)
    try:
        return {
            m: con.sql(f"select {m} from {REQUEST_TABLE} where {SOURCES[m][1]} and {m} is not null")
            .fetchnumpy()[m]
            .astype(float)
            for m in REQUEST_METRICS
        }
    finally:
        con.close()


def _describe(values: np.ndarray, weights: np.ndarray | None, qs: list[float], names: list[str]) -> dict[str, Any]:
    w = np.ones(len(values), np.int64) if weights is None else weights
    mean, std, lo, hi = _weighted_moments(values, w)
    out: dict[str, Any] = {"count": int(w.sum()), "mean": mean, "std": std, "min": lo, "max": hi}
    out.update(zip(names, (float(x) for x in weighted_quantiles(values, w, qs))))
    return out


STAT_QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}


def replay_stats(
    result: SimResult, ok_rows: np.ndarray | None = None, extra_quantiles: dict[str, float] | None = None
) -> dict[str, Any]:
    """``{metric: {count, mean, std, min, max, p50, ...}}`` plus ``throughput`` of a replay.

    ``ok_rows`` (bool per request row, default all) restricts to the comparison
    population. ``extra_quantiles`` adds named quantiles (``{"p97": 0.97}``).
    Throughput uses the SQL definition: ok output tokens (requests) over the span
    from the first arrival or step start to the last finish or step end.
    """
    rq = result.requests
    ok_rows = np.ones(result.n_requests, bool) if ok_rows is None else np.asarray(ok_rows, bool)[: result.n_requests]
    quants = STAT_QUANTILES | (extra_quantiles or {})
    names, qs = list(quants), list(quants.values())
    vals = request_values(result, ok_rows)
    out: dict[str, Any] = {m: _describe(vals[m], None, qs, names) for m in REQUEST_METRICS}
    iv, iw = itl_weights(result, ok_rows & (rq["status"] == "ok"))
    out["itl_ms"] = _describe(iv, iw, qs, names)
    it = result.iterations
    out["iteration_ms"] = _describe((it["t_end"] - it["t_start"]) * 1000.0, None, qs, names)
    done = ok_rows & (rq["status"] == "ok")
    starts = [x.min() for x in (rq["t_arrival"], it["t_start"]) if len(x)]
    ends = [np.nanmax(x) for x in (rq["t_finish"][done], it["t_end"]) if len(x)]
    dur = max(ends) - min(starts) if starts and ends else np.nan
    out["throughput"] = {
        "output_tokens_per_s": float(rq["output_tokens"][done].sum() / dur) if dur > 0 else np.nan,
        "requests_per_s": float(done.sum() / dur) if dur > 0 else np.nan,
        "duration_s": float(dur),
    }
    return out
