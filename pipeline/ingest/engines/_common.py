"""Helpers shared by the engine converters: canonical records from frames, log timestamps.

Every converter builds a Polars frame whose columns are canonical field names plus
``line_no``; :func:`encode` hands it to the loader as typed columns (the fields that
are not canonical as one JSON object per row), and the loader validates and stores
the records with the rules of canonical JSON (``pipeline/ingest/typed_sql.py``).  A converter may emit a ``run`` record built
from the file as a whole; it gets line number 0 (there is no such source line) and
is neither read nor accepted, so ``read`` is the file's line count and
``read = accepted + rejected + skipped`` still holds.
"""

from __future__ import annotations

import calendar
import datetime as dt
import json
import math
import re
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from ...errors import InputError
from ..canonical_sql import MAX_ABS_TIME_S, MAX_COUNT
from ..load import Batch, check_zone  # noqa: F401 - check_zone re-exported for the log converters
from .. import reader
from ..typed_sql import EXTRA_JSON, Typed
from . import _wallclock as wallclock
from ..load import default_run_id as stem  # noqa: F401 - re-exported: the loader's rule for a run name

# Canonical columns in the order we write them (the loader does not care about order).
ITERATION_COLS = (
    "iter",
    "t_start",
    "t_end",
    "dur_ms",
    "prefill_tokens",
    "prefill_reqs",
    "decode_tokens",
    "decode_reqs",
    "context_tokens",
    "running_reqs",
    "waiting_reqs",
    "kv_usage",
    "preempted_reqs",
)
REQUEST_COLS = (
    "req_id",
    "t_arrival",
    "t_scheduled",
    "t_first_token",
    "t_finish",
    "prompt_tokens",
    "output_tokens",
    "cached_tokens",
    "preemptions",
    "status",
    "token_times",
)


def run_json(fields: dict[str, Any]) -> str:
    """One canonical ``run`` record; ``None`` values (and empty meta) are dropped."""
    rec: dict[str, Any] = {"kind": "run"}
    for k, v in fields.items():
        if v is None:
            continue
        if k == "meta":
            v = {mk: mv for mk, mv in v.items() if mv is not None}
            if not v:
                continue
        rec[k] = v
    return json.dumps(_finite(rec), sort_keys=False, allow_nan=False)


