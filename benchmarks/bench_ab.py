"""Before and after: `tracelat ingest` + the core summary of one canonical trace, by two
checkouts of tracelat, against the floor of bench_ingest.py, in interleaved rounds.

On a noisy machine the floor alone moves by a third between runs, so a change to the ingest is
only seen by timing both versions in the same run, round after round.  Make the "before"
checkout with ``git worktree add /tmp/before <commit>``; this checkout is "after".

Usage:
  python benchmarks/bench_ab.py --before /tmp/before                     # 1M iterations, 5 rounds
  python benchmarks/bench_ab.py --before /tmp/before --iterations 100000 --rounds 3 --workdir DIR
  python benchmarks/bench_ab.py --before /tmp/before --parquet   # the same records as canonical Parquet
  python benchmarks/bench_ab.py --before /tmp/before --recording # the headline's tiled vLLM recording

Each step runs in its own process with this Python, the checkout first on PYTHONPATH (so its
``pipeline`` and ``queries/`` are the ones used).  Every round prints each side's seconds; the
end prints the fastest round of each and its ratio to the fastest floor, and in how many rounds
"after" was faster.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_ingest as B  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


CPU: dict[str, float] = {}  # CPU seconds (user + system, all threads) of the last timed step per side


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(args: list[str], checkout: Path, side: str = "") -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    t, c = time.perf_counter(), _children_cpu()
    proc = subprocess.run([sys.executable, *args], cwd=checkout, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"step failed in {checkout}: {args[:3]}\n{proc.stderr[-2000:]}")
    CPU[side] = CPU.get(side, 0.0) + _children_cpu() - c
    return time.perf_counter() - t


def ingest_and_summary(checkout: Path, trace: Path, db: Path) -> float:
    for p in (db, Path(f"{db}.wal")):
        p.unlink(missing_ok=True)
    side = str(checkout)
    CPU[side] = 0.0
    sec = timed(["-m", "pipeline", "ingest", str(trace), "--db", str(db)], checkout, side)
    return sec + timed(["-c", B.CORE_SUMMARY, str(db), "bench"], checkout, side)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="checkout of the version to compare against")
    ap.add_argument("--iterations", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=None, help="traces are generated once and reused here")
    ap.add_argument(
        "--parquet",
        action="store_true",
        help="ingest the trace's records as canonical Parquet; the floor is read_parquet into a table",
    )
    ap.add_argument(
        "--recording",
        action="store_true",
        help="the real vLLM CPU recording tiled to the size (bench_ingest.py --recording), not the simulator's",
    )
    args = ap.parse_args()
    if not (args.before / "pipeline" / "__init__.py").exists():
        sys.exit(f"{args.before} is no tracelat checkout (no pipeline/__init__.py)")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tracelat-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    trace = B.trace_for(work, args.iterations, args.recording)
    for checkout in (args.before, REPO):  # each side's bytecode compiled once, as an install has it
        subprocess.run([sys.executable, "-m", "compileall", "-q", "pipeline"], check=True, cwd=checkout)
    cols = B.canonical_columns()
    floor = [B.FLOOR, str(trace), cols]
    if args.parquet:
        trace = B.parquet_for(trace, cols)
        floor = [B.PARQUET_FLOOR, str(trace)]
    sides = {"before": args.before.resolve(), "after": REPO}
    best: dict[str, float] = {}
    best_cpu: dict[str, float] = {}
    wins = 0
    for r in range(args.rounds):
        CPU["floor"] = 0.0
        got = {"floor": timed(["-c", *floor], REPO, "floor")}
        cpu = {"floor": CPU["floor"]}
        for name, checkout in sides.items():
            got[name] = ingest_and_summary(checkout, trace, work / f"ab-{name}.duckdb")
            cpu[name] = CPU[str(checkout)]
        wins += got["after"] < got["before"]
        for k, v in got.items():
            best[k] = min(best.get(k, float("inf")), v)
            best_cpu[k] = min(best_cpu.get(k, float("inf")), cpu[k])
        print(f"round {r + 1}: " + "  ".join(f"{k} {v:.2f} s (cpu {cpu[k]:.2f})" for k, v in got.items()), flush=True)
    floor, floor_cpu = best["floor"], best_cpu["floor"]
    print("fastest: " + "  ".join(f"{k} {v:.2f} s ({v / floor:.2f}x floor)" for k, v in best.items()))
    # CPU seconds (user + system of every thread) move less than wall time on a shared machine
    print("least CPU: " + "  ".join(f"{k} {v:.2f} s ({v / floor_cpu:.2f}x floor)" for k, v in best_cpu.items()))
    print(f"after faster in {wins} of {args.rounds} rounds")


if __name__ == "__main__":
    main()
