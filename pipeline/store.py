"""The DuckDB store: schema, opening with clear errors, and the derived-table runner.

Base tables (docs/canonical-format.md, "Store tables") are written only by ingest;
derived tables are rebuilt from ``queries/*.sql`` by :func:`build_derived` whenever an
ingest changed the store. Every other query file, ``queries/<area>/<name>.sql``, is run
on demand by the query runner (:func:`select`, :func:`rows`, :func:`materialise`), and
writes go through :func:`transaction`.
"""

from __future__ import annotations

import shlex

import contextlib
import functools
import hashlib
import os
import re
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from .errors import StoreError
from .escape import not_utf8
from .resources import QUERIES_DIR

DEFAULT_DB = "tracelat.duckdb"

SCHEMA = """
create sequence if not exists ingest_seq start 1;
create table if not exists ingests (
    ingest_id bigint, path varchar, sha256 varchar, format varchar,
    lines_read bigint, lines_accepted bigint, lines_rejected bigint, lines_skipped bigint,
    bytes bigint, t_ingested timestamp, run_ids varchar[], default_run_id varchar
);
create table if not exists runs (
    run_id varchar, engine varchar, engine_version varchar, model varchar, gpu varchar,
    num_gpus bigint, dtype varchar, kv_dtype varchar, clock varchar, meta json,
    ingest_id bigint
);
-- every accepted run record, so that removing one ingest can re-merge what the others said
create table if not exists run_records (
    ingest_id bigint, line_no bigint, run_id varchar, engine varchar, engine_version varchar,
    model varchar, gpu varchar, num_gpus bigint, dtype varchar, kv_dtype varchar, clock varchar, meta json
);
create table if not exists iterations (
    run_id varchar, iter bigint, t_start double, t_end double, dur_ms double,
    prefill_tokens bigint, prefill_reqs bigint, decode_tokens bigint, decode_reqs bigint,
    context_tokens bigint, running_reqs bigint, waiting_reqs bigint, kv_usage double,
    preempted_reqs bigint, req_ids varchar[], extra json, ingest_id bigint, line_no bigint
);
create table if not exists requests (
    run_id varchar, req_id varchar, t_arrival double, t_scheduled double,
    t_first_token double, t_finish double, prompt_tokens bigint, output_tokens bigint,
    cached_tokens bigint, preemptions bigint, status varchar, extra json,
    ingest_id bigint, line_no bigint
);
-- each request's token times once, as one list (t_s: seconds, in order); ``tokens`` is a view of
-- them, one row per token: a row per token written at ingest cost more than the rest of the ingest
create table if not exists token_lists (run_id varchar, req_id varchar, t_s double[], ingest_id bigint);
create table if not exists rejects (
    ingest_id bigint, path varchar, line_no bigint, reason varchar, raw varchar
);
-- engine metric samples (Prometheus scrapes) of a run: gauges, counters, histogram buckets
create table if not exists metric_samples (
    run_id varchar, t double, family varchar, labels json, kind varchar, le double, value double,
    ingest_id bigint, line_no bigint
);
-- per (run, request source): the clock transform applied to its times (pipeline/ingest/align.py)
create table if not exists clock_alignments (
    run_id varchar, ingest_id bigint, path varchar, clock varchar, reference_clock varchar,
    offset_s double, drift double, pivot_s double, applied boolean, inferred varchar[], info json
);
-- --clock-offset PATH=SECONDS as given for the file's runs (run_id) until the file is loaded again
create table if not exists clock_overrides (path varchar, offset_s double, run_id varchar);
create table if not exists _state (key varchar, value bigint);
-- runs whose base rows changed since the derived tables were built (NULL: all of them)
create table if not exists _dirty_runs (run_id varchar);
"""

# one row per output token: idx from 0, t in seconds, itl_ms = (t - previous t) * 1000
# (NULL for the first), computed from each request's own list when read
TOKENS_VIEW = """
create view if not exists tokens as
select run_id, req_id, idx::integer as idx, t, (t - prev) * 1000 as itl_ms, ingest_id from (
  select run_id, req_id, unnest(range(len(t_s))) as idx, unnest(t_s) as t,
    unnest(list_prepend(NULL::double, t_s[:-2])) as prev, ingest_id
  from token_lists
)
"""

# what queries read: the tables ingest writes, the tokens view over token_lists, and the clock
# alignments ingest's post-step writes (run_summary leaves a source on another clock out of spans)
BASE_TABLES = (
    "runs",
    "run_records",
    "iterations",
    "requests",
    "tokens",
    "token_lists",
    "ingests",
    "rejects",
    "clock_alignments",
)
# what ingest writes, each row with its ingest_id
INGEST_TABLES = tuple(t for t in BASE_TABLES if t not in ("tokens", "clock_alignments"))
RUN_TABLES = (
    "runs",
    "iterations",
    "requests",
    "tokens",
    "token_lists",
    "clock_alignments",
)  # tables (and the tokens view) with a run_id column


