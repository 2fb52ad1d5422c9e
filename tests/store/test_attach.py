"""The store is attached with its own row group size: big inserts go to the file, not the WAL,
and every connection of a process to one store shares one DuckDB instance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from pipeline import ingest, store
from pipeline.errors import StoreError


def write_trace(path: Path, requests: int, tokens: int) -> tuple[Path, int]:
    """A run of ``requests`` requests of ``tokens`` token times each (no steps); returns its token count."""
    lines = [{"kind": "run", "run_id": "r", "clock": "monotonic"}]
    for i in range(requests):
        t0 = i * 0.01
        times = [round(t0 + 0.02 + k * 0.005, 6) for k in range(tokens)]
        lines.append(
            {"kind": "request", "req_id": f"q{i}", "t_arrival": t0, "t_first_token": times[0],
             "t_finish": times[-1], "prompt_tokens": 10, "token_times": times}
        )  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path, requests * tokens


@pytest.mark.long
def test_token_lists_of_a_big_ingest_go_to_the_file_not_the_wal(tmp_path, monkeypatch):
    # 2048 rows per group (the smallest DuckDB takes) so that a small trace fills several
    monkeypatch.setattr(store, "ROW_GROUP_SIZE", 2048)
    trace, n_tokens = write_trace(tmp_path / "r.jsonl", requests=9000, tokens=40)
    db = tmp_path / "s.duckdb"
    con = store.connect(db)
    ingest.ingest_paths(con, [trace])
    wal = Path(f"{db}.wal")
    wal_bytes = wal.stat().st_size if wal.exists() else 0
    # the lists hold 8 bytes per token time; written to the WAL they would be all of it again
    assert wal_bytes < n_tokens * 8 / 4, wal_bytes
    groups = con.execute(
        "select count(*), max(n) from (select row_group_id, sum(count) as n from pragma_storage_info('token_lists') "
        "where column_name = 'req_id' and segment_type = 'VARCHAR' group by row_group_id)"
    )
    n_groups, largest = groups.fetchone()
    assert largest <= 2048 and n_groups >= 9000 // 2048
    con.close()
    # and what was written is the trace: every token time, in order, after a reopen
    con = store.connect(db, must_exist=True, read_only=True)
    got = con.execute("select count(*), sum(len(t_s)), bool_and(list_sort(t_s) = t_s) from token_lists").fetchone()
    assert got == (9000, n_tokens, True)
    q7 = con.execute("select t_s from token_lists where req_id = 'q7'").fetchone()[0]
    assert q7 == [round(0.07 + 0.02 + k * 0.005, 6) for k in range(40)]
    con.close()


def test_connections_of_one_process_share_the_store(tmp_path):
    db = tmp_path / "s.duckdb"
    first = store.connect(db)
    first.execute("create table t as select 1 as x")
    second = store.connect(db)
    assert second.execute("select x from t").fetchall() == [(1,)]
    first.close()  # the other connection keeps the store open
    second.execute("insert into t values (2)")
    assert second.execute("select sum(x) from t").fetchone()[0] == 3
    # one mode per file and process, as DuckDB allows
    with pytest.raises(StoreError, match="open read-write already") as err:
        store.connect(db, read_only=True)
    assert isinstance(err.value.__cause__, duckdb.ConnectionException)
    second.close()
    # the last connection closed the store: another process can open it, and sees both rows
    code = "import duckdb, sys; print(duckdb.connect(sys.argv[1], read_only=True).execute('select sum(x) from t').fetchone()[0])"
    out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "3", out.stderr
    assert not Path(f"{db}.wal").exists()  # checkpointed on close


def test_two_stores_in_one_process_stay_apart(tmp_path):
    a, b = store.connect(tmp_path / "a.duckdb"), store.connect(tmp_path / "b.duckdb")
    a.execute("create table t as select 'a' as x")
    b.execute("create table t as select 'b' as x")
    assert a.execute("select x from t").fetchall() == [("a",)] and b.execute("select x from t").fetchall() == [("b",)]
    a.close()
    b.close()


@pytest.mark.parametrize(
    "name",
    ['it\'s "quoted".duckdb', "semi'; drop table runs; --.duckdb", "ünï cödé.duckdb"],
)
def test_hostile_store_file_names(tmp_path, name):
    trace, _ = write_trace(tmp_path / "r.jsonl", requests=3, tokens=4)
    db = tmp_path / name
    con = store.connect(db)
    ingest.ingest_paths(con, [trace])
    store.build_derived(con)
    con.close()
    assert db.exists() and len(list(tmp_path.iterdir())) == 2  # the store and the trace: nothing else written
    con = store.connect(db, must_exist=True, read_only=True)
    assert store.known_runs(con) == ["r"] and store.is_read_only(con)
    con.close()


def test_memory_store_is_private(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, b = store.connect(":memory:"), store.connect(":memory:")
    a.execute("create table t as select 1 as x")
    assert not b.execute("select count(*) from duckdb_tables() where table_name = 't'").fetchone()[0]
    a.close()
    b.close()
    # a named in-memory database stays one too: no file of that name
    store.connect(":memory:named").close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.long
def test_threads_opening_one_store_in_both_modes_get_their_mode_or_a_clear_error(tmp_path):
    import threading

    db = tmp_path / "s.duckdb"
    store.connect(db).close()  # the store exists, so a read-only open is possible
    for _ in range(20):
        outcomes: dict[bool, object] = {}
        barrier = threading.Barrier(2)

        def open_as(read_only: bool) -> None:
            barrier.wait()
            try:
                outcomes[read_only] = store.connect(db, read_only=read_only)
            except StoreError as exc:
                outcomes[read_only] = exc

        threads = [threading.Thread(target=open_as, args=(ro,)) for ro in (False, True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        opened = [ro for ro, got in outcomes.items() if not isinstance(got, StoreError)]
        assert len(opened) == 1, outcomes  # one mode per file and process: the other is refused
        for ro, got in outcomes.items():
            if isinstance(got, StoreError):
                assert "open" in str(got) and "already" in str(got), got
            else:
                assert store.is_read_only(got) == ro
                got.close()


def test_a_plain_duckdb_connection_to_the_store_is_a_clear_error(tmp_path):
    db = tmp_path / "s.duckdb"
    store.connect(db).close()
    plain = duckdb.connect(str(db))
    try:
        with pytest.raises(StoreError, match="open through another DuckDB connection"):
            store.connect(db)
    finally:
        plain.close()
    store.connect(db).close()  # and once it is closed, the store opens
