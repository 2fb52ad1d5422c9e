"""Engine metrics scraped from Prometheus endpoints (``vllm:*``, ``sglang:*``, ``trtllm_*``), as time series of a run.

Three forms, each becoming rows of ``metric_samples`` (``t`` Unix seconds, ``family``,
``labels`` JSON, ``kind``, ``le``, ``value``; see :mod:`pipeline.engine_metrics` for
what is computed from them):

* **AIPerf** ``server_metrics_export.jsonl``: one line per endpoint per scrape,
  ``{endpoint_url, timestamp_ns, metrics: {family: [{labels, value} |
  {labels, histogram: {le: cumulative count}, sum, count}]}}``;
* **text exposition snapshots** (llm-d-benchmark ``metrics/raw/*.log``): a
  ``# Timestamp: ISO-8601`` line, then ``name{labels} value`` lines, repeated;
* **Prometheus ``query_range`` JSON**: ``{"data": {"result": [{"metric": {...},
  "values": [[ts, "v"], ...]}]}}``.

``kind`` is ``bucket``/``sum``/``count`` for histogram parts, ``counter`` for names
ending in ``_total`` (or typed so by a ``# TYPE`` line), else ``gauge``.  The endpoint
(AIPerf) is kept as the label ``endpoint``.  Lines that are not samples (comments, help
text, blank) are skipped; a line that should be one and cannot be read is a reject.
Everything is unnested in DuckDB or matched by Polars expressions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa

from ... import store
from ...errors import InputError
from .. import reader
from ..load import Batch
from . import _common as c
from . import _wallclock as wallclock

SCHEMA = {
    "line_no": pl.Int64,
    "t": pl.Float64,
    "family": pl.String,
    "labels": pl.String,
    "kind": pl.String,
    "le": pl.Float64,
    "value": pl.Float64,
}


def sniff_aiperf_metrics(path: Path, head: str) -> bool:
    first = next((ln for ln in head.splitlines() if ln.strip()), "")
    return (
        first.lstrip().startswith("{")
        and '"endpoint_url"' in first
        and '"timestamp_ns"' in first
        and '"metrics"' in first
    )


def sniff_exposition(path: Path, head: str) -> bool:
    return "# Timestamp:" in head and any(
        ln.split("{")[0].split(" ")[0].count(":") or ln.startswith("# TYPE") for ln in head.splitlines()[1:20]
    )


def sniff_query_range(path: Path, head: str) -> bool:
    return head.lstrip().startswith("{") and '"resultType"' in head and '"matrix"' in head


def _kind(family: pl.Expr) -> pl.Expr:
    return pl.when(family.str.ends_with("_total")).then(pl.lit("counter")).otherwise(pl.lit("gauge"))


def _frame(df: pl.DataFrame) -> pa.Table:
    return df.select([pl.col(k).cast(v) for k, v in SCHEMA.items()]).to_arrow()


def _batch(
    read: int, run: dict | None, bad: pl.DataFrame | None, skipped: int, rows: pl.DataFrame, accepted_lines: int
) -> Batch:
    b = c.batch(None, read, run=run, rejects=bad, skipped=skipped)
    b.metrics, b.metric_lines = _frame(rows), accepted_lines
    return b


def _run(fmt: str) -> dict:
    return {"clock": "unix", "meta": {"source_format": fmt, "engine_metrics": True}}


AIPERF_SQL = (
    "with j as ("
    + c.JSON_OBJECTS
    + """),
rows as (
  select line_no, try_cast(js->>'$.timestamp_ns' as double) / 1e9 as t, js->>'$.endpoint_url' as endpoint,
         try_cast(js->'$.metrics' as map(varchar, json[])) as m
  from j where ok
),
fam as (select line_no, t, endpoint, unnest(map_entries(m)) as e from rows),
ser as (select line_no, t, endpoint, e.key as family, unnest(e.value) as s from fam),
base as (
  select line_no, t, family,
    json_merge_patch(coalesce(s->'$.labels', '{}'), json_object('endpoint', endpoint))::varchar as labels,
    try_cast(s->>'$.value' as double) as value,
    try_cast(s->'$.histogram' as map(varchar, double)) as h,
    try_cast(s->>'$.sum' as double) as hsum, try_cast(s->>'$.count' as double) as hcount
  from ser
)
select line_no, t, family, labels, null::varchar as kind, null::double as le, value from base where h is null
union all
select line_no, t, family, labels, 'bucket', case when b.key = '+Inf' then 'inf'::double else try_cast(b.key as double) end,
       b.value
