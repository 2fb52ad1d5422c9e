"""Exit codes mean what the README says: 0 success, 1 a check failed, 2 usage or data error."""

from __future__ import annotations

from pathlib import Path
from pipeline.cli import run_captured as cli

FIX = Path(__file__).resolve().parents[2] / "fixtures"


def test_file_with_every_line_rejected_exits_2(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"kind": "iteration"}\n{"kind": "request"}\n')
    code, out = cli("ingest", f, "--db", tmp_path / "t.duckdb")
    assert code == 2, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("Error: 1 of 1 file(s) loaded nothing") and "all 2 records rejected" in last


def test_empty_file_exits_2(tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text("")
    code, out = cli("ingest", f, "--db", tmp_path / "t.duckdb")
    assert code == 2 and "no records in it" in out.strip().splitlines()[-1], out


def test_directory_with_a_skipped_file_says_so_last_and_exits_2(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "tiny.jsonl").write_text((FIX / "canonical" / "tiny.jsonl").read_text())
    (logs / "README").write_text("notes about this run\n")
    db = tmp_path / "t.duckdb"
    code, out = cli("ingest", logs, "--db", db)
    assert code == 2, out
    last = out.strip().splitlines()[-1]
    assert "README (skipped: no known format" in last and "the other 1 file(s) were ingested" in last
    code, out = cli("runs", "--db", db)  # what did load stays loaded
    assert code == 0 and "tiny" in out


def test_good_ingest_and_unchanged_reingest_exit_0(tmp_path):
    db = tmp_path / "t.duckdb"
    for _ in range(2):
        code, out = cli("ingest", FIX / "canonical" / "tiny.jsonl", "--db", db)
        assert code == 0, out
