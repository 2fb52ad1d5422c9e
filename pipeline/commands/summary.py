"""``tracelat summary``."""

from __future__ import annotations

from pathlib import Path

import click

from ..terminal import echo
from .options import db_option, lake_option, open_source, dumps, json_option


@click.command()
@click.argument("run_id")
@db_option
@lake_option
@json_option
def summary(run_id: str, db: str, lake: Path | None, as_json: bool) -> None:
    """Latency summary of RUN_ID: TTFT, TPOT, ITL, E2E, queueing, iteration time.

    --json prints the summary.json structure (docs/reports-and-audit.md; all times in ms).
    """
    from .. import summary as run_summary

    from ..fit import fit_ready

    con = open_source(db, lake, [run_id], fit_ready(run_id))
    s = run_summary.summary(con, run_id)
    echo(dumps(s) if as_json else run_summary.format_summary(s))
