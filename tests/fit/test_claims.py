"""The prefill-spike claim: decided by what a spike is, not by the noise threshold alone."""

from __future__ import annotations

import math
from pathlib import Path

from pipeline import store
from pipeline.fit import fit_run
from pipeline.fit.claims import _prefill_spikes
from pipeline.ingest import ingest_paths

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"


def _fit(b_lo: float, spread: float) -> dict:
    return {"coef": {"b_ms_per_prefill": 0.04}, "ci": {"b_ms_per_prefill": [b_lo, 0.05]}, "log_scale": spread}


EV = {"prefill_steps": 90, "prefill_step_median_ms": 13.0, "decode_step_median_ms": 6.25}


def test_prefill_steps_twice_as_long_as_decode_steps_spike_on_a_noisy_run():
    """The real vLLM CPU recording: prefill steps take 2.08x a decode step, but its noise puts the
    spike threshold at 4.7x a step, which none passes: the claim was DOES NOT HOLD."""
    con = store.connect(":memory:")
    ingest_paths(con, [FIX / "server.log"], run_id="v")
    store.build_derived(con)
    claim = next(c for c in fit_run(con, "v", n_boot=50).claims if "prefill" in c["claim"])
    assert claim["holds"] is True, claim
    assert "0 steps spike" in claim["evidence"] and "beyond the steps' usual spread" in claim["evidence"]


def test_a_prefill_step_within_the_usual_spread_is_no_spike():
    ratio = EV["prefill_step_median_ms"] / EV["decode_step_median_ms"]
    assert _prefill_spikes(_fit(0.03, math.log(ratio) * 0.9), EV, {"prefill": 0})["holds"] is True
    out = _prefill_spikes(_fit(0.03, math.log(ratio) * 1.1), EV, {"prefill": 0})
    assert out["holds"] is False and "within the steps' usual spread" in out["evidence"]
    assert _prefill_spikes(_fit(0.03, math.log(ratio) * 1.1), EV, {"prefill": 3})["holds"] is True
    # b not above 0: prefill tokens are not shown to cost time, whatever the medians say
    assert _prefill_spikes(_fit(-0.01, 0.01), EV, {"prefill": 3})["holds"] is False


def _steps_run(
    tmp_path, slope_ms_per_token: float, ctx_lo: int = 1000, ctx_hi: int = 20000, every: int = 10, noise: float = 0.0
):
    """Steps of 10 ms plus ``slope`` per context token, every ``every``-th with a prefill, times
    log-normal noise of sigma ``noise`` (none by default)."""
    import json

    import numpy as np

    rng = np.random.default_rng(0)
    ctx = rng.integers(ctx_lo, ctx_hi, 400)
    prefill = np.where(np.arange(400) % every == 0, rng.integers(100, 600, 400), 0)
    dur_s = (10.0 + slope_ms_per_token * ctx + 0.01 * prefill) / 1000.0 * np.exp(noise * rng.standard_normal(400))
    t_end = np.cumsum(dur_s)
    lines = [json.dumps({"kind": "run", "run_id": "flat", "engine": "hand", "model": "toy", "clock": "monotonic"})]
    for i in range(400):
        lines.append(
            json.dumps(
                {
                    "kind": "iteration",
                    "iter": i,
                    "t_start": float(t_end[i] - dur_s[i]),
                    "t_end": float(t_end[i]),
                    "prefill_tokens": int(prefill[i]),
                    "decode_tokens": 8,
                    "decode_reqs": 8,
                    "context_tokens": int(ctx[i]),
                }
            )
        )
    path = tmp_path / "flat.jsonl"
    path.write_text("\n".join(lines) + "\n")
    con = store.connect(":memory:")
    ingest_paths(con, [path])
    store.build_derived(con)
    return next(c for c in fit_run(con, "flat", n_boot=50).claims if "linearly" in c["claim"])


def test_a_slope_too_small_to_see_is_no_growth(tmp_path):
    """Steps whose time moves by a billionth of their length over the run's contexts: the slope's
    interval excludes 0 on noise-free steps, and the claim said HOLDS."""
    claim = _steps_run(tmp_path, 1e-10)
    assert claim["holds"] is False, claim
    assert "the line rises 0.0% of the median decode step (grows if >= 2%)" in claim["evidence"]


def test_a_visible_slope_grows(tmp_path):
    """0.02 ms per 1k tokens over 1k..20k tokens: 3-4% of a 10 ms step."""
    claim = _steps_run(tmp_path, 2e-5)
    assert claim["holds"] is True, claim
    assert "from 1" in claim["evidence"] and "grows if >= 2%" in claim["evidence"]


def test_contexts_too_alike_cannot_show_growth(tmp_path):
    claim = _steps_run(tmp_path, 2e-5, 10000, 10400)
    assert claim["holds"] is None and "too narrow to show growth" in claim["evidence"], claim


def test_a_slope_too_small_to_see_is_no_growth_when_every_step_has_a_prefill(tmp_path):
    """With no decode-only step the growth was not checked (its context quantiles are decode-only
    steps'), so a flat slope HOLDS again; it is now checked over all steps, and the R² is named
    for what it is."""
    claim = _steps_run(tmp_path, 1e-10, every=1)
    assert claim["holds"] is False, claim
    assert "(p5 .. p95 of all steps) the line rises 0.0% of the median step" in claim["evidence"]
    assert "R² of all steps without stalls" in claim["evidence"]
    assert _steps_run(tmp_path, 2e-5, every=1)["holds"] is True


