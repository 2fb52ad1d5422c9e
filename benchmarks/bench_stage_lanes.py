"""The canonical staging statement against the parse it would cost with DuckDB's typed JSON reader.

Usage:
  python benchmarks/bench_stage_lanes.py                 # the 1M-step trace of bench_ingest.py
  python benchmarks/bench_stage_lanes.py --iterations 100000 --rounds 3 --workdir DIR
  python benchmarks/bench_stage_lanes.py --recording     # the real vLLM CPU recording, tiled

Issue 11's biggest remaining lever is the parse. tracelat reads a canonical file's lines with
DuckDB's CSV reader and parses each with ``from_json`` (``canonical_sql.stage_sql``); DuckDB's
``read_json`` with the columns given parses into typed vectors directly and costs less. It is not
used because the validation needs each line's number (rejects, duplicates) and, for a few lines,
its text, and DuckDB's JSON and CSV readers give neither: ``file_row_number`` is "not supported
by this reader" (2.0.1), and numbering rows afterwards (``row_number() over ()``, ``POSITIONAL
JOIN`` with the lines) runs on one thread.

Three statements, each into a temporary table, in interleaved rounds (one process; CPU seconds
include DuckDB's threads; each round replaces the last round's tables):

  floor        read_json with the canonical columns (bench_ingest.py's floor)
  stage        the staging statement as the fast path runs it (file-wide quote count)
  stage_typed  the same statement over read_json's typed columns, every line's text replaced
               by a constant: NOT a valid staging (no line numbers, no text for rejects), only
               the most a typed parse could save. Lines that the text path looks at again (an
               object or list of strings, a null, a boolean) get no second look, so it also
               does a little less work. Its rows equal the stage's on traces whose typed fields
               sit on clean lines (the simulator's and the tiled recording): the number that
               differ is printed, with a warning when it is not 0 (the bound is then loose).

It also says whether this DuckDB gives row numbers to its JSON or CSV readers, which is what a
typed lane would need first.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_ingest as B  # noqa: E402

from pipeline.ingest import canonical_sql as cs  # noqa: E402
from pipeline.ingest import reader  # noqa: E402


# tracelat's line reader of a plain file, and read_json with the staging's parse types as columns
LINE_READ = reader.DUCKDB_READ.format(max_line=reader.MAX_LINE_BYTES, compression="none")
TYPED_READ = (
    "read_json($path, format='newline_delimited', columns={"
    + ",".join(f"'{k}':'{v}'" for k, v in json.loads(cs.PARSE_SPEC).items())
    + "})"
)


def statements() -> dict[str, str]:
    stage = cs.stage_sql(LINE_READ, line_no=None, keep_raw=False, file_quotes=True)
    parse = f"(select raw, try(from_json(raw, '{cs.PARSE_SPEC}')) as j from {LINE_READ})"
    if parse not in stage:
        sys.exit("the staging statement no longer parses lines as this benchmark expects; update it")
    typed = f"(select '{{}}' as raw, r as j from {TYPED_READ} r)"
    return {
        "floor": f"select * from read_json($path, format='newline_delimited', columns={B.canonical_columns()})",
        "stage": stage,
        "stage_typed": stage.replace(parse, typed),
    }


ROW_NUMBER_OPTION = "file_row_number"


def row_numbers(con: duckdb.DuckDBPyConnection, reader_sql: str, params: dict) -> bool | None:
    """Whether DuckDB's reader ``reader_sql`` (a table function call ending in ``)``) numbers its
    rows in the file: True, False when DuckDB says it does not, None on any other error."""
    with_option = reader_sql[:-1] + f", {ROW_NUMBER_OPTION}=true)"
    try:
        con.execute(f"select {ROW_NUMBER_OPTION} from {with_option} limit 1", params).fetchall()
        return True
    except duckdb.BinderException as exc:
        if "not supported" in str(exc) or "does not exist" in str(exc):
            return False
        return None
    except duckdb.Error:
        return None


def readers(path: Path) -> dict[str, tuple[str, dict]]:
    """The readers a typed lane would use: read_json with the columns given, and tracelat's line reader."""
    return {"read_json": (TYPED_READ, {"path": str(path)}), "line reader (read_csv)": (LINE_READ, {"path": str(path)})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--recording", action="store_true")
    ap.add_argument("--workdir", type=Path, help="where the trace is generated once and reused")
    ap.add_argument("--keep", action="store_true", help="keep the generated trace (without --workdir)")
    a = ap.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="tracelat-lanes-"))
    try:
        run(a, work)
    finally:
        if a.workdir is None and not a.keep:
            shutil.rmtree(work, ignore_errors=True)


def run(a: argparse.Namespace, work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    trace = B.trace_for(work, a.iterations, a.recording)
    con = duckdb.connect()
    con.execute("set enable_progress_bar = false")  # as in tracelat
    sqls = statements()
    wall: dict[str, list[float]] = {k: [] for k in sqls}
    cpu: dict[str, list[float]] = {k: [] for k in sqls}
    counts = {}
    for _ in range(a.rounds):
        for name, sql in sqls.items():
            t, c = time.perf_counter(), time.process_time()
            con.execute(f"create or replace temp table {name} as {sql}", {"path": str(trace)})
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
            counts[name] = con.execute(f"select count(*) from {name}").fetchall()[0][0]
        con.execute("drop table floor")  # the last round's two stagings stay, for the check below
    print(f"{trace.name}: {trace.stat().st_size / 2**20:.0f} MiB, {counts['floor']:,} records, {a.rounds} rounds")
    print(f"  {'statement':<12} {'wall s (min/median)':>20} {'CPU s (min/median)':>20} {'CPU x floor':>12}")
    floor_cpu = min(cpu["floor"])
    for name in sqls:
        w, c = wall[name], cpu[name]
        print(
            f"  {name:<12} {min(w):>9.2f} / {statistics.median(w):<8.2f} {min(c):>9.2f} / {statistics.median(c):<8.2f}"
            f" {min(c) / floor_cpu:>11.2f}"
        )
    differ = con.execute(
        "select count(*) from (select * exclude (raw, quotes) from stage "
        "except all select * exclude (raw, quotes) from stage_typed)"
    ).fetchall()[0][0]
    print(f"  rows of stage_typed that differ from the stage's: {differ:,} of {counts['stage']:,}")
    if differ:
        print("  WARNING: the typed variant staged other rows: its time is no bound of the same work")
    saved = min(cpu["stage"]) - min(cpu["stage_typed"])
    print(f"  a typed parse would save at most {saved:.2f} CPU-s of the stage's {min(cpu['stage']):.2f}")
    for name, (sql, params) in readers(trace).items():
        got = row_numbers(con, sql, params)
        said = {True: "yes: a typed lane may now be possible", False: "no", None: "unknown (see the error)"}[got]
        print(f"  row numbers from {name}: {said}")


if __name__ == "__main__":
    main()
