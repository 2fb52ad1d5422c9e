"""Log stamps as written on a wall clock: their own UTC offsets, and zone-less ones read in a zone.

A stamp that names its zone (Docker's ``2026-05-12T08:01:39.331095044Z``, Python's
``isoformat()`` ``+01:00``, ``%z``'s ``+0100``, ISO 8601's hours-only ``+01`` as PostgreSQL and
DuckDB print a timestamptz, each also after a space: ``%Y-%m-%d %H:%M:%S %z``, Go's
``time.String()``) is an exact instant: neither ``--tz`` nor this machine's zone applies to it.
A stamp without one is wall time in the log's zone, and the hour a DST fall-back repeats has
two readings (:func:`pick_fold`).  A sign and digits after the time that make no offset
(``+1:00``, ``+25:00``, ``+01:0``) are no wall time either: the stamp has no reading
(:func:`with_mark`), and its line is rejected saying why, never shifted by a guess.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo

import polars as pl

# What stands for a zone right after an ISO time, as two groups: Z, or a sign and digits (maybe
# after a space), the digits in groups split by colons; :func:`with_mark` tells an offset from a
# malformed one.
ZONE_MARK = r"(?:([Zz])| ?([+-]\d+(?::\d+)*))?"
# a UTC offset: +hh, +hhmm or +hh:mm, hours 00-23, minutes 00-59
_OFFSET = r"^[+-](?:[01]\d|2[0-3])(?::?[0-5]\d)?$"

# ``stamp_zone`` of a line whose stamp is wall time read in the log's zone; a stamp with its
# own mark has that offset there (``+01:00``), and epoch seconds (no wall clock) NULL.
LOCAL = "local"


def with_mark(df: pl.DataFrame, z: pl.Expr, signed: pl.Expr) -> pl.DataFrame:
    """``df`` with ``_mark`` and ``_malformed`` from the two groups of :data:`ZONE_MARK`.

    ``_mark``: ``Z`` or the UTC offset (NULL when there is none or it is malformed);
    ``_malformed``: a sign and digits after the time that make no offset (``+1:00``,
    ``+25:00``, ``+01:0``, ``+01000``), which the stamp must not be read without.
    The offset's pattern runs once, into a column (both need it).
    """
    df = df.with_columns(_offset_ok=signed.str.contains(_OFFSET))
    ok = pl.col("_offset_ok")
    return df.with_columns(_mark=pl.when(ok).then(signed).otherwise(z), _malformed=(~ok).fill_null(False)).drop(
        "_offset_ok"
    )


def malformed_reason(signed: pl.Expr) -> pl.Expr:
    """Why a stamp whose offset (the second group of :data:`ZONE_MARK`) is malformed has no time."""
    return pl.format(
        "'{}' after the time is no UTC offset (+hh, +hhmm or +hh:mm, or - for west; hours 00-23, "
        "minutes 00-59), so the time is unknown",
        signed,
    )


def _minutes(mark: pl.Expr) -> pl.Expr:
    """The minutes of an offset as two digits (``00`` for an hours-only ``+01``)."""
    return pl.when(mark.str.len_chars() > 3).then(mark.str.slice(-2, 2)).otherwise(pl.lit("00"))


def offset_s(mark: pl.Expr) -> pl.Expr:
    """Seconds east of UTC of a :func:`with_mark` mark (NULL without one)."""
    sign = pl.when(mark.str.starts_with("-")).then(-1).otherwise(1)
    hours = mark.str.slice(1, 2).cast(pl.Int64, strict=False)
    minutes = _minutes(mark).cast(pl.Int64, strict=False)
    return pl.when(mark.str.to_uppercase() == "Z").then(0).otherwise(sign * (hours * 3600 + minutes * 60))


def offset_text(mark: pl.Expr) -> pl.Expr:
    """A :func:`with_mark` mark as ``+hh:mm`` (``Z`` is ``+00:00``), so one offset reads one way in the meta."""
    return (
        pl.when(mark.str.to_uppercase() == "Z")
        .then(pl.lit("+00:00"))
        .otherwise(mark.str.slice(0, 3) + pl.lit(":") + _minutes(mark))
    )


def local_s(naive: pl.Expr, tz: str, ambiguous: str = "earliest") -> pl.Expr:
    """Unix seconds of naive wall time in zone ``tz``: ``ambiguous`` picks the reading of an
    hour a fall-back repeats (``earliest``/``latest``); a time a DST change skips is NULL, never an error."""
    aware = naive.dt.replace_time_zone(tz, ambiguous=ambiguous, non_existent="null")
    return epoch_s(aware)


def epoch_s(stamp: pl.Expr) -> pl.Expr:
    """Unix seconds of a datetime, the float nearest its microseconds / 1e6 on any frame.

    Polars divides a column of more than one row by a scalar as a product with its reciprocal
    (one unit in the last place off, for about a third of stamps), a single row exactly: one
    stamp came out two ways, so a record repeated in another reader batch no longer tied with
    itself. Whole seconds plus the microseconds divided: the product's error (1e-22 s) cannot
    move a sum that is never within 6e-14 s of a rounding midpoint.
    """
    us = stamp.dt.epoch("us")
    mag = us.abs()  # before 1970 too: the same split of the magnitude, then its sign
    secs = (mag // 1_000_000).cast(pl.Float64) + (mag % 1_000_000).cast(pl.Float64) / 1e6
    return pl.when(us < 0).then(-secs).otherwise(secs)


# Lines of several engines or threads can be written a little out of time order; only a line
# this far behind the lines before it is taken for one after a fall-back (the clock goes back
# an hour, half an hour on Lord Howe Island).
FOLD_SLACK_S = 60.0
# Each pass moves the lines behind those the pass before moved; a log through one fall-back needs two.
MAX_FOLD_PASSES = 8
# Zones change their offset a few times a year at most: a span shorter than this whose two ends
# (a day out) have one offset holds no change, and no stamp in it has a second reading.
_NO_TWO_CHANGES_S = 20 * 86400.0


def _may_fold(tz: str, lo: float, hi: float) -> bool:
    """Whether zone ``tz`` may change its UTC offset between Unix times ``lo`` and ``hi``.

    The later reading of a repeated hour lies up to an hour after the earlier one, so ``hi``
    is looked at a day later. It spares the logs that run through no DST change (most of them)
    the second reading of every stamp, the slower of the two (75 ms on 300k stamps, 30 ms for the first).
    """
    if hi - lo > _NO_TWO_CHANGES_S:
        return True
    zone = zoneinfo.ZoneInfo(tz)
    try:
        ends = [dt.datetime.fromtimestamp(t, zone).utcoffset() for t in (lo - 86400.0, hi + 86400.0)]
    except (OverflowError, OSError, ValueError):  # a stamp far outside the years a clock can say
        return True
    return ends[0] != ends[1]


def pick_fold(
    df: pl.DataFrame,
    late: pl.Expr,
    tz: str,
    after_s: float | None,
    skip: pl.Series | None = None,
) -> pl.DataFrame:
    """``df`` with ``stamp_s``: ``_early``, or ``late`` where a DST fall-back repeats the hour and
    the clock was set back; rows in line order, ``after_s`` the latest stamp of the file's
    lines before them (None for none).

    A log runs forward: in a repeated hour the earlier reading (the first pass) holds unless
    it puts the line behind the lines before it; then the clock was set back and the later
    reading (``fold=1``) is the time.  A line still behind on that reading is out of order
    and rejected as before (by the converter's own checks), its reason giving the smaller gap.
    Which lines go back depends on the readings chosen before them, so the choice is made in
    passes over the whole column until it holds (a loop over passes, not over lines; the
    readings only move later, so it settles).

    A line whose later reading would put it ahead of the next line, where the next line is in
    order with the lines before and it and the line after it are within FOLD_SLACK_S of them (a
    dense log), is one line stamped behind: it keeps its reading (and is rejected as out of
    order), where its later one put the lines after it an hour late. ``skip``: rows (outliers)
    that are neither among the lines before nor the next lines of the others.
    """
    early = pl.col("_early")
    lo, hi = df.select(early.min().alias("lo"), early.max().alias("hi")).row(0) if df.height else (None, None)
    if hi is None or not _may_fold(tz, lo, hi):
        return df.with_columns(stamp_s=early)
    df = df.with_columns(_late=late)
    later = pl.col("_late")
    floor = after_s if after_s is not None else float("-inf")
    df = df.with_columns(stamp_s=early)
    counts = pl.lit(True) if skip is None else ~pl.lit(skip)
    counted = pl.when(counts).then(pl.col("stamp_s"))
    # the earlier reading of the next line that counts (NULL for the last): a clock set back
    # leaves the lines after behind too; after one line stamped behind (a corrupted stamp) the next
    # is in order again, and the later reading would put the line ahead of it
    counted_early = pl.when(counts).then(early)
    following = counted_early.shift(-1).backward_fill()
    # and of the line after that one: lines seconds apart (a dense log) around the line behind
    then = pl.when(counted_early.is_not_null()).then(following).shift(-1).backward_fill()
    for _ in range(MAX_FOLD_PASSES):
        # the latest time of the lines before each (a line without a stamp passes it on)
        before = counted.cum_max().forward_fill().shift(1).fill_null(floor)
        limit = pl.max_horizontal(before, pl.lit(floor)) - FOLD_SLACK_S
        # (only among lines close together: a log written sparsely through the change, minutes
        # between lines, can have its next line's earlier reading in order too)
        close = (following <= limit + 2 * FOLD_SLACK_S) & ((then - following).abs() <= FOLD_SLACK_S)
        alone = (following >= limit) & close & (later > following + FOLD_SLACK_S)
        back = (later != early) & (early < limit) & ~alone.fill_null(False)
        chosen = df.select(pl.when(back).then(later).otherwise(early)).to_series()
        if chosen.equals(df.get_column("stamp_s")):
            break
        df = df.with_columns(stamp_s=chosen)
    return df.drop("_late")


def latest(df: pl.DataFrame, after_s: float | None) -> float | None:
    """The latest stamp of ``df`` and of the lines before it (``after_s``), for the next batch."""
    top = df.get_column("stamp_s").max() if df.height else None
    if top is None:
        return after_s
    return float(top) if after_s is None else max(after_s, float(top))


def zone_meta(zones: pl.Series, zone: str, given: bool) -> dict:
    """Run metadata on how the steps' stamps (their ``stamp_zone``) were put on the clock.

    ``timestamps_time_zone``: the zone that wall-clock stamps without a zone were read in,
    only when there were such stamps (``--tz`` says nothing of stamps that name their own
    zone, or of epoch seconds).  ``timestamps_utc_offsets``: the offsets that stamps carried
    themselves, each read as written.
    """
    seen = zones.drop_nulls().unique().sort().to_list()
    meta: dict = {}
    if LOCAL in seen:
        meta["timestamps_time_zone"] = zone + ("" if given else " (this machine's zone; pass --tz to change)")
    own = [z for z in seen if z != LOCAL]
    if own:
        meta["timestamps_utc_offsets"] = own
    return meta
