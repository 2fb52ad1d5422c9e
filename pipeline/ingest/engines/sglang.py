"""SGLang: scheduler logs (``Prefill batch`` / ``Decode batch``) and exported request metrics.

Log lines are read as key/value lists, not one fixed regex, because the wording
changed across versions (``batch.`` or ``batch,``, an optional ``[N]`` step counter,
``TP0``/``DP0`` rank tags, trailing ``, ``, ``#token`` vs ``token usage``, ``cuda
graph``/``cpu graph``, ``gen throughput (token/s)``).  The body after ``batch`` is
split on ``, `` and each ``key: value`` pair becomes a map entry.

* A ``Prefill batch`` line is one prefill step: ``#new-token`` -> prefill_tokens,
  ``#new-seq`` -> prefill_reqs, ``#running-req`` -> decode_reqs (requests already
  decoding, batched with the prefill), ``#queue-req`` -> waiting_reqs,
  ``token usage`` -> kv_usage, ``#cached-token`` kept as extra.  SGLang logs no
  step duration for prefill, so such steps have an end time and no duration.
* A ``Decode batch`` line is printed once every ``decode_log_interval`` decode steps
  (default 40): it is one sampled step.  ``#running-req`` -> decode_reqs and
  decode_tokens, ``#token`` -> context_tokens, and the duration is estimated as
  ``#running-req / gen throughput`` (a mean over the interval; the run's
  ``meta.estimated`` says so).

SGLang stamps have one-second resolution.  The run says
``meta.decode_log_interval`` and ``meta.decode_lines_sampled = true``.

``--export-metrics-to-file`` writes one JSON object per finished request
(``sglang-request-metrics-*.log``); see :func:`convert_metrics`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl

from ... import store
from .. import reader
from ..load import Batch
from . import _common as c
from . import _wallclock as wallclock

# "[N]" is the step counter; "[first graph replay]" marks the first decode after a CUDA-graph capture
LINE = r"(Prefill|Decode) batch(?: \[([^\]]*)\])?[.,] (.*)$"
# what a batch line starts with: a line that has it but no LINE was cut off or garbled, and
# is rejected (never skipped: a step would be lost unnoticed); "Decode batch size" is no mark
MARK = r"(?:Prefill|Decode) batch(?: \[|[.,]|$)"
# a batch line as the scheduler logs it: a time of day on the line before the words (a note
# that quotes the words, as our fixtures' NOTE.md does, is no log)
SNIFF = re.compile(r"(?m)^[^\n]*\d\d:\d\d:\d\d[^\n]*(?:Prefill|Decode) batch(?: \[[^\]]*\])?[.,] (?:#|iter:)")
DEFAULT_DECODE_INTERVAL = 40


def sniff_log(path: Path, head: str) -> bool:
    return bool(SNIFF.search(c.strip_ansi(head)))


def _kv(body: pl.Expr) -> pl.Expr:
    """``key: value, key: value`` -> list of {key, value} structs (trailing ', ' tolerated)."""
    pairs = body.str.strip_chars_end(", ").str.split(", ")
    return pairs.list.eval(
        pl.struct(
            k=pl.element().str.extract(r"^([^:]+):", 1).str.strip_chars(),
            v=pl.element().str.extract(r":\s*(.*)$", 1).str.strip_chars(),
        )
    )


def _get(kv: str, key: str) -> pl.Expr:
    """Value of ``key`` in the pair list (NULL when absent)."""
    return (
        pl.col(kv).list.eval(pl.element().filter(pl.element().struct.field("k") == key).struct.field("v")).list.first()
    )


def _num(kv: str, *keys: str, cast=pl.Float64) -> pl.Expr:
    return pl.coalesce(*[_get(kv, k).str.strip_chars_end("%").cast(cast, strict=False) for k in keys])


def _parse(lines: pl.DataFrame, written: float, tz: str = "UTC", after_s: float | None = None) -> pl.DataFrame:
    """``lines``: :func:`_common.log_lines` (fields from ``text``, the line without ANSI colour
    codes); ``after_s``: the latest stamp of the batch lines of earlier batches."""
    raw = pl.col("text")
    m = raw.str.extract_groups(LINE)
    prefix = raw.str.split_exact(" batch", 1).struct.field("field_0")
    df = lines.filter(raw.str.contains(MARK)).with_columns(_prefix=prefix)
    df = c.with_log_times(df, "_prefix", written, tz, after_s)
    df = df.with_columns(
        phase=m.struct.field("1"),
        sglang_iter=m.struct.field("2").cast(pl.Int64, strict=False),
        sglang_label=pl.when(m.struct.field("2").cast(pl.Int64, strict=False).is_null()).then(m.struct.field("2")),
        kv=_kv(m.struct.field("3")),
        ranks=pl.col("_prefix").str.extract(r"((?:\s(?:DP|TP|PP|EP|ATTN_CP|MOE_DP)\d+)+)\]", 1).str.strip_chars(),
    ).drop("_prefix")
    prefill = pl.col("phase") == "Prefill"
    running = _num("kv", "#running-req", cast=pl.Int64)
    throughput = _num("kv", "gen throughput (token/s)")
    # speculative decoding: each running request gains `accept len` tokens per step on average
    accept = _num("kv", "accept len").fill_null(1.0)
    return df.with_columns(
        prefill_tokens=pl.when(prefill).then(_num("kv", "#new-token", cast=pl.Int64)).otherwise(0),
        prefill_reqs=pl.when(prefill).then(_num("kv", "#new-seq", cast=pl.Int64)).otherwise(0),
        # a prefill batch runs alone (the decode batch waits), so it decodes nothing
        decode_reqs=pl.when(prefill).then(0).otherwise(running),
        decode_tokens=pl.when(prefill)
        .then(0)
        .otherwise(
            # strict=False: an infinite or huge accept len gives NULL here and a reject below, not a crash
            (running.cast(pl.Float64) * accept).round().cast(pl.Int64, strict=False)
        ),
        running_reqs=running,
        context_tokens=pl.when(prefill).then(None).otherwise(_num("kv", "#token", "#full token", cast=pl.Int64)),
        waiting_reqs=_num("kv", "#queue-req", cast=pl.Int64),
        kv_usage=_num("kv", "token usage", "full token usage", "page usage"),
        cached_tokens=_num("kv", "#cached-token", cast=pl.Int64),
        gen_throughput_tok_s=throughput,
        accept_len=pl.when(~prefill).then(_num("kv", "accept len")),
        dur_ms=pl.when(~prefill & (throughput > 0)).then(running.cast(pl.Float64) * accept * 1000.0 / throughput),
        graph=pl.coalesce(_get("kv", "cuda graph"), _get("kv", "cpu graph"), _get("kv", "npu graph")) == "True",
    )


def _reasons(df: pl.DataFrame) -> pl.DataFrame:
    prefill = pl.col("phase") == "Prefill"
    # every wording variant has these; a line without them was cut off or garbled
    need = [
        ("#running-req", pl.col("running_reqs")),
        ("#queue-req", pl.col("waiting_reqs")),
        ("timestamp", pl.col("stamp_s")),
    ]
    reason = (
        pl.when(prefill)
        .then(
            c.missing_reason(
                [("#new-token", pl.col("prefill_tokens")), ("#new-seq", pl.col("prefill_reqs")), *need],
                "SGLang Prefill batch line without ",
            )
        )
        .otherwise(
            c.missing_reason(
                [*need, ("gen throughput (token/s)", pl.col("gen_throughput_tok_s"))],
                "SGLang Decode batch line without ",
            )
        )
    )
    garbled = pl.when(pl.col("phase").is_null()).then(
        pl.lit("truncated or garbled SGLang batch line (no 'Prefill batch. ' or 'Decode batch. ' followed by fields)")
    )
    # a line cut short with the next written on it holds two marks: read as one step, it lost one
    glued = pl.when(pl.col("text").str.count_matches(MARK) > 1).then(
        pl.lit("two SGLang batch lines run together (a line cut short with the next written on it): neither is read")
    )
    # a stamp with a malformed UTC offset has no time: the line says why, not "without timestamp"
    unread = pl.format("SGLang {} batch line with an unreadable timestamp: {}", "phase", "stamp_problem")
    df = df.with_columns(reason=pl.coalesce(garbled, glued, unread, reason))
    # a value that is there but unreadable or out of range parses as NULL ("without" it) or as a
    # negative count; such lines (few) get a reason naming the field, the value and the range
    counts = ("prefill_tokens", "prefill_reqs", "decode_reqs", "running_reqs", "context_tokens", "waiting_reqs")
    odd = pl.any_horizontal(
        pl.col("reason").is_not_null(),
        *(pl.col(k) < 0 for k in (*counts, "cached_tokens", "gen_throughput_tok_s", "accept_len")),
        # an infinite or absurd accept len: its decode tokens do not fit an integer
        pl.col("accept_len").is_not_null() & pl.col("decode_tokens").is_null(),
        ~pl.col("kv_usage").is_between(0.0, 1.0),
    ).fill_null(False)
    need = df.select(odd).to_series()
    if not need.any():
        return df
    return pl.concat([df.filter(~need), _explain(df.filter(need))]).sort("line_no")


# The fields of a batch line with the values they may take: (key, kind); kind is count (an
# integer 0..2^53), fraction (0..1) or number (0 or more).
_RANGES = (
    *((k, "count") for k in ("#new-token", "#new-seq", "#running-req", "#queue-req", "#token", "#full token")),
    ("#cached-token", "count"),
    *((k, "fraction") for k in ("token usage", "full token usage", "page usage")),
    ("gen throughput (token/s)", "number"),
    ("accept len", "number"),
)
_ALLOWED = {"count": "an integer from 0 to 2^53", "fraction": "a fraction from 0 to 1", "number": "a number from 0 up"}


def _range_problem(text: pl.Expr, key: str, kind: str) -> pl.Expr:
    """Why the value ``text`` of ``key`` is unusable, or NULL when it is fine (or absent)."""
    d = text.cast(pl.Float64, strict=False)
    shown = text.str.slice(0, c.SHOWN_CHARS)
    out_of_range = d < 0
    if kind == "count":
        out_of_range = out_of_range | (d > c.MAX_COUNT)
    if kind == "fraction":
        out_of_range = out_of_range | (d > 1)
    problem = (
        pl.when(text.is_null())
        .then(None)
        .when(d.is_null() | ~d.is_finite())
        .then(
            pl.format(
                "{}: expected {}, got {}", pl.lit(key), pl.lit("an integer" if kind == "count" else "a number"), shown
            )
        )
        .when(out_of_range)
        .then(pl.format("{}: {} is out of range (allowed: {})", pl.lit(key), shown, pl.lit(_ALLOWED[kind])))
    )
    if kind == "count":
        problem = problem.when(d != d.round()).then(pl.format("{}: expected an integer, got {}", pl.lit(key), shown))
    return problem.otherwise(None)


def _explain(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` (lines rejected or with a value out of range) with reasons naming the bad values."""
    problems = [_range_problem(_get("kv", k).str.strip_chars_end("%"), k, kind) for k, kind in _RANGES]
    found = pl.concat_list(problems).list.drop_nulls().list.join("; ")
    phase = pl.format("SGLang {} batch line: ", pl.col("phase"))
    return df.with_columns(
        reason=pl.when(pl.col("phase").is_not_null() & (found.str.len_chars() > 0))
        .then(phase + found)
        .otherwise(pl.col("reason"))
    )


