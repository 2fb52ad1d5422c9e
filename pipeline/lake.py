"""A Parquet lake of the store's tables: ``DIR/<table>/run_id=<id>/data_0.parquet`` (hive layout).

``export_runs`` copies runs from a store (``tracelat export RUN... --lake``, and lake
ingest, :mod:`pipeline.lake_ingest`, which ingests into a temporary store first);
``open_runs`` builds an in-memory store of some runs of the lake, on which every existing
query, fit and summary runs unchanged.

Every table is partitioned by run.  Tables without a run column are partitioned by the
runs of their ingest: an ``ingests`` row (and the file's ``rejects`` and
``clock_overrides``) sits in the partition of every run the file touched, or of its
default run when it loaded nothing; readers keep one copy per ingest.

Writes: the new partitions of a run are written under ``DIR/.staging-<uuid>/`` (never
read), then a commit journal ``DIR/.commit-<uuid>.json`` names every partition to swap,
and the partitions are renamed into place.  A writer killed before the journal leaves
only the staging folder (ignored, removed by the next writer); killed after it, the next
writer rolls the journal forward, so a run is never left half old, half new once any
writer has run.  One writer at a time (``DIR/.lock``, an advisory lock); a reader during
a commit may see one table of a run already new and another still old.

Ingest ids are unique across the lake: an exported ingest whose id the lake gives another
file is written with a new one (stores number their ingests from 1 alike).

Folder names percent-encode the run id (the hive encoding DuckDB and Spark read); an id
whose encoding passes ``MAX_NAME`` characters (a file name has at most 255 bytes) is cut,
with ``%~`` and a hash of the whole id after it (``%~`` never occurs in an encoding, so no
short id can take that name).  The files carry the ``run_id`` column too, and it is what
tracelat reads (``hive_partitioning = false``); folders only say where a run's files are.
Paths reach SQL as bound parameters.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import duckdb

from . import store
from .escape import glob_literal

# ingests with the run(s) whose partition holds them: every run it touched, else its default run
INGEST_RUNS = (
    "(select *, unnest(case when len(coalesce(run_ids, [])) > 0 then run_ids "
    "else [default_run_id] end) as run_id from ingests)"
)
# table -> the rows to write, each with its partition's run_id
TABLES: dict[str, str] = {
    "runs": "select * from runs",
    "run_records": "select * from run_records",
    "iterations": "select * from iterations",
    "requests": "select * from requests",
    "token_lists": "select * from token_lists",
    "metric_samples": "select * from metric_samples",
    "clock_alignments": "select * from clock_alignments",
    "ingests": f"select * from {INGEST_RUNS}",
    # by path too: a lake written before ids were made unique may give two files one id
    "rejects": f"select j.*, i.run_id from rejects j join {INGEST_RUNS} i using (ingest_id, path)",
    "clock_overrides": "select * from clock_overrides",  # held per run
}
# tables whose rows are per ingest (or path): one copy per key when read back
# (with the path: runs exported from two stores may bring the same ingest id for different files)
SHARED = {"ingests": ("ingest_id", "path"), "rejects": ("ingest_id", "path")}


MAX_NAME = 120


def part_name(run_id: str) -> str:
    """The partition folder of a run: ``run_id=`` and the id percent-encoded (cut and hashed when long)."""
    enc = quote(run_id, safe="")
    if len(enc) > MAX_NAME:
        enc = enc[:80] + "%~" + hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:20]
    return "run_id=" + enc


DATA_FILE = "data_0.parquet"  # the one file a writer puts in a run's folder of a table


def _globs(lake: Path, table: str, run_ids: list[str] | None) -> list[str]:
    """The files of ``run_ids`` (None: all runs) in a table, each as a pattern that matches it alone.

    Only the file a writer writes (:data:`DATA_FILE`) in a ``run_id=`` folder is read: a copy
    beside it ("data_0 (1).parquet"), a macOS ``._`` file or a stray folder would otherwise be read
    as more rows of the run, or as a run of its own."""
    d = Path(lake) / table
    if not d.is_dir():
        return []
    if run_ids is None:
        folders = sorted(p.name for p in d.iterdir() if p.name.startswith("run_id="))
    else:  # the folder names are ours (percent-encoded); the lake's own path may hold glob characters
        folders = sorted({part_name(r) for r in run_ids})
    return [glob_literal(d / n / DATA_FILE) for n in folders if (d / n / DATA_FILE).is_file()]


def _has(lake: Path, table: str) -> bool:
    return bool(_globs(lake, table, None))


# the run_id column of the files, not the folder names (cut when long); columns by name across versions
READ = "read_parquet($g, hive_partitioning = false, union_by_name = true)"


def _open_lock(lake: Path):
    """The lake's lock file, never through a link: a lake is data, and may come from anyone (a link
    named ``.lock`` would have us create or touch a file elsewhere)."""
    fd = os.open(lake / ".lock", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    return os.fdopen(fd, "a")


@contextlib.contextmanager
def writer(lake: Path) -> Iterator[Path]:
    """Hold the lake's writer lock, after rolling forward what a killed writer left."""
    lake = Path(lake)
    lake.mkdir(parents=True, exist_ok=True)
    try:
        lock = _open_lock(lake)
    except OSError as e:
        from .errors import StoreError

        raise StoreError(
            f"lake {lake}: cannot open its lock file .lock ({e.strerror}); it must be a plain file, not a link"
        ) from None
    with lock as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            from .errors import StoreError

            raise StoreError(f"lake {lake} is being written by another process; wait for it to finish") from None
        try:
            recover(lake)
            yield lake
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def recover(lake: Path) -> None:
    """Finish commits whose journal was written; drop staging folders that have none."""
    journals = sorted(lake.glob(".commit-*.json"))
    for j in journals:
        _apply(lake, _checked_journal(lake, j))
        j.unlink()
    for st in lake.glob(".staging-*"):
        shutil.rmtree(st, ignore_errors=True)
    for t in lake.glob(".journal-*.tmp"):  # a journal that never became a commit
        t.unlink(missing_ok=True)


