"""Vega-Lite schema checks of the chart specs pages embed, without checking every data row.

Altair's validator (jsonschema) tries each of the schema's data shapes (a list of numbers, of
strings, of booleans, of objects) on every row of every inline dataset: 245k items for one
report's specs, 14 of the 21 s of the test that writes the report, comparison and sweep pages.
The rows themselves are free-form to the schema; what it asks of a dataset is that its rows
are all of one JSON kind. So each dataset keeps its first rows for the schema, and the
one-kind rule is checked here on all of them.
"""

from __future__ import annotations

from typing import Any

from altair.vegalite.v6.schema.core import Root

KEEP_ROWS = 3


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def _thin_rows(rows: Any, where: str) -> Any:
    if not isinstance(rows, list) or len(rows) <= KEEP_ROWS:
        return rows
    kinds = {_kind(r) for r in rows}
    assert len(kinds) == 1, f"{where}: rows of more than one JSON kind: {sorted(kinds)}"
    return rows[:KEEP_ROWS]


def _thin(node: Any, where: str) -> Any:
    """``node`` with each inline dataset cut to its first rows (named datasets and ``data.values``)."""
    if isinstance(node, list):
        return [_thin(v, where) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "datasets" and isinstance(value, dict):
            out[key] = {name: _thin_rows(rows, f"{where} dataset {name}") for name, rows in value.items()}
        elif key == "data" and isinstance(value, dict) and "values" in value:
            out[key] = {**value, "values": _thin_rows(value["values"], f"{where} data.values")}
        else:
            out[key] = _thin(value, where)
    return out


def validate_vega_lite(spec: dict, where: str = "spec") -> None:
    """Raise jsonschema.ValidationError unless ``spec`` is valid Vega-Lite (AssertionError when a
    dataset mixes kinds of rows)."""
    Root.validate(_thin(spec, where))