from (select *, unnest(map_entries(h)) as b from base where h is not null)
union all select line_no, t, family, labels, 'sum', null, hsum from base where h is not null
union all select line_no, t, family, labels, 'count', null, hcount from base where h is not null
"""
)

AIPERF_BAD = (
    "with j as ("
    + c.JSON_OBJECTS
    + """)
select line_no, left(raw, 1024) as raw,
  case when not ok then 'not valid JSON (one AIPerf server-metrics record per line)'
       else 'AIPerf server-metrics record without timestamp_ns or metrics' end as reason
from j where not """
    + reader.BLANK_SQL
    + """ and (not ok or try_cast(js->>'$.timestamp_ns' as double) is null
                                   or json_type(js, '$.metrics') <> 'OBJECT')
"""
)


def convert_aiperf_metrics(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None
) -> Iterator[Batch]:
    con = store.scratch()
    first = True
    for table in reader.lines(path, progress):
        con.register("lines", table)
        rows = store.frame(con, AIPERF_SQL, rows=table.num_rows)
        bad = store.frame(con, AIPERF_BAD, rows=table.num_rows).select("line_no", "reason", "raw")
        blank = int(con.execute("select count(*) from lines where " + reader.BLANK_SQL + "").fetchall()[0][0])
        con.unregister("lines")
        rows = rows.filter(pl.col("t").is_not_null()).with_columns(kind=pl.coalesce("kind", _kind(pl.col("family"))))
        yield _batch(
            table.num_rows,
            _run("aiperf-server-metrics") if first else None,
            bad,
            blank,
            rows,
            table.num_rows - bad.height - blank,
        )
        first = False
    con.close()


# --- text exposition ------------------------------------------------------------------

SAMPLE = r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(?:\s+\d+)?\s*$"


def convert_exposition(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None
) -> Iterator[Batch]:
    """Whole-file: a sample's time is the last ``# Timestamp:`` line above it."""
    tables = [pl.from_arrow(t) for t in reader.lines(path, progress)]
    if not tables:  # an empty file: no lines, nothing to concatenate
        yield c.batch(None, 0)
        return
    lines = pl.concat(tables)
    raw = pl.col("raw").str.strip_chars()
    stamp = raw.str.extract(r"^#\s*Timestamp:\s*(\S+)", 1)
    df = lines.with_columns(
        t=wallclock.epoch_s(stamp.str.to_datetime(time_zone="UTC", strict=False)),
        typed=raw.str.extract_groups(r"^#\s*TYPE\s+(\S+)\s+(\S+)"),
        m=raw.str.extract_groups(SAMPLE),
        comment=raw.str.starts_with("#") | (raw == ""),
    ).with_columns(t=pl.col("t").forward_fill())
    types = df.select(name=pl.col("typed").struct.field("1"), type=pl.col("typed").struct.field("2")).drop_nulls()
    samples = df.filter(~pl.col("comment")).with_columns(
        name=pl.col("m").struct.field("1"),
        lab=pl.col("m").struct.field("2").fill_null("{}"),
        value=pl.col("m").struct.field("3").str.replace(r"^\+Inf$", "inf").cast(pl.Float64, strict=False),
    )
    reason = (
        pl.when(pl.col("name").is_null() | pl.col("value").is_null())
        .then(pl.lit("not a Prometheus sample line (name{labels} value)"))
        .when(pl.col("t").is_null())
        .then(pl.lit("sample before any '# Timestamp:' line"))
    )
    samples = samples.with_columns(reason=reason)
    good = samples.filter(pl.col("reason").is_null())
    suffix = pl.col("name").str.extract(r"_(bucket|sum|count)$", 1)
    hist = types.filter(pl.col("type") == "histogram").get_column("name").to_list()
    counters = types.filter(pl.col("type") == "counter").get_column("name").to_list()
    base = pl.col("name").str.replace(r"_(bucket|sum|count)$", "")
    is_hist = suffix.is_not_null() & (base.is_in(hist) | (suffix == "bucket"))
    good = good.with_columns(
        family=pl.when(is_hist).then(base).otherwise(pl.col("name")),
        kind=pl.when(is_hist)
        .then(suffix)
        .when(pl.col("name").is_in(counters))
        .then(pl.lit("counter"))
        .otherwise(_kind(pl.col("name"))),
        le=pl.col("lab").str.extract(r'le="([^"]*)"', 1).str.replace(r"^\+Inf$", "inf").cast(pl.Float64, strict=False),
        # {a="x",le="1"} -> {"a":"x"}: label values are kept as text, escapes as written
        labels=pl.lit("{")
        + pl.col("lab")
        .str.strip_chars("{}")
        .str.replace_all(r'(?:^|,)\s*le="[^"]*"', "")
        .str.strip_chars(",")
        .str.replace_all(r'([a-zA-Z_][a-zA-Z0-9_]*)="', '"$1":"')
        + pl.lit("}"),
    )
    bad = samples.filter(pl.col("reason").is_not_null()).select("line_no", "reason", "raw")
    skipped = df.filter(pl.col("comment")).height
    yield _batch(lines.height, _run("prometheus-exposition"), bad, skipped, good, good.height)