def convert_log(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None, tz: str | None = None
) -> Iterator[Batch]:
    written = c.written_s(path)
    zone = c.check_zone(tz) if tz else c.local_zone()
    goods, bads, total, n_rec, after_s = [], [], 0, 0, None
    for table in reader.lines(path, progress):
        lines = c.log_lines(table)
        total += lines.height
        df = _parse(lines, written, zone, after_s)
        # a repeated DST hour is read on from the stamps of the batches before (with_log_times)
        after_s = wallclock.latest(df, after_s)
        df = _reasons(df)
        n_rec += df.height
        # only rejects keep their text (and the parsed key/value pairs go once read)
        bads.append(df.filter(pl.col("reason").is_not_null()).select("line_no", "reason", "raw"))
        goods.append(df.filter(pl.col("reason").is_null()).drop("text", "kv", "reason"))
    good = _out_of_order(pl.concat(goods).sort("line_no"), bads) if goods else None
    if good is None or not good.height:  # no step to describe: just the rejects, if any
        yield c.batch(None, total, rejects=pl.concat(bads) if bads else None, skipped=total - n_rec)
        return
    # each data-parallel rank schedules its own batches: its steps are a run of their own
    good = good.with_columns(iter=pl.int_range(pl.len()).over("dp"))
    # Only the decode lines carry a (mean) duration; prefill steps keep their end time only.
    good = good.with_columns(
        iter=pl.col("iter").cast(pl.Int64),
        t_end=pl.col("stamp_s"),
        t_start=pl.when(pl.col("dur_ms").is_not_null()).then(pl.col("stamp_s") - pl.col("dur_ms") / 1000),
    )
    intervals = (
        good.filter(pl.col("sglang_iter").is_not_null() & (pl.col("phase") == "Decode"))
        .select(pl.col("sglang_iter").diff().over("dp"))
        .to_series()
        .drop_nulls()
    )
    observed = intervals.filter(intervals > 0).mode().to_list() if intervals.len() else []
    meta = {
        "source_format": "sglang-log",
        "decode_lines_sampled": True,
        "decode_log_interval": int(observed[0]) if observed else DEFAULT_DECODE_INTERVAL,
        "decode_log_interval_source": "step counters in the log"
        if observed
        else "SGLang default (--decode-log-interval)",
        "timestamp_resolution_s": float(good.get_column("stamp_resolution_s").max()),
        "estimated": ["dur_ms"],
        "dur_ms_estimate": "decode lines: #running-req / gen throughput (mean step time over the logging interval); "
        "prefill lines: no duration in SGLang logs",
        "ranks": good.get_column("ranks").drop_nulls().unique().sort().to_list() or None,
        # the zone wall-clock stamps were read in, or the offsets the stamps carried themselves
        **wallclock.zone_meta(good.get_column("stamp_zone"), zone, bool(tz)),
    }
    run = {"engine": "sglang", "clock": "unix", "meta": meta}
    rejects = pl.concat(bads)
    ranks = good.get_column("dp").unique().sort().to_list()
    if len(ranks) <= 1:
        yield c.batch(_records(good), total, run=run, rejects=rejects, skipped=total - n_rec)
        return
    base = run_name or c.stem(path)
    for k, idx in enumerate(ranks):
        rid = f"{base}-dp{idx}"
        part = good.filter(pl.col("dp") == idx).with_columns(run_id=pl.lit(rid))
        own = part.get_column("ranks").drop_nulls().unique().sort().to_list() or None
        run_k = run | {"run_id": rid, "meta": meta | {"ranks": own, "dp_rank": idx, "dp_ranks": len(ranks)}}
        first = k == 0  # the file's line counts and rejects go with its first run
        yield c.batch(
            _records(part),
            total if first else 0,
            run=run_k,
            rejects=rejects if first else None,
            skipped=total - n_rec if first else 0,
        )


