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


def _shifted(doc, shift_s: float, guidellm: bool):
    """Another client's results of the same run: every time ``shift_s`` later (a deep copy)."""
    doc = json.loads(json.dumps(doc))
    if guidellm:
        for reqs in doc["benchmarks"][0]["requests"].values():
            for r in reqs:
                tm = r["info"]["timings"]
                for k, v in tm.items():
                    if isinstance(v, float) and v > 1e9:
                        tm[k] = v + shift_s
    else:
        for r in doc:
            for k in ("start_time", "end_time"):
                if k in r:
                    r[k] += shift_s
            rm = r["info"]["response_metrics"]
            for k in ("chunk_times", "output_token_times"):
                if k in rm:
                    rm[k] = [t + shift_s for t in rm[k]]
    return doc


def _strip_ids(doc):
    for reqs in doc["benchmarks"][0]["requests"].values():
        for r in reqs:
            r.pop("request_id", None)
    return doc


@pytest.mark.parametrize("fmt", ["inference-perf", "guidellm-no-ids"])
@pytest.mark.long
def test_two_clients_with_positional_ids(tmp_path, fmt):
    """inference-perf (and guidellm without request_id) number requests by position: a second
    client's file of the run keeps its requests under ids named after the file; a copy of the
    same file is rejected as duplicates, not counted twice."""
    from pipeline.cli import run_captured

    guidellm = fmt.startswith("guidellm")
    doc = json.loads((GUIDELLM if guidellm else IPERF).read_text())
    if guidellm:
        doc = _strip_ids(doc)
    first, other = tmp_path / "first.json", tmp_path / "other.json"
    first.write_text(json.dumps(doc))
    other.write_text(json.dumps(_shifted(doc, 0.5, guidellm)))
    db = tmp_path / "s.duckdb"
    code, out = run_captured("ingest", first, other, "--run-id", "r", "--db", db)
    assert code == 0 and "named other.json#" in out, out
    con = store.connect(db)
    rows = con.execute("select req_id, t_arrival from requests order by t_arrival, req_id").fetchall()
    n = len(rows) // 2
    assert n > 0 and len(rows) == 2 * n
    mine = {r[0]: r[1] for r in rows if not r[0].startswith("other.json#")}
    theirs = {r[0].removeprefix("other.json#"): r[1] for r in rows if r[0].startswith("other.json#")}
    assert mine.keys() == theirs.keys() and len(mine) == n  # every request of both clients kept
    for k, t in mine.items():
        assert theirs[k] == pytest.approx(t + 0.5, abs=1e-9)
    con.close()
    copy = tmp_path / "copy.json"
    copy.write_text(json.dumps(doc, indent=1))
    code, out = run_captured("ingest", copy, "--run-id", "r", "--db", db)
    assert code == 2 and "rejected" in out, out
    con = store.connect(db)
    assert con.execute("select count(*) from requests").fetchall()[0][0] == 2 * n
    reasons = [r[0] for r in con.execute("select reason from rejects where path like '%copy.json'").fetchall()]
    assert sum("duplicate" in r for r in reasons) == n, reasons


def test_guidellm_request_ids_are_identities(tmp_path):
    """guidellm's own request_id names a request: a second file with the same ids is not renamed
    (its records are duplicates of the first file's requests)."""
    doc = json.loads(GUIDELLM.read_text())
    other = tmp_path / "other.json"
    other.write_text(json.dumps(_shifted(doc, 0.5, True)))
    con = store.connect(tmp_path / "s.duckdb")
    res = ingest_paths(con, [GUIDELLM, other], run_id="r")
    assert not any(r.notes for r in res)
    n = con.execute("select count(*) from requests").fetchall()[0][0]
    assert n == res[0].accepted and res[1].accepted == 0
    reasons = [r[0] for r in con.execute("select reason from rejects where path like '%other.json'").fetchall()]
    assert sum("duplicate" in r for r in reasons) == n, reasons
    assert con.execute("select count(*) from requests where req_id like 'other.json#%'").fetchall()[0][0] == 0
