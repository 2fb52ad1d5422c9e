"""Hardware what-ifs on the fitted iteration model: another KV-cache dtype, faster compute.

The fitted model is ``t0 + a·context + b·prefill + c·decode (+ d·requests + e·prefill_attn)``
(docs/model-and-attribution.md). Each term is a cost of one kind, so a hardware change moves
the terms of its kind and leaves the others (docs/replay.md, "Hardware what-ifs"):

- **KV dtype** (``--kv-dtype``, ``--sweep kv_dtype=...``): with
  ``r = bytes(new) / bytes(recorded)``, ``a' = r·a`` (``a`` is the KV read per context
  token; decode is memory-bound, so the time to read the cache scales with its bytes) and
  ``kv_capacity' = floor(kv_capacity / r)`` (the same memory holds ``1/r`` times the tokens)
  unless ``--kv-capacity-tokens`` was given. ``t0`` (weights read, launches), ``b`` and ``c``
  (matmul FLOPs per token), ``d`` (per-request host and kernel work) and ``e`` (prefill
  attention over token pairs: compute) do not read the cache per context token and stay.
  A fit with ``a <= 0`` finds no KV-read cost: ``a`` is kept, only the capacity moves, and a
  note says so (:func:`kv_read_cost`; also a warning when a's interval includes 0).
- **Compute speedup** (``--compute-speedup``, ``--sweep compute_speedup=...``): with
  ``s`` the speedup, ``b' = b/s``, ``c' = c/s``, ``e' = e/s`` (the FLOP-bound terms);
  ``t0``, ``a`` (memory reads) and ``d`` stay. An extended model that swapped ``c`` for
  ``d`` leaves the decode cost unscaled, and says so (:func:`d_replaced_c`). Beside the KV dtype it makes "bytes matter
  more than FLOPs in decode" a measurable comparison on the run's own traffic.

The recorded KV dtype is ``runs.kv_dtype`` (``auto`` means the model's dtype), else
``runs.dtype``, else bf16 with a note (as :mod:`pipeline.fit.hardware` assumes), unless
``--recorded-kv-dtype`` names it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ..catalog import DTYPE_BYTES
from ..errors import InputError

if TYPE_CHECKING:
    from .calibrate import Calibration

WHATIF_FIELDS = ("kv_dtype", "compute_speedup")  # settings of a replay beside the Policy fields
KV_READ_TERMS = ("a_ms_per_ctx",)
COMPUTE_TERMS = ("b_ms_per_prefill", "c_ms_per_decode", "e_ms_per_prefill_attn")
ASSUMED_KV_DTYPE = "bf16"
# "auto" is vLLM's "as the model's dtype": a recorded value to look through, never a what-if
NOT_A_DTYPE = ("auto",)


def _key(name: Any) -> str:
    return str(name).strip().lower().replace("torch.", "")


def known_dtypes() -> str:
    """The dtype names a what-if accepts, with their bytes per element (for error messages)."""
    by_size: dict[float, list[str]] = {}
    for n, b in DTYPE_BYTES.items():
        if n not in NOT_A_DTYPE:
            by_size.setdefault(b, []).append(n)
    return "; ".join(f"{b:g} byte(s): {', '.join(ns)}" for b, ns in sorted(by_size.items(), reverse=True))


def dtype_bytes_strict(name: str, what: str) -> float:
    """Bytes per element of ``name``; an :class:`InputError` naming the known dtypes otherwise."""
    b = DTYPE_BYTES.get(_key(name))
    if b is None or _key(name) in NOT_A_DTYPE:
        raise InputError(f"{what} {name!r} is not a known dtype; known: {known_dtypes()}")
    return b


def recorded_kv_dtype(kv_dtype: str | None, dtype: str | None, option: str | None) -> tuple[str, str]:
    """The run's KV dtype and where it came from: the option, ``runs.kv_dtype``, ``runs.dtype`` or assumed."""
    if option:
        return option, "--recorded-kv-dtype"
    if kv_dtype and _key(kv_dtype) not in NOT_A_DTYPE:
        return kv_dtype, "runs.kv_dtype"
    if dtype and _key(dtype) not in NOT_A_DTYPE:
        return dtype, "runs.dtype" + (" (kv_dtype auto)" if kv_dtype else "")
    return ASSUMED_KV_DTYPE, "assumed"


def parse_value(name: str, item: str, spec: str) -> Any:
    """One ``--sweep`` value of a what-if setting, checked as its option would be."""
    if name == "kv_dtype":
        dtype_bytes_strict(item, f"--sweep {spec!r}:")
        return item
    try:
        v = float(item)
    except ValueError:
        raise InputError(f"--sweep {spec!r}: {item!r} is not a number") from None
    if not (math.isfinite(v) and v > 0):
        raise InputError(f"--sweep {spec!r}: a compute speedup is a factor > 0, got {item!r}")
    return v


def recorded_value(cal: Calibration, name: str) -> Any:
    """What the recording had: its KV dtype, compute speedup 1."""
    return cal.details["kv_dtype"]["recorded"] if name == "kv_dtype" else 1.0


