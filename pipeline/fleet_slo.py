"""``tracelat fleet --slo``: the SLO file checked per run (the audit's own code, in each task) and
fleet-wide, over all requests of all runs, from what the tasks sent back.

Fleet-wide, each ``[slo]`` limit is checked on the merged sketch of its metric:
percentiles within the sketch's relative error (stated in the check's message), mean,
std, min and max exact.  ``[goodput]``: attainment is exact (good requests over all
requests, summed over runs); the request and token goodput rates are the sums of the
runs' rates (replicas serve side by side).  ``[fluidity]`` is a per-request index whose
quantiles need every request, so it is checked per run only (said in ``not_fleet_wide``).

Exit code, as ``audit``: 2 when any run or the fleet cannot evaluate an SLO, else 1
when any is violated, else 0.  The check logic is the audit's (``audit.check._check``);
when the SLO code is unified, this module should call the shared one.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from .audit.check import AuditResult, Check, _check, _goodput_checks
from .metrics import percentile_of
from .slo import SloSpec
from .sketch import sketch_quantile, stats

FLEET = "(fleet)"


def _stat(sk: dict[str, Any], stat: str, alpha: float) -> float | None:
    p = percentile_of(stat)
    if p is not None:
        return sketch_quantile(sk["buckets"], p / 100, alpha)
    return stats(sk, alpha).get(stat)


def fleet_audit(
    spec: SloSpec, merged: dict[str, dict[str, Any]], records: list[dict[str, Any]], alpha: float
) -> dict[str, Any]:
    """Fleet-wide checks, every run's verdict, and the combined exit code."""
    result = AuditResult(FLEET, spec.path)
    for lim in spec.limits:
        sk = merged[lim.metric]
        approx = f" (from the merged sketch, within {alpha:.0%})" if percentile_of(lim.stat) is not None else ""
        c = _check(
            "slo",
            f"{lim.name} <= {lim.limit:g}",
            _stat(sk, lim.stat, alpha) if sk["n"] else None,
            "<=",
            lim.limit,
            "ms",
            "no run has values of it",
        )
        result.checks.append(Check(c.section, c.name, c.observed, c.op, c.limit, c.unit, c.status, c.message + approx))
    not_fleet_wide = []
    if spec.goodput is not None:
        # None: the run's audit could not compute it (an error); {} or requests 0: no request records
        raw = [(r.get("slo") or {}).get("goodput") for r in records]
        per = [g or {} for g in raw]
        total = sum(g.get("requests") or 0 for g in per)
        good = sum(g.get("good_requests") or 0 for g in per)

        # runs without request records (a steps-only log) are left out of the rates, as of the
        # attainment: they said "cannot be evaluated: the run has no requests" of the whole fleet
        served = [g for g in per if g.get("requests")]
        left_out = [r["run_id"] for r, g in zip(records, raw) if g is not None and not g.get("requests")]
        failed = any(g is None for g in raw)  # a run whose goodput is unknown: the fleet's sum is too

        def total_rate(key: str) -> float | None:
            vals = [g.get(key) for g in served]
            return None if failed or any(v is None for v in vals) or not vals else float(sum(vals))

        result.goodput = {
            "limits_ms": dict(spec.goodput.limits),
            "requests": total,
            "good_requests": good,
            "attainment": good / total if total else None,
            "request_goodput_rps": total_rate("request_goodput_rps"),
            "token_goodput_tps": total_rate("token_goodput_tps"),
            "rates": "sums of the runs' rates (replicas serve side by side)",
            "runs_without_requests": left_out,
        }
        result.checks.extend(_goodput_checks(result.goodput, spec.goodput))
    if spec.fluidity is not None:
        not_fleet_wide.append("fluidity (a per-request index; checked per run)")
    runs = [
        {
            "run_id": r["run_id"],
            "verdict": r["slo"]["verdict"],
            "exit_code": r["slo"]["exit_code"],
            "failures": r["slo"]["failures"],
            "errors": r["slo"]["errors"],
        }
        for r in records
    ]
    code = max([result.exit_code, *(r["exit_code"] for r in runs)])
    return {
        "fleet": result.to_dict() | {"not_fleet_wide": not_fleet_wide},
        "runs": runs,
        "exit_code": code,
        "verdict": {0: "pass", 1: "fail", 2: "error"}[code],
    }


def _result(d: dict[str, Any]) -> AuditResult:
    r = AuditResult(d["run_id"], d["slo_file"], goodput=d.get("goodput"), fluidity=d.get("fluidity"))
    r.checks = [Check(**c) for c in d["checks"]]
    return r


def fleet_junit(slo: dict[str, Any], records: list[dict[str, Any]]) -> bytes:
    """JUnit XML: the audit's testsuite of each run, and one of the fleet-wide checks, in one document."""
    from .audit import junit_xml

    suites = [ET.fromstring(junit_xml(_result(slo["fleet"])))]
    suites += [ET.fromstring(junit_xml(_result(r["slo"]))) for r in records]
    root = ET.Element("testsuites", {"name": "tracelat fleet audit", "time": "0"})
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(sum(int(s.get(key, "0")) for s in suites)))
    for s in suites:
        root.extend(list(s))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
