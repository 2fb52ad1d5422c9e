"""Benchmark clients from NVIDIA: AIPerf ``profile_export.jsonl`` and GenAI-Perf
``profile_export.json``.  Both stamp with epoch nanoseconds (Unix clock).

AIPerf (one record per request, ``--export-level records``)::

    t_arrival     = metadata.request_start_ns / 1e9
    t_first_token = t_arrival + metrics.time_to_first_token (ms)
    token_times   = t_first_token + cumsum([0] + metrics.inter_chunk_latency) (ms)
    t_finish      = t_arrival + metrics.request_latency (ms), else the last token time
    prompt_tokens = metrics.input_sequence_length; output_tokens = output_sequence_length
    status        = error when ``error`` is set (aborted when was_cancelled)

A record of AIPerf's warmup phase (``metadata.benchmark_phase`` = "warmup") is no
measured request: AIPerf's own statistics count only the profiling phase, and its
cold-start latencies and its span would skew ours.  It is skipped (counted), the run's
meta says how many (``aiperf_warmup_records_skipped``) and the ingest prints a note.

Each metric is ``{value, unit}``; time values are scaled to ms by their unit (see
``TIME_METRICS`` below).

AIPerf's "inter_token_latency" is ``(latency - ttft) / (osl - 1)``, i.e. our
``tpot_ms``; our ``itl_ms`` is its ``inter_chunk_latency``.

GenAI-Perf (``experiments[].requests[]``): ``timestamp`` is the send time; the
``response_timestamps`` of responses that carry generated text are the token
times (OpenAI role-only chunks, usage chunks and ``[DONE]`` carry none and are
dropped, as GenAI-Perf does).  The file has no token counts, so
``output_tokens`` is the number of text-bearing responses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl

from ...errors import InputError
from ... import store
from .. import reader
from ..load import Batch
from . import _common as c


def sniff_aiperf(path: Path, head: str) -> bool:
    first = next((ln for ln in head.splitlines() if ln.strip()), "")
    return first.lstrip().startswith("{") and '"request_start_ns"' in first and '"metrics"' in first


AIPERF_SQL = (
    "with j as ("
    + c.JSON_OBJECTS
    + """)
select line_no, raw,
  case when """
    + reader.BLANK_SQL
    + """ then 'blank'
       when not ok then 'not valid JSON (truncated or garbage line)' end as perr,
  coalesce(js->>'$.metadata.x_request_id', js->>'$.metadata.session_num') as req_id,
  (js->>'$.metadata.x_request_id') is null as by_session,
  try_cast(js->>'$.metadata.request_start_ns' as hugeint) as start_ns,
  try_cast(js->>'$.metadata.request_ack_ns' as hugeint) as ack_ns,
  try_cast(js->>'$.metadata.request_end_ns' as hugeint) as end_ns,
  try_cast(js->>'$.metrics.time_to_first_token.value' as double) * {ms_time_to_first_token} as ttft_ms,
  try_cast(js->>'$.metrics.request_latency.value' as double) * {ms_request_latency} as latency_ms,
  list_transform(try_cast(js->'$.metrics.inter_chunk_latency.value' as double[]),
    lambda x: x * {ms_inter_chunk_latency}) as icl_ms,
  try_cast(coalesce(js->>'$.metrics.input_sequence_length.value', js->>'$.metrics.error_isl.value') as bigint) as prompt_tokens,
  try_cast(coalesce(js->>'$.metrics.output_sequence_length.value', js->>'$.metrics.output_token_count.value') as bigint)
    as output_tokens,
  json_type(js, '$.error') not in ('NULL') and json_type(js, '$.error') is not null as has_error,
  try_cast(js->>'$.metadata.was_cancelled' as boolean) as cancelled,
  js->>'$.error.message' as error,
  js->>'$.metadata.benchmark_phase' as benchmark_phase,
  coalesce(lower(trim(js->>'$.metadata.benchmark_phase')) = 'warmup', false) as warmup,
  js->>'$.metadata.worker_id' as worker_id,
  {problems} as vproblem
