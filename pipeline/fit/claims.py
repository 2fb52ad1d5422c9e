"""The four iteration-time claims (docs/model-and-attribution.md, section 3), each checked on the run's data.

Every check returns ``{"claim", "holds", "evidence"}`` where ``holds`` is True,
False, or None when the data (or a missing model/GPU) cannot decide it, and
``evidence`` says with numbers why. Thresholds are stated in the evidence text.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LINEAR_MAX_DEV = 0.05  # binned median relative residual within +-5%: linear
# "grows": across the middle 90% of decode-only contexts the line rises by at least this share of
# the median decode step (a slope whose interval excludes 0 on noise-free steps can be 1e-14 ms)
LINEAR_MIN_GROWTH = 0.02
LINEAR_MIN_SPREAD = 0.1  # contexts spanning less than this share of their median cannot show growth
MEMORY_BOUND_MIN = 0.5  # effective KV bandwidth >= 50% of peak: memory-bound


def shape_evidence(
    ctx: np.ndarray | None, prefill: np.ndarray | None, y: np.ndarray, lr: np.ndarray, inlier: np.ndarray
) -> dict[str, Any]:
    """Numbers the claims need, computed once at fit time (stored with the fit)."""
    out: dict[str, Any] = {}
    decode_only = (prefill == 0) if prefill is not None else np.ones(len(y), bool)
    out["decode_only_steps"] = int(decode_only.sum())
    out["prefill_steps"] = int((~decode_only).sum())
    if decode_only.any():
        out["decode_step_median_ms"] = float(np.median(y[decode_only]))
        if ctx is not None:
            out["decode_context_median_tokens"] = float(np.median(ctx[decode_only]))
            lo, hi = np.quantile(ctx[decode_only], [0.05, 0.95])
            out["decode_context_p5_tokens"], out["decode_context_p95_tokens"] = float(lo), float(hi)
    if (~decode_only).any():
        out["prefill_step_median_ms"] = float(np.median(y[~decode_only]))
    if ctx is not None and len(y):  # the linear claim's growth when no step is decode-only
        out["step_median_ms"] = float(np.median(y))
        out["context_median_tokens"] = float(np.median(ctx))
        out["context_p5_tokens"], out["context_p95_tokens"] = (float(v) for v in np.quantile(ctx, [0.05, 0.95]))
    sel = decode_only & inlier if ctx is not None else None
    if sel is not None and sel.sum() >= 50 and np.ptp(ctx[sel]) > 0:
        edges = np.unique(np.quantile(ctx[sel], np.linspace(0, 1, 11)))
        which = np.clip(np.searchsorted(edges, ctx[sel], side="right") - 1, 0, len(edges) - 2)
        meds = [float(np.expm1(np.median(lr[sel][which == i]))) for i in range(len(edges) - 1) if (which == i).any()]
        out["context_bins"] = len(meds)
        out["context_bin_max_rel_dev"] = float(np.max(np.abs(meds)))
    return out


def _interval(fit: dict, name: str) -> tuple[float, float] | None:
    """The stored 95% interval of a coefficient; None when absent or not finite (stored as null)."""
    ci = (fit.get("ci") or {}).get(name)
    if ci is None or len(ci) != 2 or not all(isinstance(v, (int, float)) and np.isfinite(v) for v in ci):
        return None
    return float(ci[0]), float(ci[1])


NOT_FITTED = "the model could not be fitted to this run (see statements)"


def _linear(fit: dict, ev: dict) -> dict:
    claim = "iteration time grows linearly with the total context of the batch"
    a, ci = fit["coef"].get("a_ms_per_ctx"), _interval(fit, "a_ms_per_ctx")
    if fit["coef"].get("t0_ms") is None:
        return {"claim": claim, "holds": None, "evidence": NOT_FITTED}
    if a is None or ci is None:
        return {"claim": claim, "holds": None, "evidence": "context_tokens cannot be used here (see statements)"}
    dec = fit.get("phases", {}).get("decode_only") or {}
    r2 = dec.get("r2_inliers", fit["r2_inliers"])
    which = "decode-only steps" if "r2_inliers" in dec else "all steps"
    dev = ev.get("context_bin_max_rel_dev")
    txt = f"slope a = {a * 1000:.4g} ms per 1k context tokens (95% CI {ci[0] * 1000:.4g} .. {ci[1] * 1000:.4g}); " + (
        f"R² of {which} without stalls {r2:.3f}"
        if r2 is not None and np.isfinite(r2)
        # every step without stalls took the same time: nothing left for R² to explain
        else f"R² of {which} without stalls undefined (they all take the same time)"
    )
    if dev is not None:
        txt += (
            f"; binned by context ({ev['context_bins']} bins), decode-only steps sit within {dev:.1%} of the line "
            f"(linear if within {LINEAR_MAX_DEV:.0%})"
        )
    shown = ci[0] > 0  # growth shown; else it holds only if the CI's upper end rises too little to matter
    holds = bool(shown and (dev is None or dev <= LINEAR_MAX_DEV))
    # over decode-only steps, or over all steps when none is (a prefill in every step)
    pre = "decode_" if ev.get("decode_context_p5_tokens") is not None else ""
    lo, hi, med_ctx = (ev.get(f"{pre}context_{k}_tokens") for k in ("p5", "p95", "median"))
    med_ms = ev.get(f"{pre}step_median_ms")
    steps, step = ("decode-only steps", "decode step") if pre else ("all steps", "step")
    if lo is not None and hi is not None and med_ms and med_ctx:
        if hi - lo < LINEAR_MIN_SPREAD * med_ctx:
            txt += (
                f"; contexts of {steps} span only {lo:.0f} .. {hi:.0f} tokens (p5 .. p95), under "
                f"{LINEAR_MIN_SPREAD:.0%} of their median: too narrow to show growth"
            )
            return {"claim": claim, "holds": None, "evidence": txt}
        growth = a * (hi - lo) / med_ms
        txt += (
            f"; from {lo:.0f} to {hi:.0f} context tokens (p5 .. p95 of {steps}) the line rises "
            f"{growth:.1%} of the median {step} (grows if >= {LINEAR_MIN_GROWTH:.0%})"
        )
        if not shown or growth < LINEAR_MIN_GROWTH:
            # no visible growth shown: "does not hold" only when the data rule a visible one out;
            # a CI that reaches a visible rise says nothing either way
            upper = ci[1] * (hi - lo) / med_ms
            if upper >= LINEAR_MIN_GROWTH:
                txt += f"; the slope's CI reaches from {ci[0] * 1000:.4g} to a rise of {upper:.1%}: these steps cannot tell"
                return {"claim": claim, "holds": None, "evidence": txt}
        holds = holds and growth >= LINEAR_MIN_GROWTH
    elif not shown:
        txt += "; the slope's CI includes 0, and without the spread of contexts a rise cannot be sized"
        return {"claim": claim, "holds": None, "evidence": txt}
    return {"claim": claim, "holds": holds, "evidence": txt}


def _memory_bound(fit: dict, hw: dict | None, ev: dict) -> dict:
    claim = "decode is memory-bound (reading the weights and KV cache at close to the device's peak bandwidth)"
    if not hw or hw.get("peak_bandwidth_gbps") is None or hw.get("kv_bytes_per_token") is None:
        why = "needs the model (--model/--config) and a GPU with a peak bandwidth (--gpu)"
        return {"claim": claim, "holds": None, "evidence": why}
    frac = hw.get("bandwidth_fraction_of_peak")  # None: no positive context slope to size it
    ci = _interval(fit, "a_ms_per_ctx")
    sized = frac is not None and ci is not None and ci[0] > 0  # a slope reaching 0 sizes no KV bandwidth
    if frac is None:
        txt = "effective KV bandwidth: no positive context slope to size it"
    else:
        txt = (
            f"effective KV bandwidth {hw['effective_bandwidth_gbps']:.0f} GB/s = {frac:.0%} of the "
            f"{hw['peak_bandwidth_gbps']:.0f} GB/s peak (memory-bound if >= {MEMORY_BOUND_MIN:.0%})"
        )
        if ci is None:
            txt += " (the context slope has no interval: this bandwidth is not pinned down)"
        elif not sized:
            txt += " (the context slope's 95% CI includes 0: this bandwidth is not pinned down)"
    share = None
    med, ctx = ev.get("decode_step_median_ms"), ev.get("decode_context_median_tokens")
    if med and ctx is not None and hw.get("weight_floor_ms") is not None:
        floor = hw["weight_floor_ms"] + hw["kv_bytes_per_token"] * ctx / (hw["peak_bandwidth_gbps"] * 1e9) * 1e3
        share = floor / med
        txt += (
            f"; reading the weights and the median decode step's {ctx:.0f}-token KV cache at peak takes "
            f"{floor:.3g} ms, {share:.0%} of that step's median {med:.3g} ms (memory-bound if >= "
            f"{MEMORY_BOUND_MIN:.0%})"
        )
    if frac is not None and frac > 1.2:
        txt += "; above 100%: a is too small for a KV read of this size (wrong model or KV dtype, or caching)"
    # either reading shows it: the context's KV read near peak, or the whole step about as long as
    # reading the weights and KV at peak (decode time is mostly the reading of both)
    if share is not None and share > 1.2:
        txt += "; the step is shorter than reading its bytes at peak: check --model, --gpu and the KV dtype"
        return {"claim": claim, "holds": None, "evidence": txt}
    if (sized and MEMORY_BOUND_MIN <= frac <= 1.2) or (share is not None and share >= MEMORY_BOUND_MIN):
        return {"claim": claim, "holds": True, "evidence": txt}
    if not sized:  # the KV read cannot be sized, and the weights alone do not show it
        return {"claim": claim, "holds": None, "evidence": txt}
    return {"claim": claim, "holds": False, "evidence": txt}


def _prefill_spikes(fit: dict, ev: dict, spikes: dict) -> dict:
    claim = "a prefill in the batch spikes the iteration time"
    b, ci = fit["coef"].get("b_ms_per_prefill"), _interval(fit, "b_ms_per_prefill")
    if b is None or ci is None or not ev.get("prefill_steps"):
        return {"claim": claim, "holds": None, "evidence": "no prefill steps recorded, or prefill_tokens unusable"}
    ratio = ev["prefill_step_median_ms"] / ev["decode_step_median_ms"] if ev.get("decode_step_median_ms") else None
    txt = (
        f"b = {b * 1000:.4g} ms per 1k prompt tokens (95% CI {ci[0] * 1000:.4g} .. {ci[1] * 1000:.4g}); "
        f"{spikes.get('prefill', 0)} steps spike above their decode baseline because of prefill"
    )
    # a spike is a step visibly longer than decode alone: past the stall threshold (few steps on a
    # noisy run, where that threshold is several times a step), or the typical prefill step longer
    # than the typical decode-only one by more than the steps' usual spread
    spread = fit.get("log_scale")
    visible = bool(ratio and ratio > 0 and spread is not None and np.isfinite(spread) and np.log(ratio) > spread)
    if ratio is not None:
        txt += f"; median step with prefill {ev['prefill_step_median_ms']:.3g} ms vs decode-only {ev['decode_step_median_ms']:.3g} ms ({ratio:.2f}x)"
        if spread is not None and np.isfinite(spread):
            txt += (
                f", {'beyond' if visible else 'within'} the steps' usual spread "
                f"(x{np.exp(spread):.2f}, robust sd of log ratio {spread:.3f})"
            )
    holds = bool(ci[0] > 0 and (spikes.get("prefill", 0) > 0 or visible))
    return {"claim": claim, "holds": holds, "evidence": txt}


def _overhead(fit: dict, hw: dict | None) -> dict:
    claim = "per-step overhead is visible: t0 lies above the weight-read floor"
    if not hw or hw.get("weight_floor_ms") is None:
        return {"claim": claim, "holds": None, "evidence": "needs the model and a GPU bandwidth (--model, --gpu)"}
    t0, ci = fit["coef"].get("t0_ms"), _interval(fit, "t0_ms")
    if t0 is None or ci is None:  # too few steps, or none with a duration
        return {"claim": claim, "holds": None, "evidence": NOT_FITTED}
    lo, hi = ci
    floor = hw["weight_floor_ms"]
    share = f" ({(t0 - floor) / t0:.0%} of t0)" if t0 > 0 else ""
    txt = (
        f"t0 = {t0:.4g} ms (95% CI {lo:.4g} .. {hi:.4g}); reading {hw['weight_bytes'] / 1e9:.3g} GB of weights "
        f"at peak takes {floor:.4g} ms; overhead {t0 - floor:.4g} ms per step{share}"
    )
    if t0 < floor:
        txt += "; t0 below the floor: the peak bandwidth or weight size does not match this run"
    return {"claim": claim, "holds": bool(lo > floor), "evidence": txt}


def check(fit: dict, hw: dict | None) -> list[dict]:
    """All four claims for a fit dict (as stored) and its hardware report."""
    ev = fit.get("shape", {})
    return [
        _linear(fit, ev),
        _memory_bound(fit, hw, ev),
        _prefill_spikes(fit, ev, fit.get("spikes", {})),
        _overhead(fit, hw),
    ]
