"""Click options shared by several commands."""

from __future__ import annotations

import json
import math
from typing import Any

import click

db_option = click.option(
    "--db",
    envvar="TRACELAT_DB",
    default="tracelat.duckdb",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="DuckDB store file (also $TRACELAT_DB).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")


def _finite(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def dumps(obj: Any) -> str:
    """Strict JSON (NaN/inf become null) with stable key order."""
    return json.dumps(_finite(obj), indent=2, default=str)