def _finite(v: Any) -> Any:
    """Run metadata with NaN and infinities as text (JSON has no such numbers).

    ``vllm bench`` writes ``request_rate: Infinity`` for an unthrottled run, and a damaged
    file can put one anywhere; the walk covers one run record's metadata, not the data.
    """
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {str(k): _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def encode(frame: pl.DataFrame, kind: str, extra: tuple[str, ...] = (), sources: dict[str, str] | None = None) -> Typed:
    """The records of ``frame`` (one per row) as typed columns for the loader.

    Columns named in ``extra`` that are not canonical fields of ``kind`` go into each
    record's ``extra`` JSON object (the loader keeps unknown fields there); nulls stay
    JSON nulls there, and are "absent" in canonical fields.  ``sources`` maps canonical
    fields to the source fields they came from, for the reasons of rejected records.
    """
    known = ITERATION_COLS if kind == "iteration" else REQUEST_COLS
    cols = [c for c in (*known, "run_id") if c in frame.columns]
    unknown = [c for c in extra if c in frame.columns and c not in cols]
    extra_json = [pl.struct(*unknown).struct.json_encode().alias(EXTRA_JSON)] if unknown else []
    table = frame.select(pl.col("line_no").cast(pl.Int64), *cols, *unknown, *extra_json).to_arrow()
    # Polars hands over one chunk, which the loader's validation statement read on one thread: a
    # 200k-step slice of a vLLM log took 0.23 s (0.24 CPU-s) in one, 0.11 s (0.16 CPU-s) in batches
    return Typed(kind, reader.in_batches(table), tuple(unknown), tuple((sources or {}).items()))


def batch(
    records: Typed | None,
    lines_read: int,
    run: dict[str, Any] | None = None,
    rejects: pl.DataFrame | None = None,
    skipped: int = 0,
    positional_ids: bool = False,
    notes: list[str] | None = None,
) -> Batch:
    """A :class:`Batch`: the run record (line 0, canonical JSON) and the typed records.

    ``rejects`` has columns ``line_no, reason, raw`` (source lines the converter
    recognised as records but could not read).  ``positional_ids``: the request ids are
    entry numbers in the file (see :class:`pipeline.ingest.load.Batch`).  ``notes``: what the
    user should know of the batch (e.g. records skipped for a reason of the format's own).
    """
    lines = pa.table(
        {
            "line_no": pa.array([0] if run is not None else [], pa.int64()),
            "raw": pa.array([run_json(run)] if run is not None else [], pa.string()),
        }
    )
    rows: pa.Table | list = []
    if rejects is not None and rejects.height:
        rows = rejects.select(
            pl.col("line_no").cast(pl.Int64), pl.col("reason").cast(pl.String), pl.col("raw").cast(pl.String)
        ).to_arrow()
    typed = records if records is not None and records.table.num_rows else None
    return Batch(lines, lines_read, rows, skipped, typed=typed, positional_ids=positional_ids, notes=notes or [])


# ---------------------------------------------------------------------------
# Log-line timestamps.  Engines print many prefixes; we look for the most precise
# one present: epoch seconds (custom logging configs), an ISO date with time
# (Docker's --timestamps, SGLang, custom asctime), or vLLM's default
# "INFO 05-19 10:13:11" which has neither year nor sub-second digits.

_EPOCH = r"^\s*\[?(\d{10}\.\d+|\d{10})\]?\s"
# an ISO stamp may end in its own zone (Docker's "Z", "+01:00"): then it is no wall time in --tz
_ISO = r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:[.,](\d{1,9}))?" + wallclock.ZONE_MARK
_VLLM = r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(\d{2}-\d{2}) (\d{2}:\d{2}:\d{2})(?:[.,](\d{1,9}))?"


def _frac(col: pl.Expr) -> pl.Expr:
    """Digits after the decimal point as a fraction of a second (NULL -> 0)."""
    return (
        pl.when(col.is_null())
        .then(0.0)
        .otherwise(col.cast(pl.Float64) / pl.lit(10.0).pow(col.str.len_chars().cast(pl.Float64)))
    )


def _naive(date: pl.Expr, clock: pl.Expr) -> pl.Expr:
    return (date + pl.lit(" ") + clock).str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False)


def local_zone() -> str:
    """This machine's time zone as an IANA name (``$TZ``, else /etc/localtime), else UTC."""
    import os
    import zoneinfo

    name = os.environ.get("TZ", "").lstrip(":")
    if not name:
        try:
            target = os.path.realpath("/etc/localtime")
            name = target.split("zoneinfo/", 1)[1] if "zoneinfo/" in target else ""
        except OSError:
            name = ""
    try:
        zoneinfo.ZoneInfo(name)
        return name or "UTC"
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return "UTC"


# A year-less stamp is given the latest year that puts it before the file was last written;
# this much after it is still taken for the same year (a clock set a little wrong).
YEAR_SLACK_S = 2 * 86400.0


