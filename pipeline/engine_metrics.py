"""What a run's engine metrics (Prometheus scrapes in ``metric_samples``) say on their own.

For runs with no client or step records this is the only latency evidence, and for the
others a cross-check:

* **latency percentiles from the engine's histograms** (``vllm:time_to_first_token_seconds``
  and friends): the bucket counts' increase over the run (increments summed; after a drop, a
  counter reset, the new value counts whole, as Prometheus' ``increase`` does), summed over
  label sets, then Prometheus'
  ``histogram_quantile`` rule: linear interpolation inside the bucket that holds the rank.
  The estimate can be anywhere in that bucket, so its bounds are reported as the error
  (``bucket_ms``); a quantile in the ``+Inf`` bucket is only known to exceed the largest
  finite bound (``value_ms`` is that bound and ``above_largest_bucket`` says so);
* **gauges over time** (running and waiting requests, KV usage): mean and max of the
  per-scrape totals;
* **counters**: preemptions over the run; vLLM's ``estimated_read_bytes_per_gpu_total`` as
  a read bandwidth (GB/s over the scraped span), to set beside the fitted effective
  bandwidth of ``tracelat fit``.

The aggregation runs in DuckDB (``queries/engine_metrics/*.sql``); only the few buckets of a
histogram reach numpy.
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np

from . import store

HISTOGRAMS = {  # our metric -> engine families (seconds), first present wins
    "ttft_ms": (
        "vllm:time_to_first_token_seconds",
        "sglang:time_to_first_token_seconds",
        "trtllm_time_to_first_token_seconds",
    ),
    "itl_ms": (
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang:time_per_output_token_seconds",
    ),
    "e2e_ms": (
        "vllm:e2e_request_latency_seconds",
        "sglang:e2e_request_latency_seconds",
        "trtllm_e2e_request_latency_seconds",
    ),
    "queue_ms": ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds"),
}
GAUGES = {
    "running_reqs": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting_reqs": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    # vLLM v0's logged throughputs (tokens/s); LLMServingSim's bench timeseries.csv per tick
    "prompt_tokens_per_s": ("vllm:avg_prompt_throughput_toks_per_s",),
    "generation_tokens_per_s": ("vllm:avg_generation_throughput_toks_per_s",),
}
COUNTERS = {"preemptions": ("vllm:num_preemptions_total",)}
READ_BYTES = "vllm:estimated_read_bytes_per_gpu_total"
QUANTILES = (0.5, 0.9, 0.99)


def histogram_quantiles(les: np.ndarray, counts: np.ndarray, qs=QUANTILES) -> dict[str, dict[str, Any]] | None:
    """Quantiles (seconds) from per-bucket increases of a cumulative histogram (``le`` sorted, +Inf last)."""
    total = counts[-1] if len(counts) else 0
    if total <= 0:
        return None
    out: dict[str, dict[str, Any]] = {}
    finite = les[np.isfinite(les)]
    for q in qs:
        rank = q * total
        i = int(np.searchsorted(counts, rank, side="left"))
        lo = 0.0 if i == 0 else float(les[i - 1])
        hi, below = float(les[i]), (0.0 if i == 0 else float(counts[i - 1]))
        key = f"p{int(round(q * 100))}"
        if not np.isfinite(hi):  # in the +Inf bucket: only "more than the largest bound" is known
            out[key] = {
                "value_ms": float(finite[-1]) * 1e3 if len(finite) else None,
                "above_largest_bucket": True,
                "bucket_ms": [lo * 1e3, None],
            }
            continue
        frac = (rank - below) / (counts[i] - below) if counts[i] > below else 1.0
        out[key] = {"value_ms": (lo + (hi - lo) * frac) * 1e3, "bucket_ms": [lo * 1e3, hi * 1e3]}
    return out


def _first_family(con, run_id: str, families: tuple[str, ...], kind_filter: str) -> str | None:
    rows = con.execute(
        f"select distinct family from metric_samples where run_id = ? and family = any(?) {kind_filter}",
        [run_id, list(families)],
    ).fetchall()
    present = {r[0] for r in rows}
    return next((f for f in families if f in present), None)


def section(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """The summary's ``engine_metrics`` section, or nothing when the run has no metric samples."""
    if not con.execute("select count(*) from duckdb_tables() where table_name = 'metric_samples'").fetchall()[0][0]:
        return {}
    if not con.execute("select count(*) from metric_samples where run_id = ?", [run_id]).fetchall()[0][0]:
        return {}
    out: dict[str, Any] = {"latency_from_histograms": {}, "gauges": {}, "counters": {}}
    for metric, fams in HISTOGRAMS.items():
        fam = _first_family(con, run_id, fams, "and kind = 'bucket'")
        if fam is None:
            continue
        b = store.select(con, "engine_metrics/histogram_increase", {"run": run_id, "family": fam})
        les, n = b["le"].to_numpy().astype(float), b["n"].to_numpy().astype(float)
        qs = histogram_quantiles(les, n)
        if qs:
            out["latency_from_histograms"][metric] = {"family": fam, "count": float(n[-1]), **qs}
    for name, fams in GAUGES.items():
        fam = _first_family(con, run_id, fams, "and kind = 'gauge'")
        if fam is not None:
            mean, mx, n = store.rows(con, "engine_metrics/gauge_stats", {"run": run_id, "family": fam})[0]
            out["gauges"][name] = {"family": fam, "mean": mean, "max": mx, "scrapes": n}
    for name, fams in COUNTERS.items():
        fam = _first_family(con, run_id, fams, "and kind = 'counter'")
        if fam is not None:
            inc, _ = store.rows(con, "engine_metrics/counter_increase", {"run": run_id, "family": fam})[0]
            out["counters"][name] = {"family": fam, "increase": inc}
    if _first_family(con, run_id, (READ_BYTES,), "and kind = 'counter'"):
        inc, span = store.rows(con, "engine_metrics/counter_increase", {"run": run_id, "family": READ_BYTES})[0]
        if span:
            out["vllm_estimated_read_gb_per_s"] = inc / span / 1e9
    out["note"] = (
        "percentiles from engine histograms: linear inside the bucket holding the rank; the true value "
        "can be anywhere in bucket_ms"
    )
    return {"engine_metrics": out}


