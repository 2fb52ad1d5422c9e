"""Invariants as SQL: ``queries/checks/*.sql`` each return the rows that break one rule.

``tracelat check RUN`` runs them all on a user's own data (the same queries run in the
tests), so a broken converter, a hand-edited store or a bug shows as named rows instead
of quietly wrong percentiles.  A check whose inputs do not exist for the run (no fit yet:
no ``request_attribution``) is reported as skipped, not passed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import duckdb

from .resources import QUERIES_DIR

LIMIT = 5


@dataclass
class CheckResult:
    name: str
    purpose: str
    violations: int = 0
    examples: list[dict] = field(default_factory=list)
    skipped: str | None = None


@dataclass(frozen=True)
class CheckFile:
    name: str
    purpose: str
    inputs: tuple[str, ...]
    sql: str


def check_files() -> list[CheckFile]:
    """Every ``queries/checks/*.sql`` with its header (``check``, ``grain``, ``inputs``, ``purpose``)."""
    out = []
    for path in sorted((QUERIES_DIR / "checks").glob("*.sql")):
        text = path.read_text()
        head: dict[str, str] = {}
        key = None
        for line in text.splitlines():  # the header: "-- key: text", continued on "--   more text" lines
            if not line.startswith("--"):
                break
            m = re.match(r"--\s?(\w+):\s*(.*)$", line)
            if m and not line.startswith("--  "):
                key, head[m.group(1)] = m.group(1), m.group(2).strip()
            elif key is not None and line[2:].strip():
                head[key] += " " + line[2:].strip()
        out.append(
            CheckFile(
                head.get("check", path.stem),
                head.get("purpose", ""),
                tuple(x.strip() for x in head.get("inputs", "").split(",") if x.strip()),
                text,
            )
        )
    return out


def run_checks(con: duckdb.DuckDBPyConnection, run_id: str) -> list[CheckResult]:
    # views count: tokens is one (over token_lists), and some derived tables are
    tables = {
        r[0]
        for r in con.execute(
            "select table_name from duckdb_tables() union all select view_name from duckdb_views() where not internal"
        ).fetchall()
    }
    out = []
    for head in check_files():
        res = CheckResult(head.name, head.purpose)
        missing = [t for t in head.inputs if t not in tables]
        if missing:
            res.skipped = (
                f"needs {', '.join(missing)} (run `tracelat fit {run_id}` first)"
                if "request_attribution" in missing
                else f"needs {', '.join(missing)}"
            )
            out.append(res)
            continue
        rel = con.sql(head.sql, params={"run_id": run_id})
        cols = rel.columns
        rows = rel.fetchall()
        res.violations = len(rows)
        res.examples = [dict(zip(cols, r)) for r in rows[:LIMIT]]
        out.append(res)
    return out
