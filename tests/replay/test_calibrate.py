"""Calibration: policy from run metadata, workload from requests, fitted model and noise, corrections."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from pipeline import store
from pipeline.errors import InputError
from pipeline.replay.calibrate import calibrate, recorded_policy, resolve_policy

from .conftest import TRUE_MODEL, TRUE_NOISE, TRUE_POLICY


def test_recorded_policy_reads_vllm_and_simulator_keys():
    vllm_meta = {
        "max_num_seqs": 8,
        "max_num_batched_tokens": "256",
        "kv_cache_tokens": "2,048",
        "enable_chunked_prefill": "True",
    }
    values, sources = recorded_policy(vllm_meta)
    assert values == {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 256,
        "kv_capacity_tokens": 2048,
        "chunked_prefill": True,
        "kv_block_size": None,
        "admit_full_prompt": None,
        "prefix_caching": None,
    }
    assert sources["kv_capacity_tokens"] == "runs.meta.kv_cache_tokens"
    # the vLLM log ingestor's block facts: usable capacity wins over the reported cache size
    values, sources = recorded_policy(
        {**vllm_meta, "kv_capacity_tokens": 1920, "block_size": "128", "scheduler_reserve_full_isl": False}
    )
    assert (values["kv_capacity_tokens"], values["kv_block_size"], values["admit_full_prompt"]) == (1920, 128, False)
    assert sources["kv_block_size"] == "runs.meta.block_size"
    assert sources["admit_full_prompt"] == "runs.meta.scheduler_reserve_full_isl"
    values, _ = recorded_policy({"max_num_seqs": True, "kv_capacity_tokens": 1.5})  # not whole numbers: ignored
    assert values["max_num_seqs"] is None and values["kv_capacity_tokens"] is None


def test_missing_policy_fields_name_the_options_to_pass():
    values, sources = recorded_policy({"max_num_batched_tokens": 512})
    with pytest.raises(InputError) as err:
        resolve_policy("r1", values, sources, {})
    msg = str(err.value)
    assert "max_num_seqs, kv_capacity_tokens" in msg
    assert "--max-num-seqs N and --kv-capacity-tokens N" in msg and "'r1'" in msg


def test_options_fill_gaps_into_the_baseline_and_change_recorded_fields():
    values, sources = recorded_policy({"max_num_batched_tokens": 512, "max_num_seqs": 16})
    policy, baseline, src, notes = resolve_policy(
        "r", values, sources, {"kv_capacity_tokens": 10_000, "max_num_batched_tokens": 256}
    )
    assert (policy.max_num_seqs, policy.max_num_batched_tokens, policy.kv_capacity_tokens) == (16, 256, 10_000)
    # kv capacity was not recorded: the option completes the baseline; the token budget is a change
    assert baseline == {
        "max_num_seqs": 16,
        "max_num_batched_tokens": 512,
        "kv_capacity_tokens": 10_000,
        "chunked_prefill": True,
        "kv_block_size": 1,
        "admit_full_prompt": True,
        "prefix_caching": False,
    }
    assert src["kv_capacity_tokens"] == "option" and "chunked" in notes[0]
    assert "whole prompt" in notes[1] and "--kv-block-size" in notes[2]
    # a block size given for a run that does not record one completes the baseline, as kv capacity does
    policy, baseline, src, _ = resolve_policy("r", values, sources, {"kv_capacity_tokens": 10_000, "kv_block_size": 16})
    assert policy.kv_block_size == baseline["kv_block_size"] == 16 and src["kv_block_size"] == "option"


def test_invalid_policy_is_an_input_error():
    values, sources = recorded_policy({"max_num_batched_tokens": 8, "max_num_seqs": 16, "kv_capacity_tokens": 100})
    with pytest.raises(InputError, match="max_num_batched_tokens"):
        resolve_policy("r", values, sources, {})
    values, sources = recorded_policy({"max_num_batched_tokens": 64, "max_num_seqs": 16, "kv_capacity_tokens": 100})
    with pytest.raises(InputError, match="kv_block_size"):
        resolve_policy("r", values, sources, {"kv_block_size": 128})


@pytest.mark.long
def test_calibration_recovers_the_simulated_truth(steady_db):
    con = store.open_for_reading(steady_db)
    cal = calibrate(con, "steady")
    assert cal.policy == TRUE_POLICY and cal.policy_changes() == {}
    m = cal.model
    assert m.t0_ms == pytest.approx(TRUE_MODEL.t0_ms, rel=0.03)
    assert m.a_ms_per_ctx == pytest.approx(TRUE_MODEL.a_ms_per_ctx, rel=0.05)
    assert m.b_ms_per_prefill == pytest.approx(TRUE_MODEL.b_ms_per_prefill, rel=0.03)
    assert abs(m.c_ms_per_decode) < 0.002  # truth 0; within noise of a few tenths of a us per token
    assert cal.noise.sigma == pytest.approx(TRUE_NOISE.sigma, rel=0.1)
    assert cal.noise.stall_rate == pytest.approx(TRUE_NOISE.stall_rate, rel=0.5)
    assert cal.details["mean_scale"] == pytest.approx(1.0, abs=0.01)
    assert cal.details["host_gap_ms"] == 0.0  # the simulator runs steps back to back (rounding: no negative time)
    # workload: recorded arrivals relative to the first, sizes as recorded
    ref = con.execute(
        "select t_arrival, prompt_tokens, output_tokens from requests where run_id = 'steady' "
        "order by t_arrival, req_id"
    ).fetchall()
    t, p, o = (np.array(c) for c in zip(*ref))
    np.testing.assert_allclose(cal.workload.t_arrival, t - t.min(), atol=1e-9)
    np.testing.assert_array_equal(cal.workload.prompt_tokens, p)
    np.testing.assert_array_equal(cal.workload.output_tokens, o)
    assert cal.t_origin_s == pytest.approx(t.min()) and cal.recorded_ok.all()
    con.close()


@pytest.fixture
def edited_db(steady_db, tmp_path):
    """A private copy of the steady store, for tests that edit it."""
    db = tmp_path / "edited.duckdb"
    shutil.copy(steady_db, db)
    return db


@pytest.mark.long
def test_failed_requests_are_load_but_not_compared(edited_db):
    con = store.connect(edited_db)
    ids = [
        r[0]
        for r in con.execute(
            "select req_id from requests where run_id = 'steady' order by t_arrival limit 6"
        ).fetchall()
    ]
    con.execute("update requests set status = 'error' where req_id in (?, ?)", ids[:2])
    con.execute("update requests set status = 'error', output_tokens = 0 where req_id = ?", [ids[2]])
    con.execute("update requests set t_arrival = null where req_id = ?", [ids[3]])
    store.build_derived(con, force=True)
    cal = calibrate(con, "steady")
    n = con.execute("select count(*) from requests where run_id = 'steady'").fetchall()[0][0]
    assert len(cal.workload) == n - 2
    assert cal.details["requests"] == {
        "recorded": n,
        "replayed": n - 2,
        "replayed_not_ok": 2,
        "dropped_no_arrival_time": 1,
        "dropped_no_output_tokens": 1,
    }
    ids_replayed = list(cal.workload.ids())
    assert not cal.recorded_ok[ids_replayed.index(ids[0])] and cal.recorded_ok[ids_replayed.index(ids[4])]
    assert any("left out of the comparison" in s for s in cal.notes)
    ok_only = calibrate(con, "steady", ok_only=True)
    assert len(ok_only.workload) == n - 4 and ok_only.recorded_ok.all()
    assert not any("none was dropped for its status" in s for s in ok_only.notes)
    con.close()


def test_ok_only_on_a_run_whose_requests_are_all_ok_says_so(edited_db):
    """--ok-only dropped nothing and said nothing: the user could not tell it from a filter that ran."""
    con = store.connect(edited_db)
    assert con.execute("select count(*) from requests where run_id = 'steady' and status <> 'ok'").fetchone()[0] == 0
    cal = calibrate(con, "steady", ok_only=True)
    assert "--ok-only: every request of 'steady' is ok, so none was dropped for its status" in cal.notes
    assert not any("--ok-only" in s for s in calibrate(con, "steady").notes)


@pytest.mark.long
def test_host_time_between_steps_is_added_to_t0(edited_db):
    """Shift every step 1 ms later than the previous: 1 ms of host time per busy step."""
    con = store.connect(edited_db)
    con.execute(
        "update iterations set t_start = t_start + iter * 0.001, t_end = t_end + iter * 0.001 where run_id = 'steady'"
    )
    store.build_derived(con, force=True)
    cal = calibrate(con, "steady")
    assert cal.details["host_gap_ms"] == pytest.approx(1.0, abs=1e-6)
    fit = cal.details["fit"]
    assert cal.model.t0_ms == pytest.approx(fit["t0_ms"] * cal.details["mean_scale"] + 1.0, rel=1e-12)
    assert cal.model.b_ms_per_prefill == pytest.approx(fit["b_ms_per_prefill"] * cal.details["mean_scale"], rel=1e-12)
    con.close()


def test_front_end_delay_is_kept_per_request(edited_db):
    """t_queued (an extra field) moves the engine arrival; the replay's TTFT adds the delay back."""
    from pipeline.replay import replay_once

    con = store.connect(edited_db)
    con.execute("update requests set extra = json_object('t_queued', t_arrival + 0.004) where run_id = 'steady'")
    cal = calibrate(con, "steady", noise="none")
    np.testing.assert_allclose(cal.frontend_delay_s, 0.004, atol=1e-9)
    assert cal.workload.t_arrival[0] == pytest.approx(0.004)  # the engine sees the first request 4 ms in
    res, st = replay_once(cal, 0)
    # arrivals are the recorded ones again; first tokens come 4 ms later than without the delay
    np.testing.assert_allclose(res.requests["t_arrival"], cal.workload.t_arrival - 0.004, atol=1e-12)
    assert st["ttft_ms"]["min"] >= 4.0
    con.close()


