"""Human-readable text for ``tracelat fit`` and ``tracelat explain``."""

from __future__ import annotations

from typing import Any

from ..terminal import inline
from .result import FitResult

COEF_TEXT = (
    ("t0_ms", "t0 (fixed cost per step)", 1.0, "ms"),
    ("a_ms_per_ctx", "a (per context token)", 1000.0, "ms per 1k tokens"),
    ("b_ms_per_prefill", "b (per prefill token)", 1000.0, "ms per 1k tokens"),
    ("c_ms_per_decode", "c (per decode token)", 1000.0, "ms per 1k tokens"),
)


def _n(v: Any, fmt: str = ".4g") -> str:
    return "-" if v is None else format(v, fmt)


def _ci_text(f: FitResult) -> str:
    method = (f.ci_method or "bootstrap").split(" (")[0]
    return f"{method}, with a {f.ci_systematic_rel:.2%} systematic allowance" if f.ci_systematic_rel else method


def format_fit(f: FitResult) -> str:
    """The fit as a short report: model, diagnostics, hardware, claims, statements, spikes."""
    fitted = f.t0_ms is not None
    lines = [
        f"run {f.run_id}: iteration_ms ~ t0 + a*context + b*prefill + c*decode "
        + (
            f"({f.n_fitted} of {f.n_iterations} steps fitted, robust, 95% CIs: {_ci_text(f)})"
            if fitted
            else f"(not fitted, {f.n_iterations} steps: see notes)"
        )
    ]
    for key, label, scale, unit in COEF_TEXT:
        v = getattr(f, key)
        if v is None:
            lines.append(f"  {label:<26} not fitted")
            continue
        lo, hi = f.ci.get(key, (None, None))
        lines.append(
            f"  {label:<26} {v * scale:>10.4g} {unit:<17} [{_n(lo and lo * scale)} .. {_n(hi and hi * scale)}]"
        )
    if f.r2 is not None:
        lines.append(
            f"  R² {f.r2:.4f} (without stalls {f.r2_inliers:.4f}), MAPE {f.mape_pct:.2f}%, "
            f"residual spread (robust sd of log ratio) {f.residual_log_sigma:.3f}"
        )
    for name, ph in f.phases.items():
        if "coef" in ph:
            c = ph["coef"]
            parts = ", ".join(f"{k.split('_')[0]}={v * (1 if k == 't0_ms' else 1000):.4g}" for k, v in c.items())
            # stalls are what the fit is robust to: R² with them says little on a run that has some
            r2 = f"R² {ph['r2']:.3f}" + (
                f" (without stalls {ph['r2_inliers']:.3f})" if ph.get("r2_inliers") is not None else ""
            )
            lines.append(f"  phase {name}: {ph['n']} steps, {parts} (a, b, c per 1k), {r2}")
        else:
            lines.append(f"  phase {name}: " + "; ".join(ph.get("statements", [])))
    ex = f.extended
    if ex:
        mb, xt = ex["cv"]["memory_bound"], ex["cv"]["extended"]
        units = {
            "t0_ms": (1, "ms"),
            "a_ms_per_ctx": (1000, "ms/1k ctx"),
            "b_ms_per_prefill": (1000, "ms/1k prefill"),
            "c_ms_per_decode": (1000, "ms/1k decode"),
            "d_ms_per_req": (1, "ms/request"),
            "e_ms_per_prefill_attn": (1e6, "ms/1M prefill attention pairs"),
        }
        terms = ", ".join(f"{k.split('_')[0]}={v * units[k][0]:.4g} {units[k][1]}" for k, v in ex["coef"].items())
        lines += [
            "",
            "held-out steps (5 contiguous time blocks, each predicted by a fit to the others):",
            f"  {'model':<14}{'MAPE':>9}{'p90 |error|':>14}",
            f"  {'memory-bound':<14}{mb['mape_pct']:>8.3g}%{mb['p90_abs_ms']:>11.3g} ms",
            f"  {'extended':<14}{xt['mape_pct']:>8.3g}%{xt['p90_abs_ms']:>11.3g} ms   ({terms}; costs >= 0)",
            "  -> "
            + (
                "the extended model predicts held-out steps better (replay uses it)"
                if ex["better"]
                else "the memory-bound model is as good out of sample (replay uses it)"
            ),
        ]
    hw = f.hardware
    if hw:
        # fields the run does not state are "?", never Python's None
        lines += [
            "",
            f"hardware: model {hw.get('model') or '?'}, GPU {hw.get('gpu') or '?'} x{hw.get('num_gpus') or '?'}, "
            f"weights {hw.get('weight_dtype') or '?'}, KV {hw.get('kv_dtype') or '?'}",
        ]
        if hw.get("kv_bytes_per_token"):
            lines.append(
                f"  KV bytes per token {hw['kv_bytes_per_token']:.0f}; weights {hw['weight_bytes'] / 1e9:.3g} GB"
            )
        if hw.get("effective_bandwidth_gbps"):
            lo, hi = hw["effective_bandwidth_ci_gbps"]
            frac = hw.get("bandwidth_fraction_of_peak")
            lines.append(
                f"  effective KV bandwidth {hw['effective_bandwidth_gbps']:.0f} GB/s [{_n(lo, '.0f')} .. {_n(hi, '.0f')}]"
                + (f" = {frac:.0%} of peak {hw['peak_bandwidth_gbps']:.0f} GB/s" if frac else "")
            )
        if hw.get("weight_floor_ms") is not None:
            lines.append(
                f"  weight-read floor {hw['weight_floor_ms']:.4g} ms; t0 - floor = overhead "
                f"{_n(hw.get('overhead_ms'))} ms per step"
            )
        if hw.get("prefill_roofline_ms_per_token"):
            lines.append(
                f"  prefill compute roofline {hw['prefill_roofline_ms_per_token'] * 1000:.4g} ms per 1k tokens"
                + (
                    f"; measured b is {hw['prefill_fraction_of_peak_compute']:.0%} of peak compute"
                    if hw.get("prefill_fraction_of_peak_compute")
                    else ""
                )
            )
    lines += ["", "iteration-time claims, checked on this run:"]
    for c in f.claims:
        verdict = {True: "HOLDS", False: "DOES NOT HOLD", None: "CANNOT CHECK"}[c["holds"]]
        lines.append(f"  [{verdict}] {c['claim']}: {c['evidence']}")
    sp, st = f.spikes, f.stall_ms
    if fitted:
        lines += [
            "",
            f"spikes: {sp.get('count', 0)} (prefill {sp.get('prefill', 0)}, "
            f"preemption {sp.get('preemption', 0)}, unexplained {sp.get('unexplained', 0)}); "
            f"threshold r > {f.log_center:+.3f} + {f.k:.3g} x {f.residual_log_sigma or 0:.3f}, with "
            "r = log(measured/predicted) for stalls and log(measured/decode baseline) for prefill spikes "
            "(steps whose prefill explains them)",
        ]
        fd = f.stall_fdr
        if fd:
            nm = fd["null"]
            law = "Gaussian" if nm["df"] is None else f"Student-t, df {nm['df']:.3g}"
            flagged = st.get("count", 0)
            # Benjamini-Hochberg bounds the false ones among those flagged: with none flagged there is none
            bound = f" (at most {fd['q'] * flagged:.3g} = q x flagged)" if flagged else "; no step flagged"
            lines.append(
                f"  stall rule: false-discovery rate {fd['q']:g} (Benjamini-Hochberg) under the noise of "
                f"ordinary steps ({law}, scale {nm['scale']:.3g}): expected false stalls "
                f"{fd['expected_false']:.3g}{bound}"
            )
    else:
        lines += ["", "spikes: not detected (they are steps far above the fitted model)"]
    if st.get("count"):
        lines.append(
            f"  stalls: {st['count']} ({(f.stall_rate or 0):.2%} of steps), residual ms mean {st['mean']:.3g}, "
            f"p50 {st['p50']:.3g}, p90 {st['p90']:.3g}, max {st['max']:.3g}, total {st['total']:.4g}"
        )
    lim = f.stall_detection_limit_ms
    if lim.get("median_step") is not None:
        lines.append(
            f"  stalls shorter than {lim['median_step']:.3g} ms on a median step ({lim['p90_step']:.3g} ms on a "
            "p90 step) hide in the step's own noise: most of them are missed"
        )
    for s in f.top_spikes[:5]:
        # a step known only by its duration (dur_ms, no t_start/t_end) has no place in time
        at = f" at +{s['t_offset_s']:.3f} s" if s.get("t_offset_s") is not None else ""
        lines.append(
            f"  iter {s['iter']}{at}: {s['iteration_ms']:.4g} ms vs predicted "
            f"{s['predicted_ms']:.4g} ms (prefill {s['prefill_tokens']} tokens) -> {s['spike_cause']}"
        )
    notes = [s for s in f.statements if s and s.strip()]
    if notes:
        lines += ["", "notes:"] + [f"  - {s}" for s in notes]
    return "\n".join(lines)


