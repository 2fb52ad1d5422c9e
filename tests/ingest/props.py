"""Checks shared by the property-based ingest tests (test_props_*.py)."""

from __future__ import annotations


def _float_columns(con) -> list[tuple[str, str, bool]]:
    """(table, column, is_list) of every floating-point column of the store's main schema,
    tables and views (derived ones too), read from the catalogue: a column added later is
    checked without editing this list."""
    rows = con.execute(
        "select table_name, column_name, data_type from information_schema.columns "
        "where table_schema = 'main' and table_catalog = current_database() "
        "and (data_type in ('DOUBLE', 'FLOAT', 'REAL') or data_type in ('DOUBLE[]', 'FLOAT[]'))"
    ).fetchall()
    return [(t, c, d.endswith("[]")) for t, c, d in rows]


# A Prometheus histogram's last bucket is ``le="+Inf"`` by definition: that bound is stored as
# +inf (and only +inf, checked below), not a number that overflowed.
INFINITE_BY_DEFINITION = {("metric_samples", "le")}


def non_finite(con) -> dict[str, int]:
    """``{table.column: rows holding NaN or an infinity}`` over every float column; empty when all finite."""
    from pipeline.store import quote_ident

    out = {}
    for table, column, is_list in _float_columns(con):
        if (table, column) in INFINITE_BY_DEFINITION:
            n = con.execute(
                f"select count(*) from {quote_ident(table)} where isnan({quote_ident(column)}) "
                f"or {quote_ident(column)} = '-inf'::double"
            ).fetchall()[0][0]
            if n:
                out[f"{table}.{column}"] = n
            continue
        col = quote_ident(column)
        cond = f"list_bool_or(list_transform({col}, lambda x: not isfinite(x)))" if is_list else f"not isfinite({col})"
        n = con.execute(f"select count(*) from {quote_ident(table)} where {cond}").fetchall()[0][0]
        if n:
            out[f"{table}.{column}"] = n
    return out


def assert_store_finite(con) -> None:
    bad = non_finite(con)
    assert not bad, f"non-finite numbers stored: {bad}"


def budgets(few: int, many: int) -> list:
    """Parameters for a property's number of cases: ``few`` by default, ``many`` under ``-m slow``;
    ``TRACELAT_PROP_EXAMPLES=N`` sets both (a long local run: N=2000)."""
    import os

    import pytest

    n = int(os.environ.get("TRACELAT_PROP_EXAMPLES", "0") or 0)
    return [pytest.param(n or few, id="few"), pytest.param(n or many, id="many", marks=pytest.mark.slow)]
