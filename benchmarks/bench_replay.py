"""Benchmark trace replay on a large recorded run (default: 1M engine steps).

    python benchmarks/bench_replay.py                        # 1M steps, 1 seed
    python benchmarks/bench_replay.py --iterations 200000 --seeds 3 --profile

Phases, each timed: simulate the "recorded" run and write it (no token times),
ingest it into a fresh store, calibrate (the model fit is the bulk), replay
(simulate + statistics, per seed), write the replay as a canonical trace.
``--profile`` prints the top functions of calibrate + replay under cProfile.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import ingest, store  # noqa: E402
from pipeline.replay import calibrate, compare, replay_run_id, write_replay  # noqa: E402
from pipeline.sim import IterationModel, NoiseModel, Policy, WorkloadSpec, run_simulation  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=1_000_000)
    ap.add_argument("--rate", type=float, default=20.0, help="requests/s of the recorded run")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one, deleted after)")
    a = ap.parse_args()

    tmp = tempfile.TemporaryDirectory() if a.dir is None else None
    work = Path(tmp.name if tmp else a.dir)
    work.mkdir(parents=True, exist_ok=True)
    trace, db = work / "recorded.jsonl", work / "bench.duckdb"
    db.unlink(missing_ok=True)
    times: dict[str, float] = {}

    t = time.perf_counter()
    run = run_simulation(
        trace,
        truth=False,
        run_id="recorded",
        spec=WorkloadSpec(rate_rps=a.rate),
        policy=Policy(kv_capacity_tokens=200_000),
        model=IterationModel(),
        noise=NoiseModel(stall_rate=0.001),
        iterations=a.iterations,
        with_token_times=False,
    )
    times["simulate + write recorded run"] = time.perf_counter() - t

    t = time.perf_counter()
    con = store.connect(db)
    ingest.ingest_paths(con, [trace], fmt="jsonl")
    store.build_derived(con)
    times["ingest + derived tables"] = time.perf_counter() - t

    prof = cProfile.Profile() if a.profile else None
    if prof:
        prof.enable()
    t = time.perf_counter()
    cal = calibrate(con, "recorded")
    times["calibrate (fit included)"] = time.perf_counter() - t

    t = time.perf_counter()
    results = {}
    cmp = compare(con, cal, list(range(a.seeds)), lambda s, r, st: results.setdefault(s, r))
    times[f"replay, {a.seeds} seed(s): simulate + stats"] = time.perf_counter() - t
    if prof:
        prof.disable()

    t = time.perf_counter()
    out = write_replay(results[0], work / "replay.jsonl", replay_run_id(cal, 0), cal, 0, con, with_token_times=False)
    times["write replay trace (seed 0)"] = time.perf_counter() - t

    r0 = results[0]
    print(f"recorded run      {run.result.n_iterations:,} steps, {run.result.n_requests:,} requests")
    print(f"replay            {r0.n_iterations:,} steps ({r0.info['stop']}); trace {out.stat().st_size / 1e6:,.0f} MB")
    for name, sec in times.items():
        print(f"{name:<36}{sec:8.2f} s")
    replay_s = times["calibrate (fit included)"] + times[f"replay, {a.seeds} seed(s): simulate + stats"]
    print(f"{'calibrate + replay':<36}{replay_s:8.2f} s")
    print(f"peak RSS          {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")
    rows = {(r["metric"], r["stat"]): r for r in cmp.rows()}
    for key in (("ttft_ms", "p50"), ("ttft_ms", "p99"), ("tpot_ms", "p50"), ("tpot_ms", "p99")):
        r = rows[key]
        print(
            f"{key[0]} {key[1]}: observed {r['observed']:.4g}, replay {r['replay']:.4g} ({r['rel_error'] * 100:+.2f}%)"
        )
    con.close()
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    main()
