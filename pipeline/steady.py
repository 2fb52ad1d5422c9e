"""The summary's ``steady_state`` section: throughput in the run's steady window, and its peak.

A whole-run rate (``throughput.output_tokens_per_s``) mixes ramp-up, drain and bursts; the
iteration-time claim "system throughput = effective batch size / iteration time" holds for
a steady load. The rule (``pipeline.metrics.STEADY``) and formulas (the registry's
``steady_state`` metrics) are written down once in :mod:`pipeline.metrics`; the numbers come
from one DuckDB query (``queries/summary/steady_state.sql``), computed when asked for, not
stored: it reads the run's token times, so a store would pay for it on every ingest
(about 0.3 s on a 1M-step trace with 8.8M token times, docs/metrics.md). A span that is
mostly empty (a clock jump) is windowed again over its busy stretch: a second query.
"""

from __future__ import annotations

import math
from typing import Any

import duckdb

from . import store
from .metrics import REGISTRY, STEADY, STEADY_TABLE

# the registry's figures of the query (steady and peak rates) at the section's top level,
# the iteration-time identity's in its "identity" object with the step counts it rests on
_IDENTITY_FIGURES = ("batch_per_iteration_tokens_per_s", "step_decode_tokens_per_s")
FIGURES = tuple(m.name for m in REGISTRY if m.table == STEADY_TABLE and m.name not in _IDENTITY_FIGURES)
IDENTITY = ("steps", "batch_decode_tokens_mean", "iteration_ms_mean", "busy_share", *_IDENTITY_FIGURES)


def _query(con: duckdb.DuckDBPyConnection, run_id: str, t0: float | None, t1: float | None) -> dict[str, Any] | None:
    sql = store.query_text("summary/steady_state")
    cur = con.execute(sql, store.bind(sql, STEADY.params() | {"run_id": run_id, "t0": t0, "t1": t1}))
    rows = cur.fetchall()
    if not rows:
        return None
    return {d[0]: (None if isinstance(v, float) and v != v else v) for d, v in zip(cur.description, rows[0])}


def whole_run_se(con: duckdb.DuckDBPyConnection, run_id: str) -> float | None:
    """The batch-means standard error of the run's whole-span output rate (tokens / span) over the
    span's windows (``run_output_tokens_per_s_se``); None without a span or when the windows drift."""
    r = _query(con, run_id, None, None)
    return None if r is None else r["run_output_tokens_per_s_se"]


def _reason(r: dict[str, Any]) -> str | None:
    """Why the run has no steady state (None when it has one)."""
    if r["reached"]:
        return None
    if not r["busy_windows"]:
        if r["source"] == "iterations":
            return "no step has a time and decode_tokens"
        return "no ok request has output tokens with a time (token_times, t_first_token or t_finish)"
    unit = "steps'" if r["source"] == "iterations" else "requests'"
    if r["noise"] > STEADY.max_noise:
        return (
            f"too short to tell: its {r['windows']} windows hold about {1 / r['noise'] ** 2:.1f} {unit} worth of "
            f"tokens each (counting noise ±{r['noise']:.0%} a window), fewer than {1 / STEADY.max_noise**2:.0f}"
        )
    level = f"the load's level ({r['level_tokens_per_s']:.4g} tokens/s)"
    if r["steady_windows"] is None:
        return f"no window's rate is within ±{STEADY.edge_share * r['band']:.0%} of {level}: the load never holds"
    a, b = r["steady_start_s"], r["steady_end_s"]
    if r["steady_windows"] < r["min_span"] * r["busy_span_windows"]:
        return (
            f"the rate is within ±{STEADY.edge_share * r['band']:.0%} of {level} over {r['steady_windows']} of the "
            f"{r['busy_span_windows']} windows with load only ({a:.1f}..{b:.1f} s), less than "
            f"{r['min_span']:.0%} of them: a ramp or a burst, the load never holds"
        )
    return (
        f"from the first to the last window within ±{STEADY.edge_share * r['band']:.0%} of {level} ({a:.1f}..{b:.1f} s), only "
        f"{r['in_band_windows']} of its {r['steady_windows']} windows are within ±{r['band']:.0%} of it "
        f"(less than {STEADY.min_in_band_share:.0%}): bursts or idle gaps, no steady load"
    )


