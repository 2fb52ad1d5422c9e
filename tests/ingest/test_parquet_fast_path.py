"""Canonical Parquet read by DuckDB itself (canonical.stage_parquet) stores exactly what the
PyArrow batch path stores: values, rejects with their row numbers and reasons, duplicates,
unknown columns in ``extra``; a null column of a row is no field of it on either path."""

from __future__ import annotations

import json

import duckdb
import pytest

from pipeline import ingest, store
from pipeline.ingest import canonical

from .test_fast_path import spy_stage, stores_of_both_paths


def _parquet(path, rows_sql: str, columns: str) -> None:
    duckdb.connect().execute(f"copy (select * from (values {rows_sql}) t({columns})) to '{path}' (format parquet)")


ROWS = """
    ('run', 'R', NULL::bigint, NULL::double, NULL::double, NULL::varchar, NULL::double, NULL::double[], 'vllm', NULL::bigint),
    ('iteration', 'R', 0, 1.0, 1.01, NULL, NULL, NULL, NULL, 7),
    ('iteration', 'R', 1, 1.01, 1.02, NULL, NULL, NULL, NULL, NULL),
    ('iteration', 'R', 1, 1.02, 1.03, NULL, NULL, NULL, NULL, NULL),
    ('iteration', 'R', 2, 1.05, 1.04, NULL, NULL, NULL, NULL, NULL),
    ('request', 'R', NULL, NULL, NULL, 'a', 1.0, [1.01, 1.02], NULL, NULL),
    ('request', 'R', NULL, NULL, NULL, 'b', 1.0, [1.02, 1.01], NULL, NULL),
    ('request', NULL, NULL, NULL, NULL, NULL, 1.0, NULL, NULL, NULL),
    (NULL, 'R', 3, 1.1, 1.2, NULL, NULL, NULL, NULL, NULL),
    ('step', 'R', 4, 1.1, 1.2, NULL, NULL, NULL, NULL, NULL)
"""
COLUMNS = "kind, run_id, iter, t_start, t_end, req_id, t_arrival, token_times, engine, gpu_temp_c"


@pytest.fixture
def paths(monkeypatch):
    return spy_stage(monkeypatch, canonical.convert_parquet, "duckdb", "pyarrow")


def _both(tmp_path, monkeypatch, f) -> tuple[dict, dict]:
    return stores_of_both_paths(tmp_path, monkeypatch, f, canonical.convert_parquet)


def test_duckdb_reads_canonical_parquet_as_the_pyarrow_path_does(tmp_path, monkeypatch, paths):
    f = tmp_path / "mix.parquet"
    _parquet(f, ROWS, COLUMNS)
    fast, batch = _both(tmp_path, monkeypatch, f)
    assert paths == ["duckdb"]
    assert fast == batch
    assert fast["ingests"] == [(10, 4, 6, 0, ["R"])]
    con = store.connect(tmp_path / "fast.duckdb")
    reasons = dict(con.execute("select line_no, reason from rejects").fetchall())
    assert sorted(reasons) == [4, 5, 7, 8, 9, 10]  # row numbers from 1, the run row being 1
    assert "duplicate" in reasons[4] and "t_end (1.04) is before t_start (1.05)" in reasons[5]
    assert "token_times must be non-decreasing" in reasons[7]
    assert "missing required field req_id" in reasons[8]
    assert "missing field kind" in reasons[9] and "unknown kind step" in reasons[10]
    # the unknown column is kept where it has a value, and a null column is no field
    extras = [r for r in fast["iterations"] if "gpu_temp_c" in r]
    assert len(extras) == 1 and '{"gpu_temp_c":7}' in extras[0]
    assert all("null" not in r for r in fast["iterations"] + fast["requests"])


def test_a_file_duckdb_cannot_read_goes_the_pyarrow_path(tmp_path, monkeypatch, paths):
    f = tmp_path / "bad.parquet"
    f.write_bytes(b"PAR1" + b"\0" * 64)  # the magic bytes and nothing readable
    con = store.connect(tmp_path / "s.duckdb")
    from pipeline.errors import InputError

    with pytest.raises(InputError, match="not a readable Parquet file"):
        ingest.ingest_paths(con, [f])
    assert paths == ["pyarrow"]


