"""Reading input files as numbered lines in bounded batches.

Plain, gzip and zstd files are recognised by their magic bytes, not their names.
Lines come out as Arrow tables ``(line_no, raw)`` so that validation can happen
in DuckDB: Python never touches individual records.
"""

from __future__ import annotations

import shlex

import contextlib
import contextvars
import gzip
import hashlib
import io
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from typing import TYPE_CHECKING

from ..errors import InputError
from ..escape import glob_literal, not_utf8

if TYPE_CHECKING:  # Arrow loads only for files read line by line here (not DuckDB's reader)
    import pyarrow as pa

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
BATCH_BYTES = 32 << 20

# DuckDB's parallel CSV reader as a line reader: one VARCHAR column, a delimiter that never
# occurs in our text, no quoting; a blank line is a NULL row, so row k is line k.  A line it
# cannot read that way (a stray \r, invalid UTF-8, the delimiter, longer than max_line)
# fails the scan: callers then read the file with line_batches, which takes every line.
DUCKDB_READ = (
    "read_csv($path, columns={{'raw': 'VARCHAR'}}, delim='\x1e\x1f', quote='', escape='', "
    "header=false, auto_detect=false, new_line='\\n', comment='', skip=0, strict_mode=true, "
    "max_line_size={max_line}, compression='{compression}')"
)
MAX_LINE_BYTES = 16 << 20
# JSON's whitespace (RFC 8259) as a DuckDB string: a line of only these characters is blank
# (skipped, not rejected), and an object may follow them.  trim() alone strips spaces only.
JSON_SPACE = "' ' || chr(9) || chr(10) || chr(13)"
BLANK_SQL = f"trim(raw, {JSON_SPACE}) = ''"

Progress = Callable[[int], None]


def check_file(path: Path) -> None:
    """Raise a clear error for paths that are not readable regular files."""
    shown = not_utf8(path)
    if shown is not None:
        raise InputError(
            f"{shown}: the file's name is not valid UTF-8, which the store cannot hold as its path; "
            "rename the file (or link it under a UTF-8 name) and ingest that"
        )
    if not path.exists():
        raise InputError(f"{path}: no such file; check the path (a directory ingests every file in it)")
    if path.is_dir():
        raise InputError(f"{path}: is a directory; pass files, or use `tracelat ingest {path}` to ingest all")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: not readable (permission denied)")


def compression(path: Path) -> str:
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    return "none"


def sha256(path: Path) -> str:
    return sha256_and_quotes(path, False)[0]


def _quotes_bytes(block: bytes) -> int:
    return block.count(b'"')


def _quotes_numpy(block: bytes) -> int:
    import numpy as np  # imported once, then a dictionary lookup

    return int(np.count_nonzero(np.frombuffer(block, np.uint8) == 34))


# bytes.count takes 0.5 ns a byte, NumPy 0.07 but 0.15 s of CPU to import: it pays off beyond this
NUMPY_COUNT_BYTES = 256 << 20


def sha256_and_quotes(path: Path, count_quotes: bool = True) -> tuple[str, int | None]:
    """The file's sha256 and, with ``count_quotes``, how many double quotes its bytes hold.

    The count rides along the hash's read; the canonical fast path checks its staging
    against it (``canonical_sql.stage_sql(file_quotes=True)``).
    """
    h = hashlib.sha256()
    quotes = 0
    with open(path, "rb") as f:
        count: Callable[[bytes], int] | None = None
        if count_quotes:
            count = _quotes_numpy if os.fstat(f.fileno()).st_size >= NUMPY_COUNT_BYTES else _quotes_bytes
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            if count is not None:
                quotes += count(block)
    return h.hexdigest(), quotes if count_quotes else None


class _CountingFile(io.RawIOBase):
    """Wraps a binary file and reports how many compressed bytes were consumed."""

    def __init__(self, raw: io.BufferedReader, progress: Progress | None):
        self._raw, self._progress = raw, progress

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        n = self._raw.readinto(b)
        if self._progress and n:
            self._progress(n)
        return n

    def close(self) -> None:  # the file it wraps is its own: closed with it, not left to the collector
        try:
            if not self.closed:
                self._raw.close()
        finally:
            super().close()


class _GzipOwning(gzip.GzipFile):
    """A GzipFile that closes the stream it reads: given a ``fileobj``, GzipFile leaves it open
    (until the GzipFile itself is collected, which a caller holding it puts off)."""

    def __init__(self, raw: io.BufferedReader):
        self._owned = raw
        super().__init__(fileobj=raw)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._owned.close()


def open_binary(path: Path, progress: Progress | None = None) -> io.BufferedIOBase:
    """A decompressed binary stream of ``path``."""
    check_file(path)
    kind = compression(path)
    if kind == "zstd":
        import zstandard  # before the file is opened: a missing module leaves nothing open
    raw = io.BufferedReader(_CountingFile(open(path, "rb"), progress), 1 << 20)
    if kind == "gzip":
        return _GzipOwning(raw)  # type: ignore[return-value]
    if kind == "zstd":
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True))
    return raw


