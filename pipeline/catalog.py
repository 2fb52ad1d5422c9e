"""Hardware and model catalogue for the memory-bound model (docs/model-and-attribution.md, section 2).

The figures live in ``pipeline/data/gpus.toml`` and ``pipeline/data/models.toml``,
each with the source it was taken from. A model can also come from a Hugging Face
``config.json`` (:func:`model_from_hf_config`); its parameter count is then computed
from the shapes (embeddings, attention, gated MLP or experts, norms).

Byte counts used by the fit:

- ``kv_bytes_per_token = 2 * layers * kv_heads * head_dim * bytes(kv_dtype)``
  (one K and one V vector per layer and KV head);
- ``weight_bytes = active_params * bytes(dtype)``: what one decode step must read
  at least once (for a mixture of experts the active experts; a large batch may
  touch all of them, so the total is reported too).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import InputError
from .settings import setting

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - 3.10
    import tomli as tomllib  # type: ignore[no-redef]

DATA = Path(__file__).resolve().parent / "data"

# bytes per element of the dtype names engines log (vLLM, HF torch_dtype, TRT-LLM)
DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "auto": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8": 1,
    "int8": 1,
    "int4": 0.5,
    "fp4": 0.5,
    "nvfp4": 0.5,
}


def dtype_bytes(name: str | None, default: float = 2) -> float:
    """Bytes per element of a dtype name; ``default`` (bf16) when unknown or empty."""
    if not name:
        return default
    return DTYPE_BYTES.get(str(name).lower().replace("torch.", ""), default)


def normalise(name: str) -> str:
    """Lower-case key for matching catalogue names and aliases."""
    s = name.lower()
    for word in ("nvidia", "amd", "instinct", "tensor core gpu", "geforce"):
        s = s.replace(word, "")
    return re.sub(r"[\s_\-]+", "", s)


@dataclass(frozen=True)
class Gpu:
    """One accelerator; bandwidth in GB/s (1e9 B/s), compute dense in TFLOP/s."""

    name: str
    peak_bw_gbps: float | None
    bf16_tflops: float | None = None
    fp8_tflops: float | None = None
    memory_gb: float | None = None
    source: str = ""

    def peak_tflops(self, dtype: str | None) -> float | None:
        """Dense peak for the compute dtype (FP8 when the weights are 8-bit, else BF16)."""
        return self.fp8_tflops if dtype_bytes(dtype) <= 1 and self.fp8_tflops else self.bf16_tflops


@dataclass(frozen=True)
class ModelSpec:
    """Attention shape and parameter count of one model."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    params_b: float
    active_params_b: float | None = None
    hidden: int | None = None
    heads: int | None = None
    dtype: str | None = None
    source: str = ""

    @property
    def active_b(self) -> float:
        """Parameters (billions) read per token: the active ones for a mixture of experts."""
        return self.active_params_b or self.params_b

    def kv_bytes_per_token(self, kv_dtype: str | None = None) -> float:
        """KV-cache bytes one token adds: 2 (K and V) x layers x KV heads x head dim x dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes(kv_dtype or self.dtype)

    def weight_bytes(self, dtype: str | None = None, active: bool = True) -> float:
        """Bytes of weights one decode step reads (active or all parameters)."""
        n = self.active_b if active else self.params_b
        return n * 1e9 * dtype_bytes(dtype or self.dtype)


@dataclass(frozen=True, kw_only=True)
class HardwareSpec:
    """What the user says a run ran on; each field left None is taken from the run's metadata.

    Only the hardware figures of a fit depend on it (``tracelat fit`` makes its options
    from these fields; :func:`pipeline.fit.hardware.resolve` looks the names up).
    """

    model: str | None = setting(None, "Model name from the catalogue or a HF id (default: the run's model).")
    config: str | None = setting(
        None, "A Hugging Face config.json (or its folder) instead of --model.", existing="path"
    )
    gpu: str | None = setting(
        None, "GPU from the catalogue (h100-sxm, a100-80gb, ..., cpu:GBPS); default: the run's GPU."
    )
    bandwidth_gbps: float | None = setting(
        None,
        "Peak memory bandwidth in GB/s: overrides the GPU's catalogue figure, or describes a GPU the "
        "catalogue lacks (required for --gpu cpu).",
        min=0,
        min_open=True,
    )
    tflops: float | None = setting(
        None,
        "Dense peak TFLOP/s, overriding the catalogue (prefill roofline).",
        flag="--peak-tflops",
        min=0,
        min_open=True,
    )

    def __post_init__(self) -> None:
        # a config file or a library caller reaches here without click's check
        for name in ("bandwidth_gbps", "tflops"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(f"{name}: expected a positive number, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (all fields, None included)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HardwareSpec":
        """The inverse of :meth:`to_dict`; unknown keys are an error, missing ones None."""
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise InputError(f"unknown hardware setting(s): {', '.join(sorted(unknown))}")
        return cls(**d)


@lru_cache(maxsize=None)
def _table(name: str) -> dict:
    with open(DATA / name, "rb") as fh:
        return tomllib.load(fh)


def _lookup(table: dict, name: str) -> tuple[str, dict] | None:
    want = normalise(name)
    short = normalise(name.rsplit("/", 1)[-1])
    for key, entry in table.items():
        keys = {normalise(key)} | {normalise(a) for a in entry.get("aliases", [])}
        if want in keys or short in keys:
            return key, entry
    return None


def gpus() -> list[str]:
    """Names of the catalogued accelerators."""
    return list(_table("gpus.toml"))


def models() -> list[str]:
    """Names of the catalogued models."""
    return list(_table("models.toml"))


def find_gpu(name: str | None, bandwidth_gbps: float | None = None, tflops: float | None = None) -> Gpu | None:
    """The accelerator called ``name`` (catalogue name or alias), or None when unknown.

    ``cpu:40`` means the ``cpu`` entry with 40 GB/s; ``bandwidth_gbps`` / ``tflops``
    override the catalogue figures (needed for ``cpu``).
    """
    if not name:
        return None
    m = re.fullmatch(r"\s*(.*?)\s*:\s*([0-9.]+)\s*", name)
    if m:
        try:
            given = float(m.group(2))
        except ValueError:  # "1.2.3"
            given = 0.0
        if not given > 0:
            raise InputError(f"GPU {name!r}: {m.group(2)!r} is no positive bandwidth in GB/s (write e.g. cpu:40)")
        name, bandwidth_gbps = m.group(1), bandwidth_gbps or given
    hit = _lookup(_table("gpus.toml"), name)
    if hit is None:
        return None
    key, e = hit
    gpu = Gpu(key, e.get("peak_bw_gbps"), e.get("bf16_tflops"), e.get("fp8_tflops"), e.get("memory_gb"), e["source"])
    if bandwidth_gbps is not None:
        gpu = replace(gpu, peak_bw_gbps=float(bandwidth_gbps), source=f"user-given {bandwidth_gbps} GB/s")
    if tflops is not None:
        gpu = replace(gpu, bf16_tflops=float(tflops), fp8_tflops=None)
    return gpu


def get_gpu(name: str, bandwidth_gbps: float | None = None, tflops: float | None = None) -> Gpu:
    """Like :func:`find_gpu` but raises an :class:`InputError` listing the known names."""
    gpu = find_gpu(name, bandwidth_gbps, tflops)
    if gpu is None:
        raise InputError(f"unknown GPU {name!r}; known: {', '.join(gpus())} (or give --bandwidth-gbps with --gpu cpu)")
    return gpu


def find_model(name: str | None) -> ModelSpec | None:
    """The catalogued model called ``name`` (HF repo id or short name), or None."""
    if not name:
        return None
    hit = _lookup(_table("models.toml"), name)
    if hit is None:
        return None
    key, e = hit
    return ModelSpec(
        key,
        e["layers"],
        e["kv_heads"],
        e["head_dim"],
        e["params_b"],
        e.get("active_params_b"),
        e.get("hidden"),
        e.get("heads"),
        None,
        e["source"],
    )


def get_model(name: str) -> ModelSpec:
    """Like :func:`find_model` but raises an :class:`InputError` listing the known names."""
    spec = find_model(name)
    if spec is None:
        raise InputError(f"unknown model {name!r}; known: {', '.join(models())}; or pass --config path/to/config.json")
    return spec


# model types whose Transformers config class ties the output layer to the input embedding when
# config.json leaves tie_word_embeddings out (Gemma's configs do); Llama, Mistral, Qwen and most
# others set it false in their class, and write it out anyway
TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "gpt2", "opt"})


def _count_params(c: dict, hidden: int, heads: int, kv_heads: int, head_dim: int, layers: int) -> tuple[float, float]:
    """Total and active parameters (billions) from a decoder config's shapes."""
    vocab = int(c.get("vocab_size", 0))
    inter = int(c.get("intermediate_size") or c.get("ffn_dim") or 4 * hidden)
    attn = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    if c.get("attention_bias") or c.get("model_type") in ("qwen2", "qwen2_moe"):
        attn += heads * head_dim + 2 * kv_heads * head_dim
    experts = int(c.get("num_local_experts") or c.get("num_experts") or 1)
    per_tok = int(c.get("num_experts_per_tok") or experts)
    moe_inter = int(c.get("moe_intermediate_size") or inter)
    expert = 3 * hidden * (moe_inter if experts > 1 else inter)  # gated MLP: gate, up, down
    router = hidden * experts if experts > 1 else 0
    norms = 2 * hidden
    embed = vocab * hidden * (1 if c.get("tie_word_embeddings", c.get("model_type") in TIED_BY_DEFAULT) else 2)
    total = embed + hidden + layers * (attn + router + norms + experts * expert)
    active = embed + hidden + layers * (attn + router + norms + per_tok * expert)
    return total / 1e9, active / 1e9


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` (or the folder holding it)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        c = json.loads(p.read_text())
    except FileNotFoundError as exc:
        raise InputError(f"{p}: no such file; pass the model's config.json to --config") from exc
    except ValueError as exc:
        raise InputError(f"{p}: not valid JSON ({exc}); pass a Hugging Face config.json") from exc
    if "text_config" in c:  # multimodal wrappers keep the language model under text_config
        c = {**c, **c["text_config"]}
    try:
        hidden = int(c["hidden_size"])
        heads = int(c["num_attention_heads"])
        layers = int(c["num_hidden_layers"])
    except KeyError as exc:
        raise InputError(f"{p}: config lacks {exc.args[0]!r}; is this a decoder-only model's config.json?") from exc
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or hidden // heads)
    total, active = _count_params(c, hidden, heads, kv_heads, head_dim, layers)
    name = c.get("_name_or_path") or p.parent.name or "config"
    return ModelSpec(
        str(name),
        layers,
        kv_heads,
        head_dim,
        round(total, 4),
        round(active, 4) if active < total else None,
        hidden,
        heads,
        c.get("torch_dtype") or c.get("dtype"),
        f"{p} (parameters computed from shapes)",
    )