def with_log_times(
    df: pl.DataFrame, prefix: str, written_s: float, tz: str = "UTC", after_s: float | None = None
) -> pl.DataFrame:
    """``df`` with ``stamp_s``, ``stamp_resolution_s``, ``stamp_zone`` and ``stamp_problem`` from
    the text in column ``prefix``.

    ``stamp_s`` is Unix seconds: a stamp with its own zone (``Z``, ``+01:00``, ``+0100``,
    ``+01``, also after a space) is read as written, one without is wall time in ``tz``; one
    followed by a sign and digits that make no offset (``+1:00``) has none (NULL), and
    ``stamp_problem`` says why (NULL for every other line); vLLM's year-less stamps get the latest year
    that puts them at or before ``written_s``, the file's modification time, so a log over New
    Year or read in the next year keeps its order.  ``stamp_resolution_s`` is 1.0 for
    whole-second stamps and 1e-3 or finer otherwise.  ``stamp_zone`` says how the stamp was
    put on the clock (:data:`_wallclock.LOCAL`, its own offset, or NULL for epoch seconds).
    In the hour a DST fall-back repeats, a wall time is read as the later of its two
    instants where the earlier one would put the line behind the lines before it (rows in
    line order; ``after_s``: the latest stamp of the file's earlier batches, see
    :func:`_wallclock.pick_fold`).  Each pattern is matched once, into a column, before the
    fields are taken apart: as expressions, every field would run its pattern again (4 s
    instead of 0.3 s on 300k lines).

    A log stamped to the second repeats each prefix for every line of that second: the
    stamps are then read once per distinct prefix and joined back (the fold, which depends on
    line order, is still chosen per line).
    """
    head = df.get_column(prefix).head(DISTINCT_SAMPLE)
    if df.height > DISTINCT_SAMPLE and head.n_unique() * 4 < head.len():
        stamps = _read_stamps(df.select(pl.col(prefix).unique()), prefix, written_s, tz)
        df = df.join(stamps, on=prefix, how="left", maintain_order="left", nulls_equal=True)
    else:
        df = _read_stamps(df, prefix, written_s, tz)
    return wallclock.pick_fold(df, pl.col("_late_in"), tz, after_s).drop("_early", "_late_in")


# lines whose prefixes say whether they repeat (a second's lines of a busy log share one)
DISTINCT_SAMPLE = 4096


