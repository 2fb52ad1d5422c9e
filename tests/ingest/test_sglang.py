"""SGLang scheduler logs (every wording variant) and --export-metrics-to-file records."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest


from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sglang"


def unix(s: str) -> float:
    return dt.datetime.fromisoformat(s).replace(tzinfo=dt.timezone.utc).timestamp()


def test_docs_lines(con):
    (res,) = load(con, FIX / "server.log")
    assert (res.format, res.accepted, res.rejected, res.skipped) == ("sglang-log", 3, 0, 2)
    got = con.execute(
        "select iter, t_end, dur_ms, prefill_tokens, prefill_reqs, decode_reqs, context_tokens, "
        "running_reqs, waiting_reqs, kv_usage, extra->>'$.cached_tokens' from iterations order by iter"
    ).fetchall()
    t = unix("2025-09-03 05:49:04")
    assert got == [
        (0, t, None, 115, 1, 0, None, 0, 0, 0.02, "351"),
        (1, t, pytest.approx(1 * 1000 / 65.75), 0, 0, 1, 501, 1, 0, 0.02, None),
        (2, t + 1, pytest.approx(1 * 1000 / 75.29), 0, 0, 1, 541, 1, 0, 0.03, None),
    ]
    meta = json.loads(con.execute("select meta from runs").fetchall()[0][0])
    assert meta["decode_lines_sampled"] is True and meta["decode_log_interval"] == 40
    assert meta["estimated"] == ["dur_ms"]
    # the prefill step has no duration: it must not count as a 0 ms iteration
    assert con.execute("select count from metric_stats where metric = 'iteration_ms'").fetchall() == [(2,)]


def test_wording_variants_and_step_counters(con):
    (res,) = load(con, FIX / "server_tp.log")
    assert (res.accepted, res.rejected) == (6, 0)
    got = con.execute(
        "select extra->>'$.phase', extra->>'$.sglang_iter', prefill_tokens, running_reqs, decode_reqs, "
        "context_tokens, waiting_reqs, extra->>'$.graph' from iterations order by iter"
    ).fetchall()
    assert got == [
        ("Prefill", None, 200, 0, 0, None, 0, None),  # older lines say nothing about graphs
        ("Decode", None, 0, 1, 1, 234, 0, None),
        ("Decode", None, 0, 1, 1, 2154, 0, None),
        ("Prefill", "41", 300, 3, 0, None, 1, "false"),
        ("Decode", "80", 0, 5, 5, 1800, 1, "true"),
        ("Decode", "120", 0, 5, 5, 2000, 0, "true"),
    ]
    meta = json.loads(con.execute("select meta from runs").fetchall()[0][0])
    assert meta["decode_log_interval"] == 40 and meta["decode_log_interval_source"] == "step counters in the log"
    assert meta["ranks"] == ["DP0 TP3", "TP0"]


def test_broken_lines(con, tmp_path):
    lines = (FIX / "server.log").read_text().splitlines()
    lines[2] = lines[2].split("gen throughput")[0]  # truncated decode line
    lines[1] = lines[1].replace("#new-token: 115, ", "")  # prefill line missing a field
    path = tmp_path / "s.log"
    path.write_text("\n".join(lines) + "\n")
    load(con, path)
    rej = dict(con.execute("select line_no, reason from rejects").fetchall())
    assert rej == {
        2: "SGLang Prefill batch line without #new-token",
        3: "SGLang Decode batch line without #queue-req, gen throughput (token/s)",
    }
    assert con.execute("select count(*) from iterations").fetchall() == [(1,)]


def test_two_batch_lines_run_together_are_one_reject(con, tmp_path):
    lines = (FIX / "server.log").read_text().splitlines()
    marks = [i for i, line in enumerate(lines) if " batch. " in line]
    a = marks[0]
    lines[a] = lines[a][: lines[a].index(" batch. ") + 12] + lines[a + 1]  # cut, the next line written on it
    del lines[a + 1]
    path = tmp_path / "s.log"
    path.write_text("\n".join(lines) + "\n")
    (res,) = load(con, path)
    rej = con.execute("select line_no, reason from rejects").fetchall()
    assert rej == [
        (a + 1, "two SGLang batch lines run together (a line cut short with the next written on it): neither is read")
    ]
    assert res.lines_read == res.accepted + res.rejected + res.skipped


@pytest.mark.parametrize(
    "line, old, new, reason",
    [
        (
            2,
            "#running-req: 1,",
            "#running-req: -5,",
            "#running-req: -5 is out of range (allowed: an integer from 0 to 2^53)",
        ),
        (
            2,
            "#running-req: 1,",
            "#running-req: 99999999999999999999,",
            "#running-req: 99999999999999999999 is out of range (allowed: an integer from 0 to 2^53)",
        ),
        (
            2,
            "#running-req: 1,",
            "#running-req: 2.5,",
            "#running-req: expected an integer, got 2.5",
        ),
        (2, "#running-req: 1,", "#running-req: many,", "#running-req: expected an integer, got many"),
        (1, "#queue-req: 0,", "#queue-req: -1,", "#queue-req: -1 is out of range (allowed: an integer from 0 to 2^53)"),
        (
            2,
            "token usage: 0.02,",
            "token usage: 7.5,",
            "token usage: 7.5 is out of range (allowed: a fraction from 0 to 1)",
        ),
        (
            2,
            "gen throughput (token/s): 65.75,",
            "gen throughput (token/s): -65.75,",
            "gen throughput (token/s): -65.75 is out of range (allowed: a number from 0 up)",
        ),
    ],
)
def test_value_out_of_range_is_named_not_missing(con, tmp_path, line, old, new, reason):
    """A value that is there but out of range is said to be, naming the field, the value and the
    range: never "without #running-req", which sends the user looking for a missing field."""
    lines = (FIX / "server.log").read_text().splitlines()
    assert old in lines[line]
    lines[line] = lines[line].replace(old, new)
    path = tmp_path / "s.log"
    path.write_text("\n".join(lines) + "\n")
    (res,) = load(con, path)
    assert (res.accepted, res.rejected) == (2, 1)
    phase = "Prefill" if line == 1 else "Decode"
    rej = dict(con.execute("select line_no, reason from rejects").fetchall())
    assert rej == {line + 1: f"SGLang {phase} batch line: {reason}"}


def test_request_metrics_export(con):
    path = FIX / "sglang-request-metrics-20260301_10.log"
    (res,) = load(con, path)
    assert (res.format, res.accepted, res.rejected) == ("sglang-metrics", 3, 0)
    got = con.execute(
        "select req_id, t_arrival, t_finish, prompt_tokens, output_tokens, cached_tokens, status "
        "from requests order by req_id"
    ).fetchall()
    assert got == [
        ("a1", 1772359200.125, 1772359200.537, 5, 16, 0, "ok"),
        ("a2", 1772359200.5, pytest.approx(1772359200.7), 7, 8, 5, "ok"),  # finish = arrival + e2e_latency
        ("a3", 1772359201.0, 1772359201.01, 3, 0, 0, "aborted"),
    ]
    assert con.execute(
        "select count from metric_stats where metric = 'e2e_ms' and run_id = ?", [path.name.split(".")[0]]
    ).fetchall() == [(2,)]


def test_current_line_variants(tmp_path):
    """2026 wording: 'Prefill batch,', 'Prefill batch. iter:', '#full token' on hybrid models,
    '[first graph replay]', and speculative decoding's 'accept len' (tokens per request per step)."""
    from pipeline import store
    from pipeline.ingest import detect, ingest_paths

    src = Path(__file__).resolve().parents[2] / "fixtures" / "sglang" / "server_2026.log"
    assert detect(src).name == "sglang-log"
    con = store.connect(tmp_path / "s.duckdb")
    res = ingest_paths(con, [src], run_id="s")[0]
    assert (res.lines_read, res.accepted, res.rejected) == (5, 5, 0)
    rows = con.execute(
        "select prefill_tokens, prefill_reqs, decode_reqs, decode_tokens, context_tokens, kv_usage, "
        "dur_ms from iterations order by iter"
    ).fetchall()
    assert rows[0][:2] == (64, 1) and rows[1][:2] == (128, 2)
    assert rows[3][2:6] == (3, 3, 960, 0.31)  # '#full token', 'full token usage'
    # first graph replay, accept len 4.75: 3 requests x 4.75 tokens; step = tokens / throughput
    assert rows[4][2:4] == (3, round(3 * 4.75))
    assert rows[4][6] == pytest.approx(3 * 4.75 * 1000 / 149.0)


