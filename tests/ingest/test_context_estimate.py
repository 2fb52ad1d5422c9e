"""context_tokens estimated from request timelines (POST_INGEST as-of join), marked as estimated."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline import ingest

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"


def write(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def steps(n, dt=0.01, t0=0.0):
    return [{"kind": "iteration", "iter": i, "t_start": t0 + i * dt, "t_end": t0 + (i + 1) * dt} for i in range(n)]


def test_hand_computed(con, tmp_path):
    """Two requests: A (prompt 100) prefills in step 0 alone, decodes in steps 1-4; B (prompt 40)
    prefills in two chunks, steps 2 and 3, then decodes in step 4."""
    reqs = [
        {
            "kind": "request",
            "req_id": "A",
            "t_arrival": 0.0,
            "t_scheduled": 0.0,
            "t_first_token": 0.01,
            "t_finish": 0.05,
            "prompt_tokens": 100,
            "output_tokens": 5,
            "token_times": [0.01, 0.02, 0.03, 0.04, 0.05],
        },
        {
            "kind": "request",
            "req_id": "B",
            "t_arrival": 0.015,
            "t_scheduled": 0.02,
            "t_first_token": 0.04,
            "t_finish": 0.05,
            "prompt_tokens": 40,
            "output_tokens": 2,
        },  # no token times: interpolated
    ]
    ingest.ingest_paths(
        con,
        [
            write(tmp_path / "it.jsonl", [{"kind": "run", "run_id": "r", "clock": "monotonic"}, *steps(6)]),
            write(tmp_path / "rq.jsonl", [{"kind": "run", "run_id": "r"}, *reqs]),
        ],
    )
    got = dict(con.execute("select iter, context_tokens from iterations order by iter").fetchall())
    # step i spans [0.01 i, 0.01 (i+1)], midpoint 0.01 i + 0.005
    assert got == {
        0: 0,  # A prefilling from its start: nothing cached yet
        1: 100 + 1,  # A decoding: prompt + 1 emitted token (at 0.01)
        2: 100 + 2 + 0,  # A: 2 tokens; B's first chunk: (0.02-0.02)/(0.04-0.02) of 40 = 0
        3: 100 + 3 + 20,  # B second chunk: half of its prompt computed
        4: 146,  # A: 100 + 4; B decoding: 40 + 1 + (2-1) * (0.045-0.04)/(0.05-0.04) = 41.5;
        # 145.5 rounds to 146
        5: 0,  # nobody running
    }
    meta = json.loads(con.execute("select meta from runs where run_id = 'r'").fetchall()[0][0])
    assert meta["estimated"] == ["context_tokens"]
    assert meta["context_estimate"]["requests"] == 2


def test_tokens_read_at_one_instant_count_whole(con, tmp_path):
    """A client that reads tokens in one burst records them at one time: the ASOF join took any
    one of the tied rows, so a step after the burst counted 1 to 7 of them, depending on the rows'
    order (a property test saw "always 2" in one order and "always 17" in another). All count."""
    burst = {
        "kind": "request",
        "req_id": "A",
        "t_arrival": 0.0,
        "t_scheduled": 0.0,
        "t_first_token": 0.02,
        "t_finish": 0.05,
        "prompt_tokens": 1,
        "output_tokens": 8,
        "token_times": [0.02] * 7 + [0.05],
    }
    ingest.ingest_paths(
        con,
        [
            write(tmp_path / "it.jsonl", [{"kind": "run", "run_id": "r", "clock": "monotonic"}, *steps(5)]),
            write(tmp_path / "rq.jsonl", [{"kind": "run", "run_id": "r"}, burst]),
        ],
    )
    got = dict(con.execute("select iter, context_tokens from iterations order by iter").fetchall())
    # midpoints 0.025, 0.035, 0.045 lie after the burst of 7 at 0.02 and before the last token
    assert [got[i] for i in (2, 3, 4)] == [1 + 7] * 3
    # the same tokens in the other order (a temporary table shadows the view): the same estimate
    from pipeline.ingest import context

    con.execute("create temp table tokens as select * from main.tokens order by idx desc")
    con.execute("update iterations set context_tokens = null")
    context.estimate_context(con, ["r"])
    again = dict(con.execute("select iter, context_tokens from iterations order by iter").fetchall())
    con.execute("drop table temp.tokens")
    assert again == got


def test_given_context_is_never_overwritten(con, tmp_path):
    its = steps(3)
    its[1]["context_tokens"] = 777
    req = {
        "kind": "request",
        "req_id": "A",
        "t_arrival": 0.0,
        "t_scheduled": 0.0,
        "t_first_token": 0.01,
        "t_finish": 0.03,
        "prompt_tokens": 10,
        "output_tokens": 3,
    }
    ingest.ingest_paths(con, [write(tmp_path / "a.jsonl", [{"kind": "run", "run_id": "r"}, *its, req])])
    assert con.execute("select context_tokens from iterations where iter = 1").fetchall() == [(777,)]
    assert con.execute("select count(*) from iterations where context_tokens is null").fetchall() == [(0,)]


def test_clocks_that_do_not_overlap_are_left_alone(con, tmp_path):
    req = {
        "kind": "request",
        "req_id": "A",
        "t_arrival": 1000.0,
        "t_scheduled": 1000.0,
        "t_first_token": 1000.1,
        "t_finish": 1000.2,
        "prompt_tokens": 10,
        "output_tokens": 3,
    }
    ingest.ingest_paths(con, [write(tmp_path / "a.jsonl", [{"kind": "run", "run_id": "r"}, *steps(4), req])])
    assert con.execute("select count(*) from iterations where context_tokens is null").fetchall() == [(4,)]
    meta = json.loads(con.execute("select meta from runs").fetchall()[0][0])
    assert "skipped" in meta["context_estimate"] and "estimated" not in meta


def test_recorded_vllm_log_plus_request_stats(con):
    """Real recording: the estimate follows vLLM's own KV-cache usage (blocks of 128 tokens, 2048 tokens)."""
    ingest.ingest_paths(con, [FIX / "server_epoch.log", FIX / "requests.jsonl"], run_id="rec")
    ctx, kv = np.array(
        con.execute("select context_tokens, kv_usage from iterations order by iter").fetchall(), dtype=float
    ).T
    assert not np.isnan(ctx).any()
    assert np.corrcoef(ctx, kv)[0, 1] > 0.9
    # KV usage counts whole 128-token blocks of every running request: it bounds the context from above
    assert np.median(kv * 2048 - ctx) > 0
    meta = json.loads(con.execute("select meta from runs").fetchall()[0][0])
    assert meta["estimated"] == ["context_tokens"] and meta["context_estimate"]["requests"] == 64