def is_recorded(cal: Calibration, name: str, value: Any) -> bool:
    """Whether ``value`` replays the recording's hardware (a dtype of the recorded size: r = 1)."""
    if name == "kv_dtype":
        rec = DTYPE_BYTES.get(_key(recorded_value(cal, name)))
        return rec is not None and DTYPE_BYTES.get(_key(value)) == rec
    return value == 1


def apply(cal: Calibration, name: str, value: Any) -> Calibration:
    """``cal`` with one hardware what-if applied (each at most once: r is against the recording)."""
    if name in cal.whatif:
        raise ValueError(f"{name} is already a what-if of this calibration")
    return (with_kv_dtype if name == "kv_dtype" else with_compute_speedup)(cal, value)


def with_kv_dtype(cal: Calibration, name: str) -> Calibration:
    """The KV what-if: ``a`` times r, the KV capacity over r unless given (module docstring)."""
    new_bytes = dtype_bytes_strict(name, "--kv-dtype")
    rec = cal.details["kv_dtype"]
    rec_name, source = rec["recorded"], rec["source"]
    rec_bytes = DTYPE_BYTES.get(_key(rec_name))
    if rec_bytes is None or _key(rec_name) in NOT_A_DTYPE:
        raise InputError(
            f"run {cal.run_id!r} records KV dtype {rec_name!r} ({source}), which is not a known dtype; "
            f"pass --recorded-kv-dtype DTYPE (known: {known_dtypes()})"
        )
    assumed = source == "assumed"
    rec_text = f"{rec_name}{', assumed' if assumed else ''}"
    notes = list(cal.notes)
    if assumed:
        notes.append(
            f"the run records no KV dtype (runs.kv_dtype, runs.dtype): the --kv-dtype what-if takes the "
            f"recorded KV cache to be {ASSUMED_KV_DTYPE} (pass --recorded-kv-dtype otherwise)"
        )
    # byte sizes are powers of two, so the ratio and the capacity are exact
    ratio = Fraction(new_bytes) / Fraction(rec_bytes)
    if ratio == 1:
        notes.append(f"--kv-dtype {name}: the recorded KV dtype ({rec_text}) has the same size; nothing changes")
        return replace(cal, notes=notes)
    cap_before = cal.policy.kv_capacity_tokens
    cap_given = cal.details.get("kv_capacity_option") is not None
    cap_after = cap_before if cap_given else math.floor(cap_before / ratio)
    kv_read, why = kv_read_cost(cal)
    scale_a = kv_read != "none"
    if scale_a:
        cal = replace(cal, model=replace(cal.model, a_ms_per_ctx=cal.model.a_ms_per_ctx * float(ratio)))
    try:
        cal = cal.with_policy(kv_capacity_tokens=cap_after)
    except InputError as exc:
        raise InputError(f"--kv-dtype {name}: {exc}") from None
    a_note = (
        f"the KV read per context token a x{_num(ratio)} (decode reads the cache at memory speed)"
        if scale_a
        else "the KV read per context token a kept"
    )
    notes.append(
        f"--kv-dtype {name}: {new_bytes:g} byte(s) per element for the recorded {rec_name} ({rec_bytes:g}, "
        f"{'assumed' if assumed else 'from ' + source}): {a_note}; t0, b, c, d and e unchanged; "
        + (
            "KV capacity kept as given by --kv-capacity-tokens"
            if cap_given
            else f"KV capacity x{_num(1 / ratio)} (the same memory holds {_num(1 / ratio)} times the tokens)"
        )
    )
    if why:
        notes.append(f"--kv-dtype {name}: {why}")
    info = {
        "kv_dtype": name,
        "recorded_kv_dtype": rec_name,
        "recorded_source": source,
        "ratio": float(ratio),
        "scaled_terms": list(KV_READ_TERMS) if scale_a else [],
        "kv_read_cost": kv_read,
        "kv_capacity_tokens_before": cap_before,
        "kv_capacity_tokens": cap_after,
        "kv_capacity_source": "option" if cap_given else "scaled",
    }
    info["summary"] = _kv_summary(info)
    return replace(cal, notes=notes, whatif={**cal.whatif, "kv_dtype": info})


