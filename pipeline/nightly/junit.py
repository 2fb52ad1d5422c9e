"""JUnit XML of a night: the SLO audit's suite (when there is an SLO file) plus a suite of
change-point checks, one testcase per statistic tested tonight, failing when the statistic
has a new change point for the worse that gates the night.  CI systems then show *why* a
night exited 1, whichever the reason."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from ..escape import xml_clean
from .stats import direction, label


def _el(parent: ET.Element, tag: str, **attrs: object) -> ET.Element:
    return ET.SubElement(parent, tag, {k: xml_clean(v) for k, v in attrs.items()})


def nightly_junit(audit_xml: bytes | None, outcome: Any, metrics: list[str]) -> bytes:
    """``audit_xml`` (``pipeline.audit.junit_xml``) with the change-point suite added;
    ``metrics``: the statistics tested tonight."""
    root = ET.fromstring(audit_xml) if audit_xml else ET.Element("testsuites")
    root.set("name", "tracelat nightly")  # with or without an SLO file: CI keys its history on the name
    for audit in root.iter("testsuite"):
        # every night audits the engine's run id (often the same each night): the night names it in CI
        audit.set("name", f"tracelat audit night {outcome.night.run_id} (run {outcome.night.source_run})")
    tested = sorted(m for m in set(metrics) if direction(m) != 0)
    failing = {}
    for c in outcome.failing_changes:
        failing.setdefault(c.metric, []).append(c)
    suite = _el(
        root,
        "testsuite",
        name=f"tracelat nightly change points {outcome.night.run_id}",
        tests=len(tested),
        failures=len(failing),
        errors=0,
        skipped=0,
        time="0",
    )
    for metric in tested:
        case = _el(
            suite,
            "testcase",
            classname="tracelat.nightly.change_point",
            name=f"{metric}: no new change for the worse",
            time="0",
        )
        for c in failing.get(metric, []):
            size = "changed" if c.rel_change is None else f"{100 * c.rel_change:+.1f}%"
            msg = f"{label(metric)} {size} from night {c.night}: {c.before:.4g} -> {c.after:.4g} (p = {c.p_value:.4f})"
            node = _el(case, "failure", message=msg, type="ChangePoint")
            node.text = xml_clean(msg)
    for key in ("tests", "failures", "errors"):
        total = sum(int(s.get(key) or 0) for s in root.findall("testsuite"))
        root.set(key, str(total))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


# the error testcase of each command that rewrites its --junit file on exit 2 (suite, case, type)
ERROR_CASES = {
    "nightly": ("tracelat nightly", "tracelat.nightly.night", "the night runs", "NightlyError"),
    "audit": ("tracelat audit", "tracelat.audit.run", "the audit runs", "AuditError"),
    "fleet": ("tracelat fleet audit", "tracelat.fleet.run", "the fleet audit runs", "FleetError"),
}


def error_junit(message: str, night: str | None = None, command: str = "nightly") -> bytes:
    """JUnit XML for a command that failed (exit 2): one testcase with an ``<error>`` carrying
    ``message``, so that CI shows a broken night (or audit) instead of the last run's file."""
    msg = xml_clean(message)
    name, classname, case_name, kind = ERROR_CASES[command]
    root = ET.Element("testsuites", name=name, tests="1", failures="0", errors="1")
    suite = _el(
        root,
        "testsuite",
        name=name + (f" {night}" if night else ""),
        tests=1,
        failures=0,
        errors=1,
        skipped=0,
        time="0",
    )
    case = _el(suite, "testcase", classname=classname, name=case_name, time="0")
    node = _el(case, "error", message=msg, type=kind)
    node.text = msg
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
