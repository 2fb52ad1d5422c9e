"""Many replicas, one answer: per-run analyses in parallel, merged into fleet percentiles and outliers.

Each run of a lake (:mod:`pipeline.lake`) is one task: an in-memory store of that run,
the existing derived tables, fit and summary, and back comes a small record (its
percentiles, fit, stall rate, tail shares) plus **mergeable sketches** of TTFT, TPOT, E2E
and ITL: counts per logarithmic bucket ``k = ceil(log_g x)`` with ``g = (1 + a)/(1 - a)``
(DDSketch's mapping), so merging is adding counts and any quantile of the merged sketch
is within a relative error ``a`` (default 1%) of the exact one over all requests.

Outliers: for each fleet-level signal (p99 TTFT, p99 TPOT, t0, effective bandwidth,
stall rate) a robust z-score ``(x - median) / (1.4826 MAD)`` over the runs, in the bad
direction (higher latency, t0, stall rate; lower bandwidth); a run is flagged beyond
``Z_FLAG``; runs are ranked by their largest z.

Tasks run on Ray when asked for and installed (``--ray local|auto|ADDRESS``), else in a
local process pool; the result says which.
"""

from __future__ import annotations

import fnmatch
import math
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .metrics import LATENCY, SOURCES

ALPHA = 0.01
Z_FLAG = 3.5
SKETCHED = {m: SOURCES[m] for m in LATENCY}  # TTFT, TPOT, ITL, E2E: (table, filter) from the registry
SIGNALS = {  # name -> (how to read it from a run record, +1 when higher is worse, -1 when lower is)
    "ttft_p99_ms": (lambda r: (r["ttft_ms"] or {}).get("p99"), 1),
    "tpot_p99_ms": (lambda r: (r["tpot_ms"] or {}).get("p99"), 1),
    "t0_ms": (lambda r: r.get("t0_ms"), 1),
    "bandwidth_gbps": (lambda r: r.get("effective_bandwidth_gbps"), -1),
    "stall_rate": (lambda r: r.get("stall_rate"), 1),
}


def _gamma(alpha: float) -> float:
    return (1 + alpha) / (1 - alpha)


def sketch(con, run_id: str, metric: str, alpha: float = ALPHA) -> dict[int, int]:
    """Bucket counts of one metric of one run (positive values; zeros under key -2**31)."""
    table, where = SKETCHED[metric]
    rows = con.execute(
        f"select case when {metric} > 0 then ceil(ln({metric}) / ln($g))::bigint else -2147483648 end as k, "
        f"count(*) from {table} where run_id = $r and {metric} is not null and {where} group by k",
        {"g": _gamma(alpha), "r": run_id}).fetchall()
    return {int(k): int(n) for k, n in rows}


def sketch_quantile(counts: dict[int, int], q: float, alpha: float = ALPHA) -> float | None:
    """DDSketch's estimate: the bucket holding rank q(N-1), its value 2 g^k / (g + 1)."""
    n = sum(counts.values())
    if not n:
        return None
    keys = sorted(counts)
    cum = np.cumsum([counts[k] for k in keys])
    k = keys[int(np.searchsorted(cum, q * (n - 1), side="right"))]
    if k == -2147483648:
        return 0.0
    g = _gamma(alpha)
    return 2 * g ** k / (g + 1)


def run_record(lake: str, run_id: str, alpha: float = ALPHA) -> dict[str, Any]:
    """One task: a run's summary, fit and sketches (small, picklable)."""
    from .fit import get_or_fit
    from .lake import open_run
    from .summary import summary

    con = open_run(Path(lake), run_id)
    try:
        get_or_fit(con, run_id)
        s = summary(con, run_id)
        fit = s.get("fit") or {}
        spikes = s.get("spikes") or {}
        steps = s.get("iterations") or 0
        tail = s.get("tail") or {}
        rec = {
            "run_id": run_id, "requests": s.get("requests"), "iterations": steps,
            **{m: {k: s[m].get(k) for k in ("count", "p50", "p90", "p99", "mean")} for m in SKETCHED},
            "t0_ms": fit.get("t0_ms"), "effective_bandwidth_gbps": fit.get("effective_bandwidth_gbps"),
            "stall_rate": (spikes.get("unexplained", 0) / steps) if steps and spikes else None,
            "tail_top": {m: max(p, key=p.get) if p else None for m, p in tail.items()},
            "sketches": {m: sketch(con, run_id, m, alpha) for m in SKETCHED},
        }
    finally:
        con.close()
    return rec


