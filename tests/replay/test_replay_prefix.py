"""Prefix caching in replay: recorded cached_tokens, --prefix-caching/--no-prefix-caching (default: recorded), Mooncake hash_ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline import ingest, store
from pipeline.cli import run_captured
from pipeline.errors import InputError
from pipeline.replay import calibrate, compare
from pipeline.sim import Policy, run_simulation
from pipeline.sim.workload import workload_from_file

from .conftest import TRUE_MODEL, TRUE_NOISE

BT = 512


def write_mooncake(path: Path, n: int, seed: int, rate_rps: float, roots: int = 6) -> Path:
    """A Mooncake-style trace whose prompts share a few "system prompt" prefixes (ids: 1 per 512 tokens)."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate_rps, n))
    nxt = 10_000
    with open(path, "w") as fh:
        for i in range(n):  # a test fixture writer
            root, depth, own = int(rng.integers(roots)), int(rng.integers(1, 5)), int(rng.integers(1, 3))
            ids = [root * 100 + j for j in range(depth)] + list(range(nxt, nxt + own))
            nxt += own
            fh.write(
                json.dumps(
                    {
                        "timestamp": int(t[i] * 1000),
                        "input_length": len(ids) * BT - int(rng.integers(BT)),
                        "output_length": int(rng.integers(4, 60)),
                        "hash_ids": ids,
                    }
                )
                + "\n"
            )
    return path


POLICY = Policy(max_num_seqs=64, max_num_batched_tokens=4096, kv_capacity_tokens=400_000, prefix_caching=True)


@pytest.fixture(scope="module")
def prefix_db(tmp_path_factory):
    """A simulated recording of a server with prefix caching (run ``pc``), its workload file and store."""
    d = tmp_path_factory.mktemp("prefix")
    wl = write_mooncake(d / "trace.jsonl", 1200, seed=5, rate_rps=8.0)
    sim = run_simulation(
        d / "pc.jsonl",
        truth=False,
        run_id="pc",
        workload=workload_from_file(wl),
        policy=POLICY,
        model=TRUE_MODEL,
        noise=TRUE_NOISE,
        seed=0,
    )
    con = store.connect(d / "store.duckdb")
    ingest.ingest_paths(con, [d / "pc.jsonl"])
    store.build_derived(con)
    con.close()
    return d / "store.duckdb", wl, sim


def test_the_recording_stores_each_requests_cached_tokens(prefix_db):
    db, _, sim = prefix_db
    con = store.connect(db, read_only=True)
    got = dict(con.execute("select req_id, cached_tokens from requests where run_id = 'pc'").fetchall())
    con.close()
    want = dict(zip(sim.result.requests["req_id"].astype(str), sim.result.requests["cached_tokens"].tolist()))
    assert got == want and sum(want.values()) > 0


def _ttft_errors(cmp) -> dict[str, float]:
    return (
        {r["stat"]: r["rel_error"] for r in cmp.calibration_report()["rows"] if r["metric"] == "ttft_ms"}
        if cmp.mode == "validation"
        else {r["stat"]: r["rel_error"] for r in cmp.rows() if r["metric"] == "ttft_ms"}
    )


@pytest.mark.long
def test_recorded_cached_tokens_replay_closer_to_the_observed_than_recomputing(prefix_db):
    db, _, sim = prefix_db
    con = store.connect(db)  # the first calibration stores the fit
    try:
        cal = calibrate(con, "pc")
        assert cal.policy.prefix_caching and cal.baseline_policy["prefix_caching"] is True
        on = compare(con, cal, [0, 1])
        off = compare(con, cal.with_policy(prefix_caching=False), [0, 1])
    finally:
        con.close()
    assert on.mode == "validation" and off.mode == "what-if"
    assert off.calibration.policy_changes() == {"prefix_caching": False}
    e_on, e_off = _ttft_errors(on), _ttft_errors(off)
    for stat in ("p50", "p90"):
        assert abs(e_on[stat]) < 0.10, (stat, e_on)
        # recomputing the cached prefixes makes every prefill longer: replayed TTFT too high
        assert e_off[stat] > abs(e_on[stat]) + 0.10, (stat, e_on, e_off)
    assert any("prefix-cache hits in the recording: replayed as cached" in n for n in cal.notes)
    # request by request too: each TTFT is closer to its recorded one with the cached prefixes
    mape_on = on.calibration_report()["per_request"]["ttft_ms"]["mape"]
    mape_off = off.calibration_report()["per_request"]["ttft_ms"]["mape"]
    assert mape_on < 0.5 * mape_off, (mape_on, mape_off)


