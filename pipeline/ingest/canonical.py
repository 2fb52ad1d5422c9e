"""Canonical trace files (SPEC §2): JSON Lines (plain, gzip, zstd) and Parquet."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from .. import store
from ..errors import InputError
from . import reader
from .load import Batch

PARQUET_MAGIC = b"PAR1"


def sniff_jsonl(path: Path, head: str) -> bool:
    """Canonical JSONL: the first non-blank line is an object with a known ``kind``."""
    for line in head.splitlines():
        if line.strip():
            return line.lstrip().startswith("{") and any(
                f'"kind":{sp}"{k}"' in line for k in ("run", "iteration", "request") for sp in ("", " ")
            )
    return False


def convert_jsonl(path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None) -> Iterator[Batch]:
    for table in reader.line_batches(path, progress):
        yield Batch(table, table.num_rows)


def sniff_parquet(path: Path, head: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == PARQUET_MAGIC


def convert_parquet(path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None) -> Iterator[Batch]:
    """Each Parquet row becomes one canonical JSON object; row numbers stand in for lines."""
    import pyarrow.parquet as pq

    import pyarrow as pa

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as exc:  # UnicodeDecodeError: a column name
        raise InputError(f"{path}: not a readable Parquet file ({exc}); is --format right?") from exc
    con = store.scratch()  # $TRACELAT_MEMORY_LIMIT applies here too
    first = 1
    for rb in _batches(pf, path):
        con.register("rb", rb)
        table = con.sql(
            "select (row_number() over () + $first - 1)::bigint as line_no, to_json(rb)::varchar as raw from rb",
            params={"first": first},
        ).to_arrow_table()
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
            raise InputError(f"{path}: Parquet data is corrupt after row {rows} ({str(exc).strip()[:300]}); "
                             "the file was not ingested. Re-copy or re-write it") from exc
        rows += rb.num_rows
        yield rb
