"""Metric definitions (the one place they are written down) and the run summary.

All latencies are milliseconds; times in the store are seconds on the run's clock.
Request timestamps: arrival ``a``, scheduled ``s``, first token ``f``, finish ``c``,
output token count ``N``, token times ``t_i``.

=============  ==========================================  ============================
metric         formula                                     grain
=============  ==========================================  ============================
ttft_ms        (f - a) * 1000                              one per ok request
queue_ms       (s - a) * 1000                              one per ok request
prefill_ms     (f - s) * 1000                              one per ok request
e2e_ms         (c - a) * 1000                              one per ok request
tpot_ms        (c - f) * 1000 / (N - 1), only N > 1        one per ok request
itl_ms         (t_i - t_{i-1}) * 1000, i >= 1              one per token gap (token-weighted)
iteration_ms   (t_end - t_start) * 1000, or dur_ms         one per engine step
=============  ==========================================  ============================

Statistics: count, mean, sample std (ddof=1), max, min and the percentiles p50, p90,
p95, p99, p99.9 with linear interpolation (numpy's default, DuckDB ``quantile_cont``).
``iteration_ms`` also has ``cv = std / mean``, the coefficient of variation.

Throughput: ``output_tokens_per_s = sum(N of ok requests) / duration_s`` and
``requests_per_s = ok requests / duration_s``, where ``duration_s`` spans the first
arrival (or step start) to the last finish (or step end).

Other tools' names for these (docs/metrics.md, "Other tools' names"): AIPerf's and guidellm's "ITL"
is our ``tpot_ms``; guidellm's "TPOT" includes the first token
(``(c - a) * 1000 / N``); LLMPerf's "ITL" includes TTFT; Etalon's "TBT" is our
``itl_ms``; vLLM ``bench serve`` uses exactly our names and formulas.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import duckdb

from . import store

METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms", "prefill_ms", "iteration_ms")
STATS = ("p50", "p90", "p95", "p99", "p999", "mean", "std", "max", "count")

# Later stages (model fit, spikes, tail attribution) add summary sections here:
# each provider returns {section_name: value} or {} when it has nothing to say.
SectionProvider = Callable[[duckdb.DuckDBPyConnection, str], dict[str, Any]]
SECTION_PROVIDERS: list[SectionProvider] = []


def _fit_sections(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    from .fit.summary import sections  # imported on use: scipy stays out of `tracelat --help`

    return sections(con, run_id)


SECTION_PROVIDERS.append(_fit_sections)


def _engine_metric_sections(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    from .engine_metrics import section

    return section(con, run_id)


SECTION_PROVIDERS.append(_engine_metric_sections)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and v != v:
        return None
    return v


def metric_stats(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, dict[str, Any]]:
    """Statistics of every metric of a run, ``{metric: {stat: value}}``; empty metrics have count 0."""
    cols = STATS + ("min", "cv")
    rows = con.execute(
        f"select metric, {', '.join(cols)} from metric_stats where run_id = ?", [run_id]
    ).fetchall()
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


def summary(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """The ``summary.json`` structure (docs/reports-and-audit.md) for one run (derived tables must be built)."""
    store.require_run(con, run_id)
    info = run_info(con, run_id)
    stats = metric_stats(con, run_id)
    out: dict[str, Any] = {
        "run_id": run_id,
        "requests": info.get("requests", 0),
        "requests_ok": info.get("requests_ok", 0),
        "requests_failed": info.get("requests_failed", 0),
        "iterations": info.get("iterations", 0),
        "duration_s": info.get("duration_s"),
        "run": run_metadata(con, run_id),
    }
    for m in METRICS:
        out[m] = stats[m]
    out["throughput"] = {
        "output_tokens_per_s": info.get("output_tokens_per_s"),
        "requests_per_s": info.get("requests_per_s"),
        "source": info.get("throughput_source"),
    }
    for provider in SECTION_PROVIDERS:
        out.update(provider(con, run_id))
    return out


def format_summary(s: dict[str, Any]) -> str:
    """A compact human table of a summary."""

    def num(v: Any, digits: int = 2) -> str:
        if v is None:
            return "-"
        if isinstance(v, int):
            return str(v)
        return f"{v:.{digits}f}"

    lines = [
        f"run {s['run_id']}: {s['requests']} requests ({s['requests_failed']} failed), "
        f"{s['iterations']} iterations, {num(s['duration_s'], 3)} s",
        f"throughput: {num(s['throughput']['output_tokens_per_s'], 1)} output tokens/s, "
        f"{num(s['throughput']['requests_per_s'], 3)} requests/s",
        "",
        f"{'metric':<14}{'count':>9}" + "".join(f"{k:>10}" for k in ("p50", "p90", "p99", "p999", "mean", "max")),
    ]
    for m in METRICS:
        st = s[m]
        if not st.get("count"):
            continue
        lines.append(
            f"{m:<14}{st['count']:>9}" + "".join(f"{num(st[k]):>10}" for k in ("p50", "p90", "p99", "p999", "mean", "max"))
        )
    if s["iteration_ms"].get("cv") is not None:
        lines.append(f"iteration time coefficient of variation: {s['iteration_ms']['cv']:.3f}")
    from .engine_metrics import format_lines

    lines += format_lines(s)
    return "\n".join(lines)
