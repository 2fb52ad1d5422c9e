"""The report's replay calibration section (``tracelat report RUN --calibrate``).

A validation replay (the run's requests through the simulator under the recorded
policy, :mod:`pipeline.replay`) costs a fit and a few simulations, so the report
computes it only when asked; the numbers are those of ``tracelat replay RUN``'s
calibration report (``Comparison.calibration_report``: the statistics, the seeds'
spread and bias, request-by-request MAPE and Pearson r, the verdict), and ``summary.json`` keeps
them under ``replay_calibration``. Every string shown (run ids, notes naming
files) goes through the page's escaping.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from ..errors import InputError, StoreError
from ..escape import html_text
from .page import Section, table

DEFAULT_SEEDS = 3


def replay_calibration(con, run_id: str, seeds: int = DEFAULT_SEEDS, goodput_spec: Any = None) -> dict[str, Any]:
    """Replay ``run_id`` under its recorded policy ``seeds`` times; the calibration report as plain data
    (with goodput observed vs replayed when ``goodput_spec``, an SLO file's ``[goodput]``, is given).

    ``{"available": False, "reason": ...}`` when the run cannot be replayed (no
    request records, no fittable steps, a policy setting it does not record).
    """
    from ..replay import calibrate, compare

    try:
        cal = calibrate(con, run_id)
        cmp = compare(con, cal, list(range(seeds)), goodput_spec=goodput_spec)
    except (InputError, StoreError) as exc:
        return {"available": False, "reason": str(exc)}
    rep = cmp.calibration_report()
    return {
        "available": True,
        "seeds": cmp.seeds,
        "policy": cal.policy.to_dict(),
        "iteration_model": cal.details.get("iteration_model"),
        "noise_mode": cal.details.get("noise_mode"),
        **rep,
        "notes": list(cal.notes),
    }


def _pct(v: float | None) -> str | None:
    return None if v is None else f"{v * 100:+.1f}%"


def calibration_section(cal: dict[str, Any] | None) -> Section | None:
    """The section for a :func:`replay_calibration` result; ``None`` when calibration was not asked for."""
    if cal is None:
        return None
    sec = Section("calibration", "Replay calibration (observed vs replayed, recorded policy)")
    if not cal.get("available"):
        sec.missing.append("replay calibration not available: " + str(cal.get("reason")))
        return sec
    policy = ", ".join(f"{k}={v}" for k, v in (cal.get("policy") or {}).items())
    sec.intro = (
        f'<p class="sub">{len(cal["seeds"])} seed(s), noise {html_text(cal.get("noise_mode"))}, '
        f"{html_text(cal.get('iteration_model'))} iteration model; policy {html_text(policy)}. "
        "Error: the mean over seeds against the observed value; range: the seeds' own spread; "
        "bias: over / under when every seed errs that way, mixed when the seeds straddle it.</p>"
    )
    rows = [
        {
            "metric": r["metric"],
            "stat": r["stat"],
            "observed": r["observed"],
            "replayed": r["replay"],
            "error": _pct(r["rel_error"]),
            "seed range": (
                None if r["rel_error_min"] is None else f"{_pct(r['rel_error_min'])} .. {_pct(r['rel_error_max'])}"
            ),
            "bias": r["bias"],
            "within tolerance": r["within_tol"],
        }
        for r in cal["rows"]
    ]
    body = table(
        pl.DataFrame(rows, schema_overrides={"observed": pl.Float64, "replayed": pl.Float64}, infer_schema_length=None),
        left=("metric", "stat", "bias"),
    )
    if cal.get("per_request"):
        pr = [
            {
                "metric": m,
                "requests": v["n"],
                "MAPE": None if v["mape"] is None else f"{v['mape'] * 100:.1f}%",
                "MAPE seed range": (
                    None if v["mape_min"] is None else f"{v['mape_min'] * 100:.1f}% .. {v['mape_max'] * 100:.1f}%"
                ),
                "Pearson r": None if v["pearson_r"] is None else f"{v['pearson_r']:.3f}",
            }
            for m, v in cal["per_request"].items()
        ]
        body += "<h3>Request by request (each replayed request against the same recorded one)</h3>" + table(
            pl.DataFrame(pr, infer_schema_length=None), left=("metric",)
        )
    if cal.get("goodput"):
        gp = [
            {
                "goodput": r["stat"],
                "observed": r["observed"],
                "replayed": r["replay"],
                "error": _pct(r["rel_error"]),
                "within tolerance": r["within_tol"],
            }
            for r in cal["goodput"]
        ]
        body += "<h3>Goodput under the SLO file (requests recorded ok)</h3>" + table(
            pl.DataFrame(
                gp, schema_overrides={"observed": pl.Float64, "replayed": pl.Float64}, infer_schema_length=None
            ),
            left=("goodput",),
        )
    body += f'<p class="verdict"><strong>{html_text(cal["verdict"])}</strong></p>'
    if cal.get("notes"):
        body += "<ul>" + "".join(f"<li>{html_text(n)}</li>" for n in cal["notes"]) + "</ul>"
    sec.body = body
    return sec
