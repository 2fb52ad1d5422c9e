"""Runs that served the same arrivals are resampled in the same time blocks (compare.paired_blocks)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from pipeline import ingest, store
from pipeline.compare import PAIR_SHIFT, compare
from pipeline.sim import Policy, WorkloadSpec, build_workload, run_simulation

SPEC = WorkloadSpec(requests=1000, rate_rps=14, burst_at_s=30.0, burst_count=20)
BASE = Policy(max_num_seqs=64, kv_capacity_tokens=120_000)


@pytest.fixture(scope="module")
def burst_db(tmp_path_factory):
    """``w``: a load with a burst of long prompts; ``w512``: the same arrivals with a token budget
    of 512 a step (the burst's prompts take four times as many steps: TTFT p90 four times as
    long); ``w2``: the same config, other arrivals."""
    d = tmp_path_factory.mktemp("paired")
    traces = []
    for name, seed, budget in (("w", 21, 2048), ("w512", 21, 512), ("w2", 22, 2048)):
        out = d / f"{name}.jsonl"
        policy = replace(BASE, max_num_batched_tokens=budget)
        run_simulation(out, truth=False, run_id=name, seed=seed, spec=SPEC, policy=policy)
        traces.append(out)
    con = store.connect(d / "p.duckdb")
    ingest.ingest_paths(con, traces)
    store.build_derived(con)
    yield con, d
    con.close()


def _ttft(path, q):
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    v = [(r["t_first_token"] - r["t_arrival"]) * 1000 for r in recs if r["kind"] == "request"]
    return np.percentile(v, q)


@pytest.mark.long
def test_a_burst_both_runs_served_no_longer_hides_a_regression(burst_db):
    """Resampled independently, whether a replicate draws the burst's block decided every TTFT
    replicate of each run: a TTFT several times longer was "no significant change"."""
    con, d = burst_db
    paired = compare(con, "w", con, "w512")
    assert paired.paired is not None and paired.paired["requests"] == 1020
    assert paired.paired["arrival_shift_p95_s"] == 0.0  # one workload, drawn from one seed
    assert paired.blocks["baseline"]["blocks"] == paired.blocks["candidate"]["blocks"] == paired.paired["blocks"]
    by = {(x.metric, x.stat): x for x in paired.deltas}
    p90 = by[("ttft_ms", "p90")]
    assert p90.base == pytest.approx(_ttft(d / "w.jsonl", 90)) and p90.cand == pytest.approx(
        _ttft(d / "w512.jsonl", 90)
    )
    assert p90.rel > 1 and p90.verdict == "regression" and by[("ttft_ms", "mean")].verdict == "regression"
    unpaired = compare(con, "w", con, "w512", paired=False)
    assert unpaired.paired is None
    u = {(x.metric, x.stat): x for x in unpaired.deltas}[("ttft_ms", "p90")]
    assert u.delta == p90.delta and (u.ci_high - u.ci_low) > 2 * (p90.ci_high - p90.ci_low)
    assert "regression" not in {x.verdict for x in unpaired.deltas if x.metric == "ttft_ms" and x.stat != "p50"}


@pytest.mark.long
def test_runs_of_other_arrivals_are_not_paired(burst_db, tmp_path):
    con, d = burst_db
    assert compare(con, "w", con, "w2").paired is None  # another seed: other arrivals
    # the same requests arriving later by more than a share of a block: no longer one stretch of workload
    w = build_workload(SPEC, 21)
    width = compare(con, "w", con, "w512").paired["block_s"]
    late = np.where(np.arange(len(w)) % 2 == 0, 0.0, 2 * PAIR_SHIFT * width)
    shifted = type(w)(np.maximum.accumulate(w.t_arrival + late), w.prompt_tokens, w.output_tokens, w.req_id)
    run_simulation(tmp_path / "ws.jsonl", truth=False, run_id="ws", seed=21, workload=shifted, policy=BASE)
    ingest.ingest_paths(con, [tmp_path / "ws.jsonl"])
    store.build_derived(con)
    assert compare(con, "w", con, "ws").paired is None
    # and the same arrivals under another seed's noise are
    run_simulation(tmp_path / "wn.jsonl", truth=False, run_id="wn", seed=5, workload=w, policy=BASE)
    ingest.ingest_paths(con, [tmp_path / "wn.jsonl"])
    store.build_derived(con)
    same = compare(con, "w", con, "wn")
    assert same.paired is not None and same.exit_code == 0, [x for x in same.regressions]
