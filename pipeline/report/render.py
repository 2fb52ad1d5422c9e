"""``write_report``: index.html, summary.json and summary.md for one run.

Sections that depend on the model fit (spikes, the fitted line, tail attribution)
are drawn when ``summary.summary`` has ``fit`` / ``spikes`` / ``tail`` and the
per-iteration fit table exists; otherwise the page says they are not available
and how to get them (``tracelat fit``).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from .. import __version__, metrics
from ..steady import report_rows as steady_rows
from ..summary import summary as run_summary
from . import charts, frames
from ..escape import html_text
from .markdown import summary_markdown
from .page import Section, card, fmt, generated_stamp, kv_table, missing, page, table
from ..terminal import counted

FIT_HINT = "not available (run `tracelat fit`)"
NO_STEPS_HINT = "not available: the run has no steps (iteration records)"


def fit_hint(s: dict[str, Any]) -> str:
    """Why the run has no fit: none computed yet, or nothing to fit (``tracelat fit`` would not help)."""
    return NO_STEPS_HINT if s.get("iterations") == 0 else FIT_HINT


HEADLINE = tuple((m, metrics.BY_NAME[m].label) for m in metrics.HEADLINE)  # (metric, card label)


def name_digest(text: str) -> str:
    """8 hex digits of SHA-256: tells apart names that reduce to the same folder name."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def safe_name(run_id: str, limit: int = 100) -> str:
    """A run id reduced to a safe file or folder name (ids come from logs: no ``..``, no ``/``).

    Ids that are not kept as they are (``a/b`` and ``a?b`` both reduce to ``a_b``, and
    long ids are cut) get ``~`` and a digest of the exact id, so two runs never share a
    folder; ``~`` is never kept from an id, so no id can name another's folder.
    """
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).lstrip(".")[:limit] or "run"
    return name if name == run_id else f"{name[: limit - 9]}~{name_digest(run_id)}"


def default_out_dir(run_id: str) -> Path:
    """``reports/<run_id>/`` with the id reduced to a safe folder name."""
    return Path("reports") / safe_name(run_id)


def _headline(s: dict[str, Any], audit: Any) -> str:
    cards = [
        card("requests (failed)", f"{fmt(s['requests'])} ({fmt(s['requests_failed'])})"),
        card("duration", f"{fmt(s['duration_s'], 1)} s"),
        card("output tokens/s", fmt(s["throughput"].get("output_tokens_per_s"), 1)),
    ]
    for key, label in HEADLINE:
        st = s.get(key) or {}
        if st.get("count"):
            cards.append(card(f"{label} p50 / p99 (ms)", f"{fmt(st['p50'])} / {fmt(st['p99'])}"))
    if s["iteration_ms"].get("cv") is not None:
        cards.append(card("iteration time CV", fmt(s["iteration_ms"]["cv"], 3)))
    if audit is not None:
        cards.append(card("SLO audit", audit.verdict.upper(), audit.verdict))
    else:
        cards.append(card("SLO audit", "no SLO file", "error"))
    return '<div class="cards">' + "".join(cards) + "</div>"


def _stats_table(s: dict[str, Any]) -> str:
    rows = [
        {
            "metric": m,
            **{k: (s[m] or {}).get(k) for k in ("count", "p50", "p90", "p95", "p99", "p999", "mean", "std", "max")},
        }
        for m in metrics.METRICS
        if (s.get(m) or {}).get("count")
    ]
    stats = table(pl.DataFrame(rows), left=("metric",)) if rows else missing("no latency values in this run")
    return stats + kv_table(steady_rows(s))


def _audit_section(audit: Any) -> Section:
    sec = Section("slo", "SLO verdict")
    if audit is None:
        sec.missing.append("no SLO file given: pass --slo slo.toml (see examples/slo.toml)")
        return sec
    rows = pl.DataFrame(
        [
            {"SLO": c.name, "observed": c.observed, "limit": f"{c.op} {c.limit:g}", "result": c.status.upper()}
            for c in audit.checks
        ]
    )
    sec.intro = (
        f'<p class="sub">{html_text(audit.slo_path)}: {counted(len(audit.checks), "check")}, {audit.failures} '
        f"failed, {audit.errors} could not be evaluated</p>"
    )
    sec.body = table(rows, left=("SLO", "result"))
    if audit.goodput:
        g = audit.goodput
        sec.body += kv_table(
            [
                ("goodput attainment", g["attainment"]),
                ("good requests", g["good_requests"]),
                ("request goodput (req/s)", g["request_goodput_rps"]),
                ("token goodput (tokens/s)", g["token_goodput_tps"]),
            ]
        )
    if audit.fluidity and audit.fluidity.get("requests_evaluated"):
        f = audit.fluidity
        sec.body += kv_table(
            [
                ("fluidity index mean", f["mean"]),
                ("fluidity index p01", f["percentiles"]["p01"]),
                ("service-level fluidity", f["service"]),
                ("requests with index >= 0.9", f["fraction_at_least_0_9"]),
            ]
        )
    return sec


