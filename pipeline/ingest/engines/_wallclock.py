"""Log stamps as written on a wall clock: their own UTC offsets, and zone-less ones read in a zone.

A stamp that names its zone (Docker's ``2026-05-12T08:01:39.331095044Z``, Python's
``isoformat()`` ``+01:00``, ``%z``'s ``+0100``) is an exact instant: neither ``--tz`` nor this
machine's zone applies to it.  A stamp without one is wall time in the log's zone.
"""

from __future__ import annotations

import polars as pl

# The zone mark right after an ISO time: Z, or a UTC offset +hh:mm / +hhmm (hours 00-23).
ZONE_MARK = r"([Zz]|[+-](?:[01]\d|2[0-3]):?[0-5]\d)?"

# ``stamp_zone`` of a line whose stamp is wall time read in the log's zone; a stamp with its
# own mark has that offset there (``+01:00``), and epoch seconds (no wall clock) NULL.
LOCAL = "local"


def offset_s(mark: pl.Expr) -> pl.Expr:
    """Seconds east of UTC of a :data:`ZONE_MARK` (NULL without one)."""
    sign = pl.when(mark.str.starts_with("-")).then(-1).otherwise(1)
    hours = mark.str.slice(1, 2).cast(pl.Int64, strict=False)
    minutes = mark.str.slice(-2, 2).cast(pl.Int64, strict=False)
    return pl.when(mark.str.to_uppercase() == "Z").then(0).otherwise(sign * (hours * 3600 + minutes * 60))


def offset_text(mark: pl.Expr) -> pl.Expr:
    """A :data:`ZONE_MARK` as ``+hh:mm`` (``Z`` is ``+00:00``), so one offset reads one way in the meta."""
    return (
        pl.when(mark.str.to_uppercase() == "Z")
        .then(pl.lit("+00:00"))
        .otherwise(mark.str.slice(0, 3) + pl.lit(":") + mark.str.slice(-2, 2))
    )


def local_s(naive: pl.Expr, tz: str) -> pl.Expr:
    """Unix seconds of naive wall time in zone ``tz``."""
    # a wall time that a DST change skips or repeats: the earlier reading, never an error
    aware = naive.dt.replace_time_zone(tz, ambiguous="earliest", non_existent="null")
    return aware.dt.epoch("us").cast(pl.Float64) / 1e6


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
