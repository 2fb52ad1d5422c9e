"""AIPerf profile_export.jsonl (real runs in realdata/aiperf) and GenAI-Perf profile_export.json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest


from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "genai_perf"
RUNS = ["qwen_concurrency1", "qwen_concurrency2", "qwen_concurrency2/qwen_concurrency4"]


def stat(con, metric, cols="count, mean, p50, p99, max"):
    return con.execute(f"select {cols} from metric_stats where metric = ?", [metric]).fetchall()[0]


def independent(path: Path) -> dict[str, np.ndarray]:
    recs = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    m = [r["metrics"] for r in recs]
    ttft = np.array([x["time_to_first_token"]["value"] for x in m])
    lat = np.array([x["request_latency"]["value"] for x in m])
    osl = np.array([x["output_sequence_length"]["value"] for x in m])
    return {
        "ttft_ms": ttft,
        "e2e_ms": lat,
        "tpot_ms": (lat - ttft) / (osl - 1),  # AIPerf's own "inter_token_latency"
        "itl_ms": np.concatenate([x["inter_chunk_latency"]["value"] for x in m]),
        "aiperf_itl": np.array([x["inter_token_latency"]["value"] for x in m]),
    }


@pytest.mark.parametrize("run", RUNS)
def test_realdata_latencies(con, realdata, run):
    path = realdata / "aiperf/tests/unit/plot/fixtures" / run / "profile_export.jsonl"
    (res,) = load(con, path)
    assert (res.format, res.accepted, res.rejected) == ("aiperf", 10, 0)
    want = independent(path)
    # our TPOT is AIPerf's "inter_token_latency" (docs/metrics.md, "Other tools' names")
    np.testing.assert_allclose(want["tpot_ms"], want["aiperf_itl"], rtol=1e-9)
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms"):
        v = want[metric]
        # epoch-ns stamps as float64 seconds carry ~0.2 µs: compare to 1 µs
        np.testing.assert_allclose(
            stat(con, metric), [len(v), v.mean(), np.median(v), np.percentile(v, 99), v.max()], rtol=1e-6, atol=1e-3
        )
    assert con.execute("select count(*) from tokens").fetchall()[0][0] == 10 * 200


def test_broken_and_failed_records(con, realdata, tmp_path):
    lines = (
        (realdata / "aiperf/tests/unit/plot/fixtures/qwen_concurrency1/profile_export.jsonl").read_text().splitlines()
    )
    lines[1] = lines[1][:300]  # truncated
    rec = json.loads(lines[2])
    rec["metadata"].pop("request_start_ns")
    lines[2] = json.dumps(rec)
    rec = json.loads(lines[3])
    rec["metrics"] = {"error_isl": {"value": 100, "unit": "tokens"}}
    rec["error"] = {"code": 499, "type": "RequestCancellationError", "message": "cancelled"}
    lines[3] = json.dumps(rec)
    path = tmp_path / "pe.jsonl"
    path.write_text("\n".join(lines) + "\n")
    (res,) = load(con, path)
    rej = dict(con.execute("select line_no, reason from rejects").fetchall())
    assert rej == {
        2: "not valid JSON (truncated or garbage line)",
        3: "AIPerf record without metadata.request_start_ns",
    }
    assert con.execute(
        "select status, t_first_token, prompt_tokens, extra->>'$.error' from requests where line_no = 4"
    ).fetchall() == [("error", None, 100, "cancelled")]
    assert stat(con, "ttft_ms", "count") == (7,)


def test_genai_perf_profile_export(con):
    (res,) = load(con, FIX / "profile_export.json")
    assert (res.format, res.accepted, res.rejected) == ("genai-perf", 2, 0)
    base = 1_717_000_000.0
    got = con.execute(
        "select req_id, t_arrival - $b, t_first_token - $b, t_finish - $b, output_tokens from requests order by req_id",
        {"b": base},
    ).fetchall()
    # text-bearing responses only: request 0 at 5, 8, 12 ms; request 1 at 7, 11, 15 ms (fixture NOTE)
    assert [(r[0], *np.round(r[1:4], 6), r[4]) for r in got] == [
        ("0", 0.001, 0.005, 0.012, 3),
        ("1", 0.002, 0.007, 0.015, 3),
    ]
    # Unix seconds in float64 resolve ~0.24 µs at 1.7e9 s: compare to 1 µs
    np.testing.assert_allclose(stat(con, "ttft_ms", "mean, max"), [4.5, 5.0], atol=1e-3)
    np.testing.assert_allclose(
        sorted(r[0] for r in con.execute("select itl_ms from token_gaps").fetchall()), [3, 4, 4, 4], atol=1e-3
    )
    meta = json.loads(con.execute("select meta from runs").fetchall()[0][0])
    assert (meta["service_kind"], meta["experiment_mode"], meta["experiment_value"]) == ("openai", "concurrency", 10)


def test_in_repo_aiperf_fixture(tmp_path):
    """The happy path without ../shared/realdata: TTFT and ITL are the export's own numbers."""
    import json

    import numpy as np

    from pipeline import store
    from pipeline.ingest import detect, ingest_paths

    src = Path(__file__).resolve().parents[2] / "fixtures" / "aiperf" / "profile_export.jsonl"
    assert detect(src).name == "aiperf"
    con = store.connect(tmp_path / "a.duckdb")
    res = ingest_paths(con, [src], run_id="a")[0]
    store.build_derived(con)
    recs = [json.loads(x) for x in src.read_text().splitlines()]
    assert (res.lines_read, res.accepted, res.rejected) == (len(recs), len(recs), 0)
    ttft = dict(con.execute("select req_id, ttft_ms from request_latency").fetchall())
    for r in recs:
        assert ttft[r["metadata"]["x_request_id"]] == pytest.approx(
            r["metrics"]["time_to_first_token"]["value"], abs=1e-3
        )
    itl = con.execute("select itl_ms from token_gaps order by 1").fetchnumpy()["itl_ms"]
    want = np.sort(np.concatenate([r["metrics"]["inter_chunk_latency"]["value"] for r in recs]))
    assert np.allclose(itl, want, atol=1e-3)