def test_unknown_noise_mode_and_run(steady_db):
    con = store.open_for_reading(steady_db)
    with pytest.raises(InputError, match="--noise"):
        calibrate(con, "steady", noise="loud")
    with pytest.raises(Exception, match="not in the store"):
        calibrate(con, "nope")
    con.close()


def test_block_settings_missing_from_the_metadata(edited_db):
    """An older simulated trace gets what the simulator then did; any other run gets vLLM's defaults, with notes."""
    import json

    con = store.connect(edited_db)
    meta = json.loads(con.execute("select meta from runs where run_id = 'steady'").fetchall()[0][0])
    assert (meta["kv_block_size"], meta["admit_full_prompt"], meta["simulated"]) == (1, False, True)
    del meta["kv_block_size"], meta["admit_full_prompt"]
    con.execute("update runs set meta = ? where run_id = 'steady'", [json.dumps(meta)])
    cal = calibrate(con, "steady", noise="none")
    assert (cal.policy.kv_block_size, cal.policy.admit_full_prompt) == (1, False)
    assert cal.details["policy_sources"]["kv_block_size"] == "simulator default (runs.meta.simulated)"
    assert not any("block size" in n for n in cal.notes)
    del meta["simulated"]
    con.execute("update runs set meta = ? where run_id = 'steady'", [json.dumps(meta)])
    cal = calibrate(con, "steady", noise="none")
    assert (cal.policy.kv_block_size, cal.policy.admit_full_prompt) == (1, True)
    assert cal.policy_changes() == {}  # defaults complete the baseline: still a validation
    assert any("--kv-block-size" in n for n in cal.notes) and any("whole prompt" in n for n in cal.notes)
    con.close()


