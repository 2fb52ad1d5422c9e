"""store.scratch(): cursors of one in-memory database per process. What one cursor registers
or makes temporary is its own; the memory limit follows $TRACELAT_MEMORY_LIMIT at each call."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from pipeline import store


def test_registrations_and_temporary_tables_are_each_cursors_own():
    a, b = store.scratch(), store.scratch()
    a.register("x", pa.table({"v": [1, 2, 3]}))
    b.register("x", pa.table({"v": [10]}))
    assert a.execute("select sum(v) from x").fetchall() == [(6,)]
    assert b.execute("select sum(v) from x").fetchall() == [(10,)]
    a.execute("create temp table t as select 7 as v")
    with pytest.raises(duckdb.CatalogException):
        b.execute("select * from t")
    a.close()
    c = store.scratch()
    with pytest.raises(duckdb.CatalogException):
        c.execute("select * from t")
    assert b.execute("select sum(v) from x").fetchall() == [(10,)]  # another cursor's close leaves b as it was
    b.close()
    c.close()


def test_the_memory_limit_follows_the_environment_at_each_call(monkeypatch, own_scratch):
    default = duckdb.connect().execute("select current_setting('memory_limit')").fetchall()[0][0]
    monkeypatch.setenv("TRACELAT_MEMORY_LIMIT", "123MB")
    con = store.scratch()
    assert con.execute("select current_setting('memory_limit')").fetchall()[0][0].replace(" ", "") in (
        "117.3MiB",
        "123.0MB",
    )
    con.close()
    monkeypatch.delenv("TRACELAT_MEMORY_LIMIT")
    con = store.scratch()
    assert con.execute("select current_setting('memory_limit')").fetchall()[0][0] == default
    con.close()


def test_a_limit_once_set_no_longer_binds_when_the_environment_drops_it(monkeypatch, tmp_path, own_scratch):
    """The buffer pool itself goes back to the default, not only the setting shown: DuckDB 1.5
    showed the default after `reset memory_limit` but kept the old limit, and the line reader
    (256 MiB line buffers) then failed on a 10-line file."""
    from pipeline.ingest.reader import duckdb_line_batches

    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\n' * 10)
    monkeypatch.setenv("TRACELAT_MEMORY_LIMIT", "123MB")
    store.scratch().close()
    monkeypatch.delenv("TRACELAT_MEMORY_LIMIT")
    batches = duckdb_line_batches(path)
    assert batches is not None
    assert sum(b.num_rows for b in batches) == 10
