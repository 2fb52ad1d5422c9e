"""vllm bench serve --save-detailed JSON: our TTFT/TPOT/ITL equal vLLM's own numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import InputError

from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
BENCH = FIX / "bench.json"


def stat(con, run_id, metric, col):
    return con.execute(f"select {col} from metric_stats where run_id = ? and metric = ?", [run_id, metric]).fetchall()[
        0
    ][0]


def test_detected_and_every_request_accepted(con):
    doc = json.loads(BENCH.read_text())
    (res,) = load(con, BENCH)
    assert res.format == "vllm-bench"
    n = len(doc["ttfts"])
    assert (res.lines_read, res.accepted, res.rejected) == (
        n,
        n,
        0,
    )  # the converter's run record is no entry of the file
    assert con.execute("select count(*) from tokens").fetchall()[0][0] == sum(len(i) + 1 for i in doc["itls"])


@pytest.mark.parametrize("metric", ["ttft", "tpot", "itl"])
def test_stats_equal_vllm_reported(con, metric):
    """Acceptance: mean, median, p99 equal mean_*_ms, median_*_ms, p99_*_ms of the same file (1e-6 rel)."""
    doc = json.loads(BENCH.read_text())
    load(con, BENCH)
    for ours, theirs in (("mean", "mean"), ("p50", "median"), ("p99", "p99")):
        got = stat(con, "bench", f"{metric}_ms", ours)
        want = doc[f"{theirs}_{metric}_ms"]
        assert got == pytest.approx(want, rel=1e-6), (metric, ours)


def test_run_metadata(con):
    load(con, BENCH)
    model, clock, meta = con.execute("select model, clock, meta from runs").fetchall()[0]
    meta = json.loads(meta)
    assert (model, clock) == ("tiny-llama", "monotonic")
    assert meta["num_prompts"] == 64 and meta["request_rate"] == 16.0
    assert meta["reported"]["p99_ttft_ms"] == json.loads(BENCH.read_text())["p99_ttft_ms"]


def _variant(tmp_path: Path, edit) -> Path:
    doc = json.loads(BENCH.read_text())
    edit(doc)
    out = tmp_path / "variant.json"
    out.write_text(json.dumps(doc))
    return out


def test_failed_requests_become_errors_not_latencies(con, tmp_path):
    def fail(doc):
        for i in (3, 10):
            doc["ttfts"][i], doc["itls"][i], doc["output_lens"][i] = 0.0, [], 0
            doc["errors"][i] = "Bad Request" if i == 3 else ""

    path = _variant(tmp_path, fail)
    load(con, path)
    doc = json.loads(path.read_text())
    bad = dict(con.execute("select req_id, status from requests where status <> 'ok'").fetchall())
    assert bad == {"3": "error", "10": "error"}
    assert con.execute("select t_first_token, t_finish, output_tokens from requests where req_id = '3'").fetchall() == [
        (None, None, None)
    ]
    ok = [i for i in range(len(doc["ttfts"])) if i not in (3, 10)]
    ttfts = np.array([doc["ttfts"][i] for i in ok]) * 1000
    assert stat(con, "variant", "ttft_ms", "count") == len(ok)
    assert stat(con, "variant", "ttft_ms", "p99") == pytest.approx(np.percentile(ttfts, 99), rel=1e-9)
    itls = np.concatenate([doc["itls"][i] for i in ok]) * 1000
    assert stat(con, "variant", "itl_ms", "mean") == pytest.approx(itls.mean(), rel=1e-9)


def test_bundled_chunks_keep_vllm_tpot(con, tmp_path):
    """A streamed chunk carrying two tokens: fewer ITLs than output tokens, TPOT still vLLM's."""

    def bundle(doc):
        itl = doc["itls"][0]
        doc["itls"][0] = [itl[0] + itl[1]] + itl[2:]

    path = _variant(tmp_path, bundle)
    (res,) = load(con, path)
    assert res.rejected == 0
    doc = json.loads(path.read_text())
    lat, ttft, n = doc["latencies"][0], doc["ttfts"][0], doc["output_lens"][0]
    got = con.execute("select tpot_ms from request_latency where req_id = '0'").fetchall()[0][0]
    assert got == pytest.approx((lat - ttft) / (n - 1) * 1000, rel=1e-9)
    assert con.execute("select count(*) from tokens where req_id = '0'").fetchall()[0][0] == n - 1


def test_without_detail_arrays_is_a_clear_error(con, tmp_path):
    def strip(doc):
        for k in ("ttfts", "itls", "input_lens", "output_lens", "errors", "start_times"):
            doc.pop(k)

    with pytest.raises(InputError, match="--save-detailed"):
        load(con, _variant(tmp_path, strip), fmt="vllm-bench")
    assert con.execute("select count(*) from requests").fetchall()[0][0] == 0


def test_cut_arrays_and_truncated_file(con, tmp_path):
    path = _variant(tmp_path, lambda d: d["itls"].pop())
    with pytest.raises(InputError, match="itls has 63 entries but ttfts has 64"):
        load(con, path)
    cut = tmp_path / "cut.json"
    cut.write_text(BENCH.read_text()[:5000])
    with pytest.raises(InputError, match="invalid JSON"):
        load(con, cut, fmt="vllm-bench")
    assert con.execute("select count(*) from ingests").fetchall()[0][0] == 0


@pytest.mark.parametrize("run_id, want", [(None, ["two-1", "two-2"]), ("nightly", ["nightly-1", "nightly-2"])])
def test_appended_results_become_runs_named_after_the_run(con, tmp_path, run_id, want):
    doc = json.loads(BENCH.read_text())
    path = tmp_path / "two.jsonl"  # --append-result: one result object per line
    path.write_text(json.dumps(doc) + "\n" + json.dumps(doc) + "\n")
    (res,) = load(con, path, fmt="vllm-bench", run_id=run_id)
    assert res.run_ids == want
    n = len(doc["ttfts"])
    for rid in want:
        assert stat(con, rid, "ttft_ms", "count") == n
        assert stat(con, rid, "ttft_ms", "mean") == pytest.approx(doc["mean_ttft_ms"], rel=1e-12)


def test_without_start_times_is_refused(con, tmp_path):
    """Without start_times every arrival would sit at 0: the run's duration would be its longest
    request and its throughput several times too high. The file is refused, nothing is stored."""
    with pytest.raises(InputError, match="no start_times"):
        load(con, _variant(tmp_path, lambda d: d.pop("start_times")), fmt="vllm-bench")
    assert con.execute("select count(*) from requests").fetchall()[0][0] == 0


def test_entry_without_start_time_is_rejected(con, tmp_path):
    def hole(doc):
        doc["start_times"][3] = None

    (res,) = load(con, _variant(tmp_path, hole), fmt="vllm-bench")
    doc = json.loads(BENCH.read_text())
    assert (res.accepted, res.rejected) == (len(doc["ttfts"]) - 1, 1)
    ((line, reason),) = con.execute("select line_no, reason from rejects").fetchall()
    assert line == 4 and "start_times" in reason
    starts = np.array(doc["start_times"])
    got = dict(con.execute("select req_id, t_arrival from requests").fetchall())
    assert "3" not in got
    assert got["0"] == pytest.approx(starts[0] - starts.min(), abs=1e-9)  # the origin: the other entries