def _out_of_order(good: pl.DataFrame, bads: list[pl.DataFrame]) -> pl.DataFrame:
    """The batch lines that are in time order within their rank; the others join ``bads``.

    A scheduler logs its batches in order, so a line stamped before an earlier line of its
    rank, or repeating one's step counter and stamp, is a log repeated or spliced (fetched
    twice, copytruncate): kept, its steps would count twice (the throughput doubled).
    """
    good = good.with_columns(dp=pl.col("ranks").str.extract(r"DP(\d+)", 1).cast(pl.Int64).fill_null(0))
    before = pl.col("stamp_s").cum_max().shift(1).over("dp")
    seen = pl.col("line_no").min().over("dp", "sglang_iter", "stamp_s")
    same = pl.col("line_no").min().over("dp", "raw")
    reason = (
        pl.when(pl.col("stamp_s") < before)
        .then(
            pl.format(
                "SGLang batch line stamped {} s before an earlier line of its scheduler: "
                "a repeated or spliced log? (its lines are in time order)",
                (before - pl.col("stamp_s")).round(3),
            )
        )
        .when(pl.col("sglang_iter").is_not_null() & (pl.col("line_no") != seen))
        .then(pl.format("SGLang batch line repeats step [{}] of line {} (a repeated log?)", "sglang_iter", seen))
        # a decode line's context and throughput change every step: word for word, it is the same line
        .when((pl.col("phase") == "Decode") & (pl.col("line_no") != same))
        .then(pl.format("SGLang Decode batch line repeats line {} word for word (a repeated log?)", same))
    )
    good = good.with_columns(reason=reason)
    bads.append(good.filter(pl.col("reason").is_not_null()).select("line_no", "reason", "raw"))
    return good.filter(pl.col("reason").is_null()).drop("raw", "reason")


