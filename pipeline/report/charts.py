"""Chart builders: pure functions from small Polars frames to Altair charts (no I/O).

Frames go to Altair as they are: ``to_dict`` embeds their rows in the spec's
top-level ``datasets`` (named by a hash of the values), so a spec is self-contained
and its JSON can be compared with a golden file.  Frames hold thousands of rows at
most; callers converting a chart use :func:`spec`, which lifts Altair's 5000-row
guard for the queue chart's long frame.  Every chart
says in its subtitle how its data was reduced (see :mod:`.frames`).
"""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from ..metrics import REGISTRY

WIDTH, HEIGHT = 820, 240
CAUSES = ["prefill", "preemption", "unexplained"]
CAUSE_COLORS = ["#e45756", "#f58518", "#7f3c8d"]
LABELS = {m.name: m.axis_title for m in REGISTRY if m.stats}  # "TTFT (ms)", "E2E latency (ms)", ...


def _data(df: pl.DataFrame) -> pl.DataFrame:
    return df


def _rows(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(rows)


# Altair checks every object against the Vega-Lite JSON schema as it is built and the whole
# spec again in ``to_dict``: about 1 s of a 1.3 s report, and of every nightly trend page.
# The specs' structure is this package's code, not data, so pages skip both checks; the
# tests turn VALIDATE on and validate every page's specs against the schema.
VALIDATE = False
alt.utils.schemapi.disable_debug_mode()


def spec(chart: alt.TopLevelMixin) -> dict[str, Any]:
    """The Vega-Lite spec of a chart (dict), data included."""
    with alt.data_transformers.disable_max_rows():
        return chart.to_dict(validate=VALIDATE)


def _title(text: str, *subtitle: str) -> alt.Title:
    return alt.Title(text, subtitle=[s for s in subtitle if s], anchor="start")


def _log_ok(values: pl.Series) -> bool:
    """A log axis helps when values are positive and span more than ~2 decades."""
    v = values.drop_nulls()
    return v.len() > 0 and v.min() > 0 and v.max() / v.min() > 50


def timeline(df: pl.DataFrame, method: str, spikes: pl.DataFrame | None, spikes_note: str) -> alt.LayerChart:
    """Iteration time over the run (``t_s, lo_ms, mean_ms, hi_ms``), spikes coloured by cause."""
    base = alt.Chart(_data(df)).encode(x=alt.X("t_s:Q", title="time since run start (s)"))
    layers: list[alt.Chart] = []
    if (df["lo_ms"] != df["hi_ms"]).any():
        layers.append(
            base.mark_area(opacity=0.3, color="#4c78a8").encode(
                y=alt.Y("lo_ms:Q", title="iteration time (ms)"), y2=alt.Y2("hi_ms:Q")
            )
        )
    layers.append(
        base.mark_line(strokeWidth=1, color="#4c78a8").encode(
            y=alt.Y("mean_ms:Q", title="iteration time (ms)"),
            tooltip=[alt.Tooltip("t_s:Q", format=".3f"), alt.Tooltip("mean_ms:Q", format=".2f")],
        )
    )
    if spikes is not None and spikes.height:
        layers.append(
            alt.Chart(_data(spikes))
            .mark_point(filled=True, size=40)
            .encode(
                x=alt.X("t_s:Q"),
                y=alt.Y("iteration_ms:Q"),
                color=alt.Color("cause:N", scale=alt.Scale(domain=CAUSES, range=CAUSE_COLORS), title="spike cause"),
                tooltip=[
                    alt.Tooltip("t_s:Q", format=".3f"),
                    alt.Tooltip("iteration_ms:Q", format=".2f"),
                    alt.Tooltip("cause:N"),
                    alt.Tooltip("residual_ms:Q", format=".2f"),
                ],
            )
        )
    return alt.layer(*layers).properties(
        width=WIDTH, height=HEIGHT, title=_title("Iteration time over the run", method, spikes_note)
    )


def context_scatter(df: pl.DataFrame, method: str, fit_line: pl.DataFrame | None, fit_note: str) -> alt.LayerChart:
    """Iteration time vs KV context tokens; big runs arrive as histogram cells plus tail points."""
    layers: list[alt.Chart] = []
    y_title = "iteration time (ms)"
    if "kind" in df.columns:
        cells, points = df.filter(pl.col("kind") == "cell"), df.filter(pl.col("kind") == "point")
        layers.append(
            alt.Chart(_data(cells.drop("context_tokens", "iteration_ms", "batch", strict=False)))
            .mark_rect()
            .encode(
                x=alt.X("ctx_lo:Q", bin="binned", title="context tokens in the batch"),
                x2=alt.X2("ctx_hi:Q"),
                y=alt.Y("ms_lo:Q", bin="binned", title=y_title),
                y2=alt.Y2("ms_hi:Q"),
                color=alt.Color("count:Q", scale=alt.Scale(type="log", scheme="blues"), title="iterations"),
                tooltip=[alt.Tooltip("ctx_lo:Q"), alt.Tooltip("ms_lo:Q"), alt.Tooltip("count:Q")],
            )
        )
        df = points.select("context_tokens", "iteration_ms", "batch")
    if df.height:
        layers.append(
            alt.Chart(_data(df))
            .mark_circle(size=12, opacity=0.6)
            .encode(
                x=alt.X("context_tokens:Q", title="context tokens in the batch"),
                y=alt.Y("iteration_ms:Q", title=y_title),
                color=alt.Color(
                    "batch:N",
                    scale=alt.Scale(domain=["decode only", "with prefill"], range=["#4c78a8", "#e45756"]),
                    title="batch",
                ),
                tooltip=[
                    alt.Tooltip("context_tokens:Q"),
                    alt.Tooltip("iteration_ms:Q", format=".2f"),
                    alt.Tooltip("batch:N"),
                ],
            )
        )
    if fit_line is not None and fit_line.height:
        layers.append(
            alt.Chart(_data(fit_line))
            .mark_line(color="black", strokeDash=[6, 3])
            .encode(x=alt.X("context_tokens:Q"), y=alt.Y("predicted_ms:Q"))
        )
    return alt.layer(*layers).properties(
        width=WIDTH,
        height=HEIGHT + 60,
        title=_title("Iteration time vs context tokens (the memory-bound decode line)", method, fit_note),
    )


def cdf(df: pl.DataFrame, metric: str, method: str, marks: dict[str, float | None]) -> alt.LayerChart:
    """Empirical CDF (``value_ms, fraction``) with vertical rules at the given percentiles."""
    log = _log_ok(df["value_ms"])
    x = alt.X(
        "value_ms:Q",
        title=LABELS.get(metric, metric) + (" (log scale)" if log else ""),
        scale=alt.Scale(type="log") if log else alt.Scale(zero=False),
    )
    line = (
        alt.Chart(_data(df))
        .mark_line(interpolate="step-after" if "exact" in method else "linear")
        .encode(
            x=x,
            y=alt.Y("fraction:Q", title="fraction of values <=", scale=alt.Scale(domain=[0, 1])),
            tooltip=[alt.Tooltip("value_ms:Q", format=".3f"), alt.Tooltip("fraction:Q", format=".4f")],
        )
    )
    rows = [
        {"stat": k, "value_ms": round(float(v), 4), "label": f"{k} {v:.1f} ms"}
        for k, v in marks.items()
        if v is not None and (not log or v > 0)
    ]
    layers: list[alt.Chart] = [line]
    if rows:
        rules = alt.Chart(_rows(rows)).encode(x=alt.X("value_ms:Q"))
        layers.append(rules.mark_rule(strokeDash=[4, 2], color="#e45756"))
        layers.append(
            rules.mark_text(align="left", dx=4, dy=-6, color="#e45756").encode(
                y=alt.YValue(12), text=alt.Text("label:N")
            )
        )
    return alt.layer(*layers).properties(
        width=WIDTH // 2 - 30, height=HEIGHT, title=_title(f"{LABELS.get(metric, metric)}: distribution", method)
    )


def tail_bars(df: pl.DataFrame) -> alt.FacetChart:
    """Tail attribution: share of each part in (tail - median) latency, one row per metric."""
    chart = (
        alt.Chart(_data(df))
        .mark_bar()
        .encode(
            x=alt.X("share:Q", axis=alt.Axis(format="%"), title="share of the tail's extra latency"),
            y=alt.Y("part:N", title=None, sort="-x"),
            color=alt.Color("part:N", legend=None),
            tooltip=[alt.Tooltip("metric:N"), alt.Tooltip("part:N"), alt.Tooltip("share:Q", format=".1%")],
        )
        .properties(width=WIDTH - 260, height=alt.Step(18))
    )
    return (
        chart.facet(row=alt.Row("metric:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left")))
        .resolve_scale(y="independent")
        .properties(
            title=_title(
                "Tail attribution: what grows from the median (p40-p60) to the tail (>= p99)",
                "mean part in the >= p99 group minus mean part in the p40-p60 group, as shares",
            )
        )
    )


