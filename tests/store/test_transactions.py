"""A killed ingest leaves the store as it was; a locked store gives a clear error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from pipeline import ingest, store
from pipeline.errors import StoreError

SLOW_INGEST = textwrap.dedent(
    """
    import sys, time
    from pipeline import ingest, store
    from pipeline.ingest import canonical, load, reader
    reader.BATCH_BYTES = 4096
    canonical.STAGED_SLICE_BATCHES = 1  # the staged fast path loads in slices of a batch too
    orig = load.load_batch
    def slow(con, batch, st):
        orig(con, batch, st)
        print("BATCH", flush=True)
        time.sleep(0.3)
    load.load_batch = slow
    con = store.connect(sys.argv[1])
    ingest.ingest_paths(con, [sys.argv[2]])
    print("DONE", flush=True)
    """
)


def _trace(path: Path, n: int, run: str) -> Path:
    path.write_text(
        "".join(
            json.dumps({"kind": "iteration", "run_id": run, "iter": i, "t_start": i / 100, "t_end": (i + 1) / 100})
            + "\n"
            for i in range(n)
        )
    )
    return path


def _contents(db: Path) -> list:
    con = store.connect(db)
    try:
        return (
            con.execute("select run_id, count(*), sum(iter) from iterations group by 1 order by 1").fetchall()
            + con.execute("select count(*) from ingests").fetchall()
        )
    finally:
        con.close()


@pytest.mark.long
def test_kill_during_ingest_leaves_previous_contents(tmp_path):
    db = tmp_path / "k.duckdb"
    con = store.connect(db)
    ingest.ingest_paths(con, [_trace(tmp_path / "first.jsonl", 100, "first")])
    con.close()
    before = _contents(db)
    big = _trace(tmp_path / "big.jsonl", 3000, "big")
    proc = subprocess.Popen([sys.executable, "-c", SLOW_INGEST, str(db), str(big)], stdout=subprocess.PIPE, text=True)
    seen = 0
    deadline = time.time() + 60
    while seen < 3 and time.time() < deadline:
        if proc.stdout.readline().strip() == "BATCH":
            seen += 1
    assert seen == 3, "the ingest never got going"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _contents(db) == before
    con = store.connect(db)
    (res,) = ingest.ingest_paths(con, [big])
    assert res.accepted == 3000
    con.close()
    assert _contents(db)[:2] == [("big", 3000, sum(range(3000))), ("first", 100, sum(range(100)))]


def test_locked_database_is_a_clear_error(tmp_path):
    db = tmp_path / "l.duckdb"
    store.connect(db).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb, time; c = duckdb.connect({str(db)!r}); print('HELD', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "HELD"
        with pytest.raises(StoreError, match="locked by another process"):
            store.connect(db)
    finally:
        holder.kill()
        holder.wait()
    con = store.connect(db)  # intact and usable once the writer is gone
    assert con.execute("select count(*) from ingests").fetchall() == [(0,)]
    con.close()


def _disk_full(c):  # what DuckDB does when the disk is full: the failed commit ends the transaction
    c.execute("rollback")
    raise duckdb.IOException('IO Error: Could not write file "x.wal": No space left on device')


def test_transaction_commits_rolls_back_and_keeps_a_failed_commits_cause(tmp_path, monkeypatch):
    con = store.connect(tmp_path / "t.duckdb")
    con.execute("create table t (x int)")
    with store.transaction(con):
        con.execute("insert into t values (1)")
    with pytest.raises(KeyError):  # not a database error: propagates unchanged, the rows go
        with store.transaction(con, lambda exc, state: StoreError("unused")):
            con.execute("insert into t values (2)")
            raise KeyError("x")
    with pytest.raises(StoreError, match=r"(?s)^wrapped: .*syntax error.*; nothing of it was stored"):
        with store.transaction(con, lambda exc, state: StoreError(f"wrapped: {exc}; {state}")):
            con.execute("insert into t values (3)")
            con.execute("selec 1")
    monkeypatch.setattr(store, "commit", _disk_full)
    with pytest.raises(StoreError) as err:
        with store.transaction(con, lambda exc, state: StoreError(f"{exc}; {state}")):
            con.execute("insert into t values (4)")
    assert "No space left on device" in str(err.value) and "no transaction is active" not in str(err.value)
    monkeypatch.undo()
    assert con.execute("select list(x order by x) from t").fetchall()[0][0] == [1]
    with store.transaction(con):  # usable again: no transaction left open
        con.execute("insert into t values (5)")
    assert con.execute("select count(*) from t").fetchall()[0][0] == 2


def test_nightly_record_reports_a_failed_commits_cause(tmp_path, monkeypatch):
    """The nightly history's transaction used a bare ROLLBACK that hid the cause behind
    "no transaction is active"; it now goes through store.transaction."""
    from pipeline.nightly.history import History, Night
    from pipeline.nightly.stats import Stat

    hist = History(tmp_path / "h")
    monkeypatch.setattr(store, "commit", _disk_full)
    with pytest.raises(duckdb.IOException, match="No space left on device"):
        hist.record(Night(0, "r1", "2026-11-01"), [Stat("ttft_ms.p50", 1.0)])
    monkeypatch.undo()
    assert hist.con.execute("select count(*) from nightly_runs").fetchall()[0][0] == 0
    assert hist.record(Night(0, "r1", "2026-11-01"), [Stat("ttft_ms.p50", 1.0)]).seq == 1
    hist.close()