def format_explain(e: dict[str, Any]) -> str:
    """Tail attribution as text: parts with shares, the largest, top steps and requests."""
    from .attribution import show_time

    w = e["window"]
    start, unix = e.get("run_start"), e.get("clock_is_unix", False)

    def when(t):
        return show_time(t, start, unix)

    where = (
        ""
        if w["from"] is None and w["to"] is None
        else f" (requests arriving {when(w['from']) if w['from'] is not None else 'from the start'} .. "
        f"{when(w['to']) if w['to'] is not None else 'the end'})"
    )
    lines = [f"run {e['run_id']}: why is the {e['metric'].upper()} tail slow?{where}"]
    lines += [f"  warning: {w}" for w in e.get("warnings", [])]
    if not e["parts"]:
        return "\n".join(lines + [f"  {s}" for s in e["statements"]])
    lines.append(
        f"  {_of(e['requests'], 'request')}; p50 {e['p50']:.4g}, p99 {e['p99']:.4g} {e['unit']}; tail group "
        f"(>= p99) {_of(e['tail_requests'], 'request')} vs median group (p40-p60) {e['median_requests']}"
    )
    lines.append(f"  {'part':<22}{'tail mean':>12}{'median mean':>13}{'growth':>11}{'share':>8}")
    for p in e["parts"]:
        # a share that rounds to 0 is 0%, not "-0%" (a part that shrank by a hair)
        share = "-" if p["share"] is None else f"{p['share'] + 0.0:.0%}".replace("-0%", "0%")
        lines.append(
            f"  {p['part']:<22}{p['tail_mean_ms']:>12.4g}{p['median_mean_ms'] or 0:>13.4g}"
            f"{p['growth_ms'] or 0:>11.4g}{share:>8}"
        )
    if e["largest"]:
        top = e["parts"][0]
        lines.append(f"  largest: {e['largest']}: {top['meaning']}")
    if e["top_iterations"]:
        lines.append(
            "  steps that delayed the tail most (excess over decode baseline each tail request waited through):"
        )
        for s in e["top_iterations"]:  # as many as --limit asked for
            lines.append(
                f"    iter {s['iter']} ending {when(s['t_end'])}: {s['iteration_ms']:.4g} ms, prefill "
                f"{s['prefill_tokens']} tokens, excess {s['excess_ms']:.4g} ms, {_of(s['tail_requests'], 'tail request')}"
                + (f", {s['spike_cause']} spike" if s["spike_cause"] else "")
            )
    if e["top_requests"]:
        lines.append("  worst requests:")
        for r in e["top_requests"]:
            lines.append(
                f"    {inline(r['req_id'])} arrived {when(r['t_arrival'])}: {e['metric']} {r['value']:.4g}, prompt "
                f"{r['prompt_tokens']}, output {r['output_tokens']}"
                + ("" if r["preemptions"] is None else f", preemptions {r['preemptions']}")
            )
    lines += [f"  note: {s}" for s in e["statements"]]
    return "\n".join(lines)


def _of(n: int, noun: str) -> str:
    """``1 request``, ``2 requests`` (no thousands separator: scripts read these lines)."""
    return f"{n} {noun if n == 1 else noun + 's'}"