def _read_stamps(df: pl.DataFrame, prefix: str, written_s: float, tz: str) -> pl.DataFrame:
    """``df`` with ``_early`` and ``_late_in`` (a stamp's two readings in a repeated hour),
    ``stamp_resolution_s``, ``stamp_zone`` and ``stamp_problem`` from its column ``prefix``
    (see :func:`with_log_times`); a function of each row's prefix alone."""
    p = pl.col(prefix)
    df = df.with_columns(_ep=p.str.extract(_EPOCH, 1), _iso=p.str.extract_groups(_ISO), _vl=p.str.extract_groups(_VLLM))
    epoch, iso, vl = pl.col("_ep"), pl.col("_iso"), pl.col("_vl")
    year = stamp_year(written_s, tz)
    month_day, clock = vl.struct.field("1"), vl.struct.field("2")

    # the file's year; then, only if some stamp needs it (rare: a log read after New Year, or of
    # 29 February read in a later year), the latest year before it that holds the date
    df = df.with_columns(_vl_dt=_naive(pl.lit(f"{year}-") + month_day, clock))
    df = df.with_columns(_vl_t=wallclock.local_s(pl.col("_vl_dt"), tz))
    t = pl.col("_vl_t")
    redo = (t > written_s + YEAR_SLACK_S) | (t.is_null() & (month_day == "02-29"))
    if df.select(redo.fill_null(False).any()).item():
        leap = next(y for y in range(year, year - 8, -1) if calendar.isleap(y))
        feb29_year = leap if leap < year else leap - 4
        back = pl.when(month_day == "02-29").then(pl.lit(feb29_year)).otherwise(pl.lit(year - 1)).cast(pl.String)
        earlier = _naive(back + pl.lit("-") + month_day, clock)
        df = df.with_columns(
            _vl_dt=pl.when(redo).then(earlier).otherwise(pl.col("_vl_dt")),
            _vl_t=pl.when(redo).then(wallclock.local_s(earlier, tz)).otherwise(t),
        )

    iso_dt, signed = _naive(iso.struct.field("1"), iso.struct.field("2")), iso.struct.field("5")
    # Z or the offset after the time; a sign and digits there that make no offset leave the
    # stamp without any reading
    df = wallclock.with_mark(df, iso.struct.field("4"), signed)
    mark, malformed = pl.col("_mark"), iso_dt.is_not_null() & pl.col("_malformed")
    zoned = iso_dt.is_not_null() & mark.is_not_null()
    # an instant as written: the stamp read as UTC, less its offset
    own_t = pl.when(zoned).then(wallclock.epoch_s(iso_dt) + _frac(iso.struct.field("3")) - wallclock.offset_s(mark))
    # else wall time in tz: the ISO stamp, or vLLM's year-less one
    wall_iso = iso_dt.is_not_null() & mark.is_null() & ~pl.col("_malformed")
    wall_frac = pl.when(wall_iso).then(_frac(iso.struct.field("3"))).otherwise(_frac(vl.struct.field("3")))
    wall_t = pl.when(wall_iso).then(wallclock.local_s(iso_dt, tz)).when(malformed).then(None).otherwise(t) + wall_frac
    wall_late = (
        pl.when(wall_iso)
        .then(wallclock.local_s(iso_dt, tz, "latest"))
        .otherwise(wallclock.local_s(pl.col("_vl_dt"), tz, "latest"))
        + wall_frac
    )
    epoch_t = epoch.cast(pl.Float64, strict=False)

    def res(digits: pl.Expr) -> pl.Expr:
        return pl.when(digits.is_null()).then(1.0).otherwise(pl.lit(10.0).pow(-digits.str.len_chars().cast(pl.Float64)))

    # each reading once, into a column: both the time and its kind (stamp_zone) need it
    df = df.with_columns(_ep_t=epoch_t, _own_t=own_t, _wall_t=wall_t)
    # why a stamp has no reading, written only where one lacks it (rare: no text built otherwise)
    unread = malformed & pl.col("_ep_t").is_null()
    if df.select(pl.col("_malformed").any()).item() and df.select(unread.any()).item():
        df = df.with_columns(stamp_problem=pl.when(unread).then(wallclock.malformed_reason(signed)))
    else:
        df = df.with_columns(stamp_problem=pl.lit(None, pl.String))
    epoch_t, own_t, wall_t = pl.col("_ep_t"), pl.col("_own_t"), pl.col("_wall_t")
    df = df.with_columns(
        _early=pl.coalesce(epoch_t, own_t, wall_t),
        stamp_resolution_s=pl.when(epoch.is_not_null())
        .then(res(epoch.str.extract(r"\.(\d+)$", 1)))
        .when(iso.struct.field("1").is_not_null())
        .then(res(iso.struct.field("3")))
        .when(vl.struct.field("1").is_not_null())
        .then(res(vl.struct.field("3"))),
        stamp_zone=pl.when(epoch_t.is_not_null())
        .then(pl.lit(None, pl.String))
        .when(own_t.is_not_null())
        .then(wallclock.offset_text(mark))
        .when(wall_t.is_not_null())
        .then(pl.lit(wallclock.LOCAL)),
    )
    # only a wall time has a second reading
    late = pl.when(pl.col("stamp_zone") == wallclock.LOCAL).then(wall_late).otherwise(pl.col("_early"))
    return df.with_columns(_late_in=late).drop(
        "_ep", "_iso", "_vl", "_vl_dt", "_vl_t", "_mark", "_malformed", "_ep_t", "_own_t", "_wall_t"
    )


# ANSI escape sequences (CSI: SGR colours and the like). vLLM's ColoredFormatter (stdout a
# terminal, e.g. ``docker run -t``) wraps the level, the time and ``[file:line]`` in them, as
# SGLang's coloured formatter does: ``\x1b[32mINFO\x1b[0m \x1b[90m11-30 04:47:27\x1b[0m ...``.
ANSI_CSI = r"\x1b\[[0-?]*[ -/]*[@-~]"


