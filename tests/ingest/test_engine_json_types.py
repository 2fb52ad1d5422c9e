"""Engine JSON converters: a number written as a JSON string ("0.007", "12") is rejected with a
reason naming the field, as the canonical format rejects it, never read as a number (and a
non-numeric string never read as absent).  Every dropped record is a counted reject.

Each case quotes one value of one record of a fixture; the others must load as before.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures"
QUOTED = "(a string: write the number without quotes)"


def _jsonl(name):
    return [json.loads(x) for x in (FIX / name).read_text().splitlines() if x.strip()]


def _quote(rec, path):
    *head, last = path
    for k in head:
        rec = rec[k]
    rec[last] = str(rec[last])


def _edit_jsonl(name, idx, path):
    recs = _jsonl(name)
    _quote(recs[idx], path)
    return "".join(json.dumps(r) + "\n" for r in recs)


def _edit_doc(name, edit):
    doc = json.loads((FIX / name).read_text())
    edit(doc)
    return json.dumps(doc)


CASES = {
    "vllm-requests": (
        "vllm/requests.jsonl",
        lambda: _edit_jsonl("vllm/requests.jsonl", 1, ["input_toks"]),
        2,
        'input_toks: expected an integer, got "',
    ),
    "aiperf": (
        "aiperf/profile_export.jsonl",
        lambda: _edit_jsonl("aiperf/profile_export.jsonl", 1, ["metrics", "time_to_first_token", "value"]),
        2,
        'metrics.time_to_first_token.value: expected a number, got "',
    ),
    "aiperf-list": (
        "aiperf/profile_export.jsonl",
        lambda: _edit_jsonl("aiperf/profile_export.jsonl", 1, ["metrics", "inter_chunk_latency", "value", 0]),
        2,
        "metrics.inter_chunk_latency.value: expected a list of numbers, got [",
    ),
    "sglang-metrics": (
        "sglang/sglang-request-metrics-20260301_10.log",
        lambda: _edit_jsonl("sglang/sglang-request-metrics-20260301_10.log", 1, ["completion_tokens"]),
        2,
        'completion_tokens: expected an integer, got "',
    ),
    "fpm": (
        "fpm/fpm-relay-w0.jsonl",
        lambda: _edit_jsonl("fpm/fpm-relay-w0.jsonl", 1, ["wall_time"]),
        2,
        'wall_time: expected a number, got "',
    ),
    "trtllm": (
        "trtllm/metrics.json",
        lambda: _edit_doc("trtllm/metrics.json", lambda d: _quote(d[1], ["iterLatencyMS"])),
        2,
        'iterLatencyMS: expected a number, got "',
    ),
    "vllm-bench": (
        "vllm/bench.json",
        lambda: _edit_doc("vllm/bench.json", lambda d: _quote(d, ["ttfts", 1])),
        2,
        'vllm bench entry: ttfts: expected a number, got "',
    ),
    "vllm-bench-itls": (
        "vllm/bench.json",
        lambda: _edit_doc("vllm/bench.json", lambda d: _quote(d, ["itls", 1, 0])),
        2,
        "vllm bench entry: itls: expected a list of numbers, got [",
    ),
    "genai-perf": (
        "genai_perf/profile_export.json",
        lambda: _edit_doc(
            "genai_perf/profile_export.json", lambda d: _quote(d["experiments"][0]["requests"][0], ["timestamp"])
        ),
        1,
        'GenAI-Perf timestamp is not an integer (ns): "',
    ),
    "guidellm": (
        "guidellm/benchmarks.json",
        lambda: _edit_doc(
            "guidellm/benchmarks.json",
            lambda d: _quote(d["benchmarks"][0]["requests"]["successful"][0], ["input_metrics", "total_tokens"]),
        ),
        1,
        'input_metrics.total_tokens: expected an integer, got "',
    ),
    "inference-perf": (
        "inference_perf/per_request_lifecycle_metrics.json",
        lambda: _edit_doc("inference_perf/per_request_lifecycle_metrics.json", lambda d: _quote(d[0], ["start_time"])),
        1,
        'start_time: expected a number, got "',
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.long
def test_number_in_quotes_is_a_reject_naming_the_field(con, tmp_path, case):
    fixture, edited, line, reason = CASES[case]
    ref_path = FIX / fixture
    bad = tmp_path / ref_path.name
    bad.write_text(edited())
    (ref,) = load(con, ref_path, run_id="ref")
    (res,) = load(con, bad, run_id="bad")
    assert res.format == ref.format
    # one reject more, one record fewer (FPM: a rank line fewer merged into its step, which stays)
    assert res.rejected == ref.rejected + 1, res.line()
    assert res.accepted + res.skipped == ref.accepted + ref.skipped - 1, res.line()
    got = dict(
        con.execute(
            "select line_no, reason from rejects where ingest_id = (select max(ingest_id) from rejects)"
        ).fetchall()
    )
    assert got[line].startswith(reason), got
    if '"' in reason[-2:] or reason.endswith("got ["):
        assert QUOTED in got[line] or "without quotes" in got[line]


def test_a_vllm_bench_count_too_large_is_named_as_such(con, tmp_path):
    """It was "a value of the wrong type in: input_lens (... a number in quotes is a string)" for a number
    that is only too large, and the value was not shown."""
    doc = json.loads((FIX / "vllm" / "bench.json").read_text())
    doc["input_lens"][2] = 10**30
    bad = tmp_path / "bench.json"
    bad.write_text(json.dumps(doc))
    (res,) = load(con, bad, run_id="big")
    assert res.rejected == 1, res.line()
    (reason,) = con.execute("select reason from rejects where line_no = 3").fetchall()[0]
    assert reason == f"vllm bench entry: input_lens: {10**30} is out of range for an integer", reason
