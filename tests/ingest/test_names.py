"""File and store names the store cannot hold, and the store inside the folder it is fed from."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pipeline import store
from pipeline.cli import run_captured as cli

TINY = Path(__file__).resolve().parents[2] / "fixtures" / "canonical" / "tiny.jsonl"
# a POSIX name is bytes: \xff is no UTF-8, and Python holds it as the surrogate \udcff
BAD = os.fsdecode(b"bad\xff.jsonl")

needs_bytes_names = pytest.mark.skipif(
    sys.platform == "darwin" or sys.getfilesystemencoding() != "utf-8", reason="the file system takes no such name"
)


@needs_bytes_names
def test_a_file_named_in_no_utf8_is_refused_by_name(tmp_path):
    (tmp_path / BAD).write_bytes(TINY.read_bytes())
    code, out = cli("ingest", tmp_path / BAD, "--db", tmp_path / "s.duckdb")
    shown = f"{tmp_path}/bad\\xff.jsonl"
    assert code == 2 and out.startswith(f"Error: {shown}: the file's name is not valid UTF-8"), out
    assert "database error" not in out and "udcff" not in out


@needs_bytes_names
def test_in_a_folder_such_a_file_is_skipped_and_the_rest_loaded(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / BAD).write_bytes(TINY.read_bytes())
    (logs / "good.jsonl").write_bytes(TINY.read_bytes())
    db = tmp_path / "s.duckdb"
    code, out = cli("ingest", logs, "--db", db)
    assert code == 2, out  # a file of the folder loaded nothing: a script's && must not pass
    assert f"{logs}/bad\\xff.jsonl: skipped (the file's name is not valid UTF-8" in out
    assert "udcff" not in out and "\ufffd" not in out
    assert store.connect(db).execute("select count(*) from iterations").fetchall() == [(4,)]


@needs_bytes_names
def test_a_store_path_in_no_utf8_is_a_store_error(tmp_path):
    code, out = cli("ingest", TINY, "--db", tmp_path / os.fsdecode(b"s\xff.duckdb"))
    assert code == 2 and f"database path {tmp_path}/s\\xff.duckdb is not valid UTF-8" in out, out
    assert not list(tmp_path.iterdir())


def test_the_store_inside_the_folder_ingested_is_not_read(tmp_path):
    """``ingest logs/ --db logs/t.duckdb``: the store, its write-ahead log and its spill folder were
    read as files of unknown format and failed the command, on the first run and every one after."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "tiny.jsonl").write_bytes(TINY.read_bytes())
    db = logs / "t.duckdb"
    for status in ("8 accepted", "unchanged"):  # the store is new (its log open meanwhile), then there
        (logs / "t.duckdb.tmp").mkdir(exist_ok=True)  # spilled to by a big query
        (logs / "t.duckdb.tmp" / "spill.block").write_bytes(b"\0" * 64)
        code, out = cli("ingest", logs, "--db", db)
        assert code == 0 and status in out and "t.duckdb" not in out, out
    # another DuckDB file in the folder is still one the user should hear about
    (logs / "other.duckdb").write_bytes(db.read_bytes())
    code, out = cli("ingest", logs, "--db", db)
    assert code == 2 and "other.duckdb: skipped (no known format)" in out, out
