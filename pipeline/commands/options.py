"""Click options shared by several commands."""

from __future__ import annotations

import json
from typing import Any

import click

from ..jsonplain import plain

db_option = click.option(
    "--db",
    envvar="TRACELAT_DB",
    default="tracelat.duckdb",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="DuckDB store file (also $TRACELAT_DB).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")


def dumps(obj: Any) -> str:
    """Strict JSON (NaN/inf become null) with stable key order."""
    return json.dumps(plain(obj), indent=2, default=str)
