"""Helpers shared by the ingest tests."""

from __future__ import annotations

from pathlib import Path

from pipeline import ingest, store


def load(con, *paths, **kw):
    """Ingest files as the CLI does, then build the derived tables; the per-file results."""
    res = ingest.ingest_paths(con, [Path(p) for p in paths], **kw)
    store.build_derived(con)
    return res