def queue(df: pl.DataFrame, method: str) -> alt.VConcatChart:
    """Running / waiting requests and KV-cache usage over time (long frame ``t_s, series, value``)."""
    reqs = df.filter(pl.col("series") != "KV usage %")
    kv = df.filter(pl.col("series") == "KV usage %")
    x = alt.X("t_s:Q", title="time since run start (s)")
    top = (
        alt.Chart(_data(reqs))
        .mark_line(strokeWidth=1)
        .encode(
            x=x,
            y=alt.Y("value:Q", title="requests"),
            color=alt.Color(
                "series:N",
                scale=alt.Scale(domain=["running requests", "waiting requests"], range=["#4c78a8", "#f58518"]),
                title=None,
            ),
            tooltip=[alt.Tooltip("series:N"), alt.Tooltip("t_s:Q", format=".3f"), alt.Tooltip("value:Q", format=".1f")],
        )
        .properties(width=WIDTH, height=HEIGHT - 60)
    )
    parts: list[Any] = [top] if reqs.height else []
    if kv.height:
        parts.append(
            alt.Chart(_data(kv))
            .mark_line(strokeWidth=1, color="#54a24b")
            .encode(
                x=x,
                y=alt.Y("value:Q", title="KV cache used (%)", scale=alt.Scale(domain=[0, 100])),
                tooltip=[alt.Tooltip("t_s:Q", format=".3f"), alt.Tooltip("value:Q", format=".1f")],
            )
            .properties(width=WIDTH, height=HEIGHT - 100)
        )
    return alt.vconcat(*parts).properties(title=_title("Queue depth, running requests and KV-cache usage", method))


