"""``tracelat audit``."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import CheckFailed, InputError, writing
from ..terminal import echo
from .junit_error import JunitOnUsageError, junit_on_error
from .options import db_option, lake_option, open_source, dumps, json_option


@click.command(cls=JunitOnUsageError)
@click.argument("run_id")
@click.option(
    "--slo", "slo_path", required=True, type=click.Path(path_type=Path), help="SLO file (TOML; see examples/slo.toml)."
)
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write JUnit XML here (one testcase per SLO).",
)
@click.option(
    "--markdown",
    "md_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the Markdown verdict here.",
)
@click.option("--nightly", is_flag=True, help="Print the Markdown verdict (for a nightly job's log or comment).")
@db_option
@lake_option
@json_option
def audit(
    run_id: str,
    slo_path: Path,
    junit_path: Path | None,
    md_path: Path | None,
    nightly: bool,
    db: str,
    lake: Path | None,
    as_json: bool,
) -> None:
    """Check RUN_ID against the SLOs in --slo: percentile limits, goodput, fluidity index.

    \b
    Exit codes: 0 every SLO holds, 1 at least one is violated,
    2 usage or data error (bad SLO file, unknown run, an SLO that the run's
    data cannot evaluate, such as itl_ms without token times). Such an SLO is
    an <error> testcase of --junit; any other exit 2 rewrites --junit with
    the error, so CI never shows an earlier run's file.
    """
    from .. import audit as aud
    from .. import store

    # exit 2 here (a bad SLO file, an unknown run, an output not written) rewrites --junit with the error:
    # CI must not show an earlier run's passing file.  An SLO the run cannot evaluate (exit 2
    # below) is an <error> of the audit's own file, written here.
    with junit_on_error(junit_path, "audit"):
        spec = aud.load_slo(slo_path)
        spec.require_checks()
        con = open_source(db, lake, [run_id], store.always)
        result = aud.audit(con, run_id, spec)
        if junit_path:
            with writing("--junit", junit_path):
                junit_path.parent.mkdir(parents=True, exist_ok=True)
                junit_path.write_bytes(aud.junit_xml(result))
        md = aud.markdown_report(result)
        if md_path:
            with writing("--markdown", md_path):
                md_path.parent.mkdir(parents=True, exist_ok=True)
                md_path.write_text(md, encoding="utf-8")
    # printed after: a reader that closes the pipe early (`| head`) does not undo a --junit written
    if as_json:
        echo(dumps(result.to_dict()))
    else:
        echo(md if nightly else aud.text_report(result))
    if result.exit_code == 2:
        # exit 2 wins (the verdict is incomplete), but the violations found are said with it
        violated = [c.name for c in result.checks if c.status == "fail"]
        raise InputError(
            f"run {run_id}: the run's data cannot evaluate {result.errors} SLO(s): "
            + ", ".join(c.name for c in result.checks if c.status == "error")
            + (f"; and {len(violated)} SLO(s) violated: {', '.join(violated)}" if violated else "")
        )
    if result.exit_code:
        raise CheckFailed(
            f"run {run_id}: {result.failures} SLO(s) violated: "
            + ", ".join(c.name for c in result.checks if c.status == "fail")
        )
