"""Plot frames: every reduction checked against numpy on the raw values."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.report import frames


def raw(con, sql, run_id):
    return np.array([r[0] for r in con.execute(sql, [run_id]).fetchall()], dtype=float)


def test_timeline_raw_then_bucketed(synth_run):
    con, rid = synth_run
    ms = raw(con, "select iteration_ms from iteration_metrics where run_id = ? order by iter", rid)
    t0 = frames.origin_s(con, rid)
    x = raw(con, "select t_start from iteration_metrics where run_id = ? order by iter", rid) - t0
    small = frames.iteration_timeline(con, rid, max_points=1000)
    assert small.df.height == len(ms) and small.method == "all 400 iterations"
    np.testing.assert_allclose(small.df["mean_ms"].to_numpy(), ms.round(4))
    big = frames.iteration_timeline(con, rid, max_points=60)  # 20 buckets
    w = x.max() / 20
    b = np.floor(x / w)
    for row in big.df.iter_rows(named=True):
        sel = ms[np.isclose(b * w, row["t_s"], atol=1e-4)]
        assert row["lo_ms"] == pytest.approx(sel.min(), abs=1e-4)
        assert row["hi_ms"] == pytest.approx(sel.max(), abs=1e-4)
        assert row["mean_ms"] == pytest.approx(sel.mean(), abs=1e-4)
    assert big.df.height <= 21 and big.df["hi_ms"].max() == pytest.approx(ms.max(), abs=1e-4)  # no spike lost
    assert "time buckets" in big.method


@pytest.mark.parametrize(
    "metric, sql",
    [
        ("ttft_ms", "select ttft_ms from request_latency where run_id = ? and status = 'ok'"),
        ("itl_ms", "select itl_ms from token_gaps where run_id = ?"),
    ],
)
def test_cdf_exact_and_quantile_grid(synth_run, metric, sql):
    con, rid = synth_run
    v = np.sort(raw(con, sql, rid))
    exact = frames.cdf(con, rid, metric, points=100_000)
    np.testing.assert_allclose(exact.df["value_ms"].to_numpy(), v.round(6), atol=1e-6)
    np.testing.assert_allclose(exact.df["fraction"].to_numpy(), np.arange(1, len(v) + 1) / len(v), atol=1e-6)
    grid = frames.cdf(con, rid, metric, points=50)
    assert grid.df.height == 50 and grid.df["fraction"][0] == 0 and grid.df["fraction"][-1] == 1
    np.testing.assert_allclose(
        grid.df["value_ms"].to_numpy(), np.percentile(v, grid.df["fraction"].to_numpy() * 100), atol=2e-6
    )
    assert (grid.df["fraction"] >= 0.99).sum() == 10  # a fifth of the points spent on the top 1%


def test_context_histogram_accounts_for_every_iteration(synth_run):
    con, rid = synth_run
    ms = raw(con, "select iteration_ms from iteration_metrics where run_id = ?", rid)
    fr = frames.iteration_vs_context(con, rid, max_points=100)
    cells = fr.df.filter(fr.df["kind"] == "cell")
    points = fr.df.filter(fr.df["kind"] == "point")
    cap = np.percentile(ms, 99.9)
    assert cells["count"].sum() == (ms <= cap).sum()
    assert points.height == (ms > cap).sum() >= 1
    assert sorted(points["iteration_ms"].to_list()) == pytest.approx(sorted(ms[ms > cap].round(4)))
    small = frames.iteration_vs_context(con, rid, max_points=1000)
    assert small.df.height == len(ms) and set(small.df["batch"]) == {"decode only", "with prefill"}


def test_queue_series_bucket_means(synth_run):
    con, rid = synth_run
    t0 = frames.origin_s(con, rid)
    x = raw(con, "select t_start from iteration_metrics where run_id = ? order by iter", rid) - t0
    kv = raw(con, "select kv_usage from iteration_metrics where run_id = ? order by iter", rid) * 100
    fr = frames.queue_series(con, rid, max_points=40)  # 10 buckets
    w = x.max() / 10
    got = fr.df.filter(fr.df["series"] == "KV usage %").sort("t_s")
    b = np.floor(x / w)
    want = [kv[b == k].mean() for k in np.unique(b)]
    np.testing.assert_allclose(got["value"].to_numpy(), want, atol=1e-3)
    assert set(fr.df["series"]) == {"running requests", "waiting requests", "KV usage %"}


def test_top_requests_and_iterations(synth_run):
    con, rid = synth_run
    ttft = raw(con, "select ttft_ms from request_latency where run_id = ?", rid)
    top = frames.top_requests(con, rid, "ttft_ms", n=5)
    np.testing.assert_allclose(top["ttft_ms"].to_numpy(), np.sort(ttft)[::-1][:5].round(2))
    it = frames.top_iterations(con, rid, n=3)
    assert it.height == 3


def test_tail_shares_tolerates_odd_sections():
    assert frames.tail_shares({}) is None
    assert frames.tail_shares({"tail": None}) is None
    df = frames.tail_shares({"tail": {"ttft": {"waiting": 0.7, "prefill": 0.3, "bad": "x"}, "tpot": None}})
    assert df.to_dicts() == [
        {"metric": "ttft", "part": "waiting", "share": 0.7},
        {"metric": "ttft", "part": "prefill", "share": 0.3},
    ]


def test_time_axes_start_at_the_runs_first_event_as_explain_and_perfetto_do(tmp_path):
    """A server log that starts before the client's first request: the report measured time from the
    first arrival, so the early step sat at -0.495 s while explain and the Perfetto timeline put it at 0."""
    import json
    from pathlib import Path

    from pipeline import store
    from pipeline.fit.attribution import run_start
    from pipeline.ingest import ingest_paths

    tiny = Path(__file__).resolve().parents[2] / "fixtures" / "canonical" / "tiny.jsonl"
    lines = tiny.read_text().splitlines()
    warm = {"kind": "iteration", "iter": 100, "t_start": 0.5, "t_end": 0.52, "decode_tokens": 1, "decode_reqs": 1}
    f = tmp_path / "warm.jsonl"
    f.write_text("\n".join([lines[0], json.dumps(warm), *lines[1:]]) + "\n")
    con = store.connect(tmp_path / "w.duckdb")
    ingest_paths(con, [f])
    store.build_derived(con)
    first_arrival = con.execute("select min(t_arrival) from requests").fetchall()[0][0]
    assert first_arrival > 0.5 and run_start(con, "tiny") == 0.5
    assert frames.origin_s(con, "tiny") == 0.5
    t = frames.iteration_timeline(con, "tiny").df
    assert t["t_s"].min() == 0.0 and (t["t_s"] >= 0).all()


def test_steps_without_time_stamps_are_left_off_time_axes_and_said_so(tmp_path):
    """Steps with only dur_ms: the timeline and queue charts got rows at t = null (drawn nowhere)
    while their subtitles said "all N iterations"."""
    import json
    from pathlib import Path

    from pipeline import store
    from pipeline.ingest import ingest_paths

    tiny = Path(__file__).resolve().parents[2] / "fixtures" / "canonical" / "tiny.jsonl"
    lines = tiny.read_text().splitlines()
    extra = [{"kind": "iteration", "iter": 500 + k, "dur_ms": 9.0, "running_reqs": 2} for k in range(4)]
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join([*lines, *map(json.dumps, extra)]) + "\n")
    con = store.connect(tmp_path / "d.duckdb")
    ingest_paths(con, [f])
    store.build_derived(con)
    timed = con.execute("select count(*) from iterations where t_start is not null or t_end is not null").fetchall()[0][
        0
    ]
    t = frames.iteration_timeline(con, "tiny")
    assert t.df.height == timed and t.df["t_s"].null_count() == 0
    assert t.method == f"all {timed:,} iterations (4 without time stamps left out)"
    q = frames.queue_series(con, "tiny")
    assert q.df["t_s"].null_count() == 0 and "(4 without time stamps left out)" in q.method
