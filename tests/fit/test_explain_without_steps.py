"""explain on a run of client records only (no steps): every part is unattributed, so it says
why and what the requests' own timestamps show: the wait for a batch in the tail and median
groups, against numpy on the same requests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.cli import run_captured as cli


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    rng = np.random.default_rng(3)
    n = 400
    arrival = np.sort(rng.uniform(0, 60, n))
    queue = np.linspace(0.01, 20.0, n) * rng.uniform(0.8, 1.2, n)  # a queue that builds up
    prefill = rng.uniform(0.02, 0.2, n)
    lines = [{"kind": "run", "run_id": "client", "clock": "unix"}]
    for i in range(n):
        t0 = 1.7e9 + arrival[i]
        lines.append(
            {
                "kind": "request",
                "req_id": f"r{i}",
                "t_arrival": t0,
                "t_scheduled": t0 + queue[i],
                "t_first_token": t0 + queue[i] + prefill[i],
                "t_finish": t0 + queue[i] + prefill[i] + 2.0,
                "output_tokens": 50,
            }
        )
    d = tmp_path_factory.mktemp("nosteps")
    (d / "c.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    code, out = cli("ingest", d / "c.jsonl", "--db", d / "s.duckdb")
    assert code == 0, out
    return d / "s.duckdb", lines[1:]


def _expected(reqs, metric: str) -> tuple[float, float, float, float]:
    """Tail (>= p99) and median (p40..p60) groups' mean wait and mean metric, numpy's linear percentiles."""
    arr = np.array([r["t_arrival"] for r in reqs])
    wait = (np.array([r["t_scheduled"] for r in reqs]) - arr) * 1000
    end = "t_first_token" if metric == "ttft" else "t_finish"
    v = (np.array([r[end] for r in reqs]) - arr) * 1000
    p40, p60, p99 = np.percentile(v, [40, 60, 99])
    tail, med = v >= p99, (v >= p40) & (v <= p60)
    return wait[tail].mean(), v[tail].mean(), wait[med].mean(), v[med].mean()


@pytest.mark.parametrize("metric", ["ttft", "e2e"])
def test_the_wait_for_a_batch_in_both_groups(run, metric):
    db, reqs = run
    code, out = cli("explain", "client", "--metric", metric, "--db", db, "--json")
    assert code == 0, out
    notes = json.loads(out)["statements"]
    assert any(n.startswith("the run has no steps (iteration records)") for n in notes), notes
    (said,) = [n for n in notes if n.startswith("from the timestamps alone")]
    tq, tv, mq, mv = _expected(reqs, metric)
    assert f"is {tq / tv:.1%} of the tail group's mean {metric.upper()} ({tq:,.1f} of {tv:,.1f} ms)" in said
    assert f"and {mq / mv:.1%} of the median group's ({mq:,.1f} of {mv:,.1f} ms)" in said


def test_tpot_says_only_that_steps_are_missing(run):
    db, _ = run
    code, out = cli("explain", "client", "--metric", "tpot", "--db", db, "--json")
    notes = json.loads(out)["statements"]
    assert code == 0 and any(n.startswith("the run has no steps") for n in notes)
    assert not any(n.startswith("from the timestamps alone") for n in notes)


def test_a_run_with_steps_gets_neither_note(tmp_path):
    from pathlib import Path

    fix = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
    db = tmp_path / "v.duckdb"
    code, out = cli("ingest", fix / "server_epoch.log", fix / "requests.jsonl", "--run-id", "v", "--db", db)
    assert code == 0, out
    code, out = cli("explain", "v", "--db", db, "--json")
    assert code == 0 and not any("no steps" in n or "timestamps alone" in n for n in json.loads(out)["statements"])


def test_a_log_cut_short_names_the_window_that_keeps_to_its_steps(tmp_path):
    """A log cut at 60% of its lines: the requests after it are all unattributed, which headlined
    the tail. The note says how many end after the last step and gives the --to that keeps to the
    log; with it, no time is unattributed."""
    import re
    from pathlib import Path

    rec = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
    lines = (rec / "server_epoch.log").read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.log"
    cut.write_text("".join(lines[: len(lines) * 6 // 10]))
    db = tmp_path / "c.duckdb"
    code, out = cli("ingest", cut, rec / "bench.json", "--run-id", "cut", "--tz", "UTC", "--db", db)
    assert code == 0, out
    code, out = cli("explain", "cut", "--db", db, "--json")
    res = json.loads(out)
    assert res["largest"] == "unattributed"
    (note,) = [n for n in res["statements"] if "after the log's last step" in n]
    n_after, to = re.search(r"(\d+) requests end after .* --to ([0-9.]+) keeps", note).groups()
    last = duckdb_last_step(db)
    assert int(n_after) == requests_ending_after(db, last) and abs(float(to) - (last - res["run_start"])) < 1e-3
    code, out = cli("explain", "cut", "--db", db, "--to", to, "--json")
    parts = {p["part"]: p for p in json.loads(out)["parts"]}
    assert parts["unattributed"]["growth_ms"] == 0 and json.loads(out)["largest"] != "unattributed"


def duckdb_last_step(db) -> float:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("select max(t_end) from iterations where run_id = 'cut'").fetchone()[0]
    finally:
        con.close()


def requests_ending_after(db, t: float) -> int:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("select count(*) from requests where run_id = 'cut' and t_finish > ?", [t]).fetchone()[0]
    finally:
        con.close()
