"""compare on re-runs of one simulated load: requests share the server's queue and batches, so
the intervals must come from blocks of time, not from single requests (pipeline/blockboot.py).

Twelve pairs of runs of one configuration (800 requests at 12 req/s, seeds differ) must be
flagged about as often as the confidence says, far less often than when each run is cut into
blocks much shorter than a request stays; four pairs whose candidate pays 30% more fixed cost
per step must be flagged on the decode statistics every time.
"""

from __future__ import annotations

import dataclasses

import pytest

from pipeline import compare as cmp
from pipeline import ingest, store
from pipeline.sim import IterationModel, WorkloadSpec, run_simulation

pytestmark = pytest.mark.slow
SAME, SLOWER = 12, 4


@pytest.fixture(scope="module")
def reruns(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reruns")
    traces = []
    for k in range(2 * (SAME + SLOWER)):
        slower = k >= 2 * SAME and k % 2 == 1  # the candidate of a power pair
        model = IterationModel(t0_ms=IterationModel().t0_ms * (1.3 if slower else 1.0))
        out = folder / f"r{k}.jsonl"
        spec = WorkloadSpec(requests=800, rate_rps=12.0)
        run_simulation(out, truth=False, run_id=f"r{k}", seed=100 + k, spec=spec, model=model)
        traces.append(out)
    con = store.connect(folder / "s.duckdb")
    ingest.ingest_paths(con, traces)
    store.build_derived(con)
    yield con
    con.close()


def _flags(con, pairs) -> tuple[int, int, int]:
    """(latency flags, latency statistics with an interval, pairs with any flag)."""
    flags = tested = anyf = 0
    for k in pairs:
        comp = cmp.compare(con, f"r{2 * k}", con, f"r{2 * k + 1}", seed=k)
        lat = [d for d in comp.deltas if d.metric != "throughput" and d.ci_low is not None]
        flags += sum(d.verdict in ("regression", "improvement") for d in lat)
        tested += len(lat)
        anyf += any(d.verdict in ("regression", "improvement") for d in comp.deltas)
    return flags, tested, anyf


def test_reruns_are_flagged_as_often_as_the_confidence_says(reruns, monkeypatch):
    flags, tested, anyf = _flags(reruns, range(SAME))
    # 99% and a 5% threshold: about 1% of ~250 statistics (measured: 1.8% on 40 pairs)
    assert tested > 200 and flags <= 0.03 * tested, (flags, tested)
    assert anyf <= 5  # of 12: ~25 correlated statistics a pair
    # blocks of a hundredth of a residence time (the most, 100, a run) resample nearly single
    # requests: the same pairs flag far more, so the block length is what makes them quiet
    monkeypatch.setattr(cmp, "BLOCKS", dataclasses.replace(cmp.BLOCKS, residence_multiple=0.01))
    short, short_tested, _ = _flags(reruns, range(SAME))
    assert short_tested == tested and short >= 2 * max(flags, 3), (short, flags)


def test_a_slower_step_is_flagged_in_every_pair(reruns):
    for k in range(SAME, SAME + SLOWER):
        comp = cmp.compare(reruns, f"r{2 * k}", reruns, f"r{2 * k + 1}")
        got = {(d.metric, d.stat) for d in comp.regressions}
        want = {("tpot_ms", "p50"), ("tpot_ms", "mean"), ("itl_ms", "p50"), ("itl_ms", "mean"), ("iteration_ms", "p50")}
        assert want <= got, (k, want - got)
        assert comp.blocks["baseline"]["blocks"] >= 10