def _secs(t: float, span: float) -> str:
    """``t`` seconds to four significant digits of ``span``: 0.0469999 of a 0.047 s span is 0.04700,
    12345.678 of a day is 12346 (a float's last bits are no information)."""
    digits = 3 - math.floor(math.log10(span)) if span > 0 else 3
    return f"{t:.{max(digits, 0)}f}"


def section(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """``{"steady_state": {...}}``: always present; ``reached`` false with a ``reason`` when there is none."""
    r = _query(con, run_id, None, None)
    if r is None:
        return {"steady_state": {"reached": False, "reason": "the run has no time span (duration_s is 0 or unknown)"}}
    start, span_note, offset, share = r["span_t0"], None, 0.0, 1.0
    w, n = r["window_s"], r["windows"]
    if r["busy_windows"] and r["stretch_end_s"] - r["stretch_start_s"] < STEADY.empty_span_share * n * w:
        # a span that is mostly empty (a clock jump, a long idle tail): window its busy stretch
        a, b = r["stretch_start_s"], r["stretch_end_s"]
        r2 = _query(con, run_id, start + a, start + b)
        if r2 is not None and r2["busy_windows"]:
            share = r2["tokens"] / r["tokens"]
            left_out = round(r["tokens"] - r2["tokens"])
            held = (
                f"{share:.1%} of its tokens"
                if share < 0.999
                else f"all but {left_out} of its {round(r['tokens'])} tokens"
                if left_out
                else "all its tokens"
            )
            span_note = (
                f"the run's {_secs(n * w, n * w)} s span is mostly empty (a clock jump or a long idle gap?): "
                f"{held} fall in {_secs(a, b - a)}..{_secs(b, b - a)} s from the start, which the windows cover"
            )
            r, offset = r2, a
            w = r["window_s"]
    elif r["busy_windows"] and r["busy_windows"] < STEADY.empty_span_share * r["busy_span_windows"]:
        span_note = (
            f"the run's {_secs(n * w, n * w)} s span is mostly empty (a clock jump or long idle gaps?): only "
            f"{r['busy_windows']} of the {r['busy_span_windows']} windows of {w:.4g} s from its first "
            f"to its last token hold any"
        )
    reached = bool(r["reached"])
    peak_start = r["peak_window_start_s"]
    out: dict[str, Any] = {
        "source": r["source"],
        "window_s": w,
        "windows": r["windows"],
        "busy_windows": r["busy_windows"],
        "span_note": span_note,
        "counting_noise": r["noise"],
        "band": r["band"],
        "level_tokens_per_s": r["level_tokens_per_s"],
        "reached": reached,
        "reason": _reason(r),
        "steady_window_s": [offset + r["steady_start_s"], offset + r["steady_end_s"]] if reached else None,
        "steady_span_s": r["steady_end_s"] - r["steady_start_s"] if reached else None,
        "in_band_share": r["in_band_windows"] / r["steady_windows"] if reached else None,
        **{m: r[m] for m in FIGURES},
        "steady_token_share": r["steady_token_share"] * share if reached else None,
        "peak_window_s": [offset + peak_start, offset + peak_start + w] if peak_start is not None else None,
        "identity": {k: r[k] for k in IDENTITY} if reached and r["steps"] else None,
        "uncertainty": _uncertainty(r) if reached else None,
    }
    return {"steady_state": out}


def _uncertainty(r: dict[str, Any]) -> dict[str, Any]:
    """The steady rates' standard errors and edge allowances (rule: ``STEADY``, "Uncertainty"),
    with why there is no standard error when there is none."""
    out: dict[str, Any] = {
        "windows": r["steady_windows"],
        "lag1_autocorrelation": r["steady_lag1_autocorrelation"],
        **{f"{k}_{part}": r[f"steady_{k}_{part}"] for k in _RATES for part in ("se", "edge")},
        "no_interval": None,
    }
    if r["steady_output_tokens_per_s_se"] is None:
        rho = r["steady_lag1_autocorrelation"]
        out["no_interval"] = (
            f"the steady window has {r['steady_windows']} windows, fewer than {STEADY.min_interval_windows}"
            if r["steady_windows"] < STEADY.min_interval_windows
            else f"its window rates drift (lag-1 autocorrelation {rho:.2f} > {STEADY.max_lag1})"
        )
    return out


_RATES = ("output_tokens_per_s", "requests_per_s")


def half_widths(st: dict[str, Any], confidence: float = 0.95) -> dict[str, float | None]:
    """``{rate: half-width}`` of the steady rates' intervals: Student t on the steady windows
    times the SE, plus the edge allowance (``STEADY``, "Uncertainty"); None without an SE."""
    u = st.get("uncertainty") or {}
    if u.get("output_tokens_per_s_se") is None:
        return dict.fromkeys(_RATES)
    from scipy.stats import t as student_t

    q = float(student_t.ppf(0.5 + confidence / 2, u["windows"] - 1))
    return {
        k: None if u[f"{k}_se"] is None or u[f"{k}_edge"] is None else q * u[f"{k}_se"] + u[f"{k}_edge"] for k in _RATES
    }


def _n(v: Any, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def format_lines(s: dict[str, Any]) -> list[str]:
    """The text summary's lines for the section (none when the summary has no section)."""
    st = s.get("steady_state")
    if not st:
        return []
    peak = f"; peak {_n(st.get('peak_output_tokens_per_s'))} tokens/s" if st.get("peak_output_tokens_per_s") else ""
    note = [f"  note: {st['span_note']}"] if st.get("span_note") else []
    if not st["reached"]:
        return [f"steady state: none ({st['reason']}){peak}", *note]
    a, b = st["steady_window_s"]
    lines = [
        f"steady state ({st['source']}, {st['windows']} windows of {st['window_s']:.4g} s): "
        f"{_n(st['steady_output_tokens_per_s'])} output tokens/s, {_n(st['steady_requests_per_s'], 3)} requests/s "
        f"over {a:.1f}..{b:.1f} s from the start ({st['steady_token_share']:.0%} of the tokens){peak}"
    ]
    half = half_widths(st)
    if half["output_tokens_per_s"] is not None:
        req = f", ±{half['requests_per_s']:.3f} requests/s" if half["requests_per_s"] is not None else ""
        lines.append(
            f"  95% interval: ±{half['output_tokens_per_s']:.1f} output tokens/s{req} "
            f"(batch means over {st['uncertainty']['windows']} windows, plus the edges' allowance)"
        )
    elif st.get("uncertainty"):
        lines.append(f"  no interval: {st['uncertainty']['no_interval']}")
    i = st.get("identity")
    if i:
        lines.append(
            f"  batch / iteration time: {i['batch_decode_tokens_mean']:.2f} decode tokens per step / "
            f"{i['iteration_ms_mean']:.3f} ms = {_n(i['batch_per_iteration_tokens_per_s'])} tokens/s while busy; "
            f"busy {i['busy_share']:.1%} of the window: {_n(i['step_decode_tokens_per_s'])} decode tokens/s from steps"
        )
    return lines + note


def _interval_text(st: dict[str, Any]) -> str:
    half = half_widths(st)["output_tokens_per_s"]
    if half is None:
        return f"none: {(st.get('uncertainty') or {}).get('no_interval')}"
    v = st["steady_output_tokens_per_s"]
    return f"{v - half:.1f} .. {v + half:.1f} (±{half:.1f})"


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
            ("output tokens/s, steady state, 95% interval", _interval_text(st)),
            ("requests/s, steady state", st["steady_requests_per_s"]),
            ("steady window (s from start)", f"{a:.1f} .. {b:.1f} ({st['steady_token_share']:.0%} of the tokens)"),
        ]
        i = st.get("identity")
        if i:
            rows.append(("batch / iteration time (tokens/s while busy)", i["batch_per_iteration_tokens_per_s"]))
    elif st:
        rows.append(("steady state", f"none: {st['reason']}"))
    if st.get("span_note"):
        rows.append(("time span", st["span_note"]))
    if st.get("peak_output_tokens_per_s") is not None:
        rows.append((f"output tokens/s, peak {st['window_s']:.3g} s window", st["peak_output_tokens_per_s"]))
    return rows
