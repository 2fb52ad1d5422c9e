"""Canonical trace files (docs/canonical-format.md): JSON Lines (plain, gzip, zstd) and Parquet."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb

from .. import store
from ..errors import InputError
from ..escape import glob_literal
from . import reader
from .canonical_sql import OWN_NAMES, stage_sql
from .load import MAX_RUN_CASES, Batch, last_run_case
from .parquet_sql import parquet_stage_sql

PARQUET_MAGIC = b"PAR1"


def sniff_jsonl(path: Path, head: str) -> bool:
    """Canonical JSONL: the first non-blank line is an object with a known ``kind``."""
    for line in head.splitlines():
        if line.strip():
            return line.lstrip().startswith("{") and any(
                f'"kind":{sp}"{k}"' in line for k in ("run", "iteration", "request") for sp in ("", " ")
            )
    return False


def convert_jsonl(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None
) -> Iterator[Batch]:
    for table in reader.line_batches(path, progress):
        yield Batch(table, table.num_rows)


# DuckDB reads the lines itself (plain, gzip, zstd; reader.DUCKDB_READ): a line it cannot
# read that way fails the scan, and the file goes the batch path of convert_jsonl instead,
# which reads every line.
_READ = reader.DUCKDB_READ
MAX_LINE_BYTES = reader.MAX_LINE_BYTES
# Staged rows go to the store in slices of this many reader batches of the file (1 GiB):
# each slice is a few set statements (no row is copied out of DuckDB), so slices can be
# big; they bound what a slice's duplicate check holds (a file that repeats itself
# rejects half its lines; a loser row is its line number and reason, the raw text comes
# later from fill_raw). Each slice's statements cost time of their own: 256 MB slices
# made the 1M-step bench file (414 MiB) 0.3 s slower to load than one slice.
STAGED_SLICE_BATCHES = 32
_STAGED, _RUN_LINES, _LINES = "_tracelat_staged", "_tracelat_run_lines", "_tracelat_lines"
# A plain file this big has its double quotes counted as it is hashed, and is staged without
# counting them line by line (stage_sql's file_quotes): a seventh of the staging statement's
# CPU (0.3 of 2.4 CPU-s at 414 MiB; the count and NumPy's import cost 0.2). A smaller file
# would gain less than binding a second statement costs when the sums differ.
QUOTE_COUNT_MIN_BYTES = 8 << 20
# A file smaller than this is staged without DuckDB's optimiser. The staging statement is one
# wide projection over a scan with no join to order: the optimiser's rewrites of its 46 KB of
# expressions (about 50 ms) buy nothing measurable at any size (the same CPU on a 321 MiB file,
# the same rows), but are a third of the statement's time on a file of a few hundred lines,
# which a nightly run over many small files pays per file. Bigger files keep the optimised plan.
# The size is that on disk: a compressed file under it holds more lines, which costs nothing
# either (the same time and rows up to 400k lines gzipped). The setting is put back as it was
# (store.unoptimised).
UNOPTIMISED_MAX_BYTES = 64 << 20
_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:')
_KNOWN_KEYS = frozenset().union(*OWN_NAMES.values())


class _NotOrdered(Exception):
    pass


class StagedJsonl:
    """A canonical JSONL file read, parsed and validated by DuckDB in one scan (the fast path).

    Every line is one row of a temporary table, in file order (DuckDB keeps insertion
    order), so a row's ``rowid + 1`` is its line number.  Raw text is kept only for
    lines rejected while staging; the few rejected later (duplicates) get theirs from
    :meth:`fill_raw`.  Built before the file's transaction (a scan that fails leaves
    nothing behind to roll back); :meth:`batches` then hands the rows to
    ``load.load_batch`` in slices of about ``reader.BATCH_BYTES`` of the file.
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        path: Path,
        default_run: str,
        quotes: Callable[[], int | None] | None = None,
        read: str | None = None,
        read_params: dict | None = None,
        stage: str | None = None,
    ):
        self.con, self.path, self.default_run = con, path, default_run
        self.params = {"path": glob_literal(path), **(read_params or {})}
        comp = reader.compression(path)
        # read: another relation of the file's records as JSON text in a column ``raw`` (Parquet)
        self.read = read or _READ.format(max_line=MAX_LINE_BYTES, compression={"none": "none"}.get(comp, comp))
        self.quote_check = "line"  # or "file"; "line-again" when the file-wide count disagreed
        if stage is not None:  # staged by the caller's statement (typed Parquet columns)
            self.quote_check = "typed"
            con.execute(f"create or replace temp table {_STAGED} as {stage}", self.params)
        elif quotes is not None and comp == "none" and _looks_clean(reader.head_text(path, 1 << 16)):
            self._stage(file_quotes=True)
            staged_quotes = con.execute(f"select sum(quotes) from temp.main.{_STAGED}").fetchall()[0][0]
            if staged_quotes is not None and staged_quotes == quotes():
                self.quote_check = "file"
                con.execute(f"alter table temp.main.{_STAGED} drop column quotes")
            else:  # a line that looked clean is not (or the file changed meanwhile): line by line
                self.quote_check = "line-again"
                self._stage(file_quotes=False)
        else:
            self._stage(file_quotes=False)
        self.n_lines, first = con.execute(f"select count(*), min(rowid) from temp.main.{_STAGED}").fetchall()[0]
        # committed (no transaction is open), so its rowids count from 0: rowid + 1 is the line number
        if self.n_lines and first != 0:
            self.close()
            raise _NotOrdered(f"rowids start at {first}")
        # the run of a line that names none: that of the last run record before it
        self.run_lines = con.execute(
            f"select rowid + 1, coalesce(own_run, $d) from temp.main.{_STAGED} where kind = 'run' order by 1",
            {"d": default_run},
        ).fetchall()
        if len(self.run_lines) > MAX_RUN_CASES:
            con.execute(
                f"create or replace temp table {_RUN_LINES} as select rowid + 1 as line_no, "
                f"coalesce(own_run, $d) as run from temp.main.{_STAGED} where kind = 'run'",
                {"d": default_run},
            )

    def _stage(self, file_quotes: bool) -> None:
        sql = stage_sql(self.read, line_no=None, keep_raw=False, file_quotes=file_quotes)
        with store.unoptimised(self.con, when=self.path.stat().st_size < UNOPTIMISED_MAX_BYTES):
            self.con.execute(f"create or replace temp table {_STAGED} as {sql}", self.params)

    def batches(self, progress: Callable[[int], None] | None = None) -> Iterator[Batch]:
        size = max(self.path.stat().st_size, 1)
        per = max(1, int(self.n_lines * reader.BATCH_BYTES * STAGED_SLICE_BATCHES / size)) if self.n_lines else 1
        rows = f"(select rowid + 1 as line_no, * from temp.main.{_STAGED} where rowid >= $a and rowid < $b) s"
        params: dict = {"d": self.default_run}
        if len(self.run_lines) > MAX_RUN_CASES:
            sql = (
                f"select s.*, coalesce(s.own_run, r.run, $d) as run_id from {rows} "
                f"asof left join temp.main.{_RUN_LINES} r on s.line_no >= r.line_no"
            )
        else:  # a few run records (usually one, on line 1): the last one at or before the line
            last, case_params = last_run_case(self.run_lines, "s.line_no")
            params |= case_params
            sql = f"select s.*, coalesce(s.own_run, {last}, $d) as run_id from {rows}"
        for a in range(0, self.n_lines, per):
            b = min(a + per, self.n_lines)
            staged = self.con.sql(sql, params=params | {"a": a, "b": b})  # a lazy relation: read where used
            if progress:
                progress(int(size * (b - a) / self.n_lines))
            yield Batch(None, b - a, staged=staged)

    def fill_raw(self, ingest_id: int) -> None:
        """The raw text of this file's rejects that were staged without it (duplicates)."""
        missing = self.con.execute(
            "select count(*) from rejects where ingest_id = ? and raw is null and line_no > 0", [ingest_id]
        ).fetchall()[0][0]
        if not missing:
            return
        self.con.execute(f"create or replace temp table {_LINES} as select raw from {self.read}", self.params)
        # inside a transaction, a new table's rowids start at a large offset (its rows are not committed)
        self.con.execute(
            "update rejects set raw = left(l.raw, 1024) from (select rowid - (select min(rowid) from "
            f"temp.main.{_LINES}) + 1 as line_no, raw from temp.main.{_LINES}) l "
            "where rejects.ingest_id = ? and rejects.raw is null and rejects.line_no = l.line_no",
            [ingest_id],
        )

    def close(self) -> None:
        for t in (_STAGED, _RUN_LINES, _LINES):
            self.con.execute(f"drop table if exists temp.main.{t}")


