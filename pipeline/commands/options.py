"""Click options shared by several commands."""

from __future__ import annotations

import click

from ..jsonplain import dumps  # noqa: F401  (re-exported for the commands)

db_option = click.option(
    "--db",
    envvar="TRACELAT_DB",
    default="tracelat.duckdb",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="DuckDB store file (also $TRACELAT_DB).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")

