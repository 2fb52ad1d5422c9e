"""Real split evidence: recorded vLLM server logs with the `vllm bench serve` JSON of the same run.

fixtures/vllm (16 req/s, light queueing) and fixtures/vllm_queue (40 req/s, seconds of
queueing), both recorded by scripts/record_vllm_cpu.py.  Each recording also has the
server's per-request stats (requests.jsonl: engine-side queued/scheduled times on the
machine's monotonic clock, the clock the bench's perf_counter start times are on) and
a log with epoch stamps: the ground truth for the offset and for queueing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline import store
from pipeline.errors import InputError
from pipeline.ingest import align, ingest_paths

FIX = Path(__file__).resolve().parents[2] / "fixtures"
PAIRS = {"vllm": FIX / "vllm", "vllm_queue": FIX / "vllm_queue"}


def _joint(tmp, rec: Path, log: str = "server.log", **kw):
    con = store.connect(tmp / "j.duckdb")
    ingest_paths(con, [rec / log, rec / "bench.json"], run_id="joint", **kw)
    store.build_derived(con)
    return con


def _truth(rec: Path) -> dict:
    bench = json.loads((rec / "bench.json").read_text())
    stats = [json.loads(line) for line in (rec / "requests.jsonl").read_text().splitlines() if line.strip()]
    by_idx = {int(s["request_id"].split("-")[-2]): s for s in stats}
    start = np.array(bench["start_times"])
    sched = np.array([by_idx[i]["scheduled_ts"] for i in range(len(start))])
    # unix minus monotonic: arrival_time (unix) is stamped before queued_ts (monotonic), so the
    # largest difference is the one with the least latency between the two stamps
    unix_minus_mono = max(s["arrival_time"] - s["queued_ts"] for s in stats)
    return {"bench": bench, "queue_ms": (sched - start) * 1e3, "offset_s": unix_minus_mono + start.min()}


def _alignment(con) -> dict:
    return json.loads(
        con.execute("select json_extract(meta, '$.clock_alignment') from runs where run_id = 'joint'").fetchone()[0]
    )


@pytest.mark.parametrize("name", list(PAIRS))
def test_joint_run_matches_the_bench(tmp_path, name):
    rec = PAIRS[name]
    con = _joint(tmp_path, rec)
    bench = _truth(rec)["bench"]
    dur, tps = con.execute("select duration_s, output_tokens_per_s from run_summary where run_id = 'joint'").fetchone()
    assert dur == pytest.approx(bench["duration"], rel=0.02)
    assert tps == pytest.approx(bench["output_throughput"], rel=0.02)
    n, queued = con.execute("select count(*), count(queue_ms) from request_latency where run_id = 'joint'").fetchone()
    assert n == queued == len(bench["ttfts"])  # queueing for every request
    assert _alignment(con)["status"] == "aligned"


@pytest.mark.parametrize("name", list(PAIRS))
def test_offset_and_queueing_against_the_server_stats(tmp_path, name):
    rec = PAIRS[name]
    truth = _truth(rec)
    con = _joint(tmp_path, rec, log="server_epoch.log")
    src = _alignment(con)["sources"][0]
    steps = con.execute("select median(dur_ms) from iterations where run_id = 'joint'").fetchone()[0]
    # Tokens are matched to the log stamps of the steps that made them, so the offset also holds
    # the lag between a step's log stamp and the client reading its token: +2.0 ms at 16 req/s
    # (within one median step), +13.5 ms for the CPU-starved client at 40 req/s.
    err_ms = (src["offset_s"] - truth["offset_s"]) * 1e3
    assert abs(err_ms) <= max(steps, 15.0), (err_ms, steps)
    q = con.execute("select queue_ms from request_latency where run_id = 'joint' order by req_id::int").fetchnumpy()[
        "queue_ms"
    ]
    # on vllm_queue the CPU-starved client read the last first token 16 ms after the log's last
    # step (six median steps): within its usual lag behind the steps, so that step made it
    q = np.ma.filled(np.ma.asarray(q, dtype=float), np.nan)
    assert not np.isnan(q).any() and src["inferred"]["t_scheduled"]["requests_outside_steps"] == 0
    want = truth["queue_ms"]
    err = np.abs(q - want)
    assert (
        err[
            np.argmax(
                con.execute("select t_first_token from requests order by req_id::int").fetchnumpy()["t_first_token"]
            )
        ]
        <= 20.0
    )  # the last request's own queueing, against the server's
    assert np.median(err) <= 10.0  # ms, against queues of up to 4 s
    for p in (50, 90, 99):
        assert np.percentile(q, p) == pytest.approx(np.percentile(want, p), rel=0.10, abs=5.0)


def test_queueing_on_second_resolution_log(tmp_path):
    """The default vLLM log (1-second stamps, timeline rebuilt): queue percentiles still within 5%."""
    rec = PAIRS["vllm_queue"]
    truth = _truth(rec)
    con = _joint(tmp_path, rec)
    q = con.execute("select queue_ms from request_latency where run_id = 'joint'").fetchnumpy()["queue_ms"]
    for p in (50, 90, 99):
        assert np.percentile(q, p) == pytest.approx(np.percentile(truth["queue_ms"], p), rel=0.05)


@pytest.mark.parametrize("name", list(PAIRS))
@pytest.mark.long
def test_explain_and_replay_work_on_the_joint_run(tmp_path, name):
    from pipeline.fit import get_or_fit
    from pipeline.fit.attribution import explain
    from pipeline.replay import calibrate, compare

    con = _joint(tmp_path, PAIRS[name])
    get_or_fit(con, "joint")
    for metric in ("ttft", "tpot"):
        shares = {p["part"]: p["share"] for p in explain(con, "joint", metric)["parts"]}
        assert shares.get("unattributed", 0.0) < 0.20, shares
    cmp = compare(con, calibrate(con, "joint"), [0])
    observed = {(r["metric"], r["stat"]): r["observed"] for r in cmp.rows()}
    assert observed[("ttft_ms", "p50")] is not None


@pytest.mark.long
def test_sources_of_different_runs_are_not_merged_silently(tmp_path):
    con = store.connect(tmp_path / "x.duckdb")
    ingest_paths(con, [PAIRS["vllm"] / "server_epoch.log", PAIRS["vllm_queue"] / "bench.json"], run_id="joint")
    store.build_derived(con)
    info = _alignment(con)
    assert info["status"] == "failed"
    share = info["sources"][0]["steps_matched_share"]
    assert f"{share:.0%} of the steps" in info["problem"] and "do not look like one run" in info["problem"]
    from pipeline.fit import get_or_fit
    from pipeline.fit.attribution import explain
    from pipeline.replay import calibrate

    get_or_fit(con, "joint")
    with pytest.raises(InputError, match="could not be aligned"):
        explain(con, "joint", "ttft")
    with pytest.raises(InputError, match="could not be aligned"):
        calibrate(con, "joint")
    # the duration never spans the two clocks: it is the bench's own span
    dur = con.execute("select duration_s from run_summary where run_id = 'joint'").fetchone()[0]
    assert dur < 60


@pytest.mark.long
def test_a_client_file_of_another_run_leaves_the_right_pair_as_it_was(tmp_path):
    """server.log + its bench.json + another run's bench.json under one --run-id: the stray file is
    NOT aligned; the right pair is aligned and re-timed as when given alone (it lost the re-timing:
    queue p50 5 ms for 23), and the duration and rates are the right client's (1.8e9 s, 0 tok/s)."""
    rec = PAIRS["vllm"]
    alone = _joint(tmp_path, rec)
    con = store.connect(tmp_path / "three.duckdb")
    ingest_paths(con, [rec / "server.log", rec / "bench.json", PAIRS["vllm_queue"] / "bench.json"], run_id="joint")
    store.build_derived(con)
    info = _alignment(con)
    by_path = {Path(src["path"]).parent.name: src for src in info["sources"]}
    assert info["status"] == "failed" and by_path["vllm_queue"]["status"] == "failed"
    assert by_path["vllm"]["status"] == "aligned" and by_path["vllm"]["retime"]["retimed"]
    get = (
        "select req_id, queue_ms, prefill_ms from request_latency where run_id = 'joint' and req_id not like '%#%' "
        "order by req_id"
    )
    np.testing.assert_allclose(
        np.array(con.execute(get).fetchall(), dtype=float), np.array(alone.execute(get).fetchall(), dtype=float)
    )
    cols = "duration_s, output_tokens_per_s, requests_per_s"
    got = con.execute(f"select {cols} from run_summary where run_id = 'joint'").fetchone()
    want = alone.execute(f"select {cols} from run_summary where run_id = 'joint'").fetchone()
    assert got == pytest.approx(want, rel=1e-9)
    bench = _truth(rec)["bench"]
    assert got[0] == pytest.approx(bench["duration"], rel=0.02)
    assert con.execute("select requests from run_summary where run_id = 'joint'").fetchone()[0] == 64 + 96


