"""Hostile input through the command line: names and ids that try to inject or break things."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

TINY = Path(__file__).resolve().parents[2] / "fixtures" / "canonical" / "tiny.jsonl"


def tiny_as(tmp_path: Path, run_id: str) -> Path:
    """tiny.jsonl under another run id (its run record names the run)."""
    out = tmp_path / f"{len(list(tmp_path.glob('*.jsonl')))}.jsonl"
    lines = TINY.read_text().splitlines()
    head = json.loads(lines[0])
    head["run_id"] = run_id
    out.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    return out


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("name", ['a"b.duckdb', 'range"(1); commit; drop table requests; begin; --.duckdb'])
def test_store_file_name_is_not_sql(tmp_path, name):
    # the second ingest rebuilds the derived tables per run, over views naming the database
    db = str(tmp_path / name)
    for run_id in ("one", "two"):
        r = run("ingest", str(tiny_as(tmp_path, run_id)), "--db", db)
        assert r.returncode == 0, r.stderr
    r = run("summary", "one", "--db", db, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ttft_ms"]["count"] == 2
    con = duckdb.connect(db, read_only=True)
    try:
        # tiny.jsonl holds 3 requests per run; an injected "drop table requests" would leave none
        assert con.execute("select run_id, count(*) from requests group by 1 order by 1").fetchall() == [
            ("one", 3), ("two", 3)]
    finally:
        con.close()