def _looks_clean(head: str) -> bool:
    """Whether the file's first lines hold no unknown key, which a line's quotes alone would
    show: then its quotes likely add up file-wide, and it need not be staged twice. A guess
    from at most 64 KiB: a wrong one costs time, never a record. Lines the statement finds
    unclean by other signs (an object or list of strings, a boolean, a null, an escaped
    quote) are counted with the quotes they hold and cannot spoil the sum: skipped here."""
    for line in head.split("\n")[:-1]:  # whole lines only
        if any(s in line for s in ('"meta"', '"req_ids"', "true", "false", "null", '\\"')):
            continue
        if any(k not in _KNOWN_KEYS for k in _KEY.findall(line)):
            return False
    return True


def stage_jsonl(
    con: duckdb.DuckDBPyConnection, path: Path, default_run: str, quotes: Callable[[], int | None] | None = None
) -> StagedJsonl | None:
    """The fast path for a canonical JSONL file, or None when DuckDB cannot read its lines as they are.

    ``quotes``: returns the count of double quotes in the file (None if unknown), which lets
    a plain file be staged without counting them per line (see :class:`StagedJsonl`).
    """
    if b"\r" in reader.head_text(path, 1 << 16).encode():
        return None  # CRLF line ends: DuckDB would not number lines as we do
    if reader.compression(path) != "none" and not reader.intact(path):
        return None  # DuckDB may read a corrupt stream silently; the batch path names the last good line
    return _staged_or_none(con, lambda: StagedJsonl(con, path, default_run, quotes))


