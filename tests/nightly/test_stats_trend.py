"""A night's statistics (intervals by hand) and the trend page (escaping, charts, links;
drawn in headless Chromium when it passes its preflight)."""

from __future__ import annotations

import json
import re

import numpy as np
import polars as pl
import pytest
from scipy.stats import t as student_t

from pipeline.nightly.analysis import changes
from pipeline.nightly.changepoint import Settings
from pipeline.nightly.history import Night
from pipeline.nightly.stats import _fit, _proportion, night_statistics
from pipeline.nightly.trend import write_trend

from ..vega import validate_vega_lite
from .conftest import simulate_night, tpot_from_trace


def test_fit_intervals_by_hand():
    s = {
        "fit": {
            "t0_ms": 5.0,
            "ms_per_1k_context_tokens": 0.2,
            "effective_bandwidth_gbps": 500.0,
            "ci": {"t0_ms": [4.9, 5.1], "a_ms_per_ctx": [0.00018, 0.00025]},
        }
    }
    got = {st.metric: st for st in _fit(s)}
    assert (got["fit.t0_ms"].ci_low, got["fit.t0_ms"].ci_high) == (4.9, 5.1)
    slope = got["fit.ms_per_1k_context_tokens"]
    assert slope.ci_low == pytest.approx(0.18) and slope.ci_high == pytest.approx(0.25)
    bw = got["fit.effective_bandwidth_gbps"]  # 500 GB/s at a = 0.0002: the interval is a's, inverted
    assert bw.ci_low == pytest.approx(500 * 0.0002 / 0.00025) and bw.ci_high == pytest.approx(500 * 0.0002 / 0.00018)
    s["fit"]["ci"]["a_ms_per_ctx"] = [-0.0001, 0.00025]  # a slope CI reaching 0: no upper bandwidth bound
    assert {st.metric: st for st in _fit(s)}["fit.effective_bandwidth_gbps"].ci_high is None


def test_proportion_interval():
    """Wilson's interval (statsmodels' proportion_confint(90, 100, method='wilson') gives
    0.8256..0.9448); at 100 of 100 it keeps a width, n / (n + z^2) to 1, where the normal
    interval collapses to [1, 1]."""
    (st,) = _proportion("goodput.attainment", 90, 100, 1.96)
    assert (
        st.value == 0.9
        and st.ci_low == pytest.approx(0.82557, abs=1e-4)
        and st.ci_high == pytest.approx(0.94476, abs=1e-4)
    )
    (full,) = _proportion("goodput.attainment", 100, 100, 1.96)
    assert full.value == 1.0 and full.ci_low == pytest.approx(100 / (100 + 1.96**2))
    assert full.ci_high == 1.0  # exactly: computed, it read 0.9999999999999998
    (none,) = _proportion("stalls.rate", 0, 5000, 1.96)
    assert none.ci_low == 0.0 and none.ci_high == pytest.approx(1.96**2 / (5000 + 1.96**2))  # not 5.4e-20


