"""Fitted coefficients against the hardware: bandwidth, weight floor, compute roofline.

All byte and time conversions of the model (docs/model-and-attribution.md, section 2) live here:

- effective bandwidth ``= kv_bytes_per_token / a`` (a in ms per context token, so
  GB/s = bytes / (a * 1e-3) / 1e9), compared with the peak of all tensor-parallel
  GPUs together (each reads its share of the KV cache at the same time);
- weight floor ``= weight_bytes / peak``: the least time a step needs to read the
  weights once; ``t0 - floor`` is per-step overhead (launches, scheduling, host work);
- prefill roofline ``= 2 * active_params / peak_flops`` per prompt token (the matmul
  FLOPs; attention's quadratic term is ignored, so long prompts sit above it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb

from .. import catalog
from ..catalog import Gpu, HardwareSpec, ModelSpec
from ..errors import InputError


@dataclass(frozen=True)
class Hardware:
    """What the run ran on, as resolved from options and run metadata."""

    model: ModelSpec | None
    gpu: Gpu | None
    num_gpus: int
    dtype: str | None
    kv_dtype: str | None
    notes: tuple[str, ...] = ()


def resolve(con: duckdb.DuckDBPyConnection, run_id: str, hw: HardwareSpec = HardwareSpec()) -> Hardware:
    """Model and GPU as ``hw`` names them, else from the run's metadata (``runs.model``/``gpu``)."""
    model, config, gpu, bandwidth_gbps, tflops = hw.model, hw.config, hw.gpu, hw.bandwidth_gbps, hw.tflops
    rows = con.execute("select model, gpu, num_gpus, dtype, kv_dtype from runs where run_id = ?", [run_id]).fetchall()
    run_model, run_gpu, num_gpus, dtype, kv_dtype = rows[0] if rows else (None, None, None, None, None)
    notes = []
    if config:
        spec = catalog.model_from_hf_config(config)
    elif model:
        spec = catalog.get_model(model)
    else:
        spec = catalog.find_model(run_model)
        if spec is None:
            notes.append(
                f"model {run_model!r} of the run is not in the catalogue: pass --model or --config "
                "for bandwidth and weight-floor figures"
                if run_model
                else "the run names no model: pass --model or --config for bandwidth and weight-floor figures"
            )
    if gpu:
        dev = catalog.get_gpu(gpu, bandwidth_gbps, tflops)
    else:
        try:
            dev = catalog.find_gpu(run_gpu, bandwidth_gbps, tflops)
        except InputError:  # the log's "gpu": "cpu:0" is the run's oddity, not the user's mistake
            dev = None
        if dev is None and (bandwidth_gbps is not None or tflops is not None):
            # a GPU the catalogue lacks (or the run does not name), described by the user's figures:
            # they are used, not dropped
            given = [
                f"{bandwidth_gbps} GB/s" if bandwidth_gbps is not None else "",
                f"{tflops} TFLOP/s" if tflops else "",
            ]
            dev = Gpu(
                str(run_gpu) if run_gpu else "user-given",
                float(bandwidth_gbps) if bandwidth_gbps is not None else None,
                float(tflops) if tflops is not None else None,
                source="user-given " + ", ".join(x for x in given if x),
            )
            notes.append(
                (f"GPU {run_gpu!r} of the run is not in the catalogue" if run_gpu else "the run names no GPU")
                + ": its figures are the ones given (--bandwidth-gbps, --peak-tflops)"
            )
        if dev is None:
            notes.append(
                f"GPU {run_gpu!r} of the run is not in the catalogue: pass --gpu"
                if run_gpu
                else "the run names no GPU: pass --gpu"
            )
    if dev is not None and not dev.peak_bw_gbps:
        notes.append(f"{dev.name} has no fixed bandwidth: give it with --bandwidth-gbps (or --gpu {dev.name}:GBPS)")
    if kv_dtype and str(kv_dtype).strip().lower() == "auto":  # vLLM's kv_cache_dtype=auto: the model's dtype
        kv_dtype = None
    return Hardware(spec, dev, int(num_gpus or 1), dtype or (spec.dtype if spec else None), kv_dtype, tuple(notes))


def _inv_ci(num: float, ci: tuple[float, float] | None) -> list[float | None]:
    """Interval of ``num / x`` for x in ci (x > 0); None where the interval reaches 0."""
    if not ci:
        return [None, None]
    lo, hi = ci
    return [num / hi if hi > 0 else None, num / lo if lo > 0 else None]


def report(coef: dict[str, float | None], ci: dict[str, Any], hw: Hardware) -> dict[str, Any] | None:
    """Hardware figures for a fit; None when neither model nor GPU is known."""
    spec, dev = hw.model, hw.gpu
    if spec is None and dev is None:
        return None
    out: dict[str, Any] = {
        "model": spec.name if spec else None,
        "gpu": dev.name if dev else None,
        "num_gpus": hw.num_gpus,
        "weight_dtype": hw.dtype or "bf16 (assumed)",
        "kv_dtype": hw.kv_dtype or hw.dtype or "bf16 (assumed)",
        "sources": {"model": spec.source if spec else None, "gpu": dev.source if dev else None},
    }
    a, t0, b = coef.get("a_ms_per_ctx"), coef.get("t0_ms"), coef.get("b_ms_per_prefill")
    peak_bw = dev.peak_bw_gbps * hw.num_gpus if dev and dev.peak_bw_gbps else None
    out["peak_bandwidth_gbps"] = peak_bw
    if spec is not None:
        kvb = spec.kv_bytes_per_token(hw.kv_dtype or hw.dtype)
        out["kv_bytes_per_token"] = kvb
        out["weight_bytes"] = spec.weight_bytes(hw.dtype)
        if a and a > 0:
            # bytes per ms -> GB/s: bytes / (a * 1e-3 s) / 1e9
            out["effective_bandwidth_gbps"] = kvb / a * 1e-6
            out["effective_bandwidth_ci_gbps"] = [v * 1e-6 if v else None for v in _inv_ci(kvb, ci.get("a_ms_per_ctx"))]
    if peak_bw and out.get("effective_bandwidth_gbps"):
        out["bandwidth_fraction_of_peak"] = out["effective_bandwidth_gbps"] / peak_bw
    if spec is not None and peak_bw:
        floor = spec.weight_bytes(hw.dtype) / (peak_bw * 1e9) * 1e3
        out["weight_floor_ms"] = floor
        if spec.active_params_b:
            out["weight_floor_all_experts_ms"] = spec.weight_bytes(hw.dtype, active=False) / (peak_bw * 1e9) * 1e3
        if t0 is not None:
            out["overhead_ms"] = t0 - floor
            lo, hi = ci.get("t0_ms", (None, None))
            out["overhead_ci_ms"] = [lo - floor if lo is not None else None, hi - floor if hi is not None else None]
    tf = dev.peak_tflops(hw.dtype) if dev else None
    if spec is not None and tf:
        roof = 2 * spec.active_b * 1e9 / (tf * 1e12 * hw.num_gpus) * 1e3
        out["prefill_roofline_ms_per_token"] = roof
        if b and b > 0:
            out["prefill_ms_per_token"] = b
            out["prefill_fraction_of_peak_compute"] = roof / b
    return out
