"""record-fpm against a ZMQ publisher on the loopback: what an engine sends is what ingest reads."""

from __future__ import annotations

import json
import threading
import time

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

from pipeline import store  # noqa: E402
from pipeline.ingest import ingest_paths  # noqa: E402
from pipeline.ingest.fpm_record import FPM_FIELDS, record  # noqa: E402


def _step(counter: int, as_list: bool):
    sched = {
        "num_prefill_requests": counter % 2,
        "sum_prefill_tokens": 128 * (counter % 2),
        "var_prefill_length": 0.0,
        "sum_prefill_kv_tokens": 0,
        "num_decode_requests": 3,
        "sum_decode_kv_tokens": 900 + counter,
        "var_decode_kv_tokens": 1.5,
    }
    queued = {
        "num_prefill_requests": 1,
        "sum_prefill_tokens": 64,
        "var_prefill_length": 0.0,
        "num_decode_requests": 0,
        "sum_decode_kv_tokens": 0,
        "var_decode_kv_tokens": 0.0,
    }
    rec = {
        "version": 1,
        "worker_id": "w",
        "dp_rank": 0,
        "counter_id": counter,
        "timing_scope": "execute_model_cuda",
        "wall_time": 0.01 + counter / 1000,
        "scheduled_requests": sched,
        "queued_requests": queued,
    }
    if as_list:  # msgspec array_like structs arrive as lists in schema order
        rec = [
            rec[f] if f not in ("scheduled_requests", "queued_requests") else list(rec[f].values()) for f in FPM_FIELDS
        ]
    return rec


def test_recorded_stream_ingests(tmp_path):
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    out = tmp_path / "fpm.jsonl"
    stats = {}

    def run():
        stats["s"] = record(f"tcp://127.0.0.1:{port}", out, duration_s=20, max_records=6)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)  # the subscriber connects (ZMQ drops what a PUB sends before that)
    seq = 0
    for counter in range(6):
        if counter == 2:  # an idle heartbeat, and a message the subscriber never sees
            pub.send_multipart([b"", seq.to_bytes(8, "big"), msgpack.packb({})])
            seq += 2
        pub.send_multipart([b"", seq.to_bytes(8, "big"), msgpack.packb(_step(counter, counter % 2 == 1))])
        seq += 1
        time.sleep(0.02)
    t.join(timeout=20)
    pub.close(linger=0)
    st = stats["s"]
    assert (st.records, st.heartbeats, st.missed) == (6, 1, 1)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["counter_id"] for r in lines] == list(range(6))
    assert lines[3]["scheduled_requests"]["sum_decode_kv_tokens"] == 903  # a list record mapped by schema order
    con = store.connect(tmp_path / "f.duckdb")
    res = ingest_paths(con, [out], run_id="rec")[0]
    assert (res.accepted, res.rejected) == (6, 0)
    got = con.execute("select iter, context_tokens, dur_ms from iterations order by iter").fetchall()
    assert got == [(c, 900 + c, pytest.approx(1000 * (0.01 + c / 1000))) for c in range(6)]


def test_bad_endpoint_is_a_clear_error(tmp_path):
    from pipeline.errors import InputError

    with pytest.raises(InputError, match="tcp://HOST:PORT"):
        record("nonsense", tmp_path / "x.jsonl", duration_s=0.2)
