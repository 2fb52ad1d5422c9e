"""benchmarks/ingest_timeline.py: it sees the statements of every stage of an ingest, and the ingest happens."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[2]
# start, wall, CPU, CPUs busy (or -), statement
ROW = re.compile(r"^\s*(?P<start>[\d.]+)\s+[\d.]+\s+[\d.]+\s+(?:[\d.]+|-)\s+(?P<statement>\S.*)$")


def test_timeline_shows_each_stage_of_an_ingest(tmp_path):
    db = tmp_path / "s.duckdb"
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ingest_timeline.py"), str(ROOT / "fixtures/canonical/tiny.jsonl")]
        + ["--db", str(db), "--min-ms", "0"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    rows = [m for m in map(ROW.match, out.splitlines()) if m]
    statements = [m["statement"] for m in rows]
    # the staging statement, the load's inserts (run through load._Scope) and the derived tables
    assert any(s.startswith("execute: create or replace temp table _tracelat_staged") for s in statements)
    for table in ("iterations", "requests", "token_lists"):
        assert any(s.startswith(f"load: insert into {table} ") for s in statements), table
    assert any(s.startswith('execute: create or replace table "metric_stats"') for s in statements)
    starts = [float(m["start"]) for m in rows]
    assert starts == sorted(starts)
    assert out.splitlines()[-1].startswith("total: ")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select count(*) from iterations").fetchall()[0][0] > 0
