"""Golden Vega-Lite specs (sorted JSON) of every chart, built from small fixed frames.

Regenerate after an intended change with ``TRACELAT_UPDATE_GOLDEN=1 pytest tests/report/test_golden.py``
and review the diff.  The HTML itself is never compared byte for byte.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest

from pipeline.report import charts

GOLDEN = Path(__file__).resolve().parents[1] / "golden"

TIMELINE = pl.DataFrame(
    {"t_s": [0.0, 1.0, 2.0], "lo_ms": [5.0, 6.0, 5.5], "mean_ms": [6.0, 9.0, 6.5], "hi_ms": [8.0, 60.0, 7.0]}
)
SPIKES = pl.DataFrame({"t_s": [1.2], "iteration_ms": [60.0], "cause": ["prefill"], "residual_ms": [41.5]})
SCATTER = pl.DataFrame(
    {
        "context_tokens": [100, 2000, 4000],
        "iteration_ms": [5.1, 5.9, 30.2],
        "batch": ["decode only", "decode only", "with prefill"],
    }
)
CELLS = pl.DataFrame(
    {
        "kind": ["cell", "cell", "point"],
        "ctx_lo": [0.0, 50.0, None],
        "ctx_hi": [50.0, 100.0, None],
        "ms_lo": [5.0, 5.0, None],
        "ms_hi": [6.0, 6.0, None],
        "count": [10, 3, None],
        "context_tokens": [None, None, 90],
        "iteration_ms": [None, None, 80.0],
        "batch": [None, None, "with prefill"],
    }
)
FIT = pl.DataFrame({"context_tokens": [0.0, 4000.0], "predicted_ms": [5.0, 6.0]})
CDF = pl.DataFrame({"value_ms": [1.0, 2.0, 3.0, 100.0], "fraction": [0.25, 0.5, 0.75, 1.0]})
TAIL = pl.DataFrame(
    {
        "metric": ["ttft", "ttft", "tpot"],
        "part": ["waiting_hol", "own_prefill", "decode_baseline"],
        "share": [0.8, 0.2, 1.0],
    }
)
QUEUE = pl.DataFrame(
    {
        "t_s": [0.0, 1.0, 0.0, 1.0, 0.0, 1.0],
        "series": ["running requests"] * 2 + ["waiting requests"] * 2 + ["KV usage %"] * 2,
        "value": [3.0, 4.0, 0.0, 2.0, 10.0, 20.0],
    }
)
CMP = pl.DataFrame(
    {
        "value_ms": [1.0, 2.0, 1.5, 2.5],
        "fraction": [0.5, 1.0, 0.5, 1.0],
        "run": ["baseline", "baseline", "candidate", "candidate"],
    }
)
DELTAS = pl.DataFrame(
    {
        "label": ["ttft_ms p99", "tpot_ms p50"],
        "rel": [0.3, 0.0],
        "rel_lo": [0.2, -0.01],
        "rel_hi": [0.4, 0.01],
        "verdict": ["regression", "no significant change"],
    }
)

CHARTS = {
    "timeline": lambda: charts.timeline(TIMELINE, "3 buckets", SPIKES, "points: all 1 spikes"),
    "timeline_raw_no_spikes": lambda: charts.timeline(
        TIMELINE.with_columns(lo_ms=pl.col("mean_ms"), hi_ms=pl.col("mean_ms")),
        "all 3 iterations",
        None,
        "spikes: not available",
    ),
    "context_points": lambda: charts.context_scatter(SCATTER, "all 3 iterations", FIT, "dashed: fit"),
    "context_cells": lambda: charts.context_scatter(CELLS, "histogram", None, "fitted line: not available"),
    "cdf_log": lambda: charts.cdf(CDF, "ttft_ms", "all 4 values (exact empirical CDF)", {"p50": 2.0, "p99": 97.0}),
    "tail": lambda: charts.tail_bars(TAIL),
    "queue": lambda: charts.queue(QUEUE, "all 2 iterations"),
    "compare_cdf": lambda: charts.compare_cdf(CMP, "itl_ms", "exact"),
    "compare_deltas": lambda: charts.compare_deltas(DELTAS, 0.05),
}


@pytest.mark.parametrize("name", sorted(CHARTS))
def test_chart_spec_matches_golden(name):
    spec = json.loads(json.dumps(CHARTS[name]().to_dict(), sort_keys=True))  # validates against the schema
    path = GOLDEN / f"chart_{name}.json"
    text = json.dumps(spec, sort_keys=True, indent=1) + "\n"
    if os.environ.get("TRACELAT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with TRACELAT_UPDATE_GOLDEN=1 to create it"
    assert json.loads(path.read_text()) == spec


def test_chart_data_is_the_frame():
    spec = charts.spec(charts.cdf(CDF, "ttft_ms", "exact", {"p50": 2.0, "p99": None}))
    datasets = spec["datasets"]
    assert CDF.to_dicts() in datasets.values()
    assert [{"stat": "p50", "value_ms": 2.0, "label": "p50 2.0 ms"}] in datasets.values()
    assert spec["layer"][0]["encoding"]["x"]["scale"]["type"] == "log"  # 1..100 spans two decades


def test_big_frames_do_not_hit_altair_row_limit():
    big = pl.DataFrame(
        {"t_s": [float(i) for i in range(9000)], "series": ["waiting requests"] * 9000, "value": [1.0] * 9000}
    )
    spec = charts.spec(charts.queue(big, "many"))
    assert max(len(v) for v in spec["datasets"].values()) == 9000
