"""tracelat report --calibrate: the replay calibration in the HTML report and summary.json."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from pipeline import ingest, store
from pipeline.cli import run_captured
from pipeline.escape import md_text

VLLM = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"


@pytest.fixture(scope="module")
def calibrated(steady_db, tmp_path_factory):
    out = tmp_path_factory.mktemp("rep")
    code, text = run_captured("report", "steady", "--db", steady_db, "--out", out, "--calibrate", "2")
    assert code == 0, text
    return out


@pytest.mark.long
def test_report_shows_the_same_calibration_as_replay(steady_db, calibrated):
    summary = json.loads((calibrated / "summary.json").read_text())
    cal = summary["replay_calibration"]
    code, text = run_captured("replay", "steady", "--db", steady_db, "--json", "--seeds", "2")
    assert code == 0, text
    want = json.loads(text)["calibration_report"]
    assert cal["available"] and cal["seeds"] == [0, 1]
    assert cal["rows"] == want["rows"] and cal["verdict"] == want["verdict"]
    page = (calibrated / "index.html").read_text()
    assert "Replay calibration" in page and html.escape(want["verdict"], quote=True) in page
    # one table row per metric and statistic, with the error the replay computed
    ttft_p99 = next(r for r in want["rows"] if (r["metric"], r["stat"]) == ("ttft_ms", "p99"))
    assert f"{ttft_p99['rel_error'] * 100:+.1f}%" in page
    # and the request-by-request errors
    assert cal["per_request"] == want["per_request"]
    assert "Request by request" in page and f"{want['per_request']['e2e_ms']['mape'] * 100:.1f}%" in page
    # summary.md (PR comments, nightly logs) carries the verdict and the largest error too
    md = (calibrated / "summary.md").read_text()
    rows = [r for r in want["rows"] if r["rel_error"] is not None]
    worst = max(rows, key=lambda r: abs(r["rel_error"]))
    within = sum(bool(r["within_tol"]) for r in rows)
    assert f"**Replay calibration** (2 seed(s), recorded policy): {md_text(want['verdict'], 400)}" in md
    assert (
        f"{within} of {len(rows)} statistics within tolerance; largest error "
        f"{md_text(worst['metric'])} {worst['stat']} {worst['rel_error'] * 100:+.1f}%"
    ) in md


def test_report_without_calibrate_has_no_calibration(steady_db, tmp_path):
    code, text = run_captured("report", "steady", "--db", steady_db, "--out", tmp_path)
    assert code == 0, text
    assert "replay_calibration" not in json.loads((tmp_path / "summary.json").read_text())
    assert "calibration" not in (tmp_path / "summary.md").read_text()
    assert "Replay calibration" not in (tmp_path / "index.html").read_text()


def test_a_run_that_cannot_be_replayed_says_why(tmp_path):
    con = store.connect(tmp_path / "s.duckdb")
    ingest.ingest_paths(con, [VLLM / "server_epoch.log"], run_id="steps-only")  # steps, no request records
    store.build_derived(con)
    con.close()
    code, text = run_captured(
        "report", "steps-only", "--db", tmp_path / "s.duckdb", "--out", tmp_path / "r", "--calibrate"
    )
    assert code == 0, text
    cal = json.loads((tmp_path / "r" / "summary.json").read_text())["replay_calibration"]
    assert cal["available"] is False and "request" in cal["reason"]
    assert "replay calibration not available" in (tmp_path / "r" / "index.html").read_text()
    md = (tmp_path / "r" / "summary.md").read_text()
    assert "**Replay calibration**: not available (" in md and cal["reason"][:40] in md


@pytest.mark.long
def test_report_calibration_with_slo_shows_goodput_as_replay(steady_db, tmp_path):
    slo = tmp_path / "slo.toml"
    slo.write_text("[goodput]\nttft_ms = 60\n[slo]\nttft_ms.p99 = 1000\n")
    code, text = run_captured(
        "report", "steady", "--db", steady_db, "--out", tmp_path / "rep", "--calibrate", "1", "--slo", slo
    )
    assert code == 0, text
    cal = json.loads((tmp_path / "rep" / "summary.json").read_text())["replay_calibration"]
    code, text = run_captured("replay", "steady", "--db", steady_db, "--json", "--seeds", "1", "--slo", slo)
    assert code == 0, text
    want = json.loads(text)["calibration_report"]["goodput"]
    assert want and cal["goodput"] == want
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "Goodput under the SLO file" in page