def test_prefix_caching_is_inferred_from_cached_tokens_when_the_run_does_not_say(prefix_db, tmp_path):
    db, _, _ = prefix_db
    copy = tmp_path / "c.duckdb"
    copy.write_bytes(db.read_bytes())
    con = store.connect(copy)
    try:
        meta = json.loads(con.execute("select meta from runs where run_id = 'pc'").fetchone()[0])
        meta.pop("prefix_caching")
        con.execute("update runs set meta = ? where run_id = 'pc'", [json.dumps(meta)])
        cal = calibrate(con, "pc")
        assert (
            cal.policy.prefix_caching and cal.details["policy_sources"]["prefix_caching"] == "requests' cached_tokens"
        )
        con.execute("update requests set cached_tokens = 0 where run_id = 'pc'")
        cal = calibrate(con, "pc")
        assert not cal.policy.prefix_caching
    finally:
        con.close()


def test_cli_prefix_caching_off_is_a_what_if_and_on_the_recorded_policy(prefix_db):
    db, _, _ = prefix_db
    code, out = run_captured(*["replay", "pc", "--db", str(db), "--json", "--seeds", "1", "--no-prefix-caching"])
    assert code == 0, out
    doc = json.loads(out)
    assert doc["mode"] == "what-if" and doc["changed"] == {"prefix_caching": False}
    assert doc["replay_run_ids"] == ["pc~replay~noprefix-seed0"]
    code, out = run_captured(*["replay", "pc", "--db", str(db), "--json", "--seeds", "1", "--prefix-caching"])
    assert code == 0, out
    assert json.loads(out)["mode"] == "validation"


def test_workload_hash_ids_replay_a_prefix_cache(prefix_db, tmp_path):
    # the engine of `pc` under another shared-prefix workload: hash_ids on by default (as the file
    # says), and caching makes TTFT lower than recomputing every prompt
    db, _, _ = prefix_db
    wl = write_mooncake(tmp_path / "other.jsonl", 600, seed=9, rate_rps=6.0)
    stats = {}
    for mode in ("recorded", "off"):
        code, out = run_captured(
            *[
                "replay",
                "pc",
                "--db",
                str(db),
                "--json",
                "--seeds",
                "1",
                "--noise",
                "none",
                "--workload",
                str(wl),
                *({"off": ["--no-prefix-caching"]}.get(mode, [])),
            ]
        )
        assert code == 0, out
        doc = json.loads(out)
        assert doc["policy"]["prefix_caching"] is (mode == "recorded")
        stats[mode] = {r["stat"]: r["replay"] for r in doc["rows"] if r["metric"] == "ttft_ms"}
    assert stats["recorded"]["p50"] < 0.9 * stats["off"]["p50"]


def test_mooncake_reader_maps_hash_ids_and_infers_the_block_size(tmp_path):
    f = tmp_path / "m.jsonl"
    rows = [
        {"timestamp": 5, "input_length": 300, "output_length": 2, "hash_ids": ["s", "x"]},
        {"timestamp": 0, "input_length": 250, "output_length": 2, "hash_ids": ["s"]},
        {"timestamp": 9, "input_length": 600, "output_length": 2, "hash_ids": ["s", "y", "z"]},
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = workload_from_file(f)
    # sorted by arrival; equal strings are equal ids; 300 tokens in 2 ids and 600 in 3: 256 per id
    ids = [w.hash_values[w.hash_offsets[i] : w.hash_offsets[i + 1]].tolist() for i in range(3)]
    assert [len(x) for x in ids] == [1, 2, 3] and ids[0][0] == ids[1][0] == ids[2][0]
    assert len({ids[1][1], ids[2][1], ids[2][2], ids[0][0]}) == 4
    assert w.hash_block_tokens == 256


@pytest.mark.parametrize(
    "rows, message",
    [
        (
            [
                {"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1]},
                {"timestamp": 1, "input_length": 100, "output_length": 2, "hash_ids": [1, 2]},
            ],
            "fit no single block size",
        ),
        ([{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, None]}], "null block id"),
        ([{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": "abc"}], "not lists of block ids"),
    ],
)
def test_mooncake_reader_rejects_hash_ids_it_cannot_use(tmp_path, rows, message):
    f = tmp_path / "bad.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match=message):
        workload_from_file(f)
