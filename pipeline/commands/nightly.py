"""``tracelat nightly``."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import CheckFailed
from ..settings import finite_float
from ..terminal import echo, inline

from .junit_error import JunitOnUsageError, junit_on_error
from .options import dumps, json_option


def _labels(value: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` items; parsed in the command (not a click callback) so that a bad one
    still rewrites the --junit file with an error."""
    out = []
    for item in value:
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="'--label'")
        out.append((key.strip(), val))
    return tuple(out)


@click.command(cls=JunitOnUsageError)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--history",
    "history",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="History folder (created): history.duckdb and one run store per night.",
)
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="KEY=VALUE",
    help="Label tonight's run (date=YYYY-MM-DD orders the nights; commit=..., anything). Repeatable, each key once.",
)
@click.option(
    "--slo",
    "slo_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="SLO file (TOML; see examples/slo.toml): audited every night, goodput added to the history.",
)
@click.option(
    "--baseline",
    default="auto",
    show_default=True,
    metavar="auto|NIGHT",
    help="Night to compare with; auto: the latest night since the last change point that passed its SLOs.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the trend page (index.html) and tonight's report (default HISTORY/reports).",
)
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write JUnit XML here: the SLO audit (with --slo) and one change-point check per statistic.",
)
@click.option("--run-id", help="Night id (default: the date, then DATE.2, DATE.3 for more nights that day).")
@click.option("--format", "fmt", help="Skip format detection (see `tracelat ingest --help`).")
@click.option(
    "--min-change",
    default=0.05,
    show_default=True,
    type=finite_float(0, None),
    help="A change point for the worse fails the night when it is at least this large (0.05 = 5%).",
)
@json_option
def nightly(
    paths: tuple[Path, ...],
    history: Path,
    labels: tuple[str, ...],
    slo_path: Path | None,
    baseline: str,
    out_dir: Path | None,
    junit_path: Path | None,
    run_id: str | None,
    fmt: str | None,
    min_change: float,
    as_json: bool,
) -> None:
    """One command per night: ingest PATHS as tonight's run, add it to the history in
    --history, write its report, audit the SLOs, compare with a baseline, detect
    change points over the whole history and render the trend page.

    PATHS are the files of one run; records that name no run get the night's
    id. Files of one format that `tracelat ingest` reads as several runs (two
    AIPerf exports, one per concurrency) fail the night: record each run in a
    --history of its own.

    \b
    Exit codes: 0 fine; 1 an SLO is violated or a new change point for the
    worse (E-divisive means, permutation test) appeared tonight; 2 usage or
    data error: the night failed, the history is unchanged and no report of
    it is left (--out as it was).
    Re-running a night with the same files adds nothing to the history and
    reports the night as recorded: its SLO file, labels, baseline and
    --min-change of then, whatever this run gives (a warning names the options
    ignored; record it again in another --history). This run's options are
    still checked as for a new night: a bad one (an --slo file that is not
    there, a --baseline not in the history, a bad --label date=) exits 2.
    On exit 2, --junit is rewritten with the error, so CI never shows an older
    night's result.

    \b
    Example (cron or CI, once a night):
      tracelat nightly logs/ --history /data/nightly --slo slo.toml \\
          --label commit=$GIT_SHA --junit nightly.xml
    """
    from ..nightly.job import Options, run

    with junit_on_error(junit_path, "nightly"):  # the night failed: CI must not show the last night's file
        opts = Options(
            paths, history, _labels(labels), slo_path, baseline, out_dir, junit_path, run_id, fmt, min_change
        )
        outcome = run(opts)
    for note in outcome.notes:
        echo(note, err=True)
    if as_json:
        echo(dumps(outcome.to_dict()))
    else:
        echo(outcome.markdown.rstrip())
        echo(f"\ntrend: {inline(outcome.files['trend'])}\nreport: {inline(outcome.files['report'])}")
    if outcome.exit_code:
        failed = ", ".join(outcome.night.slo_failed)
        why = (
            [f"SLO {outcome.slo['verdict']}" + (f": {failed}" if failed else "")]
            if outcome.slo is not None and outcome.slo["verdict"] != "pass"
            else []
        )
        why += [f"a new change point for the worse in {c.metric}" for c in outcome.failing_changes]
        raise CheckFailed(f"night {outcome.night.run_id}: " + "; ".join(why))
