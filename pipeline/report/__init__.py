"""Reports: a self-contained offline HTML page, summary.json and summary.md per run,
and the comparison page of two runs.

``write_report(con, run_id, out_dir=None, slo=None) -> Path`` is the entry point
(``tracelat report`` and ``tracelat demo`` call it).  :mod:`.frames` reduces data in
DuckDB, :mod:`.charts` turns frames into Altair charts (pure), :mod:`.page`
assembles the HTML, :mod:`.escape` keeps strings from logs inert.
"""

from __future__ import annotations

from .render import default_out_dir, write_report

__all__ = ["default_out_dir", "write_report"]
