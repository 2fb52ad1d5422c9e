"""Evaluate an :class:`SloSpec` on a run: one :class:`Check` per SLO, an :class:`AuditResult`.

A check *fails* when the value is on the wrong side of its limit and is an *error*
when the run has no data to compute it (e.g. ``itl_ms`` without token times, or
fluidity without token times), or when the value is an estimate whose uncertainty
reaches the limit (queue and prefill times inferred from a server log's steps): the
audit then exits 2, because an SLO that cannot be evaluated must not pass silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import duckdb

from .. import store
from . import measure
from ..metrics import percentile_name, percentile_of
from ..slo import TIE_MS, SloSpec, within_limit


@dataclass(frozen=True)
class Check:
    """One SLO and its outcome: ``status`` is ``pass``, ``fail`` or ``error``."""

    section: str
    name: str
    observed: float | None
    op: str
    limit: float
    unit: str
    status: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class AuditResult:
    """All checks of one audit, plus the goodput and fluidity measurements."""

    run_id: str
    slo_path: str
    checks: list[Check] = field(default_factory=list)
    goodput: dict[str, Any] | None = None
    fluidity: dict[str, Any] | None = None

    @property
    def failures(self) -> int:
        return sum(c.status == "fail" for c in self.checks)

    @property
    def errors(self) -> int:
        return sum(c.status == "error" for c in self.checks)

    @property
    def verdict(self) -> str:
        """``error`` (data missing), ``fail`` (a violation) or ``pass``."""
        return "error" if self.errors else "fail" if self.failures else "pass"

    @property
    def exit_code(self) -> int:
        return {"pass": 0, "fail": 1, "error": 2}[self.verdict]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "slo_file": self.slo_path,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "checks": [c.to_dict() for c in self.checks],
            "failures": self.failures,
            "errors": self.errors,
            "goodput": self.goodput,
            "fluidity": self.fluidity,
        }


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit in ("fraction", "index"):
        return f"{v:.4f}"
    if abs(v) >= 1e9:  # a limit of 1e300 printed its 300 digits
        return f"{v:.4g} {unit}".rstrip()
    return f"{v:.3f} {unit}".rstrip()


def _check(
    section: str, name: str, observed: float | None, op: str, limit: float, unit: str, missing_why: str = ""
) -> Check:
    if observed is None:
        return Check(
            section,
            name,
            None,
            op,
            limit,
            unit,
            "error",
            f"{name}: cannot be evaluated: {missing_why or 'no data in this run'}",
        )
    if op == "<=":
        ok = within_limit(observed, limit) if unit == "ms" else observed <= limit
    else:
        ok = observed >= limit
    verb = "within" if ok else ("exceeds" if op == "<=" else "is below")
    tie = ""
    if ok and op == "<=" and observed > limit:  # met by TIE_MS only: shown to 3 decimals it reads as over
        tie = f" (over by {(observed - limit) * 1e3:.3g} us, within the {TIE_MS * 1e3:g} us rounding of times)"
    return Check(
        section,
        name,
        observed,
        op,
        limit,
        unit,
        "pass" if ok else "fail",
        f"{name} = {_fmt(observed, unit)} {verb} limit {op} {_fmt(limit, unit)}{tie}",
    )


_NO_DATA = {
    "itl_ms": "the run has no token times (token_times in request records)",
    "iteration_ms": "the run has no iteration records",
}


# metrics measured from t_scheduled: a client's records lack it, and a split-evidence ingest infers
# it from the server log's steps (pipeline/ingest/align.py), with an uncertainty per request
FROM_SCHEDULED = ("queue_ms", "prefill_ms")


def _scheduled_uncertainty_ms(con: duckdb.DuckDBPyConnection, run_id: str) -> float | None:
    """The p90 uncertainty (ms) of the run's inferred t_scheduled; None when it was recorded."""
    rows = con.execute(
        "select max(cast(info->'inferred'->'t_scheduled'->>'p90_uncertainty_ms' as double)) "
        "from clock_alignments where run_id = $r and list_contains(inferred, 't_scheduled')",
        {"r": run_id},
    ).fetchall()
    return rows[0][0] if rows else None


