"""The fit on a real recorded vLLM CPU run (fixtures/vllm): it runs and reports honestly, whatever holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import store
from pipeline.fit import explain, fit_run
from pipeline.ingest import ingest_paths

VLLM = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 1024, "torch_dtype": "bfloat16", "tie_word_embeddings": False}  # fixtures/vllm/NOTE.md


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
    return con, fit_run(con, "cpu", config=str(tmp / "config.json"), gpu="cpu:20", n_boot=100)


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
