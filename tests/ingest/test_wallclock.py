"""Unix seconds of log stamps: the same stamp gives the same float on any frame."""

from __future__ import annotations

import random

import polars as pl

from pipeline.ingest.engines._wallclock import epoch_s


def test_epoch_seconds_are_the_nearest_float_on_one_row_and_on_many():
    """Polars divides a column of many rows by a scalar through its reciprocal (an ulp off for about
    a third of stamps) and a single row exactly, so a TRT-LLM record repeated in a one-record reader
    batch did not tie with itself in a longer one. Checked against Python's own division."""
    rng = random.Random(7)
    us = [rng.randrange(-(10**14), 4 * 10**15) for _ in range(50_000)] + [1727912742692475, 0, -1]
    frame = pl.DataFrame({"us": us}).with_columns(d=pl.from_epoch("us", time_unit="us"))
    many = frame.select(epoch_s(pl.col("d"))).to_series().to_list()
    assert many == [u / 1e6 for u in us]
    naive = frame.select(pl.col("us").cast(pl.Float64) / 1e6).to_series().to_list()
    assert sum(a != u / 1e6 for a, u in zip(naive, us)) > 1000  # the product this replaces was off
    ones = [frame.slice(k, 1).select(epoch_s(pl.col("d"))).item() for k in (0, 17, len(us) - 3)]
    assert ones == [many[0], many[17], many[-3]]