@pytest.mark.long
def test_ingest_line_warns_with_the_match_rate(tmp_path):
    from click.testing import CliRunner

    from pipeline.cli import cli

    db = str(tmp_path / "w.duckdb")
    res = CliRunner().invoke(
        cli,
        [
            "ingest",
            str(PAIRS["vllm"] / "server.log"),
            str(PAIRS["vllm_queue"] / "bench.json"),
            "--run-id",
            "joint",
            "--db",
            db,
        ],
    )
    assert res.exit_code == 0
    assert "NOT aligned" in res.output and "do not look like one run" in res.output
    # what is refused is named: the quantities that join steps and requests, not each file's own
    assert "tail attribution, replay and the Perfetto timeline of this run are refused" in res.output
    assert "durations, throughput" not in res.output
    summary = CliRunner().invoke(cli, ["summary", "joint", "--db", db])
    assert summary.exit_code == 0, summary.output
    (warning,) = [x for x in summary.output.splitlines() if x.startswith("warning: ")]
    assert "bench.json NOT aligned with server.log" in warning
    from pipeline.cli import run_captured

    code, out = run_captured("explain", "joint", "--db", db)
    assert code == 2 and "different clocks that could not be aligned" in out, out
    res = CliRunner().invoke(
        cli,
        [
            "ingest",
            str(PAIRS["vllm"] / "server.log"),
            str(PAIRS["vllm"] / "bench.json"),
            "--run-id",
            "good",
            "--db",
            db,
        ],
    )
    assert "bench.json aligned with server.log: offset +1796014047.9" in res.output


