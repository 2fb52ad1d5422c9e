"""Many replicas, one answer: per-run analyses in parallel, merged into fleet percentiles and outliers.

Each run of a lake (:mod:`pipeline.lake`) is one task: an in-memory store of that run,
the existing derived tables, fit and summary (and the SLO audit, and the run's report,
when asked), and back comes a small record (its percentiles, fit, stall rate, tail
shares) plus **mergeable sketches** of every SLO metric: counts per logarithmic bucket
``k = ceil(log_g x)`` with ``g = (1 + a)/(1 - a)`` (DDSketch's mapping), so merging is
adding counts and any quantile of the merged sketch is within a relative error ``a``
(default 1%) of the exact order statistic over all values (numpy's ``method="lower"``);
count, mean, sum of squared deviations, min and max come back too, so mean, std, min and max of the
fleet are exact.

Outliers: for each fleet-level signal (p99 TTFT, p99 TPOT, t0, effective bandwidth,
stall rate, the share of the TTFT tail no known cause explains) a robust z-score
``(x - median) / (1.4826 MAD)`` over the runs, in the bad direction (higher latency, t0,
stall rate, unexplained share; lower bandwidth), the MAD floored per signal (:data:`FLOORS`) and
small runs left out (:data:`MIN_REQUESTS`, :data:`MIN_STEPS`); a run is flagged beyond
``Z_FLAG``; runs are ranked by their largest z.

Tasks run on Ray when asked for and installed (``--ray local|auto|ADDRESS``), else in a
local process pool; the result says which.
"""

from __future__ import annotations

import fnmatch
import math
import os
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .metrics import LATENCY
from .sketch import ALPHA, merge, sketch, sketch_quantile, stats  # noqa: F401  (part of this module's API)

Z_FLAG = 3.5
HEADLINE = LATENCY  # the per-run percentiles the fleet reports: TTFT, TPOT, ITL, E2E
SIGNALS = {  # name -> (how to read it from a run record, +1 when higher is worse, -1 when lower is)
    "ttft_p99_ms": (lambda r: (r["ttft_ms"] or {}).get("p99"), 1),
    "tpot_p99_ms": (lambda r: (r["tpot_ms"] or {}).get("p99"), 1),
    "t0_ms": (lambda r: r.get("t0_ms"), 1),
    "bandwidth_gbps": (lambda r: r.get("effective_bandwidth_gbps"), -1),
    "stall_rate": (lambda r: r.get("stall_rate"), 1),
    "ttft_tail_unexplained": (lambda r: ((r.get("tail_shares") or {}).get("ttft") or {}).get("unexplained"), 1),
}
# The least spread a signal's z is measured against, (relative to |median|, absolute): runs that
# agree closely (every t0 within 0.3%, every run but one without stalls: MAD 0) made any small
# difference a "robust z" of 4 or more. Differences under these are no finding.
FLOORS = {
    "ttft_p99_ms": (0.05, 0.0),
    "tpot_p99_ms": (0.05, 0.0),
    "t0_ms": (0.02, 0.0),
    "bandwidth_gbps": (0.05, 0.0),
    "stall_rate": (0.0, 0.001),  # a tenth of a percent of steps
    "ttft_tail_unexplained": (0.0, 0.05),  # five points of the tail's share
}
# Runs too small for a signal to mean anything are left out of it (their z is None)
MIN_REQUESTS = 50  # p99s and tail shares
MIN_STEPS = 100  # t0, bandwidth, stall rate
_BY_REQUESTS = ("ttft_p99_ms", "tpot_p99_ms", "ttft_tail_unexplained")


def _signal(name: str, rec: dict[str, Any]) -> float | None:
    enough = (
        (rec.get("requests") or 0) >= MIN_REQUESTS
        if name in _BY_REQUESTS
        else (rec.get("iterations") or 0) >= MIN_STEPS
    )
    return SIGNALS[name][0](rec) if enough else None


