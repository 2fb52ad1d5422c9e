"""The static format list (help text) and the ingestor registry (detection) agree."""

from __future__ import annotations

import re

from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.formats import FORMATS
from pipeline.ingest import INGESTORS, _load_plugins


def test_static_format_list_equals_registered_ingestors():
    _load_plugins()
    # names, detection order and descriptions: the help lists formats in the order tried
    assert list(FORMATS) == [(name, ing.description) for name, ing in INGESTORS.items()]


def test_ingest_help_lists_every_format():
    out = CliRunner().invoke(cli, ["ingest", "--help"]).output
    listed = out.split("Formats (--format NAME):", 1)[1]
    for name, description in FORMATS:
        # name, then the description after the column's padding
        assert re.search(rf"^\s+{re.escape(name)}\s+{re.escape(description)}$", listed, re.M), name
