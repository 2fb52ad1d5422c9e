"""A file's SHA-256 (idempotence) and its count of double quotes (the canonical fast path's
check), and the first big file of ``tracelat ingest`` hashed while the command starts.

Imports only the standard library: :func:`prefetch` runs before the CLI imports DuckDB and
the ingestors (about 0.3 s of one thread on a 2-core machine), when the other core is idle,
so less of the hash competes with DuckDB's threads staging the file. hashlib leaves the GIL
while it hashes, so the imports go on meanwhile. One read of the file, as when the ingest
hashes it itself: a file bigger than the page cache is not read from disk twice.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_BLOCK = 1 << 20
# bytes.count takes 0.5 ns a byte, NumPy 0.07 but 0.15 s of CPU to import: it pays off beyond this
NUMPY_COUNT_BYTES = 256 << 20
# a file smaller than this is hashed where it is ingested: the prefetch would save little
PREFETCH_MIN_BYTES = 8 << 20


def _quotes_bytes(block: bytes) -> int:
    return block.count(b'"')


def _quotes_numpy(block: bytes) -> int:
    import numpy as np  # imported once, then a dictionary lookup

    return int(np.count_nonzero(np.frombuffer(block, np.uint8) == 34))


def _blocks(f) -> Iterable[bytes]:
    return iter(lambda: f.read(_BLOCK), b"")


class Cancelled(Exception):
    """The prefetch was not wanted after all (:func:`take` found another file or a changed one)."""


def sha256_and_quotes(
    path: Path, count_quotes: bool = True, stop: threading.Event | None = None
) -> tuple[str, int | None]:
    """The file's sha256 and, with ``count_quotes``, how many double quotes its bytes hold.

    The count rides along the hash's read; the canonical fast path checks its staging
    against it (``canonical_sql.stage_sql(file_quotes=True)``). ``stop``: raise
    :class:`Cancelled` at the next block once it is set.
    """
    h = hashlib.sha256()
    quotes = 0
    with open(path, "rb") as f:
        count: Callable[[bytes], int] | None = None
        if count_quotes:
            count = _quotes_numpy if os.fstat(f.fileno()).st_size >= NUMPY_COUNT_BYTES else _quotes_bytes
        for block in _blocks(f):
            if stop is not None and stop.is_set():
                raise Cancelled(str(path))
            h.update(block)
            if count is not None:
                quotes += count(block)
    return h.hexdigest(), quotes if count_quotes else None


def _key(path: str | Path) -> tuple[str, int, int] | None:
    """What identifies the file's content for the prefetch: its real path, size and mtime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return os.path.realpath(path), st.st_size, st.st_mtime_ns


def _looks_canonical(path: str | Path) -> bool:
    """Whether the file will likely want its quotes counted: plain (not gzip or zstd) and its first
    non-blank line an object with a ``kind`` (canonical.sniff_jsonl, roughly). A wrong guess costs
    a second read of the file, never a wrong count (:func:`take` hands a count only when counted)."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    if head.startswith(GZIP_MAGIC) or head.startswith(ZSTD_MAGIC):
        return False
    for line in head.split(b"\n"):
        if line.strip():
            return line.lstrip().startswith(b"{") and b'"kind"' in line
    return False


_slot: tuple[tuple[str, int, int], bool, Future, threading.Event] | None = None


def _run(path: str, count: bool, fut: Future, stop: threading.Event) -> None:
    try:
        fut.set_result(sha256_and_quotes(Path(path), count, stop))
    except BaseException as exc:  # the ingest hashes the file itself (take returns None)
        fut.set_exception(exc)


def prefetch(paths: Iterable[str | Path]) -> None:
    """Start hashing the first of ``paths`` in a background thread when it is a regular file of at
    least PREFETCH_MIN_BYTES (a folder, a small or a missing file: nothing). Daemon: a command
    that fails before it ingests does not wait for it."""
    global _slot
    first = next(iter(paths), None)
    key = None if first is None else _key(first)
    if key is None or key[1] < PREFETCH_MIN_BYTES:
        return
    count = _looks_canonical(first)
    fut: Future = Future()
    fut.set_running_or_notify_cancel()
    stop = threading.Event()
    _slot = (key, count, fut, stop)
    threading.Thread(target=_run, args=(str(first), count, fut, stop), name="tracelat-hash", daemon=True).start()


def take(path: str | Path, count_quotes: bool) -> Future | None:
    """The prefetched ``(sha256, quotes)`` of ``path`` as a future, if it was prefetched, is
    unchanged since (same size and mtime) and had its quotes counted when ``count_quotes``;
    else None (the caller hashes it). Taken once."""
    global _slot
    if _slot is None:
        return None
    key, counted, fut, stop = _slot
    _slot = None  # asked once: a prefetch not taken now never will be
    if _key(path) != key or (count_quotes and not counted):
        stop.set()  # the caller hashes the file itself: no second thread reading it beside DuckDB's
        return None
    if fut.done() and fut.exception() is not None:
        return None
    return fut
