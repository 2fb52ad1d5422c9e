"""vLLM OpenTelemetry spans (OTLP JSON): server-side queue, TTFT and E2E per request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import store
from pipeline.ingest import detect, ingest_paths

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "otel" / "vllm-traces.jsonl"


def _attrs(span):
    return {a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}


def test_llm_request_spans_become_requests(tmp_path):
    assert detect(FIX).name == "otel"
    con = store.connect(tmp_path / "o.duckdb")
    res = ingest_paths(con, [FIX], run_id="o")[0]
    store.build_derived(con)
    spans = [
        s
        for line in FIX.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
        if s["name"] == "llm_request"
    ]
    got = {
        r[0]: r[1:]
        for r in con.execute(
            "select req_id, queue_ms, ttft_ms, e2e_ms, prompt_tokens, output_tokens from request_latency"
        ).fetchall()
    }
    checked = 0  # to a microsecond: unix seconds in a double hold 0.24 us
    for s in spans:
        a = _attrs(s)
        if "gen_ai.request.id" not in a:
            continue
        q, ttft, e2e, pt, ct = got[a["gen_ai.request.id"]]
        assert q == pytest.approx(1000 * a["gen_ai.latency.time_in_queue"], abs=1e-3)
        assert ttft == pytest.approx(1000 * a["gen_ai.latency.time_to_first_token"], abs=1e-3)
        assert e2e == pytest.approx(1000 * a["gen_ai.latency.e2e"], abs=1e-3)
        assert (pt, ct) == (int(a["gen_ai.usage.prompt_tokens"]), int(a["gen_ai.usage.completion_tokens"]))
        checked += 1
    assert checked == 3
    # 5 spans: 3 accepted, 1 rejected (no id), 1 other span skipped
    assert (res.lines_read, res.accepted, res.rejected, res.skipped) == (5, 3, 1, 1)
    assert con.execute("select reason, line_no from rejects").fetchall() == [
        ("vLLM llm_request span without gen_ai.request.id", 2)
    ]


def test_lines_that_are_not_traces_are_rejected(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(FIX.read_text().splitlines()[0] + '\n{"resourceSpans": [\n\n{"hello": 1}\n')
    con = store.connect(tmp_path / "t.duckdb")
    res = ingest_paths(con, [p], fmt="otel", run_id="t")[0]
    assert dict(con.execute("select line_no, reason from rejects").fetchall()) == {
        2: "not valid JSON (OTLP TracesData: one object per line, or one document)",
        4: "not an OTLP TracesData object (no resourceSpans list)",
    }
    assert res.lines_read == res.accepted + res.rejected + res.skipped


@pytest.mark.parametrize("gz", [False, True])
def test_a_pretty_printed_document_reads_like_its_lines(tmp_path, gz):
    """`jq .` or curl output: one TracesData document over many lines. Every line was rejected as
    invalid JSON; it holds the same spans as the line-per-object file."""
    import gzip

    docs = [json.loads(x) for x in FIX.read_text().splitlines() if x.strip()]
    merged = {"resourceSpans": [rs for d in docs for rs in d["resourceSpans"]]}
    text = json.dumps(merged, indent=2) + "\n"
    p = tmp_path / ("doc.json.gz" if gz else "doc.json")
    p.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    assert detect(p).name == "otel"
    con = store.connect(tmp_path / "d.duckdb")
    res = ingest_paths(con, [p], run_id="d")[0]
    ref_con = store.connect(tmp_path / "r.duckdb")
    ref = ingest_paths(ref_con, [FIX], run_id="d")[0]
    assert (res.accepted, res.rejected, res.skipped) == (ref.accepted, ref.rejected, ref.skipped) == (3, 1, 1)
    cols = "select req_id, t_arrival, t_scheduled, t_first_token, t_finish, prompt_tokens, output_tokens from requests order by 1"
    assert con.execute(cols).fetchall() == ref_con.execute(cols).fetchall()
    # a truncated document is one reject, not one per line
    p.write_text(text[: len(text) // 2])
    con2 = store.connect(tmp_path / "t.duckdb")
    res2 = ingest_paths(con2, [p], fmt="otel", run_id="t")[0]
    assert (res2.accepted, res2.rejected) == (0, 1)
    assert con2.execute("select line_no, reason from rejects").fetchall() == [
        (1, "not valid JSON (OTLP TracesData: one object per line, or one document)")
    ]
