"""``tracelat check``."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import CheckFailed
from ..terminal import echo, inline
from .options import db_option, lake_option, open_source, dumps, json_option


@click.command()
@click.argument("run_id", metavar="RUN")
@db_option
@lake_option
@json_option
def check(run_id: str, db: str, lake: Path | None, as_json: bool) -> None:
    """Check RUN against tracelat's invariants; exit 1 when any is broken.

    Each rule is a query in queries/checks/ that returns the rows breaking it: TTFT =
    queueing + prefill, token times in order and starting at the first token, steps that
    end after they start, tail-attribution parts that add up to each latency (the run
    is fitted first when it has no stored fit, as summary does), ingest line counts that
    add up. The first rows of each violation are shown.
    """
    from .. import store
    from ..check import run_checks

    from ..errors import TracelatError
    from ..fit import fit_ready, get_or_fit

    # fit when no fit is stored (as summary and explain do), so that the attribution is checked
    # whichever command ran before; a lake keeps no fit between commands
    con = open_source(db, lake, [run_id], fit_ready(run_id))
    store.require_run(con, run_id)

    try:
        get_or_fit(con, run_id)
    except TracelatError:
        pass  # a run that cannot be fitted: its attribution check says it was skipped
    results = run_checks(con, run_id)
    bad = [r for r in results if r.violations]
    if as_json:
        echo(dumps([r.__dict__ for r in results]))
    else:
        for r in results:
            state = (
                f"skipped ({r.skipped})" if r.skipped else ("ok" if not r.violations else f"{r.violations} violations")
            )
            echo(f"{r.name:<28}{state}")
            for ex in r.examples:
                echo(
                    f"    {ex.get('problem')}: "
                    + ", ".join(f"{k}={inline(v)}" for k, v in ex.items() if k != "problem")
                )
    if bad:
        raise CheckFailed(f"run {run_id}: {len(bad)} invariant(s) broken: " + ", ".join(r.name for r in bad))
