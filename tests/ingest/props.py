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
    """``{table.column: rows holding NaN or an infinity}`` over every float column; empty when all finite.

    One statement per table, a count per column (a statement per column took 60 ms a store)."""
    from pipeline.store import quote_ident

    by_table: dict[str, list[tuple[str, str]]] = {}
    for table, column, is_list in _float_columns(con):
        col = quote_ident(column)
        if (table, column) in INFINITE_BY_DEFINITION:
            cond = f"isnan({col}) or {col} = '-inf'::double"
        elif is_list:
            cond = f"list_bool_or(list_transform({col}, lambda x: not isfinite(x)))"
        else:
            cond = f"not isfinite({col})"
        by_table.setdefault(table, []).append((column, cond))
    out = {}
    for table, checks in by_table.items():
        counts = con.execute(
            "select " + ", ".join(f"count_if({cond})" for _, cond in checks) + f" from {quote_ident(table)}"
        ).fetchall()[0]
        out |= {f"{table}.{column}": n for (column, _), n in zip(checks, counts) if n}
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