from j
"""
)

# Each metric is ``{value, unit}``.  AIPerf writes its time metrics in ms by default, but its
# unit enum (MetricTimeUnit, matched without regard to case) also has ns, us and s ("sec" in
# later versions), and a metric converted for display or by another tool keeps its unit: a
# value is scaled to ms by its unit.  A unit we do not know rejects the record (a TTFT in
# minutes read as ms would be silently wrong); an absent unit is AIPerf's default, ms.
TIME_METRICS = ("time_to_first_token", "request_latency", "inter_chunk_latency")
COUNT_METRICS = ("input_sequence_length", "error_isl", "output_sequence_length", "output_token_count")

# Fields whose value is checked: one that is there but no number (or out of range) rejects
# the record naming the field and the value, where try_cast would make it NULL ("without").
CHECKED = [
    *((f"$.metadata.{k}", f"metadata.{k}", "ns") for k in ("request_start_ns", "request_ack_ns", "request_end_ns")),
    *((f"$.metrics.{k}.value", f"metrics.{k}.value", "number") for k in ("time_to_first_token", "request_latency")),
    *((f"$.metrics.{k}.value", f"metrics.{k}.value", "count") for k in COUNT_METRICS),
    # a list with a string or null in it would cast to NULL: the request without token times
    ("$.metrics.inter_chunk_latency.value", "metrics.inter_chunk_latency.value", "numbers"),
]
_PER_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3, "sec": 1e3}


def _unit(k: str) -> str:
    return f"lower(js->>'$.metrics.{k}.unit')"


def _to_ms(k: str) -> str:
    """SQL: the factor that turns metric ``k``'s values into ms (NULL for an unknown unit)."""
    whens = " ".join(f"when '{u}' then {f!r}" for u, f in _PER_MS.items())
    return f"(case coalesce({_unit(k)}, 'ms') {whens} end)"


def _unit_problem(k: str, allowed: tuple[str, ...], what: str) -> str:
    """SQL: why metric ``k``'s unit is none of ``allowed`` (``what``: the kind of unit, said in
    the reason), or NULL when it is one of them or absent."""
    shown = f"left(js->>'$.metrics.{k}.unit', {c.SHOWN_CHARS})"
    known = ", ".join(f"'{u}'" for u in allowed)
    writes = ", ".join(allowed[:-1]) + " or " + allowed[-1] if len(allowed) > 1 else allowed[0]
    return (
        f"case when {_unit(k)} is not null and {_unit(k)} not in ({known}) "
        f"then 'metrics.{k}.unit: unknown {what} \"' || {shown} || '\" (AIPerf writes {writes}); "
        "convert the values to one of those units and name it' end"
    )


_UNIT_PROBLEMS = [
    *(_unit_problem(k, tuple(_PER_MS), "time unit") for k in TIME_METRICS),
    *(_unit_problem(k, ("tokens",), "unit for a token count") for k in COUNT_METRICS),
]
AIPERF_SQL = AIPERF_SQL.replace(
    "{problems}", "nullif(concat_ws('; ', " + ", ".join([*_UNIT_PROBLEMS, c.json_problems("js", CHECKED)]) + "), '')"
)
for _k in TIME_METRICS:
    AIPERF_SQL = AIPERF_SQL.replace("{ms_" + _k + "}", _to_ms(_k))


# the field each canonical one comes from, named in the reasons of rejected records
SOURCES = {
    "req_id": "metadata.x_request_id",
    "t_arrival": "metadata.request_start_ns",
    "t_first_token": "metrics.time_to_first_token",
    "t_finish": "metrics.request_latency",
    "token_times": "metrics.inter_chunk_latency",
    "prompt_tokens": "metrics.input_sequence_length",
    "output_tokens": "metrics.output_sequence_length",
}


