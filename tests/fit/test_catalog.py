"""Hardware/model catalogue: byte counts by hand, HF config.json parsing, name matching."""

from __future__ import annotations

import json

import pytest

from pipeline import catalog
from pipeline.errors import InputError


def test_kv_bytes_per_token_by_hand():
    # 2 (K and V) x layers x KV heads x head dim x bytes
    assert catalog.get_model("llama-3.1-8b").kv_bytes_per_token("bf16") == 2 * 32 * 8 * 128 * 2 == 131072
    assert catalog.get_model("meta-llama/Llama-2-7b-hf").kv_bytes_per_token() == 2 * 32 * 32 * 128 * 2
    assert catalog.get_model("Llama-3.1-70B").kv_bytes_per_token("fp8") == 2 * 80 * 8 * 128 * 1
    assert catalog.get_model("qwen/Qwen2.5-7B-Instruct").kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2


def test_every_entry_has_a_source_and_the_required_entries_exist():
    for name in ("a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "l40s", "mi300x", "cpu"):
        assert catalog.find_gpu(name).source
    for name in (
        "llama-3.1-8b",
        "llama-3.1-70b",
        "llama-2-7b",
        "llama-2-70b",
        "mistral-7b",
        "qwen2.5-7b",
        "qwen2.5-72b",
        "mixtral-8x7b",
    ):
        assert catalog.find_model(name).source


def test_gpu_aliases_and_user_bandwidth():
    assert catalog.find_gpu("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert catalog.find_gpu("AMD Instinct MI300X").peak_bw_gbps == 5300
    assert catalog.find_gpu("H100-SXM").peak_tflops("bf16") == 989.4
    assert catalog.find_gpu("H100-SXM").peak_tflops("fp8") == 1978.9
    assert catalog.find_gpu("a100-80gb").peak_tflops("fp8") == 312  # no FP8 on A100: BF16 peak
    assert catalog.find_gpu("cpu").peak_bw_gbps is None
    assert catalog.find_gpu("cpu:40").peak_bw_gbps == 40.0
    assert catalog.get_gpu("cpu", bandwidth_gbps=25.6).peak_bw_gbps == 25.6
    assert catalog.find_gpu("tpu-v5") is None
    with pytest.raises(InputError, match="unknown GPU 'tpu-v5'; known: a100-40gb"):
        catalog.get_gpu("tpu-v5")
    with pytest.raises(InputError, match="--config"):
        catalog.get_model("gpt-5")


def _llama_config(**extra):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        **extra,
    }


def test_hf_config_matches_catalogue(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(_llama_config()))
    spec = catalog.model_from_hf_config(tmp_path)  # the folder works too
    ref = catalog.get_model("llama-3.1-8b")
    assert (spec.layers, spec.kv_heads, spec.head_dim) == (32, 8, 128)
    assert spec.params_b == pytest.approx(ref.params_b, abs=0.005)
    # by hand: embeddings + lm_head + 32 x (attention + gated MLP + 2 norms) + final norm
    attn = 4096 * 4096 * 2 + 2 * 4096 * 1024
    by_hand = 2 * 128256 * 4096 + 32 * (attn + 3 * 4096 * 14336 + 2 * 4096) + 4096
    assert spec.params_b == pytest.approx(by_hand / 1e9, abs=1e-4)
    assert spec.kv_bytes_per_token() == 131072 and spec.dtype == "bfloat16"


def test_hf_config_without_tie_flag_follows_the_model_types_default(tmp_path):
    """Gemma's config.json leaves tie_word_embeddings out, and its config class ties them: counting
    an untied output layer put Gemma-2-9B at 10.16 B parameters, the weight floor 10% high."""
    gemma = {
        "model_type": "gemma2",
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "num_hidden_layers": 42,
        "vocab_size": 256000,
    }
    (tmp_path / "config.json").write_text(json.dumps(gemma))
    assert catalog.model_from_hf_config(tmp_path).params_b == pytest.approx(9.2417, abs=0.002)  # Google's count
    # a Llama config without the key stays untied, as LlamaConfig's own default is
    llama = {k: v for k, v in _llama_config().items() if k != "tie_word_embeddings"}
    (tmp_path / "config.json").write_text(json.dumps(llama))
    assert catalog.model_from_hf_config(tmp_path).params_b == pytest.approx(
        catalog.get_model("llama-3.1-8b").params_b, abs=0.005
    )


def test_hf_config_mixture_of_experts(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(
        json.dumps(_llama_config(model_type="mixtral", vocab_size=32000, num_local_experts=8, num_experts_per_tok=2))
    )
    spec = catalog.model_from_hf_config(p)
    ref = catalog.get_model("mistralai/Mixtral-8x7B-v0.1")
    assert spec.params_b == pytest.approx(ref.params_b, rel=0.01)
    assert spec.active_params_b == pytest.approx(ref.active_params_b, rel=0.01)
    assert spec.weight_bytes("bf16") == pytest.approx(spec.active_params_b * 2e9)
    assert spec.weight_bytes("bf16", active=False) == pytest.approx(spec.params_b * 2e9)


def test_hf_config_errors(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        catalog.model_from_hf_config(tmp_path / "missing.json")
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(InputError, match="lacks 'num_attention_heads'"):
        catalog.model_from_hf_config(bad)


@pytest.mark.parametrize("name", ["cpu:0", "cpu:1.2.3", "cpu:."])
def test_a_gpu_bandwidth_suffix_must_be_a_positive_number(name):
    with pytest.raises(InputError, match="no positive bandwidth in GB/s"):
        catalog.find_gpu(name)


@pytest.mark.parametrize("field", ["bandwidth_gbps", "tflops"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -5.0, "40"])
def test_hardware_spec_refuses_a_figure_that_is_no_positive_number(field, value):
    with pytest.raises(InputError, match=f"{field}: expected a positive number"):
        catalog.HardwareSpec(**{field: value})


def test_a_gpu_with_a_bad_bandwidth_in_the_run_metadata_is_a_note_not_an_error():
    import duckdb

    from pipeline.fit import hardware

    con = duckdb.connect()
    con.execute(
        "create table runs as select 'r' as run_id, null::varchar as model, 'cpu:0' as gpu, "
        "null::int as num_gpus, null::varchar as dtype, null::varchar as kv_dtype"
    )
    hw = hardware.resolve(con, "r")
    assert hw.gpu is None and any("GPU 'cpu:0' of the run is not in the catalogue" in n for n in hw.notes)
