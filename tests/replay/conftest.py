"""Simulated "recorded" runs with known truth, ingested once."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.sim import IterationModel, NoiseModel, Policy, WorkloadSpec, run_simulation

TRUE_POLICY = Policy(max_num_seqs=64, max_num_batched_tokens=1024, kv_capacity_tokens=200_000, chunked_prefill=True)
TRUE_MODEL = IterationModel(t0_ms=5.0, a_ms_per_ctx=0.0002, b_ms_per_prefill=0.02, c_ms_per_decode=0.0)
TRUE_NOISE = NoiseModel(sigma=0.03, stall_rate=0.001, stall_ms_mean=40.0)


def simulated_store(
    directory: Path,
    run_id: str,
    spec: WorkloadSpec,
    policy: Policy = TRUE_POLICY,
    noise: NoiseModel = TRUE_NOISE,
    seed: int = 0,
) -> Path:
    """Simulate a run, ingest it into ``directory/store.duckdb`` and return the store path."""
    from pipeline import ingest, store

    trace = directory / f"{run_id}.jsonl"
    run_simulation(
        trace, truth=False, run_id=run_id, spec=spec, policy=policy, model=TRUE_MODEL, noise=noise, seed=seed
    )
    db = directory / "store.duckdb"
    con = store.connect(db)
    ingest.ingest_paths(con, [trace])
    store.build_derived(con)
    con.close()
    return db


@pytest.fixture(scope="session")
def steady_db(tmp_path_factory) -> Path:
    """3000 requests at 10/s, log-normal sizes, noise and rare stalls: run id ``steady``.

    Shared by the session: tests may add replay runs to it but never change ``steady``
    (tests that edit the store work on a copy).
    """
    spec = WorkloadSpec(requests=3000, rate_rps=10.0, prompt_mean=400, output_mean=100)
    return simulated_store(tmp_path_factory.mktemp("steady"), "steady", spec)
