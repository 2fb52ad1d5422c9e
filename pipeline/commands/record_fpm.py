"""``tracelat record-fpm``."""

from __future__ import annotations

from pathlib import Path

import click

from ..terminal import echo


@click.command("record-fpm")
@click.option(
    "--zmq",
    "endpoint",
    required=True,
    metavar="tcp://HOST:PORT",
    help="The engine's ForwardPassMetrics PUB socket (SGLang/vLLM --forward-pass-metrics-port; "
    "data-parallel rank N publishes on PORT+N).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="JSONL file to append to (.gz compresses); ingest it with `tracelat ingest FILE`.",
)
@click.option("--duration", "duration_s", type=click.FloatRange(min=0.1), help="Stop after this many seconds.")
@click.option("--max-records", type=click.IntRange(min=1), help="Stop after this many step records.")
@click.option(
    "--idle-timeout",
    "idle_s",
    type=click.FloatRange(min=0.1),
    help="Stop when nothing (not even a heartbeat) arrived for this many seconds.",
)
def record_fpm(endpoint: str, out: Path, duration_s, max_records, idle_s) -> None:
    """Record an engine's per-step ForwardPassMetrics stream to JSONL (Ctrl-C stops).

    Each record gets the time it was received (`timestamp`, Unix seconds) unless it
    has one: the step's end, within the delivery delay. Empty heartbeat records are
    counted, not written; skipped sequence numbers (messages ZMQ dropped) are counted
    and reported.
    """
    from ..ingest.fpm_record import record

    st = record(endpoint, out, duration_s, max_records, idle_s)
    echo(
        f"{out}: {st.records} step records, {st.heartbeats} heartbeats, {st.missed} missed (sequence gaps), "
        f"{st.undecodable} undecodable"
    )
