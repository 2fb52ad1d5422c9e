"""The report's engine-metrics section: only for runs with Prometheus samples, drawn from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import store
from pipeline.summary import summary
from pipeline.ingest import ingest_paths
from pipeline.report.render import build_sections

FIX = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.mark.long
def test_engine_section_draws_the_scraped_gauges(tmp_path):
    con = store.connect(tmp_path / "r.duckdb")
    ingest_paths(
        con,
        [
            FIX / "vllm" / "server_epoch.log",
            FIX / "vllm" / "requests.jsonl",
            FIX / "prometheus" / "server_metrics_export.jsonl",
        ],
        run_id="j",
    )
    ingest_paths(con, [FIX / "canonical" / "tiny.jsonl"])  # its run record names it "tiny"
    store.build_derived(con)
    secs = {s.key: s for s in build_sections(con, "j", summary(con, "j"))}
    sec = secs["engine"]
    data = [row for rows in sec.charts["engine"]["datasets"].values() for row in rows]  # both panels' data
    # 3 scrapes x (running, waiting, KV usage)
    assert len(data) == 9 and {d["series"] for d in data} == {"running requests", "waiting requests", "KV usage %"}
    assert max(d["value"] for d in data if d["series"] == "KV usage %") == 35.0
    assert "p50 77.78 (bucket 50..100)" in sec.body
    assert "engine" not in {s.key for s in build_sections(con, "tiny", summary(con, "tiny"))}


def test_queue_chart_comes_from_the_gauges_when_the_steps_carry_none(tmp_path):
    """An LLMServingSim bench folder: requests and per-second engine gauges, no steps. The queue
    section draws the gauges (it said "not available" above a section listing them); the engine
    section keeps its numbers and does not draw the same chart twice."""
    con = store.connect(tmp_path / "r.duckdb")
    ingest_paths(con, [FIX / "llmservingsim"], run_id="lss")
    store.build_derived(con)
    assert con.execute("select count(*) from iterations where run_id = 'lss'").fetchone()[0] == 0
    secs = {s.key: s for s in build_sections(con, "lss", summary(con, "lss"))}
    queue, engine = secs["queue"], secs["engine"]
    assert not queue.missing and "Prometheus gauges" in queue.intro
    data = [row for rows in queue.charts["queue"]["datasets"].values() for row in rows]
    running = con.execute(
        "select t, value from metric_samples where run_id = 'lss' and family = 'vllm:num_requests_running' order by t"
    ).fetchall()
    drawn = sorted((d["t_s"], d["value"]) for d in data if d["series"] == "running requests")
    assert [v for _, v in drawn] == [v for _, v in running] and len(running) > 1
    assert "engine" not in engine.charts and "running_reqs: mean" in engine.body
    # no steps: the tail is all "unattributed", which the page says in words, not as a 100% bar
    assert "tail" not in secs["tail"].charts
    assert secs["tail"].missing == ["tail attribution: not available: the run has no steps (iteration records)"]