def test_prompts_over_the_step_budget_without_chunked_prefill_are_noted(steady_db):
    con = store.open_for_reading(steady_db)
    cal = calibrate(con, "steady", noise="none", overrides={"chunked_prefill": False, "max_num_batched_tokens": 256})
    over, total = con.execute(
        "select count(*) filter (where prompt_tokens > 256), count(*) from requests where run_id = 'steady'"
    ).fetchone()
    assert 0 < over < total and len(cal.workload) == total
    (note,) = [n for n in cal.notes if n.startswith("token budget: ")]
    assert f"{over} of {total} prompts are longer than max_num_batched_tokens (256)" in note
    # the note follows the policy a what-if replays under
    assert not [n for n in cal.with_policy(chunked_prefill=True).notes if n.startswith("token budget: ")]
    wide = cal.with_policy(max_num_batched_tokens=int(cal.workload.prompt_tokens.max()))
    assert not [n for n in wide.notes if n.startswith("token budget: ")]
    narrower = cal.with_policy(max_num_batched_tokens=128).notes
    (again,) = [n for n in narrower if n.startswith("token budget: ")]
    assert "(128)" in again and f"{over} of" not in again
    assert not [n for n in calibrate(con, "steady", noise="none").notes if n.startswith("token budget: ")]


@pytest.mark.long
def test_failed_requests_are_replayed_with_the_tokens_they_received(edited_db):
    con = store.connect(edited_db)
    a, b, c = (
        r[0]
        for r in con.execute(
            "select req_id from requests where run_id = 'steady' and output_tokens > 5 order by t_arrival limit 3"
        ).fetchall()
    )
    # a: aborted after 3 of its tokens; b: failed at the end (all its tokens); c: ok, list cut (not failed)
    con.execute("update requests set status = 'aborted' where req_id = ?", [a])
    con.execute("update requests set status = 'error' where req_id = ?", [b])
    con.execute("update token_lists set t_s = t_s[1:3] where req_id in (?, ?)", [a, c])
    store.build_derived(con, force=True)
    cal = calibrate(con, "steady")
    recorded = dict(con.execute("select req_id, output_tokens from requests where run_id = 'steady'").fetchall())
    out = dict(zip(cal.workload.ids(), cal.workload.output_tokens))
    assert out[a] == 3 and recorded[a] > 5
    assert out[b] == recorded[b] and out[c] == recorded[c]
    assert sum(out.values()) == sum(recorded.values()) - (recorded[a] - 3)
    assert any(f"(3 of {recorded[a]}): replayed with the tokens they received" in n for n in cal.notes)
    con.close()


