"""SLA auditing: SLO files, goodput, the fluidity index, JUnit XML and verdicts.

``load_slo(path)`` reads a TOML SLO file, ``audit(con, run_id, spec)`` evaluates it
and returns an :class:`AuditResult` (``exit_code`` 0 pass, 1 violation, 2 data
error); ``junit_xml`` and ``markdown_report`` turn the result into CI outputs.
"""

from __future__ import annotations

from .check import AuditResult, Check, audit
from .junit import junit_xml
from ..slo import SloSpec, load_slo, parse_slo
from .verdict import markdown_report, text_report

__all__ = [
    "AuditResult",
    "Check",
    "SloSpec",
    "audit",
    "junit_xml",
    "load_slo",
    "markdown_report",
    "parse_slo",
    "text_report",
]