def intact(path: Path) -> bool:
    """Whether a compressed file decompresses to its end without error (checksums included)."""
    try:
        with open_binary(path) as f:
            while f.read(8 << 20):
                pass
    except (OSError, EOFError, zlib.error, ValueError):
        return False
    except Exception as exc:  # zstandard.ZstdError
        if type(exc).__name__ == "ZstdError":
            return False
        raise
    return True


BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark: some Windows tools start a text file with it


def _head_bytes(path: Path, n_bytes: int) -> tuple[bytes, Exception | None]:
    """Up to ``n_bytes`` of the decompressed content, and the error that stopped the read
    before them (a compressed stream cut short or damaged), or None."""
    chunks: list[bytes] = []
    try:
        with open_binary(path) as f:
            # in pieces: a stream cut short still shows its format by what came before the cut
            while sum(map(len, chunks)) < n_bytes and (piece := f.read(min(4096, n_bytes))):
                chunks.append(piece)
    except (OSError, EOFError, zlib.error) as exc:
        return b"".join(chunks)[:n_bytes], exc
    return b"".join(chunks)[:n_bytes], None


def salvage(path: Path) -> str:
    """The command that writes the readable part of a damaged compressed file beside it, named
    like it (``server.log.gz`` -> ``server.part.log``: the same kind of file, for detection)."""
    plain = path.name[: -len(path.suffix)] if path.suffix in (".gz", ".zst", ".zstd") else path.name
    stem, dot, ext = plain.rpartition(".")
    part = f"{stem}.part.{ext}" if dot and stem else f"{plain}.part"
    # a command to paste into a shell: a name like a$(touch x).gz must stay a name
    return f"{'zstdcat' if compression(path) == 'zstd' else 'zcat'} {shlex.quote(str(path))} > " + shlex.quote(
        str(path.with_name(part))
    )


def damaged_message(path: Path, n_read: int, exc: Exception) -> str:
    """Why a compressed file whose start could not be read whole is no use, and what to do."""
    kind = compression(path)
    if kind == "none":  # not compressed: an I/O error, not damaged compression
        return f"{path}: cannot read the start of the file ({exc})"
    return (
        f"{path}: damaged or truncated {kind} file: only {n_read} bytes could be decompressed "
        f"before the damage ({exc}), too few to tell its format. Re-copy the file, and check the "
        f"copy with `{'zstd' if kind == 'zstd' else 'gzip'} -t {shlex.quote(str(path))}`"
    )


def head_damage(path: Path, n_bytes: int = 65536) -> str | None:
    """:func:`damaged_message` when reading the head of ``path`` hit damaged compressed data, else None.

    Detection asks this only after no format matched: a .gz copied short before its first
    complete record decompresses to a few header lines (or none), which match no format,
    and "unknown format" would send the user looking for the wrong fix.
    """
    head, exc = _head_bytes(path, n_bytes)
    return None if exc is None else damaged_message(path, len(head), exc)


def head_text(path: Path, n_bytes: int = 65536) -> str:
    """The first bytes of the decompressed content, for format detection (without a
    byte-order mark: formats are told by their first characters)."""
    head, exc = _head_bytes(path, n_bytes)
    if exc is not None and not head:
        raise InputError(damaged_message(path, 0, exc)) from exc
    if head.startswith(BOM):
        head = head[len(BOM) :]
    return head.decode("utf-8", errors="replace")


# Rows per record batch of the Arrow tables handed to DuckDB (the lines here, a converter's typed
# records, a Polars frame it registers): DuckDB scans an Arrow table one record batch per thread,
# so a batch of 200k lines in one chunk was validated on one core. Slicing is zero-copy.
ARROW_BATCH_ROWS = 16384


def in_batches(table: pa.Table) -> pa.Table:
    """``table`` (or a Polars frame, as Arrow) in record batches of at most ARROW_BATCH_ROWS rows."""
    import pyarrow as pa

    if not isinstance(table, pa.Table):
        table = table.to_arrow()
    if table.num_rows <= ARROW_BATCH_ROWS:
        return table
    return pa.Table.from_batches(table.to_batches(max_chunksize=ARROW_BATCH_ROWS), table.schema)


