"""``tracelat ingest PATH... --lake DIR``: ingest into a temporary store, then export the touched runs.

Every ingest rule of the store holds because the store's own code does the work:

1. a temporary in-memory store is seeded with the lake's ingest records (so identical
   content is recognised: idempotence by content hash, and ``--replace`` finds what to
   remove) and its ``--clock-offset`` overrides; its ingest id sequence starts above the
   lake's, so ids stay unique across the lake;
2. the files are ingested there (rejects with line numbers, engine formats, run names);
3. the lake's rows of every run the files touched (or a --replace removed) are loaded,
   less the rows of ingests a --replace removed, and the post-ingest steps run again
   over the whole run (clock alignment of a multi-file run whose files came in separate
   ingests, context estimation);
4. those runs are exported to the lake (:func:`pipeline.lake.export_runs`: staged,
   journaled, renamed into place), the ingest records and rejects with them.
"""

from __future__ import annotations

from pathlib import Path

from . import lake as lk
from . import store


def ingest_to_lake(lake: Path, paths, **kwargs) -> tuple[list, list[str], object]:
    """Ingest ``paths`` into ``lake``; ``kwargs`` as :func:`pipeline.ingest.ingest_paths`.

    Returns (results, runs written, the temporary store, derived tables built) for reporting.
    """
    from . import ingest as ing

    lake = Path(lake)
    con = store.connect(":memory:")
    with lk.writer(lake):
        lk.load_into(con, lake, None, tables=("ingests", "clock_overrides"))
        top = int(store.scalar(con, "select coalesce(max(ingest_id), 0) from ingests"))
        con.execute("drop sequence ingest_seq")
        con.execute(f"create sequence ingest_seq start {top + 1}")  # an int we computed, not input
        done: list = []
        error = None
        try:
            done = ing.ingest_paths(con, paths, **kwargs)
        except Exception as exc:  # what was ingested before the failing file is kept, as in the store
            if store.interrupted(exc):  # Ctrl-C or SIGTERM inside a query: stop, write nothing more
                raise
            error = exc
        new = [
            r[0]
            for r in con.execute(
                f"select distinct run_id from {lk.INGEST_RUNS} where ingest_id > $t", {"t": top}
            ).fetchall()
        ]
        # an unchanged file names runs only when a --clock-offset given for it aligned them again
        touched = sorted({x for r in done for x in (*r.run_ids, *r.removed_runs)} | set(new))
        if error is not None and not touched:
            raise error
        if touched:
            _merge_lake_rows(con, lake, touched)
            lk.export_locked(con, touched, lake)
        if error is not None:
            error.lake_store = con  # what the files before it loaded, for the command to say
            raise error
    store.build_derived(con)
    return done, touched, con


def _merge_lake_rows(con, lake: Path, touched: list[str]) -> None:
    """Bring in the lake's rows of the touched runs and redo the post-ingest steps over whole runs."""
    from .ingest import POST_INGEST, align
    from .ingest.load import remerge_runs

    present = set(lk.lake_runs(lake)) & set(touched)
    con.execute("begin transaction")
    try:
        if present:
            runs = sorted(present)
            # what the post-ingest steps derived from the new files alone is derived again below
            con.execute("delete from run_records where ingest_id is null and run_id = any($r)", {"r": runs})
            lk.load_into(
                con,
                lake,
                runs,
                tables=tuple(t for t in lk.TABLES if t not in ("runs", "ingests")),
                only_known_ingests=True,
            )
            _refuse_repeated_keys(con, runs)
            # run rows come from their records; a bare row (data, no record) is made again below
            remerge_runs(con, runs)
            con.execute(
                "insert into runs (run_id, ingest_id) select distinct run_id, min(ingest_id) over "
                "(partition by run_id) from (select run_id, ingest_id from iterations union all "
                "select run_id, ingest_id from requests union all select run_id, ingest_id from "
                "metric_samples) where run_id = any($r) and run_id not in (select run_id from runs)",
                {"r": runs},
            )
        store.commit(con)
    except BaseException:
        store.rollback(con)
        raise
    if not present:
        return  # the ingest's own post-ingest steps saw every row of these runs already
    for step in (align.align_clocks, *POST_INGEST):
        con.execute("begin transaction")
        try:
            step(con, sorted(present))
            store.bump_generation(con, sorted(present))
            store.commit(con)
        except BaseException:
            store.rollback(con)
            raise


# A key of a run held by two files: the store's duplicate check saw only the new files' rows
_REPEATED = """
select t.run_id, t.what || ' ' || t.k, min(g.path), max(g.path) from (
  select run_id, 'request id' as what, req_id as k, ingest_id from requests where run_id = any($r)
  union all select run_id, 'step', iter::varchar, ingest_id from iterations where run_id = any($r)
) t join ingests g using (ingest_id)
group by t.run_id, t.what, t.k having count(distinct t.ingest_id) > 1 limit 1
"""


def _refuse_repeated_keys(con, runs: list[str]) -> None:
    """Refuse a lake ingest that would give a run a request id or step number twice.

    In a store the duplicate check sees every row of the run; here the new files were
    checked against each other only (the lake's rows come in afterwards).  Files ingested
    together are checked as in a store: a second ``vllm bench`` client of a run, say, gets
    its ids named after it there.
    """
    import shlex

    from .errors import InputError
    from .terminal import inline

    hit = con.execute(_REPEATED, {"r": runs}).fetchone()
    if hit:
        run, key, a, b = hit
        if a == b:  # one path, two ingests: the file changed since the lake took it
            raise InputError(
                f"run {run}: {inline(a)} changed since it was written into the lake (its earlier content holds "
                f"{key} too); re-load it with --replace"
            )
        raise InputError(
            f"run {run}: {inline(a)} and {inline(b)} both hold {key}; the lake already holds one of them, so "
            "they were not checked against each other. If one is a newer recording that replaces the run, "
            "write the run from it alone (an export replaces a run whole): `tracelat ingest NEWFILE --db "
            f"new.duckdb && tracelat export {shlex.quote(run)} --db new.duckdb --lake DIR`; if they are two "
            "files of one run (a server log and its client's records), ingest them together (`tracelat ingest "
            "FILE... --lake DIR --replace`); if they are two runs, give this file its own --run-id"
        )
