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
