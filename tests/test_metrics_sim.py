"""Every SQL metric against numpy on a simulated run, read back from the trace file itself."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline import ingest, store
from pipeline.summary import summary
from pipeline.sim import IterationModel, NoiseModel, Policy, WorkloadSpec, run_simulation

QS = {"p50": 50, "p90": 90, "p95": 95, "p99": 99, "p999": 99.9}


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    d = tmp_path_factory.mktemp("sim")
    trace = d / "simrun.jsonl"
    run_simulation(
        trace,
        run_id="simrun",
        spec=WorkloadSpec(requests=300, rate_rps=20, prompt_mean=300, output_mean=60),
        policy=Policy(max_num_seqs=32, max_num_batched_tokens=1024, kv_capacity_tokens=60_000),
        model=IterationModel(t0_ms=5, a_ms_per_ctx=2e-4, b_ms_per_prefill=0.02),
        noise=NoiseModel(sigma=0.05, stall_rate=0.01, stall_ms_mean=30),
        seed=3,
    )
    con = store.connect(d / "s.duckdb")
    ingest.ingest_paths(con, [trace])
    store.build_derived(con)
    records = [json.loads(l) for l in trace.read_text().splitlines()]
    yield summary(con, "simrun"), records
    con.close()


def _check(stats: dict, values: np.ndarray) -> None:
    assert stats["count"] == len(values)
    for k, q in QS.items():
        assert stats[k] == pytest.approx(np.percentile(values, q), rel=1e-9, abs=1e-9), k
    assert stats["mean"] == pytest.approx(values.mean(), rel=1e-9)
    assert stats["std"] == pytest.approx(values.std(ddof=1), rel=1e-9)
    assert stats["max"] == pytest.approx(values.max(), rel=1e-12)


def test_request_metrics_equal_numpy(sim):
    s, records = sim
    reqs = [r for r in records if r["kind"] == "request" and r.get("status", "ok") == "ok"]
    a = np.array([r["t_arrival"] for r in reqs])
    sch = np.array([r["t_scheduled"] for r in reqs])
    f = np.array([r["t_first_token"] for r in reqs])
    c = np.array([r["t_finish"] for r in reqs])
    n = np.array([r["output_tokens"] for r in reqs])
    _check(s["ttft_ms"], (f - a) * 1000)
    _check(s["queue_ms"], (sch - a) * 1000)
    _check(s["e2e_ms"], (c - a) * 1000)
    multi = n > 1
    _check(s["tpot_ms"], (c[multi] - f[multi]) * 1000 / (n[multi] - 1))


def test_itl_equals_numpy(sim):
    s, records = sim
    gaps = np.concatenate([np.diff(r["token_times"]) * 1000 for r in records if r["kind"] == "request"])
    _check(s["itl_ms"], gaps)


def test_iteration_metrics_equal_numpy(sim):
    s, records = sim
    its = [r for r in records if r["kind"] == "iteration"]
    dur = np.array([(r["t_end"] - r["t_start"]) * 1000 for r in its])
    _check(s["iteration_ms"], dur)
    assert s["iteration_ms"]["cv"] == pytest.approx(dur.std(ddof=1) / dur.mean(), rel=1e-9)
    assert s["iterations"] == len(its)


def test_throughput_equals_numpy(sim):
    s, records = sim
    reqs = [r for r in records if r["kind"] == "request" and r.get("status", "ok") == "ok"]
    its = [r for r in records if r["kind"] == "iteration"]
    t0 = min(min(r["t_arrival"] for r in reqs), min(r["t_start"] for r in its))
    t1 = max(max(r["t_finish"] for r in reqs), max(r["t_end"] for r in its))
    assert s["duration_s"] == pytest.approx(t1 - t0)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(sum(r["output_tokens"] for r in reqs) / (t1 - t0))
    assert s["throughput"]["requests_per_s"] == pytest.approx(len(reqs) / (t1 - t0))
