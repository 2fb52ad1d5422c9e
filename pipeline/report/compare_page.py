"""The comparison outputs of ``tracelat compare``: index.html (overlaid CDFs, deltas
with CIs), comparison.json and comparison.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from .. import metrics
from ..compare import Comparison, Delta
from . import charts, frames
from ..escape import html_text, md_text
from .render import name_digest, safe_name
from .page import Section, card, page, table

ICON = {
    "regression": "\u274c",
    "improvement": "\u2705",
    "below threshold": "",
    "no significant change": "",
    "no verdict": "",
}


def default_out_dir(base_run: str, cand_run: str) -> Path:
    """``reports/compare_<base>_vs_<cand>/``, names made safe (and unique) as for reports."""
    base, cand = safe_name(base_run, 60), safe_name(cand_run, 60)
    name = f"compare_{base}_vs_{cand}"
    if "_vs_" in base or "_vs_" in cand:  # (a_vs_b, c) and (a, b_vs_c) would share a folder
        name += f"~{name_digest(base_run + chr(0) + cand_run)}"
    return Path("reports") / name


def _pct(v: float | None) -> str | None:
    return None if v is None else f"{100 * v:+.2f}%"


def delta_frame(comp: Comparison) -> pl.DataFrame:
    """One row per compared statistic, as shown in the table."""
    rows = [
        {
            "metric": d.metric,
            "stat": d.stat,
            "baseline": d.base,
            "candidate": d.cand,
            "delta": d.delta,
            "change": _pct(d.rel),
            "CI of change": None if d.rel_low is None else f"{_pct(d.rel_low)} .. {_pct(d.rel_high)}",
            "verdict": d.verdict,
        }
        for d in comp.deltas
    ]
    return pl.DataFrame(rows, schema_overrides={"baseline": pl.Float64, "candidate": pl.Float64, "delta": pl.Float64})


def _chart_frame(comp: Comparison) -> pl.DataFrame:
    rows = [
        {"label": f"{d.metric} {d.stat}", "rel": d.rel, "rel_lo": d.rel_low, "rel_hi": d.rel_high, "verdict": d.verdict}
        for d in comp.deltas
        if d.rel is not None and d.rel_low is not None
    ]
    return pl.DataFrame(rows)


def _cdfs(comp: Comparison, base_con: duckdb.DuckDBPyConnection, cand_con: duckdb.DuckDBPyConnection) -> Section:
    sec = Section("cdfs", "Distributions: baseline vs candidate")
    for metric in metrics.LATENCY:
        fb, fc = frames.cdf(base_con, comp.base_run, metric), frames.cdf(cand_con, comp.cand_run, metric)
        if fb is None or fc is None:
            sec.missing.append(f"{charts.LABELS[metric]}: not available in {'both runs' if fb is fc else 'one run'}")
            continue
        df = pl.concat([fb.df.with_columns(run=pl.lit("baseline")), fc.df.with_columns(run=pl.lit("candidate"))])
        sec.charts[f"cmp_{metric}"] = charts.spec(
            charts.compare_cdf(df, metric, f"baseline: {fb.method}; candidate: {fc.method}")
        )
    return sec


def _tests_table(comp: Comparison) -> str:
    rows = [
        {
            "metric": m,
            "n baseline": t["n_base"],
            "n candidate": t["n_cand"],
            "p-value": t["p_value"],
            "P(candidate > baseline)": t["prob_cand_greater"],
            "tested on": f"{t['subsampled_to']:,} per run (random)" if t["subsampled_to"] else "all values",
        }
        for m, t in comp.tests.items()
    ]
    return table(pl.DataFrame(rows), left=("metric", "tested on")) if rows else ""


def write_comparison(
    comp: Comparison,
    base_con: duckdb.DuckDBPyConnection,
    cand_con: duckdb.DuckDBPyConnection,
    out_dir: str | Path | None = None,
) -> Path:
    """Write index.html, comparison.json and comparison.md; return the HTML path."""
    from ..jsonplain import dumps

    out = Path(out_dir) if out_dir is not None else default_out_dir(comp.base_run, comp.cand_run)
    out.mkdir(parents=True, exist_ok=True)
    n_reg = len(comp.regressions)
    header = (
        f'<h1>tracelat compare: <span class="rid">{html_text(comp.cand_run, 200)}</span> vs baseline '
        f'<span class="rid">{html_text(comp.base_run, 200)}</span></h1>'
        '<div class="cards">'
        + card(
            "verdict",
            f"{n_reg} regression{'s' if n_reg != 1 else ''}" if n_reg else "no regression",
            "fail" if n_reg else "pass",
        )
        + card("threshold", f"{comp.threshold:.1%}")
        + card("confidence", f"{comp.confidence:.0%}")
        + card("bootstrap resamples", f"{comp.resamples:,}")
        + card("resampling", "paired (same arrivals)" if comp.paired else "independent")
        + "</div>"
    )
    if comp.warnings:
        header += '<ul class="warnings">' + "".join(f"<li>{html_text(w, 600)}</li>" for w in comp.warnings) + "</ul>"
    deltas = Section(
        "deltas", "Every headline statistic", body=table(delta_frame(comp), left=("metric", "stat", "verdict"))
    )
    chart_df = _chart_frame(comp)
    if chart_df.height:
        deltas.charts["deltas"] = charts.spec(charts.compare_deltas(chart_df, comp.threshold))
    deltas.missing += [f"{m}: {why}" for m, why in comp.skipped.items()]
    tests = Section("tests", "Mann-Whitney U test per metric (two-sided)", body=_tests_table(comp))
    sections = [deltas, _cdfs(comp, base_con, cand_con), tests]
    footer = (
        "A statistic is a regression when it grew by more than the threshold and the bootstrap CI of its "
        "difference lies above zero (docs/reports-and-audit.md)."
    )
    html_path = out / "index.html"
    html_path.write_text(
        page(f"tracelat compare: {comp.cand_run} vs {comp.base_run}", header, sections, footer), encoding="utf-8"
    )
    (out / "comparison.json").write_text(dumps(comp.to_dict()) + "\n", encoding="utf-8")
    (out / "comparison.md").write_text(comparison_markdown(comp), encoding="utf-8")
    return html_path


def _md_row(d: Delta) -> str:
    if d.rel_low is not None:
        ci = f"{_pct(d.rel_low)} .. {_pct(d.rel_high)}"
    elif d.ci_low is not None:  # from a baseline of 0 (no failures, no queueing): no relative size
        ci = f"{d.ci_low:+,.4g} .. {d.ci_high:+,.4g} (absolute)"
    else:
        ci = "-"
    num = lambda v: "-" if v is None else f"{v:,.3f}"  # noqa: E731
    return (
        f"| {d.metric} | {d.stat} | {num(d.base)} | {num(d.cand)} | {_pct(d.rel) or '-'} | {ci} | "
        f"{ICON[d.verdict]} {d.verdict} |"
    )


def comparison_markdown(comp: Comparison, only_changes: bool = False) -> str:
    """Markdown table of the comparison (for PR comments and nightly logs)."""
    n_reg = len(comp.regressions)
    head = (
        f"## {ICON['regression'] if n_reg else ICON['improvement']} tracelat compare: "
        f"{n_reg} regression{'s' if n_reg != 1 else ''}: {md_text(comp.cand_run)} vs baseline "
        f"{md_text(comp.base_run)}"
    )
    rows: list[Any] = [d for d in comp.deltas if not only_changes or d.flagged]
    lines = [
        head,
        "",
        f"Threshold {comp.threshold:.1%}, {comp.confidence:.0%} bootstrap CIs ({comp.resamples:,} resamples).",
    ]
    if comp.paired:
        lines[-1] += (
            f" Paired: both runs served the same {comp.paired['requests']:,} arrivals (95% within "
            f"{comp.paired['arrival_shift_p95_s'] * 1000:.3g} ms), so each resample draws the same "
            f"{comp.paired['blocks']} time blocks from both."
        )
    if rows:
        lines += [
            "",
            "| metric | stat | baseline | candidate | change | CI of change | verdict |",
            "|---|---|---:|---:|---:|---|---|",
        ] + [_md_row(d) for d in rows]
    else:
        below = sum(d.verdict == "below threshold" for d in comp.deltas)
        unjudged = sum(d.verdict == "no verdict" for d in comp.deltas)
        lines += [
            "",
            (
                f"No statistic changed beyond the threshold; {below} changed by less (verdict 'below threshold')."
                if below
                else "No statistic changed significantly."
            )
            + (
                f" {unjudged} of {len(comp.deltas)} had too few values to judge (verdict 'no verdict')."
                if unjudged
                else ""
            ),
        ]
    return "\n".join(lines) + "\n"
