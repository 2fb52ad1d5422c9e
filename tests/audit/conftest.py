"""A tiny hand-made run whose goodput and fluidity are computed by hand in the tests."""

from __future__ import annotations

import json

import pytest

# Deadlines used by the hand computations: TTFT 100 ms, TBT 10 ms; goodput ttft <= 100, tpot <= 12.
REQUESTS = [
    # R1: TTFT 50, gaps 8 8 8 -> tpot 8, good; fluidity 1
    {
        "req_id": "R1",
        "t_arrival": 0.0,
        "t_scheduled": 0.01,
        "t_first_token": 0.050,
        "t_finish": 0.074,
        "prompt_tokens": 10,
        "output_tokens": 4,
        "token_times": [0.050, 0.058, 0.066, 0.074],
    },
    # R2: TTFT 20, gaps 8 65 5 -> tpot 26 (not good); the 65 ms stall is absorbed by slack: fluidity 1
    {
        "req_id": "R2",
        "t_arrival": 1.0,
        "t_scheduled": 1.005,
        "t_first_token": 1.020,
        "t_finish": 1.098,
        "prompt_tokens": 10,
        "output_tokens": 4,
        "token_times": [1.020, 1.028, 1.093, 1.098],
    },
    # R3: TTFT 153 (late: 1 + 5 misses), gaps 8 43 (late: 4 misses) 8 5 -> fluidity 3/13; tpot 16
    {
        "req_id": "R3",
        "t_arrival": 2.0,
        "t_scheduled": 2.1,
        "t_first_token": 2.153,
        "t_finish": 2.217,
        "prompt_tokens": 10,
        "output_tokens": 5,
        "token_times": [2.153, 2.161, 2.204, 2.212, 2.217],
    },
    # R4: one token, TTFT 90: good (no TPOT), fluidity 1
    {
        "req_id": "R4",
        "t_arrival": 3.0,
        "t_scheduled": 3.0,
        "t_first_token": 3.090,
        "t_finish": 3.090,
        "prompt_tokens": 10,
        "output_tokens": 1,
        "token_times": [3.090],
    },
    # R5: failed request: never good, not in fluidity
    {"req_id": "R5", "t_arrival": 0.5, "status": "error", "prompt_tokens": 10, "output_tokens": 0},
    # R6: ok, no token times: TTFT 30, tpot 10 -> good; not in fluidity
    {
        "req_id": "R6",
        "t_arrival": 4.0,
        "t_scheduled": 4.0,
        "t_first_token": 4.030,
        "t_finish": 4.050,
        "prompt_tokens": 10,
        "output_tokens": 3,
    },
]


def write_trace(path, run_id, requests, iterations=()):
    lines = [{"kind": "run", "run_id": run_id, "engine": "hand", "model": "toy", "clock": "monotonic"}]
    lines += [{"kind": "iteration", **it} for it in iterations]
    lines += [{"kind": "request", **r} for r in requests]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def load(db_path, *traces):
    from pipeline import ingest, store

    con = store.connect(db_path)
    ingest.ingest_paths(con, list(traces))
    store.build_derived(con)
    return con


@pytest.fixture
def make_store(tmp_path, db_path):
    """``make_store(run_id, requests, iterations=())``: ingest a trace into the test store, return the connection."""
    cons = []

    def make(run_id, requests, iterations=()):
        if cons:
            cons.pop().close()
        cons.append(load(db_path, write_trace(tmp_path / f"{run_id}.jsonl", run_id, requests, iterations)))
        return cons[-1]

    yield make
    for c in cons:
        c.close()


@pytest.fixture
def tiny_run(make_store, db_path):
    """(connection, db path) of a store holding run ``aud`` (REQUESTS, no iterations)."""
    return make_store("aud", REQUESTS), db_path
