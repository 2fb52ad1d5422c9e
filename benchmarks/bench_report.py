"""Benchmark report generation on a large simulated run.

    python benchmarks/bench_report.py                         # 1M iterations, token times on
    python benchmarks/bench_report.py --iterations 200000 --no-token-times

Simulates the run, ingests it into a temporary store, then times (1) the summary
with the model fit (pipeline.fit; computed on first use), (2) ``write_report`` given that summary, and
prints the size of index.html (the issue's budget: under ~5 MB for 1M iterations).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=1_000_000)
    ap.add_argument("--no-token-times", action="store_true")
    ap.add_argument("--keep", default=None, help="folder to keep the trace, store and report in")
    a = ap.parse_args()

    from pipeline import ingest, store
    from pipeline.summary import summary
    from pipeline.report import write_report
    from pipeline.report.page import vega_bundle
    from pipeline.sim import NoiseModel, run_simulation

    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="bench_report_"))
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    sim = run_simulation(
        work / "big.jsonl",
        truth=False,
        run_id="big",
        iterations=a.iterations,
        noise=NoiseModel(stall_rate=0.001),
        with_token_times=not a.no_token_times,
        seed=1,
    )
    t_sim = time.perf_counter() - t
    t = time.perf_counter()
    con = store.connect(work / "big.duckdb")
    ingest.ingest_paths(con, [sim.trace_path])
    store.build_derived(con)
    t_ingest = time.perf_counter() - t
    vega_bundle()  # a one-off per process (about 2 s): not part of the per-report cost
    t = time.perf_counter()
    s = summary(con, "big")
    t_summary = time.perf_counter() - t
    t = time.perf_counter()
    index = write_report(con, "big", work / "report", summary=s)
    t_report = time.perf_counter() - t
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"iterations          {s['iterations']:,}")
    print(f"requests            {s['requests']:,}  (token gaps: {s['itl_ms']['count'] or 0:,})")
    print(f"simulate + write    {t_sim:8.1f} s")
    print(f"ingest + derived    {t_ingest:8.1f} s")
    print(f"summary incl. fit   {t_summary:8.1f} s  (first time: fits and stores the model)")
    print(f"write_report        {t_report:8.1f} s  (given the summary)")
    print(f"index.html          {index.stat().st_size / 1e6:8.2f} MB  ({index})")
    print(f"peak RSS            {peak_mb:8.0f} MB")


if __name__ == "__main__":
    main()
