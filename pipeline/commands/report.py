"""``tracelat report``."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import writing
from ..terminal import echo, inline
from .options import db_option, lake_option, open_source, dumps, json_option


@click.command()
@click.argument("run_id")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Output folder (default reports/<run_id>/).",
)
@click.option(
    "--slo",
    "slo_path",
    type=click.Path(path_type=Path),
    help="SLO file (TOML) whose verdict, goodput and fluidity the report shows.",
)
@click.option(
    "--calibrate",
    "calibrate_seeds",
    type=click.IntRange(min=1),
    is_flag=False,
    flag_value=3,
    default=None,
    metavar="[SEEDS]",
    help="Add the replay calibration: the run replayed under its recorded policy (SEEDS seeds, 3 when "
    "not given), observed vs replayed TTFT/TPOT/ITL/E2E/queueing with bias and a verdict. Costs a "
    "fit and the replays, so it is off by default.",
)
@db_option
@lake_option
@json_option
def report(
    run_id: str,
    out_dir: Path | None,
    slo_path: Path | None,
    calibrate_seeds: int | None,
    db: str,
    lake: Path | None,
    as_json: bool,
) -> None:
    """Write DIR/index.html (offline, self-contained), summary.json and summary.md for RUN_ID.

    The HTML has the headline numbers, iteration time over the run with spikes,
    iteration time vs context with the fitted line, TTFT/TPOT/ITL CDFs, tail
    attribution, queue depth and KV usage, and the top offending iterations and
    requests.  Large runs are aggregated for plotting; each chart says how.
    """
    from ..report import write_report

    from ..fit import fit_ready

    con = open_source(db, lake, [run_id], fit_ready(run_id))
    with writing("--out", out_dir or "the report folder"):
        html = write_report(con, run_id, out_dir, slo=slo_path, calibrate_seeds=calibrate_seeds)
    files = {
        "html": str(html),
        "summary_json": str(html.with_name("summary.json")),
        "summary_md": str(html.with_name("summary.md")),
        "html_bytes": html.stat().st_size,
    }
    if as_json:
        echo(dumps(files))
    else:
        echo(f"report: {inline(html)} ({files['html_bytes'] / 1e6:.2f} MB), summary.json and summary.md next to it")
    if calibrate_seeds:  # asked for: say when it could not be done, not only inside the page
        import json

        cal = json.loads(html.with_name("summary.json").read_text()).get("replay_calibration") or {}
        if not cal.get("available"):
            echo(f"warning: no replay calibration for this run: {cal.get('reason', 'not available')}", err=True)
