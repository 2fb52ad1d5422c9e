"""Fitting one run end to end and keeping the result in the store.

:func:`fit_run` reads the run's steps, fits the model (overall and per phase),
materialises ``iteration_fit`` and ``request_attribution`` and stores the numbers
in the ``fits`` table (one row per run, with a fingerprint of the run's data).
:func:`get_or_fit` returns the stored fit while the run's data is unchanged.
The hardware figures and the iteration-time claims depend on ``--model``/``--gpu`` and are
recomputed from the stored numbers on every call (cheap).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl

from .. import store
from ..catalog import HardwareSpec
from ..errors import InputError
from . import claims, hardware, sql, stalls
from .extended import fit_extended
from .model import TERMS, LinearFit, fit_linear, log_ratio
from .result import FitResult

# Version of what ``fits`` stores; a stored fit of another version is refitted, never read
# (v1 lacked log_center; v2: sandwich intervals above 20k steps, one-step bootstrap, ci_method;
# v3: default k 3.5 (was 4), stall detection limit; v4: an unfitted run's steps get NULL
# predictions, no longer NaN ones that flagged every step a stall, and all-0 ms steps are not fitted;
# v5: stalls by false-discovery rate (Benjamini-Hochberg under a fitted Student-t null), k is the cut's
# equivalent in robust sigmas; the extended model chosen by held-out error; v6: data-parallel dummy steps
# are not fitted and get no prediction; v7: the coefficients are refitted without the flagged stalls,
# whose one-sided pull put them high; v8: the p5 and p95 of contexts (decode-only steps, all steps), for the linear
# claim's growth); v9: token gaps price preemption only where tokens come one per step (a bursty client's
# gaps are not steps sat out); v10: phase edges priced where they fall in a step's span (host gap first),
# waiting_step (the step in progress at arrival, neither full nor prefilling: not capacity), the hardware
# options fit was given kept with the numbers.
FIT_VERSION = 10
TOL_S = 1e-6  # request times match a step ending up to 1 us later (float rounding of the same clock)

FITS_SCHEMA = """
create table if not exists fits (
    run_id varchar, fit_version integer, fingerprint varchar, numbers json, fitted_at timestamp
)
"""


def _fingerprint(con: duckdb.DuckDBPyConnection, run_id: str) -> str:
    """Changes whenever the run's steps, requests or token times change.

    An xor of row hashes: exact and independent of row order (a float sum is not:
    DuckDB's parallel sums may differ in the last bits between two reads).
    """
    a = con.execute(
        "select count(*), bit_xor(hash(iter, iteration_ms, t_end, context_tokens, prefill_tokens, "
        "decode_tokens, preempted_reqs)) from iteration_metrics where run_id = ?",
        [run_id],
    ).fetchall()[0]
    b = con.execute(
        "select count(*), bit_xor(hash(req_id, t_arrival, t_scheduled, t_first_token, t_finish, "
        "output_tokens, preemptions, status)) from request_latency where run_id = ?",
        [run_id],
    ).fetchall()[0]
    c = con.execute("select count(*), bit_xor(hash(req_id, idx, t)) from tokens where run_id = ?", [run_id]).fetchall()[
        0
    ]
    return json.dumps([FIT_VERSION, *a, *b, *c], default=str)


EXTRA_COLUMNS = ("batch_reqs", "prefill_reqs", "decode_reqs", "prefill_attn")  # the extended model's inputs


def _load(
    con: duckdb.DuckDBPyConnection, run_id: str
) -> tuple[dict[str, np.ndarray], np.ndarray, list[str], int, dict[str, np.ndarray | None], int]:
    """Complete rows of the model's columns (time order); absent columns are left out, with a note.

    Also the extended model's inputs on the same rows (None where not recorded): requests per
    step and the exact prefill attention pairs, an extra field of simulated traces. The last
    value is the number of data-parallel dummy steps left out.
    """
    df = store.select(con, "fit/fit_inputs", {"run_id": run_id})
    n_all = df.height
    notes = []
    # A data-parallel engine with nothing scheduled runs a dummy step to stay in lockstep with
    # the others (vLLM logs it with " (dummy)"): no tokens, and its elapsed time is waiting on the
    # executor, not work. Fitted, such steps would pull t0 towards the wait and count as stalls.
    n_dummy = int(df["is_dummy"].sum())
    if n_dummy:
        df = df.filter(~pl.col("is_dummy"))
        notes.append(
            f'{n_dummy} of {n_all} steps are data-parallel dummy steps (vLLM "(dummy)" lines: padding, '
            "no tokens) and are not fitted"
        )
    present = [c for _, c in TERMS if df[c].null_count() < df.height]
    if present:
        before = df.height
        df = df.drop_nulls(present)
        if df.height < before:
            notes.append(f"{before - df.height} of {before} steps lack one of {', '.join(present)} and are not fitted")
    cols = {c: df[c].to_numpy().astype(float) for c in present}
    extra = {
        c: df[c].cast(float).fill_null(float("nan")).to_numpy() if df[c].null_count() < df.height else None
        for c in EXTRA_COLUMNS
    }
    return cols, df["iteration_ms"].to_numpy().astype(float), notes, n_all, extra, n_dummy


def _phase_fits(cols: dict[str, np.ndarray], y: np.ndarray, k: float) -> dict[str, Any]:
    """Separate fits of decode-only steps and steps with prefill, where each has enough steps."""
    if "prefill_tokens" not in cols:
        return {}
    out: dict[str, Any] = {}
    pf = cols["prefill_tokens"] > 0
    for name, sel, allow in (("decode_only", ~pf, ("a_ms_per_ctx", "c_ms_per_decode")), ("with_prefill", pf, None)):
        if sel.sum() < 20:
            out[name] = {"n": int(sel.sum()), "statements": [f"only {int(sel.sum())} such steps: not fitted"]}
            continue
        f = fit_linear({c: v[sel] for c, v in cols.items()}, y[sel], allow=allow, n_boot=100, k=k)
        out[name] = f.to_dict() if f else {"n": int(sel.sum()), "statements": ["too few steps to fit"]}
    return out


def _numbers(fit: LinearFit | None, cols, y, k: float) -> dict[str, Any]:
    """The stored numeric part of a fit (JSON-ready)."""
    if fit is None:
        return {
            "coef": {"t0_ms": None},
            "ci": {},
            "terms": [],
            "n": len(y),
            "r2": None,
            "r2_inliers": None,
            "mape_pct": None,
            "log_center": 0.0,
            "log_scale": float("inf"),
            "statements": [],
        }
    d = fit.to_dict()
    for name, _ in TERMS:
        d["coef"].setdefault(name, None)
    yhat = fit.predict(cols)
    lr = log_ratio(y, yhat)
    inlier = np.nan_to_num(lr, nan=np.inf) <= fit.log_center + k * fit.log_scale
    d["shape"] = claims.shape_evidence(cols.get("context_tokens"), cols.get("prefill_tokens"), y, lr, inlier)
    return d


def fit_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    hw: HardwareSpec = HardwareSpec(),
    *,
    k: float | None = None,
    n_boot: int = 200,
    fdr: float = stalls.DEFAULT_FDR,
    timings: dict[str, float] | None = None,
) -> FitResult:
    """Fit the memory-bound model to a run, store it, and return the full result.

    ``hw`` (model, HF config, GPU, bandwidth, TFLOP/s; :class:`~pipeline.catalog.HardwareSpec`)
    only affects the hardware figures; what it leaves None comes from the run's metadata. ``timings``,
    if given, receives the seconds each phase took (benchmarks). Stalls: steps flagged by
    Benjamini-Hochberg at false-discovery rate ``fdr``; ``k`` (deprecated) flags steps beyond a
    fixed ``k`` robust sigmas instead, whose false stalls grow with the run.
    """
    lap = _Lap(timings)
    store.require_run(con, run_id)
    resolved = hardware.resolve(con, run_id, hw)  # bad names fail early
    cols, y, notes, n_all, extra, n_dummy = _load(con, run_id)
    lap("load")
    # steps that all last 0 ms (coarse or missing clocks) carry no timing to fit: the
    # relative-error fit would divide by them
    timed = bool((y > 0).any())
    fit = fit_linear(cols, y, n_boot=n_boot, k=k, fdr=fdr) if timed else None
    if k is not None:
        notes.append(
            f"stalls by a fixed threshold of k = {k:g} robust sigmas (--k, deprecated): its false stalls "
            "grow with the run; --fdr Q bounds their share instead"
        )
    if n_all == 0:
        notes.append("the run has no steps with a duration: there is nothing to fit")
    elif len(y) == 0:
        notes.append("no step other than data-parallel dummy steps has the model's columns: there is nothing to fit")
    elif not timed:
        notes.append(f"all {len(y)} steps last 0 ms: iteration time cannot be fitted")
    elif fit is None:
        notes.append(f"only {len(y)} usable steps: too few to fit the model")
    lap("fit")
    k_eff = fit.stall_k if fit else (stalls.DEFAULT_K if k is None else k)
    nums = _numbers(fit, cols, y, k_eff)
    nums["statements"] = notes + nums["statements"]
    # the phase fits judge their outliers by the whole run's rule (one noise law, one cut)
    nums.update(
        n_iterations=n_all,
        dummy_steps_excluded=n_dummy,
        k=k_eff,
        phases=_phase_fits(cols, y, k_eff) if fit else {},
        stall_fdr=fit.stall_fdr if fit else None,
        # what `fit` was told the run ran on (--model, --gpu, ...): summary, report and explain
        # assemble the stored fit with it, instead of dropping the hardware figures it gave
        hardware_options={
            k: str(Path(v).resolve()) if k == "config" else v for k, v in hw.to_dict().items() if v is not None
        },
    )
    lap("phase_fits_and_evidence")
    ext = None
    if fit is not None:
        lr = log_ratio(y, fit.predict(cols))
        ext = fit_extended(
            cols, extra, y, fit.terms, np.nan_to_num(lr, nan=np.inf) <= fit.log_center + k_eff * fit.log_scale
        )
    nums["extended"] = ext.to_dict() if ext else None
    lap("extended_model")
    with store.transaction(con):
        _materialise(con, run_id, nums, lap)
        nums.update(stalls.stats(con, run_id, stalls.limit_factor(nums["log_center"], k_eff, nums["log_scale"])))
        nums["top_spikes"] = stalls.top_spikes(con, run_id)
        lap("stall_stats")
        con.execute(FITS_SCHEMA)
        con.execute("delete from fits where run_id = ?", [run_id])
        con.execute(
            "insert into fits values (?, ?, ?, ?, now())",
            [run_id, FIT_VERSION, _fingerprint(con, run_id), json.dumps(_jsonable(nums))],
        )
    lap("store_and_commit")
    return assemble(run_id, nums, resolved)


class _Lap:
    """Seconds since the previous lap, recorded under a name (no-op without a dict)."""

    def __init__(self, out: dict[str, float] | None) -> None:
        self.out, self.t = out, time.perf_counter()

    def __call__(self, name: str) -> None:
        if self.out is not None:
            now = time.perf_counter()
            self.out[name] = self.out.get(name, 0.0) + now - self.t
            self.t = now


def _materialise(con: duckdb.DuckDBPyConnection, run_id: str, nums: dict[str, Any], lap: _Lap) -> None:
    coef = nums["coef"]
    params = {
        "run_id": run_id,
        "t0_ms": coef["t0_ms"] or 0.0,
        "log_center": nums["log_center"],
        "log_scale": nums["log_scale"],
        "k": nums["k"],
        "tol_s": TOL_S,
    }
    params |= {name: coef.get(name) or 0.0 for name, _ in TERMS}
    if coef["t0_ms"] is None:  # nothing fitted: no predictions, every step unattributed
        # NULL, not NaN: DuckDB orders NaN above every number, so a NaN prediction made
        # every step a "stall" with a NaN residual
        params["t0_ms"] = None
    store.materialise(con, "fit/iteration_fit", params)
    lap("iteration_fit")
    with sql.step_sums(con, run_id):
        store.materialise(con, "fit/request_attribution", params)
    lap("request_attribution")


def _jsonable(o: Any) -> Any:
    if isinstance(o, dict):
        return {k: _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, (np.generic,)):
        return o.item()
    if isinstance(o, float) and not np.isfinite(o):
        return None if np.isnan(o) else ("inf" if o > 0 else "-inf")
    return o


def assemble(run_id: str, nums: dict[str, Any], hw: hardware.Hardware) -> FitResult:
    """A :class:`FitResult` from stored numbers and resolved hardware."""
    hw_report = hardware.report(nums["coef"], nums["ci"], hw)
    statements = list(nums.get("statements", [])) + list(hw.notes)
    return FitResult.from_numbers(run_id, nums, hw_report, claims.check(nums, hw_report), statements)


def stored_numbers(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any] | None:
    """The stored fit of a run if its data has not changed since, else None."""
    if not all(store.table_exists(con, t) for t in ("fits", "iteration_fit", "request_attribution")):
        return None
    rows = con.execute(
        "select fingerprint, numbers from fits where run_id = ? and fit_version = ?", [run_id, FIT_VERSION]
    ).fetchall()
    if not rows or rows[0][0] != _fingerprint(con, run_id):
        return None
    nums = json.loads(rows[0][1])
    nums["log_scale"] = float(nums["log_scale"]) if nums.get("log_scale") is not None else float("nan")
    return nums


def fit_ready(*run_ids: str):
    """``read_only_if`` for ``store.open_for_reading``: every known run of ``run_ids`` has a current stored fit."""

    def ready(con: duckdb.DuckDBPyConnection) -> bool:
        known = set(store.known_runs(con))
        return all(stored_numbers(con, r) is not None for r in run_ids if r in known)

    return ready


def _given_to_fit(con: duckdb.DuckDBPyConnection, run_id: str) -> HardwareSpec:
    """The hardware options the run's last `tracelat fit` was given (none: the run's own names), kept
    in its stored fit's numbers (also a fit the run's data has outdated: a refit keeps them)."""
    if not store.table_exists(con, "fits"):
        return HardwareSpec()
    row = con.execute(
        "select numbers->'hardware_options' from fits where run_id = ? order by fitted_at desc limit 1", [run_id]
    ).fetchone()
    if not row or not row[0]:
        return HardwareSpec()
    try:
        return HardwareSpec.from_dict(json.loads(row[0]))
    except (InputError, TypeError, ValueError):  # written by another version: the run's own names
        return HardwareSpec()


def get_or_fit(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    hw: HardwareSpec = HardwareSpec(),
) -> FitResult:
    """The run's fit: the stored one while the run's data is unchanged, else a new fit."""
    store.require_run(con, run_id)
    if hw == HardwareSpec():
        hw = _given_to_fit(con, run_id)
        try:
            hardware.resolve(con, run_id, hw)
        except InputError:  # a --config file since moved, say: the run's own names, as before
            hw = HardwareSpec()
    nums = stored_numbers(con, run_id)
    if nums is None:
        if store.is_read_only(con):
            raise store.StoreError(
                f"run {run_id!r} has no current stored fit and the store is open read-only; "
                "open it with store.open_for_reading(db, read_only_if=fit_ready(run_id))"
            )
        return fit_run(con, run_id, hw)
    return assemble(run_id, nums, hardware.resolve(con, run_id, hw))