def convert_aiperf(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None
) -> Iterator[Batch]:
    con = store.scratch()  # $TRACELAT_MEMORY_LIMIT applies here too
    first = True
    warmups = 0  # warmup records skipped so far
    tables = reader.lines(path, progress)
    table = next(tables, None)
    while table is not None:
        following = next(tables, None)  # one ahead: the last batch says how many warmup records the file had
        con.register("lines", table)
        df = store.frame(con, AIPERF_SQL, rows=table.num_rows)
        con.unregister("lines")
        failed = pl.col("has_error").fill_null(False) | pl.col("cancelled").fill_null(False)
        # a warmup record is skipped, not read as a request, whatever else it holds (AIPerf does
        # not measure it either); a blank line is skipped, not rejected
        warm = pl.col("warmup") & pl.col("perr").is_null()
        df = df.with_columns(
            reason=pl.when((pl.col("perr") == "blank") | warm)
            .then(None)
            .otherwise(
                pl.coalesce(
                    pl.col("perr"),
                    pl.col("vproblem"),
                    c.missing_reason(
                        [
                            ("metadata.x_request_id", pl.col("req_id")),
                            ("metadata.request_start_ns", pl.col("start_ns")),
                        ],
                        "AIPerf record without ",
                    ),
                    pl.when(~failed & pl.col("ttft_ms").is_null()).then(
                        pl.lit("AIPerf record without metrics.time_to_first_token (and no error)")
                    ),
                )
            )
        )
        good = df.filter(pl.col("reason").is_null() & pl.col("perr").is_null() & ~pl.col("warmup"))
        arrival = pl.col("start_ns").cast(pl.Float64) / 1e9
        first_tok = arrival + pl.col("ttft_ms") / 1000.0
        tokens = pl.concat_list(pl.lit(0.0), pl.col("icl_ms").fill_null(pl.lit([], pl.List(pl.Float64))))
        ok = pl.when(~failed)
        good = good.with_columns(
            t_arrival=arrival,
            t_first_token=ok.then(first_tok),
            token_times=ok.then(tokens.list.eval(pl.element().cum_sum()) / 1000.0 + first_tok),
            t_ack=pl.col("ack_ns").cast(pl.Float64) / 1e9,
            status=pl.when(pl.col("cancelled").fill_null(False))
            .then(pl.lit("aborted"))
            .when(failed)
            .then(pl.lit("error"))
            .otherwise(pl.lit("ok")),
            output_tokens=ok.then(pl.col("output_tokens")),
        ).with_columns(
            t_finish=ok.then(pl.coalesce(arrival + pl.col("latency_ms") / 1000.0, pl.col("token_times").list.last())),
        )
        run = None
        if first:
            run = {
                "engine": "aiperf-client",
                "clock": "unix",
                "meta": {
                    "source_format": "aiperf-profile-export",
                    "token_times_are": "streamed chunk arrival times; itl_ms = AIPerf inter_chunk_latency",
                },
            }
            first = False
        warm_here = df.filter(warm).height
        warmups += warm_here
        notes = []
        if following is None:  # the file's last batch: the run's meta says how many warmup records it left out
            if run is None:
                run = {"meta": {}}  # merged into the run record of the first batch (a meta key of its own)
            run["meta"]["aiperf_warmup_records_skipped"] = warmups
            if warmups:
                notes.append(
                    f"{warmups} warmup record{'s' if warmups != 1 else ''} (metadata.benchmark_phase = warmup) "
                    "skipped: not measured requests, as in AIPerf's own statistics"
                )
        skipped = df.filter(pl.col("perr") == "blank").height + warm_here
        # without x_request_id the id is session_num, which every AIPerf process counts from 0: a
        # second client's export of the run would clash (load.py names such ids after the file)
        positional = good.height > 0 and bool(good.get_column("by_session").all())
        yield c.batch(
            c.encode(good, "request", ("t_ack", "error", "benchmark_phase", "worker_id"), sources=SOURCES),
            table.num_rows,
            run=run,
            rejects=df.filter(pl.col("reason").is_not_null()),
            skipped=skipped,
            positional_ids=positional,
            notes=notes,
        )
        table = following
    con.close()


# --- GenAI-Perf -------------------------------------------------------------------------


def sniff_genai_perf(path: Path, head: str) -> bool:
    return (
        head.lstrip().startswith("{")
        and '"experiments"' in head
        and ('"response_timestamps"' in head or '"service_kind"' in head)
    )


def convert_genai_perf(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None
) -> Iterator[Batch]:
    doc = c.read_json_document(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("experiments"), list):
        raise InputError(f"{path}: GenAI-Perf profile export without an 'experiments' list")
    exps = doc["experiments"]
    first_line = 1
    for k, exp in enumerate(exps):
        if not isinstance(exp, dict) or not isinstance(exp.get("requests") or [], list):
            raise InputError(
                f"{path}: GenAI-Perf experiment {k} is not an object with a 'requests' list; "
                "the file is damaged or not this format"
            )
        reqs = exp.get("requests") or []
        n = len(reqs)
        df = _requests_frame(reqs).with_columns(
            line_no=pl.col("idx").cast(pl.Int64) + first_line,
            req_id=pl.col("idx").cast(pl.String) if len(exps) == 1 else pl.lit(f"{k}-") + pl.col("idx").cast(pl.String),
        )
        good = (
            df.filter(pl.col("reason").is_null())
            .with_columns(
                t_arrival=pl.col("timestamp").cast(pl.Float64) / 1e9,
                t_first_token=pl.col("token_times").list.first(),
                t_finish=pl.col("token_times").list.last(),
                output_tokens=pl.col("token_times").list.len(),
                status=pl.when(pl.col("token_times").list.len().fill_null(0) > 0)
                .then(pl.lit("ok"))
                .otherwise(pl.lit("error")),
            )
            .with_columns(
                token_times=pl.when(pl.col("status") == "ok").then(pl.col("token_times")),
                output_tokens=pl.when(pl.col("status") == "ok").then(pl.col("output_tokens")),
            )
        )
        experiment = exp.get("experiment") if isinstance(exp.get("experiment"), dict) else {}
        run = {
            "engine": "genai-perf-client",
            "clock": "unix",
            "meta": {
                "source_format": "genai-perf-profile-export",
                "genai_perf_version": doc.get("version"),
                "service_kind": doc.get("service_kind"),
                "endpoint": doc.get("endpoint"),
                "experiment_mode": experiment.get("mode"),
                "experiment_value": experiment.get("value"),
                "output_tokens_are": "text-bearing responses (the export holds no token counts)",
            },
        }
        if len(exps) > 1:
            run["run_id"] = f"{run_name or c.stem(path)}-{experiment.get('mode', 'exp')}{experiment.get('value', k)}"
        bad = df.filter(pl.col("reason").is_not_null()).select("line_no", "reason", "raw")
        yield c.batch(c.encode(good, "request"), n, run=run, rejects=bad, positional_ids=True)  # ids: positions
        first_line += n