@pytest.mark.parametrize("accept", ["inf", "1e300", "99999999999999999999"])
@pytest.mark.long
def test_absurd_accept_len_is_a_reject_not_a_crash(tmp_path, accept):
    """accept len times #running-req is the step's decode tokens: an infinite or huge one does not
    fit an integer and crashed the converter (InvalidOperationError); it is a rejected line."""
    from pipeline import store
    from pipeline.ingest import ingest_paths

    head = "[2026-05-19 00:32:54 DP0 TP0] Decode batch [first graph replay], #running-req: 3, #token: 1000, "
    tail = "token usage: 0.31, cuda graph: True, gen throughput (token/s): 149.0, accept len: {}, #queue-req: 0\n"
    f = tmp_path / "sg.log"
    f.write_text(head + tail.format(accept) + head + tail.format("1.5"))
    con = store.connect(tmp_path / "s.duckdb")
    (res,) = ingest_paths(con, [f], fmt="sglang-log")
    assert (res.accepted, res.rejected) == (1, 1)
    ((line,),) = con.execute("select line_no from rejects").fetchall()
    assert line == 1
    assert con.execute("select decode_tokens from iterations").fetchall() == [(4,)]  # round(3 * 1.5)


@pytest.mark.parametrize("name", ["server.log", "server_2026.log", "server_tp.log"])
@pytest.mark.long
def test_a_repeated_log_counts_each_step_once(con, tmp_path, name):
    """A log fetched twice (cat, copytruncate overlap) held every step twice: 100% more tokens and
    throughput, and steps going back in time, with nothing said."""
    text = (FIX / name).read_text()
    twice = tmp_path / f"twice-{name}"
    twice.write_text(text + text)
    (one,) = load(con, FIX / name, run_id="one")
    (two,) = load(con, twice, run_id="two")
    assert two.accepted == one.accepted and two.rejected == one.accepted, two.line()
    sums = "select count(*), sum(prefill_tokens), sum(decode_tokens), min(t_end), max(t_end) from iterations where run_id = $r"
    assert con.execute(sums, {"r": "two"}).fetchall() == con.execute(sums, {"r": "one"}).fetchall()
    n = len(text.splitlines())
    rejected = con.execute(
        "select line_no from rejects where path like $p order by 1", {"p": f"%{twice.name}"}
    ).fetchall()
    assert rejected and all(line > n for (line,) in rejected), rejected  # only the second copy's lines


