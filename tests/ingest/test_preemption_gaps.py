"""Preemptions inferred from a client's token gaps (queries/ingest/preemption_gaps.sql).

Steps end every 10 ms; each request's tokens are placed at step ends, with reads moved
across a step boundary by hand: jitter must not count as a preemption, a sat-out step must."""

from __future__ import annotations

import pytest

from pipeline import store

STEP_S = 0.010


def _gaps(tmp_path, step_of_each_token: dict[str, list[float]]) -> dict[str, tuple[int, int, int]]:
    con = store.connect(tmp_path / "p.duckdb")
    con.execute(
        "insert into iterations (run_id, iter, t_start, t_end) "
        "select 'r', i, i * $s, (i + 1) * $s from range(200) t(i)",
        {"s": STEP_S},
    )
    for req, steps in step_of_each_token.items():
        # a token is read 1 ms after the end of the step it is placed on (fractional steps: between)
        times = [(k + 1) * STEP_S + 0.001 for k in steps]
        con.execute("insert into token_lists values ('r', ?, ?, 7)", [req, times])
    store.materialise(con, "ingest/preemption_gaps", {"run": "r", "ing": 7, "shift": 0.0}, table="_g", temp=True)
    out = {r: (g, o, n) for r, g, o, n in con.execute("select req_id, gaps, ones, n from _g").fetchall()}
    con.close()
    return out


def test_one_token_per_step_has_no_gaps(tmp_path):
    assert _gaps(tmp_path, {"a": list(range(10, 30))})["a"] == (0, 19, 19)


@pytest.mark.parametrize(
    "name, steps, gaps",
    [
        # a read late by one step lands on the next one's step: dk 2 then 0
        ("late read", [10, 11, 12, 14, 14, 15, 16], 0),
        # a read early by one step: dk 0 then 2
        ("early read", [10, 11, 11, 13, 14, 15], 0),
        # the client stalled two steps, then read three tokens at once: dk 3, 0, 0
        ("client burst", [10, 11, 14, 14, 14, 15, 16], 0),
        # sat out steps 13-17: one preemption
        ("preempted", [10, 11, 12, 18, 19, 20], 1),
        # sat out two steps, next to a late read elsewhere in the request
        ("preempted and a late read", [10, 11, 14, 15, 17, 17, 18], 1),
        # sat out steps twice
        ("preempted twice", [10, 11, 15, 16, 17, 25, 26], 2),
        # a three-step preemption beside a late read: the read cancels one step, two remain
        ("preempted beside a late read", [10, 11, 16, 16, 17], 1),
    ],
)
def test_jitter_is_not_a_preemption_and_a_sat_out_step_is(tmp_path, name, steps, gaps):
    got = _gaps(tmp_path, {"x": steps})["x"]
    assert got[0] == gaps, name
    assert got[2] == len(steps) - 1  # every token after the first has a previous one


def test_random_requests_follow_the_one_written_rule(tmp_path):
    """Random requests (reads late and early, client bursts, steps sat out, side by side) against
    the rule written once in tests/jumps.py, which request_attribution.sql is checked against too:
    the two SQL copies of the rule cannot drift apart."""
    import random

    from tests.jumps import EDGE_REQUESTS, one_per_step_request, sat_out

    rng = random.Random(7)
    reqs = {f"r{i}": one_per_step_request(rng, rng.randint(5, 150), 199) for i in range(60)} | EDGE_REQUESTS
    got = _gaps(tmp_path, reqs)
    assert sum(len(sat_out(s)) for s in reqs.values()) >= 20  # the draw has steps sat out to find
    for r, steps in reqs.items():
        assert got[r][0] == len(sat_out(steps)), (r, steps)