def _staged_or_none(con: duckdb.DuckDBPyConnection, make: Callable[[], StagedJsonl]) -> StagedJsonl | None:
    """``make()``, or None (and nothing left behind) when DuckDB cannot stage the file in order."""
    if not con.execute("select current_setting('preserve_insertion_order')").fetchall()[0][0]:
        return None  # rows could come out of file order: no line numbers
    try:
        return make()
    except (duckdb.Error, _NotOrdered):
        for t in (_STAGED, _RUN_LINES):
            con.execute(f"drop table if exists temp.main.{t}")
        return None


convert_jsonl.stage = stage_jsonl  # type: ignore[attr-defined]
stage_jsonl.quote_count_min_bytes = QUOTE_COUNT_MIN_BYTES  # type: ignore[attr-defined]


def json_row_sql(names: list[str], idents: list[str] | None = None) -> tuple[str, dict[str, str]]:
    """SQL for a row's non-null columns ``names`` as one JSON object text, and its parameters.

    A Parquet row holds every column of its file, and a null there is a field the record does
    not have (the other kinds' fields, mostly): it is left out, as a JSON line would leave it
    out (nested values are kept as they are). Column names come from the file: each is a
    quoted identifier in the SQL, and its JSON key text a bound parameter. Building the text
    this way costs a third of ``to_json`` of the whole row followed by a merge patch.
    ``idents``: the columns' identifiers in the SQL, when not their quoted names.
    """
    if not names:
        return "'{}'", {}
    idents = idents or [store.quote_ident(n) for n in names]
    parts = [f"case when {c} is not null then $k{i} || to_json({c}) end" for i, c in enumerate(idents)]
    keys = {f"k{i}": json.dumps(n, ensure_ascii=False) + ":" for i, n in enumerate(names)}
    return "'{' || concat_ws(',', " + ", ".join(parts) + ") || '}'", keys


