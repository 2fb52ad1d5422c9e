"""A run as an llm-d Benchmark Report v0.2.1 (JSON), for llm-d-benchmark's comparison tools.

The schema is llm-d-benchmark's ``br_v0_2_1_json_schema.json`` (generated from its
pydantic models, ``benchmark_report/schema_v0_2*.py``); docs/formats.md names the fields
we fill and from what. The report holds:

* ``run``: ``uid`` (a UUID derived from the run's id and extent, so a re-export gives the
  same one), ``eid`` = the tracelat run id, ``time`` (ISO-8601 start, end and duration;
  start and end only when the run's clock is Unix time), a ``description``.
* ``scenario.load``: the observed input length distribution and, for ``vllm bench``
  runs, the request rate and concurrency it was given; ``tool`` is the source format.
  No ``scenario.stack``: llm-d's pydantic model refuses a ``standardized.kind`` that its
  own JSON Schema requires, so no stack entry passes both (left out until they agree).
* ``results.request_performance.aggregate``: request counts and lengths, TTFT, TPOT,
  ITL, NTPOT and request latency (ms, ms/token), and mean token and request rates
  over the run's duration (``run_summary``).
* ``results.observability``: engine-side step statistics (KV cache usage in percent,
  running and waiting requests) as one component, and a ``tracelat`` object with what
  the schema has no field for (steps, preemptions, data-parallel dummy steps).

Units follow llm-d's validators: times in ``ms``, per-token latencies in ``ms/token``,
token rates in ``tokens/s``, request rate in ``queries/s``, lengths in ``count``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from pathlib import Path
from typing import Any

import duckdb

from .. import store
from ..resources import QUERIES_DIR

VERSION = "0.2.1"
STATS_SQL = QUERIES_DIR / "export" / "llmd_statistics.sql"
# Statistics keys in llm-d's names, in the order of quantile_cont's list in the query
PCTL_KEYS = ("p0p1", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "p99p9")
# run meta keys in which converters keep the load generator's version
HARNESS_VERSION_KEYS = ("guidellm_version", "genai_perf_version", "aiperf_version", "inference_perf_version")


def _finite(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and not math.isfinite(v))


def _stat(row: dict[str, Any] | None, units: str, integer: bool = False) -> dict[str, Any] | None:
    """One llm-d ``Statistics`` object (None when the quantity has no values)."""
    if row is None or not row["n"]:
        return None
    out: dict[str, Any] = {"units": units, "mean": float(row["mean"])}
    if _finite(row["stddev"]):
        out["stddev"] = float(row["stddev"])
    out["min"] = int(row["min"]) if integer else float(row["min"])
    out.update({k: float(q) for k, q in zip(PCTL_KEYS, row["q"]) if _finite(q)})
    out["max"] = int(row["max"]) if integer else float(row["max"])
    return out


def _rate(total: float | None, duration_s: float | None, units: str) -> dict[str, Any] | None:
    if total is None or not duration_s or duration_s <= 0 or not math.isfinite(duration_s):
        return None
    return {"units": units, "mean": float(total) / float(duration_s)}


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _load(meta: dict[str, Any], stats: dict[str, dict], tool: str) -> dict[str, Any] | None:
    """``scenario.load`` from what the run shows (None without prompt lengths)."""
    isl = stats.get("prompt_tokens")
    if isl is None or not isl["n"] or isl["mean"] < 1 or isl["max"] < 1:
        return None
    seq = {"distribution": "other", "value": float(isl["mean"]), "min": int(isl["min"]), "max": int(isl["max"])}
    if _finite(isl["stddev"]):
        seq["std_dev"] = float(isl["stddev"])
    version = next((meta[k] for k in HARNESS_VERSION_KEYS if meta.get(k)), None)
    std: dict[str, Any] = {
        "tool": tool,
        "tool_version": str(version or "unknown"),
        "source": "unknown",
        "input_seq_len": seq,
    }
    rate, conc = meta.get("request_rate"), meta.get("max_concurrency")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) and rate > 0:
        std["rate_qps"] = float(rate)
    if isinstance(conc, int) and not isinstance(conc, bool) and conc >= 1:
        std["concurrency"] = conc
    return {
        "metadata": {
            "description": "observed by tracelat from the run's request records, not the generator's configuration"
        },
        "standardized": std,
        "native": {},
    }


def report(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """The report as a dict (derived tables must be built)."""
    store.require_run(con, run_id)
    cur = con.execute("select engine, engine_version, model, gpu, clock, meta from runs where run_id = ?", [run_id])
    engine, version, model, gpu, clock, meta_text = cur.fetchall()[0]
    meta = json.loads(meta_text) if meta_text else {}
    summ = con.execute(
        "select requests, requests_ok, requests_failed, iterations, t_first, t_last, duration_s, "
        "output_tokens_per_s, throughput_source from run_summary where run_id = ?",
        [run_id],
    ).fetchall()[0]
    n_req, n_ok, _, n_steps, t_first, t_last, duration_s, out_rate, tp_source = summ
    sql = STATS_SQL.read_text()
    rel = con.sql(sql, params={"run_id": run_id})
    cols = rel.columns
    stats = {r[0]: dict(zip(cols, r)) for r in rel.fetchall()}
    counts = con.execute(
        "select count(*) filter (where status = 'error'), count(*) filter (where status not in ('ok', 'error')), "
        "sum(prompt_tokens) filter (where status = 'ok'), sum(output_tokens) filter (where status = 'ok'), "
        "sum(preemptions) from requests where run_id = ?",
        [run_id],
    ).fetchall()[0]
    failures, incomplete, prompt_sum, output_sum, req_preempt = counts
    steps = con.execute(
        "select count(*) filter (where coalesce(try_cast(extra->>'is_dummy' as boolean), false)), "
        "sum(preempted_reqs) from iterations where run_id = ?",
        [run_id],
    ).fetchall()[0]
    n_dummy, step_preempt = steps
    tool = str(meta.get("source_format") or "tracelat")

    run_time: dict[str, Any] = {}
    if _finite(duration_s) and duration_s >= 0:
        run_time["duration"] = f"PT{duration_s:.6f}S"
    if clock == "unix" and _finite(t_first) and _finite(t_last):
        run_time |= {"start": _iso(t_first), "end": _iso(t_last)}
    uid = uuid.uuid5(uuid.NAMESPACE_URL, f"tracelat:{run_id}:{t_first!r}:{t_last!r}:{n_req}:{n_steps}")
    run = _drop_none(
        {
            "uid": str(uid),
            "eid": run_id,
            "time": run_time or None,
            "description": f"tracelat run {run_id}: {engine or 'unknown engine'} {version or ''}".rstrip()
            + f", model {model or 'unknown'}, {gpu or 'unknown accelerator'}, read from {tool}",
            "keywords": ["tracelat", tool],
        }
    )

    aggregate: dict[str, Any] = {}
    if n_req:
        aggregate["requests"] = _drop_none(
            {
                "total": int(n_req),
                "failures": int(failures or 0),
                "incomplete": int(incomplete or 0),
                "input_length": _stat(stats.get("prompt_tokens"), "count", integer=True),
                "output_length": _stat(stats.get("output_tokens"), "count", integer=True),
            }
        )
        latency = _drop_none(
            {
                "time_to_first_token": _stat(stats.get("ttft_ms"), "ms"),
                "normalized_time_per_output_token": _stat(stats.get("ntpot_ms"), "ms/token"),
                "time_per_output_token": _stat(stats.get("tpot_ms"), "ms/token"),
                "inter_token_latency": _stat(stats.get("itl_ms"), "ms/token"),
                "request_latency": _stat(stats.get("e2e_ms"), "ms"),
            }
        )
        if latency:
            aggregate["latency"] = latency
    throughput = _drop_none(
        {
            "input_token_rate": _rate(prompt_sum, duration_s, "tokens/s") if tp_source == "requests" else None,
            "output_token_rate": {"units": "tokens/s", "mean": float(out_rate)} if _finite(out_rate) else None,
            "total_token_rate": _rate((prompt_sum or 0) + (output_sum or 0), duration_s, "tokens/s")
            if tp_source == "requests" and prompt_sum is not None
            else None,
            "request_rate": _rate(n_ok, duration_s, "queries/s") if n_req else None,
        }
    )
    if throughput:
        aggregate["throughput"] = throughput

    resources = _drop_none(
        {
            "kv_cache_usage": _stat(stats.get("kv_usage_pct"), "percent"),
            "running_requests": _stat(stats.get("running_reqs"), "count"),
            "waiting_requests": _stat(stats.get("waiting_reqs"), "count"),
        }
    )
    observability: dict[str, Any] = {
        "tracelat": _drop_none(
            {
                "run_id": run_id,
                "source_format": tool,
                "clock": clock,
                "steps": int(n_steps or 0),
                "dp_dummy_steps": int(n_dummy or 0),
                "preemptions": int(req_preempt)
                if req_preempt is not None
                else (int(step_preempt) if step_preempt is not None else None),
                "statistics": "linear-interpolation percentiles over ok requests (latencies), token gaps (ITL) "
                "and steps other than data-parallel dummy steps (resources)",
            }
        )
    }
    if resources:
        observability["components"] = [{"component_label": f"{engine or 'engine'}-{run_id}", "aggregate": resources}]

    out: dict[str, Any] = {"version": VERSION, "run": run}
    load = _load(meta, stats, tool)
    if load:
        out["scenario"] = {"load": load}
    results: dict[str, Any] = {"observability": observability}
    if aggregate:
        results["request_performance"] = {"aggregate": aggregate}
    out["results"] = results
    return out


def export(con: duckdb.DuckDBPyConnection, run_id: str, path: Path) -> dict[str, Any]:
    """Write the report to ``path`` (JSON); returns a short description of what was written."""
    rep = report(con, run_id)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(rep, indent=2, allow_nan=False) + "\n"
    path.write_text(text, encoding="utf-8")
    agg = rep["results"].get("request_performance", {}).get("aggregate", {})
    return {
        "path": str(path),
        "version": VERSION,
        "uid": rep["run"]["uid"],
        "requests": agg.get("requests", {}).get("total", 0),
        "latency": sorted(agg.get("latency", {})),
        "bytes": len(text.encode()),
    }