AIPERF_FIX = Path(__file__).resolve().parents[2] / "fixtures" / "aiperf" / "profile_export.jsonl"
REQ_COLS = "r.req_id, t_arrival, t_first_token, t_finish, t_s, prompt_tokens, output_tokens"


def _requests(con, run):
    q = f"select {REQ_COLS} from requests r left join token_lists using (run_id, req_id) where run_id = ? order by 1"
    return con.execute(q, [run]).fetchall()


@pytest.mark.parametrize(
    "metric, unit, scale",
    [
        ("time_to_first_token", "s", 1e-3),
        ("time_to_first_token", "sec", 1e-3),
        ("request_latency", "ns", 1e6),
        ("inter_chunk_latency", "us", 1e3),
        ("time_to_first_token", "MS", 1.0),  # AIPerf's unit enums ignore case
    ],
)
@pytest.mark.long
def test_aiperf_metric_units_are_converted(con, tmp_path, metric, unit, scale):
    """A metric in seconds, microseconds or nanoseconds gives the times it gives in ms."""
    recs = [json.loads(x) for x in AIPERF_FIX.read_text().splitlines() if x.strip()]
    for r in recs:
        m = r["metrics"][metric]
        assert m["unit"] == "ms"
        v = m["value"]
        m["value"], m["unit"] = ([x * scale for x in v] if isinstance(v, list) else v * scale), unit
    f = tmp_path / "units.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    (res,) = load(con, f, run_id="units")
    load(con, AIPERF_FIX, run_id="ref")
    assert (res.accepted, res.rejected) == (len(recs), 0)
    got, want = _requests(con, "units"), _requests(con, "ref")
    assert [g[0] for g in got] == [w[0] for w in want]
    for g, w in zip(got, want):
        assert g[4] == pytest.approx(w[4], rel=1e-12, abs=1e-9)
        assert g[1:4] == pytest.approx(w[1:4], rel=1e-12, abs=1e-9) and g[5:] == w[5:]


