"""Messy real split evidence: the recorded vLLM run (fixtures/vllm) as an on-call engineer gets it.

The ground truth is the same run's server stats (requests.jsonl: engine-side scheduled times on
the monotonic clock the bench's perf_counter start times are on) and its epoch-stamped log.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from pipeline import store
from pipeline.ingest import ingest_paths

REC = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"


def _truth_queue_ms() -> np.ndarray:
    bench = json.loads((REC / "bench.json").read_text())
    stats = [json.loads(x) for x in (REC / "requests.jsonl").read_text().splitlines() if x.strip()]
    by_idx = {int(s["request_id"].split("-")[-2]): s for s in stats}
    start = np.array(bench["start_times"])
    return (np.array([by_idx[i]["scheduled_ts"] for i in range(len(start))]) - start) * 1e3


def _ingest(tmp_path, name: str, files, **kw):
    con = store.connect(tmp_path / f"{name}.duckdb")
    ingest_paths(con, [str(f) for f in files], run_id="r", tz="UTC", **kw)
    store.build_derived(con)
    return con


def _queue(con) -> np.ndarray:
    q = con.execute("select queue_ms from request_latency where run_id = 'r' order by req_id::int").fetchnumpy()
    return np.ma.filled(np.ma.asarray(q["queue_ms"], dtype=float), np.nan)


def _restarted(src: Path, out: Path, at_step: int) -> Path:
    """``src`` with the engine restarted before its ``at_step``-th step line: the start-up lines
    are logged again and the iteration counter starts from 0 (the stamps run on)."""
    lines = src.read_text().splitlines(keepends=True)
    steps = [i for i, x in enumerate(lines) if "Iteration(" in x]
    cut = steps[at_step]

    def renumber(line: str) -> str:
        return re.sub(r"Iteration\((\d+)\)", lambda m: f"Iteration({int(m.group(1)) - at_step})", line)

    out.write_text("".join(lines[:cut] + lines[: steps[0]] + [renumber(x) for x in lines[cut:]]))
    return out


@pytest.mark.parametrize("log", ["server.log", "server_epoch.log"])
@pytest.mark.long
def test_a_log_with_an_engine_restart_keeps_the_steps_after_it(tmp_path, log):
    """The iteration counter starting again at a restart made every later step a 'duplicate iter'
    reject: half the steps were lost, the whole-second log was no longer re-timed, queue p50 read
    0 ms for 17 ms (15 requests without any) and the TTFT tail went 109% 'unattributed'."""
    log_path = _restarted(REC / log, tmp_path / "restarted.log", 266)
    whole = _ingest(tmp_path, "whole", [REC / log, REC / "bench.json"])
    con = _ingest(tmp_path, "restart", [log_path, REC / "bench.json"])
    assert con.execute("select count(*) from rejects").fetchone()[0] == 0
    n, lo, hi = con.execute("select count(*), min(iter), max(iter) from iterations where run_id = 'r'").fetchone()
    assert (n, lo, hi) == (532, 0, 531)
    # the steps after the restart keep the log's own counter, and are the same steps at the same times
    got = con.execute(
        "select iter, t_end, json_extract(extra, '$.log_iter')::int, json_extract(extra, '$.engine_start')::int "
        "from iterations where run_id = 'r' order by iter"
    ).fetchnumpy()
    want = whole.execute("select iter, t_end from iterations where run_id = 'r' order by iter").fetchnumpy()
    np.testing.assert_allclose(got["t_end"], want["t_end"], rtol=0, atol=1e-6)
    log_iter = next(v for k, v in got.items() if k.startswith("CAST(json_extract(extra, '$.log_iter')"))
    assert list(log_iter[264:268]) == [264, 265, 0, 1]
    restarts = json.loads(
        con.execute("select json_extract(meta, '$.engine_restarts') from runs where run_id = 'r'").fetchone()[0]
    )
    assert [(r["log_iter"], r["previous_iter"]) for r in restarts] == [(0, 265)]
    # queueing for every request, as far from the server's own stats as without the restart
    q, truth = _queue(con), _truth_queue_ms()
    assert not np.isnan(q).any()
    np.testing.assert_allclose(q, _queue(whole), rtol=0, atol=1e-6)
    assert np.median(np.abs(q - truth)) <= 5.0
    assert np.percentile(q, 50) == pytest.approx(np.percentile(truth, 50), abs=7.0)


def test_a_log_pasted_twice_is_no_restart(tmp_path):
    """The counter falls but the stamps go back too: the second copy's lines stay duplicates."""
    text = (REC / "server_epoch.log").read_text()
    twice = tmp_path / "twice.log"
    twice.write_text(text + text)
    con = _ingest(tmp_path, "twice", [twice])
    assert con.execute("select count(*) from iterations").fetchone()[0] == 532
    assert con.execute("select count(*) from rejects").fetchone()[0] == 532  # duplicates (one by its stamp)
    assert con.execute("select json_extract(meta, '$.engine_restarts') from runs").fetchone()[0] is None


