"""Files a benchmark writes beside its per-request records (AIPerf's aggregate JSON and CSV, GPU
telemetry): skipped with a note saying what they are, never a failed ingest or a night, never
read as records of a format named with --format; a file that only has such a name is read."""

from __future__ import annotations

import json
import shutil

from pathlib import Path

import pytest

from pipeline import store
from pipeline.cli import run_captured as cli
from pipeline.errors import InputError
from pipeline.ingest import ingest_paths, loaded_nothing

REPO = Path(__file__).resolve().parents[2]
AIPERF = REPO / "fixtures" / "aiperf" / "profile_export.jsonl"

AGGREGATE = {
    "request_throughput": {"unit": "requests/sec", "avg": 0.25},
    "request_latency": {"unit": "ms", "avg": 3652.1, "p50": 3644.0, "p99": 3909.3},
    "time_to_first_token": {"unit": "ms", "avg": 40.0},
}
TELEMETRY = {
    "timestamp_ns": 1762551530946074466,
    "gpu_index": 0,
    "gpu_uuid": "GPU-0",
    "telemetry_data": {"gpu_power_usage": 30.2, "gpu_utilization": 2.0},
}


@pytest.fixture
def run_folder(tmp_path) -> Path:
    """An AIPerf output folder: the records, the aggregate (JSON and CSV) and the telemetry."""
    folder = tmp_path / "qwen_c1"
    folder.mkdir()
    shutil.copy(AIPERF, folder / "profile_export.jsonl")
    (folder / "profile_export_aiperf.json").write_text(json.dumps(AGGREGATE, indent=2))
    (folder / "profile_export_aiperf.csv").write_text(
        "Metric,avg,min,max\r\nRequest Latency (ms),3652.1,3517.1,3954.0\r\n"
    )
    (folder / "gpu_telemetry_export.jsonl").write_text(json.dumps(TELEMETRY) + "\n" + json.dumps(TELEMETRY) + "\n")
    return folder


def _records() -> int:
    return sum(1 for line in AIPERF.read_text().splitlines() if line.strip())


def test_a_run_folder_loads_its_records_and_names_the_rest(run_folder, tmp_path):
    con = store.connect(tmp_path / "s.duckdb")
    results = ingest_paths(con, [run_folder])
    by_name = {Path(r.path).name: r for r in results}
    assert by_name["profile_export.jsonl"].accepted == _records()
    beside = [r for r in results if r.companion]
    assert sorted(Path(r.path).name for r in beside) == [
        "gpu_telemetry_export.jsonl",
        "profile_export_aiperf.csv",
        "profile_export_aiperf.json",
    ]
    assert loaded_nothing(results) == []
    assert all("profile_export.jsonl" in r.note and r.lines_read == 0 for r in beside)
    assert "aggregate" in by_name["profile_export_aiperf.json"].note
    assert "telemetry" in by_name["gpu_telemetry_export.jsonl"].note
    assert con.execute("select count(*) from rejects").fetchone()[0] == 0


def test_cli_exits_0_and_says_what_was_not_read(run_folder, tmp_path):
    code, out = cli("ingest", "--db", tmp_path / "s.duckdb", run_folder)
    assert code == 0, out
    assert "profile_export_aiperf.json: not read: AIPerf's aggregate statistics" in out
    assert "--format" not in out  # the hint for unknown files would lead nowhere here


def test_a_format_named_for_the_folder_leaves_the_companions_alone(run_folder, tmp_path):
    con = store.connect(tmp_path / "s.duckdb")
    results = ingest_paths(con, [run_folder], fmt="aiperf")
    assert sum(r.accepted for r in results) == _records()
    assert sum(r.rejected for r in results) == 0  # the aggregate was read as records: hundreds of rejects


def test_only_companions_named_is_an_error_that_points_at_the_records(run_folder, tmp_path):
    con = store.connect(tmp_path / "s.duckdb")
    with pytest.raises(InputError, match="nothing to ingest.*profile_export.jsonl"):
        ingest_paths(con, [run_folder / "profile_export_aiperf.json", run_folder / "gpu_telemetry_export.jsonl"])


