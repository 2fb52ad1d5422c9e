"""``tracelat rejects``."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import InputError
from ..terminal import echo, inline, one_line
from .options import db_option, lake_option, open_source, dumps, json_option


@click.command()
@click.argument("path", required=False)
@db_option
@lake_option
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Most lines to show.")
@json_option
def rejects(path: str | None, db: str, lake: Path | None, limit: int, as_json: bool) -> None:
    """Lines that ingest rejected: file, line number, reason and the line itself.

    PATH limits the list to one ingested file: as it was named at ingest, or
    any other name of the same file (./x.jsonl, an absolute path).
    Line numbers count every line of the file from 1 (`sed -n Np FILE` shows it);
    for whole-document formats (vLLM bench JSON, GenAI-Perf, TRT-LLM JSON arrays)
    they count entries of the document instead.
    """
    from .. import store

    con = open_source(db, lake, None, store.always, tables=("ingests", "rejects"))
    where, params = ("where path = any(?)", [_names_of(con, path)]) if path else ("", [])
    total = store.scalar(con, f"select count(*) from rejects {where}", params)
    rows = con.execute(
        f"select path, line_no, reason, raw from rejects {where} order by ingest_id, line_no limit {int(limit)}", params
    ).fetchall()
    if as_json:
        echo(dumps({"total": total, "rejects": [dict(zip(("path", "line_no", "reason", "raw"), r)) for r in rows]}))
        return
    if not rows:
        echo("no rejected lines" + (f" for {inline(path)}" if path else ""))
        return
    for p, line_no, reason, raw in rows:
        if raw is None:  # valid lines keep no text (a duplicate is rejected after validation)
            echo(f"{inline(p)}:{line_no}: {one_line(reason)}")
            continue
        shown = raw[:100] + ("..." if len(raw) > 100 else "")
        echo(f"{inline(p)}:{line_no}: {one_line(reason)}\n    {one_line(shown)}")
    if total > len(rows):
        echo(f"... {total - len(rows)} more (use --limit)")


def _names_of(con, path: str) -> list[str]:
    """The stored paths that name the file at ``path``: the text as given, any stored under
    another spelling of it (./x, absolute, with ..; resolved against this folder) and, when
    the file is here to read, any ingest of the same content (a relative path given in
    another folder resolves elsewhere; the content hash does not)."""
    want = Path(path).resolve()
    stored = [p for (p,) in con.execute("select path from ingests union select path from rejects").fetchall()]
    names = [path] + [p for p in stored if p != path and Path(p).resolve() == want]
    if want.is_file():
        from ..ingest import reader

        digest = reader.sha256_and_quotes(want, count_quotes=False)[0]
        names += [p for (p,) in con.execute("select distinct path from ingests where sha256 = ?", [digest]).fetchall()]
    if not set(names) & set(stored):  # a typo must not read as a clean file
        raise InputError(
            f"{path}: no file of that name or content was ingested here; "
            "`tracelat rejects` without PATH lists the rejected lines of every file"
        )
    return names
