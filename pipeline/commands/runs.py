"""``tracelat runs``."""

from __future__ import annotations

from pathlib import Path

import click

from ..terminal import clean, echo
from .options import db_option, lake_option, open_source, dumps, json_option


@click.command()
@db_option
@lake_option
@json_option
def runs(db: str, lake: Path | None, as_json: bool) -> None:
    """List runs: engine, model, request and iteration counts, duration."""
    from .. import store

    con = open_source(db, lake, None, store.always)
    rows = con.execute(
        "select r.run_id, r.engine, r.model, s.requests, s.iterations, s.duration_s "
        "from runs r left join run_summary s using (run_id) order by r.run_id"
    ).fetchall()
    cols = ("run_id", "engine", "model", "requests", "iterations", "duration_s")
    if as_json:
        echo(dumps([dict(zip(cols, r)) for r in rows]))
        return
    if not rows:
        echo("no runs; ingest a trace with `tracelat ingest FILE`")
        return
    # columns as wide as their longest value: long run ids and model names must not run together
    table = [cols] + [
        (r[0], r[1] or "-", r[2] or "-", str(r[3] or 0), str(r[4] or 0), "-" if r[5] is None else f"{r[5]:.2f}")
        for r in rows
    ]
    # one line per run: a newline in a model name (from a log) must not forge a row
    table = [tuple(" ".join(clean(str(v)).split()) for v in row) for row in table]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    for cells in table:
        echo("  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip())