def with_swept_capacity(info: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The KV what-if's description when a sweep replaces its capacity: the swept value, not rescaled."""
    out = {**info, "kv_capacity_tokens": int(tokens), "kv_capacity_source": "sweep"}
    out["summary"] = _kv_summary(out)
    return out


def _kv_summary(info: dict[str, Any]) -> str:
    """``kv_dtype=fp8 (recorded bf16, assumed): a x0.5, kv capacity x2 (12000 -> 24000 tokens)``."""
    ratio, before, after = info["ratio"], info["kv_capacity_tokens_before"], info["kv_capacity_tokens"]
    rec_text = f"{info['recorded_kv_dtype']}{', assumed' if info['recorded_source'] == 'assumed' else ''}"
    a_text = {
        "fitted": f"a x{_num(ratio)}",
        "uncertain": f"a x{_num(ratio)} (a's 95% interval includes 0)",
        "none": "a kept (the fit finds no KV-read cost)",
    }[info["kv_read_cost"]]
    cap_text = {
        "option": f"kv capacity {after} tokens as given (--kv-capacity-tokens)",
        "scaled": f"kv capacity x{_num(1 / ratio)} ({before} -> {after} tokens)",
        "sweep": f"kv capacity {after} tokens as swept (not rescaled)",
    }[info["kv_capacity_source"]]
    return f"kv_dtype={info['kv_dtype']} (recorded {rec_text}): {a_text}, {cap_text}"


def kv_read_cost(cal: Calibration) -> tuple[str, str | None]:
    """Whether the fit finds a KV read per context token to scale, and a warning when it does not.

    ``fitted``: ``a > 0`` and its 95% interval (memory-bound fit) lies above 0; ``uncertain``:
    ``a > 0`` but the interval includes 0, so a is scaled and the step-time part of the what-if
    is within the fit's noise; ``none``: ``a <= 0``, no KV-read cost to scale (halving a
    negative slope would make a smaller cache slower), so a is kept and only the capacity moves.
    """
    a = cal.model.a_ms_per_ctx
    fit = cal.details.get("fit") or {}
    ci = fit.get("a_ci_ms_per_ctx") if cal.details.get("iteration_model") == "memory-bound" else None
    per_1k = f"a = {a * 1000:.4g} ms per 1k context tokens"
    if a <= 0:
        return "none", (
            f"the fit finds no KV-read cost ({per_1k}, not above 0), so the dtype what-if keeps a and changes "
            "only the KV capacity; the step-time effect of the dtype is not measured on this run (a run with "
            "longer contexts or larger batches separates a from t0)"
        )
    if ci is not None and ci[0] <= 0:
        k = 1000 * float(cal.details.get("mean_scale") or 1.0)  # the interval of the fit, as the replay scales a
        return "uncertain", (
            f"{per_1k}, but its 95% interval ({ci[0] * k:.4g} .. {ci[1] * k:.4g}) includes 0: "
            "the step-time part of the dtype what-if is within the fit's uncertainty, the KV capacity part is not"
        )
    return "fitted", None


def with_compute_speedup(cal: Calibration, speedup: float) -> Calibration:
    """The compute what-if: the FLOP-bound terms b, c, e over the speedup (module docstring)."""
    if not (math.isfinite(speedup) and speedup > 0):
        raise InputError(f"--compute-speedup must be a factor > 0, got {speedup}")
    if speedup == 1:
        return cal
    model = replace(cal.model, **{t: getattr(cal.model, t) / speedup for t in COMPUTE_TERMS})
    summary = f"compute x{speedup:g}: b, c, e x{_num(1 / speedup)}"
    notes = [
        *cal.notes,
        f"--compute-speedup {speedup:g}: the FLOP-bound terms (b prefill, c decode, e prefill attention) "
        f"x{_num(1 / speedup)}; t0 (weights read, launches), a (KV read) and d (per request) unchanged",
    ]
    if d_replaced_c(cal.details):
        # Without speculative decoding a decode request makes one token a step, so a decode
        # matmul cost per token and per-request work look alike; the extended model priced
        # both as d, which this what-if leaves, and the memory-bound model both as c, which it scales.
        summary = f"compute x{speedup:g}: b, e x{_num(1 / speedup)}; d (in place of c) unchanged"
        notes.append(
            "the extended model replaced c (per decode token) by d (per request in the step) on this run: "
            "the steps cannot split a decode matmul cost from per-request work, and d stays, so the decode "
            "gain is understated when d holds matmul cost; --iteration-model memory-bound prices decode per "
            "token (c, scaled), which overstates it when d is host work"
        )
    info = {"compute_speedup": speedup, "scaled_terms": list(COMPUTE_TERMS), "summary": summary}
    return replace(cal, model=model, notes=notes, whatif={**cal.whatif, "compute_speedup": info})


def d_replaced_c(details: dict[str, Any]) -> bool:
    """Whether the replay's iteration model is an extended one that swapped c for d."""
    terms = (details.get("extended") or {}).get("terms") or []
    return (
        details.get("iteration_model") == "extended"
        and "d_ms_per_req" in terms
        and "c_ms_per_decode" not in terms
        and "c_ms_per_decode" in (details.get("fit") or {}).get("terms", [])
    )


def tag(whatif: dict[str, Any]) -> list[str]:
    """Run-id parts of the what-ifs: ``kvdtfp8``, ``compute2x``."""
    parts = []
    if "kv_dtype" in whatif:
        parts.append("kvdt" + _key(whatif["kv_dtype"]["kv_dtype"]))
    if "compute_speedup" in whatif:
        parts.append(f"compute{whatif['compute_speedup']['compute_speedup']:g}x")
    return parts


def _num(x: Fraction | float) -> str:
    return f"{float(x):.4g}"