def log_lines(table: pa.Table) -> pl.DataFrame:
    """A batch of ``(line_no, raw)`` log lines with ``text``: the line without ANSI escape codes.

    Log converters read their fields from ``text`` and keep ``raw`` (the line as written) for
    rejects. A log without any escape byte (the usual case: one scan for the byte) gets
    ``text`` as a copy-free alias of ``raw``.
    """
    lines = pl.from_arrow(table)
    raw = pl.col("raw")
    if lines.select(raw.str.contains("\x1b", literal=True).any()).item():
        return lines.with_columns(text=raw.str.replace_all(ANSI_CSI, ""))
    return lines.with_columns(text=raw)


def strip_ansi(head: str) -> str:
    """``head`` (a file's first bytes, for format detection) without ANSI escape codes."""
    return re.sub(ANSI_CSI, "", head) if "\x1b" in head else head


def written_s(path: Path) -> float:
    """When the file was last written (Unix seconds): year-less log stamps lie before it."""
    return path.stat().st_mtime


def stamp_year(t_s: float, tz: str = "UTC") -> int:
    """The year of Unix time ``t_s`` on the wall clock of zone ``tz``."""
    import zoneinfo

    return dt.datetime.fromtimestamp(t_s, zoneinfo.ZoneInfo(tz)).year


def reconstruct_ends(stamp_s: pl.Expr, dur_ms: pl.Expr, resolution_s: float = 1.0) -> pl.Expr:
    """Step end times from whole-second stamps and per-step durations (rows in step order).

    With cumulative busy time ``c_i`` the true end is ``c_i + o_i``, where the
    offset ``o_i`` (idle time so far) never decreases and must keep the end inside
    its logged second: ``stamp_i - c_i <= o_i < stamp_i + 1 - c_i``.  Monotonicity
    tightens both bounds: ``L_i`` = running max of the lower bounds, ``U_i`` =
    running min (from the end) of the upper ones.  We take the middle of
    ``[L_i, U_i]``, which is non-decreasing too; the error is at most half the
    interval and shrinks wherever a busy stretch crosses a second boundary.
    """
    cum = dur_ms.fill_null(0.0).cum_sum() / 1000.0
    lower = (stamp_s - cum).cum_max()
    upper = (stamp_s + resolution_s - cum).cum_min(reverse=True)
    return cum + (lower + pl.max_horizontal(lower, upper)) / 2.0


def int_field(text: pl.Expr, pattern: str) -> pl.Expr:
    return text.str.extract(pattern, 1).str.replace_all(",", "").cast(pl.Int64, strict=False)


def float_field(text: pl.Expr, pattern: str) -> pl.Expr:
    return text.str.extract(pattern, 1).cast(pl.Float64, strict=False)


def missing_reason(checks: list[tuple[str, pl.Expr]], prefix: str) -> pl.Expr:
    """``prefix + 'a, b'`` naming the fields whose expression is NULL, or NULL when none."""
    parts = [pl.when(expr.is_null()).then(pl.lit(name)) for name, expr in checks]
    joined = pl.concat_list(parts).list.drop_nulls().list.join(", ")
    return pl.when(joined.str.len_chars() > 0).then(pl.lit(prefix) + joined)


# The documents we read (bench results, GenAI-Perf exports, TRT-LLM /metrics arrays) nest
# a handful of levels; far deeper nesting is damage or hostile, and costs dearly: json.loads
# recurses (RecursionError near 1,000 levels) and Polars takes a minute to infer the schema
# of 970 nested levels.
MAX_JSON_DEPTH = 64