def db_path(db: str | os.PathLike | None) -> str:
    """The store path: the given one, else ``$TRACELAT_DB``, else ``tracelat.duckdb``.

    An empty path (``--db ''``, ``TRACELAT_DB=`` with no value) is an error, not the default:
    a script whose variable came out empty must not write to another store than it meant.
    """
    if db is not None and str(db) == "":
        raise StoreError("--db is empty; pass the store's file path (or leave --db out for tracelat.duckdb)")
    if db is None and os.environ.get("TRACELAT_DB") == "":
        raise StoreError("TRACELAT_DB is set but empty; set it to the store's file path or unset it")
    return str(db or os.environ.get("TRACELAT_DB") or DEFAULT_DB)


# A DuckDB file has its magic at byte 8 (after the checksum of its first header block).
DUCKDB_MAGIC_AT, DUCKDB_MAGIC = 8, b"DUCK"


def check_is_duckdb(path: str) -> None:
    """Refuse an existing file that is not a DuckDB database before DuckDB opens it.

    DuckDB treats a file it does not recognise as a foreign database (an SQLite file makes
    it try to download the sqlite extension from the network) and may write into it.
    """
    p = Path(path)
    if not p.is_file() or p.stat().st_size == 0:
        return  # a new store (DuckDB creates it), or an empty file it initialises
    with open(p, "rb") as f:
        head = f.read(16)
    if head[DUCKDB_MAGIC_AT : DUCKDB_MAGIC_AT + len(DUCKDB_MAGIC)] != DUCKDB_MAGIC:
        kind = (
            "an SQLite database"
            if head.startswith(b"SQLite format 3")
            else "a trace file (ingest it with `tracelat ingest FILE`)"
            if head.lstrip()[:1] in (b"{", b"[")
            else "not a DuckDB database"
        )
        raise StoreError(
            f"database {path} is {kind}, not a tracelat store; pass a DuckDB file (or a new path) with --db"
        )


def memory_limit_sql() -> str | None:
    """``set memory_limit`` for ``$TRACELAT_MEMORY_LIMIT``, or None when it is unset.

    Every connection that runs queries over trace data applies it (the store's and the
    scratch in-memory ones of the converters): it bounds DuckDB's buffer memory per
    database, beyond which sorts, joins and aggregates spill to disk.
    """
    limit = os.environ.get("TRACELAT_MEMORY_LIMIT")
    return f"set memory_limit = '{_memory_limit(limit)}'" if limit else None


# Settings of every connection. No progress bar: DuckDB draws its own on the terminal for a
# query over 2 s (an ingest's staging, a big derived table), cutting into our output and
# progress lines. And an ASOF join never runs as a nested loop: DuckDB picks the loop when it
# *estimates* at most 64 rows on the left side, and its estimate for unnested lists is small
# whatever they hold: attributing 20 requests of 2000 token times each against 10k steps took
# 5 s instead of 0.03 s, and a fit of a run with preemptions took minutes (tokens x steps).
SESSION = "set enable_progress_bar = false; set asof_loop_join_threshold = 0"


_SCRATCH: duckdb.DuckDBPyConnection | None = None
_SCRATCH_LOCK = threading.Lock()
# The scratch database's memory limit as last set (None: DuckDB's default). Going back to the
# default opens a new database rather than `reset memory_limit`: DuckDB 1.5 resets the setting
# it shows but keeps the buffer pool's limit (a read with 256 MiB line buffers then failed
# against a limit a test had set), and setting the shown value again rounds it.
_SCRATCH_LIMIT: str | None = None


def scratch() -> duckdb.DuckDBPyConnection:
    """An in-memory connection for converters and helpers, with the memory limit applied.

    A cursor of one in-memory database per process: a new database costs 15-20 ms (its
    buffer pool and threads), a cursor 0.1 ms, and a small engine file's ingest asked for two.
    What a cursor registers or makes temporary is its own and goes when it closes; nothing
    here makes lasting objects, and no caller changes a setting: settings are the database's,
    so one that needs another value (threads, insertion order) opens a database of its own
    with ``duckdb.connect()``. The memory limit is the database's too, set from
    $TRACELAT_MEMORY_LIMIT as it is at each call. (Worker processes are spawned, never forked:
    DuckDB does not survive a fork.)
    """
    global _SCRATCH, _SCRATCH_LIMIT
    limit = memory_limit_sql()  # before the database: a bad value is an error, not a half-made one
    with _SCRATCH_LOCK:
        if _SCRATCH is None or (limit is None and _SCRATCH_LIMIT is not None):
            _SCRATCH, _SCRATCH_LIMIT = duckdb.connect(), None  # open cursors keep the old one alive
        con = _SCRATCH.cursor()
        if limit is not None and limit != _SCRATCH_LIMIT:
            con.execute(limit)
            _SCRATCH_LIMIT = limit
    con.execute(SESSION)
    return con