# --- query_range JSON -------------------------------------------------------------------

# Prometheus's HTTP API writes each sample as [unix_seconds, "value"]: the value is a JSON
# string by design (so NaN and +Inf fit), so a number in quotes is read here, unlike in the
# request formats (see _common.json_value_problem).
QUERY_RANGE_SQL = """
with d as (select unnest(try_cast(j->'$.result' as json[])) as r
           from (select $data::json as j)),
s as (select r->'$.metric' as metric, r->>'$.metric.__name__' as name,
             unnest(try_cast(r->'$.values' as json[])) as v from d)
select 0::bigint as line_no, try_cast(v->>'$[0]' as double) as t, name,
       json_merge_patch(metric, '{"__name__": null}')::varchar as labels,
       try_cast(metric->>'$.le' as double) as le, try_cast(v->>'$[1]' as double) as value
from s
"""


def convert_query_range(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None
) -> Iterator[Batch]:
    # Read in Python first: a damaged or gzipped document then gets the clean error every
    # whole-document format gives, and an error answer says what Prometheus said.
    doc = c.read_json_document(path)
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a Prometheus query_range answer (a JSON {type(doc).__name__}, not an object)")
    if doc.get("status") == "error":
        said = f"{doc.get('errorType') or 'error'}: {doc.get('error') or 'no message'}"[:300]
        raise InputError(f"{path}: Prometheus answered this query with an error ({said}); it holds no samples")
    if not isinstance(doc.get("data"), dict):
        raise InputError(f"{path}: not a Prometheus query_range answer (no data object)")
    data = json.dumps(doc["data"])
    con = store.scratch()
    try:  # a sample is at least 8 characters of the text ([1,"2"],): at most that many rows
        df = store.frame(con, QUERY_RANGE_SQL, {"data": data}, rows=len(data) // 8)
    finally:
        con.close()
    suffix = pl.col("name").str.extract(r"_(bucket|sum|count)$", 1)
    is_hist = (suffix == "bucket") | (
        suffix.is_in(["sum", "count"]) & pl.col("le").is_null() & pl.col("name").str.contains("_seconds|_tokens")
    )
    df = df.filter(pl.col("t").is_not_null() & pl.col("name").is_not_null()).with_columns(
        family=pl.when(is_hist).then(pl.col("name").str.replace(r"_(bucket|sum|count)$", "")).otherwise(pl.col("name")),
        kind=pl.when(is_hist).then(suffix).otherwise(_kind(pl.col("name"))),
        labels=pl.col("labels").str.replace(r',?"le":"[^"]*"', "").str.replace(r"^\{,", "{"),
    )
    yield _batch(1, _run("prometheus-query-range"), None, 0 if df.height else 1, df, 1 if df.height else 0)
