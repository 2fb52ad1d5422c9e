"""What one more small file costs: `tracelat ingest DIR` over many copies of small fixtures.

A nightly run over a day of benchmark results ingests many files of a few hundred lines; each
pays fixed costs (its transaction, binding the validation statements, its checks) that a
1M-step benchmark never shows.  This script copies small bundled fixtures of several formats
N times each (every copy its own run: the file names differ), ingests each format's folder
in one `tracelat ingest` process, and reports milliseconds per file beyond the process
start (the same command on one copy, subtracted).

Usage:
  python benchmarks/bench_small_files.py                        # 40 copies, 3 rounds
  python benchmarks/bench_small_files.py --copies 100 --rounds 5
  python benchmarks/bench_small_files.py --before /tmp/before   # and a checkout to compare
                                                                #   (git worktree add /tmp/before REV)

Rounds are interleaved (before, after, before, ...) and the fastest round of each counts:
this machine's speed moves between runs; read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# format -> fixture (each a few dozen to a few hundred records)
FIXTURES = {
    "jsonl": "fixtures/canonical/tiny.jsonl",
    "vllm-bench": "fixtures/vllm/bench.json",
    "vllm-requests": "fixtures/vllm/requests.jsonl",
    "aiperf": "fixtures/aiperf/profile_export.jsonl",
    "guidellm": "fixtures/guidellm/benchmarks.json",
    "trtllm-iterlog": "fixtures/trtllm/metrics.json",
    "vllm-log": "fixtures/vllm/server.log",
    "sglang-log": "fixtures/sglang/server.log",
}


def _ingest(checkout: Path, folder: Path, fmt: str, db: Path) -> float:
    for p in (db, Path(f"{db}.wal")):
        p.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    cmd = [sys.executable, "-m", "pipeline", "ingest", str(folder), "--format", fmt, "--db", str(db), "--json"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"ingest failed in {checkout}: {proc.stderr[-2000:]}")
    # every copy is a run of its own: the same records accepted from each, none a duplicate
    results = json.loads(proc.stdout)
    if len({r["accepted"] for r in results}) != 1 or len({tuple(r["run_ids"]) for r in results}) != len(results):
        sys.exit(f"the copies of {fmt} are not runs of their own: {[(r['accepted'], r['run_ids']) for r in results]}")
    return took


def _own_run(fmt: str, data: bytes) -> bytes:
    """The fixture as a file whose records take their run from the file's name: the canonical
    trace names its run ("tiny"), which made every copy after the first a file of duplicates."""
    if fmt == "jsonl":
        data = data.replace(b'"run_id":"tiny",', b"", 1)
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", type=Path, default=None, help="a checkout to compare against")
    ap.add_argument("--formats", default=",".join(FIXTURES), help="comma-separated, of: " + ", ".join(FIXTURES))
    args = ap.parse_args()
    sides = {"after": REPO} if args.before is None else {"before": args.before.resolve(), "after": REPO}
    work = Path(tempfile.mkdtemp(prefix="tracelat-small-"))
    try:
        print(f"{args.copies} copies per format, {args.rounds} rounds; ms per file beyond one file's run")
        for fmt in args.formats.split(","):
            src = REPO / FIXTURES[fmt]
            one, many = work / fmt / "one", work / fmt / "many"
            one.mkdir(parents=True)
            many.mkdir(parents=True)
            data = _own_run(fmt, src.read_bytes())
            (one / f"c0{src.suffix}").write_bytes(data)
            for i in range(args.copies):
                (many / f"c{i}{src.suffix}").write_bytes(data)
            best: dict[str, float] = {}
            for _ in range(args.rounds):
                for name, checkout in sides.items():
                    base = _ingest(checkout, one, fmt, work / "one.duckdb")
                    full = _ingest(checkout, many, fmt, work / "many.duckdb")
                    per = (full - base) / (args.copies - 1) * 1000
                    best[name] = min(best.get(name, float("inf")), per)
            shown = "  ".join(f"{k} {v:6.1f} ms" for k, v in best.items())
            ratio = f"  (after/before {best['after'] / best['before']:.2f})" if "before" in best else ""
            print(f"  {fmt:14s} {shown}{ratio}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