# what our writers put in a journal: one staging folder of the lake, known tables, partition names
# of part_name (percent-encoded, no separator). A journal is read from the lake, which anyone may
# have written: a name such as "../x" would move or delete files outside it.
_STAGING = re.compile(r"\.staging-[0-9a-f]{32}")
_PART = re.compile(r"run_id=[A-Za-z0-9_.~%-]+")


def _checked_journal(lake: Path, path: Path) -> dict:
    """The commit journal at ``path``, after checking that it names only what a writer of this lake writes."""
    from .errors import StoreError

    def bad(what: str) -> StoreError:
        return StoreError(
            f"lake {lake}: commit journal {path.name} {what}; it was not written by tracelat, or is damaged. "
            "Nothing was moved; check the lake's origin, then remove that file to read the lake as it is"
        )

    try:
        journal = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        raise bad("cannot be read as JSON") from None
    if not isinstance(journal, dict) or not isinstance(journal.get("staging"), str):
        raise bad("has no staging folder")
    if not _STAGING.fullmatch(journal["staging"]) or (lake / journal["staging"]).is_symlink():
        raise bad(f"names a staging folder outside the lake ({journal['staging']!r})")
    for key in ("parts", "delete"):
        entries = journal.get(key) or []
        if not isinstance(entries, list):
            raise bad(f"has a malformed {key} list")
        for entry in entries:
            ok = isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)
            if not ok or entry[0] not in TABLES or not _PART.fullmatch(entry[1]):
                raise bad(f"names a partition that is none of the lake's ({str(entry)[:80]!r})")
            if (lake / entry[0]).is_symlink():
                raise bad(f"names table folder {entry[0]}, which is a link out of the lake")
    return journal


def _inside(lake: Path, *paths: Path) -> None:
    root = lake.resolve()
    for p in paths:
        if not p.resolve().is_relative_to(root):
            from .errors import StoreError

            raise StoreError(
                f"lake {lake}: {p.relative_to(lake)} leads out of the lake (a link); stopped before moving it"
            )


