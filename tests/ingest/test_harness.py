"""guidellm and inference-perf per-request results: mapping checked against the files themselves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline import store
from pipeline.ingest import detect, ingest_paths

FIX = Path(__file__).resolve().parents[2] / "fixtures"
GUIDELLM = FIX / "guidellm" / "benchmarks.json"
IPERF = FIX / "inference_perf" / "per_request_lifecycle_metrics.json"


def _load(tmp_path, path, name="h"):
    con = store.connect(tmp_path / "h.duckdb")
    res = ingest_paths(con, [path], run_id=name)
    store.build_derived(con)
    return con, res[0]


def test_guidellm_requests(tmp_path):
    assert detect(GUIDELLM).name == "guidellm"
    con, res = _load(tmp_path, GUIDELLM)
    doc = json.loads(GUIDELLM.read_text())
    succ = doc["benchmarks"][0]["requests"]["successful"][:3]
    got = con.execute("select req_id, ttft_ms, tpot_ms, status from request_latency order by req_id").fetchall()
    by = {r[0]: r for r in got}
    for q in succ:
        tm = q["info"]["timings"]
        assert by[q["request_id"]][1] == pytest.approx(1000 * (tm["first_token_iteration"] - tm["request_start"]))
        # guidellm's "inter_token_latency_ms" is our TPOT
        out = q["output_metrics"]["total_tokens"]
        assert by[q["request_id"]][2] == pytest.approx(
            1000 * (tm["last_token_iteration"] - tm["first_token_iteration"]) / (out - 1)
        )
    assert by["req-3"][3] == "aborted" and by["req-4"][3] == "error"
    assert (res.lines_read, res.accepted, res.rejected) == (6, 5, 1)
    reason = con.execute("select reason from rejects").fetchone()[0]
    assert reason == "guidellm request without info.timings.request_start"


def test_inference_perf_requests(tmp_path):
    assert detect(IPERF).name == "inference-perf"
    con, res = _load(tmp_path, IPERF)
    doc = json.loads(IPERF.read_text())
    rows = con.execute(
        "select req_id, t_arrival, t_first_token, t_finish, prompt_tokens, output_tokens, status "
        "from requests order by req_id"
    ).fetchall()
    assert rows[0][1:] == (
        doc[0]["start_time"],
        doc[0]["info"]["response_metrics"]["output_token_times"][0],
        doc[0]["end_time"],
        256,
        4,
        "ok",
    )
    assert rows[1][4] == 100  # request_metrics.text.input_tokens
    assert rows[2][6] == "error" and rows[2][2] is None
    itl = con.execute("select itl_ms from token_gaps where req_id = '0' order by 1").fetchnumpy()["itl_ms"]
    assert np.allclose(np.sort(itl), np.sort(np.diff(doc[0]["info"]["response_metrics"]["output_token_times"]) * 1000))
    assert (res.lines_read, res.accepted, res.rejected) == (4, 3, 1)
    assert con.execute("select clock from runs").fetchone()[0] == "monotonic"  # perf_counter seconds


def test_broken_documents_are_clear_errors(tmp_path):
    from pipeline.errors import InputError

    p = tmp_path / "benchmarks.json"
    p.write_text('{"benchmarks": [{"requests": {"successful": [1, 2]}}], "metadata": {"guidellm_version": "x"}}')
    with pytest.raises(InputError, match="not objects"):
        _load(tmp_path, p)
    q = tmp_path / "lifecycle.json"
    q.write_text('{"start_time": 1}')
    with pytest.raises(InputError, match="must be a JSON list"):
        ingest_paths(store.connect(tmp_path / "q.duckdb"), [q], fmt="inference-perf")
