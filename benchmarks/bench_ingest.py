"""Ingest, derived tables and summary of a big canonical trace, against DuckDB's bare load.

Usage:
  python benchmarks/bench_ingest.py                       # 1M and 4M iterations (issue 11; long)
  python benchmarks/bench_ingest.py --iterations 100000   # quick: 100k and 400k iterations
  python benchmarks/bench_ingest.py --iterations 100000 --scale 1   # one size only
  python benchmarks/bench_ingest.py --recording           # a real recording tiled, not the simulator
  options: --workdir DIR (traces are generated once per size and reused there), --keep,
           --repeat N (every phase N times in rounds; the fastest round of each counts)

Every phase runs in its own child process, so its wall time and peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss`` of that child, reported on exit) are its own:

  floor            read_json(FILE, format='newline_delimited', columns={...}) into a table of an
                   in-memory DuckDB: the canonical fields with their types, given explicitly
                   (pipeline/ingest/canonical_sql.py FIELDS), one scan of the file.  Ratios are
                   against this.
  floor_file       the same into a database file, checkpointed: the floor plus persisting the
                   table (tracelat writes a store file), for reference; ratios stay against floor.
  bound            floor_file, then on its table the core numbers that tracelat stores and
                   reports, computed as tracelat computes them (exact ITL percentiles and
                   moments over every gap of the ok requests; TTFT, E2E and iteration-time
                   percentiles): what any tool that returns the same numbers does at least, with
                   no validation, rejects, duplicate checks or per-run bookkeeping.  Its ratio
                   says how much of the targets is left for those.
  floor_sampled    the same with sample_size=-1 and no schema: DuckDB scans the whole file once
                   to infer the types and again to load it (the floor this script used before).
  startup          python start plus the imports of the phases below, nothing else: part of
                   every tracelat figure, dominant on small files.
  ingest           ingest.ingest_paths into a new store (reading, validation, base tables,
                   post-ingest steps); no derived tables.
  derived          store.build_derived on that store (queries/*.sql).
  summary_core     the summary.json sections of the foundation (counts, latency metrics,
                   iteration time, throughput); the analyses' sections (steady state, model
                   fit, engine gauges) are left out.
  summary_full     `tracelat summary RUN --json`, fit, spikes and tail sections included (it
                   fits the model on first use), shown for reference.
  cli_ingest       `tracelat ingest FILE` into another new store: ingest + derived in one process,
                   what a user runs (one interpreter start, the data still in DuckDB's cache).
  parquet_floor    the same records as a Parquet file (written once by DuckDB with the canonical
                   columns), read_parquet into a table of an in-memory DuckDB.
  cli_parquet      `tracelat ingest` of that Parquet file into a new store.

Every phase also shows its CPU seconds (user + system of all its threads): on a machine with few
cores the work done, which noise from other tenants moves less than wall time.  With --repeat,
the headline ratio is also shown per round (that round's cli_ingest + summary_core over that
round's floor) with its median: the fastest rounds of two phases may come from different spells.

The package's bytecode is compiled before the first round (compile_package), as an installed
tracelat has it: the figures before 2026-12-07's sixteenth session compiled it in every child.

Totals: ``ingest+derived+summary_core`` adds the three separate processes (three starts);
``cli_ingest+summary_core`` is the user's two commands, the figure the targets are about.  Machines are noisy (and this one may be
shared): read the ratios, not the absolute seconds, and run twice if in doubt.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.ingest.canonical_sql import COMMON, FIELDS  # noqa: E402


def canonical_columns() -> str:
    """DuckDB ``columns={...}`` struct of every canonical field with its store type."""
    cols = {name: "varchar" for name in COMMON}
    for fields in FIELDS.values():
        for f in fields:
            if cols.setdefault(f.name, f.column_type) != f.column_type:
                raise SystemExit(f"field {f.name} has two types: {cols[f.name]}, {f.column_type}")
    return "{" + ", ".join(f"'{n}': '{t.upper()}'" for n, t in cols.items()) + "}"


FLOOR = """
import duckdb, sys
con = duckdb.connect()
con.execute("set enable_progress_bar = false")  # as in tracelat
con.execute("create table x as select * from read_json(?, format='newline_delimited', columns=" + sys.argv[2] + ")",
            [sys.argv[1]])
print(con.execute("select count(*) from x").fetchall()[0][0])
"""

# The floor again, into a database file, checkpointed: what persisting the same table costs
# (tracelat writes a store file; the floor above keeps its table in memory). With a fourth
# argument (the bound), that query runs on the persisted table and its row is printed as JSON.
FLOOR_FILE = """
import duckdb, json, os, sys
db = sys.argv[3]
for p in (db, db + ".wal"):
    if os.path.exists(p):
        os.unlink(p)
