"""Change points over a history, new ones, open regressions, the auto baseline and the
tail cause, on synthetic histories whose truth is known (no store, no simulator)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pipeline.nightly import analysis
from pipeline.nightly.changepoint import Settings
from pipeline.nightly.history import Night
from pipeline.nightly.stats import direction, label

N, STEP = 24, 14


def _history(series: dict[str, np.ndarray], failed: set[int] = frozenset()) -> tuple[list[Night], pl.DataFrame]:
    nights = [
        Night(i + 1, f"n{i:02d}", f"2026-11-{i + 1:02d}", slo_verdict="fail" if i in failed else "pass")
        for i in range(N)
    ]
    rows = [
        {
            "run_id": nights[i].run_id,
            "seq": i + 1,
            "night": nights[i].night,
            "metric": m,
            "value": float(v[i]),
            "ci_low": None,
            "ci_high": None,
        }
        for m, v in series.items()
        for i in range(N)
    ]
    return nights, pl.DataFrame(rows)


def _noise(seed: int, sigma: float = 0.03) -> np.ndarray:
    return np.exp(np.random.default_rng(seed).normal(0, sigma, N))


def _step(size: float, at: int = STEP) -> np.ndarray:
    return np.where(np.arange(N) >= at, 1 + size, 1.0)


@pytest.fixture
def history():
    return _history(
        {
            "tpot_ms.p99": 10 * _noise(1) * _step(0.25),
            "throughput.output_tokens_per_s": 1000 * _noise(2) * _step(-0.2),
            "ttft_ms.p99": 50 * _noise(3),
            "tail.tpot.decode_baseline": 0.2 + 0.3 * (np.arange(N) >= STEP) + 0.01 * _noise(4),
            "tail.tpot.prefill_interference": 0.8 - 0.3 * (np.arange(N) >= STEP) + 0.01 * _noise(5),
        },
        failed={20},
    )


def test_changes_before_after_and_direction(history):
    nights, series = history
    found = {c.metric: c for c in analysis.changes(series, nights, Settings())}
    assert set(found) == {"tpot_ms.p99", "throughput.output_tokens_per_s"}  # tail shares are not tested
    tpot = found["tpot_ms.p99"]
    vals = series.filter(pl.col("metric") == "tpot_ms.p99")["value"].to_numpy()
    assert tpot.index == STEP and tpot.run_id == nights[STEP].run_id and tpot.night == "2026-11-15"
    assert tpot.before == pytest.approx(np.median(vals[:STEP])) and tpot.after == pytest.approx(np.median(vals[STEP:]))
    assert tpot.rel_change == pytest.approx(tpot.after / tpot.before - 1) and tpot.rel_change > 0.15
    assert tpot.worse and found["throughput.output_tokens_per_s"].worse  # up is worse; down is worse
    assert analysis.gating(tpot, 0.05) and not analysis.gating(tpot, 0.5)


@pytest.mark.long
def test_new_only_when_not_found_the_night_before(history):
    nights, series = history
    s = Settings()
    seen = []
    for k in range(STEP + 1, N + 1):  # evaluate every night as the command does
        now = analysis.changes(series, nights[:k], s)
        before = analysis.changes(series, nights[: k - 1], s)
        seen += [(k, c.metric) for c in analysis.new_changes(now, before)]
    # each change is new on exactly one night (the night it is first confirmed)
    assert sorted(m for _, m in seen) == ["throughput.output_tokens_per_s", "tpot_ms.p99"]
    assert all(k >= STEP + 3 for k, _ in seen)  # min_size nights after the change


def test_open_until_recovered():
    up = 10 * _noise(6) * _step(0.3, 8)
    recovered = up * np.where(np.arange(N) >= 16, 1 / 1.3, 1.0)
    nights, series = _history(
        {"tpot_ms.p99": up, "e2e_ms.p99": 10 * _noise(7) * _step(0.3, 8) * np.where(np.arange(N) >= 16, 1 / 1.3, 1.0)}
    )
    found = analysis.changes(series, nights, Settings())
    rows = analysis.open_regressions(found, series, nights, 0.05)
    assert [r["metric"] for r in rows] == ["tpot_ms.p99"]  # e2e came back
    assert rows[0]["label"] == "TPOT p99" and rows[0]["rel_now"] > 0.2
    assert [c.index for c in found if c.metric == "e2e_ms.p99"] == [8, 16]
    assert recovered is not None


def test_auto_baseline(history):
    nights, series = history
    found = analysis.changes(series, nights, Settings())
    # after the change at night index 14: the latest passing night before tonight; night 20 failed its SLOs
    assert analysis.auto_baseline(nights, nights[21], found).run_id == "n19"
    assert analysis.auto_baseline(nights, nights[23], found).run_id == "n22"
    # tonight is the first night of the new regime: nothing after the change yet, the latest passing night
    assert analysis.auto_baseline(nights, nights[STEP], found).run_id == nights[STEP - 1].run_id
    assert analysis.auto_baseline(nights, nights[0], found) is None


def test_tail_cause_is_the_share_that_grew(history):
    nights, series = history
    found = analysis.changes(series, nights, Settings())
    tpot = next(c for c in found if c.metric == "tpot_ms.p99")
    metric, before, after = analysis.tail_cause(tpot, series, nights, found)
    assert metric == "tail.tpot.decode_baseline" and before == pytest.approx(0.21, abs=0.01)
    assert after == pytest.approx(0.51, abs=0.01)
    assert label(metric) == "decode baseline share (TPOT tail)"


def test_a_change_from_zero_gates():
    stalls = np.where(np.arange(N) >= STEP, 0.01, 0.0) * _noise(8)
    nights, series = _history({"stalls.rate": stalls})
    (c,) = analysis.changes(series, nights, Settings())
    assert c.before == 0 and c.rel_change is None and c.worse and analysis.gating(c, 0.05)
    (row,) = analysis.open_regressions([c], series, nights, 0.05)
    assert row["rel_now"] is None and row["now"] == pytest.approx(np.median(stalls[STEP:]))


def test_directions():
    assert direction("tpot_ms.p99") == 1 and direction("fit.t0_ms") == 1 and direction("stalls.rate") == 1
    assert direction("throughput.requests_per_s") == -1 and direction("fit.effective_bandwidth_gbps") == -1
    assert direction("goodput.attainment") == -1 and direction("tail.ttft.waiting_hol") == 0


def test_a_change_point_that_drops_out_and_returns_is_not_new_again(monkeypatch):
    """Found as of night 15, gone from the searches of nights 16 and 17 (the level scattered back
    towards the old one), found again as of night 18: it failed the gate on 15 and again on 18."""
    from types import SimpleNamespace

    from pipeline.nightly import outputs
    from pipeline.nightly.analysis import Change, new_changes

    nights = [SimpleNamespace(run_id=f"n{i:02d}") for i in range(1, 21)]
    hist = SimpleNamespace(nights=lambda: nights, series=lambda: None)
    tpot = Change("tpot_ms.p99", "n12", "2026-11-12", 11, 8.4, 11.0, 0.31, 0.001, True)
    e2e = Change("e2e_ms.p50", "n13", "2026-11-13", 12, 900.0, 1170.0, 0.3, 0.001, True)
    found_as_of = {15: [tpot], 16: [], 17: [], 18: [tpot, e2e]}
    monkeypatch.setattr(outputs, "_changes", lambda h, s, upto, settings: found_as_of.get(len(upto), []))
    opts = SimpleNamespace(detector=None)
    _, _, _, found, before = outputs._as_of(hist, nights[17], opts)
    assert found == [tpot, e2e]
    assert new_changes(found, before) == [e2e]  # the statistic that crossed tonight is new; tpot is not
    # a change found last more than REPORTED_NIGHTS nights ago is new again
    found_as_of = {15 - outputs.REPORTED_NIGHTS: [tpot], 18: [tpot]}
    _, _, _, found, before = outputs._as_of(hist, nights[17], opts)
    assert new_changes(found, before) == [tpot]
