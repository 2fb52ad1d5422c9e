"""Exit codes mean what the README says: 0 success, 1 a check failed, 2 usage or data error."""

from __future__ import annotations

from pathlib import Path

import pytest

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


@pytest.mark.long
def test_a_file_that_loaded_nothing_exits_2_again_when_unchanged(tmp_path):
    """An empty file, or one of rejects only, loaded again: it was 'unchanged' and exited 0."""
    db = tmp_path / "t.duckdb"
    (tmp_path / "empty.log").write_text("")
    (tmp_path / "bad.jsonl").write_text('{"kind": "iteration"}\n')
    for name in ("empty.log", "bad.jsonl"):
        for _ in range(2):
            code, out = cli("ingest", tmp_path / name, "--db", db)
            assert code == 2 and "loaded nothing" in out.strip().splitlines()[-1], out
        assert "it loaded nothing when this content was ingested before" in out
    tiny = FIX / "canonical" / "tiny.jsonl"
    for _ in range(2):  # a file that loaded records is still fine unchanged
        code, out = cli("ingest", tiny, "--db", db)
        assert code == 0, out
    assert "unchanged" in out


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


@pytest.mark.long
def test_closed_output_pipe_exits_141_quietly(tmp_path):
    # `tracelat ... | head`: the reader has gone; click would exit 1, which means "a check failed"
    import os
    import subprocess
    import sys

    db = tmp_path / "t.duckdb"
    assert cli("ingest", FIX / "canonical" / "tiny.jsonl", "--db", db)[0] == 0
    for args in (["runs"], ["summary", "tiny"]):
        r, w = os.pipe()
        os.close(r)  # no reader at all: the first write fails, whatever the timing
        try:
            p = subprocess.run(
                [sys.executable, "-m", "pipeline", *args, "--db", str(db)], stdout=w, stderr=subprocess.PIPE, text=True
            )
        finally:
            os.close(w)
        assert p.returncode == 141, p.stderr
        assert p.stderr == "", p.stderr  # no traceback, no "Exception ignored"


@pytest.mark.long
def test_a_file_that_stops_the_ingest_leaves_the_lines_of_those_kept(tmp_path):
    """A later file no ingestor reads stops the command (exit 2); the files before it are kept, and
    their lines and the clock alignment are printed before the error, which names the files after
    it as not read (it printed only the error)."""
    from ..clirun import run_cli

    (tmp_path / "notes.json").write_text('{"hello": 1}\n')
    rec = FIX / "vllm"
    db = tmp_path / "t.duckdb"
    r = run_cli(
        "ingest",
        rec / "server.log",
        rec / "bench.json",
        tmp_path / "notes.json",
        FIX / "canonical" / "tiny.jsonl",
        "--run-id",
        "z",
        "--db",
        db,
    )
    assert r.returncode == 2, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"{rec / 'server.log'} [vllm-log]: ") and lines[1].startswith(
        f"{rec / 'bench.json'} [vllm-bench]: "
    )
    assert lines[2].startswith("run z: bench.json aligned with server.log: offset +"), r.stdout
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith(f"Error: {tmp_path / 'notes.json'}: unknown format"), r.stderr
    assert "the 2 file(s) before it were ingested and kept" in err
    assert f"the 1 file(s) after it were not read: {FIX / 'canonical' / 'tiny.jsonl'}" in err
    r = run_cli("runs", "--db", db)
    assert [line.split()[0] for line in r.stdout.splitlines()[1:]] == ["z"]  # tiny.jsonl was not read


def test_a_file_that_stops_a_lake_ingest_leaves_the_lines_of_those_kept(tmp_path):
    """The same through --lake: the files before the one that stops it are written to the lake, and said."""
    from ..clirun import run_cli

    (tmp_path / "notes.json").write_text('{"hello": 1}\n')
    tiny = FIX / "canonical" / "tiny.jsonl"
    lake = tmp_path / "lake"
    r = run_cli("ingest", tiny, tmp_path / "notes.json", "--lake", lake)
    assert r.returncode == 2, r.stderr
    assert r.stdout.splitlines() == [f"{tiny} [jsonl]: 8 read, 8 accepted, 0 rejected; runs: tiny"], r.stdout
    assert "the 1 file(s) before it were ingested and kept" in r.stderr
    r = run_cli("runs", "--lake", lake)
    assert [line.split()[0] for line in r.stdout.splitlines()[1:]] == ["tiny"], r.stdout


@pytest.mark.long
def test_ingest_json_says_what_was_kept_when_a_file_stops_it(tmp_path):
    """`ingest --json` with a file that stops the command (exit 2) wrote nothing on stdout, so a
    script could not tell what was in the store. It writes the same list as after a whole ingest,
    the failing file (status error, with the message) and the unread ones (status not read)."""
    import json

    from ..clirun import run_cli

    (tmp_path / "notes.json").write_text('{"hello": 1}\n')
    rec = FIX / "vllm"
    tiny = FIX / "canonical" / "tiny.jsonl"
    db = tmp_path / "t.duckdb"
    args = (rec / "server.log", rec / "bench.json", tmp_path / "notes.json", tiny, "--run-id", "z", "--json")
    r = run_cli("ingest", *args, "--db", db)
    assert r.returncode == 2, r.stderr
    out = json.loads(r.stdout)
    assert [(e["path"], e["status"]) for e in out] == [
        (str(rec / "server.log"), "ingested"),
        (str(rec / "bench.json"), "ingested"),
        (str(tmp_path / "notes.json"), "error"),
        (str(tiny), "not read"),
    ]
    assert out[1]["clock_alignment"][0]["status"] == "aligned" and out[1]["run_ids"] == ["z"]
    assert out[2]["error"] in r.stderr and "unknown format" in out[2]["error"]
    # the first file stopping it: a list of that file alone; through --lake the same shape
    r = run_cli("ingest", tmp_path / "notes.json", "--json", "--db", tmp_path / "u.duckdb")
    assert r.returncode == 2 and [e["status"] for e in json.loads(r.stdout)] == ["error"], r.stdout
    r = run_cli("ingest", tiny, tmp_path / "notes.json", "--json", "--lake", tmp_path / "lake")
    assert r.returncode == 2, r.stderr
    assert [(e["status"], e.get("accepted")) for e in json.loads(r.stdout)] == [("ingested", 8), ("error", None)]
    # an option's error is not a file's: nothing on stdout
    r = run_cli("ingest", tiny, "--json", "--tz", "Mars/Olympus", "--db", tmp_path / "v.duckdb")
    assert r.returncode == 2 and r.stdout == "", r.stdout
