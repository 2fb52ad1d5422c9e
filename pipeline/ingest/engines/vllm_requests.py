"""vLLM per-request stats: one JSON object per finished request (``RequestStateStats``).

Fields (as dumped by LLMServingSim's harness and by scripts/record_vllm_cpu.py):
``request_id, input_toks, output_toks, arrival_time, queued_ts, scheduled_ts,
first_token_ts, last_token_ts`` (+ optional ``num_preemptions``,
``num_cached_tokens``, ``finish_reason``).  ``arrival_time`` is the front end's
wall clock (Unix s); the four ``*_ts`` are the engine core's ``time.monotonic()``.

One clock: we keep Unix time.  The monotonic stamps get one offset per file,
``o = max_i(arrival_time_i - queued_ts_i)``: every request reaches the engine queue
some front-end delay after it arrived, and the smallest delay is taken as zero, so
``t_arrival <= t_scheduled`` holds for all and TTFT includes front-end work
(tokenisation), as a client sees it.  ``o`` is stored in ``meta.monotonic_to_unix_s``.

One line must not move every other: a ``queued_ts`` from another clock (a zeroed or
hand-edited field, a restarted engine) would set the maximum.  So the offsets are
first checked against their median ``m`` (half the lines would have to agree to move
it): with ``d_i`` the front-end delays, ``o_i - m = d_med - d_i``, which a real
request keeps below the median request's delay (milliseconds; ``EARLY_TOLERANCE_S``
allows far more) and above minus its own delay (``LATE_TOLERANCE_S``: tokenisation
and hand-over do not take minutes).  Lines outside are rejected, naming the field
and the expected offset; the maximum is taken over the others.

A ``meta.json`` next to the file (LLMServingSim layout) supplies the run facts:
vLLM version, model, GPU, ``max_num_seqs``, ``max_num_batched_tokens``, KV tokens.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl

from ... import store
from .. import reader
from ..load import Batch
from . import _common as c
from . import llmservingsim

# how far a line's arrival_time - queued_ts may lie from the file's median (see module doc):
# above it, the request would have reached the engine before the median request's front-end
# delay (ms, < 0.3 s in every recorded run we have) had passed; below it, it would have spent
# more than a minute between the front end and the engine queue
EARLY_TOLERANCE_S = 1.0
LATE_TOLERANCE_S = 60.0

REQUIRED = ("request_id", "arrival_time", "queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")

PARSE = (
    "with j as ("
    + c.JSON_OBJECTS
    + """)
select line_no, raw,
  case when """
    + reader.BLANK_SQL
    + """ then 'blank'
       when not ok then 'not valid JSON (truncated or garbage line)'
  end as perr,
  js->>'$.request_id' as req_id,
  try_cast(js->>'$.input_toks' as bigint) as prompt_tokens,
  try_cast(js->>'$.output_toks' as bigint) as output_tokens,
  try_cast(js->>'$.num_preemptions' as bigint) as preemptions,
  try_cast(js->>'$.num_cached_tokens' as bigint) as cached_tokens,
  js->>'$.finish_reason' as finish_reason,
  try_cast(js->>'$.arrival_time' as double) as arrival_time,
  nullif(try_cast(js->>'$.queued_ts' as double), 0) as queued_ts,
  nullif(try_cast(js->>'$.scheduled_ts' as double), 0) as scheduled_ts,
  nullif(try_cast(js->>'$.first_token_ts' as double), 0) as first_token_ts,
  nullif(try_cast(js->>'$.last_token_ts' as double), 0) as last_token_ts,
  case when ok then list_filter({names}, lambda k: json_type(js, '$.' || k) is null) end as missing,
  {problems} as vproblem