def test_the_name_alone_makes_no_companion(tmp_path):
    """A canonical trace saved as profile_export_aiperf.json is read as what it holds."""
    f = tmp_path / "profile_export_aiperf.json"
    f.write_text(json.dumps({"kind": "iteration", "iter": 0, "t_start": 1.0, "t_end": 1.01}) + "\n")
    con = store.connect(tmp_path / "s.duckdb")
    (res,) = ingest_paths(con, [f])
    assert (res.companion, res.format, res.accepted) == (False, "jsonl", 1)


@pytest.mark.slow  # a whole night (6-7 s); loaded_nothing, which decides it, is checked above
def test_a_night_over_a_run_folder_passes(run_folder, tmp_path):
    code, out = cli("nightly", run_folder, "--history", tmp_path / "h")
    assert code == 0, out


def test_real_aiperf_folders(realdata, tmp_path):
    fixtures = realdata / "aiperf" / "tests" / "unit" / "plot" / "fixtures"
    code, out = cli("ingest", "--db", tmp_path / "s.duckdb", fixtures)
    assert code == 0, out
    lines = out.splitlines()
    read = [ln for ln in lines if "[aiperf]" in ln]
    assert len(read) == 3 and all(" 0 rejected" in ln for ln in read)
    assert sum(": not read: " in ln for ln in lines) == 6  # an aggregate and a telemetry file per run


@pytest.mark.long
def test_a_report_written_into_the_logs_folder_is_not_read(tmp_path):
    """`tracelat report --out logs/rep` then `tracelat ingest logs`: the report's summary.json was
    read as a vLLM bench result and stopped the ingest (exit 2, the server log after it unread)."""
    fix = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("server.log", "bench.json"):
        shutil.copy(fix / name, logs / name)
    db = tmp_path / "r.duckdb"
    code, out = cli("ingest", logs, "--run-id", "r", "--db", db)
    assert code == 0, out
    code, out = cli("report", "r", "--db", db, "--out", logs / "rep")
    assert code == 0, out
    assert sorted(p.name for p in (logs / "rep").iterdir()) == ["index.html", "summary.json", "summary.md"]
    code, out = cli("compare", "r", "r", "--db", db, "--out", logs / "cmp")
    assert code == 0, out
    code, out = cli("ingest", logs, "--run-id", "again", "--db", db)
    assert code == 0, out
    for name in ("index.html", "summary.json", "summary.md"):
        assert f"{logs / 'rep' / name}: not read: " in out, out
    for name in ("index.html", "comparison.json", "comparison.md"):
        assert f"{logs / 'cmp' / name}: not read: " in out, out
    con = store.connect(db, read_only=True)
    counts = con.execute("select run_id, count(*) from iterations group by run_id order by 1").fetchall()
    assert counts == [("again", 532), ("r", 532)]
    # a summary.json of another shape is no report of ours: still read (and refused) as what it looks like
    (logs / "rep" / "summary.json").write_text('{"date": "x", "duration": 1.0}\n')
    con.close()
    code, out = cli("ingest", logs / "rep" / "summary.json", "--db", db)
    assert code == 2 and "not read" not in out, out


@pytest.mark.parametrize(
    "name, head",
    [
        ("nightly.json", '{\n  "run_id": "2026-12-07",\n  "night": "2026-12-07",\n'),
        ("nightly.md", "## FAIL: tracelat nightly, night 2026-12-07 (2026-12-07)\n"),
        ("index.html", "<!DOCTYPE html>\n<html><head><title>tracelat nightly trend</title>"),
    ],
)
def test_a_nights_outputs_are_known_as_tracelat_s_own(name, head):
    """nightly --out inside the logs' folder (outputs/nightly.py writes these heads)."""
    from pipeline.ingest.companions import companion

    c = companion(Path(name), head)
    assert c is not None and c.instead == "" and "tracelat" in c.what
    assert companion(Path(name), head.replace("tracelat", "another tool").replace('"night"', '"nights"')) is None
