"""Log stamps read once per distinct prefix (a busy log's lines of one second share it) give
what reading every line gives, across a DST fall-back where the fold is chosen line by line."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from pipeline.ingest.engines import _common as c


def _prefixes() -> list[str]:
    """vLLM-style year-less stamps, 6 lines a second, through Berlin's 2026 fall-back (the 02:xx
    hour twice), with an epoch, an ISO-with-offset and a malformed stamp among them."""
    out = []
    for t in range(0, 3 * 3600, 37):  # 00:59 ... 03:59 wall time, with 02:xx repeated below
        wall = dt.datetime(2026, 10, 25, 0, 59) + dt.timedelta(seconds=t)
        out += [f"INFO {wall:%m-%d %H:%M:%S} [loggers.py:199] Engine 000: "] * 6
        if wall.hour == 2 and wall.minute == 59 and wall.second >= 23:  # the clock goes back: again
            for u in range(0, 3600, 37):
                again = dt.datetime(2026, 10, 25, 2, 0) + dt.timedelta(seconds=u)
                out += [f"INFO {again:%m-%d %H:%M:%S} [loggers.py:199] Engine 000: "] * 6
    out += ["1792888888.25 INFO Engine 000: ", "2026-10-25T03:00:01.5+01:00 INFO ", "2026-10-25 03:00:02+1:00 INFO "]
    return out


@pytest.mark.parametrize("tz", ["Europe/Berlin", "UTC"])
def test_distinct_prefixes_read_as_every_line(monkeypatch, tz):
    df = pl.DataFrame({"_prefix": _prefixes()})
    written = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc).timestamp()
    monkeypatch.setattr(c, "DISTINCT_SAMPLE", 10**9)  # every line read
    each = c.with_log_times(df, "_prefix", written, tz)
    monkeypatch.setattr(c, "DISTINCT_SAMPLE", 64)
    assert df.height > 64 and df.head(64)["_prefix"].n_unique() * 4 < 64  # the distinct path is taken
    once = c.with_log_times(df, "_prefix", written, tz)
    assert once.columns == each.columns and once.equals(each)
    if tz == "Europe/Berlin":  # the repeated hour was read as its second pass: the stamps never go back
        s = each.filter(pl.col("stamp_zone") == "local")["stamp_s"]
        assert (s.diff().drop_nulls() >= 0).all() and s.max() - s.min() > 3 * 3600