def compare_cdf(df: pl.DataFrame, metric: str, method: str) -> alt.Chart:
    """Overlaid CDFs of one metric for two runs (``value_ms, fraction, run``)."""
    log = _log_ok(df["value_ms"])
    return (
        alt.Chart(_data(df))
        .mark_line()
        .encode(
            x=alt.X(
                "value_ms:Q",
                title=LABELS.get(metric, metric) + (" (log scale)" if log else ""),
                scale=alt.Scale(type="log") if log else alt.Scale(zero=False),
            ),
            y=alt.Y("fraction:Q", title="fraction of values <=", scale=alt.Scale(domain=[0, 1])),
            color=alt.Color(
                "run:N", scale=alt.Scale(domain=["baseline", "candidate"], range=["#4c78a8", "#e45756"]), title=None
            ),
            tooltip=[
                alt.Tooltip("run:N"),
                alt.Tooltip("value_ms:Q", format=".3f"),
                alt.Tooltip("fraction:Q", format=".4f"),
            ],
        )
        .properties(
            width=WIDTH // 2 - 30,
            height=HEIGHT,
            title=_title(f"{LABELS.get(metric, metric)}: baseline vs candidate", method),
        )
    )


def compare_deltas(df: pl.DataFrame, threshold: float) -> alt.LayerChart:
    """Relative change per metric/statistic with its bootstrap CI (``label, rel, rel_lo, rel_hi, verdict``)."""
    base = alt.Chart(_data(df)).encode(y=alt.Y("label:N", title=None, sort=None))
    colors = alt.Scale(
        domain=["regression", "improvement", "below threshold", "no significant change", "no verdict"],
        range=["#e45756", "#54a24b", "#b279a2", "#9d9d9d", "#d0d0d0"],
    )
    bars = base.mark_errorbar(ticks=True).encode(
        x=alt.X("rel_lo:Q", axis=alt.Axis(format="%"), title="candidate vs baseline (relative change, CI)"),
        x2=alt.X2("rel_hi:Q"),
        color=alt.Color("verdict:N", scale=colors, title=None),
    )
    dots = base.mark_point(filled=True, size=50).encode(
        x=alt.X("rel:Q"),
        color=alt.Color("verdict:N", scale=colors, title=None),
        tooltip=[
            alt.Tooltip("label:N"),
            alt.Tooltip("rel:Q", format="+.2%"),
            alt.Tooltip("rel_lo:Q", format="+.2%"),
            alt.Tooltip("rel_hi:Q", format="+.2%"),
            alt.Tooltip("verdict:N"),
        ],
    )
    rules = (
        alt.Chart(_rows([{"x": -threshold}, {"x": 0.0}, {"x": threshold}]))
        .mark_rule(strokeDash=[3, 3], color="#888")
        .encode(x=alt.X("x:Q"))
    )
    return alt.layer(rules, bars, dots).properties(
        width=WIDTH - 200,
        height=alt.Step(16),
        title=_title("Change of each statistic", f"dashed lines: 0 and the +/-{threshold:.0%} regression threshold"),
    )
