"""Metrics on a hand-written trace, against values computed by hand (see comments)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipeline import ingest, metrics, store
from pipeline.summary import summary

TINY = Path(__file__).resolve().parent.parent / "fixtures" / "canonical" / "tiny.jsonl"


@pytest.fixture
def tiny(con):
    ingest.ingest_paths(con, [TINY])
    store.build_derived(con)
    return summary(con, "tiny")


def test_request_metrics_by_hand(tiny):
    # A: arrival .995, scheduled 1.000, first 1.020, finish 1.060, 3 tokens
    # B: arrival 1.010, scheduled 1.020, first 1.050, finish 1.075, 3 tokens
    assert tiny["ttft_ms"]["count"] == 2
    assert tiny["ttft_ms"]["mean"] == pytest.approx((25 + 40) / 2)
    assert tiny["ttft_ms"]["p99"] == pytest.approx(25 + 0.99 * 15)
    assert tiny["queue_ms"]["max"] == pytest.approx(10)
    assert tiny["prefill_ms"]["p50"] == pytest.approx(25)
    assert tiny["e2e_ms"]["mean"] == pytest.approx(65)
    assert tiny["tpot_ms"]["p50"] == pytest.approx((20 + 12.5) / 2)
    assert tiny["tpot_ms"]["std"] == pytest.approx(math.sqrt(2 * 3.75**2))


def test_itl_is_token_weighted(tiny):
    # gaps: A 30, 10; B 10, 15 (ms)
    itl = tiny["itl_ms"]
    assert itl["count"] == 4
    assert itl["p50"] == pytest.approx(12.5)
    assert itl["mean"] == pytest.approx(16.25)
    assert itl["max"] == pytest.approx(30)


def test_iteration_time_and_cv(tiny):
    it = tiny["iteration_ms"]  # 20, 30, 10, 14 ms
    std = math.sqrt((1.5**2 + 11.5**2 + 8.5**2 + 4.5**2) / 3)
    assert it["mean"] == pytest.approx(18.5)
    assert it["std"] == pytest.approx(std)
    assert it["cv"] == pytest.approx(std / 18.5)


def test_failed_requests_excluded_and_counted(tiny):
    assert tiny["requests"] == 3
    assert tiny["requests_failed"] == 1
    assert tiny["ttft_ms"]["count"] == 2


def test_throughput_by_hand(tiny):
    # first arrival .995, last finish 1.075 -> 0.08 s; 6 output tokens of ok requests
    assert tiny["duration_s"] == pytest.approx(0.08)
    assert tiny["throughput"]["output_tokens_per_s"] == pytest.approx(75)
    assert tiny["throughput"]["requests_per_s"] == pytest.approx(25)


def test_host_gap_between_steps(con, tiny):
    gaps = dict(con.execute("select iter, gap_ms from iteration_metrics where run_id = 'tiny'").fetchall())
    assert gaps[0] is None
    assert gaps[3] == pytest.approx(1.0)
    assert gaps[1] == pytest.approx(0.0, abs=1e-9)


def test_summary_keys_match_spec(tiny):
    for key in ("run_id", "requests", "iterations", "duration_s", "throughput"):
        assert key in tiny
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms", "iteration_ms"):
        assert set(metrics.STATS) <= set(tiny[m])
    assert "cv" in tiny["iteration_ms"]
    assert set(tiny["throughput"]) >= {"output_tokens_per_s", "requests_per_s"}


def _variant(tmp_path: Path, name: str, requests: list[str]) -> Path:
    """tiny's run and steps (decode 0+1+2+1 = 4 tokens over 1.000-1.075 s) with other requests."""
    lines = TINY.read_text().splitlines()
    f = tmp_path / f"{name}.jsonl"
    f.write_text("\n".join(lines[:5] + requests) + "\n")
    return f


@pytest.mark.parametrize(
    "requests, tokens_per_s, source",
    [
        # every request failed: the client got no tokens over its span (not step tokens over it)
        (['{"kind":"request","req_id":"C","t_arrival":1.0,"t_finish":1.5,"status":"error"}'], 0.0, "requests"),
        # an ok request without output_tokens: the steps' tokens over the steps' span (0.075 s)
        (
            ['{"kind":"request","req_id":"A","t_arrival":0.5,"t_first_token":1.02,"t_finish":2.5}'],
            4 / 0.075,
            "iterations",
        ),
    ],
)
@pytest.mark.long
def test_throughput_takes_tokens_and_span_from_one_source(con, tmp_path, requests, tokens_per_s, source):
    ingest.ingest_paths(con, [_variant(tmp_path, "tiny", requests)])
    store.build_derived(con)
    got = summary(con, "tiny")
    assert got["throughput"]["output_tokens_per_s"] == pytest.approx(tokens_per_s)
    assert got["throughput"]["source"] == source
    assert got["throughput"]["requests_per_s"] == pytest.approx(0.0 if source == "requests" else 1 / 2.0)