def test_step_lines_out_of_order_within_a_second_are_no_restart(tmp_path):
    """Whole-second stamps cannot order two lines of one second: a counter that falls by a few
    steps there is lines out of order, and every step keeps its number."""
    lines = (REC / "server.log").read_text().splitlines(keepends=True)
    steps = [i for i, x in enumerate(lines) if "Iteration(" in x]
    a, b = steps[100], steps[105]
    assert lines[a][:20] == lines[b][:20]  # same second
    moved = lines[:a] + lines[a + 1 : b + 1] + [lines[a]] + lines[b + 1 :]
    log = tmp_path / "moved.log"
    log.write_text("".join(moved))
    con = _ingest(tmp_path, "moved", [log])
    assert con.execute("select count(*), max(iter) from iterations").fetchone() == (532, 531)
    assert con.execute("select json_extract(meta, '$.engine_restarts') from runs").fetchone()[0] is None


def _explain(con, metric: str = "ttft") -> dict:
    from pipeline.fit import get_or_fit
    from pipeline.fit.attribution import explain

    get_or_fit(con, "r")
    return explain(con, "r", metric)


def _client_jsonl(out: Path) -> Path:
    """The bench's requests as a client's own per-request JSONL on its perf_counter clock."""
    bench = json.loads((REC / "bench.json").read_text())
    rows = [json.dumps({"kind": "run", "clock": "monotonic"})]
    for i, start in enumerate(bench["start_times"]):
        first = start + bench["ttfts"][i]
        tokens = list(first + np.concatenate([[0.0], np.cumsum(bench["itls"][i])]))
        rows.append(
            json.dumps(
                {
                    "kind": "request",
                    "req_id": f"r{i}",
                    "t_arrival": start,
                    "t_first_token": first,
                    "t_finish": start + bench["latencies"][i],
                    "prompt_tokens": bench["input_lens"][i],
                    "output_tokens": bench["output_lens"][i],
                    "token_times": tokens,
                }
            )
        )
    out.write_text("\n".join(rows) + "\n")
    return out


@pytest.mark.long
def test_explain_warns_when_the_steps_were_not_re_timed(tmp_path):
    """Two client files of the run (the bench JSON and a per-request JSONL) are aligned each on its
    own, so neither re-times the whole-second log: its steps sit up to a second off, and explain put
    the TTFT tail 113% on 'own_prefill' (the epoch-stamped log: 70% waiting_capacity, 21%
    waiting_hol) with no word of doubt; the ingest line's warning was all. Now explain says so
    first, naming why; a re-timed run has no such warning."""
    truth = _explain(_ingest(tmp_path, "truth", [REC / "server_epoch.log", REC / "bench.json"]))
    assert truth["largest"] == "waiting_capacity" and truth["warnings"] == []
    whole = _explain(_ingest(tmp_path, "whole", [REC / "server.log", REC / "bench.json"]))
    assert whole["largest"] == truth["largest"] and whole["warnings"] == []
    client = _client_jsonl(tmp_path / "client.jsonl")
    two = _explain(_ingest(tmp_path, "two", [REC / "server.log", REC / "bench.json", client]))
    assert two["largest"] != truth["largest"]  # the shares are wrong ...
    warning, twins = two["warnings"]  # ... and said to be
    assert "NOT re-timed" in warning and "up to a second" in warning
    assert "2 request files, each aligned on its own" in warning
    # the client file here is the bench's requests written again: the ingest's word on that is repeated
    assert "look like two records of the same requests" in twins
    from pipeline.fit.text import format_explain

    text = format_explain(two).splitlines()
    assert text[1] == f"  warning: {warning}"


