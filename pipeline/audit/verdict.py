"""Human outputs of an audit: a terminal table and a Markdown verdict for nightly jobs."""

from __future__ import annotations

from typing import Any

from ..escape import md_text
from .check import AuditResult
from ..terminal import counted, inline

BADGE = {"pass": "PASS", "fail": "FAIL", "error": "ERROR"}
ICON = {"pass": "\u2705", "fail": "\u274c", "error": "\u26a0\ufe0f"}


def _num(v: Any, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if unit == "fraction":
        return f"{100 * v:.2f}%"
    if unit == "index":
        return f"{v:.4f}"
    return f"{v:,.3f}{(' ' + unit) if unit else ''}"


def _goodput_line(g: dict[str, Any]) -> str:
    limits = ", ".join(f"{m} <= {v:g}" for m, v in g["limits_ms"].items())
    if g.get("unmeasured"):
        return f"goodput ({limits}): not measurable, no ok request of the run has {', '.join(g['unmeasured'])}"
    return (
        f"goodput ({limits}): {g['good_requests']} of {g['requests']} requests good "
        f"({_num(g['attainment'], 'fraction')}); request goodput {_num(g['request_goodput_rps'], 'req/s')}, "
        f"token goodput {_num(g['token_goodput_tps'], 'tokens/s')}"
    )


def _fluidity_line(f: dict[str, Any]) -> str:
    head = (
        f"fluidity (TTFT deadline {f['ttft_deadline_ms']:g} ms, TBT deadline {f['tbt_deadline_ms']:g} ms): "
        f"{counted(f['requests_evaluated'], 'request')} evaluated"
    )
    if not f["requests_evaluated"]:
        return head + " (no token times)"
    pct = ", ".join(f"{k} {v:.4f}" for k, v in f["percentiles"].items())
    return f"{head}; index mean {f['mean']:.4f}, {pct}; service-level {f['service']:.4f}"


def text_report(result: AuditResult) -> str:
    """Plain-text verdict for the terminal."""
    lines = [
        f"audit of run {result.run_id} against {inline(str(result.slo_path))}: {BADGE[result.verdict]} "
        f"({counted(len(result.checks), 'check')}, {result.failures} failed, {result.errors} not evaluable)"
    ]
    for c in result.checks:
        lines.append(f"  [{BADGE[c.status]:>5}] {c.message}")
    if result.goodput:
        lines.append(_goodput_line(result.goodput))
    if result.fluidity:
        lines.append(_fluidity_line(result.fluidity))
    return "\n".join(lines)


def markdown_report(result: AuditResult) -> str:
    """Markdown verdict (nightly job comment, PR comment); every log-derived string escaped."""
    lines = [
        f"## {ICON[result.verdict]} SLO audit {BADGE[result.verdict]}: run {md_text(result.run_id)}",
        "",
        f"{counted(len(result.checks), 'check')} from {md_text(result.slo_path)}: {result.failures} failed, "
        f"{result.errors} could not be evaluated.",
        "",
        "| SLO | observed | limit | result |",
        "|---|---:|---:|---|",
    ]
    for c in result.checks:
        lines.append(
            f"| {md_text(c.name)} | {_num(c.observed, c.unit)} | {c.op} {_num(c.limit, c.unit)} "
            f"| {ICON[c.status]} {BADGE[c.status]} |"
        )
    if result.goodput:
        lines += ["", md_text(_goodput_line(result.goodput), limit=None)]
    if result.fluidity:
        lines += ["", md_text(_fluidity_line(result.fluidity), limit=None)]
    return "\n".join(lines) + "\n"