def _columns(con: duckdb.DuckDBPyConnection, relation: str, params: dict | None = None) -> list[str]:
    """The column names DuckDB gives a relation (a duplicate name, by case, gets a suffix)."""
    return [name for name, _ in _typed_columns(con, relation, params)]


def _typed_columns(con: duckdb.DuckDBPyConnection, relation: str, params: dict | None = None) -> list[tuple[str, str]]:
    """The names and DuckDB types of a relation's columns."""
    return [(r[0], r[1]) for r in con.execute(f"describe select * from {relation}", params).fetchall()]


def stage_parquet(con: duckdb.DuckDBPyConnection, path: Path, default_run: str) -> StagedJsonl | None:
    """A canonical Parquet file read, turned into records and validated by DuckDB in one scan, or
    None when DuckDB cannot read it (convert_parquet then reads it with PyArrow and says why)."""

    def make() -> StagedJsonl:
        columns = _typed_columns(con, "read_parquet($path)", {"path": glob_literal(path)})
        names = [name for name, _ in columns]
        row, keys = json_row_sql(names)
        read = f"(select {row} as raw from read_parquet($path))"  # in file order: row k is "line" k
        # the typed columns validated as they are; the rows' JSON text only for what it alone decides
        stage = parquet_stage_sql("read_parquet($path)", columns, lambda idents: json_row_sql(names, idents)[0])
        if stage is not None:
            try:
                return StagedJsonl(con, path, default_run, read=read, read_params=keys, stage=stage)
            except duckdb.Error:
                pass  # a value the typed statement cannot take: the JSON text decides, as for other types
        return StagedJsonl(con, path, default_run, read=read, read_params=keys)

    return _staged_or_none(con, make)


def sniff_parquet(path: Path, head: str) -> bool:
    """A Parquet file with a ``kind`` column (any Parquet file, a table of kernel timings say, is
    no trace); one whose schema cannot be read is taken, so that its damage is reported."""
    with open(path, "rb") as f:
        if f.read(4) != PARQUET_MAGIC:
            return False
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError):
        return True
    return "kind" in names


def convert_parquet(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None
) -> Iterator[Batch]:
    """Each Parquet row becomes one canonical JSON object; row numbers stand in for lines."""
    import pyarrow.parquet as pq

    import pyarrow as pa

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as exc:  # UnicodeDecodeError: a column name
        raise InputError(f"{path}: not a readable Parquet file ({exc}); is --format right?") from exc
    con = store.scratch()  # $TRACELAT_MEMORY_LIMIT applies here too
    first = 1
    sql = keys = None
    for rb in _batches(pf, path):
        con.register("rb", rb)
        if sql is None:  # null columns are no fields of the row (as in stage_parquet)
            row, keys = json_row_sql(_columns(con, "rb"))
            sql = f"select (row_number() over () + $first - 1)::bigint as line_no, {row} as raw from rb"
        table = con.sql(sql, params={"first": first, **keys}).to_arrow_table()
        first += rb.num_rows
        if progress:
            progress(rb.nbytes)
        yield Batch(table, rb.num_rows)


def _batches(pf, path: Path):
    """The file's record batches; a corrupt page or column chunk (Arrow raises OSError or
    ArrowException part-way) is one clear error: the file is rolled back, not a crash."""
    import pyarrow as pa

    rows = 0
    it = pf.iter_batches(batch_size=200_000)
    while True:
        try:
            rb = next(it)
        except StopIteration:
            return
        except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
            raise InputError(
                f"{path}: Parquet data is corrupt after row {rows} ({str(exc).strip()[:300]}); "
                "the file was not ingested. Re-copy or re-write it"
            ) from exc
        rows += rb.num_rows
        yield rb


convert_parquet.stage = stage_parquet  # type: ignore[attr-defined]