def run_record(
    lake: str, run_id: str, alpha: float = ALPHA, slo: Any = None, report_dir: str | None = None
) -> dict[str, Any]:
    """One task: a run's summary, fit, sketches, and its SLO audit and report when asked (small, picklable)."""
    from .fit import get_or_fit
    from .lake import open_run
    from .metrics import METRICS
    from .summary import summary

    from .errors import TracelatError

    t0 = time.perf_counter()
    con = open_run(Path(lake), run_id, threads=1)  # one task per CPU: DuckDB's threads would only compete
    try:
        try:
            get_or_fit(con, run_id)
        except TracelatError:
            pass  # a run without steps has no fit: its record says so (t0, bandwidth null)
        s = summary(con, run_id)
        fit = s.get("fit") or {}
        spikes = s.get("spikes") or {}
        steps = s.get("iterations") or 0
        tail = s.get("tail") or {}
        rec = {
            "run_id": run_id,
            "model": (s.get("run") or {}).get("model"),
            "requests": s.get("requests"),
            "iterations": steps,
            **{m: {k: s[m].get(k) for k in ("count", "p50", "p90", "p99", "mean")} for m in HEADLINE},
            "t0_ms": fit.get("t0_ms"),
            "effective_bandwidth_gbps": fit.get("effective_bandwidth_gbps"),
            "stall_rate": (spikes.get("unexplained", 0) / steps) if steps and spikes else None,
            "tail_shares": tail,
            "tail_top": {m: _top(p) for m, p in tail.items()},
            "sketches": {m: sketch(con, run_id, m, alpha) for m in METRICS},
            "warnings": _data_warnings(con, run_id),
        }
        if slo is not None:
            from .audit import audit

            try:
                rec["slo"] = audit(con, run_id, slo).to_dict()
            except TracelatError as exc:  # as `audit` would exit 2: this run cannot be evaluated
                rec["slo"] = {
                    "run_id": run_id,
                    "slo_file": slo.path,
                    "verdict": "error",
                    "exit_code": 2,
                    "checks": [
                        {
                            "section": "run",
                            "name": "data",
                            "observed": None,
                            "op": "",
                            "limit": 0.0,
                            "unit": "",
                            "status": "error",
                            "message": str(exc),
                        }
                    ],
                    "failures": 0,
                    "errors": 1,
                    "goodput": None,
                    "fluidity": None,
                }
        if report_dir is not None:
            from .report import write_report

            write_report(con, run_id, report_dir, slo=slo, summary=s)
            rec["report"] = str(report_dir)
    finally:
        con.close()
    rec["cost"] = {
        "wall_s": time.perf_counter() - t0,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    return rec


def _data_warnings(con, run_id: str) -> list[str]:
    """What the run's ingest left in doubt, for the fleet to say: files with rejected lines, and
    clock joins that failed or are in doubt (a run of rejects shows in the table only as "-")."""
    from . import store
    from .ingest.align import source_lines
    from .terminal import inline

    rows = con.execute(
        "select path, lines_read, lines_rejected from ingests where list_contains(run_ids, $r) "
        "and lines_rejected > 0 order by path",
        {"r": run_id},
    ).fetchall()
    out = [f"{inline(p)}: {rej} of {read} lines rejected" for p, read, rej in rows]
    return out + [text for bad, text in source_lines(run_id, store.run_meta(con, run_id)) if bad]


def _top(parts: dict[str, float | None] | None) -> str | None:
    """The cause with the largest share of a tail (parts without a share, e.g. too few requests, skipped)."""
    known = {k: v for k, v in (parts or {}).items() if v is not None}
    return max(known, key=known.get) if known else None


def _robust_z(values: list[float | None], sign: int, rel: float = 0.0, floor: float = 0.0) -> list[float | None]:
    """``sign * (x - median) / scale`` per run, ``scale = max(1.4826 MAD, rel * |median|, floor)``
    (the mean absolute deviation x 1.2533 standing in for a MAD of 0); None for a run without the
    value, and for every run when fewer than 3 have it."""
    x = np.array([np.nan if v is None else v for v in values], dtype=float)
    ok = np.isfinite(x)
    if ok.sum() < 3:
        return [None] * len(values)
    med = float(np.median(x[ok]))
    mad = 1.4826 * float(np.median(np.abs(x[ok] - med)))
    if mad <= 0:
        mad = float(np.mean(np.abs(x[ok] - med))) * 1.2533 or 0.0
    mad = max(mad, rel * abs(med), floor)
    if mad <= 0:
        return [0.0 if o else None for o in ok]
    return [sign * (v - med) / mad if o else None for v, o in zip(x, ok)]


def _map(tasks: list[tuple], ray: str | None, workers: int | None) -> tuple[list[dict], str]:
    if ray:
        try:
            import ray as ray_mod  # optional: pip install 'tracelat[ray]'
        except ImportError:
            ray_mod = None
        if ray_mod is not None:
            return _on_ray(ray_mod, tasks, ray, workers)
        if ray not in ("local", "auto"):
            from .errors import InputError

            raise InputError(
                f"--ray {ray}: Ray is not installed here; pip install 'tracelat[ray]' "
                "(or --ray local / no --ray for a local process pool)"
            )
        how = "process pool (Ray is not installed: pip install 'tracelat[ray]')"
    else:
        how = "process pool"
    if len(tasks) == 1 or workers == 1:
        return [run_record(*t) for t in tasks], "in process"
    import multiprocessing

    # spawn, not fork: DuckDB and Polars hold threads that a forked child would inherit locked
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(run_record, *zip(*tasks))), how