@contextlib.contextmanager
def unoptimised(con: duckdb.DuckDBPyConnection, when: bool = True) -> Iterator[None]:
    """DuckDB's optimiser off for the statements run inside (``when`` false: nothing changes),
    then as it was. For the wide staging statements of small inputs, whose optimiser rewrites
    cost more than they save (canonical.UNOPTIMISED_MAX_BYTES). The setting is the
    connection's own: other connections and cursors of the database keep theirs."""
    was = when and optimiser_on(con) is not False  # unknown (DuckDB 1.5): on, as we leave it
    if was:
        con.execute("pragma disable_optimizer")
    try:
        yield
    finally:
        if was:
            try:
                con.execute("pragma enable_optimizer")
            except duckdb.Error:
                # a statement inside failed in a transaction, which DuckDB now holds aborted: it
                # takes nothing but ROLLBACK, and this error would hide the real one. rollback()
                # puts the optimiser back.
                _OPTIMISER_OWED.add(con)


def optimiser_on(con: duckdb.DuckDBPyConnection) -> bool | None:
    """Whether DuckDB's optimiser is on for this connection; None where DuckDB does not show it
    (1.5 has the pragmas but no ``enable_optimizer`` setting to read).

    ``current_setting`` rather than ``duckdb_settings()``: the table function lists every
    setting, 4.3 against 0.3 ms, and a small file's ingest asks once or twice.
    """
    try:
        return bool(con.execute("select current_setting('enable_optimizer')").fetchall()[0][0])
    except duckdb.CatalogException:
        return None


# connections whose optimiser unoptimised() could not turn back on (an aborted transaction)
_OPTIMISER_OWED: weakref.WeakSet = weakref.WeakSet()


