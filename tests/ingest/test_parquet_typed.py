"""Canonical Parquet validated from its typed columns (ingest/parquet_sql.py) stores exactly
what the rows' JSON text stores, through DuckDB's JSON stage and through the PyArrow batch
path: values, rejects with row numbers, reasons and raw text, extras; column types it does
not validate itself go the JSON stage."""

from __future__ import annotations

import json
import math

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.terminal import UNSAFE_IN_ID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import ingest, store
from pipeline.ingest import canonical

from .props import budgets
from .test_fast_path import state

MODES = ("typed", "json", "batch")


def _ingest(tmp_path, monkeypatch, f, mode: str) -> tuple[dict, list[str]]:
    """The store after ingesting ``f`` in ``mode``, and how each StagedJsonl was staged."""
    used: list[str] = []
    with monkeypatch.context() as m:
        real_init = canonical.StagedJsonl.__init__

        def spy(self, *a, **kw):
            real_init(self, *a, **kw)
            used.append(self.quote_check)

        m.setattr(canonical.StagedJsonl, "__init__", spy)
        if mode == "json":
            m.setattr(canonical, "parquet_stage_sql", lambda *a, **kw: None)
        if mode == "batch":
            m.setattr(canonical.convert_parquet, "stage", None)
        db = tmp_path / f"{mode}-{f.stem}.duckdb"
        if db.exists():
            db.unlink()
        con = store.connect(db)
        try:
            ingest.ingest_paths(con, [f])
            return state(con), used
        finally:
            con.close()


def _all_modes(tmp_path, monkeypatch, table: pa.Table, name: str = "t") -> tuple[dict, list[str]]:
    f = tmp_path / f"{name}.parquet"
    pq.write_table(table, f)
    out = {mode: _ingest(tmp_path, monkeypatch, f, mode) for mode in MODES}
    assert out["typed"][0] == out["json"][0], "typed columns and the JSON stage disagree"
    assert out["typed"][0] == out["batch"][0], "typed columns and the batch path disagree"
    assert out["json"][1] == ["line"] and out["batch"][1] == []
    return out["typed"][0], out["typed"][1]


NAN, INF = math.nan, math.inf


def test_tricky_values_match_the_json_text(tmp_path, monkeypatch):
    """NaN and infinities, integer times, an integer run_id, a uint64 count beyond 2^63, a
    struct meta with a nested null, another kind's field (extra), unknown kinds and a missing
    kind, lists with nulls and NaN: every reason and value as the JSON text gives it."""
    rows = [
        {"kind": "run", "run_id": 7, "meta": {"tp": 2, "knob": None}},
        {"kind": "iteration", "iter": 0, "t_start": 1.0, "t_end": 1.01, "decode_tokens": 3},
        {"kind": "iteration", "iter": 1, "t_start": NAN, "t_end": 1.02},
        {"kind": "iteration", "iter": 2, "t_start": 1.02, "t_end": INF},
        {"kind": "iteration", "iter": 3, "t_start": 1.03, "t_end": 1.04, "t_arrival": 5.0},
        {"kind": "iteration", "iter": 4, "t_start": 1.04, "t_end": 1.05, "kv_usage": 1.5},
        {"kind": "iteration", "iter": 5, "t_start": 2, "t_end": 3, "decode_tokens": -1},
        {"kind": "request", "req_id": "a", "t_arrival": 1.0, "token_times": [1.1, 1.2], "output_tokens": 2},
        {"kind": "request", "req_id": "b", "t_arrival": 1.0, "token_times": [1.1, None]},
        {"kind": "request", "req_id": "c", "t_arrival": 1.0, "token_times": [1.1, NAN]},
        {"kind": "request", "req_id": "d", "t_arrival": 1.0, "token_times": [1.3, 1.2], "iter": 9},
        {"kind": "request", "req_id": "e", "t_arrival": 1.0, "token_times": [], "status": "weird"},
        {"kind": "step", "iter": 6},
        {"kind": None, "iter": 7},
        {"kind": "request", "t_arrival": 1.0},
    ]
    names = list(dict.fromkeys(k for r in rows for k in r))
    table = pa.table({k: [r.get(k) for r in rows] for k in names})
    table = table.append_column("prompt_tokens", pa.array([None] * 7 + [2**64 - 1] + [None] * 7, pa.uint64()))
    stored, used = _all_modes(tmp_path, monkeypatch, table)
    assert used == ["typed"]
    con = store.connect(tmp_path / "typed-t.duckdb", read_only=True)
    reasons = dict(con.execute("select line_no, reason from rejects").fetchall())
    con.close()
    assert "NaN or infinite" in reasons[3] and "NaN or infinite" in reasons[4]
    assert "expected a fraction" in reasons[6] and "negative count" in reasons[7]
    assert "contains null, NaN or infinite" in reasons[9] and "contains null, NaN or infinite" in reasons[10]
    assert "non-decreasing" in reasons[11] and "status" in reasons[12]
    assert "unknown kind step" in reasons[13] and "missing field kind" in reasons[14]
    assert "missing required field req_id" in reasons[15]
    assert "prompt_tokens: expected a non-negative integer, got 18446744073709551615" in reasons[8]
    assert any("t_arrival" in r for r in stored["iterations"])  # another kind's field: kept in extra
    assert stored["ingests"][0][:3] == (15, 3, 12)


