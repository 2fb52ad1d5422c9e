"""Running the parameterised queries of ``queries/fit/`` (they need fitted coefficients).

The derived-table runner of :mod:`pipeline.store` only materialises ``queries/*.sql``;
the files here have the same header convention but are run by this package, with
their ``$params`` bound, one run at a time (rows of other runs are kept).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from ..errors import StoreError
from ..store import QUERIES_DIR, quote_ident

FIT_QUERIES = QUERIES_DIR / "fit"


def query_text(name: str) -> str:
    """The SQL of ``queries/fit/<name>.sql``."""
    return (FIT_QUERIES / f"{name}.sql").read_text()


def bind(sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``params`` the SQL uses; raises if one it uses is missing."""
    used = set(re.findall(r"\$([A-Za-z_]\w*)", re.sub(r"--[^\n]*", "", sql)))
    missing = used - params.keys()
    if missing:
        raise StoreError(f"query needs parameters {sorted(missing)} (bug)")
    return {k: params[k] for k in used}


def select(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any]):
    """Run an on-demand query and return a Polars frame."""
    sql = query_text(name)
    return con.sql(sql, params=bind(sql, params)).pl()


def table_exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether a table of that name exists in the main schema."""
    rows = con.execute("select count(*) from duckdb_tables() where table_name = ?", [name]).fetchall()
    return bool(rows[0][0])


def materialise(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any]) -> None:
    """Replace the rows of ``params['run_id']`` in table ``name`` with the query's result.

    The table is created on first use; if an older version of the query left a table
    with other columns, it is rebuilt (its rows are derived, so nothing is lost that
    ``tracelat fit`` cannot recompute).
    """
    sql = query_text(name)
    p = bind(sql, params)
    t = quote_ident(name)
    if table_exists(con, name):
        cols = _columns(con, f"select * from {t} where false", {})
        new = _columns(con, f"select * from ({sql}) where false", p)
        if cols != new:
            con.execute(f"drop table {t}")
    con.execute(f"create table if not exists {t} as select * from ({sql}) where false", p)
    con.execute(f"delete from {t} where run_id = ?", [params["run_id"]])
    con.execute(f"insert into {t} {sql}", p)


STEP_PARTS = ("span", "base", "pf", "ux", "ua")  # columns <part>_ms of step_parts.sql


@contextmanager
def step_sums(con: duckdb.DuckDBPyConnection, run_id: str) -> Iterator[None]:
    """Register ``fit_step_sums`` (see ``queries/fit/request_attribution.sql``) while in the block.

    Running sums in Polars (O(n)); DuckDB 2.0's windowed running sums cost 2 s on a
    million steps for the five parts.
    """
    steps = select(con, "step_parts", {"run_id": run_id}).sort("t_end", "iter")
    ms = {p: pl.col(f"{p}_ms").cast(pl.Float64) for p in STEP_PARTS}
    cum = steps.select(
        pl.col("t_end").cast(pl.Float64),
        pl.int_range(1, pl.len() + 1, dtype=pl.Int64).alias("k"),
        *[c.cum_sum().alias(f"c_{p}") for p, c in ms.items()],
        *[c.shift(-1).alias(f"n_{p}") for p, c in ms.items()],
    )
    first = steps.select(ms.values()).head(1)
    row0 = pl.DataFrame(
        {"t_end": [float("-inf")], "k": [0], **{f"c_{p}": [0.0] for p in STEP_PARTS},
         **{f"n_{p}": [first[f"{p}_ms"][0] if first.height else None] for p in STEP_PARTS}},
        schema=cum.schema,
    )
    table = pl.concat([row0, cum]).to_arrow()
    del steps, cum  # only the registered table is needed while the queries run (1M steps: 150 MB)
    con.register("fit_step_sums", table)
    try:
        yield
    finally:
        con.unregister("fit_step_sums")


def _columns(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> list[str]:
    cur = con.execute(sql, params or None)
    names = [d[0] for d in cur.description]
    cur.fetchall()  # drain: an unfinished result blocks the next statement
    return names


def fit_query_files() -> list[Path]:
    """The SQL files of this stage (for header tests)."""
    return sorted(FIT_QUERIES.glob("*.sql"))
