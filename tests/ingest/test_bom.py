"""A UTF-8 byte-order mark at the start of a file (Windows tools write one) is not data: every
format stores what it stores without it. It cost JSON-lines formats their first record and made
whole-document formats (bench results, Prometheus ranges) unreadable."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import store
from pipeline.ingest import ingest_paths

FIX = Path(__file__).resolve().parents[2] / "fixtures"
FILES = [
    "aiperf/profile_export.jsonl",
    "canonical/tiny.jsonl",
    "fpm/fpm-relay-w0.jsonl",
    "genai_perf/profile_export.json",
    "guidellm/benchmarks.json",
    "inference_perf/per_request_lifecycle_metrics.json",
    "otel/vllm-traces.jsonl",
    "prometheus/query_range.json",
    "prometheus/vllm-0_metrics.log",
    "sglang/server.log",
    "trtllm/iteration_log.txt",
    "trtllm/metrics.json",
    "vllm/bench.json",
    "vllm/requests.jsonl",
    "vllm/server.log",
]


def _stored(tmp_path: Path, path: Path, name: str) -> dict:
    con = store.connect(tmp_path / f"{name}.duckdb")
    (res,) = ingest_paths(con, [path], run_id="r")
    got = {"counts": (res.format, res.lines_read, res.accepted, res.rejected, res.skipped)}
    for t in ("iterations", "requests", "token_lists", "rejects"):
        cols = [c for (c,) in con.execute(f"select column_name from (describe {t})").fetchall()]
        keep = ", ".join(c for c in cols if c not in ("ingest_id", "path"))
        got[t] = con.execute(f"select {keep} from {t} order by all").fetchall()
    con.close()
    return got


@pytest.mark.parametrize("name", FILES)
@pytest.mark.long
def test_a_byte_order_mark_changes_nothing(tmp_path, name):
    src = FIX / name
    plain, marked = tmp_path / "plain", tmp_path / "marked"
    plain.mkdir()
    marked.mkdir()
    (plain / src.name).write_bytes(src.read_bytes())
    (marked / src.name).write_bytes(b"\xef\xbb\xbf" + src.read_bytes())
    want = _stored(tmp_path, plain / src.name, "plain")
    assert want["counts"][2] > 0
    assert _stored(tmp_path, marked / src.name, "marked") == want
