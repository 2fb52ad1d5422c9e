"""Simulated runs with known truth, ingested into a store (shared by the fit tests)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

# Llama-3.1-8B on one H100 SXM: a is the KV read at 80% of peak bandwidth,
# t0 the weight read at peak plus 2 ms overhead, b prefill at about half of peak compute.
KV_BYTES = 2 * 32 * 8 * 128 * 2
PEAK_GBPS = 3350.0
TRUE_BW_GBPS = 0.8 * PEAK_GBPS
A_TRUE = KV_BYTES / (TRUE_BW_GBPS * 1e9) * 1e3  # ms per context token
T0_TRUE = 8.03e9 * 2 / (PEAK_GBPS * 1e9) * 1e3 + 2.0
B_TRUE = 0.032


@dataclass
class SimRun:
    run_id: str
    con: object
    db: Path
    result: object  # pipeline.sim.engine.SimResult
    model: object
    noise: object


def make_run(
    tmp: Path,
    run_id: str,
    workload,
    policy,
    noise,
    tokens: bool = True,
    seed: int = 3,
    model_name: str = "meta-llama/Llama-3.1-8B",
    gpu: str = "H100-SXM",
) -> SimRun:
    from pipeline import store
    from pipeline.ingest import ingest_paths
    from pipeline.sim.engine import simulate
    from pipeline.sim.model import IterationModel
    from pipeline.sim.writer import write_trace

    model = IterationModel(t0_ms=T0_TRUE, a_ms_per_ctx=A_TRUE, b_ms_per_prefill=B_TRUE, c_ms_per_decode=0.0)
    result = simulate(workload, policy, model, noise, seed=seed)
    trace = tmp / f"{run_id}.jsonl"
    write_trace(result, trace, run_id, policy, model, noise, model_name=model_name, gpu=gpu, with_token_times=tokens)
    db = tmp / f"{run_id}.duckdb"
    con = store.connect(db)
    ingest_paths(con, [trace])
    store.build_derived(con)
    from pipeline.fit import fit_run

    fit_run(con, run_id, n_boot=50)  # stored: tests read it back with get_or_fit
    return SimRun(run_id, con, db, result, model, noise)


def chat_workload(seed: int):
    """Chat-like steady load: prompts of 300 and outputs of 400 tokens on average (decode-dominated steps)."""
    from pipeline.sim.workload import poisson_workload

    return poisson_workload(3000, 20, 300, 0.8, 400, 0.8, seed=seed)


@pytest.fixture(scope="session")
def accuracy_run(tmp_path_factory) -> SimRun:
    """Prefill-heavy steady load (prompts 800, outputs 200), 3% noise, 2% of steps with a stall (mean 50 ms)."""
    from pipeline.sim.engine import Policy
    from pipeline.sim.model import NoiseModel
    from pipeline.sim.workload import poisson_workload

    w = poisson_workload(3000, 20, 800, 0.8, 200, 0.8, seed=1)
    return make_run(
        tmp_path_factory.mktemp("acc"),
        "acc",
        w,
        Policy(max_num_seqs=128, max_num_batched_tokens=2048),
        NoiseModel(sigma=0.03, stall_rate=0.02, stall_ms_mean=50.0),
        seed=2,
    )


@pytest.fixture(scope="session")
def incident_run(tmp_path_factory) -> SimRun:
    """Steady load with a burst of 24 very long prompts (16k tokens) at t = 90 s."""
    from pipeline.sim.engine import Policy
    from pipeline.sim.model import NoiseModel
    from pipeline.sim.workload import add_burst, poisson_workload

    w = add_burst(poisson_workload(1500, 8, 400, 0.6, 150, 0.6, seed=1), 90.0, 24, 16000, 16, spread_s=1.0)
    return make_run(
        tmp_path_factory.mktemp("inc"),
        "incident",
        w,
        Policy(max_num_seqs=128, max_num_batched_tokens=2048),
        NoiseModel(sigma=0.03, stall_rate=0.005, stall_ms_mean=50.0),
    )


def _kv_workload():
    from pipeline.sim.workload import poisson_workload

    return poisson_workload(1500, 20, 400, 0.6, 500, 0.6, seed=1)


@pytest.fixture(scope="session")
def kv_run(tmp_path_factory) -> SimRun:
    """KV cache far too small for the load: requests are preempted and recomputed."""
    from pipeline.sim.engine import Policy
    from pipeline.sim.model import NoiseModel

    return make_run(
        tmp_path_factory.mktemp("kv"),
        "kv",
        _kv_workload(),
        Policy(max_num_seqs=128, max_num_batched_tokens=2048, kv_capacity_tokens=30000),
        NoiseModel(sigma=0.03, stall_rate=0.005, stall_ms_mean=50.0),
    )


@pytest.fixture(scope="session")
def kv_run_no_tokens(tmp_path_factory) -> SimRun:
    """The same KV-pressure run without per-token times."""
    from pipeline.sim.engine import Policy
    from pipeline.sim.model import NoiseModel

    return make_run(
        tmp_path_factory.mktemp("kvn"),
        "kvn",
        _kv_workload(),
        Policy(max_num_seqs=128, max_num_batched_tokens=2048, kv_capacity_tokens=30000),
        NoiseModel(sigma=0.03, stall_rate=0.005, stall_ms_mean=50.0),
        tokens=False,
    )
