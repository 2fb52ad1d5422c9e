"""OpenTelemetry spans from vLLM (``--otlp-traces-endpoint``), as OTLP JSON.

A collector's file exporter writes one ``TracesData`` object per line
(``{"resourceSpans": [{"scopeSpans": [{"spans": [...]}]}]}``); a single such document
works too, on one line or pretty-printed over many.  vLLM emits one ``llm_request`` span per finished request with::

    gen_ai.request.id, gen_ai.usage.prompt_tokens, gen_ai.usage.completion_tokens,
    gen_ai.latency.time_in_queue, gen_ai.latency.time_to_first_token, gen_ai.latency.e2e,
    gen_ai.latency.time_in_model_prefill, gen_ai.latency.time_in_model_decode (seconds)

Mapping (server-side, no client needed; Unix clock)::

    t_arrival     = startTimeUnixNano (vLLM starts the span at the request's arrival)
    t_scheduled   = t_arrival + time_in_queue
    t_first_token = t_arrival + time_to_first_token
    t_finish      = t_arrival + e2e (else endTimeUnixNano)

Spans with another name are skipped (counted); a line that is not a TracesData
object, or an ``llm_request`` span without an id or a start, is a reject (a span's
reject carries its document's line number).  The file's records are spans, so
``read`` counts spans plus the lines that held none.  Unnested and picked apart in
DuckDB: no Python loop over spans.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa

from .. import reader
from ... import store
from ..load import Batch
from . import _common as c

SPAN = "llm_request"
# OTLP JSON (proto3's JSON mapping) writes 64-bit integers as strings: ``startTimeUnixNano``,
# ``endTimeUnixNano`` and ``intValue`` attributes are numbers in quotes by design, so they are
# read from strings here, unlike in the request formats (see _common.json_value_problem).


def sniff(path: Path, head: str) -> bool:
    return head.lstrip().startswith("{") and '"resourceSpans"' in head


def _attr(key: str, kind: str) -> str:
    """An attribute's value from a span's ``attributes`` list (OTLP AnyValue: int64 as a string)."""
    pick = f"list_filter(attrs, lambda a: a->>'$.key' = '{key}')[1]"
    return f"coalesce({pick}->>'$.value.{kind}', {pick}->>'$.value.doubleValue', {pick}->>'$.value.intValue')"


SQL = (
    "with j as ("
    + c.JSON_OBJECTS
    + """),
docs as (
  select line_no, raw, ok, js,
    coalesce(case when ok then json_type(js, '$.resourceSpans') = 'ARRAY' end, false) as is_doc
  from j
),
rs as (select line_no, unnest(from_json(js->'$.resourceSpans', '["JSON"]')) as r from docs where is_doc),
ss as (select line_no, unnest(from_json(coalesce(r->'$.scopeSpans', r->'$.instrumentationLibrarySpans'), '["JSON"]')) as s
       from rs),
sp as (select line_no, unnest(from_json(s->'$.spans', '["JSON"]')) as span from ss),
flat as (select line_no, span->>'$.name' as name,
           try_cast(span->>'$.startTimeUnixNano' as double) / 1e9 as t_arrival,
           try_cast(span->>'$.endTimeUnixNano' as double) / 1e9 as t_end,
           from_json(coalesce(span->'$.attributes', '[]'), '["JSON"]') as attrs
         from sp)
select line_no, name, t_arrival, t_end,
  """
    + _attr("gen_ai.request.id", "stringValue")
    + """ as req_id,
  try_cast("""
    + _attr("gen_ai.usage.prompt_tokens", "intValue")
    + """ as bigint) as prompt_tokens,
  try_cast("""
    + _attr("gen_ai.usage.completion_tokens", "intValue")
    + """ as bigint) as output_tokens,
  try_cast("""
    + _attr("gen_ai.latency.time_in_queue", "doubleValue")
    + """ as double) as queue_s,
  try_cast("""
    + _attr("gen_ai.latency.time_to_first_token", "doubleValue")
    + """ as double) as ttft_s,
  try_cast("""
    + _attr("gen_ai.latency.e2e", "doubleValue")
    + """ as double) as e2e_s,
  try_cast("""
    + _attr("gen_ai.latency.time_in_model_prefill", "doubleValue")
    + """ as double) as model_prefill_s,
  try_cast("""
    + _attr("gen_ai.latency.time_in_model_decode", "doubleValue")
    + """ as double) as model_decode_s
