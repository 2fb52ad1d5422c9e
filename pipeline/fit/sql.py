"""Running the parameterised queries of ``queries/fit/`` (they need fitted coefficients).

The derived-table runner of :mod:`pipeline.store` only materialises ``queries/*.sql``;
the files here have the same header convention but are run by this package, with
their ``$params`` bound, one run at a time (rows of other runs are kept).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import duckdb

from ..errors import StoreError
from ..store import QUERIES_DIR

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
    if table_exists(con, name):
        cols = _columns(con, f'select * from "{name}" where false', {})
        new = _columns(con, f"select * from ({sql}) where false", p)
        if cols != new:
            con.execute(f'drop table "{name}"')
    con.execute(f'create table if not exists "{name}" as select * from ({sql}) where false', p)
    con.execute(f'delete from "{name}" where run_id = ?', [params["run_id"]])
    con.execute(f'insert into "{name}" {sql}', p)


def _columns(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> list[str]:
    cur = con.execute(sql, params or None)
    names = [d[0] for d in cur.description]
    cur.fetchall()  # drain: an unfinished result blocks the next statement
    return names


def fit_query_files() -> list[Path]:
    """The SQL files of this stage (for header tests)."""
    return sorted(FIT_QUERIES.glob("*.sql"))