def line_batches(path: Path, progress: Progress | None = None, batch_bytes: int | None = None) -> Iterator[pa.Table]:
    """Yield ``(line_no, raw)`` Arrow tables covering every line of ``path``.

    Line numbers start at 1 and count every line, blank ones included, so a reject
    can always be found with ``sed -n Np``.  A compressed stream that breaks
    part-way raises :class:`InputError` naming the last good line.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    next_line = 1
    batch_bytes = batch_bytes or BATCH_BYTES
    with open_binary(path, progress) as f:
        while True:
            try:
                lines = f.readlines(batch_bytes)
            except (OSError, EOFError, zlib.error) as exc:
                good = next_line - 1 + _lines_before_damage(path, next_line - 1)
                raise InputError(
                    f"{path}: compressed data is corrupt after line {good} ({exc}); "
                    "the file was not ingested. Re-copy it, or salvage the readable part with "
                    f"`{salvage(path)}` and ingest that"
                ) from exc
            if not lines:
                return
            if next_line == 1 and lines[0].startswith(BOM):  # not part of the first record
                lines[0] = lines[0][len(BOM) :]
            table = pa.table(
                {
                    "line_no": pa.array(np.arange(next_line, next_line + len(lines), dtype=np.int64)),
                    "raw": pc.utf8_rtrim(_to_text(lines), characters="\r\n"),
                }
            )
            next_line += len(lines)
            yield in_batches(table)


def _lines_before_damage(path: Path, skip: int) -> int:
    """Whole lines readable after the first ``skip`` lines of a damaged compressed file (a
    batch that breaks is lost whole: this reads it again line by line, on the error path only)."""
    n = 0
    try:
        with open_binary(path) as f:
            for i, line in enumerate(f):
                if i >= skip and line.endswith(b"\n"):
                    n += 1
    except (OSError, EOFError, zlib.error):
        pass
    return n


class FastReadFailed(Exception):
    """DuckDB could not read the file's lines as they are: read them again with line_batches."""


def duckdb_line_batches(path: Path, progress: Progress | None = None) -> Iterator[pa.Table] | None:
    """``(line_no, raw)`` tables like :func:`line_batches`, read by DuckDB's parallel reader.

    None when the file is not one DuckDB numbers lines in as we do (CRLF line ends, a
    damaged compressed stream).  Rows stream out in file order (nothing
    holds the whole file); a line DuckDB cannot read raises :class:`FastReadFailed`
    part-way, so a caller must be able to start over (converters read through
    :func:`lines`, and the loader starts the file over).
    """
    import duckdb
    import numpy as np
    import pyarrow as pa

    from .. import store

    kind = compression(path)
    if kind != "none" and not intact(path):
        return None  # line_batches names the last good line
    head = head_text(path, 1 << 16)
    if "\r" in head:
        return None  # CRLF line ends (a byte-order mark both readers drop)
    con = store.scratch()
    if not con.execute("select current_setting('preserve_insertion_order')").fetchall()[0][0]:
        con.close()
        return None  # rows could come out of file order: no line numbers
    # about BATCH_BYTES of text per batch, as line_batches
    rows = max(1, int(BATCH_BYTES * max(head.count("\n"), 1) / max(len(head.encode()), 1)))
    size = path.stat().st_size
    # a blank line is '' as line_batches gives it (DuckDB reads it as NULL)
    sql = "select coalesce(raw, '') as raw from " + DUCKDB_READ.format(max_line=MAX_LINE_BYTES, compression=kind)

    def batches() -> Iterator[pa.Table]:
        next_line = 1
        try:
            for rb in con.sql(sql, params={"path": glob_literal(path)}).to_arrow_reader(rows):
                n = rb.num_rows
                lines = pa.table(
                    {"line_no": pa.array(np.arange(next_line, next_line + n, dtype=np.int64)), "raw": rb[0]}
                )
                yield in_batches(lines)
                next_line += n
                if progress and kind == "none":
                    progress(_text_bytes(rb[0]) + n)  # + the newlines
        except (duckdb.Error, OSError) as exc:
            raise FastReadFailed(str(exc)) from exc
        finally:
            con.close()
        if progress and kind != "none":
            progress(size)

    return batches()


_PYTHON_ONLY = contextvars.ContextVar("tracelat_python_lines", default=False)


def lines(path: Path, progress: Progress | None = None) -> Iterator[pa.Table]:
    """The file's ``(line_no, raw)`` batches for a converter that yields as it reads.

    DuckDB's reader when it can read the file's lines as they are; should it fail part-way,
    :class:`FastReadFailed` reaches the loader, which rolls the file back and ingests it
    again inside :func:`python_lines` (this then reads with :func:`line_batches`).
    """
    if not _PYTHON_ONLY.get():
        fast = duckdb_line_batches(path, progress)
        if fast is not None:
            return fast
    return line_batches(path, progress)


@contextlib.contextmanager
def python_lines() -> Iterator[None]:
    """Within this block :func:`lines` reads with the Python line reader."""
    token = _PYTHON_ONLY.set(True)
    try:
        yield
    finally:
        _PYTHON_ONLY.reset(token)


def _text_bytes(col) -> int:
    import pyarrow.compute as pc

    return int(pc.sum(pc.binary_length(col)).as_py() or 0)


def _to_text(lines: list[bytes]) -> pa.Array:
    """Lines as Arrow strings; invalid UTF-8 (rare) is replaced with U+FFFD, not fatal."""
    import pyarrow as pa

    blob = pa.array(lines, pa.binary())
    try:
        return blob.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([b.decode("utf-8", errors="replace") for b in lines], pa.string())
