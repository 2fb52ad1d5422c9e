"""The sweep chart: p99 TTFT and p99 TPOT against the swept setting, SLO limits drawn in.

:func:`sweep_chart` builds the Altair chart (no I/O); :func:`save_chart` writes
it as one self-contained HTML file through the report's page
(:func:`pipeline.report.page.page`): the same escaping of log-borne text (the run
id), inlined Vega JS, and Content-Security-Policy as the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..replay.sweep import Sweep

PANELS = (("ttft_ms", "p99", "p99 TTFT (ms)"), ("tpot_ms", "p99", "p99 TPOT (ms)"))


def chart_rows(sweep: Sweep) -> list[dict[str, Any]]:
    """Long-form data: one row per (swept value, panel, seed)."""
    rows = []
    for i, r in enumerate(sweep.rows):
        status = "no SLO file" if r.meets is None else ("meets SLO" if r.meets else "misses SLO")
        for metric, stat, title in PANELS:
            for seed, s in zip(sweep.seeds, r.per_seed):
                rows.append(
                    {
                        "value": _shown(r.value),
                        "order": i,  # the sweep's order: categories are drawn as given, not sorted
                        "panel": title,
                        "seed": seed,
                        "ms": (s.get(metric) or {}).get(stat),
                        "mean_ms": r.mean(metric, stat),
                        "status": status,
                        "recorded": sweep.is_recorded(r.value),
                    }
                )
    return rows


def sweep_chart(sweep: Sweep):
    """Two panels (p99 TTFT, p99 TPOT) of the replays' mean over seeds, seeds as faint dots."""
    import altair as alt

    rows = chart_rows(sweep)
    data = alt.Data(values=rows)
    # on/off settings and dtype names are categories
    numeric = all(isinstance(r.value, (int, float)) and not isinstance(r.value, bool) for r in sweep.rows)
    # log2 axis ticked at the swept values (powers of two are the usual choices)
    x = (
        alt.X(
            "value:Q",
            title=sweep.param,
            scale=alt.Scale(type="log", base=2),
            axis=alt.Axis(values=[r.value for r in sweep.rows]),
        )
        if numeric
        # categories in the sweep's order (bf16, fp8, int4, fp32), not alphabetically (bf16, fp32, fp8, int4)
        else alt.X("value:N", title=sweep.param, sort=[_shown(r.value) for r in sweep.rows])
    )
    # the line joins the values in the sweep's order too (a line's path otherwise follows the field's values)
    path = {} if numeric else {"order": alt.Order("order:Q")}
    palette = {"meets SLO": "#2a9d4b", "misses SLO": "#d1495b", "no SLO file": "#4c78a8"}
    present = [k for k in palette if any(row["status"] == k for row in rows)]
    color = alt.Color("status:N", title=None, scale=alt.Scale(domain=present, range=[palette[k] for k in present]))
    limits = {(lim.metric, lim.stat): lim.limit for lim in _slo_limits(sweep)}
    panels = []
    for metric, stat, title in PANELS:
        base = alt.Chart(data).transform_filter(alt.datum.panel == title)
        line = base.mark_line(color="#888").encode(x=x, y=alt.Y("mean(mean_ms):Q", title=title), **path)
        dots = base.mark_circle(size=90).encode(
            x=x,
            y=alt.Y("mean(mean_ms):Q"),
            color=color,
            tooltip=[
                alt.Tooltip("value:Q" if numeric else "value:N", title=sweep.param),
                alt.Tooltip("mean(mean_ms):Q", title=title, format=".4g"),
                alt.Tooltip("status:N"),
            ],
        )
        seeds = base.mark_tick(opacity=0.4, color="#555").encode(x=x, y=alt.Y("ms:Q"))
        layer = line + seeds + dots
        if (metric, stat) in limits:
            rule = (
                alt.Chart(alt.Data(values=[{"limit": limits[(metric, stat)]}]))
                .mark_rule(color="#d1495b", strokeDash=[6, 4])
                .encode(y=alt.Y("limit:Q"))
            )
            layer = layer + rule
        panels.append(layer.properties(width=320, height=240, title=title))
    sub = f"{len(sweep.seeds)} seed(s) per value; ticks: single seeds; dashed: SLO limit"
    fixed = sweep.fixed_changes()
    if fixed:  # Vega renders the title as text, not HTML
        sub = [f"every value with {'; '.join(fixed)}", sub]
    return alt.hconcat(*panels).properties(
        title=alt.TitleParams(f"What-if replay of {sweep.calibration.run_id}: {sweep.param}", subtitle=sub)
    )


def _shown(value: Any) -> Any:
    """A swept value as the chart shows it (on/off settings as true/false)."""
    return str(value).lower() if isinstance(value, bool) else value


def _slo_limits(sweep: Sweep) -> list:
    if not sweep.slo_path:
        return []
    from ..slo import load_slo

    return list(load_slo(sweep.slo_path).limits)


def save_chart(sweep: Sweep, path) -> Path:
    """Write the sweep chart as self-contained HTML (inline Vega JS, the report's CSP)."""
    from .. import __version__
    from .charts import spec
    from ..escape import html_text
    from .page import Section, page

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    run_id = sweep.calibration.run_id
    # Altair's own save() pastes the spec (with the run id, from a log) into <script> as is;
    # the report's page escapes it and adds the CSP
    header = (
        f'<h1>What-if replay of <span class="rid">{html_text(run_id, limit=300)}</span>: {html_text(sweep.param)}</h1>'
    )
    section = Section(
        "sweep", "p99 TTFT and p99 TPOT against the swept setting", charts={"sweep": spec(sweep_chart(sweep))}
    )
    footer = f"tracelat {html_text(__version__)}; the table and JSON of this sweep: tracelat replay --sweep [--json]."
    path.write_text(page(f"tracelat replay sweep: {run_id}", header, [section], footer), encoding="utf-8")
    return path