def test_unix_client_that_matches_gets_no_offset(tmp_path):
    con = store.connect(tmp_path / "u.duckdb")
    before = None
    ingest_paths(con, [PAIRS["vllm"] / "requests.jsonl"], run_id="alone")
    before = con.execute("select sum(t_arrival) from requests where run_id = 'alone'").fetchone()[0]
    ingest_paths(con, [PAIRS["vllm"] / "server_epoch.log", PAIRS["vllm"] / "requests.jsonl"], run_id="joint")
    src = _alignment(con)["sources"][0]
    assert src["status"] == "same clock" and src["applied"] is False
    assert abs(src["estimated_offset_s"]) * 1e3 < 5.0
    after = con.execute("select sum(t_arrival) from requests where run_id = 'joint'").fetchone()[0]
    assert after == pytest.approx(before, abs=1e-4)  # not moved (sums of unix times: summation order)


@pytest.mark.long
def test_override_and_order_of_ingest(tmp_path):
    rec = PAIRS["vllm"]
    a = _joint(tmp_path, rec)
    t_a = a.execute("select t_arrival, t_scheduled from requests where run_id = 'joint' order by req_id").fetchall()
    # the client first, then the server: the same alignment, made when the second file arrives
    b = store.connect(tmp_path / "b.duckdb")
    ingest_paths(b, [rec / "bench.json"], run_id="joint")
    ingest_paths(b, [rec / "server.log"], run_id="joint")
    t_b = b.execute("select t_arrival, t_scheduled from requests where run_id = 'joint' order by req_id").fetchall()
    np.testing.assert_allclose(np.array(t_b, dtype=float), np.array(t_a, dtype=float), atol=1e-6)
    # re-ingesting the server log (--replace) re-estimates from the raw times, not from shifted ones
    ingest_paths(b, [rec / "server.log"], run_id="joint", replace=True)
    t_c = b.execute("select t_arrival, t_scheduled from requests where run_id = 'joint' order by req_id").fetchall()
    np.testing.assert_allclose(np.array(t_c, dtype=float), np.array(t_a, dtype=float), atol=1e-6)
    # --clock-offset wins over the estimate, exactly
    c = store.connect(tmp_path / "c.duckdb")
    ingest_paths(
        c, [rec / "server.log", rec / "bench.json"], run_id="joint", clock_offsets=("bench.json=1796014047.5",)
    )
    first = c.execute("select min(t_arrival) from requests where run_id = 'joint'").fetchone()[0]
    assert first == pytest.approx(1796014047.5, abs=1e-6)  # the bench's first start is its origin, 0


def test_the_run_is_the_servers_in_any_order_of_its_files(tmp_path):
    """The log's engine and source format, whichever file came last (the bench's did when last)."""
    rec = PAIRS["vllm"]
    con = store.connect(tmp_path / "o.duckdb")
    ingest_paths(con, [rec / "server.log", rec / "bench.json"], run_id="a")
    ingest_paths(con, [rec / "bench.json", rec / "server.log"], run_id="b")
    ingest_paths(con, [rec / "server.log"], run_id="log")
    rows = con.execute(
        "select run_id, engine, engine_version, model, clock, json_extract_string(meta, '$.source_format') "
        "from runs order by run_id"
    ).fetchall()
    assert [r[1:] for r in rows] == [rows[-1][1:]] * 3, rows


def _steps(con, run: str) -> np.ndarray:
    return np.array(
        con.execute("select t_start, t_end from iterations where run_id = ? order by iter", [run]).fetchall()
    )


def test_a_client_replaced_or_moved_away_leaves_the_steps_on_their_stamps(tmp_path):
    """The steps the client re-timed go back on the log's own timeline when the client leaves the
    run, and a client loaded again is aligned from the log's times, not from re-timed ones."""
    rec = PAIRS["vllm"]
    alone = store.connect(tmp_path / "alone.duckdb")
    ingest_paths(alone, [rec / "server.log"], run_id="joint")
    con = _joint(tmp_path, rec)
    first = _alignment(con)["sources"][0]
    assert first["retime"]["retimed"]
    assert np.abs(_steps(con, "joint") - _steps(alone, "joint")).max() > 0.01  # re-timed: else this shows nothing
    ingest_paths(con, [rec / "bench.json"], run_id="joint", replace=True)  # the same client again
    again = _alignment(con)["sources"][0]
    assert again["offset_before_retime_s"] == first["offset_before_retime_s"]
    assert again["offset_s"] == first["offset_s"]
    ingest_paths(con, [rec / "bench.json"], run_id="other", replace=True)  # the client moves to another run
    np.testing.assert_array_equal(_steps(con, "joint"), _steps(alone, "joint"))
    assert con.execute("select count(*) from clock_alignments where run_id = 'joint'").fetchone()[0] == 0


