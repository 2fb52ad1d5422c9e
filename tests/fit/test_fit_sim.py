"""Acceptance on simulated runs: parameters, bandwidth, stalls, claims against the simulator's truth."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.catalog import HardwareSpec
from pipeline.fit import get_or_fit
from pipeline.fit.stalls import stall_iters
from pipeline.sim.engine import Policy
from pipeline.sim.model import NoiseModel
from pipeline.sim.scoring import oracle_recall, score_stalls

from .conftest import chat_workload, make_run

KV_BYTES = 2 * 32 * 8 * 128 * 2


@pytest.fixture(scope="module")
def acc_fit(accuracy_run):
    return get_or_fit(accuracy_run.con, accuracy_run.run_id)


@pytest.mark.long
def test_parameters_within_3_percent(acc_fit, accuracy_run):
    m = accuracy_run.model
    assert acc_fit.t0_ms == pytest.approx(m.t0_ms, rel=0.03)
    assert acc_fit.a_ms_per_ctx == pytest.approx(m.a_ms_per_ctx, rel=0.03)
    assert acc_fit.b_ms_per_prefill == pytest.approx(m.b_ms_per_prefill, rel=0.03)
    # the true c is 0: either its interval holds 0, or decode_tokens tracks context too closely and c is
    # left out with a statement saying so
    if acc_fit.c_ms_per_decode is None:
        assert any("decode_tokens moves with context_tokens" in s for s in acc_fit.statements)
    else:
        lo, hi = acc_fit.ci["c_ms_per_decode"]
        assert lo <= 0 <= hi
    for name in ("t0_ms", "a_ms_per_ctx", "b_ms_per_prefill"):
        lo, hi = acc_fit.ci[name]
        assert lo < getattr(acc_fit, name) < hi


def test_bandwidth_recovered_within_3_percent(acc_fit, accuracy_run):
    hw = acc_fit.hardware
    assert hw["model"] == "llama-3.1-8b" and hw["gpu"] == "h100-sxm"
    assert hw["kv_bytes_per_token"] == KV_BYTES
    true_bw = KV_BYTES / (accuracy_run.model.a_ms_per_ctx * 1e-3) / 1e9  # GB/s put into the simulator
    assert hw["effective_bandwidth_gbps"] == pytest.approx(true_bw, rel=0.03)
    assert hw["bandwidth_fraction_of_peak"] == pytest.approx(true_bw / 3350, rel=0.03)
    floor = 8.03e9 * 2 / 3350e9 * 1e3
    assert hw["weight_floor_ms"] == pytest.approx(floor, rel=1e-9)
    assert hw["overhead_ms"] == pytest.approx(accuracy_run.model.t0_ms - floor, abs=0.03 * accuracy_run.model.t0_ms)
    assert hw["prefill_roofline_ms_per_token"] == pytest.approx(2 * 8.03e9 / 989.4e12 * 1e3, rel=1e-9)


def _flags_and_predicted(run) -> tuple[np.ndarray, np.ndarray]:
    rows = run.con.execute(
        "select iter, is_stall, predicted_ms from iteration_fit where run_id = ? order by iter", [run.run_id]
    ).fetchnumpy()
    assert np.array_equal(rows["iter"], np.arange(len(run.result.iterations["t_end"])))
    return rows["is_stall"].astype(bool), rows["predicted_ms"]


def _oracle(run) -> float:
    it = run.result.iterations
    return oracle_recall((it["t_end"] - it["t_start"]) * 1000, it["base_ms"], it["stall_ms"] > 0, run.noise)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.long
def test_stall_recall_and_false_positives_on_chat_load(tmp_path, seed):
    """The acceptance figure: >= 95% of ALL injected stalls found, <= 5% of the flagged steps false."""
    run = make_run(
        tmp_path,
        f"chat{seed}",
        chat_workload(seed),
        Policy(max_num_seqs=128, max_num_batched_tokens=2048),
        NoiseModel(sigma=0.03, stall_rate=0.02, stall_ms_mean=50.0),
        tokens=False,
        seed=seed + 1,
    )
    flagged, _ = _flags_and_predicted(run)
    score = score_stalls(flagged, run.result.iterations["stall_ms"])
    assert score["stalls"] > 200
    assert score["recall"] >= 0.95, score
    assert score["fdr"] <= 0.05, score
    assert score["recall"] >= _oracle(run) - 0.01  # within a point of what any per-step rule could do


def test_stall_detection_on_prefill_heavy_load(acc_fit, accuracy_run):
    """Long prefill steps hide more small stalls in their noise: recall is judged against what is findable."""
    it = accuracy_run.result.iterations
    flagged, predicted = _flags_and_predicted(accuracy_run)
    assert set(np.flatnonzero(flagged).tolist()) == stall_iters(accuracy_run.con, accuracy_run.run_id)
    limit = acc_fit.detection_limit_ms(predicted)
    np.testing.assert_allclose(
        limit, predicted * np.exp(acc_fit.log_center) * (np.exp(acc_fit.k * acc_fit.residual_log_sigma) - 1), rtol=1e-12
    )
    lim = acc_fit.stall_detection_limit_ms
    assert lim["median_step"] == pytest.approx(np.median(limit), rel=1e-6)
    assert lim["p90_step"] == pytest.approx(np.quantile(limit, 0.9), rel=1e-6)
    score = score_stalls(flagged, it["stall_ms"], limit)
    oracle = _oracle(accuracy_run)
    assert score["stalls"] > 100
    assert score["fdr"] <= 0.05
    assert score["recall_above_limit"] >= 0.95
    # below 95% even for the best per-step rule on this seed: the bound is what to hold the detector to
    assert score["recall"] >= oracle - 0.015, (score, oracle)
    assert score["ms_recall"] >= 0.99
    assert acc_fit.spikes["unexplained"] + acc_fit.spikes["preemption"] == flagged.sum()
    # the noise model for replay: sigma 3%, stall rate and mean size close to what was injected
    truth = it["stall_ms"] > 0
    assert acc_fit.residual_log_sigma == pytest.approx(accuracy_run.noise.sigma, rel=0.1)
    assert acc_fit.stall_rate == pytest.approx(truth.mean(), rel=0.1)
    assert acc_fit.stall_ms["mean"] == pytest.approx(np.mean(it["stall_ms"][truth & flagged]), rel=0.1)


def test_claims_hold_on_memory_bound_simulation(acc_fit):
    verdicts = [c["holds"] for c in acc_fit.claims]
    assert verdicts == [True, True, True, True], acc_fit.claims
    assert acc_fit.shape["context_bin_max_rel_dev"] < 0.02
    assert acc_fit.spikes["prefill"] > 0


def test_r2_and_mape_match_numpy(acc_fit, accuracy_run):
    it = accuracy_run.result.iterations
    y = (it["t_end"] - it["t_start"]) * 1000
    yhat = acc_fit.predict_ms(it["context_tokens"], it["prefill_tokens"], it["decode_tokens"])
    r2 = 1 - np.sum((y - yhat) ** 2) / np.sum((y - y.mean()) ** 2)
    assert acc_fit.r2 == pytest.approx(r2, rel=1e-9)
    assert acc_fit.mape_pct == pytest.approx(np.mean(np.abs(y - yhat) / y) * 100, rel=1e-9)


def test_phase_fits(acc_fit, accuracy_run):
    dec = acc_fit.phases["decode_only"]
    assert "b_ms_per_prefill" not in dec["coef"]
    assert dec["coef"]["a_ms_per_ctx"] == pytest.approx(accuracy_run.model.a_ms_per_ctx, rel=0.05)
    pf = acc_fit.phases["with_prefill"]
    assert pf["coef"]["b_ms_per_prefill"] == pytest.approx(accuracy_run.model.b_ms_per_prefill, rel=0.03)


def test_stored_fit_is_reused_and_models_round_trip(acc_fit, accuracy_run):
    again = get_or_fit(accuracy_run.con, accuracy_run.run_id)
    assert again.t0_ms == acc_fit.t0_ms and again.ci == acc_fit.ci and again.spikes == acc_fit.spikes
    im, nm = acc_fit.iteration_model(), acc_fit.noise_model()
    assert im.base_ms(1000, 10, 2) == pytest.approx(acc_fit.predict_ms(1000, 10, 2))
    assert nm.sigma == acc_fit.residual_log_sigma and nm.stall_rate == acc_fit.stall_rate
    # a different GPU changes the hardware figures, not the fit
    h200 = get_or_fit(accuracy_run.con, accuracy_run.run_id, HardwareSpec(gpu="h200"))
    assert h200.t0_ms == acc_fit.t0_ms
    assert h200.hardware["bandwidth_fraction_of_peak"] == pytest.approx(
        acc_fit.hardware["effective_bandwidth_gbps"] / 4800, rel=1e-9
    )


def test_iteration_fit_parts_add_up(accuracy_run, acc_fit):
    con, run = accuracy_run.con, accuracy_run.run_id
    rows = con.execute(
        "select max(abs(decode_baseline_ms + prefill_ms_part + residual_ms - iteration_ms)), "
        "max(abs(span_ms - iteration_ms - host_gap_ms)), count(*) from iteration_fit where run_id = ?",
        [run],
    ).fetchall()
    assert rows[0][0] < 1e-9 and rows[0][1] < 1e-9 and rows[0][2] == len(accuracy_run.result.iterations["t_end"])
    # decode baseline = t0 + a*ctx + c*decode computed independently
    it = accuracy_run.result.iterations
    base = con.execute("select decode_baseline_ms from iteration_fit where run_id = ? order by iter", [run]).fetchall()
    expect = (
        acc_fit.t0_ms
        + acc_fit.a_ms_per_ctx * it["context_tokens"]
        + (acc_fit.c_ms_per_decode or 0) * it["decode_tokens"]
    )
    np.testing.assert_allclose([b[0] for b in base], expect, rtol=1e-12)