def _estimated(c: Check, uncertainty_ms: float) -> Check:
    """A check on an inferred value: undecided when the limit lies within its uncertainty, else noted."""
    how = f"t_scheduled was inferred from the server log's steps, ±{uncertainty_ms:g} ms for 90% of requests"
    if c.observed is None:
        return c
    if abs(c.observed - c.limit) <= uncertainty_ms:
        return replace(
            c,
            status="error",
            message=f"{c.name}: cannot be decided: {_fmt(c.observed, c.unit)} is within the estimate's "
            f"uncertainty of the limit ({how}); record t_scheduled, or give the log with sub-second stamps",
        )
    return replace(c, message=f"{c.message} (an estimate: {how})")


def _stat_checks(con: duckdb.DuckDBPyConnection, run_id: str, spec: SloSpec) -> list[Check]:
    by_metric: dict[str, list[str]] = {}
    for lim in spec.limits:
        by_metric.setdefault(lim.metric, []).append(lim.stat)
    values = {m: measure.run_stats(con, run_id, m, stats) for m, stats in by_metric.items()}
    unsure = _scheduled_uncertainty_ms(con, run_id) if set(by_metric) & set(FROM_SCHEDULED) else None
    out = []
    for lim in spec.limits:
        v = values[lim.metric]
        why = _NO_DATA.get(lim.metric, "no ok requests with this value") if not v["count"] else "too few values"
        c = _check("slo", f"{lim.name} <= {lim.limit:g}", v.get(lim.stat), "<=", lim.limit, "ms", why)
        out.append(_estimated(c, unsure) if unsure is not None and lim.metric in FROM_SCHEDULED else c)
    return out


def _goodput_checks(g: dict[str, Any], spec) -> list[Check]:
    out = []
    wanted = [
        ("min_attainment", "attainment", "goodput attainment", "fraction"),
        ("min_request_goodput_rps", "request_goodput_rps", "request goodput", "req/s"),
        ("min_token_goodput_tps", "token_goodput_tps", "token goodput", "tokens/s"),
    ]
    for key, value_key, label, unit in wanted:
        limit = getattr(spec, key)
        if limit is not None:
            out.append(
                _check(
                    "goodput",
                    f"{label} >= {limit:g}",
                    g[value_key],
                    ">=",
                    limit,
                    unit,
                    f"no ok request of the run has {', '.join(g['unmeasured'])}"
                    if g.get("unmeasured")
                    else "the run has no requests (or no duration)",
                )
            )
    return out


def _fluidity_checks(f: dict[str, Any], spec) -> list[Check]:
    """One check per fluidity minimum. The index needs a request's token times: when under half
    of the ok requests have them, a minimum over those says nothing of the rest (one evaluable
    request of nine passed "min >= 0.5" that the nine fail), and the check cannot be evaluated;
    with half or more, its message says how many were left out."""
    n, without = f.get("requests_evaluated", 0), f.get("requests_without_token_times", 0)
    out = []
    for stat, limit in spec.minima.items():
        p = percentile_of(stat)
        value = f.get("percentiles", {}).get(percentile_name(p)) if p is not None else f.get(stat)
        name = f"fluidity index {stat} >= {limit:g}"
        if n and without > n:
            out.append(
                Check(
                    "fluidity",
                    name,
                    None,
                    ">=",
                    limit,
                    "index",
                    "error",
                    f"{name}: cannot be evaluated: only {n} of the run's {n + without} ok requests have token "
                    f"times (token_times in request records); a limit judged on them says nothing of the other {without}",
                )
            )
            continue
        check = _check(
            "fluidity",
            name,
            value,
            ">=",
            limit,
            "index",
            "no ok request has token times (token_times in request records)",
        )
        if without and check.status != "error":
            check = replace(
                check, message=f"{check.message} (over {n} of {n + without} ok requests: {without} have no token times)"
            )
        out.append(check)
    return out


def audit(con: duckdb.DuckDBPyConnection, run_id: str, spec: SloSpec) -> AuditResult:
    """Evaluate every SLO of ``spec`` on ``run_id`` (derived tables must be built)."""
    store.require_run(con, run_id)
    measure.require_data(con, run_id)
    result = AuditResult(run_id, spec.path)
    result.checks.extend(_stat_checks(con, run_id, spec))
    if spec.goodput is not None:
        result.goodput = measure.goodput(con, run_id, spec.goodput)
        result.checks.extend(_goodput_checks(result.goodput, spec.goodput))
    if spec.fluidity is not None:
        result.fluidity = measure.fluidity(con, run_id, spec.fluidity)
        result.checks.extend(_fluidity_checks(result.fluidity, spec.fluidity))
    return result