from flat
"""
)

BAD_LINES = (
    """
select line_no, left(raw, 1024) as raw,
  case when not ok then 'not valid JSON (OTLP TracesData: one object per line, or one document)'
       else 'not an OTLP TracesData object (no resourceSpans list)' end as reason
from (select *, coalesce(case when ok then json_type(js, '$.resourceSpans') = 'ARRAY' end, false) as is_doc
      from ("""
    + c.JSON_OBJECTS
    + """))
where not is_doc and not """
    + reader.BLANK_SQL
    + """
"""
)


def _document(path: Path, progress: Callable[[int], None] | None) -> Iterator[pa.Table] | None:
    """A pretty-printed document (``jq .``, ``curl``) as one line; None for one object per line.

    A line-per-object file has a whole object on its first line; a document spreads one over
    many. JSON strings hold no raw line breaks, so the document's lines joined by spaces are
    the same document on one line (its spans' rejects then name line 1).
    """
    first = next((x for x in reader.head_text(path).splitlines() if x.strip()), "")
    if not first.lstrip().startswith("{") or first.rstrip().endswith("}"):
        return None
    text = " ".join(x for t in reader.lines(path, progress) for x in t.column("raw").to_pylist())
    return iter([pa.table({"line_no": pa.array([1], pa.int64()), "raw": pa.array([text], pa.string())})])


def convert(path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None) -> Iterator[Batch]:
    con = store.scratch()  # $TRACELAT_MEMORY_LIMIT applies here too
    spans, bads, n_lines, blank = [], [], 0, 0
    for table in _document(path, progress) or reader.lines(path, progress):
        n_lines += table.num_rows
        con.register("lines", table)
        spans.append(store.frame(con, SQL, rows=table.num_rows))
        bads.append(store.frame(con, BAD_LINES, rows=table.num_rows))
        blank += int(con.execute("select count(*) from lines where " + reader.BLANK_SQL + "").fetchall()[0][0])
        con.unregister("lines")
    con.close()
    df = pl.concat(spans) if spans else pl.DataFrame()
    bad_lines = pl.concat(bads).select("line_no", "reason", "raw") if bads else None
    if not df.height:
        yield c.batch(
            None, n_lines, rejects=bad_lines, skipped=n_lines - (bad_lines.height if bad_lines is not None else 0)
        )
        return
    is_req = pl.col("name") == SPAN
    df = df.with_columns(
        reason=pl.when(is_req).then(
            c.missing_reason(
                [("gen_ai.request.id", pl.col("req_id")), ("startTimeUnixNano", pl.col("t_arrival"))],
                "vLLM llm_request span without ",
            )
        )
    )
    other = df.filter(~is_req.fill_null(False)).height
    good = df.filter(is_req & pl.col("reason").is_null()).with_columns(
        t_scheduled=pl.col("t_arrival") + pl.col("queue_s"),
        t_first_token=pl.col("t_arrival") + pl.col("ttft_s"),
        t_finish=pl.coalesce(pl.col("t_arrival") + pl.col("e2e_s"), pl.col("t_end")),
        status=pl.lit("ok"),
    )
    span_bad = df.filter(is_req & pl.col("reason").is_not_null()).select(
        "line_no", "reason", raw=pl.col("req_id").fill_null("")
    )
    run = {
        "engine": "vllm",
        "clock": "unix",
        "meta": {
            "source_format": "otel-otlp-json",
            "spans_other_than_llm_request": other,
            "times_are": "server side: the span's start is the request's arrival at vLLM",
        },
    }
    # the file's records are spans (many per line): read = spans + bad lines + blank lines
    n_bad = bad_lines.height if bad_lines is not None else 0
    rejects = pl.concat([x for x in (bad_lines, span_bad) if x is not None])
    yield c.batch(
        c.encode(good, "request", ("model_prefill_s", "model_decode_s")),
        df.height + n_bad + blank,
        run=run,
        rejects=rejects,
        skipped=other + blank,
    )