def json_depth(data: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text, brackets inside strings not counted.

    Vectorised: a quote delimits a string unless an odd number of backslashes precede it;
    the parity of delimiters seen so far says whether a byte lies inside a string.
    """
    import numpy as np

    b = np.frombuffer(data, dtype=np.uint8)
    if not b.size:
        return 0
    pos = np.arange(b.size)
    # length of the run of backslashes ending at each byte (0 where the byte is none)
    last_other = np.maximum.accumulate(np.where(b != ord("\\"), pos, -1))
    run = pos - last_other
    quote = b == ord('"')
    before = np.concatenate(([0], run[:-1]))
    delim = quote & (before % 2 == 0)
    inside = (np.cumsum(delim) - delim) % 2 == 1  # a delimiter itself counts as outside
    step = np.where(inside, 0, (b == ord("[")).astype(np.int8) + (b == ord("{")) - (b == ord("]")) - (b == ord("}")))
    return int(np.cumsum(step, dtype=np.int64).max())


def read_document_text(path: Path) -> str:
    """The whole decompressed file as text, refused when it nests JSON implausibly deep."""
    import zlib

    from .. import reader

    try:
        with reader.open_binary(path) as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise InputError(
            f"{path}: compressed data is corrupt or truncated ({exc}); the file was not ingested. Re-copy it"
        ) from exc
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise InputError(
            f"{path}: JSON nested {depth} levels deep (at most {MAX_JSON_DEPTH} expected); "
            "the file is damaged or not this format"
        )
    return data.decode("utf-8-sig", errors="replace")  # -sig: without a byte-order mark


def read_json_document(path: Path) -> Any:
    """A whole JSON document (bench results); Python's json accepts Infinity/NaN too.

    A document that cannot be read (broken compression, invalid JSON, nesting deeper
    than :data:`MAX_JSON_DEPTH`) is one clear :class:`InputError`: nothing of it can
    be told apart as a record to reject.
    """
    text = read_document_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}:{exc.lineno}: not a JSON document ({exc.msg} at column {exc.colno}); "
            "is the file complete, and is --format right?"
        ) from exc
    except RecursionError as exc:  # unbalanced brackets can hide depth from json_depth's count
        raise InputError(f"{path}: JSON nested too deeply to read; the file is damaged or not this format") from exc
    except ValueError as exc:  # an integer of more than 4300 digits (Python's conversion limit)
        raise InputError(f"{path}: not a JSON document this tool can read ({exc}); the file is damaged") from exc


# Lines of a JSON Lines file as objects: ``ok`` says whether a line is one and ``js``
# is the line or NULL.  DuckDB's CASE does not shield JSON functions from invalid
# text, a NULL argument does, so extract from ``js`` only.
JSON_OBJECTS = """
select line_no, raw, ok, case when ok then raw end as js from (
  select line_no, raw, coalesce(case when json_valid(raw) then json_type(raw) = 'OBJECT' end, false) as ok
  from lines
)"""


# ---------------------------------------------------------------------------
# Value checks.  A field that is present but unreadable (a string, a boolean, a number
# out of range) must reject its record with a reason naming the field and the value,
# never turn into a NULL that reads as "absent" (a failed request, a missing count).

SHOWN_CHARS = 40  # a value in a reason is cut to this many characters
MAX_ABS_TIME_NS = MAX_ABS_TIME_S * 1e9  # the canonical format's bound (the year 5138) in nanoseconds


def json_value_problem(js: str, path: str, name: str, kind: str = "number") -> str:
    """SQL: why the JSON value at ``path`` of ``js`` is no ``kind``, or NULL when it is fine.

    ``kind``: ``number`` (finite), ``count`` (an integer up to 2^53; a negative one is left
    to the record's own checks, which name the canonical field), ``int`` (the same),
    ``ns`` (a Unix time in nanoseconds: a number up to 1e20 in magnitude) or ``numbers`` (a
    list of numbers).  Absent and JSON null are fine (NULL): whether a field may be
    missing is the converter's rule.  ``path`` and ``name`` are our own constants.

    A number written as a JSON string (``"0.007"``) is rejected, as the canonical format
    does: no engine we read writes these fields so, and one that arrives so was edited or
    produced by another tool whose other numbers may be as unreliable.  Fields a real
    producer writes as strings (OTLP's int64 values, Prometheus sample values) are not
    checked with this.
    """
    got = f"left(json_extract({js}, '{path}')::varchar, {SHOWN_CHARS})"
    if kind == "numbers":
        t = f"json_type({js}, '{path}')"
        odd = f"list_filter(json_type({js}, '{path}[*]'), lambda t: t not in ('BIGINT', 'UBIGINT', 'DOUBLE'))"
        return (
            f"case when {t} is null or {t} = 'NULL' then null "
            f"when {t} <> 'ARRAY' then '{name}: expected a list of numbers, got ' || {got} "
            f"when len({odd}) > 0 then '{name}: expected a list of numbers, got ' || {got} || "
            f"' (an entry is ' || case {odd}[1] when 'VARCHAR' then 'a string' when 'NULL' then 'null' "
            f"else lower({odd}[1]) end || '; write every entry as a number, without quotes)' end"
        )
    x = f"({js}->>'{path}')"
    d = f"try_cast({x} as double)"
    shown = f"left({x}, {SHOWN_CHARS})"
    expect = "a number" if kind == "number" else "an integer"
    whens = [
        f"when json_type({js}, '{path}') = 'VARCHAR' and {d} is not null then '{name}: expected {expect}, got ' || {got} || "
        "' (a string: write the number without quotes)'",
        f"when {d} is null then '{name}: expected {expect}, got ' || {got}",
        f"when not isfinite({d}) then '{name}: ' || {shown} || ' is not a finite number'",
    ]
    if kind == "ns":
        whens.append(
            f"when abs({d}) > {MAX_ABS_TIME_NS:.0f} then '{name}: ' || {shown} || "
            f"' is no time in nanoseconds (magnitude over 1e20)'"
        )
    if kind in ("count", "int"):
        whens += [
            f"when {d} <> round({d}) then '{name}: expected an integer, got ' || {shown}",
            f"when abs({d}) > {MAX_COUNT} then '{name}: ' || {shown} || ' is implausibly large (over 2^53)'",
        ]
    return f"case when {x} is null then null {' '.join(whens)} end"


def json_problems(js: str, fields: list[tuple[str, str, str]]) -> str:
    """SQL: the problems of ``(path, name, kind)`` fields (see :func:`json_value_problem`)
    joined with ``; ``, NULL when there is none."""
    parts = ", ".join(json_value_problem(js, p, n, k) for p, n, k in fields)
    return f"nullif(concat_ws('; ', {parts}), '')"


def text_value_problem(text: pl.Expr, name: str, kind: str = "number") -> pl.Expr:
    """Why the number written as ``text`` (log text) is no ``kind``, or NULL when it is fine.

    ``kind``: ``number`` (finite, non-negative: durations and fractions in logs) or ``count``
    (a non-negative integer up to 2^53).  NULL text is fine (absent).  Meant for the few
    lines already rejected, to say why: it is not cheap enough to run on every line.
    """
    d = text.str.replace_all(",", "", literal=True).cast(pl.Float64, strict=False)
    shown = text.str.slice(0, SHOWN_CHARS)
    expect = "a number" if kind == "number" else "an integer"
    out = (
        pl.when(text.is_null())
        .then(None)
        .when(d.is_null())
        .then(pl.format("{}: expected {}, got {}", pl.lit(name), pl.lit(expect), shown))
        .when(~d.is_finite())
        .then(pl.format("{}: {} is not a finite number", pl.lit(name), shown))
        .when(d < 0)
        .then(pl.format("{}: {} is negative", pl.lit(name), shown))
    )
    if kind == "count":
        out = (
            out.when(d != d.round())
            .then(pl.format("{}: expected an integer, got {}", pl.lit(name), shown))
            .when(d > MAX_COUNT)
            .then(pl.format("{}: {} is implausibly large (over 2^53)", pl.lit(name), shown))
        )
    return out.otherwise(None)
