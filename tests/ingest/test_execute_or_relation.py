"""Small batches run their statements executed, big ones as relations (store.EXECUTE_ROWS_MAX):
the two ways store the same rows, rejects and counts, for the canonical batch path and for
engine converters."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from pipeline import store

from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures"

TABLES = {
    "iterations": "select * exclude (ingest_id) from iterations order by all",
    "requests": "select * exclude (ingest_id) from requests order by all",
    "token_lists": "select run_id, req_id, t_s from token_lists order by all",
    "rejects": "select line_no, reason, raw from rejects order by all",
    "metric_samples": "select * exclude (ingest_id) from metric_samples order by all",
}


def _damaged_canonical(tmp_path: Path) -> Path:
    """The tiny canonical trace gzipped (the batch path, not the file-wide staging), with a cut
    line, a bad value and a duplicate of an iteration among its lines."""
    lines = (FIX / "canonical" / "tiny.jsonl").read_text().splitlines()
    lines += ['{"kind": "iteration", "iter": 999, "t_st', '{"kind": "iteration", "iter": 5, "t_start": "x"}']
    lines += [next(x for x in lines if '"iteration"' in x)]
    path = tmp_path / "damaged.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return path


@pytest.mark.parametrize(
    "source",
    ["canonical", "vllm/requests.jsonl", "trtllm/metrics.json", "aiperf/profile_export.jsonl", "sglang/server.log"],
)
def test_executed_and_relation_statements_store_the_same(tmp_path, monkeypatch, source):
    path = _damaged_canonical(tmp_path) if source == "canonical" else FIX / source
    stored = {}
    counts = {}
    for way, limit in (("executed", 10**9), ("relation", -1)):
        monkeypatch.setattr(store, "EXECUTE_ROWS_MAX", limit)
        con = store.connect(tmp_path / f"{way}.duckdb")
        (res,) = load(con, path, run_id="r", tz="UTC")
        counts[way] = (res.lines_read, res.accepted, res.rejected, res.skipped)
        stored[way] = {t: con.execute(q).fetchall() for t, q in TABLES.items()}
        con.close()
    assert counts["executed"] == counts["relation"]
    assert stored["executed"] == stored["relation"]
    assert counts["executed"][1] > 0
    if source == "canonical":
        assert counts["executed"][2] == 3 and len(stored["executed"]["rejects"]) == 3