def format_lines(s: dict[str, Any]) -> list[str]:
    em = s.get("engine_metrics")
    if not em:
        return []
    lines = ["engine metrics (Prometheus):"]
    for metric, h in em.get("latency_from_histograms", {}).items():
        parts = []
        for k in ("p50", "p90", "p99"):
            q = h.get(k)
            if not q:
                continue
            lo, hi = q["bucket_ms"]
            parts.append(
                f"{k} {'>' if q.get('above_largest_bucket') else ''}{q['value_ms']:.4g}"
                f" (bucket {lo:.4g}..{'inf' if hi is None else f'{hi:.4g}'})"
            )
        lines.append(f"  {metric} from {h['family']}: " + ", ".join(parts))
    for name, g in em.get("gauges", {}).items():
        lines.append(f"  {name}: mean {g['mean']:.4g}, max {g['max']:.4g} over {g['scrapes']} scrapes")
    for name, c in em.get("counters", {}).items():
        lines.append(f"  {name}: +{c['increase']:.4g} over the run")
    if em.get("vllm_estimated_read_gb_per_s") is not None:
        lines.append(f"  vLLM's estimated read bandwidth per GPU: {em['vllm_estimated_read_gb_per_s']:.4g} GB/s")
    return lines


def gauge_series(con: duckdb.DuckDBPyConnection, run_id: str, t0: float | None):
    """Running/waiting requests and KV usage (%) over time as a long frame ``t_s, series, value``
    (the report's queue chart), or None when the run has none of them."""
    import polars as pl

    names = {"running_reqs": "running requests", "waiting_reqs": "waiting requests", "kv_usage": "KV usage %"}
    fams = {f: names[k] for k, fs in GAUGES.items() if k in names for f in fs}
    if not con.execute("select count(*) from duckdb_tables() where table_name = 'metric_samples'").fetchall()[0][0]:
        return None
    df = store.select(con, "engine_metrics/gauge_series", {"run": run_id, "fams": list(fams)})
    if not df.height:
        return None
    origin = t0 if t0 is not None else float(df.get_column("t").min())
    scale = pl.when(pl.col("family").is_in([f for f in fams if fams[f] == "KV usage %"])).then(100.0).otherwise(1.0)
    return df.select(t_s=pl.col("t") - origin, series=pl.col("family").replace_strict(fams), value=pl.col("v") * scale)
