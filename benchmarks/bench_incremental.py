"""What a small nightly ingest costs when the store already holds big runs.

    python benchmarks/bench_incremental.py [--iterations 300000] [--big-runs 2]

Fills a store with ``--big-runs`` simulated runs of ``--iterations`` steps (token
times on), then ingests one small run (50 requests) and times: the ingest
transaction, the derived-table update (only the new run's rows, the default), and
a full rebuild of the same tables (what every ingest cost before runs were tracked).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=300_000)
    ap.add_argument("--big-runs", type=int, default=2)
    a = ap.parse_args()

    from pipeline import ingest, store
    from pipeline.sim import WorkloadSpec, run_simulation

    work = Path(tempfile.mkdtemp(prefix="bench_incremental_"))
    con = store.connect(work / "store.duckdb")
    t = time.perf_counter()
    for k in range(a.big_runs):
        run_simulation(work / f"big{k}.jsonl", truth=False, run_id=f"big{k}", iterations=a.iterations, seed=k + 1)
        ingest.ingest_paths(con, [work / f"big{k}.jsonl"])
        store.build_derived(con)
    n = store.scalar(con, "select count(*) from iterations")
    ntok = store.scalar(con, "select count(*) from tokens")
    print(f"store: {a.big_runs} runs, {n:,} steps, {ntok:,} token times ({time.perf_counter() - t:.0f} s to build)")

    run_simulation(work / "small.jsonl", truth=False, run_id="small", spec=WorkloadSpec(requests=50), seed=99)
    t = time.perf_counter()
    ingest.ingest_paths(con, [work / "small.jsonl"])
    t_ingest = time.perf_counter() - t
    t = time.perf_counter()
    store.build_derived(con)
    t_inc = time.perf_counter() - t
    t = time.perf_counter()
    store.build_derived(con, force=True)
    t_full = time.perf_counter() - t
    print(
        f"small run: ingest {t_ingest:.2f} s; derived tables for the new run {t_inc:.3f} s; "
        f"full rebuild {t_full:.2f} s ({t_full / t_inc:.0f}x)"
    )


if __name__ == "__main__":
    main()
