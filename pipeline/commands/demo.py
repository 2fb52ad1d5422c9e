"""``tracelat demo``: the main job end to end on bundled (or freshly simulated) data."""

from __future__ import annotations

from pathlib import Path

import click

from ..resources import DEMO_TRACE as BUNDLED
from ..resources import EXAMPLE_SLO
from ..terminal import echo
from .options import db_option

SIMULATED = "demo-simulated"


@click.command()
@db_option
@click.option(
    "--trace",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Trace to analyse (default: the bundled simulated incident, fixtures/demo/incident.jsonl.gz).",
)
@click.option(
    "--simulate",
    "fresh",
    is_flag=True,
    help="Simulate a new incident (a random seed, printed) as run demo-simulated, replacing the last one, "
    "instead of using the bundled trace.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Report folder (default reports/<run_id>/).",
)
@click.option("--open", "open_report", is_flag=True, help="Open the HTML report in a browser when done.")
def demo(db: str, trace: Path | None, fresh: bool, out: Path | None, open_report: bool) -> None:
    """Ingest a trace, summarise it and write the HTML report.

    Without options it uses the bundled trace: a simulated steady load with a
    burst of very long prompts (an incident), with known ground truth.  The
    report is checked against examples/slo.toml.
    """
    from .. import ingest, store
    from ..summary import format_summary, summary
    from ..errors import InputError
    from ..ingest import reader

    if fresh:
        import secrets

        from ..fixtures_gen import make_incident

        # its own run id, replaced each time: the same id as the bundled run would make every
        # step of the new trace a duplicate of the stored run's
        seed = secrets.randbelow(2**31)
        trace = make_incident(Path(db).with_suffix("").parent / f"{SIMULATED}.jsonl.gz", seed=seed, run_id=SIMULATED)
        echo(f"simulated {trace} (seed {seed})")
    if trace is None:
        if not BUNDLED.exists():
            raise InputError(
                f"the bundled demo trace {BUNDLED} is missing: the installation is incomplete; "
                "reinstall tracelat, or pass --trace FILE or --simulate"
            )
        trace = BUNDLED
    con = store.connect(db)
    for res in ingest.ingest_paths(con, [trace], replace=fresh):
        echo(res.line())
    store.build_derived(con)
    # the run of THIS trace (it may have been ingested earlier, so not the latest ingest)
    run_id = con.execute(
        "select run_ids[1] from ingests where sha256 = ? order by ingest_id desc limit 1", [reader.sha256(trace)]
    ).fetchall()[0][0]
    echo("")
    echo(format_summary(summary(con, run_id)))
    from ..report import write_report

    slo = EXAMPLE_SLO if EXAMPLE_SLO.exists() else None
    from ..errors import writing

    with writing("--out", out or "the report folder"):
        index = write_report(con, run_id, out, slo=slo)
    echo(f"\nreport: {index}")
    if open_report and click.launch(str(index)) != 0:
        echo("no browser could be started here; open the report file above in one", err=True)