def _robust_z(values: list[float | None], sign: int) -> list[float | None]:
    x = np.array([np.nan if v is None else v for v in values], dtype=float)
    ok = np.isfinite(x)
    if ok.sum() < 3:
        return [None] * len(values)
    med = float(np.median(x[ok]))
    mad = 1.4826 * float(np.median(np.abs(x[ok] - med)))
    if mad <= 0:
        mad = float(np.mean(np.abs(x[ok] - med))) * 1.2533 or 0.0
    if mad <= 0:
        return [0.0 if o else None for o in ok]
    return [sign * (v - med) / mad if o else None for v, o in zip(x, ok)]


def _map(tasks: list[tuple[str, str, float]], ray: str | None, workers: int | None) -> tuple[list[dict], str]:
    if ray and ray != "off":
        try:
            import ray as ray_mod  # optional: pip install 'tracelat[ray]'
        except ImportError:
            ray_mod = None
        if ray_mod is not None:
            if not ray_mod.is_initialized():
                addr = None if ray in ("local", "auto") else ray
                ray_mod.init(address=addr if addr else ("auto" if ray == "auto" and _ray_env() else None),
                             ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
            remote = ray_mod.remote(run_record)
            return ray_mod.get([remote.remote(*t) for t in tasks]), "ray"
        how = "process pool (Ray is not installed: pip install 'tracelat[ray]')"
    else:
        how = "process pool"
    if len(tasks) == 1 or workers == 1:
        return [run_record(*t) for t in tasks], "in process"
    import multiprocessing

    # spawn, not fork: DuckDB and Polars hold threads that a forked child would inherit locked
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(run_record, *zip(*tasks))), how


def _ray_env() -> bool:
    import os

    return bool(os.environ.get("RAY_ADDRESS"))


def fleet(lake: Path, runs_glob: str | None = None, ray: str | None = None, workers: int | None = None,
          alpha: float = ALPHA) -> dict[str, Any]:
    """Per-run records, fleet percentiles from merged sketches, and the outlier table."""
    from .errors import InputError
    from .lake import lake_runs

    runs = [r for r in lake_runs(lake) if runs_glob is None or fnmatch.fnmatchcase(r, runs_glob)]
    if not runs:
        raise InputError(f"{lake}: no runs{' matching ' + runs_glob if runs_glob else ''}; "
                         "write some with `tracelat export RUN --lake DIR`")
    records, how = _map([(str(lake), r, alpha) for r in runs], ray, workers)
    merged: dict[str, dict[int, int]] = {m: {} for m in SKETCHED}
    for rec in records:
        for m, counts in rec.pop("sketches").items():
            for k, n in counts.items():
                merged[m][k] = merged[m].get(k, 0) + n
    fleet_stats = {m: {f"p{int(round(q * 100))}": sketch_quantile(merged[m], q, alpha) for q in (0.5, 0.9, 0.99)}
                   | {"count": sum(merged[m].values())} for m in SKETCHED}
    zs = {name: _robust_z([get(r) for r in records], sign) for name, (get, sign) in SIGNALS.items()}
    for i, rec in enumerate(records):
        rz = {name: z[i] for name, z in zs.items() if z[i] is not None}
        rec["z"] = {k: round(float(v), 3) for k, v in rz.items()}
        rec["outlier"] = sorted(k for k, v in rz.items() if v > Z_FLAG)
        rec["worst_z"] = float(max(rz.values())) if rz else None
    ranked = sorted(records, key=lambda r: -(r["worst_z"] if r["worst_z"] is not None else -math.inf))
    return {"fleet": fleet_stats, "runs": ranked, "sketch_relative_error": alpha, "executor": how,
            "outlier_rule": f"robust z > {Z_FLAG} in the bad direction (median, 1.4826 MAD over runs)"}
