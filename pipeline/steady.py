"""The summary's ``steady_state`` section: throughput in the run's steady window, and its peak.

A whole-run rate (``throughput.output_tokens_per_s``) mixes ramp-up, drain and bursts; the
iteration-time claim "system throughput = effective batch size / iteration time" holds for
a steady load. The rule (``pipeline.metrics.STEADY``) and formulas (the registry's
``steady_state`` metrics) are written down once in :mod:`pipeline.metrics`; the numbers come
from one DuckDB query (``queries/summary/steady_state.sql``), computed when asked for, not
stored: it reads the run's token times, so a store would pay for it on every ingest
(0.13 s on a 1M-step trace with 8.8M token times, docs/metrics.md).
"""

from __future__ import annotations

from typing import Any

import duckdb

from . import store
from .metrics import REGISTRY, STEADY, STEADY_TABLE

# the registry's figures of the query (steady and peak rates) at the section's top level,
# the iteration-time identity's in its "identity" object with the step counts it rests on
_IDENTITY_FIGURES = ("batch_per_iteration_tokens_per_s", "step_decode_tokens_per_s")
FIGURES = tuple(m.name for m in REGISTRY if m.table == STEADY_TABLE and m.name not in _IDENTITY_FIGURES)
IDENTITY = ("steps", "batch_decode_tokens_mean", "iteration_ms_mean", "busy_share", *_IDENTITY_FIGURES)


def _reason(r: dict[str, Any]) -> str | None:
    """Why the run has no steady state (None when it has one)."""
    if r["reached"]:
        return None
    if not r["busy_windows"]:
        if r["source"] == "iterations":
            return "no step has a time and decode_tokens"
        return "no ok request has output tokens with a time (token_times, t_first_token or t_finish)"
    band = f"within ±{STEADY.band:.0%} of the median rate ({r['median_tokens_per_s']:.4g} tokens/s)"
    if r["steady_windows"] is None:  # a median between two far-apart rates has no window near it
        return f"no window's rate is {band}: the load never holds"
    if r["steady_windows"] < STEADY.min_span_share * r["windows"]:
        return (
            f"the rate is {band} over {r['steady_windows']} of {r['windows']} windows only, "
            f"less than {STEADY.min_span_share:.0%} of the run: it never holds"
        )
    return (
        f"from the first to the last window {band}, only {r['in_band_windows']} of {r['steady_windows']} "
        f"windows are in that band (less than {STEADY.min_in_band_share:.0%}): bursts or idle gaps, no steady load"
    )


def section(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """``{"steady_state": {...}}``: always present; ``reached`` false with a ``reason`` when there is none."""
    cur = con.execute(
        store.query_text("summary/steady_state"),
        store.bind(store.query_text("summary/steady_state"), STEADY.params() | {"run_id": run_id}),
    )
    rows = cur.fetchall()
    if not rows:
        return {"steady_state": {"reached": False, "reason": "the run has no time span (duration_s is 0 or unknown)"}}
    r = {d[0]: (None if isinstance(v, float) and v != v else v) for d, v in zip(cur.description, rows[0])}
    w = r["window_s"]
    reached = bool(r["reached"])
    out: dict[str, Any] = {
        "source": r["source"],
        "window_s": w,
        "windows": r["windows"],
        "busy_windows": r["busy_windows"],
        "median_tokens_per_s": r["median_tokens_per_s"],
        "reached": reached,
        "reason": _reason(r),
        "steady_window_s": [r["steady_start_s"], r["steady_end_s"]] if reached else None,
        "steady_span_s": r["steady_end_s"] - r["steady_start_s"] if reached else None,
        "in_band_share": r["in_band_windows"] / r["steady_windows"] if reached else None,
        **{m: r[m] for m in FIGURES},
        "steady_token_share": r["steady_token_share"],
        "peak_window_s": (
            [r["peak_window_start_s"], r["peak_window_start_s"] + w] if r["peak_window_start_s"] is not None else None
        ),
        "identity": {k: r[k] for k in IDENTITY} if reached and r["steps"] else None,
    }
    return {"steady_state": out}


def _n(v: Any, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def format_lines(s: dict[str, Any]) -> list[str]:
    """The text summary's lines for the section (none when the summary has no section)."""
    st = s.get("steady_state")
    if not st:
        return []
    peak = f"; peak {_n(st.get('peak_output_tokens_per_s'))} tokens/s" if st.get("peak_output_tokens_per_s") else ""
    if not st["reached"]:
        return [f"steady state: none ({st['reason']}){peak}"]
    a, b = st["steady_window_s"]
    lines = [
        f"steady state ({st['source']}, {st['windows']} windows of {st['window_s']:.4g} s): "
        f"{_n(st['steady_output_tokens_per_s'])} output tokens/s, {_n(st['steady_requests_per_s'], 3)} requests/s "
        f"over {a:.1f}..{b:.1f} s from the start ({st['steady_token_share']:.0%} of the tokens){peak}"
    ]
    i = st.get("identity")
    if i:
        lines.append(
            f"  batch / iteration time: {i['batch_decode_tokens_mean']:.2f} decode tokens per step / "
            f"{i['iteration_ms_mean']:.3f} ms = {_n(i['batch_per_iteration_tokens_per_s'])} tokens/s while busy; "
            f"busy {i['busy_share']:.1%} of the window: {_n(i['step_decode_tokens_per_s'])} decode tokens/s from steps"
        )
    return lines


def report_rows(s: dict[str, Any]) -> list[tuple[str, Any]]:
    """(label, value) rows for the report's throughput table: whole run, steady window, peak."""
    st = s.get("steady_state") or {}
    rows: list[tuple[str, Any]] = [
        ("output tokens/s, whole run", s["throughput"].get("output_tokens_per_s")),
        ("requests/s, whole run", s["throughput"].get("requests_per_s")),
    ]
    if st.get("reached"):
        a, b = st["steady_window_s"]
        rows += [
            ("output tokens/s, steady state", st["steady_output_tokens_per_s"]),
            ("requests/s, steady state", st["steady_requests_per_s"]),
            ("steady window (s from start)", f"{a:.1f} .. {b:.1f} ({st['steady_token_share']:.0%} of the tokens)"),
        ]
        i = st.get("identity")
        if i:
            rows.append(("batch / iteration time (tokens/s while busy)", i["batch_per_iteration_tokens_per_s"]))
    elif st:
        rows.append(("steady state", f"none: {st['reason']}"))
    if st.get("peak_output_tokens_per_s") is not None:
        rows.append((f"output tokens/s, peak {st['window_s']:.3g} s window", st["peak_output_tokens_per_s"]))
    return rows