def test_time_zone_of_local_stamps(tmp_path):
    rec = PAIRS["vllm"]
    utc = _joint(tmp_path, rec, tz="UTC")
    t_utc = utc.execute("select min(t_start) from iterations").fetchone()[0]
    con = store.connect(tmp_path / "tz.duckdb")
    ingest_paths(con, [rec / "server.log", rec / "bench.json"], run_id="joint", tz="America/New_York")
    store.build_derived(con)
    t_ny = con.execute("select min(t_start) from iterations").fetchone()[0]
    assert t_ny - t_utc == pytest.approx(5 * 3600, abs=1e-6)  # 30 Nov: EST, UTC-5
    meta = json.loads(con.execute("select meta from runs where run_id = 'joint'").fetchone()[0])
    assert meta["timestamps_time_zone"] == "America/New_York"
    # the client follows the server's clock: the same durations
    d = [c.execute("select duration_s from run_summary").fetchone()[0] for c in (utc, con)]
    assert d[0] == pytest.approx(d[1], abs=1e-6)
    with pytest.raises(InputError, match="not a known time zone"):
        ingest_paths(con, [rec / "server.log"], run_id="x", tz="Mars/Olympus", replace=True)


def test_second_stamped_steps_are_retimed_from_the_client(tmp_path):
    """The default vLLM log (1-second stamps) plus the bench's token times: step ends within a few
    ms of the epoch-stamped log of the same run (they were off by up to 491 ms), queues per request
    within 10 ms of the server's own stats."""
    from pipeline.ingest import retime

    rec = PAIRS["vllm"]
    con = _joint(tmp_path, rec)
    ref = store.connect(tmp_path / "epoch.duckdb")
    ingest_paths(ref, [rec / "server_epoch.log"], run_id="epoch")
    rebuilt = store.connect(tmp_path / "rebuilt.duckdb")
    ingest_paths(rebuilt, [rec / "server.log"], run_id="alone")
    get = "select t_end from iterations order by iter"
    truth = ref.execute(get).fetchnumpy()["t_end"]
    before = rebuilt.execute(get).fetchnumpy()["t_end"]
    after = con.execute(get).fetchnumpy()["t_end"]
    assert np.max(np.abs(before - truth)) > 0.3  # what the stamps alone give
    assert np.max(np.abs(after - truth)) < 0.006 and np.median(np.abs(after - truth)) < 0.002
    src = _alignment(con)["sources"][0]
    assert src["retime"]["retimed"] and src["steps_matched_share"] > 0.99
    q = con.execute("select queue_ms from request_latency where run_id = 'joint' order by req_id::int").fetchnumpy()[
        "queue_ms"
    ]
    assert np.median(np.abs(q - _truth(rec)["queue_ms"])) < 10.0
    # undone exactly: the steps go back to the timeline rebuilt from the stamps
    ing = con.execute("select ingest_id from ingests where path like '%server.log'").fetchone()[0]
    retime.undo(con, "joint", ing)
    np.testing.assert_allclose(con.execute(get).fetchnumpy()["t_end"], before, atol=1e-6)


@pytest.mark.parametrize("lost", [[-1], [-3, -2, -1], [100], [300]], ids=["last", "last3", "step100", "step300"])
@pytest.mark.long
def test_step_lines_lost_from_the_log_still_retime_right(tmp_path, lost):
    """A log copied while written loses its last step lines; a garbled line loses one in the middle.
    The client's token count, run back from the last step, then put every step (or every step before
    the loss) one or more tokens off: one lost 1-token step moved prefill p90 from 33 to 118 ms. The
    count is moved to where the token gaps match the step durations; every step the log still has
    ends within 10 ms (median 2 ms) of the epoch-stamped log of the same run, and the queues keep the server's."""
    rec = PAIRS["vllm"]
    lines = (rec / "server.log").read_text().split("\n")
    steps = [i for i, line in enumerate(lines) if "Iteration(" in line]
    drop = {steps[k] for k in lost}
    (tmp_path / "server.log").write_text("\n".join(x for i, x in enumerate(lines) if i not in drop))
    (tmp_path / "bench.json").write_text((rec / "bench.json").read_text())
    con = _joint(tmp_path, tmp_path)
    ref = store.connect(tmp_path / "epoch.duckdb")
    ingest_paths(ref, [rec / "server_epoch.log"], run_id="epoch")
    truth = dict(ref.execute("select iter, t_end from iterations").fetchall())
    got = dict(con.execute("select iter, t_end from iterations").fetchall())
    assert len(got) == len(truth) - len(lost)
    err = np.array([got[i] - truth[i] for i in got])
    # the change of count is placed to within a few steps of a loss in the middle
    assert np.max(np.abs(err)) < 0.010 and np.median(np.abs(err)) < 0.002
    rt = _alignment(con)["sources"][0]["retime"]
    assert rt["retimed"] and rt["count_mismatch_tokens"] > 0
    q = con.execute("select queue_ms from request_latency where run_id = 'joint' order by req_id::int").fetchnumpy()[
        "queue_ms"
    ]
    assert np.median(np.abs(q - _truth(rec)["queue_ms"])) < 10.0


