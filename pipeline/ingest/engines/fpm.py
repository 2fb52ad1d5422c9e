"""ForwardPassMetrics (FPM): one record per engine step per data-parallel rank.

The per-iteration stream of SGLang (``--forward-pass-metrics-port``), vLLM (native,
in review) and NVIDIA Dynamo, in its file form (``fpm-relay*.jsonl[.gz]``): one JSON
object per line, flat or wrapped as ``{"event": {"fpm": {...}}}``.  Schema v1::

    version, worker_id, dp_rank, counter_id, timing_scope, wall_time (s),
    scheduled_requests{num_prefill_requests, sum_prefill_tokens, var_prefill_length,
                       sum_prefill_kv_tokens, num_decode_requests, sum_decode_kv_tokens,
                       var_decode_kv_tokens},
    queued_requests{num_prefill_requests, sum_prefill_tokens, ..., num_decode_requests, ...}

Mapping: one step is ``(worker_id, counter_id)``; its data-parallel ranks are joined
(counts summed, ``dur_ms`` = the slowest rank's ``wall_time``, which is what the step
waited for) and the extra rank lines count as skipped.  ``iter`` = ``counter_id``,
``prefill_tokens`` = ``sum_prefill_tokens``, ``prefill_reqs`` = ``num_prefill_requests``,
``decode_reqs`` = ``decode_tokens`` = ``num_decode_requests``, ``context_tokens`` =
``sum_decode_kv_tokens`` (``sum_prefill_kv_tokens`` is kept as an extra field),
``waiting_reqs`` = queued prefill + decode requests.  ``wall_time`` is a duration, not a
time of day: producers differ on what it times (``timing_scope``: a CUDA-event interval
around the forward pass, or host time from schedule to update), and the run's
``meta.elapsed_time_scope`` says which.  A record may carry a time of day as
``timestamp``/``time`` (Unix seconds or nanoseconds) next to the FPM fields; then it is
the step's end, else steps have durations only.  Empty records (the 1 s heartbeat when
idle) are skipped.  Several workers in one file become one run each, ``<run>-<worker>``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl

from .. import reader
from ... import store
from ..load import Batch
from . import _common as c


def sniff(path: Path, head: str) -> bool:
    first = next((ln for ln in head.splitlines() if ln.strip() and '"counter_id"' in ln), "")
    return first.lstrip().startswith("{") and '"scheduled_requests"' in first and '"wall_time"' in first


SQL = (
    "with j as ("
    + c.JSON_OBJECTS
    + """),
r as (select line_no, raw, ok, coalesce(js->'$.event.fpm', js) as f, js from j)
select line_no, raw,
  case when not ok then 'not valid JSON (truncated or garbage line)' end as perr,
  coalesce(ok and json_type(f, '$.counter_id') is null and json_type(f, '$.scheduled_requests') is null, false)
    as heartbeat,
  f->>'$.worker_id' as worker_id,
  try_cast(f->>'$.dp_rank' as bigint) as dp_rank,
  try_cast(f->>'$.counter_id' as bigint) as counter_id,
  f->>'$.timing_scope' as timing_scope,
  try_cast(f->>'$.wall_time' as double) as wall_time,
  try_cast(coalesce(f->>'$.timestamp', js->>'$.timestamp', f->>'$.time', js->>'$.time') as double) as stamp,
  try_cast(f->>'$.scheduled_requests.num_prefill_requests' as bigint) as prefill_reqs,
  try_cast(f->>'$.scheduled_requests.sum_prefill_tokens' as bigint) as prefill_tokens,
  try_cast(f->>'$.scheduled_requests.sum_prefill_kv_tokens' as bigint) as prefill_kv_tokens,
  try_cast(f->>'$.scheduled_requests.num_decode_requests' as bigint) as decode_reqs,
  try_cast(f->>'$.scheduled_requests.sum_decode_kv_tokens' as bigint) as context_tokens,
  try_cast(f->>'$.queued_requests.num_prefill_requests' as bigint) as queued_prefill,
  try_cast(f->>'$.queued_requests.num_decode_requests' as bigint) as queued_decode,
  {problems} as vproblem
