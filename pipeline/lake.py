"""A Parquet lake of the canonical tables: ``DIR/<table>/run_id=<id>/*.parquet`` (hive layout).

``export_runs`` copies runs from a store; ``open_run`` builds an in-memory store of one run
from the lake, on which every existing query, fit and summary runs unchanged.  A run's
partitions are written to a temporary folder and renamed into place, so a reader never
sees half a run; exporting a run again replaces it.  Folder names are DuckDB's hive
encoding of the run id (``/``, ``?`` and quotes percent-encoded); paths reach SQL only as
bound parameters.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import duckdb

from . import store

TABLES = ("runs", "run_records", "iterations", "requests", "token_lists", "metric_samples")


def _glob(lake: Path, table: str) -> str:
    return str(lake / table / "**" / "*.parquet")


def export_runs(con: duckdb.DuckDBPyConnection, run_ids: list[str], lake: Path) -> dict[str, int]:
    """Write ``run_ids`` (all their base-table rows) into ``lake``; returns rows written per table."""
    lake = Path(lake)
    written: dict[str, int] = {}
    for table in TABLES:
        n = con.execute(f"select count(*) from {table} where run_id = any($r)", {"r": run_ids}).fetchall()[0][0]
        if not n:
            continue
        tmp = lake / f".tmp-{uuid.uuid4().hex}" / table
        tmp.mkdir(parents=True)
        con.execute(f"create or replace temp table _lake_out as select * from {table} where run_id = any($r)",
                    {"r": run_ids})
        # COPY takes its target as text: the path is ours (a fresh uuid folder), quotes doubled anyway
        target = str(tmp).replace("'", "''")
        con.execute(f"copy temp.main._lake_out to '{target}' (format parquet, partition_by (run_id))")
        con.execute("drop table temp.main._lake_out")
        for part in tmp.iterdir():  # one folder per run: swap it in whole
            final = lake / table / part.name
            final.parent.mkdir(parents=True, exist_ok=True)
            old = final.with_name(f".old-{uuid.uuid4().hex}")
            if final.exists():
                final.rename(old)
            part.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(tmp.parent, ignore_errors=True)
        written[table] = int(n)
    return written


def lake_runs(lake: Path) -> list[str]:
    """Run ids in the lake (from its ``runs`` partitions)."""
    con = store.scratch()
    try:
        if not list((Path(lake) / "runs").glob("run_id=*")):
            return []
        rows = con.execute("select distinct run_id from read_parquet($g, hive_partitioning = true) order by 1",
                           {"g": _glob(Path(lake), "runs")}).fetchall()
        return [r[0] for r in rows]
    finally:
        con.close()


def open_run(lake: Path, run_id: str) -> duckdb.DuckDBPyConnection:
    """An in-memory store holding one run of the lake, derived tables built."""
    con = store.connect(":memory:")
    for table in TABLES:
        if not list((Path(lake) / table).glob("run_id=*")):
            continue
        cols = [r[0] for r in con.execute(f"describe {table}").fetchall()]
        sel = ", ".join(f'"{c}"' for c in cols)
        con.execute(f"insert into {table} select {sel} from read_parquet($g, hive_partitioning = true, "
                    "union_by_name = true) where run_id = $r", {"g": _glob(Path(lake), table), "r": run_id})
    store.bump_generation(con, None)
    store.build_derived(con)
    return con
