"""The fit on a real recorded vLLM CPU run (fixtures/vllm): it runs and reports honestly, whatever holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import store
from pipeline.catalog import HardwareSpec
from pipeline.fit import explain, fit_run
from pipeline.ingest import ingest_paths

VLLM = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}  # fixtures/vllm/NOTE.md


@pytest.fixture(scope="module")
def vllm_fit(tmp_path_factory):
    if not (VLLM / "server_epoch.log").exists():
        pytest.skip("no recorded vLLM CPU run in fixtures/vllm")
    tmp = tmp_path_factory.mktemp("vllm")
    (tmp / "config.json").write_text(json.dumps(TINY_LLAMA))
    con = store.connect(tmp / "v.duckdb")
    # the step log and the per-request stats on one run, so context_tokens can be estimated from the requests
    ingest_paths(con, [VLLM / "server_epoch.log", VLLM / "requests.jsonl"], run_id="cpu")
    store.build_derived(con)
    return con, fit_run(con, "cpu", HardwareSpec(config=str(tmp / "config.json"), gpu="cpu:20"), n_boot=100)


def test_fit_runs_and_reports_spread(vllm_fit):
    con, f = vllm_fit
    steps = con.execute("select count(*) from iterations where run_id = 'cpu'").fetchall()[0][0]
    assert f.n_fitted == f.n_iterations == steps > 500
    assert 0 < f.r2 < 1 and f.mape_pct > 0 and f.residual_log_sigma > 0
    # the fixed cost per step dominates a 4-layer model on a CPU: t0 is far above the weight floor
    assert f.hardware["kv_bytes_per_token"] == 2 * 4 * 2 * 64 * 2
    assert f.t0_ms > 10 * f.hardware["weight_floor_ms"]
    assert f.claims[3]["holds"] is True
    # prefill spikes the step: steps with prefill take longer (median) than decode-only ones
    assert f.shape["prefill_step_median_ms"] > f.shape["decode_step_median_ms"]
    assert all(c["holds"] in (True, False, None) and c["evidence"] for c in f.claims)


def test_explain_on_real_run(vllm_fit):
    con, _ = vllm_fit
    for metric in ("ttft", "tpot", "e2e"):
        e = explain(con, "cpu", metric)
        assert e["requests"] == 64
        assert sum(p["share"] for p in e["parts"]) == pytest.approx(1.0)


# Held-out (5 contiguous time blocks) per-step MAPE of both models on the real recordings, pinned when
# written: fixtures/vllm gains from a per-request cost (0.31 ms per request in the step, on top of
# 0.06 ms per decode token); fixtures/vllm_queue is dominated by host variance on a contended CPU
# (decode steps of 5 requests last 0.6-39 ms), which no candidate term explains, so the
# memory-bound model stands. Margin: 0.5 points (fit or ingest changes show up here).
HELD_OUT_MAPE = {"vllm": (22.34, 22.02), "vllm_queue": (55.64, 55.64)}


@pytest.mark.parametrize("name", list(HELD_OUT_MAPE))
@pytest.mark.long
def test_extended_model_out_of_sample_on_real_runs(tmp_path, name):
    d = VLLM.parent / name
    if not (d / "server_epoch.log").exists():
        pytest.skip(f"no recorded run in fixtures/{name}")
    con = store.connect(tmp_path / "v.duckdb")
    ingest_paths(con, [d / "server_epoch.log", d / "requests.jsonl"], run_id="cpu")
    store.build_derived(con)
    ex = fit_run(con, "cpu", HardwareSpec(gpu="cpu:20"), n_boot=20).extended
    mb, xt = ex["cv"]["memory_bound"]["mape_pct"], ex["cv"]["extended"]["mape_pct"]
    assert (mb, xt) == pytest.approx(HELD_OUT_MAPE[name], abs=0.5)
    assert xt <= mb  # the extended model is never worse out of sample: it only adds what held-out steps reward
    assert ex["better"] == (name == "vllm")
    assert all(v >= 0 for v in ex["coef"].values())
