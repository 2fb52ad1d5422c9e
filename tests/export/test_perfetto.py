"""Perfetto export: a valid Trace Event Format file whose slices are the store's numbers."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from pipeline import store
from pipeline.ingest import ingest_paths

FIX = Path(__file__).resolve().parents[2] / "fixtures"


def _valid(doc: dict) -> list[dict]:
    """The Trace Event Format rules a viewer relies on; returns the events."""
    ev = doc["traceEvents"]
    for e in ev:
        assert e["ph"] in {"M", "X", "i", "C", "b", "e"} and isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0
        if e["ph"] in ("b", "e"):
            assert e["cat"] and e["id"] is not None
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
    # complete slices of one thread never overlap (Perfetto drops one that starts inside another)
    slices = sorted((e["pid"], e["tid"], e["ts"], e["dur"]) for e in ev if e["ph"] == "X")
    for (p1, t1, ts1, d1), (p2, t2, ts2, _) in zip(slices, slices[1:]):
        assert (p1, t1) != (p2, t2) or ts2 >= ts1 + d1 - 0.002, (ts1, d1, ts2)
    # async slices nest: every begin has its end, per (id, name), and ends never precede begins
    opened = Counter((e["id"], e["name"]) for e in ev if e["ph"] == "b")
    closed = Counter((e["id"], e["name"]) for e in ev if e["ph"] == "e")
    assert opened == closed
    begin = {(e["id"], e["name"]): e["ts"] for e in ev if e["ph"] == "b"}
    assert all(e["ts"] >= begin[(e["id"], e["name"])] for e in ev if e["ph"] == "e")
    return ev


@pytest.mark.long
def test_joint_vllm_run_exports_its_steps_and_requests(tmp_path):
    from click.testing import CliRunner

    from pipeline.cli import cli

    db = tmp_path / "p.duckdb"
    con = store.connect(db)
    ingest_paths(con, [FIX / "vllm" / "server_epoch.log", FIX / "vllm" / "requests.jsonl"], run_id="cpu")
    con.close()
    out = tmp_path / "cpu.json.gz"
    res = CliRunner().invoke(cli, ["export", "cpu", "--db", str(db), "--perfetto", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.load(gzip.open(out, "rt"))
    ev = _valid(doc)
    con = store.connect(db, read_only=True)
    steps = con.execute("select iter, iteration_ms from iteration_metrics where run_id = 'cpu'").fetchall()
    xs = {e["args"]["iter"]: e for e in ev if e["ph"] == "X"}
    assert len(xs) == len(steps) == doc["metadata"]["steps"]
    for i, ms in steps:  # us; unix doubles hold 0.24 us
        cut = xs[i]["args"]["overlap_ms"] or 0.0
        assert xs[i]["args"]["iteration_ms"] == ms
        assert xs[i]["dur"] == pytest.approx(max(ms - cut, 0) * 1000, abs=1.0), xs[i]
    # this log's steps overlap: vLLM stamps after the step and times another interval
    cut = [e for e in xs.values() if e["args"]["overlap_ms"]]
    assert len(cut) == doc["metadata"]["steps_overlapping_the_one_before"] > 0
    assert "drawn from the end of the step before them" in res.output
    lat = dict(con.execute("select req_id, queue_ms from request_latency where run_id = 'cpu'").fetchall())
    req_of = {e["id"]: e["args"]["req_id"] for e in ev if e["ph"] == "b" and e["name"].startswith("request ")}
    queue = {}
    for e in ev:
        if e["name"] == "queue":
            queue.setdefault(e["id"], {})[e["ph"]] = e["ts"]
    assert len(queue) == len(lat)
    for i, q in queue.items():
        assert (q["e"] - q["b"]) / 1000 == pytest.approx(lat[req_of[i]], abs=0.01)


@pytest.mark.long
def test_long_runs_are_sampled_by_a_stated_rule(tmp_path):
    from pipeline.export.perfetto import export
    from pipeline.fit import get_or_fit
    from pipeline.sim import run_simulation
    from pipeline.sim.model import NoiseModel

    sim = run_simulation(
        tmp_path / "s.jsonl",
        truth=False,
        iterations=12_000,
        noise=NoiseModel(sigma=0.03, stall_rate=0.01, stall_ms_mean=40.0),
        with_token_times=False,
    )
    con = store.connect(tmp_path / "s.duckdb")
    ingest_paths(con, [sim.trace_path])
    store.build_derived(con)
    get_or_fit(con, sim.run_id)
    info = export(con, sim.run_id, tmp_path / "s.json", max_steps=2000)
    ev = _valid(json.loads((tmp_path / "s.json").read_text()))
    n_steps = sum(e["ph"] == "X" for e in ev)
    stalls = con.execute("select count(*) from iteration_fit where is_stall").fetchall()[0][0]
    assert stalls > 10 and sum(e["ph"] == "i" for e in ev) == stalls  # every stall kept
    assert (
        n_steps
        <= 2000
        + stalls
        + con.execute("select count(*) from iteration_fit where spike_cause is not null").fetchall()[0][0]
    )
    assert "every 6th other step" in info["step_sampling"]
    assert (tmp_path / "s.json").stat().st_size < 12_000 * 400  # bounded: far less than every step in full


@pytest.mark.long
def test_a_million_step_run_exports_within_the_stated_bound(tmp_path):
    """1,000,000 steps, max_steps 20,000: every 50th step is kept (the stated rule, no spikes without a
    fit), the file is valid Trace Event Format, and its size is bounded by the kept steps, not the run."""
    from pipeline.export.perfetto import export

    con = store.connect(tmp_path / "m.duckdb")
    con.execute("insert into runs (run_id, engine, clock, meta) values ('big', 'sim', 'monotonic', '{}')")
    con.execute("""
        insert into iterations (run_id, iter, t_start, t_end, dur_ms, prefill_tokens, prefill_reqs, decode_tokens,
                                decode_reqs, context_tokens, running_reqs, waiting_reqs, kv_usage, preempted_reqs)
        select 'big', i, i * 0.021, i * 0.021 + 0.020, 20.0, case when i % 50 = 7 then 512 else 0 end,
               case when i % 50 = 7 then 1 else 0 end, 32, 32, 19200 + i % 1000, 33, i % 7, (i % 100) / 100.0, 0
        from range(1000000) t(i)""")
    store.build_derived(con)
    out = tmp_path / "big.json.gz"
    info = export(con, "big", out, max_steps=20_000)
    doc = json.load(gzip.open(out, "rt"))
    ev = _valid(doc)
    iters = sorted(e["args"]["iter"] for e in ev if e["ph"] == "X")
    assert iters == list(range(0, 1_000_000, 50))  # k = ceil(1e6 / 20,000) = 50: steps 0, 50, 100, ...
    assert info["step_sampling"] == "20,000+ steps: every spike and stall, and every 50th other step"
    assert sum(e["ph"] == "C" for e in ev) == 3 * 20_000  # counters follow the kept steps
    raw = len(gzip.open(out).read())
    assert raw < 600 * 20_000 + 4096  # about 480 bytes per kept step (slice + three counters)


@pytest.mark.long
def test_run_on_two_clocks_is_refused(tmp_path):
    """A server log with another run's bench JSON cannot be aligned: its steps and requests lie
    decades apart, and a timeline of them used to be written without a word."""
    import subprocess
    import sys

    db = tmp_path / "mix.duckdb"
    con = store.connect(db)
    ingest_paths(con, [FIX / "vllm" / "server.log", FIX / "vllm_queue" / "bench.json"], run_id="mix")
    store.build_derived(con)
    con.close()
    out = tmp_path / "mix.json"
    args = [sys.executable, "-m", "pipeline", "export", "mix", "--perfetto", str(out), "--db", str(db)]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("Error: run mix: its steps and requests are on different clocks")
    assert "--clock-offset" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_steps_without_times_are_counted_not_dropped_unsaid(tmp_path):
    """Canonical steps may carry only dur_ms: no place on a timeline. The export wrote fewer steps
    than the run has and said nothing."""
    from pipeline.export.perfetto import export

    lines = [json.loads(x) for x in (FIX / "canonical" / "tiny.jsonl").read_text().splitlines()]
    extra = [{"kind": "iteration", "iter": 500 + k, "dur_ms": 12.5, "decode_tokens": 2} for k in range(3)]
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in [*lines, *extra]) + "\n")
    con = store.connect(tmp_path / "t.duckdb")
    ingest_paths(con, [f])
    store.build_derived(con)
    total = con.execute("select count(*) from iterations").fetchall()[0][0]
    info = export(con, "tiny", tmp_path / "t.json")
    ev = _valid(json.loads((tmp_path / "t.json").read_text()))
    drawn = sum(e["ph"] == "X" for e in ev)
    assert info["steps_without_times"] == 3 and drawn == info["steps"] == total - 3
