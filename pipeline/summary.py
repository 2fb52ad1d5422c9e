"""A run's ``summary.json``: the registry's statistics plus the sections later stages add.

It sits above :mod:`pipeline.metrics` (which must not import the fit) and below the
commands, report, nightly and fleet that print or store it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import duckdb

from . import steady, store
from .metrics import METRICS, metric_stats, run_info, run_metadata

# Analyses beyond the registry's statistics (steady state, model fit, spikes, tail
# attribution, engine gauges) add summary sections here: each provider returns
# {section_name: value} or {} when it has nothing to say.
SectionProvider = Callable[[duckdb.DuckDBPyConnection, str], dict[str, Any]]
SECTION_PROVIDERS: list[SectionProvider] = [steady.section]  # throughput in the steady window, the peak


def _fit_sections(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    from .fit.summary import sections  # imported on use: scipy stays out of `tracelat --help`

    return sections(con, run_id)


SECTION_PROVIDERS.append(_fit_sections)


def _engine_metric_sections(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    from .engine_metrics import section

    return section(con, run_id)


SECTION_PROVIDERS.append(_engine_metric_sections)


def summary(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """The ``summary.json`` structure (docs/reports-and-audit.md) for one run (derived tables must be built)."""
    store.require_run(con, run_id)
    info = run_info(con, run_id)
    stats = metric_stats(con, run_id)
    out: dict[str, Any] = {
        "run_id": run_id,
        "requests": info.get("requests", 0),
        "requests_ok": info.get("requests_ok", 0),
        "requests_failed": info.get("requests_failed", 0),
        "iterations": info.get("iterations", 0),
        "duration_s": info.get("duration_s"),
        "run": run_metadata(con, run_id),
    }
    for m in METRICS:
        out[m] = stats[m]
    out["throughput"] = {
        "output_tokens_per_s": info.get("output_tokens_per_s"),
        "requests_per_s": info.get("requests_per_s"),
        "source": info.get("throughput_source"),
    }
    for provider in SECTION_PROVIDERS:
        out.update(provider(con, run_id))
    return out


def format_summary(s: dict[str, Any]) -> str:
    """A compact human table of a summary."""

    def num(v: Any, digits: int = 2) -> str:
        if v is None:
            return "-"
        if isinstance(v, int):
            return str(v)
        return f"{v:.{digits}f}"

    lines = [
        f"run {s['run_id']}: {s['requests']} requests ({s['requests_failed']} failed), "
        f"{s['iterations']} iterations, {num(s['duration_s'], 3)} s",
        f"throughput: {num(s['throughput']['output_tokens_per_s'], 1)} output tokens/s, "
        f"{num(s['throughput']['requests_per_s'], 3)} requests/s",
    ]
    lines += steady.format_lines(s)
    from .ingest.align import source_lines

    # the ingest's warning scrolls away; the run's sources on two clocks change what it can answer
    meta = (s.get("run") or {}).get("meta") or {}
    lines += [f"warning: {text}" for bad, text in source_lines(str(s["run_id"]), meta) if bad]
    lines += [
        "",
        f"{'metric':<14}{'count':>9}" + "".join(f"{k:>10}" for k in ("p50", "p90", "p99", "p999", "mean", "max")),
    ]
    for m in METRICS:
        st = s[m]
        if not st.get("count"):
            continue
        lines.append(
            f"{m:<14}{st['count']:>9}"
            + "".join(f"{num(st[k]):>10}" for k in ("p50", "p90", "p99", "p999", "mean", "max"))
        )
    if s["iteration_ms"].get("cv") is not None:
        lines.append(f"iteration time coefficient of variation: {s['iteration_ms']['cv']:.3f}")
    from .engine_metrics import format_lines

    lines += format_lines(s)
    return "\n".join(lines)
