"""The one goodput implementation (pipeline.slo.goodput) against numpy, and audit vs replay sweep."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pipeline import store
from pipeline.slo import GoodputSpec, goodput


def _requests(seed: int, n: int = 400) -> pl.DataFrame:
    """A request_latency-shaped table: failures, one-token outputs, missing first tokens and finishes."""
    rng = np.random.default_rng(seed)
    out = rng.integers(1, 40, n)
    out[rng.random(n) < 0.15] = 1
    ttft = rng.lognormal(5, 1, n)
    ttft[rng.random(n) < 0.05] = np.nan  # no first token
    tpot = np.where(out > 1, rng.lognormal(3, 0.5, n), np.nan)
    e2e = ttft + np.nan_to_num(tpot) * (out - 1) + rng.exponential(5, n)
    e2e[rng.random(n) < 0.05] = np.nan  # no finish
    status = np.where(rng.random(n) < 0.1, "error", "ok")
    return pl.DataFrame(
        {
            "run_id": "r",
            "req_id": [f"q{i}" for i in range(n)],
            "status": status,
            "output_tokens": out,
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "e2e_ms": e2e,
            "queue_ms": rng.exponential(30, n),
        }
    ).with_columns(pl.col("ttft_ms", "tpot_ms", "e2e_ms").fill_nan(None))


def _numpy_goodput(df: pl.DataFrame, limits: dict[str, float], duration_s: float) -> dict:
    """Goodput written out with numpy from the definition (docs/reports-and-audit.md)."""
    ok = df["status"].to_numpy() == "ok"
    out = df["output_tokens"].to_numpy()
    good = ok.copy()
    by_limit = {}
    for metric, limit in limits.items():
        v = df[metric].to_numpy().astype(float)  # nulls become NaN: never within a limit
        meets = v <= limit + 1e-3  # within 1 us of the limit meets it (float rounding of times)
        if metric == "tpot_ms":
            meets |= np.isnan(v) & (out <= 1)  # a one-token output has no TPOT and meets the limit
        by_limit[metric] = (ok & meets).sum() / len(df)
        good &= meets
    return {
        "good_requests": int(good.sum()),
        "attainment": good.sum() / len(df),
        "by_limit": by_limit,
        "good_output_tokens": int(out[good].sum()),
        "request_goodput_rps": good.sum() / duration_s,
        "token_goodput_tps": out[good].sum() / duration_s,
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "limits",
    [{"ttft_ms": 200.0}, {"ttft_ms": 300.0, "tpot_ms": 25.0}, {"tpot_ms": 20.0, "e2e_ms": 900.0, "queue_ms": 40.0}],
)
def test_goodput_equals_numpy(seed, limits):
    df = _requests(seed)
    other = _requests(seed + 10).with_columns(run_id=pl.lit("other"))  # another run: must not count
    con = store.scratch()
    con.register("request_latency", pl.concat([df, other]))
    got = goodput(con, "r", GoodputSpec(dict(limits)), 12.5)
    want = _numpy_goodput(df, limits, 12.5)
    assert 0 < got["good_requests"] < len(df)  # the limits split the requests: the case under test
    assert got["requests"] == len(df)
    assert got["requests_ok"] == int((df["status"] == "ok").sum())
    assert got["good_requests"] == want["good_requests"]
    assert got["good_output_tokens"] == want["good_output_tokens"]
    assert got["attainment"] == pytest.approx(want["attainment"], rel=1e-12)
    assert got["attainment_by_limit"] == pytest.approx(want["by_limit"], rel=1e-12)
    assert got["request_goodput_rps"] == pytest.approx(want["request_goodput_rps"], rel=1e-12)
    assert got["token_goodput_tps"] == pytest.approx(want["token_goodput_tps"], rel=1e-12)


@pytest.mark.parametrize("duration_s", [None, 0.0, float("nan")])
def test_goodput_rates_undefined_without_a_duration(duration_s):
    con = store.scratch()
    con.register("request_latency", _requests(0))
    got = goodput(con, "r", GoodputSpec({"ttft_ms": 200.0}), duration_s)
    assert got["request_goodput_rps"] is None and got["token_goodput_tps"] is None
    assert got["attainment"] is not None


def test_goodput_rates_undefined_without_requests():
    con = store.scratch()
    con.register("request_latency", _requests(0).filter(pl.col("run_id") == "none"))
    got = goodput(con, "r", GoodputSpec({"ttft_ms": 200.0}), 60.0)
    assert got["requests"] == 0 and got["attainment"] is None
    assert got["request_goodput_rps"] is None and got["token_goodput_tps"] is None


def test_a_limit_on_a_metric_no_request_has_is_not_measured():
    """A client's records without steps have no queue_ms: not 'every request fails the limit'."""
    con = store.scratch()
    con.register("request_latency", _requests(0).with_columns(queue_ms=pl.lit(None, dtype=pl.Float64)))
    got = goodput(con, "r", GoodputSpec({"ttft_ms": 200.0, "queue_ms": 100.0}), 60.0)
    assert got["unmeasured"] == ["queue_ms"] and got["attainment"] is None
    assert got["request_goodput_rps"] is None and got["token_goodput_tps"] is None
    assert got["attainment_by_limit"]["queue_ms"] is None and got["attainment_by_limit"]["ttft_ms"] > 0
    # one request with a value makes it measured: the others then do not meet the limit
    some = _requests(0).with_columns(queue_ms=pl.when(pl.col("req_id") == "q3").then(1.0).otherwise(None))
    con.register("request_latency", some.with_columns(status=pl.lit("ok")))
    got = goodput(con, "r", GoodputSpec({"queue_ms": 100.0}), 60.0)
    assert got["unmeasured"] == [] and got["good_requests"] == 1


