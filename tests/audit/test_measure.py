"""Goodput and fluidity: hand-computed values on a tiny run, and an independent
loop implementation of the Etalon definition on random token times."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.audit import measure
from pipeline.slo import FluiditySpec, GoodputSpec

from .conftest import REQUESTS


def test_goodput_hand_computed(tiny_run):
    con, _ = tiny_run
    g = measure.goodput(con, "aud", GoodputSpec({"ttft_ms": 100, "tpot_ms": 12}))
    # good: R1, R4 (single token meets any TPOT limit), R6; R2 (tpot 26), R3 (ttft 153), R5 (error) are not
    assert (g["requests"], g["requests_ok"], g["good_requests"]) == (6, 5, 3)
    assert g["attainment"] == pytest.approx(0.5)
    assert g["good_output_tokens"] == 4 + 1 + 3
    # duration: first arrival 0.0 to last finish 4.05
    assert g["duration_s"] == pytest.approx(4.05)
    assert g["request_goodput_rps"] == pytest.approx(3 / 4.05)
    assert g["token_goodput_tps"] == pytest.approx(8 / 4.05)
    # each limit alone: ttft <= 100 holds for R1 R2 R4 R6; tpot <= 12 for R1 R4 R6
    assert g["attainment_by_limit"] == pytest.approx({"ttft_ms": 4 / 6, "tpot_ms": 3 / 6})


def test_goodput_e2e_limit(tiny_run):
    con, _ = tiny_run
    # e2e: R1 74, R2 98, R3 217, R4 90, R6 50 -> <= 95: R1 R4 R6
    g = measure.goodput(con, "aud", GoodputSpec({"e2e_ms": 95}))
    assert g["good_requests"] == 3


def test_fluidity_hand_computed(tiny_run):
    con, _ = tiny_run
    spec = FluiditySpec(ttft_deadline_ms=100, tbt_deadline_ms=10, minima={"p01": 0.9})
    per_req = {r["req_id"]: r for r in measure.fluidity_table(con, "aud", spec).to_dicts()}
    assert sorted(per_req) == ["R1", "R2", "R3", "R4"]
    assert per_req["R3"]["missed"] == 10 and per_req["R3"]["deadlines"] == 13
    assert per_req["R3"]["fluidity_index"] == pytest.approx(3 / 13)
    for r in ("R1", "R2", "R4"):
        assert per_req[r]["fluidity_index"] == 1 and per_req[r]["missed"] == 0
    assert (per_req["R1"]["deadlines"], per_req["R4"]["deadlines"]) == (4, 1)
    f = measure.fluidity(con, "aud", spec)
    assert f["requests_evaluated"] == 4 and f["requests_without_token_times"] == 1
    idx = [3 / 13, 1, 1, 1]
    assert f["mean"] == pytest.approx(np.mean(idx))
    assert f["percentiles"]["p01"] == pytest.approx(np.percentile(idx, 1))
    assert f["service"] == pytest.approx(1 - 10 / (4 + 4 + 13 + 1))
    assert f["fraction_at_least_0_9"] == pytest.approx(0.75)


def etalon_index(ttft_ms: float, gaps_ms: list[float], d_ttft: float, d_tbt: float) -> tuple[int, int]:
    """Straight loop over tokens, written from the Etalon definition: (missed, deadlines)."""
    slack, missed, total = 0.0, 0, 0
    for i, s in enumerate([ttft_ms, *gaps_ms]):
        d = d_ttft if i == 0 else d_tbt
        if s <= d + slack:
            slack += d - s
            total += 1
            continue
        m = 1 + math.floor((s - slack - d) / d_tbt) if i == 0 else math.floor((s - slack) / d_tbt)
        missed += m
        total += m
        slack = 0.0
    return missed, total


def test_fluidity_matches_loop_reference(make_store):
    rng = np.random.default_rng(3)
    reqs = []
    for k in range(40):
        n = int(rng.integers(1, 60))
        arrival = float(k)
        ttft = float(rng.gamma(2.0, 60.0)) / 1000
        gaps = rng.gamma(1.5, 7.0, size=n - 1) / 1000
        gaps[rng.random(n - 1) < 0.05] += rng.uniform(0.02, 0.3)  # stalls
        times = arrival + ttft + np.concatenate([[0.0], np.cumsum(gaps)])
        reqs.append(
            {
                "req_id": f"q{k}",
                "t_arrival": arrival,
                "t_scheduled": arrival,
                "t_first_token": times[0],
                "t_finish": times[-1],
                "prompt_tokens": 5,
                "output_tokens": n,
                "token_times": times.tolist(),
            }
        )
    con = make_store("rnd", reqs)
    spec = FluiditySpec(ttft_deadline_ms=150, tbt_deadline_ms=12)
    got = {r["req_id"]: r for r in measure.fluidity_table(con, "rnd", spec).to_dicts()}
    assert len(got) == 40
    misses = 0
    for r in reqs:
        t = np.array(r["token_times"])
        missed, total = etalon_index((t[0] - r["t_arrival"]) * 1000, list(np.diff(t) * 1000), 150, 12)
        assert (got[r["req_id"]]["missed"], got[r["req_id"]]["deadlines"]) == (missed, total), r["req_id"]
        misses += missed
    assert misses > 0  # the stalls did cost deadlines: the comparison is not vacuous


def test_run_stats_any_percentile(tiny_run):
    con, _ = tiny_run
    ttft = [50, 20, 153, 90, 30]  # ok requests with a first token
    s = measure.run_stats(con, "aud", "ttft_ms", ["p99", "p75", "p001", "mean", "max"])
    assert s["count"] == 5
    assert s["p99"] == pytest.approx(np.percentile(ttft, 99))
    assert s["p75"] == pytest.approx(np.percentile(ttft, 75))
    assert s["p001"] == pytest.approx(np.percentile(ttft, 0.1))
    assert s["std"] == pytest.approx(np.std(ttft, ddof=1))
    itl = measure.run_stats(con, "aud", "itl_ms", ["p50"])
    gaps = [8, 8, 8, 8, 65, 5, 8, 43, 8, 5]
    assert itl["count"] == 10 and itl["p50"] == pytest.approx(np.percentile(gaps, 50))


@pytest.mark.long
def test_fluidity_judged_on_under_half_of_the_requests_cannot_be_evaluated(make_store):
    """Nine ok requests, one of them with token times (a one-token request, index 1): "min >= 0.5"
    passed on that one, while the nine with their token times fail it."""
    import copy

    from pipeline.audit import audit, parse_slo

    slo = parse_slo({"fluidity": {"ttft_deadline_ms": 100, "tbt_deadline_ms": 10, "min_index_min": 0.5}}, "t.toml")
    r3 = next(r for r in REQUESTS if r["req_id"] == "R3")  # index 3/13
    reqs = []
    for k in range(8):
        r = copy.deepcopy(r3)
        r["req_id"] = f"S{k}"
        reqs.append(r)
    one = {**next(r for r in REQUESTS if r["req_id"] == "R4"), "req_id": "ONE"}
    with_times = audit(make_store("all", [*reqs, one]), "all", slo)
    assert with_times.checks[0].status == "fail" and with_times.checks[0].observed == pytest.approx(3 / 13)
    for r in reqs:
        del r["token_times"]
    (check,) = audit(make_store("few", [*reqs, one]), "few", slo).checks
    assert check.status == "error" and check.observed is None
    assert "only 1 of the run's 9 ok requests have token times" in check.message
    assert "says nothing of the other 8" in check.message
    # half or more evaluated: judged, and the message says how many were left out
    for r in reqs[:4]:
        r["token_times"] = r3["token_times"]
    (check,) = audit(make_store("half", [*reqs, one]), "half", slo).checks
    assert check.status == "fail" and check.observed == pytest.approx(3 / 13)
    assert check.message.endswith("(over 5 of 9 ok requests: 4 have no token times)")


def test_one_check_and_one_request_are_said_in_the_singular(make_store):
    """The verdict read "1 checks" and "1 requests evaluated"."""
    from pipeline.audit import audit, markdown_report, parse_slo
    from pipeline.audit.verdict import text_report

    r4 = {**next(r for r in REQUESTS if r["req_id"] == "R4")}
    slo = parse_slo({"fluidity": {"ttft_deadline_ms": 100, "tbt_deadline_ms": 10, "min_index_min": 0.5}}, "t.toml")
    result = audit(make_store("one", [r4]), "one", slo)
    text, md = text_report(result), markdown_report(result)
    assert "(1 check, 0 failed" in text and "1 request evaluated" in text and "1 checks" not in text
    assert "1 check from t.toml" in md and "1 requests" not in md


def test_a_limit_met_by_the_rounding_of_times_says_so_and_huge_limits_stay_short():
    """ttft_ms.max = 73.4430 against 73.4435 ms printed "= 73.444 ms within limit <= 73.443 ms"; a
    limit of 1e300 printed 300 digits."""
    from pipeline.audit.check import _check

    c = _check("slo", "ttft_ms.max", 73.4435, "<=", 73.443, "ms")
    assert c.status == "pass"
    assert c.message == (
        "ttft_ms.max = 73.444 ms within limit <= 73.443 ms (over by 0.5 us, within the 1 us rounding of times)"
    ), c.message
    assert _check("slo", "ttft_ms.max", 73.442, "<=", 73.443, "ms").message.endswith("<= 73.443 ms")
    assert _check("slo", "ttft_ms.max", 73.4445, "<=", 73.443, "ms").status == "fail"
    big = _check("slo", "ttft_ms.p99", 12.5, "<=", 1e300, "ms")
    assert big.message == "ttft_ms.p99 = 12.500 ms within limit <= 1e+300 ms", big.message
