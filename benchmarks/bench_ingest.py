"""Ingest + summarise a 1M-iteration canonical trace, against DuckDB's bare load as the floor.

Usage: python benchmarks/bench_ingest.py [--iterations 1000000] [--workdir DIR] [--keep]

Each measured step runs in its own subprocess so peak RSS is that step's alone:
  floor:   create table x as select * from read_json(FILE, format='newline_delimited', sample_size=-1)
           in an in-memory DuckDB (nothing else; a bare count(*) would be optimised away)
  tracelat: `tracelat ingest FILE --db NEW` (derived tables included), then the summary.json
           sections of the foundation (counts, latency metrics, iteration time, throughput);
           the full `tracelat summary --json` (model fit, spikes, tail) is timed separately
Machines are noisy: read the ratio, not the absolute seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CORE_SUMMARY = """
import json, sys
from pipeline import metrics, store
metrics.SECTION_PROVIDERS.clear()  # the sections of the foundation issue only; the fit is timed apart
con = store.open_for_reading(sys.argv[1])
print(json.dumps(metrics.summary(con, sys.argv[2]), default=str))
"""

FLOOR = """
import duckdb, sys
con = duckdb.connect()
con.execute("create table x as select * from read_json(?, format='newline_delimited', sample_size=-1)", [sys.argv[1]])
print(con.execute("select count(*) from x").fetchall()[0][0])
"""


WRAP = """
import resource, runpy, sys
code, sys.argv = sys.argv[1], sys.argv[1:]
try:
    if code == "-m":
        sys.argv = sys.argv[1:]
        runpy.run_module(sys.argv[0], run_name="__main__")
    else:
        exec(compile(code, "<bench>", "exec"))
finally:
    print("MAXRSS_KIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def measured(args: list[str]) -> tuple[float, float, str]:
    """(seconds, peak RSS MiB, stdout) of ``python ARGS`` in a fresh child process."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", WRAP, *args], capture_output=True, text=True)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"step failed: {args}\n{proc.stderr}")
    rss = [int(l.split()[1]) for l in proc.stderr.splitlines() if l.startswith("MAXRSS_KIB")][-1] / 1024
    return dt, rss, proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=1_000_000)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the generated trace and store")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tracelat-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    trace = work / "bench.jsonl"
    if not trace.exists():
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "pipeline", "simulate", "--out", str(trace), "--run-id", "bench",
             "--iterations", str(args.iterations), "--seed", "1"],
            check=True,
        )
        print(f"generated {trace} ({trace.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.1f} s")
    floor_s, floor_rss, _ = measured([FLOOR, str(trace)])
    db = work / "bench.duckdb"
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    ing_s, ing_rss, _ = measured(["-m", "pipeline", "ingest", str(trace), "--db", str(db)])
    sum_s, sum_rss, out = measured([CORE_SUMMARY, str(db), "bench"])
    full_s, _, _ = measured(["-m", "pipeline", "summary", "bench", "--db", str(db), "--json"])
    s = json.loads(out)
    total = ing_s + sum_s
    print(json.dumps({
        "iterations": s["iterations"], "requests": s["requests"], "itl_gaps": s["itl_ms"]["count"],
        "file_mib": round(trace.stat().st_size / 2**20, 1),
        "floor_s": round(floor_s, 2), "floor_peak_rss_mib": round(floor_rss),
        "ingest_s": round(ing_s, 2), "summary_s": round(sum_s, 2), "tracelat_total_s": round(total, 2),
        "tracelat_peak_rss_mib": round(max(ing_rss, sum_rss)),
        "ratio_to_floor": round(total / floor_s, 2),
        "full_summary_with_fit_sections_s": round(full_s, 2),
    }, indent=2))
    if not args.keep and args.workdir is None:
        for p in work.iterdir():
            p.unlink()
        work.rmdir()


if __name__ == "__main__":
    main()