con = duckdb.connect(db)
con.execute("set enable_progress_bar = false")  # as in tracelat
con.execute("create table x as select * from read_json(?, format='newline_delimited', columns=" + sys.argv[2] + ")",
            [sys.argv[1]])
con.execute("checkpoint")
if len(sys.argv) > 4:
    print(json.dumps(con.execute(sys.argv[4]).fetchall()[0]))
print(con.execute("select count(*) from x").fetchall()[0][0])
con.close()
os.unlink(db)
"""

# bound: the floor persisted, then the exact statistics of queries/metric_stats.sql (ITL gaps
# as one list per ok request, quantiles over them, moments as exact fixed-point sums) and the
# percentiles of the per-request and per-iteration metrics, on the floor's table.
QS = "[0.5, 0.9, 0.95, 0.99, 0.999]"
BOUND_STATS = f"""
with ok as (select * from x where kind = 'request' and coalesce(status, 'ok') = 'ok'),
gaps as materialized (
    select list_transform(list_zip(token_times[2:], token_times[:-2]), lambda p: (p[1] - p[2]) * 1000) as g
    from ok where len(token_times) > 1
),
s as (select count(v) as n, max(v) - min(v) as span, quantile_cont(v, {QS}) as q from (select unnest(g) as v from gaps)),
m as (
    select sum(list_sum(d)::decimal(38, 24))::double as sd, sum(list_dot_product(d, d)::decimal(38, 24))::double as sdd
    from (select list_transform(g, lambda v: (v - s.q[1]) / s.span) as d from gaps, s)
)
select s.*, m.*,
    (select quantile_cont((t_first_token - t_arrival) * 1000, {QS}) from ok),
    (select quantile_cont((t_finish - t_arrival) * 1000, {QS}) from ok),
    (select quantile_cont(dur_ms, {QS}) from x where kind = 'iteration')
from s, m
"""

FLOOR_SAMPLED = """
import duckdb, sys
con = duckdb.connect()
con.execute("set enable_progress_bar = false")  # as in tracelat
con.execute("create table x as select * from read_json(?, format='newline_delimited', sample_size=-1)", [sys.argv[1]])
print(con.execute("select count(*) from x").fetchall()[0][0])
"""

PARQUET_FLOOR = """
import duckdb, sys
con = duckdb.connect()
con.execute("set enable_progress_bar = false")  # as in tracelat
con.execute("create table x as select * from read_parquet(?)", [sys.argv[1]])
print(con.execute("select count(*) from x").fetchall()[0][0])
"""


TO_PARQUET = """
import duckdb, sys
trace, out, cols = sys.argv[1:4]
target = "'" + out.replace("'", "''") + "'"  # COPY's target takes no parameter: quoted as a literal
duckdb.connect().execute(
    "copy (select * from read_json(?, format='newline_delimited', columns=" + cols + ")) to " + target + " (format parquet)",
    [trace],
)
"""


def parquet_for(trace: Path, cols: str) -> Path:
    """The canonical trace's records as one Parquet file (a column per canonical field), made once.

    In a child process: a child's peak RSS counts its parent's at the fork, so this process
    stays small."""
    out = trace.with_suffix(".parquet")
    if not out.exists():
        subprocess.run([sys.executable, "-c", TO_PARQUET, str(trace), str(out), cols], check=True, cwd=REPO)
    return out


STARTUP = """
from pipeline import ingest, metrics, store
from pipeline.ingest import engines
"""

INGEST = """
import sys
from pipeline import ingest, store
con = store.connect(sys.argv[1])
for r in ingest.ingest_paths(con, [sys.argv[2]]):
    print(r.line())
con.close()
"""

DERIVED = """
import sys
from pipeline import store
con = store.connect(sys.argv[1])
assert store.build_derived(con), "derived tables were already current"
con.close()
"""

CORE_SUMMARY = """
import json, sys
from pipeline import store, summary
summary.SECTION_PROVIDERS.clear()  # the sections of the foundation only; the fit is timed apart
con = store.open_for_reading(sys.argv[1], read_only_if=store.always)
print(json.dumps(summary.summary(con, sys.argv[2]), default=str))
"""

# Runs one phase and reports the child's own peak RSS on stderr, whatever happens.
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
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print("MAXRSS_KIB", ru.ru_maxrss, file=sys.stderr)
    print("CPU_S", ru.ru_utime + ru.ru_stime, file=sys.stderr)
"""


