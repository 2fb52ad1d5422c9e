"""A night is one run, also when the files name none: records that name no run get the night's
id, so two runs' files (two AIPerf exports of two concurrencies, two canonical traces without a
``run`` record) must fail the night instead of making one run of them, their throughput wrong."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from pipeline import store
from pipeline.ingest import ingest_paths

from .conftest import cli

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _aiperf_copy(dest: Path, shift_s: float, prefix: str) -> Path:
    """The AIPerf fixture as another run: ``shift_s`` later, its request ids prefixed."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for line in (FIXTURES / "aiperf" / "profile_export.jsonl").read_text().splitlines():
        rec = json.loads(line)
        meta = rec["metadata"]
        meta["x_request_id"] = prefix + str(meta["x_request_id"])
        for key in ("request_start_ns", "request_end_ns"):
            meta[key] += int(shift_s * 1e9)
        lines.append(json.dumps(rec))
    dest.write_text("\n".join(lines) + "\n")
    return dest


def _requests_per_s(path: Path) -> float:
    """ok requests / (last end - first start), straight from an AIPerf export."""
    meta = [json.loads(line)["metadata"] for line in path.read_text().splitlines()]
    span = (max(m["request_end_ns"] for m in meta) - min(m["request_start_ns"] for m in meta)) / 1e9
    return len(meta) / span


def _recorded(hist: Path, metric: str) -> list[tuple[str, float]]:
    con = duckdb.connect(str(hist / "history.duckdb"), read_only=True)
    try:
        return con.execute(
            "select run_id, value from nightly_history where metric = ? order by seq", [metric]
        ).fetchall()
    finally:
        con.close()


def test_two_aiperf_exports_are_two_runs_not_one_night(tmp_path, capsys):
    logs = tmp_path / "logs"
    c1 = _aiperf_copy(logs / "c1" / "profile_export.jsonl", 0.0, "a-")
    c2 = _aiperf_copy(logs / "c2" / "profile_export.jsonl", 30.0, "b-")
    # what `tracelat ingest DIR` makes of the folder: two runs
    con = store.connect(tmp_path / "ingest.duckdb")
    ingest_paths(con, [logs])
    assert sorted(store.known_runs(con)) == ["c1/profile_export", "c2/profile_export"]
    con.close()

    hist = tmp_path / "hist"
    code, _, err = cli(capsys, "nightly", str(logs), "--history", str(hist), "--label", "date=2026-11-01")
    assert code == 2 and err.startswith("Error: tonight's files hold 2 runs, not one: aiperf files of requests"), err
    assert f"run 'c1/profile_export': {c1}" in err and f"run 'c2/profile_export': {c2}" in err
    assert "--history of its own" in err
    assert not hist.exists()

    # each export alone is a night, with its own throughput (merged, the two made 40 requests over 37 s)
    for i, export in enumerate((c1, c2), start=1):
        code, _, err = cli(
            capsys, "nightly", str(export.parent), "--history", str(hist), "--label", f"date=2026-11-0{i}"
        )
        assert code == 0, err
    rps = _recorded(hist, "throughput.requests_per_s")
    assert [r for r, _ in rps] == ["2026-11-01", "2026-11-02"]
    for (_, value), export in zip(rps, (c1, c2)):
        # the store keeps epoch seconds as doubles: ns are rounded to about 0.2 us
        assert value == pytest.approx(_requests_per_s(export), rel=1e-6)


def test_two_canonical_request_files_without_run_records_fail_the_night(tmp_path, capsys):
    """Two clients' canonical request records of two runs, no ``run`` record: two runs for
    `tracelat ingest`, refused by the night (steps would collide anyway: a run has one step log)."""
    requests = [
        json.loads(ln) for ln in (FIXTURES / "canonical" / "tiny.jsonl").read_text().splitlines() if '"request"' in ln
    ]
    folder = tmp_path / "logs"
    folder.mkdir()
    for name, shift in (("a", 0.0), ("b", 100.0)):
        recs = [
            {
                k: f"{name}-{v}" if k == "req_id" else v + shift if k.startswith("t_") and v is not None else v
                for k, v in r.items()
            }
            for r in requests
        ]
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    hist = tmp_path / "hist"
    code, _, err = cli(capsys, "nightly", str(folder), "--history", str(hist))
    assert code == 2 and "hold 2 runs, not one: jsonl files of requests" in err, err
    assert f"run 'a': {folder / 'a.jsonl'}" in err and f"run 'b': {folder / 'b.jsonl'}" in err
    assert not hist.exists()


def test_a_server_log_and_its_client_records_are_one_night(tmp_path, capsys):
    """Files of one run in different formats (steps from the server, requests from the client)
    still make one night, without naming the run."""
    from pipeline.sim.split import scenario, write_engine_pair

    result, *_ = scenario("light", 7)
    logs = tmp_path / "logs"
    logs.mkdir()
    write_engine_pair(result, logs / "server.log", logs / "profile_export.jsonl")
    hist = tmp_path / "hist"
    code, stdout, err = cli(
        capsys, "nightly", str(logs), "--history", str(hist), "--label", "date=2026-11-01", "--json"
    )
    assert code == 0, err
    night = json.loads(stdout)
    assert night["source_run"] == "2026-11-01"
    con = duckdb.connect(str(hist / "runs" / Path(night["files"]["report"]).parent.name) + ".duckdb", read_only=True)
    try:
        exported = len((logs / "profile_export.jsonl").read_text().splitlines())
        assert con.execute("select count(distinct run_id), count(*) from requests").fetchone() == (1, exported)
        assert con.execute("select count(distinct run_id) from iterations").fetchone()[0] == 1
    finally:
        con.close()
