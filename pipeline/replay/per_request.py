"""Per-request calibration: each replayed request against the same request in the recording.

A validation replay keeps the recording's requests (same ids, same rows), so beyond the
distributions every request can be compared one to one: the mean absolute percentage
error (MAPE) of its TTFT, TPOT and E2E, and the Pearson correlation between observed and
replayed values (does the replay put the slow requests where they were?). The population
is that of the latency statistics: requests ``ok`` in the recording that finished in the
replay, with an observed value > 0 (MAPE divides by it). A workload file replay has no
counterpart requests, so none of this is computed for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..metrics import LATENCY, REQUEST_METRICS
from ..sim import SimResult
from .calibrate import Calibration

# the client latencies a request has on its own (ITL is per token gap): TTFT, TPOT, E2E
PER_REQUEST_METRICS = tuple(m for m in LATENCY if m in REQUEST_METRICS)
# names from the registry only, so safe in the SQL text
OBSERVED_SQL = f"""
select cast(req_id as varchar) as req_id, {", ".join(PER_REQUEST_METRICS)}
from request_latency
where run_id = $run_id
"""


def observed_per_request(con, cal: Calibration) -> dict[str, np.ndarray] | None:
    """Observed TTFT/TPOT/E2E (ms) per workload row (NaN where not recorded); None for a workload file."""
    import polars as pl

    if cal.workload_source:
        return None
    obs = con.sql(OBSERVED_SQL, params={"run_id": cal.run_id}).pl()
    rows = pl.DataFrame({"req_id": np.asarray(cal.workload.ids()).astype(str), "row": np.arange(len(cal.workload))})
    joined = rows.join(obs, on="req_id", how="left").sort("row")
    return {m: joined[m].cast(pl.Float64).fill_null(float("nan")).to_numpy() for m in PER_REQUEST_METRICS}


def replayed_per_request(result: SimResult) -> dict[str, np.ndarray]:
    """Replayed TTFT/TPOT/E2E (ms) per row, by ``queries/request_latency.sql`` itself; NaN where not reached."""
    import polars as pl

    from .stats import request_latency

    n = result.n_requests
    con = request_latency(result, np.ones(n, bool))
    try:
        got = con.sql(OBSERVED_SQL, params={"run_id": "replay"}).pl()
    finally:
        con.close()
    rows = pl.DataFrame({"req_id": np.asarray(result.requests["req_id"][:n]).astype(str), "row": np.arange(n)})
    joined = rows.join(got, on="req_id", how="left").sort("row")
    return {m: joined[m].cast(pl.Float64).fill_null(float("nan")).to_numpy() for m in PER_REQUEST_METRICS}


def per_request_errors(result: SimResult, cal: Calibration, observed: dict[str, np.ndarray]) -> dict[str, Any]:
    """``{metric: {n, mape, pearson_r}}`` of one replay against the recording, request by request."""
    n = result.n_requests
    ok = cal.recorded_ok[:n] & (result.requests["status"] == "ok")
    rep = replayed_per_request(result)
    out = {}
    for m in PER_REQUEST_METRICS:
        o, r = observed[m][:n], rep[m]
        keep = ok & np.isfinite(o) & np.isfinite(r) & (o > 0)
        o, r = o[keep], r[keep]
        mape = float(np.mean(np.abs(r - o) / o)) if len(o) else None
        corr = float(np.corrcoef(o, r)[0, 1]) if len(o) >= 3 and o.std() > 0 and r.std() > 0 else None
        out[m] = {"n": int(keep.sum()), "mape": mape, "pearson_r": corr}
    return out


def summarise(per_seed: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Mean over seeds (and the seeds' range) of each metric's MAPE and Pearson r."""
    if not per_seed:
        return None
    out = {}
    for m in PER_REQUEST_METRICS:
        mape = [s[m]["mape"] for s in per_seed if s[m]["mape"] is not None]
        corr = [s[m]["pearson_r"] for s in per_seed if s[m]["pearson_r"] is not None]
        out[m] = {
            "n": per_seed[0][m]["n"],
            "mape": float(np.mean(mape)) if mape else None,
            "mape_min": min(mape) if mape else None,
            "mape_max": max(mape) if mape else None,
            "pearson_r": float(np.mean(corr)) if corr else None,
            "per_seed": [{"mape": s[m]["mape"], "pearson_r": s[m]["pearson_r"]} for s in per_seed],
        }
    return out


def format_line(summary: dict[str, Any] | None) -> str | None:
    """``per request (one to one): ttft MAPE 4.1% r 0.98, ...`` or None."""
    if not summary:
        return None
    parts = []
    for m, v in summary.items():
        if v["mape"] is None:
            continue
        r = f" r {v['pearson_r']:.3f}" if v["pearson_r"] is not None else ""
        parts.append(f"{m.removesuffix('_ms')} MAPE {v['mape'] * 100:.1f}%{r}")
    n = max((v["n"] for v in summary.values()), default=0)
    return (
        f"per request (one to one, {n} requests; MAPE mean over seeds, Pearson r): " + ", ".join(parts)
        if parts
        else None
    )
