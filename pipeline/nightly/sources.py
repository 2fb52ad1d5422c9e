"""Tonight's files must make one run, also when their records name none.

Records that name no run get the night's id (:func:`.job._stage`), so that a server log
and the benchmark client's records of one run land in one run without ``--run-id``.  The
same rule would merge two runs whose files name none (two AIPerf exports of two
concurrencies, two canonical traces without a ``run`` record) into one night, their
throughput and latencies wrong, and the several-runs check could not see it:
:func:`refuse_merged_runs` finds them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError

# tables whose rows make a file a source of a run's requests or steps
KINDS = (("requests", "requests"), ("iterations", "steps"))


def merged_runs(con: Any, run_id: str, results: list[Any]) -> tuple[str, str, dict[str, list[str]]] | None:
    """``(format, kind, {run name: [paths]})`` for files of one format whose records name no run and
    that each give ``run_id`` the same kind of records (requests, or steps), when ``tracelat
    ingest`` without --run-id reads them as two runs or more (:func:`pipeline.ingest.run_names`);
    else None.

    One run's files differ in format or in kind (a server log's steps, a client's requests), or
    are pieces of one log (``server.log``, ``server.log.1``: one name in one folder), which
    ``tracelat ingest`` reads as one run too."""
    from ..ingest import run_names

    names = run_names([Path(r.path) for r in results if r.status != "skipped"])
    names_by_path = {str(p): n for p, n in names.items()}
    for table, kind in KINDS:
        rows = con.execute(
            f"select path, format from ingests i where exists (select 1 from {table} t "
            "where t.ingest_id = i.ingest_id and t.run_id = ?) order by ingest_id",
            [run_id],
        ).fetchall()
        by_format: dict[str, dict[str, list[str]]] = {}
        for path, fmt in rows:
            by_format.setdefault(fmt, {}).setdefault(names_by_path.get(path, path), []).append(path)
        for fmt, runs in by_format.items():
            if len(runs) > 1:
                return fmt, kind, runs
    return None


def refuse_merged_runs(con: Any, run_id: str, results: list[Any]) -> None:
    """Raise when tonight's files that name no run are the files of several runs (:func:`merged_runs`)."""
    from ..terminal import clean

    found = merged_runs(con, run_id, results)
    if found is None:
        return
    fmt, kind, runs = found
    shown = "; ".join(
        f"run {clean(name)!r}: " + ", ".join(clean(p) for p in paths[:3]) + (" ..." if len(paths) > 3 else "")
        for name, paths in list(runs.items())[:5]
    )
    raise InputError(
        f"tonight's files hold {len(runs)} runs, not one: {fmt} files of {kind} whose records name no run, "
        f"which `tracelat ingest` reads as {len(runs)} runs ({shown}" + (" ..." if len(runs) > 5 else "") + "); "
        "a night is one run and would merge them into it, its numbers wrong: record each run in a --history "
        "of its own (one `tracelat nightly` per run, e.g. per concurrency), or give only the files of one run"
    )