def measured(args: list[str]) -> tuple[float, float, str, float]:
    """(seconds, peak RSS MiB, stdout, CPU seconds) of ``python ARGS`` in a fresh child process.

    CPU seconds: user + system of every thread of the child (its own rusage at exit)."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", WRAP, *args], capture_output=True, text=True, cwd=REPO)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"step failed: {args[:1]} ...\n{proc.stderr}")
    lines = proc.stderr.splitlines()
    rss = [int(l.split()[1]) for l in lines if l.startswith("MAXRSS_KIB")][-1] / 1024
    cpu = [float(l.split()[1]) for l in lines if l.startswith("CPU_S")][-1]
    return dt, rss, proc.stdout, cpu


def compile_package() -> None:
    """The package's bytecode written once, as ``pip install`` does for a wheel and as Python does
    on a checkout's first run. With PYTHONDONTWRITEBYTECODE set (this sandbox sets it) nothing
    else writes it, and every child process of the rounds compiled about 30 modules from source,
    about 0.05 s a process that no installed tracelat spends."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "pipeline"], check=True, cwd=REPO)
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("PYTHONDONTWRITEBYTECODE is set: the package's bytecode was compiled first", file=sys.stderr)


def trace_for(work: Path, iterations: int, recording: bool = False) -> Path:
    trace = work / f"bench-{'rec-' if recording else ''}{iterations}.jsonl"
    if not trace.exists():
        t = time.perf_counter()
        if recording:  # the real vLLM CPU run of fixtures/vllm, tiled (benchmarks/tile_recording.py)
            cmd = [str(REPO / "benchmarks" / "tile_recording.py"), str(trace), "--iterations", str(iterations)]
        else:
            cmd = ["-m", "pipeline", "simulate", "--out", str(trace), "--run-id", "bench"]
            cmd += ["--iterations", str(iterations), "--seed", "1"]
        subprocess.run(
            [sys.executable, *cmd],
            check=True,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
        )
        print(
            f"generated {trace.name} ({trace.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.0f} s",
            file=sys.stderr,
        )
    return trace


def _fresh(db: Path) -> Path:
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    return db


def bench(work: Path, iterations: int, repeat: int = 1, recording: bool = False) -> dict:
    """Every phase ``repeat`` times, in rounds (all phases once per round, so that a slow
    spell of a shared machine hits every phase alike); a phase's wall time is its fastest
    round, its peak RSS the largest of its rounds."""
    trace = trace_for(work, iterations, recording)
    db = work / f"bench-{iterations}.duckdb"
    db2 = work / f"bench-{iterations}-cli.duckdb"
    db3 = work / f"bench-{iterations}-parquet.duckdb"
    cols = canonical_columns()
    steps: dict[str, list[str]] = {
        "floor": [FLOOR, str(trace), cols],
        "floor_file": [FLOOR_FILE, str(trace), cols, str(work / "floor.duckdb")],
        "bound": [FLOOR_FILE, str(trace), cols, str(work / "bound.duckdb"), BOUND_STATS],
        "floor_sampled": [FLOOR_SAMPLED, str(trace)],
        "startup": [STARTUP],
        "ingest": [INGEST, str(db), str(trace)],
        "derived": [DERIVED, str(db)],
        "summary_core": [CORE_SUMMARY, str(db), "bench"],
        "summary_full": ["-m", "pipeline", "summary", "bench", "--db", str(db), "--json"],
        "cli_ingest": ["-m", "pipeline", "ingest", str(trace), "--db", str(db2)],
    }
    pq = parquet_for(trace, cols)
    steps["parquet_floor"] = [PARQUET_FLOOR, str(pq)]
    steps["cli_parquet"] = ["-m", "pipeline", "ingest", str(pq), "--db", str(db3), "--run-id", "bench"]
    phases: dict[str, tuple[float, float]] = {}
    cpus: dict[str, float] = {}
    rounds: list[float] = []  # each round's cli_ingest + summary_core over that round's floor
    out = bound_out = ""
    for _ in range(max(1, repeat)):
        _fresh(db)
        _fresh(db2)
        _fresh(db3)
        this: dict[str, float] = {}
        for name, args in steps.items():
            sec, rss, text, cpu = measured(args)
            this[name] = sec
            if name == "summary_core":
                out = text
            if name == "bound":
                bound_out = text
            best = phases.get(name, (float("inf"), 0.0))
            phases[name] = (min(best[0], sec), max(best[1], rss))
            cpus[name] = min(cpus.get(name, float("inf")), cpu)
        rounds.append((this["cli_ingest"] + this["summary_core"]) / this["floor"])
    summary = json.loads(out)
    _check_bound(summary, bound_out)
    floor = phases["floor"][0]
    total = sum(phases[p][0] for p in ("ingest", "derived", "summary_core"))
    cli = phases["cli_ingest"][0] + phases["summary_core"][0]
    return {
        "iterations": summary["iterations"],
        "requests": summary["requests"],
        "itl_gaps": summary["itl_ms"]["count"],
        "file_mib": round(trace.stat().st_size / 2**20, 1),
        "phases": {
            name: {
                "wall_s": round(sec, 2),
                "cpu_s": round(cpus[name], 2),
                "peak_rss_mib": round(rss),
                "ratio_to_floor": round(sec / floor, 2),
            }
            for name, (sec, rss) in phases.items()
        },
        # the headline ratio of each round on its own (a slow spell of the machine hits both)
        "cli_ingest_summary_core_ratio_per_round": [round(x, 2) for x in rounds],
        "ingest_derived_summary_core": {
            "wall_s": round(total, 2),
            "cpu_s": round(sum(cpus[p] for p in ("ingest", "derived", "summary_core")), 2),
            "ratio_to_floor": round(total / floor, 2),
            "peak_rss_mib": round(max(phases[p][1] for p in ("ingest", "derived", "summary_core"))),
        },
        "cli_ingest_summary_core": {
            "wall_s": round(cli, 2),
            "cpu_s": round(cpus["cli_ingest"] + cpus["summary_core"], 2),
            "ratio_to_floor": round(cli / floor, 2),
            "peak_rss_mib": round(max(phases[p][1] for p in ("cli_ingest", "summary_core"))),
        },
    }


