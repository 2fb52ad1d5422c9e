"""A timeline of one `tracelat ingest`: every SQL statement that took long, with its CPU.

Usage:
  python benchmarks/ingest_timeline.py TRACE [--db STORE] [--min-ms 40]

Runs the CLI in this process with the store's connection wrapped, and prints, for each statement
over --min-ms, when it started, its wall and CPU seconds and how many CPUs were busy, then the
totals. CPU is the process's: DuckDB's threads and any Python thread running meanwhile (the
staging statement's figure includes the hash thread). Statements of the load go through
``load._Scope``, which must run them itself (DuckDB finds its Arrow tables among the caller's
local variables), so that method is timed instead of wrapped.

Made for the canonical JSONL fast path, whose work is all statements of the store's connection.
Elsewhere some work shows as gaps: a lazy relation (``con.sql``) runs where it is read, not where
it is made (its row says ``sql``), and engine converters parse on connections of their own.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


class Timeline:
    def __init__(self, min_s: float):
        self.min_s, self.rows = min_s, []
        self.t0, self.c0 = time.perf_counter(), _cpu()

    def timed(self, kind: str, sql: object, run):
        w, c = time.perf_counter(), _cpu()
        try:
            return run()
        finally:  # a statement that fails (and is tried again another way) shows too
            dw, dc = time.perf_counter() - w, _cpu() - c
            if dw >= self.min_s:
                self.rows.append((w - self.t0, dw, dc, kind, " ".join(str(sql).split())))

    def show(self, width: int = 100) -> str:
        lines = [f"{'start s':>8} {'wall s':>7} {'CPU s':>6} {'CPUs':>5}  statement"]
        for start, dw, dc, kind, sql in self.rows:
            busy = f"{dc / dw:5.1f}" if dw >= 0.05 else "    -"  # the CPU clock ticks every 10 ms
            lines.append(f"{start:8.2f} {dw:7.2f} {dc:6.2f} {busy}  {kind}: {sql[:width]}")
        wall, cpu = time.perf_counter() - self.t0, _cpu() - self.c0
        lines.append(f"total: {wall:.2f} s wall, {cpu:.2f} CPU-s ({cpu / wall:.1f} CPUs busy)")
        return "\n".join(lines)


class _Connection:
    """The store's connection, with execute and sql timed."""

    def __init__(self, con, timeline: Timeline):
        self._con, self._tl = con, timeline

    def __getattr__(self, name):
        return getattr(self._con, name)

    def execute(self, sql, *a, **k):
        return self._tl.timed("execute", sql, lambda: self._con.execute(sql, *a, **k))

    def sql(self, sql, *a, **k):
        return self._tl.timed("sql", sql, lambda: self._con.sql(sql, *a, **k))

    def cursor(self):
        return _Connection(self._con.cursor(), self._tl)

    def __enter__(self):  # looked up on the class, not through __getattr__
        return self

    def __exit__(self, *exc):
        self._con.close()


@contextlib.contextmanager
def instrumented(timeline: Timeline):
    """The store's connections and the load's statements timed into ``timeline``, while inside."""
    from pipeline import store
    from pipeline.ingest import load

    connect, init, run = store.connect, load._Scope.__init__, load._Scope._run

    def scope_init(self, con, *a, **k):
        init(self, con._con if isinstance(con, _Connection) else con, *a, **k)

    def scope_run(self, sql, params, fetch):
        return timeline.timed("load", sql, lambda: run(self, sql, params, fetch))

    store.connect = lambda *a, **k: _Connection(connect(*a, **k), timeline)
    load._Scope.__init__, load._Scope._run = scope_init, scope_run
    try:
        yield timeline
    finally:
        store.connect, load._Scope.__init__, load._Scope._run = connect, init, run


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--db", type=Path, help="store to ingest into (default: a new one, removed at the end)")
    ap.add_argument("--min-ms", type=float, default=40.0, help="show statements at least this long")
    a = ap.parse_args(argv)
    scratch = None if a.db else Path(tempfile.mkdtemp(prefix="tracelat-timeline-"))
    db = a.db or scratch / "store.duckdb"
    from pipeline.cli import main as cli

    try:
        with instrumented(Timeline(a.min_ms / 1000)) as timeline:
            try:
                cli(["ingest", str(a.trace), "--db", str(db)])
            except SystemExit as exc:  # the CLI's own error handler has said what went wrong
                if exc.code:
                    raise
        return timeline.show()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    print(main())
