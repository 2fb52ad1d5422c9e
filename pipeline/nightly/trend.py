"""The trend page: every headline statistic per night with its interval, change points
marked with their size and p-value, open regressions, and links to each night's report.

Drawn with Altair through the report's page (:func:`pipeline.report.page.page`):
one offline file, the report's Content-Security-Policy, every string from labels
or logs escaped (table cells, the embedded specs, the links).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

import altair as alt
import polars as pl

from ..metrics import LATENCY
from ..report import charts
from ..escape import html_text
from ..report.page import Section, card, missing, page, table
from . import analysis
from .history import Night
from .stats import direction, label
from ..terminal import counted

GROUPS = (
    ("latency", "Latency percentiles", tuple(f"{m}." for m in LATENCY)),
    ("throughput", "Throughput and goodput", ("throughput.", "goodput.")),
    ("engine", "Iteration time, model fit and stalls", ("iteration_ms.", "fit.", "stalls.")),
)
WIDTH, HEIGHT = 360, 150


def _frame(series: pl.DataFrame, nights: list[Night], metric: str) -> pl.DataFrame:
    pos = {n.run_id: i + 1 for i, n in enumerate(nights)}
    return (
        series.filter(pl.col("metric") == metric)
        .with_columns(i=pl.col("run_id").replace_strict(pos, return_dtype=pl.Int64))
        .select("i", "run_id", "night", "value", "ci_low", "ci_high")
        .sort("i")
    )


def stat_chart(df: pl.DataFrame, cps: list[analysis.Change], title: str) -> alt.LayerChart:
    """One statistic over the nights: points and line, interval rules, change points as
    dashed rules between nights (red: for the worse) labelled with size and p-value."""
    x = alt.X("i:Q", title="night", axis=alt.Axis(tickMinStep=1, format="d"))
    base = alt.Chart(df)
    layers = [
        base.mark_rule(color="#9aa5b8").encode(x=x, y=alt.Y("ci_low:Q"), y2=alt.Y2("ci_high:Q")),
        base.mark_line(point=True, color="#4c78a8").encode(
            x=x,
            y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=False)),
            tooltip=[
                alt.Tooltip("run_id:N"),
                alt.Tooltip("night:N"),
                alt.Tooltip("value:Q", format=",.4g"),
                alt.Tooltip("ci_low:Q", format=",.4g"),
                alt.Tooltip("ci_high:Q", format=",.4g"),
            ],
        ),
    ]
    if cps:
        marks = pl.DataFrame(
            [
                {
                    "x": c.index + 0.5,
                    "worse": "worse" if c.worse else "better",
                    "text": f"{'n/a' if c.rel_change is None else f'{100 * c.rel_change:+.1f}%'} p={c.p_value:.3g}",
                    "run_id": c.run_id,
                }
                for c in cps
            ]
        )
        color = alt.Color(
            "worse:N", scale=alt.Scale(domain=["worse", "better"], range=["#e45756", "#54a24b"]), legend=None
        )
        cp = alt.Chart(marks)
        layers += [
            cp.mark_rule(strokeDash=[4, 3], strokeWidth=2).encode(
                x=alt.X("x:Q"), color=color, tooltip=[alt.Tooltip("run_id:N"), alt.Tooltip("text:N")]
            ),
            cp.mark_text(align="left", dx=3, y=6, fontSize=10).encode(
                x=alt.X("x:Q"), text=alt.Text("text:N"), color=color
            ),
        ]
    return alt.layer(*layers).properties(width=WIDTH, height=HEIGHT, title=alt.Title(title, anchor="start"))


def tail_chart(series: pl.DataFrame, nights: list[Night], fam: str) -> alt.Chart | None:
    pos = {n.run_id: i + 1 for i, n in enumerate(nights)}
    df = (
        series.filter(pl.col("metric").str.starts_with(f"tail.{fam}."))
        .with_columns(
            i=pl.col("run_id").replace_strict(pos, return_dtype=pl.Int64),
            cause=pl.col("metric").str.split(".").list.get(2),
        )
        .select("i", "run_id", "cause", "value")
        .sort("i", "cause")
    )
    if df.height == 0:
        return None
    return (
        alt.Chart(df)
        .mark_line(point=True)
        .encode(
            x=alt.X("i:Q", title="night", axis=alt.Axis(tickMinStep=1, format="d")),
            y=alt.Y("value:Q", title="share of the p99 group's extra latency", axis=alt.Axis(format="%")),
            color=alt.Color("cause:N", title="cause"),
            tooltip=[alt.Tooltip("run_id:N"), alt.Tooltip("cause:N"), alt.Tooltip("value:Q", format=".1%")],
        )
        .properties(width=WIDTH, height=HEIGHT, title=alt.Title(f"{fam.upper()} tail attribution", anchor="start"))
    )


def _link(out: Path, night: Night) -> str:
    if not night.report:
        return html_text(night.run_id)
    rel = os.path.relpath(Path(night.report) / "index.html", out.resolve())
    return f'<a href="{html_text(quote(Path(rel).as_posix()))}">{html_text(night.run_id, limit=80)}</a>'


# labels with a column of their own; every other label (but the date, shown as its own column)
# is listed in the last column, "key = value" per line
LABEL_COLUMNS = ("commit", "engine", "engine_version", "model", "gpu", "config")


def _other_labels(labels: dict[str, str]) -> str:
    return "<br>".join(
        f"{html_text(k, limit=40)} = {html_text(v, limit=80)}"
        for k, v in sorted(labels.items())
        if k not in LABEL_COLUMNS and k != "date"
    )


def nights_table(out: Path, nights: list[Night]) -> str:
    """Newest first, each id linking to its report; every label shown, every cell escaped."""
    keys = LABEL_COLUMNS
    head = "".join(f'<th class="l">{h}</th>' for h in ("night", "date", "SLO", *keys, "other labels"))
    rows = []
    for n in reversed(nights):
        slo = n.slo_verdict or "no SLO file"
        cells = [_link(out, n), html_text(n.night), html_text(slo.upper() if n.slo_verdict else slo)]
        cells += [html_text(n.labels.get(k, ""), limit=60) for k in keys]
        cells.append(_other_labels(n.labels))
        rows.append("<tr>" + "".join(f'<td class="l">{c}</td>' for c in cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _changes_table(found: list[analysis.Change]) -> str:
    if not found:
        return '<p class="sub">No change point in any statistic.</p>'
    df = pl.DataFrame(
        [
            {
                "statistic": label(c.metric),
                "from night": c.night,
                "run": c.run_id,
                "before": c.before,
                "after": c.after,
                "change": None if c.rel_change is None else f"{100 * c.rel_change:+.1f}%",
                "p-value": f"{c.p_value:.4f}",
                "for the worse": c.worse,
            }
            for c in found
        ]
    )
    return table(df, left=("statistic", "from night", "run"))


def _open_table(rows: list[dict]) -> str:
    if not rows:
        return '<p class="sub">None: every change for the worse has recovered (or there was none).</p>'
    df = pl.DataFrame(
        [
            {
                "statistic": r["label"],
                "since night": r["night"],
                "before": r["before"],
                "after": r["after"],
                "now": r["now"],
                "change now": None if r["rel_now"] is None else f"{100 * r['rel_now']:+.1f}%",
                "p-value": f"{r['p_value']:.4f}",
            }
            for r in rows
        ]
    )
    return table(df, left=("statistic", "since night"))


def write_trend(
    out: Path,
    nights: list[Night],
    series: pl.DataFrame,
    found: list[analysis.Change],
    open_rows: list[dict],
    min_change: float,
) -> Path:
    """Write ``out/index.html``; returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    metrics = sorted(set(series["metric"].to_list())) if series.height else []
    sections = [
        Section("open", "Open regressions", body=_open_table(open_rows)),
        Section(
            "changes",
            "Change points",
            body=_changes_table(found),
            intro=f'<p class="sub">Gating: for the worse by at least {min_change:.0%}. Method and '
            "settings: docs/nightly.md.</p>",
        ),
    ]
    legend = (
        '<p class="sub">One point per night (hover for its id), the grey rule its 95% interval; dashed '
        "lines are change points between two nights, labelled with the change and its p-value (red: for "
        "the worse).</p>"
    )
    for key, title, prefixes in GROUPS:
        sec = Section(key, title, intro=legend)
        for m in (m for m in metrics if m.startswith(prefixes) and direction(m) != 0):
            df = _frame(series, nights, m)
            if df.height:
                sec.charts[f"{key}_{len(sec.charts)}"] = charts.spec(
                    stat_chart(df, [c for c in found if c.metric == m], label(m))
                )
        if not sec.charts:
            sec.missing.append("no statistic of this group in the history")
        sections.append(sec)
    tail = Section("tail", "Tail attribution per night")
    for fam in ("ttft", "tpot", "e2e"):
        ch = tail_chart(series, nights, fam)
        if ch is not None:
            tail.charts[f"tail_{fam}"] = charts.spec(ch)
    if not tail.charts:
        tail.missing.append("no tail attribution in the history (nights without a model fit)")
    sections += [tail, Section("nights", "Nights", body=nights_table(out, nights))]
    last = nights[-1] if nights else None
    header = (
        "<h1>tracelat nightly trend</h1>"
        f'<p class="sub">{counted(len(nights), "night")}'
        + (f", latest {html_text(last.run_id, limit=80)} ({html_text(last.night)})" if last else "")
        + "</p>"
        '<div class="cards">'
        + card("open regressions", str(len(open_rows)), "fail" if open_rows else "pass")
        + card("change points", str(len(found)))
        + (
            card(
                "latest SLO", html_text((last.slo_verdict or "no SLO file").upper()), "pass" if last.passed else "fail"
            )
            if last
            else ""
        )
        + "</div>"
    )
    if not nights:
        header += missing("no night in the history yet")
    path = out / "index.html"
    path.write_text(
        page(
            "tracelat nightly trend",
            header,
            sections,
            "Change points: E-divisive means with a permutation test (docs/nightly.md).",
        ),
        encoding="utf-8",
    )
    return path
