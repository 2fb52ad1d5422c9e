"""Fleet at scale: N simulated replicas of S steps each, ingested into a lake and analysed by ``fleet``.

Usage:
    python benchmarks/bench_fleet.py                       # 64 runs x 50k steps (the figures in docs/scale.md)
    python benchmarks/bench_fleet.py --runs 8 --steps 5000 # a quick look
    python benchmarks/bench_fleet.py --work /tmp/fleetbench --keep   # keep traces, store and lake

Ray comes from ``pip install 'tracelat[ray]'``; without it the Ray line is skipped.

Phases, each timed on its own (the machine may be shared: compare ratios within one run):

1. simulate the replicas (a process pool; not part of any comparison); one has a slower
   GPU (half the bandwidth), one a head-of-line incident;
2. ``ingest DIR --lake L`` (one process), and ``ingest DIR --db S`` for the baseline;
3. the baseline: one process, for each run ``get_or_fit`` then ``summary`` over the store;
4. ``fleet L`` on a local Ray instance with ``--workers`` CPUs, and in the process pool;
5. the per-task cost from the tasks' own clocks, the driver's peak RSS, a task's peak RSS,
   and the projection to a 64-CPU cluster: ceil(N / 64) waves of the mean task, plus the
   driver's fixed cost (start, merge) measured here.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def simulate_one(args: tuple[str, int, int]) -> str:
    from pipeline.sim import IterationModel, NoiseModel, Policy, WorkloadSpec, run_simulation

    out, i, steps = args
    slow = i == 1  # half the bandwidth: the KV read costs twice as much
    burst = i == 2
    spec = WorkloadSpec(
        rate_rps=6.0,
        prompt_mean=400,
        output_mean=120,
        burst_at_s=60.0 if burst else None,
        burst_count=12 if burst else 0,
        burst_prompt_tokens=16000,
        burst_output_tokens=16,
    )
    run_simulation(
        out,
        truth=False,
        run_id=f"replica-{i:03d}",
        spec=spec,
        policy=Policy(max_num_seqs=16, max_num_batched_tokens=2048, kv_capacity_tokens=200_000),
        model=IterationModel(6.8, 0.00025 * (2.0 if slow else 1.0), 0.032, 0.0),
        noise=NoiseModel(0.03, 0.0005, 40.0),
        seed=100 + i,
        iterations=steps,
        model_name="meta-llama/Llama-3.1-8B",
        gpu="H100-SXM",
    )
    return out


def cli(*args: object) -> float:
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return time.perf_counter() - t


def baseline(db: Path) -> tuple[float, int]:
    """Sequential: every run's fit and summary in one process over the store."""
    from pipeline import store
    from pipeline.fit import get_or_fit
    from pipeline.metrics import summary

    t = time.perf_counter()
    con = store.open_for_reading(db)
    runs = store.known_runs(con)
    for r in runs:
        get_or_fit(con, r)
        summary(con, r)
    con.close()
    return time.perf_counter() - t, len(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50_000)
    ap.add_argument("--workers", type=int, default=2, help="CPUs of the local Ray instance and the pool")
    ap.add_argument("--work", type=Path, default=None, help="folder for traces, store and lake (default: temporary)")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="bench_fleet_"))
    traces, lake, db = work / "traces", work / "lake", work / "store.duckdb"
    traces.mkdir(parents=True, exist_ok=True)

    t = time.perf_counter()
    todo = [
        (str(traces / f"replica-{i:03d}.jsonl"), i, a.steps)
        for i in range(a.runs)
        if not (traces / f"replica-{i:03d}.jsonl").exists()
    ]
    with ProcessPoolExecutor(a.workers) as pool:
        list(pool.map(simulate_one, todo))
    size = sum(p.stat().st_size for p in traces.iterdir()) / 2**20
    print(f"simulate {a.runs} x {a.steps:,} steps: {time.perf_counter() - t:.0f} s ({size:,.0f} MiB of traces)")

    shutil.rmtree(lake, ignore_errors=True)
    db.unlink(missing_ok=True)
    t_lake = cli("ingest", traces, "--lake", lake)
    lake_mib = sum(p.stat().st_size for p in lake.rglob("*.parquet")) / 2**20
    print(
        f"ingest --lake: {t_lake:.1f} s ({t_lake / a.runs:.2f} s per run; lake {lake_mib:,.0f} MiB, "
        f"{lake_mib / a.runs:.1f} MiB per run)"
    )
    t_db = cli("ingest", traces, "--db", db)
    print(f"ingest --db:   {t_db:.1f} s")

    t_seq, n = baseline(db)
    print(f"sequential fit + summary of {n} runs over the store: {t_seq:.1f} s ({t_seq / n:.2f} s per run)")

    from pipeline.fleet import fleet

    results = {}
    try:
        import ray  # noqa: F401

        runs_on = [("local Ray", "local"), ("process pool", None)]
    except ImportError:
        print("Ray is not installed: pip install 'tracelat[ray]' for the Ray line")
        runs_on = [("process pool", None)]
    for label, ray in runs_on:
        t = time.perf_counter()
        out = fleet(lake, ray=ray, workers=a.workers)
        wall = time.perf_counter() - t
        results[label] = (wall, out)
        tasks = out["cost"]["task_wall_s_sum"]
        print(
            f"fleet on {label} ({out['executor']}): {wall:.1f} s; tasks {tasks:.1f} s in all, "
            f"{tasks / a.runs:.2f} s mean; task peak RSS {out['cost']['task_peak_rss_mib_max']:,.0f} MiB; "
            f"speed-up over the sequential loop {t_seq / wall:.2f}x"
        )
        flagged = {r["run_id"]: r["outlier"] for r in out["runs"] if r["outlier"]}
        print(f"  flagged: {flagged}")
    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"driver peak RSS (this process, store baseline included): {driver:,.0f} MiB")
    wall, out = results[runs_on[0][0]]
    mean_task = out["cost"]["task_wall_s_sum"] / a.runs
    fixed = max(wall - out["cost"]["task_wall_s_sum"] / a.workers, 0.0)
    for cpus in (a.workers, 64):
        waves = math.ceil(a.runs / cpus)
        print(
            f"projected on {cpus} CPUs: {waves} wave(s) x {mean_task:.2f} s + {fixed:.1f} s fixed = "
            f"{waves * mean_task + fixed:.1f} s"
        )
    if not a.keep and a.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    main()
