"""Recording the ForwardPassMetrics ZMQ stream to the JSONL form ``tracelat ingest`` reads.

Engines publish FPM on a ZMQ PUB socket (SGLang and vLLM ``--forward-pass-metrics-port``;
a data-parallel rank N binds PORT+N): multipart messages ``(topic b"", seq as 8 bytes
big-endian, msgpack(ForwardPassMetrics))``, and an empty record about once a second
when idle.  A record is a msgpack map, or (msgspec ``array_like`` structs) a list in
schema order; both become the flat JSON object of docs/formats.md.  Sequence numbers
that skip show messages the subscriber missed (ZMQ drops when a reader is slow); the
summary says how many.  The receive loop handles one message at a time by nature; it
does no work per record beyond decoding and writing it.
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

FPM_FIELDS = (
    "version",
    "worker_id",
    "dp_rank",
    "counter_id",
    "timing_scope",
    "wall_time",
    "scheduled_requests",
    "queued_requests",
)
SCHEDULED = (
    "num_prefill_requests",
    "sum_prefill_tokens",
    "var_prefill_length",
    "sum_prefill_kv_tokens",
    "num_decode_requests",
    "sum_decode_kv_tokens",
    "var_decode_kv_tokens",
)
QUEUED = (
    "num_prefill_requests",
    "sum_prefill_tokens",
    "var_prefill_length",
    "num_decode_requests",
    "sum_decode_kv_tokens",
    "var_decode_kv_tokens",
)


@dataclass
class RecordStats:
    records: int = 0
    heartbeats: int = 0
    missed: int = 0
    undecodable: int = 0


def as_record(obj) -> dict | None:
    """A decoded msgpack payload as the flat FPM dict (None for an empty heartbeat)."""
    if obj is None or obj == {} or obj == []:
        return None
    if isinstance(obj, (list, tuple)):
        obj = dict(zip(FPM_FIELDS, obj))
        for key, names in (("scheduled_requests", SCHEDULED), ("queued_requests", QUEUED)):
            if isinstance(obj.get(key), (list, tuple)):
                obj[key] = dict(zip(names, obj[key]))
    if not isinstance(obj, dict):
        raise ValueError(f"not an FPM record: {type(obj).__name__}")
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v) for k, v in obj.items()
    }


def record(
    endpoint: str,
    out: Path,
    duration_s: float | None = None,
    max_records: int | None = None,
    idle_timeout_s: float | None = None,
) -> RecordStats:
    """Subscribe to ``endpoint`` and append records to ``out`` until a limit (or Ctrl-C)."""
    try:
        import msgpack
        import zmq
    except ImportError as exc:
        raise InputError("recording FPM needs pyzmq and msgpack: pip install 'tracelat[fpm]'") from exc
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVTIMEO, 200)
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        raise InputError(f"--zmq {endpoint}: {exc}; use tcp://HOST:PORT") from exc
    stats, last_seq = RecordStats(), None
    opener = gzip.open if out.name.endswith(".gz") else open
    start = last_msg = time.monotonic()
    try:
        with opener(out, "at", encoding="utf-8") as fh:
            while True:
                now = time.monotonic()
                if duration_s is not None and now - start >= duration_s:
                    break
                if idle_timeout_s is not None and now - last_msg >= idle_timeout_s:
                    break
                try:
                    parts = sock.recv_multipart()
                except zmq.Again:
                    continue
                last_msg = time.monotonic()
                if len(parts) >= 3 and len(parts[1]) == 8:
                    seq = int.from_bytes(parts[1], "big")
                    if last_seq is not None and seq > last_seq + 1:
                        stats.missed += seq - last_seq - 1
                    last_seq = seq
                try:
                    rec = as_record(msgpack.unpackb(parts[-1], raw=False, strict_map_key=False)) if parts[-1] else None
                except (ValueError, msgpack.UnpackException, TypeError):
                    stats.undecodable += 1
                    continue
                if rec is None:
                    stats.heartbeats += 1
                    continue
                rec.setdefault("timestamp", time.time())  # when it was received: the step's end, within a ms
                fh.write(json.dumps(rec, default=str) + "\n")
                stats.records += 1
                if max_records is not None and stats.records >= max_records:
                    break
    except KeyboardInterrupt:
        pass
    finally:
        sock.close(linger=0)
    return stats
