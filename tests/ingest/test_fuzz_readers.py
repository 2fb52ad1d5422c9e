"""DuckDB's line reader against the Python one (scripts/fuzz.py --readers): every damaged copy
of a line-based format's fixture gives the same store, or the same error, whichever read its
lines.  A file of its own, so that pytest-xdist runs it beside test_fuzz.py, not after it."""

from __future__ import annotations

import pytest

from .test_fuzz import fuzz


@pytest.mark.parametrize("fmt", fuzz.READER_FORMATS)
@pytest.mark.long
def test_duckdb_and_python_line_readers_agree_on_damaged_files(fmt, tmp_path):
    assert fuzz.readers_agree(fmt, 5, tmp_path, seed=0) == []


@pytest.mark.slow
@pytest.mark.parametrize("fmt", fuzz.READER_FORMATS)
def test_duckdb_and_python_line_readers_agree_many(fmt, tmp_path):
    assert fuzz.readers_agree(fmt, 25, tmp_path, seed=1) == []