@pytest.mark.long
def test_given_offset_retimes_the_steps_too(tmp_path):
    """--clock-offset with the true offset (the server's own stats give it) must re-time the
    second-stamped steps as the estimate does: it used to leave them on the stamps' timeline, and
    queueing and prefill came out wrong (queue p99 173 ms for 369, prefill p99 390 ms for 43)."""
    from pipeline.ingest.align import describe

    rec = PAIRS["vllm"]
    truth = _truth(rec)
    offset = float(truth["offset_s"])
    est = _joint(tmp_path, rec)
    (tmp_path / "given").mkdir()
    given = _joint(tmp_path / "given", rec, clock_offsets=(f"bench.json={offset!r}",))
    src = _alignment(given)["sources"][0]
    assert src["status"] == "override" and src["retime"]["retimed"] and src["retime"]["given_offset_fits_stamps"]
    get = "select t_end from iterations order by iter"
    epoch = store.connect(tmp_path / "epoch.duckdb")
    ingest_paths(epoch, [rec / "server_epoch.log"], run_id="epoch")
    steps = epoch.execute(get).fetchnumpy()["t_end"]
    assert np.max(np.abs(given.execute(get).fetchnumpy()["t_end"] - steps)) < 0.006
    q = "select queue_ms, prefill_ms from request_latency where run_id = 'joint' order by req_id::int"
    a, b = est.execute(q).fetchnumpy(), given.execute(q).fetchnumpy()
    assert np.median(np.abs(b["queue_ms"] - truth["queue_ms"])) < 10.0
    # the estimate and the true offset differ by about a millisecond: so do the queues
    np.testing.assert_allclose(b["queue_ms"], a["queue_ms"], atol=5.0)
    np.testing.assert_allclose(b["prefill_ms"], a["prefill_ms"], atol=5.0)
    assert not any(problem for problem, _ in describe(given, ["joint"]))
    # an offset half a second off is still applied (the user chose it), with a warning that names
    # the interval the log's stamps allow
    (tmp_path / "far").mkdir()
    far = _joint(tmp_path / "far", rec, clock_offsets=(f"bench.json={offset - 0.5!r}",))
    assert _alignment(far)["sources"][0]["retime"]["given_offset_fits_stamps"] is False
    [(problem, text)] = describe(far, ["joint"])
    assert problem and "stamps allow offsets" in text
    # four seconds off, the steps cannot be re-timed at all: the decode counts tell (it said nothing)
    (tmp_path / "off").mkdir()
    off = _joint(tmp_path / "off", rec, clock_offsets=(f"bench.json={offset + 4.0!r}",))
    src = _alignment(off)["sources"][0]
    assert not src["retime"]["retimed"] and src["steps_matched_share"] < 0.8
    [(problem, text)] = describe(off, ["joint"])
    assert problem and "check the offset" in text and f"matched {src['steps_matched_share']:.0%} of steps" in text
    assert _alignment(given)["sources"][0]["steps_matched_share"] > 0.95  # the true one: no doubt
    # an offset for the file of steps is not applied, and the ingest says so (it said nothing)
    (tmp_path / "ref").mkdir()
    ref = _joint(tmp_path / "ref", rec, clock_offsets=("server.log=5",))
    assert any(p and "--clock-offset server.log=... was not applied" in t for p, t in describe(ref, ["joint"]))
    t_ref = ref.execute("select min(t_start) from iterations").fetchone()[0]
    assert t_ref == pytest.approx(est.execute("select min(t_start) from iterations").fetchone()[0], abs=1e-6)


@pytest.mark.long
def test_client_and_server_records_of_the_same_requests_are_named(tmp_path):
    """The bench's records and the server's own (requests.jsonl) of one run are the same 64
    requests: ingested together the run counted 128 requests and twice the throughput, silently."""
    import shutil

    from pipeline.ingest.align import describe

    rec = PAIRS["vllm"]
    con = store.connect(tmp_path / "three.duckdb")
    ingest_paths(con, [rec / "server.log", rec / "bench.json", rec / "requests.jsonl"], run_id="joint")
    [twin] = _alignment(con)["same_requests"]
    assert twin["matched"] == 64 and twin["requests"] == [64, 64]
    problems = [text for problem, text in describe(con, ["joint"]) if problem]
    twins = [t for t in problems if "bench.json and requests.jsonl look like two records of the same requests" in t]
    # two request sources re-time no steps of a second-stamped log: the others say so
    assert len(twins) == 1 and all("NOT re-timed" in t for t in problems if t not in twins)
    # other requests in the same minutes (every output one token longer) are no twins
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(rec / "server.log", other)
    shutil.copy(rec / "bench.json", other)
    lines = [json.loads(x) for x in (rec / "requests.jsonl").read_text().splitlines() if x.strip()]
    (other / "requests.jsonl").write_text(
        "".join(json.dumps(r | {"output_toks": r["output_toks"] + 1}) + "\n" for r in lines)
    )
    con2 = store.connect(tmp_path / "other.duckdb")
    ingest_paths(con2, [other / "server.log", other / "bench.json", other / "requests.jsonl"], run_id="joint")
    assert "same_requests" not in _alignment(con2)
    assert all(s["status"] != "failed" for s in _alignment(con2)["sources"])
    # one client alone: nothing to say
    assert "same_requests" not in _alignment(_joint(tmp_path, rec))


def test_starved_client_does_not_retime(tmp_path):
    """At 40 req/s the bench client read tokens in bursts, tens of ms late, and the steps served 72
    decode tokens more than it saw (2.4%): the counts disagree (their token times do not fit the log's
    stamps either), so the rebuilt timeline stays and the run says why."""
    con = _joint(tmp_path, PAIRS["vllm_queue"])
    how = _alignment(con)["sources"][0]["retime"]
    assert how["retimed"] is False and "(3121) and the client's (3049) differ" in how["why"]


