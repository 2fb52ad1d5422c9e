"""What a night's inputs left in doubt, said beside its verdict: rejected lines, sources whose
join failed, and what the comparison with the baseline could not cover.

Read from the night's own store (and the comparison), so a re-run of a recorded night says the
same. Plain text: the terminal shows it through ``terminal.clean``, nightly.md through
``escape.md_text``.
"""

from __future__ import annotations

from typing import Any

from .. import store

# per file: lines read and rejected, and the first reject (the store keeps them all)
_REJECTS = """
select i.path, i.lines_read, i.lines_rejected,
       (select r.line_no from rejects r where r.ingest_id = i.ingest_id order by r.line_no limit 1),
       (select r.reason from rejects r where r.ingest_id = i.ingest_id order by r.line_no limit 1)
from ingests i where i.lines_rejected > 0 order by i.path
"""


def night_warnings(con: Any, run_id: str, store_path: str) -> list[str]:
    """The night's rejected lines per file and its failed source joins (``store_path``: where
    ``tracelat rejects`` finds the rejects)."""
    from ..ingest.align import source_lines

    import shlex

    from ..terminal import inline

    out = [
        f"{inline(path)}: {rejected} of {read} lines rejected (the first, line {line}: {reason}); the night is "
        f"recorded without them: `tracelat rejects --db {shlex.quote(store_path)}` lists them"
        for path, read, rejected, line, reason in con.execute(_REJECTS).fetchall()
    ]
    out += [text for bad, text in source_lines(run_id, store.run_meta(con, run_id)) if bad]
    requests, steps = con.execute(_SIZES, [run_id]).fetchone()
    if not requests and steps:
        # the night passes on its step times alone: a client that died or a results file left out
        # would otherwise look like a quiet night
        out.append(
            f"the night's run holds {steps} steps and no requests: no request latency (TTFT, TPOT, ITL, E2E) "
            "or goodput was recorded for it, and no SLO or change on them could fail it; give the "
            "benchmark's request records with the server's log"
        )
    return out


_SIZES = "select (select count(*) from requests where run_id = $1), (select count(*) from iterations where run_id = $1)"


# per file of tonight: its records rejected because another file of the night holds the same
# step number or request id of the run (load._duplicates_sql's "another file" reason)
CROSS_FILE_DUPLICATES = """
select path, count(*), min(line_no), arg_min(reason, line_no)
from rejects where reason like 'duplicate % another file: %' group by path order by path
"""


def mostly_rejected(results: list[Any]) -> list[Any]:
    """Files that rejected more lines than they loaded records: a stale copy of another night's
    file (every record a duplicate), a file of another format, a garbled log. A night recorded
    from the rest would pass on part of its data."""
    return [r for r in results if r.status not in ("unchanged", "skipped") and r.rejected > r.accepted]


def label_overrides(con: Any, run_id: str, labels: dict[str, str]) -> list[str]:
    """The night's labels that a ``--label`` set to something other than the run's own records say
    (engine, engine_version, model, gpu, config): the trend page and the history show the label, so
    a typo or a stale CI variable would silently re-label the night."""
    from ..metrics import run_metadata
    from .history import labels_of

    own = labels_of({"run": run_metadata(con, run_id)}, "", {})
    return [
        f"--label {key}={labels[key]} replaces the {key} the run's records give ({own[key]}); the history "
        "and the trend page show the label"
        for key in ("engine", "engine_version", "model", "gpu", "config")
        if key in own and key in labels and labels[key] != own[key]
    ]