def _records(good: pl.DataFrame):
    return c.encode(
        good,
        "iteration",
        ("phase", "sglang_iter", "sglang_label", "cached_tokens", "gen_throughput_tok_s", "accept_len", "graph"),
        sources={
            "prefill_tokens": "#new-token",
            "prefill_reqs": "#new-seq",
            "decode_reqs": "#running-req",
            "running_reqs": "#running-req",
            "context_tokens": "#token",
            "waiting_reqs": "#queue-req",
            "kv_usage": "token usage",
            "dur_ms": "#running-req / gen throughput",
        },
    )


# --- --export-metrics-to-file request records -------------------------------------------


def sniff_metrics(path: Path, head: str) -> bool:
    first = next((ln for ln in head.splitlines() if ln.strip()), "")
    return first.lstrip().startswith("{") and '"request_parameters"' in first and '"completion_tokens"' in first


METRICS_SQL = (
    "with j as ("
    + c.JSON_OBJECTS
    + """)
select line_no, raw,
  case when not ok then 'not valid JSON (truncated or garbage line)' end as perr,
  coalesce(js->>'$.id', js->>'$.rid') as req_id,
  try_cast(js->>'$.prompt_tokens' as bigint) as prompt_tokens,
  try_cast(js->>'$.completion_tokens' as bigint) as output_tokens,
  try_cast(js->>'$.cached_tokens' as bigint) as cached_tokens,
  try_cast(js->>'$.e2e_latency' as double) as e2e_s,
  try_cast(js->>'$.request_received_ts' as double) as received,
  try_cast(js->>'$.request_finished_ts' as double) as finished,
  try_cast(js->>'$.response_sent_to_client_ts' as double) as sent,
  try_cast(js->>'$.queue_time' as double) as queue_s,
  coalesce(js->>'$.finish_reason.type', js->>'$.finish_reason') as finish_reason,
  {problems} as vproblem
from j
"""
)
# Fields whose value is checked: one that is there but no number (a string "12", a count
# that is no integer) rejects the record naming the field, where try_cast would make it
# NULL or read the string (SGLang writes these as JSON numbers).
METRICS_CHECKED = [
    *((f"$.{k}", k, "count") for k in ("prompt_tokens", "completion_tokens", "cached_tokens")),
    *(
        (f"$.{k}", k, "number")
        for k in (
            "e2e_latency",
            "request_received_ts",
            "request_finished_ts",
            "response_sent_to_client_ts",
            "queue_time",
        )
    ),
]
METRICS_SQL = METRICS_SQL.replace("{problems}", c.json_problems("js", METRICS_CHECKED))