def test_report_and_markdown_state_the_alignment(tmp_path):
    """The report's run section and summary.md say how the sources were joined; a hostile file
    name reaches them escaped."""
    import shutil

    from pipeline.summary import summary
    from pipeline.report.markdown import summary_markdown
    from pipeline.report.render import _run_section

    hostile = tmp_path / "<script>alert(1)<"
    hostile.mkdir()
    shutil.copy(PAIRS["vllm"] / "bench.json", hostile / "b<img src=x>.json")
    con = store.connect(tmp_path / "r.duckdb")
    ingest_paths(con, [PAIRS["vllm"] / "server.log", hostile / "b<img src=x>.json"], run_id="joint")
    store.build_derived(con)
    s = summary(con, "joint")
    html = _run_section(s).body
    assert "Sources and clocks" in html and "aligned with server.log" in html
    assert "<img" not in html and "&lt;img src=x&gt;" in html
    md = summary_markdown(s)
    assert "**Sources**:" in md and "scheduling inferred from steps" in md
    from markdown_it import MarkdownIt  # as a chat or PR would render it: the name is text

    rendered = MarkdownIt("commonmark", {"html": True}).render(md)
    assert "<img" not in rendered and "b&lt;img src=x&gt;.json" in rendered


def _unix_client(tmp_path: Path, shift_s: float) -> Path:
    """fixtures/vllm's requests as a client on the Unix clock (from the aligned joint run), moved by ``shift_s``."""
    con = _joint(tmp_path, PAIRS["vllm"], log="server_epoch.log")
    rows = con.execute(
        "select req_id, t_arrival, t_first_token, t_finish, prompt_tokens, output_tokens from requests "
        "where run_id = 'joint'"
    ).fetchall()
    con.close()
    lines = [json.dumps({"kind": "run", "engine": "client", "clock": "unix"})]  # the run --run-id names
    keys = ("req_id", "t_arrival", "t_first_token", "t_finish", "prompt_tokens", "output_tokens")
    for r in rows:
        rec = dict(zip(keys, r)) | {"kind": "request"}
        for k in ("t_arrival", "t_first_token", "t_finish"):
            rec[k] += shift_s
        lines.append(json.dumps(rec))
    out = tmp_path / f"client{shift_s:+.0f}.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.mark.parametrize("shift_s, aligned", [(5 * 3600.0, True), (3 * 86400.0, False)])
@pytest.mark.long
def test_unix_clocks_days_apart_are_two_runs(tmp_path, shift_s, aligned):
    # a log read in the wrong time zone is hours off and is aligned; days apart is another run
    client = _unix_client(tmp_path, shift_s)
    con = store.connect(tmp_path / "u.duckdb")
    ingest_paths(con, [PAIRS["vllm"] / "server_epoch.log", client], run_id="joint")
    src = _alignment(con)["sources"][0]
    if aligned:
        assert src["status"] == "aligned" and src["offset_s"] == pytest.approx(-shift_s, abs=0.05)
    else:
        assert src["status"] == "failed" and "3.0 days" in src["reason"], src


def test_given_offset_outside_the_log_warns(tmp_path):
    truth = _truth(PAIRS["vllm"])
    con = _joint(
        tmp_path, PAIRS["vllm"], log="server_epoch.log", clock_offsets=[f"bench.json={truth['offset_s'] + 1000}"]
    )
    src = _alignment(con)["sources"][0]
    assert src["status"] == "override" and src["steps_matched_share"] == 0.0
    problem, text = align.source_lines("joint", {"clock_alignment": _alignment(con)})[0]
    assert problem and "matched 0% of steps" in text
    # no step made these requests' first tokens: no scheduling is made up for them
    assert con.execute("select count(t_scheduled) from requests where run_id = 'joint'").fetchone()[0] == 0