def test_data_parallel_ranks_are_runs_of_their_own(con, tmp_path):
    """Each DP rank's scheduler logs its own batches into one file: their steps interleaved in one
    run overlapped on one timeline (batch and iteration statistics of two engines mixed)."""
    lines = (FIX / "server_2026.log").read_text().splitlines()
    other = [x.replace("DP0 TP0", "DP1 TP1").replace("#running-req: 3", "#running-req: 7") for x in lines]
    log = tmp_path / "dp.log"
    log.write_text("\n".join(x for pair in zip(lines, other) for x in pair) + "\n")
    (res,) = load(con, log)
    assert sorted(res.run_ids) == ["dp-dp0", "dp-dp1"] and res.rejected == 0, res.line()
    rows = con.execute(
        "select run_id, list(iter order by iter), list(running_reqs order by iter), count(*) "
        "from iterations group by 1 order by 1"
    ).fetchall()
    assert rows == [
        ("dp-dp0", [0, 1, 2, 3, 4], [0, 1, 1, 3, 3], 5),
        ("dp-dp1", [0, 1, 2, 3, 4], [0, 1, 1, 7, 7], 5),
    ]
    metas = {r: json.loads(m) for r, m in con.execute("select run_id, meta from runs").fetchall()}
    assert metas["dp-dp1"]["dp_rank"] == 1 and metas["dp-dp1"]["dp_ranks"] == 2
    assert metas["dp-dp1"]["ranks"] == ["DP1 TP1", "DP1 TP1 EP0"]  # its own tags only


def test_coloured_log_reads_as_the_plain_one(tmp_path):
    """A coloured formatter's ANSI codes (here around the stamp and rank tags) are stripped
    before the fields are read: the same steps and rank tags as the plain log."""
    from pipeline import store

    plain = (FIX / "server_tp.log").read_text().splitlines()
    coloured = [f"\x1b[90m[\x1b[32m{ln[1:].replace(']', chr(27) + '[0m]', 1)}" for ln in plain]
    assert coloured[3].startswith("\x1b[90m[\x1b[32m2026-03-01 10:00:00 DP0 TP3\x1b[0m] Prefill batch [41],")
    got = []
    for name, lines in (("plain", plain), ("coloured", coloured)):
        path = tmp_path / f"{name}.log"
        path.write_text("\n".join(lines) + "\n")
        con = store.connect(tmp_path / f"{name}.duckdb")
        (res,) = load(con, path, tz="UTC")
        got.append(
            (
                (res.format, res.accepted, res.rejected),
                con.execute(
                    "select iter, t_end, dur_ms, prefill_tokens, running_reqs, context_tokens from iterations order by iter"
                ).fetchall(),
                json.loads(con.execute("select meta from runs").fetchall()[0][0])["ranks"],
            )
        )
    assert got[1] == got[0]
    assert got[0][0] == ("sglang-log", 6, 0) and got[0][2] == ["DP0 TP3", "TP0"]
    assert got[0][1][3][:4] == (3, unix("2026-03-01 10:00:00"), None, 300)