@pytest.mark.parametrize(
    "metric, unit, reason",
    [
        (
            "time_to_first_token",
            "min",
            'metrics.time_to_first_token.unit: unknown time unit "min" (AIPerf writes ns, us, ms, s or sec)',
        ),
        (
            "inter_chunk_latency",
            "ticks",
            'metrics.inter_chunk_latency.unit: unknown time unit "ticks" (AIPerf writes ns, us, ms, s or sec)',
        ),
        (
            "output_sequence_length",
            "bytes",
            'metrics.output_sequence_length.unit: unknown unit for a token count "bytes" (AIPerf writes tokens)',
        ),
    ],
)
def test_aiperf_unknown_unit_is_a_reject(con, tmp_path, metric, unit, reason):
    recs = [json.loads(x) for x in AIPERF_FIX.read_text().splitlines() if x.strip()]
    recs[3]["metrics"][metric]["unit"] = unit
    f = tmp_path / "unit.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    (res,) = load(con, f)
    assert (res.accepted, res.rejected) == (len(recs) - 1, 1)
    ((line, got),) = con.execute("select line_no, reason from rejects").fetchall()
    assert line == 4 and got.startswith(reason)


@pytest.mark.long
def test_two_genai_perf_exports_of_one_run(tmp_path):
    """GenAI-Perf numbers requests by position: a second client's export of the run gets ids named
    after its file; a copy of the same export is rejected as duplicates."""
    from pipeline import store
    from pipeline.cli import run_captured

    doc = json.loads((FIX / "profile_export.json").read_text())
    later = json.loads(json.dumps(doc))
    for r in later["experiments"][0]["requests"]:  # another client: its requests half a second later
        r["timestamp"] += 500_000_000
        r["response_timestamps"] = [t + 500_000_000 for t in r["response_timestamps"]]
    (tmp_path / "other.json").write_text(json.dumps(later))
    (tmp_path / "copy.json").write_text(json.dumps(doc, indent=1))
    db = tmp_path / "s.duckdb"
    code, out = run_captured(
        "ingest", FIX / "profile_export.json", tmp_path / "other.json", "--run-id", "r", "--db", db
    )
    assert code == 0 and "named other.json#0" in out, out
    code, out = run_captured("ingest", tmp_path / "copy.json", "--run-id", "r", "--db", db)
    assert code == 2 and "all 2 records rejected" in out, out
    con = store.connect(db)
    ids = [r[0] for r in con.execute("select req_id from requests order by req_id").fetchall()]
    assert ids == ["0", "1", "other.json#0", "other.json#1"]


@pytest.mark.long
def test_two_aiperf_exports_without_request_ids(tmp_path):
    """An AIPerf record without metadata.x_request_id is known by its session_num, which every AIPerf
    process counts from 0: a second client's export of the run keeps its requests under ids named
    after its file. With x_request_id (uuids in real exports) nothing is renamed."""
    import json

    from pipeline import store
    from pipeline.cli import run_captured

    recs = [json.loads(x) for x in AIPERF_FIX.read_text().splitlines()]
    for k, r in enumerate(recs):
        del r["metadata"]["x_request_id"]
        r["metadata"]["session_num"] = k
    later = json.loads(json.dumps(recs))
    for r in later:  # another client: its requests half a second later
        for key in ("request_start_ns", "request_end_ns"):
            r["metadata"][key] += 500_000_000
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in recs))
    b.write_text("".join(json.dumps(r) + "\n" for r in later))
    db = tmp_path / "s.duckdb"
    code, out = run_captured("ingest", a, b, "--run-id", "r", "--db", db)
    assert code == 0 and "named b.jsonl#0" in out, out
    con = store.connect(db)
    got = dict(con.execute("select req_id, t_arrival from requests").fetchall())
    assert len(got) == 2 * len(recs)
    for k, r in enumerate(recs):
        t = r["metadata"]["request_start_ns"] / 1e9
        assert got[str(k)] == pytest.approx(t, abs=1e-6)
        assert got[f"b.jsonl#{k}"] == pytest.approx(t + 0.5, abs=1e-6)
    con.close()
    # the same pair with their own x_request_id: ids are identities, the second file's are duplicates
    own = [json.loads(x) for x in AIPERF_FIX.read_text().splitlines()]
    for r in own:
        for key in ("request_start_ns", "request_end_ns"):
            r["metadata"][key] += 500_000_000
    c = tmp_path / "c.jsonl"
    c.write_text("".join(json.dumps(r) + "\n" for r in own))
    db2 = tmp_path / "s2.duckdb"
    code, out = run_captured("ingest", AIPERF_FIX, c, "--run-id", "r", "--db", db2)
    assert "named" not in out, out
    con = store.connect(db2)
    assert con.execute("select count(*) from requests").fetchall()[0][0] == len(own)
    dups = con.execute("select count(*) from rejects where reason like '%duplicate%'").fetchall()[0][0]
    assert dups == len(own)