def test_file_column_names_never_clash_with_the_statements_names(tmp_path, monkeypatch):
    """Columns named like the statement's own (reason, extra, v_iter, t_iter, c0, kind_1, raw,
    own_run) are unknown fields like any other: kept in extra, never read as ours."""
    n = 3
    hostile = ["reason", "extra", "v_iter", "t_iter", "c0", "raw", "own_run", 'a"b', "x'); drop table runs; --"]
    cols = {
        "kind": ["iteration"] * n,
        "iter": list(range(n)),
        "t_start": [0.0, 1.0, 2.0],
        "t_end": [0.5, 1.5, 2.5],
        **{h: [f"{h}-{i}" if i != 1 else None for i in range(n)] for h in hostile},
    }
    stored, used = _all_modes(tmp_path, monkeypatch, pa.table(cols))
    assert used == ["typed"] and stored["ingests"][0][:3] == (3, 3, 0)
    con = store.connect(tmp_path / "typed-t.duckdb", read_only=True)
    extras = dict(con.execute("select iter, extra from iterations").fetchall())
    con.close()
    assert json.loads(extras[0]) == {h: f"{h}-0" for h in hostile} and extras[1] is None


@pytest.mark.parametrize(
    "column,array",
    [
        ("t_start", pa.array([0.0, 1.0], pa.float32())),  # to_json writes a float32's own digits
        ("iter", pa.array(["0", "1"])),  # a string where a number belongs: the text names it
        ("output_tokens", pa.array([True, False])),
        ("meta", pa.array(['{"a":1}', None])),
    ],
)
@pytest.mark.long
def test_types_it_does_not_validate_go_the_json_stage(tmp_path, monkeypatch, column, array):
    cols = {"kind": ["iteration", "request"], "iter": [0, None], "t_start": [0.0, None], "t_end": [0.5, None]}
    cols |= {"req_id": [None, "r"], "t_arrival": [None, 1.0]}
    table = pa.table(cols)
    if column in table.column_names:
        table = table.set_column(table.column_names.index(column), column, array)
    else:
        table = table.append_column(column, array)
    _, used = _all_modes(tmp_path, monkeypatch, table)
    assert used == ["line"]


# --- any column of any type: the three ways agree -----------------------------------------------

