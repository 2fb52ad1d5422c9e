"""Plot-ready frames, aggregated in DuckDB so a report stays small for huge runs.

Each function returns a small Polars frame (thousands of rows at most, whatever
the run size) and a sentence saying how it was reduced; charts print it as the
subtitle.  Times on the x axis are seconds since the run's first event.

Reductions:
* iteration timeline: raw points up to ``max_points`` iterations; above that, fixed
  time buckets with min / mean / max per bucket (a spike is never averaged away:
  the max line keeps it).
* iteration vs context: raw points up to ``max_points``; above that a 2-D histogram
  (count per context x time cell) plus every iteration above the p99.9 as a point.
* CDFs: the exact empirical CDF up to ``cdf_points`` values; above that
  ``quantile_cont`` at ``cdf_points`` probabilities, denser in the tail (p99-p100).
* queue / KV series: per-bucket mean above ``max_points`` (a burst shows averaged over its bucket).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import polars as pl

from ..metrics import REQUEST_METRICS
from .. import store

MAX_POINTS = 3000
CDF_POINTS = 500
TOP_N = 15
# A per-iteration table with fitted values written by `tracelat fit` (pipeline/fit),
# looked up by name and columns so the report works with or without it.
FIT_TABLES = ("iteration_fit",)


@dataclass(frozen=True)
class Frame:
    """A plot frame and how it was reduced from the raw rows."""

    df: pl.DataFrame
    method: str
    raw_rows: int


def _pl(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> pl.DataFrame:
    return con.sql(sql, params=store.bind(sql, params)).pl()


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> list[tuple]:
    return con.execute(sql, store.bind(sql, params)).fetchall()


def _one(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> Any:
    rows = _rows(con, sql, params)
    return rows[0][0] if rows else None


def table_columns(con: duckdb.DuckDBPyConnection, table: str) -> set[str]:
    rows = con.execute("select column_name from duckdb_columns() where table_name = ?", [table]).fetchall()
    return {r[0] for r in rows}


def fit_table(con: duckdb.DuckDBPyConnection) -> tuple[str, set[str]] | None:
    """The per-iteration fit table and its columns, when `tracelat fit` has written one."""
    for name in FIT_TABLES:
        cols = table_columns(con, name)
        if {"run_id", "iter"} <= cols and cols & {"residual_ms", "predicted_ms", "is_spike", "spike_cause"}:
            return name, cols
    return None


def origin_s(con: duckdb.DuckDBPyConnection, run_id: str) -> float:
    """The run's first event time (x = 0 on time axes): its first arrival or step start, the
    origin of `explain` and the Perfetto timeline too (a server log may start before the client)."""
    from ..fit.attribution import run_start

    t = run_start(con, run_id)
    return float(t) if t is not None else 0.0


# x position of an iteration: its start, else end minus duration, in s since the run start
def _iter_x(alias: str = "") -> str:
    a = f"{alias}." if alias else ""
    return f"(coalesce({a}t_start, {a}t_end - {a}iteration_ms / 1000) - $t0)"


_ITER_X = _iter_x()


def _rounded(df: pl.DataFrame, digits: int = 4) -> pl.DataFrame:
    return df.with_columns(pl.col(pl.Float64).round(digits))


def iteration_timeline(con: duckdb.DuckDBPyConnection, run_id: str, max_points: int = MAX_POINTS) -> Frame | None:
    """Iteration time over the run: columns ``t_s, lo_ms, mean_ms, hi_ms``."""
    p = {"r": run_id, "t0": origin_s(con, run_id)}
    n, span, untimed = _rows(
        con,
        f"select count(iteration_ms) filter ({_ITER_X} is not null), max({_ITER_X}), "
        f"count(iteration_ms) filter ({_ITER_X} is null) from iteration_metrics where run_id = $r",
        p,
    )[0]
    if not n:
        return None
    left_out = _untimed_note(untimed)
    if n <= max_points or not span:
        df = _pl(
            con,
            f"""select {_ITER_X} as t_s, iteration_ms as lo_ms, iteration_ms as mean_ms,
                                 iteration_ms as hi_ms
                          from iteration_metrics where run_id = $r and iteration_ms is not null
                          and {_ITER_X} is not null order by iter""",
            p,
        )
        return Frame(_rounded(df), f"all {n:,} iterations{left_out}", n)
    buckets = max(max_points // 3, 10)
    p["w"] = span / buckets
    df = _pl(
        con,
        f"""select floor({_ITER_X} / $w) * $w as t_s, min(iteration_ms) as lo_ms,
                             avg(iteration_ms) as mean_ms, max(iteration_ms) as hi_ms
                      from iteration_metrics where run_id = $r and iteration_ms is not null
                      and {_ITER_X} is not null group by 1 order by 1""",
        p,
    )
    return Frame(
        _rounded(df),
        f"{n:,} iterations in {df.height:,} time buckets of {p['w']:.3g} s: min-max band and mean line{left_out}",
        n,
    )


def _untimed_note(untimed: int) -> str:
    """What a time axis leaves out: steps with a duration but no time stamp have no place on it."""
    return f" ({untimed:,} without time stamps left out)" if untimed else ""


def spikes(con: duckdb.DuckDBPyConnection, run_id: str, limit: int = 1000) -> Frame | None:
    """Spike iterations labelled by cause (from the fit table): ``t_s, iteration_ms, cause, residual_ms``."""
    fit = fit_table(con)
    if fit is None or not {"is_spike", "spike_cause"} <= fit[1]:
        return None
    resid = "f.residual_ms" if "residual_ms" in fit[1] else "null::double"
    p = {"r": run_id, "t0": origin_s(con, run_id), "lim": limit}
    total = _one(con, f"select count(*) from {fit[0]} where run_id = $r and is_spike", p)
    df = _pl(
        con,
        f"""select {_iter_x("m")} as t_s,
                             m.iteration_ms, coalesce(f.spike_cause, 'unexplained') as cause, {resid} as residual_ms
                      from {fit[0]} f join iteration_metrics m using (run_id, iter)
                      where f.run_id = $r and f.is_spike
                      order by {resid} desc nulls last, m.iteration_ms desc limit $lim""",
        p,
    )
    shown = f"all {total:,} spikes" if total <= limit else f"the {limit:,} largest of {total:,} spikes"
    return Frame(_rounded(df.sort("t_s")), shown, total)


def iteration_vs_context(con: duckdb.DuckDBPyConnection, run_id: str, max_points: int = MAX_POINTS) -> Frame | None:
    """Points ``context_tokens, iteration_ms, batch`` or, for big runs, histogram cells + tail points.

    Big runs give a frame with ``kind`` = ``cell`` (``ctx_lo, ctx_hi, ms_lo, ms_hi, count``)
    or ``point`` (iterations above the p99.9 of iteration time).
    """
    p: dict[str, Any] = {"r": run_id}
    where = "run_id = $r and context_tokens is not null and iteration_ms is not null"
    n = _one(con, f"select count(*) from iteration_metrics where {where}", p)
    if not n:
        return None
    batch = "case when has_prefill then 'with prefill' else 'decode only' end"
    if n <= max_points:
        df = _pl(
            con,
            f"select context_tokens, iteration_ms, {batch} as batch from iteration_metrics where {where} order by iter",
            p,
        )
        return Frame(_rounded(df), f"all {n:,} iterations", n)
    ctx_max, ms_min, ms_cap = _rows(
        con,
        f"select max(context_tokens), min(iteration_ms), quantile_cont(iteration_ms, 0.999) "
        f"from iteration_metrics where {where}",
        p,
    )[0]
    p.update(cw=max(ctx_max, 1) / 80, mw=max(ms_cap - ms_min, 1e-9) / 50, m0=ms_min, cap=ms_cap)
    cells = _pl(
        con,
        f"""select 'cell' as kind, floor(context_tokens / $cw) * $cw as ctx_lo,
                                (floor(context_tokens / $cw) + 1) * $cw as ctx_hi,
                                $m0 + least(floor((iteration_ms - $m0) / $mw), 49) * $mw as ms_lo,
                                $m0 + (least(floor((iteration_ms - $m0) / $mw), 49) + 1) * $mw as ms_hi,
                                count(*) as count
                         from iteration_metrics where {where} and iteration_ms <= $cap
                         group by all order by ctx_lo, ms_lo""",
        p,
    )
    tail = _pl(
        con,
        f"""select 'point' as kind, context_tokens, iteration_ms, {batch} as batch
                        from iteration_metrics where {where} and iteration_ms > $cap
                        order by iteration_ms desc limit 2000""",
        p,
    )
    df = pl.concat([cells, tail], how="diagonal_relaxed")
    return Frame(
        _rounded(df),
        f"{n:,} iterations: 2-D histogram (80 x 50 cells) up to the p99.9 of "
        f"iteration time, the {tail.height:,} slowest iterations above it as points",
        n,
    )


def decode_only_median_decode_tokens(con: duckdb.DuckDBPyConnection, run_id: str) -> float:
    """Median decode tokens of decode-only steps: where the fitted line is drawn (0 when unknown)."""
    v = _one(
        con, "select median(decode_tokens) from iteration_metrics where run_id = $r and not has_prefill", {"r": run_id}
    )
    return float(v or 0.0)


def cdf(con: duckdb.DuckDBPyConnection, run_id: str, metric: str, points: int = CDF_POINTS) -> Frame | None:
    """Empirical CDF of a metric: ``value_ms, fraction`` (metric from a whitelist)."""
    from ..metrics import SOURCES

    table, where = SOURCES[metric]
    base = f"from {table} where run_id = $r and {where} and {metric} is not null"
    p: dict[str, Any] = {"r": run_id}
    n = _one(con, f"select count(*) {base}", p)
    if not n:
        return None
    if n <= points:
        df = _pl(
            con,
            f"""select {metric} as value_ms, row_number() over (order by {metric}) / count(*) over ()
                          as fraction {base} order by 1""",
            p,
        )
        return Frame(_rounded(df, 6), f"all {n:,} values (exact empirical CDF)", n)
    body = np.linspace(0.0, 0.99, int(points * 0.8), endpoint=False)
    qs = np.concatenate([body, np.linspace(0.99, 1.0, points - len(body))]).round(6)
    # numpy/quantile_cont linear interpolation between order statistics lo and lo + 1; one sort
    # with row numbers fetches the ~2 * points order statistics needed (a list of 500
    # quantile_cont fractions is several times slower on millions of values)
    h = (n - 1) * qs
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    p["pos"] = np.union1d(lo, hi).tolist()
    stats = _pl(
        con,
        f"""with s as (select {metric} as v, row_number() over (order by {metric}) - 1 as i {base})
                         select i, v from s semi join (select unnest($pos) as i) as p using (i) order by i""",
        p,
    )
    idx, v = stats["i"].to_numpy(), stats["v"].to_numpy()
    v_lo, v_hi = v[np.searchsorted(idx, lo)], v[np.searchsorted(idx, hi)]
    df = pl.DataFrame({"value_ms": v_lo + (h - lo) * (v_hi - v_lo), "fraction": qs})
    return Frame(_rounded(df, 6), f"{n:,} values, drawn from {len(qs)} quantiles (denser from p99 up)", n)


def queue_series(con: duckdb.DuckDBPyConnection, run_id: str, max_points: int = MAX_POINTS) -> Frame | None:
    """Long frame ``t_s, series, value`` of running / waiting requests and KV usage (%)."""
    p: dict[str, Any] = {"r": run_id, "t0": origin_s(con, run_id)}
    timed = f"{_ITER_X} is not null"
    have = _rows(
        con,
        f"select count(running_reqs) filter ({timed}), count(waiting_reqs) filter ({timed}), "
        f"count(kv_usage) filter ({timed}), count(*) filter ({timed}), max({_ITER_X}), "
        f"count(*) filter (not ({timed})) from iteration_metrics where run_id = $r",
        p,
    )[0]
    if not any(have[:3]):
        return None
    n, span, left_out = have[3], have[4] or 0, _untimed_note(have[5])
    bucketed = n > max_points and span > 0
    if bucketed:
        p["w"] = span / max(max_points // 4, 10)
        method = f"mean per {p['w']:.3g} s bucket of {n:,} iterations{left_out}"
    else:
        method = f"all {n:,} iterations{left_out}"
    key = f"floor({_ITER_X} / $w) * $w" if bucketed else _ITER_X
    agg = "avg" if bucketed else ""
    wide = _pl(
        con,
        f"""select {key} as t_s, {agg}(running_reqs) as "running requests",
                               {agg}(waiting_reqs) as "waiting requests", {agg}(kv_usage * 100) as "KV usage %"
                        from iteration_metrics where run_id = $r and {timed} {"group by 1" if bucketed else ""}
                        order by 1""",
        p,
    )
    long = wide.unpivot(index="t_s", variable_name="series", value_name="value").drop_nulls("value")
    return Frame(_rounded(long.with_columns(pl.col("value").cast(pl.Float64))), method, n)


def top_iterations(con: duckdb.DuckDBPyConnection, run_id: str, n: int = TOP_N) -> pl.DataFrame:
    """The slowest iterations (largest residual when a fit exists) with their batch."""
    fit = fit_table(con)
    p = {"r": run_id, "t0": origin_s(con, run_id), "n": n}
    extra, join, order = "", "", "m.iteration_ms desc"
    if fit is not None:
        cols = fit[1]
        pick = [c for c in ("predicted_ms", "residual_ms", "spike_cause") if c in cols]
        extra = "".join(f", f.{c}" for c in pick)
        join = f"left join {fit[0]} f using (run_id, iter)"
        order = "f.residual_ms desc nulls last, m.iteration_ms desc" if "residual_ms" in cols else order
    return _pl(
        con,
        f"""select m.iter, round({_iter_x("m")}, 3) as t_s, round(m.iteration_ms, 3) as iteration_ms {extra},
                               m.context_tokens, m.prefill_tokens, m.decode_reqs, m.preempted_reqs, m.waiting_reqs
                        from iteration_metrics m {join} where m.run_id = $r and m.iteration_ms is not null
                        order by {order} limit $n""",
        p,
    )


def top_requests(con: duckdb.DuckDBPyConnection, run_id: str, metric: str, n: int = TOP_N) -> pl.DataFrame:
    """The ``n`` ok requests with the largest ``metric`` (a per-request metric: ttft_ms, tpot_ms, e2e_ms, ...)."""
    assert metric in REQUEST_METRICS  # a column of request_latency, from the registry: safe in the SQL text
    p = {"r": run_id, "t0": origin_s(con, run_id), "n": n}
    return _pl(
        con,
        f"""select req_id, round(t_arrival - $t0, 3) as arrival_s, prompt_tokens, output_tokens,
                               round(queue_ms, 2) as queue_ms, round(ttft_ms, 2) as ttft_ms,
                               round(tpot_ms, 2) as tpot_ms, round(e2e_ms, 2) as e2e_ms, preemptions
                        from request_latency where run_id = $r and status = 'ok' and {metric} is not null
                        order by {metric} desc, req_id limit $n""",
        p,
    )


def tail_shares(summary: dict[str, Any]) -> pl.DataFrame | None:
    """``metric, part, share`` from the summary's ``tail`` section (None when absent)."""
    tail = summary.get("tail")
    if not isinstance(tail, dict):
        return None
    rows = [
        {"metric": str(m), "part": str(part), "share": float(v)}
        for m, parts in tail.items()
        if isinstance(parts, dict)
        for part, v in parts.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    return pl.DataFrame(rows) if rows else None
