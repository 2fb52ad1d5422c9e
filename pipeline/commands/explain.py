"""``tracelat explain``: which parts of a latency grow in the p99 tail, and who caused it."""

from __future__ import annotations

from pathlib import Path

import click

from ..terminal import echo
from .options import db_option, lake_option, open_source, dumps, json_option


@click.command()
@click.argument("run_id")
@click.option(
    "--metric",
    type=click.Choice(["ttft", "tpot", "e2e"]),
    default="ttft",
    show_default=True,
    help="Latency metric to explain.",
)
@click.option(
    "--from",
    "t_from",
    help="Only requests arriving at or after this time: seconds since the run's "
    "start, @<clock seconds>, or (unix clocks) HH:MM[:SS] (on the run's day, or the next for a "
    "run over midnight) / ISO date-time, read in the zone of the log's stamps (--tz at ingest; "
    "UTC for logs with epoch or zoned stamps); an ISO date-time may name its zone (Z, +02:00).",
)
@click.option("--to", "t_to", help="Only requests arriving at or before this time (same forms as --from).")
@click.option(
    "--limit", type=click.IntRange(min=1), default=10, show_default=True, help="Top steps and requests to list."
)
@db_option
@lake_option
@json_option
def explain(run_id: str, metric: str, t_from, t_to, limit: int, db: str, lake: Path | None, as_json: bool) -> None:
    """Attribute the tail of METRIC in RUN_ID to causes (docs/model-and-attribution.md).

    Each request's latency is split into waiting (head-of-line vs capacity), own
    prefill, decode baseline, prefill interference, preemption and unexplained
    stalls; the parts that grow from the median group (p40-p60) to the >= p99
    group are reported as shares summing to 100%, with the steps and requests
    that hurt most. Uses the stored fit (computed now if missing or stale).
    """
    import math

    from ..fit import explain as run_explain
    from ..fit import fit_ready, get_or_fit, parse_time
    from ..fit.attribution import check_window
    from ..fit.text import format_explain

    con = open_source(db, lake, [run_id], fit_ready(run_id))
    get_or_fit(con, run_id)
    lo = parse_time(t_from, con, run_id, -math.inf)
    hi = parse_time(t_to, con, run_id, math.inf)
    check_window(con, run_id, lo, hi, t_from, t_to)
    result = run_explain(con, run_id, metric, lo, hi, limit)
    echo(dumps(result) if as_json else format_explain(result))