@pytest.mark.long
def test_a_stopped_run_replays_its_throughput(tmp_path):
    """A simulation stopped after 1500 steps leaves its last requests aborted mid-output (their
    output_tokens are the lengths asked for): replayed at full length they ran 3 s past the recording
    and the replayed throughput came out 19% low."""
    from pipeline.ingest import ingest_paths
    from pipeline.replay import replay_once
    from pipeline.sim import Policy, WorkloadSpec, run_simulation

    trace = tmp_path / "stop.jsonl"
    policy = Policy(max_num_seqs=32, max_num_batched_tokens=1024, kv_capacity_tokens=200_000)
    spec = WorkloadSpec(requests=800, rate_rps=20.0)
    run_simulation(
        trace, truth=False, run_id="stop", spec=spec, policy=policy, model=TRUE_MODEL, seed=4, iterations=1500
    )
    con = store.connect(tmp_path / "s.duckdb")
    ingest_paths(con, [trace])
    store.build_derived(con)
    aborted = con.execute("select count(*) from requests where status = 'aborted'").fetchone()[0]
    assert aborted > 5
    observed = con.execute("select output_tokens_per_s from run_summary where run_id = 'stop'").fetchone()[0]
    cal = calibrate(con, "stop", noise="none")
    replayed = replay_once(cal, 0)[1]["throughput"]["output_tokens_per_s"]
    assert replayed == pytest.approx(observed, rel=0.03)
    con.close()


@pytest.mark.parametrize("raw, want", [(-2.33e-05, 0.0), (-0.4, 0.0), (0.0004, 0.0), (1.18, 1.18)])
def test_host_gap_below_a_microsecond_or_negative_adds_nothing(monkeypatch, raw, want):
    """Re-timed steps that abut gave a host gap of -2.33e-05 ms, printed as such: steps that touch
    or overlap by rounding add no host time."""
    import importlib

    from pipeline import store

    calibrate = importlib.import_module("pipeline.replay.calibrate")  # the package exports a function of that name
    monkeypatch.setattr(store, "rows", lambda con, name, params: [(1.0, raw, 500)])
    meta = {"timestamps_reconstructed": True, "clock_alignment": {"sources": [{"retime": {"retimed": True}}]}}
    scale, gap, notes = calibrate.corrections(None, "r", meta)
    assert (scale, gap) == (1.0, want)
    assert notes and f"({want:.3g} ms a step)" in notes[0], notes