def commit(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("commit")


@contextlib.contextmanager
def transaction(
    con: duckdb.DuckDBPyConnection, failed: Callable[[duckdb.Error, str], BaseException] | None = None
) -> Iterator[None]:
    """Run the block in one transaction: committed when it ends, rolled back when it raises.

    The rollback goes through :func:`rollback`, so a failed COMMIT reports its own cause
    (disk full) rather than "cannot rollback - no transaction is active". ``failed(exc,
    state)`` turns a database error into ours; ``state`` says in words what the store
    now holds. Other exceptions (an interrupt too) propagate unchanged after the rollback.
    """
    con.execute("begin transaction")
    try:
        yield
        commit(con)
    except BaseException as exc:
        state = rollback(con)
        if failed is not None and isinstance(exc, duckdb.Error):
            raise failed(exc, state) from exc
        raise


def rollback(con: duckdb.DuckDBPyConnection) -> str:
    """Roll back the open transaction; returns what the store now holds, in words.

    A COMMIT that fails (disk full, an unwritable folder) has already ended the
    transaction, so a plain ROLLBACK would raise "no transaction is active" and hide the
    real error; and a fatal write error invalidates the database for this process.
    """
    try:
        con.execute("rollback")
    except duckdb.Error:
        pass  # already ended by the failed statement or commit
    if con in _OPTIMISER_OWED:
        with contextlib.suppress(duckdb.Error):
            con.execute("pragma enable_optimizer")
            _OPTIMISER_OWED.discard(con)
    try:
        con.execute("select 1").fetchall()
    except duckdb.Error as exc:
        return (
            f"the store cannot be used by this process any more ({str(exc).splitlines()[0]}); "
            "its file holds what the last completed command wrote"
        )
    return "nothing of it was stored; the store holds what it held before"


# Rows per row group of what this process writes to a store (DuckDB's default: 122,880).
# DuckDB writes a big insert straight to the file once it fills a row group ("optimistic"
# writes); what never fills one goes to the WAL at commit and is written again by the next
# checkpoint. token_lists holds one row per request, so the 68k requests of a 1M-step file
# (8.7M token times) never filled one: its commit wrote an 80 MB WAL and the checkpoint the
# lists again (0.55 s; written during the insert instead, 0.3 s). One row group is also one
# thread's share of a scan, so such a table was read on one core.
ROW_GROUP_SIZE = 16384


# The mode check and the attach are one step for the threads of a process.
_OPEN_LOCK = threading.Lock()


def _open(path: str, read_only: bool) -> duckdb.DuckDBPyConnection:
    """A connection whose default database is the store file, attached with ROW_GROUP_SIZE.

    ``duckdb.connect(FILE)`` takes no row group size, so the file is attached to an
    in-memory instance named after the file's real path. DuckDB's instance cache then does
    what it does for a file opened directly: every connection of this process to the store
    shares one instance, which closes (detaching and checkpointing the store) with the last.
    One mode per file and process, as DuckDB allows: a mismatch is a ConnectionException.
    ``USE store`` holds for this connection only: a ``cursor()`` of it starts in ``memory``.
    """
    if path.startswith(":memory:"):
        return duckdb.connect(path)  # an in-memory store, private or named, as before
    real = os.path.realpath(path)
    instance = ":memory:tracelat-" + hashlib.sha256(real.encode()).hexdigest()[:32]
    # spill files go next to the store, where DuckDB puts them for a file it opens itself
    con = duckdb.connect(instance, config={"temp_directory": real + ".tmp"})
    # off before the ATTACH: on a loaded machine it took over 2 s and drew DuckDB's bar
    con.execute("set enable_progress_bar = false")
    try:
        with _OPEN_LOCK:
            held = scalar(con, "select readonly from duckdb_databases() where database_name = 'store'")
            if held is None:
                mode = "read_only, " if read_only else ""
                try:  # DuckDB 1.5 binds no parameter in ATTACH: the path is a quoted literal
                    con.execute(f"attach {quote_literal(real)} as store ({mode}row_group_size {ROW_GROUP_SIZE})")
                except duckdb.Error as exc:
                    if "file handle conflict" not in str(exc).lower():
                        raise
                    raise StoreError(
                        f"cannot open database {path}: this process has it open through another DuckDB "
                        "connection (duckdb.connect); close that connection first"
                    ) from exc
                held = read_only
            if held != read_only:
                raise duckdb.ConnectionException(f"{real} is open {'read-only' if held else 'read-write'}")
        con.execute("use store")
    except BaseException:
        con.close()
        raise
    return con


def _check_ours(con: duckdb.DuckDBPyConnection, path: str, tables: set[str]) -> None:
    """Refuse a DuckDB file that holds tables but not a store's: ingest would add ours beside
    the owner's, and a read command would answer "no runs" about the wrong file."""
    if not tables or tables & {"ingests", "tokens"}:  # tokens: a store of before token_lists
        return
    con.close()
    if "nightly_runs" in tables:
        raise StoreError(
            f"database {path} is a nightly history, not a store: each night's store is "
            f"{Path(path).parent / 'runs'}/<night>.duckdb, one file per night"
        )
    shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
    raise StoreError(
        f"database {path} is a DuckDB file of something else (tables {shown}), not a tracelat store; "
        "pass a new path or a store with --db"
    )


def connect(
    db: str | os.PathLike | None = None, must_exist: bool = False, read_only: bool = False
) -> duckdb.DuckDBPyConnection:
    """Open (and unless ``must_exist``, create) the store, turning DuckDB's errors into ours.

    ``read_only``: several processes may read a store at once (no writer meanwhile);
    the schema is then taken as it is.
    """
    path = db_path(db)
    shown = not_utf8(path)
    if shown is not None:
        raise StoreError(f"database path {shown} is not valid UTF-8, which DuckDB cannot open; pass --db a UTF-8 path")
    if must_exist and not Path(path).exists():
        raise StoreError(
            f"database {path} does not exist; ingest a trace first (tracelat ingest FILE --db {shlex.quote(str(path))})"
        )
    if Path(path).is_dir():
        raise StoreError(f"database path {path} is a directory; pass a file path with --db")
    if not path.startswith(":memory:") and "?" in os.path.dirname(os.path.realpath(path)):
        # DuckDB (2.0.1) names the write-ahead log by putting ".wal" before the path's first "?":
        # in a folder's name, that is a folder that does not exist, and the first commit fails
        # after the file was made
        from .terminal import inline  # (click, which terminal needs, is no import of the store's)

        raise StoreError(
            f"database path {inline(path)}: DuckDB cannot keep a store in a folder whose path holds '?' "
            "(its write-ahead log would go to another folder); pass --db a path without '?' in its folders"
        )
    check_is_duckdb(path)
    try:
        con = _open(path, read_only)
    except duckdb.IOException as exc:
        msg = str(exc)
        if "lock" in msg.lower():
            holder = re.search(r"PID (\d+)", msg)
            who = f" (process {holder.group(1)})" if holder else ""
            raise StoreError(
                f"database {path} is locked by another process{who}: a writer, or readers while this "
                "command needs to write; wait for it to finish or use another --db"
            ) from exc
        raise StoreError(f"cannot open database {path}: {msg}") from exc
    except duckdb.ConnectionException as exc:
        mode = "read-write" if read_only else "read-only"
        raise StoreError(
            f"cannot open database {path}: this process has it open {mode} already; close that connection first"
        ) from exc
    except duckdb.Error as exc:
        raise StoreError(f"cannot open database {path}: {exc}; is it a DuckDB file?") from exc
    con.execute(SESSION)
    limit = memory_limit_sql()
    if limit:  # DuckDB spills to disk beyond this; the default is 80% of RAM
        con.execute(limit)
    before = {r[0] for r in con.execute("select table_name from duckdb_tables()").fetchall()}
    _check_ours(con, path, before)
    if read_only:
        return con
    con.execute(SCHEMA)
    if "clock_overrides" in before and "run_id" not in _table_columns(con, "clock_overrides"):
        # a store from before offsets were held per run: each one held for every run of its file
        con.execute("alter table clock_overrides add column run_id varchar")
        con.execute(
            "insert into clock_overrides select o.path, o.offset_s, r.run_id from clock_overrides o "
            "join (select path, unnest(run_ids) as run_id from ingests) r using (path) where o.run_id is null"
        )
        con.execute("delete from clock_overrides where run_id is null")
    if "runs" in before and "run_records" not in before:
        # a store from before run_records: each run's merged row stands for the records that made it
        con.execute(
            "insert into run_records select ingest_id, 0, run_id, engine, engine_version, model, gpu, "
            "num_gpus, dtype, kv_dtype, clock, meta from runs"
        )
    if "tokens" in before:  # a store from before token_lists: one row per token becomes one list per request
        con.execute("begin transaction")
        try:
            con.execute(
                "insert into token_lists select run_id, req_id, list(t order by idx), ingest_id from tokens "
                "group by run_id, req_id, ingest_id"
            )
            con.execute("drop table tokens")
            con.execute(TOKENS_VIEW)
            commit(con)
        except duckdb.Error as exc:
            state = rollback(con)
            con.close()
            raise StoreError(
                f"cannot open database {path}: moving its tokens to token_lists failed: {exc} ({state})"
            ) from exc
    con.execute(TOKENS_VIEW)
    return con


def _table_columns(con: duckdb.DuckDBPyConnection, table: str) -> set[str]:
    return {r[0] for r in con.execute(f"describe main.{table}").fetchall()}  # our own table names only


def _memory_limit(text: str) -> str:
    if not re.fullmatch(r"\s*\d+(\.\d+)?\s*([KMGT]i?B)?\s*", text, re.IGNORECASE):
        raise StoreError(f"TRACELAT_MEMORY_LIMIT={text!r} is not a size like 2GB or 500MB")
    return text.strip()


@dataclass(frozen=True)
class QueryFile:
    """One ``queries/*.sql`` file: a plain select and its parsed header."""

    path: Path
    table: str
    grain: str
    inputs: tuple[str, ...]
    sql: str
    view: bool = False  # ``-- materialize: view``: it only re-expresses its inputs, stored as a view


def _parse_header(path: Path) -> QueryFile:
    text = path.read_text()
    head: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"--\s*(\w+):\s*(.*)", line)
        if not m:
            if line.strip() and not line.startswith("--"):
                break
            continue
        head[m.group(1)] = m.group(2).strip()
    missing = {"table", "grain", "inputs"} - head.keys()
    if missing:
        raise StoreError(f"{path}: header lacks {', '.join(sorted(missing))}")
    inputs = tuple(s.strip() for s in head["inputs"].split(",") if s.strip())
    return QueryFile(
        path, head["table"], head["grain"], inputs, text, (head.get("materialize") or "table").split()[0] == "view"
    )