def _timeline_section(con, run_id: str, s: dict[str, Any], max_points: int) -> Section:
    sec = Section("timeline", "Iteration time over the run")
    tl = frames.iteration_timeline(con, run_id, max_points)
    if tl is None:
        sec.missing.append("not available: the run has no iteration records")
        return sec
    sp = frames.spikes(con, run_id)
    if sp is None:
        note = f"spikes: {FIT_HINT}"
    else:
        counts = s.get("spikes") or {}
        by_cause = ", ".join(f"{c} {counts[c]}" for c in charts.CAUSES if counts.get(c) is not None)
        note = f"points: {sp.method}" + (f" ({by_cause})" if by_cause else "")
        lim = (counts.get("stall_detection_limit_ms") or {}).get("median_step")
        if isinstance(lim, (int, float)):
            note += f"; stalls under {lim:.3g} ms hide in a median step's noise"
    sec.charts["timeline"] = charts.spec(charts.timeline(tl.df, tl.method, sp.df if sp else None, note))
    return sec


def _fit_line(fit: dict[str, Any] | None, ctx_max: float, decode: float) -> tuple[pl.DataFrame | None, str]:
    """The fitted line t0 + a*ctx (+ c*decode at the median decode batch), or a note why there is none."""
    if not fit or fit.get("t0_ms") is None or fit.get("ms_per_1k_context_tokens") is None:
        return None, f"fitted line: {FIT_HINT}"
    t0, a = float(fit["t0_ms"]), float(fit["ms_per_1k_context_tokens"])
    c = fit.get("ms_per_1k_decode_tokens")
    base = t0 + (float(c) * decode / 1000 if isinstance(c, (int, float)) else 0.0)
    line = pl.DataFrame({"context_tokens": [0.0, float(ctx_max)], "predicted_ms": [base, base + a * ctx_max / 1000]})
    r2 = f", R\u00b2 {fit['r2']:.3f}" if isinstance(fit.get("r2"), (int, float)) else ""
    at = f" + c\u00b7{decode:g} decode tokens (median of decode-only steps)" if isinstance(c, (int, float)) else ""
    return line, (
        f"dashed: fitted t0 + a\u00b7ctx{at}, no prefill; t0 = {t0:.3g} ms, a = {a:.3g} ms per 1k context tokens{r2}"
    )


_PER_1K = {
    "a_ms_per_ctx": ("ms_per_1k_context_tokens", 1000.0),
    "b_ms_per_prefill": ("ms_per_1k_prefill_tokens", 1000.0),
    "c_ms_per_decode": ("ms_per_1k_decode_tokens", 1000.0),
}


def _sig(v: Any) -> Any:
    return f"{v:.4g}" if isinstance(v, float) else v


# summary.json's fit keys whose unit their name does not carry
_FIT_LABELS = {"mape": "mape (%)"}


def _fit_numbers(fit: dict[str, Any]) -> str:
    """The fit's numbers, its CIs, the iteration-time claims and the fit's notes (strings escaped)."""
    ci = fit.get("ci") if isinstance(fit.get("ci"), dict) else {}
    # four significant digits: two decimals showed 0.1947 ms per 1k tokens as 0.19, R² 0.9955 as 1.00
    rows = [(_FIT_LABELS.get(k, k), _sig(v)) for k, v in fit.items() if isinstance(v, (int, float, str)) or v is None]
    for k, v in ci.items():  # on the scale of the rows above (per 1k tokens), not the fit's per token
        if isinstance(v, list):
            name, scale = _PER_1K.get(k, (k, 1.0))
            rows.append((f"95% CI of {name}", " .. ".join(_sig(x * scale) if x is not None else "-" for x in v)))
    out = kv_table(rows)
    claims = [c for c in fit.get("claims") or [] if isinstance(c, dict)]
    if claims:
        verdict = {True: "holds", False: "does not hold", None: "not testable here"}
        out += table(
            pl.DataFrame(
                [
                    {
                        "iteration-time claim": str(c.get("claim")),
                        "on this run": verdict.get(c.get("holds"), str(c.get("holds"))),
                    }
                    for c in claims
                ]
            ),
            left=("iteration-time claim", "on this run"),
        )
    notes = [n for n in fit.get("statements") or [] if isinstance(n, str)]
    if notes:
        out += "<ul>" + "".join(f"<li>{html_text(n)}</li>" for n in notes) + "</ul>"
    return out