def _apply(lake: Path, journal: dict) -> None:
    """Swap each named partition in (or out): idempotent, so a second pass after a kill is safe."""
    staging = lake / journal["staging"]
    trash = staging / ".old"
    deletes = {tuple(d) for d in journal.get("delete") or []}
    for table, part in journal["parts"]:
        new, final = staging / table / part, lake / table / part
        # links planted inside the staging folder would lead a move out of the lake
        _inside(lake, new, final, trash / table)
        if (table, part) in deletes:
            if final.exists():
                (trash / table).mkdir(parents=True, exist_ok=True)
                final.rename(trash / table / f"{part}-{uuid.uuid4().hex}")
            continue
        if not new.exists():
            continue  # moved in before the kill
        if final.exists():
            (trash / table).mkdir(parents=True, exist_ok=True)
            final.rename(trash / table / f"{part}-{uuid.uuid4().hex}")
        final.parent.mkdir(parents=True, exist_ok=True)
        new.rename(final)


def _existing_parts(lake: Path, table: str, run_ids: set[str]) -> list[str]:
    d = lake / table
    if not d.is_dir():
        return []
    return [n for n in sorted({part_name(r) for r in run_ids}) if (d / n).is_dir()]


def export_runs(con: duckdb.DuckDBPyConnection, run_ids: list[str], lake: Path) -> dict[str, int]:
    """Write ``run_ids`` (all their rows) into ``lake``, replacing what it held of them.

    A run with no rows left in a table loses that table's partition.  Returns rows written
    per table.
    """
    lake = Path(lake)
    with writer(lake):
        return export_locked(con, sorted(set(run_ids)), lake)


def export_locked(con, run_ids: list[str], lake: Path) -> dict[str, int]:
    """:func:`export_runs` for a caller that holds the writer lock."""
    name = f".staging-{uuid.uuid4().hex}"
    staging = lake / name
    written: dict[str, int] = {}
    parts: list[list[str]] = []
    _map_ingest_ids(con, run_ids, lake)
    for table, sql in TABLES.items():
        if table != "clock_overrides":  # every other table carries the ingest id
            sql = (
                "select x.* replace (coalesce(m.new_id, x.ingest_id) as ingest_id) from "
                f"({sql}) x left join temp.main._lake_ids m on m.old_id = x.ingest_id"
            )
        con.execute(
            f"create or replace temp table _lake_out as select * from ({sql}) where run_id = any($r)", {"r": run_ids}
        )
        n = int(store.scalar(con, "select count(*) from temp.main._lake_out"))
        present = [r[0] for r in con.execute("select distinct run_id from temp.main._lake_out").fetchall()]
        for run in present:  # one COPY per run and table: the folder names are ours (see part_name)
            folder = staging / table / part_name(run)
            folder.mkdir(parents=True)
            con.execute(
                "create or replace temp table _lake_run as select * from temp.main._lake_out where run_id = $r",
                {"r": run},
            )
            # COPY takes its target as text: the path is ours (a uuid folder, an encoded name), and
            # absolute, so a lake named "~x" is not written to the home folder
            target = store.quote_literal(os.path.abspath(folder / "data_0.parquet"))
            con.execute(f"copy temp.main._lake_run to {target} (format parquet)")
        con.execute("drop table if exists temp.main._lake_run")
        if n:
            written[table] = n
        con.execute("drop table temp.main._lake_out")
    deletes: list[list[str]] = []
    for table in TABLES:
        new = {p.name for p in (staging / table).iterdir()} if (staging / table).is_dir() else set()
        for p in sorted(new):
            parts.append([table, p])
        for p in _existing_parts(lake, table, set(run_ids)):
            if p not in new:
                parts.append([table, p])
                deletes.append([table, p])
    con.execute("drop table temp.main._lake_ids")
    journal = {"staging": name, "parts": parts, "delete": deletes}
    tmp_j = lake / f".journal-{uuid.uuid4().hex}.tmp"
    with open(tmp_j, "w") as fh:
        json.dump(journal, fh)
        fh.flush()
        os.fsync(fh.fileno())
    final_j = lake / f".commit-{name[9:]}.json"
    tmp_j.rename(final_j)  # the commit point: from here on the next writer finishes the swap
    _apply(lake, journal)
    final_j.unlink()
    shutil.rmtree(staging, ignore_errors=True)
    return written