def query_files(directory: Path = QUERIES_DIR) -> list[QueryFile]:
    """All derived-table queries in dependency order (inputs before users)."""
    files = {q.table: q for q in map(_parse_header, sorted(directory.glob("*.sql")))}
    if not files:
        # without this, every later query fails with "Table run_summary does not exist"
        raise StoreError(
            f"no derived-table queries (*.sql) in {directory}: the installation is incomplete; "
            "reinstall tracelat (a wheel carries them as pipeline/_queries)"
        )
    order: list[QueryFile] = []
    state: dict[str, int] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == 2 or name not in files:
            return
        if state.get(name) == 1:
            raise StoreError("cycle in queries/: " + " -> ".join(path + (name,)))
        state[name] = 1
        for dep in files[name].inputs:
            visit(dep, path + (name,))
        state[name] = 2
        order.append(files[name])

    for name in files:
        visit(name, ())
    return order


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier.

    Identifiers cannot be bound as parameters; some come from outside (a Parquet file's
    column names, which may hold any character), so an embedded
    ``"`` is doubled, which is SQL's only escape inside a quoted identifier.
    """
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """``text`` as a quoted SQL string literal, for the few places that take no bound parameter.

    An embedded ``'`` is doubled, the only escape in a standard string literal (a backslash is
    an ordinary character there).
    """
    return "'" + text.replace("'", "''") + "'"


# Up to this many rows in, our statements run executed; above, as relations (see arrow).
EXECUTE_ROWS_MAX = 8192


def arrow(result: duckdb.DuckDBPyConnection) -> Any:
    """The rows of an executed statement (``con.execute(sql, params)``) as an Arrow table.

    A relation (``con.sql(sql).to_arrow_table()`` or ``.pl()``) binds its statement once for
    its columns and again to run it. For the long validation statements of a small file that
    second bind was most of the work: the batch staging statement on two lines took 260-330 ms
    as a relation and 125-180 ms executed. An executed statement's rows are copied once more
    into Arrow, though: executing the statements of every batch (35k records each) of a
    100k-record TensorRT-LLM log took 3.2-3.3 s instead of 3.8-3.9 s but raised the ingest's
    peak RSS from 650-720 to 790-810 MiB. So callers execute statements over at most
    EXECUTE_ROWS_MAX rows (the files of a few hundred records that a nightly run reads by
    the hundred) and keep the relation above that, where the peak stays as it was.

    DuckDB warns about that copy; the choice is deliberate, so its one message is ignored
    process-wide. The filter is added on each call, not once at import: a test runner's
    ``catch_warnings`` drops filters set before it. Not ``catch_warnings`` here: it saves and
    restores the whole filter list, so two threads inside it at once can undo each other's
    filters (another thread's ``simplefilter("error")`` lost, or this one left behind anyway).
    It is added only when not already first: each change of the list makes Python show again
    the warnings it shows once per place.
    """
    first = warnings.filters[0] if warnings.filters else None
    if not (first and first[0] == "ignore" and first[2] is UserWarning and _is_arrow_copy(first[1])):
        warnings.filterwarnings("ignore", _ARROW_COPY, UserWarning)
    return result.to_arrow_table()


def _is_arrow_copy(message: Any) -> bool:
    return message is not None and getattr(message, "pattern", message) == _ARROW_COPY


# the start of DuckDB's warning about an executed statement's rows turned into Arrow
_ARROW_COPY = "Arrow output on a DB-API result"


def unique_names(names: list[str]) -> list[str]:
    """Column names made unique as DuckDB makes them for ``relation.pl()``: a name already
    taken (case aside) becomes ``name_1``, ``name_2`` ..., the first of those that is free."""
    taken: set[str] = set()
    out = []
    for name in names:
        new, k = name, 0
        while new.lower() in taken:
            k += 1
            new = f"{name}_{k}"
        taken.add(new.lower())
        out.append(new)
    return out


def frame(con: duckdb.DuckDBPyConnection, sql: str, params: dict | None = None, *, rows: int) -> Any:
    """``sql``'s rows as a Polars DataFrame; ``rows``: how many rows it reads (its input, or a
    bound on it), which picks the way it runs.

    Its tables must be registered ones or the store's: a Python variable of the caller is
    out of DuckDB's sight from here.
    """
    if rows > EXECUTE_ROWS_MAX:
        return con.sql(sql, params=params).pl()
    import polars as pl

    table = arrow(con.execute(sql, params) if params else con.execute(sql))
    names = unique_names(table.column_names)
    if names != table.column_names:  # Polars refuses a name twice; the relation renames them
        table = table.rename_columns(names)
    return pl.from_arrow(table, rechunk=False)


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params=None):
    """The single value a query returns (None for no rows); always drains the result."""
    rows = con.execute(sql, params).fetchall() if params is not None else con.execute(sql).fetchall()
    return rows[0][0] if rows else None


def run_meta(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    """The run's ``meta`` object ({} when it has none, or when it is not a readable JSON object:
    a run record's meta nested beyond reason gives no facts rather than an internal error)."""
    import json

    raw = scalar(con, "select meta from runs where run_id = $r", {"r": run_id})
    try:
        meta = json.loads(raw) if raw else {}
    except (ValueError, RecursionError):
        return {}
    return meta if isinstance(meta, dict) else {}


