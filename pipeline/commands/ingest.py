"""``tracelat ingest``."""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path

import click

from ..terminal import clean, echo
from .options import db_option, dumps, json_option

BIG_FILE = 8 << 20


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@db_option
@click.option("--run-id", help="Run id for records that name none (default: the file name up to its first dot; "
              "with the folder in front when two files of one ingest share a name).")
@click.option("--format", "fmt", help="Skip detection and use this format (see the list above).")
@click.option("--replace", is_flag=True, help="Re-load files whose content (or path) was ingested before.")
@json_option
def ingest(paths: tuple[Path, ...], db: str, run_id: str | None, fmt: str | None, replace: bool, as_json: bool) -> None:
    """Load trace files into the store, one transaction per file.

    PATHS are files or directories (every file below a directory is ingested,
    each with the format detected from its content).  A bad line never stops a
    file: it is recorded in the `rejects` table with its line number and reason.
    Identical content is not loaded twice; --replace re-loads it.
    """
    from .. import ingest as ing
    from .. import store

    con = store.connect(db)

    @contextlib.contextmanager
    def progress_for(path: Path):
        size = path.stat().st_size
        if as_json or size < BIG_FILE:
            yield None
            return
        with click.progressbar(length=size, label=clean(f"ingest {path.name}"), file=click.get_text_stream("stderr")) as bar:
            yield bar.update

    results = ing.ingest_paths(con, paths, fmt=fmt, run_id=run_id, replace=replace, progress_for=progress_for)
    store.build_derived(con)
    if as_json:
        echo(dumps([r.__dict__ for r in results]))
        return
    for r in results:
        echo(r.line())
    rejected = sum(r.rejected for r in results)
    if rejected:
        echo(f"{rejected} lines rejected; see them with: tracelat rejects [FILE] --db {db}", err=True)


def _formats_help() -> str:
    from ..ingest import INGESTORS, _load_plugins

    _load_plugins()
    return "\n".join(f"  {name:<16}{ing.description}" for name, ing in INGESTORS.items())


ingest.help = inspect.cleandoc(ingest.help or "") + "\n\n\b\nFormats (--format NAME):\n" + _formats_help()
