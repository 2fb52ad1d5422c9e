"""The command line: exit codes, the single error line, --json output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import COMMANDS, cli
from ..clirun import run_cli

TINY = Path(__file__).resolve().parents[2] / "fixtures" / "canonical" / "tiny.jsonl"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=cwd)


def test_ingest_then_summary_json(tmp_path):
    db = str(tmp_path / "c.duckdb")
    r = run("ingest", str(TINY), "--db", db)
    assert r.returncode == 0, r.stderr
    assert "8 read, 8 accepted, 0 rejected" in r.stdout
    r = run("summary", "tiny", "--db", db, "--json")
    s = json.loads(r.stdout)
    assert s["run_id"] == "tiny" and s["ttft_ms"]["count"] == 2
    assert s["ttft_ms"]["mean"] == pytest.approx(32.5)
    r = run("runs", "--db", db, "--json")
    assert [x["run_id"] for x in json.loads(r.stdout)] == ["tiny"]


def test_db_from_environment(tmp_path):
    import os

    env = dict(os.environ, TRACELAT_DB=str(tmp_path / "env.duckdb"))
    r = subprocess.run([sys.executable, "-m", "pipeline", "ingest", str(TINY)], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and (tmp_path / "env.duckdb").exists()


def test_errors_are_one_line_exit_2(tmp_path):
    r = run("ingest", str(tmp_path / "missing.jsonl"), "--db", str(tmp_path / "x.duckdb"))
    assert r.returncode == 2
    assert r.stderr.strip().startswith("Error: ") and "no such file" in r.stderr
    assert "Traceback" not in r.stderr
    r = run("summary", "nope", "--db", str(tmp_path / "none.duckdb"))
    assert r.returncode == 2 and "does not exist; ingest a trace first" in r.stderr


def test_debug_shows_traceback(tmp_path):
    # a process of its own: in process, --debug lets the exception reach the caller
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "--debug",
            "ingest",
            str(tmp_path / "missing.jsonl"),
            "--db",
            str(tmp_path / "x.duckdb"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_unknown_run_lists_known(tmp_path):
    db = str(tmp_path / "c.duckdb")
    run("ingest", str(TINY), "--db", db)
    r = run("summary", "nope", "--db", db)
    assert r.returncode == 2 and "known runs: tiny" in r.stderr


def test_usage_error_exit_2():
    r = run("summary")
    assert r.returncode == 2 and "Missing argument" in r.stderr


def test_every_command_has_help():
    from click.testing import CliRunner

    runner = CliRunner()
    for name in COMMANDS:
        res = runner.invoke(cli, [name, "--help"])
        assert res.exit_code == 0, (name, res.output)
        assert len(res.output.split("\n\n")[1].strip()) > 20, name


def test_rejects_lists_lines_with_reasons(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"kind":"iteration","iter":0,"dur_ms":1}\nnot json\n{"kind":"iteration","iter":1,"dur_ms":-2}\n')
    db = str(tmp_path / "r.duckdb")
    r = run("ingest", str(f), "--db", db)
    assert r.returncode == 0 and "2 lines rejected; see them with: tracelat rejects" in r.stderr
    r = run("rejects", str(f), "--db", db, "--json")
    got = json.loads(r.stdout)
    assert got["total"] == 2
    assert [(x["line_no"], x["reason"]) for x in got["rejects"]] == [
        (2, "not valid JSON (truncated or garbage line)"),
        (3, "dur_ms is negative (-2.0)"),
    ]
    r = run("rejects", "--db", db, "--limit", "1")
    assert f"{f}:2: not valid JSON" in r.stdout and "1 more" in r.stdout
    # another spelling of the same file finds its rejects (it said "no rejected lines")
    r = run("rejects", "bad.jsonl", "--db", db, "--json", cwd=tmp_path)
    assert json.loads(r.stdout)["total"] == 2, r.stdout
    r = run("rejects", str(tmp_path / ".." / tmp_path.name / "bad.jsonl"), "--db", db, "--json")
    assert json.loads(r.stdout)["total"] == 2, r.stdout
    # ingested under a relative path in its folder, asked for from another: found by its content
    rel = str(tmp_path / "rel.duckdb")
    assert run("ingest", "bad.jsonl", "--db", rel, cwd=tmp_path).returncode == 0
    (tmp_path / "sub").mkdir()
    r = run("rejects", "../bad.jsonl", "--db", rel, "--json", cwd=tmp_path / "sub")
    assert json.loads(r.stdout)["total"] == 2, r.stdout
    # a misspelled name is an error, not "no rejected lines"; a clean ingested file has none
    r = run("rejects", "bda.jsonl", "--db", db, cwd=tmp_path)
    assert r.returncode == 2 and "bda.jsonl: no file of that name or content was ingested" in r.stderr, r.stderr
    good = tmp_path / "good.jsonl"
    good.write_text('{"kind":"iteration","iter":0,"dur_ms":1}\n')
    assert run("ingest", str(good), "--db", db).returncode == 0
    r = run("rejects", str(good), "--db", db)
    assert r.returncode == 0 and r.stdout.strip() == f"no rejected lines for {good}", r.stdout


def test_rejected_duplicates_print_no_empty_text_line(tmp_path):
    # a converter keeps no text of valid lines, and a duplicate is found after conversion: its
    # reject has no text, and printed a blank line under its reason
    log = (Path(__file__).resolve().parents[2] / "fixtures" / "vllm" / "server_epoch.log").read_text().splitlines()
    at = next(i for i, line in enumerate(log) if "Iteration(" in line)
    f = tmp_path / "dup.log"
    f.write_text("\n".join([*log[: at + 1], log[at], *log[at + 1 :]]) + "\n")
    db = str(tmp_path / "d.duckdb")
    assert run("ingest", str(f), "--db", db).returncode == 0
    lines = run("rejects", "--db", db).stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{f}:{at + 2}: duplicate iter "), lines
    assert f"(first at line {at + 1})" in lines[0], lines


def test_a_workload_trace_is_skipped_with_what_it_is_for(tmp_path):
    """A Mooncake or Azure trace holds arrivals and sizes only: skipped, it was told to name a format
    with --format, and forcing one only made thousands of rejects."""
    import shutil
    from pathlib import Path

    from pipeline.cli import run_captured

    fix = Path(__file__).resolve().parents[2] / "fixtures"
    d = tmp_path / "my traces"
    d.mkdir()
    shutil.copy(fix / "mooncake" / "conversation_trace_head.jsonl", d / "trace.jsonl")
    shutil.copy(fix / "canonical" / "tiny.jsonl", d / "tiny.jsonl")
    (d / "notes.csv").write_text("a,b\n1,2\n")
    code, out = run_captured("ingest", d, "--db", tmp_path / "w.duckdb")
    assert code == 2, out
    assert f"replay a run on it with `tracelat replay RUN --workload '{d / 'trace.jsonl'}'`" in out, out
    assert "notes.csv: skipped (no known format); name it with --format NAME" in out
    assert "tiny.jsonl [jsonl]" in out
    # named on its own, the same trace is an error that says the same, not "unknown format"
    code, out = run_captured("ingest", d / "trace.jsonl", "--db", tmp_path / "w2.duckdb")
    assert code == 2 and "a workload trace (arrivals and sizes" in out and "unknown format" not in out, out
    assert f"tracelat replay RUN --workload '{d / 'trace.jsonl'}'" in out
    code, out = run_captured("ingest", d / "notes.csv", "--db", tmp_path / "w2.duckdb")
    assert code == 2 and "notes.csv: unknown format; known formats:" in out, out


@pytest.mark.long
def test_report_says_when_the_calibration_asked_for_cannot_be_done(tmp_path):
    """A run without steps cannot be replayed: `report --calibrate` still writes the page (exit
    0) and says why on stderr, not only inside the HTML."""
    db, lss = str(tmp_path / "c.duckdb"), TINY.parents[1] / "llmservingsim"
    r = run("ingest", str(lss / "meta.json"), str(lss / "timeseries.csv"), "--run-id", "lss", "--db", db)
    assert r.returncode == 0, r.stderr
    r = run("report", "lss", "--db", db, "--out", str(tmp_path / "r"), "--calibrate", "1")
    assert r.returncode == 0, r.stderr
    assert "warning: no replay calibration for this run: run 'lss' has no steps" in r.stderr
    assert run("ingest", str(TINY), "--db", db).returncode == 0
    r = run("report", "tiny", "--db", db, "--out", str(tmp_path / "t"))
    assert r.returncode == 0 and "calibration" not in r.stderr  # not asked for: nothing said
