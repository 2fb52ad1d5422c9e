"""TensorRT-LLM IterationStats: JSON (lines, or the array ``trtllm-serve /metrics``
returns) and the Python-dict-repr lines of ``trtllm-bench --iteration_log``.

The dict-repr lines (single quotes, ``True/False/None``) are turned into JSON text
by a vectorised token rewrite, which is exact for these records (numbers, nested
dicts and a timestamp string without quotes); any line the rewrite does not make
valid JSON is parsed with ``ast.literal_eval`` (never ``eval``) as a fallback.

Field mapping (flat ForwardPassMetrics fields win when present):

=================  ===========================================================
canonical          IterationStats
=================  ===========================================================
iter               iter
dur_ms             iterLatencyMS
t_end              timestamp ``%m-%d-%Y %H:%M:%S[.%f]`` (end of the iteration; the
                   writer's local time without a zone: read in ``--tz``, default
                   this machine's zone, stated in ``meta.timestamps_time_zone``, by
                   the rule of :mod:`._wallclock` through a DST change)
prefill_reqs       scheduledNumPrefillRequests | inflightBatchingStats.numContextRequests
prefill_tokens     scheduledSumPrefillTokens | inflightBatchingStats.numCtxTokens
decode_reqs        scheduledNumDecodeRequests | inflightBatchingStats.numGenRequests
decode_tokens      decode_reqs (+ specDecodingStats.numAcceptedTokens)
context_tokens     scheduledSumPrefillKvTokens + scheduledSumDecodeKvTokens
running_reqs       numActiveRequests
waiting_reqs       queuedNumPrefillRequests + queuedNumDecodeRequests | numQueuedRequests
kv_usage           kvCacheStats.usedNumBlocks / kvCacheStats.maxNumBlocks
preempted_reqs     inflightBatchingStats.numPausedRequests
=================  ===========================================================
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl

from ... import store
from .. import reader
from ..load import Batch
from . import _common as c
from . import _wallclock as wallclock


def sniff(path: Path, head: str) -> bool:
    return ('"iterLatencyMS"' in head or "'iterLatencyMS'" in head) and head.lstrip()[:1] in ("{", "[")


def _as_json(raw: pl.Expr) -> pl.Expr:
    """Python dict repr -> JSON text (exact for IterationStats; see module doc)."""
    return (
        raw.str.replace_all("'", '"', literal=True)
        .str.replace_all(r"\bTrue\b", "true")
        .str.replace_all(r"\bFalse\b", "false")
        .str.replace_all(r"\bNone\b", "null")
        .str.replace_all(r"\b(-?)inf\b", "${1}1e999")  # float('inf') repr; DuckDB reads it as infinity
    )


# IterationStats records are a few KB; a longer line is no record, and literal_eval's
# cost grows with it.
MAX_LITERAL_CHARS = 1 << 20
# A record of a JSON array of IterationStats takes over this many bytes (the fixture's take
# 900-1200): a document's length over it bounds its records, before they are split.
DOC_RECORD_BYTES_MIN = 100


def _literal_fallback(text: str) -> str | None:
    """The line as JSON text, or None when it is no dict literal that JSON can hold.

    Any failure is a reject of this one line, never of the file: literal_eval raises
    TypeError for unhashable keys (``{[1]: 2}``, ``{{1}: 2}``), json.dumps for tuple
    keys and ValueError for integers of more than 4300 digits, and deep nesting
    raises RecursionError or MemoryError.
    """
    if len(text) > MAX_LITERAL_CHARS:
        return None
    try:
        val = ast.literal_eval(text)
        return json.dumps(val, default=str, allow_nan=True) if isinstance(val, dict) else None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, OverflowError):
        return None


# Every field read with _v, checked too: a value that is there but no number (or an integer
# out of range) rejects its record naming the field, where try_cast would make it NULL.
CHECKED: dict[str, str] = {}


def _at(path: str) -> tuple[str, str]:
    """``$.a.b`` -> (the parsed record's top-level field ``a`` as SQL, ``$.b``); ``$.a`` -> (.., ``$``).

    Each line is parsed once, into a struct of its top-level fields as JSON (``from_json``); a
    field's own text is short, so reading a value from it costs little. Reading every path from the
    whole line instead parsed each line about 70 times (22 s for 300k records)."""
    top, _, rest = path[2:].partition(".")
    return f's."{top}"', f"$.{rest}" if rest else "$"


def _v(path: str, typ: str = "double") -> str:
    CHECKED.setdefault(path, "number" if typ == "double" else "count")
    col, sub = _at(path)
    return f"try_cast({col}->>'{sub}' as {typ})"


EXTRACT = f"""
select line_no, raw, valid,
  {_v("$.iter", "bigint")} as iter,
  {_v("$.iterLatencyMS")} as dur_ms,
  coalesce(try_strptime(s."timestamp"->>'$', '%m-%d-%Y %H:%M:%S.%f'),
           try_strptime(s."timestamp"->>'$', '%m-%d-%Y %H:%M:%S')) as wall_end,
  coalesce({_v("$.scheduledNumPrefillRequests", "bigint")}, {_v("$.inflightBatchingStats.numContextRequests", "bigint")},
           {_v("$.staticBatchingStats.numContextRequests", "bigint")}) as prefill_reqs,
  coalesce({_v("$.scheduledSumPrefillTokens", "bigint")}, {_v("$.inflightBatchingStats.numCtxTokens", "bigint")},
           {_v("$.staticBatchingStats.numCtxTokens", "bigint")}) as prefill_tokens,
  coalesce({_v("$.scheduledNumDecodeRequests", "bigint")}, {_v("$.inflightBatchingStats.numGenRequests", "bigint")}) as decode_reqs,
  -- sums and products in try(): a count near 2^63 overflowed and failed the whole file (values over
  -- 2^53 are the record's reject anyway, in vproblem)
  try(coalesce({_v("$.scheduledNumDecodeRequests", "bigint")}, {_v("$.inflightBatchingStats.numGenRequests", "bigint")},
           {_v("$.staticBatchingStats.numGenTokens", "bigint")})
    + coalesce({_v("$.specDecodingStats.numAcceptedTokens", "bigint")}, 0)) as decode_tokens,
  try({_v("$.scheduledSumPrefillKvTokens", "bigint")} + {_v("$.scheduledSumDecodeKvTokens", "bigint")}) as context_tokens,
  {_v("$.numActiveRequests", "bigint")} as running_reqs,
  coalesce(try({_v("$.queuedNumPrefillRequests", "bigint")} + {_v("$.queuedNumDecodeRequests", "bigint")}),
           {_v("$.numQueuedRequests", "bigint")}) as waiting_reqs,
  {_v("$.kvCacheStats.usedNumBlocks")} / nullif({_v("$.kvCacheStats.maxNumBlocks")}, 0) as kv_usage,
  {_v("$.inflightBatchingStats.numPausedRequests", "bigint")} as preempted_reqs,
  {_v("$.numCompletedRequests", "bigint")} as completed_reqs,
  {_v("$.newActiveRequestsQueueLatencyMS")} as new_active_queue_ms,
  {_v("$.maxBatchSizeRuntime", "bigint")} as max_batch_runtime,
  {_v("$.maxBatchSizeStatic", "bigint")} as max_batch_static,
  {_v("$.maxNumTokensRuntime", "bigint")} as max_tokens_runtime,
  {_v("$.maxNumTokensStatic", "bigint")} as max_tokens_static,
  try({_v("$.kvCacheStats.maxNumBlocks", "bigint")} * {_v("$.kvCacheStats.tokensPerBlock", "bigint")}) as kv_tokens,
  -- the end marker: no iter (then, and only then, the whole line is looked at again)
  case when s."iter" is null then coalesce(json_exists(js, '$.end') and not json_exists(js, '$.iter'), false)
       else false end as is_end,
  s."timestamp"->>'$' as ts_text,
  nullif(concat_ws('; ', {", ".join(c.json_value_problem(*_at(p), p[2:], k) for p, k in CHECKED.items())}), '') as vproblem
from (
  select line_no, raw, valid, js, try(from_json(js, '{{STRUCT}}')) as s
  from (select line_no, raw, valid, case when valid then js end as js from src)
)
"""
# every top-level field a path above reads, as JSON: the struct each line is parsed into once
EXTRACT = EXTRACT.replace(
    "{STRUCT}",
    json.dumps({k: "JSON" for k in dict.fromkeys([*(p[2:].split(".")[0] for p in CHECKED), "timestamp"])}),
)


def _field_reason() -> pl.Expr:
    """Why a record is rejected for what it holds besides its stamp (NULL for none)."""
    return pl.coalesce(
        pl.when(~pl.col("valid")).then(
            pl.lit("not a TRT-LLM IterationStats record (invalid JSON or Python literal; truncated?)")
        ),
        pl.col("vproblem"),
        c.missing_reason([("iter", pl.col("iter")), ("iterLatencyMS", pl.col("dur_ms"))], "IterationStats without "),
    )


def _reason(zone: str) -> pl.Expr:
    """Why a record is rejected (NULL for a good one): column ``_field`` (:func:`_field_reason`),
    else its stamp's; ``zone``: the one its stamps were read in."""
    return pl.coalesce(
        pl.col("_field"),
        pl.when(pl.col("ts_text").is_not_null() & pl.col("wall_end").is_null()).then(
            pl.lit("timestamp not in %m-%d-%Y %H:%M:%S[.%f] form: ") + pl.col("ts_text")
        ),
        pl.when(pl.col("wall_end").is_not_null() & pl.col("t_end").is_null()).then(
            pl.format(
                "timestamp {} is no time in {} (a DST change skips it): is --tz the zone the log was written in?",
                pl.col("ts_text"),
                pl.lit(zone),
            )
        ),
    )


def _on_the_clock(rec: pl.DataFrame, zone: str, after_s: float | None) -> pl.DataFrame:
    """``rec`` (records in file order) with ``t_end``: the wall-clock stamps read in ``zone``.

    The rule of the other logs' zone-less stamps (:mod:`._wallclock`): in the hour a DST
    fall-back repeats, the earlier instant unless it puts the step behind the steps before
    it (``after_s``: the latest stamp of the steps judged before), then the later one; a time
    a spring-forward skips has none (NULL, rejected by :func:`_reason`). Not every record is a
    step before the others: not one rejected for its fields, nor one in a run stamped ahead
    between two steps close together (:func:`_not_a_step`; one 40 min ahead inside the repeated
    hour put the next good records an hour late). Column ``_step`` says which are.
    """
    wall = pl.col("wall_end")
    rec = rec.with_columns(_early=wallclock.local_s(wall, zone))
    skip = _not_a_step(rec, after_s)
    rec = wallclock.pick_fold(rec, wallclock.local_s(wall, zone, "latest"), zone, after_s, skip=skip)
    return rec.drop("_early").rename({"stamp_s": "t_end"}).with_columns(_step=~skip)


def _not_a_step(df: pl.DataFrame, after_s: float | None) -> pl.Series:
    """Rows whose earlier reading (``_early``) is no step before the next ones: records rejected
    for their fields (``_field``), and those of a run stamped ahead (:func:`_ahead_s`) whose
    neighbours are within FOLD_SLACK_S of each other. Sparse records (an idle server) ahead of the
    next are instead likely the first pass of the repeated hour: left as steps (the order checks
    judge them after)."""
    rows = df.select(pl.int_range(pl.len()).alias("_i"), t=pl.col("_early"), bad=pl.col("_field").is_not_null())
    seq = rows.filter(pl.col("t").is_not_null() & ~pl.col("bad"))
    gap = _ahead_s(pl.col("t"), after_s, max_gap_s=wallclock.FOLD_SLACK_S)
    ahead = seq.with_columns(_ahead_s=gap).filter(pl.col("_ahead_s").is_not_null()).get_column("_i")
    return rows.get_column("bad").scatter(ahead, True)


# the field each canonical one comes from (the first of its alternatives), for reasons
SOURCES = {
    "dur_ms": "iterLatencyMS",
    "t_end": "timestamp",
    "running_reqs": "numActiveRequests",
    "preempted_reqs": "inflightBatchingStats.numPausedRequests",
    "kv_usage": "kvCacheStats.usedNumBlocks / maxNumBlocks",
}


# how many records in a row may be stamped ahead and be rejected as outliers (see _out_of_order)
AHEAD_RUN = 3
# how many stamped records after a record the rule for runs ahead reads (_ahead_s): the rest of a
# run of AHEAD_RUN, the record after it and as many after that as the run has records, less one
LOOKAHEAD = 2 * AHEAD_RUN - 1


def _source_tables(path: Path, progress) -> Iterator[tuple[pl.DataFrame, int]]:
    """``(line_no, raw, json_text)`` frames: JSON array elements, or file lines."""
    head = reader.head_text(path, 256).lstrip()
    if head.startswith("["):
        c.read_json_document(path)  # a clear error for a document that is not valid JSON
        with reader.open_binary(path) as f:
            text = f.read().decode("utf-8-sig", errors="replace")
        # array elements as JSON text, split by DuckDB (no Python loop over elements)
        con = store.scratch()
        frame = store.frame(
            con,
            "select (generate_subscripts(items, 1))::bigint as line_no, unnest(items)::varchar as raw "
            "from (select json_extract($doc::json, '$[*]') as items)",
            {"doc": text},
            rows=len(text) // DOC_RECORD_BYTES_MIN,
        )
        con.close()
        yield frame.with_columns(text=pl.col("raw")), frame.height
        return
    for table in reader.lines(path, progress):
        frame = c.log_lines(table)  # text: the line without ANSI colour codes
        yield (
            frame.with_columns(
                text=pl.when(pl.col("text").str.strip_chars().str.starts_with("{")).then(pl.col("text"))
            ),
            frame.height,
        )


def convert(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None, tz: str | None = None
) -> Iterator[Batch]:
    zone = c.check_zone(tz) if tz else c.local_zone()
    con = store.scratch()  # $TRACELAT_MEMORY_LIMIT applies here too
    # fold_s: the latest stamp of the records judged so far that count as steps before the next
    # (_not_a_step), for the reading of a repeated hour; good_s: the latest good one, for the order checks
    # ctx: the stamps of the last records before ``held`` that the order checks saw, so that
    # the ahead rule sees the same neighbours across a batch's edge as within a batch
    run_done, fold_s, good_s, held, ctx = False, None, None, None, []
    for frame, n in _source_tables(path, progress):
        blank = frame.filter(pl.col("raw").str.strip_chars() == "").height
        frame = frame.filter(pl.col("raw").str.strip_chars() != "")
        frame = frame.with_columns(text=pl.when(pl.col("text").is_not_null()).then(_as_json(pl.col("text"))))
        con.register("f", reader.in_batches(frame))  # read on every core (reader.ARROW_BATCH_ROWS)
        frame = store.frame(
            con, "select line_no, raw, text, coalesce(json_valid(text), false) as valid from f", rows=frame.height
        )
        con.unregister("f")
        broken = frame.filter(~pl.col("valid") & pl.col("raw").str.strip_chars().str.starts_with("{"))
        if broken.height:  # rare: fall back to literal_eval, line by line, only for these
            fixed = broken.with_columns(text=pl.col("raw").map_elements(_literal_fallback, return_dtype=pl.String))
            frame = frame.update(fixed.select("line_no", "text", valid=pl.col("text").is_not_null()), on="line_no")
        con.register("src", reader.in_batches(frame.select("line_no", "raw", "valid", js=pl.col("text"))))
        rec = store.frame(con, EXTRACT, rows=frame.height)
        con.unregister("src")
        ends = rec.filter(pl.col("is_end")).height
        rec = rec.filter(~pl.col("is_end"))
        if held is not None:  # the records the last batch could not judge go first, put on the clock again
            rec = pl.concat([held.select(rec.columns), rec], how="vertical_relaxed")
        rec = rec.with_columns(_field=_field_reason())
        rec = _on_the_clock(rec, zone, fold_s).with_columns(reason=_reason(zone)).drop("_field")
        run = None if run_done else _run(rec, zone, bool(tz))
        run_done = True
        rec, held, good_s, ctx = _out_of_order(rec, good_s, ctx)
        # the same rows count across a batch's edge as within a batch, so its size changes no reading
        fold_s = wallclock.latest(rec.filter(pl.col("_step")).select(stamp_s="t_end"), fold_s)
        yield _batch(rec.drop("_step"), n, blank + ends, run)
    if held is not None:
        rec, _, _, _ = _out_of_order(held, good_s, ctx, last=True)
        yield _batch(rec.drop("_step"), 0, 0, None)
    con.close()


def _batch(rec: pl.DataFrame, n: int, skipped: int, run: dict | None) -> Batch:
    return c.batch(
        c.encode(
            rec.filter(pl.col("reason").is_null()),
            "iteration",
            ("completed_reqs", "new_active_queue_ms"),
            sources=SOURCES,
        ),
        n,
        run=run,
        rejects=rec.filter(pl.col("reason").is_not_null()),
        skipped=skipped,
    )


def _stamped() -> pl.Expr:
    return pl.col("reason").is_null() & pl.col("t_end").is_not_null()


def _ahead_s(t: pl.Expr, after_s: float | None, max_gap_s: float | None = None) -> pl.Expr:
    """Over stamps ``t`` in file order (``after_s``: the latest good one before them), how far a
    record in a run stamped ahead is ahead of the record after its run (NULL for the others).

    A run of up to AHEAD_RUN records stamped ahead (a corrupted stamp, a year typo) is the outlier,
    not every record after it: each of the run is later than the record after the run, and the
    record before the run is strictly earlier than that one (in order without the run) and not later
    than the run's first. Strictly: a repeated block (copytruncate) starts at the stamp of a record
    before it, so the good records it follows are not taken for a run ahead; the block is 'behind'.
    A run of two or three is the outlier only when as many records after it are behind it (up to
    the file's end): when fewer are, those are the records out of order, and fewer are rejected.
    ``max_gap_s``: only runs whose record before is at most this far from the record after (a run
    at the very start has none before: never).
    """
    prev = t.shift(1).fill_null(float("-inf") if after_s is None else after_s)
    by = []  # (run start, offset in the run): the row's stamp minus the stamp after its run
    for n in range(1, AHEAD_RUN + 1):
        after = t.shift(-n)
        starts = (prev < after) & (pl.min_horizontal(*(t.shift(-o) for o in range(n))) > after) & (prev <= t)
        # a run of n is the outlier only when as many records after it would be behind it, kept:
        # one record behind two or three good ones (a 40 min slip) is that record, not them
        top = pl.max_horizontal(*(t.shift(-o) for o in range(n)))
        for m in range(1, n):  # the record right after the run is behind it by the rule above
            starts = starts & (t.shift(-(n + m)).is_null() | (t.shift(-(n + m)) < top))
        if max_gap_s is not None:
            starts = starts & (after - prev <= max_gap_s)
        for o in range(n):
            by.append(pl.when(starts.shift(o).fill_null(False)).then(t - after.shift(o)))
    return pl.coalesce(by)


def _out_of_order(
    rec: pl.DataFrame, after_s: float | None, ctx: list[float], last: bool = False
) -> tuple[pl.DataFrame, pl.DataFrame | None, float | None, list[float]]:
    """``rec`` with a reason for the good records stamped out of order, the rows held back for the
    next batch, the latest good stamp so far (``after_s``: that of earlier batches) and the new
    ``ctx``.

    The executor writes its iterations in order, so a record behind one before it is a log
    repeated or spliced (fetched twice, copytruncate): kept, its steps would count twice and the
    timeline would run backwards, as vLLM's and SGLang's converters reject too.  Whether a record
    is ahead depends on the records after it: unless ``last``, the rows from the LOOKAHEAD-th last
    stamped record on are not judged here but held, to go first in the next batch.  It depends on
    the records before it too (a run ahead starts after a record in order with the one after the
    run): ``ctx`` holds the stamps of the last AHEAD_RUN + 1 stamped records before ``rec`` (of
    the file so far when fewer), whatever their fate, which is all the rule reads of them."""
    floor = float("-inf") if after_s is None else after_s
    ok = _stamped()
    rows = rec.with_row_index("_i")
    seq = rows.filter(ok).select("_i", "t_end")  # the stamped records, in file order
    cut = rec.height if last or seq.height == 0 else int(seq.get_column("_i").tail(LOOKAHEAD)[0])
    held = None if cut == rec.height else rec.slice(cut)
    before = pl.DataFrame({"_i": list(range(-len(ctx), 0)), "t_end": ctx}, schema={"_i": pl.Int64, "t_end": pl.Float64})
    ahead = (
        pl.concat([before, seq], how="vertical_relaxed")
        .with_columns(_ahead_s=_ahead_s(pl.col("t_end"), None))
        .filter(pl.col("_ahead_s").is_not_null() & (pl.col("_i") >= 0))
        .select(pl.col("_i").cast(pl.UInt32), "_ahead_s")
    )
    ctx = [*ctx, *seq.filter(pl.col("_i") < cut).get_column("t_end").tail(AHEAD_RUN + 1).to_list()]
    ctx = ctx[-(AHEAD_RUN + 1) :]
    rec = (
        rows.head(cut)
        .join(ahead, on="_i", how="left")
        .sort("_i")
        .with_columns(
            reason=pl.when(pl.col("_ahead_s").is_not_null())
            .then(
                pl.format(
                    "IterationStats record stamped {} s after a record that follows it, which is in order with "
                    "the one before: a corrupted stamp?",
                    pl.col("_ahead_s").round(3),
                )
            )
            .otherwise(pl.col("reason"))
        )
        .drop("_i", "_ahead_s")
    )
    stamp = pl.when(ok).then(pl.col("t_end"))
    before = pl.max_horizontal(stamp.cum_max().forward_fill().shift(1).fill_null(floor), pl.lit(floor))
    rec = rec.with_columns(
        reason=pl.when(ok & (pl.col("t_end") < before))
        .then(
            pl.format(
                "IterationStats record stamped {} s before an earlier record: a repeated or spliced log? "
                "(the executor writes its iterations in time order)",
                (before - pl.col("t_end")).round(3),
            )
        )
        .otherwise(pl.col("reason"))
    )
    top = rec.filter(pl.col("reason").is_null()).get_column("t_end").max()
    return rec, held, (after_s if top is None else max(floor, float(top))), ctx


_LIMITS = ("max_batch_runtime", "max_batch_static", "max_tokens_runtime", "max_tokens_static", "kv_tokens")


def _run(rec: pl.DataFrame, zone: str, given: bool) -> dict:
    """The run record, its limits from the first batch's first good record or, when the batch has
    none (a log that starts with damage; one-record batches), its first record that has them: the
    run is written once, with the first batch, so the limits must not depend on its size."""
    good = rec.filter(pl.col("reason").is_null())
    if not good.height:
        good = rec.filter(pl.any_horizontal(pl.col(c).is_not_null() for c in _LIMITS))
    first = good.head(1).to_dicts()[0] if good.height else {}
    meta = {
        "source_format": "trtllm-iteration-stats",
        "max_num_seqs": first.get("max_batch_runtime") or first.get("max_batch_static"),
        "max_num_batched_tokens": first.get("max_tokens_runtime") or first.get("max_tokens_static"),
        "kv_cache_tokens": first.get("kv_tokens"),
        # the writer's local time, no zone in the stamp
        "timestamps_time_zone": zone + ("" if given else " (this machine's zone; pass --tz to change)"),
    }
    return {"engine": "tensorrt-llm", "clock": "unix", "meta": meta}
