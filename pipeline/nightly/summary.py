"""The Markdown summary of a night: verdict, what changed, when, by how much, and
which tail cause moved with it ("TPOT p99 +18% from night 2026-11-13; prefill
interference share (TPOT tail) 41% -> 63%").  Labels and ids are escaped
(:func:`pipeline.escape.md_text`)."""

from __future__ import annotations

import re
from typing import Any

import polars as pl

from ..escape import md_text
from . import analysis
from .history import Night
from .stats import label
from ..terminal import counted

# Labels and ids come from logs and command lines; the summary goes to a terminal and to chat
# messages, where control characters (an escape sequence retitling the window) have no place.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _num(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.4g}" if abs(v) < 1e5 else f"{v:,.0f}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:+.1f}%"


def change_line(c: analysis.Change, series: pl.DataFrame, nights: list[Night], found: list[analysis.Change]) -> str:
    """One change in words, with the tail cause that moved with it."""
    size = "changed" if c.rel_change is None else _pct(c.rel_change)  # from a level of 0: no relative size
    text = (
        f"{md_text(label(c.metric))} {size} from night {md_text(c.night)} "
        f"(run {md_text(c.run_id)}): {_num(c.before)} -> {_num(c.after)}, p = {c.p_value:.4f}"
    )
    cause = analysis.tail_cause(c, series, nights, found)
    if cause:
        metric, a, b = cause
        text += f"; {md_text(label(metric))} {100 * a:.0f}% -> {100 * b:.0f}%"
    return text


def markdown(o: Any, series: pl.DataFrame, nights: list[Night]) -> str:
    """The summary of an :class:`~.job.Outcome`."""
    bad = o.exit_code != 0
    n = o.night
    lines = [f"## {'FAIL' if bad else 'PASS'}: tracelat nightly, night {md_text(n.run_id)} ({md_text(n.night)})", ""]
    if n.labels:
        lines.append(
            "Labels: " + ", ".join(f"{md_text(k, 40)} = {md_text(v, 80)}" for k, v in sorted(n.labels.items()))
        )
        lines.append("")
    if o.slo is None:
        lines.append("- SLO: no SLO file given.")
    else:
        failed = [c["name"] for c in o.slo["checks"] if c["status"] != "pass"]
        lines.append(
            f"- SLO: {o.slo['verdict'].upper()}"
            + (f" (failed: {', '.join(md_text(f) for f in failed)})" if failed else "")
        )
    if o.baseline is None:
        lines.append("- Baseline: none (the first night, or no earlier night passed its SLOs).")
    else:
        reg = (o.comparison or {}).get("regressions") or []
        lines.append(
            f"- Baseline: night {md_text(o.baseline)}; compare: {len(reg)} regression(s)"
            + (
                f" ({', '.join(md_text(r) for r in reg[:8])}{f' and {len(reg) - 8} more' if len(reg) > 8 else ''})"
                if reg
                else ""
            )
        )
    if o.goodput_restart:
        # said once, on the night the limits changed: the goodput statistics start new series
        lines.append(f"- goodput limits changed on {md_text(o.goodput_restart)}: goodput series restart")
    worse = o.failing_changes
    lines.append(
        f"- Change points: {len(o.new_change_points)} new tonight ({len(worse)} for the worse by "
        f">= {o.min_change:.0%}), {len(o.change_points)} in the history of {counted(len(nights), 'night')}; "
        f"open regressions: {len(o.open_regressions)}."
    )
    if o.warnings:
        lines += ["", "### Warnings", ""] + [f"- {md_text(w, 1000)}" for w in o.warnings]
    if o.new_change_points:
        lines += ["", "### New change points", ""]
        lines += [
            f"- {'**' if c in worse else ''}{change_line(c, series, nights, o.change_points)}"
            f"{'**' if c in worse else ''}"
            for c in o.new_change_points
        ]
    if o.open_regressions:
        lines += [
            "",
            "### Open regressions",
            "",
            "| statistic | since night | before | after | now | change now | p |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {md_text(r['label'])} | {md_text(r['night'])} | {_num(r['before'])} | {_num(r['after'])} | "
            f"{_num(r['now'])} | {_pct(r['rel_now'])} | {r['p_value']:.4f} |"
            for r in o.open_regressions
        ]
    others = [c for c in o.change_points if c not in o.new_change_points]
    if others:
        lines += ["", "### Earlier change points", ""]
        lines += [f"- {change_line(c, series, nights, o.change_points)}" for c in others]
    return _CONTROL.sub("", "\n".join(lines) + "\n")
