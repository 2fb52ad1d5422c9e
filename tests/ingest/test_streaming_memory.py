"""Memory stays bounded: ingesting a 4x larger file does not take 4x the memory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from pipeline.sim import IterationModel, Policy, WorkloadSpec, run_simulation

INGEST = textwrap.dedent(
    """
    import resource, sys
    from pipeline import ingest, store
    from pipeline.ingest import reader
    reader.BATCH_BYTES = 4 << 20
    con = store.connect(sys.argv[1])
    (res,) = ingest.ingest_paths(con, [sys.argv[2]])
    assert res.rejected == 0
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
    """
)


def _peak_mib(tmp_path, trace) -> int:
    env = dict(os.environ, TRACELAT_MEMORY_LIMIT="256MB")
    out = subprocess.run(
        [sys.executable, "-c", INGEST, str(tmp_path / f"{trace.stem}.duckdb"), str(trace)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return int(out.stdout.split()[-1])


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_file_size(tmp_path):
    spec = dict(policy=Policy(max_num_seqs=64), model=IterationModel(), seed=1)
    small = tmp_path / "small.jsonl"
    big = tmp_path / "big.jsonl"
    run_simulation(small, truth=False, spec=WorkloadSpec(rate_rps=30), iterations=40_000, **spec)
    run_simulation(big, truth=False, spec=WorkloadSpec(rate_rps=30), iterations=160_000, **spec)
    assert big.stat().st_size > 3.5 * small.stat().st_size
    p_small, p_big = _peak_mib(tmp_path, small), _peak_mib(tmp_path, big)
    # Bounded: the 4x file may cost a little more (DuckDB's buffers up to its limit), never ~4x.
    assert p_big < 1.6 * p_small, (p_small, p_big, big.stat().st_size >> 20)
