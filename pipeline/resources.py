"""Where the files that live outside the package are found: queries, demo trace, example SLO.

In a checkout (and an editable install) they sit at the top of the repository
(``queries/``, ``fixtures/demo/``, ``examples/``), the layout the project documents.
A wheel cannot ship top-level folders next to the package, so the build copies
them into the package as ``pipeline/_queries``, ``pipeline/_fixtures/demo`` and
``pipeline/_examples`` (pyproject.toml, ``force-include``).  The packaged copy is
preferred when present: in an installed wheel the folder above the package is
``site-packages``, where a ``queries/`` of some other project might sit.

This module imports nothing but pathlib, so the CLI may use it for help text.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
CHECKOUT = PACKAGE.parent


def _locate(packaged: str, checkout: str) -> Path:
    """The packaged copy if the wheel installed one, else the checkout's folder.

    Returns the checkout path even when neither exists, so that error messages
    name the place a developer would look; callers check for contents.
    """
    inside = PACKAGE / packaged
    return inside if inside.exists() else CHECKOUT / checkout


QUERIES_DIR = _locate("_queries", "queries")
DEMO_DIR = _locate("_fixtures/demo", "fixtures/demo")
EXAMPLES_DIR = _locate("_examples", "examples")
DEMO_TRACE = DEMO_DIR / "incident.jsonl.gz"
EXAMPLE_SLO = EXAMPLES_DIR / "slo.toml"