def test_night_statistics_on_a_simulated_run(tmp_path):
    from pipeline import store
    from pipeline.summary import summary
    from pipeline.ingest import ingest_paths

    night = simulate_night(tmp_path / "n", seed=3)
    con = store.connect(tmp_path / "s.duckdb")
    ingest_paths(con, [night])
    store.build_derived(con)
    s = summary(con, "bench")
    stats = {st.metric: st for st in night_statistics(con, "bench", s)}
    # goodput on a metric the run lacks is not measured: no attainment of 0 in the history
    unmeasured = {"requests": 80, "good_requests": 0, "attainment": None, "request_goodput_rps": None}
    assert not [st for st in night_statistics(con, "bench", s, unmeasured) if st.metric.startswith("goodput.")]
    tpot = tpot_from_trace(night / "trace.jsonl")
    for p in (50, 90, 99):
        st = stats[f"tpot_ms.p{p}"]
        assert st.value == pytest.approx(np.percentile(tpot, p))
        if len(tpot) * (1 - p / 100) >= 10:  # enough values beyond it for a block-bootstrap interval
            assert st.ci_low <= st.value <= st.ci_high
        else:
            assert st.ci_low is None and st.ci_high is None
    assert len(tpot) < 1000 and stats["tpot_ms.p99"].ci_low is None  # both kinds were seen
    assert stats["iteration_ms.cv"].value == pytest.approx(s["iteration_ms"]["cv"])
    steady = s["steady_state"]
    assert steady["reached"], steady["reason"]  # a constant-rate simulated night holds its load
    got = stats["throughput.steady_output_tokens_per_s"]
    assert got.value == pytest.approx(steady["steady_output_tokens_per_s"])
    u = steady["uncertainty"]  # a 95% interval: t on the steady windows times the SE, plus the edge allowance
    half = student_t.ppf(0.975, u["windows"] - 1) * u["output_tokens_per_s_se"] + u["output_tokens_per_s_edge"]
    assert (got.ci_low, got.ci_high) == pytest.approx((got.value - half, got.value + half), rel=1e-12)
    assert stats["fit.effective_bandwidth_gbps"].value == pytest.approx(s["fit"]["effective_bandwidth_gbps"])
    assert stats["stalls.rate"].value == pytest.approx(s["spikes"]["unexplained"] / s["iterations"])
    assert {m for m in stats if m.startswith("tail.tpot.")} >= {
        "tail.tpot.decode_baseline",
        "tail.tpot.prefill_interference",
    }
    assert "goodput.attainment" not in stats  # only with an SLO file that has [goodput]
    con.close()


HOSTILE = '"><img src=x onerror=alert(1)><!--</script>'


def _trend(tmp_path):
    n = 14
    nights = [
        Night(
            i + 1,
            f"{HOSTILE}{i}" if i == 3 else f"2026-11-{i + 1:02d}",
            f"2026-11-{i + 1:02d}",
            labels={"commit": HOSTILE},
            report=str(tmp_path / "out" / f"r{i}"),
        )
        for i in range(n)
    ]
    vals = 10 * np.exp(np.random.default_rng(0).normal(0, 0.02, n)) * np.where(np.arange(n) >= 7, 1.3, 1.0)
    rows = [
        {
            "run_id": nights[i].run_id,
            "seq": i + 1,
            "night": nights[i].night,
            "metric": m,
            "value": float(v),
            "ci_low": float(v) * 0.97,
            "ci_high": float(v) * 1.03,
        }
        for i in range(n)
        for m, v in (("tpot_ms.p99", vals[i]), ("throughput.requests_per_s", 5.0), ("tail.tpot.decode_baseline", 0.3))
    ]
    series = pl.DataFrame(rows)
    found = changes(series, nights, Settings())
    return write_trend(tmp_path / "out", nights, series, found, [], 0.05), found


def test_trend_page_escapes_and_links(tmp_path, string_channels):
    path, found = _trend(tmp_path)
    assert not string_channels
    html = path.read_text()
    assert [c.metric for c in found] == ["tpot_ms.p99"]
    body = html.split("</head>", 1)[1]  # the vega bundle in the head has markup of its own
    assert HOSTILE not in html and "<img" not in body and "<!--" not in body
    assert 'href="r0/index.html"' in html and 'href="r13/index.html"' in html
    specs = json.loads(re.search(r'id="tracelat-specs">(.*?)</script>', html, re.S).group(1))
    assert len(specs) == 3  # TPOT p99, requests/s, the TPOT tail
    for spec in specs.values():  # built without Altair's checks (charts.VALIDATE): valid Vega-Lite
        validate_vega_lite(spec)
    # the change point is drawn between nights 7 and 8 (1-based), labelled with its size
    rule = [d for d in specs["latency_0"]["datasets"].values() if d and "text" in d[0]]
    assert rule and rule[0][0]["x"] == 7.5 and rule[0][0]["text"].startswith("+")


@pytest.mark.browser
@pytest.mark.long
def test_trend_page_draws_offline(chromium, tmp_path):
    path, _ = _trend(tmp_path)
    page = chromium.dump_dom(path)  # skipped only when the browser fails its own preflight
    status = re.search(r'<p id="render-status"([^>]*)>', page.dom).group(1)
    assert dict(re.findall(r'data-(\w+)="(\d+)"', status)) == {"done": "1", "ok": "3", "failed": "0"}
    assert page.console == []
