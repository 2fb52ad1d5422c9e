"""Typed records (engine converters) are checked exactly as their canonical JSON text would be."""

from __future__ import annotations

import json
import math

import duckdb
import polars as pl
import pytest

from pipeline.ingest.canonical_sql import ALL_FIELDS, stage_sql
from pipeline.ingest.engines import _common as c
from pipeline.ingest.typed_sql import typed_stage_sql

NAN, INF = float("nan"), float("inf")

ITERATIONS = pl.DataFrame(
    {
        "line_no": list(range(1, 11)),
        "iter": [0, 1, 2, 3, 4, 5, 6, None, 8, 9],
        "t_start": [1.0, 2.0, 3.0, 4.0, NAN, 6.0, 7.0, 8.0, 9.0, 1e12],
        "t_end": [1.01, 1.5, 3.02, 4.01, 5.01, INF, 7.5, 8.01, 9.01, 1e12 + 1],
        "dur_ms": [10.0, None, 20.0, 99.0, 10.0, None, 500.0, 10.0, None, None],
        "prefill_tokens": [5, 0, -3, 1, 2, 3, 4, 5, 6, 7],
        "decode_tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        "kv_usage": [0.5, 1.5, 0.1, None, 0.2, 0.3, -0.1, 0.4, 0.5, 0.6],
        "engine_index": [0, 0, 1, 1, None, 0, 0, 0, 0, 0],
        "is_dummy": [False, True, False, None, False, False, False, False, False, False],
    }
)

REQUESTS = pl.DataFrame(
    {
        "line_no": list(range(1, 8)),
        "req_id": ["a", "b", "c", "d", "e", None, "g"],
        "t_arrival": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, NAN],
        "t_first_token": [1.1, 1.9, 3.2, 4.1, 5.1, 6.1, 7.1],
        "t_finish": [1.5, 2.5, 3.1, 4.9, 5.9, 6.9, 7.9],
        "output_tokens": [3, 2, 2, 1, 5, 2, 2],
        "token_times": [[1.1, 1.3, 1.5], [1.9, 2.5], [3.2, 3.1], [4.1, 4.5], [5.1, NAN], [6.1], [7.1, 7.9]],
        "status": ["ok", "ok", "ok", "ok", "weird", "ok", "ok"],
        "error": [None, "x", None, None, None, None, "y"],
    }
)


def _json_path(frame: pl.DataFrame, kind: str, extra: tuple[str, ...]) -> list[tuple]:
    """What the loader made of these records as canonical JSON text (the path engines took before)."""
    known = c.ITERATION_COLS if kind == "iteration" else c.REQUEST_COLS
    cols = [x for x in (*known, *extra) if x in frame.columns]
    lines = frame.select(
        pl.col("line_no").cast(pl.Int64),
        pl.struct(pl.lit(kind).alias("kind"), *cols).struct.json_encode().alias("raw"),
    ).to_arrow()
    return _rows(duckdb.connect().sql(stage_sql("lines"), params=None), lines)


def _typed_path(frame: pl.DataFrame, kind: str, extra: tuple[str, ...]) -> list[tuple]:
    typed = c.encode(frame, kind, extra)
    typed_in = typed.table  # noqa: F841 - read by DuckDB's replacement scan
    return _rows(duckdb.connect().sql(typed_stage_sql("typed_in", typed)), None)


def _rows(rel, lines) -> list[tuple]:
    cols = ["line_no", "kind", *(f"v_{n}" for n in ALL_FIELDS), "extra", "reason"]
    out = []
    for row in rel.select(*cols).order("line_no").fetchall():
        d = dict(zip(cols, row))
        d["extra"] = json.loads(d["extra"]) if d["extra"] is not None else None
        out.append(d)
    return out


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize(
    "frame, kind, extra",
    [(ITERATIONS, "iteration", ("engine_index", "is_dummy")), (REQUESTS, "request", ("error",))],
    ids=["iterations", "requests"],
)
def test_typed_records_stage_as_their_json_text(frame, kind, extra):
    by_json, typed = _json_path(frame, kind, extra), _typed_path(frame, kind, extra)
    assert len(by_json) == len(typed) == frame.height
    # JSON text has no NaN or infinity (Polars writes null), a typed column keeps them: the typed
    # record is rejected naming the field and nothing else about it (docs/formats.md)
    floats = [n for n, f in ALL_FIELDS.items() if f.kind == "float" and n in frame.columns]
    bad = {
        row["line_no"]: [n for n in floats if row[n] is not None and not math.isfinite(row[n])]
        for row in frame.iter_rows(named=True)
    }
    rejected = 0
    for j, t in zip(by_json, typed):
        if bad[j["line_no"]]:
            assert t["reason"] == "; ".join(f"{n}: NaN or infinite value {t_v}" for n, t_v in _shown(frame, j, bad))
            rejected += 1
            continue
        for col in j:
            if col == "reason" and j[col] and t[col]:
                # the same checks fail; a shown value may be printed differently (1e+20 vs 1e20)
                assert [r.split(":")[0] for r in j[col].split("; ")] == [r.split(":")[0] for r in t[col].split("; ")]
            else:
                assert _same(j[col], t[col]), (j["line_no"], col, j[col], t[col])
        rejected += j["reason"] is not None
    assert 0 < rejected < frame.height  # the cases cover both outcomes


def _shown(frame: pl.DataFrame, j: dict, bad: dict) -> list[tuple[str, str]]:
    """(field, its value as DuckDB prints it) of a row's non-finite fields."""
    row = frame.row(j["line_no"] - 1, named=True)
    text = {True: "Infinity", False: "-Infinity"}
    return [(n, "NaN" if math.isnan(row[n]) else text[row[n] > 0]) for n in bad[j["line_no"]]]


def test_extra_json_keeps_nulls_and_skips_canonical_columns():
    typed = c.encode(ITERATIONS.with_columns(run_id=pl.lit("r")), "iteration", ("engine_index", "run_id"))
    assert typed.extra == ("engine_index",)
    texts = typed.table.column("extra_json").to_pylist()
    assert json.loads(texts[0]) == {"engine_index": 0} and json.loads(texts[4]) == {"engine_index": None}


def test_column_names_that_are_no_identifiers_are_refused():
    frame = pl.DataFrame({"line_no": [1], "iter": [0], "dur_ms": [1.0], 'x"; drop table runs; --': [1]})
    typed = c.encode(frame, "iteration", ('x"; drop table runs; --',))
    with pytest.raises(ValueError, match="not a plain identifier"):
        typed_stage_sql("typed_in", typed)
