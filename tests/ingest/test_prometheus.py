"""Engine metrics from Prometheus scrapes: three file forms, one set of samples, percentiles from buckets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline import store
from pipeline.engine_metrics import histogram_quantiles
from pipeline.ingest import detect, ingest_paths
from pipeline.summary import summary

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "prometheus"
FILES = {
    "aiperf-server-metrics": FIX / "server_metrics_export.jsonl",
    "prometheus-text": FIX / "vllm-0_metrics.log",
    "prometheus-range": FIX / "query_range.json",
}


def _ttft_buckets():
    """The last scrape's cumulative TTFT buckets (the first is all zero): the run's increase."""
    last = json.loads((FIX / "server_metrics_export.jsonl").read_text().splitlines()[2])
    h = last["metrics"]["vllm:time_to_first_token_seconds"][0]["histogram"]
    les = np.array([float("inf") if k == "+Inf" else float(k) for k in h])
    return les, np.array(list(h.values()), dtype=float)


def _percentile_by_hand(les, cum, q):
    rank = q * cum[-1]
    i = next(k for k, c in enumerate(cum) if c >= rank)
    lo = 0.0 if i == 0 else les[i - 1]
    below = 0.0 if i == 0 else cum[i - 1]
    return 1000 * (lo + (les[i] - lo) * (rank - below) / (cum[i] - below))


@pytest.mark.parametrize("fmt", list(FILES))
@pytest.mark.long
def test_every_form_gives_the_same_ttft_percentiles(tmp_path, fmt):
    path = FILES[fmt]
    assert detect(path).name == fmt
    con = store.connect(tmp_path / "m.duckdb")
    res = ingest_paths(con, [path], run_id="m")[0]
    store.build_derived(con)
    assert res.lines_read == res.accepted + res.rejected + res.skipped
    s = summary(con, "m")["engine_metrics"]
    les, cum = _ttft_buckets()
    h = s["latency_from_histograms"]["ttft_ms"]
    assert h["count"] == cum[-1]
    for q in (0.5, 0.9, 0.99):
        got = h[f"p{int(q * 100)}"]
        assert got["value_ms"] == pytest.approx(_percentile_by_hand(les, cum, q))
        lo, hi = got["bucket_ms"]
        assert lo <= got["value_ms"] <= hi
    assert s["gauges"]["running_reqs"]["max"] == 5


@pytest.mark.long
def test_aiperf_counters_gauges_and_rejects(tmp_path):
    con = store.connect(tmp_path / "a.duckdb")
    res = ingest_paths(con, [FILES["aiperf-server-metrics"]], run_id="a")[0]
    store.build_derived(con)
    assert (res.lines_read, res.accepted, res.rejected) == (4, 3, 1)
    s = summary(con, "a")["engine_metrics"]
    assert s["counters"]["preemptions"]["increase"] == 3
    assert s["gauges"]["kv_usage"]["mean"] == pytest.approx((0.0 + 0.35 + 0.20) / 3)
    assert s["vllm_estimated_read_gb_per_s"] == pytest.approx(3.0e9 / 4.0 / 1e9)  # bytes over the 4 s scraped
    # a counter reset (engine restart) loses nothing: increases are summed, drops ignored
    lines = FILES["aiperf-server-metrics"].read_text().splitlines()[:3]
    again = json.loads(lines[2])
    again["timestamp_ns"] += 2_000_000_000
    again["metrics"]["vllm:num_preemptions_total"][0]["value"] = 1.0  # reset to 0, then one more
    p = tmp_path / "server_metrics_export.jsonl"
    p.write_text("\n".join([*lines, json.dumps(again)]) + "\n")
    ingest_paths(con, [p], run_id="b")
    store.build_derived(con)
    assert summary(con, "b")["engine_metrics"]["counters"]["preemptions"]["increase"] == 3 + 1


def test_quantile_in_the_open_bucket_says_so():
    les = np.array([0.1, 0.5, np.inf])
    q = histogram_quantiles(les, np.array([10.0, 50.0, 100.0]), (0.9,))["p90"]
    assert q["above_largest_bucket"] and q["value_ms"] == pytest.approx(500.0) and q["bucket_ms"] == [500.0, None]


def test_runs_without_samples_have_no_section(tmp_path):
    con = store.connect(tmp_path / "c.duckdb")
    ingest_paths(con, [Path(__file__).resolve().parents[2] / "fixtures" / "canonical" / "tiny.jsonl"])
    store.build_derived(con)
    run = con.execute("select run_id from runs").fetchone()[0]
    assert "engine_metrics" not in summary(con, run)


def test_gauge_totals_do_not_depend_on_the_order_of_the_label_sets():
    """A scrape's total over label sets adds them in one order: 0.1 + 0.2 + 0.3 is
    0.6000000000000001 left to right and 0.6 right to left, whichever order the rows came in."""
    got = []
    for values in ((0.1, 0.2, 0.3), (0.3, 0.2, 0.1)):
        con = store.connect(":memory:")
        for i, v in enumerate(values):
            con.execute(
                "insert into metric_samples by name select 'r' as run_id, ? as line_no, 1.0 as t, "
                "'vllm:kv_cache_usage_perc' as family, ? as labels, 'gauge' as kind, NULL as le, ? as value, "
                "1 as ingest_id",
                [i, json.dumps({"engine": str(int(v * 10))}), v],
            )
        stats = store.rows(con, "engine_metrics/gauge_stats", {"run": "r", "family": "vllm:kv_cache_usage_perc"})
        series = store.rows(con, "engine_metrics/gauge_series", {"run": "r", "fams": ["vllm:kv_cache_usage_perc"]})
        got.append((stats, series))
        con.close()
    assert got[0] == got[1]
    assert got[0][0][0][1] == sum(sorted([0.1, 0.2, 0.3]))  # the label sets in order: 0.1 + 0.2 + 0.3