def _check_bound(summary: dict, bound_out: str) -> None:
    """The bound computed the numbers tracelat reports (else it is no bound of the same work)."""
    n, _span, q, *_ = json.loads(next(l for l in bound_out.splitlines() if l.startswith("[")))
    itl = summary["itl_ms"]
    got = [itl[k] for k in ("p50", "p90", "p95", "p99", "p999")]
    if n != itl["count"] or any(abs(a - b) > 1e-9 * max(1.0, abs(b)) for a, b in zip(q, got)):
        sys.exit(f"bound disagrees with tracelat: ITL count {n} vs {itl['count']}, quantiles {q} vs {got}")


def table(r: dict) -> str:
    lines = [
        f"{r['iterations']:,} iterations, {r['requests']:,} requests, {r['itl_gaps']:,} ITL gaps, {r['file_mib']} MiB",
        f"  {'phase':<30}{'wall s':>8}{'CPU s':>8}{'peak RSS MiB':>14}{'x floor':>9}",
    ]
    rows = [
        *r["phases"].items(),
        ("ingest+derived+summary_core", r["ingest_derived_summary_core"]),
        ("cli_ingest+summary_core", r["cli_ingest_summary_core"]),
    ]
    for name, p in rows:
        lines.append(
            f"  {name:<30}{p['wall_s']:>8.2f}{p['cpu_s']:>8.2f}{p['peak_rss_mib']:>14}{p['ratio_to_floor']:>9.2f}"
        )
    per_round = r["cli_ingest_summary_core_ratio_per_round"]
    if len(per_round) > 1:
        median = statistics.median(per_round)
        lines.append(
            f"  cli_ingest+summary_core x floor by round: {', '.join(f'{x:.2f}' for x in per_round)} (median {median:.2f})"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--iterations",
        type=int,
        default=1_000_000,
        help="iterations of the first trace (default 1000000; 100000 runs in a few minutes)",
    )
    ap.add_argument(
        "--scale", type=int, default=4, help="the second trace is this many times bigger (1: one trace only)"
    )
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the generated traces and stores")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of every phase; each phase reports its fastest round (default 1; 3 on a noisy machine)",
    )
    ap.add_argument(
        "--recording",
        action="store_true",
        help="trace: the real vLLM CPU run of fixtures/vllm tiled to the size (benchmarks/tile_recording.py) "
        "instead of the simulator's",
    )
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tracelat-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    sizes = [args.iterations] + ([args.iterations * args.scale] if args.scale > 1 else [])
    compile_package()
    results = []
    for n in sizes:
        results.append(bench(work, n, args.repeat, args.recording))
        if not args.json:
            print(table(results[-1]), flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    if not args.keep and args.workdir is None:
        for p in work.iterdir():
            p.unlink()
        work.rmdir()


if __name__ == "__main__":
    main()