def convert_metrics(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None
) -> Iterator[Batch]:
    """One request per line: ``request_received_ts`` (Unix s) is the arrival; the finish is
    ``request_finished_ts`` or arrival + ``e2e_latency``.  SGLang exports no first-token
    time, so TTFT/TPOT stay unknown for these requests (NULL, not zero)."""
    con = store.scratch()  # $TRACELAT_MEMORY_LIMIT applies here too
    first = True
    for table in reader.lines(path, progress):
        con.register("lines", table)
        df = store.frame(con, METRICS_SQL, rows=table.num_rows)
        con.unregister("lines")
        blank = df.filter(pl.col("raw").str.strip_chars() == "")
        df = df.filter(pl.col("raw").str.strip_chars() != "").with_columns(
            reason=pl.coalesce(
                pl.col("perr"),
                pl.col("vproblem"),
                c.missing_reason(
                    [("id", pl.col("req_id")), ("request_received_ts", pl.col("received"))],
                    "SGLang request metrics without ",
                ),
            )
        )
        good = df.filter(pl.col("reason").is_null()).with_columns(
            t_arrival=pl.col("received"),
            t_scheduled=pl.when(pl.col("queue_s").is_not_null()).then(pl.col("received") + pl.col("queue_s")),
            t_finish=pl.coalesce(pl.col("finished"), pl.col("received") + pl.col("e2e_s")),
            status=pl.when(pl.col("finish_reason").fill_null("").str.to_lowercase().str.contains("abort"))
            .then(pl.lit("aborted"))
            .otherwise(pl.lit("ok")),
        )
        run = (
            {"engine": "sglang", "clock": "unix", "meta": {"source_format": "sglang-request-metrics"}}
            if first
            else None
        )
        first = False
        yield c.batch(
            c.encode(
                good,
                "request",
                ("finish_reason", "e2e_s"),
                sources={
                    "req_id": "id",
                    "output_tokens": "completion_tokens",
                    "t_arrival": "request_received_ts",
                    "t_scheduled": "queue_time",
                    "t_finish": "request_finished_ts",
                },
            ),
            table.num_rows,
            run=run,
            rejects=df.filter(pl.col("reason").is_not_null()),
            skipped=blank.height,
        )
    con.close()
