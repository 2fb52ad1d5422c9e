"""``tracelat runs``."""

from __future__ import annotations

import click

from ..terminal import echo
from .options import db_option, dumps, json_option


@click.command()
@db_option
@json_option
def runs(db: str, as_json: bool) -> None:
    """List runs: engine, model, request and iteration counts, duration."""
    from .. import store

    con = store.open_for_reading(db, read_only_if=store.always)
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
    echo(f"{'run_id':<32}{'engine':<16}{'model':<24}{'requests':>9}{'iterations':>11}{'duration_s':>11}")
    for r in rows:
        dur = "-" if r[5] is None else f"{r[5]:.2f}"
        echo(f"{r[0]:<32}{(r[1] or '-'):<16}{(r[2] or '-')[:23]:<24}{r[3] or 0:>9}{r[4] or 0:>11}{dur:>11}")