def test_parquet_duplicates_get_their_row_text(tmp_path, paths):
    f = tmp_path / "dup.parquet"
    _parquet(f, "('iteration', 0, 1.0, 1.01), ('iteration', 0, 1.0, 1.01)", "kind, iter, t_start, t_end")
    con = store.connect(tmp_path / "s.duckdb")
    (res,) = ingest.ingest_paths(con, [f])
    assert paths == ["duckdb"] and (res.accepted, res.rejected) == (1, 1)
    ((line_no, reason, raw),) = con.execute("select line_no, reason, raw from rejects").fetchall()
    assert line_no == 2 and "duplicate iter 0" in reason and "first at line 1" in reason
    assert json.loads(raw) == {"kind": "iteration", "iter": 0, "t_start": 1.0, "t_end": 1.01}


def test_column_names_from_the_file_are_data_and_nested_nulls_stay(tmp_path, monkeypatch, paths):
    """Hostile column names (quotes, a backslash, SQL, non-ASCII, a second 'iter' by case) reach
    extra as keys, never the SQL text; a null inside a struct is a value of it, as in JSON."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "kind": ["run", "iteration"],
            "run_id": ["R", "R"],
            "meta": [{"knob": None, "tp": 2}, None],
            "iter": [None, 0],
            "t_start": [None, 1.0],
            "t_end": [None, 1.01],
            'x"); drop table iterations; --': [None, 1],
            "back\\slash é": [None, "v"],
            "ITER": [None, 5],
        }
    )
    f = tmp_path / "hostile.parquet"
    pq.write_table(table, f)
    fast, batch = _both(tmp_path, monkeypatch, f)
    assert paths == ["duckdb"] and fast == batch
    con = store.connect(tmp_path / "fast.duckdb")
    ((extra,),) = con.execute("select extra from iterations").fetchall()
    assert json.loads(extra) == {'x"); drop table iterations; --': 1, "back\\slash é": "v", "ITER_1": 5}
    assert json.loads(con.execute("select meta from run_records").fetchall()[0][0]) == {"knob": None, "tp": 2}


@pytest.mark.parametrize(("run_id", "stored"), [("1.5::double", "night"), ("''", "night"), ("7::bigint", "7")])
@pytest.mark.long
def test_a_parquet_run_id_column_names_a_run_only_when_valid(tmp_path, monkeypatch, paths, run_id, stored):
    """A run id of a wrong type or empty is the run row's reject; the rows below it take the file's name."""
    f = tmp_path / "night.parquet"
    _parquet(
        f,
        f"('run', {run_id}, NULL, NULL, NULL), ('iteration', NULL, 0, 1.0, 1.01)",
        "kind, run_id, iter, t_start, t_end",
    )
    fast, batch = _both(tmp_path, monkeypatch, f)
    assert paths == ["duckdb"] and fast == batch
    assert fast["ingests"][0][4] == [stored]
    assert len(fast["rejects"]) == (stored == "night")


def test_a_parquet_table_without_a_kind_column_is_no_trace(tmp_path):
    """Any Parquet file was read as canonical records: a folder of kernel-timing tables put 189,715
    rejects ("missing field kind") into the store. Now it is skipped as of no known format."""
    from pipeline.errors import InputError

    d = tmp_path / "tables"
    d.mkdir()
    duckdb.sql(f"copy (select range as m, range * 2.5 as latency_ms from range(50)) to '{d / 'gemm.parquet'}'")
    with pytest.raises(InputError, match="unknown format"):
        ingest.detect(d / "gemm.parquet")
    _parquet(d / "trace.parquet", "('iteration', 0, 1.0, 1.01)", "kind, iter, t_start, t_end")
    assert ingest.detect(d / "trace.parquet").name == "parquet"
    con = store.connect(tmp_path / "s.duckdb")
    res = {r.path.rsplit("/", 1)[-1]: r for r in ingest.ingest_paths(con, [d])}
    assert res["gemm.parquet"].status == "skipped" and res["trace.parquet"].accepted == 1
    assert con.execute("select count(*) from rejects").fetchall()[0][0] == 0
