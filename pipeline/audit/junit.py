"""JUnit XML for CI systems (Jenkins, GitLab): one ``<testcase>`` per SLO.

The layout is the common subset both read: ``<testsuites>`` holding one
``<testsuite>`` with ``tests``/``failures``/``errors`` counts, ``<properties>``,
and testcases whose ``<failure>``/``<error>`` carry a one-line ``message``.
"""

from __future__ import annotations

import socket
import xml.etree.ElementTree as ET
from datetime import datetime, timezone

from .. import __version__
from ..escape import xml_clean
from .check import AuditResult


def _el(parent: ET.Element, tag: str, **attrs: object) -> ET.Element:
    return ET.SubElement(parent, tag, {k: xml_clean(v) for k, v in attrs.items()})


def junit_xml(result: AuditResult, timestamp: datetime | None = None) -> bytes:
    """The audit as JUnit XML (UTF-8 bytes with an XML declaration)."""
    ts = (timestamp or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%S")
    counts = {"tests": len(result.checks), "failures": result.failures, "errors": result.errors, "skipped": 0}
    root = ET.Element("testsuites", {"name": "tracelat audit", **{k: str(v) for k, v in counts.items()}, "time": "0"})
    suite = _el(
        root,
        "testsuite",
        name=f"tracelat audit {result.run_id}",
        timestamp=ts,
        hostname=socket.gethostname(),
        time="0",
        **counts,
    )
    props = _el(suite, "properties")
    for name, value in (
        ("run_id", result.run_id),
        ("slo_file", result.slo_path),
        ("tracelat_version", __version__),
        ("verdict", result.verdict),
    ):
        _el(props, "property", name=name, value=value)
    for check in result.checks:
        case = _el(suite, "testcase", classname=f"tracelat.slo.{check.section}", name=check.name, time="0")
        if check.status == "fail":
            node = _el(case, "failure", message=check.message, type="SLOViolation")
            node.text = xml_clean(f"run {result.run_id}: {check.message}")
        elif check.status == "error":
            node = _el(case, "error", message=check.message, type="MissingData")
            node.text = xml_clean(f"run {result.run_id}: {check.message}")
        else:
            out = _el(case, "system-out")
            out.text = xml_clean(check.message)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