# --- warmup records ---------------------------------------------------------------------


def _with_warmup(src: Path, dst: Path, warm: set[int], blank_after: int | None = None) -> list[dict]:
    """``src``'s records with metadata.benchmark_phase = "warmup" on the records numbered in
    ``warm`` (0-based), written to ``dst`` (a blank line after record ``blank_after``); the records."""
    recs = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    for k in warm:
        recs[k]["metadata"]["benchmark_phase"] = "warmup"
    lines = [json.dumps(r) for r in recs]
    if blank_after is not None:
        lines.insert(blank_after + 1, "")
    dst.write_text("\n".join(lines) + "\n")
    return recs


def _profiling_numbers(recs: list[dict]) -> tuple[int, float, float]:
    """Request count, span (s) and output tokens per second of the profiling records, computed
    here from the export's own fields (first send to last finish)."""
    prof = [r for r in recs if r["metadata"]["benchmark_phase"] == "profiling"]
    start = [r["metadata"]["request_start_ns"] / 1e9 for r in prof]
    end = [s + r["metrics"]["request_latency"]["value"] / 1e3 for s, r in zip(start, prof)]
    span = max(end) - min(start)
    tokens = sum(r["metrics"]["output_sequence_length"]["value"] for r in prof)
    return len(prof), span, tokens / span


def _ingest_and_summarize(tmp_path: Path, path: Path) -> tuple[int, str, dict]:
    from pipeline.cli import run_captured

    db = tmp_path / "w.duckdb"
    code, out = run_captured("ingest", path, "--run-id", "w", "--db", db)
    scode, sout = run_captured("summary", "w", "--db", db, "--json")
    assert scode == 0, sout
    return code, out, json.loads(sout)


def test_realdata_warmup_records_are_not_measured(tmp_path, realdata):
    """AIPerf counts only its profiling phase: two warmup records of a real run are skipped
    (counted, said in the ingest output and the run's meta), and the run's requests, span and
    throughput are those of the 8 profiling records."""
    src = realdata / "aiperf/tests/unit/plot/fixtures/qwen_concurrency1/profile_export.jsonl"
    path = tmp_path / "profile_export.jsonl"
    recs = _with_warmup(src, path, {0, 1})
    n, span, tok_s = _profiling_numbers(recs)
    assert (n, round(span, 3), round(tok_s, 2)) == (8, 29.014, 55.15)  # the numbers
    code, out, s = _ingest_and_summarize(tmp_path, path)
    assert code == 0, out
    assert "10 read, 8 accepted, 0 rejected, 2 skipped; runs: w" in out, out
    assert "2 warmup records (metadata.benchmark_phase = warmup) skipped" in out, out
    assert s["run"]["meta"]["aiperf_warmup_records_skipped"] == 2
    assert s["requests"] == n and s["ttft_ms"]["count"] == n
    assert s["duration_s"] == pytest.approx(span, abs=1e-5)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(tok_s, rel=1e-6)
    # the cold start is gone from the percentiles too: TTFT is that of the profiling records
    ttft = [r["metrics"]["time_to_first_token"]["value"] for r in recs[2:]]
    assert s["ttft_ms"]["max"] == pytest.approx(max(ttft), abs=1e-3)


