"""The extended step-time model: per-request and prefill-attention costs, chosen on held-out time blocks.

Against the simulator's truth: a generator with both extra terms (pipeline.sim.model.IterationModel
d_ms_per_req, e_ms_per_prefill_attn) is recovered within 5%, its memory-bound terms within 3%; on a
memory-bound run the extended model claims no gain.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize

from pipeline.fit import get_or_fit
from pipeline.fit.extended import cross_validate, fit_nonneg

from .conftest import A_TRUE, B_TRUE, T0_TRUE

D_TRUE = 0.02  # ms per request in the step: per-sequence host work
E_TRUE = 1e-6  # ms per prefill attention pair: ~0.5 PFLOP/s-equivalent for Llama-8B's 0.5 MFLOP per pair


@pytest.fixture(scope="module")
def extended_run(tmp_path_factory):
    """Long prompts (1500 tokens on average, chunked at 2048) so chunks attend over earlier chunks."""
    from pipeline import store
    from pipeline.fit import fit_run
    from pipeline.ingest import ingest_paths
    from pipeline.sim.engine import Policy, simulate
    from pipeline.sim.model import IterationModel, NoiseModel
    from pipeline.sim.workload import poisson_workload
    from pipeline.sim.writer import write_trace

    tmp = tmp_path_factory.mktemp("ext")
    model = IterationModel(
        t0_ms=T0_TRUE,
        a_ms_per_ctx=A_TRUE,
        b_ms_per_prefill=B_TRUE,
        c_ms_per_decode=0.0,
        d_ms_per_req=D_TRUE,
        e_ms_per_prefill_attn=E_TRUE,
    )
    noise = NoiseModel(sigma=0.03, stall_rate=0.01, stall_ms_mean=50.0)
    policy = Policy(max_num_seqs=128, max_num_batched_tokens=2048)
    res = simulate(poisson_workload(12000, 12, 1500, 0.9, 200, 0.8, seed=1), policy, model, noise, seed=1)
    trace = write_trace(res, tmp / "ext.jsonl", "ext", policy, model, noise, with_token_times=False)
    con = store.connect(tmp / "ext.duckdb")
    ingest_paths(con, [trace])
    store.build_derived(con)
    return con, fit_run(con, "ext", n_boot=20), model, res


@pytest.mark.long
def test_extended_terms_recovered(extended_run):
    _, f, model, res = extended_run
    ex = f.extended
    assert res.n_iterations > 20_000
    assert ex["prefill_attn_source"] == "recorded (prefill_attn)"
    assert {"d_ms_per_req", "e_ms_per_prefill_attn"} <= set(ex["terms"])
    c = ex["coef"]
    assert c["d_ms_per_req"] == pytest.approx(model.d_ms_per_req, rel=0.05)
    assert c["e_ms_per_prefill_attn"] == pytest.approx(model.e_ms_per_prefill_attn, rel=0.05)
    for name in ("t0_ms", "a_ms_per_ctx", "b_ms_per_prefill"):
        assert c[name] == pytest.approx(getattr(model, name), rel=0.03), name
    assert c.get("c_ms_per_decode", 0.0) < 0.1 * model.d_ms_per_req  # the per-request cost is not put on decodes
    mb, xt = ex["cv"]["memory_bound"], ex["cv"]["extended"]
    assert ex["better"] and xt["mape_pct"] < mb["mape_pct"] and xt["p90_abs_ms"] < mb["p90_abs_ms"]
    # the held-out errors are those of the whole model: recompute them from the blocks
    it = res.iterations
    cols = {
        "context_tokens": it["context_tokens"].astype(float),
        "prefill_tokens": it["prefill_tokens"].astype(float),
        "batch_reqs": (it["decode_reqs"] + it["prefill_reqs"]).astype(float),
        "prefill_attn": it["prefill_attn"],
    }
    y = (it["t_end"] - it["t_start"]) * 1000
    again = cross_validate(tuple(t for t in ex["terms"]), cols, y)
    assert again["mape_pct"] == pytest.approx(xt["mape_pct"], rel=1e-6)


def test_replay_uses_the_extended_model_when_it_predicts_better(extended_run):
    from pipeline.replay import calibrate

    con, f, model, _ = extended_run
    cal = calibrate(con, "ext")
    assert cal.details["iteration_model"] == "extended"
    scale = cal.details["mean_scale"]
    assert cal.model.d_ms_per_req == pytest.approx(f.extended["coef"]["d_ms_per_req"] * scale, rel=1e-12)
    assert cal.model.e_ms_per_prefill_attn == pytest.approx(
        f.extended["coef"]["e_ms_per_prefill_attn"] * scale, rel=1e-12
    )
    assert any(n.startswith("iteration model: extended") for n in cal.notes)


@pytest.mark.long
def test_memory_bound_run_claims_no_gain(accuracy_run):
    f = get_or_fit(accuracy_run.con, accuracy_run.run_id)
    ex = f.extended
    assert not ex["better"], ex
    assert ex["cv"]["extended"]["mape_pct"] > 0.99 * ex["cv"]["memory_bound"]["mape_pct"]


def test_nonnegative_fit_matches_scipy_lsq_linear():
    """Without noise or outliers the robust passes change nothing: the bounded least-squares solution."""
    rng = np.random.default_rng(2)
    n = 3000
    X = np.column_stack([np.ones(n), rng.uniform(0, 5000, n), rng.uniform(0, 500, n), rng.uniform(0, 50, n)])
    beta_true = np.array([5.0, 2e-4, 0.03, 0.0])
    y = X @ beta_true * np.exp(rng.normal(0, 0.02, n))
    b = fit_nonneg(X, y)
    assert np.all(b >= 0)
    # the first pass is plain NNLS on the rows: check that building block against scipy's bounded solver
    from pipeline.fit.extended import _nnls_rows

    colscale = np.abs(X).max(axis=0)
    ref = optimize.lsq_linear(X / colscale, y, bounds=(0, np.inf), tol=1e-12).x
    np.testing.assert_allclose(_nnls_rows(X / colscale, y), ref, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(b[:3], beta_true[:3], rtol=0.03)