def test_log_cut_short_leaves_later_requests_unscheduled(tmp_path):
    lines = (PAIRS["vllm"] / "server_epoch.log").read_text().splitlines(keepends=True)
    steps = [i for i, line in enumerate(lines) if "Iteration(" in line]
    cut = tmp_path / "server_epoch.log"
    cut.write_text("".join(lines[: steps[len(steps) // 2]]))
    con = store.connect(tmp_path / "c.duckdb")
    ingest_paths(con, [cut, PAIRS["vllm"] / "bench.json"], run_id="joint")
    store.build_derived(con)
    last_end = con.execute("select max(t_end) from iterations where run_id = 'joint'").fetchone()[0]
    after, unscheduled, queued_after = con.execute(
        "select count(*) filter (where q.t_first_token > $e + 0.05), "
        "count(*) filter (where q.t_scheduled is null), "
        "count(l.queue_ms) filter (where q.t_first_token > $e + 0.05) "
        "from requests q join request_latency l using (run_id, req_id) where run_id = 'joint'",
        {"e": last_end},
    ).fetchone()
    assert after >= 10 and unscheduled >= after and queued_after == 0
    inferred = _alignment(con)["sources"][0]["inferred"]["t_scheduled"]
    assert inferred["requests_outside_steps"] == unscheduled
    # those inside still get their queueing, close to the server's own
    truth = _truth(PAIRS["vllm"])["queue_ms"]
    got = con.execute(
        "select req_id::int, queue_ms from request_latency where run_id = 'joint' and queue_ms is not null"
    ).fetchall()
    err = np.array([abs(q - truth[i]) for i, q in got])
    assert len(got) >= 20 and np.median(err) <= 10.0


def test_steps_stamped_to_the_second_and_not_re_timed_are_named_with_their_error(tmp_path):
    """Three timed-out entries in bench.json keep its token times from re-timing the default log's
    steps: the inferred scheduling is then only as good as whole-second stamps, and the line says
    so as a warning instead of claiming ±0 ms."""
    bench = json.loads((PAIRS["vllm"] / "bench.json").read_text())
    for i in (10, 11, 12):
        bench["errors"][i], bench["output_lens"][i], bench["itls"][i] = "Timeout", 0, []
        bench["ttfts"][i] = bench["latencies"][i] = 0
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    con = store.connect(tmp_path / "t.duckdb")
    ingest_paths(con, [PAIRS["vllm"] / "server.log", tmp_path / "bench.json"], run_id="joint")
    src = _alignment(con)["sources"][0]
    assert not (src.get("retime") or {}).get("retimed")
    sched = src["inferred"]["t_scheduled"]
    assert sched["median_uncertainty_ms"] >= 1000 and sched["steps_not_retimed"]
    ((problem, text),) = align.describe(con, ["joint"])
    assert problem and "were NOT re-timed" in text and "up to a second off" in text
    # re-timed (the unchanged bench.json): no such warning
    con2 = _joint(tmp_path, PAIRS["vllm"])
    ((problem, text),) = align.describe(con2, ["joint"])
    assert not problem and "NOT re-timed" not in text and "steps re-timed from its token times" in text


@pytest.mark.parametrize("skew_s", [0.002, 0.004, -0.002])
@pytest.mark.long
def test_a_unix_client_a_few_ms_off_infers_the_preemptions_of_an_aligned_one(tmp_path, skew_s):
    """A client on a synchronised Unix clock a few ms off the log's is left on its clock; its
    token gaps are still matched to steps on the estimated offset: before, every token sat
    near a step boundary and dozens of requests got preemptions that never happened."""
    aligned = _joint(tmp_path, PAIRS["vllm"], log="server_epoch.log")
    want = dict(aligned.execute("select req_id, preemptions from requests where run_id = 'joint'").fetchall())
    rows = aligned.execute(
        "select r.req_id, r.t_arrival, r.t_first_token, r.t_finish, r.prompt_tokens, r.output_tokens, l.t_s "
        "from requests r join token_lists l using (run_id, req_id) where run_id = 'joint' order by r.req_id"
    ).fetchall()
    client = tmp_path / "client.jsonl"
    lines = [{"kind": "run", "clock": "unix"}] + [
        {
            "kind": "request",
            "req_id": r,
            "t_arrival": a + skew_s,
            "t_first_token": f + skew_s,
            "t_finish": e + skew_s,
            "prompt_tokens": p,
            "output_tokens": n,
            "token_times": [t + skew_s for t in ts],
        }
        for r, a, f, e, p, n, ts in rows
    ]
    client.write_text("".join(json.dumps(x) + "\n" for x in lines))
    con = store.connect(tmp_path / "u.duckdb")
    ingest_paths(con, [PAIRS["vllm"] / "server_epoch.log", client], run_id="u")
    meta = con.execute("select json_extract(meta, '$.clock_alignment') from runs where run_id = 'u'").fetchone()[0]
    src = json.loads(meta)["sources"][0]
    assert src["applied"] is False  # left on its clock: within a step of the log's
    got = dict(con.execute("select req_id, preemptions from requests where run_id = 'u'").fetchall())
    assert sum(got.values()) == sum(want.values()) and got == want


@pytest.mark.parametrize("off_by_s", [0.0, 0.003])
def test_preemptions_at_the_true_offset_are_vllms_own(tmp_path, off_by_s):
    """vLLM's request stats name the requests it preempted (2 of 64; one sat out steps between
    tokens, the other before its first).  Given the true offset, the client's read lag moves
    some tokens past a step end: before, 20 requests (10 at +3 ms) were said to be preempted."""
    rec = PAIRS["vllm"]
    stats = [json.loads(line) for line in (rec / "requests.jsonl").read_text().splitlines() if line.strip()]
    truth = {str(int(s["request_id"].split("-")[-2])): s["num_preemptions"] for s in stats}
    given = float(_truth(rec)["offset_s"]) + off_by_s
    con = _joint(tmp_path, rec, log="server_epoch.log", clock_offsets=[f"bench.json={given!r}"])
    got = dict(con.execute("select req_id, preemptions from requests where run_id = 'joint'").fetchall())
    said = {r for r, n in got.items() if n}
    assert said and all(truth[r] >= got[r] for r in said), {r: (got[r], truth[r]) for r in said}


def test_a_bursty_client_puts_no_time_on_preemption_vllm_did_not_make(tmp_path):
    """At 40 req/s the frontend lags and the client gets its tokens in bursts of up to 20 at once:
    every burst's first gap spans many steps.  vLLM preempted 8 of the 96 requests once; the tail
    attribution put time on preemption for nearly every request (41% of the TPOT tail, on a request
    vLLM never preempted).  Those gaps are not steps sat out: no request gets a preemption part, and
    explain says why."""
    from pipeline.fit import explain, get_or_fit

    rec = PAIRS["vllm_queue"]
    con = _joint(tmp_path, rec, log="server_epoch.log")
    get_or_fit(con, "joint")
    rows = con.execute(
        "select req_id, preemptions, preemption_ms, preemption_method from request_attribution where run_id = 'joint'"
    ).fetchall()
    assert len(rows) == 96 and all(p is None for _, p, _, _ in rows)  # none inferred: tokens come in bursts
    assert all(ms == 0 and method == "bursty" for _, _, ms, method in rows)
    out = explain(con, "joint", "tpot")
    assert any(
        "96 of 96 requests have no preemption counts and got their tokens in bursts" in x for x in out["statements"]
    )


def test_a_client_without_prompt_lengths_says_why_queueing_is_not_inferred(tmp_path):
    aligned = _joint(tmp_path, PAIRS["vllm"], log="server_epoch.log")
    rows = aligned.execute(
        "select req_id, t_arrival, t_first_token, t_finish, output_tokens from requests where run_id = 'joint'"
    ).fetchall()
    client = tmp_path / "client.jsonl"
    lines = [{"kind": "run", "clock": "unix"}] + [
        {"kind": "request", "req_id": r, "t_arrival": a, "t_first_token": f, "t_finish": e, "output_tokens": n}
        for r, a, f, e, n in rows
    ]
    client.write_text("".join(json.dumps(x) + "\n" for x in lines))
    con = store.connect(tmp_path / "p.duckdb")
    ingest_paths(con, [PAIRS["vllm"] / "server_epoch.log", client], run_id="p")
    ((_, text),) = align.describe(con, ["p"])
    assert "scheduling NOT inferred (its records give no prompt token counts)" in text, text
    assert con.execute("select count(t_scheduled) from requests where run_id = 'p'").fetchone()[0] == 0


@pytest.mark.parametrize("wrong_by_s", [0.01, 0.025, -0.02])
@pytest.mark.long
def test_given_offset_a_few_steps_off_warns(tmp_path, wrong_by_s):
    """An offset one to three steps wrong still matches 95-99% of the steps' decode counts, so it
    passed unremarked, while only 39-48% of first tokens landed on a step end (98% at the right one)
    and 44 requests were said to be preempted.  The estimate's offset is named beside it."""
    truth = float(_truth(PAIRS["vllm"])["offset_s"])
    given = truth + wrong_by_s
    con = _joint(tmp_path, PAIRS["vllm"], log="server_epoch.log", clock_offsets=[f"bench.json={given!r}"])
    src = _alignment(con)["sources"][0]
    assert src["status"] == "override" and src["offset_s"] == given and src["steps_matched_share"] >= 0.8
    better = src["estimate_fits_better"]
    assert better["offset_s"] == pytest.approx(truth, abs=3e-3) and better["requests_matched_share"] > 0.9
    problem, text = align.source_lines("joint", {"clock_alignment": _alignment(con)})[0]
    assert problem and f"the estimated offset {better['offset_s']:+.6f} s" in text
    # the right offset given: no such doubt
    (tmp_path / "right").mkdir()
    right = _joint(tmp_path / "right", PAIRS["vllm"], log="server_epoch.log", clock_offsets=[f"bench.json={truth!r}"])
    src = _alignment(right)["sources"][0]
    assert "estimate_fits_better" not in src
    assert not align.source_lines("joint", {"clock_alignment": _alignment(right)})[0][0]


def test_ingest_json_carries_each_files_alignment(tmp_path):
    """--json said which files loaded, not how the client was put on the log's clock: the offset,
    its uncertainty and a failure's reason were only in the text (or on stderr)."""
    from ..clirun import run_cli

    rec = PAIRS["vllm"]
    db = tmp_path / "j.duckdb"
    r = run_cli("ingest", rec / "server.log", rec / "bench.json", "--run-id", "joint", "--db", db, "--json")
    assert r.returncode == 0, r.stderr
    log, bench = json.loads(r.stdout)
    assert log["clock_alignment"] == []  # the steps' file is the clock, not placed on one
    (placed,) = bench["clock_alignment"]
    con = store.connect(db, read_only=True)
    (src,) = _alignment(con)["sources"]
    assert placed == {"run_id": "joint", "reference": [str(rec / "server.log")], **src}
    assert placed["status"] == "aligned" and placed["uncertainty_ms"] > 0


@pytest.mark.long
def test_a_client_moved_away_in_a_lake_leaves_the_steps_on_their_stamps(tmp_path):
    """The same as in a store (above), through a lake: its merge left out the removed client's clock
    alignment row, the one that says which steps it re-timed, so they stayed re-timed."""
    import polars as pl

    from ..clirun import run_cli

    rec = PAIRS["vllm"]
    lake = tmp_path / "lake"
    alone = store.connect(tmp_path / "alone.duckdb")
    ingest_paths(alone, [rec / "server.log"], run_id="joint")
    want = _steps(alone, "joint")

    def steps() -> np.ndarray:
        df = pl.read_parquet(lake / "iterations" / "run_id=joint" / "*.parquet").sort("iter")
        return df.select("t_start", "t_end").to_numpy()

    r = run_cli("ingest", rec / "server.log", rec / "bench.json", "--run-id", "joint", "--lake", lake)
    assert r.returncode == 0, r.stderr
    assert np.abs(steps() - want).max() > 0.01  # re-timed
    r = run_cli("ingest", rec / "bench.json", "--run-id", "other", "--replace", "--lake", lake)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(steps(), want)