TYPES = {
    "float64": (pa.float64(), st.floats()),
    "float32": (pa.float32(), st.floats(width=32)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "uint64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "int8": (pa.int8(), st.integers(-128, 127)),
    "string": (pa.string(), st.text(max_size=12)),
    "bool": (pa.bool_(), st.booleans()),
    "list<double>": (pa.list_(pa.float64()), st.lists(st.one_of(st.none(), st.floats()), max_size=4)),
    "list<int64>": (pa.list_(pa.int64()), st.lists(st.integers(-(2**40), 2**40), max_size=4)),
    "list<string>": (pa.list_(pa.string()), st.lists(st.text(max_size=5), max_size=3)),
    "struct": (
        pa.struct([("a", pa.int64()), ("b", pa.string())]),
        st.fixed_dictionaries({"a": st.none() | st.integers(-5, 5), "b": st.text(max_size=4)}),
    ),
    "null": (pa.null(), st.none()),
}
NAMES = [
    "kind",
    "run_id",
    "iter",
    "t_start",
    "t_end",
    "dur_ms",
    "kv_usage",
    "decode_tokens",
    "req_ids",
    "req_id",
    "t_arrival",
    "t_finish",
    "output_tokens",
    "status",
    "token_times",
    "meta",
    "engine",
    "zz",
]


NUMBERS = {"float64", "int64", "uint64", "int8"}
TYPED = {  # the column types each field is validated in as it is (else the JSON stage)
    "kind": {"string"},
    "run_id": {"string", "int64", "uint64", "int8"},
    "req_id": {"string", "int64", "uint64", "int8"},
    "status": {"string"},
    "engine": {"string"},
    "req_ids": {"list<string>"},
    "token_times": {"list<double>", "list<int64>"},
    "meta": {"struct"},
    "zz": set(TYPES),  # an unknown column, of any type, goes to extra
}


def _base() -> dict[str, list]:
    return {
        "kind": ["run", "iteration", "iteration", "request", "request"],
        "run_id": ["R", None, "R", None, "R"],
        "iter": [None, 0, 1, None, None],
        "t_start": [None, 1.0, 1.01, None, None],
        "t_end": [None, 1.01, 1.02, None, None],
        "req_id": [None, None, None, "a", "b"],
        "t_arrival": [None, None, None, 1.0, 1.0],
        "token_times": [None, None, None, [1.005, 1.015], [1.01]],
    }


def _strings(v) -> list[str]:
    """Every string in a drawn value (a list's items, a struct's values)."""
    if isinstance(v, str):
        return [v]
    if isinstance(v, (list, tuple)):
        return [x for item in v for x in _strings(item)]
    if isinstance(v, dict):
        return [x for item in v.values() for x in _strings(item)]
    return []


def _null_column_is_integer(tmp) -> bool:
    """Whether this DuckDB reads a Parquet column of Arrow's null type as INTEGER (1.5) rather
    than as its NULL type (2.0): the typed stage decides by the type DuckDB gives."""
    f = tmp / "null-column.parquet"
    pq.write_table(pa.table({"c": pa.array([None], pa.null())}), f)
    return duckdb.connect().execute("describe select * from read_parquet(?)", [str(f)]).fetchall()[0][1] == "INTEGER"


@pytest.mark.parametrize("examples", budgets(8, 60))
@pytest.mark.long
def test_any_column_of_any_type_is_staged_as_its_json_text_is(tmp_path_factory, examples):
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def prop(data):
        tmp = tmp_path_factory.mktemp("p")
        cols = _base()
        name = data.draw(st.sampled_from(NAMES), label="column")
        type_name = data.draw(st.sampled_from(sorted(TYPES)), label="type")
        typ, values = TYPES[type_name]
        if name == "run_id":  # ingest refuses a run id with a control character, in a list's JSON text too
            values = values.filter(lambda v: not any(UNSAFE_IN_ID.search(x) for x in _strings(v)))
        cols[name] = data.draw(st.lists(st.one_of(st.none(), values), min_size=5, max_size=5), label="values")
        table = pa.table({k: pa.array(v, typ if k == name else None) for k, v in cols.items()})
        with pytest.MonkeyPatch.context() as mp:
            _, used = _all_modes(tmp, mp, table)
        if type_name == "null" and _null_column_is_integer(tmp):
            type_name = "int64"  # DuckDB 1.5 reads a Parquet column of Arrow's null type as INTEGER
        typed = type_name == "null" or type_name in TYPED.get(name, NUMBERS)
        assert used == (["typed"] if typed else ["line"]), (name, type_name)

    prop()


@pytest.mark.parametrize("name", ["kind", "iter", "t_start", "req_id", "meta", "zz"])
@pytest.mark.long
def test_a_column_of_arrow_null_type(tmp_path, monkeypatch, name):
    """A column written with no value at all (Arrow's null type): every path stores the same, and
    the typed stage takes it as the type DuckDB reads it as (NULL in 2.0, INTEGER in 1.5)."""
    cols = _base()
    cols[name] = [None] * 5
    table = pa.table({k: pa.array(v, pa.null() if k == name else None) for k, v in cols.items()})
    _, used = _all_modes(tmp_path, monkeypatch, table)
    typed = not _null_column_is_integer(tmp_path) or "int64" in TYPED.get(name, NUMBERS)
    assert used == (["typed"] if typed else ["line"])


def test_a_json_meta_column_is_validated_by_its_values(tmp_path, monkeypatch):
    """DuckDB writes a JSON column (the store's own type for meta): an object is meta, a
    string, number or JSON null in it is what the text would say of it."""
    import duckdb

    f = tmp_path / "j.parquet"
    duckdb.connect().execute(
        "copy (select * from (values ('run', 'A', '{\"tp\": 2, \"k\": null}'::json, NULL::bigint, NULL::double),"
        " ('run', 'B', '\"not an object\"'::json, NULL, NULL), ('run', 'C', '5'::json, NULL, NULL),"
        " ('run', 'D', 'null'::json, NULL, NULL), ('iteration', 'A', '{\"x\": 1}'::json, 0, 1.0))"
        " t(kind, run_id, meta, iter, t_start)) to '" + str(f) + "' (format parquet)"
    )
    out = {mode: _ingest(tmp_path, monkeypatch, f, mode) for mode in MODES}
    assert out["typed"][1] == ["typed"] and out["typed"][0] == out["json"][0] == out["batch"][0]
    con = store.connect(tmp_path / "typed-j.duckdb", read_only=True)
    reasons = dict(con.execute("select line_no, reason from rejects").fetchall())
    meta = con.execute("select meta from run_records where run_id = 'A'").fetchall()[0][0]
    extra = con.execute("select extra from iterations").fetchall()[0][0]
    con.close()
    assert json.loads(meta) == {"tp": 2, "k": None}
    assert set(reasons) == {2, 3} and all("meta: expected an object" in reasons[k] for k in (2, 3))
    assert json.loads(extra) == {"meta": {"x": 1}}


NUMERIC_FIELDS = ["iter", "decode_tokens", "t_start", "t_end", "dur_ms", "kv_usage"]


@pytest.mark.parametrize("bad", [(math.nan, math.nan), (math.inf, -math.inf)], ids=["nan", "inf"])
@pytest.mark.parametrize("field", NUMERIC_FIELDS)
@pytest.mark.long
def test_nan_and_infinities_among_numbers_of_a_column(tmp_path, monkeypatch, field, bad):
    """A column's Parquet statistics leave NaN out: a check DuckDB decides from them must not
    let a NaN through to a cast (it failed the whole statement) or past a range check."""
    values = {
        "iter": [0.0, 1.0, 2.0, 3.0],
        "t_start": [1.0, 1.1, 1.2, 1.3],
        "t_end": [1.05, 1.15, 1.25, 1.35],
        "decode_tokens": [1.0] * 4,
        "dur_ms": [50.0] * 4,
        "kv_usage": [0.5] * 4,
    }
    values[field] = [bad[0], *values[field][1:3], bad[1]]
    table = pa.table({"kind": ["iteration"] * 4, **values})
    stored, used = _all_modes(tmp_path, monkeypatch, table)
    assert used == ["typed"]
    con = store.connect(tmp_path / "typed-t.duckdb", read_only=True)
    reasons = dict(con.execute("select line_no, reason from rejects").fetchall())
    con.close()
    assert set(reasons) == {1, 4} and all(field in r for r in reasons.values())


def test_a_typed_statement_that_fails_leaves_the_file_to_the_json_stage(tmp_path, monkeypatch):
    monkeypatch.setattr(canonical, "parquet_stage_sql", lambda *a: "select error('a value it cannot take')")
    table = pa.table({"kind": ["iteration"], "iter": [0], "t_start": [1.0], "t_end": [1.5]})
    f = tmp_path / "e.parquet"
    pq.write_table(table, f)
    stored, used = _ingest(tmp_path, monkeypatch, f, "typed")
    assert used == ["line"] and stored["ingests"][0][:3] == (1, 1, 0)
