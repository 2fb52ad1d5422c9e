"""Files that benchmark clients write beside the records tracelat reads, and that hold nothing it
reads: aggregate statistics (tracelat computes its own from the per-request records), GPU
telemetry, metric schemas.

An AIPerf run's folder holds ``profile_export.jsonl`` (read) next to ``profile_export_aiperf.json``
and ``gpu_telemetry_export.jsonl``; ingesting the folder failed on the two it cannot read, and
naming a format for them (the hint for an unknown file) turned a valid aggregate into hundreds
of "not valid JSON" rejects. A companion is known by its exact file name and by what its head
holds, so that another tool's ``inputs.json`` is not taken for one.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Companion:
    names: tuple[str, ...]  # exact file names the tool writes
    head: re.Pattern[str]  # what the file's head holds
    what: str  # what the file is, for the user
    instead: str  # the file of the run that tracelat reads ("" for tracelat's own outputs)


# a metric of an aggregate export: "time_to_first_token": {"unit": "ms", ...}
_AGGREGATE_JSON = re.compile(
    r'"(?:request_throughput|request_latency|time_to_first_token|inter_token_latency)"\s*:\s*\{\s*"unit"'
)

COMPANIONS = (
    Companion(
        ("profile_export_aiperf.json",),
        _AGGREGATE_JSON,
        "AIPerf's aggregate statistics of the run; tracelat computes its own from the per-request records",
        "profile_export.jsonl",
    ),
    Companion(
        ("profile_export_aiperf.csv",),
        re.compile(r"\A\ufeff?Metric,"),
        "AIPerf's aggregate statistics of the run (CSV); tracelat computes its own from the per-request records",
        "profile_export.jsonl",
    ),
    Companion(
        ("profile_export_genai_perf.json",),
        _AGGREGATE_JSON,
        "GenAI-Perf's aggregate statistics of the run; tracelat computes its own from the per-request records",
        "profile_export.json",
    ),
    Companion(
        ("profile_export_genai_perf.csv",),
        re.compile(r"\A\ufeff?Metric,"),
        "GenAI-Perf's aggregate statistics of the run (CSV); tracelat computes its own from the per-request records",
        "profile_export.json",
    ),
    Companion(
        ("gpu_telemetry_export.jsonl",),
        re.compile(r'\A\s*\{[^\n]*"telemetry_data"\s*:'),
        "AIPerf's GPU telemetry (DCGM samples); tracelat does not analyse GPU telemetry",
        "profile_export.jsonl",
    ),
    Companion(
        ("server_metrics_metadata.json",),
        re.compile(r'"metric_schemas"\s*:'),
        "AIPerf's descriptions of the server's metrics; the samples themselves are read",
        "server_metrics_export.jsonl",
    ),
    # tracelat's own outputs, written into the logs' folder (`tracelat report --out logs/r`): a folder
    # ingest read a report's summary.json as a vLLM bench result and stopped there
    *(
        Companion((name,), re.compile(head), what, "")
        for name, head, what in (
            (
                "summary.json",
                r'\A\{\s*"run_id"\s*:[^\n]*\n\s*"requests"\s*:',
                "tracelat's own summary of a run (tracelat report)",
            ),
            ("summary.md", r"\A### tracelat: run ", "tracelat's own summary of a run (tracelat report)"),
            ("index.html", r"<title>tracelat ", "a page tracelat wrote"),
            (
                "comparison.json",
                r'\A\{\s*"base_run"\s*:[^\n]*\n\s*"cand_run"\s*:',
                "tracelat's own comparison of two runs (tracelat compare)",
            ),
            (
                "comparison.md",
                r"\A## \S+ tracelat compare: ",
                "tracelat's own comparison of two runs (tracelat compare)",
            ),
            (
                "nightly.json",
                r'\A\{\s*"run_id"\s*:[^\n]*\n\s*"night"\s*:',
                "tracelat's own record of a night (tracelat nightly)",
            ),
            (
                "nightly.md",
                r"\A## \w+: tracelat nightly, night ",
                "tracelat's own record of a night (tracelat nightly)",
            ),
        )
    ),
)


def companion(path: Path, head: str) -> Companion | None:
    """The companion file ``path`` is (``head``: the start of its text), or None."""
    for c in COMPANIONS:
        if path.name in c.names and c.head.search(head):
            return c
    return None


def note(c: Companion) -> str:
    """What a skipped companion is, and where the run's records are."""
    if not c.instead:  # no benchmark's: an output of tracelat's own
        return f"not read: {c.what}"
    return f"not read: {c.what} (the run's records are in {c.instead} beside it)"