@pytest.mark.long
def test_warmup_records_are_skipped_and_counted(tmp_path):
    """Without realdata: the in-repo fixture with three warmup records (one of them failed, one
    spelled in capitals) and a blank line; read = accepted + rejected + skipped still holds."""
    path = tmp_path / "profile_export.jsonl"
    recs = _with_warmup(AIPERF_FIX, path, {0, 1, 5}, blank_after=9)
    recs[5]["error"] = {"code": 500, "type": "ServerError", "message": "cold"}
    recs[1]["metadata"]["benchmark_phase"] = "WARMUP"
    path.write_text(
        "".join(json.dumps(r) + "\n" for r in recs[:10]) + "\n" + "".join(json.dumps(r) + "\n" for r in recs[10:])
    )
    for r in recs:
        r["metadata"]["benchmark_phase"] = r["metadata"]["benchmark_phase"].lower()
    n, span, tok_s = _profiling_numbers(recs)
    assert n == len(recs) - 3
    code, out, s = _ingest_and_summarize(tmp_path, path)
    assert code == 0, out
    assert f"{len(recs) + 1} read, {n} accepted, 0 rejected, 4 skipped" in out, out
    assert "3 warmup records (metadata.benchmark_phase = warmup) skipped" in out, out
    assert s["run"]["meta"]["aiperf_warmup_records_skipped"] == 3
    assert (s["requests"], s["requests_failed"]) == (n, 0)  # the failed warmup record is not a failed request
    assert s["duration_s"] == pytest.approx(span, abs=1e-5)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(tok_s, rel=1e-6)


def test_warmup_count_reaches_the_meta_across_batches(con, tmp_path, monkeypatch):
    """A file read in several batches: the count of the whole file reaches the run's meta
    (and the first batch's run facts stay), the note says it once."""
    from pipeline.ingest import reader

    monkeypatch.setattr(reader, "BATCH_BYTES", 4096)  # a record or two per batch
    path = tmp_path / "profile_export.jsonl"
    recs = _with_warmup(AIPERF_FIX, path, {0, 1, 2, 15})
    (res,) = load(con, path, run_id="w")
    assert (res.lines_read, res.accepted, res.rejected, res.skipped) == (len(recs), len(recs) - 4, 0, 4)
    assert [x for x in res.notes if "warmup" in x] == [
        "4 warmup records (metadata.benchmark_phase = warmup) skipped: not measured requests, "
        "as in AIPerf's own statistics"
    ]
    engine, clock, meta = con.execute("select engine, clock, meta from runs where run_id = 'w'").fetchall()[0]
    meta = json.loads(meta)
    assert (engine, clock, meta["source_format"], meta["aiperf_warmup_records_skipped"]) == (
        "aiperf-client",
        "unix",
        "aiperf-profile-export",
        4,
    )
    got = {r[0] for r in con.execute("select req_id from requests").fetchall()}
    assert got == {r["metadata"]["x_request_id"] for k, r in enumerate(recs) if k not in (0, 1, 2, 15)}


def test_no_warmup_records_meta_says_zero(con):
    (res,) = load(con, AIPERF_FIX, run_id="a")
    assert res.skipped == 0 and not [x for x in res.notes if "warmup" in x]
    meta = json.loads(con.execute("select meta from runs").fetchall()[0][0])
    assert meta["aiperf_warmup_records_skipped"] == 0


def test_only_warmup_records_load_nothing_and_say_why(tmp_path):
    path = tmp_path / "profile_export.jsonl"
    recs = _with_warmup(AIPERF_FIX, path, set(range(20)))
    from pipeline.cli import run_captured

    code, out = run_captured("ingest", path, "--db", tmp_path / "w.duckdb")
    assert code == 2, out
    assert f"{len(recs)} read, 0 accepted, 0 rejected, {len(recs)} skipped" in out, out
    assert "AIPerf's warmup records (metadata.benchmark_phase = warmup) are skipped, not measured" in out, out
