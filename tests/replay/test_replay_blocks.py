"""A KV-bound simulated run with paged KV (blocks of 128, whole-prompt admission), replayed.

The run records its block size and admission rule (the simulator writes its
policy into ``runs.meta``), so the replay reproduces the queueing; replaying the
same run with KV counted in tokens, or with first-chunk admission, gets TTFT
wrong in opposite directions (more room and less queueing; self-preemption of
partly prefilled prompts and more queueing).
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import store
from pipeline.replay import calibrate, compare
from pipeline.sim import Policy, WorkloadSpec

from .conftest import simulated_store

PAGED = Policy(
    max_num_seqs=32, max_num_batched_tokens=512, kv_capacity_tokens=4096, kv_block_size=128, admit_full_prompt=True
)
SEEDS = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def replays(tmp_path_factory):
    spec = WorkloadSpec(
        requests=1500, rate_rps=15.0, prompt_mean=300, prompt_sigma=0.6, output_mean=60, output_sigma=0.6
    )
    db = simulated_store(tmp_path_factory.mktemp("paged"), "paged", spec, policy=PAGED)
    con = store.open_for_reading(db)
    cal = calibrate(con, "paged")
    out = {
        name: compare(con, c, SEEDS)
        for name, c in (
            ("recorded", cal),
            ("tokens", cal.with_policy(kv_block_size=1)),
            ("first_chunk", cal.with_policy(admit_full_prompt=False)),
        )
    }
    con.close()
    return cal, out


def row(comparison, metric, stat):
    return next(r for r in comparison.rows() if r["metric"] == metric and r["stat"] == stat)


def test_block_policy_comes_from_the_run(replays):
    cal, _ = replays
    assert cal.policy == PAGED and cal.policy_changes() == {}
    assert cal.details["policy_sources"]["kv_block_size"] == "runs.meta.kv_block_size"
    assert not any("block size" in n or "whole prompt" in n for n in cal.notes)


@pytest.mark.parametrize("metric", ["ttft_ms", "tpot_ms"])
@pytest.mark.parametrize("stat,tolerance", [("p50", 0.05), ("p99", 0.10)])
@pytest.mark.long
def test_replay_with_the_paged_policy_reproduces_the_run(replays, metric, stat, tolerance):
    cmp = replays[1]["recorded"]
    r = row(cmp, metric, stat)
    per_seed = np.array([s[metric][stat] for s in cmp.replays])
    assert abs(r["rel_error"]) < tolerance, r
    assert np.all(np.abs(per_seed / r["observed"] - 1) < tolerance), per_seed


def test_token_counting_and_first_chunk_admission_get_the_queue_wrong(replays):
    out = replays[1]
    truth = row(out["recorded"], "ttft_ms", "p90")
    tokens, first = row(out["tokens"], "ttft_ms", "p90"), row(out["first_chunk"], "ttft_ms", "p90")
    assert abs(truth["rel_error"]) < 0.05
    assert tokens["rel_error"] < -0.3 and tokens["replay_max"] < truth["observed"]  # more room, less queueing
    assert first["rel_error"] > 0.3 and first["replay_min"] > truth["observed"]  # self-preemption, more queueing


@pytest.mark.long
def test_run_ids_and_cli_options_for_the_block_policy(replays, tmp_path_factory):
    import json
    import subprocess
    import sys

    from pipeline.replay import replay_run_id

    cal, _ = replays
    assert (
        replay_run_id(cal.with_policy(kv_block_size=16, admit_full_prompt=False), 0)
        == "paged~replay~kvb16-nofullprompt-seed0"
    )
    db = next(tmp_path_factory.getbasetemp().glob("paged*/store.duckdb"))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "replay",
            "paged",
            "--db",
            str(db),
            "--seeds",
            "1",
            "--kv-block-size",
            "16",
            "--no-admit-full-prompt",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["mode"] == "what-if" and doc["changed"] == {"kv_block_size": 16, "admit_full_prompt": False}
    assert doc["policy"]["kv_block_size"] == 16 and doc["recorded_policy"]["kv_block_size"] == 128
    assert doc["replay_run_ids"] == ["paged~replay~kvb16-nofullprompt-seed0"]