def _fit_section(con, run_id: str, s: dict[str, Any], max_points: int) -> Section:
    sec = Section("fit", "Iteration time vs context tokens")
    sc = frames.iteration_vs_context(con, run_id, max_points)
    fit = s.get("fit") if isinstance(s.get("fit"), dict) else None
    if fit:
        sec.intro = _fit_numbers(fit)
    else:
        sec.missing.append(f"model fit: {fit_hint(s)}")
    if sc is None:
        sec.missing.append("not available: no iteration has context_tokens")
        return sec
    ctx = sc.df["ctx_hi"].max() if "ctx_hi" in sc.df.columns else sc.df["context_tokens"].max()
    line, note = _fit_line(fit, float(ctx or 0), frames.decode_only_median_decode_tokens(con, run_id))
    sec.charts["context"] = charts.spec(charts.context_scatter(sc.df, sc.method, line, note))
    return sec


def _distribution_section(con, run_id: str, s: dict[str, Any]) -> Section:
    sec = Section("distributions", "TTFT, TPOT and ITL distributions")
    why = {
        "itl_ms": "no token times in this run",
        "ttft_ms": "no request records with a first token",
        "tpot_ms": "no request with more than one output token",
    }
    for metric in ("ttft_ms", "tpot_ms", "itl_ms"):
        fr = frames.cdf(con, run_id, metric)
        if fr is None:
            sec.missing.append(f"{charts.LABELS[metric]}: not available ({why[metric]})")
            continue
        st = s.get(metric) or {}
        marks = {"p50": st.get("p50"), "p99": st.get("p99")}
        sec.charts[f"cdf_{metric}"] = charts.spec(charts.cdf(fr.df, metric, fr.method, marks))
    return sec


def _tail_section(s: dict[str, Any]) -> Section:
    sec = Section("tail", "Tail attribution")
    # without steps every part is "unattributed": a bar of 100% says less than the reason
    df = None if s.get("iterations") == 0 else frames.tail_shares(s)
    if df is None:
        sec.missing.append(f"tail attribution: {fit_hint(s)}")
    else:
        sec.charts["tail"] = charts.spec(charts.tail_bars(df))
    return sec


def _queue_section(con, run_id: str, max_points: int, gauges: Any) -> tuple[Section, bool]:
    """From the steps; from the engine's gauges (``gauges``) when the steps carry none; and
    whether it was from the gauges."""
    sec = Section("queue", "Queue depth, running requests and KV usage")
    q = frames.queue_series(con, run_id, max_points)
    if q is not None:
        sec.charts["queue"] = charts.spec(charts.queue(q.df, q.method))
    elif gauges is not None:
        sec.intro = "<p>From the engine's Prometheus gauges, one point per scrape: the steps carry none of these.</p>"
        sec.charts["queue"] = charts.spec(charts.queue(gauges, "engine gauges per scrape"))
        return sec, True
    else:
        sec.missing.append("not available: iterations carry no running_reqs / waiting_reqs / kv_usage")
    return sec, False


def _gauges(con, run_id: str, s: dict[str, Any]):
    """The engine's running/waiting/KV gauges over time (engine_metrics.gauge_series), or None."""
    if not s.get("engine_metrics"):
        return None
    from ..engine_metrics import gauge_series

    t0 = s.get("run_start_s")
    return gauge_series(con, run_id, t0 if isinstance(t0, (int, float)) else None)


def _engine_metrics_section(s: dict[str, Any], gauges: Any, charted: bool) -> Section | None:
    """Only for runs with Prometheus samples: the engine's own view next to the step timeline
    (``charted``: its gauges are already the queue section's chart)."""
    from ..engine_metrics import format_lines

    if not s.get("engine_metrics"):
        return None
    sec = Section("engine", "Engine metrics (Prometheus scrapes)")
    if gauges is not None and not charted:
        sec.charts["engine"] = charts.spec(charts.queue(gauges, "engine gauges per scrape"))
    lines = format_lines(s)[1:]
    sec.body = "<ul>" + "".join(f"<li>{html_text(x.strip())}</li>" for x in lines) + "</ul>"
    return sec


