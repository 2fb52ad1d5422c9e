"""Edges of the 2026 formats (issue 14): each damaged line is rejected with its exact reason and
line number, each unreadable document is one clear error, the good lines still load; a guidellm
sweep gives one run per benchmark."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest

from pipeline import store
from pipeline.errors import InputError
from pipeline.ingest import ingest_paths

FIX = Path(__file__).resolve().parents[2] / "fixtures"


def _ingest(tmp_path, name: str, text: str, fmt: str | None = None):
    p = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(p, "wt") as fh:
            fh.write(text)
    else:
        p.write_text(text)
    con = store.connect(tmp_path / "b.duckdb")
    res = ingest_paths(con, [p], fmt=fmt, run_id="b")[0]
    return con, res, dict(con.execute("select line_no, reason from rejects").fetchall())


def test_aiperf_server_metrics_rejects(tmp_path):
    good = (FIX / "prometheus" / "server_metrics_export.jsonl").read_text().splitlines()[:2]
    text = "\n".join([*good, '{"endpoint_url": "x", "timestamp_', '{"endpoint_url": "x", "metrics": {}}', ""]) + "\n"
    con, res, rej = _ingest(tmp_path, "server_metrics_export.jsonl", text)
    assert res.format == "aiperf-server-metrics"
    assert rej == {
        3: "not valid JSON (one AIPerf server-metrics record per line)",
        4: "AIPerf server-metrics record without timestamp_ns or metrics",
    }
    assert (res.lines_read, res.accepted, res.rejected, res.skipped) == (5, 2, 2, 1)
    assert con.execute("select count(distinct t) from metric_samples").fetchall() == [(2,)]


def test_the_fixtures_own_reject_is_the_truncated_scrape(tmp_path):
    con = store.connect(tmp_path / "f.duckdb")
    ingest_paths(con, [FIX / "prometheus" / "server_metrics_export.jsonl"], run_id="f")
    assert con.execute("select line_no, reason from rejects").fetchall() == [
        (4, "not valid JSON (one AIPerf server-metrics record per line)")
    ]


def test_text_exposition_rejects(tmp_path):
    snap = (FIX / "prometheus" / "vllm-0_metrics.log").read_text().splitlines()[:13]
    lines = ["vllm:num_requests_running 3", *snap, 'vllm:num_requests_running{model_name="t"} three', "garbage line"]
    con, res, rej = _ingest(tmp_path, "metrics.log", "\n".join(lines) + "\n", fmt="prometheus-text")
    assert rej == {
        1: "sample before any '# Timestamp:' line",
        15: "not a Prometheus sample line (name{labels} value)",
        16: "not a Prometheus sample line (name{labels} value)",
    }
    assert (res.lines_read, res.accepted, res.rejected, res.skipped) == (16, 9, 3, 4)  # 4 comment lines


def test_query_range_documents(tmp_path):
    good = (FIX / "prometheus" / "query_range.json").read_text()
    con, res, rej = _ingest(tmp_path, "q.json.gz", good)  # compressed: read like any document
    n = sum(len(r["values"]) for r in json.loads(good)["data"]["result"])
    assert res.format == "prometheus-range" and rej == {}
    assert con.execute("select count(*) from metric_samples").fetchall() == [(n,)]
    for text, message in (
        (good[:70], r"q\.json:1: not a JSON document \(Unterminated string"),
        (
            '{"status": "error", "errorType": "bad_data", "error": "parse error at char 4"}',
            r"q\.json: Prometheus answered this query with an error \(bad_data: parse error at char 4\); "
            "it holds no samples",
        ),
        ("[1, 2]", r"q\.json: not a Prometheus query_range answer \(a JSON list, not an object\)"),
    ):
        sub = tmp_path / f"case{len(text)}"
        sub.mkdir()
        with pytest.raises(InputError, match=message):
            _ingest(sub, "q.json", text, fmt="prometheus-range")
        assert store.connect(sub / "b.duckdb").execute("select count(*) from metric_samples").fetchall() == [(0,)]


def test_sglang_request_metrics_rejects(tmp_path):
    src = (FIX / "sglang" / "sglang-request-metrics-20260301_10.log").read_text().splitlines()
    no_ts = json.loads(src[1])
    del no_ts["request_received_ts"]
    no_id = json.loads(src[2])
    no_id.pop("id", None)
    no_id.pop("rid", None)
    text = "\n".join([src[0], json.dumps(no_ts), json.dumps(no_id), src[0][:50]]) + "\n"
    con, res, rej = _ingest(tmp_path, "sglang-request-metrics-20260301_11.log", text)
    assert res.format == "sglang-metrics"
    assert rej == {
        2: "SGLang request metrics without request_received_ts",
        3: "SGLang request metrics without id",
        4: "not valid JSON (truncated or garbage line)",
    }
    assert con.execute("select req_id from requests").fetchall() == [(json.loads(src[0])["id"],)]


def test_inference_perf_reject_names_the_field(tmp_path):
    con = store.connect(tmp_path / "i.duckdb")
    res = ingest_paths(con, [FIX / "inference_perf" / "per_request_lifecycle_metrics.json"], run_id="i")[0]
    # the fixture's fourth record has no start_time (records are "lines" 1..n of the list)
    assert con.execute("select line_no, reason from rejects").fetchall() == [
        (4, "inference-perf request without start_time")
    ]
    assert (res.accepted, res.rejected) == (3, 1)


def test_guidellm_sweep_gives_one_run_per_benchmark(tmp_path):
    doc = json.loads((FIX / "guidellm" / "benchmarks.json").read_text())
    second = copy.deepcopy(doc["benchmarks"][0])
    for kind in ("successful", "incomplete", "errored"):
        for r in second["requests"].get(kind, []):
            r["request_id"] = "b2-" + r["request_id"]
    doc["benchmarks"].append(second)
    p = tmp_path / "benchmarks.json"
    p.write_text(json.dumps(doc))
    con = store.connect(tmp_path / "g.duckdb")
    (res,) = ingest_paths(con, [p], run_id="sweep")
    assert res.run_ids == ["sweep-1", "sweep-2"]
    n = sum(len(doc["benchmarks"][0]["requests"].get(k, [])) for k in ("successful", "incomplete", "errored"))
    got = dict(con.execute("select run_id, count(*) from requests group by 1").fetchall())
    rejected = 1  # the fixture's request without request_start, once per benchmark
    assert got == {"sweep-1": n - rejected, "sweep-2": n - rejected}
    assert con.execute(
        "select count(*) from requests where run_id = 'sweep-2' and req_id not like 'b2-%'"
    ).fetchall() == [(0,)]
