"""The report's engine-metrics section: only for runs with Prometheus samples, drawn from them."""

from __future__ import annotations

from pathlib import Path

from pipeline import store
from pipeline.summary import summary
from pipeline.ingest import ingest_paths
from pipeline.report.render import build_sections

FIX = Path(__file__).resolve().parents[2] / "fixtures"


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
