"""vLLM per-request stats: LLMServingSim's real vLLM 0.19 runs and our CPU recording."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest


from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
RUN = "llmservingsim/bench/examples/RTX4090/Llama-3.1-8B/vllm"


def independent(path: Path) -> dict[str, np.ndarray]:
    """Plain numpy over the JSON: the clock offset is max(arrival - queued) (see vllm_requests)."""
    recs = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    a = np.array([r["arrival_time"] for r in recs])
    q, s, f, l = (
        np.array([r[k] for r in recs]) for k in ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
    )
    n = np.array([r["output_toks"] for r in recs])
    arrival_mono = a - (a - q).max()
    ok = n > 1
    return {
        "ttft_ms": (f - arrival_mono) * 1000,
        "queue_ms": (s - arrival_mono) * 1000,
        "tpot_ms": ((l - f) * 1000 / (n - 1))[ok],
        "e2e_ms": (l - arrival_mono) * 1000,
    }


@pytest.mark.parametrize("metric", ["ttft_ms", "tpot_ms", "queue_ms", "e2e_ms"])
def test_realdata_percentiles_equal_numpy(con, realdata, metric):
    path = realdata / RUN / "requests.jsonl"
    (res,) = load(con, path)
    assert (res.format, res.accepted, res.rejected) == ("vllm-requests", 300, 0)
    want = independent(path)[metric]
    # an LLMServingSim bench folder (meta.json beside): the run is named after the folder
    assert res.run_ids == [path.parent.name]
    got = con.execute(
        "select count, mean, p50, p90, p99, max from metric_stats where run_id = ? and metric = ?",
        [path.parent.name, metric],
    ).fetchall()[0]
    assert got[0] == len(want)
    np.testing.assert_allclose(
        got[1:], [want.mean(), *np.percentile(want, [50, 90, 99]), want.max()], rtol=1e-9, atol=1e-6
    )


def test_realdata_run_facts_from_meta_json(con, realdata):
    load(con, realdata / RUN / "requests.jsonl")
    ver, model, gpu, dtype, clock, meta = con.execute(
        "select engine_version, model, gpu, dtype, clock, meta from runs"
    ).fetchall()[0]
    meta = json.loads(meta)
    assert (ver, model, gpu, dtype, clock) == (
        "0.19.0",
        "meta-llama/Llama-3.1-8B",
        "NVIDIA GeForce RTX 4090",
        "bfloat16",
        "unix",
    )
    assert (meta["max_num_seqs"], meta["max_num_batched_tokens"], meta["kv_cache_tokens"]) == (256, 2048, 41408)
    # arrival_time is kept exactly; queued/scheduled/... moved by one offset
    first = json.loads((realdata / RUN / "requests.jsonl").read_text().splitlines()[0])
    t_arr, t_q = con.execute(
        "select t_arrival, t_queued from requests r, lateral (select (extra->>'t_queued')::double as t_queued) "
        "where req_id = ?",
        [first["request_id"]],
    ).fetchall()[0]
    assert t_arr == first["arrival_time"]
    assert t_q - first["queued_ts"] == pytest.approx(meta["monotonic_to_unix_s"], abs=1e-6)


def test_recorded_run_preemptions_and_tokens(con):
    path = FIX / "requests.jsonl"
    load(con, path)
    recs = [json.loads(l) for l in path.read_text().splitlines()]
    got = con.execute(
        "select sum(preemptions), sum(output_tokens), count(*) filter (status = 'ok') from requests"
    ).fetchall()[0]
    assert got == (sum(r["num_preemptions"] for r in recs), sum(r["output_toks"] for r in recs), len(recs))
    assert got[0] > 0  # the small KV cache of the recording forced preemptions


def test_broken_lines(con, tmp_path):
    lines = (FIX / "requests.jsonl").read_text().splitlines()
    lines[2] = lines[2][:60]  # truncated
    rec = json.loads(lines[4])
    rec.pop("first_token_ts")
    lines[4] = json.dumps(rec)  # field missing
    rec = json.loads(lines[5])
    rec["first_token_ts"] = 0.0
    lines[5] = json.dumps(rec)  # never got a token
    lines.insert(7, "")
    path = tmp_path / "req.jsonl"
    path.write_text("\n".join(lines) + "\n")
    (res,) = load(con, path)
    rej = dict(con.execute("select line_no, reason from rejects").fetchall())
    assert rej == {3: "not valid JSON (truncated or garbage line)", 5: "vLLM request stats without first_token_ts"}
    assert res.skipped == 1 and res.lines_read == res.accepted + res.rejected + res.skipped
    assert con.execute("select status, t_first_token from requests where line_no = 6").fetchall() == [("error", None)]


def test_one_line_on_another_clock_is_rejected_and_moves_nothing(con, tmp_path):
    lines = (FIX / "requests.jsonl").read_text().splitlines()
    good = tmp_path / "good" / "requests.jsonl"
    good.parent.mkdir()
    good.write_text("\n".join(l for i, l in enumerate(lines) if i not in (10, 20)) + "\n")
    for i, shift in ((10, None), (20, 500.0)):  # queued_ts = 1.0 (the case); 500 s late
        rec = json.loads(lines[i])
        rec["queued_ts"] = 1.0 if shift is None else rec["queued_ts"] + shift
        lines[i] = json.dumps(rec)
    bad = tmp_path / "requests.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    (res,) = load(con, bad)
    assert (res.accepted, res.rejected) == (len(lines) - 2, 2)
    recs = [json.loads(l) for l in lines]
    median = float(np.median([r["arrival_time"] - r["queued_ts"] for r in recs]))
    reasons = dict(con.execute("select line_no, reason from rejects").fetchall())
    assert set(reasons) == {11, 21}
    for reason in reasons.values():
        assert reason.startswith("queued_ts ") and f"expected about {median:.6f} s" in reason
    # the others are mapped as if the two lines had never been there
    ids = [json.loads(l)["request_id"] for l in good.read_text().splitlines()]
    want = dict(zip(ids, independent(good)["ttft_ms"]))
    got = dict(con.execute("select req_id, ttft_ms from request_latency").fetchall())
    assert got.keys() == want.keys()
    # 1 us: Unix-time doubles resolve 0.24 us, and the two computations round differently
    np.testing.assert_allclose([got[r] for r in ids], [want[r] for r in ids], rtol=0, atol=1e-3)
