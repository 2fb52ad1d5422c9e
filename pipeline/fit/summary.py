"""The ``fit``, ``spikes`` and ``tail`` sections of ``tracelat summary --json`` (docs/reports-and-audit.md)."""

from __future__ import annotations

from typing import Any

import duckdb


def sections(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """Fit (stored, or computed now) of the run, summarised; ``{}`` for a run without steps."""
    from .attribution import tail_section
    from .run import get_or_fit

    fit = get_or_fit(con, run_id)
    if fit.n_iterations == 0:
        return {"fit": None, "spikes": None, "tail": tail_section(con, run_id)}
    spikes = {k: fit.spikes.get(k, 0) for k in ("count", "prefill", "preemption", "unexplained")}
    spikes["stall_detection_limit_ms"] = fit.stall_detection_limit_ms
    return {"fit": fit.summary_section(), "spikes": spikes, "tail": tail_section(con, run_id)}
