"""``summary.md``: the run summary as Markdown for PR comments and nightly logs."""

from __future__ import annotations

from typing import Any

from .. import metrics
from ..escape import md_text

STATS = ("count", "p50", "p90", "p99", "p999", "mean", "max")


def _n(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return md_text(v)


def _fit_lines(s: dict[str, Any]) -> list[str]:
    fit, spikes, tail = s.get("fit"), s.get("spikes"), s.get("tail")
    out = []
    if isinstance(fit, dict) and fit.get("t0_ms") is not None:
        out.append(
            f"**Iteration-time model**: t0 {_n(fit.get('t0_ms'))} ms, "
            f"{_n(fit.get('ms_per_1k_context_tokens'), 4)} ms per 1k context tokens, "
            f"{_n(fit.get('ms_per_1k_prefill_tokens'), 4)} ms per 1k prefill tokens, "
            f"R\u00b2 {_n(fit.get('r2'), 3)} ({_n(fit.get('r2_without_stalls'), 3)} without stalls), "
            f"MAPE {_n(fit.get('mape'), 2)}%"
        )
    else:
        why = "the run has no steps (iteration records)" if s.get("iterations") == 0 else "run `tracelat fit`"
        out.append(f"**Iteration-time model**: not available ({why})")
    if isinstance(spikes, dict):
        out.append(
            "**Spikes**: "
            + ", ".join(f"{md_text(k)} {_n(v)}" for k, v in spikes.items() if not isinstance(v, (dict, list)))
        )
        lim = spikes.get("stall_detection_limit_ms") or {}
        if isinstance(lim.get("median_step"), (int, float)) and isinstance(lim.get("p90_step"), (int, float)):
            out.append(
                f"**Stall detection limit**: {_n(lim['median_step'], 3)} ms on a median step, "
                f"{_n(lim['p90_step'], 3)} ms on a p90 step (shorter stalls hide in the step's noise)"
            )
    if isinstance(tail, dict):
        for metric, parts in tail.items():
            if isinstance(parts, dict):
                # every part, a negative one too (a part smaller in the tail than in the median group):
                # the three largest alone could add up past 100%
                shown = sorted(
                    ((k, v) for k, v in parts.items() if isinstance(v, (int, float)) and round(100 * v)),
                    key=lambda kv: -kv[1],
                )
                out.append(
                    f"**Tail of {md_text(metric)}**: "
                    + (", ".join(f"{md_text(k)} {100 * v:.0f}%" for k, v in shown) or "no part above 0.5%")
                )
    return out


def _steady_lines(st: dict[str, Any] | None) -> list[str]:
    """The steady-state line (docs/metrics.md "Steady state and peak"), with a blank line after it."""
    if not st:
        return []
    peak = st.get("peak_output_tokens_per_s")
    peak_text = f"; peak {_n(peak, 1)} output tokens/s ({st['window_s']:.3g} s window)" if peak is not None else ""
    note = [f"Note: {md_text(st['span_note'], 400)}", ""] if st.get("span_note") else []
    if not st.get("reached"):
        return [f"Steady state: none ({md_text(st.get('reason') or '', 400)}){peak_text}", "", *note]
    a, b = st["steady_window_s"]
    return [
        f"Steady state: {_n(st['steady_output_tokens_per_s'], 1)} output tokens/s, "
        f"{_n(st['steady_requests_per_s'], 3)} requests/s over {a:.1f}..{b:.1f} s from the start "
        f"({st['steady_token_share']:.0%} of the tokens){peak_text}",
        "",
        *note,
    ]


def _calibration_lines(cal: dict[str, Any] | None) -> list[str]:
    """The replay calibration (``report --calibrate``) in a line or two: why there is none, or its
    verdict, how many statistics the replay kept within tolerance and the largest error."""
    if cal is None:
        return []
    if not cal.get("available"):
        return [f"**Replay calibration**: not available ({md_text(cal.get('reason') or '', 400)})"]
    rows = [r for r in cal.get("rows") or [] if r.get("rel_error") is not None]
    out = [
        f"**Replay calibration** ({len(cal.get('seeds') or [])} seed(s), recorded policy): "
        f"{md_text(cal.get('verdict') or '', 400)}"
    ]
    if rows:
        within = sum(1 for r in rows if r.get("within_tol"))
        worst = max(rows, key=lambda r: abs(r["rel_error"]))
        out.append(
            f"{within} of {len(rows)} statistics within tolerance; largest error "
            f"{md_text(worst['metric'])} {md_text(worst['stat'])} {worst['rel_error'] * 100:+.1f}%"
        )
    return out


def summary_markdown(s: dict[str, Any], audit: Any = None) -> str:
    """Markdown summary of a ``pipeline.summary.summary`` dict (plus an audit verdict when given)."""
    run = s.get("run") or {}
    who = " / ".join(md_text(run[k], 60) for k in ("engine", "model", "gpu") if run.get(k))
    lines = [f"### tracelat: run {md_text(s['run_id'])}", ""]
    if who:
        lines += [who, ""]
    from ..ingest.align import source_lines

    for bad, text in source_lines(str(s["run_id"]), run.get("meta") or {}):
        lines += [("**Sources (problem)**: " if bad else "**Sources**: ") + md_text(text, 2000), ""]
    lines += [
        f"{_n(s['requests'])} requests ({_n(s['requests_failed'])} failed), {_n(s['iterations'])} iterations, "
        f"{_n(s['duration_s'], 1)} s; {_n(s['throughput'].get('output_tokens_per_s'), 1)} output tokens/s, "
        f"{_n(s['throughput'].get('requests_per_s'), 3)} requests/s",
        "",
        *_steady_lines(s.get("steady_state")),
        "| metric (ms) | " + " | ".join(STATS) + " |",
        "|---|" + "---:|" * len(STATS),
    ]
    for m in metrics.METRICS:
        st = s.get(m) or {}
        if st.get("count"):
            lines.append(f"| {m} | " + " | ".join(_n(st.get(k)) for k in STATS) + " |")
    if s["iteration_ms"].get("cv") is not None:
        lines += ["", f"Iteration time coefficient of variation: {s['iteration_ms']['cv']:.3f}"]
    lines += [""] + [f"{x}  " for x in (*_fit_lines(s), *_calibration_lines(s.get("replay_calibration")))]
    if audit is not None:
        from ..audit.verdict import markdown_report

        lines += ["", markdown_report(audit).replace("## ", "#### ", 1)]
    return "\n".join(lines).rstrip() + "\n"