def _map_ingest_ids(con, run_ids: list[str], lake: Path) -> None:
    """``temp._lake_ids(old_id, new_id)``: new ids for the exported ingests whose id the lake gives another file.

    Stores number their ingests from 1 alike, so runs exported from two stores (or lakes of
    two hosts put together) would bring one id for two files; a lake ingest, and every
    command that removes or lists an ingest, needs the id to name one file.  An ingest is the
    same one when its path and content hash match too; a clash gets an id above every id the
    lake and the store hold.
    """
    con.execute(
        "create or replace temp table _lake_ids as select distinct ingest_id as old_id, path, sha256 "
        f"from {INGEST_RUNS} where run_id = any($r)",
        {"r": run_ids},
    )
    globs = _globs(lake, "ingests", None)
    if not globs:
        con.execute("alter table temp.main._lake_ids add column new_id bigint")
        return
    con.execute(
        "create or replace temp table _lake_theirs as select distinct ingest_id, path, sha256 "
        f"from {READ} where not (run_id = any($r))",
        {"g": globs, "r": run_ids},
    )
    con.execute(
        "create or replace temp table _lake_ids as "
        "with clash as (select distinct o.old_id, o.path, o.sha256 from temp.main._lake_ids o "
        "  join temp.main._lake_theirs t "
        "  on t.ingest_id = o.old_id and (t.path is distinct from o.path or t.sha256 is distinct from o.sha256)), "
        # the same file already in the lake (in another run's partition) keeps the id it has there
        "known as (select c.old_id, min(t.ingest_id) as new_id from clash c join temp.main._lake_theirs t "
        "  on t.path is not distinct from c.path and t.sha256 is not distinct from c.sha256 group by c.old_id), "
        "top as (select greatest((select coalesce(max(ingest_id), 0) from temp.main._lake_theirs), "
        "  (select coalesce(max(ingest_id), 0) from main.ingests)) as n) "
        "select old_id, new_id from known union all "
        "select old_id, (select n from top) + row_number() over (order by old_id) as new_id "
        "from (select distinct old_id from clash where old_id not in (select old_id from known))"
    )
    con.execute("drop table temp.main._lake_theirs")


def settle(lake: Path) -> None:
    """For readers: finish a killed writer's commit when no writer is at work (and the lake is writable)."""
    lake = Path(lake)
    if not any(lake.glob(".commit-*.json")):
        return
    try:
        with _open_lock(lake) as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # a writer is at work; it finishes its own commit
            try:
                recover(lake)
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
    except OSError:
        return  # a read-only lake: read it as it is


def lake_runs(lake: Path) -> list[str]:
    """Run ids in the lake: those of its ``runs`` partitions, and of any run that has requests or
    steps without one (a ``runs`` folder lost or not copied must not drop the run unseen)."""
    lake = Path(lake)
    settle(lake)
    selects, params = [], {}
    for table in ("runs", "requests", "iterations"):
        files = _globs(lake, table, None)
        if files:
            selects.append(f"select run_id from read_parquet(${table}, hive_partitioning = false)")
            params[table] = files
    if not selects:
        return []
    con = store.scratch()
    try:
        rows = con.execute(
            f"select distinct run_id from ({' union all '.join(selects)}) where run_id is not null order by 1", params
        ).fetchall()
        return [r[0] for r in rows]
    except duckdb.Error as exc:
        raise _unreadable(lake, exc) from None
    finally:
        con.close()


def _unreadable(lake: Path, exc: Exception) -> Exception:
    from .errors import StoreError

    return StoreError(
        f"lake {lake}: a file cannot be read ({str(exc).splitlines()[0]}); ingest or export that run into "
        "the lake again (tracelat ingest FILE --lake DIR --replace), or remove the file's run_id= folder"
    )