@pytest.mark.long
def test_server_records_with_their_own_scheduling_warn_of_coarse_steps(tmp_path):
    """vLLM's per-request records bring their own scheduled times, so nothing is inferred on the
    whole-second log, and the warning lived only with inferred scheduling: explain put the TTFT
    tail 73% on 'unexplained' (the epoch-stamped log: waiting_capacity) with no word of doubt."""
    truth = _explain(_ingest(tmp_path, "truth", [REC / "server_epoch.log", REC / "requests.jsonl"]))
    assert truth["largest"] == "waiting_capacity" and truth["warnings"] == []
    con = _ingest(tmp_path, "whole", [REC / "server.log", REC / "requests.jsonl"])
    whole = _explain(con)
    assert whole["largest"] != truth["largest"]  # the shares are wrong ...
    (warning,) = whole["warnings"]  # ... and said to be
    assert "NOT re-timed" in warning and "no per-token times" in warning
    from pipeline.ingest.align import describe

    lines = [text for bad, text in describe(con, ["r"]) if bad]  # the ingest's own warning line
    assert any("requests.jsonl aligned with server.log" in t and "NOT re-timed" in t for t in lines), lines


@pytest.mark.parametrize("order", ["older first", "newer first"])
def test_the_pieces_of_a_rotated_log_are_re_timed_as_one_log(tmp_path, order):
    """A whole-second log rotated into server.log.1 and server.log, given as two files: only a
    single steps file was re-timed, so its steps stayed up to a second off: queue p50 3.9 ms for
    17 ms (error 12 ms median, 363 ms at most) and the TTFT tail 109% 'own_prefill' for 70%
    'waiting_capacity'. The pieces (stamps one after the other) are now re-timed as one log: the
    same steps, queueing and attribution as the log in one file."""
    lines = (REC / "server.log").read_text().splitlines(keepends=True)
    older, newer = tmp_path / "server.log.1", tmp_path / "server.log"
    older.write_text("".join(lines[:380]))
    newer.write_text("".join(lines[380:]))
    files = [older, newer] if order == "older first" else [newer, older]
    whole = _ingest(tmp_path, "whole", [REC / "server.log", REC / "bench.json"])
    con = _ingest(tmp_path, "pieces", [*files, REC / "bench.json"])
    src = json.loads(
        con.execute("select json_extract(meta, '$.clock_alignment') from runs where run_id = 'r'").fetchone()[0]
    )["sources"][0]
    assert src["retime"]["retimed"], src
    get = "select iter, t_end from iterations where run_id = 'r' order by iter"
    np.testing.assert_allclose(
        con.execute(get).fetchnumpy()["t_end"], whole.execute(get).fetchnumpy()["t_end"], rtol=0, atol=1e-6
    )
    q, truth = _queue(con), _truth_queue_ms()
    np.testing.assert_allclose(q, _queue(whole), rtol=0, atol=1e-6)
    assert np.median(np.abs(q - truth)) <= 5.0 and np.max(np.abs(q - truth)) <= 15.0
    assert np.percentile(q, 50) == pytest.approx(np.percentile(truth, 50), abs=7.0)
    epoch = _explain(_ingest(tmp_path, "epoch", [REC / "server_epoch.log", REC / "bench.json"]))
    got = _explain(con)
    assert got["warnings"] == [] and got["largest"] == epoch["largest"] == "waiting_capacity"
    shares = {p["part"]: p["share"] for p in got["parts"]}
    for p in epoch["parts"]:
        assert shares[p["part"]] == pytest.approx(p["share"], abs=0.02)
