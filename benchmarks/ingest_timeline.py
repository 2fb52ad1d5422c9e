"""A timeline of one `tracelat ingest`: every SQL statement that took long, with its CPU.

Usage:
  python benchmarks/ingest_timeline.py TRACE [--db STORE] [--min-ms 40]

Runs the CLI in this process with the store's connection wrapped, and prints, for each statement
over --min-ms, when it started, its wall and CPU seconds (all threads) and how many CPUs were busy,
then the totals. The gaps between statements are Python (imports, bookkeeping). Statements of the
load go through ``load._Scope``, which must run them itself (DuckDB finds its Arrow tables among
the caller's local variables), so that method is timed instead of wrapped.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T0 = time.perf_counter()


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


C0 = _cpu()


class Timeline:
    def __init__(self, min_s: float):
        self.min_s, self.rows = min_s, []

    def timed(self, kind: str, sql: object, run):
        w, c = time.perf_counter(), _cpu()
        out = run()
        dw, dc = time.perf_counter() - w, _cpu() - c
        if dw >= self.min_s:
            self.rows.append((w - T0, dw, dc, kind, " ".join(str(sql).split())))
        return out

    def show(self, width: int = 100) -> str:
        lines = [f"{'start s':>8} {'wall s':>7} {'CPU s':>6} {'CPUs':>5}  statement"]
        for start, dw, dc, kind, sql in self.rows:
            busy = f"{dc / dw:5.1f}" if dw >= 0.05 else "    -"  # the CPU clock ticks every 10 ms
            lines.append(f"{start:8.2f} {dw:7.2f} {dc:6.2f} {busy}  {kind}: {sql[:width]}")
        wall, cpu = time.perf_counter() - T0, _cpu() - C0
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


def instrument(timeline: Timeline) -> None:
    from pipeline import store
    from pipeline.ingest import load

    connect = store.connect
    store.connect = lambda *a, **k: _Connection(connect(*a, **k), timeline)
    init, run = load._Scope.__init__, load._Scope._run

    def scope_init(self, con, *a):
        init(self, con._con if isinstance(con, _Connection) else con, *a)

    def scope_run(self, sql, params, fetch):
        return timeline.timed("load", sql, lambda: run(self, sql, params, fetch))

    load._Scope.__init__, load._Scope._run = scope_init, scope_run


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--db", type=Path, help="store to ingest into (default: a new one in a temporary folder)")
    ap.add_argument("--min-ms", type=float, default=40.0, help="show statements at least this long")
    a = ap.parse_args(argv)
    db = a.db or Path(tempfile.mkdtemp(prefix="tracelat-timeline-")) / "store.duckdb"
    timeline = Timeline(a.min_ms / 1000)
    instrument(timeline)
    from pipeline.cli import main as cli

    try:
        cli(["ingest", str(a.trace), "--db", str(db)])
    except SystemExit as exc:  # the CLI's own error handler has said what went wrong
        if exc.code:
            raise
    return timeline.show()


if __name__ == "__main__":
    print(main())
