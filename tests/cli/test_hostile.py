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
            ("one", 3),
            ("two", 3),
        ]
    finally:
        con.close()


ESC_RUN = "run\x1b[2J\x1b]0;pwned\x07\rX\x9b31m"
ESC_MODEL = "model\x1b[31mred\x1bc\x7f\x08"


def test_terminal_output_holds_no_control_characters(tmp_path):
    lines = [json.loads(x) for x in TINY.read_text().splitlines()]
    lines[0] |= {"run_id": ESC_RUN, "model": ESC_MODEL}
    bad = '{"kind":"request","req_id":"\\u001b[2Jr9","t_arrival":"\x1b[1Aoops"}'
    trace = tmp_path / "esc\x1b[1m.jsonl"
    trace.write_text("\n".join([*map(json.dumps, lines), bad]) + "\n")
    db = str(tmp_path / "e.duckdb")
    outputs = [
        run("ingest", str(trace), "--db", db),
        run("runs", "--db", db),
        run("summary", ESC_RUN, "--db", db),
        run("rejects", "--db", db),
        run("report", ESC_RUN, "--db", db, "--out", str(tmp_path / "rep")),
        run("summary", "nope\x1b[2J", "--db", db),  # the error lists the known runs
        run("summary", ESC_RUN, "--db", db, "--bogus\x1b[2J"),
    ]  # click's usage error quotes the option
    assert [r.returncode for r in outputs] == [0, 0, 0, 0, 0, 2, 2], [r.stderr for r in outputs]
    for r in outputs:
        for text in (r.stdout, r.stderr):
            bad_chars = {c for c in text if (ord(c) < 32 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F}
            assert not bad_chars, (r.args, text)
    # the names are still shown, without their escapes
    assert "run]0;pwnedX31m" not in outputs[1].stdout  # whole sequences go, not only the ESC byte
    assert "runX " in outputs[1].stdout and "modelred" in outputs[1].stdout
    assert "known runs: runX)" in outputs[5].stderr


def test_run_ids_that_reduce_to_one_name_get_their_own_report_folders(tmp_path):
    db = str(tmp_path / "r.duckdb")
    for run_id in ("a/b", "a?b"):
        assert run("ingest", str(tiny_as(tmp_path, run_id)), "--db", db).returncode == 0
    where = {}
    for run_id in ("a/b", "a?b"):
        r = run("report", run_id, "--db", db, "--json", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        where[run_id] = Path(tmp_path, json.loads(r.stdout)["html"])  # the command says where it went
    assert where["a/b"].parent != where["a?b"].parent
    for run_id, html in where.items():
        assert html.parent.parent == tmp_path / "reports"
        summary = json.loads(html.with_name("summary.json").read_text())
        assert summary["run_id"] == run_id  # neither overwrote the other
