"""``tracelat summary``."""

from __future__ import annotations

import click

from ..terminal import echo
from .options import db_option, dumps, json_option


@click.command()
@click.argument("run_id")
@db_option
@json_option
def summary(run_id: str, db: str, as_json: bool) -> None:
    """Latency summary of RUN_ID: TTFT, TPOT, ITL, E2E, queueing, iteration time.

    --json prints the summary.json structure (docs/reports-and-audit.md; all times in ms).
    """
    from .. import metrics, store

    from ..fit import fit_ready

    con = store.open_for_reading(db, read_only_if=fit_ready(run_id))
    s = metrics.summary(con, run_id)
    echo(dumps(s) if as_json else metrics.format_summary(s))
