"""The fit's hardware figures read vLLM's kv_cache_dtype=auto as the model's dtype."""

from __future__ import annotations

from pipeline import store
from pipeline.fit import hardware


def test_kv_dtype_auto_is_the_model_dtype(tmp_path):
    con = store.connect(tmp_path / "h.duckdb")
    con.execute(
        "insert into runs (run_id, engine, model, gpu, num_gpus, dtype, kv_dtype) values "
        "('auto', 'vllm', 'llama-3.1-8b', 'H100', 1, 'float32', 'auto'), "
        "('fp8', 'vllm', 'llama-3.1-8b', 'H100', 1, 'float32', 'fp8')"
    )
    coef = {"a_ms_per_ctx": 1e-4, "t0_ms": 5.0, "b_ms_per_prefill": 0.01}
    auto = hardware.report(coef, {}, hardware.resolve(con, "auto"))
    fp8 = hardware.report(coef, {}, hardware.resolve(con, "fp8"))
    assert auto["kv_dtype"] == "float32"  # not "auto", and 4 bytes an element (auto is no dtype of its own)
    assert auto["kv_bytes_per_token"] == 4 * fp8["kv_bytes_per_token"]
