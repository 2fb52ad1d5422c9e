"""The running sums that ``queries/fit/request_attribution.sql`` reads.

The queries of ``queries/fit/`` are run by the store's query runner
(:func:`pipeline.store.select`, :func:`pipeline.store.materialise`), by name
(``fit/tail_parts``), their ``$params`` bound; this module adds the one input they
need that is computed outside SQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import polars as pl

from .. import store


STEP_PARTS = ("span", "base", "pf", "ux", "ua", "hol", "cap")  # columns <part>_ms of step_parts.sql
GAP_PARTS = ("gux", "gua", "bnd")  # only the next step's is read: the host gap at a span's start (in ux or
# ua), and the boundary part of cap (step_parts.sql)


@contextmanager
def step_sums(con: duckdb.DuckDBPyConnection, run_id: str) -> Iterator[None]:
    """Register ``fit_step_sums`` (see ``queries/fit/request_attribution.sql``) while in the block.

    Running sums in Polars (O(n)); DuckDB 2.0's windowed running sums cost 2 s on a
    million steps for the five parts.
    """
    steps = store.select(con, "fit/step_parts", {"run_id": run_id}).sort("t_end", "iter")
    ms = {p: pl.col(f"{p}_ms").cast(pl.Float64) for p in STEP_PARTS}
    start = pl.col("t_end").cast(pl.Float64) - ms["span"] / 1000.0  # a span runs from the step before's end
    cum = steps.select(
        pl.col("t_end").cast(pl.Float64),
        pl.int_range(1, pl.len() + 1, dtype=pl.Int64).alias("k"),
        *[c.cum_sum().alias(f"c_{p}") for p, c in ms.items()],
        *[c.shift(-1).alias(f"n_{p}") for p, c in ms.items()],
        *[pl.col(f"{p}_ms").cast(pl.Float64).shift(-1).alias(f"n_{p}") for p in GAP_PARTS],
        start.shift(-1).alias("n_start"),
    )
    first = steps.select(*ms.values(), *[f"{p}_ms" for p in GAP_PARTS], start.alias("start")).head(1)
    row0 = pl.DataFrame(
        {
            "t_end": [float("-inf")],
            "k": [0],
            **{f"c_{p}": [0.0] for p in STEP_PARTS},
            **{f"n_{p}": [first[f"{p}_ms"][0] if first.height else None] for p in (*STEP_PARTS, *GAP_PARTS)},
            "n_start": [first["start"][0] if first.height else None],
        },
        schema=cum.schema,
    )
    table = pl.concat([row0, cum]).to_arrow()
    del steps, cum  # only the registered table is needed while the queries run (1M steps: 150 MB)
    con.register("fit_step_sums", table)
    try:
        yield
    finally:
        con.unregister("fit_step_sums")