def _on_ray(ray_mod, tasks: list[tuple], ray: str, workers: int | None) -> tuple[list[dict], str]:
    """One Ray task per run: ``local`` starts a Ray instance here; ``auto`` joins $RAY_ADDRESS if set,
    else starts one; anything else is a cluster address (``ray://host:10001`` or ``host:6379``)."""
    address = os.environ.get("RAY_ADDRESS") if ray == "auto" else None if ray == "local" else ray
    started = not ray_mod.is_initialized()
    if started:
        kw = {"num_cpus": workers} if address is None and workers else {}
        ray_mod.init(address=address, include_dashboard=False, log_to_driver=False, **kw)
    try:
        remote = ray_mod.remote(num_cpus=1, max_retries=1)(run_record)
        out = ray_mod.get([remote.remote(*t) for t in tasks])
        where = f"Ray cluster at {address}" if address else "local Ray"
        return out, f"{where} ({int(ray_mod.cluster_resources().get('CPU', 0))} CPUs)"
    finally:
        if started:
            ray_mod.shutdown()


def report_dir(out: Path, run_id: str) -> Path:
    """Where a run's report goes under ``--out``: a file-name-safe form of the id, plus a hash of it
    (ids may hold any character; two ids that sanitise alike still get two folders)."""
    import hashlib
    import re

    safe = re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:60].lstrip(".") or "run"
    return Path(out) / "runs" / f"{safe}-{hashlib.sha256(run_id.encode()).hexdigest()[:10]}"


def fleet(
    lake: Path,
    runs_glob: str | None = None,
    ray: str | None = None,
    workers: int | None = None,
    alpha: float = ALPHA,
    slo: Any = None,
    out: Path | None = None,
) -> dict[str, Any]:
    """Per-run records, fleet statistics from merged sketches, the outlier table (and the SLO verdicts)."""
    from .errors import InputError
    from .lake import lake_runs
    from .metrics import METRICS
    from .terminal import shown_id

    runs = [r for r in lake_runs(lake) if runs_glob is None or fnmatch.fnmatchcase(r, runs_glob)]
    if not runs:
        raise InputError(
            f"{lake}: no runs{'' if runs_glob is None else ' matching --runs ' + shown_id(runs_glob)}; "
            "write some with `tracelat ingest FILE --lake DIR` or `tracelat export RUN --lake DIR`"
        )
    tasks = [(str(Path(lake).resolve()), r, alpha, slo, None if out is None else str(report_dir(out, r))) for r in runs]
    records, how = _map(tasks, ray, workers)
    sketches = [rec.pop("sketches") for rec in records]
    merged = {m: merge([s[m] for s in sketches]) for m in METRICS}
    fleet_stats = {m: stats(merged[m], alpha) for m in METRICS}
    zs = {
        name: _robust_z([_signal(name, r) for r in records], sign, *FLOORS[name]) for name, (_, sign) in SIGNALS.items()
    }
    for i, rec in enumerate(records):
        rz = {name: z[i] for name, z in zs.items() if z[i] is not None}
        rec["z"] = {k: round(float(v), 3) for k, v in rz.items()}
        rec["outlier"] = sorted(k for k, v in rz.items() if v > Z_FLAG)
        rec["worst_z"] = float(max(rz.values())) if rz else None
    ranked = sorted(records, key=lambda r: -(r["worst_z"] if r["worst_z"] is not None else -math.inf))
    result = {
        "fleet": fleet_stats,
        "runs": ranked,
        "sketch_relative_error": alpha,
        "executor": how,
        "outlier_rule": f"robust z > {Z_FLAG} in the bad direction (median, 1.4826 MAD over runs, at least "
        f"5% of the median for p99s and bandwidth, 2% for t0, 0.1% of steps for the stall rate, 5 points for the "
        f"unexplained tail share; runs under {MIN_REQUESTS} requests or {MIN_STEPS} steps left out of those signals)",
        "cost": {
            "task_wall_s_sum": sum(r["cost"]["wall_s"] for r in records),
            "task_peak_rss_mib_max": max(r["cost"]["peak_rss_mib"] for r in records),
        },
    }
    if slo is not None:
        from .fleet_slo import fleet_audit

        result["slo"] = fleet_audit(slo, merged, records, alpha)
    return result