from r
"""
)

# Fields whose value is checked: one that is there but no number (or a count out of range)
# rejects the record naming the field and the value, where try_cast would make it NULL.
_SCHED = ("num_prefill_requests", "sum_prefill_tokens", "sum_prefill_kv_tokens", "num_decode_requests")
CHECKED = [
    ("$.dp_rank", "dp_rank", "count"),
    ("$.counter_id", "counter_id", "count"),
    ("$.wall_time", "wall_time", "number"),
    ("$.timestamp", "timestamp", "number"),
    ("$.time", "time", "number"),
    *((f"$.scheduled_requests.{k}", f"scheduled_requests.{k}", "count") for k in (*_SCHED, "sum_decode_kv_tokens")),
    *(
        (f"$.queued_requests.{k}", f"queued_requests.{k}", "count")
        for k in ("num_prefill_requests", "num_decode_requests")
    ),
]
SQL = SQL.replace("{problems}", c.json_problems("f", CHECKED))

REQUIRED = ("counter_id", "wall_time", "prefill_reqs", "prefill_tokens", "decode_reqs")


def _reasons(df: pl.DataFrame) -> pl.DataFrame:
    missing = c.missing_reason([(f, pl.col(f)) for f in REQUIRED], "FPM record without ")
    negative = pl.when(pl.any_horizontal(*[pl.col(f) < 0 for f in REQUIRED])).then(
        pl.lit("FPM record with a negative count or wall_time")
    )
    first = pl.col("line_no").min().over("worker_id", "counter_id", "dp_rank")
    dup = pl.when(pl.col("line_no") != first).then(
        pl.lit("duplicate FPM record of rank ")
        + pl.col("dp_rank").cast(pl.String)
        + pl.lit(" of step ")
        + pl.col("counter_id").cast(pl.String)
        + pl.lit(" (first at line ")
        + first.cast(pl.String)
        + pl.lit(")")
    )
    return df.with_columns(
        reason=pl.when(pl.col("heartbeat"))
        .then(None)
        .otherwise(pl.coalesce(pl.col("perr"), pl.col("vproblem"), missing, negative, dup))
    )


def convert(path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None) -> Iterator[Batch]:
    """Whole-file conversion: a step's ranks may lie anywhere in the file."""
    con = store.scratch()  # $TRACELAT_MEMORY_LIMIT applies here too
    parts, total = [], 0
    for table in reader.lines(path, progress):
        total += table.num_rows
        con.register("lines", table)
        parts.append(store.frame(con, SQL, rows=table.num_rows))
        con.unregister("lines")
    con.close()
    df = _reasons(pl.concat(parts)) if parts else pl.DataFrame()
    if not df.height:
        yield c.batch(None, total)
        return
    blank = df.filter(pl.col("raw").str.strip_chars() == "").height
    df = df.filter(pl.col("raw").str.strip_chars() != "")
    bad = df.filter(pl.col("reason").is_not_null()).select("line_no", "reason", "raw")
    good = df.filter(pl.col("reason").is_null() & ~pl.col("heartbeat"))
    heartbeats = df.filter(pl.col("heartbeat") & pl.col("reason").is_null()).height
    stamp = pl.col("stamp")
    steps = (
        good.group_by("worker_id", "counter_id")
        .agg(
            line_no=pl.col("line_no").min(),
            ranks=pl.len(),
            dur_ms=pl.col("wall_time").max() * 1000.0,
            prefill_reqs=pl.col("prefill_reqs").sum(),
            prefill_tokens=pl.col("prefill_tokens").sum(),
            prefill_kv_tokens=pl.col("prefill_kv_tokens").sum(),
            decode_reqs=pl.col("decode_reqs").sum(),
            context_tokens=pl.col("context_tokens").sum(),
            waiting_reqs=(pl.col("queued_prefill").fill_null(0) + pl.col("queued_decode").fill_null(0)).sum(),
            t_end=pl.when(stamp > 1e14).then(stamp / 1e9).otherwise(stamp).max(),
            timing_scope=pl.col("timing_scope").drop_nulls().first(),
        )
        .with_columns(iter=pl.col("counter_id"), decode_tokens=pl.col("decode_reqs"))
        .sort("worker_id", "counter_id")
    )
    merged = int(steps.get_column("ranks").sum() - steps.height)
    scopes = good.get_column("timing_scope").drop_nulls().unique().sort().to_list()
    workers = steps.get_column("worker_id").fill_null("").unique().sort().to_list()
    meta = {
        "source_format": "forward-pass-metrics",
        "fpm_version": 1,
        "elapsed_time_scope": ", ".join(scopes) if scopes else "not stated by the producer",
        "fpm_dp_ranks": int(good.get_column("dp_rank").n_unique()),
        "fpm_rank_lines_merged": merged,
        "fpm_heartbeats": heartbeats,
        "step_times": "wall_time of each step; time of day from the records' timestamp field"
        if steps.get_column("t_end").is_not_null().any()
        else "durations only (no time of day)",
    }
    run = {"engine": "fpm", "clock": "unix", "meta": meta}
    skipped = blank + heartbeats + merged
    extra = ("prefill_kv_tokens", "timing_scope")
    src = {"iter": "counter_id", "dur_ms": "wall_time", "t_end": "timestamp"}
    if len(workers) <= 1:
        yield c.batch(c.encode(steps, "iteration", extra, sources=src), total, run=run, rejects=bad, skipped=skipped)
        return
    base = run_name or c.stem(path)
    for k, w in enumerate(workers):
        part = steps.filter(pl.col("worker_id").fill_null("") == w).with_columns(run_id=pl.lit(f"{base}-{w}"))
        run_k = run | {"run_id": f"{base}-{w}", "meta": meta | {"fpm_worker_id": w}}
        if k == 0:
            yield c.batch(
                c.encode(part, "iteration", (*extra, "run_id"), sources=src),
                total,
                run=run_k,
                rejects=bad,
                skipped=skipped,
            )
        else:
            yield c.batch(c.encode(part, "iteration", (*extra, "run_id"), sources=src), 0, run=run_k)
