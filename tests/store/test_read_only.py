"""Read commands open a current store read-only, so several can read it at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import ingest, store
from pipeline.fit import fit_ready, get_or_fit

HOLD = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
con.execute("select count(*) from runs").fetchall()
print("holding", flush=True)
time.sleep(60)
"""


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def sim_db(tmp_path) -> Path:
    from pipeline.sim import WorkloadSpec, run_simulation

    trace = tmp_path / "r.jsonl"
    run_simulation(trace, truth=False, run_id="r", spec=WorkloadSpec(requests=200, rate_rps=8.0), seed=1)
    db = tmp_path / "s.duckdb"
    con = store.connect(db)
    ingest.ingest_paths(con, [trace])
    con.close()
    return db


def test_summary_and_runs_read_while_another_process_reads(sim_db):
    assert cli("summary", "r", "--db", str(sim_db), "--json").returncode == 0  # builds and stores the fit
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(sim_db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        r = cli("summary", "r", "--db", str(sim_db), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["fit"]["t0_ms"] > 0
        for args in (("runs",), ("explain", "r", "--metric", "ttft"), ("rejects",)):
            r = cli(*args, "--db", str(sim_db))
            assert r.returncode == 0, (args, r.stderr)
        # a writer still has to wait, and says so
        r = cli("ingest", str(sim_db.with_name("r.jsonl")), "--db", str(sim_db), "--run-id", "again")
        assert r.returncode == 2 and "is locked" in r.stderr
    finally:
        holder.kill()
        holder.wait()


def test_stale_store_or_missing_fit_opens_read_write(sim_db):
    con = store.open_for_reading(sim_db, read_only_if=store.always)
    assert not store.is_read_only(con) and store.derived_current(con)  # derived tables had to be built
    con.close()
    con = store.open_for_reading(sim_db, read_only_if=store.always)
    assert store.is_read_only(con)
    con.close()
    con = store.open_for_reading(sim_db, read_only_if=fit_ready("r"))
    assert not store.is_read_only(con)  # no stored fit yet: it will be written
    get_or_fit(con, "r")
    con.close()
    con = store.open_for_reading(sim_db, read_only_if=fit_ready("r"))
    assert store.is_read_only(con)
    assert get_or_fit(con, "r").t0_ms > 0  # read from the store
    con.close()


def test_read_only_connection_without_a_fit_is_a_clear_error(sim_db):
    con = store.open_for_reading(sim_db, read_only_if=store.always)
    con.close()
    con = store.open_for_reading(sim_db, read_only_if=store.always)
    assert store.is_read_only(con)
    with pytest.raises(store.StoreError, match="no current stored fit and the store is open read-only"):
        get_or_fit(con, "r")
    con.close()


def test_same_process_read_write_connection_is_shared(sim_db):
    rw = store.connect(sim_db)
    store.build_derived(rw)
    con = store.open_for_reading(sim_db, read_only_if=store.always)
    assert not store.is_read_only(con)  # DuckDB allows one configuration per file and process
    assert con.execute("select count(*) from runs").fetchall() == [(1,)]
    con.close()
    rw.close()


def test_old_schema_is_migrated_through_the_read_write_path(sim_db):
    con = store.connect(sim_db)
    store.build_derived(con)
    con.execute("drop table run_records")
    con.close()
    con = store.open_for_reading(sim_db, read_only_if=store.always)
    assert not store.is_read_only(con)
    assert con.execute("select count(*) from run_records").fetchall() == [(1,)]
    con.close()