def load_into(
    con: duckdb.DuckDBPyConnection,
    lake: Path,
    run_ids: list[str] | None,
    tables: tuple[str, ...] | None = None,
    only_known_ingests: bool = False,
) -> None:
    """Insert the lake's rows of ``run_ids`` (None: all runs) into a store's tables.

    ``only_known_ingests``: skip rows of ingests the store does not hold for that run (lake
    ingest: the ones a --replace removed); rows no ingest made (derived run records) are kept, and
    so are clock alignments: a removed client's row is what puts the steps it re-timed back
    (``ingest.align._undo``, which then deletes it).
    """
    lake = Path(lake)
    for table in tables or tuple(TABLES):
        globs = _globs(lake, table, run_ids)
        if not globs:
            continue
        cols = [r[0] for r in con.execute(f"describe main.{table}").fetchall()]
        sel = ", ".join(f'"{c}"' for c in cols)
        where = ["true" if run_ids is None else "run_id = any($r)"]
        if only_known_ingests and "ingest_id" in cols and table not in ("ingests", "clock_alignments"):
            # by run too: a lake written before ids were made unique may give two files one id
            where.append(f"(ingest_id is null or (ingest_id, run_id) in (select ingest_id, run_id from {INGEST_RUNS}))")
        src = f"select * from {READ} where {' and '.join(where)}"
        if table in SHARED:  # one copy of a file's rows: those in the first partition holding them
            keys = SHARED[table]
            src = f"select * from ({src}) qualify run_id = min(run_id) over (partition by {', '.join(keys)})"
            if table == "ingests":  # what the store holds already stays as it is
                same = " and ".join(f"m.{k} is not distinct from x.{k}" for k in keys)
                src = f"select * from ({src}) x where not exists (select 1 from main.{table} m where {same})"
        params = {"g": globs} | ({} if run_ids is None else {"r": run_ids})
        try:
            con.execute(f"insert into main.{table} select {sel} from ({src})", params)
        except duckdb.Error as exc:
            if store.interrupted(exc):
                raise
            raise _unreadable(lake, exc) from None


def open_runs(
    lake: Path, run_ids: list[str] | None = None, tables: tuple[str, ...] | None = None, threads: int | None = None
) -> duckdb.DuckDBPyConnection:
    """An in-memory store holding ``run_ids`` of the lake (None: every run), derived tables built.

    ``tables``: load only these (``rejects`` needs no steps or tokens).  ``threads``: DuckDB's threads
    for this connection (a fleet task holds one CPU)."""
    lake = Path(lake)
    if not any(_has(lake, t) for t in TABLES):
        from .errors import StoreError

        raise StoreError(
            f"lake {lake} has no runs; write some with `tracelat ingest FILE --lake {lake}` "
            "or `tracelat export RUN --lake DIR`"
        )
    settle(lake)
    con = store.connect(":memory:")
    if threads:
        con.execute(f"set threads = {int(threads)}")
    load_into(con, lake, None if run_ids is None else sorted(set(run_ids)), tables)
    if run_ids is not None and (tables is None or "runs" in tables):
        known = {r[0] for r in con.execute("select run_id from runs").fetchall()}
        lost = [r for r in sorted(set(run_ids)) if r not in known and r in lake_runs(lake)]
        if lost:  # its rows are there, its run record is not: a folder lost or not copied
            from .errors import StoreError

            con.close()
            raise StoreError(
                f"lake {lake}: run {lost[0]!r} has requests or steps but no run record "
                f"(runs/{part_name(lost[0])}/{DATA_FILE} is missing); write the run again: ingest its files with "
                "--replace (tracelat ingest FILE... --lake DIR --replace) or export it from a store"
            )
    store.bump_generation(con, None)
    store.build_derived(con)
    return con


def open_run(lake: Path, run_id: str, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory store holding one run of the lake, derived tables built."""
    return open_runs(lake, [run_id], threads=threads)