def test_audit_of_a_goodput_limit_on_a_missing_metric_cannot_be_evaluated(tmp_path):
    from pathlib import Path

    from pipeline.cli import run_captured

    fix = Path(__file__).resolve().parents[1] / "fixtures"
    db = tmp_path / "q.duckdb"
    code, out = run_captured("ingest", fix / "genai_perf" / "profile_export.json", "--run-id", "g", "--db", db)
    assert code == 0, out
    (tmp_path / "slo.toml").write_text("[goodput]\nqueue_ms = 100\nmin_attainment = 0.5\n")
    code, out = run_captured("audit", "g", "--slo", tmp_path / "slo.toml", "--db", db)
    assert code == 2, out
    assert "no ok request of the run has queue_ms" in out and "FAIL" not in out


@pytest.mark.parametrize("minimum", ["min_request_goodput_rps = 1", "min_token_goodput_tps = 0", "min_attainment = 0"])
def test_audit_of_a_steps_only_run_cannot_evaluate_goodput(tmp_path, minimum):
    """A log of steps only (TRT-LLM iteration log) says nothing of goodput: exit 2, not a FAIL or a PASS."""
    from pathlib import Path

    from pipeline.cli import run_captured

    repo = Path(__file__).resolve().parents[1]
    db = tmp_path / "s.duckdb"
    code, out = run_captured("ingest", repo / "fixtures" / "trtllm" / "iteration_log.txt", "--db", db)
    assert code == 0, out
    (tmp_path / "slo.toml").write_text(f"[goodput]\nttft_ms = 100\n{minimum}\n")
    code, out = run_captured("audit", "iteration_log", "--slo", tmp_path / "slo.toml", "--db", db)
    assert code == 2, out
    assert "cannot be evaluated" in out and "FAIL" not in out and "PASS" not in out


def test_audit_and_replay_sweep_agree_on_goodput(tmp_path):
    """The same simulated run judged by the audit (ingested) and by a sweep (simulator arrays)."""
    from pipeline import ingest
    from pipeline.audit.measure import goodput as audit_goodput
    from pipeline.replay.sweep import replay_goodput as sweep_goodput
    from pipeline.sim import IterationModel, NoiseModel, Policy, poisson_workload, simulate
    from pipeline.sim.writer import write_trace

    policy, model, noise = (
        Policy(max_num_seqs=16, max_num_batched_tokens=256, kv_capacity_tokens=4000, chunked_prefill=True),
        IterationModel(),
        NoiseModel(sigma=0.05, stall_rate=0.01, stall_ms_mean=20.0),
    )
    w = poisson_workload(200, 30.0, 200, 0.6, 4, 1.0, seed=7)  # short outputs: many of one token
    res = simulate(w, policy, model, noise, seed=3, t_end_s=5.0)  # cut: some requests never finish
    rq = res.requests
    assert (rq["status"] != "ok").any() and (rq["output_tokens"][rq["status"] == "ok"] == 1).any()
    path = write_trace(res, tmp_path / "g.jsonl", "g", policy, model, noise)
    con = store.connect(tmp_path / "g.duckdb")
    ingest.ingest_paths(con, [path])
    store.build_derived(con)
    spec = GoodputSpec({"ttft_ms": 300.0, "tpot_ms": 40.0, "e2e_ms": 600.0})
    audit = audit_goodput(con, "g", spec)
    dur = con.execute("select duration_s from run_summary where run_id = 'g'").fetchall()[0][0]
    con.close()
    sweep = sweep_goodput(res, np.ones(res.n_requests, bool), spec, dur)
    assert 0 < audit["good_requests"] < audit["requests"] == res.n_requests
    for key in ("requests", "requests_ok", "good_requests", "good_output_tokens", "attainment_by_limit"):
        assert sweep[key] == audit[key], key
    for key in ("attainment", "request_goodput_rps", "token_goodput_tps"):
        assert sweep[key] == pytest.approx(audit[key], rel=1e-12), key
    # and a third opinion straight from the simulator's arrays
    done = rq["status"] == "ok"
    with np.errstate(invalid="ignore"):
        ttft = (rq["t_first_token"] - rq["t_arrival"]) * 1000
        e2e = (rq["t_finish"] - rq["t_arrival"]) * 1000
        tpot = (rq["t_finish"] - rq["t_first_token"]) * 1000 / np.maximum(rq["output_tokens"] - 1, 1)
    good = done & (ttft <= 300) & (e2e <= 600) & ((rq["output_tokens"] <= 1) | (tpot <= 40))
    assert audit["good_requests"] == int(good.sum())