# One row per request of an experiment, typed by DuckDB from the requests' JSON text: a
# value of the wrong type is a reject of its request (Polars' from_dicts fails the whole list).
# Token times are the response stamps whose output carries generated text (see module doc),
# sorted; list_zip pads the shorter list with NULL, so unequal lengths cannot fail.
REQUESTS_SQL = r"""
with items as (
  select unnest(range(len(xs))) as idx, unnest(xs) as r
  from (select json_extract($doc::json, '$[*]') as xs)
), typed as (
  select idx, r, json_type(r) = 'OBJECT' as is_obj,
    try_cast(case when json_type(r) = 'OBJECT' then r->>'$.timestamp' end as bigint) as timestamp,
    json_type(case when json_type(r) = 'OBJECT' then r end, '$.timestamp') as ts_type,
    try_cast(case when json_type(r) = 'OBJECT' then r->'$.response_timestamps' end as bigint[]) as resp_ts,
    json_type(case when json_type(r) = 'OBJECT' then r end, '$.response_timestamps') as rts_type,
    list_transform(json_extract(case when json_type(r) = 'OBJECT' then r end, '$.response_outputs[*]'),
      lambda o: coalesce(case when json_type(o, '$.response') = 'VARCHAR' then o->>'$.response' end,
                    case when json_exists(o, '$.text_output') then '{"text_output":"' || (o->>'$.text_output') || '"}' end)
    ) as resp_out
  from items
)
select idx::bigint as idx, timestamp, left(r::varchar, 1024) as raw,
  case when not is_obj then 'GenAI-Perf request is not a JSON object'
       when ts_type is null or ts_type = 'NULL' then 'GenAI-Perf request without timestamp'
       when timestamp is null or ts_type = 'VARCHAR'
         then 'GenAI-Perf timestamp is not an integer (ns): ' || left(r->'$.timestamp', 60)
              || case when ts_type = 'VARCHAR' then ' (a string: write the number without quotes)' else '' end
       -- a string entry ("123") would cast; GenAI-Perf writes numbers
       when rts_type is not null and rts_type <> 'NULL' and (rts_type <> 'ARRAY' or resp_ts is null
              or list_count(resp_ts) < json_array_length(r, '$.response_timestamps')
              or list_bool_or(list_transform(json_type(r, '$.response_timestamps[*]'),
                                             lambda t: t not in ('BIGINT', 'UBIGINT', 'DOUBLE'))))
         then 'GenAI-Perf response_timestamps is not a list of integers (ns)'
  end as reason,
  nullif(list_sort(list_transform(
    list_filter(list_zip(resp_ts, resp_out), lambda p: p[1] is not null and p[2] is not null
      and regexp_matches(p[2], '"(?:content|text|text_output)"\s*:\s*"[^"]') and not contains(p[2], '[DONE]')),
    lambda p: p[1] / 1e9)), []) as token_times
from typed order by idx
"""


def _requests_frame(reqs: list) -> pl.DataFrame:
    """idx, timestamp (ns), raw, reason (why the request is rejected) and token_times (s)."""
    import json

    con = store.scratch()
    try:
        # json.dumps keeps NaN/Infinity as such; DuckDB's JSON reader accepts them
        return store.frame(con, REQUESTS_SQL, {"doc": json.dumps(reqs)}, rows=len(reqs))
    finally:
        con.close()