def test_a_slope_whose_interval_holds_0_and_a_visible_rise_cannot_be_checked(tmp_path):
    """Noisy steps of a flat run: the slope's CI runs from below 0 to a rise of several percent of
    a step. The claim said DOES NOT HOLD, which the data do not show either."""
    claim = _steps_run(tmp_path, 0.0, noise=0.3)
    assert claim["holds"] is None, claim
    assert "these steps cannot tell" in claim["evidence"]
    lo, hi = (float(x) for x in claim["evidence"].split("95% CI ")[1].split(")")[0].split(" .. "))
    assert lo < 0 < hi
    # noise-free and flat: the interval rules a visible rise out, and the claim does not hold
    flat = _steps_run(tmp_path, 0.0)
    assert flat["holds"] is False and "cannot tell" not in flat["evidence"], flat


def test_a_slope_above_0_with_a_small_rise_and_a_visible_upper_end_cannot_be_checked(tmp_path):
    """The slope's CI is above 0 and its line rises under 2% of a step, but the CI's upper end is a
    visible rise: the same "cannot tell" as a CI that reaches 0 (it said DOES NOT HOLD)."""
    claim = _steps_run(tmp_path, 1e-5, noise=0.02)
    assert claim["holds"] is None and "these steps cannot tell" in claim["evidence"], claim
    ci = claim["evidence"].split("95% CI ")[1].split(")")[0].split(" .. ")
    assert float(ci[0]) > 0
    rise = float(claim["evidence"].split("the line rises ")[1].split("%")[0])
    assert rise < 2.0


def test_steps_that_all_take_the_same_time_leave_r2_undefined_not_a_crash(tmp_path):
    """Every decode step without a stall took exactly 21 ms: R² without stalls is 0/0, stored as
    null, and `tracelat report` (which words the claims from the stored fit) stopped with an
    internal error formatting None."""
    import json

    from pipeline.cli import run_captured

    lines = [
        json.dumps(
            {
                "kind": "iteration",
                "iter": i,
                "dur_ms": 21 + (50 if i % 17 == 0 else 0),
                "prefill_tokens": 10 if i % 5 == 0 else 0,
                "decode_tokens": 3,
                "context_tokens": 100 + i,
            }
        )
        for i in range(60)
    ]
    (tmp_path / "same.jsonl").write_text("\n".join(lines) + "\n")
    db = tmp_path / "s.duckdb"
    assert run_captured("ingest", tmp_path / "same.jsonl", "--db", db)[0] == 0
    code, out = run_captured("report", "same", "--db", db, "--out", tmp_path / "rep")
    assert code == 0, out
    doc = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert doc["fit"]["r2_without_stalls"] is None
    assert next(c for c in doc["fit"]["claims"] if "linearly" in c["claim"])["holds"] is False
    from pipeline.fit.claims import _linear

    fit = {
        "coef": {"t0_ms": 21.0, "a_ms_per_ctx": 1e-6},
        "ci": {"a_ms_per_ctx": [5e-7, 2e-6]},
        "r2_inliers": None,
        "phases": {"decode_only": {"r2_inliers": None}},
    }
    evidence = _linear(fit, {})["evidence"]
    assert "R² of decode-only steps without stalls undefined (they all take the same time)" in evidence


def _hw(frac: float) -> dict:
    return {
        "bandwidth_fraction_of_peak": frac,
        "effective_bandwidth_gbps": 3350 * frac,
        "peak_bandwidth_gbps": 3350.0,
        "weight_floor_ms": 4.794,
        "kv_bytes_per_token": 131072,
    }


def test_memory_bound_verdict_follows_what_the_numbers_show():
    """The verdict looked at the context slope's bandwidth alone: DOES NOT HOLD at "8% of peak"
    although the slope's interval included 0 (the bandwidth was not pinned down), and at "20% of
    peak" although reading the weights and KV cache at peak took 87% of the median decode step."""
    from pipeline.fit.claims import _memory_bound

    sized = {"ci": {"a_ms_per_ctx": [1e-5, 3e-5]}}
    unsized = {"ci": {"a_ms_per_ctx": [-1e-5, 3e-5]}}
    ev = {"decode_step_median_ms": 5.66, "decode_context_median_tokens": 1000}
    floor = 4.794 + 131072 * 1000 / 3350e9 * 1e3
    assert floor / 5.66 > 0.85
    assert _memory_bound(sized, _hw(0.2), ev)["holds"] is True  # the weights' read dominates the step
    assert _memory_bound(sized, _hw(0.2), {**ev, "decode_step_median_ms": 30.0})["holds"] is False
    assert _memory_bound(sized, _hw(0.7), {})["holds"] is True  # the KV read near peak
    assert _memory_bound(sized, _hw(0.2), {})["holds"] is False
    out = _memory_bound(unsized, _hw(0.08), {})
    assert out["holds"] is None and "CI includes 0" in out["evidence"]
    assert _memory_bound(unsized, _hw(0.08), ev)["holds"] is True
    out = _memory_bound(sized, _hw(0.7), {**ev, "decode_step_median_ms": 2.0})  # faster than its bytes
    assert out["holds"] is None and "shorter than reading its bytes at peak" in out["evidence"]
    # no positive context slope (a <= 0: no bandwidth to size): the weights' share still decides
    no_slope = {**_hw(0.2), "bandwidth_fraction_of_peak": None, "effective_bandwidth_gbps": None}
    out = _memory_bound({"ci": {}}, no_slope, ev)
    assert out["holds"] is True and "no positive context slope" in out["evidence"], out
    assert _memory_bound({"ci": {}}, no_slope, {})["holds"] is None
    out = _memory_bound({"ci": {}}, _hw(0.7), {})  # a slope without an interval: not pinned down, not "includes 0"
    assert out["holds"] is None and "has no interval" in out["evidence"] and "includes 0" not in out["evidence"]