# --- the query runner: queries/<area>/<name>.sql, run with their $parameters bound ---------
#
# The derived tables (queries/*.sql) are built by build_derived; every other query file is
# run on demand through these functions: by name (``fit/tail_parts``), its parameters
# bound, never formatted into the text.


def query_text(name: str) -> str:
    """The SQL of ``queries/<name>.sql``; ``name`` is ``area/file`` without ``.sql``."""
    return _read_query(QUERIES_DIR / f"{name}.sql")


@functools.lru_cache(maxsize=None)
def _read_query(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError as exc:
        raise StoreError(f"query file {path} is missing: the installation is incomplete; reinstall tracelat") from exc


def bind(sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``params`` the SQL uses (DuckDB rejects unused ones); raises if one it uses is missing."""
    used = set(re.findall(r"\$([A-Za-z_]\w*)", re.sub(r"--[^\n]*", "", sql)))
    missing = used - params.keys()
    if missing:
        raise StoreError(f"query needs parameters {sorted(missing)} (bug)")
    return {k: params[k] for k in used}


def select(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any]):
    """Run query file ``name`` and return its result as a Polars frame."""
    sql = query_text(name)
    return con.sql(sql, params=bind(sql, params)).pl()


def rows(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any]) -> list[tuple]:
    """Run query file ``name`` and return its rows as tuples (for a few scalars)."""
    sql = query_text(name)
    return con.execute(sql, bind(sql, params)).fetchall()


def table_exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether a table of that name exists in the main schema."""
    return bool(scalar(con, "select count(*) from duckdb_tables() where table_name = ?", [name]))


def materialise(
    con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any], table: str | None = None, temp: bool = False
) -> None:
    """Store the result of query file ``name`` in ``table`` (default: the file's name).

    A stored table keeps the rows of other runs: those of ``params['run_id']`` are
    replaced. It is created on first use; if an older version of the query left one
    with other columns, it is rebuilt (its rows are derived, so nothing is lost that the
    command writing it cannot recompute). ``temp``: a temporary table, replaced whole.
    """
    sql = query_text(name)
    p = bind(sql, params)
    table = table or name.rsplit("/", 1)[-1]
    t = quote_ident(table)
    if temp:
        con.execute(f"create or replace temp table {t} as {sql}", p)
        return
    if table_exists(con, table):
        if _columns(con, f"select * from {t} where false", {}) != _columns(
            con, f"select * from ({sql}) where false", p
        ):
            con.execute(f"drop table {t}")
    con.execute(f"create table if not exists {t} as select * from ({sql}) where false", p)
    con.execute(f"delete from {t} where run_id = ?", [params["run_id"]])
    con.execute(f"insert into {t} {sql}", p)


def _columns(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> list[str]:
    cur = con.execute(sql, params or None)
    names = [d[0] for d in cur.description]
    cur.fetchall()  # drain: an unfinished result blocks the next statement
    return names


def bump_generation(con: duckdb.DuckDBPyConnection, run_ids: Iterable[str] | None = None) -> None:
    """Mark the base tables as changed; call inside the transaction that changed them.

    ``run_ids``: the runs whose rows changed (added, replaced or deleted); None when
    unknown, which makes the next :func:`build_derived` rebuild everything. Derived
    tables are rebuilt when this counter differs from the one they were built at (a
    count of ingests would repeat after a --replace).
    """
    con.execute(
        "insert into _state select 'generation', 0 where not exists (select 1 from _state where key = 'generation')"
    )
    con.execute("update _state set value = value + 1 where key = 'generation'")
    if run_ids is None:
        con.execute("insert into _dirty_runs values (NULL)")
    else:
        con.execute("insert into _dirty_runs select unnest($r::varchar[])", {"r": sorted(set(run_ids))})


def pending_runs(con: duckdb.DuckDBPyConnection, files: list[QueryFile] | None = None) -> list[str] | None:
    """Runs whose derived rows are out of date (None: all of them, or the derived tables are missing)."""
    rows = con.execute("select distinct run_id from _dirty_runs order by run_id nulls first").fetchall()
    if (rows and rows[0][0] is None) or not _derived_exist(con, files or query_files()):
        return None
    return [r[0] for r in rows]


def _sql_digest(files: list[QueryFile]) -> int:
    """Changes when any query file changes (stored tables may then have other columns)."""
    return int.from_bytes(hashlib.sha256("\0".join(q.sql for q in files).encode()).digest()[:7], "big")


def _state(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    return dict(con.execute("select key, max(value) from _state group by key").fetchall())


def _current(con: duckdb.DuckDBPyConnection, state: dict[str, int], files: list[QueryFile]) -> bool:
    return (
        state.get("derived_generation") == state.get("generation", 0)
        and state.get("derived_sql") == _sql_digest(files)
        and _derived_exist(con, files)
    )


def derived_current(con: duckdb.DuckDBPyConnection) -> bool:
    """Derived tables exist and were built from the store as it is, by the queries as they are."""
    return _current(con, _state(con), query_files())


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is DuckDB's report of an interrupt (Ctrl-C, or SIGTERM as the CLI raises it)
    inside a query: ``InterruptException``, or the RuntimeError "Query interrupted" it gives elsewhere."""
    return isinstance(exc, duckdb.InterruptException) or (
        isinstance(exc, RuntimeError) and str(exc).strip() == "Query interrupted"
    )


def build_derived(con: duckdb.DuckDBPyConnection, force: bool = False) -> bool:
    """Materialise every ``queries/*.sql`` as a table unless already current.

    Returns True when tables were rebuilt.  The store's generation (a number that
    changes with every ingest or replace) is remembered in ``_state`` so read
    commands do not redo the work.  Only the runs that changed are recomputed
    (:func:`pending_runs`), every query being per run; a full rebuild happens when
    the tables are missing, the queries changed, a writer did not say which runs
    it changed, or ``force``.
    """
    files = query_files()
    state = _state(con)
    if not force and _current(con, state, files):
        return False
    digest = _sql_digest(files)
    shadowed = [*RUN_TABLES, *(q.table for q in files)]
    per_run = all(i in shadowed for q in files for i in q.inputs)  # no query reads ingests/rejects
    runs = None if force or not per_run or state.get("derived_sql") != digest else pending_runs(con, files)
    try:
        with transaction(con, lambda exc, state: StoreError(f"building derived tables failed: {exc} ({state})")):
            if runs is None:
                for q in files:
                    # a view is never stale; a query that changed from one to the other replaces it
                    other = "table" if q.view else "view"
                    if scalar(
                        con,
                        f"select count(*) from duckdb_{other}s() where {other}_name = ? "
                        "and schema_name = 'main' and database_name = current_database()",
                        [q.table],
                    ):
                        con.execute(f"drop {other} main.{quote_ident(q.table)}")
                    con.execute(f"create or replace {'view' if q.view else 'table'} {quote_ident(q.table)} as {q.sql}")
            elif runs:
                _rebuild_runs(con, runs, files, shadowed)
            con.execute("delete from _dirty_runs")
            con.execute("delete from _state where key in ('derived_generation', 'derived_sql')")
            con.execute(
                "insert into _state values ('derived_generation', ?), ('derived_sql', ?)",
                [state.get("generation", 0), digest],
            )
        # (an interrupt too is rolled back: never leave half-deleted derived rows)
    finally:
        for name in shadowed:
            con.execute(f"drop view if exists temp.main.{quote_ident(name)}")
        con.execute("drop table if exists temp.main._build_runs")
    return True


def _rebuild_runs(con: duckdb.DuckDBPyConnection, runs: list[str], files: list[QueryFile], shadowed: list[str]) -> None:
    """Recompute the derived rows of ``runs`` only.

    Each query runs unchanged against temporary views that shadow every table it
    reads (``shadowed``) with that table's rows of these runs (a temporary view is
    found before the stored table of the same name); its rows replace the runs' old
    rows. The caller drops the views.
    """
    # the database is named after the store's file name: any text, so quoted, never pasted
    db = quote_ident(scalar(con, "select current_database()"))
    con.execute("create or replace temp table _build_runs as select unnest($r::varchar[]) as run_id", {"r": runs})
    for t in shadowed:
        con.execute(
            f"create or replace temp view {quote_ident(t)} as select * from {db}.main.{quote_ident(t)} "
            f"where run_id in (select run_id from temp.main._build_runs)"
        )
    for q in files:
        if q.view:
            continue
        target = f"{db}.main.{quote_ident(q.table)}"
        con.execute(f"delete from {target} where run_id in (select run_id from temp.main._build_runs)")
        con.execute(f"insert into {target} by name select * from (\n{q.sql}\n)")


def _derived_exist(con: duckdb.DuckDBPyConnection, files: list[QueryFile]) -> bool:
    tables = {r[0] for r in con.execute("select table_name from duckdb_tables()").fetchall()}
    views = {r[0] for r in con.execute("select view_name from duckdb_views() where not internal").fetchall()}
    return all(q.table in (views if q.view else tables) for q in files)


SCHEMA_TABLES = tuple(re.findall(r"create table if not exists (\w+)", SCHEMA))


def always(con: duckdb.DuckDBPyConnection) -> bool:
    """``read_only_if`` for commands that only read derived tables."""
    return True


def open_for_reading(
    db: str | os.PathLike | None, read_only_if: Callable[[duckdb.DuckDBPyConnection], bool] | None = None
) -> duckdb.DuckDBPyConnection:
    """A connection whose derived tables are current (rebuilt if an ingest happened).

    With ``read_only_if``, the connection is read-only when nothing has to be written,
    so that several commands can read one store at the same time: the schema and
    derived tables are current and ``read_only_if(con)`` holds (:func:`always`, or
    :func:`pipeline.fit.fit_ready` for commands that need a run's stored fit).
    Otherwise a read-write connection (one process at a time).
    """
    if read_only_if is not None:
        con = _read_only_if_current(db, read_only_if)
        if con is not None:
            return con
    con = connect(db, must_exist=True)
    build_derived(con)
    return con


def _read_only_if_current(db, read_only_if) -> duckdb.DuckDBPyConnection | None:
    """A read-only connection if nothing has to be written, else None."""
    try:
        con = connect(db, must_exist=True, read_only=True)
    except StoreError as exc:
        if isinstance(exc.__cause__, duckdb.ConnectionException):
            return None  # this process holds the store read-write already: share that
        raise
    try:
        names = {r[0] for r in con.execute("select table_name from duckdb_tables()").fetchall()}
        if set(SCHEMA_TABLES) <= names and derived_current(con) and read_only_if(con):
            return con
    except duckdb.Error:
        pass  # something to create or migrate: the read-write path does it
    con.close()
    return None


def is_read_only(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(scalar(con, "select readonly from duckdb_databases() where database_name = current_database()"))


def known_runs(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [r[0] for r in con.execute("select run_id from runs order by run_id").fetchall()]


def require_run(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Raise a helpful error when ``run_id`` is not in the store."""
    runs = known_runs(con)
    if run_id not in runs:
        raise unknown_run(run_id, runs)


def unknown_run(run_id: str, runs: list[str], where: str = "the store", see: str = "tracelat runs") -> StoreError:
    """The error for a run id that ``where`` (holding ``runs``) does not have."""
    listing = ", ".join(runs[:10]) + (" ..." if len(runs) > 10 else "") if runs else "none"
    return StoreError(f"run {run_id!r} is not in {where} (known runs: {listing}); see `{see}`")
