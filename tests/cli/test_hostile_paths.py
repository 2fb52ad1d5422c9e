"""File names are data: DuckDB and Polars take a path as a glob pattern and expand a
leading ``~``, so a log named ``[ab].jsonl`` beside ``a.jsonl`` and ``b.jsonl`` once
loaded those two instead of itself. Each reader here must read the one file named."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import duckdb
import pytest

from pipeline.cli import run_captured
from pipeline.escape import glob_literal
from pipeline.nightly.history import History
from pipeline.sim.workload import workload_from_file

TINY = Path(__file__).resolve().parents[2] / "fixtures" / "canonical" / "tiny.jsonl"


def _trace(path: Path, run_id: str) -> Path:
    """The tiny canonical trace under another run id."""
    lines = TINY.read_text().splitlines()
    head = json.loads(lines[0]) | {"run_id": run_id}
    text = "\n".join([json.dumps(head), *lines[1:]]) + "\n"
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def _runs(*where: str | Path) -> list[str]:
    code, out = run_captured("runs", "--json", *where)
    assert code == 0, out
    return sorted(r["run_id"] for r in json.loads(out))


@pytest.mark.parametrize("name", ["[ab].jsonl", "?.jsonl", "*.jsonl", "[ab].jsonl.gz", "x]y[.jsonl"])
@pytest.mark.long
def test_ingest_reads_the_file_named_not_a_pattern(tmp_path, name):
    logs = tmp_path / "logs"
    logs.mkdir()
    _trace(logs / "a.jsonl", "A")
    _trace(logs / "b.jsonl", "B")
    evil = _trace(logs / name, "EVIL")
    db = tmp_path / "t.duckdb"
    code, out = run_captured("ingest", evil, "--db", db)
    assert code == 0, out
    assert _runs("--db", db) == ["EVIL"]
    con = duckdb.connect(str(db), read_only=True)
    try:  # every line of the one file, none of the others
        assert con.execute("select count(*) from iterations").fetchone()[0] == 4
        assert con.execute("select count(*) from requests").fetchone()[0] == 3
    finally:
        con.close()


def test_ingest_reads_canonical_parquet_named_like_a_pattern(tmp_path):
    con = duckdb.connect()
    for name, run in (("a.parquet", "A"), ("b.parquet", "B"), ("[ab].parquet", "EVIL")):
        src = _trace(tmp_path / f"{run}.jsonl", run)
        con.execute(
            f"copy (select * from read_json_auto('{src}', sample_size = -1)) to '{tmp_path / name}' (format parquet)"
        )
    db = tmp_path / "t.duckdb"
    code, out = run_captured("ingest", tmp_path / "[ab].parquet", "--db", db)
    assert code == 0, out
    assert _runs("--db", db) == ["EVIL"]


def test_relative_path_starting_with_tilde_is_not_the_home_folder(tmp_path, monkeypatch):
    home = tmp_path / "home"
    # DuckDB would read "~x/t.jsonl" as HOME + "x/t.jsonl"; put a decoy there
    decoy = Path(str(home) + "x")
    decoy.mkdir(parents=True)
    _trace(decoy / "t.jsonl", "DECOY")
    work = tmp_path / "work"
    (work / "~x").mkdir(parents=True)
    _trace(work / "~x" / "t.jsonl", "MINE")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    code, out = run_captured("ingest", "~x/t.jsonl", "--db", "t.duckdb")
    assert code == 0, out
    assert _runs("--db", "t.duckdb") == ["MINE"]


@pytest.mark.long
def test_lake_named_like_a_pattern_reads_only_itself(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # "lake[1]?" as a pattern matches "lake1X": a decoy lake there must stay unread
    for lake, run in (("lake1X", "DECOY"), ("lake[1]?", "MINE"), ("~lake", "TILDE")):
        code, out = run_captured("ingest", _trace(tmp_path / f"{run}.jsonl", run), "--lake", lake)
        assert code == 0, out
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert _runs("--lake", "lake[1]?") == ["MINE"]
    assert _runs("--lake", "~lake") == ["TILDE"]
    code, out = run_captured("summary", "MINE", "--lake", "lake[1]?", "--json")
    assert code == 0, out
    assert (json.loads(out)["requests"], json.loads(out)["iterations"]) == (3, 4)


def test_nightly_history_under_a_tilde_folder_stays_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    hist = History("~hist")
    hist.close()
    assert (tmp_path / "~hist" / "history.duckdb").is_file()
    assert not any(p.name.startswith("hhist") for p in tmp_path.iterdir())


def test_workload_file_named_like_a_pattern(tmp_path):
    for name, n in (("a.csv", 1), ("b.csv", 2), ("[ab].csv", 3)):
        rows = "\n".join(f"{i * 0.5},{10 + i},{5 + i}" for i in range(n))
        (tmp_path / name).write_text("t_arrival,prompt_tokens,output_tokens\n" + rows + "\n")
    for name, n in (("a.jsonl", 1), ("b.jsonl", 2), ("[ab].jsonl", 4)):
        rows = [json.dumps({"t_arrival": i * 0.5, "prompt_tokens": 10, "output_tokens": 5}) for i in range(n)]
        (tmp_path / name).write_text("\n".join(rows) + "\n")
    assert len(workload_from_file(tmp_path / "[ab].csv").t_arrival) == 3
    assert len(workload_from_file(tmp_path / "[ab].jsonl").t_arrival) == 4


def test_glob_literal_matches_exactly_one_file(tmp_path):
    names = ["[ab].x", "a.x", "b.x", "*.x", "?.x", "c]d.x", "{a,b}.x", "~e.x", "f'g.x"]
    for n in names:
        (tmp_path / n).write_text("")
    con = duckdb.connect()
    for n in names:
        got = con.execute("select file from glob($p)", {"p": glob_literal(tmp_path / n)}).fetchall()
        assert [Path(g[0]) for g in got] == [tmp_path / n]
    assert os.path.isabs(glob_literal("~rel"))