from j
"""
)

# Fields whose value is checked: present but not a number (or a count out of range) rejects
# the line, naming the field, where a try_cast would make it NULL (a request without first
# token reads as failed).  Absent and null stay allowed, as the format has it.
CHECKED = (
    *(("$." + f, f, "count") for f in ("input_toks", "output_toks", "num_preemptions", "num_cached_tokens")),
    *(
        ("$." + f, f, "number")
        for f in ("arrival_time", "queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
    ),
)
_ID_PROBLEM = (
    "case when json_type(js, '$.request_id') in ('OBJECT', 'ARRAY', 'BOOLEAN', 'DOUBLE') "
    "then 'request_id: expected a string or integer, got ' || left(json_extract(js, '$.request_id')::varchar, "
    f"{c.SHOWN_CHARS}) end"
)


_PROBLEMS = "nullif(concat_ws('; ', " + _ID_PROBLEM + ", " + c.json_problems("js", list(CHECKED)) + "), '')"


# the field each canonical one comes from, named in the reasons of rejected records
SOURCES = {
    "req_id": "request_id",
    "prompt_tokens": "input_toks",
    "output_tokens": "output_toks",
    "preemptions": "num_preemptions",
    "cached_tokens": "num_cached_tokens",
    "t_arrival": "arrival_time",
    "t_scheduled": "scheduled_ts",
    "t_first_token": "first_token_ts",
    "t_finish": "last_token_ts",
}


def sniff(path: Path, head: str) -> bool:
    first = next((ln for ln in head.splitlines() if ln.strip()), "")
    return first.lstrip().startswith("{") and '"queued_ts"' in first and '"first_token_ts"' in first


def _sidecar(path: Path) -> dict:
    """Run facts from an LLMServingSim-style ``meta.json`` beside the file, if any (the fields
    the ``llmservingsim-meta`` format gives, :func:`llmservingsim.run_fields`)."""
    side = path.parent / llmservingsim.META_FILE
    try:
        doc = json.loads(side.read_text(errors="replace"))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(doc, dict):  # optional run facts: a damaged file is left out, never fatal
        return {}
    run = llmservingsim.run_fields(doc, side.name)
    run.pop("engine")
    return run


# Why a parsed line is not a request (None: it is one).
_REASON = pl.coalesce(
    pl.col("perr"),
    pl.when(pl.col("missing").list.len() > 0).then(
        pl.lit("vLLM request stats without ") + pl.col("missing").list.join(", ")
    ),
    pl.col("vproblem"),
    pl.when(pl.col("arrival_time").is_null() | pl.col("queued_ts").is_null()).then(
        pl.lit("arrival_time and queued_ts must be non-zero numbers")
    ),
)


def _check_clock(good: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(lines whose clock offset agrees with the file's median, rejects of the others); see module doc."""
    if not good.height:
        return good.drop("raw"), pl.DataFrame(schema={"line_no": pl.Int64, "reason": pl.String, "raw": pl.String})
    o = pl.col("arrival_time") - pl.col("queued_ts")
    median = float(good.select(o.median()).item())
    dev = o - median
    off = (dev > EARLY_TOLERANCE_S) | (dev < -LATE_TOLERANCE_S)
    expected = f"{median:.6f}"
    reason = pl.format(
        "queued_ts {} is on another clock than the file's other lines: arrival_time - queued_ts = {} s, "
        "expected about " + expected + " s (the file's median; a request reaches the engine queue 0 to "
        f"{LATE_TOLERANCE_S:g} s after it arrives)",
        pl.col("queued_ts"),
        o.round(6),
    )
    rejects = good.filter(off).select(pl.col("line_no").cast(pl.Int64), reason.alias("reason"), "raw")
    return good.filter(~off).drop("raw"), rejects


def convert(path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None) -> Iterator[Batch]:
    """Parse every line in DuckDB, then map the clocks with one offset for the file."""
    con = store.scratch()  # $TRACELAT_MEMORY_LIMIT applies here too
    names = "[" + ", ".join(f"'{n}'" for n in REQUIRED) + "]"
    goods, bads, total, blank = [], [], 0, 0
    for table in reader.lines(path, progress):
        total += table.num_rows
        con.register("lines", table)
        part = store.frame(con, PARSE.format(names=names, problems=_PROBLEMS), rows=table.num_rows).with_columns(
            reason=_REASON
        )
        con.unregister("lines")
        blank += part.filter(pl.col("reason") == "blank").height
        # only rejects keep their text
        bads.append(
            part.filter(pl.col("reason").is_not_null() & (pl.col("reason") != "blank")).select(
                "line_no", "reason", "raw"
            )
        )
        goods.append(part.filter(pl.col("reason").is_null()))  # raw kept until the clock check
    con.close()
    if not goods:  # an empty file
        yield c.batch(None, total)
        return
    good, clock_bad = _check_clock(pl.concat(goods))
    bad = pl.concat([*bads, clock_bad]).sort("line_no")
    offset = float(good.select((pl.col("arrival_time") - pl.col("queued_ts")).max()).item()) if good.height else 0.0
    got_token = pl.col("first_token_ts").is_not_null()
    req = good.select(
        "line_no",
        "req_id",
        "prompt_tokens",
        "cached_tokens",
        "preemptions",
        "finish_reason",
        t_arrival=pl.col("arrival_time"),
        t_queued=pl.col("queued_ts") + offset,
        t_scheduled=pl.col("scheduled_ts") + offset,
        t_first_token=pl.col("first_token_ts") + offset,
        t_finish=pl.coalesce(pl.col("last_token_ts"), pl.col("first_token_ts")) + offset,
        output_tokens=pl.col("output_tokens"),
        status=pl.when(~got_token)
        .then(pl.lit("error"))
        .when(pl.col("finish_reason").fill_null("").str.to_lowercase().str.contains("abort"))
        .then(pl.lit("aborted"))
        .otherwise(pl.lit("ok")),
    )
    run = _sidecar(path)
    meta = dict(run.pop("meta", {}))
    meta.update(
        source_format="vllm-requests",
        monotonic_to_unix_s=offset,
        clock_mapping="t = monotonic_ts + max(arrival_time - queued_ts) over the lines whose offset "
        "agrees with the file's median",
    )
    run.update(engine="vllm", clock="unix", meta=meta)
    records = c.encode(req, "request", ("t_queued", "finish_reason"), sources=SOURCES)
    yield c.batch(records, total, run=run, rejects=bad, skipped=blank)
