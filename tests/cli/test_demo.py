"""`tracelat demo`: the README's main job, end to end on the bundled incident."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "fixtures" / "demo"


@pytest.mark.long
def test_demo_ingests_summarises_and_writes_report(tmp_path):
    out = tmp_path / "rep"
    r = subprocess.run(
        [sys.executable, "-m", "pipeline", "demo", "--db", str(tmp_path / "d.duckdb"), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert f"report: {out / 'index.html'}" in r.stdout
    summary = json.loads((out / "summary.json").read_text())
    truth = json.loads((DEMO / "incident.truth.json").read_text())
    # the report's numbers are those of the bundled trace (counts from the truth file)
    assert summary["iterations"] == truth["result"]["iterations"]
    assert summary["requests"] == truth["result"]["requests"]
    # and the fit recovers the simulated hardware-consistent model within 3%
    fit = summary["fit"]
    assert fit["t0_ms"] == pytest.approx(truth["model"]["t0_ms"], rel=0.03)
    assert fit["ms_per_1k_context_tokens"] == pytest.approx(truth["model"]["a_ms_per_ctx"] * 1000, rel=0.03)
    assert fit["ms_per_1k_prefill_tokens"] == pytest.approx(truth["model"]["b_ms_per_prefill"] * 1000, rel=0.03)
    assert "<html" in (out / "index.html").read_text()[:500].lower()


@pytest.mark.slow  # the demo twice, in subprocesses; CI runs it with -m slow (the default run stays near 5 minutes)
def test_demo_again_after_other_ingests_summarises_its_own_run(tmp_path):
    db = str(tmp_path / "d.duckdb")
    tiny = Path(__file__).resolve().parents[2] / "fixtures" / "canonical" / "tiny.jsonl"
    args = [sys.executable, "-m", "pipeline"]
    subprocess.run(args + ["ingest", str(DEMO / "incident.jsonl.gz"), "--db", db], check=True, capture_output=True)
    subprocess.run(args + ["ingest", str(tiny), "--db", db], check=True, capture_output=True)
    r = subprocess.run(args + ["demo", "--db", db, "--out", str(tmp_path / "rep")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "unchanged" in r.stdout and "run demo-incident:" in r.stdout


@pytest.mark.slow  # the demo and simulate, in subprocesses; CI runs it with -m slow (the default run stays near 5 minutes)
def test_simulate_after_demo_is_its_own_run_and_replaces_the_last(tmp_path):
    from pipeline.cli import run_captured

    db = tmp_path / "d.duckdb"
    code, out = run_captured("demo", "--db", db, "--out", tmp_path / "r0")
    assert code == 0, out
    seen = []
    for k in (1, 2):
        code, out = run_captured("demo", "--simulate", "--db", db, "--out", tmp_path / f"r{k}")
        assert code == 0, out
        assert " 0 rejected" in out and "run demo-simulated:" in out, out
        seen.append(json.loads((tmp_path / f"r{k}" / "summary.json").read_text()))
    assert [s["run_id"] for s in seen] == ["demo-simulated"] * 2
    code, out = run_captured("runs", "--json", "--db", db)
    assert sorted(r["run_id"] for r in json.loads(out)) == ["demo-incident", "demo-simulated"]
    code, out = run_captured("rejects", "--json", "--db", db)
    assert code == 0 and json.loads(out)["total"] == 0, out
    # the second simulation replaced the first: the stored run is the last one written
    code, out = run_captured("summary", "demo-simulated", "--json", "--db", db)
    stored = json.loads(out)["ttft_ms"]["p50"]
    assert stored == seen[1]["ttft_ms"]["p50"] != seen[0]["ttft_ms"]["p50"]
