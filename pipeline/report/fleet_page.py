"""The fleet page (``tracelat fleet --out DIR``): fleet percentiles, the spread of per-run p99s and the
ranked outlier table, each run linking to its own report under ``DIR/runs/``.

Built on the run report's page (:func:`.page.page`: inline Vega, CSP, no network); every
run id, model name and SLO message is text from files and goes through ``html_text``
(tables) or ``script_json`` (chart data).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import altair as alt
import polars as pl

from .. import __version__
from .charts import LABELS, spec
from ..escape import html_text
from ..metrics import LATENCY
from .page import Section, card, fmt, generated_stamp, page

STATS = ("count", "p50", "p90", "p99", "p999", "mean", "std", "max")


def _fleet_table(fleet: dict[str, Any]) -> str:
    head = '<th class="l">metric</th>' + "".join(f"<th>{s}</th>" for s in STATS)
    rows = "".join(
        f'<tr><td class="l">{html_text(LABELS.get(m, m))}</td>'
        + "".join(f"<td>{fmt(q.get(s))}</td>" for s in STATS)
        + "</tr>"
        for m, q in fleet.items()
        if q.get("count")
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _p99_chart(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    rows = [
        {
            "run": r["run_id"],
            "metric": LABELS[m],
            "p99_ms": r[m]["p99"],
            "flagged": "flagged" if r["outlier"] else "ordinary",
        }
        for r in runs
        for m in LATENCY
        if r[m].get("p99") is not None
    ]
    if not rows:
        return None
    chart = (
        alt.Chart(pl.DataFrame(rows))
        .mark_tick(thickness=2, size=18)
        .encode(
            x=alt.X("p99_ms:Q", title="p99 of the run (ms)", scale=alt.Scale(type="log")),
            y=alt.Y("metric:N", title=None),
            color=alt.Color(
                "flagged:N", scale=alt.Scale(domain=["ordinary", "flagged"], range=["#4c78a8", "#e45756"]), title=None
            ),
            tooltip=[alt.Tooltip("run:N"), alt.Tooltip("metric:N"), alt.Tooltip("p99_ms:Q", format=".3f")],
        )
        .properties(
            width=820,
            height=160,
            title=alt.Title(
                "p99 of each run",
                subtitle=["one tick per run and metric; red: flagged as an outlier on some signal"],
                anchor="start",
            ),
        )
    )
    return spec(chart)


def _outlier_table(runs: list[dict[str, Any]], out: Path) -> str:
    cols = ("run", "model", "p99 TTFT ms", "p99 TPOT ms", "t0 ms", "GB/s", "stall rate", "worst z", "flagged", "SLO")
    left = ' class="l"'
    head = "".join(f"<th{left if i < 2 else ''}>{html_text(c)}</th>" for i, c in enumerate(cols))
    body = []
    for r in runs:
        name = html_text(r["run_id"], limit=120)
        if r.get("report"):  # a relative link: the folder name is ours (file-name-safe), quoted anyway
            href = Path(os.path.relpath(Path(r["report"]) / "index.html", out)).as_posix()
            name = f'<a href="{html_text(href)}">{name}</a>'
        slo = (r.get("slo") or {}).get("verdict")
        css = {"pass": "pass", "fail": "fail", "error": "error"}.get(slo or "", "")
        cells = [
            f'<td class="l rid">{name}</td>',
            f'<td class="l">{fmt(r.get("model"))}</td>',
            *(
                f"<td>{fmt(v)}</td>"
                for v in (
                    r["ttft_ms"].get("p99"),
                    r["tpot_ms"].get("p99"),
                    r.get("t0_ms"),
                    r.get("effective_bandwidth_gbps"),
                )
            ),
            f"<td>{fmt(r.get('stall_rate'), 4)}</td>",
            f"<td>{fmt(r.get('worst_z'))}</td>",
            f'<td class="l">{html_text(", ".join(r["outlier"]) or "-")}</td>',
            f'<td class="{css}">{html_text(slo or "-")}</td>',
        ]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def write_fleet_page(result: dict[str, Any], out: Path) -> Path:
    """Write ``out/index.html`` for a :func:`pipeline.fleet.fleet` result; the runs' reports are in ``out/runs/``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs, fleet = result["runs"], result["fleet"]
    flagged = [r for r in runs if r["outlier"]]
    cards = [card("runs", fmt(len(runs))), card("flagged", fmt(len(flagged)), "fail" if flagged else "pass")]
    for m, label in (("ttft_ms", "fleet p99 TTFT ms"), ("tpot_ms", "fleet p99 TPOT ms")):
        cards.append(card(label, fmt(fleet[m].get("p99"))))
    slo = result.get("slo")
    if slo:
        cards.append(card("SLO (fleet and every run)", html_text(slo["verdict"]), slo["verdict"]))
    header = (
        f'<h1>tracelat fleet: {len(runs)} runs</h1><p class="sub">{html_text(result["executor"])}; '
        f"percentiles from merged sketches, within {result['sketch_relative_error']:.0%} of exact; "
        f"outliers: {html_text(result['outlier_rule'])}</p>"
        f'<div class="cards">{"".join(cards)}</div>'
    )
    sections = [Section("fleet", "Fleet statistics over all requests of all runs", body=_fleet_table(fleet))]
    chart = _p99_chart(runs)
    sections.append(
        Section(
            "spread",
            "Spread of per-run p99s",
            charts={"p99s": chart} if chart else {},
            missing=[] if chart else ["no run has latency values"],
        )
    )
    sections.append(
        Section(
            "outliers",
            "Runs, most unusual first",
            intro='<p class="sub">robust z per signal in its bad direction; each run id opens that run\'s report</p>',
            body=_outlier_table(runs, out),
        )
    )
    if slo:
        checks = "".join(
            f'<tr><td class="l">{html_text(c["name"])}</td><td class="{c["status"]}">'
            f'{html_text(c["status"])}</td><td class="l">{html_text(c["message"])}</td></tr>'
            for c in slo["fleet"]["checks"]
        )
        note = "".join(f'<p class="sub">not fleet-wide: {html_text(n)}</p>' for n in slo["fleet"]["not_fleet_wide"])
        sections.append(Section("slo", "SLOs over the whole fleet", body=f"<table>{checks}</table>{note}"))
    stamp = generated_stamp()
    html_path = out / "index.html"
    html_path.write_text(
        page(
            f"tracelat fleet: {len(runs)} runs",
            header,
            sections,
            f"tracelat {html_text(__version__)}, generated {stamp}.",
        ),
        encoding="utf-8",
    )
    return html_path
