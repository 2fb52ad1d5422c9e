"""Replay statistics from simulator arrays vs independent numpy computations and the SQL pipeline."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.replay.stats import itl_weights, replay_stats, weighted_quantiles
from pipeline.sim import IterationModel, NoiseModel, Policy, poisson_workload, simulate, token_times

QS = [0.0, 0.01, 0.5, 0.9, 0.99, 0.999, 1.0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_quantiles_equal_numpy_on_the_expanded_array(seed):
    rng = np.random.default_rng(seed)
    v = rng.normal(size=50)
    w = rng.integers(0, 6, size=50)
    np.testing.assert_allclose(weighted_quantiles(v, w, QS), np.quantile(np.repeat(v, w), QS), rtol=0, atol=1e-12)


def test_weighted_quantiles_single_value_and_empty():
    np.testing.assert_allclose(weighted_quantiles(np.array([3.0]), np.array([4]), [0.5, 0.99]), [3.0, 3.0])
    assert np.isnan(weighted_quantiles(np.array([1.0]), np.array([0]), [0.5])).all()


@pytest.fixture(scope="module")
def preempting_result():
    """A small run that preempts (tight KV), so requests have several token segments."""
    w = poisson_workload(300, 40.0, 300, 0.5, 60, 0.6, seed=3)
    policy = Policy(max_num_seqs=32, max_num_batched_tokens=512, kv_capacity_tokens=6000, chunked_prefill=True)
    res = simulate(w, policy, IterationModel(), NoiseModel(sigma=0.05, stall_rate=0.01, stall_ms_mean=20.0), seed=5)
    assert res.requests["preemptions"].sum() > 0  # the case under test
    return res


def _numpy_reference(res, ok_rows):
    """Per-request formulas and every token gap, written out request by request."""
    rq = res.requests
    ok = ok_rows & (rq["status"] == "ok")
    ttft, tpot, itl = [], [], []
    for r, times in enumerate(token_times(res)):
        if not ok[r]:
            continue
        ttft.append((rq["t_first_token"][r] - rq["t_arrival"][r]) * 1000)
        if rq["output_tokens"][r] > 1:
            tpot.append((rq["t_finish"][r] - rq["t_first_token"][r]) * 1000 / (rq["output_tokens"][r] - 1))
        itl.extend(np.diff(times) * 1000)
    return np.array(ttft), np.array(tpot), np.array(itl)


@pytest.mark.parametrize("subset", ["all", "every_third_excluded"])
def test_replay_stats_match_per_request_numpy(preempting_result, subset):
    res = preempting_result
    ok_rows = np.ones(res.n_requests, bool)
    if subset != "all":
        ok_rows[::3] = False
    st = replay_stats(res, ok_rows)
    ttft, tpot, itl = _numpy_reference(res, ok_rows)
    for name, ref in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl)):
        assert st[name]["count"] == len(ref)
        for key, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999)):
            assert st[name][key] == pytest.approx(np.quantile(ref, q), rel=1e-9, abs=1e-9), (name, key)
        assert st[name]["mean"] == pytest.approx(ref.mean(), rel=1e-9)
        assert st[name]["std"] == pytest.approx(ref.std(ddof=1), rel=1e-9)
        assert st[name]["max"] == pytest.approx(ref.max(), rel=1e-12)
    rq = res.requests
    done = ok_rows & (rq["status"] == "ok")
    dur = max(rq["t_finish"][done].max(), res.iterations["t_end"][-1]) - min(rq["t_arrival"].min(), 0.0)
    assert st["throughput"]["output_tokens_per_s"] == pytest.approx(rq["output_tokens"][done].sum() / dur)
    assert st["throughput"]["requests_per_s"] == pytest.approx(done.sum() / dur)


def test_itl_weights_count_every_gap_once(preempting_result):
    res = preempting_result
    ok = np.ones(res.n_requests, bool)
    _, w = itl_weights(res, ok)
    n_tokens = sum(len(t) for t in token_times(res))
    assert int(w.sum()) == n_tokens - res.n_requests  # one gap per token after each request's first


def test_replay_stats_match_the_sql_pipeline(tmp_path, preempting_result):
    """Write the result as a trace, ingest it, and compare with metric_stats / run_summary."""
    from pipeline import ingest, store
    from pipeline.metrics import metric_stats, run_info
    from pipeline.sim.writer import write_trace

    res = preempting_result
    policy = Policy(max_num_seqs=32, max_num_batched_tokens=512, kv_capacity_tokens=6000, chunked_prefill=True)
    path = write_trace(res, tmp_path / "r.jsonl", "r", policy, IterationModel(), NoiseModel())
    con = store.connect(tmp_path / "s.duckdb")
    ingest.ingest_paths(con, [path])
    store.build_derived(con)
    sql = metric_stats(con, "r")
    info = run_info(con, "r")
    mine = replay_stats(res)
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms", "prefill_ms", "iteration_ms"):
        assert mine[m]["count"] == sql[m]["count"], m
        for k in ("p50", "p90", "p99", "p999", "mean", "max"):
            assert mine[m][k] == pytest.approx(sql[m][k], rel=1e-6, abs=1e-6), (m, k)
    assert mine["throughput"]["output_tokens_per_s"] == pytest.approx(info["output_tokens_per_s"], rel=1e-9)
    con.close()