def _top_section(con, run_id: str) -> Section:
    sec = Section("top", "Top offenders")
    parts = []
    it = frames.top_iterations(con, run_id)
    if it.height:
        by = "residual over the fitted model" if "residual_ms" in it.columns else "iteration time"
        parts.append(f"<h3>Slowest iterations (by {by})</h3>" + table(it, left=("spike_cause",)))
    for metric, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
        rq = frames.top_requests(con, run_id, metric)
        if rq.height:
            parts.append(f"<h3>Requests with the largest {label}</h3>" + table(rq, left=("req_id",)))
    sec.body = "".join(parts) or missing("no iterations or requests")
    return sec


def _run_section(s: dict[str, Any]) -> Section:
    import json

    from ..ingest.align import source_lines

    meta = dict(s.get("run") or {})
    extra = meta.pop("meta", None)
    sources = source_lines(str(s.get("run_id")), extra or {})
    body = ""
    if sources:  # a run joined from several files: how their clocks were put together
        body += (
            "<h3>Sources and clocks</h3><ul>"
            + "".join(
                f"<li>{'<strong>problem:</strong> ' if bad else ''}{html_text(text)}</li>" for bad, text in sources
            )
            + "</ul>"
        )
    body += kv_table([(k, v) for k, v in meta.items()])
    if extra:
        body += "<pre>" + html_text(json.dumps(extra, indent=1, default=str)[:20000]) + "</pre>"
    return Section("run", "Run metadata", body=body)


def build_sections(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    s: dict[str, Any],
    audit: Any = None,
    max_points: int = frames.MAX_POINTS,
) -> list[Section]:
    """Every section of the run report, in page order."""
    from .calibration import calibration_section

    gauges = _gauges(con, run_id, s)
    queue, from_gauges = _queue_section(con, run_id, max_points, gauges)
    sections = [
        _audit_section(audit),
        _timeline_section(con, run_id, s, max_points),
        _fit_section(con, run_id, s, max_points),
        _distribution_section(con, run_id, s),
        _tail_section(s),
        queue,
        _engine_metrics_section(s, gauges, charted=from_gauges),
        calibration_section(s.get("replay_calibration")),
        _top_section(con, run_id),
        _run_section(s),
    ]
    return [sec for sec in sections if sec is not None]


def write_report(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    out_dir: str | Path | None = None,
    slo: Any = None,
    max_points: int = frames.MAX_POINTS,
    summary: dict[str, Any] | None = None,
    calibrate_seeds: int | None = None,
) -> Path:
    """Write ``index.html``, ``summary.json`` and ``summary.md`` for ``run_id``; return the HTML path.

    ``out_dir`` defaults to ``reports/<run_id>/``; ``slo`` (a path or an
    :class:`~pipeline.audit.SloSpec`) adds the SLO verdict, goodput and fluidity;
    ``summary`` reuses a ``pipeline.summary.summary(con, run_id)`` the caller already has.
    ``calibrate_seeds`` adds the replay calibration (a validation replay with that many
    seeds, :mod:`.calibration`); it costs a fit and the simulations, so only on request.
    Derived tables must be current (``store.open_for_reading`` or ``build_derived``).
    """
    from ..jsonplain import dumps

    s = dict(summary) if summary is not None else run_summary(con, run_id)
    audit = spec = None
    if slo is not None:
        from .. import audit as aud

        spec = slo if isinstance(slo, aud.SloSpec) else aud.load_slo(slo)
        audit = aud.audit(con, run_id, spec)
        s["slo"] = audit.to_dict()
    if calibrate_seeds:
        from .calibration import replay_calibration

        s["replay_calibration"] = replay_calibration(
            con, run_id, calibrate_seeds, spec.goodput if spec is not None else None
        )
    out = Path(out_dir) if out_dir is not None else default_out_dir(run_id)
    out.mkdir(parents=True, exist_ok=True)
    run = s.get("run") or {}
    sub = " \u00b7 ".join(html_text(run[k], limit=80) for k in ("engine", "model", "gpu") if run.get(k))
    header = (
        f'<h1>tracelat report: <span class="rid">{html_text(run_id, limit=300)}</span></h1>'
        f'<p class="sub">{sub}</p>' + _headline(s, audit) + _stats_table(s)
    )
    stamp = generated_stamp()
    footer = (
        f"tracelat {html_text(__version__)}, generated {stamp}. Metric definitions: docs/metrics.md; "
        "how each chart reduces large runs is stated in its subtitle."
    )
    sections = build_sections(con, run_id, s, audit, max_points)
    html_path = out / "index.html"
    html_path.write_text(page(f"tracelat report: {run_id}", header, sections, footer), encoding="utf-8")
    (out / "summary.json").write_text(dumps(s) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(summary_markdown(s, audit), encoding="utf-8")
    return html_path
