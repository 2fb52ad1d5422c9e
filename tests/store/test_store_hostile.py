"""The store and output paths: failures name their cause and path, exit 2 (issue 15 item 12)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import duckdb
import pytest

from pipeline import ingest, store
from pipeline.errors import InputError, StoreError
from pipeline.cli import run_captured as cli

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "fixtures" / "canonical" / "tiny.jsonl"


def test_empty_db_is_an_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out = cli("ingest", TINY, "--db", "")
    assert code == 2 and "--db is empty" in out, out
    assert not (tmp_path / "tracelat.duckdb").exists()  # the default was not used instead


def test_sqlite_file_is_refused_up_front(tmp_path):
    db = tmp_path / "store.db"
    sqlite3.connect(db).execute("create table t (x)").connection.close()
    before = db.read_bytes()
    t0 = time.perf_counter()
    code, out = cli("runs", "--db", db)
    assert code == 2 and "is an SQLite database, not a tracelat store" in out, out
    assert time.perf_counter() - t0 < 5 and db.read_bytes() == before
    with pytest.raises(StoreError, match="not a DuckDB database"):
        (tmp_path / "junk.duckdb").write_bytes(b"\x00" * 4096)
        store.connect(tmp_path / "junk.duckdb")


def test_duckdb_file_of_something_else_is_refused(tmp_path):
    other = tmp_path / "other.duckdb"
    con = duckdb.connect(str(other))
    con.execute("create table foo (x int)")
    con.close()
    for args in (("ingest", TINY), ("runs",), ("summary", "tiny")):
        code, out = cli(*args, "--db", other)
        assert code == 2 and "is a DuckDB file of something else (tables foo)" in out, out
    con = duckdb.connect(str(other), read_only=True)
    try:  # nothing of ours was added beside the owner's table
        assert [r[0] for r in con.execute("select table_name from duckdb_tables()").fetchall()] == ["foo"]
    finally:
        con.close()
    code, out = cli("ingest", TINY, "--db", tmp_path / "ok.duckdb")  # a new path is a new store
    assert code == 0, out


def test_nightly_history_as_db_points_at_the_nights_stores(tmp_path):
    from pipeline.nightly.history import History

    History(tmp_path / "h").close()
    code, out = cli("runs", "--db", tmp_path / "h" / "history.duckdb")
    assert code == 2 and "is a nightly history, not a store" in out and "runs/<night>.duckdb" in out, out


def test_failed_commit_reports_its_cause(tmp_path, monkeypatch):
    con = store.connect(tmp_path / "t.duckdb")

    def failing_commit(c):  # what DuckDB does when the disk is full: the commit ends the transaction
        c.execute("rollback")
        raise duckdb.IOException('IO Error: Could not write file "t.duckdb.wal": No space left on device')

    monkeypatch.setattr(store, "commit", failing_commit)
    with pytest.raises(InputError) as err:
        ingest.ingest_paths(con, [TINY])
    msg = str(err.value)
    assert "No space left on device" in msg and "no transaction is active" not in msg
    assert "nothing of it was stored" in msg
    monkeypatch.undo()
    assert con.execute("select count(*) from ingests").fetchone()[0] == 0


def test_unwritable_outputs_are_errors_naming_the_path(tmp_path):
    db = tmp_path / "t.duckdb"
    assert cli("ingest", TINY, "--db", db)[0] == 0
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    code, out = cli("report", "tiny", "--db", db, "--out", blocker / "sub")
    assert code == 2 and f"cannot write --out {blocker / 'sub'}" in out, out
    if Path("/dev/full").exists():
        code, out = cli("audit", "tiny", "--db", db, "--slo", REPO / "examples" / "slo.toml", "--junit", "/dev/full")
        assert code == 2 and "cannot write --junit /dev/full: No space left on device" in out, out


def test_memory_limit_applies_to_every_connection(tmp_path, monkeypatch, own_scratch):
    monkeypatch.setenv("TRACELAT_MEMORY_LIMIT", "123MB")
    for con in (store.connect(tmp_path / "t.duckdb"), store.scratch()):
        limit = con.execute("select current_setting('memory_limit')").fetchone()[0]
        assert limit.replace(" ", "").lower() in ("117.3mib", "123.0mb", "123mb"), limit
        con.close()
    monkeypatch.setenv("TRACELAT_MEMORY_LIMIT", "lots")
    with pytest.raises(StoreError, match="not a size"):
        store.scratch()


def test_a_folder_with_a_question_mark_is_refused_before_a_file_is_made(tmp_path, monkeypatch):
    """DuckDB puts ".wal" before a path's first "?": in a folder's name the log's folder does not
    exist, and the ingest failed at its commit with a raw error, leaving an empty store behind."""
    folder = tmp_path / "inc?1"
    folder.mkdir()
    code, out = cli("ingest", TINY, "--db", folder / "s.duckdb")
    assert code == 2 and "a folder whose path holds '?'" in out and "Failed to commit" not in out, out
    assert not list(folder.iterdir())
    monkeypatch.chdir(folder)  # a relative path there is refused too
    code, out = cli("ingest", TINY, "--db", "s.duckdb")
    assert code == 2 and "holds '?'" in out and not list(folder.iterdir()), out
    # a "?" in the file's own name is no folder of it: that works
    code, out = cli("ingest", TINY, "--db", tmp_path / "s?x.duckdb")
    assert code == 0, out
    assert store.connect(tmp_path / "s?x.duckdb").execute("select count(*) from runs").fetchall() == [(1,)]
